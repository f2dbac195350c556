//! Models split between a GPU and the CPU (`-ngl`, `model/split/`).
//!
//! The numbers: a split whose "GPU" side is a second CPU backend runs the same code as an
//! all-CPU run on each side, so its logits must equal the all-CPU run's bit for bit, for every
//! `-ngl` from 0 to all layers, through prompt batches, decode, every-token logits (perplexity)
//! and a context shift — which checks the placement, the hand-overs and the KV cache parts, not
//! the kernels (the GPU's kernels are checked against the CPU by `selftest --compute`).
//!
//! The mechanism on a GPU backend: the real `GpuCompute` on the scripted fake device (its kernels
//! are no-ops, so only what is placed, planned, launched and shown is checked here), loaded
//! through the loader as the commands load it: `-ngl N`, and `-ngl auto` on a device too small
//! for the whole model.

use std::sync::Arc;

use hipscope::gpu::backend::{Backend, MemoryPlan};
use hipscope::gpu::compute::{ComputeOptions, GpuCompute};
use hipscope::gpu::cpu::CpuBackend;
use hipscope::gpu::fake::{FakeControl, FakeDevice, FakeScript};
use hipscope::gpu::kernels::KernelCache;
use hipscope::gpu::snapshot::DeviceRelease;
use hipscope::model::config::ModelConfig;
use hipscope::model::forward::{Logits, Model, ModelOptions};
use hipscope::model::gguf::GgufFile;
use hipscope::model::loader::{self, LoadOptions};
use hipscope::model::protocol::ModelSource;
use hipscope::model::split::backend::SplitBackend;
use hipscope::model::split::{self, GpuLayers, Placement};

pub(crate) fn synth(shape: &str, quant: &str) -> Arc<GgufFile> {
    loader::open(
        &ModelSource::Synthetic {
            shape: shape.into(),
            quant: quant.into(),
            seed: 5,
        },
        &mut |_, _| {},
    )
    .expect("synthetic model")
}

fn opts(all_logits: bool) -> ModelOptions {
    ModelOptions {
        n_ctx: 96,
        n_batch: 16,
        all_logits,
        n_seq: 1,
    }
}

/// Every logit the script produces: a 40-token prompt in three batches (last logits), three
/// decode steps, a context shift and a step after it, then the same prompt again with every
/// token's logits when `all`.
fn run_script(m: &mut Model, all: bool) -> Vec<Vec<f32>> {
    let vocab = m.config.vocab_size as u32;
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % vocab).collect();
    let mut out = Vec::new();
    let mut logits = Vec::new();
    m.forward(&prompt, 0, Logits::Last, &mut logits)
        .expect("prompt");
    out.push(logits.clone());
    for (i, t) in [3u32, 9, 27].iter().enumerate() {
        m.forward(&[t % vocab], 40 + i, Logits::Last, &mut logits)
            .expect("decode");
        out.push(logits.clone());
    }
    if m.shift_kv(4, 12, 31).is_ok() {
        m.forward(&[5], 35, Logits::Last, &mut logits)
            .expect("after the shift");
        out.push(logits.clone());
    }
    if all {
        m.forward(&prompt[..20], 0, Logits::All, &mut logits)
            .expect("all logits");
        out.push(logits.clone());
    }
    out
}

fn cpu_model(file: &Arc<GgufFile>, all: bool) -> Model {
    Model::load(
        file.clone(),
        Box::new(CpuBackend::new(2)),
        opts(all),
        &mut |_, _| {},
    )
    .expect("load on the CPU")
}

fn split_model(file: &Arc<GgufFile>, ngl: usize, all: bool) -> Model {
    split_with(file, ngl, false, opts(all))
}

/// A split whose "GPU" is a second CPU backend, with op offload as asked.
pub(crate) fn split_with(
    file: &Arc<GgufFile>,
    ngl: usize,
    op_offload: bool,
    o: ModelOptions,
) -> Model {
    let config = ModelConfig::from_gguf(file).expect("config");
    let place = Placement::from_ngl(config.n_layers, ngl, config.tied_embeddings)
        .with_op_offload(op_offload.then_some(32));
    let split = SplitBackend::new(
        vec![Box::new(CpuBackend::new(2))],
        Box::new(CpuBackend::new(2)),
        place,
        vec![MemoryPlan::default()],
        format!("-ngl {ngl}"),
    );
    Model::load(file.clone(), Box::new(split), o, &mut |_, _| {}).expect("load split")
}

