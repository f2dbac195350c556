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
//! The cache holds f32 or f16 elements ([`KvElem`]; `--kv-type`). On AVX-512 CPUs a job runs the
//! kernel of `x86_512.rs` (head dimensions a multiple of 16: four queries a register block), on
//! AVX2 CPUs (and other head dimensions a multiple of 8) the one of `x86.rs`; the plain-Rust body
//! here is the portable path and the reference the tests hold both kernels to.

use std::sync::Mutex;

use super::pool::ThreadPool;
use crate::gpu::backend::AttnParams;
use crate::gpu::quant::dot::Isa;

use super::exp::exp_shifted_sum;

#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_512;

/// An element of the KV cache: f32, or an IEEE half held as its bits (`u16`).
pub trait KvElem: Copy + Default + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    /// Rounded to nearest even.
    fn from_f32(v: f32) -> Self;
}

impl KvElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> f32 {
        v
    }
}

impl KvElem for u16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        crate::gpu::quant::f16_to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> u16 {
        crate::gpu::quant::f32_to_f16(v)
    }
}

/// The kernel that runs on the CPU's instruction set.
pub trait JobKernel: KvElem {
    /// # Safety
    /// As [`run_job`].
    unsafe fn run(
        isa: Isa,
        a: &Job,
        q: &[f32],
        k: &[Self],
        v: &[Self],
        sc: &mut [f32],
        out: *mut f32,
    );
}

macro_rules! job_kernel {
    ($t:ty) => {
        impl JobKernel for $t {
            unsafe fn run(
                isa: Isa,
                a: &Job,
                q: &[f32],
                k: &[$t],
                v: &[$t],
                sc: &mut [f32],
                out: *mut f32,
            ) {
                // SAFETY: the ISA's presence was checked when the backend chose it
                // (`MatmulScratch::with_isa`); the rest is the caller's contract.
                unsafe {
                    #[cfg(target_arch = "x86_64")]
                    if isa == Isa::Avx512 && x86_512::fits(a.hd) {
                        return x86_512::job(a, q, k, v, sc, out);
                    }
                    #[cfg(target_arch = "x86_64")]
                    if matches!(isa, Isa::Avx2 | Isa::Avx512) && x86::fits(a.hd) {
                        return x86::job(a, q, k, v, sc, out);
                    }
                    let _ = isa;
                    job_body(a, q, k, v, sc, out)
                }
            }
        }
    };
}
job_kernel!(f32);
job_kernel!(u16);

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

/// One attention op of the backend: where it runs and on what shape.
pub struct Run<'a> {
    pub pool: &'a ThreadPool,
    /// One score buffer per pool thread.
    pub scores: &'a [Mutex<Vec<f32>>],
    pub isa: Isa,
    pub p: &'a AttnParams,
    /// Positions the layer's cache keeps (position j in slot j mod slots).
    pub slots: usize,
    /// Each query head's attention sink (gpt-oss); empty: none.
    pub sinks: &'a [f32],
}

impl Run<'_> {
    /// Writes the batch's keys and values (`kn`, `vn`: `n_tokens` rows of `kv_dim`) into the
    /// layer's cache (`keys`, `values`: `slots` positions), then attends: `out` gets
    /// `n_tokens` rows of `n_heads·head_dim`.
    ///
    /// # Panics
    /// Where a slice is shorter than the shape says (the backend sized them from it).
    pub fn store_and_attend<E: JobKernel>(
        &self,
        q: &[f32],
        kn: &[f32],
        vn: &[f32],
        keys: &mut [E],
        values: &mut [E],
        out: &mut [f32],
    ) {
        let p = self.p;
        let kv_dim = p.n_kv_heads * p.head_dim;
        assert_eq!(
            out.len(),
            p.n_tokens * p.n_heads * p.head_dim,
            "attention output"
        );
        for t in 0..p.n_tokens {
            let at = (p.pos0 + t) % self.slots * kv_dim;
            let row = t * kv_dim..(t + 1) * kv_dim;
            for (d, &x) in keys[at..at + kv_dim].iter_mut().zip(&kn[row.clone()]) {
                *d = E::from_f32(x);
            }
            for (d, &x) in values[at..at + kv_dim].iter_mut().zip(&vn[row]) {
                *d = E::from_f32(x);
            }
        }
        let (keys, values) = (&*keys, &*values);
        let split = Split::new(p, self.pool.n_threads());
        let optr = OutPtr(out.as_mut_ptr());
        let (scores, isa, slots, sinks) = (self.scores, self.isa, self.slots, self.sinks);
        self.pool.run(&|ith, nth| {
            let Ok(mut sc) = scores[ith].lock() else {
                return;
            };
            for job in (ith..split.jobs).step_by(nth) {
                // SAFETY: `out` holds n_tokens·q_dim floats (asserted above); jobs own
                // disjoint (token, head) rows.
                unsafe {
                    run_job(
                        isa,
                        p,
                        split,
                        job,
                        q,
                        keys,
                        values,
                        kv_dim,
                        slots,
                        sinks,
                        &mut sc,
                        optr.get(),
                    )
                };
            }
        });
    }
}

