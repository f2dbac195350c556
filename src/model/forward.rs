//! (Over 700 lines on purpose: the forward pass of every architecture, its buffers and its
//! batch groups in one file, so that a layer's sequence of ops reads top to bottom in one place;
//! the MoE feed-forward and the weight lookup are in `forward/`.)
//!
//! The forward pass of every supported architecture, written once over [`Backend`].
//!
//! ```text
//! x = embed(tokens) (· √d: Gemma)
//! per layer: q, k, v = Wq·norm(x), Wk·norm(x), Wv·norm(x)  (one fused matrix: Phi-3)
//!            q, k = headnorm(q), headnorm(k)                 (Qwen 3, Gemma 3)
//!            a = Wo · attn(rope(q), rope(k), v)               (sliding window, soft-cap: Gemma)
//!            x += a, or x += norm(a)                          (Gemma's post-attention norm)
//!            f = Wdown · (act(Wgate·norm(x)) * Wup·norm(x))   (act: silu, or GELU for Gemma)
//!            x += f, or x += norm(f)                          (Gemma's post-FFN norm)
//!            (MoE: f = Σ of the top-k routed experts' f, weighted: forward/moe.rs)
//! logits = Wout · norm(x) (soft-capped: Gemma 2)
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::gpu::backend::{
    AttnParams, Backend, BackendError, Buf, Glu, HeadNorms, KvLayout, KvShift, MemoryPlan, OpLabel,
    RopeParams, SeqPos, Weight, head_norms_separately,
};
use crate::gpu::fault::{self, Phase, STUCK_BUDGET};
use crate::gpu::rope::Yarn;
use crate::gpu::trace;
use crate::model::config::{ConfigError, FfnAct, ModelConfig, RopeScaling};
use crate::model::gguf::GgufFile;

mod moe;
mod weights;
use weights::LayerWeights;

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
    /// A sliding-window layer's ring no longer holds the window a token at `pos` needs (the
    /// cache was rolled back further than its rings reach): the sequence must be run again
    /// from its start ([`Model::kv_resume`] says where a run may resume).
    #[error(
        "position {pos}: the sliding-window layers no longer hold positions {need}.. (they keep {lo}..{end})"
    )]
    WindowLost {
        pos: usize,
        need: usize,
        lo: usize,
        end: usize,
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
    /// Sequences the KV cache holds, each of `n_ctx` positions (`hipscope serve`'s slots,
    /// run together by [`Model::forward_seqs`]); 1 for the chat.
    pub n_seq: usize,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            n_ctx: 4096,
            n_batch: 512,
            all_logits: false,
            n_seq: 1,
        }
    }
}

/// One sequence's part of a batch of several ([`Model::forward_seqs`]): `tokens` at positions
/// `pos0..` of sequence `seq`'s cache.
#[derive(Clone, Copy, Debug)]
pub struct SeqChunk<'a> {
    pub seq: usize,
    pub pos0: usize,
    pub tokens: &'a [u32],
    /// Whether the logits after its last token are wanted (a prompt's last chunk, a decode
    /// step).
    pub logits: bool,
}

/// A group of rows of a batch: one sequence's tokens, rows `row0..row0 + n` of the activations.
#[derive(Clone, Copy, Debug)]
struct Group {
    seq: usize,
    row0: usize,
    n: usize,
    pos0: usize,
}

/// Positions whose keys and values the sliding-window rings hold, `lo..end` (every layer of a
/// model without rings holds every position it was given).
#[derive(Clone, Copy, Debug, Default)]
struct RingSpan {
    lo: usize,
    end: usize,
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
    /// The mixture-of-experts scratch (MoE models only).
    moe: Option<moe::MoeBufs>,
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
    /// The sliding-window layers' RoPE (Gemma 3's local base).
    rope_swa: RopeParams,
    /// Positions each sliding-window layer's ring keeps (0: no rings).
    ring_slots: usize,
    /// What each sequence's rings hold.
    rings: Vec<RingSpan>,
    act: Activations,
    /// Raised from another thread to stop a forward call between prompt batches and between
    /// layers, so that a stop or a quit during a long prompt takes effect within one layer.
    interrupt: Arc<AtomicBool>,
    /// Logits rows the `logits` buffer holds: 1, or `n_batch` with `all_logits`.
    logits_rows: usize,
    load_time: Duration,
}

