//! The CPU backend's [`Memory`]: weights left in the memory-mapped file (vectors dequantized
//! once), activations as f32 vectors, the KV cache in its element type, the host's memory as the
//! arena.

use super::{CpuBackend, CpuWeight, KvCache, KvData, invalid};
use crate::gpu::backend::{
    BackendError, Buf, KvLayout, KvShift, KvType, Memory, MemoryPlan, OpLabel, Result, Weight,
    WeightData, stage_slot,
};
use crate::gpu::quant;
use crate::gpu::snapshot::{ArenaSnapshot, RegionSnapshot};
use crate::gpu::telemetry::host::host_memory;

/// A KV cache element as [`Memory::kv_rows_out`] lays it out: little-endian bytes.
trait KvElem: Copy {
    const BYTES: usize;
    fn put(self, to: &mut [u8]);
    fn get(from: &[u8]) -> Self;
}

impl KvElem for f32 {
    const BYTES: usize = 4;
    fn put(self, to: &mut [u8]) {
        to.copy_from_slice(&self.to_le_bytes());
    }
    fn get(from: &[u8]) -> f32 {
        f32::from_le_bytes([from[0], from[1], from[2], from[3]])
    }
}

impl KvElem for u16 {
    const BYTES: usize = 2;
    fn put(self, to: &mut [u8]) {
        to.copy_from_slice(&self.to_le_bytes());
    }
    fn get(from: &[u8]) -> u16 {
        u16::from_le_bytes([from[0], from[1]])
    }
}

/// `n` rows of keys then `n` of values from the runs ([`KvLayout::row_runs`]) of `k` and `v`.
fn rows_out<E: KvElem>(
    k: &[E],
    v: &[E],
    runs: &[(usize, usize, usize)],
    n: usize,
    kv_dim: usize,
    out: &mut Vec<u8>,
) {
    let half = n * kv_dim * E::BYTES;
    out.clear();
    out.resize(2 * half, 0);
    let (ko, vo) = out.split_at_mut(half);
    for &(at, row, rows) in runs {
        let (src, dst) = (at..at + rows * kv_dim, row * kv_dim * E::BYTES);
        for (to, (&x, &y)) in (dst..)
            .step_by(E::BYTES)
            .zip(k[src.clone()].iter().zip(&v[src]))
        {
            x.put(&mut ko[to..to + E::BYTES]);
            y.put(&mut vo[to..to + E::BYTES]);
        }
    }
}

/// The inverse of [`rows_out`]: `data`'s `n` rows of keys then of values into the runs.
fn rows_in<E: KvElem>(
    k: &mut [E],
    v: &mut [E],
    runs: &[(usize, usize, usize)],
    n: usize,
    kv_dim: usize,
    data: &[u8],
) {
    let (kd, vd) = data.split_at(n * kv_dim * E::BYTES);
    for &(at, row, rows) in runs {
        let from = row * kv_dim * E::BYTES;
        for (i, (x, y)) in k[at..at + rows * kv_dim]
            .iter_mut()
            .zip(&mut v[at..at + rows * kv_dim])
            .enumerate()
        {
            let b = from + i * E::BYTES;
            *x = E::get(&kd[b..b + E::BYTES]);
            *y = E::get(&vd[b..b + E::BYTES]);
        }
    }
}

impl Memory for CpuBackend {
    /// Nothing to set aside: each weight stays in its file, each buffer is allocated as asked.
    fn plan(&mut self, _plan: &MemoryPlan) -> Result<()> {
        Ok(())
    }

    /// No device memory (`-ngl auto` does not size the CPU).
    fn plan_bytes(&self, _plan: &MemoryPlan) -> Option<u64> {
        None
    }

    fn load_weight(&mut self, d: &WeightData) -> Result<Weight> {
        let _op = self.ops.begin_named(&format!("load · {}", d.name));
        let w = cpu_weight(d)?;
        self.weights.push(w);
        Ok(Weight(self.weights.len() as u32 - 1))
    }

