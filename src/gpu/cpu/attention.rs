//! Causal attention over the CPU backend's f32 KV cache, tiled so that each key and value row is
//! read once for a tile of queries rather than once per query.
//!
//! A job is a tile of up to [`TOKEN_TILE`] consecutive tokens × a set of query heads that share
//! one KV head (all of the group, or one head where that leaves too few jobs to keep every
//! thread busy, as in decode with few KV heads). It runs in three passes over the keys it sees:
//! scores (each key row against every query of the tile), one softmax per query (the shifted
//! exponentials of `exp.rs`), then the weighted sum of value rows. The scores of a tile live in a
//! per-thread buffer of (queries × keys) floats — never the whole score matrix of the prompt.
//!
//! The body is plain Rust compiled three times: for the portable target, and with AVX2+FMA and
//! AVX-512 enabled, so that the compiler vectorizes the dot products, the exponentials and the
//! value sums at the width of the instruction set `Isa::active` picked.

use crate::gpu::backend::AttnParams;
use crate::gpu::quant::dot::Isa;

use super::exp::exp_shifted_sum;

/// Query tokens per job.
pub const TOKEN_TILE: usize = 4;

/// How attention is cut into jobs for `n_threads` threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    /// Query heads per job: the whole GQA group, or 1.
    pub heads_per_job: usize,
    pub jobs: usize,
}

impl Split {
    pub fn new(p: &AttnParams, n_threads: usize) -> Split {
        let tiles = p.n_tokens.div_ceil(TOKEN_TILE);
        let group = p.n_heads / p.n_kv_heads.max(1);
        // Whole groups read each key once for the group, but with fewer than about four jobs per
        // thread the last jobs leave threads idle; one head per job then balances better.
        let heads_per_job = if tiles * p.n_kv_heads >= 4 * n_threads {
            group.max(1)
        } else {
            1
        };
        Split {
            heads_per_job,
            jobs: tiles * (p.n_heads / heads_per_job),
        }
    }
}

/// Runs job `job` of `split`: its tokens' outputs for its heads.
///
/// `q` holds `n_tokens` rows of `n_heads·head_dim`; `keys` and `values` hold this layer's cache,
/// `slots` positions of `kv_dim` floats (position j in slot j mod slots: a sliding-window layer's
/// ring; a global layer has a slot per position), with every position the job's tokens see
/// written; `sc` is the thread's score buffer (grown as needed).
///
/// # Safety
/// `out` points to `n_tokens·n_heads·head_dim` floats, and no other thread touches the rows of
/// this job's (token, head) pairs while it runs.
#[allow(clippy::too_many_arguments)]
pub unsafe fn run_job(
    isa: Isa,
    p: &AttnParams,
    split: Split,
    job: usize,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    kv_dim: usize,
    slots: usize,
    sc: &mut Vec<f32>,
    out: *mut f32,
) {
    let a = Job::new(p, split, job, kv_dim, slots);
    let need = a.nq() * a.stride + a.nq();
    if sc.len() < need {
        sc.resize(need, 0.0);
    }
    // SAFETY: the ISA's presence was checked by Isa::active; the rest is the caller's contract.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => job_avx512(&a, q, keys, values, sc, out),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => job_avx2(&a, q, keys, values, sc, out),
            _ => job_body(&a, q, keys, values, sc, out),
        }
    }
}

/// One job's shape.
struct Job {
    t0: usize,
    t1: usize,
    h0: usize,
    heads: usize,
    pos0: usize,
    hd: usize,
    q_dim: usize,
    kv_dim: usize,
    /// Offset of the job's KV head inside a cache position.
    koff: usize,
    scale: f32,
    /// 0: no soft-capping.
    softcap: f32,
    /// 0: every earlier key.
    window: usize,
    slots: usize,
    /// The first key position any token of the job sees.
    jbase: usize,
    /// Key positions from `jbase` to the last token's; the row length of the score buffer.
    stride: usize,
}

impl Job {
    fn new(p: &AttnParams, split: Split, job: usize, kv_dim: usize, slots: usize) -> Job {
        let head_blocks = p.n_heads / split.heads_per_job;
        let (tile, hb) = (job / head_blocks, job % head_blocks);
        let t0 = tile * TOKEN_TILE;
        let t1 = (t0 + TOKEN_TILE).min(p.n_tokens);
        let h0 = hb * split.heads_per_job;
        let group = p.n_heads / p.n_kv_heads;
        let jbase = if p.window == 0 {
            0
        } else {
            (p.pos0 + t0 + 1).saturating_sub(p.window)
        };
        Job {
            t0,
            t1,
            h0,
            heads: split.heads_per_job,
            pos0: p.pos0,
            hd: p.head_dim,
            q_dim: p.n_heads * p.head_dim,
            kv_dim,
            koff: (h0 / group) * p.head_dim,
            scale: p.scale,
            softcap: p.softcap,
            window: p.window,
            slots: slots.max(1),
            jbase,
            stride: p.pos0 + t1 - jbase,
        }
    }

