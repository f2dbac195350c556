//! The AVX2 kernel on [`PackedMatrix`] groups (layout in `packed.rs`). A 64-byte quant chunk of
//! a group is two 256-bit halves, rows 0..8 and rows 8..16; each half runs as its own 8-row
//! pass, one ymm accumulator per token whose lane `i` is row `i` of the half.
//!
//! Per block: the half's quants are loaded once and unpacked into eight registers (one per four
//! elements); each token then takes eight `maddubs` against its four activation bytes broadcast,
//! summed in 16 bits (a 4-bit quant times an 8-bit activation, 16 terms, stays below 2¹⁵), one
//! `madd` to 32 bits, one conversion and two multiply-adds (by d_w·d_a and m_w·(d_a·Σq_a)).
//! Q4_K does the same per 32-element sub-block, its `madd` multiplying by the sub-block's scale.

#![allow(clippy::needless_range_loop)] // indexing per token keeps the accumulators in registers

use super::packed::{
    PACK_ROWS, PackFmt, PackedMatrix, Q4K_BLOCK, Q4K_D, Q4K_DMIN, Q4K_MIN, Q4K_SC,
};
use super::{Activation, QK, QK_K};
use std::arch::x86_64::*;

/// Rows per half.
const HALF: usize = PACK_ROWS / 2;

/// Runs the kernel of `pm`'s format with the token tile as a constant.
///
/// # Safety
/// AVX2/FMA/F16C present; `data` holds `ng` groups of `pm`; the token tile lies in `act`, whose
/// format and width are `pm`'s; `out` holds `ng · nt · 16` floats.
pub(super) unsafe fn groups(
    pm: &PackedMatrix,
    data: &[u8],
    ng: usize,
    act: &Activation,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    macro_rules! go {
        ($($t:literal)*) => {
            match nt {
                $($t => match pm.fmt {
                    PackFmt::Q4_0 => groups_32::<false, $t>(pm, data, ng, act, t0, out),
                    PackFmt::Q4_1 => groups_32::<true, $t>(pm, data, ng, act, t0, out),
                    PackFmt::Q5_0 => groups_8::<Q5_0, $t>(pm, data, ng, act, t0, out),
                    PackFmt::Q5_1 => groups_8::<Q5_1, $t>(pm, data, ng, act, t0, out),
                    PackFmt::Q8_0 => groups_8::<Q8_0, $t>(pm, data, ng, act, t0, out),
                    PackFmt::Q4K => groups_q4k::<$t>(pm, data, ng, act, t0, out),
                },)*
                _ => unreachable!("token tile {nt}"),
            }
        };
    }
    // SAFETY: forwarded from the caller.
    unsafe { go!(1 2 3 4) }
}

/// Bytes ahead of the current block to prefetch (a prefetch never faults).
const PREFETCH: usize = 1024;

/// Q4_0 (`M` false: m = −8·d) and Q4_1 (`M` true: m stored).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn groups_32<const M: bool, const T: usize>(
    pm: &PackedMatrix,
    data: &[u8],
    ng: usize,
    act: &Activation,
    t0: usize,
    out: &mut [f32],
) {
    let nb = pm.cols() / QK;
    let qb = pm.fmt.quant_bytes();
    let qa = act.q32[t0 * nb..(t0 + T) * nb].as_ptr() as *const u8;
    let ds = act.ds32[t0 * nb..(t0 + T) * nb].as_ptr() as *const f32;
    let nib = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    for g in 0..ng {
        for half in 0..2 {
            // SAFETY: group g spans group_bytes inside data: quants nb·qb, then nb·16 f16 d (and
            // m); token k's block b is at qa + (k·nb + b)·32, its [d, d·Σq] at ds + (k·nb + b)·2.
            unsafe {
                let base = data.as_ptr().add(g * pm.group_bytes);
                let dptr = base.add(nb * qb + half * 16);
                let mut acc = [_mm256_setzero_ps(); T];
                for b in 0..nb {
                    let q = base.add(b * qb + half * 32);
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(PREFETCH) as *const i8);
                    let mut w = [_mm256_setzero_si256(); 8];
                    for j in 0..4 {
                        let v = _mm256_load_si256(q.add(64 * j) as *const __m256i);
                        w[j] = _mm256_and_si256(v, nib);
                        w[j + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
                    }
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(dptr.add(b * 32) as *const __m128i));
                    let m = if M {
                        _mm256_cvtph_ps(_mm_loadu_si128(dptr.add((nb + b) * 32) as *const __m128i))
                    } else {
                        _mm256_mul_ps(d, _mm256_set1_ps(-8.0))
                    };
                    for t in 0..T {
                        let a = qa.add((t * nb + b) * QK);
                        let mut s16 = _mm256_setzero_si256();
                        for j in 0..8 {
                            // Elements 4j..4j+4 of the block (low nibbles are j < 4).
                            let av =
                                _mm256_set1_epi32((a.add(4 * j) as *const i32).read_unaligned());
                            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[j], av));
                        }
                        let dot = _mm256_madd_epi16(s16, ones);
                        let dsa = ds.add((t * nb + b) * 2);
                        let sd = _mm256_mul_ps(d, _mm256_set1_ps(*dsa));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sd, acc[t]);
                        acc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(*dsa.add(1)), acc[t]);
                    }
                }
                let o = out.as_mut_ptr().add(g * T * PACK_ROWS + half * HALF);
                for t in 0..T {
                    _mm256_storeu_ps(o.add(t * PACK_ROWS), acc[t]);
                }
            }
        }
    }
}