/// The shapes the split's numbers are checked on: plain llama; biases (qwen2); sliding-window
/// rings, tied embeddings, embedding scale and norms after the products (gemma3); a fused QKV and
/// RoPE factors (phi3); attention sinks and the experts' biases, handed to the side that runs
/// their layer (gpt-oss); an expert mixture with per-head norms (qwen3moe).
pub(crate) const SPLIT_SHAPES: &[(&str, &str)] = &[
    ("tiny", "Q4_0"),
    ("tiny-qwen2", "Q8_0"),
    ("tiny-gemma3", "Q4_K"),
    ("tiny-phi3", "Q8_0"),
    ("tiny-gpt-oss", "Q8_0"),
    ("tiny-qwen3moe", "Q4_K"),
];

#[test]
fn every_split_gives_the_all_cpu_logits_bit_for_bit() {
    for &(shape, quant) in SPLIT_SHAPES {
        let file = synth(shape, quant);
        let n = ModelConfig::from_gguf(&file).expect("config").n_layers;
        let want = run_script(&mut cpu_model(&file, true), true);
        for ngl in 0..=n + 1 {
            let mut m = split_model(&file, ngl, true);
            let got = run_script(&mut m, true);
            assert_eq!(got.len(), want.len(), "{shape} -ngl {ngl}");
            for (step, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g == w,
                    "{shape} -ngl {ngl}: step {step} differs from the all-CPU run (first at {:?})",
                    g.iter().zip(w).position(|(a, b)| a != b)
                );
            }
        }
    }
}

#[test]
fn a_split_hands_the_activations_over_once_per_step() {
    let file = synth("tiny-gemma3", "Q8_0");
    let n = ModelConfig::from_gguf(&file).expect("config").n_layers;
    let handovers = |m: &Model| {
        m.backend()
            .arena()
            .split
            .expect("a split model shows its split")
    };
    // Half the layers: the residual stream goes up once per forward step, 3 prompt batches and
    // 2 decode steps.
    let mut m = split_model(&file, n / 2 + 1, false);
    let mut logits = Vec::new();
    let prompt: Vec<u32> = (0..40).collect();
    m.forward(&prompt, 0, Logits::Last, &mut logits)
        .expect("prompt");
    m.forward(&[1], 40, Logits::Last, &mut logits)
        .expect("decode");
    m.forward(&[2], 41, Logits::Last, &mut logits)
        .expect("decode");
    let s = handovers(&m);
    assert_eq!(s.handovers, 5, "{s:?}");
    let dim = m.config.dim as u64;
    assert_eq!(s.handover_bytes, (16 + 16 + 8 + 1 + 1) * dim * 4, "{s:?}");
    assert_eq!(
        (s.gpu_layers, s.cpu_layers),
        (n / 2 + 1, n + 1 - (n / 2 + 1))
    );
    // -ngl 0: nothing crosses.
    let mut m = split_model(&file, 0, false);
    m.forward(&prompt, 0, Logits::Last, &mut logits)
        .expect("prompt");
    assert_eq!(handovers(&m).handovers, 0);
}