    /// The first key position token `t` sees.
    fn lo(&self, t: usize) -> usize {
        if self.window == 0 {
            0
        } else {
            (self.pos0 + t + 1).saturating_sub(self.window)
        }
    }

    /// The tokens of the job that see key position `j`: those at or after it, within their
    /// window.
    fn seers(&self, j: usize) -> std::ops::Range<usize> {
        let first = self.t0.max(j.saturating_sub(self.pos0));
        let end = if self.window == 0 {
            self.t1
        } else {
            self.t1.min((j + self.window).saturating_sub(self.pos0))
        };
        first..end.max(first)
    }

    /// Where position `j` starts in the layer's cache.
    fn at(&self, j: usize) -> usize {
        j % self.slots * self.kv_dim + self.koff
    }

    fn nq(&self) -> usize {
        (self.t1 - self.t0) * self.heads
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn job_avx2(a: &Job, q: &[f32], k: &[f32], v: &[f32], sc: &mut [f32], out: *mut f32) {
    // SAFETY: forwarded contract.
    unsafe { job_body(a, q, k, v, sc, out) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn job_avx512(a: &Job, q: &[f32], k: &[f32], v: &[f32], sc: &mut [f32], out: *mut f32) {
    // SAFETY: forwarded contract.
    unsafe { job_body(a, q, k, v, sc, out) }
}

#[inline(always)]
unsafe fn job_body(
    a: &Job,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    sc: &mut [f32],
    out: *mut f32,
) {
    let (hd, nq, stride) = (a.hd, a.nq(), a.stride);
    let (scores, inv) = sc.split_at_mut(nq * stride);
    let qi = |t: usize, h: usize| (t - a.t0) * a.heads + h;
    let q_row = |t: usize, h: usize| {
        let o = t * a.q_dim + (a.h0 + h) * hd;
        &q[o..o + hd]
    };
    let jend = a.jbase + stride;
    // Scores.
    for j in a.jbase..jend {
        let kj = &keys[a.at(j)..a.at(j) + hd];
        for t in a.seers(j) {
            for h in 0..a.heads {
                let mut s = dot(q_row(t, h), kj) * a.scale;
                if a.softcap > 0.0 {
                    s = a.softcap * (s / a.softcap).tanh();
                }
                scores[qi(t, h) * stride + j - a.jbase] = s;
            }
        }
    }
    // Softmax per query, over the keys its token sees; outputs zeroed.
    for t in a.t0..a.t1 {
        let (k0, k1) = (a.lo(t) - a.jbase, a.pos0 + t + 1 - a.jbase);
        for h in 0..a.heads {
            let i = qi(t, h);
            let row = &mut scores[i * stride + k0..i * stride + k1];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            inv[i] = 1.0 / exp_shifted_sum(row, max);
            // SAFETY: this job owns out row (t, h0 + h) (the caller's contract).
            unsafe { out_row(a, out, t, h) }.fill(0.0);
        }
    }
    // Weighted values.
    for j in a.jbase..jend {
        let vj = &values[a.at(j)..a.at(j) + hd];
        for t in a.seers(j) {
            for h in 0..a.heads {
                let i = qi(t, h);
                let w = scores[i * stride + j - a.jbase] * inv[i];
                // SAFETY: as above.
                let o = unsafe { out_row(a, out, t, h) };
                for (o, &x) in o.iter_mut().zip(vj) {
                    *o += w * x;
                }
            }
        }
    }
}

/// The output row of token t, head h0 + h.
///
/// # Safety
/// The job owns that row; `out` spans every token's row.
#[inline(always)]
#[allow(clippy::mut_from_ref)]
unsafe fn out_row<'a>(a: &Job, out: *mut f32, t: usize, h: usize) -> &'a mut [f32] {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(out.add(t * a.q_dim + (a.h0 + h) * a.hd), a.hd) }
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight partial sums let the compiler vectorise without reassociation flags.
    let mut acc = [0f32; 8];
    let (ac, ar) = a.as_chunks::<8>();
    let (bc, br) = b.as_chunks::<8>();
    for (x, y) in ac.iter().zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(n_tokens: usize, n_kv_heads: usize) -> AttnParams {
        AttnParams {
            layer: 0,
            n_tokens,
            pos0: 0,
            n_heads: 6,
            n_kv_heads,
            head_dim: 8,
            scale: 1.0,
            window: 0,
            softcap: 0.0,
        }
    }

    #[test]
    fn split_keeps_groups_when_there_is_work_for_every_thread() {
        // 64 tokens: 16 tiles × 2 KV heads = 32 jobs of 3 heads for 2 threads.
        assert_eq!(
            Split::new(&params(64, 2), 2),
            Split {
                heads_per_job: 3,
                jobs: 32
            }
        );
        // Decode: 1 tile × 2 KV heads would leave threads idle: one head per job.
        assert_eq!(
            Split::new(&params(1, 2), 2),
            Split {
                heads_per_job: 1,
                jobs: 6
            }
        );
    }
}
