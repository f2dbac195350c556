//! Properties of the quant formats and kernels: round-trip error bounds, dot products against
//! an f64 reference, SIMD against scalar, and hostile input.

use hipscope::gpu::quant::dot::{Activation, Isa, Kernel, MAX_TILE};
use hipscope::gpu::quant::{self, COMPUTE_TYPES, GgmlType, QuantError};
use proptest::prelude::*;

/// Rows of `n_blocks` blocks of `bl`, each block with its own magnitude (10^-2 … 10^2) and a
/// random offset, so that scales and mins of every size and sign occur.
fn rows(bl: usize, max_blocks: usize) -> impl Strategy<Value = Vec<f32>> {
    (1..=max_blocks).prop_flat_map(move |nb| {
        (
            prop::collection::vec(-1.0f32..1.0, nb * bl),
            prop::collection::vec((-2i32..=2, -1.0f32..1.0), nb),
        )
            .prop_map(move |(v, scales)| {
                v.chunks(bl)
                    .zip(&scales)
                    .flat_map(|(c, &(e, off))| {
                        let s = 10f32.powi(e);
                        c.iter()
                            .map(move |x| (x + 0.3 * off) * s)
                            .collect::<Vec<_>>()
                    })
                    .collect()
            })
    })
}

fn roundtrip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let q = quant::quantize(ty, x).expect("quantize");
    let mut y = vec![0f32; x.len()];
    quant::dequantize(ty, &q, &mut y).expect("dequantize");
    y
}

/// Unit roundoff of f16 (10 stored mantissa bits): rounding to f16 changes a value by at most
/// this fraction of it.
const F16_EPS: f32 = 1.0 / 2048.0;

/// How far rounding `v` to f16 may move it: relative for normal values, half the subnormal
/// step (2^-25) near zero.
fn f16_err(v: f32) -> f32 {
    (v.abs() * F16_EPS).max(1.0 / (1u32 << 25) as f32)
}

/// Largest error allowed for element `x` of a block, from the block alone (see each arm).
fn bound(ty: GgmlType, block: &[f32], x: f32) -> f32 {
    let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (min, max) = block
        .iter()
        .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    // Slack for f32 rounding inside the quantizer and dequantizer.
    let tiny = amax * 1e-6;
    match ty {
        GgmlType::F32 => 0.0,
        // Round to nearest: half an ulp, relative.
        GgmlType::F16 => f16_err(x),
        GgmlType::Bf16 => x.abs() / 256.0,
        // Step d = amax/8; rounding costs d/2, except that the value of the opposite sign to
        // the largest one may clamp from 8 to 7: one full step. The f16 scale adds |q|·Δd.
        GgmlType::Q4_0 => amax / 8.0 + 8.0 * f16_err(amax / 8.0) + tiny,
        GgmlType::Q5_0 => amax / 16.0 + 16.0 * f16_err(amax / 16.0) + tiny,
        // Step d = (max-min)/n: half a step, plus the f16 rounding of d (×q) and of the min.
        GgmlType::Q4_1 => {
            let d = (max - min) / 15.0;
            d / 2.0 + f16_err(min) + 15.0 * f16_err(d) + tiny
        }
        GgmlType::Q5_1 => {
            let d = (max - min) / 31.0;
            d / 2.0 + f16_err(min) + 31.0 * f16_err(d) + tiny
        }
        GgmlType::Q8_0 | GgmlType::Q8_1 => {
            let d = amax / 127.0;
            d / 2.0 + 127.0 * f16_err(d) + tiny
        }
        // K types: rounding costs half a step; the weighted least-squares fit may clip a
        // group's extremes by up to about a step (its grid search shrinks the grid by up to
        // one step, rmin); and the group scales and mins are themselves quantized to 6 bits
        // (Q6_K: 8) against the super-block's largest, which moves a value by up to
        // nmax/126 (nmax/256) of a step. Two steps of the super-block's coarsest grid bound the
        // sum. The Q4_K/Q5_K grids always include zero (the min is clamped to <= 0), hence the
        // widened range.
        GgmlType::Q4K => 2.0 * (max.max(0.0) - min.min(0.0)) / 15.0 + tiny,
        GgmlType::Q5K => 2.0 * (max.max(0.0) - min.min(0.0)) / 31.0 + tiny,
        GgmlType::Q6K => 2.0 * amax / 32.0 + tiny,
        _ => f32::INFINITY,
    }
}