/// The output, which the jobs write at disjoint rows.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every job writes only its own rows, and the pool joins before the owner reads them.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// A method, so that closures capture the whole wrapper (not its raw field).
    fn get(self) -> *mut f32 {
        self.0
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
pub unsafe fn run_job<E: JobKernel>(
    isa: Isa,
    p: &AttnParams,
    split: Split,
    job: usize,
    q: &[f32],
    keys: &[E],
    values: &[E],
    kv_dim: usize,
    slots: usize,
    sinks: &[f32],
    sc: &mut Vec<f32>,
    out: *mut f32,
) {
    let a = Job::new(p, split, job, kv_dim, slots, sinks);
    let need = a.nq() * a.stride + a.nq();
    if sc.len() < need {
        sc.resize(need, 0.0);
    }
    // SAFETY: the caller's contract.
    unsafe { E::run(isa, &a, q, keys, values, sc, out) }
}

/// One job's shape.
pub struct Job<'s> {
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
    /// Every query head's attention sink; empty: none.
    sinks: &'s [f32],
}

impl<'s> Job<'s> {
    fn new(
        p: &AttnParams,
        split: Split,
        job: usize,
        kv_dim: usize,
        slots: usize,
        sinks: &'s [f32],
    ) -> Job<'s> {
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
            sinks,
        }
    }

    /// 1 / the softmax denominator of query head `h0 + h` over `row` (its scores, turned into
    /// exp(s − max) in place), the head's sink counted in as llama.cpp's `soft_max` counts it: in
    /// the maximum and as one more term of the sum. Inlined, so that the exponentials vectorize
    /// for the instruction set of the kernel that calls it.
    #[inline(always)]
    fn softmax_inv(&self, row: &mut [f32], h: usize) -> f32 {
        let mut max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sink = self.sinks.get(self.h0 + h).copied();
        if let Some(s) = sink {
            max = max.max(s);
        }
        let mut sum = exp_shifted_sum(row, max);
        if let Some(s) = sink {
            sum += (s - max).exp();
        }
        1.0 / sum
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
    #[inline(always)]
    fn at(&self, j: usize) -> usize {
        // A global layer's positions never wrap: no division per key (it cost more than the
        // key's dot product at depth).
        let slot = if j < self.slots { j } else { j % self.slots };
        slot * self.kv_dim + self.koff
    }

    fn nq(&self) -> usize {
        (self.t1 - self.t0) * self.heads
    }
}

/// The portable job (and the reference of `x86.rs`).
///
/// # Safety
/// As [`run_job`].
unsafe fn job_body<E: KvElem>(
    a: &Job,
    q: &[f32],
    keys: &[E],
    values: &[E],
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
            inv[i] = a.softmax_inv(row, h);
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
                    *o += w * x.to_f32();
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
fn dot<E: KvElem>(a: &[f32], b: &[E]) -> f32 {
    // Eight partial sums let the compiler vectorise without reassociation flags.
    let mut acc = [0f32; 8];
    let (ac, ar) = a.as_chunks::<8>();
    let (bc, br) = b.as_chunks::<8>();
    for (x, y) in ac.iter().zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i].to_f32();
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        s += x * y.to_f32();
    }
    s
}

/// What the x86 kernels' tests share: the shapes, and a comparison with the portable body.
#[cfg(all(test, target_arch = "x86_64"))]
mod kernel_tests {
    use super::*;
    use crate::gpu::test_rng::TestRng;

    /// A job kernel of `x86.rs` or `x86_512.rs`.
    pub(super) type Kernel<E> = unsafe fn(&Job, &[f32], &[E], &[E], &mut [f32], *mut f32);

    /// Every job of `p` (split for `n_threads`) through `kernel`, on random queries and a random
    /// cache of `slots` positions drawn from `seed`: the output.
    pub(super) fn run_jobs<E: KvElem>(
        p: &AttnParams,
        slots: usize,
        seed: u64,
        n_threads: usize,
        kernel: Kernel<E>,
    ) -> Vec<f32> {
        let mut rng = TestRng::new(seed);
        let kv_dim = p.n_kv_heads * p.head_dim;
        let q: Vec<f32> = (0..p.n_tokens * p.n_heads * p.head_dim)
            .map(|_| rng.f())
            .collect();
        let keys: Vec<E> = (0..slots * kv_dim)
            .map(|_| E::from_f32(rng.f() * 2.0))
            .collect();
        let vals: Vec<E> = (0..slots * kv_dim).map(|_| E::from_f32(rng.f())).collect();
        let mut out = vec![f32::NAN; q.len()];
        let mut sc = Vec::new();
        let split = Split::new(p, n_threads);
        for j in 0..split.jobs {
            let a = Job::new(p, split, j, kv_dim, slots, &[]);
            sc.resize(a.nq() * a.stride + a.nq(), 0.0);
            // SAFETY: the caller checked the kernel's ISA; `out` holds every row; jobs write
            // disjoint rows.
            unsafe { kernel(&a, &q, &keys, &vals, &mut sc, out.as_mut_ptr()) };
        }
        out
    }