/// The byte formats (`groups_8`'s `K`).
const Q5_0: u8 = 0;
const Q5_1: u8 = 1;
const Q8_0: u8 = 2;

/// Q5_0, Q5_1 (values 0..32 a byte; m = −16·d or stored) and Q8_0 (signed bytes, m = 0: the sign
/// moves onto the activation so that `maddubs` sees |w|).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn groups_8<const K: u8, const T: usize>(
    pm: &PackedMatrix,
    data: &[u8],
    ng: usize,
    act: &Activation,
    t0: usize,
    out: &mut [f32],
) {
    let nb = pm.cols() / QK;
    let qb = pm.fmt.quant_bytes();
    let qa = act.q32[t0 * nb..(t0 + T) * nb].as_ptr() as *const u8;
    let ds = act.ds32[t0 * nb..(t0 + T) * nb].as_ptr() as *const f32;
    let ones = _mm256_set1_epi16(1);
    for g in 0..ng {
        for half in 0..2 {
            // SAFETY: group g spans group_bytes inside data: quants nb·qb, then nb·16 f16 d (and
            // m); token k's block b is at qa + (k·nb + b)·32, its [d, d·Σq] at ds + (k·nb + b)·2.
            unsafe {
                let base = data.as_ptr().add(g * pm.group_bytes);
                let dptr = base.add(nb * qb + half * 16);
                let mut acc = [_mm256_setzero_ps(); T];
                for b in 0..nb {
                    let q = base.add(b * qb + half * 32);
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(PREFETCH) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(PREFETCH + 256) as *const i8);
                    let w: [__m256i; 8] =
                        std::array::from_fn(|j| _mm256_load_si256(q.add(64 * j) as *const __m256i));
                    let aw: [__m256i; 8] = if K == Q8_0 {
                        std::array::from_fn(|j| _mm256_sign_epi8(w[j], w[j]))
                    } else {
                        w
                    };
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(dptr.add(b * 32) as *const __m128i));
                    let m = match K {
                        Q5_1 => _mm256_cvtph_ps(_mm_loadu_si128(
                            dptr.add((nb + b) * 32) as *const __m128i
                        )),
                        Q5_0 => _mm256_mul_ps(d, _mm256_set1_ps(-16.0)),
                        _ => _mm256_setzero_ps(),
                    };
                    for t in 0..T {
                        let a = qa.add((t * nb + b) * QK);
                        let mut s32 = _mm256_setzero_si256();
                        // A Q8_0 pair may reach 2·128·127: each goes to 32 bits alone. Q5's
                        // (2·31·127) add up four at a time in 16 bits first.
                        let per = if K == Q8_0 { 1 } else { 4 };
                        for j0 in (0..8).step_by(per) {
                            let mut s16 = _mm256_setzero_si256();
                            for j in j0..j0 + per {
                                let av = _mm256_set1_epi32(
                                    (a.add(4 * j) as *const i32).read_unaligned(),
                                );
                                let av = if K == Q8_0 {
                                    _mm256_sign_epi8(av, w[j])
                                } else {
                                    av
                                };
                                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(aw[j], av));
                            }
                            s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(s16, ones));
                        }
                        let dsa = ds.add((t * nb + b) * 2);
                        let sd = _mm256_mul_ps(d, _mm256_set1_ps(*dsa));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), sd, acc[t]);
                        if K != Q8_0 {
                            acc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(*dsa.add(1)), acc[t]);
                        }
                    }
                }
                let o = out.as_mut_ptr().add(g * T * PACK_ROWS + half * HALF);
                for t in 0..T {
                    _mm256_storeu_ps(o.add(t * PACK_ROWS), acc[t]);
                }
            }
        }
    }
}

