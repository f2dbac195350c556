//! The attention job of `attention/mod.rs` written out in AVX2+FMA+F16C, for an f32 or f16 KV cache
//! (used on AVX2 and AVX-512 CPUs alike; the portable body in `mod.rs` is the reference the
//! tests hold it to).
//!
//! - **Scores**, key-outer in blocks of four: the four key rows stay in L1 while every query of
//!   the job takes its four dot products at once (four independent FMA chains, one reduction of
//!   the four sums together), so that neither a serial add chain nor a horizontal sum per key
//!   sets the pace.
//! - **Softmax** per query, as the portable body does it.
//! - **Values**, query-outer: the query's output sits in registers (up to 64 dimensions at a
//!   time) while its keys' value rows stream past, scaled by 1/Σ at the end; no output row is
//!   read and written back per key.
//!
//! An f16 cache is widened by `vcvtph2ps` as it is read; f32 and f16 differ only in [`Row8`].

#![allow(clippy::needless_range_loop)] // indexing the accumulators keeps them in registers

use std::arch::x86_64::*;

use super::{Job, KvElem};

/// Eight consecutive cache elements as f32.
pub(super) trait Row8: KvElem {
    /// # Safety
    /// `p..p + 8` is readable; AVX2/F16C present.
    unsafe fn load8(p: *const Self) -> __m256;
}

impl Row8 for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_loadu_ps(p) }
    }
}

impl Row8 for u16 {
    #[inline(always)]
    unsafe fn load8(p: *const u16) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
}

/// Key positions ahead of the one being read whose rows are prefetched.
const PREFETCH_KEYS: usize = 32;

/// Asks for the cache lines of `n` elements from `p` (a prefetch never faults).
#[inline(always)]
pub(super) fn prefetch_row<E>(p: *const E, n: usize) {
    let bytes = n * std::mem::size_of::<E>();
    let mut off = 0;
    while off < bytes {
        // SAFETY: a prefetch is a hint; it reads nothing and cannot fault.
        unsafe { _mm_prefetch::<_MM_HINT_T0>((p as *const i8).wrapping_add(off)) };
        off += 64;
    }
}

/// Whether this kernel takes the shape: head dimensions that are whole 8-float vectors.
pub(super) fn fits(head_dim: usize) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(8)
}

/// The four sums of `a`'s lanes, as [Σa0, Σa1, Σa2, Σa3].
#[inline(always)]
pub(super) unsafe fn hsum4(a: [__m256; 4]) -> __m128 {
    // SAFETY: register operations only.
    unsafe {
        let s01 = _mm256_hadd_ps(a[0], a[1]);
        let s23 = _mm256_hadd_ps(a[2], a[3]);
        let s = _mm256_hadd_ps(s01, s23);
        _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s))
    }
}

