//! The CPU forward pass against a naive float64 transformer written here from the formulas
//! (llama.cpp's graphs in `src/models/{llama,qwen2,qwen3,gemma2,gemma3,phi3}.cpp`), on synthetic
//! models of every architecture variant the engine supports.

use std::sync::Arc;

use hipscope::gpu::cpu::CpuBackend;
use hipscope::gpu::quant::{self, GgmlType};
use hipscope::model::config::{ModelConfig, RopeScaling};
use hipscope::model::forward::{Logits, Model, ModelError, ModelOptions};
use hipscope::model::gguf::GgufFile;
use hipscope::model::synthetic;

fn weights(f: &GgufFile, name: &str) -> Vec<f64> {
    let t = f.tensor(name).unwrap_or_else(|| panic!("{name}"));
    let mut v = vec![0f32; t.n_elements() as usize];
    quant::dequantize(t.ty, f.tensor_data(t), &mut v).unwrap();
    v.into_iter().map(f64::from).collect()
}

fn opt_weights(f: &GgufFile, name: &str) -> Option<Vec<f64>> {
    f.tensor(name).map(|_| weights(f, name))
}

/// y = W x for W stored as `rows` rows of `cols`.
fn matvec(w: &[f64], x: &[f64]) -> Vec<f64> {
    w.chunks_exact(x.len())
        .map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(a, b)| a * s * b).collect()
}

