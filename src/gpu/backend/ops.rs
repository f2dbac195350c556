//! The forward pass's ops ([`Ops`]), the parameters of the rotary embedding and attention ops
//! ([`RopeParams`], [`AttnParams`]), and the fused ops written as the separate ones
//! (`*_separately`), which a backend that does not fuse calls from its own implementation.

use super::moe::MoeFfn;
use super::{BackendError, Buf, OpLabel, Result, Weight};
use crate::gpu::rope::Yarn;

/// The ops of a llama-family forward pass, on the backend's buffers and weights. Activations are
/// row-major `[n_tokens, width]`. Calls may be asynchronous (GPU): only [`Memory::read`] returns
/// data and waits for it.
///
/// No op has a default body: a fused op (`matmul_qkv`, `matmul_glu`, `matmul_add`,
/// `rope_attention`, `rms_norm_add`) is one call that a backend runs as one launch or as the separate ops (the
/// `*_separately` functions below), and a wrapper (the split model, the selftest's lockstep) must
/// decide which for itself rather than inherit a body that bypasses it.
///
/// [`Memory::read`]: super::Memory::read
pub trait Ops {
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
    /// three products, which a backend may run as one launch ([`qkv_separately`] otherwise).
    #[allow(clippy::too_many_arguments)]
    fn matmul_qkv(
        &mut self,
        w: [Weight; 3],
        bias: [Option<Weight>; 3],
        x: Buf,
        out: [Buf; 3],
        n_tokens: usize,
        layer: u32,
    ) -> Result<()>;

    /// gate = act(Wgate · x) * (Wup · x) over `n_tokens` rows of `ffn_dim`, `act` SiLU (SwiGLU)
    /// or GELU (Gemma's GeGLU) (`up` is scratch: a backend that fuses the two products may leave
    /// it untouched; [`glu_separately`] otherwise).
    #[allow(clippy::too_many_arguments)]
    fn matmul_glu(
        &mut self,
        w_gate: Weight,
        w_up: Weight,
        x: Buf,
        gate: Buf,
        up: Buf,
        n_tokens: usize,
        ffn_dim: usize,
        act: Glu,
        layer: u32,
    ) -> Result<()>;

    /// acc[t] += W · x[t] (rows of `dim`): a product with the residual add in its epilogue
    /// (`tmp` is scratch for a backend that adds separately: [`add_separately`]).
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
    ) -> Result<()>;

    /// acc[t] += x[t] / rms(x[t]) * weight (rows of `dim`): Gemma's norm after a block with the
    /// residual add (`tmp` is scratch for a backend that adds separately:
    /// [`norm_add_separately`]).
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_add(
        &mut self,
        x: Buf,
        weight: Weight,
        acc: Buf,
        tmp: Buf,
        n_tokens: usize,
        dim: usize,
        eps: f32,
        label: OpLabel,
        add_label: OpLabel,
    ) -> Result<()>;

    /// A mixture-of-experts feed-forward added to `acc` (see [`MoeFfn`]).
    fn moe_ffn(&mut self, m: &MoeFfn) -> Result<()>;

    /// x[t] += bias.
    fn add_bias(&mut self, x: Buf, bias: Weight, n_tokens: usize, label: OpLabel) -> Result<()>;

    /// Rotates each head of rows `row0..row0 + n_tokens` of `x` (rows of `n_heads * head_dim`)
    /// by its position `pos0 + t` (`row0`: a group of a batch of several sequences).
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &mut self,
        x: Buf,
        row0: usize,
        n_tokens: usize,
        n_heads: usize,
        head_dim: usize,
        pos0: usize,
        params: &RopeParams,
        label: OpLabel,
    ) -> Result<()>;

    /// Stores k and v in sequence `p.seq`'s cache, then causal attention of q over positions
    /// `0..=pos` for each token; reads and writes rows `p.row0..p.row0 + p.n_tokens` of q, k, v
    /// and `out` (rows of `n_heads * head_dim` in `out`).
    fn attention(&mut self, q: Buf, k: Buf, v: Buf, out: Buf, p: &AttnParams) -> Result<()>;

    /// The per-head RMS norms of q and k where `norms` has them (Qwen 3, Gemma 3), then RoPE of q
    /// (`n_heads` heads) and k (`n_kv_heads` heads) in place at positions `pos0 + t`, then
    /// [`Ops::attention`]: what a backend may run with the norms and the rotation fused into the
    /// KV-cache write ([`rope_attention_separately`] otherwise).
    #[allow(clippy::too_many_arguments)]
    fn rope_attention(
        &mut self,
        q: Buf,
        k: Buf,
        v: Buf,
        out: Buf,
        norms: &HeadNorms,
        rope: &RopeParams,
        p: &AttnParams,
    ) -> Result<()>;

    /// [`Ops::rope_attention`] for a decode step of several sequences: row `i` of q, k, v and
    /// `out` is one token of sequence `rows[i].seq` at position `rows[i].pos` (each sequence at
    /// most once). `p` gives the layer, the heads, the window, the scale, the soft-cap and the
    /// sinks; its `seq`, `row0`, `n_tokens` and `pos0` are not read. What a backend may run as one
    /// launch for every sequence ([`rope_attention_rows_separately`] otherwise).
    #[allow(clippy::too_many_arguments)]
    fn rope_attention_rows(
        &mut self,
        q: Buf,
        k: Buf,
        v: Buf,
        out: Buf,
        norms: &HeadNorms,
        rope: &RopeParams,
        p: &AttnParams,
        rows: &[SeqPos],
    ) -> Result<()>;

    /// gate = silu(gate) * up, elementwise over `len`.
    fn swiglu(&mut self, gate: Buf, up: Buf, len: usize, label: OpLabel) -> Result<()>;

    /// gate = gelu(gate) * up, elementwise over `len`, GELU in its tanh form as ggml computes it
    /// (Gemma's feed-forward).
    fn geglu(&mut self, gate: Buf, up: Buf, len: usize, label: OpLabel) -> Result<()>;

    /// x *= factor, elementwise over `len` (Gemma's embedding scale).
    fn scale(&mut self, x: Buf, len: usize, factor: f32, label: OpLabel) -> Result<()>;

    /// acc += x, elementwise over `len`.
    fn add(&mut self, acc: Buf, x: Buf, len: usize, label: OpLabel) -> Result<()>;

    /// Products over fewer than `rows` rows give each row exactly what a one-row product gives
    /// it (the CPU multiplies them with its row kernel rather than its packed GEMM, whose
    /// per-row sums round differently). `hipscope serve` sets it above its slot count, so that a
    /// decode step of several sequences answers each one as it would be answered alone. A
    /// backend whose paths agree, or that does not hold them equal yet (the GPU's), ignores it.
    fn set_exact_rows_below(&mut self, rows: usize);

    /// dst[dst_off..+len] = src[src_off..+len].
    fn copy(
        &mut self,
        src: Buf,
        src_off: usize,
        dst: Buf,
        dst_off: usize,
        len: usize,
    ) -> Result<()>;
}

