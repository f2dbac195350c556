//! The CPU implementation of [`Backend`]: weights stay in the memory-mapped file, activations are
//! f32 vectors, the KV cache f32 or f16 (`--kv-type`), and the heavy ops run on a persistent
//! thread pool. Here the [`Ops`] (the attention and MoE bodies live in `attention/` and
//! `backend/moe.rs`); the [`Memory`] and [`Instrument`] sides in `backend/memory.rs` and
//! `backend/instrument.rs`.
//!
//! [`Backend`]: crate::gpu::backend::Backend
//! [`Memory`]: crate::gpu::backend::Memory
//! [`Instrument`]: crate::gpu::backend::Instrument

use std::sync::Mutex;

mod instrument;
mod memory;
pub(super) mod moe;

use super::CpuOptions;
use super::activation::{Gate, gated};
use super::attention;
use super::matmul::{MatmulScratch, QuantMatrix, matmul, matmul_packed};
use super::pool::ThreadPool;
use super::track::HostOps;
use crate::gpu::backend::{
    AttnParams, BackendError, Buf, Glu, HeadNorms, KvLayout, KvType, OpLabel, Ops, Result,
    RopeParams, SeqPos, SharedBytes, Weight, add_separately, glu_separately, norm_add_separately,
    qkv_separately, rope_attention_rows_separately, rope_attention_separately,
};
use crate::gpu::quant::dot::{PACK_MIN_TOKENS, PackedMatrix};
use crate::gpu::quant::{self, GgmlType};
use crate::gpu::watchdog::Watchdog;

struct CpuWeight {
    name: String,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    storage: SharedBytes,
    offset: usize,
    len: usize,
    /// Vectors (norms, biases, RoPE factors) dequantized once at load.
    vector: Option<Vec<f32>>,
    /// The matrix repacked for the GEMM kernels, made at its first product of at least
    /// `PACK_MIN_TOKENS` tokens (so that a matrix only looked up by rows, like an untied token
    /// embedding, or only used in decode, costs no copy); `Some(None)` where the type or
    /// instruction set has no packed kernel. Decode keeps reading the file's layout.
    packed: Option<Option<PackedMatrix>>,
}

impl CpuWeight {
    fn bytes(&self) -> &[u8] {
        &(*self.storage).as_ref()[self.offset..self.offset + self.len]
    }

    fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_len() * self.ty.block_bytes()
    }
}

struct KvCache {
    layout: KvLayout,
    data: KvData,
}

/// Keys and values, `[layer][seq][slot][kv_dim]` each, layer `l` at `layout.offset(l)`, in the
/// element type `--kv-type` chose (f16 held as its bits).
enum KvData {
    F32 { k: Vec<f32>, v: Vec<f32> },
    F16 { k: Vec<u16>, v: Vec<u16> },
}

impl KvData {
    fn new(ty: KvType, len: usize) -> KvData {
        match ty {
            KvType::F32 => KvData::F32 {
                k: vec![0.0; len],
                v: vec![0.0; len],
            },
            KvType::F16 => KvData::F16 {
                k: vec![0; len],
                v: vec![0; len],
            },
        }
    }

    fn bytes(&self) -> u64 {
        match self {
            KvData::F32 { k, v } => (k.len() + v.len()) as u64 * 4,
            KvData::F16 { k, v } => (k.len() + v.len()) as u64 * 2,
        }
    }
}

pub struct CpuBackend {
    pool: ThreadPool,
    weights: Vec<CpuWeight>,
    /// The weight slots [`Memory::stage_weights`] fills again at each call.
    staged: Vec<usize>,
    bufs: Vec<(&'static str, Vec<f32>)>,
    kv: Option<KvCache>,
    scratch: MatmulScratch,
    /// One attention-score row per thread.
    scores: Vec<Mutex<Vec<f32>>>,
    /// Element type of the next KV cache allocated.
    kv_type: KvType,
    /// Repack weights for the packed GEMM ([`CpuOptions::repack`]).
    repack: bool,
    /// Products of at least this many rows take the packed GEMM ([`Ops::set_exact_rows_below`]).
    pack_min_rows: usize,
    allocations: u64,
    reason: String,
    /// Every op in the in-flight table while it runs, for the watchdog.
    ops: HostOps,
    watchdog: Option<Watchdog>,
}

/// Fewest elements of an RMS norm split over the threads (a decode step's row stays on one).
const NORM_PAR_MIN: usize = 16 * 1024;

fn invalid(msg: String) -> BackendError {
    BackendError::Invalid(msg)
}

impl CpuBackend {
    /// A backend with `threads` threads (0: one per available core), chosen for `reason` (shown
    /// with the device).
    pub fn with_reason(threads: usize, reason: &str) -> CpuBackend {
        CpuBackend {
            reason: reason.to_string(),
            ..CpuBackend::new(threads)
        }
    }

