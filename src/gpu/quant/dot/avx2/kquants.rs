//! AVX2 kernels for the K-quants (against Q8xK) and the float weights (against f32).

#![allow(clippy::needless_range_loop)] // indexing per token keeps the accumulators in registers

use super::super::super::blocks::f16_at;
use super::*;

// --- K types against Q8xK ---

pub(super) trait BlkK {
    const BYTES: usize;
    /// Adds this super-block's contribution for each of T tokens to acc.
    unsafe fn superblock<const T: usize>(p: *const u8, a: [*const Q8xK; T], acc: &mut [__m256; T]);
}

/// Byte-pair shuffles broadcasting i16 scale k of a 128-bit lane to all 16 of its i16s.
#[inline(always)]
unsafe fn scale_shuffle(k: usize) -> __m256i {
    unsafe { _mm256_set1_epi16((((2 * k + 1) << 8) | (2 * k)) as i16) }
}

/// Q4_K/Q5_K scales and mins as 16 × i16: [sc0..sc7, m0..m7] (the AVX-512 kernels' too).
#[inline(always)]
pub(in super::super) unsafe fn k_scales_mins(p: *const u8) -> __m256i {
    unsafe {
        let s = p.add(layout::K_SCALES);
        let u0 = (s as *const u32).read_unaligned();
        let u1 = (s.add(4) as *const u32).read_unaligned();
        let u2 = (s.add(8) as *const u32).read_unaligned();
        const M1: u32 = 0x3f3f_3f3f;
        const M2: u32 = 0x0f0f_0f0f;
        const M3: u32 = 0x0303_0303;
        let sc_lo = u0 & M1;
        let sc_hi = (u2 & M2) | (((u0 >> 6) & M3) << 4);
        let mn_lo = u1 & M1;
        let mn_hi = ((u2 >> 4) & M2) | (((u1 >> 6) & M3) << 4);
        _mm256_cvtepu8_epi16(_mm_setr_epi32(
            sc_lo as i32,
            sc_hi as i32,
            mn_lo as i32,
            mn_hi as i32,
        ))
    }
}

/// The mins term of Q4_K/Q5_K: −d_a·dmin·Σ_j m_j·(Σa)_j, added to acc as 4 partial lanes.
#[inline(always)]
unsafe fn k_mins<const T: usize>(
    dmin: f32,
    mins: __m128i,
    a: [*const Q8xK; T],
    acc: &mut [__m256; T],
) {
    unsafe {
        for t in 0..T {
            let bs = _mm256_load_si256((*a[t]).bsums.as_ptr() as *const __m256i);
            let q8s = _mm_hadd_epi16(
                _mm256_castsi256_si128(bs),
                _mm256_extracti128_si256::<1>(bs),
            );
            let prod = _mm_cvtepi32_ps(_mm_madd_epi16(mins, q8s));
            let f = _mm256_set1_ps(-(*a[t]).d * dmin);
            acc[t] = _mm256_fmadd_ps(f, _mm256_zextps128_ps256(prod), acc[t]);
        }
    }
}

pub(super) struct K4;
impl BlkK for K4 {
    const BYTES: usize = layout::Q4_K;
    #[inline(always)]
    unsafe fn superblock<const T: usize>(p: *const u8, a: [*const Q8xK; T], acc: &mut [__m256; T]) {
        unsafe {
            let dd = half2(p);
            let (d, dmin) = (_mm_cvtss_f32(dd), _mm_cvtss_f32(_mm_movehdup_ps(dd)));
            let ms = k_scales_mins(p);
            k_mins::<T>(dmin, _mm256_extracti128_si256::<1>(ms), a, acc);
            let sc = _mm256_permute2x128_si256::<0>(ms, ms);
            let m4 = _mm256_set1_epi8(0x0F);
            let mut sumi = [_mm256_setzero_si256(); T];
            let q = p.add(layout::Q4_K_QS);
            for j in 0..4 {
                let sl = _mm256_shuffle_epi8(sc, scale_shuffle(2 * j));
                let sh = _mm256_shuffle_epi8(sc, scale_shuffle(2 * j + 1));
                let bits = _mm256_loadu_si256(q.add(32 * j) as *const __m256i);
                let lo = _mm256_and_si256(bits, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                for t in 0..T {
                    let ya = (*a[t]).qs.as_ptr().add(64 * j);
                    let yl = _mm256_load_si256(ya as *const __m256i);
                    let yh = _mm256_load_si256(ya.add(32) as *const __m256i);
                    let pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(lo, yl));
                    let ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(hi, yh));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(pl, ph));
                }
            }
            for t in 0..T {
                let f = _mm256_set1_ps((*a[t]).d * d);
                acc[t] = _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            }
        }
    }
}

