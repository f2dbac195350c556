//! The llama-family forward pass, written once over [`Backend`].
//!
//! ```text
//! x = embed(tokens)
//! per layer: x += Wo · attn(rope(Wq·norm(x)), rope(Wk·norm(x)), Wv·norm(x))
//!            x += Wdown · (silu(Wgate·norm(x)) * Wup·norm(x))
//! logits = Wout · norm(x)
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::gpu::backend::{
    AttnParams, Backend, BackendError, Buf, KvShift, MemoryPlan, OpLabel, RopeParams, SharedBytes,
    Weight, WeightData,
};
use crate::gpu::fault::{self, Phase, STUCK_BUDGET};
use crate::gpu::quant;
use crate::model::config::{ConfigError, ModelConfig, RopeScaling};
use crate::model::gguf::GgufFile;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{path}: tensor {tensor}: {message}")]
    Tensor {
        path: String,
        tensor: String,
        message: String,
    },
    #[error("{0}")]
    Backend(#[from] BackendError),
    #[error("positions {start}..{end} exceed the context of {n_ctx} tokens")]
    ContextFull {
        start: usize,
        end: usize,
        n_ctx: usize,
    },
    #[error(transparent)]
    FileChanged(#[from] crate::model::gguf::GgufError),
    /// The interrupt flag was raised (a stop or a quit) between two batches or two layers.
    #[error("stopped")]
    Interrupted,
}

/// Which logits a forward call returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// The last token's only (generation).
    Last,
    /// Every token's, row after row (perplexity).
    All,
}

/// How a model is set up on its backend.
#[derive(Clone, Copy, Debug)]
pub struct ModelOptions {
    /// KV cache positions.
    pub n_ctx: usize,
    /// Most tokens per forward step (prompts are processed in batches of this size).
    pub n_batch: usize,
    /// Room for every token's logits (perplexity), not just the last one's.
    pub all_logits: bool,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            n_ctx: 4096,
            n_batch: 512,
            all_logits: false,
        }
    }
}

struct LayerWeights {
    attn_norm: Weight,
    wq: Weight,
    wk: Weight,
    wv: Weight,
    wo: Weight,
    bq: Option<Weight>,
    bk: Option<Weight>,
    bv: Option<Weight>,
    ffn_norm: Weight,
    gate: Weight,
    up: Weight,
    down: Weight,
}

struct Activations {
    x: Buf,
    xn: Buf,
    q: Buf,
    k: Buf,
    v: Buf,
    att: Buf,
    proj: Buf,
    gate: Buf,
    up: Buf,
    last: Buf,
    logits: Buf,
}

/// A model loaded on a backend, ready to run.
pub struct Model {
    pub config: ModelConfig,
    pub options: ModelOptions,
    file: Arc<GgufFile>,
    backend: Box<dyn Backend>,
    tok_embd: Weight,
    output_norm: Weight,
    output: Weight,
    layers: Vec<LayerWeights>,
    rope: RopeParams,
    act: Activations,
    /// Raised from another thread to stop a forward call between prompt batches and between
    /// layers, so that a stop or a quit during a long prompt takes effect within one layer.
    interrupt: Arc<AtomicBool>,
    /// Logits rows the `logits` buffer holds: 1, or `n_batch` with `all_logits`.
    logits_rows: usize,
    load_time: Duration,
}