fn check_roundtrip(ty: GgmlType, x: &[f32]) -> Result<(), TestCaseError> {
    let y = roundtrip(ty, x);
    // The bound is per block for the 32-types, per super-block for the K types.
    let group = ty.block_len().max(1);
    for (bi, (xb, yb)) in x.chunks(group).zip(y.chunks(group)).enumerate() {
        for (i, (&a, &b)) in xb.iter().zip(yb).enumerate() {
            let lim = bound(ty, xb, a);
            prop_assert!(
                (a - b).abs() <= lim,
                "{ty} block {bi} element {i}: {a} -> {b}, error {} > bound {lim}",
                (a - b).abs()
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn roundtrip_32_types_within_bounds(x in rows(32, 6)) {
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Bf16, GgmlType::Q4_0, GgmlType::Q4_1,
                   GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q8_1] {
            check_roundtrip(ty, &x)?;
        }
    }

    #[test]
    fn roundtrip_k_types_within_bounds(x in rows(256, 2)) {
        for ty in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
            check_roundtrip(ty, &x)?;
        }
    }
}

/// Quality on Gaussian data, as root-mean-square error relative to σ: limits about 10% above
/// what these quantizers reach (0.0856, 0.0776, 0.0425, 0.0378, 0.0053, 0.0706, 0.0358,
/// 0.0176; Q2_K 0.2950, Q3_K 0.1488, IQ4_NL 0.0758, IQ4_XS 0.0763; MXFP4 0.1155, whose
/// power-of-two scale and E2M1 grid trade accuracy for a cheap format), which are llama.cpp's own
/// figures since the reference fixtures prove the bytes
/// identical; a broken search or packing lands far above.
#[test]
fn rms_error_on_gaussian_data() {
    let n = 256 * 64;
    let x = gaussian(n, 7);
    for (ty, limit) in [
        (GgmlType::Q4_0, 0.095),
        (GgmlType::Q4_1, 0.086),
        (GgmlType::Q5_0, 0.047),
        (GgmlType::Q5_1, 0.042),
        (GgmlType::Q8_0, 0.0059),
        (GgmlType::Q4K, 0.078),
        (GgmlType::Q5K, 0.040),
        (GgmlType::Q6K, 0.020),
        (GgmlType::Q2K, 0.325),
        (GgmlType::Q3K, 0.164),
        (GgmlType::Iq4Nl, 0.084),
        (GgmlType::Iq4Xs, 0.084),
        (GgmlType::Mxfp4, 0.127),
    ] {
        let y = roundtrip(ty, &x);
        let rms = (x
            .iter()
            .zip(&y)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum::<f64>()
            / n as f64)
            .sqrt();
        assert!(
            rms < limit,
            "{ty}: rms error {rms:.4} σ, expected < {limit}"
        );
    }
}

/// Deterministic standard normal samples (Box–Muller over a xorshift generator).
fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || (crate::common::xorshift(&mut s) >> 11) as f64 / (1u64 << 53) as f64;
    (0..n)
        .map(|_| {
            let (u, v) = (next().max(1e-12), next());
            ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
        })
        .collect()
}

/// Weights of `ty` for `rows` × `cols` from the generator, quantized.
fn weights(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let x: Vec<f32> = gaussian(rows * cols, seed)
        .iter()
        .map(|v| v * 0.05)
        .collect();
    let q = quant::quantize(ty, &x).expect("quantize weights");
    let mut w = vec![0f32; x.len()];
    quant::dequantize(ty, &q, &mut w).expect("dequantize weights");
    (q, w)
}

