//! AVX-512 (BW, VNNI) row kernels for Q4_K, Q5_K and Q6_K against Q8xK, the decode path of the
//! 256-element types (prompts of Q4_K run the packed kernels).
//!
//! Where the AVX2 kernels take a 32-element sub-block per 256-bit register, one 512-bit register
//! here holds two sub-blocks whose activation bytes lie next to each other (Q4_K/Q5_K: the low and
//! high nibbles of one 32-byte run, elements 64j..64j+64; Q6_K: two of its 32-element runs), so
//! that the activation is one 64-byte load; `vpmaddubsw` multiplies, and `vpdpwssd` multiplies
//! the 16-bit pair sums by the sub-blocks' scales and adds them to the integer sum in one
//! instruction (AVX2: `madd` then `add`). The mins (Q4_K/Q5_K) and Q6_K's −32 offset are folded
//! in once per super-block from the activation's 16-element sums, as in the AVX2 kernels.

#![allow(clippy::needless_range_loop)] // indexing per token keeps the accumulators in registers

use super::super::blocks::layout;
use super::avx2::k_scales_mins;
use super::*;
use std::arch::x86_64::*;

/// The AVX-512 kernel for a K-quant, or `None` where the AVX2 one serves.
pub(super) fn kernel(ty: GgmlType) -> Option<KernelFn> {
    Some(match ty {
        GgmlType::Q4K => rows::<K4>,
        GgmlType::Q5K => rows::<K5>,
        GgmlType::Q6K => rows::<K6>,
        _ => return None,
    })
}

/// Bytes ahead of the current super-block to prefetch (a prefetch never faults).
const PREFETCH: usize = 2048;

trait BlkK {
    const BYTES: usize;
    /// Adds this super-block's contribution for each of T tokens to acc.
    unsafe fn superblock<const T: usize>(p: *const u8, a: [*const Q8xK; T], acc: &mut [__m512; T]);
}

/// The f16 pair at p as f32s (d, dmin).
#[inline(always)]
unsafe fn half2(p: *const u8) -> (f32, f32) {
    unsafe {
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const u32).read_unaligned() as i32));
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }
}

/// `i16` scales `2j` (elements 0..16 of the result) and `2j + 1` (16..32) of `scales`
/// (sc0..sc7 in its low 8 i16s).
#[inline(always)]
unsafe fn scale_pair(scales: __m256i, j: usize) -> __m512i {
    unsafe {
        let idx = _mm512_inserti64x4::<1>(
            _mm512_set1_epi16(2 * j as i16),
            _mm256_set1_epi16(2 * j as i16 + 1),
        );
        _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(scales))
    }
}

/// The two 32-byte halves `lo` (elements 0..32 of the result) and `hi` (32..64).
#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    unsafe { _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi) }
}

/// Q4_K/Q5_K's mins term, −d_a·dmin·Σ_j m_j·(Σa)_j, into the low lanes of acc.
#[inline(always)]
unsafe fn k_mins<const T: usize>(
    dmin: f32,
    mins: __m128i,
    a: [*const Q8xK; T],
    acc: &mut [__m512; T],
) {
    unsafe {
        for t in 0..T {
            let bs = _mm256_loadu_si256((*a[t]).bsums.as_ptr() as *const __m256i);
            let q8s = _mm_hadd_epi16(
                _mm256_castsi256_si128(bs),
                _mm256_extracti128_si256::<1>(bs),
            );
            let prod = _mm_cvtepi32_ps(_mm_madd_epi16(mins, q8s));
            let f = _mm512_set1_ps(-(*a[t]).d * dmin);
            acc[t] = _mm512_fmadd_ps(f, _mm512_zextps128_ps512(prod), acc[t]);
        }
    }
}

