//! (Over 700 lines on purpose: every op of the `Ops` and `Memory` seams, each choosing its
//! side and moving its inputs and weights there, one short method each; the instrumentation
//! and op offload's streaming and borrowed KV rows are apart, in `backend/`.)
//!
//! [`SplitBackend`]: one [`Backend`] over several — a CPU backend for the layers [`Placement`]
//! leaves on the CPU (and the token embedding), and one GPU backend per GPU for its range of
//! layers (`-ngl`, `--split-mode layer`) — so that the forward pass runs unchanged on a split
//! model. The ops and the memory side are here; the instrumentation (devices, streams,
//! watchdogs, quit) is in `backend/instrument.rs`.
//!
//! Every activation buffer exists on every part; each remembers which parts hold its latest
//! contents and how far (the rows the last ops wrote). An op runs on the part of its layer (its
//! label, its attention call, the weight it reads); a buffer it reads that another part wrote
//! last is copied across first: the crossing, one op on the sending part's stream
//! ([`Memory::cross_out`]) and one on the receiving part's ([`Memory::cross_in`]), both labelled
//! `cross A → B`; a GPU backend stages it through its pinned host buffers. With llama.cpp's
//! placement — embedding and first layers on the CPU, then each GPU's layers in turn, the output
//! on the last — that is one copy of the residual stream (`n_tokens × dim` floats) per boundary
//! per step, and the logits read back as without a split. Each part keeps the KV cache of its
//! own layers only.

mod instrument;
mod offload;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use super::{Placement, Side};
use crate::gpu::backend::{
    AttnParams, Backend, BackendError, Buf, Glu, HeadNorms, KvLayout, KvShift, KvType, Memory,
    MemoryPlan, MoeFfn, OaiMoe, OpLabel, Ops, Result, RopeParams, SeqPos, SharedBytes, Weight,
    WeightData,
};
use crate::gpu::compute::GpuCompute;
use crate::gpu::quant::GgmlType;
use crate::gpu::snapshot::{ArenaSnapshot, SplitGpu, SplitSnapshot};

struct BufSlot {
    /// The buffer's handle on each part (index: [`part`]).
    on: Vec<Buf>,
    /// The parts holding its latest contents (bit `part`).
    current: u64,
    /// Elements `0..extent` may differ between the parts that are current and those that are not.
    extent: usize,
}

struct WeightSlot {
    on: Vec<Option<Weight>>,
    rows: usize,
    cols: usize,
    name: String,
    /// A weight of the CPU's that GPU 0 does not hold, as stored, to stream it up for an op
    /// offloaded there ([`Placement::op_offload`]).
    host: Option<HostWeight>,
}

struct HostWeight {
    ty: GgmlType,
    storage: SharedBytes,
    offset: usize,
    len: usize,
}

/// The GPU backend under a part, for a peer copy.
fn as_gpu(p: &mut Box<dyn Backend>) -> Option<&mut GpuCompute> {
    p.as_any_mut()?.downcast_mut::<GpuCompute>()
}

/// A part's index: the CPU first, then the GPUs in order.
fn part(s: Side) -> usize {
    match s {
        Side::Cpu => 0,
        Side::Gpu(g) => g + 1,
    }
}

fn side_of(i: usize) -> Side {
    match i {
        0 => Side::Cpu,
        g => Side::Gpu(g - 1),
    }
}

/// A crossing's label (`cross GPU 0 → GPU 1`): a few distinct texts per process, kept for good.
fn cross_label(from: Side, to: Side) -> OpLabel {
    static NAMES: OnceLock<Mutex<HashMap<(Side, Side), &'static str>>> = OnceLock::new();
    let mut m = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let name = *m
        .entry((from, to))
        .or_insert_with(|| Box::leak(format!("cross {from} → {to}").into_boxed_str()));
    OpLabel::global(name)
}

