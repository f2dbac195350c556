//! A model split over several GPUs by layers (issue 35: `--split-mode layer`, `--tensor-split`,
//! `model/split/`).
//!
//! The numbers: the real SmolLM2 split over two "GPUs" that are CPU backends runs the same code
//! as the one-device CPU run on each part, so its greedy tokens and its logits must equal that
//! run's bit for bit — which checks the cut, the crossings between the parts and each part's KV
//! cache, not the kernels (those are `selftest --compute`'s, on a real GPU).
//!
//! The mechanism: the real `GpuCompute` on two scripted fake devices (`fake:0`, `fake:1`),
//! loaded through the loader as the commands load them, the second opened through `MoreGpus`:
//! what is placed where and said, the crossings as ops on both devices' streams, a hang on the
//! second device named by its stream, and the quit releasing every device in order.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hipscope::gpu::backend::{Backend, Instrument, Memory, MemoryPlan, OpLabel};
use hipscope::gpu::compute::{ComputeOptions, GpuCompute};
use hipscope::gpu::cpu::CpuBackend;
use hipscope::gpu::device::{DeviceInfo, RuntimeKind};
use hipscope::gpu::fake::{FakeDevice, FakeScript};
use hipscope::gpu::kernels::KernelCache;
use hipscope::gpu::quant::GgmlType;
use hipscope::gpu::snapshot::{DeviceRelease, WatchState, WatchdogSnapshot};
use hipscope::gpu::stream::{Budget, StreamShared};
use hipscope::gpu::watchdog::{WatchConfig, WatchEvent, Watchdog};
use hipscope::model::config::ModelConfig;
use hipscope::model::forward::{Logits, Model, ModelOptions};
use hipscope::model::gguf::GgufFile;
use hipscope::model::loader::{self, LoadOptions};
use hipscope::model::split::backend::SplitBackend;
use hipscope::model::split::{
    GpuLayers, MoreGpus, Placement, Side, SplitMode, SplitOptions, TensorSplit,
};
use hipscope::model::synthetic;
use hipscope::model::tokenizer::Tokenizer;

use crate::common;

fn smollm2() -> Arc<GgufFile> {
    Arc::new(GgufFile::open(&common::smollm2()).expect("the test model opens"))
}

/// Greedy tokens and each step's logits: the prompt in batches of 8, then `n` decode steps.
fn greedy(m: &mut Model, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut logits = Vec::new();
    let mut all = Vec::new();
    let mut pos = 0;
    for chunk in prompt.chunks(8) {
        m.forward(chunk, pos, Logits::Last, &mut logits)
            .expect("prompt");
        pos += chunk.len();
    }
    all.push(logits.clone());
    let mut toks = Vec::new();
    for _ in 0..n {
        let t = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32)
            .expect("logits");
        toks.push(t);
        m.forward(&[t], pos, Logits::Last, &mut logits)
            .expect("decode");
        pos += 1;
        all.push(logits.clone());
    }
    (toks, all)
}

fn opts() -> ModelOptions {
    ModelOptions {
        n_ctx: 128,
        n_batch: 8,
        all_logits: false,
        n_seq: 1,
    }
}

/// The model over a CPU part and two CPU backends in the GPUs' place, cut as `place` says.
fn over_two(file: &Arc<GgufFile>, place: Placement) -> Model {
    let split = SplitBackend::new(
        vec![Box::new(CpuBackend::new(2)), Box::new(CpuBackend::new(2))],
        Box::new(CpuBackend::new(2)),
        place,
        vec![MemoryPlan::default(); 2],
        "test: two devices".into(),
    );
    Model::load(file.clone(), Box::new(split), opts(), &mut |_, _| {}).expect("load split")
}