    /// The CPU reads a weight where it lies: staging is loading into the previous call's slots.
    fn stage_weights(&mut self, data: &[WeightData]) -> Result<Vec<Weight>> {
        let mut out = Vec::with_capacity(data.len());
        for (i, d) in data.iter().enumerate() {
            let w = cpu_weight(d)?;
            let at = stage_slot(&mut self.weights, &mut self.staged, i, w);
            out.push(Weight(at as u32));
        }
        Ok(out)
    }

    /// It reads every weight where it lies already.
    fn pin_host(
        &mut self,
        _: &crate::gpu::backend::SharedBytes,
        _: std::ops::Range<usize>,
    ) -> Result<bool> {
        Ok(false)
    }

    fn kv_rows_out(
        &mut self,
        layer: usize,
        seq: usize,
        pos: std::ops::Range<usize>,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let _op = self.ops.begin(OpLabel::layer(layer as u32, "kv rows out"));
        let kv = self
            .kv
            .as_ref()
            .ok_or_else(|| invalid("KV rows before the KV cache was allocated".into()))?;
        let (n, kv_dim) = (pos.len(), kv.layout.kv_dim());
        if n > kv.layout.slots(layer) {
            return Err(invalid(format!(
                "KV rows {}..{} of layer {layer}: more than its {} positions",
                pos.start,
                pos.end,
                kv.layout.slots(layer)
            )));
        }
        let runs = kv.layout.row_runs(layer, seq, pos)?;
        match &kv.data {
            KvData::F32 { k, v } => rows_out(k, v, &runs, n, kv_dim, out),
            KvData::F16 { k, v } => rows_out(k, v, &runs, n, kv_dim, out),
        }
        Ok(())
    }

    fn kv_rows_in(&mut self, layer: usize, seq: usize, pos0: usize, data: &[u8]) -> Result<()> {
        let _op = self.ops.begin(OpLabel::layer(layer as u32, "kv rows in"));
        let kv = self
            .kv
            .as_mut()
            .ok_or_else(|| invalid("KV rows before the KV cache was allocated".into()))?;
        let kv_dim = kv.layout.kv_dim();
        let row = 2 * kv_dim * self.kv_type.bytes() as usize;
        if row == 0 || !data.len().is_multiple_of(row) {
            return Err(invalid(format!(
                "{} bytes of KV rows for rows of {kv_dim} keys and values",
                data.len()
            )));
        }
        let n = data.len() / row;
        let runs = kv.layout.row_runs(layer, seq, pos0..pos0 + n)?;
        match &mut kv.data {
            KvData::F32 { k, v } => rows_in(k, v, &runs, n, kv_dim, data),
            KvData::F16 { k, v } => rows_in(k, v, &runs, n, kv_dim, data),
        }
        Ok(())
    }

    fn alloc(&mut self, name: &'static str, len: usize) -> Result<Buf> {
        self.bufs.push((name, vec![0f32; len]));
        self.allocations += 1;
        Ok(Buf(self.bufs.len() as u32 - 1))
    }

    fn alloc_kv_cache(&mut self, layout: &KvLayout) -> Result<()> {
        let _op = self.ops.begin(OpLabel::global("alloc kv_cache"));
        let len = layout.elems();
        let bytes = len as u64 * 2 * self.kv_type.bytes();
        if let Some((_, avail)) = host_memory()
            && bytes > avail
        {
            return Err(BackendError::OutOfMemory(format!(
                "the KV cache for {} positions needs {} MiB, {} MiB are available; ask for a smaller context (-c)",
                layout.n_ctx(),
                bytes >> 20,
                avail >> 20
            )));
        }
        self.kv = Some(KvCache {
            layout: layout.clone(),
            data: KvData::new(self.kv_type, len),
        });
        for s in &self.scores {
            if let Ok(mut s) = s.lock() {
                s.resize(layout.n_ctx(), 0.0);
            }
        }
        self.allocations += 2;
        Ok(())
    }

    fn kv_type(&self) -> KvType {
        self.kv_type
    }