    /// A backend computing as `o` says, chosen for `reason` (shown with the device).
    pub fn with_options(o: &CpuOptions, reason: &str) -> CpuBackend {
        CpuBackend {
            scratch: MatmulScratch::with_isa(o.isa),
            repack: o.repack,
            ..CpuBackend::with_reason(o.threads, reason)
        }
    }

    /// A backend with `threads` threads (0: one per available core).
    pub fn new(threads: usize) -> CpuBackend {
        let n = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        CpuBackend {
            pool: ThreadPool::new(n),
            weights: Vec::new(),
            staged: Vec::new(),
            bufs: Vec::new(),
            kv: None,
            scratch: MatmulScratch::default(),
            scores: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            kv_type: KvType::F32,
            repack: true,
            pack_min_rows: PACK_MIN_TOKENS,
            allocations: 0,
            reason: String::new(),
            ops: HostOps::new(),
            watchdog: None,
        }
    }

    /// The KV cache's element type (f32 unless set; the commands pass `--kv-type`, f16 by
    /// default, as llama.cpp keeps it).
    pub fn with_kv_type(mut self, kv: KvType) -> CpuBackend {
        self.kv_type = kv;
        self
    }

    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    fn weight(&self, w: Weight) -> Result<&CpuWeight> {
        self.weights
            .get(w.0 as usize)
            .ok_or_else(|| invalid(format!("no weight #{}", w.0)))
    }

    fn vector(&self, w: Weight, len: usize) -> Result<&[f32]> {
        let cw = self.weight(w)?;
        match &cw.vector {
            Some(v) if v.len() == len => Ok(v),
            _ => Err(invalid(format!(
                "{} is not a vector of {len} elements ({} × {})",
                cw.name, cw.rows, cw.cols
            ))),
        }
    }

    fn buf(&self, b: Buf, len: usize) -> Result<&[f32]> {
        let (name, v) = self
            .bufs
            .get(b.0 as usize)
            .ok_or_else(|| invalid(format!("no buffer #{}", b.0)))?;
        v.get(..len)
            .ok_or_else(|| invalid(format!("buffer {name} holds {}, {len} needed", v.len())))
    }

    /// Takes a buffer out (to be written while others are read) and checks its length.
    fn take(&mut self, b: Buf, len: usize) -> Result<Vec<f32>> {
        let (name, v) = self
            .bufs
            .get_mut(b.0 as usize)
            .ok_or_else(|| invalid(format!("no buffer #{}", b.0)))?;
        if v.len() < len {
            return Err(invalid(format!(
                "buffer {name} holds {}, {len} needed",
                v.len()
            )));
        }
        Ok(std::mem::take(v))
    }