pub(super) struct K5;
impl BlkK for K5 {
    const BYTES: usize = layout::Q5_K;
    #[inline(always)]
    unsafe fn superblock<const T: usize>(p: *const u8, a: [*const Q8xK; T], acc: &mut [__m256; T]) {
        unsafe {
            let dd = half2(p);
            let (d, dmin) = (_mm_cvtss_f32(dd), _mm_cvtss_f32(_mm_movehdup_ps(dd)));
            let ms = k_scales_mins(p);
            k_mins::<T>(dmin, _mm256_extracti128_si256::<1>(ms), a, acc);
            let sc = _mm256_permute2x128_si256::<0>(ms, ms);
            let m4 = _mm256_set1_epi8(0x0F);
            let x10 = _mm256_set1_epi8(0x10);
            let hbits = _mm256_loadu_si256(p.add(layout::Q5_K_QH) as *const __m256i);
            let mut sumi = [_mm256_setzero_si256(); T];
            let q = p.add(layout::Q5_K_QS);
            for j in 0..4 {
                let sl = _mm256_shuffle_epi8(sc, scale_shuffle(2 * j));
                let sh = _mm256_shuffle_epi8(sc, scale_shuffle(2 * j + 1));
                let bits = _mm256_loadu_si256(q.add(32 * j) as *const __m256i);
                let bl = _mm256_set1_epi8((1u8 << (2 * j)) as i8);
                let bh = _mm256_set1_epi8((2u8 << (2 * j)) as i8);
                let hl = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bl), bl), x10);
                let hh = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bh), bh), x10);
                let lo = _mm256_or_si256(_mm256_and_si256(bits, m4), hl);
                let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4), hh);
                for t in 0..T {
                    let ya = (*a[t]).qs.as_ptr().add(64 * j);
                    let yl = _mm256_load_si256(ya as *const __m256i);
                    let yh = _mm256_load_si256(ya.add(32) as *const __m256i);
                    let pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(lo, yl));
                    let ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(hi, yh));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(pl, ph));
                }
            }
            for t in 0..T {
                let f = _mm256_set1_ps((*a[t]).d * d);
                acc[t] = _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            }
        }
    }
}

