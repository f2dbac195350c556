//! From a model source to a ready session: open (or synthesize) the GGUF, build the tokenizer and
//! chat template, and load the weights onto a backend.

use std::path::Path;
use std::sync::Arc;

use crate::gpu::backend::Backend;
use crate::gpu::compute::{KernelNeeds, TypeSet};
use crate::gpu::cpu::CpuOptions;
use crate::gpu::telemetry::Roots;
use crate::model::forward::{Model, ModelError, ModelOptions};
use crate::model::gguf::{GgufError, GgufFile};
use crate::model::protocol::{ModelSource, ModelSummary, SamplerConfig};
use crate::model::session::Session;
use crate::model::split::{self, GpuLayers, MoreGpus, SplitOptions};
use crate::model::synthetic::{self, SynthError};
use crate::model::template::ChatTemplate;
use crate::model::tokenizer::{Tokenizer, TokenizerError};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Synth(#[from] SynthError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("a remote endpoint ({0}) has no model file to open: it is connected to, not loaded")]
    Remote(String),
}

/// The largest context accepted anywhere (`-c`, `ctx_size`, `/set ctx`).
pub const MAX_CTX: usize = 1 << 24;

/// Settings for loading a model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// KV cache positions; `None`: the model's training context, at most 4096; `Some(0)`: the
    /// model's training context, as far as memory allows (llama.cpp's `-c 0`).
    pub n_ctx: Option<usize>,
    pub n_batch: usize,
    /// Keep every token's logits (perplexity), not only the last.
    pub all_logits: bool,
    pub sampler: SamplerConfig,
    /// Share of the conversation after the system prompt a full context drops at once.
    pub discard: f32,
    /// Layers on the GPU (`-ngl`); the rest run on a CPU backend computing as `cpu` says.
    /// Ignored on the CPU backend.
    pub gpu_layers: GpuLayers,
    /// How a CPU backend made here computes: the CPU part of a split model, or the CPU in place
    /// of a GPU that cannot run the architecture.
    pub cpu: CpuOptions,
    /// Sequences the KV cache holds, each of the context (`hipscope serve --parallel`).
    pub n_seq: usize,
    /// How a model is split over several GPUs (`--split-mode`, `--tensor-split`, `--main-gpu`).
    pub split: SplitOptions,
    /// The other GPUs of the opened one's runtime; `None`: one GPU only.
    pub more_gpus: Option<MoreGpus>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            n_ctx: None,
            n_batch: 512,
            all_logits: false,
            sampler: SamplerConfig::default(),
            discard: crate::model::session::DEFAULT_DISCARD,
            gpu_layers: GpuLayers::Auto,
            cpu: CpuOptions::default(),
            n_seq: 1,
            split: SplitOptions::default(),
            more_gpus: None,
        }
    }
}

/// Opens a model file, or builds the synthetic model in memory.
pub fn open(
    src: &ModelSource,
    progress: &mut dyn FnMut(f32, &str),
) -> Result<Arc<GgufFile>, LoadError> {
    Ok(Arc::new(match src {
        ModelSource::File(p) => GgufFile::open(p)?,
        ModelSource::Synthetic { shape, quant, seed } => {
            let s = synthetic::shape(shape)?;
            let ty = synthetic::recipe(quant)?;
            synthetic::build(s, ty, *seed, progress)?
        }
        ModelSource::Remote(spec) => return Err(LoadError::Remote(spec.url.clone())),
    }))
}

/// What can be checked of a model without a device: the architecture and its tensors, the
/// tokenizer, the weight types. A file that passes loads unless the device runs out of memory.
pub fn check(file: &GgufFile) -> Result<(), LoadError> {
    Tokenizer::from_gguf(file)?;
    let config = crate::model::config::ModelConfig::from_gguf(file).map_err(ModelError::from)?;
    config.check_tensors(file).map_err(ModelError::from)?;
    Ok(())
}

/// The GPU kernels a model launches: the types of its matrices (every tensor of more than one
/// row; one-row tensors are kept as f32 vectors), whether it has experts, its heads' dimension
/// (the cache type is the backend's own). The GPU backend compiles these when it opens, anything
/// else when first needed (`gpu::compute::ComputeOptions::kernels`).
pub fn kernel_needs(file: &GgufFile) -> KernelNeeds {
    let matrices = file
        .tensors()
        .iter()
        .filter(|t| t.dims.iter().skip(1).product::<u64>() > 1);
    let config = crate::model::config::ModelConfig::from_gguf(file).ok();
    KernelNeeds {
        types: matrices.clone().map(|t| t.ty).collect::<TypeSet>(),
        moe: config.as_ref().is_some_and(|c| c.moe.is_some())
            || matrices.clone().any(|t| t.name.contains("_exps")),
        head_dim: config.map_or(0, |c| c.head_dim),
        ..KernelNeeds::default()
    }
}

