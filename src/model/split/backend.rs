//! [`SplitBackend`]: one [`Backend`] over two — the GPU backend for the layers [`Placement`]
//! gives it, the CPU backend for the rest — so that the forward pass runs unchanged on a split
//! model. The ops and the memory side are here; the instrumentation (device, streams, watchdog,
//! quit) is in `backend/instrument.rs`.
//!
//! Every activation buffer exists on both sides; each remembers which side holds its latest
//! contents and how far (the rows the last ops wrote). An op runs on the side of its layer (its
//! label, its attention call, the weight it reads); a buffer it reads that the other side wrote
//! last is copied across first (read there, written here: the hand-over). With llama.cpp's
//! placement — embedding and first layers on the CPU, last layers and output on the GPU — that
//! is one copy of the residual stream (`n_tokens × dim` floats) up to the GPU per step, before
//! the first GPU layer, and the logits read back as without a split. Each side keeps the KV cache
//! of its own layers only.

mod instrument;

use super::{Placement, Side};
use crate::gpu::backend::{
    AttnParams, Backend, BackendError, Buf, Glu, HeadNorms, KvLayout, KvShift, KvType, Memory,
    MemoryPlan, MoeFfn, OaiMoe, OpLabel, Ops, Result, RopeParams, Weight, WeightData,
};
use crate::gpu::snapshot::{ArenaSnapshot, SplitSnapshot};

/// Where a buffer's latest contents are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Home {
    Both,
    Only(Side),
}

struct BufSlot {
    gpu: Buf,
    cpu: Buf,
    home: Home,
    /// Elements `0..extent` may differ between the sides (the rows written since they agreed).
    extent: usize,
}

struct WeightSlot {
    gpu: Option<Weight>,
    cpu: Option<Weight>,
    rows: usize,
    cols: usize,
    name: String,
}

/// A model's layers split between a GPU backend and the CPU backend.
pub struct SplitBackend {
    gpu: Box<dyn Backend>,
    cpu: Box<dyn Backend>,
    place: Placement,
    /// The plan the GPU side is given (its weights, its layers' KV cache).
    gpu_plan: MemoryPlan,
    /// How the split was chosen, for the device summary (`-ngl auto: 16/33 layers …`).
    said: String,
    weights: Vec<WeightSlot>,
    bufs: Vec<BufSlot>,
    gpu_weight_bytes: u64,
    cpu_weight_bytes: u64,
    handovers: u64,
    handover_bytes: u64,
}

impl SplitBackend {
    pub fn new(
        gpu: Box<dyn Backend>,
        cpu: Box<dyn Backend>,
        place: Placement,
        gpu_plan: MemoryPlan,
        said: String,
    ) -> SplitBackend {
        SplitBackend {
            gpu,
            cpu,
            place,
            gpu_plan,
            said,
            weights: Vec::new(),
            bufs: Vec::new(),
            gpu_weight_bytes: 0,
            cpu_weight_bytes: 0,
            handovers: 0,
            handover_bytes: 0,
        }
    }

    fn side(&mut self, s: Side) -> &mut dyn Backend {
        match s {
            Side::Gpu => self.gpu.as_mut(),
            Side::Cpu => self.cpu.as_mut(),
        }
    }

    fn slot(&self, b: Buf) -> Result<&BufSlot> {
        self.bufs
            .get(b.0 as usize)
            .ok_or_else(|| BackendError::Invalid(format!("split: no buffer #{}", b.0)))
    }

    /// The buffer's handle on side `s`.
    fn on(&self, b: Buf, s: Side) -> Result<Buf> {
        let slot = self.slot(b)?;
        Ok(match s {
            Side::Gpu => slot.gpu,
            Side::Cpu => slot.cpu,
        })
    }

    /// The weight's handle on side `s`.
    fn w_on(&self, w: Weight, s: Side) -> Result<Weight> {
        let slot = self
            .weights
            .get(w.0 as usize)
            .ok_or_else(|| BackendError::Invalid(format!("split: no weight #{}", w.0)))?;
        let h = match s {
            Side::Gpu => slot.gpu,
            Side::Cpu => slot.cpu,
        };
        h.ok_or_else(|| {
            BackendError::Invalid(format!(
                "split: tensor {} is not on the {} side",
                slot.name,
                side_name(s)
            ))
        })
    }

