//! (Over 700 lines on purpose: the `Backend` trait and the parameter types of its methods are one
//! interface, read top to bottom by whoever implements it.)
//!
//! The compute interface the forward pass is written against. The CPU backend implements it
//! directly; the GPU backends implement it by enqueuing labelled kernels on their one stream.
//!
//! Buffers and weights are opaque handles owned by the backend, so that a GPU backend can keep
//! them in its arena and the forward pass never sees a device pointer.

use std::sync::Arc;
use std::time::Duration;

use crate::gpu::device::DeviceInfo;
use crate::gpu::quant::GgmlType;
use crate::gpu::snapshot::{
    ArenaSnapshot, DeviceRelease, DeviceSummary, QuitStep, StreamSnapshot, WatchdogSnapshot,
};
use crate::gpu::stream::{Budget, StreamShared};
use crate::gpu::watchdog::Watchdog;

/// A weight tensor held by the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Weight(pub u32);

/// An f32 activation buffer held by the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Buf(pub u32);

/// What an op is, for labels in the stream and watchdog panels (`layer 7 · attn_q`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpLabel {
    pub layer: Option<u32>,
    pub name: &'static str,
}

impl OpLabel {
    pub const fn global(name: &'static str) -> OpLabel {
        OpLabel { layer: None, name }
    }
    pub const fn layer(layer: u32, name: &'static str) -> OpLabel {
        OpLabel {
            layer: Some(layer),
            name,
        }
    }
}

impl std::fmt::Display for OpLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.layer {
            Some(l) => write!(f, "layer {l} · {}", self.name),
            None => f.write_str(self.name),
        }
    }
}

/// Bytes that outlive any borrower: a memory-mapped model file, or one built in memory.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A weight as stored in the model file: `rows` rows of `cols` elements of type `ty` (GGUF dims
/// `[cols, rows]`) at `storage[offset..offset + len]`. The CPU backend keeps pointing into the
/// storage (no copy of a memory-mapped file); GPU backends upload it.
#[derive(Clone)]
pub struct WeightData<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub storage: &'a SharedBytes,
    pub offset: usize,
    pub len: usize,
}

impl WeightData<'_> {
    pub fn bytes(&self) -> &[u8] {
        &(**self.storage).as_ref()[self.offset..self.offset + self.len]
    }

    /// Checks that `len` bytes hold `rows × cols` elements of `ty` and that the range lies in the
    /// storage, before any backend trusts them.
    pub fn check(&self) -> Result<()> {
        let expected = self
            .cols
            .checked_mul(self.rows)
            .and_then(|n| self.ty.bytes_for(n as u64));
        let in_storage = self
            .offset
            .checked_add(self.len)
            .is_some_and(|end| end <= (**self.storage).as_ref().len());
        if expected != Some(self.len as u64) || !in_storage {
            return Err(BackendError::Invalid(format!(
                "tensor {}: {} bytes do not hold {} × {} {}",
                self.name, self.len, self.rows, self.cols, self.ty
            )));
        }
        Ok(())
    }
}

/// Rotary position embedding parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Dimensions rotated per head (pairs: n_rot / 2).
    pub n_rot: usize,
    pub base: f32,
    /// Positions are multiplied by this (1 / linear scaling factor).
    pub freq_scale: f32,
    /// NeoX pairs (i, i + n_rot/2) instead of adjacent pairs (2i, 2i+1).
    pub neox: bool,
    /// Per-pair frequency divisors (llama 3.1 `rope_freqs.weight`, Phi-3's
    /// `rope_factors_short/long.weight`).
    pub freq_factors: Option<Weight>,
    /// Multiplies the cosines and sines (ggml's `attn_factor`, Phi-3's
    /// `rope.scaling.attn_factor`): 1 for a plain rotation. A KV shift ignores it: moving a
    /// key is a pure rotation.
    pub attn_factor: f32,
    /// YaRN (gpt-oss): ggml's `rope_yarn` mixes each pair's interpolated and extrapolated angle
    /// by its ramp and scales cosines and sines by 1 + 0.1·ln(1/freq_scale); `None` for none.
    pub yarn: Option<Yarn>,
}

