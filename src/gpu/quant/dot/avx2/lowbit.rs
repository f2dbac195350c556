//! AVX2 kernels for the low-bit types: Q2_K and Q3_K (2-bit planes, sixteen 16-element
//! sub-blocks), IQ4_NL and IQ4_XS (4-bit indices into `KVALUES_IQ4NL`, signed values, so
//! `maddubs` takes |q| and the sign moves to the activation as for Q8_0), and MXFP4 (the same
//! with E2M1 values).

#![allow(clippy::needless_range_loop)] // indexing per token keeps the accumulators in registers

use super::super::super::blocks::{KVALUES_IQ4NL, f16_at};
use super::super::super::mxfp4;
use super::*;

/// The IQ4 value table in both 128-bit lanes, for `_mm256_shuffle_epi8`.
#[inline(always)]
unsafe fn iq4_table() -> __m256i {
    unsafe {
        _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i))
    }
}

pub(super) struct BIq4Nl;
impl Blk32 for BIq4Nl {
    const BYTES: usize = layout::IQ4_NL;
    const SIGNED: bool = true;
    const HAS_M: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        unsafe { _mm256_shuffle_epi8(iq4_table(), nibbles32(p.add(2))) }
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

/// MXFP4: like IQ4_NL, with the doubled E2M1 values as the table and the halved E8M0 scale as d.
pub(super) struct BMxfp4;
impl Blk32 for BMxfp4 {
    const BYTES: usize = mxfp4::BYTES;
    const SIGNED: bool = true;
    const HAS_M: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        unsafe {
            let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                mxfp4::KVALUES_MXFP4.as_ptr() as *const __m128i
            ));
            _mm256_shuffle_epi8(table, nibbles32(p.add(1)))
        }
    }
    #[inline(always)]
    unsafe fn dm(p: *const u8) -> __m128 {
        unsafe { _mm_setr_ps(mxfp4::e8m0_to_fp32_half(*p), 0.0, 0.0, 0.0) }
    }
    #[inline(always)]
    unsafe fn group_dm(p: *const u8) -> (__m256, __m256) {
        unsafe {
            let e = |j: usize| mxfp4::e8m0_to_fp32_half(*p.add(j * Self::BYTES));
            let d = _mm_setr_ps(e(0), e(1), e(2), e(3));
            (_mm256_set_m128(d, d), _mm256_setzero_ps())
        }
    }
}

/// i16 `lo` in the low 128-bit lane and `hi` in the high one, each broadcast.
#[inline(always)]
unsafe fn two_scales(lo: i16, hi: i16) -> __m256i {
    unsafe { _mm256_setr_m128i(_mm_set1_epi16(lo), _mm_set1_epi16(hi)) }
}

/// Σ over the 2-bit planes of a Q2_K/Q3_K block: for half h and bit pair k, the 32 bytes from
/// `q(h, k)` (unsigned) hold sub-blocks 8h + 2k (bytes 0..16) and 8h + 2k + 1 (16..32), which
/// meet activation elements 128h + 32k .. +32, scaled by `sc[i]`.
#[inline(always)]
unsafe fn planes<const T: usize>(
    q: impl Fn(usize, usize) -> __m256i,
    sc: &[i16; 16],
    a: [*const Q8xK; T],
    sumi: &mut [__m256i; T],
) {
    unsafe {
        for h in 0..2 {
            for k in 0..4 {
                let qv = q(h, k);
                let i = 8 * h + 2 * k;
                let s = two_scales(sc[i], sc[i + 1]);
                for t in 0..T {
                    let y = _mm256_load_si256(
                        (*a[t]).qs.as_ptr().add(128 * h + 32 * k) as *const __m256i
                    );
                    let prod = _mm256_madd_epi16(s, _mm256_maddubs_epi16(qv, y));
                    sumi[t] = _mm256_add_epi32(sumi[t], prod);
                }
            }
        }
    }
}