    /// Every job of `p` through `kernel` and through the portable body, split for one and for
    /// three threads, on one random cache of `slots` positions; the largest difference relative
    /// to the output's magnitude.
    fn compare<E: KvElem>(p: &AttnParams, slots: usize, seed: u64, kernel: Kernel<E>) -> f32 {
        let mut worst = 0f32;
        for n_threads in [1, 3] {
            let want = run_jobs(p, slots, seed, n_threads, job_body::<E>);
            let got = run_jobs(p, slots, seed, n_threads, kernel);
            let mag = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            worst = want
                .iter()
                .zip(&got)
                .map(|(w, g)| (w - g).abs() / mag)
                .fold(
                    worst,
                    |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
                );
        }
        worst
    }

    /// Holds a kernel (its f32 and f16 forms) to the portable body on every shape it `fits`:
    /// decode at depth, prompts with and without earlier context, a sliding window with
    /// soft-capping, several head dimensions and GQA groups (partial register blocks).
    pub(super) fn check_every_case(fits: fn(usize) -> bool, f32k: Kernel<f32>, f16k: Kernel<u16>) {
        let base = AttnParams {
            layer: 0,
            seq: 0,
            row0: 0,
            n_tokens: 1,
            pos0: 0,
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: 64,
            scale: 0.125,
            window: 0,
            softcap: 0.0,
            sinks: None,
        };
        let cases = [
            // Decode at depth, a key count that leaves a partial block of four.
            AttnParams { pos0: 1537, ..base },
            // A prompt batch after some context: causal edges inside the key blocks.
            AttnParams {
                n_tokens: 11,
                pos0: 6,
                ..base
            },
            // A first prompt.
            AttnParams {
                n_tokens: 9,
                ..base
            },
            // Sliding window (a ring of slots) and soft-capping (Gemma 2).
            AttnParams {
                n_tokens: 7,
                pos0: 40,
                window: 16,
                softcap: 50.0,
                ..base
            },
            // Head dimensions of 128 (two 64-wide value passes), 96 (64 + 32), 40 (32 + 8)
            // and 256 with a group of four (Gemma 3).
            AttnParams {
                n_tokens: 5,
                pos0: 3,
                head_dim: 128,
                ..base
            },
            AttnParams {
                n_tokens: 5,
                pos0: 3,
                head_dim: 96,
                n_kv_heads: 6,
                ..base
            },
            AttnParams {
                n_tokens: 3,
                pos0: 30,
                head_dim: 40,
                n_kv_heads: 1,
                ..base
            },
            AttnParams {
                n_tokens: 13,
                pos0: 300,
                head_dim: 256,
                n_heads: 4,
                n_kv_heads: 1,
                window: 64,
                ..base
            },
            // SmolLM2's shape over a whole 512-token prompt.
            AttnParams {
                n_tokens: 512,
                pos0: 0,
                head_dim: 64,
                n_heads: 9,
                n_kv_heads: 3,
                ..base
            },
            // A long prompt with a group of two (Qwen 3): every job a full block of queries.
            AttnParams {
                n_tokens: 64,
                pos0: 100,
                head_dim: 128,
                n_heads: 4,
                n_kv_heads: 2,
                ..base
            },
        ];
        let mut ran = 0;
        for (i, p) in cases.iter().enumerate() {
            if !fits(p.head_dim) {
                continue;
            }
            ran += 1;
            // A sliding-window layer keeps window + batch slots; a global one every position.
            let slots = if p.window > 0 {
                p.window + p.n_tokens
            } else {
                p.pos0 + p.n_tokens
            };
            let d32 = compare::<f32>(p, slots, i as u64 + 1, f32k);
            let d16 = compare::<u16>(p, slots, i as u64 + 101, f16k);
            // Same inputs, other summation order: f32 rounding only.
            assert!(
                d32 < 2e-5 && d16 < 2e-5,
                "case {i} {p:?}: f32 {d32:e}, f16 {d16:e}"
            );
        }
        assert!(ran >= 7, "only {ran} shapes fit the kernel");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(n_tokens: usize, n_kv_heads: usize) -> AttnParams {
        AttnParams {
            layer: 0,
            seq: 0,
            row0: 0,
            n_tokens,
            pos0: 0,
            n_heads: 6,
            n_kv_heads,
            head_dim: 8,
            scale: 1.0,
            window: 0,
            softcap: 0.0,
            sinks: None,
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
