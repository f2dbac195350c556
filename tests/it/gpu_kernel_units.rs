//! The kernels as compile units (issue 30 item 3, issue 38): every weight type's launches are
//! labelled with that type (the Streams panel and hang reports name the op by these labels); a
//! model's GPU backend compiles its own units when it opens and anything unforeseen at its first
//! use; two compiles filling one cache at once leave it whole. On the fake device (its compiler's
//! "code object" is the unit's text, its kernels run as no-ops) and the real binary.

use std::process::Command;
use std::sync::Arc;

use hipscope::gpu::compute::plan::GPU_TYPES;
use hipscope::gpu::compute::{ComputeOptions, GpuCompute, KernelNeeds};
use hipscope::gpu::fake::{FakeDevice, FakeScript};
use hipscope::gpu::kernels::KernelCache;
use hipscope::gpu::quant::GgmlType;
use hipscope::model::forward::{Logits, Model, ModelOptions};
use hipscope::model::gguf::GgufFile;
use hipscope::model::loader;
use hipscope::model::protocol::ModelSource;

fn synthetic(shape: &str, quant: GgmlType) -> Arc<GgufFile> {
    loader::open(
        &ModelSource::Synthetic {
            shape: shape.into(),
            quant: quant.name().into(),
            seed: 5,
        },
        &mut |_, _| {},
    )
    .expect("synthetic model")
}

fn open(options: ComputeOptions) -> GpuCompute {
    let dev = FakeDevice::new(FakeScript {
        total_memory: 1 << 30,
        auto_complete: true,
        blas: false,
        graphs: false,
    });
    GpuCompute::open(Box::new(dev), "fake", options, &KernelCache::disabled()).expect("open")
}

fn opts() -> ModelOptions {
    ModelOptions {
        n_ctx: 64,
        n_batch: 32,
        all_logits: false,
        n_seq: 1,
    }
}

/// A prompt (GEMM path), a decode step (the one-token kernels) and a short batch (up to 8 tokens
/// a launch): the labels of every op the model enqueued.
fn run(m: &mut Model) -> Vec<String> {
    let mut logits = Vec::new();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 7 + 1) % 512).collect();
    m.forward(&prompt, 0, Logits::Last, &mut logits)
        .expect("prompt");
    m.forward(&[5], 20, Logits::Last, &mut logits)
        .expect("decode");
    m.forward(&[6, 7, 8], 21, Logits::Last, &mut logits)
        .expect("short batch");
    let shared = m.backend().watch_target().expect("a GPU backend").0;
    shared
        .recent_completed(4000)
        .into_iter()
        .map(|o| o.label)
        .collect()
}

/// Every matrix-vector launch inside the layers names the layers' weight type (the defect: a
/// fallback arm labelled Q2_K, Q3_K, IQ4_NL and IQ4_XS launches "mv_q6_k").
#[test]
fn every_types_matrix_launches_are_labelled_with_that_type() {
    for &ty in GPU_TYPES {
        let mut m = Model::load(
            synthetic("tiny", ty),
            Box::new(open(ComputeOptions::default())),
            opts(),
            &mut |_, _| {},
        )
        .expect("load");
        let labels = run(&mut m);
        let suffix = ty.name().to_ascii_lowercase();
        let mv: Vec<&String> = labels
            .iter()
            .filter(|l| l.starts_with("layer "))
            .filter(|l| l.rsplit(" · ").next().is_some_and(|k| k.starts_with("mv")))
            .collect();
        assert!(
            mv.len() >= 4,
            "{ty}: too few matrix-vector launches: {mv:?}"
        );
        for l in mv {
            let kernel = l.rsplit(" · ").next().unwrap_or("");
            assert!(
                kernel
                    .trim_end_matches(" + residual")
                    .ends_with(&format!("_{suffix}")),
                "{ty}: {l:?} does not name {suffix}"
            );
        }
        let _ = m
            .backend_mut()
            .shutdown(std::time::Duration::from_secs(2), &mut |_| {});
    }
}

fn units_built(g: &GpuCompute) -> Vec<String> {
    g.kernel_builds().iter().map(|b| b.name.clone()).collect()
}