/// A model's layers split between a CPU backend and one or more GPU backends.
pub struct SplitBackend {
    /// The CPU part, then the GPUs' (index: [`part`]).
    parts: Vec<Box<dyn Backend>>,
    place: Placement,
    /// The plan each GPU is given (its weights, its layers' KV cache).
    gpu_plans: Vec<MemoryPlan>,
    /// How the split was chosen, for the device summary (`-ngl auto: 16/33 layers …`).
    said: String,
    weights: Vec<WeightSlot>,
    bufs: Vec<BufSlot>,
    /// Weight bytes each part holds.
    weight_bytes: Vec<u64>,
    handovers: u64,
    handover_bytes: u64,
    streamed_ops: u64,
    streamed_bytes: u64,
    cross_buf: Vec<f32>,
    /// GPU 0's KV cache has a stage: op offload's attention of a CPU layer runs there over
    /// rows borrowed from the CPU's cache ([`SplitBackend::borrow_kv`]).
    kv_stage: bool,
    kv_rows: Vec<u8>,
    kv_rows_bytes: u64,
    /// Bytes of the files GPU 0 reads streamed weights from in place (`pin_streamed`); `None`
    /// before the first stream.
    pinned: Option<u64>,
}

impl SplitBackend {
    /// `gpus` in the order of `place` (GPU 0 first), each with its plan.
    pub fn new(
        gpus: Vec<Box<dyn Backend>>,
        cpu: Box<dyn Backend>,
        place: Placement,
        gpu_plans: Vec<MemoryPlan>,
        said: String,
    ) -> SplitBackend {
        let mut parts = vec![cpu];
        parts.extend(gpus);
        let n = parts.len();
        SplitBackend {
            parts,
            place,
            gpu_plans,
            said,
            weights: Vec::new(),
            bufs: Vec::new(),
            weight_bytes: vec![0; n],
            handovers: 0,
            handover_bytes: 0,
            streamed_ops: 0,
            streamed_bytes: 0,
            cross_buf: Vec::new(),
            kv_stage: false,
            kv_rows: Vec::new(),
            kv_rows_bytes: 0,
            pinned: None,
        }
    }

    fn side(&mut self, s: Side) -> &mut dyn Backend {
        self.parts[part(s)].as_mut()
    }

    fn all(&self) -> u64 {
        (1u64 << self.parts.len()) - 1
    }

    fn slot(&self, b: Buf) -> Result<&BufSlot> {
        self.bufs
            .get(b.0 as usize)
            .ok_or_else(|| BackendError::Invalid(format!("split: no buffer #{}", b.0)))
    }

    /// The buffer's handle on side `s`.
    fn on(&self, b: Buf, s: Side) -> Result<Buf> {
        self.slot(b)?
            .on
            .get(part(s))
            .copied()
            .ok_or_else(|| BackendError::Invalid(format!("split: no part {s}")))
    }

    /// The weight's handle on side `s`.
    fn w_on(&self, w: Weight, s: Side) -> Result<Weight> {
        let slot = self
            .weights
            .get(w.0 as usize)
            .ok_or_else(|| BackendError::Invalid(format!("split: no weight #{}", w.0)))?;
        slot.on.get(part(s)).copied().flatten().ok_or_else(|| {
            BackendError::Invalid(format!("split: tensor {} is not on the {s}", slot.name))
        })
    }

    /// Where an op reading weight `w` runs: `want` (its layer's side) if the weight is there,
    /// else the first part that holds it.
    fn weight_side(&self, w: Weight, want: Side) -> Side {
        match self.weights.get(w.0 as usize) {
            Some(s) if s.on.get(part(want)).copied().flatten().is_none() => {
                s.on.iter().position(Option::is_some).map_or(want, side_of)
            }
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
            // Under op offload a CPU layer's op with no weight follows its input to GPU 0.
            Some(l) => match self.place.layer_side(l as usize) {
                Side::Cpu if self.place.streams() && self.only_on(x, Side::Gpu(0)) => Side::Gpu(0),
                s => s,
            },
            None if matches!(label.name, "output_norm" | "output") => self.place.output_side(),
            None => match self.slot(x).map(|s| s.current) {
                Ok(c) if c.count_ones() == 1 => side_of(c.trailing_zeros() as usize),
                _ => self.place.output_side(),
            },
        }
    }

    /// Whether side `s` alone holds `b`'s latest contents.
    fn only_on(&self, b: Buf, s: Side) -> bool {
        self.slot(b).is_ok_and(|x| x.current == 1 << part(s))
    }

