//! The attention job of `attention/mod.rs` in AVX-512, for head dimensions that are whole
//! 16-float vectors (64, 96, 128, 256: every model the project runs), an f32 or f16 cache.
//!
//! A long prompt's attention is two small matrix products a job (scores = Q·Kᵀ, out = P·V); the
//! AVX2 kernel (`x86.rs`) takes them a query at a time, so each key and value vector it loads
//! serves one query. Here both products are register-blocked over four queries:
//!
//! - **Scores**, four queries × four keys a block: per 8 dimensions four query and four key
//!   loads feed sixteen FMAs (the AVX2 kernel: five loads for four), each sum in eight lanes and
//!   reduced as the AVX2 kernel reduces it, so that every score — and with the same softmax and
//!   the same per-dimension value sums, every output — is the AVX2 kernel's to the bit: a result
//!   does not depend on the CPU's vector width (`tests::equals_the_avx2_kernel_bit_for_bit`).
//!   Every query of a block gets a score for every key of the block's range (the union of its
//!   queries' ranges); a query's keys outside its own range get a weight of 0 after its softmax.
//! - **Softmax** per query over its own keys, as the portable body does it.
//! - **Values**, four queries × 64 dimensions a block, 16 lanes wide: each value vector loaded
//!   once for the four queries (sixteen accumulators), instead of once per query; a query's keys
//!   outside its own range add weights of exactly 0.
//!
//! The portable body in `mod.rs` stays the reference: the tests hold this kernel to it.

#![allow(clippy::needless_range_loop)] // indexing the accumulators keeps them in registers

use std::arch::x86_64::*;

use super::x86::{Row8, hsum4, prefetch_row};
use super::{Job, KvElem};

/// Sixteen consecutive cache elements as f32.
pub(super) trait Row16: KvElem + Row8 {
    /// # Safety
    /// `p..p + 16` is readable; AVX-512F present.
    unsafe fn load16(p: *const Self) -> __m512;
}

impl Row16 for f32 {
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_loadu_ps(p) }
    }
}

impl Row16 for u16 {
    #[inline(always)]
    unsafe fn load16(p: *const u16) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
}

/// Queries of a register block.
const QB: usize = 4;
/// Keys of a score block.
const KB: usize = 4;
/// Key positions ahead of the one being read whose rows are prefetched.
const PREFETCH_KEYS: usize = 16;

/// Whether this kernel takes the shape: head dimensions that are whole 16-float vectors.
pub(super) fn fits(head_dim: usize) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(16)
}