#[test]
fn smollm2_over_two_devices_gives_the_one_device_tokens_and_logits() {
    let file = smollm2();
    let config = ModelConfig::from_gguf(&file).expect("config");
    let n = config.n_layers;
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let prompt = tok.encode("The capital of France is", true, false);
    assert!(prompt.len() > 3, "{prompt:?}");
    let mut one = Model::load(
        file.clone(),
        Box::new(CpuBackend::new(2)),
        opts(),
        &mut |_, _| {},
    )
    .expect("load on one device");
    let (want_toks, want_logits) = greedy(&mut one, &prompt, 12);
    // Every layer over two devices, evenly; a 3:1 cut of 20 offloaded layers with the first
    // ones on the CPU; a cut that leaves the second device only the output.
    for (ngl, shares) in [
        (n + 1, vec![1.0, 1.0]),
        (20, vec![3.0, 1.0]),
        (n + 1, vec![n as f64, 1.0]),
    ] {
        let place = Placement::from_split(n, ngl, config.tied_embeddings, &shares);
        assert_eq!(place.n_gpus(), 2);
        let what = place.describe();
        let mut m = over_two(&file, place);
        let (toks, logits) = greedy(&mut m, &prompt, 12);
        assert_eq!(toks, want_toks, "{what}");
        for (step, (g, w)) in logits.iter().zip(&want_logits).enumerate() {
            assert!(
                g == w,
                "{what}: step {step}'s logits differ from the one-device run (first at {:?})",
                g.iter().zip(w).position(|(a, b)| a != b)
            );
        }
        // The residual stream crossed between the parts: CPU → GPU 0 → GPU 1 each step.
        let s = m.backend().arena().split.expect("a split shows its split");
        assert!(s.handovers >= 2 * logits.len() as u64, "{what}: {s:?}");
        assert_eq!(s.gpus.len(), 2, "{s:?}");
    }
}

#[test]
fn layers_are_cut_over_gpus_as_llama_cpp_cuts_them() {
    // Two equal GPUs, 32 layers and the output: 17 on the first, 15 and the output on the
    // second (llama.cpp: upper_bound of il/33 in the cumulative shares [0.5, 1]).
    let p = Placement::from_split(32, 33, false, &[1.0, 1.0]);
    assert_eq!(
        (p.gpu_from, p.gpu_bounds.clone(), p.output_gpu),
        (0, vec![17], 1)
    );
    assert_eq!(
        (p.layer_side(16), p.layer_side(17)),
        (Side::Gpu(0), Side::Gpu(1))
    );
    assert_eq!(p.output_side(), Side::Gpu(1));
    assert_eq!(
        p.describe(),
        "33/33 layers on 2 GPUs (GPU 0: layers 0–16; GPU 1: layers 17–31 and the output), 0 on \
         the CPU (the embedding)"
    );
    assert_eq!(p.tensor_parts("blk.20.attn_q.weight"), vec![Side::Gpu(1)]);
    assert_eq!(p.tensor_parts("token_embd.weight"), vec![Side::Cpu]);
    assert_eq!(p.tensor_parts("output.weight"), vec![Side::Gpu(1)]);
    assert_eq!(
        p.tensor_parts("output_norm.weight"),
        vec![Side::Cpu, Side::Gpu(0), Side::Gpu(1)]
    );
    // -ngl 20, --tensor-split 3,1: layers 0–12 on the CPU, 13–27 on GPU 0, 28–31 and the
    // output on GPU 1.
    let p = Placement::from_split(32, 20, false, &[3.0, 1.0]);
    assert_eq!((p.gpu_from, p.gpu_bounds.clone()), (13, vec![28]));
    assert_eq!((p.gpu_range(0), p.gpu_range(1)), (13..28, 28..32));
    assert_eq!(p.layer_side(12), Side::Cpu);
    assert_eq!(p.ngl(), 20);
    // --tensor-split 1,0: everything on the first GPU.
    let p = Placement::from_split(32, 33, false, &[1.0, 0.0]);
    assert_eq!((p.gpu_bounds.clone(), p.output_gpu), (vec![32], 0));
    // One GPU: the placement of -ngl alone.
    assert_eq!(
        Placement::from_split(32, 16, false, &[5.0]),
        Placement::from_ngl(32, 16, false)
    );

    // The settings' values.
    assert_eq!("layer".parse::<SplitMode>(), Ok(SplitMode::Layer));
    assert_eq!("NONE".parse::<SplitMode>(), Ok(SplitMode::None));
    let e = "row"
        .parse::<SplitMode>()
        .expect_err("row is not implemented");
    assert!(e.contains("not implemented"), "{e}");
    assert_eq!(
        "3,1".parse::<TensorSplit>(),
        Ok(TensorSplit(vec![3.0, 1.0]))
    );
    for bad in ["", "3,x", "-1,2", "0,0"] {
        assert!(bad.parse::<TensorSplit>().is_err(), "{bad:?}");
    }
    let s = SplitOptions {
        tensor_split: Some(TensorSplit(vec![3.0])),
        ..SplitOptions::default()
    };
    assert_eq!(
        s.shares(&[10, 20]),
        vec![3.0, 0.0],
        "padded as llama.cpp pads"
    );
    assert_eq!(SplitOptions::default().shares(&[10, 20]), vec![10.0, 20.0]);
}

