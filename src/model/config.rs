//! Model hyperparameters, read from a GGUF file's `{arch}.*` metadata.
//!
//! (Over 700 lines on purpose: every architecture's keys, their defaults and their refusals are
//! one table read top to bottom against llama.cpp's loader; splitting it per architecture would
//! scatter the shared keys.)

use std::path::PathBuf;

use crate::model::gguf::GgufFile;

/// The architectures the forward pass implements (each as llama.cpp builds its graph:
/// `src/models/<arch>.cpp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// llama, Mistral (as converted by llama.cpp), SmolLM, TinyLlama, …
    Llama,
    /// Qwen2 / Qwen2.5: llama with q/k/v biases and NeoX RoPE.
    Qwen2,
    /// Qwen3 (dense): Qwen2 without biases, with an RMS norm of each query and key head.
    Qwen3,
    /// Gemma 2: embedding × √d, norms after attention and after the FFN as well as before,
    /// GELU gate, soft-capped attention and output logits, every other layer sliding-window.
    Gemma2,
    /// Gemma 3 (text): Gemma 2's block with per-head Q/K norms instead of attention soft-capping,
    /// five sliding-window layers to one global, local layers on their own RoPE base.
    Gemma3,
    /// Phi-3 / Phi-4-mini: llama with fused QKV and gate-up tensors and LongRoPE factors.
    Phi3,
    /// Qwen3 MoE (Qwen3-30B-A3B): Qwen3's attention, a mixture of experts for every FFN.
    Qwen3Moe,
    /// OpenAI gpt-oss (llama.cpp's `openai-moe`): biased Q/K/V/O, attention sinks, every other
    /// layer sliding-window (the even ones), YaRN RoPE, and a biased mixture of experts with
    /// softmax-after-top-k routing and the clamped SwiGLU.
    GptOss,
}

impl Arch {
    pub fn from_name(name: &str) -> Option<Arch> {
        match name {
            "llama" | "mistral" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "gemma2" => Some(Arch::Gemma2),
            "gemma3" => Some(Arch::Gemma3),
            "phi3" => Some(Arch::Phi3),
            "qwen3moe" => Some(Arch::Qwen3Moe),
            "gpt-oss" => Some(Arch::GptOss),
            _ => None,
        }
    }

    /// NeoX RoPE rotates pairs (i, i + n_rot/2); "normal" RoPE rotates adjacent pairs. llama.cpp's
    /// `llama_model_rope_type` is the authority on which architecture uses which.
    pub fn neox_rope(self) -> bool {
        !matches!(self, Arch::Llama)
    }

    /// Gemma's block: embedding scale, post-attention and post-FFN norms, GELU gate.
    pub fn gemma(self) -> bool {
        matches!(self, Arch::Gemma2 | Arch::Gemma3)
    }

    /// Per-head RMS norms of the queries and keys before RoPE.
    pub fn qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3)
    }

    /// Why shifting the KV cache (moving keys and re-rotating them) would not give what a
    /// recompute gives for this architecture, if it would not: sliding-window layers (their
    /// window moves with the positions) or position-dependent attention beyond RoPE. Every
    /// architecture answers explicitly, so a new one must decide.
    pub fn kv_shift_inexact(self) -> Option<&'static str> {
        match self {
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Phi3 => None,
            Arch::Gemma2 | Arch::Gemma3 | Arch::GptOss => Some(
                "sliding-window layers keep only their window, and their windows move with the positions",
            ),
        }
    }

    /// Why the GPU backends cannot run this architecture yet, if they cannot (the model then
    /// runs on the CPU backend; `--backend auto` falls back to it). Every architecture answers
    /// explicitly, so a new one must decide.
    pub fn gpu_unsupported(self) -> Option<&'static str> {
        match self {
            Arch::Llama
            | Arch::Qwen2
            | Arch::Qwen3
            | Arch::Qwen3Moe
            | Arch::Gemma2
            | Arch::Gemma3
            | Arch::Phi3
            | Arch::GptOss => None,
        }
    }
}

/// The feed-forward gate's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnAct {
    /// silu(gate) · up.
    Silu,
    /// gelu(gate) · up, GELU in its tanh form (Gemma).
    GeluTanh,
}

