//! The GPU backend's host side on the scripted fake device (no GPU): the arena is made once from
//! the model's plan (and a model that does not fit is refused with the numbers), every weight is
//! uploaded and verified, a forward pass enqueues labelled launches of the right kernels and
//! allocates nothing, and shutdown runs the quit protocol's steps. The fake runs the inference
//! kernels as no-ops, so nothing here checks numbers: `hipscope selftest --compute` does that on a
//! real GPU (docs/runs/gpu-inference-h100.txt).

use std::sync::Arc;
use std::time::Duration;

use hipscope::gpu::backend::{BackendError, Instrument, Memory};
use hipscope::gpu::compute::{ComputeOptions, GpuCompute, KvType, PrefillGemm, PrefillPath};
use hipscope::gpu::fake::{FakeControl, FakeDevice, FakeScript};
use hipscope::gpu::kernels::KernelCache;
use hipscope::gpu::snapshot::{DeviceRelease, QuitStepStatus};
use hipscope::model::forward::{Logits, Model, ModelError, ModelOptions};
use hipscope::model::loader;
use hipscope::model::protocol::ModelSource;

fn fake(total_memory: u64) -> (FakeDevice, FakeControl) {
    let f = FakeDevice::new(FakeScript {
        total_memory,
        auto_complete: true,
        blas: false,
        graphs: false,
    });
    let c = f.control();
    (f, c)
}

fn tiny(quant: &str) -> Arc<hipscope::model::gguf::GgufFile> {
    loader::open(
        &ModelSource::Synthetic {
            shape: "tiny-qwen2".into(),
            quant: quant.into(),
            seed: 3,
        },
        &mut |_, _| {},
    )
    .expect("synthetic model")
}

fn opts() -> ModelOptions {
    ModelOptions {
        n_ctx: 64,
        n_batch: 32,
        all_logits: false,
        n_seq: 1,
    }
}

/// The compute backend on a fake device of `total_memory` bytes, and the device's control.
fn open_fake(total_memory: u64, options: ComputeOptions) -> (GpuCompute, FakeControl) {
    let (dev, ctl) = fake(total_memory);
    let gpu = GpuCompute::open(
        Box::new(dev),
        "fake: test device",
        options,
        &KernelCache::disabled(),
    )
    .expect("open");
    (gpu, ctl)
}

/// A synthetic model of `shape` in `quant` loaded on a fake device of 1 GiB (f16 KV cache).
fn fake_model(shape: &str, quant: &str) -> (Model, FakeControl) {
    let (gpu, ctl) = open_fake(
        1 << 30,
        ComputeOptions {
            kv: KvType::F16,
            ..ComputeOptions::default()
        },
    );
    let file = loader::open(
        &ModelSource::Synthetic {
            shape: shape.into(),
            quant: quant.into(),
            seed: 3,
        },
        &mut |_, _| {},
    )
    .expect("synthetic model");
    let m = Model::load(file, Box::new(gpu), opts(), &mut |_, _| {}).expect("load");
    (m, ctl)
}

/// The kernels one decode step (token 5 at `pos`) launches, in order (upload checks left out).
fn decode_launches(m: &mut Model, ctl: &FakeControl, pos: usize) -> Vec<String> {
    let before = ctl.log().len();
    let mut logits = Vec::new();
    m.forward(&[5], pos, Logits::Last, &mut logits)
        .expect("decode");
    ctl.log()[before..]
        .iter()
        .filter(|l| l.starts_with("launch ") && !l.contains("hs_checksum"))
        .cloned()
        .collect()
}

fn mallocs(c: &FakeControl) -> usize {
    c.log().iter().filter(|l| l.starts_with("malloc")).count()
}

fn launched(c: &FakeControl, kernel: &str) -> usize {
    let want = format!("launch {kernel}");
    c.log().iter().filter(|l| **l == want).count()
}

