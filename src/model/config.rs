//! Model hyperparameters, read from a GGUF file's `{arch}.*` metadata.

use std::path::PathBuf;

use crate::model::gguf::GgufFile;

/// The architectures the forward pass implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// llama, Mistral (as converted by llama.cpp), SmolLM, TinyLlama, …
    Llama,
    /// Qwen2 / Qwen2.5: llama with q/k/v biases and NeoX RoPE.
    Qwen2,
}

impl Arch {
    pub fn from_name(name: &str) -> Option<Arch> {
        match name {
            "llama" | "mistral" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            _ => None,
        }
    }

    /// NeoX RoPE rotates pairs (i, i + n_rot/2); "normal" RoPE rotates adjacent pairs. llama.cpp's
    /// `llama_model_rope_type` is the authority on which architecture uses which.
    pub fn neox_rope(self) -> bool {
        matches!(self, Arch::Qwen2)
    }

    /// Why shifting the KV cache (moving keys and re-rotating them) would not give what a
    /// recompute gives for this architecture, if it would not: sliding-window layers (their
    /// window moves with the positions) or position-dependent attention beyond RoPE. Every
    /// architecture answers explicitly, so a new one must decide.
    pub fn kv_shift_inexact(self) -> Option<&'static str> {
        match self {
            Arch::Llama | Arch::Qwen2 => None,
        }
    }
}

/// How RoPE positions are scaled for long contexts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// llama 3.1 style: per-dimension frequency factors from the `rope_freqs.weight` tensor.
    FreqFactors,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    /// `general.architecture` as written in the file.
    pub arch_name: String,
    pub n_layers: usize,
    pub dim: usize,
    pub ffn_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Dimensions of each head that RoPE rotates (≤ head_dim).
    pub n_rot: usize,
    pub rope_base: f32,
    pub rope_scaling: RopeScaling,
    pub rms_eps: f32,
    pub vocab_size: usize,
    /// The context length the model was trained for.
    pub train_ctx: usize,
    /// No `output.weight`: the token embedding doubles as the output matrix.
    pub tied_embeddings: bool,
}

/// The model file lacks something the architecture needs, or says something impossible.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: metadata key {key} is missing")]
    Missing { path: PathBuf, key: String },
    #[error("{path}: metadata key {key} = {value}: {why}")]
    Invalid {
        path: PathBuf,
        key: String,
        value: String,
        why: String,
    },
    #[error(
        "{path}: architecture {arch:?} is not supported (supported: llama, mistral, qwen2 and their fine-tunes such as SmolLM)"
    )]
    UnsupportedArch { path: PathBuf, arch: String },
    #[error("{path}: tensor {name} is missing")]
    MissingTensor { path: PathBuf, name: String },
    #[error("{path}: tensor {name} has shape {got:?}, expected {expected:?}")]
    BadShape {
        path: PathBuf,
        name: String,
        got: Vec<u64>,
        expected: Vec<u64>,
    },
}

struct Reader<'a> {
    f: &'a GgufFile,
    arch: &'a str,
}

impl Reader<'_> {
    fn path(&self) -> PathBuf {
        self.f.path().to_path_buf()
    }

    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    fn usize_opt(&self, suffix: &str) -> Result<Option<usize>, ConfigError> {
        let key = self.key(suffix);
        match self.f.get(&key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 && n < (1 << 31) => Ok(Some(n as usize)),
                _ => Err(ConfigError::Invalid {
                    path: self.path(),
                    key,
                    value: v.summary(),
                    why: "expected a positive integer below 2^31".into(),
                }),
            },
        }
    }

    fn usize(&self, suffix: &str) -> Result<usize, ConfigError> {
        self.usize_opt(suffix)?.ok_or_else(|| ConfigError::Missing {
            path: self.path(),
            key: self.key(suffix),
        })
    }

    fn f32_opt(&self, suffix: &str) -> Result<Option<f32>, ConfigError> {
        let key = self.key(suffix);
        match self.f.get(&key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x > 0.0 => Ok(Some(x as f32)),
                _ => Err(ConfigError::Invalid {
                    path: self.path(),
                    key,
                    value: v.summary(),
                    why: "expected a positive number".into(),
                }),
            },
        }
    }

    fn invalid(&self, suffix: &str, value: impl ToString, why: &str) -> ConfigError {
        ConfigError::Invalid {
            path: self.path(),
            key: self.key(suffix),
            value: value.to_string(),
            why: why.into(),
        }
    }
}