/// A session ready to chat, and anything the user should know about how it was set up (a
/// file without a chat template, and the format used instead).
pub struct Loaded {
    pub session: Session,
    pub summary: ModelSummary,
    pub warnings: Vec<String>,
    /// How `-ngl` placed the layers on a GPU (`-ngl auto: 16/33 layers on the GPU …`); `None`
    /// on the CPU backend.
    pub offload: Option<String>,
}

pub fn load(
    file: Arc<GgufFile>,
    backend: Box<dyn Backend>,
    opts: &LoadOptions,
    progress: &mut dyn FnMut(f32, &str),
) -> Result<Loaded, LoadError> {
    let mut warnings = Vec::new();
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let (template, note) = ChatTemplate::for_chat(&file, &tokenizer);
    warnings.extend(note);
    let config = crate::model::config::ModelConfig::from_gguf(&file).map_err(ModelError::from)?;
    let n_ctx = match opts.n_ctx {
        None => config.train_ctx.clamp(8, 4096),
        Some(0) => {
            let (n, note) = trained_context_in_memory(&config, backend.device().free_memory);
            warnings.extend(note);
            n
        }
        Some(n) => n.max(8),
    };
    if n_ctx > config.train_ctx {
        warnings.push(format!(
            "context {n_ctx} is longer than the {} tokens the model was trained on; expect degraded output past that",
            config.train_ctx
        ));
    }
    let options = ModelOptions {
        n_ctx,
        n_batch: opts.n_batch,
        all_logits: opts.all_logits,
        n_seq: opts.n_seq.max(1),
    };
    let backend = cpu_if_gpu_cannot(backend, &config, &opts.cpu, &mut warnings)?;
    let (backend, offload) = split::arrange(
        &file,
        backend,
        &config,
        options,
        split::Arrange {
            want: opts.gpu_layers,
            split: &opts.split,
            more: opts.more_gpus.as_ref(),
            cpu: &opts.cpu,
            roots: &Roots::from_env(),
        },
    )?;
    let model = Model::load(file.clone(), backend, options, progress)?;
    // What each op reads and writes, for a trace's and the profile's bytes columns.
    crate::gpu::trace::set_op_costs(crate::model::bound::op_costs(
        &file,
        &model.config,
        model.backend().kv_type().bytes() as usize,
    ));
    let summary = summarize(&file, &model);
    let mut session = Session::new(model, tokenizer, template, opts.sampler.clone());
    session.set_discard(opts.discard);
    Ok(Loaded {
        session,
        summary,
        warnings,
        offload,
    })
}

/// An architecture the GPU backends cannot run yet ([`Arch::gpu_unsupported`]) on a GPU
/// backend: with `--backend auto` (its reason says `auto:`) a CPU backend instead, with a warning
/// saying why; with an explicit `--backend hip|cuda` an error saying so. Anything else passes.
///
/// [`Arch::gpu_unsupported`]: crate::model::config::Arch::gpu_unsupported
fn cpu_if_gpu_cannot(
    backend: Box<dyn Backend>,
    config: &crate::model::config::ModelConfig,
    cpu: &CpuOptions,
    warnings: &mut Vec<String>,
) -> Result<Box<dyn Backend>, LoadError> {
    let Some(why) = config.arch.gpu_unsupported() else {
        return Ok(backend);
    };
    let device = backend.device();
    if device.backend == "cpu" {
        return Ok(backend);
    }
    if !device.reason.starts_with("auto:") {
        return Err(
            ModelError::Backend(crate::gpu::backend::BackendError::Unsupported(format!(
                "{why}: {} cannot run it; use --backend cpu (or auto)",
                device.name
            )))
            .into(),
        );
    }
    let said = format!(
        "{why}; --backend auto uses the CPU instead of {}",
        device.name
    );
    let cpu = crate::gpu::cpu::CpuBackend::with_options(cpu, &said).with_kv_type(backend.kv_type());
    drop(backend);
    warnings.push(said);
    Ok(Box::new(cpu))
}

/// Bytes of KV cache per position, at most (f32 keys and values; a GPU's f16 cache takes half).
pub fn kv_bytes_per_position(config: &crate::model::config::ModelConfig) -> u64 {
    (config.n_layers * config.kv_dim()) as u64 * 2 * 4
}