/// The GPU backend on the fake device numbered `ordinal`.
fn fake_compute(ordinal: u32, total_memory: u64) -> GpuCompute {
    let dev = FakeDevice::with_ordinal(
        FakeScript {
            total_memory,
            auto_complete: true,
            blas: false,
            graphs: false,
        },
        ordinal,
    );
    GpuCompute::open(
        Box::new(dev),
        "fake: test device",
        ComputeOptions::default(),
        &KernelCache::disabled(),
    )
    .expect("open")
}

fn fake_gpu(ordinal: u32, total_memory: u64) -> Box<dyn Backend> {
    Box::new(fake_compute(ordinal, total_memory))
}

/// What the second fake GPU left for the test to look at: its stream, its watchdog's snapshots.
#[derive(Clone, Default)]
struct Second {
    stream: Arc<Mutex<Option<Arc<StreamShared>>>>,
    seen: Arc<Mutex<Vec<WatchdogSnapshot>>>,
}

/// `MoreGpus` offering one more fake GPU (`fake:1`), opened with its own watchdog as
/// `gpu::open` starts one.
fn one_more(total_memory: u64, second: &Second) -> MoreGpus {
    let s = second.clone();
    MoreGpus::new(
        move |main: &DeviceInfo| {
            assert_eq!(main.ordinal, 0, "asked beside the first GPU");
            vec![DeviceInfo {
                backend: Some(RuntimeKind::Fake),
                ordinal: 1,
                name: "fake GPU 1".into(),
                total_memory,
                ..DeviceInfo::default()
            }]
        },
        move |d, _sink| {
            let mut b = fake_gpu(d.ordinal, total_memory);
            let (shared, info) = b.watch_target().expect("a GPU has a stream");
            *s.stream.lock().unwrap() = Some(shared.clone());
            let seen = s.seen.clone();
            let cfg = WatchConfig {
                tick: Duration::from_millis(10),
                report_dir: None,
                heartbeat: Duration::from_millis(50),
                ..WatchConfig::default()
            };
            let dog = Watchdog::spawn(
                shared,
                &info,
                cfg,
                Box::new(move |ev| {
                    let (WatchEvent::Snapshot(x) | WatchEvent::Hung { snapshot: x, .. }) = ev;
                    seen.lock().unwrap().push(x);
                }),
            )
            .map_err(|e| e.to_string())?;
            b.keep_watchdog(dog);
            Ok(b)
        },
    )
}

/// The tiny llama with 4 layers: equal shares put layers 0–2 on GPU 0, layer 3 and the output
/// on GPU 1.
fn synth_tiny() -> Arc<GgufFile> {
    let mut s = synthetic::shape("tiny").expect("shape").clone();
    s.n_layers = 4;
    Arc::new(synthetic::build(&s, GgmlType::Q8_0, 5, &mut |_, _| {}).expect("build"))
}

fn load_opts(mode: SplitMode, more: MoreGpus) -> LoadOptions {
    LoadOptions {
        n_ctx: Some(64),
        n_batch: 16,
        gpu_layers: GpuLayers::Auto,
        split: SplitOptions {
            mode,
            ..SplitOptions::default()
        },
        more_gpus: Some(more),
        cpu: hipscope::gpu::cpu::CpuOptions {
            threads: 2,
            ..Default::default()
        },
        ..LoadOptions::default()
    }
}

