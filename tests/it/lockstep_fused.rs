//! `selftest --compute`'s op-by-op check (`gpu/compute/lockstep.rs`) covers the fused decode
//! kernels: in a decode step the lockstep hands each fused op (Q/K/V with their biases, gate and
//! up with SwiGLU, a product with the residual add, RoPE with the KV-cache write) to the GPU as
//! one call, so the GPU launches its fused kernel, and compares each output with the CPU's under
//! the fused op's own kind. Before, the fused ops' default bodies split them into the separate
//! ops, so no fused kernel ran in the lockstep.
//!
//! On the scripted fake device (no GPU): it launches the kernels as no-ops, so a fused op's
//! output there is whatever its buffer held, and the comparison must call that wrong; the
//! numbers themselves are `hipscope selftest --compute`'s job on a real GPU
//! (`scripts/device/selftest-compute.sh`).

use std::time::Duration;

use std::sync::{Arc, Mutex};

use hipscope::gpu::compute::lockstep::{Lockstep, OpErrors};
use hipscope::gpu::compute::{ComputeOptions, GpuCompute, KvType};
use hipscope::gpu::cpu::CpuBackend;
use hipscope::gpu::fake::{FakeControl, FakeDevice, FakeScript};
use hipscope::gpu::kernels::KernelCache;
use hipscope::gpu::snapshot::DeviceRelease;
use hipscope::model::forward::{Logits, Model, ModelOptions, SeqChunk};
use hipscope::model::loader;
use hipscope::model::protocol::ModelSource;

fn launched(c: &FakeControl, kernel: &str) -> usize {
    let want = format!("launch {kernel}");
    c.log().iter().filter(|l| **l == want).count()
}

/// A synthetic `shape` (Q4_0) loaded on the lockstep of the CPU and a fake GPU (f32 cache, ops
/// complete at once, no BLAS, no graphs): the model, the fake's control and the lockstep's
/// comparison table.
fn lockstep_model(shape: &str) -> (Model, FakeControl, Arc<Mutex<OpErrors>>) {
    lockstep_model_seqs(shape, 1)
}

/// As [`lockstep_model`], with a cache of `n_seq` sequences.
fn lockstep_model_seqs(shape: &str, n_seq: usize) -> (Model, FakeControl, Arc<Mutex<OpErrors>>) {
    let dev = FakeDevice::new(FakeScript::default());
    let ctl = dev.control();
    let gpu = GpuCompute::open(
        Box::new(dev),
        "fake: test device",
        ComputeOptions {
            kv: KvType::F32,
            ..ComputeOptions::default()
        },
        &KernelCache::disabled(),
    )
    .expect("open");
    let (lockstep, errors) = Lockstep::new(CpuBackend::new(1), gpu);
    let file = loader::open(
        &ModelSource::Synthetic {
            shape: shape.into(),
            quant: "Q4_0".into(),
            seed: 3,
        },
        &mut |_, _| {},
    )
    .expect("synthetic model");
    let opts = ModelOptions {
        n_ctx: 64,
        n_batch: 32,
        all_logits: false,
        n_seq,
    };
    let m = Model::load(file, Box::new(lockstep), opts, &mut |_, _| {}).expect("load");
    (m, ctl, errors)
}