/// RoPE at `pos` with base `base` and position scale `scale` (ggml's `rope_ext` without YaRN:
/// cos and sin times `mscale`).
fn rope(
    x: &mut [f64],
    pos: usize,
    c: &ModelConfig,
    (base, scale): (f64, f64),
    factors: Option<&[f64]>,
) {
    let half = c.n_rot / 2;
    let m = c.rope_attn_factor as f64;
    for head in x.chunks_exact_mut(c.head_dim) {
        for i in 0..half {
            let mut theta = pos as f64 * scale * base.powf(-2.0 * i as f64 / c.n_rot as f64);
            if let Some(f) = factors {
                theta /= f[i];
            }
            let (a, b) = if c.arch.neox_rope() {
                (i, i + half)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = (x0 * theta.cos() - x1 * theta.sin()) * m;
            head[b] = (x0 * theta.sin() + x1 * theta.cos()) * m;
        }
    }
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// The whole sequence, token by token, with an explicit cache; returns every position's logits.
fn reference(f: &GgufFile, tokens: &[u32], n_ctx: usize) -> Vec<Vec<f64>> {
    let c = ModelConfig::from_gguf(f).unwrap();
    let eps = c.rms_eps as f64;
    let arch = c.arch_name.as_str();
    let gemma = arch.starts_with("gemma");
    let embd = weights(f, "token_embd.weight");
    let out_w = opt_weights(f, "output.weight").unwrap_or_else(|| embd.clone());
    let out_norm = weights(f, "output_norm.weight");
    // Phi-3's factors: the short ones while the context stays within the original one.
    let factors = opt_weights(f, "rope_freqs.weight").or_else(|| match c.rope_scaling {
        RopeScaling::LongRope { original_ctx } if n_ctx > original_ctx => {
            opt_weights(f, "rope_factors_long.weight")
        }
        _ => opt_weights(f, "rope_factors_short.weight"),
    });
    let global_rope = (
        c.rope_base as f64,
        match c.rope_scaling {
            RopeScaling::Linear { factor } => 1.0 / factor as f64,
            _ => 1.0,
        },
    );
    let hd = c.head_dim;
    let (q_dim, kv_dim) = (c.n_heads * hd, c.n_kv_heads * hd);
    let group = c.n_heads / c.n_kv_heads;
    // Gemma's query scale: 1/sqrt(key_length) for these sizes (query_pre_attn_scalar).
    let scale = 1.0 / (hd as f64).sqrt();
    let softcap = |s: f64, cap: Option<f32>| match cap {
        Some(cap) => cap as f64 * (s / cap as f64).tanh(),
        None => s,
    };
    let mut kcache: Vec<Vec<Vec<f64>>> = vec![Vec::new(); c.n_layers];
    let mut vcache: Vec<Vec<Vec<f64>>> = vec![Vec::new(); c.n_layers];
    let mut all = Vec::new();
    for (pos, &tok) in tokens.iter().enumerate() {
        let mut x = embd[tok as usize * c.dim..(tok as usize + 1) * c.dim].to_vec();
        if gemma {
            x.iter_mut().for_each(|v| *v *= (c.dim as f64).sqrt());
        }
        for l in 0..c.n_layers {
            let w = |s: &str| weights(f, &format!("blk.{l}.{s}"));
            let b = |s: &str| opt_weights(f, &format!("blk.{l}.{s}"));
            // Gemma 2: even layers local; Gemma 3: five local, then one global.
            let window = match arch {
                "gemma2" if l % 2 == 0 => c.sliding_window,
                "gemma3" if l % 6 < 5 => c.sliding_window,
                _ => 0,
            };
            let rope_l = if arch == "gemma3" && window > 0 {
                (10000.0, 1.0)
            } else {
                global_rope
            };
            let h = rms_norm(&x, &w("attn_norm.weight"), eps);
            let add = |mut v: Vec<f64>, bias: Option<Vec<f64>>| {
                if let Some(bias) = bias {
                    v.iter_mut().zip(bias).for_each(|(a, b)| *a += b);
                }
                v
            };
            let (mut q, mut k, v) = match b("attn_qkv.weight") {
                Some(qkv) => {
                    let all = matvec(&qkv, &h);
                    (
                        all[..q_dim].to_vec(),
                        all[q_dim..q_dim + kv_dim].to_vec(),
                        all[q_dim + kv_dim..].to_vec(),
                    )
                }
                None => (
                    add(matvec(&w("attn_q.weight"), &h), b("attn_q.bias")),
                    add(matvec(&w("attn_k.weight"), &h), b("attn_k.bias")),
                    add(matvec(&w("attn_v.weight"), &h), b("attn_v.bias")),
                ),
            };
            if let (Some(qn), Some(kn)) = (b("attn_q_norm.weight"), b("attn_k_norm.weight")) {
                q = q
                    .chunks_exact(hd)
                    .flat_map(|h| rms_norm(h, &qn, eps))
                    .collect();
                k = k
                    .chunks_exact(hd)
                    .flat_map(|h| rms_norm(h, &kn, eps))
                    .collect();
            }
            rope(&mut q, pos, &c, rope_l, factors.as_deref());
            rope(&mut k, pos, &c, rope_l, factors.as_deref());
            kcache[l].push(k);
            vcache[l].push(v);
            let first = if window > 0 {
                (pos + 1).saturating_sub(window)
            } else {
                0
            };
            let mut att = vec![0f64; c.n_heads * hd];
            for head in 0..c.n_heads {
                let kvh = head / group;
                let qh = &q[head * hd..(head + 1) * hd];
                let scores: Vec<f64> = kcache[l][first..]
                    .iter()
                    .map(|k| {
                        let kh = &k[kvh * hd..(kvh + 1) * hd];
                        let s = qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f64>() * scale;
                        softcap(s, c.attn_softcap)
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, ej) in e.iter().enumerate() {
                    let vh = &vcache[l][first + j][kvh * hd..(kvh + 1) * hd];
                    for d in 0..hd {
                        att[head * hd + d] += ej / z * vh[d];
                    }
                }
            }
            let mut o = matvec(&w("attn_output.weight"), &att);
            if let Some(post) = b("post_attention_norm.weight") {
                o = rms_norm(&o, &post, eps);
            }
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let h = rms_norm(&x, &w("ffn_norm.weight"), eps);
            let (g, u) = match b("ffn_gate.weight") {
                Some(gw) => (matvec(&gw, &h), matvec(&w("ffn_up.weight"), &h)),
                None => {
                    // Phi-3's gate_up: gate rows first.
                    let gu = matvec(&w("ffn_up.weight"), &h);
                    (gu[..c.ffn_dim].to_vec(), gu[c.ffn_dim..].to_vec())
                }
            };
            let act: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(&g, u)| {
                    if gemma {
                        gelu(g) * u
                    } else {
                        g / (1.0 + (-g).exp()) * u
                    }
                })
                .collect();
            let mut d = matvec(&w("ffn_down.weight"), &act);
            if let Some(post) = b("post_ffw_norm.weight") {
                d = rms_norm(&d, &post, eps);
            }
            x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
        }
        let logits = matvec(&out_w, &rms_norm(&x, &out_norm, eps));
        all.push(
            logits
                .into_iter()
                .map(|v| softcap(v, c.final_softcap))
                .collect(),
        );
    }
    all
}

const N_CTX: usize = 64;

fn load(shape: &str, ty: GgmlType, threads: usize) -> Model {
    let s = synthetic::shape(shape).unwrap();
    let f = Arc::new(synthetic::build(s, ty, 7, &mut |_, _| {}).unwrap());
    Model::load(
        f,
        Box::new(CpuBackend::new(threads)),
        ModelOptions {
            n_ctx: N_CTX,
            n_batch: 16,
            all_logits: true,
            n_seq: 1,
        },
        &mut |_, _| {},
    )
    .unwrap()
}

/// Largest |a - b| relative to the largest |b|.
fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max((*x as f64 - y).abs()))
        / scale
}