/// Where no BLAS serves (the fake has none), auto takes hipscope's own f16 kernel; `blas` is
/// refused with the reason; `f32` keeps the prompt on f32 tiles and hs_sgemm.
#[test]
fn the_prefill_gemm_setting_picks_the_path() {
    let open = |prefill| {
        let (gpu, ctl) = open_fake(
            1 << 30,
            ComputeOptions {
                prefill,
                ..ComputeOptions::default()
            },
        );
        (gpu, ctl)
    };
    let (gpu, _) = open(PrefillGemm::Auto);
    assert!(matches!(
        gpu.prefill_path().expect("auto"),
        PrefillPath::Own { forced: false, .. }
    ));
    let (gpu, _) = open(PrefillGemm::Blas);
    let e = gpu
        .prefill_path()
        .expect_err("no BLAS on the fake")
        .to_string();
    assert!(e.contains("HIPSCOPE_PREFILL_GEMM=blas"), "{e}");
    let (gpu, ctl) = open(PrefillGemm::F32);
    assert!(matches!(
        gpu.prefill_path().expect("f32"),
        PrefillPath::F32 { .. }
    ));
    let mut m = Model::load(tiny("Q4_0"), Box::new(gpu), opts(), &mut |_, _| {}).expect("load");
    let prompt: Vec<u32> = (0..20).map(|i| (i * 7 + 1) % 512).collect();
    let mut logits = Vec::new();
    m.forward(&prompt, 0, Logits::Last, &mut logits)
        .expect("prompt");
    assert!(launched(&ctl, "hs_sgemm") > 0);
    assert_eq!(launched(&ctl, "hs_gemm_f16"), 0);
    assert_eq!(launched(&ctl, "hs_quantize_act_f16"), 0);
}

#[test]
fn a_forward_pass_enqueues_labelled_kernels_and_allocates_nothing() {
    let (gpu, ctl) = open_fake(
        1 << 30,
        ComputeOptions {
            kv: KvType::F16,
            ..ComputeOptions::default()
        },
    );
    let shared = gpu.gpu().expect("live").stream_shared();
    let monitor = gpu.monitor().expect("a GPU backend has a monitor");
    let mut m = Model::load(tiny("Q4_0"), Box::new(gpu), opts(), &mut |_, _| {}).expect("load");
    let after_load = mallocs(&ctl);
    assert!(
        after_load <= 4,
        "one allocation per arena region, not per tensor: {after_load}"
    );
    assert!(
        ctl.log().iter().any(|l| l.contains("hs_checksum")),
        "uploads are verified on the device"
    );

    let mut logits = Vec::new();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 7 + 1) % 512).collect();
    m.forward(&prompt, 0, Logits::Last, &mut logits)
        .expect("prompt");
    assert_eq!(logits.len(), 512);
    m.forward(&[5], 20, Logits::Last, &mut logits)
        .expect("decode");
    m.forward(&[6, 7, 8], 21, Logits::Last, &mut logits)
        .expect("short batch");
    assert_eq!(
        mallocs(&ctl),
        after_load,
        "no device allocation while generating"
    );

    // The prompt (20 ≥ 16 tokens) took the GEMM path: its activations to f16, f16 tiles
    // dequantized, hipscope's own f16 matrix kernel (no BLAS on the fake); the short batch took
    // the matrix-vector kernel, decode the fused one-token ones.
    assert!(launched(&ctl, "hs_dequant_tile_q4_0") > 0);
    assert!(launched(&ctl, "hs_quantize_act_f16") > 0);
    assert!(launched(&ctl, "hs_gemm_f16") > 0);
    assert_eq!(launched(&ctl, "hs_sgemm"), 0);
    assert!(launched(&ctl, "hs_mv_q4_0") > 0);
    // Attention: the prompt's tiled (20 ≥ 8 rows), the decode step's and the short batch's per
    // query row; one launch per layer per step.
    let tiled = ctl
        .log()
        .iter()
        .filter(|l| l.starts_with("launch hs_attention_tiled_f16_"))
        .count();
    assert_eq!(tiled, 2, "the prompt's attention, tiled, once per layer");
    assert_eq!(
        launched(&ctl, "hs_attention_f16"),
        2 * 2,
        "one per layer per step"
    );
    // RoPE of q and k and the KV-cache write: one launch per layer per step.
    assert_eq!(launched(&ctl, "hs_rope_kv_store_f16"), 3 * 2);
    assert_eq!(launched(&ctl, "hs_kv_store_f16"), 0);
    assert_eq!(launched(&ctl, "hs_rope"), 0);
    // Decode (one token): Q, K and V with qwen2's biases in one launch, gate and up with SwiGLU
    // in one, the output projection and down with the residual add in their epilogue; the
    // output head (the last token's logits only, every step) through the same one-token kernel.
    assert_eq!(launched(&ctl, "hs_mv_qkv_q4_0"), 2);
    assert_eq!(launched(&ctl, "hs_mv_swiglu_q4_0"), 2);
    assert_eq!(launched(&ctl, "hs_mv1_q4_0"), 2 * 2 + 3);
    // The batches add the biases separately: 2 steps × 2 layers × q, k, v.
    assert_eq!(launched(&ctl, "hs_add_bias_rows"), 2 * 2 * 3);
    // Quantized activations: the prompt (GEMM path) quantizes each product's input straight to
    // f16 (q, k, v, o, gate, up, down: 7 a layer), and the output head's input for its
    // matrix-vector kernel (1). From that first matrix-vector quantization on, the RMS norms (5 a
    // step) and the attention kernels (a Q8 block divides tiny-qwen2's heads of 64) quantize their
    // own output, leaving the SwiGLU outputs (2 a step) for decode and the short batch.
    assert_eq!(launched(&ctl, "hs_quantize_act_f16"), 2 * 7);
    assert_eq!(launched(&ctl, "hs_quantize_act"), 1 + 2 + 2);
    assert_eq!(launched(&ctl, "hs_rms_norm_q8"), 5 + 5);

    let labels: Vec<String> = shared
        .recent_completed(4000)
        .into_iter()
        .map(|o| o.label)
        .collect();
    for want in [
        "layer 1 · attn_q · mv_q4_0",
        "layer 0 · attention · attention_tiled",
        "layer 1 · attention · attention_f16 + quantize_q8",
        "layer 1 · ffn_down · mm_f16",
        "layer 0 · ffn_down · dequant_f16",
        "read · logits",
    ] {
        assert!(
            labels.iter().any(|l| l == want),
            "no op labelled {want:?} among {} ops",
            labels.len()
        );
    }
    let streams = monitor.streams();
    assert_eq!(streams.len(), 1);
    assert!(streams[0].enqueued > 100);
    assert!(monitor.watchdog().is_some());

    let mut steps = Vec::new();
    let code = m
        .backend_mut()
        .shutdown(Duration::from_secs(2), &mut |s| steps.push(s));
    assert_eq!(code, DeviceRelease::Clean);
    let done: Vec<&str> = steps
        .iter()
        .filter(|s| s.status == QuitStepStatus::Done)
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(
        done,
        [
            "drain stream",
            "destroy BLAS handles",
            "destroy events",
            "unload modules",
            "free arena and pinned memory",
            "destroy stream"
        ]
    );
    assert!(!ctl.stream_alive());
    assert_eq!(ctl.live_modules(), 0);
    assert_eq!(ctl.device_bytes_allocated(), 0);
    // A second shutdown has nothing left to do; the backend refuses further work.
    assert_eq!(
        m.backend_mut()
            .shutdown(Duration::from_secs(1), &mut |_| {}),
        DeviceRelease::Clean
    );
    assert!(m.forward(&[1], 24, Logits::Last, &mut logits).is_err());
}