    fn put(&mut self, b: Buf, v: Vec<f32>) {
        self.bufs[b.0 as usize].1 = v;
    }
}
impl Ops for CpuBackend {
    fn embed(&mut self, table: Weight, tokens: &[u32], out: Buf) -> Result<()> {
        let _op = self.ops.begin(OpLabel::global("embed"));
        let mut o = self.take(out, 0)?;
        let res = (|| {
            let w = self.weight(table)?;
            if o.len() < tokens.len() * w.cols {
                return Err(invalid("embedding output buffer too small".into()));
            }
            let rb = w.row_bytes();
            for (t, &tok) in tokens.iter().enumerate() {
                let tok = tok as usize;
                if tok >= w.rows {
                    return Err(invalid(format!(
                        "token id {tok} is outside the vocabulary of {} tokens",
                        w.rows
                    )));
                }
                let row = &w.bytes()[tok * rb..(tok + 1) * rb];
                quant::dequantize(w.ty, row, &mut o[t * w.cols..(t + 1) * w.cols])
                    .map_err(|e| invalid(format!("{}: {e}", w.name)))?;
            }
            Ok(())
        })();
        self.put(out, o);
        res
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
        let _op = self.ops.begin(label);
        let mut o = self.take(out, n_tokens * dim)?;
        let res = (|| {
            let w = self.vector(weight, dim)?;
            // Rows split over the threads; each row's arithmetic as before, so the result does
            // not depend on the thread count.
            let scale_of = |ss: f64| 1.0 / ((ss / dim as f64) as f32 + eps).sqrt();
            let sum_sq = |r: &[f32]| -> f64 { r.iter().map(|&v| (v as f64) * (v as f64)).sum() };
            let o = &mut o[..n_tokens * dim];
            if x == out {
                self.pool.split_rows(o, dim, NORM_PAR_MIN, &|_, part| {
                    for or in part.chunks_exact_mut(dim) {
                        let scale = scale_of(sum_sq(or));
                        for (o, &wv) in or.iter_mut().zip(w) {
                            *o = *o * scale * wv;
                        }
                    }
                });
            } else {
                let x = self.buf(x, n_tokens * dim)?;
                self.pool.split_rows(o, dim, NORM_PAR_MIN, &|r0, part| {
                    let xs = &x[r0 * dim..r0 * dim + part.len()];
                    for (xr, or) in xs.chunks_exact(dim).zip(part.chunks_exact_mut(dim)) {
                        let scale = scale_of(sum_sq(xr));
                        for ((o, &xv), &wv) in or.iter_mut().zip(xr).zip(w) {
                            *o = xv * scale * wv;
                        }
                    }
                });
            }
            Ok(())
        })();
        self.put(out, o);
        res
    }

    fn matmul(
        &mut self,
        w: Weight,
        x: Buf,
        out: Buf,
        n_tokens: usize,
        label: OpLabel,
    ) -> Result<()> {
        let _op = self.ops.begin(label);
        let (rows, cols) = {
            let cw = self.weight(w)?;
            (cw.rows, cw.cols)
        };
        let isa = self.scratch.isa();
        let repack = self.repack;
        let cw = &mut self.weights[w.0 as usize];
        let packs = n_tokens >= self.pack_min_rows;
        if packs && cw.packed.is_none() {
            let packed = repack
                .then(|| PackedMatrix::new(isa, cw.ty, rows, cols, cw.bytes()))
                .flatten();
            cw.packed = Some(packed);
        }
        let mut o = self.take(out, n_tokens * rows)?;
        let mut scratch = std::mem::take(&mut self.scratch);
        let res = (|| {
            let cw = self.weight(w)?;
            let xv = self.buf(x, n_tokens * cols)?;
            let y = &mut o[..n_tokens * rows];
            if let Some(Some(p)) = cw.packed.as_ref().filter(|_| packs) {
                matmul_packed(&self.pool, p, xv, n_tokens, y, &mut scratch);
                return Ok(());
            }
            let m = QuantMatrix::new(cw.ty, rows, cols, cw.bytes())
                .map_err(|e| invalid(format!("{}: {e}", cw.name)))?;
            matmul(&self.pool, &m, xv, n_tokens, y, &mut scratch);
            Ok(())
        })();
        self.scratch = scratch;
        self.put(out, o);
        res
    }

    // The fused ops as their separate ops: the reference the GPU's fused kernels are held to.
    fn matmul_qkv(
        &mut self,
        w: [Weight; 3],
        bias: [Option<Weight>; 3],
        x: Buf,
        out: [Buf; 3],
        n_tokens: usize,
        layer: u32,
    ) -> Result<()> {
        qkv_separately(self, w, bias, x, out, n_tokens, layer)
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
        let w = [w_gate, w_up];
        glu_separately(self, w, x, gate, up, n_tokens, ffn_dim, act, layer)
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
        norm_add_separately(
            self, x, weight, acc, tmp, n_tokens, dim, eps, label, add_label,
        )
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
        add_separately(self, w, x, acc, tmp, n_tokens, dim, label, add_label)
    }