    /// Where an op reading weight `w` runs: `want` (its layer's side) if the weight is there,
    /// else the one side that holds it.
    fn weight_side(&self, w: Weight, want: Side) -> Side {
        match self.weights.get(w.0 as usize) {
            Some(s) if want == Side::Gpu && s.gpu.is_none() => Side::Cpu,
            Some(s) if want == Side::Cpu && s.cpu.is_none() => Side::Gpu,
            _ => want,
        }
    }

    fn dims(&self, w: Weight) -> (usize, usize) {
        self.weights
            .get(w.0 as usize)
            .map_or((0, 0), |s| (s.rows, s.cols))
    }

    /// The side an op labelled `label` runs on: its layer's; the output's for the output ops;
    /// otherwise where its input `x` is (no copy for a global op such as the embedding scale).
    fn label_side(&self, label: OpLabel, x: Buf) -> Side {
        match label.layer {
            Some(l) => self.place.layer_side(l as usize),
            None if matches!(label.name, "output_norm" | "output") => self.place.output_side(),
            None => match self.slot(x).map(|s| s.home) {
                Ok(Home::Only(s)) => s,
                _ => self.place.output_side(),
            },
        }
    }

    /// Makes buffer `b` current on side `s`: the hand-over, when the other side wrote it last.
    fn need(&mut self, b: Buf, s: Side) -> Result<()> {
        let (home, extent, from_buf, to_buf) = {
            let slot = self.slot(b)?;
            let (from, to) = match s {
                Side::Gpu => (slot.cpu, slot.gpu),
                Side::Cpu => (slot.gpu, slot.cpu),
            };
            (slot.home, slot.extent, from, to)
        };
        let from = match home {
            Home::Only(h) if h != s => h,
            _ => return Ok(()),
        };
        if extent > 0 {
            let mut data = vec![0f32; extent];
            self.side(from).read(from_buf, 0, &mut data)?;
            self.side(s).write(to_buf, 0, &data)?;
            self.handovers += 1;
            self.handover_bytes += extent as u64 * 4;
        }
        if let Some(slot) = self.bufs.get_mut(b.0 as usize) {
            slot.home = Home::Both;
            slot.extent = 0;
        }
        Ok(())
    }

    /// Side `s` wrote elements `0..len` of `b` (after [`SplitBackend::need`] where the op also
    /// read it). A write on one side over a buffer the other side wrote last leaves that side's
    /// rows beyond `len` behind: the forward pass never reads past the rows of its batch.
    fn wrote(&mut self, b: Buf, s: Side, len: usize) {
        if let Some(slot) = self.bufs.get_mut(b.0 as usize) {
            slot.extent = match slot.home {
                Home::Only(h) if h == s => slot.extent.max(len),
                _ => len,
            };
            slot.home = Home::Only(s);
        }
    }

    fn rope_on(&self, r: &RopeParams, s: Side) -> Result<RopeParams> {
        Ok(RopeParams {
            freq_factors: match r.freq_factors {
                Some(w) => Some(self.w_on(w, s)?),
                None => None,
            },
            ..*r
        })
    }

    /// `p` with its attention sinks (gpt-oss) as side `s` holds them.
    fn attn_on(&self, p: &AttnParams, s: Side) -> Result<AttnParams> {
        Ok(AttnParams {
            sinks: match p.sinks {
                Some(w) => Some(self.w_on(w, s)?),
                None => None,
            },
            ..*p
        })
    }

    /// The split for the Arena panel.
    fn split_snapshot(&self) -> SplitSnapshot {
        SplitSnapshot {
            gpu_layers: self.place.ngl(),
            cpu_layers: self.place.n_layers + 1 - self.place.ngl(),
            gpu_weight_bytes: self.gpu_weight_bytes,
            cpu_weight_bytes: self.cpu_weight_bytes,
            handovers: self.handovers,
            handover_bytes: self.handover_bytes,
            summary: self.place.describe(),
        }
    }
}

fn side_name(s: Side) -> &'static str {
    match s {
        Side::Gpu => "GPU",
        Side::Cpu => "CPU",
    }
}

impl Ops for SplitBackend {
    fn embed(&mut self, table: Weight, tokens: &[u32], out: Buf) -> Result<()> {
        // The input layer stays on the CPU, as llama.cpp keeps it.
        let s = self.weight_side(table, Side::Cpu);
        let (t, o) = (self.w_on(table, s)?, self.on(out, s)?);
        self.side(s).embed(t, tokens, o)?;
        let cols = self.dims(table).1;
        self.wrote(out, s, tokens.len() * cols);
        Ok(())
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
        let s = self.weight_side(weight, self.label_side(label, x));
        self.need(x, s)?;
        let (xs, w, o) = (self.on(x, s)?, self.w_on(weight, s)?, self.on(out, s)?);
        self.side(s).rms_norm(xs, w, o, n_tokens, dim, eps, label)?;
        self.wrote(out, s, n_tokens * dim);
        Ok(())
    }