/// `-c 0`: the trained context, or the most positions (a multiple of 256) whose KV cache fits
/// in half of the memory the device has free, with a note saying so.
fn trained_context_in_memory(
    config: &crate::model::config::ModelConfig,
    free: Option<u64>,
) -> (usize, Option<String>) {
    let trained = config.train_ctx.max(8);
    let per = kv_bytes_per_position(config).max(1);
    let Some(free) = free else {
        return (trained, None);
    };
    let fits = ((free / 2 / per) as usize / 256 * 256).max(256);
    if fits >= trained {
        return (trained, None);
    }
    (
        fits,
        Some(format!(
            "-c 0: the trained context of {trained} tokens needs {} MiB of KV cache, {} MiB are free; using {fits} tokens",
            (trained as u64 * per) >> 20,
            free >> 20
        )),
    )
}

fn summarize(file: &GgufFile, model: &Model) -> ModelSummary {
    let path = file.path();
    let quant = file.type_label().unwrap_or_else(|| "?".into());
    let on_disk = path.is_file();
    ModelSummary {
        name: display_name(file.get_str("general.name"), &file_stem(path), &quant),
        path: on_disk.then(|| path.to_path_buf()),
        architecture: model.config.arch_name.clone(),
        quant,
        parameters: file.parameter_count(),
        file_bytes: file.bytes().len() as u64,
        context_length: model.n_ctx(),
        n_layers: model.config.n_layers,
        load_time: model.load_time(),
    }
}

/// The one name a model goes by everywhere (header, speaker labels, exports, picker): the
/// file's `general.name` where it is short and reads as a name (at most 24 characters and 4
/// words), the file's stem otherwise; without the weight type at its end, which is shown beside
/// it (`synthetic tiny · Q4_0`, not `synthetic tiny Q4_0 · Q4_0`).
pub fn display_name(general_name: Option<&str>, stem: &str, quant: &str) -> String {
    let general = general_name
        .map(str::trim)
        .filter(|n| !n.is_empty() && n.chars().count() <= 24 && n.split_whitespace().count() <= 4);
    let name = general.unwrap_or(stem);
    without_quant(name, quant).to_string()
}

/// `name` without a trailing weight type (`SmolLM2-135M-Instruct.Q4_1` → `SmolLM2-135M-Instruct`):
/// `quant` is a type label, and a name may end in any of its forms (`ftype::name_suffixes`:
/// `Q4_K - Medium`, `Q4_K_M`, `Q4_K`), matched without regard to case after a separator; a name
/// that is nothing else stays.
fn without_quant<'a>(name: &'a str, quant: &str) -> &'a str {
    for suffix in crate::model::gguf::ftype::name_suffixes(quant) {
        let cut = without_suffix(name, suffix);
        if cut.len() < name.len() {
            return cut;
        }
    }
    name
}

fn without_suffix<'a>(name: &'a str, quant: &str) -> &'a str {
    if quant.is_empty() || name.len() <= quant.len() {
        return name;
    }
    let cut = name.len() - quant.len();
    let (head, tail) = (name.get(..cut), name.get(cut..));
    match (head, tail) {
        (Some(head), Some(tail)) if tail.eq_ignore_ascii_case(quant) => {
            let trimmed = head.trim_end_matches(['.', '-', '_', ' ']);
            if trimmed.len() < head.len() && !trimmed.is_empty() {
                trimmed
            } else {
                name
            }
        }
        _ => name,
    }
}

fn file_stem(p: &Path) -> String {
    p.file_stem()
        .map_or_else(|| p.display().to_string(), |s| s.to_string_lossy().into())
}

#[cfg(test)]
mod tests {
    use super::display_name;

    #[test]
    fn one_readable_name_without_the_weight_type_twice() {
        // A long, machine-made general.name gives way to the file stem.
        assert_eq!(
            display_name(
                Some("Smollm2 135M 8k Lc100K Mix1 Ep2"),
                "SmolLM2-135M-Instruct.Q4_1",
                "Q4_1"
            ),
            "SmolLM2-135M-Instruct"
        );
        assert_eq!(
            display_name(Some("synthetic tiny Q4_0"), "x", "Q4_0"),
            "synthetic tiny"
        );
        assert_eq!(
            display_name(Some("Llama 3.2 3B Instruct"), "llama", "Q4_K"),
            "Llama 3.2 3B Instruct"
        );
        assert_eq!(display_name(None, "model-q8_0", "Q8_0"), "model");
        assert_eq!(display_name(Some("  "), "Q8_0", "Q8_0"), "Q8_0");
        assert_eq!(display_name(None, "tinyq4_0", "Q4_0"), "tinyq4_0");
        // A type label as llama.cpp names it: the name may end in any of its forms.
        let q4km = "Q4_K - Medium";
        assert_eq!(
            display_name(None, "Qwen3-30B-A3B-Q4_K_M", q4km),
            "Qwen3-30B-A3B"
        );
        assert_eq!(
            display_name(Some("synthetic tiny Q4_K"), "x", q4km),
            "synthetic tiny"
        );
    }
}
