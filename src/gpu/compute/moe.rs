//! The mixture-of-experts feed-forward on the GPU (`kernels/infer_moe.hip`): the router product
//! (the ordinary matrix path), then routing, a sort of the (token, expert) entries by expert, the
//! experts' gate/up and down products over the chunks of that sort, and the weighted sum into
//! the residual — every expert id stays on the device, read by the kernels from the route
//! buffer, so no step waits for the host (and a captured graph replays it as is). All experts
//! are resident in the arena; a chunk reads only its own expert's rows, so decode reads the
//! chosen experts' weights and no others. A prompt batch (the dense GEMM path's token count) runs
//! its experts as grouped products on the matrix units instead (`hs_moe_mm_*` in
//! `kernels/gemm.hip`: chunks of [`MM_CHUNK`] entries, weights dequantized to f16 as they are
//! staged). gpt-oss's variant ([`MoeFfn::oai`]: biases, routing by the softmax of the chosen
//! logits, the clamped SwiGLU) runs in the same launches, its bias pointers passed where other
//! models pass null.

use super::kernel_set::TypeFns;
use super::*;
use crate::gpu::backend::MoeFfn;

/// Entries of one chunk in short batches (the matrix-vector kernels' token count).
const CHUNK: usize = 8;
/// Entries of one chunk of the grouped products (their 64-column tile).
const MM_CHUNK: usize = 64;
/// Threads of a routing block; a batch of at most one token per warp routes and sorts in one
/// launch.
const ROUTE_THREADS: u32 = 256;
/// Threads of a grouped-product block, rows of its down tile and hidden rows of its gate/up tile
/// (`HS_MM_THREADS`, `HS_MM_BM`, `MOE_MM_HALF` in kernels/gemm.hip).
const MM_THREADS: u32 = 128;
const MM_ROWS: usize = 64;
const MM_GATE_UP_ROWS: usize = 32;
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
        match type_kernels(gw.ty) {
            Some(k) => Ok((gw.ty, k.act, gw.buf)),
            None => Err(BackendError::Unsupported(format!(
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

    /// Whether a batch of `n_tokens` with `gate` and `down` experts runs the grouped products
    /// on the matrix units: a prompt batch (the dense GEMM path's threshold, its f32 input
    /// buffer planned), a prefill path other than f32, quantized experts with grouped kernels
    /// and rows whole 32-element chunks.
    pub fn moe_grouped(&self, n_tokens: usize, gate: Weight, down: Weight) -> bool {
        let fits = |w: Weight| {
            self.weight(w).is_ok_and(|gw| match type_kernels(gw.ty) {
                // Every quantized type has grouped kernels (its own or `any`'s).
                Some(TypeKernels {
                    act: ActFormat::Q8 { bs },
                    ..
                }) => dequant::f16_input_fits(gw.cols, bs),
                _ => false,
            })
        };
        n_tokens >= self.opts.gemm_min_tokens.max(1)
            && self.ws.as_ref().is_some_and(|w| w.xdq.is_some())
            && self
                .prefill_path()
                .is_ok_and(|p| !matches!(p, dequant::PrefillPath::F32 { .. }))
            && fits(gate)
            && fits(down)
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
        let fns = self.moe_fns()?;
        self.launch_matmul(m.router, m.x, m.logits, n, lab("ffn_moe_router"))?;
        let grouped = self.moe_grouped(n, m.gate, m.down);
        let nt = match (n, grouped) {
            (1, _) => 1,
            (_, true) => MM_CHUNK,
            _ => CHUNK,
        };
        let chunks = entries.min(entries.div_ceil(nt) + ne);
        if chunks > MAX_GRID_Y {
            return Err(invalid(format!(
                "MoE: {chunks} expert chunks in one batch (at most {MAX_GRID_Y}); use a smaller batch"
            )));
        }
        let (n32, k32, dim32) = (n as u32, k as u32, dim as u32);
        // Routing: a warp per token; a batch of one block's worth routes and sorts in one launch,
        // a longer one routes over many blocks and sorts after.
        let warps = (ROUTE_THREADS / self.warp.clamp(1, ROUTE_THREADS)) as usize;
        let sort_in_route = n <= warps;
        self.launch(
            lab("ffn_moe_route"),
            "moe_route",
            fns.route,
            [n.div_ceil(warps).min(MAX_GRID_Y) as u32, 1, 1],
            [ROUTE_THREADS, 1, 1],
            &[
                Arg::Ptr(logits.ptr),
                Arg::Ptr(route.ptr),
                Arg::U32(n32),
                Arg::U32(ne as u32),
                Arg::U32(k32),
                Arg::U32(nt as u32),
                rb,
                Arg::U32(u32::from(sort_in_route)),
            ],
        )?;
        if !sort_in_route {
            self.launch(
                lab("ffn_moe_route"),
                "moe_sort",
                fns.sort,
                [1, 1, 1],
                [ROUTE_THREADS, 1, 1],
                &[
                    Arg::Ptr(route.ptr),
                    Arg::U32(n32),
                    Arg::U32(ne as u32),
                    Arg::U32(k32),
                    Arg::U32(nt as u32),
                ],
            )?;
        }
        self.wrote(m.logits);
        self.wrote(m.route);
        let io = Experts {
            types: [gty, dty],
            weights: [wg, wu, wd],
            acts: [gact, dact],
            x: self.buf(m.x, n * dim)?,
            h: self.buf(m.h, entries * ff)?,
            y: self.buf(m.y, entries * dim)?,
            route,
            chunks: chunks as u32,
            gate_up_tail: [
                Arg::U32(n32),
                Arg::U32(k32),
                Arg::U32(ff as u32),
                Arg::U32(dim32),
                gb,
                ub,
            ],
            down_tail: [
                Arg::U32(n32),
                Arg::U32(k32),
                Arg::U32(dim32),
                Arg::U32(ff as u32),
            ],
            gate_up_biases: [gb, ub],
        };
        if grouped {
            self.moe_grouped_products(m, &io)?;
        } else {
            self.moe_chunked_products(m, &io)?;
        }
        let y = io.y;
        self.launch(
            lab("ffn_moe_combine"),
            "moe_combine",
            fns.combine,
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

    /// The experts of a prompt batch as grouped products (`hs_moe_mm_*`): the batch's rows
    /// Q8-rounded to f16, gate/up with the activation inside, the hidden rows Q8-rounded to f16,
    /// down. The f16 rows live in the GEMM path's f32 input buffer (`xdq`, sized for every
    /// entry's widest row in f32), so the workspace's quantization key is cleared first.
    fn moe_grouped_products(&mut self, m: &MoeFfn, io: &Experts) -> Result<()> {
        let (n, dim, ff, entries) = (m.n_tokens, m.dim, m.ffn_dim, m.n_tokens * m.n_used);
        let [ActFormat::Q8 { bs: gbs }, ActFormat::Q8 { bs: dbs }] = io.acts else {
            return Err(invalid(
                "MoE grouped products need quantized experts".into(),
            ));
        };
        let fns = self.moe_fns()?;
        let [gate_up, _] = fns.mm(&self.type_fns(io.types[0])?.k);
        let [_, down] = fns.mm(&self.type_fns(io.types[1])?.k);
        let half = self
            .workspace()?
            .xdq
            .ok_or_else(|| invalid("the GEMM path was not planned for this batch size".into()))?;
        if (entries * ff.max(dim) * 2) as u64 > half.bytes {
            return Err(invalid(format!(
                "MoE: {entries} entries of {} f16 exceed the planned batch",
                ff.max(dim)
            )));
        }
        let lab = |name| OpLabel::layer(m.layer, name);
        let [wg, wu, wd] = io.weights;
        self.quant = None;
        self.quantize_f16(io.x, half, n * dim, gbs, lab("ffn_moe_gate_up"))?;
        // The type (for the `any` kernels) and one expert row's bytes.
        let row_bytes =
            |ty: GgmlType, cols: usize| (cols / ty.block_len() * ty.block_bytes()) as u64;
        let [gty, dty] = io.types;
        let mut args = vec![
            Arg::Ptr(wg.ptr),
            Arg::Ptr(wu.ptr),
            Arg::Ptr(half.ptr),
            Arg::Ptr(io.h.ptr),
            Arg::Ptr(io.route.ptr),
        ];
        args.extend(io.gate_up_tail);
        args.extend([Arg::U32(gty.id()), Arg::U64(row_bytes(gty, dim))]);
        self.launch(
            lab("ffn_moe_gate_up"),
            "moe_mm_gate_up",
            gate_up,
            [ff.div_ceil(MM_GATE_UP_ROWS) as u32, io.chunks, 1],
            [MM_THREADS, 1, 1],
            &args,
        )?;
        self.wrote(m.h);
        self.quantize_f16(io.h, half, entries * ff, dbs, lab("ffn_moe_down"))?;
        let mut args = vec![
            Arg::Ptr(wd.ptr),
            Arg::Ptr(half.ptr),
            Arg::Ptr(io.y.ptr),
            Arg::Ptr(io.route.ptr),
        ];
        args.extend(io.down_tail);
        args.extend([Arg::U32(dty.id()), Arg::U64(row_bytes(dty, ff))]);
        self.launch(
            lab("ffn_moe_down"),
            "moe_mm_down",
            down,
            [dim.div_ceil(MM_ROWS) as u32, io.chunks, 1],
            [MM_THREADS, 1, 1],
            &args,
        )?;
        self.wrote(m.y);
        Ok(())
    }

    /// The experts as matrix-vector products over chunks of 1 (decode) or [`CHUNK`] entries: the
    /// dense products' kernels (`kernels/infer_matvec.hip`) with the route as their `ids`, a
    /// chunk a row of the grid: the entries' rows gathered in sorted order and Q8-quantized
    /// (float experts take them as they are), gate/up with the activation inside, the hidden rows
    /// quantized, down. A decode step (chunks of one entry) runs the one-token kernels on the
    /// token's row quantized once, not gathered.
    fn moe_chunked_products(&mut self, m: &MoeFfn, io: &Experts) -> Result<()> {
        let (n, dim, ff, entries) = (m.n_tokens, m.dim, m.ffn_dim, m.n_tokens * m.n_used);
        let xs = self.buf(m.xs, entries * dim)?;
        let lab = |name| OpLabel::layer(m.layer, name);
        let [gate_fns, down_fns] = [self.type_fns(io.types[0])?, self.type_fns(io.types[1])?];
        // One token through the one-token kernels reads its row as it is (every entry is token
        // 0: `mv_act_row` in kernels/infer_matvec.hip), quantized once; a batch gathers the
        // entries' rows in sorted order.
        let one_token = n == 1 && gate_fns.one.is_some();
        if !one_token {
            let gather = self.moe_fns()?.gather;
            self.launch(
                lab("ffn_moe_gather"),
                "moe_gather",
                gather,
                [elementwise_grid((entries * dim) as u64), 1, 1],
                [256, 1, 1],
                &[
                    Arg::Ptr(io.x.ptr),
                    Arg::Ptr(xs.ptr),
                    Arg::Ptr(io.route.ptr),
                    Arg::U32(n as u32),
                    Arg::U32(m.n_used as u32),
                    Arg::U32(dim as u32),
                ],
            )?;
            self.wrote(m.xs);
        }
        let [wg, wu, wd] = io.weights;
        let route = [
            Arg::Ptr(io.route.ptr),
            Arg::U32(n as u32),
            Arg::U32(m.n_used as u32),
        ];
        let [gb, ub] = io.gate_up_biases;
        // The products' inputs: Q8 quants and scales in the workspace for quantized experts
        // (null for float ones, which read the f32 rows).
        let (gx, grows) = if one_token { (m.x, 1) } else { (m.xs, entries) };
        let gate_in = self.expert_input(io.acts[0], gx, grows, dim, lab("ffn_moe_gate_up"))?;
        let (kernel, name, grid, mut args) = match (n, gate_fns.one) {
            (1, Some(one)) => (
                one.swiglu,
                gate_fns.k.names.label_swiglu,
                mv_grid(ff, self.warp),
                vec![Arg::Ptr(wg.ptr), Arg::Ptr(wu.ptr), gate_in[0], gate_in[1]],
            ),
            _ => (
                self.gate_up_fn(io.types[0])?,
                gate_fns.k.names.label_gate_up,
                self.expert_grid(&gate_fns, ff),
                vec![
                    Arg::Ptr(wg.ptr),
                    Arg::Ptr(wu.ptr),
                    gate_in[0],
                    gate_in[1],
                    Arg::Ptr(xs.ptr),
                ],
            ),
        };
        args.push(Arg::Ptr(io.h.ptr));
        args.extend([Arg::U32(ff as u32), Arg::U32(dim as u32)]);
        if !one_token {
            // hs_mv_gate_up_*'s token count: the chunk's, with ids.
            args.push(Arg::U32(0));
        }
        args.extend([gb, ub]);
        args.extend(route);
        self.launch(
            lab("ffn_moe_gate_up"),
            name,
            kernel,
            [grid, io.chunks, 1],
            [MV_THREADS, 1, 1],
            &args,
        )?;
        self.wrote(m.h);
        let h = io.h;
        let down_in = self.expert_input(io.acts[1], m.h, entries, ff, lab("ffn_moe_down"))?;
        let (kernel, name, grid, mut args) = match (n, down_fns.one) {
            (1, Some(one)) => (
                one.mv1,
                down_fns.k.names.label_mv1,
                mv_grid(dim.div_ceil(down_fns.k.mv1_rows_per_warp()), self.warp),
                vec![
                    Arg::Ptr(wd.ptr),
                    down_in[0],
                    down_in[1],
                    Arg::Ptr(io.y.ptr),
                    Arg::U64(0),
                    Arg::U32(dim as u32),
                    Arg::U32(ff as u32),
                    Arg::U32(0),
                ],
            ),
            _ => (
                down_fns.mv,
                down_fns.k.names.label_mv,
                self.expert_grid(&down_fns, dim),
                vec![
                    Arg::Ptr(wd.ptr),
                    down_in[0],
                    down_in[1],
                    Arg::Ptr(h.ptr),
                    Arg::Ptr(io.y.ptr),
                    Arg::U32(dim as u32),
                    Arg::U32(ff as u32),
                    Arg::U32(0),
                ],
            ),
        };
        args.extend(route);
        self.launch(
            lab("ffn_moe_down"),
            name,
            kernel,
            [grid, io.chunks, 1],
            [MV_THREADS, 1, 1],
            &args,
        )?;
        self.wrote(m.y);
        Ok(())
    }

    /// The activation arguments (xq, xd) of an expert product reading `x` (`rows` × `cols`): its
    /// Q8 quants and scales, quantized here, for quantized experts; nulls for float ones.
    fn expert_input(
        &mut self,
        act: ActFormat,
        x: Buf,
        rows: usize,
        cols: usize,
        label: OpLabel,
    ) -> Result<[Arg; 2]> {
        match act {
            ActFormat::Q8 { bs } => {
                self.quantize_input(x, rows, cols, bs, false, label)?;
                let ws = self.workspace()?;
                Ok([Arg::Ptr(ws.xq.ptr), Arg::Ptr(ws.xd.ptr)])
            }
            ActFormat::F32 => Ok([Arg::U64(0), Arg::U64(0)]),
        }
    }

    /// Blocks across an expert's `rows` of a chunk product (`hs_mv_*`, `hs_mv_gate_up_*`): a warp
    /// a row for quantized experts, a block a row (capped; the kernel loops) for float ones.
    fn expert_grid(&self, fns: &TypeFns, rows: usize) -> u32 {
        if fns.k.quantized() {
            mv_grid(rows, self.warp)
        } else {
            rows.clamp(1, MAX_GRID_Y) as u32
        }
    }
}

/// What both expert paths of one MoE op take, resolved once: the experts' types, buffers
/// (gate, up, down) and activation formats, the input, hidden and output rows, the route, the
/// chunk count (the launches' grid height), the grouped products' trailing arguments (gate/up:
/// n, k, ff, dim, gpt-oss's gate and up biases; down: n, k, dim, ff) and the biases alone for the
/// chunked ones.
struct Experts {
    types: [GgmlType; 2],
    weights: [DeviceBuffer; 3],
    acts: [ActFormat; 2],
    x: DeviceBuffer,
    h: DeviceBuffer,
    y: DeviceBuffer,
    route: DeviceBuffer,
    chunks: u32,
    gate_up_tail: [Arg; 6],
    down_tail: [Arg; 4],
    gate_up_biases: [Arg; 2],
}
