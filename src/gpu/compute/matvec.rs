//! Matrix products of decode-sized batches (`kernels/infer_matvec.hip`): quantized weights
//! times Q8 activations (quantized once per input version), up to 8 tokens per launch; larger
//! batches go to the prefill GEMM (`dequant`).

use super::*;

impl GpuCompute {
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
        if !cols.is_multiple_of(bs as usize) {
            return Err(invalid(format!(
                "rows of {cols} are not whole blocks of {bs}"
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
        let n_blocks = elems / bs as u64;
        let f = self.kernels.quantize;
        self.launch(
            label,
            "quantize_q8",
            f,
            [n_blocks.div_ceil(128).clamp(1, 65_535) as u32, 1, 1],
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
        if let ActFormat::Q8 { bs } = tk.act {
            self.quantize_input(x, n_tokens, cols, bs, false, label)?;
        }
        let (mv, _) = self.kernels.by_type[&ty];
        let (xq, xd) = {
            let ws = self.workspace()?;
            (ws.xq, ws.xd)
        };
        let kname = mv_name(tk.suffix);
        let nblocks = match tk.act {
            ActFormat::Q8 { bs } => cols / bs as usize,
            ActFormat::F32 => 0,
        };
        for (t0, nt) in mv_chunks(n_tokens) {
            self.launch(
                label,
                kname,
                mv,
                [mv_grid(rows, self.warp), 1, 1],
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
                ],
            )?;
        }
        Ok(())
    }
}

fn mv_name(suffix: &str) -> &'static str {
    match suffix {
        "f32" => "mv_f32",
        "f16" => "mv_f16",
        "bf16" => "mv_bf16",
        "q4_0" => "mv_q4_0",
        "q4_1" => "mv_q4_1",
        "q5_0" => "mv_q5_0",
        "q5_1" => "mv_q5_1",
        "q8_0" => "mv_q8_0",
        "q4_k" => "mv_q4_k",
        "q5_k" => "mv_q5_k",
        _ => "mv_q6_k",
    }
}
