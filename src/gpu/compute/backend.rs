//! [`GpuCompute`]'s side of the [`Backend`] seam: each op a call into the launcher of its kernel
//! family (`matvec`, `dequant`, `ops`, `attention`, `moe`, `kv_shift`), the memory side on the
//! arena, the instrumentation on the runtime's stream.
//!
//! [`Backend`]: crate::gpu::backend::Backend

use super::*;
use crate::gpu::backend::{Instrument, Memory, Ops, stage_slot};

impl Ops for GpuCompute {
    fn embed(&mut self, table: Weight, tokens: &[u32], out: Buf) -> Result<()> {
        self.launch_embed(table, tokens, out)
    }

    fn rms_norm(
        &mut self,
        x: Buf,
        weight: Weight,
        out: Buf,
        n_tokens: usize,
        dim: usize,
        eps: f32,
        label: OpLabel,
    ) -> Result<()> {
        self.launch_rms_norm(x, weight, out, n_tokens, dim, eps, label)
    }

    fn matmul(
        &mut self,
        w: Weight,
        x: Buf,
        out: Buf,
        n_tokens: usize,
        label: OpLabel,
    ) -> Result<()> {
        self.launch_matmul(w, x, out, n_tokens, label)
    }

    fn add_bias(&mut self, x: Buf, bias: Weight, n_tokens: usize, label: OpLabel) -> Result<()> {
        self.launch_add_bias(x, bias, n_tokens, label)
    }

    fn matmul_qkv(
        &mut self,
        w: [Weight; 3],
        bias: [Option<Weight>; 3],
        x: Buf,
        out: [Buf; 3],
        n_tokens: usize,
        layer: u32,
    ) -> Result<()> {
        self.launch_matmul_qkv(w, bias, x, out, n_tokens, layer)
    }

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
    ) -> Result<()> {
        self.launch_matmul_glu(w_gate, w_up, x, gate, up, n_tokens, ffn_dim, act, layer)
    }

    fn rms_norm_add(
        &mut self,
        x: Buf,
        weight: Weight,
        acc: Buf,
        _tmp: Buf,
        n_tokens: usize,
        dim: usize,
        eps: f32,
        label: OpLabel,
        _add_label: OpLabel,
    ) -> Result<()> {
        self.launch_rms_norm_add(x, weight, acc, n_tokens, dim, eps, label)
    }

    fn moe_ffn(&mut self, m: &crate::gpu::backend::MoeFfn) -> Result<()> {
        self.launch_moe(m)
    }

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
    ) -> Result<()> {
        self.launch_matmul_add(w, x, acc, tmp, n_tokens, dim, label, add_label)
    }

    fn rope(
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
        self.launch_rope(x, row0, n_tokens, n_heads, head_dim, pos0, p, label)
    }

    fn attention(&mut self, q: Buf, k: Buf, v: Buf, out: Buf, p: &AttnParams) -> Result<()> {
        self.launch_attention(q, k, v, out, p, None, None)
    }

    fn rope_attention(
        &mut self,
        q: Buf,
        k: Buf,
        v: Buf,
        out: Buf,
        norms: &HeadNorms,
        rope: &RopeParams,
        p: &AttnParams,
    ) -> Result<()> {
        if q == k || k == v || q == v {
            return crate::gpu::backend::rope_attention_separately(
                self, q, k, v, out, norms, rope, p,
            );
        }
        self.launch_attention(q, k, v, out, p, Some((rope, norms)), None)
    }

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
    ) -> Result<()> {
        if q == k || k == v || q == v {
            return crate::gpu::backend::rope_attention_rows_separately(
                self, q, k, v, out, norms, rope, p, rows,
            );
        }
        self.launch_attention(q, k, v, out, p, Some((rope, norms)), Some(rows))
    }

    // The matvec and GEMM paths are not held equal row for row yet (a multi-sequence decode step
    // of up to `gemm_min_tokens` rows stays on the matvec kernels).
    fn set_exact_rows_below(&mut self, _rows: usize) {}

    fn swiglu(&mut self, gate: Buf, up: Buf, len: usize, label: OpLabel) -> Result<()> {
        let f = self.kernels.swiglu;
        self.elementwise(f, "swiglu", gate, up, len, label)
    }

    fn geglu(&mut self, gate: Buf, up: Buf, len: usize, label: OpLabel) -> Result<()> {
        let f = self.kernels.geglu;
        self.elementwise(f, "geglu", gate, up, len, label)
    }

    fn scale(&mut self, x: Buf, len: usize, factor: f32, label: OpLabel) -> Result<()> {
        self.launch_scale(x, len, factor, label)
    }

    fn add(&mut self, acc: Buf, x: Buf, len: usize, label: OpLabel) -> Result<()> {
        let f = self.kernels.add;
        self.elementwise(f, "add", acc, x, len, label)
    }

    fn copy(
        &mut self,
        src: Buf,
        src_off: usize,
        dst: Buf,
        dst_off: usize,
        len: usize,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let s = self
            .buf(src, src_off + len)?
            .slice(src_off as u64 * 4, len as u64 * 4)
            .map_err(gpu_err)?;
        let d = self
            .buf(dst, dst_off + len)?
            .slice(dst_off as u64 * 4, len as u64 * 4)
            .map_err(gpu_err)?;
        let l = self.label(OpLabel::global("copy"), "")?;
        self.gpu_mut()?
            .copy_d2d(l, d, s, len as u64 * 4)
            .map_err(gpu_err)?;
        self.wrote(dst);
        Ok(())
    }
}