#[test]
fn the_lockstep_runs_and_compares_the_fused_decode_kernels() {
    // qwen2: biases on Q, K and V (the fused Q/K/V kernel adds them), NeoX RoPE.
    let (mut m, ctl, errors) = lockstep_model("tiny-qwen2");
    let n_layers = m.config.n_layers;
    let mut logits = Vec::new();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 7 + 1) % 512).collect();
    m.forward(&prompt, 0, Logits::Last, &mut logits)
        .expect("prompt");
    let prompt_kinds: Vec<String> = errors.lock().unwrap().keys().cloned().collect();
    m.forward(&[5], 20, Logits::Last, &mut logits)
        .expect("decode");

    // The GPU ran its fused one-token kernels inside the lockstep: one Q/K/V launch and one
    // gate/up launch per layer.
    assert_eq!(launched(&ctl, "hs_mv_qkv_q4_0"), n_layers);
    assert_eq!(launched(&ctl, "hs_mv_swiglu_q4_0"), n_layers);
    // RoPE with the KV-cache write, for the prompt and the decode step, once per layer each;
    // never the separate rotation.
    assert_eq!(launched(&ctl, "hs_rope_kv_store_f32"), 2 * n_layers);
    assert_eq!(launched(&ctl, "hs_rope"), 0);

    let errors = errors.lock().unwrap().clone();
    let kinds: Vec<&String> = errors.keys().collect();
    // Each fused op compared under its own kind: Q, K and V each; the gated product; both
    // products with the residual add (attention output and down); q and k after the rotation.
    for (kind, calls) in [
        ("matmul_qkv Q4_0 (mv fused)", 3 * n_layers),
        ("matmul_swiglu Q4_0 (mv fused)", n_layers),
        ("matmul_add Q4_0 (mv fused)", 2 * n_layers),
        ("rope (neox) + kv_store (fused)", 2 * 2 * n_layers),
    ] {
        let e = errors
            .get(kind)
            .unwrap_or_else(|| panic!("no {kind:?} among the compared ops: {kinds:?}"));
        assert_eq!(e.calls, calls, "{kind}");
        // The fake computes nothing, so the GPU's side of a fused op is stale: a comparison
        // that read the GPU's own output calls it wrong.
        assert!(
            e.rel_l2 > 0.1,
            "{kind}: {} (the GPU's output was not the one compared)",
            e.rel_l2
        );
    }
    // A prompt batch fuses no product: its products are compared one by one, as before.
    assert!(prompt_kinds.iter().all(|k| !k.contains("(mv fused)")));
    assert!(
        prompt_kinds
            .iter()
            .any(|k| k.starts_with("matmul Q4_0 (gemm"))
    );

    let release = m
        .backend_mut()
        .shutdown(Duration::from_secs(5), &mut |_| {});
    assert_eq!(release, DeviceRelease::Clean);
}

/// Gemma 3's layer in a decode step: the per-head Q/K norms in the launch that rotates and
/// stores (no norm launch of their own), gate and up with GELU in one product, and each norm
/// after a block with its residual add in one launch; each compared under its fused kind. The
/// prompt batch runs the same ops as separate kernels where the GPU does not fuse them (GeGLU).
#[test]
fn the_lockstep_compares_gemma3s_fused_norms_and_geglu() {
    let (mut m, ctl, errors) = lockstep_model("tiny-gemma3");
    let n_layers = m.config.n_layers;
    let mut logits = Vec::new();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 7 + 1) % 512).collect();
    m.forward(&prompt, 0, Logits::Last, &mut logits)
        .expect("prompt");
    let norms = |c: &FakeControl| launched(c, "hs_rms_norm_rows") + launched(c, "hs_rms_norm_q8");
    let after_prompt = (
        norms(&ctl),
        launched(&ctl, "hs_geglu_inplace"),
        launched(&ctl, "hs_rms_norm_add_rows"),
    );
    m.forward(&[5], 20, Logits::Last, &mut logits)
        .expect("decode");
    // The decode step: two norms a layer before its blocks and the output norm, none for the
    // heads; GELU inside the gate/up product; the post-norms with their adds, two a layer.
    assert_eq!(norms(&ctl) - after_prompt.0, 2 * n_layers + 1);
    assert_eq!(launched(&ctl, "hs_geglu_inplace"), after_prompt.1);
    assert_eq!(launched(&ctl, "hs_mv_swiglu_q4_0"), n_layers);
    assert_eq!(
        launched(&ctl, "hs_rms_norm_add_rows") - after_prompt.2,
        2 * n_layers
    );
    // The prompt ran the same: its head norms in the rotation's launch, GeGLU apart.
    assert_eq!(after_prompt.0, 2 * n_layers + 1);
    assert_eq!(after_prompt.1, n_layers);
    assert_eq!(launched(&ctl, "hs_rope_kv_store_f32"), 2 * n_layers);

    let errors = errors.lock().unwrap().clone();
    let kinds: Vec<&String> = errors.keys().collect();
    let rope_kind = kinds
        .iter()
        .find(|k| k.starts_with("qk_norm + rope"))
        .unwrap_or_else(|| panic!("no normalized rotation among the compared ops: {kinds:?}"));
    for (kind, calls) in [
        ("matmul_geglu Q4_0 (mv fused)", n_layers),
        ("rms_norm + add (fused)", 4 * n_layers),
        (rope_kind.as_str(), 2 * 2 * n_layers),
    ] {
        let e = errors
            .get(kind)
            .unwrap_or_else(|| panic!("no {kind:?} among the compared ops: {kinds:?}"));
        assert_eq!(e.calls, calls, "{kind}");
        // The fake computes nothing: the GPU's stale output must be called wrong.
        assert!(e.rel_l2 > 0.1, "{kind}: {}", e.rel_l2);
    }
    let release = m
        .backend_mut()
        .shutdown(Duration::from_secs(5), &mut |_| {});
    assert_eq!(release, DeviceRelease::Clean);
}