struct K4;
impl BlkK for K4 {
    const BYTES: usize = layout::Q4_K;
    #[inline(always)]
    unsafe fn superblock<const T: usize>(p: *const u8, a: [*const Q8xK; T], acc: &mut [__m512; T]) {
        unsafe {
            let (d, dmin) = half2(p);
            let ms = k_scales_mins(p);
            k_mins::<T>(dmin, _mm256_extracti128_si256::<1>(ms), a, acc);
            let m4 = _mm256_set1_epi8(0x0F);
            let q = p.add(layout::Q4_K_QS);
            let mut sumi = [_mm512_setzero_si512(); T];
            for j in 0..4 {
                let bits = _mm256_loadu_si256(q.add(32 * j) as *const __m256i);
                let w = join(
                    _mm256_and_si256(bits, m4),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4),
                );
                let s = scale_pair(ms, j);
                for t in 0..T {
                    let y = _mm512_loadu_si512((*a[t]).qs.as_ptr().add(64 * j) as *const __m512i);
                    sumi[t] = _mm512_dpwssd_epi32(sumi[t], s, _mm512_maddubs_epi16(w, y));
                }
            }
            for t in 0..T {
                let f = _mm512_set1_ps((*a[t]).d * d);
                acc[t] = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(sumi[t]), acc[t]);
            }
        }
    }
}

struct K5;
impl BlkK for K5 {
    const BYTES: usize = layout::Q5_K;
    #[inline(always)]
    unsafe fn superblock<const T: usize>(p: *const u8, a: [*const Q8xK; T], acc: &mut [__m512; T]) {
        unsafe {
            let (d, dmin) = half2(p);
            let ms = k_scales_mins(p);
            k_mins::<T>(dmin, _mm256_extracti128_si256::<1>(ms), a, acc);
            let m4 = _mm256_set1_epi8(0x0F);
            let x10 = _mm512_set1_epi8(0x10);
            let hb = _mm256_loadu_si256(p.add(layout::Q5_K_QH) as *const __m256i);
            let hbits = join(hb, hb);
            let q = p.add(layout::Q5_K_QS);
            let mut sumi = [_mm512_setzero_si512(); T];
            for j in 0..4 {
                let bits = _mm256_loadu_si256(q.add(32 * j) as *const __m256i);
                let w = join(
                    _mm256_and_si256(bits, m4),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4),
                );
                // Bit 2j of qh is the fifth bit of the low nibbles, bit 2j + 1 of the high ones.
                let sel = join(
                    _mm256_set1_epi8((1u8 << (2 * j)) as i8),
                    _mm256_set1_epi8((2u8 << (2 * j)) as i8),
                );
                let high = _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(hbits, sel), x10);
                let w = _mm512_or_si512(w, high);
                let s = scale_pair(ms, j);
                for t in 0..T {
                    let y = _mm512_loadu_si512((*a[t]).qs.as_ptr().add(64 * j) as *const __m512i);
                    sumi[t] = _mm512_dpwssd_epi32(sumi[t], s, _mm512_maddubs_epi16(w, y));
                }
            }
            for t in 0..T {
                let f = _mm512_set1_ps((*a[t]).d * d);
                acc[t] = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(sumi[t]), acc[t]);
            }
        }
    }
}