/// The YaRN part of RoPE, as llama.cpp passes it to `ggml_rope_ext`: `ext_factor` and the
/// correction dimensions `ggml_rope_yarn_corr_dims` computes from the original context and
/// `beta_fast`/`beta_slow`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub ext_factor: f32,
    pub corr_dims: [f32; 2],
}

impl Yarn {
    /// ggml's `ggml_rope_yarn_corr_dims` for `n_rot` rotated dimensions.
    pub fn new(n_rot: usize, n_ctx_orig: usize, base: f32, beta_fast: f32, beta_slow: f32) -> Yarn {
        let dim = |beta: f32| {
            n_rot as f32 * (n_ctx_orig as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        Yarn {
            ext_factor: 1.0,
            corr_dims: [
                dim(beta_fast).floor().max(0.0),
                dim(beta_slow).ceil().min(n_rot as f32 - 1.0),
            ],
        }
    }

    /// ggml's `rope_yarn` for pair `i` (dimension 2i): the angle from the extrapolated one
    /// (`theta_extrap`, unscaled position) and the cosine/sine scale.
    pub fn angle(&self, theta_extrap: f32, freq_scale: f32, i: usize) -> f32 {
        let interp = freq_scale * theta_extrap;
        let [lo, hi] = self.corr_dims;
        let y = (i as f32 - lo) / (hi - lo).max(0.001);
        let ramp = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
        interp * (1.0 - ramp) + theta_extrap * ramp
    }

    /// The factor on cosines and sines: 1 + 0.1·ln(1/freq_scale).
    pub fn mscale(&self, freq_scale: f32) -> f32 {
        if self.ext_factor != 0.0 {
            1.0 + 0.1 * (1.0 / freq_scale).ln()
        } else {
            1.0
        }
    }
}

impl RopeParams {
    /// The pairs rotated per head; an error when `n_rot` is odd or wider than the head.
    pub fn pairs(&self, head_dim: usize) -> Result<usize> {
        if self.n_rot > head_dim || !self.n_rot.is_multiple_of(2) {
            return Err(BackendError::Invalid(format!(
                "RoPE over {} of {head_dim} dimensions",
                self.n_rot
            )));
        }
        Ok(self.n_rot / 2)
    }
}

/// One attention call over `n_tokens` new tokens at positions `pos0..pos0+n_tokens`, whose keys
/// and values are first written into the layer's cache at those positions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    pub layer: usize,
    pub n_tokens: usize,
    pub pos0: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// A sliding-window layer's window: the token at position p sees keys p − window < j ≤ p
    /// (llama.cpp's `LLAMA_SWA_TYPE_STANDARD`); 0 for a global layer.
    pub window: usize,
    /// Attention logit soft-capping (Gemma 2): each score s becomes cap · tanh(s / cap); 0 for
    /// none.
    pub softcap: f32,
    /// Attention sinks (gpt-oss's `attn_sinks`): one logit per query head that joins each
    /// softmax's denominator, as llama.cpp's `soft_max` and flash attention take it, and adds no
    /// value; `None` for none.
    pub sinks: Option<Weight>,
}

/// Element type of the KV cache, on every backend (`--kv-type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    F32,
    /// Half the memory and bandwidth of f32, as llama.cpp keeps it by default.
    #[default]
    F16,
}

impl KvType {
    pub fn bytes(self) -> u64 {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
        }
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            other => Err(format!("unknown KV cache type {other:?} (f32 or f16)")),
        }
    }
}

/// The KV cache's shape: for each layer, the positions it keeps, of `kv_dim` keys and as many
/// values. A global layer keeps the whole context; a sliding-window layer keeps a ring of its
/// window plus a batch (position p lives in slot p mod slots), which is all its attention can
/// read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// The model's layer number of this layout's first layer: 0, or where a split model's
    /// part starts ([`KvLayout::part`]).
    first: usize,
    n_ctx: usize,
    kv_dim: usize,
    slots: Vec<usize>,
    /// Element offset of each layer, and the total after the last.
    offsets: Vec<usize>,
}