impl Memory for GpuCompute {
    fn plan(&mut self, plan: &MemoryPlan) -> Result<()> {
        if self.plan.is_some() {
            return Err(invalid("the memory plan was already made".into()));
        }
        if plan.n_batch > MAX_GRID_Y {
            return Err(invalid(format!(
                "batches of {} tokens (at most {MAX_GRID_Y})",
                plan.n_batch
            )));
        }
        let ap = plan::arena_plan(plan, &self.opts);
        let sizes = plan::workspace_sizes(plan, &self.opts);
        let g = self.gpu_mut()?;
        g.create_arena(&ap).map_err(gpu_err)?;
        let mut alloc = |r: Region, b: u64| g.alloc(r, b).map_err(gpu_err);
        let ws = Workspace {
            tokens: alloc(Region::Workspace, sizes.tokens)?,
            xq: alloc(Region::Workspace, sizes.xq)?,
            xd: alloc(Region::Workspace, sizes.xd)?,
            xdq: match sizes.xdq {
                0 => None,
                b => Some(alloc(Region::Workspace, b)?),
            },
            tile: match sizes.tile {
                0 => None,
                b => Some(alloc(Region::Workspace, b)?),
            },
            attn_part: Some(alloc(Region::Workspace, sizes.attn_part)?),
        };
        self.ws = Some(ws);
        self.seq_rows_up.clear();
        self.plan = Some(*plan);
        self.refresh_arena(true);
        Ok(())
    }

    fn plan_bytes(&self, plan: &MemoryPlan) -> Option<u64> {
        let g = self.gpu.as_ref()?;
        Some(g.arena_needs(&plan::arena_plan(plan, &self.opts)))
    }

    fn load_weight(&mut self, d: &WeightData) -> Result<Weight> {
        let (bytes, vector) = device_bytes(d)?;
        let g = self.gpu_mut()?;
        let buf = g
            .alloc(Region::Weights, bytes.len() as u64)
            .map_err(gpu_err)?;
        // Checksummed on the device against the host (the gfx1151 zeroed-weights failure).
        g.upload_tensor(d.name, buf, &bytes).map_err(gpu_err)?;
        self.weights.push(gpu_weight(d, buf, vector));
        Ok(Weight(self.weights.len() as u32 - 1))
    }

