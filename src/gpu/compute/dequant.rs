//! Row dequantization (`kernels/infer_dequant.hip`): embedding lookups, and the prefill GEMM:
//! dequantized weight tiles times the Q8-rounded batch, on the matrix units by default (f16
//! tiles and activations, f32 accumulation: the BLAS's f16 GEMM where it has one, else
//! hipscope's own `hs_gemm_f16` in `kernels/gemm.hip`), or in f32 through `gemm_f32`.
//! [`PrefillPath`] says which; `HIPSCOPE_PREFILL_GEMM` ([`PrefillGemm`]) forces one.

use std::fmt;

use super::*;
use plan::PrefillGemm;

/// Which GEMM multiplies a prompt batch on this device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrefillPath {
    /// f32 tiles through `gemm_f32` (the BLAS's SGEMM or `hs_sgemm`).
    F32 { why: &'static str },
    /// f16 tiles through the BLAS's f16 GEMM (cublasGemmEx, rocblas_gemm_ex).
    BlasF16 { library: String },
    /// f16 tiles through hipscope's own `hs_gemm_f16` on the device's matrix units.
    Own { units: &'static str, forced: bool },
}

impl fmt::Display for PrefillPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrefillPath::F32 { why } => write!(f, "f32 tiles × gemm_f32 ({why})"),
            PrefillPath::BlasF16 { library } => {
                write!(f, "f16 tiles × {library} f16 GEMM (f32 accumulate)")
            }
            PrefillPath::Own { units, forced } => write!(
                f,
                "f16 tiles × own hs_gemm_f16 on {units}{}",
                if *forced {
                    format!(" ({}=own)", PrefillGemm::ENV)
                } else {
                    String::new()
                }
            ),
        }
    }
}

/// The matrix units `hs_gemm_f16` uses on `arch` (the `#if` chain at the head of
/// kernels/mma.h: keep the two in step).
pub fn matrix_units(kind: RuntimeKind, arch: &str) -> &'static str {
    tensor_units(kind, arch).unwrap_or(match kind {
        RuntimeKind::Cuda => "plain FMA (no mma.sync before sm_80)",
        RuntimeKind::Hip => "plain FMA (no matrix units)",
        RuntimeKind::Fake => "plain FMA (test device)",
    })
}

/// The matrix units of `arch`, or `None` where mma.h's tile falls back to plain FMA (where a
/// prompt's attention keeps its FMA kernel, `attention.rs`).
pub fn tensor_units(kind: RuntimeKind, arch: &str) -> Option<&'static str> {
    match kind {
        RuntimeKind::Cuda => match arch.strip_prefix("sm_").and_then(|n| n.parse::<u32>().ok()) {
            Some(n) if n >= 80 => Some("tensor cores (mma.sync m16n8k16)"),
            _ => None,
        },
        RuntimeKind::Hip => {
            let base = arch.split(':').next().unwrap_or(arch);
            if [
                "gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152",
            ]
            .contains(&base)
            {
                Some("WMMA (v_wmma_f32_16x16x16_f16, wave32)")
            } else if ["gfx908", "gfx90a", "gfx940", "gfx941", "gfx942"].contains(&base) {
                Some("MFMA (v_mfma_f32_16x16x16f16, wave64)")
            } else {
                None
            }
        }
        RuntimeKind::Fake => None,
    }
}

/// The prefill GEMM `setting` picks on `gpu`: auto takes the BLAS's f16 GEMM where there is
/// one, else the own kernel.
pub fn choose_prefill(setting: PrefillGemm, gpu: &Gpu) -> std::result::Result<PrefillPath, String> {
    let units = matrix_units(gpu.kind(), &gpu.info().arch);
    Ok(match (setting, gpu.blas_f16()) {
        (PrefillGemm::F32, _) => PrefillPath::F32 {
            why: "HIPSCOPE_PREFILL_GEMM=f32",
        },
        (PrefillGemm::Own, _) => PrefillPath::Own {
            units,
            forced: true,
        },
        (PrefillGemm::Auto | PrefillGemm::Blas, Some(library)) => PrefillPath::BlasF16 { library },
        (PrefillGemm::Auto, None) => PrefillPath::Own {
            units,
            forced: false,
        },
        (PrefillGemm::Blas, None) => {
            return Err(format!(
                "{}=blas, but no BLAS with an f16 GEMM serves this device ({:?})",
                PrefillGemm::ENV,
                gpu.gemm_path()
            ));
        }
    })
}