#[test]
fn placement_follows_llama_cpp() {
    // 32 layers, -ngl 16: layers 17..31 and the output on the GPU (i_gpu_start = 33 − 16).
    let p = Placement::from_ngl(32, 16, false);
    assert_eq!((p.gpu_from, p.output_on_gpu, p.ngl()), (17, true, 16));
    assert_eq!(
        p.describe(),
        "16/33 layers on the GPU (layers 17–31 and the output), 17 on the CPU (layers 0–16, the embedding)"
    );
    assert_eq!(p.tensor_sides("blk.17.ffn_up.weight"), (true, false));
    assert_eq!(p.tensor_sides("blk.16.ffn_up.weight"), (false, true));
    assert_eq!(p.tensor_sides("token_embd.weight"), (false, true));
    assert_eq!(p.tensor_sides("output.weight"), (true, false));
    // Tied: the embedding is also the output matrix, so the GPU needs it too.
    assert_eq!(
        Placement::from_ngl(32, 16, true).tensor_sides("token_embd.weight"),
        (true, true)
    );
    assert!(Placement::from_ngl(32, 33, false).all_on_gpu());
    assert!(Placement::from_ngl(32, 99, false).all_on_gpu());
    let none = Placement::from_ngl(32, 0, false);
    assert_eq!((none.gpu_layers(), none.output_on_gpu), (0, false));
    assert_eq!(none.tensor_sides("output.weight"), (false, true));
    assert_eq!(
        "auto".parse::<GpuLayers>(),
        Ok(GpuLayers::Auto),
        "auto parses"
    );
    assert_eq!("16".parse::<GpuLayers>(), Ok(GpuLayers::Count(16)));
    let e = "half".parse::<GpuLayers>().expect_err("not a count");
    assert!(e.contains("\"half\""), "{e}");
}

pub(crate) fn fake_gpu(total_memory: u64) -> Box<dyn Backend> {
    fake_gpu_ctl(total_memory).0
}

pub(crate) fn fake_gpu_ctl(total_memory: u64) -> (Box<dyn Backend>, FakeControl) {
    let dev = FakeDevice::new(FakeScript {
        total_memory,
        auto_complete: true,
        blas: false,
        graphs: false,
    });
    let ctl = dev.control();
    let gpu = Box::new(
        GpuCompute::open(
            Box::new(dev),
            "fake: test device",
            ComputeOptions::default(),
            &KernelCache::disabled(),
        )
        .expect("open"),
    );
    (gpu, ctl)
}

pub(crate) fn load_opts(ngl: GpuLayers) -> LoadOptions {
    LoadOptions {
        n_ctx: Some(64),
        n_batch: 16,
        gpu_layers: ngl,
        cpu: hipscope::gpu::cpu::CpuOptions {
            threads: 2,
            ..Default::default()
        },
        ..LoadOptions::default()
    }
}

#[test]
fn a_split_on_a_gpu_backend_uploads_only_its_layers_and_shows_both_lanes() {
    let file = synth("tiny-qwen2", "Q8_0");
    let loaded = loader::load(
        file.clone(),
        fake_gpu(1 << 30),
        &load_opts(GpuLayers::Count(2)),
        &mut |_, _| {},
    )
    .expect("load split");
    let said = loaded.offload.clone().expect("the split is said");
    assert_eq!(
        said,
        "-ngl 2: 2/3 layers on the GPU (layers 1–1 and the output), 1 on the CPU (layers 0–0, the \
         embedding); prompt batches of 32+ tokens run the CPU's layers on GPU 0 (op offload)"
    );
    let mut session = loaded.session;
    let m = session.model_mut();
    assert!(
        m.backend().device().reason.ends_with(&said),
        "{}",
        m.backend().device().reason
    );
    // tiny-qwen2 ties its output to the embedding: the GPU, which runs the output, gets the
    // embedding too; the CPU keeps it for the input, with its own copy of the output norm.
    assert!(file.tensor("output.weight").is_none(), "a tied model");
    let size = |pred: &dyn Fn(&str) -> bool| -> u64 {
        file.tensors()
            .iter()
            .filter(|t| pred(&t.name))
            .map(|t| t.size)
            .sum()
    };
    let gpu_bytes =
        size(&|n| n.starts_with("blk.1.") || n == "output_norm.weight" || n == "token_embd.weight");
    let cpu_bytes =
        size(&|n| n.starts_with("blk.0.") || n == "output_norm.weight" || n == "token_embd.weight");
    let arena = m.backend().arena();
    let s = arena.split.clone().expect("split in the arena snapshot");
    assert_eq!(
        (s.gpu_weight_bytes, s.cpu_weight_bytes),
        (gpu_bytes, cpu_bytes)
    );
    // The GPU's arena holds its part of the weights, not the whole model.
    let region = arena
        .regions
        .iter()
        .find(|r| r.name.contains("weights"))
        .expect("a weights region");
    assert!(
        region.used >= gpu_bytes && region.used < size(&|_| true),
        "{region:?}"
    );
    let mut logits = Vec::new();
    m.forward(&[1, 2, 3], 0, Logits::Last, &mut logits)
        .expect("a step");
    assert_eq!(logits.len(), m.config.vocab_size);
    let monitor = m.backend().monitor().expect("monitor");
    let lanes: Vec<String> = monitor.streams().into_iter().map(|s| s.name).collect();
    assert_eq!(lanes.len(), 2, "{lanes:?}");
    assert_eq!(lanes[1], "cpu", "{lanes:?}");
    let cpu_lane = &monitor.streams()[1];
    assert!(
        cpu_lane.completed > 0,
        "the CPU's ops are counted: {cpu_lane:?}"
    );
    assert_eq!(
        m.backend_mut()
            .shutdown(std::time::Duration::from_secs(2), &mut |_| {}),
        DeviceRelease::Clean
    );
}

