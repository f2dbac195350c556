//! The mixture-of-experts feed-forward on the GPU (`kernels/infer_moe.hip`): the router product
//! (the ordinary matrix path), then routing, a sort of the (token, expert) entries by expert, the
//! experts' gate/up and down products over the chunks of that sort, and the weighted sum into
//! the residual — every expert id stays on the device, read by the kernels from the route
//! buffer, so no step waits for the host (and a captured graph replays it as is). All experts
//! are resident in the arena; a chunk reads only its own expert's rows, so decode reads the
//! chosen experts' weights and no others. gpt-oss's variant ([`MoeFfn::oai`]: biases, routing by
//! the softmax of the chosen logits, the clamped SwiGLU) runs in the same launches, its bias
//! pointers passed where other models pass null.

use super::*;
use crate::gpu::backend::MoeFfn;

/// Entries of one chunk in prompt batches (the matrix-vector kernels' token count).
const CHUNK: usize = 8;

/// The MoE kernels: routing, gather, combine, and per quantized type the gate/up and down
/// kernels for chunks of 1 and of [`CHUNK`] entries.
pub(super) struct MoeKernels {
    route: KernelFn,
    gather: KernelFn,
    combine: KernelFn,
    /// gate_up (1), gate_up (8), down (1), down (8).
    by_type: HashMap<GgmlType, [KernelFn; 4]>,
}

impl MoeKernels {
    pub(super) fn resolve(gpu: &Gpu) -> std::result::Result<MoeKernels, GpuError> {
        let mut by_type = HashMap::new();
        for &ty in plan::GPU_TYPES {
            let Some(k) = type_kernels(ty) else { continue };
            if k.act == ActFormat::F32 {
                // Float experts: one kernel each, for any chunk.
                let g = gpu.function(&format!("hs_moe_gate_up_{}", k.suffix))?;
                let d = gpu.function(&format!("hs_moe_down_{}", k.suffix))?;
                by_type.insert(ty, [g, g, d, d]);
                continue;
            }
            let f =
                |kind: &str, nt: usize| gpu.function(&format!("hs_moe_{kind}{nt}_{}", k.suffix));
            by_type.insert(
                ty,
                [
                    f("gate_up", 1)?,
                    f("gate_up", CHUNK)?,
                    f("down", 1)?,
                    f("down", CHUNK)?,
                ],
            );
        }
        Ok(MoeKernels {
            route: gpu.function("hs_moe_route")?,
            gather: gpu.function("hs_moe_gather")?,
            combine: gpu.function("hs_moe_combine")?,
            by_type,
        })
    }
}

impl GpuCompute {
    /// The expert tensor `w`: its type, activation format and buffer, checked to hold `rows` ×
    /// `cols`.
    fn expert_weight(
        &self,
        w: Weight,
        rows: usize,
        cols: usize,
    ) -> Result<(GgmlType, ActFormat, DeviceBuffer)> {
        let gw = self.weight(w)?;
        if gw.rows != rows || gw.cols != cols {
            return Err(invalid(format!(
                "{}: {} × {}, the MoE op needs {rows} × {cols}",
                gw.name, gw.rows, gw.cols
            )));
        }
        match (
            type_kernels(gw.ty),
            self.kernels.moe.by_type.contains_key(&gw.ty),
        ) {
            (Some(k), true) => Ok((gw.ty, k.act, gw.buf)),
            _ => Err(BackendError::Unsupported(format!(
                "{}: experts of type {} have no GPU kernels",
                gw.name, gw.ty
            ))),
        }
    }

    /// A bias tensor of gpt-oss's MoE: `rows` rows of `cols` f32 (a one-row tensor is kept as
    /// f32 whatever its stored type; a wider one must be stored as F32, as the converter writes
    /// them).
    fn moe_bias(&self, w: Weight, rows: usize, cols: usize) -> Result<DeviceBuffer> {
        let gw = self.weight(w)?;
        if gw.rows * gw.cols != rows * cols || gw.cols != cols {
            return Err(invalid(format!(
                "{}: {} × {}, the MoE op needs {rows} × {cols}",
                gw.name, gw.rows, gw.cols
            )));
        }
        if gw.ty != GgmlType::F32 {
            return Err(BackendError::Unsupported(format!(
                "{}: an expert bias of type {} (the GPU reads expert biases as F32)",
                gw.name, gw.ty
            )));
        }
        Ok(gw.buf)
    }

