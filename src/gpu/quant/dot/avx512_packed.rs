//! The AVX-512 VNNI kernel on [`PackedMatrix`] groups of the 32-element types (layout in
//! `packed.rs`). A 64-byte quant chunk of a group is one 512-bit register whose 32-bit lane `i`
//! is row `i`: one `vpdpbusd` against four activation bytes broadcast advances all 16 rows' dot
//! products by four elements (the AVX2 kernel needs two 8-row halves, each a `maddubs` and an
//! add per four elements, and a `madd` per block).
//!
//! Weights enter `vpdpbusd` unsigned: Q4_0/Q4_1 nibbles and Q5 values as stored, Q8_0's signed
//! bytes offset by 128 (an xor), that offset going into the m term as Q4_0's −8 does (m = −128·d:
//! exact, the activation's `d·Σq` of a Q8_0-style activation is exact in f32).
//!
//! Q4_K: per 32-element sub-block, eight `vpdpbusd` give each row's integer sum, one `vpmulld`
//! by the 16 rows' six-bit scales; the mins meet pairs of the activation's 16-element sums in
//! one `vpmaddwd` per pair of sub-blocks, as in the AVX2 kernel.

#![allow(clippy::needless_range_loop)] // indexing per token keeps the accumulators in registers

use super::packed::{
    PACK_ROWS, PackFmt, PackedMatrix, Q4K_BLOCK, Q4K_D, Q4K_DMIN, Q4K_MIN, Q4K_SC,
};
use super::{Activation, QK, QK_K};
use std::arch::x86_64::*;

/// Whether `fmt` has a kernel here (all the packed formats do).
pub(super) fn covers(_fmt: PackFmt) -> bool {
    true
}

/// Runs the kernel of `pm`'s format with the token tile as a constant.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C present; `data` holds `ng` groups of `pm`;
/// the token tile lies in `act`, whose format and width are `pm`'s; `out` holds `ng · nt · 16`
/// floats.
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
                    PackFmt::Q4_0 => groups_k::<Q4_0, $t>(pm, data, ng, act, t0, out),
                    PackFmt::Q4_1 => groups_k::<Q4_1, $t>(pm, data, ng, act, t0, out),
                    PackFmt::Q5_0 => groups_k::<Q5_0, $t>(pm, data, ng, act, t0, out),
                    PackFmt::Q5_1 => groups_k::<Q5_1, $t>(pm, data, ng, act, t0, out),
                    PackFmt::Q8_0 => groups_k::<Q8_0, $t>(pm, data, ng, act, t0, out),
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

/// The formats (`groups_k`'s `K`).
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn groups_k<const K: u8, const T: usize>(
    pm: &PackedMatrix,
    data: &[u8],
    ng: usize,
    act: &Activation,
    t0: usize,
    out: &mut [f32],
) {
    let nb = pm.cols() / QK;
    let qb = pm.fmt.quant_bytes();
    let nibbles = K == Q4_0 || K == Q4_1;
    let qa = act.q32[t0 * nb..(t0 + T) * nb].as_ptr() as *const u8;
    let ds = act.ds32[t0 * nb..(t0 + T) * nb].as_ptr() as *const f32;
    let nib = _mm512_set1_epi8(0x0F);
    let flip = _mm512_set1_epi8(-128);
    for g in 0..ng {
        // SAFETY: group g spans group_bytes inside data: quants nb·qb, then nb·16 f16 d (and m);
        // token k's block b is at qa + (k·nb + b)·32, its [d, d·Σq] at ds + (k·nb + b)·2.
        unsafe {
            let base = data.as_ptr().add(g * pm.group_bytes);
            let dptr = base.add(nb * qb);
            let mut acc = [_mm512_setzero_ps(); T];
            for b in 0..nb {
                let q = base.add(b * qb);
                _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(PREFETCH) as *const i8);
                let mut w = [_mm512_setzero_si512(); 8];
                if nibbles {
                    for j in 0..4 {
                        let v = _mm512_loadu_si512(q.add(64 * j) as *const __m512i);
                        w[j] = _mm512_and_si512(v, nib);
                        w[j + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
                    }
                } else {
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(PREFETCH + 256) as *const i8);
                    for j in 0..8 {
                        let v = _mm512_loadu_si512(q.add(64 * j) as *const __m512i);
                        w[j] = if K == Q8_0 {
                            _mm512_xor_si512(v, flip)
                        } else {
                            v
                        };
                    }
                }
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(dptr.add(b * 32) as *const __m256i));
                let m = match K {
                    Q4_1 | Q5_1 => _mm512_cvtph_ps(_mm256_loadu_si256(
                        dptr.add((nb + b) * 32) as *const __m256i
                    )),
                    Q4_0 => _mm512_mul_ps(d, _mm512_set1_ps(-8.0)),
                    Q5_0 => _mm512_mul_ps(d, _mm512_set1_ps(-16.0)),
                    _ => _mm512_mul_ps(d, _mm512_set1_ps(-128.0)),
                };
                for t in 0..T {
                    let a = qa.add((t * nb + b) * QK);
                    // Two chains per token, so that the multiply-adds' latency overlaps.
                    let mut s0 = _mm512_setzero_si512();
                    let mut s1 = _mm512_setzero_si512();
                    for j in 0..4 {
                        let a0 = _mm512_set1_epi32((a.add(4 * j) as *const i32).read_unaligned());
                        let a1 =
                            _mm512_set1_epi32((a.add(16 + 4 * j) as *const i32).read_unaligned());
                        // w[j] holds elements 4j.., w[j + 4] elements 16 + 4j.. (a nibble
                        // chunk's low and high halves; a byte format's chunks j and j + 4).
                        s0 = _mm512_dpbusd_epi32(s0, w[j], a0);
                        s1 = _mm512_dpbusd_epi32(s1, w[j + 4], a1);
                    }
                    let s = _mm512_add_epi32(s0, s1);
                    let dsa = ds.add((t * nb + b) * 2);
                    let sd = _mm512_mul_ps(d, _mm512_set1_ps(*dsa));
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sd, acc[t]);
                    acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(*dsa.add(1)), acc[t]);
                }
            }
            let o = out.as_mut_ptr().add(g * T * PACK_ROWS);
            for t in 0..T {
                _mm512_storeu_ps(o.add(t * PACK_ROWS), acc[t]);
            }
        }
    }
}

