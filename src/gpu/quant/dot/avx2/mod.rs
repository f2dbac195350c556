//! AVX2+FMA+F16C kernels: activation quantization and the 32-element types (`kquants.rs`:
//! K-quants and float weights; `lowbit.rs`: Q2_K, Q3_K, IQ4_NL, IQ4_XS).

#![allow(clippy::needless_range_loop)] // indexing per token keeps the accumulators in registers

use super::super::blocks::{QK, QK_K, layout};
use super::*;
use std::arch::x86_64::*;

pub(in super::super) fn kernel(ty: GgmlType) -> KernelFn {
    use GgmlType::*;
    match ty {
        F32 => rows_f::<F32w>,
        F16 => rows_f::<F16w>,
        Bf16 => rows_f::<Bf16w>,
        Q4_0 => rows_32::<B4_0>,
        Q4_1 => rows_32::<B4_1>,
        Q5_0 => rows_32::<B5_0>,
        Q5_1 => rows_32::<B5_1>,
        Q8_0 => rows_32::<B8_0>,
        Q4K => rows_k::<K4>,
        Q5K => rows_k::<K5>,
        Iq4Nl => rows_32::<BIq4Nl>,
        Q2K => rows_k::<K2>,
        Q3K => rows_k::<K3>,
        Iq4Xs => rows_k::<KIq4Xs>,
        Mxfp4 => rows_32::<BMxfp4>,
        _ => rows_k::<K6>,
    }
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

// --- activation quantization ---

/// Q8x32 blocks of x, the same numbers as `quantize_q8x32_block`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn quantize_q8x32(
    x: &[f32],
    q32: &mut [Q8x32],
    ds32: &mut [[f32; 2]],
    q8_1: bool,
) {
    let sign = _mm256_set1_ps(-0.0);
    let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for ((xb, q), ds) in x.as_chunks::<QK>().0.iter().zip(q32).zip(ds32) {
        // SAFETY: xb is 32 floats, q.qs 32 bytes; unaligned loads/stores.
        unsafe {
            let p = xb.as_ptr();
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let m = _mm256_max_ps(
                _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
            );
            let amax = hmax(m);
            let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            // cvtps rounds to nearest even under the default MXCSR, like round_ties_even.
            let i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], id));
            let i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], id));
            let i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], id));
            let i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], id));
            let s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
            let sum = hsum_i32(s);
            let p16a = _mm256_packs_epi32(i0, i1);
            let p16b = _mm256_packs_epi32(i2, i3);
            let p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), perm);
            _mm256_storeu_si256(q.qs.as_mut_ptr() as *mut __m256i, p8);
            *ds = q8x32_scales(amax, sum, q8_1);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn quantize_q8xk(x: &[f32], qk: &mut [Q8xK]) {
    let sign = _mm256_set1_ps(-0.0);
    let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (xb, b) in x.as_chunks::<QK_K>().0.iter().zip(qk) {
        // SAFETY: xb is 256 floats, b.qs 256 bytes, b.bsums 16 × i16.
        unsafe {
            let p = xb.as_ptr();
            let mut m = _mm256_setzero_ps();
            for i in 0..32 {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * i))));
            }
            let amax = hmax(m);
            let ids = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            b.d = q8xk_scale(amax, ids);
            let id = _mm256_set1_ps(ids);
            for c in 0..8 {
                let pc = p.add(32 * c);
                let i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(pc), id));
                let i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(pc.add(8)), id));
                let i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(pc.add(16)), id));
                let i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(pc.add(24)), id));
                let p8 = _mm256_permutevar8x32_epi32(
                    _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3)),
                    perm,
                );
                _mm256_storeu_si256(b.qs.as_mut_ptr().add(32 * c) as *mut __m256i, p8);
            }
        }
        for (j, sum) in b.bsums.iter_mut().enumerate() {
            *sum = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum();
        }
    }
}

#[inline(always)]
unsafe fn hmax(m: __m256) -> f32 {
    unsafe {
        let m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
        let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        _mm_cvtss_f32(m4)
    }
}

