//! What every command that runs a model shares: its arguments ([`ModelArgs`]: which model, which
//! backend, context and batch sizes) and the steps from them to a loaded model and back to a
//! clean device (`finish`).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use super::progress::{ProgressLine, stderr_progress};
use super::usage::{MAX_CTX, MAX_THREADS, UsageError, whole};
use crate::app::config::Config;
use crate::app::quit::{QuitConfig, describe_step, hard_exit_now};
use crate::app::stderr::errln;
use crate::app::{exit_code, fetch};
use crate::gpu::backend::Backend;
use crate::gpu::compute::{ComputeOptions, KernelNeeds, KvType};
use crate::gpu::cpu::CpuOptions;
use crate::gpu::open::BackendRequest;
use crate::gpu::select::BackendChoice;
use crate::gpu::snapshot::{DeviceRelease, QuitStepStatus};
use crate::model::forward::Model;
use crate::model::gguf::GgufFile;
use crate::model::loader::{self, LoadOptions, Loaded};
use crate::model::protocol::{ModelSource, SamplerConfig};
use crate::model::split::GpuLayers;

/// Where the model comes from and how it is set up; shared by every command that runs one.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file (default: the configured model, else SmolLM2-135M-Instruct, fetched on
    /// first use).
    #[arg(short = 'm', long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Use a synthetic model of this shape instead (tiny, smollm2-135m, qwen2.5-0.5b,
    /// llama-3.2-1b, llama-2-7b, qwen3-0.6b, gemma3-1b, gemma2-2b, phi3-mini, phi4-mini; `hipscope
    /// synth --help` lists them all).
    #[arg(long, value_name = "NAME", conflicts_with = "model")]
    pub synthetic: Option<String>,
    /// Weight type of the synthetic model.
    #[arg(
        long,
        value_name = "TYPE",
        default_value = "Q8_0",
        requires = "synthetic"
    )]
    pub quant: String,
    /// Seed of the synthetic model's weights.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "synthetic")]
    pub synthetic_seed: u64,
    /// Context size in tokens (default: `ctx_size` in config.toml, else the model's trained
    /// context, at most 4096; 0: the whole trained context, as far as memory allows).
    #[arg(short = 'c', long = "ctx-size", value_name = "N", allow_negative_numbers = true,
          value_parser = whole::<usize>(0, MAX_CTX))]
    pub ctx_size: Option<usize>,
    /// CPU threads (default: `threads` in config.toml, else all cores; 0: all cores).
    #[arg(short = 't', long, value_name = "N", allow_negative_numbers = true,
          value_parser = whole::<usize>(0, MAX_THREADS))]
    pub threads: Option<usize>,
    /// Most tokens per forward step when processing a prompt.
    #[arg(
        short = 'b',
        long = "batch-size",
        value_name = "N",
        default_value_t = 512,
        allow_negative_numbers = true,
        value_parser = whole::<usize>(1, MAX_CTX)
    )]
    pub batch_size: usize,
    /// Where the model runs: auto (HIP, then CUDA, then the CPU), hip, cuda or cpu (default:
    /// `backend` in config.toml, else auto).
    #[arg(long, value_name = "NAME", value_parser = parse_backend)]
    pub backend: Option<BackendChoice>,
    /// GPU number as the runtime counts them (default: `device` in config.toml, else the largest
    /// discrete GPU).
    #[arg(long, value_name = "N")]
    pub device: Option<u32>,
    /// Layers on the GPU, as llama.cpp counts them (the output layer first, then the last
    /// layers); the rest run on the CPU. `auto` (default: `n_gpu_layers` in config.toml, else
    /// auto): as many as the device's memory holds. Also `-ngl N`.
    #[arg(long = "n-gpu-layers", visible_alias = "ngl", value_name = "N|auto",
          value_parser = crate::model::split::parse_gpu_layers)]
    pub n_gpu_layers: Option<GpuLayers>,
    #[command(flatten)]
    pub split: crate::app::settings::SplitArgs,
    /// Element type of the KV cache (f16 or f32), on the GPU and the CPU alike; f16 halves its
    /// memory and the bytes attention reads at depth, as llama.cpp keeps it.
    #[arg(long, value_name = "TYPE", default_value = "f16", value_parser = parse_kv)]
    pub kv_type: KvType,
    /// Run the GPU decode step launch by launch instead of replaying it as a graph (config
    /// `graphs`).
    #[arg(long)]
    pub no_graphs: bool,
    /// Write a timeline of every op, copy and step to FILE (Chrome trace-event JSON: open it in
    /// ui.perfetto.dev or chrome://tracing; docs/PROFILING.md).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
}

fn parse_backend(s: &str) -> Result<BackendChoice, String> {
    s.parse()
}

fn parse_kv(s: &str) -> Result<KvType, String> {
    s.parse()
}