    pub(super) fn launch_moe(&mut self, m: &MoeFfn) -> Result<()> {
        let (n, dim, ff, ne, k) = (m.n_tokens, m.dim, m.ffn_dim, m.n_expert, m.n_used);
        if n == 0 {
            return Ok(());
        }
        if k == 0 || k > ne || ne > crate::gpu::backend::MAX_EXPERTS {
            return Err(invalid(format!("MoE: {k} of {ne} experts asked for")));
        }
        let (gty, gact, wg) = self.expert_weight(m.gate, ne * ff, dim)?;
        let (uty, _, wu) = self.expert_weight(m.up, ne * ff, dim)?;
        let (dty, dact, wd) = self.expert_weight(m.down, ne * dim, ff)?;
        if gty != uty {
            return Err(invalid(format!(
                "MoE gate experts are {gty}, up experts {uty}: one type is needed"
            )));
        }
        let entries = n * k;
        let route = self.buf(m.route, MoeFfn::route_len(n, k, ne))?;
        let logits = self.buf(m.logits, n * ne)?;
        let x = self.buf(m.x, n * dim)?;
        let xs = self.buf(m.xs, entries * dim)?;
        let h = self.buf(m.h, entries * ff)?;
        let y = self.buf(m.y, entries * dim)?;
        let acc = self.buf(m.acc, n * dim)?;
        // gpt-oss: the router's bias, per expert the gate's, up's and down's (null pointers
        // otherwise: the Mixtral-style op).
        let [rb, gb, ub, db] = match &m.oai {
            Some(o) => [
                self.moe_bias(o.router_bias, 1, ne)?,
                self.moe_bias(o.gate_bias, ne, ff)?,
                self.moe_bias(o.up_bias, ne, ff)?,
                self.moe_bias(o.down_bias, ne, dim)?,
            ]
            .map(|b| Arg::Ptr(b.ptr)),
            None => [Arg::U64(0); 4],
        };
        let lab = |name| OpLabel::layer(m.layer, name);
        self.launch_matmul(m.router, m.x, m.logits, n, lab("ffn_moe_router"))?;
        let nt = if n == 1 { 1 } else { CHUNK };
        let chunks = entries.min(entries.div_ceil(CHUNK) + ne);
        if chunks > MAX_GRID_Y {
            return Err(invalid(format!(
                "MoE: {chunks} expert chunks in one batch (at most {MAX_GRID_Y}); use a smaller batch"
            )));
        }
        let (n32, k32, dim32, ff32) = (n as u32, k as u32, dim as u32, ff as u32);
        self.launch(
            lab("ffn_moe_route"),
            "moe_route",
            self.kernels.moe.route,
            [1, 1, 1],
            [256, 1, 1],
            &[
                Arg::Ptr(logits.ptr),
                Arg::Ptr(route.ptr),
                Arg::U32(n32),
                Arg::U32(ne as u32),
                Arg::U32(k32),
                Arg::U32(nt as u32),
                rb,
            ],
        )?;
        self.wrote(m.logits);
        self.wrote(m.route);
        self.launch(
            lab("ffn_moe_gather"),
            "moe_gather",
            self.kernels.moe.gather,
            [elementwise_grid((entries * dim) as u64), 1, 1],
            [256, 1, 1],
            &[
                Arg::Ptr(x.ptr),
                Arg::Ptr(xs.ptr),
                Arg::Ptr(route.ptr),
                Arg::U32(n32),
                Arg::U32(k32),
                Arg::U32(dim32),
            ],
        )?;
        self.wrote(m.xs);
        let which = usize::from(nt != 1);
        let gate_up = self.kernels.moe.by_type[&gty][which];
        let down = self.kernels.moe.by_type[&dty][2 + which];
        // The products' inputs: Q8 quants and scales in the workspace for quantized experts,
        // the f32 rows themselves for float ones.
        let gate_in = match gact {
            ActFormat::Q8 { bs } => {
                self.quantize_input(m.xs, entries, dim, bs, false, lab("ffn_moe_gate_up"))?;
                let ws = self.workspace()?;
                vec![Arg::Ptr(ws.xq.ptr), Arg::Ptr(ws.xd.ptr)]
            }
            ActFormat::F32 => vec![Arg::Ptr(xs.ptr)],
        };
        let mut args = vec![Arg::Ptr(wg.ptr), Arg::Ptr(wu.ptr)];
        args.extend(gate_in);
        args.extend([
            Arg::Ptr(h.ptr),
            Arg::Ptr(route.ptr),
            Arg::U32(n32),
            Arg::U32(k32),
            Arg::U32(ff32),
            Arg::U32(dim32),
            gb,
            ub,
        ]);
        self.launch(
            lab("ffn_moe_gate_up"),
            "moe_gate_up",
            gate_up,
            [mv_grid(ff, self.warp), chunks as u32, 1],
            [MV_THREADS, 1, 1],
            &args,
        )?;
        self.wrote(m.h);
        let down_in = match dact {
            ActFormat::Q8 { bs } => {
                self.quantize_input(m.h, entries, ff, bs, false, lab("ffn_moe_down"))?;
                let ws = self.workspace()?;
                vec![Arg::Ptr(ws.xq.ptr), Arg::Ptr(ws.xd.ptr)]
            }
            ActFormat::F32 => vec![Arg::Ptr(h.ptr)],
        };
        let mut args = vec![Arg::Ptr(wd.ptr)];
        args.extend(down_in);
        args.extend([
            Arg::Ptr(y.ptr),
            Arg::Ptr(route.ptr),
            Arg::U32(n32),
            Arg::U32(k32),
            Arg::U32(dim32),
            Arg::U32(ff32),
        ]);
        self.launch(
            lab("ffn_moe_down"),
            "moe_down",
            down,
            [mv_grid(dim, self.warp), chunks as u32, 1],
            [MV_THREADS, 1, 1],
            &args,
        )?;
        self.wrote(m.y);
        self.launch(
            lab("ffn_moe_combine"),
            "moe_combine",
            self.kernels.moe.combine,
            [elementwise_grid((n * dim) as u64), 1, 1],
            [256, 1, 1],
            &[
                Arg::Ptr(acc.ptr),
                Arg::Ptr(y.ptr),
                Arg::Ptr(route.ptr),
                Arg::U32(n32),
                Arg::U32(k32),
                Arg::U32(dim32),
                db,
            ],
        )?;
        self.wrote(m.acc);
        Ok(())
    }
}