#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
        _mm_cvtsi128_si32(s)
    }
}

// --- 32-element types against Q8x32 ---

/// Bytes ahead of the current weight block to prefetch (a prefetch never faults, so running
/// past the end of the matrix is harmless).
const PREFETCH: usize = 4096;

/// A 32-element weight block type as the SIMD kernel sees it.
pub(super) trait Blk32 {
    const BYTES: usize;
    /// Quants are signed (Q8_0), needing the sign trick before `maddubs`.
    const SIGNED: bool;
    /// Whether the [d, m] product's second lane matters.
    const HAS_M: bool;
    /// The 32 quants as bytes (unsigned unless SIGNED).
    unsafe fn quants(p: *const u8) -> __m256i;
    /// [d, m, 0, 0] where a value is d·q + m.
    unsafe fn dm(p: *const u8) -> __m128;
    /// For the GROUP blocks from p: ([d0, d1, d2, d3] twice, [m0, m1, m2, m3] twice).
    unsafe fn group_dm(p: *const u8) -> (__m256, __m256);
}

/// The f16 `d` of four consecutive blocks of `bytes` each, as [d0..d3] twice.
#[inline(always)]
unsafe fn group_d(p: *const u8, bytes: usize) -> __m256 {
    unsafe {
        let h = |j: usize| (p.add(j * bytes) as *const u16).read_unaligned() as i16;
        let d = _mm_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), 0, 0, 0, 0));
        _mm256_set_m128(d, d)
    }
}

/// The f16 pairs (d, m) of four consecutive blocks of `bytes` each, as ([d0..d3] twice,
/// [m0..m3] twice).
#[inline(always)]
unsafe fn group_dm_pairs(p: *const u8, bytes: usize) -> (__m256, __m256) {
    unsafe {
        let u = |j: usize| (p.add(j * bytes) as *const u32).read_unaligned() as i32;
        let v = _mm256_cvtph_ps(_mm_setr_epi32(u(0), u(1), u(2), u(3)));
        (
            _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)),
            _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7)),
        )
    }
}

/// 32 nibbles from 16 bytes: low nibbles in bytes 0..16, high nibbles in 16..32.
#[inline(always)]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    unsafe {
        let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
        let v = _mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4));
        _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
    }
}

/// 0x10 in byte j where bit j of the little-endian u32 at p is set.
#[inline(always)]
unsafe fn fifth_bits32(p: *const u8) -> __m256i {
    unsafe {
        let h = (p as *const u32).read_unaligned() as i32;
        let shuf = _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(h), shuf);
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
}

#[inline(always)]
unsafe fn half1(p: *const u8) -> __m128 {
    unsafe { _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const u16).read_unaligned() as i32)) }
}

#[inline(always)]
unsafe fn half2(p: *const u8) -> __m128 {
    unsafe { _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const u32).read_unaligned() as i32)) }
}

struct B4_0;
impl Blk32 for B4_0 {
    const BYTES: usize = layout::Q4_0;
    const SIGNED: bool = false;
    const HAS_M: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        unsafe { nibbles32(p.add(2)) }
    }
    #[inline(always)]
    unsafe fn dm(p: *const u8) -> __m128 {
        unsafe {
            let d = half1(p);
            _mm_mul_ps(_mm_shuffle_ps::<0>(d, d), _mm_setr_ps(1.0, -8.0, 0.0, 0.0))
        }
    }
    #[inline(always)]
    unsafe fn group_dm(p: *const u8) -> (__m256, __m256) {
        unsafe {
            let d = group_d(p, Self::BYTES);
            (d, _mm256_mul_ps(d, _mm256_set1_ps(-8.0)))
        }
    }
}

struct B4_1;
impl Blk32 for B4_1 {
    const BYTES: usize = layout::Q4_1;
    const SIGNED: bool = false;
    const HAS_M: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        unsafe { nibbles32(p.add(4)) }
    }
    #[inline(always)]
    unsafe fn dm(p: *const u8) -> __m128 {
        unsafe { half2(p) }
    }
    #[inline(always)]
    unsafe fn group_dm(p: *const u8) -> (__m256, __m256) {
        unsafe { group_dm_pairs(p, Self::BYTES) }
    }
}