/// Runs one job (see `attention::run_job`).
///
/// # Safety
/// AVX-512F/BW/VL, AVX2, FMA and F16C present; [`fits`]`(a.hd)`; the rest as
/// `attention::run_job`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn job<E: Row16>(
    a: &Job,
    q: &[f32],
    keys: &[E],
    values: &[E],
    sc: &mut [f32],
    out: *mut f32,
) {
    let (hd, nq, stride) = (a.hd, a.nq(), a.stride);
    let (scores, inv) = sc.split_at_mut(nq * stride);
    // Query i of the job: token t0 + i / heads, head h0 + i % heads.
    let token = |i: usize| a.t0 + i / a.heads;
    let q_at = |i: usize| token(i) * a.q_dim + (a.h0 + i % a.heads) * hd;
    // The keys query i sees, as offsets into its score row.
    let range = |i: usize| {
        let t = token(i);
        (a.lo(t) - a.jbase, a.pos0 + t + 1 - a.jbase)
    };

    // Scores of every key of the job's range, four queries by four keys.
    for i0 in (0..nq).step_by(QB) {
        let qn = (nq - i0).min(QB);
        // A short block repeats its first query (its sums are not stored).
        let qp: [*const f32; QB] = std::array::from_fn(|k| {
            let i = if k < qn { i0 + k } else { i0 };
            q[q_at(i)..q_at(i) + hd].as_ptr()
        });
        // The block's queries see keys from the first's lo to the last's end.
        let (lo, hi) = (range(i0).0, range(i0 + qn - 1).1);
        let mut jb = lo;
        while jb < hi {
            let nk = (hi - jb).min(KB);
            let rows: [*const E; KB] = std::array::from_fn(|k| {
                let j = a.jbase + if k < nk { jb + k } else { jb };
                keys[a.at(j)..a.at(j) + hd].as_ptr()
            });
            for k in 0..KB {
                let j = a.jbase + jb + PREFETCH_KEYS + k;
                if j < a.jbase + hi {
                    prefetch_row(keys[a.at(j)..].as_ptr(), hd);
                }
            }
            // Eight lanes a sum, as the AVX2 kernel sums them (with its reduction): every score
            // is the AVX2 kernel's to the bit, whatever the CPU's vector width.
            // SAFETY: every query and key row holds hd elements; d + 8 ≤ hd.
            let sums: [__m128; QB] = unsafe {
                let mut acc = [[_mm256_setzero_ps(); KB]; QB];
                let mut d = 0;
                while d < hd {
                    let kv: [__m256; KB] = std::array::from_fn(|k| E::load8(rows[k].add(d)));
                    for qi in 0..QB {
                        let qv = _mm256_loadu_ps(qp[qi].add(d));
                        for k in 0..KB {
                            acc[qi][k] = _mm256_fmadd_ps(qv, kv[k], acc[qi][k]);
                        }
                    }
                    d += 8;
                }
                std::array::from_fn(|qi| hsum4(acc[qi]))
            };
            for qi in 0..qn {
                let mut s4 = [0f32; 4];
                // SAFETY: four floats.
                unsafe { _mm_storeu_ps(s4.as_mut_ptr(), sums[qi]) };
                let row = &mut scores[(i0 + qi) * stride + jb..][..nk];
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
    }

    // Softmax per query over its own keys; the rest of the block's range weighs 0.
    for i0 in (0..nq).step_by(QB) {
        let qn = (nq - i0).min(QB);
        let (lo, hi) = (range(i0).0, range(i0 + qn - 1).1);
        for i in i0..i0 + qn {
            let (k0, k1) = range(i);
            let row = &mut scores[i * stride..(i + 1) * stride];
            inv[i] = a.softmax_inv(&mut row[k0..k1], i % a.heads);
            row[lo..k0].fill(0.0);
            row[k1..hi].fill(0.0);
        }
    }

    // Weighted values, four queries by 64 (else 32, else 16) dimensions.
    for i0 in (0..nq).step_by(QB) {
        let qn = (nq - i0).min(QB);
        let mut d = 0;
        while d < hd {
            // SAFETY: the job owns the output rows of its queries (`run_job`'s contract), hd
            // floats each; every value row holds hd elements from `at(j)`.
            unsafe {
                if hd - d >= 64 {
                    values_block::<E, 4>(a, values, scores, inv, i0, qn, d, out, &q_at, &range);
                    d += 64;
                } else if hd - d >= 32 {
                    values_block::<E, 2>(a, values, scores, inv, i0, qn, d, out, &q_at, &range);
                    d += 32;
                } else {
                    values_block::<E, 1>(a, values, scores, inv, i0, qn, d, out, &q_at, &range);
                    d += 16;
                }
            }
        }
    }
}

/// `out[i][d..d + 16N] = inv[i] · Σ_j w_i[j] · v_j[d..d + 16N]` for the `qn` queries from `i0`,
/// over the keys of their block's range (weights 0 outside each query's own).
///
/// # Safety
/// As [`job`]; `d + 16N ≤ hd`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn values_block<E: Row16, const N: usize>(
    a: &Job,
    values: &[E],
    scores: &[f32],
    inv: &[f32],
    i0: usize,
    qn: usize,
    d: usize,
    out: *mut f32,
    q_at: &dyn Fn(usize) -> usize,
    range: &dyn Fn(usize) -> (usize, usize),
) {
    let stride = a.stride;
    let (lo, hi) = (range(i0).0, range(i0 + qn - 1).1);
    // A short block repeats its first query's weights (its sums are not stored).
    let w: [&[f32]; QB] = std::array::from_fn(|k| {
        let i = if k < qn { i0 + k } else { i0 };
        &scores[i * stride..(i + 1) * stride]
    });
    // SAFETY: the caller's contract.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); N]; QB];
        for j in lo..hi {
            let p = values[a.at(a.jbase + j) + d..][..16 * N].as_ptr();
            if j + PREFETCH_KEYS < hi {
                prefetch_row(
                    values[a.at(a.jbase + j + PREFETCH_KEYS) + d..].as_ptr(),
                    16 * N,
                );
            }
            let vv: [__m512; N] = std::array::from_fn(|n| E::load16(p.add(16 * n)));
            for qi in 0..QB {
                let wv = _mm512_set1_ps(w[qi][j]);
                for n in 0..N {
                    acc[qi][n] = _mm512_fmadd_ps(wv, vv[n], acc[qi][n]);
                }
            }
        }
        for qi in 0..qn {
            let o = out.add(q_at(i0 + qi) + d);
            let iv = _mm512_set1_ps(inv[i0 + qi]);
            for n in 0..N {
                _mm512_storeu_ps(o.add(16 * n), _mm512_mul_ps(acc[qi][n], iv));
            }
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
            crate::gpu::quant::dot::Isa::Avx512.is_available(),
            "this test runs the AVX-512 kernel: it needs an AVX-512 CPU"
        );
        check_every_case(fits, job::<f32>, job::<u16>);
    }

    /// Every output of this kernel is the AVX2 kernel's to the bit (f32 and f16 caches; a prompt
    /// with causal edges inside the blocks, a sliding window with soft-capping, decode at
    /// depth), so that a model's numbers do not depend on the CPU's vector width.
    #[test]
    fn equals_the_avx2_kernel_bit_for_bit() {
        use super::super::AttnParams;
        use super::super::kernel_tests::run_jobs;
        assert!(
            crate::gpu::quant::dot::Isa::Avx512.is_available(),
            "this test runs the AVX-512 kernel: it needs an AVX-512 CPU"
        );
        // Both kernels' outputs, as bits, for `p` on the same random inputs.
        fn outputs<E: Row16>(p: &AttnParams, wide: bool, seed: u64) -> Vec<u32> {
            let slots = p.pos0 + p.n_tokens;
            let kernel: super::super::kernel_tests::Kernel<E> = if wide {
                job::<E>
            } else {
                super::super::x86::job::<E>
            };
            let out = run_jobs(p, slots, seed, 2, kernel);
            out.iter().map(|x| x.to_bits()).collect()
        }
        let base = AttnParams {
            layer: 0,
            seq: 0,
            row0: 0,
            n_tokens: 37,
            pos0: 0,
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            scale: 0.125,
            window: 0,
            softcap: 0.0,
            sinks: None,
        };
        for (i, p) in [
            base,
            AttnParams {
                n_tokens: 13,
                pos0: 40,
                window: 16,
                softcap: 50.0,
                head_dim: 128,
                ..base
            },
            AttnParams {
                n_tokens: 1,
                pos0: 700,
                ..base
            },
        ]
        .iter()
        .enumerate()
        {
            let seed = i as u64 + 7;
            assert!(
                outputs::<f32>(p, true, seed) == outputs::<f32>(p, false, seed),
                "{p:?} f32"
            );
            assert!(
                outputs::<u16>(p, true, seed) == outputs::<u16>(p, false, seed),
                "{p:?} f16"
            );
        }
    }
}