    fn add_bias(&mut self, x: Buf, bias: Weight, n_tokens: usize, label: OpLabel) -> Result<()> {
        let _op = self.ops.begin(label);
        let len = self.weight(bias)?.cols;
        let mut xv = self.take(x, n_tokens * len)?;
        let res = self.vector(bias, len).map(|b| {
            for row in xv[..n_tokens * len].chunks_exact_mut(len) {
                for (v, &bv) in row.iter_mut().zip(b) {
                    *v += bv;
                }
            }
        });
        self.put(x, xv);
        res
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
        let _op = self.ops.begin(label);
        let half = p.pairs(head_dim)?;
        let factors = match p.freq_factors {
            Some(f) => Some(self.vector(f, half)?.to_vec()),
            None => None,
        };
        let mut xv = self.take(x, (row0 + n_tokens) * n_heads * head_dim)?;
        // As ggml computes it: theta_i = pos · freq_scale · base^(-2i/n_rot) / factor_i, the
        // powers built by repeated multiplication in f32. Each token's angles depend only on its
        // position, so a batch's rows go over the pool (the same values as on one thread).
        let theta_scale = p.base.powf(-2.0 / p.n_rot as f32);
        let row_len = n_heads * head_dim;
        let rotate = |t0: usize, rows: &mut [f32]| {
            let mut cs = vec![(0f32, 0f32); half];
            for (k, row) in rows.chunks_exact_mut(row_len).enumerate() {
                let t = t0 + k;
                match &p.yarn {
                    // ggml's `rope_yarn`: the unscaled angle, then interpolation mixed in per pair.
                    Some(y) => {
                        let mscale = p.attn_factor * y.mscale(p.freq_scale);
                        let mut theta = (pos0 + t) as f32;
                        for (i, c) in cs.iter_mut().enumerate() {
                            let th = match &factors {
                                Some(f) => theta / f[i],
                                None => theta,
                            };
                            let th = y.angle(th, p.freq_scale, i);
                            *c = (th.cos() * mscale, th.sin() * mscale);
                            theta *= theta_scale;
                        }
                    }
                    None => {
                        let mut theta = (pos0 + t) as f32 * p.freq_scale;
                        for (i, c) in cs.iter_mut().enumerate() {
                            let th = match &factors {
                                Some(f) => theta / f[i],
                                None => theta,
                            };
                            *c = (th.cos() * p.attn_factor, th.sin() * p.attn_factor);
                            theta *= theta_scale;
                        }
                    }
                }
                for head in row.chunks_exact_mut(head_dim) {
                    for (i, &(c, s)) in cs.iter().enumerate() {
                        let (a, b) = if p.neox {
                            (i, i + half)
                        } else {
                            (2 * i, 2 * i + 1)
                        };
                        let (x0, x1) = (head[a], head[b]);
                        head[a] = x0 * c - x1 * s;
                        head[b] = x0 * s + x1 * c;
                    }
                }
            }
        };
        let batch = &mut xv[row0 * row_len..(row0 + n_tokens) * row_len];
        self.pool
            .split_rows(batch, row_len, NORM_PAR_MIN, &|first, part| {
                rotate(first, part)
            });
        self.put(x, xv);
        Ok(())
    }