pub(super) struct K2;
impl BlkK for K2 {
    const BYTES: usize = layout::Q2_K;
    #[inline(always)]
    unsafe fn superblock<const T: usize>(p: *const u8, a: [*const Q8xK; T], acc: &mut [__m256; T]) {
        unsafe {
            let b = std::slice::from_raw_parts(p, Self::BYTES);
            let d = f16_at(b, layout::Q2_K_D);
            let dmin = f16_at(b, layout::Q2_K_D + 2);
            let raw = _mm_loadu_si128(p as *const __m128i);
            // Mins: −d_a·dmin·Σ_i m_i·(Σa)_i.
            let mins =
                _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(raw), _mm_set1_epi8(0x0F)));
            for t in 0..T {
                let bs = _mm256_load_si256((*a[t]).bsums.as_ptr() as *const __m256i);
                let m = _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, bs));
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(-(*a[t]).d * dmin), m, acc[t]);
            }
            let sc: [i16; 16] = std::array::from_fn(|i| (b[i] & 0xF) as i16);
            let qs = p.add(layout::Q2_K_QS);
            let m3 = _mm256_set1_epi8(3);
            let bits = [
                _mm256_loadu_si256(qs as *const __m256i),
                _mm256_loadu_si256(qs.add(32) as *const __m256i),
            ];
            let mut sumi = [_mm256_setzero_si256(); T];
            planes::<T>(
                |h, k| {
                    _mm256_and_si256(
                        _mm256_srlv_epi64(bits[h], _mm256_set1_epi64x(2 * k as i64)),
                        m3,
                    )
                },
                &sc,
                a,
                &mut sumi,
            );
            for t in 0..T {
                let f = _mm256_set1_ps((*a[t]).d * d);
                acc[t] = _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            }
        }
    }
}

pub(super) struct K3;
impl BlkK for K3 {
    const BYTES: usize = layout::Q3_K;
    #[inline(always)]
    unsafe fn superblock<const T: usize>(p: *const u8, a: [*const Q8xK; T], acc: &mut [__m256; T]) {
        unsafe {
            let b = std::slice::from_raw_parts(p, Self::BYTES);
            let d = f16_at(b, layout::Q3_K_D);
            let raw = blocks_q3_scales(b);
            let sc: [i16; 16] = std::array::from_fn(|i| raw[i] as i16 - 32);
            // The quants are stored +4 (low bits plus 4 where the hmask bit is set): subtract
            // 4·Σ_i sc_i·(Σa)_i once per token.
            let sc16 = _mm256_loadu_si256(sc.as_ptr() as *const __m256i);
            let mut sumi = [_mm256_setzero_si256(); T];
            for t in 0..T {
                let bs = _mm256_load_si256((*a[t]).bsums.as_ptr() as *const __m256i);
                sumi[t] = _mm256_slli_epi32::<2>(_mm256_madd_epi16(bs, sc16));
                sumi[t] = _mm256_sub_epi32(_mm256_setzero_si256(), sumi[t]);
            }
            let qs = p.add(layout::Q3_K_QS);
            let m3 = _mm256_set1_epi8(3);
            let four = _mm256_set1_epi8(4);
            let hm = _mm256_loadu_si256(p as *const __m256i);
            let bits = [
                _mm256_loadu_si256(qs as *const __m256i),
                _mm256_loadu_si256(qs.add(32) as *const __m256i),
            ];
            planes::<T>(
                |h, k| {
                    let low = _mm256_and_si256(
                        _mm256_srlv_epi64(bits[h], _mm256_set1_epi64x(2 * k as i64)),
                        m3,
                    );
                    let m = _mm256_set1_epi8((1u8 << (4 * h + k)) as i8);
                    let hb = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, m), m), four);
                    _mm256_or_si256(low, hb)
                },
                &sc,
                a,
                &mut sumi,
            );
            for t in 0..T {
                let f = _mm256_set1_ps((*a[t]).d * d);
                acc[t] = _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            }
        }
    }
}

#[inline(always)]
fn blocks_q3_scales(b: &[u8]) -> [u8; 16] {
    super::super::super::blocks::q3_k_scales(&b[layout::Q3_K_SCALES..])
}

pub(super) struct KIq4Xs;
impl BlkK for KIq4Xs {
    const BYTES: usize = layout::IQ4_XS;
    #[inline(always)]
    unsafe fn superblock<const T: usize>(p: *const u8, a: [*const Q8xK; T], acc: &mut [__m256; T]) {
        unsafe {
            let b = std::slice::from_raw_parts(p, Self::BYTES);
            let d = f16_at(b, 0);
            let sc = super::super::super::blocks::iq4_xs_scales(b);
            let table = iq4_table();
            let mut sumi = [_mm256_setzero_si256(); T];
            for ib in 0..8 {
                let q = _mm256_shuffle_epi8(table, nibbles32(p.add(layout::IQ4_XS_QS + 16 * ib)));
                let aq = _mm256_sign_epi8(q, q);
                let s = _mm256_set1_epi16(sc[ib] as i16 - 32);
                for t in 0..T {
                    let y = _mm256_load_si256((*a[t]).qs.as_ptr().add(32 * ib) as *const __m256i);
                    let prod = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(y, q));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(s, prod));
                }
            }
            for t in 0..T {
                let f = _mm256_set1_ps((*a[t]).d * d);
                acc[t] = _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            }
        }
    }
}