    /// Makes buffer `b` current on side `s`: the crossing, when another part wrote it last.
    fn need(&mut self, b: Buf, s: Side) -> Result<()> {
        let to = part(s);
        let (current, extent) = {
            let slot = self.slot(b)?;
            (slot.current, slot.extent)
        };
        if current & (1 << to) != 0 || current == 0 {
            return Ok(());
        }
        // The last part that holds it: the one nearest the output, where the stream came from.
        let from = 63 - current.leading_zeros() as usize;
        if extent > 0 {
            let (fb, tb) = (self.on(b, side_of(from))?, self.on(b, s)?);
            let label = cross_label(side_of(from), s);
            if !self.peer_copy(from, to, fb, tb, extent, label)? {
                // Through the host, in a buffer kept for the next crossing.
                let mut data = std::mem::take(&mut self.cross_buf);
                data.resize(extent, 0.0);
                let r = self.parts[from]
                    .cross_out(fb, &mut data, label)
                    .and_then(|()| self.parts[to].cross_in(tb, &data, label));
                self.cross_buf = data;
                r?;
            }
            self.handovers += 1;
            self.handover_bytes += extent as u64 * 4;
        }
        let all = self.all();
        if let Some(slot) = self.bufs.get_mut(b.0 as usize) {
            slot.current |= 1 << to;
            if slot.current == all {
                slot.extent = 0;
            }
        }
        Ok(())
    }

    /// A crossing between two GPU parts peer to peer, where both are GPU backends whose runtime
    /// and link allow it (`GpuCompute::send_to_peer`); `false`: the caller goes through the host.
    fn peer_copy(
        &mut self,
        from: usize,
        to: usize,
        fb: Buf,
        tb: Buf,
        len: usize,
        label: OpLabel,
    ) -> Result<bool> {
        if from == 0 || to == 0 || from == to {
            return Ok(false);
        }
        let (lo, hi) = self.parts.split_at_mut(from.max(to));
        let (a, b) = (&mut lo[from.min(to)], &mut hi[0]);
        let (src, dst) = if from < to { (a, b) } else { (b, a) };
        let (Some(s), Some(d)) = (as_gpu(src), as_gpu(dst)) else {
            return Ok(false);
        };
        s.send_to_peer(fb, d, tb, len, label)
    }