impl KvLayout {
    /// `slots[l]` positions for layer `l` (each at most `n_ctx`); an error if the sizes
    /// overflow.
    pub fn new(n_ctx: usize, kv_dim: usize, slots: Vec<usize>) -> Result<KvLayout> {
        let mut offsets = Vec::with_capacity(slots.len() + 1);
        let mut at = 0usize;
        for &s in &slots {
            if s == 0 || s > n_ctx {
                return Err(BackendError::Invalid(format!(
                    "a KV cache layer of {s} positions in a context of {n_ctx}"
                )));
            }
            offsets.push(at);
            at = s
                .checked_mul(kv_dim)
                .and_then(|n| n.checked_add(at))
                .ok_or_else(|| BackendError::OutOfMemory("KV cache size overflows".into()))?;
        }
        offsets.push(at);
        Ok(KvLayout {
            first: 0,
            n_ctx,
            kv_dim,
            slots,
            offsets,
        })
    }

    /// Every one of `n_layers` layers keeps the whole context.
    pub fn uniform(n_layers: usize, n_ctx: usize, kv_dim: usize) -> Result<KvLayout> {
        KvLayout::new(n_ctx, kv_dim, vec![n_ctx; n_layers])
    }

    /// The layers `layers` of this layout, still numbered as the model numbers them (a split
    /// model's GPU part keeps layers 17.. as 17..); `None` for an empty or out-of-range part.
    pub fn part(&self, layers: std::ops::Range<usize>) -> Option<KvLayout> {
        let lo = layers.start.checked_sub(self.first)?;
        let hi = layers.end.checked_sub(self.first)?;
        if lo >= hi || hi > self.slots.len() {
            return None;
        }
        let mut p = KvLayout::new(self.n_ctx, self.kv_dim, self.slots[lo..hi].to_vec()).ok()?;
        p.first = layers.start;
        Some(p)
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    pub fn n_layers(&self) -> usize {
        self.slots.len()
    }

    /// Positions layer `l` keeps (0 for a layer that does not exist here).
    pub fn slots(&self, l: usize) -> usize {
        l.checked_sub(self.first)
            .and_then(|i| self.slots.get(i))
            .copied()
            .unwrap_or(0)
    }

    /// First element of layer `l` in the keys (and in the values).
    pub fn offset(&self, l: usize) -> usize {
        l.checked_sub(self.first)
            .and_then(|i| self.offsets.get(i))
            .copied()
            .unwrap_or(0)
    }

    /// Elements of the keys (as many again for the values).
    pub fn elems(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }

    /// Every layer keeps the whole context (what a context shift needs).
    pub fn is_uniform(&self) -> bool {
        self.slots.iter().all(|&s| s == self.n_ctx)
    }

    /// Checks an attention call against layer `p.layer`: the positions fit the context, and a
    /// ring is wide enough that the batch's first token still finds its window after the batch's
    /// keys went in.
    pub fn check_attention(&self, p: &AttnParams) -> Result<()> {
        let slots = self.slots(p.layer);
        let kv_dim = p.n_kv_heads * p.head_dim;
        let ring_ok = slots == self.n_ctx || (p.window > 0 && p.window + p.n_tokens <= slots + 1);
        if kv_dim != self.kv_dim
            || slots == 0
            || p.n_kv_heads == 0
            || p.pos0 + p.n_tokens > self.n_ctx
            || !ring_ok
        {
            return Err(BackendError::Invalid(format!(
                "attention at layer {} positions {}..{} (window {}) does not fit the KV cache \
                 ({} layers, this one {slots} positions of {}, context {})",
                p.layer,
                p.pos0,
                p.pos0 + p.n_tokens,
                p.window,
                self.n_layers(),
                self.kv_dim,
                self.n_ctx
            )));
        }
        Ok(())
    }
}

/// A context shift: in every layer's cache, positions `src..src + n` move down to
/// `dst..dst + n` (`dst < src`) and their keys are rotated by `dst − src` positions. RoPE is a
/// rotation by an angle linear in the position, so rotating a key stored at `p` by `δ` gives the
/// key a recompute at `p + δ` would store, to the rounding of the cache's element type
/// (llama.cpp's K-shift). Values carry no position and only move.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvShift {
    pub dst: usize,
    pub src: usize,
    pub n: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rope: RopeParams,
}