    fn matmul(
        &mut self,
        w: Weight,
        x: Buf,
        out: Buf,
        n_tokens: usize,
        label: OpLabel,
    ) -> Result<()> {
        let s = self.weight_side(w, self.label_side(label, x));
        self.need(x, s)?;
        let (ws, xs, o) = (self.w_on(w, s)?, self.on(x, s)?, self.on(out, s)?);
        self.side(s).matmul(ws, xs, o, n_tokens, label)?;
        self.wrote(out, s, n_tokens * self.dims(w).0);
        Ok(())
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
        let s = self.weight_side(w[0], self.place.layer_side(layer as usize));
        self.need(x, s)?;
        let ws = [
            self.w_on(w[0], s)?,
            self.w_on(w[1], s)?,
            self.w_on(w[2], s)?,
        ];
        let mut bs = [None; 3];
        for i in 0..3 {
            if let Some(b) = bias[i] {
                bs[i] = Some(self.w_on(b, s)?);
            }
        }
        let os = [
            self.on(out[0], s)?,
            self.on(out[1], s)?,
            self.on(out[2], s)?,
        ];
        let xs = self.on(x, s)?;
        self.side(s).matmul_qkv(ws, bs, xs, os, n_tokens, layer)?;
        for i in 0..3 {
            self.wrote(out[i], s, n_tokens * self.dims(w[i]).0);
        }
        Ok(())
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
        let s = self.weight_side(w_gate, self.place.layer_side(layer as usize));
        self.need(x, s)?;
        let (g, u) = (self.w_on(w_gate, s)?, self.w_on(w_up, s)?);
        let (xs, gs, us) = (self.on(x, s)?, self.on(gate, s)?, self.on(up, s)?);
        self.side(s)
            .matmul_glu(g, u, xs, gs, us, n_tokens, ffn_dim, act, layer)?;
        self.wrote(gate, s, n_tokens * ffn_dim);
        self.wrote(up, s, n_tokens * ffn_dim);
        Ok(())
    }

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
    ) -> Result<()> {
        let s = self.weight_side(weight, self.label_side(label, x));
        self.need(x, s)?;
        self.need(acc, s)?;
        let (xs, w) = (self.on(x, s)?, self.w_on(weight, s)?);
        let (a, t) = (self.on(acc, s)?, self.on(tmp, s)?);
        self.side(s)
            .rms_norm_add(xs, w, a, t, n_tokens, dim, eps, label, add_label)?;
        self.wrote(acc, s, n_tokens * dim);
        self.wrote(tmp, s, n_tokens * dim);
        Ok(())
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
        let s = self.weight_side(w, self.label_side(label, x));
        self.need(x, s)?;
        self.need(acc, s)?;
        let (ws, xs) = (self.w_on(w, s)?, self.on(x, s)?);
        let (a, t) = (self.on(acc, s)?, self.on(tmp, s)?);
        self.side(s)
            .matmul_add(ws, xs, a, t, n_tokens, dim, label, add_label)?;
        self.wrote(acc, s, n_tokens * dim);
        self.wrote(tmp, s, n_tokens * dim);
        Ok(())
    }

    fn moe_ffn(&mut self, m: &MoeFfn) -> Result<()> {
        // The whole mixture runs on its layer's side: router, experts and the residual add.
        let s = self.weight_side(m.router, self.place.layer_side(m.layer as usize));
        let oai = match m.oai {
            Some(o) => Some(OaiMoe {
                router_bias: self.w_on(o.router_bias, s)?,
                gate_bias: self.w_on(o.gate_bias, s)?,
                up_bias: self.w_on(o.up_bias, s)?,
                down_bias: self.w_on(o.down_bias, s)?,
            }),
            None => None,
        };
        self.need(m.x, s)?;
        self.need(m.acc, s)?;
        let on = MoeFfn {
            router: self.w_on(m.router, s)?,
            gate: self.w_on(m.gate, s)?,
            up: self.w_on(m.up, s)?,
            down: self.w_on(m.down, s)?,
            x: self.on(m.x, s)?,
            acc: self.on(m.acc, s)?,
            logits: self.on(m.logits, s)?,
            route: self.on(m.route, s)?,
            xs: self.on(m.xs, s)?,
            h: self.on(m.h, s)?,
            y: self.on(m.y, s)?,
            oai,
            ..*m
        };
        self.side(s).moe_ffn(&on)?;
        self.wrote(m.acc, s, m.n_tokens * m.dim);
        // Scratch: written on this side, never read on the other.
        for b in [m.logits, m.route, m.xs, m.h, m.y] {
            self.wrote(b, s, 0);
        }
        Ok(())
    }

    fn add_bias(&mut self, x: Buf, bias: Weight, n_tokens: usize, label: OpLabel) -> Result<()> {
        let s = self.weight_side(bias, self.label_side(label, x));
        self.need(x, s)?;
        let (xs, b) = (self.on(x, s)?, self.w_on(bias, s)?);
        self.side(s).add_bias(xs, b, n_tokens, label)?;
        self.wrote(x, s, n_tokens * self.dims(bias).1);
        Ok(())
    }

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
    ) -> Result<()> {
        let s = self.label_side(label, x);
        self.need(x, s)?;
        let (xs, r) = (self.on(x, s)?, self.rope_on(params, s)?);
        self.side(s)
            .rope(xs, row0, n_tokens, n_heads, head_dim, pos0, &r, label)?;
        self.wrote(x, s, (row0 + n_tokens) * n_heads * head_dim);
        Ok(())
    }

    fn attention(&mut self, q: Buf, k: Buf, v: Buf, out: Buf, p: &AttnParams) -> Result<()> {
        let s = self.place.layer_side(p.layer);
        let p = &self.attn_on(p, s)?;
        for b in [q, k, v] {
            self.need(b, s)?;
        }
        let (qs, ks, vs, o) = (
            self.on(q, s)?,
            self.on(k, s)?,
            self.on(v, s)?,
            self.on(out, s)?,
        );
        self.side(s).attention(qs, ks, vs, o, p)?;
        self.wrote(out, s, (p.row0 + p.n_tokens) * p.n_heads * p.head_dim);
        Ok(())
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
        let s = self.place.layer_side(p.layer);
        let p = &self.attn_on(p, s)?;
        for b in [q, k, v] {
            self.need(b, s)?;
        }
        let r = self.rope_on(rope, s)?;
        let n = HeadNorms {
            q: norms.q.map(|w| self.w_on(w, s)).transpose()?,
            k: norms.k.map(|w| self.w_on(w, s)).transpose()?,
            eps: norms.eps,
        };
        let (qs, ks, vs, o) = (
            self.on(q, s)?,
            self.on(k, s)?,
            self.on(v, s)?,
            self.on(out, s)?,
        );
        self.side(s).rope_attention(qs, ks, vs, o, &n, &r, p)?;
        // Rows up to the group's end (a multi-sequence batch's groups go in row order).
        let rows = p.row0 + p.n_tokens;
        self.wrote(q, s, rows * p.n_heads * p.head_dim);
        self.wrote(k, s, rows * p.n_kv_heads * p.head_dim);
        self.wrote(out, s, rows * p.n_heads * p.head_dim);
        Ok(())
    }

    fn swiglu(&mut self, gate: Buf, up: Buf, len: usize, label: OpLabel) -> Result<()> {
        let s = self.label_side(label, gate);
        self.need(gate, s)?;
        self.need(up, s)?;
        let (g, u) = (self.on(gate, s)?, self.on(up, s)?);
        self.side(s).swiglu(g, u, len, label)?;
        self.wrote(gate, s, len);
        Ok(())
    }

    fn geglu(&mut self, gate: Buf, up: Buf, len: usize, label: OpLabel) -> Result<()> {
        let s = self.label_side(label, gate);
        self.need(gate, s)?;
        self.need(up, s)?;
        let (g, u) = (self.on(gate, s)?, self.on(up, s)?);
        self.side(s).geglu(g, u, len, label)?;
        self.wrote(gate, s, len);
        Ok(())
    }

    fn scale(&mut self, x: Buf, len: usize, factor: f32, label: OpLabel) -> Result<()> {
        let s = self.label_side(label, x);
        self.need(x, s)?;
        let xs = self.on(x, s)?;
        self.side(s).scale(xs, len, factor, label)?;
        self.wrote(x, s, len);
        Ok(())
    }

    fn add(&mut self, acc: Buf, x: Buf, len: usize, label: OpLabel) -> Result<()> {
        let s = self.label_side(label, acc);
        self.need(acc, s)?;
        self.need(x, s)?;
        let (a, xs) = (self.on(acc, s)?, self.on(x, s)?);
        self.side(s).add(a, xs, len, label)?;
        self.wrote(acc, s, len);
        Ok(())
    }

    fn set_exact_rows_below(&mut self, rows: usize) {
        self.gpu.set_exact_rows_below(rows);
        self.cpu.set_exact_rows_below(rows);
    }

    fn copy(
        &mut self,
        src: Buf,
        src_off: usize,
        dst: Buf,
        dst_off: usize,
        len: usize,
    ) -> Result<()> {
        let s = self.label_side(OpLabel::global("copy"), src);
        self.need(src, s)?;
        if dst_off > 0 {
            self.need(dst, s)?;
        }
        let (a, b) = (self.on(src, s)?, self.on(dst, s)?);
        self.side(s).copy(a, src_off, b, dst_off, len)?;
        self.wrote(dst, s, dst_off + len);
        Ok(())
    }
}