/// Runs one job (see `attention::run_job`).
///
/// # Safety
/// AVX2, FMA and F16C present; [`fits`]`(a.hd)`; the rest as `attention::run_job`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn job<E: Row8>(
    a: &Job,
    q: &[f32],
    keys: &[E],
    values: &[E],
    sc: &mut [f32],
    out: *mut f32,
) {
    let (hd, nq, stride) = (a.hd, a.nq(), a.stride);
    let (scores, inv) = sc.split_at_mut(nq * stride);
    let jend = a.jbase + stride;
    // Query i of the job: token t0 + i / heads, head h0 + i % heads.
    let token = |i: usize| a.t0 + i / a.heads;
    let q_at = |i: usize| token(i) * a.q_dim + (a.h0 + i % a.heads) * hd;
    // Scores.
    let mut jb = a.jbase;
    while jb < jend {
        let nk = (jend - jb).min(4);
        let rows: [*const E; 4] = std::array::from_fn(|k| {
            let j = if k < nk { jb + k } else { jb };
            keys[a.at(j)..a.at(j) + hd].as_ptr()
        });
        // The rows of a head are strided by the other heads' (a position holds them all), which
        // the hardware prefetchers follow poorly: ask for the block PREFETCH_KEYS ahead.
        for k in 0..4 {
            let j = jb + PREFETCH_KEYS + k;
            if j < jend {
                prefetch_row(keys[a.at(j)..].as_ptr(), hd);
            }
        }
        for i in 0..nq {
            let t = token(i);
            // Keys this query sees: lo(t) ..= pos0 + t.
            if jb > a.pos0 + t || jb + nk <= a.lo(t) {
                continue;
            }
            let qp = q[q_at(i)..q_at(i) + hd].as_ptr();
            // SAFETY: qp and each row hold hd elements; d + 8 ≤ hd.
            let s = unsafe {
                let mut acc = [_mm256_setzero_ps(); 4];
                let mut d = 0;
                while d < hd {
                    let qv = _mm256_loadu_ps(qp.add(d));
                    for k in 0..4 {
                        acc[k] = _mm256_fmadd_ps(qv, E::load8(rows[k].add(d)), acc[k]);
                    }
                    d += 8;
                }
                hsum4(acc)
            };
            let mut s4 = [0f32; 4];
            // SAFETY: four floats.
            unsafe { _mm_storeu_ps(s4.as_mut_ptr(), s) };
            let row = &mut scores[i * stride + jb - a.jbase..][..nk];
            for (o, &v) in row.iter_mut().zip(&s4) {
                let mut v = v * a.scale;
                if a.softcap > 0.0 {
                    v = a.softcap * (v / a.softcap).tanh();
                }
                *o = v;
            }
        }
        jb += nk;
    }

    // Softmax per query, over the keys its token sees.
    for i in 0..nq {
        let t = token(i);
        let (k0, k1) = (a.lo(t) - a.jbase, a.pos0 + t + 1 - a.jbase);
        let row = &mut scores[i * stride + k0..i * stride + k1];
        inv[i] = a.softmax_inv(row, i % a.heads);
    }

    // Weighted values, query by query, 64 (else 32, else 8) dimensions at a time in registers.
    for i in 0..nq {
        let t = token(i);
        let (j0, j1) = (a.lo(t), a.pos0 + t + 1);
        let w = &scores[i * stride + j0 - a.jbase..i * stride + j1 - a.jbase];
        let o = out.wrapping_add(q_at(i));
        let mut d = 0;
        while d < hd {
            // SAFETY: the job owns output row i (`run_job`'s contract), hd floats from o; every
            // value row holds hd elements from `at(j)`.
            unsafe {
                if hd - d >= 64 {
                    values_chunk::<E, 8>(a, values, w, j0, d, inv[i], o.add(d));
                    d += 64;
                } else if hd - d >= 32 {
                    values_chunk::<E, 4>(a, values, w, j0, d, inv[i], o.add(d));
                    d += 32;
                } else {
                    values_chunk::<E, 1>(a, values, w, j0, d, inv[i], o.add(d));
                    d += 8;
                }
            }
        }
    }
}

/// `o[0..8N] = inv · Σ_j w[j − j0] · v_j[d..d + 8N]` over the keys of `w`.
///
/// # Safety
/// As [`job`]; `o` points to 8N writable floats; `d + 8N ≤ hd`.
#[inline(always)]
unsafe fn values_chunk<E: Row8, const N: usize>(
    a: &Job,
    values: &[E],
    w: &[f32],
    j0: usize,
    d: usize,
    inv: f32,
    o: *mut f32,
) {
    // SAFETY: the caller's contract.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); N];
        for (k, &wk) in w.iter().enumerate() {
            let p = values[a.at(j0 + k) + d..][..8 * N].as_ptr();
            if k + PREFETCH_KEYS < w.len() {
                prefetch_row(values[a.at(j0 + k + PREFETCH_KEYS) + d..].as_ptr(), 8 * N);
            }
            let wv = _mm256_set1_ps(wk);
            for n in 0..N {
                acc[n] = _mm256_fmadd_ps(wv, E::load8(p.add(8 * n)), acc[n]);
            }
        }
        let iv = _mm256_set1_ps(inv);
        for n in 0..N {
            _mm256_storeu_ps(o.add(8 * n), _mm256_mul_ps(acc[n], iv));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernel_tests::check_every_case;
    use super::*;

    #[test]
    fn matches_the_portable_body_on_every_shape() {
        assert!(
            crate::gpu::quant::dot::Isa::Avx2.is_available(),
            "this test runs the AVX2 kernel: it needs an AVX2 CPU"
        );
        check_every_case(fits, job::<f32>, job::<u16>);
    }
}