/// The model a command runs: the one given, a synthetic one, or the default (fetched if needed).
pub fn model_source(args: &ModelArgs, config: &Config) -> anyhow::Result<ModelSource> {
    if let Some(shape) = &args.synthetic {
        use crate::model::synthetic;
        let usage = |e: synthetic::SynthError| UsageError(e.to_string());
        synthetic::shape(shape).map_err(usage)?;
        synthetic::recipe(&args.quant).map_err(usage)?;
        return Ok(ModelSource::Synthetic {
            shape: shape.clone(),
            quant: args.quant.clone(),
            seed: args.synthetic_seed,
        });
    }
    Ok(ModelSource::File(model_path(args.model.as_ref(), config)?))
}

/// The model file a command runs: the one named with `-m`, else `model` in the settings
/// (`app/settings.rs`), else the default model, fetched if needed. The one rule for every
/// command, the chat included (which reads the same config key).
pub fn model_path(named: Option<&PathBuf>, config: &Config) -> anyhow::Result<PathBuf> {
    if let Some(p) = named.or(config.model.as_ref()) {
        // A name, not a file (`-m llama3.2`): the model discovery finds under it, as the chat.
        use crate::app::discover::{self, Places, names};
        if !p.exists() && names::may_be_a_name(p) {
            let found = discover::find_named(&p.to_string_lossy(), &Places::for_names(config))
                .map_err(|e| UsageError(e.to_string()))?;
            errln!("model: {}", found.label);
            return Ok(found.path);
        }
        return Ok(p.clone());
    }
    Ok(fetch::ensure_default_model(
        &fetch::FetchOptions::from_config(&config.fetch),
        &mut stderr_progress(),
    )?)
}

/// Opens the model file (or builds the synthetic one), reporting progress on stderr.
pub fn open_model(args: &ModelArgs, config: &Config) -> anyhow::Result<Arc<GgufFile>> {
    let src = model_source(args, config)?;
    // A SIGBUS from the map (the file cut short under it) names the file, at any step.
    if let crate::model::protocol::ModelSource::File(p) = &src {
        crate::app::signals::note_mapped_file(p);
    }
    let mut bar = ProgressLine::new("building");
    let file = loader::open(&src, &mut |f, what| bar.update(f, what))?;
    bar.finish();
    Ok(file)
}

/// Loads a model ready to run on the CPU backend.
pub fn load_model(
    args: &ModelArgs,
    config: &Config,
    sampler: SamplerConfig,
) -> anyhow::Result<Loaded> {
    load_model_with(args, config, sampler, false)
}

/// As [`load_model`], keeping room for every token's logits when `all_logits`.
pub fn load_model_with(
    args: &ModelArgs,
    config: &Config,
    sampler: SamplerConfig,
    all_logits: bool,
) -> anyhow::Result<Loaded> {
    let file = open_model(args, config)?;
    let needs = Some(loader::kernel_needs(&file));
    let backend = open_backend(args, config, needs)?;
    let opts = LoadOptions {
        n_ctx: args.ctx_size.or(config.ctx_size.map(|n| n as usize)),
        n_batch: args.batch_size.max(1),
        all_logits,
        sampler,
        gpu_layers: args.n_gpu_layers.unwrap_or(config.n_gpu_layers),
        cpu: cpu_options(args, config),
        ..split_load_options(args, config, needs)?
    };
    load_on(args, file, backend, &opts)
}

/// Loads `file` on `backend` as `opts` say (`--trace` started first), the progress, warnings and
/// the offload's placement on stderr: the last step of [`load_model_with`], and of `serve`,
/// which opens its backend itself.
pub fn load_on(
    args: &ModelArgs,
    file: Arc<GgufFile>,
    backend: Box<dyn Backend>,
    opts: &LoadOptions,
) -> anyhow::Result<Loaded> {
    if let Some(path) = &args.trace {
        crate::gpu::trace::start_file(path).context("--trace")?;
    }
    let mut bar = ProgressLine::new("loading");
    let loaded = loader::load(file, backend, opts, &mut |f, what| bar.update(f, what))
        .context("loading the model")?;
    bar.finish();
    for w in &loaded.warnings {
        errln!("warning: {w}");
    }
    if let Some(s) = &loaded.offload {
        errln!("offload: {s}");
    }
    Ok(loaded)
}

/// The CPU backend's settings: `-t`, else `threads` in the settings, with the tuning knobs.
pub fn cpu_options(args: &ModelArgs, config: &Config) -> CpuOptions {
    let threads = args.threads.unwrap_or(config.threads as usize);
    config.tuning.cpu(threads)
}