impl Model {
    /// Checks the file against its architecture, hands every weight to the backend and allocates
    /// the KV cache and activations. `progress(fraction, tensor)` is called as weights load.
    pub fn load(
        file: Arc<GgufFile>,
        mut backend: Box<dyn Backend>,
        options: ModelOptions,
        progress: &mut dyn FnMut(f32, &str),
    ) -> Result<Model, ModelError> {
        let t0 = Instant::now();
        crate::gpu::fatal_signal::note_mapped_file(file.path());
        let config = ModelConfig::from_gguf(&file)?;
        config.check_tensors(&file)?;
        let n_ctx = options.n_ctx.max(1);
        let n_batch = options.n_batch.clamp(1, n_ctx);
        let b = n_batch;
        let logits_rows = if options.all_logits { b } else { 1 };
        let act_elems = [
            b * config.dim * 3,
            b * config.q_dim() * 2,
            b * config.kv_dim() * 2,
            b * config.ffn_dim * 2,
            config.dim,
            logits_rows * config.vocab_size,
        ]
        .iter()
        .sum::<usize>() as u64;
        backend.plan(&MemoryPlan {
            weights: file.tensors().iter().map(|t| t.size).sum(),
            weight_tensors: file.tensors().len(),
            activation_elems: act_elems,
            kv_elems: (config.n_layers * n_ctx * config.kv_dim()) as u64,
            n_batch,
            max_cols: config.dim.max(config.q_dim()).max(config.ffn_dim),
            vector_elems: file
                .tensors()
                .iter()
                .filter(|t| t.rows_cols().0 == 1)
                .map(|t| t.rows_cols().1 as u64)
                .sum(),
        })?;
        let storage: SharedBytes = file.clone();
        let path = file.path().display().to_string();
        let total: u64 = file.tensors().iter().map(|t| t.size).sum::<u64>().max(1);
        let mut done = 0u64;
        let mut load = |name: &str| -> Result<Weight, ModelError> {
            let t = file
                .tensor(name)
                .ok_or_else(|| ModelError::Tensor {
                    path: path.clone(),
                    tensor: name.into(),
                    message: "missing".into(),
                })?
                .clone();
            if !quant::is_supported(t.ty) {
                return Err(ModelError::Tensor {
                    path: path.clone(),
                    tensor: name.into(),
                    message: format!(
                        "type {} is not supported by this engine (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)",
                        t.ty
                    ),
                });
            }
            let (rows, cols) = t.rows_cols();
            let data = WeightData {
                name,
                ty: t.ty,
                rows,
                cols,
                storage: &storage,
                offset: (file.data_offset() + t.offset) as usize,
                len: t.size as usize,
            };
            let w = backend.load_weight(&data).map_err(|e| ModelError::Tensor {
                path: path.clone(),
                tensor: name.into(),
                message: e.to_string(),
            })?;
            done += t.size;
            progress(done as f32 / total as f32, name);
            Ok(w)
        };
        let tok_embd = load("token_embd.weight")?;
        let mut layers = Vec::with_capacity(config.n_layers);
        for l in 0..config.n_layers {
            let n = |s: &str| format!("blk.{l}.{s}");
            let opt = |s: &str| file.tensor(&n(s)).map(|_| n(s));
            let (bq, bk, bv) = (opt("attn_q.bias"), opt("attn_k.bias"), opt("attn_v.bias"));
            layers.push(LayerWeights {
                attn_norm: load(&n("attn_norm.weight"))?,
                wq: load(&n("attn_q.weight"))?,
                wk: load(&n("attn_k.weight"))?,
                wv: load(&n("attn_v.weight"))?,
                wo: load(&n("attn_output.weight"))?,
                bq: bq.map(|b| load(&b)).transpose()?,
                bk: bk.map(|b| load(&b)).transpose()?,
                bv: bv.map(|b| load(&b)).transpose()?,
                ffn_norm: load(&n("ffn_norm.weight"))?,
                gate: load(&n("ffn_gate.weight"))?,
                up: load(&n("ffn_up.weight"))?,
                down: load(&n("ffn_down.weight"))?,
            });
        }
        let output_norm = load("output_norm.weight")?;
        let output = if config.tied_embeddings {
            tok_embd
        } else {
            load("output.weight")?
        };
        let freq_factors = match config.rope_scaling {
            RopeScaling::FreqFactors => Some(load("rope_freqs.weight")?),
            _ => None,
        };
        let rope = RopeParams {
            n_rot: config.n_rot,
            base: config.rope_base,
            freq_scale: match config.rope_scaling {
                RopeScaling::Linear { factor } => 1.0 / factor,
                _ => 1.0,
            },
            neox: config.arch.neox_rope(),
            freq_factors,
        };
        if fault::hang_now(Phase::Load) {
            backend.stuck_op(
                OpLabel::global("load · stuck op (HIPSCOPE_FAULT)"),
                STUCK_BUDGET,
            )?;
        }
        backend.alloc_kv_cache(config.n_layers, n_ctx, config.kv_dim())?;
        let act = Activations {
            x: backend.alloc("x", b * config.dim)?,
            xn: backend.alloc("x_norm", b * config.dim)?,
            q: backend.alloc("q", b * config.q_dim())?,
            k: backend.alloc("k", b * config.kv_dim())?,
            v: backend.alloc("v", b * config.kv_dim())?,
            att: backend.alloc("attn_out", b * config.q_dim())?,
            proj: backend.alloc("proj", b * config.dim)?,
            gate: backend.alloc("ffn_gate", b * config.ffn_dim)?,
            up: backend.alloc("ffn_up", b * config.ffn_dim)?,
            last: backend.alloc("last", config.dim)?,
            logits: backend.alloc("logits", logits_rows * config.vocab_size)?,
        };
        Ok(Model {
            config,
            options: ModelOptions {
                n_ctx,
                n_batch,
                all_logits: options.all_logits,
            },
            file,
            backend,
            tok_embd,
            output_norm,
            output,
            layers,
            rope,
            act,
            interrupt: Arc::new(AtomicBool::new(false)),
            logits_rows,
            load_time: t0.elapsed(),
        })
    }