/// Labels of the ops enqueued on `stream` (a GPU that only sends its last crossing of a step
/// is not waited for by the host: its ops complete when the device gets to them).
fn done_labels(stream: &StreamShared) -> Vec<String> {
    (1..=stream.enqueued())
        .filter_map(|s| stream.op(s))
        .map(|o| o.label)
        .collect()
}

#[test]
fn split_mode_layer_puts_each_gpus_layers_there_and_crosses_on_both_streams() {
    let file = synth_tiny();
    let second = Second::default();
    let loaded = loader::load(
        file.clone(),
        fake_gpu(0, 1 << 30),
        &load_opts(SplitMode::Layer, one_more(1 << 30, &second)),
        &mut |_, _| {},
    )
    .expect("load over two GPUs");
    let said = loaded.offload.clone().expect("the split is said");
    assert!(
        said.starts_with("--split-mode layer, 2 GPUs in proportion to free memory (1.0, 1.0 GiB)"),
        "{said}"
    );
    assert!(
        said.contains("GPU 0: layers 0–2; GPU 1: layers 3–3 and the output"),
        "{said}"
    );
    let mut session = loaded.session;
    let m = session.model_mut();
    let mut logits = Vec::new();
    m.forward(&[1, 2, 3], 0, Logits::Last, &mut logits)
        .expect("a step");
    m.forward(&[4], 3, Logits::Last, &mut logits)
        .expect("a decode step");
    let first = m.backend().watch_target().expect("GPU 0's stream").0;
    let second_stream = second.stream.lock().unwrap().clone().expect("GPU 1 opened");
    assert_eq!(
        (first.name.as_str(), second_stream.name.as_str()),
        ("fake:0 stream 0", "fake:1 stream 0")
    );
    // Each crossing is one op on the sending device's stream and one on the receiving one's.
    let (on0, on1) = (done_labels(&first), done_labels(&second_stream));
    // Between the GPUs peer to peer (the fakes allow it); from the CPU part, an upload.
    let count = |v: &[String], l: &str| v.iter().filter(|x| x.as_str() == l).count();
    assert_eq!(count(&on0, "cross GPU 0 → GPU 1 · peer"), 2, "{on0:?}");
    assert_eq!(count(&on1, "cross GPU 0 → GPU 1 · peer"), 2, "{on1:?}");
    assert_eq!(count(&on0, "cross CPU → GPU 0"), 2, "{on0:?}");
    assert!(on1.iter().any(|l| l.starts_with("layer 3 ·")), "{on1:?}");
    assert!(!on0.iter().any(|l| l.starts_with("layer 3 ·")), "{on0:?}");
    assert!(on0.iter().any(|l| l.starts_with("layer 2 ·")), "{on0:?}");
    // The Streams panel: one block per GPU, then the CPU part.
    let lanes: Vec<String> = m
        .backend()
        .monitor()
        .expect("monitor")
        .streams()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(lanes, ["fake:0 stream 0", "fake:1 stream 0", "cpu"]);
    // The Arena panel: one block per GPU.
    let split = m.backend().arena().split.expect("split");
    let names: Vec<&str> = split.gpus.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["fake GPU", "fake GPU 1"]);
    assert!(split.gpus.iter().all(|g| g.weight_bytes > 0), "{split:?}");
    let mut steps = Vec::new();
    let release = m
        .backend_mut()
        .shutdown(Duration::from_secs(2), &mut |s| steps.push(s.name));
    assert_eq!(release, DeviceRelease::Clean, "{steps:?}");
    let first_of = |who: &str| steps.iter().position(|s| s.starts_with(who));
    let (g0, g1, c) = (first_of("GPU 0: "), first_of("GPU 1: "), first_of("CPU: "));
    assert!(
        g0.is_some() && g0 < g1 && g1 < c,
        "every device released, in order: {steps:?}"
    );
}