/// A decode step of several sequences (`hipscope serve`'s batch): the GPU rotates, stores and
/// attends every sequence's row in one launch of each kernel a layer (each row's sequence and
/// position from a table on the device), not a launch per sequence, and the lockstep compares
/// the rows' rotations and attention under their own kinds. Qwen 3: the per-head norms go into
/// the same launch (no norm launch for the heads in that step).
#[test]
fn a_decode_step_of_several_sequences_attends_in_one_launch_a_layer() {
    let (mut m, ctl, errors) = lockstep_model_seqs("tiny-qwen3", 3);
    let n_layers = m.config.n_layers;
    let mut logits = Vec::new();
    let prompts: Vec<Vec<u32>> = (0..3u32)
        .map(|s| (0..5 + 3 * s).map(|i| (i * 7 + s + 1) % 512).collect())
        .collect();
    let chunks: Vec<SeqChunk> = prompts
        .iter()
        .enumerate()
        .map(|(s, p)| SeqChunk {
            seq: s,
            pos0: 0,
            tokens: p,
            logits: true,
        })
        .collect();
    m.forward_seqs(&chunks, &mut logits).expect("prompts");
    let norms = |c: &FakeControl| launched(c, "hs_rms_norm_rows") + launched(c, "hs_rms_norm_q8");
    let before = (
        launched(&ctl, "hs_rope_kv_store_f32"),
        launched(&ctl, "hs_attention_f32"),
        norms(&ctl),
    );
    // The prompts, three sequences of several tokens each, ran a launch per sequence.
    assert_eq!(before.0, 3 * n_layers);
    let next = [[7u32], [8], [9]];
    let decode: Vec<SeqChunk> = (0..3)
        .map(|s| SeqChunk {
            seq: s,
            pos0: prompts[s].len(),
            tokens: &next[s],
            logits: true,
        })
        .collect();
    m.forward_seqs(&decode, &mut logits).expect("decode");
    assert_eq!(logits.len(), 3 * m.config.vocab_size);
    assert_eq!(launched(&ctl, "hs_rope_kv_store_f32") - before.0, n_layers);
    assert_eq!(launched(&ctl, "hs_attention_f32") - before.1, n_layers);
    // Two norms a layer before its blocks and the output norm: none for the heads.
    assert_eq!(norms(&ctl) - before.2, 2 * n_layers + 1);

    let errors = errors.lock().unwrap().clone();
    let kinds: Vec<&String> = errors.keys().collect();
    for (kind, calls) in [
        ("rope + kv_store (sequences)", 2 * n_layers),
        ("attention (sequences)", n_layers),
    ] {
        let e = errors
            .get(kind)
            .unwrap_or_else(|| panic!("no {kind:?} among the compared ops: {kinds:?}"));
        assert_eq!(e.calls, calls, "{kind}");
        // The fake computes nothing: the GPU's stale output must be called wrong.
        assert!(e.rel_l2 > 0.1, "{kind}: {}", e.rel_l2);
    }
    let release = m
        .backend_mut()
        .shutdown(Duration::from_secs(5), &mut |_| {});
    assert_eq!(release, DeviceRelease::Clean);
}
