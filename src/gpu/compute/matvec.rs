//! Matrix products of decode-sized batches (`kernels/infer_matvec.hip`): quantized weights
//! times Q8 activations (quantized once per input version), up to 8 tokens per launch; larger
//! batches go to the prefill GEMM (`dequant`). A quantized type's one-token products are fused
//! launches (bias and residual add, Q/K/V, gate and up with SwiGLU in the epilogue). The kernels
//! and their launch labels come from the type table (`plan.rs`, through `kernel_set::TypeFns`).

use super::kernel_set::{OneToken, TypeFns};
use super::*;

/// What a fused one-token launch over some weights needs: their common type, shape and kernels.
struct FusedShape {
    bs: u32,
    cols: usize,
    rows: Vec<usize>,
    bufs: Vec<DeviceBuffer>,
    fns: TypeFns,
    one: OneToken,
}

/// A fused launch's weights before its kernels are resolved.
struct FusedPlan {
    ty: GgmlType,
    bs: u32,
    cols: usize,
    rows: Vec<usize>,
    bufs: Vec<DeviceBuffer>,
}

impl FusedShape {
    /// Blocks of a one-token launch over `rows` rows (the wide kernels take two a warp).
    fn grid(&self, rows: usize, warp: u32) -> [u32; 3] {
        [
            mv_grid(rows.div_ceil(self.fns.k.mv1_rows_per_warp()), warp),
            1,
            1,
        ]
    }
}

impl GpuCompute {
    /// The activation arguments of a fused one-token launch over `cols` of `x`: its Q8 quants
    /// and scales (quantized here unless the workspace holds them), or, for the f32 variants,
    /// the input itself and a null pointer.
    fn fused_input(
        &mut self,
        one: &OneToken,
        x: Buf,
        cols: usize,
        bs: u32,
        label: OpLabel,
    ) -> Result<(Arg, Arg)> {
        if one.f32.is_some() {
            return Ok((Arg::Ptr(self.buf(x, cols)?.ptr), Arg::U64(0)));
        }
        self.quantize_input(x, 1, cols, bs, false, label)?;
        let ws = self.workspace()?;
        Ok((Arg::Ptr(ws.xq.ptr), Arg::Ptr(ws.xd.ptr)))
    }

    /// The fused one-token path for products of `ws` with one input, where it applies: one token,
    /// every weight a matrix of the same quantized type and width, the input planned for.
    fn fused_shape(&mut self, ws: &[Weight], n_tokens: usize) -> Result<Option<FusedShape>> {
        let Some(p) = self.fused_plan(ws, n_tokens)? else {
            return Ok(None);
        };
        let fns = self.type_fns(p.ty)?;
        let Some(one) = fns.one else {
            return Ok(None);
        };
        Ok(Some(FusedShape {
            bs: p.bs,
            cols: p.cols,
            rows: p.rows,
            bufs: p.bufs,
            fns,
            one,
        }))
    }

    /// The common type and shape of `ws` where a fused one-token launch applies (every
    /// quantized type has its one-token kernels: the type table generates them).
    fn fused_plan(&self, ws: &[Weight], n_tokens: usize) -> Result<Option<FusedPlan>> {
        if n_tokens != 1 || self.n_batch() == 0 || self.ws.is_none() {
            return Ok(None);
        }
        let first = self.weight(ws[0])?;
        let (ty, cols) = (first.ty, first.cols);
        let Some(ActFormat::Q8 { bs }) = type_kernels(ty).map(|k| k.act) else {
            return Ok(None);
        };
        let mut rows = Vec::with_capacity(ws.len());
        let mut bufs = Vec::with_capacity(ws.len());
        for &w in ws {
            let gw = self.weight(w)?;
            if gw.vector || gw.ty != ty || gw.cols != cols {
                return Ok(None);
            }
            rows.push(gw.rows);
            bufs.push(gw.buf);
        }
        Ok(Some(FusedPlan {
            ty,
            bs,
            cols,
            rows,
            bufs,
        }))
    }

    /// Whether a product of `ws` over `n_tokens` rows runs as one fused launch here (what the
    /// lockstep of `selftest --compute` compares as a fused op).
    pub(super) fn fuses(&self, ws: &[Weight], n_tokens: usize) -> bool {
        matches!(self.fused_plan(ws, n_tokens), Ok(Some(_)))
    }