    fn attention(&mut self, q: Buf, k: Buf, v: Buf, out: Buf, p: &AttnParams) -> Result<()> {
        let _op = self.ops.begin(OpLabel::layer(p.layer as u32, "attention"));
        let kv_dim = p.n_kv_heads * p.head_dim;
        let q_dim = p.n_heads * p.head_dim;
        let kv = self
            .kv
            .take()
            .ok_or_else(|| invalid("attention before the KV cache was allocated".into()))?;
        let rows = p.row0..p.row0 + p.n_tokens;
        let mut o = match self.take(out, rows.end * q_dim) {
            Ok(o) => o,
            Err(e) => {
                self.kv = Some(kv);
                return Err(e);
            }
        };
        let mut kv = kv;
        let res = kv.layout.check_attention(p).and_then(|()| {
            let slots = kv.layout.slots(p.layer);
            let base = kv.layout.seq_offset(p.layer, p.seq);
            let layer = base..base + slots * kv_dim;
            let (r0, r1) = (rows.start, rows.end);
            let (qv, kn, vn) = (
                &self.buf(q, r1 * q_dim)?[r0 * q_dim..r1 * q_dim],
                &self.buf(k, r1 * kv_dim)?[r0 * kv_dim..r1 * kv_dim],
                &self.buf(v, r1 * kv_dim)?[r0 * kv_dim..r1 * kv_dim],
            );
            let sinks = match p.sinks {
                Some(w) => self.vector(w, p.n_heads)?,
                None => &[],
            };
            let run = attention::Run {
                pool: &self.pool,
                scores: &self.scores,
                isa: self.scratch.isa(),
                p,
                slots,
                sinks,
            };
            let o = &mut o[r0 * q_dim..r1 * q_dim];
            match &mut kv.data {
                KvData::F32 { k, v } => {
                    run.store_and_attend(qv, kn, vn, &mut k[layer.clone()], &mut v[layer], o)
                }
                KvData::F16 { k, v } => {
                    run.store_and_attend(qv, kn, vn, &mut k[layer.clone()], &mut v[layer], o)
                }
            }
            Ok(())
        });
        self.kv = Some(kv);
        self.put(out, o);
        res
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
        rope_attention_separately(self, q, k, v, out, norms, rope, p)
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
        rope_attention_rows_separately(self, q, k, v, out, norms, rope, p, rows)
    }

    fn moe_ffn(&mut self, m: &crate::gpu::backend::MoeFfn) -> Result<()> {
        self.moe(m)
    }

    fn swiglu(&mut self, gate: Buf, up: Buf, len: usize, label: OpLabel) -> Result<()> {
        let _op = self.ops.begin(label);
        let mut g = self.take(gate, len)?;
        let res = self
            .buf(up, len)
            .map(|u| gated(&self.pool, &mut g[..len], u, Gate::Silu));
        self.put(gate, g);
        res
    }

    fn geglu(&mut self, gate: Buf, up: Buf, len: usize, label: OpLabel) -> Result<()> {
        let _op = self.ops.begin(label);
        let mut g = self.take(gate, len)?;
        let res = self
            .buf(up, len)
            .map(|u| gated(&self.pool, &mut g[..len], u, Gate::Gelu));
        self.put(gate, g);
        res
    }

    fn scale(&mut self, x: Buf, len: usize, factor: f32, label: OpLabel) -> Result<()> {
        let _op = self.ops.begin(label);
        let mut xv = self.take(x, len)?;
        for v in &mut xv[..len] {
            *v *= factor;
        }
        self.put(x, xv);
        Ok(())
    }

    fn add(&mut self, acc: Buf, x: Buf, len: usize, label: OpLabel) -> Result<()> {
        let _op = self.ops.begin(label);
        let mut a = self.take(acc, len)?;
        let res = self.buf(x, len).map(|xv| {
            for (av, &xv) in a[..len].iter_mut().zip(xv) {
                *av += xv;
            }
        });
        self.put(acc, a);
        res
    }

    fn set_exact_rows_below(&mut self, rows: usize) {
        // Exactly `rows`, even below PACK_MIN_TOKENS: `serve` reads the last n_slots + 1 tokens
        // of a cached prompt again and relies on their taking the packed GEMM as a fresh
        // prompt's rows do.
        self.pack_min_rows = rows.max(1);
    }

    fn copy(
        &mut self,
        src: Buf,
        src_off: usize,
        dst: Buf,
        dst_off: usize,
        len: usize,
    ) -> Result<()> {
        let _op = self.ops.begin(OpLabel::global("copy"));
        let mut d = self.take(dst, dst_off + len)?;
        let res = self
            .buf(src, src_off + len)
            .map(|s| d[dst_off..dst_off + len].copy_from_slice(&s[src_off..src_off + len]));
        self.put(dst, d);
        res
    }
}
