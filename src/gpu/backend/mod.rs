//! The compute interface the forward pass is written against. The CPU backend implements it
//! directly; the GPU backends implement it by enqueuing labelled kernels on their one stream.
//!
//! Buffers and weights are opaque handles owned by the backend, so that a GPU backend can keep
//! them in its arena and the forward pass never sees a device pointer.

mod instrument;
mod kv_layout;
mod memory;
mod moe;
mod ops;

pub use instrument::BackendMonitor;
pub use kv_layout::{KvLayout, KvShift, KvType};
pub use memory::{MemoryPlan, SharedBytes, WeightData};
pub use moe::{MAX_EXPERTS, MoeFfn, OaiMoe};
pub use ops::{AttnParams, RopeParams};

use std::sync::Arc;
use std::time::Duration;

use crate::gpu::device::DeviceInfo;
use crate::gpu::snapshot::{ArenaSnapshot, DeviceRelease, DeviceSummary, QuitStep, StreamSnapshot};
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