#[test]
fn a_model_that_does_not_fit_is_refused_before_any_upload() {
    let (dev, ctl) = fake(2 << 20);
    let gpu = GpuCompute::open(
        Box::new(dev),
        "fake",
        ComputeOptions::default(),
        &KernelCache::disabled(),
    )
    .expect("open");
    let err = match Model::load(tiny("F32"), Box::new(gpu), opts(), &mut |_, _| {}) {
        Ok(_) => panic!("a 2 MiB device cannot hold the model"),
        Err(e) => e,
    };
    match &err {
        ModelError::Backend(BackendError::OutOfMemory(msg)) => {
            assert!(msg.contains("weights"), "{msg}");
            assert!(msg.contains("kv_cache"), "{msg}");
            assert!(msg.contains("free of"), "{msg}");
        }
        other => panic!("expected out of memory, got {other}"),
    }
    assert_eq!(mallocs(&ctl), 0, "nothing allocated");
    assert_eq!(launched(&ctl, "hs_checksum"), 0, "no tensor was uploaded");
}

#[test]
fn unsupported_calls_are_errors_not_panics() {
    let (dev, _ctl) = fake(1 << 30);
    let mut gpu = GpuCompute::open(
        Box::new(dev),
        "fake",
        ComputeOptions::default(),
        &KernelCache::disabled(),
    )
    .expect("open");
    // Before the plan there is no arena: buffers are refused.
    assert!(gpu.alloc("x", 16).is_err());
    let mut m = Model::load(tiny("Q8_0"), Box::new(gpu), opts(), &mut |_, _| {}).expect("load");
    let mut logits = Vec::new();
    // A token outside the vocabulary: the backend checks before uploading the ids.
    let e = m
        .forward(&[100_000], 0, Logits::Last, &mut logits)
        .expect_err("token out of range");
    assert!(e.to_string().contains("outside the vocabulary"), "{e}");
    // The model still runs afterwards.
    m.forward(&[1, 2], 0, Logits::Last, &mut logits)
        .expect("valid tokens");
    assert_eq!(
        m.backend_mut()
            .shutdown(Duration::from_secs(2), &mut |_| {}),
        DeviceRelease::Clean
    );
}