    /// Shares the flag that stops a forward call between batches and between layers (it then
    /// returns [`ModelError::Interrupted`]); whoever raises it lowers it before the next request.
    pub fn set_interrupt(&mut self, flag: Arc<AtomicBool>) {
        self.interrupt = flag;
    }

    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// The backend, for its shutdown at quit.
    pub fn backend_mut(&mut self) -> &mut dyn Backend {
        self.backend.as_mut()
    }

    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    pub fn n_ctx(&self) -> usize {
        self.options.n_ctx
    }

    /// Moves cache positions `src..src + n` down to `dst..dst + n` in every layer and re-rotates
    /// their keys, so that they stand where a recompute of the shortened sequence would put them
    /// (the context shift). An error where the architecture makes that inexact
    /// ([`crate::model::config::Arch::kv_shift_inexact`]): the caller recomputes instead.
    pub fn shift_kv(&mut self, dst: usize, src: usize, n: usize) -> Result<(), ModelError> {
        if let Some(why) = self.config.arch.kv_shift_inexact() {
            return Err(ModelError::Backend(BackendError::Unsupported(format!(
                "a KV shift is not exact here: {why}"
            ))));
        }
        if src + n > self.options.n_ctx {
            return Err(ModelError::ContextFull {
                start: src,
                end: src + n,
                n_ctx: self.options.n_ctx,
            });
        }
        self.backend.kv_shift(&KvShift {
            dst,
            src,
            n,
            n_kv_heads: self.config.n_kv_heads,
            head_dim: self.config.head_dim,
            rope: self.rope,
        })?;
        Ok(())
    }

    /// Most tokens one `forward` call runs through the layers at once.
    pub fn n_batch(&self) -> usize {
        self.options.n_batch
    }