/// The activation of a gated feed-forward ([`Ops::matmul_glu`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glu {
    /// silu(gate) * up (SwiGLU: llama, Qwen, Mistral...).
    Silu,
    /// gelu(gate) * up, GELU in its tanh form as ggml computes it (GeGLU: Gemma).
    GeluTanh,
}

/// The per-head RMS norms of queries and keys before RoPE ([`Ops::rope_attention`]): Qwen 3's
/// and Gemma 3's `attn_q_norm` / `attn_k_norm`, each over one head's `head_dim` values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeadNorms {
    pub q: Option<Weight>,
    pub k: Option<Weight>,
    pub eps: f32,
}

impl HeadNorms {
    /// No norms (llama, Qwen 2, gpt-oss...).
    pub const NONE: HeadNorms = HeadNorms {
        q: None,
        k: None,
        eps: 0.0,
    };
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
    /// The sequence whose cache region the call reads and writes (0 but in a batch of several
    /// sequences: [`super::KvLayout::with_seqs`]).
    pub seq: usize,
    /// The first row of q, k, v and the output this call reads and writes (0 but for a later
    /// group of a batch of several sequences).
    pub row0: usize,
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

/// One row of a decode step of several sequences ([`Ops::rope_attention_rows`]): its sequence
/// and its position in that sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqPos {
    pub seq: usize,
    pub pos: usize,
}