impl KvShift {
    /// The rotation applied to the keys, in positions (negative: they move down).
    pub fn delta(&self) -> f32 {
        -((self.src - self.dst) as f32)
    }

    /// Checks the move against a cache of `n_ctx` positions of `kv_dim`, before anything moves.
    pub fn check(&self, n_ctx: usize, kv_dim: usize) -> Result<()> {
        self.rope.pairs(self.head_dim)?;
        if self.dst >= self.src
            || self.src + self.n > n_ctx
            || self.n_kv_heads * self.head_dim != kv_dim
        {
            return Err(BackendError::Invalid(format!(
                "KV shift of positions {}..{} to {} does not fit the KV cache ({n_ctx} positions of {kv_dim})",
                self.src,
                self.src + self.n,
                self.dst
            )));
        }
        Ok(())
    }
}

/// A mixture-of-experts feed-forward for `n_tokens` rows (llama.cpp's `build_moe_ffn` with
/// softmax gating, top-k, weights normalized to sum 1, SwiGLU experts):
///
/// ```text
/// p = softmax(router · x[t]);  e_0..e_k = the k largest p (largest first);  w_i = p[e_i] / Σ p[e_j]
/// acc[t] += Σ_i w_i · down[e_i] · (silu(gate[e_i] · x[t]) * (up[e_i] · x[t]))
/// ```
///
/// `gate` and `up` hold every expert's rows one expert after another (`n_expert · ffn_dim` rows
/// of `dim`), `down` likewise (`n_expert · dim` rows of `ffn_dim`): the 3-D `*_exps` tensors as
/// stored. Scratch buffers: `logits` (n_tokens × n_expert); `route` ([`MoeFfn::route_len`]: per
/// token the chosen expert ids, as floats, then their weights; after them whatever index the
/// backend keeps, such as the GPU's entries sorted by expert); `xs` (n_tokens × n_used × dim: the
/// inputs as each expert takes them), `h` (n_tokens × n_used × ffn_dim) and `y` (n_tokens ×
/// n_used × dim).
/// Most experts llama.cpp loads (`LLAMA_MAX_EXPERTS`).
pub const MAX_EXPERTS: usize = 512;

#[derive(Clone, Copy, Debug)]
pub struct MoeFfn {
    pub router: Weight,
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
    pub x: Buf,
    pub acc: Buf,
    pub logits: Buf,
    pub route: Buf,
    pub xs: Buf,
    pub h: Buf,
    pub y: Buf,
    pub n_tokens: usize,
    pub dim: usize,
    pub ffn_dim: usize,
    pub n_expert: usize,
    pub n_used: usize,
    pub layer: u32,
    /// gpt-oss's experts (llama.cpp's `LLM_FFN_SWIGLU_OAI_MOE` with
    /// `LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT`): biases on the router and every expert
    /// product, the softmax taken over the chosen experts' logits only, and the clamped SwiGLU;
    /// `None`: the Mixtral-style op (softmax over all experts, chosen weights renormalized,
    /// SwiGLU).
    pub oai: Option<OaiMoe>,
}

/// The biases of gpt-oss's MoE: the router's (`n_expert`), and per expert the gate's and up's
/// (`ffn_dim` each) and the down product's (`dim`), as `[n_expert]` rows of f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OaiMoe {
    pub router_bias: Weight,
    pub gate_bias: Weight,
    pub up_bias: Weight,
    pub down_bias: Weight,
}

/// ggml's `swiglu_oai` (alpha 1.702, limit 7): x = min(gate, limit), y = clamp(up, ±limit),
/// x·σ(alpha·x)·(y + 1).
pub fn swiglu_oai(gate: f32, up: f32) -> f32 {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    let x = gate.min(LIMIT);
    let y = up.clamp(-LIMIT, LIMIT);
    x / (1.0 + (ALPHA * -x).exp()) * (y + 1.0)
}