/// Q4_K (layout: `packed.rs`'s `Q4K_*` offsets).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
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
    let nib = _mm512_set1_epi8(0x0F);
    for g in 0..ng {
        // SAFETY: group g spans nb packed blocks of Q4K_BLOCK bytes inside data (offsets in
        // packed.rs); token t's block b is qa[t·nb + b].
        unsafe {
            let base = data.as_ptr().add(g * pm.group_bytes);
            let mut acc = [_mm512_setzero_ps(); T];
            for b in 0..nb {
                let p = base.add(b * Q4K_BLOCK);
                let mut isum = [_mm512_setzero_si512(); T];
                for s in 0..8 {
                    let h = s / 2;
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(Q4K_BLOCK + s * 256) as *const i8);
                    let mut w = [_mm512_setzero_si512(); 8];
                    for k in 0..8 {
                        let v = _mm512_loadu_si512(p.add((8 * h + k) * 64) as *const __m512i);
                        let v = if s % 2 == 0 {
                            v
                        } else {
                            _mm512_srli_epi16::<4>(v)
                        };
                        w[k] = _mm512_and_si512(v, nib);
                    }
                    let sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                        p.add(Q4K_SC + s * PACK_ROWS) as *const __m128i
                    ));
                    for t in 0..T {
                        let a = (*qa.add(t * nb + b)).qs.as_ptr().add(32 * s) as *const u8;
                        let mut s0 = _mm512_setzero_si512();
                        let mut s1 = _mm512_setzero_si512();
                        for k in 0..4 {
                            let a0 =
                                _mm512_set1_epi32((a.add(4 * k) as *const i32).read_unaligned());
                            let a1 = _mm512_set1_epi32(
                                (a.add(16 + 4 * k) as *const i32).read_unaligned(),
                            );
                            s0 = _mm512_dpbusd_epi32(s0, w[k], a0);
                            s1 = _mm512_dpbusd_epi32(s1, w[k + 4], a1);
                        }
                        let sum = _mm512_add_epi32(s0, s1);
                        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(sum, sc));
                    }
                }
                let dh =
                    |off: usize| _mm512_cvtph_ps(_mm256_loadu_si256(p.add(off) as *const __m256i));
                let (d, dmin) = (dh(Q4K_D), dh(Q4K_DMIN));
                let mins: [__m512i; 4] = std::array::from_fn(|pp| {
                    _mm512_cvtepu8_epi16(_mm256_loadu_si256(
                        p.add(Q4K_MIN + pp * 2 * PACK_ROWS) as *const __m256i
                    ))
                });
                for t in 0..T {
                    let a = &*qa.add(t * nb + b);
                    let mut summ = _mm512_setzero_si512();
                    for (pp, m) in mins.iter().enumerate() {
                        let bs = &a.bsums[4 * pp..4 * pp + 4];
                        let s0 = bs[0].wrapping_add(bs[1]) as u16 as u32;
                        let s1 = bs[2].wrapping_add(bs[3]) as u16 as u32;
                        let pair = _mm512_set1_epi32((s0 | (s1 << 16)) as i32);
                        summ = _mm512_add_epi32(summ, _mm512_madd_epi16(*m, pair));
                    }
                    let da = _mm512_set1_ps(a.d);
                    acc[t] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(d, da), acc[t]);
                    acc[t] =
                        _mm512_fnmadd_ps(_mm512_cvtepi32_ps(summ), _mm512_mul_ps(dmin, da), acc[t]);
                }
            }
            let o = out.as_mut_ptr().add(g * T * PACK_ROWS);
            for t in 0..T {
                _mm512_storeu_ps(o.add(t * PACK_ROWS), acc[t]);
            }
        }
    }
}