    /// Runs `tokens` at positions `pos0..` (their keys and values enter the cache there) and
    /// returns the requested logits in `out` (replaced): `vocab` floats for `Logits::Last`,
    /// `tokens.len() * vocab` for `Logits::All`.
    pub fn forward(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        want: Logits,
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let end = pos0 + tokens.len();
        if end > self.options.n_ctx {
            return Err(ModelError::ContextFull {
                start: pos0,
                end,
                n_ctx: self.options.n_ctx,
            });
        }
        // A model file changed under the map would fault on the next page read (item 11).
        self.file.check_unchanged()?;
        let vocab = self.config.vocab_size;
        out.clear();
        if want == Logits::All {
            out.reserve(tokens.len() * vocab);
        }
        let mut start = 0;
        while start < tokens.len() {
            if self.interrupt.load(Ordering::Relaxed) {
                return Err(ModelError::Interrupted);
            }
            let n = (tokens.len() - start).min(self.options.n_batch);
            let batch = &tokens[start..start + n];
            let last_batch = start + n == tokens.len();
            self.layers_forward(batch, pos0 + start)?;
            match want {
                Logits::All => {
                    let old = out.len();
                    out.resize(old + n * vocab, 0.0);
                    self.output_rows(n, &mut out[old..])?;
                }
                Logits::Last if last_batch => {
                    out.resize(vocab, 0.0);
                    let dim = self.config.dim;
                    let a = &self.act;
                    self.backend.copy(a.x, (n - 1) * dim, a.last, 0, dim)?;
                    self.backend.rms_norm(
                        a.last,
                        self.output_norm,
                        a.proj,
                        1,
                        dim,
                        self.config.rms_eps,
                        OpLabel::global("output_norm"),
                    )?;
                    self.backend.matmul(
                        self.output,
                        a.proj,
                        a.logits,
                        1,
                        OpLabel::global("output"),
                    )?;
                    self.backend.read(a.logits, 0, out)?;
                }
                Logits::Last => {}
            }
            start += n;
        }
        Ok(())
    }

    /// Logits for the first `n` rows of `x` into `out` (n × vocab).
    fn output_rows(&mut self, n: usize, out: &mut [f32]) -> Result<(), ModelError> {
        let dim = self.config.dim;
        if self.logits_rows < n {
            return Err(ModelError::Backend(BackendError::Invalid(format!(
                "logits for {n} tokens asked of a model loaded with room for {} (ModelOptions::all_logits)",
                self.logits_rows
            ))));
        }
        let a = &self.act;
        self.backend.rms_norm(
            a.x,
            self.output_norm,
            a.xn,
            n,
            dim,
            self.config.rms_eps,
            OpLabel::global("output_norm"),
        )?;
        self.backend
            .matmul(self.output, a.xn, a.logits, n, OpLabel::global("output"))?;
        self.backend.read(a.logits, 0, out)?;
        Ok(())
    }

    fn layers_forward(&mut self, tokens: &[u32], pos0: usize) -> Result<(), ModelError> {
        let c = &self.config;
        let n = tokens.len();
        let a = &self.act;
        let be = self.backend.as_mut();
        be.embed(self.tok_embd, tokens, a.x)?;
        let attn = AttnParams {
            layer: 0,
            n_tokens: n,
            pos0,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        };
        for (l, w) in self.layers.iter().enumerate() {
            if self.interrupt.load(Ordering::Relaxed) {
                return Err(ModelError::Interrupted);
            }
            let li = l as u32;
            let lab = |name| OpLabel::layer(li, name);
            let phase = if n > 1 { Phase::Prompt } else { Phase::Decode };
            if l == c.n_layers / 2 && fault::hang_now(phase) {
                be.stuck_op(lab("stuck op (HIPSCOPE_FAULT)"), STUCK_BUDGET)?;
            }
            be.rms_norm(
                a.x,
                w.attn_norm,
                a.xn,
                n,
                c.dim,
                c.rms_eps,
                lab("attn_norm"),
            )?;
            be.matmul_qkv(
                [w.wq, w.wk, w.wv],
                [w.bq, w.bk, w.bv],
                a.xn,
                [a.q, a.k, a.v],
                n,
                li,
            )?;
            be.rope_attention(
                a.q,
                a.k,
                a.v,
                a.att,
                &self.rope,
                &AttnParams { layer: l, ..attn },
            )?;
            be.matmul_add(
                w.wo,
                a.att,
                a.x,
                a.proj,
                n,
                c.dim,
                lab("attn_output"),
                lab("attn_residual"),
            )?;
            be.rms_norm(a.x, w.ffn_norm, a.xn, n, c.dim, c.rms_eps, lab("ffn_norm"))?;
            be.matmul_swiglu(w.gate, w.up, a.xn, a.gate, a.up, n, c.ffn_dim, li)?;
            be.matmul_add(
                w.down,
                a.gate,
                a.x,
                a.proj,
                n,
                c.dim,
                lab("ffn_down"),
                lab("ffn_residual"),
            )?;
        }
        Ok(())
    }
}