impl ModelConfig {
    pub fn from_gguf(f: &GgufFile) -> Result<ModelConfig, ConfigError> {
        let path = f.path().to_path_buf();
        let arch_name = f
            .architecture()
            .ok_or_else(|| ConfigError::Missing {
                path: path.clone(),
                key: "general.architecture".into(),
            })?
            .to_string();
        let arch = Arch::from_name(&arch_name).ok_or_else(|| ConfigError::UnsupportedArch {
            path: path.clone(),
            arch: arch_name.clone(),
        })?;
        let r = Reader {
            f,
            arch: &arch_name,
        };
        let n_layers = r.usize("block_count")?;
        let dim = r.usize("embedding_length")?;
        let ffn_dim = r.usize("feed_forward_length")?;
        let n_heads = r.usize("attention.head_count")?;
        let n_kv_heads = r.usize_opt("attention.head_count_kv")?.unwrap_or(n_heads);
        if n_heads % n_kv_heads != 0 {
            return Err(r.invalid(
                "attention.head_count_kv",
                n_kv_heads,
                &format!("must divide the head count {n_heads}"),
            ));
        }
        let head_dim = match r.usize_opt("attention.key_length")? {
            Some(k) => k,
            None if dim % n_heads == 0 => dim / n_heads,
            None => {
                return Err(r.invalid(
                    "attention.head_count",
                    n_heads,
                    &format!("does not divide the embedding length {dim}"),
                ));
            }
        };
        if let Some(vl) = r.usize_opt("attention.value_length")?
            && vl != head_dim
        {
            return Err(r.invalid(
                "attention.value_length",
                vl,
                "differs from the key length, which this engine does not support",
            ));
        }
        let n_rot = r.usize_opt("rope.dimension_count")?.unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(r.invalid(
                "rope.dimension_count",
                n_rot,
                &format!("must be even and at most the head size {head_dim}"),
            ));
        }
        let rope_base = r.f32_opt("rope.freq_base")?.unwrap_or(10000.0);
        let rope_scaling = if f.tensor("rope_freqs.weight").is_some() {
            RopeScaling::FreqFactors
        } else {
            match f.get_str(&r.key("rope.scaling.type")) {
                None | Some("none") => RopeScaling::None,
                Some("linear") => {
                    let factor = r.f32_opt("rope.scaling.factor")?.unwrap_or(1.0);
                    RopeScaling::Linear { factor }
                }
                Some(other) => {
                    return Err(r.invalid(
                        "rope.scaling.type",
                        other,
                        "supported: none, linear, and llama3-style rope_freqs",
                    ));
                }
            }
        };
        let rms_eps = r
            .f32_opt("attention.layer_norm_rms_epsilon")?
            .unwrap_or(1e-5);
        let embd = f
            .tensor("token_embd.weight")
            .ok_or_else(|| ConfigError::MissingTensor {
                path: path.clone(),
                name: "token_embd.weight".into(),
            })?;
        let vocab_size = match r.usize_opt("vocab_size")? {
            Some(v) => v,
            None => embd.dims.get(1).copied().unwrap_or(0) as usize,
        };
        let train_ctx = r.usize_opt("context_length")?.unwrap_or(2048);
        Ok(ModelConfig {
            arch,
            arch_name,
            n_layers,
            dim,
            ffn_dim,
            n_heads,
            n_kv_heads,
            head_dim,
            n_rot,
            rope_base,
            rope_scaling,
            rms_eps,
            vocab_size,
            train_ctx,
            tied_embeddings: f.tensor("output.weight").is_none(),
        })
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// The tensors (name, GGML-order shape, required) outside the layers.
    fn global_tensors(&self) -> Vec<(String, Vec<u64>, bool)> {
        let (d, v) = (self.dim as u64, self.vocab_size as u64);
        let mut t = vec![
            ("token_embd.weight".to_string(), vec![d, v], true),
            ("output_norm.weight".to_string(), vec![d], true),
            (
                "output.weight".to_string(),
                vec![d, v],
                !self.tied_embeddings,
            ),
        ];
        if self.rope_scaling == RopeScaling::FreqFactors {
            t.push((
                "rope_freqs.weight".into(),
                vec![self.n_rot as u64 / 2],
                true,
            ));
        }
        t
    }

    /// The tensors of layer `l`.
    fn layer_tensors(&self, l: usize) -> [(String, Vec<u64>, bool); 12] {
        let (d, q, kv, ff) = (
            self.dim as u64,
            self.q_dim() as u64,
            self.kv_dim() as u64,
            self.ffn_dim as u64,
        );
        let bias = self.arch == Arch::Qwen2;
        let b = |s: &str| format!("blk.{l}.{s}");
        [
            (b("attn_norm.weight"), vec![d], true),
            (b("attn_q.weight"), vec![d, q], true),
            (b("attn_k.weight"), vec![d, kv], true),
            (b("attn_v.weight"), vec![d, kv], true),
            (b("attn_output.weight"), vec![q, d], true),
            (b("attn_q.bias"), vec![q], bias),
            (b("attn_k.bias"), vec![kv], bias),
            (b("attn_v.bias"), vec![kv], bias),
            (b("ffn_norm.weight"), vec![d], true),
            (b("ffn_gate.weight"), vec![d, ff], true),
            (b("ffn_up.weight"), vec![d, ff], true),
            (b("ffn_down.weight"), vec![ff, d], true),
        ]
    }

    /// Checks that every tensor the architecture needs is there with the right shape.
    pub fn check_tensors(&self, f: &GgufFile) -> Result<(), ConfigError> {
        // Layer by layer, so that a hostile block count fails at the first missing tensor instead
        // of first listing millions of names.
        let layers = (0..self.n_layers).flat_map(|l| self.layer_tensors(l));
        for (name, expected, required) in self.global_tensors().into_iter().chain(layers) {
            match f.tensor(&name) {
                None if required => {
                    return Err(ConfigError::MissingTensor {
                        path: f.path().to_path_buf(),
                        name,
                    });
                }
                None => {}
                Some(t) if t.dims != expected => {
                    return Err(ConfigError::BadShape {
                        path: f.path().to_path_buf(),
                        name,
                        got: t.dims.clone(),
                        expected,
                    });
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}