pub(super) struct K6;
impl BlkK for K6 {
    const BYTES: usize = layout::Q6_K;
    #[inline(always)]
    unsafe fn superblock<const T: usize>(p: *const u8, a: [*const Q8xK; T], acc: &mut [__m256; T]) {
        unsafe {
            let d = _mm_cvtss_f32(half1(p.add(layout::Q6_K_D)));
            let scales = _mm_loadu_si128(p.add(layout::Q6_K_SCALES) as *const __m128i);
            let scales16 = _mm256_cvtepi8_epi16(scales);
            let m4 = _mm256_set1_epi8(0x0F);
            let m3 = _mm256_set1_epi8(3);
            // Quants are stored +32: subtract 32·Σ_g sc_g·(Σa)_g once per token.
            let mut sumi = [_mm256_setzero_si256(); T];
            for t in 0..T {
                let bs = _mm256_load_si256((*a[t]).bsums.as_ptr() as *const __m256i);
                sumi[t] = _mm256_sub_epi32(
                    sumi[t],
                    _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs, scales16)),
                );
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
                for (k, qk) in q.iter().enumerate() {
                    // Sixteen-element groups 8h + 2k and 8h + 2k + 1 share this vector.
                    let g = 8 * h + 2 * k;
                    let s = _mm256_setr_m128i(
                        _mm_set1_epi16(*p.add(layout::Q6_K_SCALES + g) as i8 as i16),
                        _mm_set1_epi16(*p.add(layout::Q6_K_SCALES + g + 1) as i8 as i16),
                    );
                    for t in 0..T {
                        let y = _mm256_load_si256(
                            (*a[t]).qs.as_ptr().add(128 * h + 32 * k) as *const __m256i
                        );
                        let prod = _mm256_madd_epi16(s, _mm256_maddubs_epi16(*qk, y));
                        sumi[t] = _mm256_add_epi32(sumi[t], prod);
                    }
                }
            }
            for t in 0..T {
                let f = _mm256_set1_ps((*a[t]).d * d);
                acc[t] = _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            }
        }
    }
}

tile_dispatch!(rows_k, rows_k_t, BlkK);

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_k_t<B: BlkK, const T: usize>(
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
            let mut acc = [_mm256_setzero_ps(); T];
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
                *out.get_unchecked_mut(r * T + t) = hsum(acc[t]);
            }
        }
    }
}

// --- float weights against f32 ---

pub(super) trait FloatW {
    const BYTES: usize;
    /// 8 weights from p as f32.
    unsafe fn load8(p: *const u8) -> __m256;
    fn one(p: &[u8]) -> f32;
}

pub(super) struct F32w;
impl FloatW for F32w {
    const BYTES: usize = 4;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        unsafe { _mm256_loadu_ps(p as *const f32) }
    }
    fn one(p: &[u8]) -> f32 {
        f32::from_le_bytes([p[0], p[1], p[2], p[3]])
    }
}

pub(super) struct F16w;
impl FloatW for F16w {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
    fn one(p: &[u8]) -> f32 {
        f16_at(p, 0)
    }
}

pub(super) struct Bf16w;
impl FloatW for Bf16w {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        unsafe {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
        }
    }
    fn one(p: &[u8]) -> f32 {
        super::super::super::blocks::bf16_to_f32(u16::from_le_bytes([p[0], p[1]]))
    }
}

tile_dispatch!(rows_f, rows_f_t, FloatW);

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_f_t<B: FloatW, const T: usize>(
    w: &[u8],
    rows: usize,
    cols: usize,
    act: &Activation,
    t0: usize,
    out: &mut [f32],
) {
    let x = act.f[t0 * cols..(t0 + T) * cols].as_ptr();
    let rb = cols * B::BYTES;
    let main = cols / 16 * 16;
    for r in 0..rows {
        // SAFETY: sizes checked by the caller; the vector loop stays below `main` <= cols.
        unsafe {
            let row = w.as_ptr().add(r * rb);
            let mut acc = [[_mm256_setzero_ps(); T]; 2];
            let mut c = 0;
            while c < main {
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(c * B::BYTES + PREFETCH) as *const i8);
                let w0 = B::load8(row.add(c * B::BYTES));
                let w1 = B::load8(row.add((c + 8) * B::BYTES));
                for t in 0..T {
                    let xp = x.add(t * cols + c);
                    acc[0][t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xp), acc[0][t]);
                    acc[1][t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xp.add(8)), acc[1][t]);
                }
                c += 16;
            }
            let rs = std::slice::from_raw_parts(row, rb);
            for t in 0..T {
                let mut s = hsum(_mm256_add_ps(acc[0][t], acc[1][t]));
                for cc in main..cols {
                    s += B::one(&rs[cc * B::BYTES..]) * *x.add(t * cols + cc);
                }
                *out.get_unchecked_mut(r * T + t) = s;
            }
        }
    }
}