const TOKENS: [u32; 21] = [
    5, 300, 17, 17, 42, 511, 0, 256, 99, 3, 128, 64, 7, 200, 201, 202, 9, 33, 410, 1, 77,
];

fn check(shape: &str, ty: GgmlType, tol: f64) {
    check_tokens(shape, ty, tol, &TOKENS);
}

/// 60 tokens: past the 16-token windows of the tiny sliding-window shapes and around their
/// 31-slot rings (window + batch − 1) twice.
fn long_tokens() -> Vec<u32> {
    (0..60u32).map(|i| (i * 37 + 11) % 512).collect()
}

fn check_tokens(shape: &str, ty: GgmlType, tol: f64, tokens: &[u32]) {
    let mut m = load(shape, ty, 3);
    let want = reference(m.file(), tokens, N_CTX);
    let vocab = m.config.vocab_size;
    // The whole prompt in batches of 16 (so the cache is reused across batches), every row.
    let mut all = Vec::new();
    m.forward(tokens, 0, Logits::All, &mut all).unwrap();
    for (i, w) in want.iter().enumerate() {
        let e = rel_err(&all[i * vocab..(i + 1) * vocab], w);
        assert!(e < tol, "{shape} {ty}: position {i}: relative error {e}");
    }
    // Decoding one token at a time after a prompt gives the same logits.
    let mut m = load(shape, ty, 2);
    let mut last = Vec::new();
    m.forward(&tokens[..10], 0, Logits::Last, &mut last)
        .unwrap();
    assert!(rel_err(&last, &want[9]) < tol);
    for (i, &t) in tokens.iter().enumerate().skip(10) {
        m.forward(&[t], i, Logits::Last, &mut last).unwrap();
        let e = rel_err(&last, &want[i]);
        assert!(e < tol, "{shape} {ty}: decode at {i}: relative error {e}");
    }
}

#[test]
fn llama_f32_matches_the_f64_reference() {
    check("tiny", GgmlType::F32, 2e-4);
}

#[test]
fn qwen2_biases_neox_rope_and_tied_output_match() {
    check("tiny-qwen2", GgmlType::F32, 2e-4);
}

#[test]
fn llama3_rope_frequency_factors_match() {
    check("tiny-llama3", GgmlType::F32, 2e-4);
}

#[test]
fn qwen3_per_head_qk_norms_match() {
    check("tiny-qwen3", GgmlType::F32, 2e-4);
}

#[test]
fn gemma2_softcaps_sandwich_norms_and_alternating_windows_match() {
    let c = load("tiny-gemma2", GgmlType::F32, 1).config;
    assert_eq!(c.swa_layers, [true, false, true, false]);
    assert_eq!((c.attn_softcap, c.final_softcap), (Some(50.0), Some(30.0)));
    check_tokens("tiny-gemma2", GgmlType::F32, 2e-4, &long_tokens());
}

#[test]
fn gemma3_local_rope_base_and_five_to_one_windows_match() {
    let c = load("tiny-gemma3", GgmlType::F32, 1).config;
    assert_eq!(c.swa_layers, [true, true, true, true, true, false]);
    assert_eq!((c.rope_base, c.rope_base_swa), (1e6, 1e4));
    check_tokens("tiny-gemma3", GgmlType::F32, 2e-4, &long_tokens());
}

#[test]
fn phi3_fused_tensors_partial_rotary_and_longrope_match() {
    let c = load("tiny-phi3", GgmlType::F32, 1).config;
    assert!(c.fused_qkv && c.fused_gate_up);
    assert_eq!(c.rope_scaling, RopeScaling::LongRope { original_ctx: 256 });
    assert!((c.rope_attn_factor - (1.0f32 + 16f32.ln() / 256f32.ln()).sqrt()).abs() < 1e-6);
    assert_eq!(c.sliding_window, 0, "llama.cpp turns Phi-3's window off");
    check_tokens("tiny-phi3", GgmlType::F32, 2e-4, &long_tokens());
}

#[test]
fn new_architectures_with_quantized_weights_match() {
    for shape in ["tiny-qwen3", "tiny-gemma2", "tiny-gemma3", "tiny-phi3"] {
        check_tokens(shape, GgmlType::Q8_0, 6e-2, &long_tokens());
    }
}

