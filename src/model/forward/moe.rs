//! The mixture-of-experts feed-forward of the forward pass (Mixtral-style llama, qwen3moe): its
//! scratch buffers and the one backend op ([`Ops::moe_ffn`]) that routes each token to its
//! experts and adds their weighted outputs to the residual.
//!
//! [`Ops::moe_ffn`]: crate::gpu::backend::Ops::moe_ffn

use super::weights::LayerWeights;
use crate::gpu::backend::{Backend, BackendError, Buf, MoeFfn, Weight};
use crate::model::config::Moe;

/// Scratch of the MoE op, shared by every layer (see [`MoeFfn`] for the shapes).
pub(super) struct MoeBufs {
    logits: Buf,
    route: Buf,
    xs: Buf,
    h: Buf,
    y: Buf,
}

/// f32 elements of the scratch for batches of `b` tokens.
pub(super) fn elems(m: &Moe, b: usize, dim: usize) -> usize {
    b * (m.n_expert + m.n_used * m.ffn_dim + 2 * m.n_used * dim)
        + MoeFfn::route_len(b, m.n_used, m.n_expert)
}

pub(super) fn alloc(
    be: &mut dyn Backend,
    m: &Moe,
    b: usize,
    dim: usize,
) -> Result<MoeBufs, BackendError> {
    Ok(MoeBufs {
        logits: be.alloc("moe_logits", b * m.n_expert)?,
        route: be.alloc("moe_route", MoeFfn::route_len(b, m.n_used, m.n_expert))?,
        xs: be.alloc("moe_inputs", b * m.n_used * dim)?,
        h: be.alloc("moe_hidden", b * m.n_used * m.ffn_dim)?,
        y: be.alloc("moe_outputs", b * m.n_used * dim)?,
    })
}

/// acc += the experts' output for the `n` normalized rows in `x`.
#[allow(clippy::too_many_arguments)]
pub(super) fn ffn(
    be: &mut dyn Backend,
    bufs: &MoeBufs,
    m: &Moe,
    router: Weight,
    w: &LayerWeights,
    x: Buf,
    acc: Buf,
    n: usize,
    dim: usize,
    layer: u32,
) -> Result<(), BackendError> {
    be.moe_ffn(&MoeFfn {
        router,
        gate: w.gate,
        up: w.up,
        down: w.down,
        x,
        acc,
        logits: bufs.logits,
        route: bufs.route,
        xs: bufs.xs,
        h: bufs.h,
        y: bufs.y,
        n_tokens: n,
        dim,
        ffn_dim: m.ffn_dim,
        n_expert: m.n_expert,
        n_used: m.n_used,
        layer,
        oai: w.moe_bias,
    })
}