    /// Each weight uploaded into the room the plan set aside, one after the other from its
    /// start, asynchronously on the stream (after every op before it, so the previous call's
    /// readers have read): not checksummed, as a weight loaded once is — a prompt batch would
    /// pay a host checksum of every streamed byte.
    fn stage_weights(&mut self, data: &[WeightData]) -> Result<Vec<Weight>> {
        let cap = self.plan.map_or(0, |p| p.stage_bytes);
        if self.stage.is_none() {
            let g = self.gpu_mut()?;
            self.stage = Some(g.alloc(Region::Weights, cap.max(4)).map_err(gpu_err)?);
            self.refresh_arena(true);
        }
        let room = self
            .stage
            .ok_or_else(|| invalid("no room for streamed weights".into()))?;
        let mut at = 0u64;
        let mut out = Vec::with_capacity(data.len());
        for (i, d) in data.iter().enumerate() {
            let (bytes, vector) = device_bytes(d)?;
            let len = bytes.len() as u64;
            if at + len > room.bytes {
                return Err(BackendError::OutOfMemory(format!(
                    "streaming {} ({} bytes at {at}) overruns the {} bytes set aside for one op's \
                     weights",
                    d.name, len, room.bytes
                )));
            }
            let buf = room.slice(at, len).map_err(gpu_err)?;
            at = (at + len).next_multiple_of(crate::gpu::arena::ALIGN);
            let g = self.gpu_mut()?;
            let l = g.label(&format!("stream · {}", d.name));
            // From the mapped file in place where it is registered (`Memory::pin_host`).
            if g.upload_in_place(l, buf, &bytes)
                .map_err(gpu_err)?
                .is_none()
            {
                g.upload(l, buf, &bytes).map_err(gpu_err)?;
            }
            let w = gpu_weight(d, buf, vector);
            let slot = stage_slot(&mut self.weights, &mut self.staged, i, w);
            out.push(Weight(slot as u32));
        }
        Ok(out)
    }

    fn pin_host(
        &mut self,
        storage: &crate::gpu::backend::SharedBytes,
        range: std::ops::Range<usize>,
    ) -> Result<bool> {
        self.gpu_mut()?
            .register_host(storage.clone(), range)
            .map_err(gpu_err)
    }

    /// Each run of rows ([`KvLayout::row_runs`]) downloaded through pinned staging after every
    /// op before it.
    fn kv_rows_out(
        &mut self,
        layer: usize,
        seq: usize,
        pos: std::ops::Range<usize>,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let n = pos.len();
        let (k, v, runs, row) = self.kv_runs(layer, seq, pos)?;
        if n > runs.iter().map(|r| r.2).sum() {
            return Err(invalid(format!(
                "KV rows of {n} positions of layer {layer}: more than it keeps"
            )));
        }
        out.clear();
        out.resize(2 * n * row, 0);
        let l = self.label(OpLabel::layer(layer as u32, "kv rows out"), "")?;
        let g = self.gpu_mut()?;
        g.graph_end_step().map_err(gpu_err)?;
        let (ko, vo) = out.split_at_mut(n * row);
        for (at, first, rows) in runs {
            let dst = first * row..(first + rows) * row;
            for (buf, o) in [(k, &mut ko[dst.clone()]), (v, &mut vo[dst.clone()])] {
                let from = buf.slice(at, (rows * row) as u64).map_err(gpu_err)?;
                g.download(l, from, o).map_err(gpu_err)?;
            }
        }
        Ok(())
    }

    /// Each run uploaded through pinned staging, in order on the stream.
    fn kv_rows_in(&mut self, layer: usize, seq: usize, pos0: usize, data: &[u8]) -> Result<()> {
        let row =
            self.kv.as_ref().map_or(0, |kv| kv.layout.kv_dim()) * self.opts.kv.bytes() as usize;
        if row == 0 || !data.len().is_multiple_of(2 * row) {
            return Err(invalid(format!(
                "{} bytes of KV rows for rows of {row} bytes (or no KV cache)",
                data.len()
            )));
        }
        let n = data.len() / (2 * row);
        let (k, v, runs, _) = self.kv_runs(layer, seq, pos0..pos0 + n)?;
        let l = self.label(OpLabel::layer(layer as u32, "kv rows in"), "")?;
        let g = self.gpu_mut()?;
        let (kd, vd) = data.split_at(n * row);
        for (at, first, rows) in runs {
            let src = first * row..(first + rows) * row;
            for (buf, d) in [(k, &kd[src.clone()]), (v, &vd[src.clone()])] {
                let to = buf.slice(at, (rows * row) as u64).map_err(gpu_err)?;
                g.upload(l, to, d).map_err(gpu_err)?;
            }
        }
        Ok(())
    }

    fn alloc(&mut self, name: &'static str, len: usize) -> Result<Buf> {
        let g = self.gpu_mut()?;
        let buf = g
            .alloc(Region::Activations, (len.max(1) * 4) as u64)
            .map_err(gpu_err)?;
        let l = g.label(&format!("init · zero {name}"));
        g.fill_u32(l, buf, 0).map_err(gpu_err)?;
        self.next_version += 1;
        self.bufs.push(GpuBuf {
            name,
            len,
            buf,
            version: self.next_version,
        });
        self.refresh_arena(true);
        Ok(Buf(self.bufs.len() as u32 - 1))
    }