impl Memory for SplitBackend {
    fn plan(&mut self, plan: &MemoryPlan) -> Result<()> {
        self.cpu.plan(plan)?;
        let g = self.gpu_plan;
        self.gpu.plan(&g)
    }

    fn plan_bytes(&self, plan: &MemoryPlan) -> Option<u64> {
        self.gpu.plan_bytes(plan)
    }

    fn load_weight(&mut self, data: &WeightData) -> Result<Weight> {
        let (on_gpu, on_cpu) = self.place.tensor_sides(data.name);
        let gpu = if on_gpu {
            self.gpu_weight_bytes += data.len as u64;
            Some(self.gpu.load_weight(data)?)
        } else {
            None
        };
        let cpu = if on_cpu {
            self.cpu_weight_bytes += data.len as u64;
            Some(self.cpu.load_weight(data)?)
        } else {
            None
        };
        self.weights.push(WeightSlot {
            gpu,
            cpu,
            rows: data.rows,
            cols: data.cols,
            name: data.name.to_string(),
        });
        Ok(Weight(self.weights.len() as u32 - 1))
    }

    fn alloc(&mut self, name: &'static str, len: usize) -> Result<Buf> {
        let gpu = self.gpu.alloc(name, len)?;
        let cpu = self.cpu.alloc(name, len)?;
        self.bufs.push(BufSlot {
            gpu,
            cpu,
            home: Home::Both,
            extent: 0,
        });
        Ok(Buf(self.bufs.len() as u32 - 1))
    }

