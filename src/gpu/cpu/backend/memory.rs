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