impl MoeFfn {
    /// Elements of the `route` buffer for `n` tokens: 2 per chosen expert (id, weight), then
    /// the GPU's index: 2 per chosen expert (sorted position, token) and a chunk table (a count,
    /// then 3 per chunk; at most one chunk per entry, or per 8 entries plus one per expert).
    pub fn route_len(n: usize, n_used: usize, n_expert: usize) -> usize {
        let entries = n * n_used;
        4 * entries + 1 + 3 * entries.min(entries.div_ceil(8) + n_expert)
    }
}

/// What a model will ask of a backend, known before its first weight is loaded, so that a GPU
/// backend can make its few large allocations up front (and refuse at once, with the numbers, a
/// model that does not fit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Bytes of all weights, as stored.
    pub weights: u64,
    /// Number of weight tensors.
    pub weight_tensors: usize,
    /// f32 elements of all activation buffers.
    pub activation_elems: u64,
    /// KV cache: the positions of every layer ([`KvLayout`]) × kv_dim, for keys and for values
    /// each.
    pub kv_elems: u64,
    /// Most tokens in one forward step (the width of a prompt batch).
    pub n_batch: usize,
    /// The widest input of any matrix product (elements per token row).
    pub max_cols: usize,
    /// Elements of all one-row tensors (norms, biases, RoPE factors), which a backend may keep
    /// as f32 whatever their stored type.
    pub vector_elems: u64,
}

/// A view of a backend's device that other threads may read while the worker is inside a
/// forward pass (the session borrows the backend mutably for a whole answer): atomics only, no
/// lock shared with the worker, no runtime call.
pub trait BackendMonitor: Send + Sync {
    /// The backend's streams as they are now.
    fn streams(&self) -> Vec<StreamSnapshot>;
    /// The oldest op in flight judged against its budget (OK / SLOW / HUNG), if there is a stream.
    fn watchdog(&self) -> Option<WatchdogSnapshot>;
}

/// A backend could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{0}")]
    Unsupported(String),
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    #[error("{0}")]
    Invalid(String),
    /// The device failed; no further call to it can succeed.
    #[error("device error: {0}")]
    Device(String),
}

pub type Result<T> = std::result::Result<T, BackendError>;

/// The ops of a llama-family forward pass. Activations are row-major `[n_tokens, width]`.
/// Calls may be asynchronous (GPU): only `read` returns data and waits for it.
pub trait Backend: Send {
    /// What this backend runs on.
    fn device(&self) -> DeviceSummary;

    /// Told once, before any weight or buffer, how much the model will need.
    fn plan(&mut self, _plan: &MemoryPlan) -> Result<()> {
        Ok(())
    }

    /// Takes a weight (checked: `len` matches the shape and type, the range lies in storage).
    fn load_weight(&mut self, data: &WeightData) -> Result<Weight>;

