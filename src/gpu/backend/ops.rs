//! The parameters of the rotary embedding and attention ops ([`RopeParams`], [`AttnParams`]).

use super::{BackendError, Result, Weight};
use crate::gpu::rope::Yarn;

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
