//! The long-context cases of `hipscope selftest --compute`: decode steps past flash-decoding's
//! threshold, so that one token's attention is split over the KV length and merged by the combine
//! kernel. On the app's default shape (smollm2-135m) the logits of both backends are compared end
//! to end; on tiny-gpt-oss, whose experts take Q8-rounded activations (not bounded end to end,
//! see `end_to_end_bounded`), the steps run op by op, so that its attention sinks in the split
//! and combine kernels are judged per op.

use std::sync::Arc;

use super::{
    ComputeCheckOptions, end_to_end_tolerance, graph_replays, op_tolerance, open_gpu, print_ops,
    release_then,
};
use crate::app::cmd::usage::outln;
use crate::gpu::backend::Backend;
use crate::gpu::compute::lockstep::{Lockstep, OpErrors, rel_l2};
use crate::gpu::compute::{GpuCompute, KvType};
use crate::gpu::cpu::CpuBackend;
use crate::model::forward::{Logits, Model, ModelOptions};
use crate::model::gguf::GgufFile;
use crate::model::loader;
use crate::model::protocol::ModelSource;
use crate::model::sampler::Rng;

/// Prompt tokens before the long-context decode steps: past flash-decoding's threshold, so their
/// attention is split over the KV length (and replayed as a graph where graphs are on).
const LONG_PROMPT: usize = 700;
const LONG_DECODE: usize = 3;
/// A small batch after the decode steps: below the tiled kernel's rows, so each row's attention
/// walks its 704+ keys in several chunks of one block (the chunks' online softmax).
const LONG_BATCH: usize = 5;

fn long_options() -> ModelOptions {
    ModelOptions {
        n_ctx: LONG_PROMPT + LONG_DECODE + LONG_BATCH + 1,
        n_batch: 64,
        all_logits: false,
        n_seq: 1,
    }
}