/// The f64 dot product of dequantized weights with the activation, and the bound on how far
/// the quantized-activation kernel may be from it: Σ|w_i|·e_i, with e_i the activation's
/// rounding error (half a step d_a = max|x|/127 of its block, or 0 for float weights), plus
/// f32 accumulation error, a few units of 2^-24 per block relative to Σ|w_i·x_i|.
fn reference_dot(ty: GgmlType, w: &[f32], x: &[f32]) -> (f64, f64) {
    let bl = match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => 0,
        GgmlType::Q2K
        | GgmlType::Q3K
        | GgmlType::Q4K
        | GgmlType::Q5K
        | GgmlType::Q6K
        | GgmlType::Iq4Xs => 256,
        _ => 32,
    };
    let exact: f64 = w.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
    let abs: f64 = w
        .iter()
        .zip(x)
        .map(|(&a, &b)| (a as f64 * b as f64).abs())
        .sum();
    // Rounding to 8 bits moves each value by up to half a step, amax / 254. The 32-element
    // blocks' scale is stored as an f16 (as llama.cpp's Q8_0/Q8_1 store it): a relative error up to
    // 2^-11 on every q·d, i.e. up to amax · 2^-11 per value, and for Q4_1/Q5_1 (Q8_1) the same on
    // the sum term d·Σq (|Σq| ≤ 32 · 127), which the block's offset m (|m| ≤ max|w|) multiplies.
    let f16_rel = 2f64.powi(-11);
    let q8_1 = matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1);
    let mut act_err = 0.0;
    if bl > 0 {
        for (wb, xb) in w.chunks(bl).zip(x.chunks(bl)) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
            let scale_err = if bl == 32 { amax * f16_rel } else { 0.0 };
            let e = amax / 127.0 * 0.5001 + scale_err;
            act_err += wb.iter().map(|v| v.abs() as f64 * e).sum::<f64>();
            if q8_1 {
                let wmax = wb.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
                act_err += wmax * 32.0 * amax * f16_rel;
            }
        }
    }
    let n_blocks = (w.len() / bl.max(8)) as f64;
    (
        exact,
        act_err + abs * (n_blocks + 16.0) * 4.0 * f32::EPSILON as f64 + 1e-30,
    )
}

fn isas() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|i| i.is_available())
        .collect()
}