/// The KV cache's layout for a model: every layer the whole context, a sliding-window layer
/// its window plus a batch (the batch's first token still sees its whole window after the
/// batch's keys went in, llama.cpp's SWA cache size), for `n_seq` sequences.
pub fn kv_layout(
    config: &ModelConfig,
    n_ctx: usize,
    n_batch: usize,
    n_seq: usize,
) -> Result<KvLayout, BackendError> {
    let ring = (config.sliding_window + n_batch.max(1) - 1).min(n_ctx);
    let slots = (0..config.n_layers)
        .map(|l| if config.is_swa(l) { ring } else { n_ctx })
        .collect();
    KvLayout::new(n_ctx, config.kv_dim(), slots)?.with_seqs(n_seq)
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
        let _load = trace::slice(trace::TrackId::STEPS, "model load");
        let config = ModelConfig::from_gguf(&file)?;
        config.check_tensors(&file)?;
        let n_ctx = options.n_ctx.max(1);
        let n_batch = options.n_batch.clamp(1, n_ctx);
        let n_seq = options.n_seq.max(1);
        let b = n_batch;
        // A multi-sequence batch's logits: a row per sequence at most.
        let logits_rows = if options.all_logits { b } else { 1 }.max(n_seq);
        let act_elems = [
            b * config.dim * 3,
            b * config.q_dim() * 2,
            b * config.kv_dim() * 2,
            b * config.ffn_dim * 2,
            n_seq * config.dim,
            logits_rows * config.vocab_size,
            config.moe.map_or(0, |m| moe::elems(&m, b, config.dim)),
        ]
        .iter()
        .sum::<usize>() as u64;
        let kv_layout = kv_layout(&config, n_ctx, n_batch, n_seq)?;
        // The rings' positions (0: none).
        let ring_slots = (0..config.n_layers)
            .map(|l| kv_layout.slots(l))
            .filter(|&s| s < n_ctx)
            .min()
            .unwrap_or(0);
        // A fused tensor is loaded as one weight per part (rows of the same bytes).
        let extra_weights = config.n_layers
            * (2 * usize::from(config.fused_qkv) + usize::from(config.fused_gate_up));
        backend.plan(&MemoryPlan {
            weights: file.tensors().iter().map(|t| t.size).sum(),
            weight_tensors: file.tensors().len() + extra_weights,
            activation_elems: act_elems,
            kv_elems: kv_layout.elems() as u64,
            n_batch,
            max_cols: config
                .dim
                .max(config.q_dim())
                .max(config.ffn_dim)
                // A MoE layer's inputs as its experts take them: n_used rows per token.
                .max(
                    config
                        .moe
                        .map_or(0, |m| m.n_used * m.ffn_dim.max(config.dim)),
                ),
            vector_elems: file
                .tensors()
                .iter()
                .filter(|t| t.rows_cols().0 == 1)
                .map(|t| t.rows_cols().1 as u64)
                .sum(),
            n_seq,
            // A split model's GPU part sets its own (`split::gpu_plan_of`).
            stage_bytes: 0,
        })?;
        let weights::Weights {
            tok_embd,
            output_norm,
            output,
            layers,
            freq_factors,
        } = weights::load(&file, backend.as_mut(), &config, n_ctx, progress)?;
        // YaRN with llama.cpp's defaults: ext_factor 1, beta_fast 32, beta_slow 1.
        let yarn_for = |base: f32| match config.rope_scaling {
            RopeScaling::Yarn { original_ctx, .. } => {
                Some(Yarn::new(config.n_rot, original_ctx, base, 32.0, 1.0))
            }
            _ => None,
        };
        let rope = RopeParams {
            n_rot: config.n_rot,
            base: config.rope_base,
            freq_scale: config.rope_scaling.freq_scale(),
            neox: config.arch.neox_rope(),
            freq_factors,
            attn_factor: config.rope_attn_factor,
            yarn: yarn_for(config.rope_base),
        };
        if fault::hang_now(Phase::Load) {
            backend.stuck_op(
                OpLabel::global("load · stuck op (HIPSCOPE_FAULT)"),
                STUCK_BUDGET,
            )?;
        }
        let rope_swa = RopeParams {
            base: config.rope_base_swa,
            freq_scale: config.rope_freq_scale_swa,
            yarn: yarn_for(config.rope_base_swa),
            ..rope
        };
        backend.alloc_kv_cache(&kv_layout)?;
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
            last: backend.alloc("last", n_seq * config.dim)?,
            logits: backend.alloc("logits", logits_rows * config.vocab_size)?,
            moe: match &config.moe {
                Some(m) => Some(moe::alloc(backend.as_mut(), m, b, config.dim)?),
                None => None,
            },
        };
        Ok(Model {
            config,
            options: ModelOptions {
                n_ctx,
                n_batch,
                all_logits: options.all_logits,
                n_seq,
            },
            file,
            backend,
            tok_embd,
            output_norm,
            output,
            layers,
            rope,
            rope_swa,
            ring_slots,
            rings: vec![RingSpan::default(); n_seq],
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

    /// Where a run may resume if the cache is valid up to `pos`: `pos` itself, unless the
    /// sliding-window rings lost part of the window a token at `pos` needs (the cache was rolled
    /// back by more than a batch since those positions were written); then 0, a run from the
    /// start. A model without rings resumes anywhere.
    pub fn kv_resume(&self, pos: usize) -> usize {
        self.kv_resume_seq(0, pos)
    }

    /// [`Model::kv_resume`] for sequence `seq` of a multi-sequence cache.
    pub fn kv_resume_seq(&self, seq: usize, pos: usize) -> usize {
        if self.window_lost(seq, pos).is_some() {
            0
        } else {
            pos
        }
    }

    /// Products over fewer than `rows` rows give each row what it gets alone
    /// ([`crate::gpu::backend::Ops::set_exact_rows_below`]): a batched decode step of up to
    /// `rows - 1` sequences then answers each exactly as a single-sequence step would.
    pub fn set_exact_rows_below(&mut self, rows: usize) {
        self.backend.set_exact_rows_below(rows);
    }

    /// Sequences the KV cache holds ([`ModelOptions::n_seq`]).
    pub fn n_seq(&self) -> usize {
        self.options.n_seq
    }

    /// The first position a token of sequence `seq` at `pos` needs that its rings no longer
    /// hold, if any.
    fn window_lost(&self, seq: usize, pos: usize) -> Option<usize> {
        if self.ring_slots == 0 || pos == 0 {
            return None;
        }
        let ring = self.rings.get(seq).copied().unwrap_or_default();
        let need = (pos + 1).saturating_sub(self.config.sliding_window);
        (pos > ring.end || need < ring.lo).then_some(need)
    }

    /// Checks that `n` tokens of sequence `seq` may run at `at` and records what its rings
    /// hold after them: positions at..at + n are (re)written, later ones leave the sequence, and
    /// the rings keep the last `ring_slots` of what they now hold.
    fn enter(&mut self, seq: usize, at: usize, n: usize) -> Result<(), ModelError> {
        if let Some(need) = self.window_lost(seq, at) {
            let ring = self.rings[seq];
            return Err(ModelError::WindowLost {
                pos: at,
                need,
                lo: ring.lo,
                end: ring.end,
            });
        }
        let ring = &mut self.rings[seq];
        let lo = if at == 0 { 0 } else { ring.lo };
        *ring = RingSpan {
            lo: lo.max((at + n).saturating_sub(self.ring_slots)),
            end: at + n,
        };
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
        // `Logits::Last` keeps `out`'s length from call to call: the last batch overwrites all of
        // it (a decode step fills no 600 KB of zeros first); an error or no tokens empties it.
        if want == Logits::All || tokens.is_empty() {
            out.clear();
            out.reserve(tokens.len() * self.config.vocab_size);
        }
        let vocab = self.config.vocab_size;
        // The batches, `n_batch` tokens at a time.
        let r = (|| {
            let mut start = 0;
            while start < tokens.len() {
                if self.interrupt.load(Ordering::Relaxed) {
                    return Err(ModelError::Interrupted);
                }
                let n = (tokens.len() - start).min(self.options.n_batch);
                let batch = &tokens[start..start + n];
                let last_batch = start + n == tokens.len();
                let at = pos0 + start;
                self.enter(0, at, n)?;
                let group = Group {
                    seq: 0,
                    row0: 0,
                    n,
                    pos0: at,
                };
                // The step's slice in a trace: its ops, and the logits read, belong to it.
                let _step = trace::step(at, n);
                self.layers_forward(batch, &[group])?;
                match want {
                    Logits::All => {
                        let old = out.len();
                        out.resize(old + n * vocab, 0.0);
                        self.output_rows(n, &mut out[old..])?;
                    }
                    Logits::Last if last_batch => self.logits_of_rows(&[n - 1], out)?,
                    Logits::Last => {}
                }
                start += n;
            }
            Ok(())
        })();
        if r.is_err() {
            out.clear();
        }
        r
    }

    /// Runs one batch made of several sequences' tokens ([`SeqChunk`], each sequence at most
    /// once, `n_batch` tokens at most in all): the products run over every row at once (a decode
    /// step of N sequences multiplies N rows), the rotation, the cache writes and attention
    /// group by group in the sequence's own cache region. `out` (replaced) holds the logits of
    /// each chunk that asked for them, `vocab` floats each, in the chunks' order.
    pub fn forward_seqs(
        &mut self,
        chunks: &[SeqChunk],
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let total: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let invalid = |m: String| ModelError::Backend(BackendError::Invalid(m));
        if total > self.options.n_batch {
            return Err(invalid(format!(
                "{total} tokens in one batch; the model runs at most {}",
                self.options.n_batch
            )));
        }
        let mut seen = vec![false; self.options.n_seq];
        for c in chunks {
            match seen.get_mut(c.seq) {
                Some(s) if !*s => *s = true,
                Some(_) => return Err(invalid(format!("sequence {} twice in a batch", c.seq))),
                None => {
                    return Err(invalid(format!(
                        "sequence {} of a cache of {}",
                        c.seq, self.options.n_seq
                    )));
                }
            }
            let end = c.pos0 + c.tokens.len();
            if end > self.options.n_ctx {
                return Err(ModelError::ContextFull {
                    start: c.pos0,
                    end,
                    n_ctx: self.options.n_ctx,
                });
            }
        }
        self.file.check_unchanged()?;
        if self.interrupt.load(Ordering::Relaxed) {
            return Err(ModelError::Interrupted);
        }
        let mut tokens = Vec::with_capacity(total);
        let mut groups = Vec::with_capacity(chunks.len());
        for c in chunks.iter().filter(|c| !c.tokens.is_empty()) {
            self.enter(c.seq, c.pos0, c.tokens.len())?;
            groups.push(Group {
                seq: c.seq,
                row0: tokens.len(),
                n: c.tokens.len(),
                pos0: c.pos0,
            });
            tokens.extend_from_slice(c.tokens);
        }
        out.clear();
        if groups.is_empty() {
            return Ok(());
        }
        // The step's slice in a trace: every sequence's rows of it.
        let _step = trace::step(groups[0].pos0, tokens.len());
        self.layers_forward(&tokens, &groups)?;
        let rows: Vec<usize> = chunks
            .iter()
            .filter(|c| !c.tokens.is_empty())
            .zip(&groups)
            .filter(|(c, _)| c.logits)
            .map(|(_, g)| g.row0 + g.n - 1)
            .collect();
        if !rows.is_empty() {
            self.logits_of_rows(&rows, out)?;
        }
        Ok(())
    }

    /// The logits of rows `rows` of `x` into `out` (replaced; vocab floats a row, in order): the
    /// rows gathered into `last`, then one norm and one product for all of them.
    fn logits_of_rows(&mut self, rows: &[usize], out: &mut Vec<f32>) -> Result<(), ModelError> {
        let dim = self.config.dim;
        let m = rows.len();
        let a = &self.act;
        for (j, &r) in rows.iter().enumerate() {
            self.backend.copy(a.x, r * dim, a.last, j * dim, dim)?;
        }
        self.backend.rms_norm(
            a.last,
            self.output_norm,
            a.proj,
            m,
            dim,
            self.config.rms_eps,
            OpLabel::global("output_norm"),
        )?;
        self.backend
            .matmul(self.output, a.proj, a.logits, m, OpLabel::global("output"))?;
        out.resize(m * self.config.vocab_size, 0.0);
        self.backend.read(a.logits, 0, out)?;
        softcap(out, self.config.final_softcap);
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
        softcap(out, self.config.final_softcap);
        Ok(())
    }

    /// The layers over `tokens`, made of `groups` (one for a single sequence's batch).
    fn layers_forward(&mut self, tokens: &[u32], groups: &[Group]) -> Result<(), ModelError> {
        let c = &self.config;
        let n = tokens.len();
        let a = &self.act;
        let be = self.backend.as_mut();
        be.embed(self.tok_embd, tokens, a.x)?;
        if let Some(s) = c.embed_scale {
            be.scale(a.x, n * c.dim, s, OpLabel::global("embed_scale"))?;
        }
        let attn = AttnParams {
            layer: 0,
            seq: 0,
            row0: 0,
            n_tokens: n,
            pos0: 0,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            scale: c.attn_scale,
            window: 0,
            softcap: c.attn_softcap.unwrap_or(0.0),
            sinks: None,
        };
        // One token of each of several sequences: their attention goes as one call a layer.
        let seq_rows = (groups.len() > 1 && groups.iter().all(|g| g.n == 1)).then(|| {
            groups
                .iter()
                .map(|g| SeqPos {
                    seq: g.seq,
                    pos: g.pos0,
                })
                .collect::<Vec<_>>()
        });
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
            // Qwen 3's and Gemma 3's per-head norms go with the rotation: in the launch that
            // writes the cache where the backend fuses them. A batch of several sequences
            // normalizes all its rows first (each group's call sees rows from its own row0).
            let norms = HeadNorms {
                q: w.q_norm,
                k: w.k_norm,
                eps: c.rms_eps,
            };
            let swa = c.is_swa(l);
            let rope = if swa { &self.rope_swa } else { &self.rope };
            let layer_attn = AttnParams {
                layer: l,
                window: if swa { c.sliding_window } else { 0 },
                sinks: w.sinks,
                ..attn
            };
            if let Some(rows) = &seq_rows {
                // A decode step of several sequences: every sequence's row in one call.
                be.rope_attention_rows(a.q, a.k, a.v, a.att, &norms, rope, &layer_attn, rows)?;
            } else {
                let norms = if groups.len() == 1 && groups[0].row0 == 0 {
                    norms
                } else {
                    let heads = (c.n_heads, c.n_kv_heads, c.head_dim);
                    head_norms_separately(be, a.q, a.k, &norms, n, heads, li)?;
                    HeadNorms::NONE
                };
                for g in groups {
                    let p = AttnParams {
                        seq: g.seq,
                        row0: g.row0,
                        n_tokens: g.n,
                        pos0: g.pos0,
                        ..layer_attn
                    };
                    be.rope_attention(a.q, a.k, a.v, a.att, &norms, rope, &p)?;
                }
            }
            match (w.post_attn_norm, w.bo) {
                // gpt-oss: the output projection's bias before the residual add.
                (None, Some(bo)) => {
                    be.matmul(w.wo, a.att, a.proj, n, lab("attn_output"))?;
                    be.add_bias(a.proj, bo, n, lab("attn_output_bias"))?;
                    be.add(a.x, a.proj, n * c.dim, lab("attn_residual"))?;
                }
                (Some(post), _) => {
                    be.matmul(w.wo, a.att, a.proj, n, lab("attn_output"))?;
                    be.rms_norm_add(
                        a.proj,
                        post,
                        a.x,
                        a.xn,
                        n,
                        c.dim,
                        c.rms_eps,
                        lab("post_attn_norm"),
                        lab("attn_residual"),
                    )?;
                }
                (None, None) => be.matmul_add(
                    w.wo,
                    a.att,
                    a.x,
                    a.proj,
                    n,
                    c.dim,
                    lab("attn_output"),
                    lab("attn_residual"),
                )?,
            }
            be.rms_norm(a.x, w.ffn_norm, a.xn, n, c.dim, c.rms_eps, lab("ffn_norm"))?;
            if let (Some(router), Some(m), Some(bufs)) = (w.router, &c.moe, &a.moe) {
                moe::ffn(be, bufs, m, router, w, a.xn, a.x, n, c.dim, li)?;
                continue;
            }
            let act = match c.ffn_act {
                FfnAct::Silu => Glu::Silu,
                FfnAct::GeluTanh => Glu::GeluTanh,
            };
            be.matmul_glu(w.gate, w.up, a.xn, a.gate, a.up, n, c.ffn_dim, act, li)?;
            match w.post_ffn_norm {
                Some(post) => {
                    be.matmul(w.down, a.gate, a.proj, n, lab("ffn_down"))?;
                    be.rms_norm_add(
                        a.proj,
                        post,
                        a.x,
                        a.xn,
                        n,
                        c.dim,
                        c.rms_eps,
                        lab("post_ffn_norm"),
                        lab("ffn_residual"),
                    )?;
                }
                None => be.matmul_add(
                    w.down,
                    a.gate,
                    a.x,
                    a.proj,
                    n,
                    c.dim,
                    lab("ffn_down"),
                    lab("ffn_residual"),
                )?,
            }
        }
        Ok(())
    }
}

/// Output soft-capping (Gemma 2's `final_logit_softcapping`): each logit becomes
/// cap · tanh(logit / cap), as llama.cpp's graph computes it (scale, tanh, scale).
fn softcap(logits: &mut [f32], cap: Option<f32>) {
    if let Some(cap) = cap {
        for v in logits {
            *v = (*v * (1.0 / cap)).tanh() * cap;
        }
    }
}