#[test]
fn a_model_too_large_for_one_gpu_goes_over_both_by_default() {
    let file = synth_tiny();
    let config = ModelConfig::from_gguf(&file).expect("config");
    let full = hipscope::model::split::model_plan(
        &file,
        ModelOptions {
            n_ctx: 64,
            n_batch: 16,
            all_logits: false,
            n_seq: 1,
        },
    )
    .expect("plan");
    // What one GPU needs for -ngl k, from the backend's own arithmetic.
    let probe = fake_gpu(0, 1 << 30);
    let n = config.n_layers;
    let need = |k: usize| {
        let p = Placement::from_ngl(n, k, config.tied_embeddings);
        let plan = if p.all_on_gpu() {
            full
        } else {
            hipscope::model::split::gpu_plan(&full, &p, &file, &config, 64)
        };
        probe.plan_bytes(&plan).expect("a GPU plans")
    };
    // The first GPU holds the output and two layers, not the whole model; the second is large.
    let second = Second::default();
    let small = need(3) + 4096;
    assert!(small < need(n + 1));
    let loaded = loader::load(
        file.clone(),
        fake_gpu(0, small),
        &load_opts(SplitMode::Auto, one_more(1 << 30, &second)),
        &mut |_, _| {},
    )
    .expect("load");
    let said = loaded.offload.clone().expect("said");
    assert!(
        said.starts_with(
            "split by layers: the model does not fit one GPU, 2 GPUs in proportion to free memory"
        ),
        "{said}"
    );
    let n = config.n_layers;
    assert!(
        said.contains(&format!("{}/{} layers on 2 GPUs", n + 1, n + 1)),
        "{said}"
    );
    let mut session = loaded.session;
    session
        .model_mut()
        .backend_mut()
        .shutdown(Duration::from_secs(2), &mut |_| {});
    // --split-mode none: one GPU, the rest of the layers on the CPU (-ngl auto), and the
    // second GPU never opened.
    let unused = Second::default();
    let loaded = loader::load(
        file.clone(),
        fake_gpu(0, small),
        &load_opts(SplitMode::None, one_more(1 << 30, &unused)),
        &mut |_, _| {},
    )
    .expect("load");
    let said = loaded.offload.clone().expect("said");
    assert!(said.starts_with("-ngl auto: "), "{said}");
    assert!(!said.contains("2 GPUs"), "{said}");
    assert!(unused.stream.lock().unwrap().is_none(), "not opened");
    let mut session = loaded.session;
    session
        .model_mut()
        .backend_mut()
        .shutdown(Duration::from_secs(2), &mut |_| {});
}