    fn alloc_kv_cache(&mut self, layout: &KvLayout) -> Result<()> {
        let n = layout.n_layers();
        let g = self.place.gpu_from.min(n);
        if let Some(part) = layout.part(0..g) {
            self.cpu.alloc_kv_cache(&part)?;
        }
        if let Some(part) = layout.part(g..n) {
            self.gpu.alloc_kv_cache(&part)?;
        }
        Ok(())
    }

    fn kv_type(&self) -> KvType {
        self.gpu.kv_type()
    }

    fn kv_shift(&mut self, sh: &KvShift) -> Result<()> {
        let n = self.place.n_layers;
        if self.place.gpu_from > 0 {
            let r = self.rope_on(&sh.rope, Side::Cpu)?;
            self.cpu.kv_shift(&KvShift { rope: r, ..*sh })?;
        }
        if self.place.gpu_from < n {
            let r = self.rope_on(&sh.rope, Side::Gpu)?;
            self.gpu.kv_shift(&KvShift { rope: r, ..*sh })?;
        }
        Ok(())
    }

    fn read(&mut self, buf: Buf, offset: usize, out: &mut [f32]) -> Result<()> {
        let s = match self.slot(buf)?.home {
            Home::Only(s) => s,
            Home::Both => Side::Cpu,
        };
        let b = self.on(buf, s)?;
        self.side(s).read(b, offset, out)
    }

    fn write(&mut self, buf: Buf, offset: usize, data: &[f32]) -> Result<()> {
        if offset > 0 {
            self.need(buf, Side::Cpu)?;
        }
        let b = self.on(buf, Side::Cpu)?;
        self.cpu.write(b, offset, data)?;
        self.wrote(buf, Side::Cpu, offset + data.len());
        Ok(())
    }

    fn arena(&self) -> ArenaSnapshot {
        let mut a = self.gpu.arena();
        a.split = Some(self.split_snapshot());
        a
    }
}
