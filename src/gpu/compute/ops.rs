//! Norms and element-wise ops (`kernels/infer_ops.hip`): RMS norm, bias and residual adds,
//! SwiGLU, GeGLU, scaling, RoPE.

use super::*;

/// The arguments every rotating kernel takes after the RoPE factors' pointer and `neox` (see
/// `hs_rope_row` in `kernels/prelude.h`): the cosine/sine scale (`attn_factor`, times YaRN's
/// magnitude factor), then YaRN's `ext_factor` (0: no YaRN) and correction dimensions.
pub(super) fn rope_scaling_args(p: &RopeParams) -> [Arg; 4] {
    match &p.yarn {
        Some(y) => [
            Arg::F32(p.attn_factor * y.mscale(p.freq_scale)),
            Arg::F32(y.ext_factor),
            Arg::F32(y.corr_dims[0]),
            Arg::F32(y.corr_dims[1]),
        ],
        None => [
            Arg::F32(p.attn_factor),
            Arg::F32(0.0),
            Arg::F32(0.0),
            Arg::F32(0.0),
        ],
    }
}

impl GpuCompute {
    /// `dst[i] = f(dst[i], src[i])` over `len` elements: one launch of an elementwise kernel.
    pub(super) fn elementwise(
        &mut self,
        f: KernelFn,
        kind: &'static str,
        dst: Buf,
        src: Buf,
        len: usize,
        label: OpLabel,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let d = self.buf(dst, len)?;
        let x = self.buf(src, len)?;
        self.launch(
            label,
            kind,
            f,
            [elementwise_grid(len as u64), 1, 1],
            [256, 1, 1],
            &[Arg::Ptr(d.ptr), Arg::Ptr(x.ptr), Arg::U64(len as u64)],
        )?;
        self.wrote(dst);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_rms_norm(
        &mut self,
        x: Buf,
        weight: Weight,
        out: Buf,
        n_tokens: usize,
        dim: usize,
        eps: f32,
        label: OpLabel,
    ) -> Result<()> {
        if n_tokens == 0 {
            return Ok(());
        }
        let w = self.vector(weight, dim)?;
        let xb = self.buf(x, n_tokens * dim)?;
        let ob = self.buf(out, n_tokens * dim)?;
        // Quantized for the matrix-vector products that follow, in the same launch, where the
        // last such product's block size divides the rows and the batch takes that path.
        let fuse_bs = self.fuse_bs_for(label).filter(|&bs| {
            dim.is_multiple_of(q8_block(bs) as usize)
                && n_tokens < self.opts.gemm_min_tokens.max(1)
                && self
                    .ws
                    .as_ref()
                    .is_some_and(|ws| (n_tokens * dim) as u64 <= ws.xq.bytes)
        });
        if let Some(bs) = fuse_bs {
            let (xq, xd) = {
                let ws = self.workspace()?;
                (ws.xq, ws.xd)
            };
            let f = self.kernels.rms_norm_q8;
            // Each row's Q8 blocks spread over blocks of 256 threads, a warp per Q8 block.
            let warps = (256 / self.warp.clamp(1, 256)).max(1) as usize;
            let slices = (dim / q8_block(bs) as usize)
                .div_ceil(warps)
                .clamp(1, MAX_GRID_Y);
            self.launch(
                label,
                "rms_norm + quantize_q8",
                f,
                [n_tokens as u32, slices as u32, 1],
                [256, 1, 1],
                &[
                    Arg::Ptr(xb.ptr),
                    Arg::Ptr(w.ptr),
                    Arg::Ptr(ob.ptr),
                    Arg::Ptr(xq.ptr),
                    Arg::Ptr(xd.ptr),
                    Arg::U32(dim as u32),
                    Arg::F32(eps),
                    Arg::U32(bs),
                ],
            )?;
            self.wrote(out);
            self.produced(out, label);
            self.quant = Some(QuantKey {
                buf: out,
                version: self.bufs[out.0 as usize].version,
                bs,
                n_tokens,
                dequantized: false,
            });
            return Ok(());
        }
        let f = self.kernels.rms_norm;
        self.launch_norm_rows(f, "rms_norm", [xb, w, ob], n_tokens, dim, eps, label)?;
        self.wrote(out);
        self.produced(out, label);
        Ok(())
    }

    /// A block per row of `dim`: `hs_rms_norm_rows` (y = norm(x) · w) or `hs_rms_norm_add_rows`
    /// (y += norm(x) · w), on `[x, w, y]`.
    #[allow(clippy::too_many_arguments)]
    fn launch_norm_rows(
        &mut self,
        f: KernelFn,
        name: &'static str,
        [x, w, y]: [DeviceBuffer; 3],
        n_tokens: usize,
        dim: usize,
        eps: f32,
        label: OpLabel,
    ) -> Result<()> {
        self.launch(
            label,
            name,
            f,
            [n_tokens as u32, 1, 1],
            [256, 1, 1],
            &[
                Arg::Ptr(x.ptr),
                Arg::Ptr(w.ptr),
                Arg::Ptr(y.ptr),
                Arg::U32(dim as u32),
                Arg::F32(eps),
            ],
        )
    }

    /// acc += rms_norm(x) · weight over `n_tokens` rows of `dim`, one launch (Gemma's norms
    /// after attention and after the feed-forward, with the residual add).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_rms_norm_add(
        &mut self,
        x: Buf,
        weight: Weight,
        acc: Buf,
        n_tokens: usize,
        dim: usize,
        eps: f32,
        label: OpLabel,
    ) -> Result<()> {
        if n_tokens == 0 {
            return Ok(());
        }
        let w = self.vector(weight, dim)?;
        let xb = self.buf(x, n_tokens * dim)?;
        let ab = self.buf(acc, n_tokens * dim)?;
        let f = self.kernels.rms_norm_add;
        self.launch_norm_rows(f, "rms_norm + add", [xb, w, ab], n_tokens, dim, eps, label)?;
        self.wrote(acc);
        Ok(())
    }