#[test]
fn auto_fits_the_layers_the_device_can_hold() {
    let file = synth("tiny", "F32");
    let config = ModelConfig::from_gguf(&file).expect("config");
    let n = config.n_layers;
    let options = ModelOptions {
        n_ctx: 64,
        n_batch: 16,
        all_logits: false,
        n_seq: 1,
    };
    let full = split::model_plan(&file, options).expect("plan");
    // What the GPU needs for each -ngl, from the backend's own arithmetic.
    let probe = fake_gpu(1 << 30);
    // The loader's default streams the CPU's layers for a prompt batch: the GPU sets room aside.
    let need = |ngl: usize| {
        let p = Placement::from_ngl(n, ngl, config.tied_embeddings).with_op_offload(Some(32));
        let plan = if p.all_on_gpu() {
            full
        } else {
            split::gpu_plan(&full, &p, &file, &config, 64)
        };
        probe.plan_bytes(&plan).expect("a GPU plans")
    };
    assert!(need(0) < need(1) && need(1) < need(2) && need(2) < need(n + 1));

    // Room for the output and one layer, not for the other layer.
    let dev = fake_gpu(need(2) + 4096);
    let free = dev.device().free_memory.expect("free memory known");
    assert!(free >= need(2) && free < need(n + 1), "{free}");
    let loaded = loader::load(
        file.clone(),
        dev,
        &load_opts(GpuLayers::Auto),
        &mut |_, _| {},
    )
    .expect("auto split");
    let said = loaded.offload.clone().expect("said");
    assert!(
        said.starts_with("-ngl auto: 2/3 layers on the GPU"),
        "{said}"
    );
    assert!(said.contains("VRAM free (runtime)"), "{said}");
    let mut session = loaded.session;
    session
        .model_mut()
        .backend_mut()
        .shutdown(std::time::Duration::from_secs(2), &mut |_| {});

    // Room for everything: no split, and it says so.
    let loaded = loader::load(
        file.clone(),
        fake_gpu(1 << 30),
        &load_opts(GpuLayers::Auto),
        &mut |_, _| {},
    )
    .expect("all on the GPU");
    let said = loaded.offload.clone().expect("said");
    assert!(
        said.starts_with("-ngl auto: 3/3 layers on the GPU"),
        "{said}"
    );
    let mut session = loaded.session;
    assert!(session.model.backend().arena().split.is_none());
    session
        .model_mut()
        .backend_mut()
        .shutdown(std::time::Duration::from_secs(2), &mut |_| {});

    // Not even the activations: refused with the numbers.
    let e = match loader::load(
        file.clone(),
        fake_gpu(need(0) / 2),
        &load_opts(GpuLayers::Auto),
        &mut |_, _| {},
    ) {
        Ok(_) => panic!("a device smaller than the activations cannot take a layer"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("even with every layer on the CPU"), "{e}");
    assert!(e.contains("MiB are usable"), "{e}");
}
