//! The headless subcommands.

pub mod bench;

pub mod fetch_cmd;
pub mod generate;
pub mod info;
pub mod perplexity;
pub mod synth;
pub mod tokenize;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::app::backend::BackendRequest;
use crate::app::cli::ModelArgs;
use crate::app::fetch::{self, FetchProgress};
use crate::app::quit::{describe_step, hard_exit_now};
use crate::gpu::backend::Backend;
use crate::gpu::compute::ComputeOptions;
use crate::gpu::stats::QuitStepStatus;
use crate::model::forward::Model;
use crate::model::gguf::GgufFile;
use crate::model::loader::{self, LoadOptions, Loaded};
use crate::model::protocol::{ModelSource, SamplerConfig};

/// The model a command runs: the one given, a synthetic one, or the default (fetched if needed).
pub fn model_source(args: &ModelArgs) -> anyhow::Result<ModelSource> {
    if let Some(shape) = &args.synthetic {
        use crate::model::synthetic;
        let usage = |e: synthetic::SynthError| crate::app::cli::UsageError(e.to_string());
        synthetic::shape(shape).map_err(usage)?;
        synthetic::quant_type(&args.quant).map_err(usage)?;
        return Ok(ModelSource::Synthetic {
            shape: shape.clone(),
            quant: args.quant.clone(),
            seed: args.synthetic_seed,
        });
    }
    if let Some(p) = &args.model {
        return Ok(ModelSource::File(p.clone()));
    }
    let path = fetch::ensure_default_model(&mut stderr_progress())?;
    Ok(ModelSource::File(path))
}

/// Opens the model file (or builds the synthetic one), reporting progress on stderr.
pub fn open_model(args: &ModelArgs) -> anyhow::Result<Arc<GgufFile>> {
    let src = model_source(args)?;
    let mut bar = ProgressLine::new("building");
    let file = loader::open(&src, &mut |f, what| bar.update(f, what))?;
    bar.finish();
    Ok(file)
}

/// Loads a model ready to run on the CPU backend.
pub fn load_model(args: &ModelArgs, sampler: SamplerConfig) -> anyhow::Result<Loaded> {
    load_model_with(args, sampler, false)
}

/// As [`load_model`], keeping room for every token's logits when `all_logits`.
pub fn load_model_with(
    args: &ModelArgs,
    sampler: SamplerConfig,
    all_logits: bool,
) -> anyhow::Result<Loaded> {
    let file = open_model(args)?;
    let backend = open_backend(args)?;
    let opts = LoadOptions {
        n_ctx: args.ctx_size,
        n_batch: args.batch_size.max(1),
        all_logits,
        sampler,
    };
    let mut bar = ProgressLine::new("loading");
    let loaded = loader::load(file, backend, &opts, &mut |f, what| bar.update(f, what))
        .context("loading the model")?;
    bar.finish();
    for w in &loaded.warnings {
        eprintln!("warning: {w}");
    }
    Ok(loaded)
}

/// The GPU backend's settings from the command line, with `HIPSCOPE_GEMM_MIN_TOKENS` (the batch
/// size from which matrix products take the GEMM path) for measuring the two paths.
pub fn compute_options(args: &ModelArgs) -> ComputeOptions {
    let mut o = ComputeOptions {
        kv: args.kv_type,
        ..ComputeOptions::default()
    };
    if let Some(n) = std::env::var("HIPSCOPE_GEMM_MIN_TOKENS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        o.gemm_min_tokens = n.max(1);
    }
    o
}

/// Opens the backend `--backend`/`--device` ask for, saying on stderr which one and why.
pub fn open_backend(args: &ModelArgs) -> anyhow::Result<Box<dyn Backend>> {
    let (backend, said) = crate::app::backend::open(&BackendRequest {
        choice: args.backend,
        device: args.device,
        threads: args.threads,
        compute: compute_options(args),
    })
    .map_err(anyhow::Error::msg)?;
    eprintln!("backend: {said}");
    Ok(backend)
}

/// Ends a command that ran a model: the backend's quit protocol (bounded drain, then every
/// device resource in order), failed steps on stderr. When the GPU could not be shut down
/// cleanly, leaves at once with `_exit(3)` so that no runtime atexit handler can hang the
/// process; otherwise passes the command's result through.
pub fn finish(model: &mut Model, result: anyhow::Result<i32>) -> anyhow::Result<i32> {
    let code = model
        .backend_mut()
        .shutdown(Duration::from_secs(3), &mut |s| {
            if matches!(s.status, QuitStepStatus::Failed(_)) {
                eprintln!("shutdown: {}", describe_step(&s));
            }
        });
    if code != 0 {
        if let Err(e) = &result {
            eprintln!("error: {e:#}");
        }
        eprintln!("hipscope: the GPU could not be shut down cleanly; leaving without GPU cleanup");
        hard_exit_now(code);
    }
    result
}

/// A one-line progress bar on stderr (only when stderr is a terminal).
pub struct ProgressLine {
    label: &'static str,
    tty: bool,
    last: i32,
}

impl ProgressLine {
    pub fn new(label: &'static str) -> ProgressLine {
        use std::io::IsTerminal;
        ProgressLine {
            label,
            tty: std::io::stderr().is_terminal(),
            last: -1,
        }
    }

    pub fn update(&mut self, fraction: f32, what: &str) {
        let pct = (fraction.clamp(0.0, 1.0) * 100.0) as i32;
        if !self.tty || pct == self.last {
            return;
        }
        self.last = pct;
        let width = 30;
        let filled = (pct as usize * width) / 100;
        let what: String = what.chars().take(40).collect();
        eprint!(
            "\r\x1b[2K{} [{}{}] {:3}% {}",
            self.label,
            "#".repeat(filled),
            "-".repeat(width - filled),
            pct,
            what
        );
        let _ = std::io::stderr().flush();
    }

    pub fn finish(&mut self) {
        if self.tty && self.last >= 0 {
            eprint!("\r\x1b[2K");
            let _ = std::io::stderr().flush();
        }
        self.last = -1;
    }
}

/// Fetch progress on stderr: steps as lines, bytes as a bar.
pub fn stderr_progress() -> impl FnMut(FetchProgress) {
    let mut bar = ProgressLine::new("downloading");
    move |p| match p {
        FetchProgress::Step(s) => {
            bar.finish();
            eprintln!("{s}");
        }
        FetchProgress::Bytes { done, total } => {
            let f = total.map_or(0.0, |t| done as f32 / t.max(1) as f32);
            bar.update(f, &format!("{} MiB", done >> 20));
        }
    }
}