/// [`Ops::matmul_qkv`] as separate ops: the three products, then the biases.
#[allow(clippy::too_many_arguments)]
pub fn qkv_separately<B: Ops + ?Sized>(
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

/// [`Ops::matmul_glu`] as separate ops: gate, up, then SwiGLU or GeGLU.
#[allow(clippy::too_many_arguments)]
pub fn glu_separately<B: Ops + ?Sized>(
    be: &mut B,
    w: [Weight; 2],
    x: Buf,
    gate: Buf,
    up: Buf,
    n_tokens: usize,
    ffn_dim: usize,
    act: Glu,
    layer: u32,
) -> Result<()> {
    be.matmul(w[0], x, gate, n_tokens, OpLabel::layer(layer, "ffn_gate"))?;
    be.matmul(w[1], x, up, n_tokens, OpLabel::layer(layer, "ffn_up"))?;
    let len = n_tokens * ffn_dim;
    match act {
        Glu::Silu => be.swiglu(gate, up, len, OpLabel::layer(layer, "ffn_swiglu")),
        Glu::GeluTanh => be.geglu(gate, up, len, OpLabel::layer(layer, "ffn_geglu")),
    }
}

/// [`Ops::rms_norm_add`] as separate ops: the norm into `tmp`, then the add.
#[allow(clippy::too_many_arguments)]
pub fn norm_add_separately<B: Ops + ?Sized>(
    be: &mut B,
    x: Buf,
    weight: Weight,
    acc: Buf,
    tmp: Buf,
    n_tokens: usize,
    dim: usize,
    eps: f32,
    label: OpLabel,
    add_label: OpLabel,
) -> Result<()> {
    be.rms_norm(x, weight, tmp, n_tokens, dim, eps, label)?;
    be.add(acc, tmp, n_tokens * dim, add_label)
}

/// [`Ops::matmul_add`] as separate ops: the product into `tmp`, then the add.
#[allow(clippy::too_many_arguments)]
pub fn add_separately<B: Ops + ?Sized>(
    be: &mut B,
    w: Weight,
    x: Buf,
    acc: Buf,
    tmp: Buf,
    n_tokens: usize,
    dim: usize,
    label: OpLabel,
    add_label: OpLabel,
) -> Result<()> {
    be.matmul(w, x, tmp, n_tokens, label)?;
    be.add(acc, tmp, n_tokens * dim, add_label)
}

/// The per-head norms of [`HeadNorms`] as separate ops, in place: q's `n_heads` and k's
/// `n_kv_heads` heads of `head_dim` over rows `0..n_tokens` (`heads`: those three).
pub fn head_norms_separately<B: Ops + ?Sized>(
    be: &mut B,
    q: Buf,
    k: Buf,
    norms: &HeadNorms,
    n_tokens: usize,
    (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
    layer: u32,
) -> Result<()> {
    let heads = [
        (q, norms.q, n_heads, "attn_q_norm"),
        (k, norms.k, n_kv_heads, "attn_k_norm"),
    ];
    for (x, w, n, name) in heads {
        if let Some(w) = w {
            let at = OpLabel::layer(layer, name);
            be.rms_norm(x, w, x, n_tokens * n, head_dim, norms.eps, at)?;
        }
    }
    Ok(())
}

/// [`Ops::rope_attention_rows`] as one [`Ops::rope_attention`] a row: the head norms of every row
/// first (a later row's call would be refused them), then each row at its own sequence and
/// position.
#[allow(clippy::too_many_arguments)]
pub fn rope_attention_rows_separately<B: Ops + ?Sized>(
    be: &mut B,
    q: Buf,
    k: Buf,
    v: Buf,
    out: Buf,
    norms: &HeadNorms,
    rope: &RopeParams,
    p: &AttnParams,
    rows: &[SeqPos],
) -> Result<()> {
    let heads = (p.n_heads, p.n_kv_heads, p.head_dim);
    head_norms_separately(be, q, k, norms, rows.len(), heads, p.layer as u32)?;
    for (i, r) in rows.iter().enumerate() {
        let one = AttnParams {
            seq: r.seq,
            row0: i,
            n_tokens: 1,
            pos0: r.pos,
            ..*p
        };
        be.rope_attention(q, k, v, out, &HeadNorms::NONE, rope, &one)?;
    }
    Ok(())
}

/// [`Ops::rope_attention`] as separate ops: the head norms (in place), RoPE of q, of k, then
/// attention. The norms cover rows from 0 (a whole batch), so a later group of a batch of
/// several sequences (`row0` > 0) with norms is refused: the caller normalizes the batch first.
#[allow(clippy::too_many_arguments)]
pub fn rope_attention_separately<B: Ops + ?Sized>(
    be: &mut B,
    q: Buf,
    k: Buf,
    v: Buf,
    out: Buf,
    norms: &HeadNorms,
    rope: &RopeParams,
    p: &AttnParams,
) -> Result<()> {
    let l = p.layer as u32;
    if (norms.q.is_some() || norms.k.is_some()) && p.row0 != 0 {
        return Err(BackendError::Invalid(format!(
            "head norms in a group of rows from {} (normalize the batch before its groups)",
            p.row0
        )));
    }
    let heads = (p.n_heads, p.n_kv_heads, p.head_dim);
    head_norms_separately(be, q, k, norms, p.n_tokens, heads, l)?;
    be.rope(
        q,
        p.row0,
        p.n_tokens,
        p.n_heads,
        p.head_dim,
        p.pos0,
        rope,
        OpLabel::layer(l, "rope_q"),
    )?;
    be.rope(
        k,
        p.row0,
        p.n_tokens,
        p.n_kv_heads,
        p.head_dim,
        p.pos0,
        rope,
        OpLabel::layer(l, "rope_k"),
    )?;
    be.attention(q, k, v, out, p)
}
