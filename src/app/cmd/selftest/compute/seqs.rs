//! `serve`'s decode batches in `hipscope selftest --compute`'s op-by-op run: a model of several
//! sequences, their prompts, then decode steps of one token of each in one batch, whose rotation,
//! cache writes and attention the GPU runs as one launch for every sequence
//! (`Ops::rope_attention_rows`; kinds `rope + kv_store (sequences)`, `attention (sequences…)`).

use std::sync::Arc;

use super::{DECODE, model_options, release_then};
use crate::gpu::compute::GpuCompute;
use crate::gpu::compute::lockstep::{Lockstep, OpErrors};
use crate::gpu::cpu::CpuBackend;
use crate::model::forward::{Model, ModelOptions, SeqChunk};
use crate::model::gguf::GgufFile;
use crate::model::sampler::Rng;

/// Sequences of the run, and each one's context.
pub(super) const SEQS: usize = 3;
const SEQ_CTX: usize = 320;

/// `hipscope serve`'s batches op by op: a cache of [`SEQS`] sequences, their prompts one call
/// a batch (the longest past the split attention's threshold), then [`DECODE`] decode steps of one
/// token of every sequence in one call (`rope + kv_store (sequences)`, `attention (sequences)`).
pub(super) fn run_lockstep(file: &Arc<GgufFile>, gpu: GpuCompute) -> Result<OpErrors, String> {
    let (ls, errors) = Lockstep::new(CpuBackend::new(0), gpu);
    let opts = ModelOptions {
        n_ctx: SEQ_CTX,
        n_seq: SEQS,
        ..model_options()
    };
    let mut m =
        Model::load(file.clone(), Box::new(ls), opts, &mut |_, _| {}).map_err(|e| e.to_string())?;
    let vocab = m.config.vocab_size as u64;
    let mut rng = Rng::new(0x5e95);
    let mut toks =
        |n: usize| -> Vec<u32> { (0..n).map(|_| (rng.next_u64() % vocab) as u32).collect() };
    let n_batch = model_options().n_batch;
    let mut logits = Vec::new();
    let mut pos = [0usize; SEQS];
    let run = (|| {
        // Prompts of 9, 2 and 1 full batches: the first sequence's decode steps read ~290 keys,
        // past the split attention's threshold for every head count.
        for (s, at) in pos.iter_mut().enumerate() {
            let batches = if s == 0 {
                SEQ_CTX / n_batch - 1
            } else {
                SEQS - s
            };
            for _ in 0..batches {
                let t = toks(n_batch);
                let c = [SeqChunk {
                    seq: s,
                    pos0: *at,
                    tokens: &t,
                    logits: true,
                }];
                m.forward_seqs(&c, &mut logits)
                    .map_err(|e| format!("prompt: {e}"))?;
                *at += n_batch;
            }
        }
        for _ in 0..DECODE {
            let next = toks(SEQS);
            let chunks: Vec<SeqChunk> = (0..SEQS)
                .map(|s| SeqChunk {
                    seq: s,
                    pos0: pos[s],
                    tokens: &next[s..s + 1],
                    logits: true,
                })
                .collect();
            m.forward_seqs(&chunks, &mut logits)
                .map_err(|e| format!("decode of {SEQS} sequences: {e}"))?;
            for p in &mut pos {
                *p += 1;
            }
        }
        Ok(())
    })();
    release_then(&mut m, run)?;
    Ok(errors.lock().map(|e| e.clone()).unwrap_or_default())
}

/// `more`'s kinds into `errors`: calls added, the worst kept.
pub(super) fn merge_ops(errors: &mut OpErrors, more: OpErrors) {
    for (kind, e) in more {
        match errors.get_mut(&kind) {
            Some(have) => {
                have.calls += e.calls;
                have.tied_rows += e.tied_rows;
                if e.rel_l2 > have.rel_l2 {
                    have.rel_l2 = e.rel_l2;
                    have.worst_at = e.worst_at;
                }
            }
            None => {
                errors.insert(kind, e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::compute::lockstep::OpError;

    #[test]
    fn merging_adds_calls_and_tied_rows_and_keeps_the_worst() {
        let e = |rel_l2, at: &str, calls, tied_rows| OpError {
            rel_l2,
            worst_at: at.into(),
            calls,
            tied_rows,
        };
        let mut have = OpErrors::from([("moe".to_string(), e(1e-3, "layer 0", 4, 0))]);
        merge_ops(
            &mut have,
            OpErrors::from([
                ("moe".to_string(), e(2e-3, "layer 1", 6, 1)),
                ("add".to_string(), e(0.0, "layer 0", 2, 0)),
            ]),
        );
        assert_eq!(have["moe"], e(2e-3, "layer 1", 10, 1));
        assert_eq!(have["add"], e(0.0, "layer 0", 2, 0));
    }
}