/// The SIMD instruction sets to compare with the scalar reference: AVX2 always (forced even where
/// AVX-512 is the one `Isa::detect` picks), AVX-512 where this CPU has it. Set
/// `HIPSCOPE_REQUIRE_AVX512=1` on a machine known to have it, so that a detection bug fails the
/// test instead of leaving those kernels unchecked.
fn simd_isas() -> Vec<Isa> {
    if std::env::var_os("HIPSCOPE_REQUIRE_AVX512").is_some() {
        assert!(
            Isa::Avx512.is_available(),
            "HIPSCOPE_REQUIRE_AVX512 is set but AVX-512 F/BW/VL/VNNI was not detected"
        );
    }
    [Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|i| i.is_available())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every kernel against the f64 dot of dequantized weights, for 1..=4 tokens per pass.
    #[test]
    fn kernel_dot_within_activation_quantization_error(
        nb in 1usize..=3, seed in any::<u64>(), nt in 1usize..=MAX_TILE, scale_exp in -2i32..=2,
    ) {
        for &ty in COMPUTE_TYPES {
            let cols = nb * 256;
            let rows = 3;
            let (q, w) = weights(ty, rows, cols, seed);
            let x: Vec<f32> = gaussian(nt * cols, seed ^ 0xA5).iter().map(|v| v * 10f32.powi(scale_exp)).collect();
            for isa in isas() {
                let mut act = Activation::new();
                act.quantize(isa, ty, &x, nt, cols).expect("activation");
                let k = Kernel::new(isa, ty).expect("kernel");
                let mut out = vec![0f32; rows * nt];
                k.dot_rows(&q, rows, &act, 0, nt, &mut out);
                for r in 0..rows {
                    for t in 0..nt {
                        let (exact, tol) = reference_dot(ty, &w[r * cols..(r + 1) * cols], &x[t * cols..(t + 1) * cols]);
                        let got = out[r * nt + t] as f64;
                        prop_assert!((got - exact).abs() <= tol,
                            "{ty} {isa:?} row {r} token {t}: got {got}, f64 {exact}, |diff| {} > {tol}", (got - exact).abs());
                    }
                }
            }
        }
    }

    /// The SIMD activation quantizers produce exactly the scalar bytes, and the SIMD kernels the
    /// scalar results up to the order of float additions. (On x86-64 only; a CPU there without
    /// AVX2/FMA/F16C fails this test rather than skipping it silently.)
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_matches_scalar(nb in 1usize..=3, tail in 0usize..4, seed in any::<u64>(), nt in 1usize..=MAX_TILE) {
        prop_assert!(Isa::Avx2.is_available(), "this CPU lacks AVX2/FMA/F16C: the SIMD kernels cannot be checked");
        for &ty in COMPUTE_TYPES {
            // The 32-element types also get rows with an odd block count and partial groups.
            let cols = nb * 256 + if ty.block_len() == 32 { 32 * tail } else { 0 };
            let rows = 5;
            let (q, w) = weights(ty, rows, cols, seed);
            let x = gaussian(nt * cols, seed ^ 0x5A);
            let mut a_s = Activation::new();
            a_s.quantize(Isa::Scalar, ty, &x, nt, cols).expect("scalar activation");
            let mut o_s = vec![0f32; rows * nt];
            Kernel::new(Isa::Scalar, ty).expect("kernel").dot_rows(&q, rows, &a_s, 0, nt, &mut o_s);
            for isa in simd_isas() {
                let mut a_v = Activation::new();
                a_v.quantize(isa, ty, &x, nt, cols).expect("simd activation");
                for t in 0..nt {
                    match ty {
                        GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K | GgmlType::Iq4Xs => prop_assert!(a_s.q8xk(t) == a_v.q8xk(t), "{ty} {isa:?} Q8xK token {t}"),
                        GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => prop_assert_eq!(a_s.f32s(t), a_v.f32s(t)),
                        _ => prop_assert!(a_s.q8x32(t) == a_v.q8x32(t), "{ty} {isa:?} Q8x32 token {t}"),
                    }
                }
                let k = Kernel::new(isa, ty).expect("kernel");
                prop_assert_eq!(k.isa(), isa);
                let mut o_v = vec![0f32; rows * nt];
                k.dot_rows(&q, rows, &a_v, 0, nt, &mut o_v);
                for r in 0..rows {
                    for t in 0..nt {
                        let xd = a_s.dequantized(t);
                        let abs: f64 = w[r * cols..(r + 1) * cols].iter().zip(&xd).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                        let tol = abs * (cols as f64 / 8.0 + 16.0) * f32::EPSILON as f64 + 1e-30;
                        let (s, v) = (o_s[r * nt + t] as f64, o_v[r * nt + t] as f64);
                        prop_assert!((s - v).abs() <= tol, "{ty} {isa:?} row {r} token {t}: scalar {s}, simd {v}, tol {tol}");
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// A token's products do not depend on the tile it is multiplied in: every kernel gives
    /// token t of an nt-token pass exactly (to the bit) what a one-token pass over t gives, so
    /// that `serve`'s batched steps and a prompt's chunks compute what one request alone would.
    #[test]
    fn a_tokens_products_do_not_depend_on_its_tile(nb in 1usize..=2, seed in any::<u64>(), nt in 2usize..=MAX_TILE) {
        for &ty in COMPUTE_TYPES {
            let cols = nb * 256;
            let rows = 5;
            let (q, _) = weights(ty, rows, cols, seed);
            let x = gaussian(nt * cols, seed ^ 0x3C);
            for isa in std::iter::once(Isa::Scalar).chain(simd_isas()) {
                let mut a = Activation::new();
                a.quantize(isa, ty, &x, nt, cols).expect("activation");
                let k = Kernel::new(isa, ty).expect("kernel");
                let mut tile = vec![0f32; rows * nt];
                k.dot_rows(&q, rows, &a, 0, nt, &mut tile);
                for t in 0..nt {
                    let mut one = vec![0f32; rows];
                    k.dot_rows(&q, rows, &a, t, 1, &mut one);
                    for r in 0..rows {
                        prop_assert_eq!(tile[r * nt + t].to_bits(), one[r].to_bits(), "{} {:?} row {} token {} of {}", ty, isa, r, t, nt);
                    }
                }
            }
        }
    }
}

#[test]
fn errors_name_the_type_and_the_problem() {
    let e = quant::dequantize(GgmlType::Iq2Xxs, &[0; 66], &mut [0.0; 256]).unwrap_err();
    assert!(matches!(
        e,
        QuantError::Unsupported {
            ty: GgmlType::Iq2Xxs,
            ..
        }
    ));
    assert!(
        e.to_string()
            .starts_with("IQ2_XXS is not supported (supported: F32, F16, BF16, Q4_0"),
        "{e}"
    );
    assert!(!quant::is_supported(GgmlType::Iq3S) && quant::is_supported(GgmlType::Q2K));
    assert!(
        !quant::is_supported(GgmlType::Q8K),
        "Q8_K is an activation format only"
    );

    let e = quant::quantize(GgmlType::Q4_0, &[0.0; 33]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Q4_0: 33 elements is not a whole number of 32-element blocks"
    );
    let e = quant::dequantize(GgmlType::Q4K, &[0; 145], &mut [0.0; 256]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Q4_K: 145 bytes is not a whole number of 144-byte blocks"
    );
    let e = quant::dequantize(GgmlType::Q8_0, &[0; 68], &mut [0.0; 32]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Q8_0: 68 bytes hold 64 elements, but 32 were expected"
    );
    let mut x = vec![1.0f32; 64];
    x[40] = f32::NAN;
    let e = quant::quantize(GgmlType::Q8_0, &x).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Q8_0: input element 40 is NaN; only finite values can be quantized"
    );
    // Float types carry non-finite values through.
    let h = quant::quantize(GgmlType::F16, &[f32::INFINITY, 1.0]).expect("f16");
    let mut back = [0f32; 2];
    quant::dequantize(GgmlType::F16, &h, &mut back).expect("f16 back");
    assert_eq!(back, [f32::INFINITY, 1.0]);

    let mut act = Activation::new();
    let e = act
        .quantize(Isa::Scalar, GgmlType::Q4K, &[0.0; 96], 1, 96)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "Q4_K: 96 elements is not a whole number of 256-element blocks"
    );
    assert!(Kernel::new(Isa::Avx2, GgmlType::Iq3S).is_err());
}

/// Random bytes (NaN and infinite scales included) never panic in any path, on any ISA.
#[test]
fn hostile_blocks_do_not_panic() {
    let mut s = 0x1234_5678_9abc_def0u64;
    let mut byte = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 24) as u8
    };
    for &ty in COMPUTE_TYPES {
        let cols = 512;
        let rows = 4;
        let nbytes = rows * cols / ty.block_len() * ty.block_bytes();
        let mut data: Vec<u8> = (0..nbytes).map(|_| byte()).collect();
        // Force an infinite and a NaN f16 at the start of the first two blocks (the scale of
        // most types; quants elsewhere).
        data[0..2].copy_from_slice(&0x7C00u16.to_le_bytes());
        let bb = ty.block_bytes();
        data[bb..bb + 2].copy_from_slice(&0x7E00u16.to_le_bytes());
        let mut deq = vec![0f32; rows * cols];
        quant::dequantize(ty, &data, &mut deq).expect("dequantize hostile");
        let mut x = gaussian(2 * cols, 3);
        x[5] = f32::INFINITY;
        x[cols + 7] = f32::NAN;
        for isa in isas() {
            let mut act = Activation::new();
            act.quantize(isa, ty, &x, 2, cols).expect("activation");
            let mut out = vec![0f32; rows * 2];
            Kernel::new(isa, ty)
                .expect("kernel")
                .dot_rows(&data, rows, &act, 0, 2, &mut out);
            assert_eq!(out.len(), rows * 2);
        }
    }
}

/// Large inputs are quantized on several threads; the bytes must be those of one thread.
#[test]
fn large_inputs_quantize_as_small_pieces_do() {
    let x = gaussian((1 << 20) + 3 * 256, 11);
    for ty in [GgmlType::Q4K, GgmlType::Q8_0, GgmlType::Q5_1] {
        let whole = quant::quantize(ty, &x).expect("whole");
        let mut pieces = Vec::with_capacity(whole.len());
        for c in x.chunks(64 * 256) {
            pieces.extend(quant::quantize(ty, c).expect("piece"));
        }
        assert!(whole == pieces, "{ty}: parallel quantization differs");
    }
}