#[test]
fn a_hang_on_the_second_gpu_is_named_by_its_stream_and_the_quit_still_releases_all() {
    let file = synth_tiny();
    let n = ModelConfig::from_gguf(&file).expect("config").n_layers;
    let second = Second::default();
    let loaded = loader::load(
        file.clone(),
        fake_gpu(0, 1 << 30),
        &load_opts(SplitMode::Layer, one_more(1 << 30, &second)),
        &mut |_, _| {},
    )
    .expect("load over two GPUs");
    let mut session = loaded.session;
    let m = session.model_mut();
    // An op of the last layer, on GPU 1, that never finishes.
    let budget = Budget {
        slow: Duration::from_millis(30),
        hung: Duration::from_millis(60),
    };
    m.backend_mut()
        .stuck_op(OpLabel::layer(n as u32 - 1, "stuck"), budget)
        .expect("enqueued");
    let t = Instant::now();
    let hung = loop {
        let got = second
            .seen
            .lock()
            .unwrap()
            .iter()
            .find(|s| s.state == WatchState::Hung)
            .cloned();
        if let Some(s) = got {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no hang seen");
        std::thread::yield_now();
    };
    assert_eq!(hung.stream, "fake:1 stream 0");
    assert_eq!(
        hung.op.as_deref(),
        Some(&*format!("layer {} · stuck", n - 1))
    );
    // The split's monitor shows the worst GPU: the hung one, by its name.
    let w = m
        .backend()
        .monitor()
        .expect("monitor")
        .watchdog()
        .expect("a verdict");
    assert_eq!(
        (w.state, w.stream.as_str()),
        (WatchState::Hung, "fake:1 stream 0")
    );
    // The quit: every device in order within the one deadline; GPU 1 cannot drain.
    let mut steps = Vec::new();
    let t = Instant::now();
    let release = m
        .backend_mut()
        .shutdown(Duration::from_millis(400), &mut |s| steps.push(s.name));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(release, DeviceRelease::Abandoned, "{steps:?}");
    let first_of = |who: &str| steps.iter().position(|s| s.starts_with(who));
    assert!(
        first_of("GPU 0: ") < first_of("GPU 1: ") && first_of("GPU 1: ") < first_of("CPU: "),
        "{steps:?}"
    );
}

#[test]
fn a_peer_copy_between_two_gpus_carries_the_data_intact() {
    let (mut a, mut b) = (fake_compute(0, 1 << 30), fake_compute(1, 1 << 30));
    let plan = MemoryPlan {
        activation_elems: 1 << 16,
        n_batch: 1,
        max_cols: 256,
        ..MemoryPlan::default()
    };
    let (mut xa, mut xb) = (None, None);
    for (g, x) in [(&mut a, &mut xa), (&mut b, &mut xb)] {
        g.plan(&plan).expect("plan");
        *x = Some(g.alloc("x", 4096).expect("alloc"));
    }
    let (xa, xb) = (xa.unwrap(), xb.unwrap());
    let data: Vec<f32> = (0..4096).map(|i| i as f32 * 0.5 - 7.0).collect();
    a.write(xa, 0, &data).expect("write on GPU 0");
    let sent = a
        .send_to_peer(xa, &mut b, xb, 3000, OpLabel::global("cross GPU 0 → GPU 1"))
        .expect("peer copy");
    assert!(sent, "two fakes allow a peer copy");
    let mut back = vec![0f32; 4096];
    b.read(xb, 0, &mut back).expect("read on GPU 1");
    assert_eq!(&back[..3000], &data[..3000], "the crossed rows");
    assert!(back[3000..].iter().all(|&x| x == 0.0), "nothing past them");
    for g in [&mut a, &mut b] {
        assert_eq!(
            g.shutdown(Duration::from_secs(2), &mut |_| {}),
            DeviceRelease::Clean
        );
    }
}

/// hipscope with an empty home of its own.
fn hipscope_in(home: &std::path::Path) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_hipscope"));
    c.env("HIPSCOPE_HOME", home)
        .env_remove("HIPSCOPE_CONFIG")
        .env_remove("HIPSCOPE_SPLIT_MODE")
        .env_remove("HIPSCOPE_TENSOR_SPLIT")
        .env_remove("HIPSCOPE_MAIN_GPU")
        .current_dir(home)
        .stdin(std::process::Stdio::null());
    c
}

#[test]
fn the_split_flags_are_checked_as_usage_errors() {
    let home = tempfile::tempdir().unwrap();
    let run = |args: Vec<String>, env: &[(&str, &str)]| {
        let o = hipscope_in(home.path())
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let base = ["generate", "--synthetic", "tiny", "-p", "hi", "-n", "1"];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    // Row split is llama.cpp's, not hipscope's: said so.
    let (code, err) = run(with(&["--split-mode", "row"]), &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("\"row\" is not implemented"), "{err}");
    let (code, err) = run(with(&["-ts", "3,x"]), &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("such as 3,1"), "{err}");
    // --device and --main-gpu naming two GPUs.
    let (code, err) = run(with(&["--device", "1", "--main-gpu", "0"]), &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--device 1 and --main-gpu 0"), "{err}");
    // The environment's value is checked like a flag's, naming its variable.
    let (code, err) = run(with(&[]), &[("HIPSCOPE_SPLIT_MODE", "rows")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("HIPSCOPE_SPLIT_MODE=rows"), "{err}");
    // On the CPU the split settings change nothing: the answer comes.
    let (code, err) = run(
        with(&["--backend", "cpu", "-sm", "layer", "-ts", "1,1", "-mg", "0"]),
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
}