/// Opened for a model's needs, the backend builds that model's units and no others; a type or
/// an expert op the needs left out is built when first launched, and then runs.
#[test]
fn the_backend_builds_the_models_units_and_the_rest_at_first_use() {
    let file = synthetic("tiny", GgmlType::Q4_0);
    let needs = loader::kernel_needs(&file);
    assert!(needs.types.contains(GgmlType::Q4_0) && !needs.moe);
    let g = open(ComputeOptions {
        kernels: Some(needs),
        ..ComputeOptions::default()
    });
    let built = units_built(&g);
    assert!(built.iter().any(|u| u == "infer_matvec.q4_0"), "{built:?}");
    assert!(built.iter().any(|u| u == "infer_attention"), "{built:?}");
    // tiny's heads are 64 wide; the cache f16 (the default).
    assert!(
        built.iter().any(|u| u == "infer_attention_tiled.f16_64"),
        "{built:?}"
    );
    assert!(!built.iter().any(|u| u == "infer_attention_tiled.f32_64"));
    assert!(
        !built
            .iter()
            .any(|u| u.ends_with(".gate_up") || u.ends_with(".f32act"))
    );
    for not in [
        "infer_matvec.q6_k",
        "infer_matvec.q8_0",
        "infer_moe",
        "gemm_moe",
    ] {
        assert!(!built.iter().any(|u| u == not), "{not} in {built:?}");
    }
    let mut m = Model::load(file, Box::new(g), opts(), &mut |_, _| {}).expect("load");
    run(&mut m);

    // A mixture-of-experts model opened as if it were dense and of another type: its types and
    // its expert kernels are built at their first launch.
    let moe = synthetic("tiny-qwen3moe", GgmlType::Q8_0);
    let wrong = KernelNeeds {
        types: [GgmlType::Q4K].into_iter().collect(),
        moe: false,
        head_dim: 1,
        ..KernelNeeds::default()
    };
    let g = open(ComputeOptions {
        kernels: Some(wrong),
        ..ComputeOptions::default()
    });
    let before = units_built(&g);
    assert!(!before.iter().any(|u| u == "infer_moe"), "{before:?}");
    let mut m = Model::load(moe, Box::new(g), opts(), &mut |_, _| {}).expect("load");
    let labels = run(&mut m);
    assert!(labels.iter().any(|l| l.contains("moe_route")), "{labels:?}");
    let any = m
        .backend_mut()
        .as_any_mut()
        .and_then(|a| a.downcast_mut::<GpuCompute>())
        .expect("the GPU backend");
    let after = units_built(any);
    for want in [
        "infer_moe",
        "gemm_moe",
        "infer_matvec.q8_0",
        "infer_dequant.q8_0",
    ] {
        assert!(
            after.iter().any(|u| u == want),
            "{want} not built: {after:?}"
        );
    }
}

/// Two `hipscope kernels --compile` at once into one cache (as two first starts would): both
/// succeed, every object in the cache is whole (the fake compiler's object is the unit's text, so
/// a torn write would show), no temporary file is left, and a third run finds all of it cached.
#[test]
fn two_concurrent_compiles_into_one_cache_leave_it_whole() {
    let home = tempfile::tempdir().expect("temp home");
    // `hipscope kernels --compile` for the fake compiler into the cache under `home`.
    let command = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_hipscope"));
        c.args([
            "kernels",
            "--compile",
            "--backend",
            "fake",
            "--arch",
            "fake1",
        ])
        .env("HIPSCOPE_HOME", home.path())
        .env_remove("HIPSCOPE_KERNELS");
        c
    };
    let compile = || {
        command()
            .args(["--jobs", "3"])
            .spawn()
            .expect("run hipscope")
    };
    let (mut a, mut b) = (compile(), compile());
    let (ra, rb) = (a.wait().expect("wait"), b.wait().expect("wait"));
    assert!(ra.success() && rb.success(), "{ra:?} {rb:?}");
    let units = hipscope::gpu::compute::units::kernel_units(
        &hipscope::gpu::kernels::KernelSources::embedded(),
        hipscope::gpu::compute::KernelScope::All,
    )
    .expect("units");
    let dir = walk(home.path());
    let objects: Vec<&std::path::PathBuf> = dir
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "co"))
        .collect();
    assert_eq!(objects.len(), units.len(), "one object per unit: {dir:#?}");
    for u in &units {
        let obj = objects
            .iter()
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{}-", u.name)))
            })
            .unwrap_or_else(|| panic!("no object for {}", u.name));
        assert_eq!(
            std::fs::read_to_string(obj).expect("read"),
            u.text,
            "{} is torn",
            u.name
        );
    }
    assert!(
        dir.iter().all(|p| p
            .file_name()
            .is_some_and(|n| !n.to_string_lossy().contains(".tmp"))),
        "temporary files left: {dir:#?}"
    );
    let out = command().output().expect("run hipscope");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(text.matches("(cached)").count(), units.len(), "{text}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
