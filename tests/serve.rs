//! `hipscope serve`: the multi-sequence forward pass against the single-sequence one, the
//! scheduler's continuous batching, and the HTTP endpoint with real clients (curl, the official
//! `openai` Python package, hipscope's own `chat --remote` / `top --remote`).

mod common;

use std::sync::Arc;

use hipscope::gpu::cpu::CpuBackend;
use hipscope::model::forward::{Logits, Model, ModelOptions, SeqChunk};
use hipscope::model::gguf::GgufFile;
use hipscope::model::tokenizer::Tokenizer;

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn smollm2_model(n_seq: usize, n_batch: usize) -> (Model, Tokenizer) {
    let file = Arc::new(GgufFile::open(&common::smollm2()).expect("open SmolLM2"));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let opts = ModelOptions {
        n_ctx: 256,
        n_batch,
        all_logits: false,
        n_seq,
    };
    let m = Model::load(file, Box::new(CpuBackend::new(2)), opts, &mut |_, _| {}).expect("load");
    (m, tok)
}

/// Greedy tokens of one prompt through the single-sequence path (sequence 0, one batch for the
/// prompt, one token a step).
fn alone(m: &mut Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut logits = Vec::new();
    m.forward(prompt, 0, Logits::Last, &mut logits)
        .expect("prompt");
    let mut out = vec![argmax(&logits)];
    while out.len() < n {
        let pos = prompt.len() + out.len() - 1;
        m.forward(&out[out.len() - 1..], pos, Logits::Last, &mut logits)
            .expect("decode");
        out.push(argmax(&logits));
    }
    out
}

/// Several prompts of different lengths through `forward_seqs` as the scheduler runs them: the
/// prompts cut into chunks that share steps with the others' decoding, every decode step one
/// batch of all the sequences still generating. Each sequence's greedy tokens must be exactly
/// those it gets alone.
#[test]
fn batched_sequences_give_each_ones_own_greedy_tokens() {
    let prompts = [
        "The capital of France is",
        "Write a haiku about the sea. The waves",
        "1, 2, 3, 4, 5,",
        "Once upon a time, in a land far away, there lived a dragon who",
    ];
    const N: usize = 12;
    let (mut single, tok) = smollm2_model(1, 64);
    let toks: Vec<Vec<u32>> = prompts.iter().map(|p| tok.encode(p, true, false)).collect();
    let want: Vec<Vec<u32>> = toks.iter().map(|t| alone(&mut single, t, N)).collect();
    drop(single);

    let (mut m, _) = smollm2_model(prompts.len(), 64);
    // Per sequence: prompt tokens done, generated tokens.
    let mut done = vec![0usize; prompts.len()];
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    // Sequence s starts at step s (a request arriving while the others decode); prompts go in
    // chunks of at most 5 tokens.
    let mut logits = Vec::new();
    for step in 0..200 {
        let mut chunks = Vec::new();
        for (s, t) in toks.iter().enumerate() {
            if step < s || got[s].len() >= N {
                continue;
            }
            if done[s] < t.len() {
                let n = (t.len() - done[s]).min(5);
                chunks.push(SeqChunk {
                    seq: s,
                    pos0: done[s],
                    tokens: &t[done[s]..done[s] + n],
                    logits: done[s] + n == t.len(),
                });
            } else {
                let g = &got[s];
                chunks.push(SeqChunk {
                    seq: s,
                    pos0: t.len() + g.len() - 1,
                    tokens: &g[g.len() - 1..],
                    logits: true,
                });
            }
        }
        if chunks.is_empty() {
            break;
        }
        let order: Vec<(usize, bool, usize)> = chunks
            .iter()
            .map(|c| (c.seq, c.logits, c.tokens.len()))
            .collect();
        m.forward_seqs(&chunks, &mut logits).expect("batch");
        let vocab = m.config.vocab_size;
        let mut row = 0;
        for (s, wants, n) in order {
            if done[s] < toks[s].len() {
                done[s] += n;
            }
            if wants {
                got[s].push(argmax(&logits[row * vocab..(row + 1) * vocab]));
                row += 1;
            }
        }
        assert_eq!(
            row * vocab,
            logits.len(),
            "one logits row per chunk that asked"
        );
    }
    for (s, p) in prompts.iter().enumerate() {
        assert_eq!(
            got[s],
            want[s],
            "{p:?}: batched {:?} vs alone {:?}",
            tok.decode(&got[s], false),
            tok.decode(&want[s], false)
        );
    }
}

/// A sequence past the cache's count, or twice in one batch, is refused before anything runs.
#[test]
fn forward_seqs_refuses_bad_batches() {
    let (mut m, _) = smollm2_model(2, 16);
    let t = [1u32, 2, 3];
    let mut out = Vec::new();
    let bad_seq = [SeqChunk {
        seq: 2,
        pos0: 0,
        tokens: &t,
        logits: true,
    }];
    assert!(m.forward_seqs(&bad_seq, &mut out).is_err());
    let twice = [
        SeqChunk {
            seq: 0,
            pos0: 0,
            tokens: &t,
            logits: true,
        },
        SeqChunk {
            seq: 0,
            pos0: 3,
            tokens: &t,
            logits: true,
        },
    ];
    assert!(m.forward_seqs(&twice, &mut out).is_err());
    let big = vec![1u32; 17];
    let too_many = [SeqChunk {
        seq: 1,
        pos0: 0,
        tokens: &big,
        logits: true,
    }];
    assert!(m.forward_seqs(&too_many, &mut out).is_err());
}