    fn alloc_kv_cache(&mut self, layout: &KvLayout) -> Result<()> {
        let bytes = layout.elems() as u64 * self.opts.kv.bytes();
        let g = self.gpu_mut()?;
        let k = g.alloc(Region::KvCache, bytes.max(4)).map_err(gpu_err)?;
        let v = g.alloc(Region::KvCache, bytes.max(4)).map_err(gpu_err)?;
        let l = g.label("init · zero kv_cache");
        g.fill_u32(l, k, 0).map_err(gpu_err)?;
        g.fill_u32(l, v, 0).map_err(gpu_err)?;
        self.kv = Some(KvCache {
            layout: layout.clone(),
            k,
            v,
        });
        self.refresh_arena(true);
        Ok(())
    }

    fn kv_type(&self) -> KvType {
        self.opts.kv
    }

    fn kv_shift(&mut self, s: &crate::gpu::backend::KvShift) -> Result<()> {
        self.shift_kv(s)
    }

    fn read(&mut self, buf: Buf, offset: usize, out: &mut [f32]) -> Result<()> {
        self.read_as(buf, offset, out, OpLabel::global("read"), "logits")
    }

    fn cross_out(&mut self, buf: Buf, out: &mut [f32], label: OpLabel) -> Result<()> {
        self.read_as(buf, 0, out, label, "")
    }

    fn cross_in(&mut self, buf: Buf, data: &[f32], label: OpLabel) -> Result<()> {
        self.write_as(buf, 0, data, label)
    }

    fn write(&mut self, buf: Buf, offset: usize, data: &[f32]) -> Result<()> {
        self.write_at(buf, offset, data)
    }

    fn arena(&self) -> ArenaSnapshot {
        self.arena_cache.clone()
    }
}

impl GpuCompute {
    /// One crossing of a model split over GPUs, peer to peer: elements `0..len` of `buf` here
    /// into `to_buf` on `to`, one op labelled `label` on each stream (`Gpu::send_to_peer`).
    /// `Ok(false)`: these two devices make no peer copy (the caller goes through the host).
    pub fn send_to_peer(
        &mut self,
        buf: Buf,
        to: &mut GpuCompute,
        to_buf: Buf,
        len: usize,
        label: OpLabel,
    ) -> Result<bool> {
        let src = self.buf(buf, len)?;
        let dst = to.buf(to_buf, len)?;
        let (l, tl) = (self.label(label, "peer")?, to.label(label, "peer")?);
        let (Some(a), Some(b)) = (self.gpu.as_mut(), to.gpu.as_mut()) else {
            return Err(BackendError::Device("the device was shut down".into()));
        };
        let sent = a
            .send_to_peer(l, src, b, tl, dst, len * 4)
            .map_err(gpu_err)?;
        if sent {
            to.wrote(to_buf);
        }
        Ok(sent)
    }

    /// `read` as an op labelled `l` (· `kernel`): the logits' read, or a split model's crossing.
    fn read_as(
        &mut self,
        buf: Buf,
        offset: usize,
        out: &mut [f32],
        l: OpLabel,
        kernel: &'static str,
    ) -> Result<()> {
        let src = self
            .buf(buf, offset + out.len())?
            .slice(offset as u64 * 4, out.len() as u64 * 4)
            .map_err(gpu_err)?;
        let l = self.label(l, kernel)?;
        // The end of a decode step recorded for graph replay: it runs now.
        self.gpu_mut()?.graph_end_step().map_err(gpu_err)?;
        // Through pinned staging, waiting with the configured deadline (never unbounded). The
        // device's floats are little-endian: on a little-endian host the staging buffer is copied
        // straight into `out` (one pass over the logits, a 600 KB vocabulary's worth a token).
        let r = if cfg!(target_endian = "little") {
            // SAFETY: `out` is `out.len() * 4` initialized bytes, u8 has alignment 1, and every
            // bit pattern is a valid f32.
            let bytes = unsafe {
                std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), out.len() * 4)
            };
            self.gpu_mut()?.download(l, src, bytes).map_err(gpu_err)
        } else {
            let mut bytes = std::mem::take(&mut self.host_bytes);
            bytes.resize(out.len() * 4, 0);
            let r = self
                .gpu_mut()?
                .download(l, src, &mut bytes)
                .map_err(gpu_err);
            if r.is_ok() {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            self.host_bytes = bytes;
            r
        };
        self.refresh_arena(false);
        r
    }
}