/// The tokens of the long run: the prompt, the decode steps' and the batch's.
fn long_tokens(vocab: usize) -> Vec<u32> {
    let mut rng = Rng::new(0x1096);
    (0..LONG_PROMPT + LONG_DECODE + LONG_BATCH)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

/// The steps after the prompt: (first position, end) of each decode step, then of the batch.
fn long_steps() -> impl Iterator<Item = (usize, usize)> {
    let end = LONG_PROMPT + LONG_DECODE;
    (LONG_PROMPT..end)
        .map(|p| (p, p + 1))
        .chain([(end, end + LONG_BATCH)])
}

/// Decode steps, then a small batch, at a long context on both backends: the worst
/// ‖gpu−cpu‖/‖cpu‖ of their logits and the graph replays among them.
fn run_long(file: &Arc<GgufFile>, gpu: GpuCompute) -> Result<(f64, u64), String> {
    let load = |b: Box<dyn Backend>| {
        Model::load(file.clone(), b, long_options(), &mut |_, _| {}).map_err(|e| e.to_string())
    };
    let mut g = load(Box::new(gpu))?;
    let result = (|| {
        let mut c = load(Box::new(CpuBackend::new(0)))?;
        let toks = long_tokens(c.config.vocab_size);
        let (mut lc, mut lg) = (Vec::new(), Vec::new());
        c.forward(&toks[..LONG_PROMPT], 0, Logits::Last, &mut lc)
            .map_err(|e| format!("cpu prompt: {e}"))?;
        g.forward(&toks[..LONG_PROMPT], 0, Logits::Last, &mut lg)
            .map_err(|e| format!("gpu prompt: {e}"))?;
        let mut worst = 0.0f64;
        for (pos, next) in long_steps() {
            c.forward(&toks[pos..next], pos, Logits::Last, &mut lc)
                .map_err(|e| format!("cpu step at {pos}: {e}"))?;
            g.forward(&toks[pos..next], pos, Logits::Last, &mut lg)
                .map_err(|e| format!("gpu step at {pos}: {e}"))?;
            let e = rel_l2(&lg, &lc);
            worst = if e.is_nan() {
                f64::INFINITY
            } else {
                worst.max(e)
            };
        }
        Ok(worst)
    })();
    let replays = graph_replays(g.backend_mut());
    release_then(&mut g, result.map(|w| (w, replays)))
}

/// The long-context cases of the shapes asked for: smollm2-135m's end to end, tiny-gpt-oss's op
/// by op. Prints a row per case; returns whether each passed.
pub(super) fn run(o: &ComputeCheckOptions) -> Vec<bool> {
    let mut v = Vec::new();
    if o.shapes.iter().any(|s| s == "smollm2-135m") {
        v.push(long_context(o));
    }
    if o.shapes.iter().any(|s| s == "tiny-gpt-oss") {
        v.push(long_context_ops(o));
    }
    v
}

/// The long steps op by op ([`Lockstep`]); returns the per-op table.
fn run_long_ops(file: &Arc<GgufFile>, gpu: GpuCompute) -> Result<OpErrors, String> {
    let (ls, errors) = Lockstep::new(CpuBackend::new(0), gpu);
    let mut m = Model::load(file.clone(), Box::new(ls), long_options(), &mut |_, _| {})
        .map_err(|e| e.to_string())?;
    let toks = long_tokens(m.config.vocab_size);
    let mut logits = Vec::new();
    let r = std::iter::once((0, LONG_PROMPT))
        .chain(long_steps())
        .try_for_each(|(pos, next)| {
            m.forward(&toks[pos..next], pos, Logits::Last, &mut logits)
                .map_err(|e| format!("step at {pos}: {e}"))
        });
    release_then(&mut m, r)?;
    Ok(errors.lock().map(|e| e.clone()).unwrap_or_default())
}

/// gpt-oss at a long context, op by op: its global layers' decode attention split over the keys
/// with the sinks counted in by the combine kernel, its sliding layers' within their window.
fn long_context_ops(o: &ComputeCheckOptions) -> bool {
    let source = ModelSource::Synthetic {
        shape: "tiny-gpt-oss".into(),
        quant: "Q8_0".into(),
        seed: 7,
    };
    let kv = KvType::F16;
    let what = format!(
        "tiny-gpt-oss Q8_0 f16, op by op: {LONG_DECODE} decode steps at {}–{} keys ({} KV splits \
         in the global layers), a {LONG_BATCH}-token batch after them",
        LONG_PROMPT + 1,
        LONG_PROMPT + LONG_DECODE,
        crate::gpu::compute::flash_splits(LONG_PROMPT + 1, heads_of("tiny-gpt-oss"))
    );
    let r = loader::open(&source, &mut |_, _| {})
        .map_err(|e| e.to_string())
        .and_then(|file| open_gpu(o, kv).and_then(|g| run_long_ops(&file, g)));
    match r {
        Ok(errors) => {
            let worst = errors
                .iter()
                .map(|(k, e)| e.rel_l2 / op_tolerance(k, kv))
                .fold(0.0, f64::max);
            let pass = worst <= 1.0;
            outln!(
                "{what}: worst op at {worst:.2}× its bound  {}",
                if pass { "PASS" } else { "FAIL" }
            );
            if !pass || o.ops {
                print_ops(&errors, kv);
            }
            pass
        }
        Err(e) => {
            outln!("{what}: error: {e}");
            false
        }
    }
}

/// The long-context case (flash-decoding) on the app's default shape, weights and cache; prints
/// its row and returns whether it passed.
fn long_context(o: &ComputeCheckOptions) -> bool {
    let source = ModelSource::Synthetic {
        shape: "smollm2-135m".into(),
        quant: "Q4_0".into(),
        seed: 7,
    };
    let splits = crate::gpu::compute::flash_splits(LONG_PROMPT + 1, heads_of("smollm2-135m"));
    let what = format!(
        "smollm2-135m Q4_0 f16, {LONG_DECODE} decode steps at {}–{} keys ({splits} KV splits), \
         a {LONG_BATCH}-token batch after them",
        LONG_PROMPT + 1,
        LONG_PROMPT + LONG_DECODE
    );
    let r = loader::open(&source, &mut |_, _| {})
        .map_err(|e| e.to_string())
        .and_then(|file| {
            let bound = end_to_end_tolerance(&file);
            open_gpu(o, KvType::F16)
                .and_then(|g| run_long(&file, g))
                .map(|(e, replays)| (e, replays, bound))
        });
    match r {
        Ok((e, replays, bound)) => {
            let pass = e <= bound;
            outln!(
                "{what}: ‖Δ‖/‖cpu‖ {e:.2e} (bound {bound:.0e}), {replays} graph replays  {}",
                if pass { "PASS" } else { "FAIL" }
            );
            pass
        }
        Err(e) => {
            outln!("{what}: error: {e}");
            false
        }
    }
}

/// The query heads of a synthetic shape (for the split count its row names).
fn heads_of(shape: &str) -> usize {
    crate::model::synthetic::shape(shape).map_or(1, |s| s.n_heads)
}