/// Bytes `n` f16 values take at the start of the tile buffer (rounded up to 256).
fn f16_bytes(n: usize) -> u64 {
    (n as u64 * 2).div_ceil(256) * 256
}

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
        let fns = self.type_fns(ty)?;
        let row_bytes = (cols / ty.block_len() * ty.block_bytes()) as u64;
        self.launch(
            OpLabel::global("embed"),
            fns.k.names.label_dequant,
            fns.dequant_rows,
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

    pub(super) fn live_gpu(&self) -> Result<&Gpu> {
        self.gpu
            .as_ref()
            .ok_or_else(|| BackendError::Device("the device was shut down".into()))
    }

    /// Whether a batch product with `ty` weights runs in f16 (for the lockstep's per-op bound):
    /// Q8-rounded activations, and a prefill path other than f32.
    pub fn prefill_is_f16(&self, ty: GgmlType) -> bool {
        type_kernels(ty).is_some_and(|k| matches!(k.act, ActFormat::Q8 { .. }))
            && self
                .prefill_path()
                .is_ok_and(|p| !matches!(p, PrefillPath::F32 { .. }))
    }

    /// The prefill GEMM this backend runs, from [`ComputeOptions::prefill`] and the device.
    pub fn prefill_path(&self) -> Result<PrefillPath> {
        choose_prefill(self.opts.prefill, self.live_gpu()?).map_err(invalid)
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
        // Q8-rounded batches go through f16 where the path is f16 (float weights multiply f32
        // activations: their products are held to 1e-4 of the CPU backend's).
        if let ActFormat::Q8 { bs } = tk.act {
            let path = self.prefill_path()?;
            if !matches!(path, PrefillPath::F32 { .. })
                && self.matmul_f16(&path, gw_idx, xbuf, bs, out, n_tokens, label)?
            {
                return Ok(());
            }
        }
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
        let fns = self.type_fns(ty)?;
        let (dq, dq_name) = (fns.dequant_rows, fns.k.names.label_dequant);
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

    /// The f16 GEMM path: the f32 batch `x` Q8-rounded (blocks of `bs`) and written as f16 at
    /// the start of the tile buffer in one launch (`hs_quantize_act_f16`), weight tiles
    /// dequantized to f16 after it, each tile times the batch by the BLAS or `hs_gemm_f16`.
    /// `Ok(false)` (nothing launched) where the tile buffer cannot hold the batch and one row, or
    /// `hs_gemm_f16` cannot take the shape: the caller then runs the f32 path.
    #[allow(clippy::too_many_arguments)]
    fn matmul_f16(
        &mut self,
        path: &PrefillPath,
        gw_idx: usize,
        x: DeviceBuffer,
        bs: u32,
        out: DeviceBuffer,
        n_tokens: usize,
        label: OpLabel,
    ) -> Result<bool> {
        let (ty, rows, cols, wbuf) = {
            let w = &self.weights[gw_idx];
            (w.ty, w.rows, w.cols, w.buf)
        };
        let Some(tile) = self.workspace()?.tile else {
            return Ok(false);
        };
        let xh_bytes = f16_bytes(n_tokens * cols);
        let row_f16 = cols as u64 * 2;
        if xh_bytes + row_f16 > tile.bytes || !f16_input_fits(cols, bs) {
            return Ok(false);
        }
        let xh = tile.slice(0, xh_bytes).map_err(gpu_err)?;
        let wtile = tile
            .slice(xh_bytes, tile.bytes - xh_bytes)
            .map_err(gpu_err)?;
        self.quantize_f16(x, xh, n_tokens * cols, bs, label)?;
        let per = ((wtile.bytes / row_f16) as usize).clamp(1, rows.clamp(1, MAX_GRID_Y));
        let row_bytes = (cols / ty.block_len() * ty.block_bytes()) as u64;
        let dq = self.type_fns(ty)?.dequant_tile;
        let mut r0 = 0;
        while r0 < rows {
            let r = per.min(rows - r0);
            // A thread per 32 elements (hs_dequant_tile_*; cols is a multiple of 32 here).
            let threads = (r * cols / 32) as u64;
            self.launch(
                label,
                "dequant_f16",
                dq,
                [threads.div_ceil(256).clamp(1, 65_535) as u32, 1, 1],
                [256, 1, 1],
                &[
                    Arg::Ptr(wbuf.ptr.offset(r0 as u64 * row_bytes)),
                    Arg::Ptr(wtile.ptr),
                    Arg::U32(cols as u32),
                    Arg::U64(row_bytes),
                    Arg::U32(r as u32),
                ],
            )?;
            self.gemm_f16(path, wtile, xh, out, r, r0, rows, n_tokens, cols, label)?;
            r0 += r;
        }
        Ok(true)
    }

    /// The f32 values `x` (`elems` of them, rows of a multiple of `bs`: [`f16_input_fits`])
    /// Q8-rounded in blocks of `bs` and written as f16 to `xh`, in one launch
    /// (`hs_quantize_act_f16`).
    pub(super) fn quantize_f16(
        &mut self,
        x: DeviceBuffer,
        xh: DeviceBuffer,
        elems: usize,
        bs: u32,
        label: OpLabel,
    ) -> Result<()> {
        // The f16 rounding of the Q8 values uses no sum term: the plain block length.
        let bs = q8_block(bs);
        let quant = self.kernels.quantize_f16;
        let n_blocks = elems as u64 / bs as u64;
        // bs / 8 lanes a block.
        let lanes = n_blocks * (bs as u64 / 8);
        self.launch(
            label,
            "quantize_q8_f16",
            quant,
            [lanes.div_ceil(256).clamp(1, 65_535) as u32, 1, 1],
            [256, 1, 1],
            &[
                Arg::Ptr(x.ptr),
                Arg::Ptr(xh.ptr),
                Arg::U32(bs),
                Arg::U64(n_blocks),
            ],
        )
    }

    /// `out[t, r0 .. r0 + r] = A · x[t]` with A (`r × cols`) and x f16, on `path`.
    #[allow(clippy::too_many_arguments)]
    fn gemm_f16(
        &mut self,
        path: &PrefillPath,
        a: DeviceBuffer,
        x: DeviceBuffer,
        out: DeviceBuffer,
        r: usize,
        r0: usize,
        rows: usize,
        n: usize,
        cols: usize,
        label: OpLabel,
    ) -> Result<()> {
        let (one, zero) = {
            let g = self.gpu_mut()?;
            (
                g.scalar(1.0).map_err(gpu_err)?,
                g.scalar(0.0).map_err(gpu_err)?,
            )
        };
        let g = gemm_args(a, x, out, r, r0, rows, n, cols, one, zero);
        if let PrefillPath::BlasF16 { .. } = path {
            let l = self.label(label, "gemm_f16")?;
            self.gpu_mut()?.gemm_f16_blas(l, &g).map_err(gpu_err)?;
        } else {
            let l = self.label(label, "mm_f16")?;
            self.gpu_mut()?.gemm_f16_own(l, &g).map_err(gpu_err)?;
        }
        Ok(())
    }
}

/// Whether rows of `cols` Q8-rounded in blocks of `bs` (an activation format's, sum flag and
/// all) can go through `hs_quantize_act_f16` and the f16 matrix kernels: whole 32-element chunks
/// (`hs_dequant_tile_*`, `hs_gemm_f16`, the grouped expert products) and bs / 8 lanes a block, a
/// power of two within a warp.
pub(super) fn f16_input_fits(cols: usize, bs: u32) -> bool {
    let bs = q8_block(bs);
    cols.is_multiple_of(32)
        && bs.is_multiple_of(8)
        && (bs / 8).is_power_of_two()
        && bs / 8 <= 32
        && cols.is_multiple_of(bs as usize)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrix_units_follow_the_kernels_arch_checks() {
        assert!(matrix_units(RuntimeKind::Cuda, "sm_90").contains("mma.sync"));
        assert!(matrix_units(RuntimeKind::Cuda, "sm_80").contains("mma.sync"));
        assert!(matrix_units(RuntimeKind::Cuda, "sm_75").starts_with("plain"));
        assert!(matrix_units(RuntimeKind::Hip, "gfx1100").starts_with("WMMA"));
        assert!(matrix_units(RuntimeKind::Hip, "gfx1151").starts_with("WMMA"));
        assert!(matrix_units(RuntimeKind::Hip, "gfx90a:sramecc+:xnack-").starts_with("MFMA"));
        assert!(matrix_units(RuntimeKind::Hip, "gfx1030").starts_with("plain"));
        assert!(matrix_units(RuntimeKind::Hip, "gfx110").starts_with("plain"));
        // Where the names say plain FMA, a prompt's attention keeps its FMA kernel.
        for (kind, arch) in [
            (RuntimeKind::Cuda, "sm_90"),
            (RuntimeKind::Cuda, "sm_75"),
            (RuntimeKind::Hip, "gfx1151"),
            (RuntimeKind::Hip, "gfx90a:sramecc+:xnack-"),
            (RuntimeKind::Hip, "gfx1030"),
            (RuntimeKind::Fake, "fake"),
        ] {
            assert_eq!(
                tensor_units(kind, arch).is_some(),
                !matrix_units(kind, arch).starts_with("plain"),
                "{arch}"
            );
        }
    }
}