    fn kv_shift(&mut self, s: &KvShift) -> Result<()> {
        let _op = self.ops.begin(OpLabel::global("kv_shift"));
        let factors = match s.rope.freq_factors {
            Some(f) => Some(self.vector(f, s.rope.pairs(s.head_dim)?)?.to_vec()),
            None => None,
        };
        let kv = self
            .kv
            .as_mut()
            .ok_or_else(|| invalid("KV shift before the KV cache was allocated".into()))?;
        if !kv.layout.is_uniform() {
            return Err(BackendError::Unsupported(
                "a KV shift of a cache with sliding-window rings".into(),
            ));
        }
        let (n_ctx, kv_dim) = (kv.layout.n_ctx(), kv.layout.kv_dim());
        let f = factors.as_deref();
        match &mut kv.data {
            KvData::F32 { k, v } => crate::gpu::cpu::kv_shift::shift(k, v, n_ctx, kv_dim, s, f),
            KvData::F16 { k, v } => crate::gpu::cpu::kv_shift::shift(k, v, n_ctx, kv_dim, s, f),
        }
    }

    fn read(&mut self, buf: Buf, offset: usize, out: &mut [f32]) -> Result<()> {
        let _op = self.ops.begin(OpLabel::global("read"));
        let b = self.buf(buf, offset + out.len())?;
        out.copy_from_slice(&b[offset..]);
        Ok(())
    }

    fn write(&mut self, buf: Buf, offset: usize, data: &[f32]) -> Result<()> {
        let _op = self.ops.begin(OpLabel::global("write"));
        let mut d = self.take(buf, offset + data.len())?;
        d[offset..offset + data.len()].copy_from_slice(data);
        self.put(buf, d);
        Ok(())
    }

    fn cross_out(&mut self, buf: Buf, out: &mut [f32], label: OpLabel) -> Result<()> {
        let _op = self.ops.begin(label);
        let b = self.buf(buf, out.len())?;
        out.copy_from_slice(&b[..out.len()]);
        Ok(())
    }

    fn cross_in(&mut self, buf: Buf, data: &[f32], label: OpLabel) -> Result<()> {
        let _op = self.ops.begin(label);
        let mut d = self.take(buf, data.len())?;
        d[..data.len()].copy_from_slice(data);
        self.put(buf, d);
        Ok(())
    }

    fn arena(&self) -> ArenaSnapshot {
        let weights: u64 = self.weights.iter().map(|w| w.len as u64).sum();
        let acts: u64 = self.bufs.iter().map(|(_, b)| b.len() as u64 * 4).sum();
        let kv: u64 = self.kv.as_ref().map_or(0, |kv| kv.data.bytes());
        let mem = host_memory();
        let total = weights + acts + kv;
        ArenaSnapshot {
            kind: "host".into(),
            capacity: total,
            used: total,
            high_water: total,
            regions: vec![
                RegionSnapshot {
                    name: "weights (mapped)".into(),
                    capacity: weights,
                    used: weights,
                },
                RegionSnapshot {
                    name: "kv_cache".into(),
                    capacity: kv,
                    used: kv,
                },
                RegionSnapshot {
                    name: "activations".into(),
                    capacity: acts,
                    used: acts,
                },
            ],
            largest_free: 0,
            device_allocations: self.allocations,
            pinned_host_bytes: 0,
            split: None,
            runtime_overhead: None,
            device_total: mem.map(|m| m.0),
            device_free: mem.map(|m| m.1),
        }
    }
}

/// A weight as the CPU keeps it: in its storage, a vector dequantized to f32 once.
fn cpu_weight(d: &WeightData) -> Result<CpuWeight> {
    if !quant::is_supported(d.ty) {
        return Err(BackendError::Unsupported(format!(
            "tensor {}: type {} is not supported",
            d.name, d.ty
        )));
    }
    d.check()?;
    let vector = if d.rows == 1 {
        let mut v = vec![0f32; d.cols];
        quant::dequantize(d.ty, d.bytes(), &mut v)
            .map_err(|e| invalid(format!("tensor {}: {e}", d.name)))?;
        Some(v)
    } else {
        None
    };
    Ok(CpuWeight {
        name: d.name.to_string(),
        ty: d.ty,
        rows: d.rows,
        cols: d.cols,
        storage: d.storage.clone(),
        offset: d.offset,
        len: d.len,
        vector,
        packed: None,
    })
}