#[test]
fn a_rollback_past_the_rings_is_refused_and_resumes_from_the_start() {
    let mut m = load("tiny-gemma3", GgmlType::F32, 1);
    let toks = long_tokens();
    let mut out = Vec::new();
    m.forward(&toks, 0, Logits::Last, &mut out).unwrap();
    // The rings keep positions 29..60 (31 slots): a token at 40 needs 25.. (window 16).
    assert_eq!(m.kv_resume(50), 50);
    assert_eq!(m.kv_resume(40), 0);
    let e = m
        .forward(&toks[40..41], 40, Logits::Last, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("no longer hold"), "{e}");
    // From the start it runs, and gives the reference's logits.
    let want = reference(m.file(), &toks[..41], N_CTX);
    m.forward(&toks[..41], 0, Logits::Last, &mut out).unwrap();
    assert!(rel_err(&out, &want[40]) < 2e-4);
    // A model without sliding windows resumes anywhere.
    let mut m = load("tiny-qwen3", GgmlType::F32, 1);
    m.forward(&toks, 0, Logits::Last, &mut out).unwrap();
    assert_eq!(m.kv_resume(3), 3);
}

#[test]
fn quantized_weights_match_within_activation_quantization() {
    // The reference uses the same dequantized weights; the difference left is the 8-bit
    // quantization of activations in the dot products (Q8_0/Q8_1 per 32 values, Q8_K per 256),
    // amplified through two layers and the softmax: measured at most 2.3% (Q8_0, Q4_1) and 3.6%
    // (Q4_K, Q6_K) of the largest logit. A wrong kernel is off by the size of the logits.
    for ty in [GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q4K, GgmlType::Q6K] {
        check("tiny", ty, 6e-2);
    }
}

#[test]
fn positions_past_the_context_are_refused() {
    let mut m = load("tiny", GgmlType::F32, 1);
    let mut out = Vec::new();
    let e = m
        .forward(&[1, 2, 3], 62, Logits::Last, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("exceed the context of 64"), "{e}");
    let e = m.forward(&[9999], 0, Logits::Last, &mut out).unwrap_err();
    assert!(e.to_string().contains("outside the vocabulary"), "{e}");
}

/// `Logits::Last` reuses the caller's vector without clearing it first (a decode step fills no
/// zeros): whatever it held before — a longer `Logits::All` result, another step's logits — it
/// comes back holding exactly the step's `vocab` logits; a step that fails empties it.
#[test]
fn the_last_logits_replace_whatever_the_vector_held() {
    let mut a = load("tiny", GgmlType::F32, 1);
    let mut b = load("tiny", GgmlType::F32, 1);
    let vocab = a.config.vocab_size;
    let (mut reused, mut fresh) = (Vec::new(), Vec::new());
    a.forward(&TOKENS[..8], 0, Logits::All, &mut reused)
        .unwrap();
    assert_eq!(reused.len(), 8 * vocab);
    b.forward(&TOKENS[..8], 0, Logits::All, &mut fresh).unwrap();
    for (i, &t) in TOKENS.iter().enumerate().skip(8).take(3) {
        a.forward(&[t], i, Logits::Last, &mut reused).unwrap();
        fresh = Vec::new();
        b.forward(&[t], i, Logits::Last, &mut fresh).unwrap();
        assert_eq!(reused.len(), vocab);
        assert_eq!(reused, fresh, "step at {i}");
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(true));
    a.set_interrupt(stop);
    let e = a.forward(&[7], 11, Logits::Last, &mut reused).unwrap_err();
    assert!(matches!(e, ModelError::Interrupted), "{e}");
    assert!(reused.is_empty(), "a failed step leaves no stale logits");
    a.set_interrupt(Arc::new(std::sync::atomic::AtomicBool::new(false)));
    a.forward(&[], 11, Logits::Last, &mut fresh).unwrap();
    assert!(fresh.is_empty());
}

#[test]
fn sliding_window_layers_keep_only_their_ring_in_the_kv_cache() {
    // tiny-gemma3: five local layers (window 16) and one global, one KV head of 128.
    let s = synthetic::shape("tiny-gemma3").unwrap();
    let f = Arc::new(synthetic::build(s, GgmlType::F32, 7, &mut |_, _| {}).unwrap());
    let m = Model::load(
        f,
        Box::new(CpuBackend::new(1)),
        ModelOptions {
            n_ctx: 512,
            n_batch: 16,
            all_logits: false,
            n_seq: 1,
        },
        &mut |_, _| {},
    )
    .unwrap();
    let kv = m
        .backend()
        .arena()
        .regions
        .iter()
        .find(|r| r.name == "kv_cache")
        .unwrap()
        .capacity;
    // Keys and values, f32: 5 rings of window + batch − 1 = 31 positions, one layer of 512.
    assert_eq!(kv, (5 * 31 + 512) * 128 * 4 * 2);
}
