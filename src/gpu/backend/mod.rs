//! The compute interface the forward pass is written against. The CPU backend implements it
//! directly; the GPU backends implement it by enqueuing labelled kernels on their one stream;
//! the split model (`model/split`) and the selftest's lockstep (`gpu/compute/lockstep.rs`) wrap
//! two backends in one.
//!
//! Buffers and weights are opaque handles owned by the backend, so that a GPU backend can keep
//! them in its arena and the forward pass never sees a device pointer.
//!
//! The seam is cut by concern, as ggml keeps a backend's stream, buffers and device behind
//! separate interfaces (`ggml-backend-impl.h`): [`Ops`] (`ops.rs`: the forward pass's ops, fused
//! ones included, none with a default body), [`Memory`] (`memory.rs`: plan, weights, buffers, KV
//! cache, reads and writes) and [`Instrument`] (`instrument.rs`: the device's name, streams,
//! watchdog, hang fault, quit). [`Backend`] is the three together. The KV cache's shape is in
//! `kv_layout.rs`, the mixture-of-experts op's parameters in `moe.rs`.

mod instrument;
mod kv_layout;
mod memory;
mod moe;
mod ops;

pub use instrument::{BackendMonitor, Instrument};
pub use kv_layout::{KvLayout, KvShift, KvType};
pub use memory::{Memory, MemoryPlan, SharedBytes, WeightData, stage_slot};
pub use moe::{MAX_EXPERTS, MoeFfn, OaiMoe};
pub use ops::{
    AttnParams, Glu, HeadNorms, Ops, RopeParams, SeqPos, add_separately, glu_separately,
    head_norms_separately, norm_add_separately, qkv_separately, rope_attention_rows_separately,
    rope_attention_separately,
};

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

/// Everything the app asks of a compute backend, by concern: the forward pass's ops ([`Ops`]),
/// the memory they work in ([`Memory`]), and what the app watches and controls around them
/// ([`Instrument`]). A backend implements the three; this trait comes with them, and a model
/// holds a `Box<dyn Backend>`.
pub trait Backend: Ops + Memory + Instrument + Send {}

impl<T: Ops + Memory + Instrument + Send> Backend for T {}