struct B5_0;
impl Blk32 for B5_0 {
    const BYTES: usize = layout::Q5_0;
    const SIGNED: bool = false;
    const HAS_M: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        unsafe { _mm256_or_si256(nibbles32(p.add(6)), fifth_bits32(p.add(2))) }
    }
    #[inline(always)]
    unsafe fn dm(p: *const u8) -> __m128 {
        unsafe {
            let d = half1(p);
            _mm_mul_ps(_mm_shuffle_ps::<0>(d, d), _mm_setr_ps(1.0, -16.0, 0.0, 0.0))
        }
    }
    #[inline(always)]
    unsafe fn group_dm(p: *const u8) -> (__m256, __m256) {
        unsafe {
            let d = group_d(p, Self::BYTES);
            (d, _mm256_mul_ps(d, _mm256_set1_ps(-16.0)))
        }
    }
}

struct B5_1;
impl Blk32 for B5_1 {
    const BYTES: usize = layout::Q5_1;
    const SIGNED: bool = false;
    const HAS_M: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        unsafe { _mm256_or_si256(nibbles32(p.add(8)), fifth_bits32(p.add(4))) }
    }
    #[inline(always)]
    unsafe fn dm(p: *const u8) -> __m128 {
        unsafe { half2(p) }
    }
    #[inline(always)]
    unsafe fn group_dm(p: *const u8) -> (__m256, __m256) {
        unsafe { group_dm_pairs(p, Self::BYTES) }
    }
}

struct B8_0;
impl Blk32 for B8_0 {
    const BYTES: usize = layout::Q8_0;
    const SIGNED: bool = true;
    const HAS_M: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        unsafe { _mm256_loadu_si256(p.add(2) as *const __m256i) }
    }
    #[inline(always)]
    unsafe fn dm(p: *const u8) -> __m128 {
        unsafe { half1(p) }
    }
    #[inline(always)]
    unsafe fn group_dm(p: *const u8) -> (__m256, __m256) {
        unsafe { (group_d(p, Self::BYTES), _mm256_setzero_ps()) }
    }
}

/// Defines `$name::<B>`, which runs `$tiled::<B, T>` with the token tile `T` (1..=4) as a
/// constant, so that each token's accumulators stay in registers.
macro_rules! tile_dispatch {
    ($name:ident, $tiled:ident, $bound:ident) => {
        pub(super) unsafe fn $name<B: $bound>(
            w: &[u8],
            rows: usize,
            cols: usize,
            act: &Activation,
            t0: usize,
            nt: usize,
            out: &mut [f32],
        ) {
            // SAFETY: the caller (Kernel::dot_rows) checked sizes; Kernel::new checked the
            // ISA.
            unsafe {
                match nt {
                    1 => $tiled::<B, 1>(w, rows, cols, act, t0, out),
                    2 => $tiled::<B, 2>(w, rows, cols, act, t0, out),
                    3 => $tiled::<B, 3>(w, rows, cols, act, t0, out),
                    _ => $tiled::<B, 4>(w, rows, cols, act, t0, out),
                }
            }
        }
    };
}

tile_dispatch!(rows_32, rows_32_t, Blk32);