    /// Side `s` wrote elements `0..len` of `b` (after [`SplitBackend::need`] where the op also
    /// read it). A write on one part over a buffer another part wrote last leaves that part's
    /// rows beyond `len` behind: the forward pass never reads past the rows of its batch.
    fn wrote(&mut self, b: Buf, s: Side, len: usize) {
        let bit = 1u64 << part(s);
        if let Some(slot) = self.bufs.get_mut(b.0 as usize) {
            slot.extent = if slot.current & bit != 0 {
                slot.extent.max(len)
            } else {
                len
            };
            slot.current = bit;
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

    /// `p` with its attention sinks (gpt-oss) as side `s` holds them (streamed to GPU 0 for an
    /// offloaded attention).
    fn attn_on(&mut self, p: &AttnParams, s: Side) -> Result<AttnParams> {
        Ok(AttnParams {
            sinks: match p.sinks {
                Some(w) => Some(self.w_at(w, s)?),
                None => None,
            },
            ..*p
        })
    }

    /// The split for the Arena panel: one block per GPU.
    fn split_snapshot(&self) -> SplitSnapshot {
        let gpus = (0..self.place.n_gpus())
            .map(|g| {
                let r = self.place.gpu_range(g);
                SplitGpu {
                    name: self.parts[g + 1].device().name,
                    layers: r.len() + usize::from(self.place.output_side() == Side::Gpu(g)),
                    weight_bytes: self.weight_bytes[g + 1],
                    arena: self.parts[g + 1].arena(),
                }
            })
            .collect();
        SplitSnapshot {
            gpu_layers: self.place.ngl(),
            cpu_layers: self.place.n_layers + 1 - self.place.ngl(),
            gpu_weight_bytes: self.weight_bytes[1..].iter().sum(),
            cpu_weight_bytes: self.weight_bytes[0],
            handovers: self.handovers,
            handover_bytes: self.handover_bytes,
            streamed_ops: self.streamed_ops,
            streamed_bytes: self.streamed_bytes,
            kv_rows_bytes: self.kv_rows_bytes,
            pinned_bytes: self.pinned.unwrap_or(0),
            summary: self.place.describe(),
            gpus,
        }
    }

    /// The parts holding a KV cache, each with its layers: those with a layer, and GPU 0 for
    /// op offload's stage ([`SplitBackend::alloc_kv_cache`]).
    fn kv_parts(&self) -> Vec<(Side, std::ops::Range<usize>)> {
        let mut v = vec![(Side::Cpu, 0..self.place.gpu_from)];
        v.extend((0..self.place.n_gpus()).map(|g| (Side::Gpu(g), self.place.gpu_range(g))));
        let stage = self.place.streams() && self.place.gpu_from > 0 && self.parts.len() > 1;
        v.retain(|(s, r)| !r.is_empty() || (stage && *s == Side::Gpu(0)));
        v
    }

    /// [`Ops::rope_attention`] (`seq_rows` `None`) or [`Ops::rope_attention_rows`] on the side
    /// that holds layer `p.layer`, or on GPU 0 over borrowed rows ([`SplitBackend::attn_side`]).
    #[allow(clippy::too_many_arguments)]
    fn rope_attention_on(
        &mut self,
        q: Buf,
        k: Buf,
        v: Buf,
        out: Buf,
        norms: &HeadNorms,
        rope: &RopeParams,
        p0: &AttnParams,
        seq_rows: Option<&[SeqPos]>,
    ) -> Result<()> {
        // A decode step of several sequences stays with the cache.
        let s = match seq_rows {
            Some(_) => self.place.layer_side(p0.layer),
            None => self.attn_side(p0),
        };
        let borrowed = s != self.place.layer_side(p0.layer);
        // The norms, RoPE factors and sinks in one staging call (a call's handles hold until the
        // next).
        let ws = self.ws_at([norms.q, norms.k, rope.freq_factors, p0.sinks], s)?;
        let p = &AttnParams {
            sinks: ws[3],
            ..*p0
        };
        for b in [q, k, v] {
            self.need(b, s)?;
        }
        let r = RopeParams {
            freq_factors: ws[2],
            ..*rope
        };
        let n = HeadNorms {
            q: ws[0],
            k: ws[1],
            eps: norms.eps,
        };
        if borrowed {
            self.borrow_kv(p)?;
        }
        let (qs, ks, vs, o) = (
            self.on(q, s)?,
            self.on(k, s)?,
            self.on(v, s)?,
            self.on(out, s)?,
        );
        let rows = match seq_rows {
            Some(sr) => {
                self.side(s)
                    .rope_attention_rows(qs, ks, vs, o, &n, &r, p, sr)?;
                sr.len()
            }
            None => {
                self.side(s).rope_attention(qs, ks, vs, o, &n, &r, p)?;
                // Rows up to the group's end (a multi-sequence batch's groups go in row order).
                p.row0 + p.n_tokens
            }
        };
        if borrowed {
            self.return_kv(p)?;
        }
        self.wrote(q, s, rows * p.n_heads * p.head_dim);
        self.wrote(k, s, rows * p.n_kv_heads * p.head_dim);
        self.wrote(out, s, rows * p.n_heads * p.head_dim);
        Ok(())
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
        let s = self.offload(
            self.weight_side(weight, self.label_side(label, x)),
            n_tokens,
        );
        self.need(x, s)?;
        let (xs, w, o) = (self.on(x, s)?, self.w_at(weight, s)?, self.on(out, s)?);
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
        let s = self.offload(self.weight_side(w, self.label_side(label, x)), n_tokens);
        self.need(x, s)?;
        let (ws, xs, o) = (self.w_at(w, s)?, self.on(x, s)?, self.on(out, s)?);
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
        let s = self.offload(
            self.weight_side(w[0], self.place.layer_side(layer as usize)),
            n_tokens,
        );
        self.need(x, s)?;
        let all = [
            Some(w[0]),
            Some(w[1]),
            Some(w[2]),
            bias[0],
            bias[1],
            bias[2],
        ];
        let on = self.weights_at(&all, s)?;
        let missing = || BackendError::Invalid("split: a q, k or v weight is missing".into());
        let ws = [
            on[0].ok_or_else(missing)?,
            on[1].ok_or_else(missing)?,
            on[2].ok_or_else(missing)?,
        ];
        let bs = [on[3], on[4], on[5]];
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
        let s = self.offload(
            self.weight_side(w_gate, self.place.layer_side(layer as usize)),
            n_tokens,
        );
        self.need(x, s)?;
        let on = self.weights_at(&[Some(w_gate), Some(w_up)], s)?;
        let (Some(g), Some(u)) = (on[0], on[1]) else {
            return Err(BackendError::Invalid(
                "split: a gate or up weight is missing".into(),
            ));
        };
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
        let s = self.offload(
            self.weight_side(weight, self.label_side(label, x)),
            n_tokens,
        );
        self.need(x, s)?;
        self.need(acc, s)?;
        let (xs, w) = (self.on(x, s)?, self.w_at(weight, s)?);
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
        let s = self.offload(self.weight_side(w, self.label_side(label, x)), n_tokens);
        self.need(x, s)?;
        self.need(acc, s)?;
        let (ws, xs) = (self.w_at(w, s)?, self.on(x, s)?);
        let (a, t) = (self.on(acc, s)?, self.on(tmp, s)?);
        self.side(s)
            .matmul_add(ws, xs, a, t, n_tokens, dim, label, add_label)?;
        self.wrote(acc, s, n_tokens * dim);
        self.wrote(tmp, s, n_tokens * dim);
        Ok(())
    }

    fn moe_ffn(&mut self, m: &MoeFfn) -> Result<()> {
        // The whole mixture runs on its layer's side: router, experts and the residual add.
        let s = self.offload(
            self.weight_side(m.router, self.place.layer_side(m.layer as usize)),
            m.n_tokens,
        );
        let o = m.oai;
        let on = self.weights_at(
            &[
                Some(m.router),
                Some(m.gate),
                Some(m.up),
                Some(m.down),
                o.map(|o| o.router_bias),
                o.map(|o| o.gate_bias),
                o.map(|o| o.up_bias),
                o.map(|o| o.down_bias),
            ],
            s,
        )?;
        let missing = || BackendError::Invalid("split: an expert weight is missing".into());
        let oai = match (on[4], on[5], on[6], on[7]) {
            (Some(router_bias), Some(gate_bias), Some(up_bias), Some(down_bias)) => Some(OaiMoe {
                router_bias,
                gate_bias,
                up_bias,
                down_bias,
            }),
            _ => None,
        };
        self.need(m.x, s)?;
        self.need(m.acc, s)?;
        let on = MoeFfn {
            router: on[0].ok_or_else(missing)?,
            gate: on[1].ok_or_else(missing)?,
            up: on[2].ok_or_else(missing)?,
            down: on[3].ok_or_else(missing)?,
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
        let s = self.offload(self.weight_side(bias, self.label_side(label, x)), n_tokens);
        self.need(x, s)?;
        let (xs, b) = (self.on(x, s)?, self.w_at(bias, s)?);
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
        let s = self.attn_side(p);
        let borrowed = s != self.place.layer_side(p.layer);
        let p = &self.attn_on(p, s)?;
        for b in [q, k, v] {
            self.need(b, s)?;
        }
        if borrowed {
            self.borrow_kv(p)?;
        }
        let (qs, ks, vs, o) = (
            self.on(q, s)?,
            self.on(k, s)?,
            self.on(v, s)?,
            self.on(out, s)?,
        );
        self.side(s).attention(qs, ks, vs, o, p)?;
        if borrowed {
            self.return_kv(p)?;
        }
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
        self.rope_attention_on(q, k, v, out, norms, rope, p, None)
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
        self.rope_attention_on(q, k, v, out, norms, rope, p, Some(rows))
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
        for p in &mut self.parts {
            p.set_exact_rows_below(rows);
        }
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
        self.parts[0].plan(plan)?;
        for g in 0..self.gpu_plans.len().min(self.parts.len() - 1) {
            let p = self.gpu_plans[g];
            self.parts[g + 1].plan(&p)?;
        }
        Ok(())
    }

    fn plan_bytes(&self, plan: &MemoryPlan) -> Option<u64> {
        self.parts.get(1)?.plan_bytes(plan)
    }

    fn load_weight(&mut self, data: &WeightData) -> Result<Weight> {
        let sides = self.place.tensor_parts(data.name);
        let mut on = vec![None; self.parts.len()];
        for s in sides {
            let i = part(s);
            if i < self.parts.len() {
                self.weight_bytes[i] += data.len as u64;
                on[i] = Some(self.parts[i].load_weight(data)?);
            }
        }
        // A weight of the CPU's that GPU 0 lacks is kept as stored for op offload.
        let stream =
            self.place.streams() && on[0].is_some() && on.get(1).is_some_and(Option::is_none);
        self.weights.push(WeightSlot {
            on,
            rows: data.rows,
            cols: data.cols,
            name: data.name.to_string(),
            host: stream.then(|| HostWeight {
                ty: data.ty,
                storage: data.storage.clone(),
                offset: data.offset,
                len: data.len,
            }),
        });
        Ok(Weight(self.weights.len() as u32 - 1))
    }

    fn alloc(&mut self, name: &'static str, len: usize) -> Result<Buf> {
        let on = self
            .parts
            .iter_mut()
            .map(|p| p.alloc(name, len))
            .collect::<Result<Vec<_>>>()?;
        let current = self.all();
        self.bufs.push(BufSlot {
            on,
            current,
            extent: 0,
        });
        Ok(Buf(self.bufs.len() as u32 - 1))
    }

    /// Each part's layers; GPU 0's with a stage where op offload runs the CPU layers'
    /// attention there (a CPU layer's batch borrows its rows, [`SplitBackend::borrow_kv`]).
    fn alloc_kv_cache(&mut self, layout: &KvLayout) -> Result<()> {
        let n = layout.n_layers();
        let stage = self.place.streams() && self.place.gpu_from > 0 && self.parts.len() > 1;
        for (s, r) in self.kv_parts() {
            let r = r.start.min(n)..r.end.min(n);
            let part = match s {
                Side::Gpu(0) if stage => layout.part_with_stage(r),
                _ => layout.part(r),
            };
            if let Some(part) = part {
                self.side(s).alloc_kv_cache(&part)?;
            }
        }
        self.kv_stage = stage;
        Ok(())
    }

    fn kv_type(&self) -> KvType {
        self.parts
            .get(1)
            .map_or_else(|| self.parts[0].kv_type(), |g| g.kv_type())
    }

    /// Each part that keeps layers (a stage holds nothing between batches).
    fn kv_shift(&mut self, sh: &KvShift) -> Result<()> {
        for (s, r) in self.kv_parts() {
            if r.is_empty() {
                continue;
            }
            let r = self.rope_on(&sh.rope, s)?;
            self.side(s).kv_shift(&KvShift { rope: r, ..*sh })?;
        }
        Ok(())
    }

    fn read(&mut self, buf: Buf, offset: usize, out: &mut [f32]) -> Result<()> {
        let c = self.slot(buf)?.current;
        let s = if c & 1 != 0 || c == 0 {
            Side::Cpu
        } else {
            side_of(63 - c.leading_zeros() as usize)
        };
        let b = self.on(buf, s)?;
        self.side(s).read(b, offset, out)
    }

    fn write(&mut self, buf: Buf, offset: usize, data: &[f32]) -> Result<()> {
        if offset > 0 {
            self.need(buf, Side::Cpu)?;
        }
        let b = self.on(buf, Side::Cpu)?;
        self.parts[0].write(b, offset, data)?;
        self.wrote(buf, Side::Cpu, offset + data.len());
        Ok(())
    }

    fn cross_out(&mut self, buf: Buf, out: &mut [f32], _label: OpLabel) -> Result<()> {
        self.read(buf, 0, out)
    }

    /// Its parts stream each other's weights; nothing streams into a split.
    fn stage_weights(&mut self, _data: &[WeightData]) -> Result<Vec<Weight>> {
        Err(BackendError::Unsupported(
            "weights streamed into a split model".into(),
        ))
    }

    fn cross_in(&mut self, buf: Buf, data: &[f32], _label: OpLabel) -> Result<()> {
        self.write(buf, 0, data)
    }

    /// Its parts read each other's weights; nothing streams from outside.
    fn pin_host(&mut self, _: &SharedBytes, _: std::ops::Range<usize>) -> Result<bool> {
        Err(BackendError::Unsupported(
            "host memory pinned for a split model".into(),
        ))
    }

    /// Its parts lend each other rows; nothing borrows a split's.
    fn kv_rows_out(
        &mut self,
        _layer: usize,
        _seq: usize,
        _pos: std::ops::Range<usize>,
        _out: &mut Vec<u8>,
    ) -> Result<()> {
        Err(BackendError::Unsupported(
            "KV rows borrowed from a split model".into(),
        ))
    }

    fn kv_rows_in(&mut self, _layer: usize, _seq: usize, _pos0: usize, _data: &[u8]) -> Result<()> {
        Err(BackendError::Unsupported(
            "KV rows lent to a split model".into(),
        ))
    }

    fn arena(&self) -> ArenaSnapshot {
        let mut a = self
            .parts
            .get(1)
            .map_or_else(|| self.parts[0].arena(), |g| g.arena());
        a.split = Some(self.split_snapshot());
        a
    }
}
