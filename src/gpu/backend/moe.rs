//! The mixture-of-experts op's parameters ([`MoeFfn`], gpt-oss's [`OaiMoe`]).

use super::{Buf, Weight};

/// Most experts llama.cpp loads (`LLAMA_MAX_EXPERTS`).
pub const MAX_EXPERTS: usize = 512;

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

impl MoeFfn {
    /// Elements of the `route` buffer for `n` tokens: 2 per chosen expert (id, weight), then
    /// the GPU's index: 2 per chosen expert (sorted position, token) and a chunk table (a count,
    /// then 3 per chunk; at most one chunk per entry, or per 8 entries plus one per expert).
    pub fn route_len(n: usize, n_used: usize, n_expert: usize) -> usize {
        let entries = n * n_used;
        4 * entries + 1 + 3 * entries.min(entries.div_ceil(8) + n_expert)
    }
}
