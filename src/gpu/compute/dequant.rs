//! Row dequantization (`kernels/infer_dequant.hip`): embedding lookups, and the prefill GEMM
//! (dequantized weight tiles times the Q8-rounded batch through `gemm_f32`).

use super::*;

impl GpuCompute {
    pub(super) fn launch_embed(&mut self, table: Weight, tokens: &[u32], out: Buf) -> Result<()> {
        let (ty, rows, cols, wbuf) = {
            let w = self.weight(table)?;
            (w.ty, w.rows, w.cols, w.buf)
        };
        let n = tokens.len();
        if n == 0 {
            return Ok(());
        }
        if n > self.n_batch() {
            return Err(invalid(format!(
                "{n} tokens in one step; the plan allows {}",
                self.n_batch()
            )));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= rows) {
            return Err(invalid(format!(
                "token id {bad} is outside the vocabulary of {rows} tokens"
            )));
        }
        let o = self.buf(out, n * cols)?;
        let tok_buf = self.workspace()?.tokens;
        // A decode step (one token) is recorded for graph replay; its token is written by the
        // step's own setter instead of an upload.
        if !self.begin_decode_step(n, tok_buf.ptr, tokens[0])? {
            self.host_bytes.clear();
            self.host_bytes
                .extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
            let l = self.label(OpLabel::global("embed"), "tokens")?;
            let bytes = std::mem::take(&mut self.host_bytes);
            let r = self.gpu_mut()?.upload(l, tok_buf, &bytes).map_err(gpu_err);
            self.host_bytes = bytes;
            r?;
        }
        let tk = type_kernels(ty).ok_or_else(|| invalid(format!("{ty} has no kernels")))?;
        let (_, dq) = self.kernels.by_type[&ty];
        let row_bytes = (cols / ty.block_len() * ty.block_bytes()) as u64;
        self.launch(
            OpLabel::global("embed"),
            dequant_name(tk.suffix),
            dq,
            [
                (cols as u64).div_ceil(256).clamp(1, 1024) as u32,
                n as u32,
                1,
            ],
            [256, 1, 1],
            &[
                Arg::Ptr(wbuf.ptr),
                Arg::Ptr(tok_buf.ptr),
                Arg::Ptr(o.ptr),
                Arg::U32(cols as u32),
                Arg::U64(row_bytes),
                Arg::U32(rows as u32),
            ],
        )?;
        self.wrote(out);
        Ok(())
    }

    /// The GEMM path: the input rounded through Q8 as the integer path rounds it, weight tiles
    /// dequantized to f32, `out[t, r0..r0+R] = tile · x[t]` by `gemm_f32` (column-major:
    /// C(rows × n) = Tileᵀ(R × cols) · X(cols × n)).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_gemm(
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
        let b = match tk.act {
            ActFormat::Q8 { bs } => {
                self.quantize_input(x, n_tokens, cols, bs, true, label)?;
                self.workspace()?
                    .xdq
                    .ok_or_else(|| invalid("no GEMM input buffer".into()))?
            }
            ActFormat::F32 => xbuf,
        };
        let (one, zero) = {
            let g = self.gpu_mut()?;
            (
                g.scalar(1.0).map_err(gpu_err)?,
                g.scalar(0.0).map_err(gpu_err)?,
            )
        };
        let gemm_label = self.label(label, "gemm")?;
        if ty == GgmlType::F32 {
            // Row-major rows × cols is column-major cols × rows: used as it is.
            let g = gemm_args(wbuf, b, out, rows, 0, rows, n_tokens, cols, one, zero);
            self.gpu_mut()?.gemm_f32(gemm_label, &g).map_err(gpu_err)?;
            return Ok(());
        }
        let tile = self
            .workspace()?
            .tile
            .ok_or_else(|| invalid("no weight tile buffer (GEMM path not planned)".into()))?;
        let per = tile_rows(rows, cols, tile.bytes);
        let row_bytes = (cols / ty.block_len() * ty.block_bytes()) as u64;
        let (_, dq) = self.kernels.by_type[&ty];
        let dq_name = dequant_name(tk.suffix);
        let mut r0 = 0;
        while r0 < rows {
            let r = per.min(rows - r0);
            self.launch(
                label,
                dq_name,
                dq,
                [
                    (cols as u64).div_ceil(256).clamp(1, 1024) as u32,
                    r as u32,
                    1,
                ],
                [256, 1, 1],
                &[
                    Arg::Ptr(wbuf.ptr.offset(r0 as u64 * row_bytes)),
                    Arg::U64(0),
                    Arg::Ptr(tile.ptr),
                    Arg::U32(cols as u32),
                    Arg::U64(row_bytes),
                    Arg::U32(r as u32),
                ],
            )?;
            let g = gemm_args(tile, b, out, r, r0, rows, n_tokens, cols, one, zero);
            self.gpu_mut()?.gemm_f32(gemm_label, &g).map_err(gpu_err)?;
            r0 += r;
        }
        Ok(())
    }
}

fn dequant_name(suffix: &str) -> &'static str {
    match suffix {
        "f32" => "dequant_f32",
        "f16" => "dequant_f16",
        "bf16" => "dequant_bf16",
        "q4_0" => "dequant_q4_0",
        "q4_1" => "dequant_q4_1",
        "q5_0" => "dequant_q5_0",
        "q5_1" => "dequant_q5_1",
        "q8_0" => "dequant_q8_0",
        "q4_k" => "dequant_q4_k",
        "q5_k" => "dequant_q5_k",
        "mxfp4" => "dequant_mxfp4",
        _ => "dequant_q6_k",
    }
}

/// `out[t, r0 .. r0 + r] = A · x[t]` for `n` tokens, A an `r × cols` row-major block at `a`,
/// as a column-major GEMM (m = r, n = tokens, k = cols; C offset by r0 rows, ldc = all rows).
#[allow(clippy::too_many_arguments)]
fn gemm_args(
    a: DeviceBuffer,
    x: DeviceBuffer,
    out: DeviceBuffer,
    r: usize,
    r0: usize,
    rows: usize,
    n: usize,
    cols: usize,
    one: crate::gpu::device::DevicePtr,
    zero: crate::gpu::device::DevicePtr,
) -> GemmF32 {
    GemmF32 {
        transa: Op::T,
        transb: Op::N,
        m: r as i32,
        n: n as i32,
        k: cols as i32,
        alpha: one,
        a: a.ptr,
        lda: cols as i32,
        b: x.ptr,
        ldb: cols as i32,
        beta: zero,
        c: out.ptr.offset(r0 as u64 * 4),
        ldc: rows as i32,
    }
}