struct K6;
impl BlkK for K6 {
    const BYTES: usize = layout::Q6_K;
    #[inline(always)]
    unsafe fn superblock<const T: usize>(p: *const u8, a: [*const Q8xK; T], acc: &mut [__m512; T]) {
        unsafe {
            let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
                (p.add(layout::Q6_K_D) as *const u16).read_unaligned() as i32,
            )));
            let scales = _mm_loadu_si128(p.add(layout::Q6_K_SCALES) as *const __m128i);
            let scales16 = _mm256_cvtepi8_epi16(scales);
            let scales512 = _mm512_castsi256_si512(scales16);
            let m4 = _mm256_set1_epi8(0x0F);
            let m3 = _mm256_set1_epi8(3);
            // Quants are stored +32: subtract 32·Σ_g sc_g·(Σa)_g once per token.
            let mut sumi = [_mm512_setzero_si512(); T];
            for t in 0..T {
                let bs = _mm256_loadu_si256((*a[t]).bsums.as_ptr() as *const __m256i);
                let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs, scales16));
                sumi[t] = _mm512_sub_epi32(sumi[t], _mm512_zextsi256_si512(off));
            }
            for h in 0..2 {
                let ql = p.add(64 * h);
                let qh = _mm256_loadu_si256(p.add(layout::Q6_K_QH + 32 * h) as *const __m256i);
                let b1 = _mm256_loadu_si256(ql as *const __m256i);
                let b2 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
                // Element l + 32k of this half: nibble of b1 (k = 0, 2) or b2 (k = 1, 3),
                // with bit pair k of qh as bits 4..6.
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(b1, m4),
                        _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m3)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(b2, m4),
                        _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(12))),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(b1), m4),
                        _mm256_and_si256(qh, _mm256_set1_epi8(48)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(b2), m4),
                        _mm256_srli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(-64))),
                    ),
                ];
                for kk in 0..2 {
                    // Runs 2kk and 2kk + 1 (elements 128h + 64kk..+64): sixteen-element groups
                    // g0..g0 + 4, one per 128-bit lane.
                    let w = join(q[2 * kk], q[2 * kk + 1]);
                    let g0 = (8 * h + 4 * kk) as i16;
                    let idx = _mm512_inserti64x4::<1>(
                        _mm512_castsi256_si512(_mm256_setr_m128i(
                            _mm_set1_epi16(g0),
                            _mm_set1_epi16(g0 + 1),
                        )),
                        _mm256_setr_m128i(_mm_set1_epi16(g0 + 2), _mm_set1_epi16(g0 + 3)),
                    );
                    let s = _mm512_permutexvar_epi16(idx, scales512);
                    for t in 0..T {
                        let y = _mm512_loadu_si512(
                            (*a[t]).qs.as_ptr().add(128 * h + 64 * kk) as *const __m512i
                        );
                        sumi[t] = _mm512_dpwssd_epi32(sumi[t], s, _mm512_maddubs_epi16(w, y));
                    }
                }
            }
            for t in 0..T {
                let f = _mm512_set1_ps((*a[t]).d * d);
                acc[t] = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(sumi[t]), acc[t]);
            }
        }
    }
}

/// Runs `rows_t::<B, T>` with the token tile `T` (1..=4) as a constant.
unsafe fn rows<B: BlkK>(
    w: &[u8],
    rows: usize,
    cols: usize,
    act: &Activation,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller (Kernel::dot_rows) checked sizes; Kernel::new checked the ISA.
    unsafe {
        match nt {
            1 => rows_t::<B, 1>(w, rows, cols, act, t0, out),
            2 => rows_t::<B, 2>(w, rows, cols, act, t0, out),
            3 => rows_t::<B, 3>(w, rows, cols, act, t0, out),
            _ => rows_t::<B, 4>(w, rows, cols, act, t0, out),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn rows_t<B: BlkK, const T: usize>(
    w: &[u8],
    rows: usize,
    cols: usize,
    act: &Activation,
    t0: usize,
    out: &mut [f32],
) {
    let nb = cols / QK_K;
    let rb = nb * B::BYTES;
    let qa = act.qk[t0 * nb..(t0 + T) * nb].as_ptr();
    for r in 0..rows {
        // SAFETY: sizes checked by the caller.
        unsafe {
            let row = w.as_ptr().add(r * rb);
            let mut acc = [_mm512_setzero_ps(); T];
            for b in 0..nb {
                let p = row.add(b * B::BYTES);
                let mut off = 0;
                while off < B::BYTES {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + off) as *const i8);
                    off += 64;
                }
                let a: [*const Q8xK; T] = std::array::from_fn(|t| qa.add(t * nb + b));
                B::superblock::<T>(p, a, &mut acc);
            }
            for t in 0..T {
                *out.get_unchecked_mut(r * T + t) = _mm512_reduce_add_ps(acc[t]);
            }
        }
    }
}