/// The GPU backend's settings: `--kv-type`, graphs unless `--no-graphs` or `graphs = false`, and
/// the tuning knobs (`HIPSCOPE_PREFILL_GEMM`, `HIPSCOPE_GEMM_MIN_TOKENS`, `HIPSCOPE_MV_ACT`).
pub fn compute_options(args: &ModelArgs, config: &Config) -> ComputeOptions {
    config
        .tuning
        .compute(args.kv_type, !args.no_graphs && config.graphs)
}

/// Opens the backend `--backend`/`--device` (else the settings) ask for, saying on stderr which
/// one and why. An explicit GPU backend that cannot start here is a usage error (exit code 2),
/// as in the chat. A GPU backend compiles the kernels of `needs` (every kernel for `None`) as it
/// opens, a first start's compile shown on stderr.
pub fn open_backend(
    args: &ModelArgs,
    config: &Config,
    needs: Option<KernelNeeds>,
) -> anyhow::Result<Box<dyn Backend>> {
    open_backend_with(args, config, needs, crate::gpu::open::hangs_to_stderr())
}

/// As [`open_backend`], the watchdog's events going to `sink` (`serve` names the requests of a
/// hung step).
pub fn open_backend_with(
    args: &ModelArgs,
    config: &Config,
    needs: Option<KernelNeeds>,
    sink: crate::gpu::watchdog::WatchSink,
) -> anyhow::Result<Box<dyn Backend>> {
    let req = backend_request(args, config, needs)?;
    crate::gpu::select::preflight(req.choice, req.device).map_err(|e| {
        UsageError(format!(
            "the {} backend cannot start: {e}\n  (--backend auto uses the CPU when no GPU \
             can start)",
            req.choice
        ))
    })?;
    let mut compile = super::progress::CompileLine::new();
    let (backend, said) = crate::gpu::open::open(&req, sink, &mut |p| compile.update(p))
        .map_err(anyhow::Error::msg)?;
    compile.finish();
    errln!("backend: {said}");
    Ok(backend)
}

/// What to open: `--backend`/`--device` (`--main-gpu`), else the settings'.
pub fn backend_request(
    args: &ModelArgs,
    config: &Config,
    needs: Option<KernelNeeds>,
) -> anyhow::Result<BackendRequest> {
    let split = args.split.over(&config.split);
    let device = crate::app::settings::first_gpu(args.device.or(config.device), &split)
        .map_err(UsageError)?;
    Ok(BackendRequest {
        choice: args.backend.unwrap_or(config.backend),
        device,
        cpu: cpu_options(args, config),
        compute: ComputeOptions {
            kernels: needs,
            ..compute_options(args, config)
        },
    })
}

/// The split settings (`--split-mode`, `--tensor-split`, `--main-gpu` over the settings') and
/// the other GPUs a split may open, as the first was opened: the `LoadOptions` of a command
/// that runs a model, the rest at their defaults.
pub fn split_load_options(
    args: &ModelArgs,
    config: &Config,
    needs: Option<KernelNeeds>,
) -> anyhow::Result<LoadOptions> {
    Ok(LoadOptions {
        split: args.split.over(&config.split),
        more_gpus: Some(crate::gpu::open::MoreGpus::for_request(&backend_request(
            args, config, needs,
        )?)),
        ..LoadOptions::default()
    })
}

/// Ends a command that ran a model: the backend's quit protocol (bounded drain, then every
/// device resource in order), failed steps on stderr. When the GPU could not be shut down
/// cleanly, leaves at once with `_exit(3)` so that no runtime atexit handler can hang the
/// process; otherwise passes the command's result through.
pub fn finish(model: &mut Model, result: anyhow::Result<i32>) -> anyhow::Result<i32> {
    let release = model
        .backend_mut()
        .shutdown(QuitConfig::default().drain_deadline, &mut |s| {
            if matches!(s.status, QuitStepStatus::Failed(_)) {
                errln!("shutdown: {}", describe_step(&s));
            }
        });
    stop_trace();
    if release == DeviceRelease::Abandoned {
        if let Err(e) = &result {
            errln!("error: {e:#}");
        }
        errln!("hipscope: the GPU could not be shut down cleanly; leaving without GPU cleanup");
        hard_exit_now(exit_code::after(release));
    }
    result
}

/// Closes the `--trace` file, if one is being written, saying where it is.
pub fn stop_trace() {
    match crate::gpu::trace::stop_file() {
        Ok((path, events)) => {
            let dropped = crate::gpu::trace::dropped();
            let lost = if dropped > 0 {
                format!(" ({dropped} dropped: the collector fell behind)")
            } else {
                String::new()
            };
            errln!(
                "trace: {events} events{lost} in {} (open it in ui.perfetto.dev or chrome://tracing)",
                path.display()
            );
        }
        Err(crate::gpu::trace::TraceError::NotTracing) => {}
        Err(e) => errln!("trace: {e}"),
    }
}