    /// An f32 buffer of `len` elements (zeroed).
    fn alloc(&mut self, name: &'static str, len: usize) -> Result<Buf>;

    /// The KV cache, layer by layer as `layout` says.
    fn alloc_kv_cache(&mut self, layout: &KvLayout) -> Result<()>;

    /// out[t] = dequantized row `tokens[t]` of `table`.
    fn embed(&mut self, table: Weight, tokens: &[u32], out: Buf) -> Result<()>;

    /// out[t] = x[t] / rms(x[t]) * weight, for rows of `dim`; `out` may be `x` (the per-head
    /// Q/K norms of Qwen 3 and Gemma 3 normalize in place, rows of one head).
    #[allow(clippy::too_many_arguments)]
    fn rms_norm(
        &mut self,
        x: Buf,
        weight: Weight,
        out: Buf,
        n_tokens: usize,
        dim: usize,
        eps: f32,
        label: OpLabel,
    ) -> Result<()>;

    /// out[t] = W · x[t] (W has `rows` rows of `cols`; x rows of `cols`, out rows of `rows`).
    fn matmul(
        &mut self,
        w: Weight,
        x: Buf,
        out: Buf,
        n_tokens: usize,
        label: OpLabel,
    ) -> Result<()>;

    /// q, k, v = Wq · x, Wk · x, Wv · x, each plus its bias where given: an attention block's
    /// three products, which a backend may run as one launch. By default the separate ops.
    #[allow(clippy::too_many_arguments)]
    fn matmul_qkv(
        &mut self,
        w: [Weight; 3],
        bias: [Option<Weight>; 3],
        x: Buf,
        out: [Buf; 3],
        n_tokens: usize,
        layer: u32,
    ) -> Result<()> {
        qkv_separately(self, w, bias, x, out, n_tokens, layer)
    }

    /// gate = silu(Wgate · x) * (Wup · x) over `n_tokens` rows of `ffn_dim` (`up` is scratch: a
    /// backend that fuses the two products may leave it untouched). By default the separate ops.
    #[allow(clippy::too_many_arguments)]
    fn matmul_swiglu(
        &mut self,
        w_gate: Weight,
        w_up: Weight,
        x: Buf,
        gate: Buf,
        up: Buf,
        n_tokens: usize,
        ffn_dim: usize,
        layer: u32,
    ) -> Result<()> {
        swiglu_separately(self, [w_gate, w_up], x, gate, up, n_tokens, ffn_dim, layer)
    }

    /// acc[t] += W · x[t] (rows of `dim`): a product with the residual add in its epilogue
    /// (`tmp` is scratch for a backend that adds separately, as the default does).
    #[allow(clippy::too_many_arguments)]
    fn matmul_add(
        &mut self,
        w: Weight,
        x: Buf,
        acc: Buf,
        tmp: Buf,
        n_tokens: usize,
        dim: usize,
        label: OpLabel,
        add_label: OpLabel,
    ) -> Result<()> {
        self.matmul(w, x, tmp, n_tokens, label)?;
        self.add(acc, tmp, n_tokens * dim, add_label)
    }

    /// A mixture-of-experts feed-forward added to `acc` (see [`MoeFfn`]).
    fn moe_ffn(&mut self, _m: &MoeFfn) -> Result<()> {
        Err(BackendError::Unsupported(format!(
            "{}: mixture-of-experts layers are not implemented on this backend",
            self.device().backend
        )))
    }

    /// Device memory bandwidth in bytes/s, read plus write, measured by a copy (`None` where the
    /// backend has no device memory to measure).
    fn copy_bandwidth(&mut self) -> Option<f64> {
        None
    }

    /// x[t] += bias.
    fn add_bias(&mut self, x: Buf, bias: Weight, n_tokens: usize, label: OpLabel) -> Result<()>;

    /// Rotates each head of each row of `x` (`n_tokens` rows of `n_heads * head_dim`) by its
    /// position `pos0 + t`.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &mut self,
        x: Buf,
        n_tokens: usize,
        n_heads: usize,
        head_dim: usize,
        pos0: usize,
        params: &RopeParams,
        label: OpLabel,
    ) -> Result<()>;

    /// Stores k and v in the cache, then causal attention of q over positions `0..=pos` for each
    /// token; writes `n_tokens` rows of `n_heads * head_dim` to `out`.
    fn attention(&mut self, q: Buf, k: Buf, v: Buf, out: Buf, p: &AttnParams) -> Result<()>;

    /// Moves cached keys and values down in every layer and re-rotates the keys for their new
    /// positions (see [`KvShift`]).
    fn kv_shift(&mut self, s: &KvShift) -> Result<()>;

    /// RoPE of q (`n_heads` heads) and k (`n_kv_heads` heads) at positions `pos0 + t`, then
    /// [`Backend::attention`]: what a backend may run with the rotation fused into the KV-cache
    /// write. By default the separate ops.
    fn rope_attention(
        &mut self,
        q: Buf,
        k: Buf,
        v: Buf,
        out: Buf,
        rope: &RopeParams,
        p: &AttnParams,
    ) -> Result<()> {
        rope_attention_separately(self, q, k, v, out, rope, p)
    }

    /// gate = silu(gate) * up, elementwise over `len`.
    fn swiglu(&mut self, gate: Buf, up: Buf, len: usize, label: OpLabel) -> Result<()>;

    /// gate = gelu(gate) * up, elementwise over `len`, GELU in its tanh form as ggml computes it
    /// (Gemma's feed-forward).
    fn geglu(&mut self, gate: Buf, up: Buf, len: usize, label: OpLabel) -> Result<()>;

