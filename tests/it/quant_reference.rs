//! Block formats against independent implementations: dequantization against the `gguf` Python
//! package and quantization against llama.cpp's reference quantizers, through the fixtures of
//! `scripts/gen_quant_ref.py` (real SmolLM2 blocks, random blocks of every type, hostile blocks);
//! and the activation quantization before a matrix product against what llama.cpp's x86 CPU
//! backend stores (`quantize_row_q8_0`/`_q8_1`/`_q8_K` of libggml-cpu, `act_*` fixtures).

use std::path::{Path, PathBuf};

use hipscope::gpu::quant::dot::{Activation, Isa};
use hipscope::gpu::quant::{self, GgmlType};
use serde::Deserialize;

#[derive(Deserialize)]
struct Manifest {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Case {
    Dequant {
        #[serde(rename = "type")]
        ty: String,
        source: String,
        blocks: String,
        expected: String,
        nan_equal: bool,
    },
    Quantize {
        #[serde(rename = "type")]
        ty: String,
        source: String,
        input: String,
        expected: String,
    },
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant")
}

fn read(name: &str) -> Vec<u8> {
    let p = dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn manifest() -> Manifest {
    serde_json::from_slice(&read("manifest.json")).expect("manifest.json parses")
}

fn ty(name: &str) -> GgmlType {
    GgmlType::from_name(name).unwrap_or_else(|| panic!("unknown type {name} in manifest"))
}

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    let mut seen = std::collections::BTreeSet::new();
    let mut n = 0;
    for case in manifest().cases {
        let Case::Dequant {
            ty: t,
            source,
            blocks,
            expected,
            nan_equal,
        } = case
        else {
            continue;
        };
        let t = ty(&t);
        let blocks = read(&blocks);
        let want = f32s(&read(&expected));
        let mut got = vec![0f32; want.len()];
        quant::dequantize(t, &blocks, &mut got).unwrap_or_else(|e| panic!("{t} {source}: {e}"));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let same = g.to_bits() == w.to_bits() || (nan_equal && g.is_nan() && w.is_nan());
            assert!(
                same,
                "{t} {source}: element {i}: got {g:e} ({:#x}), gguf-py {w:e} ({:#x})",
                g.to_bits(),
                w.to_bits()
            );
        }
        seen.insert(t.name());
        n += 1;
    }
    // Every compute type has fixtures (a manifest that lost some must fail here).
    for t in quant::COMPUTE_TYPES {
        assert!(seen.contains(t.name()), "no dequant fixture for {t}");
    }
    assert!(n >= 26, "only {n} dequant cases");
}

#[test]
fn quantize_matches_llama_cpp_reference_byte_for_byte() {
    let mut n = 0;
    for case in manifest().cases {
        let Case::Quantize {
            ty: t,
            source,
            input,
            expected,
        } = case
        else {
            continue;
        };
        let t = ty(&t);
        let x = f32s(&read(&input));
        let want = read(&expected);
        let got = quant::quantize(t, &x).unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!(got.len(), want.len(), "{t} ({source}) size");
        let bb = t.block_bytes();
        for (b, (g, w)) in got.chunks(bb).zip(want.chunks(bb)).enumerate() {
            assert_eq!(g, w, "{t} ({source}) block {b} differs");
        }
        n += 1;
    }
    // 12 of the first types, 4 of the low-bit ones (`gen_quant_ref.py --lowbit`), MXFP4 (`--mxfp4`).
    assert_eq!(n, 17, "quantize cases");
}

#[test]
fn real_model_blocks_dequantize_to_plausible_weights() {
    // A sanity anchor independent of gguf-py: SmolLM2's attention weights are small.
    let blocks = read("q4_1_real.blocks");
    let mut out = vec![0f32; blocks.len() / 20 * 32];
    quant::dequantize(GgmlType::Q4_1, &blocks, &mut out).expect("dequantize");
    let max = out.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(max > 0.01 && max < 2.0, "max |w| = {max}");
}