    /// acc += W · x for one token in one launch (the residual add in the product's epilogue);
    /// otherwise the product into `tmp` and a separate add.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_matmul_add(
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
        let shape = match self.fused_shape(&[w], n_tokens)? {
            Some(s) if s.rows[0] == dim && x != acc => s,
            _ => {
                self.launch_matmul(w, x, tmp, n_tokens, label)?;
                return self.elementwise(
                    self.kernels.add,
                    "add",
                    acc,
                    tmp,
                    n_tokens * dim,
                    add_label,
                );
            }
        };
        self.buf(x, shape.cols)?;
        let abuf = self.buf(acc, dim)?;
        let (xq, xd) = self.fused_input(&shape.one, x, shape.cols, shape.bs, label)?;
        self.launch(
            label,
            shape.fns.k.names.label_mv1_add,
            shape.one.f32.map_or(shape.one.mv1, |f| f[0]),
            shape.grid(dim, self.warp),
            [MV_THREADS, 1, 1],
            &[
                Arg::Ptr(shape.bufs[0].ptr),
                xq,
                xd,
                Arg::Ptr(abuf.ptr),
                Arg::U64(0),
                Arg::U32(dim as u32),
                Arg::U32(shape.cols as u32),
                Arg::U32(1),
                Arg::U64(0),
                Arg::U32(0),
                Arg::U32(0),
            ],
        )?;
        self.wrote(acc);
        Ok(())
    }

    /// Q, K and V (and their biases) for one token in one launch; otherwise separate ops.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_matmul_qkv(
        &mut self,
        w: [Weight; 3],
        bias: [Option<Weight>; 3],
        x: Buf,
        out: [Buf; 3],
        n_tokens: usize,
        layer: u32,
    ) -> Result<()> {
        let shape = match self.fused_shape(&w, n_tokens)? {
            Some(s) if !out.contains(&x) => s,
            _ => {
                return crate::gpu::backend::qkv_separately(self, w, bias, x, out, n_tokens, layer);
            }
        };
        self.buf(x, shape.cols)?;
        let mut outs = [Arg::U64(0); 3];
        let mut biases = [Arg::U64(0); 3];
        for i in 0..3 {
            outs[i] = Arg::Ptr(self.buf(out[i], shape.rows[i])?.ptr);
            if let Some(b) = bias[i] {
                biases[i] = Arg::Ptr(self.vector(b, shape.rows[i])?.ptr);
            }
        }
        let label = OpLabel::layer(layer, "attn_qkv");
        let (xq, xd) = self.fused_input(&shape.one, x, shape.cols, shape.bs, label)?;
        let total: usize = shape.rows.iter().sum();
        self.launch(
            label,
            shape.fns.k.names.label_qkv,
            shape.one.f32.map_or(shape.one.qkv, |f| f[1]),
            shape.grid(total, self.warp),
            [MV_THREADS, 1, 1],
            &[
                Arg::Ptr(shape.bufs[0].ptr),
                Arg::Ptr(shape.bufs[1].ptr),
                Arg::Ptr(shape.bufs[2].ptr),
                outs[0],
                outs[1],
                outs[2],
                biases[0],
                biases[1],
                biases[2],
                xq,
                xd,
                Arg::U32(shape.rows[0] as u32),
                Arg::U32(shape.rows[1] as u32),
                Arg::U32(shape.rows[2] as u32),
                Arg::U32(shape.cols as u32),
            ],
        )?;
        for o in out {
            self.wrote(o);
        }
        Ok(())
    }

    /// gate = act(Wgate · x) * (Wup · x) for one token in one launch (SiLU or GELU in the
    /// kernel's epilogue); otherwise separate ops.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_matmul_glu(
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
    ) -> Result<()> {
        let shape = match self.fused_shape(&[w_gate, w_up], n_tokens)? {
            Some(s) if s.rows == [ffn_dim, ffn_dim] && x != gate => s,
            _ => {
                let w = [w_gate, w_up];
                return glu_separately(self, w, x, gate, up, n_tokens, ffn_dim, act, layer);
            }
        };
        self.buf(x, shape.cols)?;
        let g = self.buf(gate, ffn_dim)?;
        let label = OpLabel::layer(layer, "ffn_gate_up");
        let (xq, xd) = self.fused_input(&shape.one, x, shape.cols, shape.bs, label)?;
        self.launch(
            label,
            shape.fns.k.names.label_swiglu,
            shape.one.f32.map_or(shape.one.swiglu, |f| f[2]),
            [mv_grid(ffn_dim, self.warp), 1, 1],
            [MV_THREADS, 1, 1],
            &[
                Arg::Ptr(shape.bufs[0].ptr),
                Arg::Ptr(shape.bufs[1].ptr),
                xq,
                xd,
                Arg::Ptr(g.ptr),
                Arg::U32(ffn_dim as u32),
                Arg::U32(shape.cols as u32),
                Arg::U64(0),
                Arg::U64(0),
                Arg::U64(0),
                Arg::U32(0),
                // No experts (ids null): k names the activation.
                Arg::U32(match act {
                    Glu::Silu => 0,
                    Glu::GeluTanh => 1,
                }),
            ],
        )?;
        self.wrote(gate);
        Ok(())
    }

    pub(super) fn launch_matmul(
        &mut self,
        w: Weight,
        x: Buf,
        out: Buf,
        n_tokens: usize,
        label: OpLabel,
    ) -> Result<()> {
        let idx = w.0 as usize;
        let (ty, rows, cols, vector) = {
            let gw = self.weight(w)?;
            (gw.ty, gw.rows, gw.cols, gw.vector)
        };
        if vector {
            return Err(invalid(format!(
                "{} is a vector, not a matrix",
                self.weights[idx].name
            )));
        }
        if n_tokens == 0 {
            return Ok(());
        }
        let tk = type_kernels(ty).ok_or_else(|| invalid(format!("{ty} has no kernels")))?;
        let xbuf = self.buf(x, n_tokens * cols)?;
        let obuf = self.buf(out, n_tokens * rows)?;
        if x == out {
            return Err(invalid(
                "a matrix product cannot write its own input".into(),
            ));
        }
        if n_tokens > self.n_batch() {
            return Err(invalid(format!(
                "{n_tokens} tokens in one product; the plan allows {}",
                self.n_batch()
            )));
        }
        let gemm = n_tokens >= self.opts.gemm_min_tokens.max(1) && self.workspace()?.xdq.is_some();
        if gemm {
            self.matmul_gemm(idx, tk, x, xbuf, obuf, n_tokens, label)?;
        } else {
            self.matmul_mv(idx, tk, x, xbuf, obuf, n_tokens, label)?;
        }
        self.wrote(out);
        Ok(())
    }

    /// The Q8 block size the op labelled `label` (an RMS norm, the attention) quantizes its
    /// output for in its own launch: what the product after it asked for at the last step, else
    /// the last quantization's.
    pub(super) fn fuse_bs_for(&self, label: OpLabel) -> Option<u32> {
        self.fuse_bs.get(&label).copied().or(self.norm_bs)
    }

    /// The op labelled `label` wrote `out`, which it could have quantized in its own launch: the
    /// first product that quantizes `out` teaches it the block size (`fuse_bs_for`).
    pub(super) fn produced(&mut self, out: Buf, label: OpLabel) {
        self.producer = Some((out, self.bufs[out.0 as usize].version, label));
    }

    /// Quantizes `n_tokens` rows of `cols` of buffer `x` for `bs`-element blocks into the
    /// workspace (quants + scales, or their dequantized copy for the GEMM path), unless the
    /// workspace already holds exactly that.
    pub(super) fn quantize_input(
        &mut self,
        x: Buf,
        n_tokens: usize,
        cols: usize,
        bs: u32,
        dequantized: bool,
        label: OpLabel,
    ) -> Result<()> {
        let src = self.buf(x, n_tokens * cols)?;
        let version = self.bufs[x.0 as usize].version;
        // The first product after an op that could have quantized for it: that op learns the
        // block size (fuse_bs_for), whether or not it already quantized for this one.
        if !dequantized
            && let Some((buf, v, op)) = self.producer
            && buf == x
            && v == version
        {
            self.producer = None;
            self.fuse_bs.insert(op, bs);
        }
        let key = QuantKey {
            buf: x,
            version,
            bs,
            n_tokens,
            dequantized,
        };
        if self.quant == Some(key) {
            return Ok(());
        }
        let blk = q8_block(bs);
        if !cols.is_multiple_of(blk as usize) {
            return Err(invalid(format!(
                "rows of {cols} are not whole blocks of {blk}"
            )));
        }
        let ws = self.workspace()?;
        let elems = (n_tokens * cols) as u64;
        if elems > ws.xq.bytes {
            return Err(invalid(format!(
                "{n_tokens} tokens × {cols} exceed the planned batch"
            )));
        }
        let (xq, xd, xdq) = if dequantized {
            let xdq = ws.xdq.ok_or_else(|| {
                invalid("the GEMM path was not planned for this batch size".into())
            })?;
            (Arg::U64(0), Arg::U64(0), Arg::Ptr(xdq.ptr))
        } else {
            (Arg::Ptr(ws.xq.ptr), Arg::Ptr(ws.xd.ptr), Arg::U64(0))
        };
        let n_blocks = elems / blk as u64;
        let f = self.kernels.quantize;
        self.launch(
            label,
            "quantize_q8",
            f,
            // A warp per block of `bs` (the kernel loops over the blocks beyond the grid).
            [
                (n_blocks * self.warp as u64).div_ceil(128).clamp(1, 65_535) as u32,
                1,
                1,
            ],
            [128, 1, 1],
            &[
                Arg::Ptr(src.ptr),
                xq,
                xd,
                xdq,
                Arg::U32(bs),
                Arg::U64(n_blocks),
            ],
        )?;
        self.quant = Some(key);
        if !dequantized {
            self.norm_bs = Some(bs);
        }
        Ok(())
    }

    /// The matrix-vector path: up to 8 tokens per launch.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_mv(
        &mut self,
        gw_idx: usize,
        tk: TypeKernels,
        x: Buf,
        xbuf: DeviceBuffer,
        out: DeviceBuffer,
        n_tokens: usize,
        label: OpLabel,
    ) -> Result<()> {
        let (ty, rows, cols, wbuf) = {
            let w = &self.weights[gw_idx];
            (w.ty, w.rows, w.cols, w.buf)
        };
        let fns = self.type_fns(ty)?;
        if let (1, ActFormat::Q8 { bs }, Some(one)) = (n_tokens, tk.act, fns.one) {
            let (xq, xd) = self.fused_input(&one, x, cols, bs, label)?;
            return self.launch(
                label,
                fns.k.names.label_mv1,
                one.f32.map_or(one.mv1, |k| k[0]),
                [
                    mv_grid(rows.div_ceil(fns.k.mv1_rows_per_warp()), self.warp),
                    1,
                    1,
                ],
                [MV_THREADS, 1, 1],
                &[
                    Arg::Ptr(wbuf.ptr),
                    xq,
                    xd,
                    Arg::Ptr(out.ptr),
                    Arg::U64(0),
                    Arg::U32(rows as u32),
                    Arg::U32(cols as u32),
                    Arg::U32(0),
                    Arg::U64(0),
                    Arg::U32(0),
                    Arg::U32(0),
                ],
            );
        }
        if let ActFormat::Q8 { bs } = tk.act {
            self.quantize_input(x, n_tokens, cols, bs, false, label)?;
        }
        let (xq, xd) = {
            let ws = self.workspace()?;
            (ws.xq, ws.xd)
        };
        let nblocks = match tk.act {
            ActFormat::Q8 { bs } => cols / q8_block(bs) as usize,
            ActFormat::F32 => 0,
        };
        // Float weights: a block per row (`mv_float`; a grid of at most 65,535 loops);
        // quantized ones: a warp per row.
        let grid = match tk.act {
            ActFormat::F32 => rows.clamp(1, MAX_GRID_Y) as u32,
            ActFormat::Q8 { .. } => mv_grid(rows, self.warp),
        };
        for (t0, nt) in mv_chunks(n_tokens) {
            self.launch(
                label,
                fns.k.names.label_mv,
                fns.mv,
                [grid, 1, 1],
                [MV_THREADS, 1, 1],
                &[
                    Arg::Ptr(wbuf.ptr),
                    Arg::Ptr(xq.ptr.offset((t0 * cols) as u64)),
                    Arg::Ptr(xd.ptr.offset((t0 * nblocks * 8) as u64)),
                    Arg::Ptr(xbuf.ptr.offset((t0 * cols * 4) as u64)),
                    Arg::Ptr(out.ptr.offset((t0 * rows * 4) as u64)),
                    Arg::U32(rows as u32),
                    Arg::U32(cols as u32),
                    Arg::U32(nt as u32),
                    Arg::U64(0),
                    Arg::U32(0),
                    Arg::U32(0),
                ],
            )?;
        }
        Ok(())
    }
}