    /// x *= factor, elementwise over `len` (Gemma's embedding scale).
    fn scale(&mut self, x: Buf, len: usize, factor: f32, label: OpLabel) -> Result<()>;

    /// acc += x, elementwise over `len`.
    fn add(&mut self, acc: Buf, x: Buf, len: usize, label: OpLabel) -> Result<()>;

    /// dst[dst_off..+len] = src[src_off..+len].
    fn copy(
        &mut self,
        src: Buf,
        src_off: usize,
        dst: Buf,
        dst_off: usize,
        len: usize,
    ) -> Result<()>;

    /// Waits for every op before it and copies `out.len()` elements from `buf[offset..]`.
    fn read(&mut self, buf: Buf, offset: usize, out: &mut [f32]) -> Result<()>;

    /// Overwrites `buf[offset..offset + data.len()]` with `data`, after every op before it (the
    /// hand-over of activations between the two backends of a split model).
    fn write(&mut self, _buf: Buf, _offset: usize, _data: &[f32]) -> Result<()> {
        Err(BackendError::Unsupported(
            "this backend cannot take activations from another".into(),
        ))
    }

    /// Bytes of device memory this backend would set aside for `plan` (its arena), for deciding
    /// how many layers fit (`-ngl auto`); `None` where the backend has no device memory.
    fn plan_bytes(&self, _plan: &MemoryPlan) -> Option<u64> {
        None
    }

    /// The element type its KV cache is allocated in (so that the CPU part of a split model
    /// keeps the GPU part's).
    fn kv_type(&self) -> KvType {
        KvType::F32
    }

    /// The streams this backend owns, for the UI (the CPU has none).
    fn streams(&self) -> Vec<StreamSnapshot> {
        Vec::new()
    }

    /// Memory held by the backend, for the UI.
    fn arena(&self) -> ArenaSnapshot;

    /// A handle other threads can read snapshots from during a generation (GPU backends).
    fn monitor(&self) -> Option<Arc<dyn BackendMonitor>> {
        None
    }

    /// The stream the process's watchdog watches on this backend, with the device facts for its
    /// hang reports (`gpu::open` starts the watchdog); `None`: nothing to watch.
    fn watch_target(&self) -> Option<(Arc<StreamShared>, DeviceInfo)> {
        None
    }

    /// Keeps the watchdog `gpu::open` started on [`Backend::watch_target`]'s stream: it runs as
    /// long as the backend — load, prompts, answers, idle, the quit's drain — and stops when the
    /// backend is dropped. A backend without a watch target is never given one.
    fn keep_watchdog(&mut self, dog: Watchdog) {
        drop(dog);
    }

    /// Enqueues an op that does not finish for tens of seconds, judged against its own `budget`:
    /// the hang `HIPSCOPE_FAULT=hang:PHASE` injects (`gpu/fault.rs`). On a GPU the
    /// `hs_spin_on_flag` kernel; on the CPU the calling thread held inside the op.
    fn stuck_op(&mut self, _label: OpLabel, _budget: Budget) -> Result<()> {
        Err(BackendError::Unsupported(
            "this backend cannot hold an op (HIPSCOPE_FAULT=hang)".into(),
        ))
    }

    /// The concrete backend, for a caller that owns a `Model` and needs the backend's own API
    /// (the selftest flips tracking on the `GpuCompute` under a model). `None` unless overridden.
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }

    /// The device half of the quit protocol: a bounded drain, then every device resource in
    /// order, each step reported through `on_step`. `Abandoned` when the process must leave with
    /// `_exit` because the GPU could not be shut down cleanly. Later calls do nothing and return
    /// `Clean`.
    fn shutdown(
        &mut self,
        _drain_deadline: Duration,
        _on_step: &mut dyn FnMut(QuitStep),
    ) -> DeviceRelease {
        DeviceRelease::Clean
    }
}