impl Instrument for GpuCompute {
    fn device(&self) -> DeviceSummary {
        match &self.gpu {
            Some(g) => {
                let i = g.info();
                DeviceSummary {
                    backend: g.kind().name().into(),
                    name: i.name.clone(),
                    arch: i.arch.clone(),
                    total_memory: Some(i.total_memory),
                    // Before the arena exists: what was free when the device was opened (what
                    // `-ngl auto` fits the layers into).
                    free_memory: self
                        .arena_cache
                        .device_free
                        .or_else(|| g.mem_at_open().map(|m| m.free)),
                    compute_units: Some(i.compute_units),
                    warp_size: Some(i.warp_size),
                    // The GPU panel shows the reason: it says which prefill GEMM runs too.
                    reason: match self.prefill_path() {
                        Ok(p) => format!("{}; prefill {p}", self.reason),
                        Err(_) => self.reason.clone(),
                    },
                    graphs: Some(g.graph_mode().describe()),
                    launch_overlap: Some(g.launch_overlap().to_string()),
                }
            }
            None => DeviceSummary {
                backend: "gpu (shut down)".into(),
                reason: self.reason.clone(),
                ..Default::default()
            },
        }
    }

    fn read_bandwidth(&mut self) -> Option<crate::gpu::snapshot::ReadBandwidth> {
        let g = self.gpu.as_mut()?;
        match g.measure_read_bandwidth() {
            Ok(b) => Some(b),
            Err(e) => {
                tracing::warn!("bandwidth measurement failed: {e}");
                None
            }
        }
    }

    fn streams(&self) -> Vec<StreamSnapshot> {
        match &self.gpu {
            Some(g) => vec![g.stream_snapshot()],
            None => Vec::new(),
        }
    }

    fn monitor(&self) -> Option<Arc<dyn BackendMonitor>> {
        let m: Arc<dyn BackendMonitor> = self.monitor.clone();
        self.gpu.as_ref().map(|_| m)
    }

    fn watch_target(&self) -> Option<(Arc<StreamShared>, DeviceInfo)> {
        let g = self.gpu.as_ref()?;
        Some((g.stream_shared(), g.info().clone()))
    }

    fn keep_watchdog(&mut self, dog: Watchdog) {
        self.watchdog = Some(dog);
    }

    fn stuck_op(&mut self, label: OpLabel, budget: Budget) -> Result<()> {
        // About 30 million polls of host memory: tens of seconds (a guard for a shared GPU).
        self.gpu_mut()?
            .launch_spin_on_flag(&label.to_string(), Some(budget), 30_000_000)
            .map(|_| ())
            .map_err(gpu_err)
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn shutdown(
        &mut self,
        drain_deadline: Duration,
        on_step: &mut dyn FnMut(QuitStep),
    ) -> DeviceRelease {
        match self.gpu.take() {
            Some(g) => g.teardown(drain_deadline, on_step).release(),
            None => DeviceRelease::Clean,
        }
    }
}

/// A weight's bytes as the device keeps them (a one-row tensor as f32), and whether it is such
/// a vector; an error for a type the kernels do not read.
fn device_bytes<'a>(d: &'a WeightData) -> Result<(std::borrow::Cow<'a, [u8]>, bool)> {
    if type_kernels(d.ty).is_none() || !quant::is_supported(d.ty) {
        return Err(BackendError::Unsupported(format!(
            "tensor {}: type {} is not supported on the GPU",
            d.name, d.ty
        )));
    }
    d.check()?;
    let vector = d.rows == 1;
    if vector && d.ty != GgmlType::F32 {
        let mut v = vec![0f32; d.cols];
        quant::dequantize(d.ty, d.bytes(), &mut v)
            .map_err(|e| invalid(format!("tensor {}: {e}", d.name)))?;
        let b = v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
        return Ok((std::borrow::Cow::Owned(b), true));
    }
    Ok((std::borrow::Cow::Borrowed(d.bytes()), vector))
}

fn gpu_weight(d: &WeightData, buf: DeviceBuffer, vector: bool) -> GpuWeight {
    GpuWeight {
        name: d.name.to_string(),
        ty: if vector { GgmlType::F32 } else { d.ty },
        rows: d.rows,
        cols: d.cols,
        buf,
        vector,
    }
}