#[test]
fn the_runtime_under_a_model_is_reachable_to_switch_tracking() {
    let (gpu, _ctl) = open_fake(1 << 30, ComputeOptions::default());
    let shared = gpu.gpu().expect("live").stream_shared();
    let mut m = Model::load(tiny("Q4_0"), Box::new(gpu), opts(), &mut |_, _| {}).expect("load");
    assert!(shared.tracking(), "tracking is on by default");
    let g = m
        .backend_mut()
        .as_any_mut()
        .and_then(|a| a.downcast_mut::<GpuCompute>())
        .expect("the model's backend is the GpuCompute it was given");
    g.runtime_mut().expect("live").set_tracking(false);
    assert!(!shared.tracking());
    let mut logits = Vec::new();
    m.forward(&[1], 0, Logits::Last, &mut logits)
        .expect("a step with tracking off");
    assert_eq!(logits.len(), m.config.vocab_size);
    let release = m
        .backend_mut()
        .shutdown(Duration::from_secs(5), &mut |_| {});
    assert_eq!(release, DeviceRelease::Clean);
    let g = m
        .backend_mut()
        .as_any_mut()
        .and_then(|a| a.downcast_mut::<GpuCompute>())
        .expect("still a GpuCompute");
    assert!(g.runtime_mut().is_none(), "no runtime after shutdown");
    // The CPU backend keeps the default: nothing to reach.
    let mut c = hipscope::gpu::cpu::CpuBackend::new(1);
    assert!(c.as_any_mut().is_none());
}

/// gpt-oss on the GPU backend (issue 16): its sinks, YaRN RoPE, biased experts and output bias
/// ride on the launches every model makes, so a decode step costs a fixed, counted number of
/// launches per layer: the attention norm (Q8-quantizing), Q, K, V with their biases in one
/// launch, RoPE (YaRN inside) + KV write, attention (sinks inside, Q8-quantizing), the output
/// projection, its bias, the residual add, the FFN norm, the router product, and the MoE's route (the router
/// bias inside), gate/up (biases and clamped SwiGLU inside; reading the FFN norm's Q8 output as
/// it is: no gather of k copies to quantize again), hidden quantization, down and combine (the
/// down bias inside): 14. Prompt batches take the tiled
/// attention and the chunked experts; nothing is allocated while generating.
#[test]
fn gpt_oss_runs_on_the_gpu_backend_with_a_counted_decode_step() {
    let (mut m, ctl) = fake_model("tiny-gpt-oss", "Q8_0");
    assert_eq!(m.config.n_layers, 2);
    let after_load = mallocs(&ctl);
    let mut logits = Vec::new();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 7 + 1) % 512).collect();
    m.forward(&prompt, 0, Logits::Last, &mut logits)
        .expect("prompt");
    assert_eq!(logits.len(), 512);
    let tiled = ctl
        .log()
        .iter()
        .filter(|l| l.starts_with("launch hs_attention_tiled_f16_64"))
        .count();
    assert_eq!(tiled, 2, "the prompt's attention, tiled, once per layer");
    // A prompt batch's experts: grouped products on the matrix units, the 20 tokens routed by
    // several blocks and sorted after; no chunked matrix-vector kernels.
    assert_eq!(launched(&ctl, "hs_moe_mm_gate_up_mxfp4"), 2);
    assert_eq!(launched(&ctl, "hs_moe_mm_down_mxfp4"), 2);
    assert_eq!(launched(&ctl, "hs_moe_route"), 2);
    assert_eq!(launched(&ctl, "hs_moe_sort"), 2);
    assert_eq!(launched(&ctl, "hs_mv_gate_up_mxfp4"), 0);

    let step = decode_launches(&mut m, &ctl, 20);
    // Outside the layers: the embedding (a dequantized row), then the output norm (on a copy of
    // the last row) and the output head.
    assert_eq!(step[0], "launch hs_dequant_rows_q8_0", "{step:#?}");
    assert_eq!(
        step[step.len() - 2..],
        ["launch hs_rms_norm_q8", "launch hs_mv1_q8_0"],
        "{step:#?}"
    );
    let per_layer = [
        "launch hs_mv_qkv_q8_0",
        "launch hs_rope_kv_store_f16",
        "launch hs_attention_f16",
        "launch hs_add_bias_rows",
        "launch hs_add_inplace",
        "launch hs_moe_route",
        // The experts' products: the dense one-token kernels with the route as their ids.
        "launch hs_mv_swiglu_mxfp4",
        "launch hs_mv1_mxfp4",
        "launch hs_moe_combine",
    ];
    for k in per_layer {
        assert_eq!(
            step.iter().filter(|l| *l == k).count(),
            2,
            "{k}: once per layer in a decode step: {step:#?}"
        );
    }
    assert_eq!(
        step.iter().filter(|l| *l == "launch hs_moe_gather").count(),
        0,
        "a decode step reads the token's row as it is: {step:#?}"
    );
    assert_eq!(
        step.len() - 3,
        2 * 14,
        "14 launches a layer (and 3 outside them): {step:#?}"
    );
    m.forward(&[6, 7, 8], 21, Logits::Last, &mut logits)
        .expect("short batch");
    // A short batch (under the GEMM threshold): chunks of 8 through the matrix-vector kernels
    // (the dense ones, the route as their ids), routed and sorted in one launch.
    assert_eq!(launched(&ctl, "hs_mv_gate_up_mxfp4"), 2);
    assert_eq!(launched(&ctl, "hs_mv_mxfp4"), 2);
    assert_eq!(launched(&ctl, "hs_moe_sort"), 2);
    assert_eq!(
        mallocs(&ctl),
        after_load,
        "no device allocation while generating"
    );
    assert_eq!(
        m.backend_mut()
            .shutdown(Duration::from_secs(2), &mut |_| {}),
        DeviceRelease::Clean
    );
}