mod kquants;
mod lowbit;
pub(super) use kquants::k_scales_mins;
use kquants::*;
use lowbit::*;

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_32_t<B: Blk32, const T: usize>(
    w: &[u8],
    rows: usize,
    cols: usize,
    act: &Activation,
    t0: usize,
    out: &mut [f32],
) {
    let nb = cols / QK;
    let ng = nb / GROUP;
    let rb = nb * B::BYTES;
    let qa = act.q32[t0 * nb..(t0 + T) * nb].as_ptr();
    let ds = act.ds32[t0 * nb..(t0 + T) * nb].as_ptr();
    let gs = act.g32[t0 * ng..(t0 + T) * ng].as_ptr();
    let ones = _mm256_set1_epi16(1);
    for r in 0..rows {
        // SAFETY: row r spans rb bytes inside w; the token tile spans T·nb blocks of qa/ds
        // and T·ng groups of gs.
        unsafe {
            let row = w.as_ptr().add(r * rb);
            let mut acc = [_mm256_setzero_ps(); T];
            // The min terms get their own chain (the FMA latency is exposed with few tokens), at
            // every tile size: a token's sum must be added in the same order whatever tile it is
            // in (`quant_props`: a one-token pass and a tile agree to the bit).
            let mut accm = [_mm256_setzero_ps(); T];
            for g in 0..ng {
                let p = row.add(g * GROUP * B::BYTES);
                // Decode streams the weights from DRAM once: ask for them ahead of time.
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + 64) as *const i8);
                let (wd, wm) = B::group_dm(p);
                let qx: [__m256i; GROUP] = std::array::from_fn(|j| B::quants(p.add(j * B::BYTES)));
                let ax: [__m256i; GROUP] = std::array::from_fn(|j| {
                    if B::SIGNED {
                        _mm256_sign_epi8(qx[j], qx[j])
                    } else {
                        qx[j]
                    }
                });
                for t in 0..T {
                    let a = qa.add(t * nb + g * GROUP);
                    let dot = |j: usize| {
                        let qy = _mm256_load_si256(a.add(j) as *const __m256i);
                        let qy = if B::SIGNED {
                            _mm256_sign_epi8(qy, qx[j])
                        } else {
                            qy
                        };
                        _mm256_madd_epi16(_mm256_maddubs_epi16(ax[j], qy), ones)
                    };
                    // Lane j (mod 4) of the sum holds half of block j's dot product.
                    let h = _mm256_hadd_epi32(
                        _mm256_hadd_epi32(dot(0), dot(1)),
                        _mm256_hadd_epi32(dot(2), dot(3)),
                    );
                    let gv = &*gs.add(t * ng + g);
                    let sc = _mm256_mul_ps(wd, _mm256_load_ps(gv.d.as_ptr()));
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), sc, acc[t]);
                    if B::HAS_M {
                        let s = _mm256_load_ps(gv.s.as_ptr());
                        accm[t] = _mm256_fmadd_ps(wm, s, accm[t]);
                    }
                }
            }
            // The blocks after the last whole group, one at a time.
            let mut acc1 = [_mm_setzero_ps(); T];
            for b in ng * GROUP..nb {
                step_32::<B, T>(row, b, nb, qa, ds, ones, &mut accm, &mut acc1);
            }
            for t in 0..T {
                let mut s = hsum(_mm256_add_ps(acc[t], accm[t]));
                if B::HAS_M {
                    s += _mm_cvtss_f32(_mm_movehdup_ps(acc1[t]));
                }
                *out.get_unchecked_mut(r * T + t) = s;
            }
        }
    }
}

/// Block b of a row against T tokens: acc += d_w·d_a·(q·a) per lane, accm lane 1 += m_w·s_a.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn step_32<B: Blk32, const T: usize>(
    row: *const u8,
    b: usize,
    nb: usize,
    qa: *const Q8x32,
    ds: *const [f32; 2],
    ones: __m256i,
    acc: &mut [__m256; T],
    accm: &mut [__m128; T],
) {
    unsafe {
        let p = row.add(b * B::BYTES);
        let qx = B::quants(p);
        let dm = B::dm(p);
        let ax = if B::SIGNED {
            _mm256_sign_epi8(qx, qx)
        } else {
            qx
        };
        for t in 0..T {
            let qy = _mm256_load_si256(qa.add(t * nb + b) as *const __m256i);
            let qy = if B::SIGNED {
                _mm256_sign_epi8(qy, qx)
            } else {
                qy
            };
            let p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, qy), ones);
            let dsa = _mm_castpd_ps(_mm_load_sd(ds.add(t * nb + b) as *const f64));
            let prod = _mm_mul_ps(dm, dsa);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), _mm256_broadcastss_ps(prod), acc[t]);
            if B::HAS_M {
                accm[t] = _mm_add_ps(accm[t], prod);
            }
        }
    }
}