/// A mixture-of-experts feed-forward (llama.cpp's `build_moe_ffn` as the llama family and
/// qwen3moe call it): a router `ffn_gate_inp` picks `n_used` of `n_expert` experts per token by
/// softmax and top-k, their weights normalized to sum 1; each expert is a SwiGLU FFN of width
/// `ffn_dim`, stored as the 3-D tensors `ffn_{gate,up,down}_exps`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moe {
    pub n_expert: usize,
    pub n_used: usize,
    /// Each expert's hidden width (`expert_feed_forward_length`, else `feed_forward_length`).
    pub ffn_dim: usize,
    /// gpt-oss's experts: biases on the router and on every expert product, the softmax taken
    /// over the chosen experts' logits (`LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT`), the
    /// clamped SwiGLU (`LLM_FFN_SWIGLU_OAI_MOE`).
    pub oai: bool,
}

pub use crate::gpu::backend::MAX_EXPERTS;

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
    /// Phi-3 LongRoPE ("su"): per-dimension factors from `rope_factors_short.weight` when the
    /// context is at most `original_ctx` (`rope.scaling.original_context_length`), else from
    /// `rope_factors_long.weight`, as llama.cpp's `get_rope_factors` chooses.
    LongRope {
        original_ctx: usize,
    },
    /// YaRN (`rope.scaling.type = yarn`, gpt-oss): positions divided by `factor` in the
    /// low-frequency dimensions, kept in the high-frequency ones, blended between by ggml's ramp
    /// over the correction dimensions of the `original_ctx` (`rope.scaling.original_context_length`)
    /// with beta_fast 32 and beta_slow 1 (llama.cpp's defaults, which it does not read from the
    /// file); cosines and sines scaled by 1 + 0.1·ln(factor).
    Yarn {
        factor: f32,
        original_ctx: usize,
    },
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
    /// The feed-forward gate's activation.
    pub ffn_act: FfnAct,
    /// Multiplies the token embeddings (Gemma: √d).
    pub embed_scale: Option<f32>,
    /// Multiplies q·k (1/√head_dim, or Gemma's `query_pre_attn_scalar` as llama.cpp derives it).
    pub attn_scale: f32,
    /// Attention logit soft-capping (Gemma 2's `attn_logit_softcapping`).
    pub attn_softcap: Option<f32>,
    /// Output logit soft-capping (`final_logit_softcapping`).
    pub final_softcap: Option<f32>,
    /// The window of the sliding-window layers (`attention.sliding_window`); 0 when none.
    pub sliding_window: usize,
    /// Per layer: a sliding-window layer (llama.cpp's `is_swa`).
    pub swa_layers: Vec<bool>,
    /// RoPE base and position scale of the sliding-window layers (Gemma 3: 10000 and 1,
    /// `rope.freq_base_swa` where written; Gemma 2: the global ones).
    pub rope_base_swa: f32,
    pub rope_freq_scale_swa: f32,
    /// Multiplies RoPE's cosines and sines (`rope.scaling.attn_factor`, Phi-3 128k).
    pub rope_attn_factor: f32,
    /// Q, K and V in one `attn_qkv.weight` (Phi-3), rows in that order.
    pub fused_qkv: bool,
    /// Gate and up in one `ffn_up.weight` of twice the width, gate rows first (Phi-3).
    pub fused_gate_up: bool,
    /// The feed-forward is a mixture of experts (Mixtral-style llama, qwen3moe).
    pub moe: Option<Moe>,
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
        "{path}: architecture {arch:?} is not supported (supported: llama, mistral, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3, gpt-oss and their fine-tunes such as SmolLM and Mixtral)"
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

    /// A count that may be 0 (Phi-3 writes `attention.sliding_window = 0` for "none").
    fn count_opt(&self, suffix: &str) -> Result<Option<usize>, ConfigError> {
        let key = self.key(suffix);
        match self.f.get(&key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n < (1 << 31) => Ok(Some(n as usize)),
                _ => Err(ConfigError::Invalid {
                    path: self.path(),
                    key,
                    value: v.summary(),
                    why: "expected an integer below 2^31".into(),
                }),
            },
        }
    }

    /// llama.cpp's `load_swa_pattern`: `attention.sliding_window_pattern` as one flag per layer,
    /// or as n (layer l is local unless l % n == n − 1; 0: every layer), else `default_n`.
    fn swa_pattern(&self, n_layers: usize, default_n: usize) -> Result<Vec<bool>, ConfigError> {
        let suffix = "attention.sliding_window_pattern";
        if let Some(crate::model::gguf::Value::Array(a)) = self.f.get(&self.key(suffix)) {
            let flags: Option<Vec<bool>> = a.items.iter().map(|v| v.as_bool()).collect();
            return match flags {
                Some(f) if f.len() == n_layers => Ok(f),
                _ => Err(self.invalid(
                    suffix,
                    format!("an array of {}", a.items.len()),
                    &format!("expected {n_layers} booleans, one per layer"),
                )),
            };
        }
        let n = self.count_opt(suffix)?.unwrap_or(default_n);
        Ok((0..n_layers).map(|l| n == 0 || l % n < n - 1).collect())
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

    /// The mixture of experts, as llama.cpp's `load_hparams` and the architecture's tensors read
    /// it: `expert_count` and `expert_used_count` (one number for every layer); llama is MoE when
    /// it has experts, qwen3moe always.
    fn moe(&self, arch: Arch, ffn_dim: usize) -> Result<Option<Moe>, ConfigError> {
        let n_expert = self.count_opt("expert_count")?.unwrap_or(0);
        let used_key = "expert_used_count";
        let n_used = match self.f.get(&self.key(used_key)) {
            Some(crate::model::gguf::Value::Array(a)) => {
                return Err(self.invalid(
                    used_key,
                    format!("an array of {}", a.items.len()),
                    "a count per layer is not supported; expected one number",
                ));
            }
            _ => self.count_opt(used_key)?.unwrap_or(0),
        };
        match arch {
            Arch::Llama | Arch::Qwen3Moe | Arch::GptOss => {}
            _ => return Ok(None),
        }
        if n_expert == 0 {
            return match arch {
                Arch::Qwen3Moe | Arch::GptOss => Err(ConfigError::Missing {
                    path: self.path(),
                    key: self.key("expert_count"),
                }),
                _ => Ok(None),
            };
        }
        if n_expert > MAX_EXPERTS {
            return Err(self.invalid(
                "expert_count",
                n_expert,
                &format!("at most {MAX_EXPERTS} experts are supported (llama.cpp's limit)"),
            ));
        }
        if n_used == 0 || n_used > n_expert {
            return Err(self.invalid(
                used_key,
                n_used,
                &format!("must be between 1 and the expert count {n_expert}"),
            ));
        }
        let ffn_dim = match arch {
            Arch::Qwen3Moe => match self.usize_opt("expert_feed_forward_length")? {
                Some(n) => n,
                None => ffn_dim / n_used,
            },
            // llama.cpp reads `expert_feed_forward_length` as required for openai-moe.
            Arch::GptOss => self.usize("expert_feed_forward_length")?,
            _ => ffn_dim,
        };
        if ffn_dim == 0 {
            return Err(self.invalid(
                "feed_forward_length",
                ffn_dim * n_used,
                "leaves experts of width 0",
            ));
        }
        Ok(Some(Moe {
            n_expert,
            n_used,
            ffn_dim,
            oai: arch == Arch::GptOss,
        }))
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

impl RopeScaling {
    /// ggml's `freq_scale`: 1 / the factor of linear and YaRN scaling, else 1.
    pub fn freq_scale(self) -> f32 {
        match self {
            RopeScaling::Linear { factor } | RopeScaling::Yarn { factor, .. } => 1.0 / factor,
            _ => 1.0,
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
        let long_rope = ["rope_factors_long.weight", "rope_factors_short.weight"]
            .map(|n| f.tensor(n).is_some());
        let rope_scaling = if f.tensor("rope_freqs.weight").is_some() {
            RopeScaling::FreqFactors
        } else if long_rope.contains(&true) {
            RopeScaling::LongRope {
                original_ctx: match r.usize_opt("rope.scaling.original_context_length")? {
                    Some(n) => n,
                    None => r.usize_opt("context_length")?.unwrap_or(2048),
                },
            }
        } else {
            match f.get_str(&r.key("rope.scaling.type")) {
                None | Some("none") => RopeScaling::None,
                Some("linear") => {
                    let factor = r.f32_opt("rope.scaling.factor")?.unwrap_or(1.0);
                    RopeScaling::Linear { factor }
                }
                Some("yarn") => RopeScaling::Yarn {
                    factor: r.f32_opt("rope.scaling.factor")?.unwrap_or(1.0),
                    // llama.cpp's `n_ctx_orig_yarn`: this key, else the trained context.
                    original_ctx: match r.usize_opt("rope.scaling.original_context_length")? {
                        Some(n) => n,
                        None => r.usize_opt("context_length")?.unwrap_or(2048),
                    },
                },
                Some(other) => {
                    return Err(r.invalid(
                        "rope.scaling.type",
                        other,
                        "supported: none, linear, yarn, llama3-style rope_freqs and Phi-3 rope_factors_short/long",
                    ));
                }
            }
        };
        let rope_attn_factor = r.f32_opt("rope.scaling.attn_factor")?.unwrap_or(1.0);
        // What each architecture's `load_arch_hparams` in llama.cpp reads, with its defaults.
        let (mut sliding_window, mut swa_layers) = (0, vec![false; n_layers]);
        let (mut attn_softcap, mut final_softcap) = (None, None);
        let mut rope_base_swa = rope_base;
        let mut rope_freq_scale_swa = rope_scaling.freq_scale();
        match arch {
            Arch::Gemma2 => {
                sliding_window = r.usize_opt("attention.sliding_window")?.unwrap_or(4096);
                swa_layers = r.swa_pattern(n_layers, 2)?;
                attn_softcap = Some(r.f32_opt("attn_logit_softcapping")?.unwrap_or(50.0));
                final_softcap = Some(r.f32_opt("final_logit_softcapping")?.unwrap_or(30.0));
                rope_base_swa = r.f32_opt("rope.freq_base_swa")?.unwrap_or(rope_base);
            }
            Arch::Gemma3 => {
                if let Some(w) = r.count_opt("attention.sliding_window")?
                    && w > 0
                {
                    sliding_window = w;
                    swa_layers = r.swa_pattern(n_layers, 6)?;
                    rope_base_swa = r.f32_opt("rope.freq_base_swa")?.unwrap_or(10000.0);
                    rope_freq_scale_swa = 1.0;
                }
                final_softcap = r.f32_opt("final_logit_softcapping")?;
            }
            // llama.cpp reads Phi-3's `attention.sliding_window` and then turns sliding-window
            // attention off for every layer (ggml-org/llama.cpp#13676): so does hipscope, so that
            // the two compute the same model.
            Arch::Phi3 => {
                r.count_opt("attention.sliding_window")?;
            }
            // llama.cpp's `llama_model_openai_moe::load_arch_hparams`: the window is required,
            // the pattern defaults to 2 (even layers sliding).
            Arch::GptOss => {
                sliding_window = r.usize("attention.sliding_window")?;
                swa_layers = r.swa_pattern(n_layers, 2)?;
                rope_base_swa = r.f32_opt("rope.freq_base_swa")?.unwrap_or(rope_base);
            }
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => {}
        }
        let moe = r.moe(arch, ffn_dim)?;
        if !swa_layers.contains(&true) {
            sliding_window = 0;
        }
        // Gemma scales queries by 1/√query_pre_attn_scalar, which llama.cpp does not read from
        // the file: 1/√(d / heads) for the 27B models (told apart by their layer count), else
        // 1/√key_length.
        let big_gemma = matches!((arch, n_layers), (Arch::Gemma2, 46) | (Arch::Gemma3, 62));
        let attn_scale = if big_gemma {
            1.0 / ((dim / n_heads) as f32).sqrt()
        } else if arch == Arch::GptOss {
            // openai-moe.cpp: 1/√n_rot.
            1.0 / (n_rot as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
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
            // llama.cpp loads gpt-oss's `output.weight` as required: never tied.
            tied_embeddings: arch != Arch::GptOss && f.tensor("output.weight").is_none(),
            ffn_act: if arch.gemma() {
                FfnAct::GeluTanh
            } else {
                FfnAct::Silu
            },
            embed_scale: arch.gemma().then(|| (dim as f32).sqrt()),
            attn_scale,
            attn_softcap,
            final_softcap,
            sliding_window,
            swa_layers,
            rope_base_swa,
            rope_freq_scale_swa,
            rope_attn_factor,
            fused_qkv: arch == Arch::Phi3 && f.tensor("blk.0.attn_qkv.weight").is_some(),
            fused_gate_up: arch == Arch::Phi3 && f.tensor("blk.0.ffn_gate.weight").is_none(),
            moe,
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
        let pairs = vec![self.n_rot as u64 / 2];
        match self.rope_scaling {
            RopeScaling::FreqFactors => t.push(("rope_freqs.weight".into(), pairs, true)),
            RopeScaling::LongRope { .. } => {
                t.push(("rope_factors_long.weight".into(), pairs.clone(), true));
                t.push(("rope_factors_short.weight".into(), pairs, true));
            }
            RopeScaling::None | RopeScaling::Linear { .. } | RopeScaling::Yarn { .. } => {}
        }
        t
    }

    /// The tensors of layer `l`.
    fn layer_tensors(&self, l: usize) -> Vec<(String, Vec<u64>, bool)> {
        let (d, q, kv, ff, hd) = (
            self.dim as u64,
            self.q_dim() as u64,
            self.kv_dim() as u64,
            self.ffn_dim as u64,
            self.head_dim as u64,
        );
        let oss = self.arch == Arch::GptOss;
        let bias = self.arch == Arch::Qwen2 || oss;
        let b = |s: &str| format!("blk.{l}.{s}");
        let mut t = vec![(b("attn_norm.weight"), vec![d], true)];
        if self.fused_qkv {
            t.push((b("attn_qkv.weight"), vec![d, q + 2 * kv], true));
        } else {
            t.push((b("attn_q.weight"), vec![d, q], true));
            t.push((b("attn_k.weight"), vec![d, kv], true));
            t.push((b("attn_v.weight"), vec![d, kv], true));
        }
        t.extend([
            (b("attn_output.weight"), vec![q, d], true),
            (b("attn_q.bias"), vec![q], bias),
            (b("attn_k.bias"), vec![kv], bias),
            (b("attn_v.bias"), vec![kv], bias),
        ]);
        if oss {
            // The FFN's norm is the file's `post_attention_norm` (llama.cpp's `attn_post_norm`).
            t.extend([
                (b("attn_output.bias"), vec![d], true),
                (b("attn_sinks.weight"), vec![self.n_heads as u64], true),
                (b("post_attention_norm.weight"), vec![d], true),
            ]);
        } else {
            t.push((b("ffn_norm.weight"), vec![d], true));
        }
        if let Some(m) = self.moe {
            let (ne, eff) = (m.n_expert as u64, m.ffn_dim as u64);
            t.extend([
                (b("ffn_gate_inp.weight"), vec![d, ne], true),
                (b("ffn_gate_exps.weight"), vec![d, eff, ne], true),
                (b("ffn_up_exps.weight"), vec![d, eff, ne], true),
                (b("ffn_down_exps.weight"), vec![eff, d, ne], true),
            ]);
            if m.oai {
                t.extend([
                    (b("ffn_gate_inp.bias"), vec![ne], true),
                    (b("ffn_gate_exps.bias"), vec![eff, ne], true),
                    (b("ffn_up_exps.bias"), vec![eff, ne], true),
                    (b("ffn_down_exps.bias"), vec![d, ne], true),
                ]);
            }
        } else if self.fused_gate_up {
            t.push((b("ffn_up.weight"), vec![d, 2 * ff], true));
        } else {
            t.push((b("ffn_gate.weight"), vec![d, ff], true));
            t.push((b("ffn_up.weight"), vec![d, ff], true));
        }
        if self.moe.is_none() {
            t.push((b("ffn_down.weight"), vec![ff, d], true));
        }
        if self.arch.qk_norm() {
            t.push((b("attn_q_norm.weight"), vec![hd], true));
            t.push((b("attn_k_norm.weight"), vec![hd], true));
        }
        if self.arch.gemma() {
            t.push((b("post_attention_norm.weight"), vec![d], true));
            t.push((b("post_ffw_norm.weight"), vec![d], true));
        }
        t
    }

    /// Whether layer `l` is a sliding-window layer.
    pub fn is_swa(&self, l: usize) -> bool {
        self.sliding_window > 0 && self.swa_layers.get(l).copied().unwrap_or(false)
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