/// A decode step's kernel launches per layer, as docs/GPU.md counts them, for each architecture's
/// shape: QK norms fused into RoPE and the KV write (Qwen 3, Gemma 3), Gemma's norms after a block
/// into its residual add, the MoE's routing and sort in one launch. Short context (under 64 cached
/// positions: attention in one launch; from there a second, the split's combine), files of
/// 32-element types (a K-quant file's 256-element activation blocks can add a quantization). The
/// real shapes count the same on the fake device: qwen3-0.6b 255 launches (28 × 9 + 3),
/// gemma3-1b 290 (26 × 11 + 4), llama-3.2-1b 147 (16 × 9 + 3), gpt-oss-20b-2l 31.
#[test]
fn decode_launches_per_layer_are_the_documented_counts() {
    // (shape, weight type, launches a layer, launches outside the layers)
    let cases = [
        ("tiny", "Q4_0", 9, 3),
        ("tiny-qwen2", "Q4_0", 9, 3),
        ("tiny-qwen3", "Q4_0", 9, 3),
        ("tiny-gemma3", "Q4_0", 11, 4),
        ("tiny-qwen3moe", "Q4_0", 12, 3),
        ("tiny-gpt-oss", "Q8_0", 14, 3),
    ];
    for (shape, quant, per_layer, outside) in cases {
        let (mut m, ctl) = fake_model(shape, quant);
        let mut logits = Vec::new();
        m.forward(&[1, 2, 3, 4], 0, Logits::Last, &mut logits)
            .expect("prompt");
        let step = decode_launches(&mut m, &ctl, 4);
        let n = m.config.n_layers;
        assert_eq!(
            step.len(),
            per_layer * n + outside,
            "{shape}: {n} layers of {per_layer} and {outside} outside them: {step:#?}"
        );
    }
}

/// A Q4_K_M file whose narrow matrices fall back to 32-element types between Q4_K ones
/// (SmolLM2's 576-wide rows: Q/K/V, gate/up and the output projection Q5_0 or Q8_0, the FFN's
/// down projection Q4_K or Q6_K, as llama-quantize writes it; Gemma 3 1B's 1152 likewise): from
/// the second decode step on, each RMS norm and the attention quantize their output for the
/// block size of the product after them in their own launch, so that the only quantizations of
/// their own left are the FFN's down inputs (one a layer) — the first step, before they have
/// seen what their products ask, had one more for every norm and attention whose size differed
/// from the last quantization's (here every layer's first norm, after the Q4_K down product).
#[test]
fn norms_and_attention_quantize_for_the_product_after_them_from_the_second_step() {
    let (mut m, ctl) = fake_model("smollm2-135m", "Q4_K_M");
    let quantizes = |step: &[String]| {
        step.iter()
            .filter(|l| *l == "launch hs_quantize_act")
            .count()
    };
    let n = m.config.n_layers;
    let first = decode_launches(&mut m, &ctl, 0);
    let second = decode_launches(&mut m, &ctl, 1);
    let third = decode_launches(&mut m, &ctl, 2);
    assert_eq!(quantizes(&second), n, "{second:#?}");
    assert_eq!(
        second, third,
        "the steps after the first launch the same kernels"
    );
    assert!(
        quantizes(&first) > n,
        "the first step quantizes apart for the norms too: {first:#?}"
    );
    assert_eq!(first.len() - second.len(), quantizes(&first) - n);
}