    pub(super) fn launch_add_bias(
        &mut self,
        x: Buf,
        bias: Weight,
        n_tokens: usize,
        label: OpLabel,
    ) -> Result<()> {
        let width = self.weight(bias)?.cols;
        let b = self.vector(bias, width)?;
        let n = (n_tokens * width) as u64;
        if n == 0 {
            return Ok(());
        }
        let xb = self.buf(x, n as usize)?;
        let f = self.kernels.add_bias;
        self.launch(
            label,
            "add_bias",
            f,
            [elementwise_grid(n), 1, 1],
            [256, 1, 1],
            &[
                Arg::Ptr(xb.ptr),
                Arg::Ptr(b.ptr),
                Arg::U32(width as u32),
                Arg::U64(n),
            ],
        )?;
        self.wrote(x);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_rope(
        &mut self,
        x: Buf,
        row0: usize,
        n_tokens: usize,
        n_heads: usize,
        head_dim: usize,
        pos0: usize,
        p: &RopeParams,
        label: OpLabel,
    ) -> Result<()> {
        let half = p.pairs(head_dim)?;
        if half > MAX_ROPE_PAIRS {
            return Err(invalid(format!(
                "RoPE over {} pairs: the kernel rotates at most {MAX_ROPE_PAIRS}",
                half
            )));
        }
        if n_tokens == 0 || half == 0 {
            return Ok(());
        }
        let factors = match p.freq_factors {
            Some(f) => Arg::Ptr(self.vector(f, half)?.ptr),
            None => Arg::U64(0),
        };
        let (pos0, pos_dev) = self.step_position(pos0, None)?;
        let width = n_heads * head_dim;
        let xb = self.buf(x, (row0 + n_tokens) * width)?;
        let [mscale, ext_factor, corr_lo, corr_hi] = rope_scaling_args(p);
        let f = self.kernels.rope;
        self.launch(
            label,
            if p.neox { "rope_neox" } else { "rope" },
            f,
            [n_tokens as u32, 1, 1],
            [128, 1, 1],
            &[
                // A later group of a multi-sequence batch: its rows, by the pointer.
                Arg::Ptr(xb.ptr.offset((row0 * width * 4) as u64)),
                Arg::U32(n_heads as u32),
                Arg::U32(head_dim as u32),
                Arg::U32(p.n_rot as u32),
                pos0,
                Arg::F32(p.freq_scale),
                Arg::F32(rope_theta_scale(p.base, p.n_rot)),
                factors,
                Arg::U32(p.neox as u32),
                mscale,
                ext_factor,
                corr_lo,
                corr_hi,
                pos_dev,
            ],
        )?;
        self.wrote(x);
        Ok(())
    }

    pub(super) fn launch_scale(
        &mut self,
        x: Buf,
        len: usize,
        factor: f32,
        label: OpLabel,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let xb = self.buf(x, len)?;
        let f = self.kernels.scale;
        self.launch(
            label,
            "scale",
            f,
            [elementwise_grid(len as u64), 1, 1],
            [256, 1, 1],
            &[Arg::Ptr(xb.ptr), Arg::F32(factor), Arg::U64(len as u64)],
        )?;
        self.wrote(x);
        Ok(())
    }
}