/// Q4_K, per 32-element sub-block: the eight `maddubs` sums meet the sub-block's scale in the
/// `madd` (the scale sits in both 16-bit halves of each lane), the mins meet pairs of the
/// activation's 16-element sums in one `madd` per pair of sub-blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn groups_q4k<const T: usize>(
    pm: &PackedMatrix,
    data: &[u8],
    ng: usize,
    act: &Activation,
    t0: usize,
    out: &mut [f32],
) {
    let nb = pm.cols() / QK_K;
    let qa = act.qk[t0 * nb..(t0 + T) * nb].as_ptr();
    let nib = _mm256_set1_epi8(0x0F);
    for g in 0..ng {
        for half in 0..2 {
            // SAFETY: group g spans nb packed blocks of Q4K_BLOCK bytes inside data (offsets in
            // packed.rs); token t's block b is qa[t·nb + b].
            unsafe {
                let base = data.as_ptr().add(g * pm.group_bytes);
                let mut acc = [_mm256_setzero_ps(); T];
                for b in 0..nb {
                    let p = base.add(b * Q4K_BLOCK);
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(Q4K_BLOCK) as *const i8);
                    let mut isum = [_mm256_setzero_si256(); T];
                    for s in 0..8 {
                        let h = s / 2;
                        let mut w = [_mm256_setzero_si256(); 8];
                        for k in 0..8 {
                            let v = _mm256_load_si256(
                                p.add((8 * h + k) * 64 + half * 32) as *const __m256i
                            );
                            let v = if s % 2 == 0 {
                                v
                            } else {
                                _mm256_srli_epi16::<4>(v)
                            };
                            w[k] = _mm256_and_si256(v, nib);
                        }
                        // The 8 rows' scales of sub-block s in both 16-bit halves of each lane.
                        let sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                            p.add(Q4K_SC + s * PACK_ROWS + half * HALF) as *const __m128i,
                        ));
                        let sc = _mm256_or_si256(sc, _mm256_slli_epi32::<16>(sc));
                        for t in 0..T {
                            let a = (*qa.add(t * nb + b)).qs.as_ptr().add(32 * s) as *const u8;
                            let mut s16 = _mm256_setzero_si256();
                            for k in 0..8 {
                                let av = _mm256_set1_epi32(
                                    (a.add(4 * k) as *const i32).read_unaligned(),
                                );
                                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[k], av));
                            }
                            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16, sc));
                        }
                    }
                    let dh = |off: usize| {
                        _mm256_cvtph_ps(_mm_loadu_si128(p.add(off + half * 16) as *const __m128i))
                    };
                    let (d, dmin) = (dh(Q4K_D), dh(Q4K_DMIN));
                    let mins: [__m256i; 4] = std::array::from_fn(|pp| {
                        _mm256_cvtepu8_epi16(_mm_loadu_si128(
                            p.add(Q4K_MIN + pp * 2 * PACK_ROWS + half * 2 * HALF) as *const __m128i,
                        ))
                    });
                    for t in 0..T {
                        let a = &*qa.add(t * nb + b);
                        let mut summ = _mm256_setzero_si256();
                        for (pp, m) in mins.iter().enumerate() {
                            let bs = &a.bsums[4 * pp..4 * pp + 4];
                            let s0 = bs[0].wrapping_add(bs[1]) as u16 as u32;
                            let s1 = bs[2].wrapping_add(bs[3]) as u16 as u32;
                            let pair = _mm256_set1_epi32((s0 | (s1 << 16)) as i32);
                            summ = _mm256_add_epi32(summ, _mm256_madd_epi16(*m, pair));
                        }
                        let da = _mm256_set1_ps(a.d);
                        acc[t] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(isum[t]),
                            _mm256_mul_ps(d, da),
                            acc[t],
                        );
                        acc[t] = _mm256_fnmadd_ps(
                            _mm256_cvtepi32_ps(summ),
                            _mm256_mul_ps(dmin, da),
                            acc[t],
                        );
                    }
                }
                let o = out.as_mut_ptr().add(g * T * PACK_ROWS + half * HALF);
                for t in 0..T {
                    _mm256_storeu_ps(o.add(t * PACK_ROWS), acc[t]);
                }
            }
        }
    }
}
