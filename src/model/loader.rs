//! From a model source to a ready session: open (or synthesize) the GGUF, build the tokenizer and
//! chat template, and load the weights onto a backend.

use std::path::Path;
use std::sync::Arc;

use crate::gpu::backend::Backend;
use crate::model::forward::{Model, ModelError, ModelOptions};
use crate::model::gguf::{GgufError, GgufFile};
use crate::model::protocol::{ModelSource, ModelSummary, SamplerConfig};
use crate::model::session::Session;
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
}

/// Settings for loading a model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// KV cache positions; `None`: the model's training context, at most 4096.
    pub n_ctx: Option<usize>,
    pub n_batch: usize,
    /// Keep every token's logits (perplexity), not only the last.
    pub all_logits: bool,
    pub sampler: SamplerConfig,
    /// Share of the conversation after the system prompt a full context drops at once.
    pub discard: f32,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            n_ctx: None,
            n_batch: 512,
            all_logits: false,
            sampler: SamplerConfig::default(),
            discard: crate::model::session::DEFAULT_DISCARD,
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
            let ty = synthetic::quant_type(quant)?;
            synthetic::build(s, ty, *seed, progress)?
        }
    }))
}

/// A session ready to chat, and anything the user should know about how it was set up (a
/// template that failed and was replaced by ChatML, say).
pub struct Loaded {
    pub session: Session,
    pub summary: ModelSummary,
    pub warnings: Vec<String>,
}

pub fn load(
    file: Arc<GgufFile>,
    backend: Box<dyn Backend>,
    opts: &LoadOptions,
    progress: &mut dyn FnMut(f32, &str),
) -> Result<Loaded, LoadError> {
    let mut warnings = Vec::new();
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let template = match ChatTemplate::from_gguf(&file, &tokenizer) {
        Ok(t) => t,
        Err(e) => {
            warnings.push(format!("{e}; using ChatML instead"));
            ChatTemplate::chatml(&tokenizer)
        }
    };
    let config = crate::model::config::ModelConfig::from_gguf(&file).map_err(ModelError::from)?;
    let n_ctx = opts
        .n_ctx
        .unwrap_or_else(|| config.train_ctx.min(4096))
        .max(8);
    if n_ctx > config.train_ctx {
        warnings.push(format!(
            "context {n_ctx} is longer than the {} tokens the model was trained on; expect degraded output past that",
            config.train_ctx
        ));
    }
    let model = Model::load(
        file.clone(),
        backend,
        ModelOptions {
            n_ctx,
            n_batch: opts.n_batch,
            all_logits: opts.all_logits,
        },
        progress,
    )?;
    let summary = summarize(&file, &model);
    let mut session = Session::new(model, tokenizer, template, opts.sampler.clone());
    session.set_discard(opts.discard);
    Ok(Loaded {
        session,
        summary,
        warnings,
    })
}

fn summarize(file: &GgufFile, model: &Model) -> ModelSummary {
    let path = file.path();
    let on_disk = path.is_file();
    ModelSummary {
        name: file
            .get_str("general.name")
            .map(str::to_string)
            .unwrap_or_else(|| file_stem(path)),
        path: on_disk.then(|| path.to_path_buf()),
        architecture: model.config.arch_name.clone(),
        quant: file
            .dominant_type()
            .map_or_else(|| "?".into(), |t| t.name().to_string()),
        parameters: file.parameter_count(),
        file_bytes: file.bytes().len() as u64,
        context_length: model.n_ctx(),
        n_layers: model.config.n_layers,
        load_time: model.load_time(),
    }
}

fn file_stem(p: &Path) -> String {
    p.file_stem()
        .map_or_else(|| p.display().to_string(), |s| s.to_string_lossy().into())
}