#[derive(Deserialize)]
struct ActFixture {
    rows: usize,
    cols: usize,
    input: String,
    q8_0: String,
    q8_1: String,
    #[serde(rename = "q8_K")]
    q8_k: String,
}

fn f16_at(b: &[u8], off: usize) -> f32 {
    quant::f16_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

/// The activation a weight type's products take is what llama.cpp's CPU backend makes of the
/// same row, value for value: Q4_0 (llama.cpp's Q8_0): the same quants, `d` the stored f16, and
/// the sum term `d·Σq` with that `d`; Q4_1 (Q8_1): the same quants, `d` and the sum term as
/// the stored f16s; Q4_K (Q8_K): the same `d·q` (ggml's Q8_K quantizer negates the quants and `d`
/// of a block whose extreme is positive), the same |d| and block sums. On every instruction set
/// this CPU runs.
#[test]
fn activation_quantization_matches_llama_cpp_cpu_backend() {
    let fx: ActFixture =
        serde_json::from_slice(&read("activations.json")).expect("activations.json parses");
    let x = f32s(&read(&fx.input));
    assert_eq!(x.len(), fx.rows * fx.cols);
    let (q8_0, q8_1, q8_k) = (read(&fx.q8_0), read(&fx.q8_1), read(&fx.q8_k));
    let nb = fx.cols / 32;
    let nk = fx.cols / 256;
    assert_eq!(q8_0.len(), fx.rows * nb * 34);
    assert_eq!(q8_1.len(), fx.rows * nb * 36);
    assert_eq!(q8_k.len(), fx.rows * nk * 292);
    let mut failures = Vec::new();
    for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
        if !isa.is_available() {
            continue;
        }
        let name = isa.name();
        for (ty, blocks, bytes) in [(GgmlType::Q4_0, &q8_0, 34), (GgmlType::Q4_1, &q8_1, 36)] {
            let mut act = Activation::new();
            act.quantize(isa, ty, &x, fx.rows, fx.cols)
                .expect("activation");
            for t in 0..fx.rows {
                let (qs, ds) = act.q8x32(t);
                for b in 0..nb {
                    let blk = &blocks[(t * nb + b) * bytes..][..bytes];
                    let d = f16_at(blk, 0);
                    let want_q: Vec<i8> = blk[bytes - 32..].iter().map(|&v| v as i8).collect();
                    let sum: i32 = want_q.iter().map(|&q| q as i32).sum();
                    let s = if bytes == 36 {
                        f16_at(blk, 2)
                    } else {
                        d * sum as f32
                    };
                    let got = (qs[b].qs.to_vec(), ds[b]);
                    if got != (want_q.clone(), [d, s]) {
                        failures.push(format!(
                            "{name} {ty} row {t} block {b}: [d, s] {:?} want {:?}{}",
                            ds[b],
                            [d, s],
                            if got.0 == want_q {
                                ""
                            } else {
                                ", quants differ"
                            }
                        ));
                    }
                }
            }
        }
        let mut act = Activation::new();
        act.quantize(isa, GgmlType::Q4K, &x, fx.rows, fx.cols)
            .expect("activation");
        for t in 0..fx.rows {
            for (b, got) in act.q8xk(t).iter().enumerate() {
                let blk = &q8_k[(t * nk + b) * 292..][..292];
                let d = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
                let sign: i32 = if d < 0.0 { -1 } else { 1 };
                let same_q = blk[4..260]
                    .iter()
                    .zip(&got.qs)
                    .all(|(&w, &g)| (w as i8) as i32 == sign * g as i32);
                let same_sums = (0..16).all(|j| {
                    let w = i16::from_le_bytes([blk[260 + 2 * j], blk[261 + 2 * j]]);
                    w as i32 == sign * got.bsums[j] as i32
                });
                if d.abs() != got.d || !same_q || !same_sums {
                    failures.push(format!(
                        "{name} Q4_K row {t} block {b}: d {} want |{d}|, quants {same_q}, sums \
                         {same_sums}",
                        got.d
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} blocks differ:\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
}