/// [`Backend::matmul_qkv`] as separate ops: the three products, then the biases.
#[allow(clippy::too_many_arguments)]
pub fn qkv_separately<B: Backend + ?Sized>(
    be: &mut B,
    w: [Weight; 3],
    bias: [Option<Weight>; 3],
    x: Buf,
    out: [Buf; 3],
    n_tokens: usize,
    layer: u32,
) -> Result<()> {
    const NAMES: [(&str, &str); 3] = [
        ("attn_q", "attn_q.bias"),
        ("attn_k", "attn_k.bias"),
        ("attn_v", "attn_v.bias"),
    ];
    for i in 0..3 {
        be.matmul(w[i], x, out[i], n_tokens, OpLabel::layer(layer, NAMES[i].0))?;
    }
    for i in 0..3 {
        if let Some(b) = bias[i] {
            be.add_bias(out[i], b, n_tokens, OpLabel::layer(layer, NAMES[i].1))?;
        }
    }
    Ok(())
}

/// [`Backend::matmul_swiglu`] as separate ops: gate, up, then SwiGLU.
#[allow(clippy::too_many_arguments)]
pub fn swiglu_separately<B: Backend + ?Sized>(
    be: &mut B,
    w: [Weight; 2],
    x: Buf,
    gate: Buf,
    up: Buf,
    n_tokens: usize,
    ffn_dim: usize,
    layer: u32,
) -> Result<()> {
    be.matmul(w[0], x, gate, n_tokens, OpLabel::layer(layer, "ffn_gate"))?;
    be.matmul(w[1], x, up, n_tokens, OpLabel::layer(layer, "ffn_up"))?;
    be.swiglu(
        gate,
        up,
        n_tokens * ffn_dim,
        OpLabel::layer(layer, "ffn_swiglu"),
    )
}

/// [`Backend::rope_attention`] as separate ops: RoPE of q, of k, then attention.
pub fn rope_attention_separately<B: Backend + ?Sized>(
    be: &mut B,
    q: Buf,
    k: Buf,
    v: Buf,
    out: Buf,
    rope: &RopeParams,
    p: &AttnParams,
) -> Result<()> {
    let l = p.layer as u32;
    be.rope(
        q,
        p.n_tokens,
        p.n_heads,
        p.head_dim,
        p.pos0,
        rope,
        OpLabel::layer(l, "rope_q"),
    )?;
    be.rope(
        k,
        p.n_tokens,
        p.n_kv_heads,
        p.head_dim,
        p.pos0,
        rope,
        OpLabel::layer(l, "rope_k"),
    )?;
    be.attention(q, k, v, out, p)
}

#[cfg(test)]
mod tests {
    use super::{Yarn, swiglu_oai};

    /// gpt-oss-20b's YaRN (64 rotated dimensions, original context 4096, base 150000, beta_fast
    /// 32, beta_slow 1): ggml's correction dimensions are floor(8.09) and ceil(17.40), worked out
    /// by hand from `ggml_rope_yarn_corr_dim`: 64·ln(4096 / (β·2π)) / (2·ln 150000).
    #[test]
    fn yarn_correction_dims_as_ggml() {
        let y = Yarn::new(64, 4096, 150_000.0, 32.0, 1.0);
        assert_eq!(y.corr_dims, [8.0, 18.0]);
        // Pairs below the first dimension keep the unscaled angle, those past the last the
        // interpolated one; the magnitude is 1 + 0.1·ln 32.
        assert_eq!(y.angle(3.0, 1.0 / 32.0, 2), 3.0);
        assert!((y.angle(3.0, 1.0 / 32.0, 20) - 3.0 / 32.0).abs() < 1e-7);
        assert!((y.mscale(1.0 / 32.0) - 1.346_574).abs() < 1e-5);
    }

    /// ggml's `swiglu_oai`: the gate clamped above at 7, up to ±7, x·σ(1.702x)·(y + 1).
    #[test]
    fn swiglu_oai_clamps_as_ggml() {
        let sig = |v: f32| 1.0 / (1.0 + (-v).exp());
        assert!((swiglu_oai(10.0, -9.0) - 7.0 * sig(1.702 * 7.0) * -6.0).abs() < 1e-5);
        assert!((swiglu_oai(-2.0, 0.5) - -2.0 * sig(-3.404) * 1.5).abs() < 1e-6);
        assert!((swiglu_oai(1.0, 100.0) - sig(1.702) * 8.0).abs() < 1e-6);
    }
}
