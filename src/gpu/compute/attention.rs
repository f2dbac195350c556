//! The KV-cache store and causal attention (`kernels/infer_attention.hip`).

use super::*;

impl GpuCompute {
    /// The position a launch passes: `(pos0, pos_dev)`. Inside a decode step recorded for graph
    /// replay the kernels read it from the step block (`pos_dev`), so one graph serves every
    /// position; otherwise `pos_dev` is null and `pos0` is the position.
    pub(super) fn step_position(&mut self, pos: usize) -> Result<(Arg, Arg)> {
        match self.gpu_mut()?.graph_position(pos as u32).map_err(gpu_err)? {
            Some(dev) => Ok((Arg::U32(0), Arg::Ptr(dev))),
            None => Ok((Arg::U32(pos as u32), Arg::U64(0))),
        }
    }

    pub(super) fn launch_attention(
        &mut self,
        q: Buf,
        k: Buf,
        v: Buf,
        out: Buf,
        p: &AttnParams,
        rope: Option<&RopeParams>,
    ) -> Result<()> {
        let kv_dim = p.n_kv_heads * p.head_dim;
        let q_dim = p.n_heads * p.head_dim;
        let (k_cache, v_cache, layer_off, slots) = {
            let kv = self
                .kv
                .as_ref()
                .ok_or_else(|| invalid("attention before the KV cache was allocated".into()))?;
            kv.layout.check_attention(p)?;
            (
                kv.k,
                kv.v,
                kv.layout.offset(p.layer) as u64,
                kv.layout.slots(p.layer),
            )
        };
        if !p.n_heads.is_multiple_of(p.n_kv_heads) || p.head_dim > MAX_HEAD_DIM {
            return Err(invalid(format!(
                "{} heads over {} KV heads of {} dimensions (heads must be a multiple of KV \
                 heads; at most {MAX_HEAD_DIM} dimensions)",
                p.n_heads, p.n_kv_heads, p.head_dim
            )));
        }
        if p.n_tokens == 0 {
            return Ok(());
        }
        if p.n_tokens > MAX_GRID_Y {
            return Err(invalid(format!("{} query rows in one call", p.n_tokens)));
        }
        let (pos0, pos_dev) = self.step_position(p.pos0)?;
        let qb = self.buf(q, p.n_tokens * q_dim)?;
        let kb = self.buf(k, p.n_tokens * kv_dim)?;
        let vb = self.buf(v, p.n_tokens * kv_dim)?;
        let ob = self.buf(out, p.n_tokens * q_dim)?;
        let eb = self.opts.kv.bytes();
        let n = (p.n_tokens * kv_dim) as u64;
        let li = p.layer as u32;
        let (store, store_name, attn, attn_name, attn_q8_name) = match self.opts.kv {
            KvType::F32 => (
                self.kernels.kv_store_f32,
                "kv_store_f32",
                self.kernels.attention_f32,
                "attention_f32",
                "attention_f32 + quantize_q8",
            ),
            KvType::F16 => (
                self.kernels.kv_store_f16,
                "kv_store_f16",
                self.kernels.attention_f16,
                "attention_f16",
                "attention_f16 + quantize_q8",
            ),
        };
        match rope {
            Some(r) => {
                let half = r.pairs(p.head_dim)?;
                if half > MAX_ROPE_PAIRS {
                    return Err(invalid(format!(
                        "RoPE over {half} pairs: the kernel rotates at most {MAX_ROPE_PAIRS}"
                    )));
                }
                let factors = match r.freq_factors {
                    Some(f) => Arg::Ptr(self.vector(f, half)?.ptr),
                    None => Arg::U64(0),
                };
                let (f, name) = match self.opts.kv {
                    KvType::F32 => (self.kernels.rope_kv_store_f32, "rope + kv_store_f32"),
                    KvType::F16 => (self.kernels.rope_kv_store_f16, "rope + kv_store_f16"),
                };
                self.launch(
                    OpLabel::layer(li, "rope_qk + kv_store"),
                    name,
                    f,
                    // A block per query head and per key head.
                    [p.n_tokens as u32, (p.n_heads + p.n_kv_heads) as u32, 1],
                    [128, 1, 1],
                    &[
                        Arg::Ptr(qb.ptr),
                        Arg::Ptr(kb.ptr),
                        Arg::Ptr(vb.ptr),
                        Arg::Ptr(k_cache.ptr.offset(layer_off * eb)),
                        Arg::Ptr(v_cache.ptr.offset(layer_off * eb)),
                        Arg::U32(p.n_heads as u32),
                        Arg::U32(p.n_kv_heads as u32),
                        Arg::U32(p.head_dim as u32),
                        Arg::U32(r.n_rot as u32),
                        pos0,
                        Arg::F32(r.freq_scale),
                        Arg::F32(rope_theta_scale(r.base, r.n_rot)),
                        factors,
                        Arg::U32(r.neox as u32),
                        Arg::F32(r.attn_factor),
                        Arg::U32(slots as u32),
                        pos_dev,
                    ],
                )?;
                self.wrote(q);
                self.wrote(k);
            }
            None => {
                self.launch(
                    OpLabel::layer(li, "kv_store"),
                    store_name,
                    store,
                    [elementwise_grid(n), 1, 1],
                    [256, 1, 1],
                    &[
                        Arg::Ptr(kb.ptr),
                        Arg::Ptr(vb.ptr),
                        Arg::Ptr(k_cache.ptr.offset(layer_off * eb)),
                        Arg::Ptr(v_cache.ptr.offset(layer_off * eb)),
                        pos0,
                        Arg::U32(kv_dim as u32),
                        Arg::U32(slots as u32),
                        Arg::U64(n),
                        pos_dev,
                    ],
                )?;
            }
        }
        // Quantized for the output projection in the same launch, as the fused RMS norm does,
        // where the last product's Q8 block divides a head (a projection of another block size
        // quantizes again).
        let fuse_bs = self.norm_bs.filter(|&bs| {
            p.head_dim.is_multiple_of(bs as usize)
                && p.n_tokens < self.opts.gemm_min_tokens.max(1)
                && self
                    .ws
                    .as_ref()
                    .is_some_and(|ws| (p.n_tokens * q_dim) as u64 <= ws.xq.bytes)
        });
        let (xq, xd) = match (fuse_bs, self.ws.as_ref()) {
            (Some(_), Some(ws)) => (Arg::Ptr(ws.xq.ptr), Arg::Ptr(ws.xd.ptr)),
            _ => (Arg::U64(0), Arg::U64(0)),
        };
        self.launch(
            OpLabel::layer(li, "attention"),
            if fuse_bs.is_some() {
                attn_q8_name
            } else {
                attn_name
            },
            attn,
            [p.n_heads as u32, p.n_tokens as u32, 1],
            [128, 1, 1],
            &[
                Arg::Ptr(qb.ptr),
                Arg::Ptr(k_cache.ptr.offset(layer_off * eb)),
                Arg::Ptr(v_cache.ptr.offset(layer_off * eb)),
                Arg::Ptr(ob.ptr),
                Arg::U32(p.n_heads as u32),
                Arg::U32(p.n_kv_heads as u32),
                Arg::U32(p.head_dim as u32),
                pos0,
                Arg::F32(p.scale),
                Arg::U32(p.window as u32),
                Arg::U32(slots as u32),
                Arg::F32(p.softcap),
                xq,
                xd,
                Arg::U32(fuse_bs.unwrap_or(0)),
                pos_dev,
            ],
        )?;
        self.wrote(out);
        if let Some(bs) = fuse_bs {
            self.quant = Some(QuantKey {
                buf: out,
                version: self.bufs[out.0 as usize].version,
                bs,
                n_tokens: p.n_tokens,
                dequantized: false,
            });
        }
        Ok(())
    }
}
