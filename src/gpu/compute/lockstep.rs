//! [`Lockstep`]: a backend that runs every op on the CPU reference and on the GPU, compares
//! what each op wrote, then copies the CPU's result into the GPU's buffer, so that every op is
//! judged on identical inputs. It names the op (and kernel) whose output differs, where a
//! comparison of final logits only says that something does. A diagnostic for
//! `hipscope selftest --compute`, far too slow for anything else (a download per op).
//!
//! A fused op runs as the GPU runs it: where the GPU launches one fused kernel (a one-token
//! `matmul_qkv`, `matmul_glu` (`matmul_swiglu`/`matmul_geglu` kinds) or `matmul_add` of a
//! quantized type, `GpuCompute::fuses`; every `rope_attention`, with Qwen 3's and Gemma 3's head
//! norms inside it; every `rms_norm_add`), both sides run the fused op (the CPU as its separate
//! ops) and each output is compared under the fused kernel's own kind (`matmul_qkv Q4_0 (mv
//! fused)`, `qk_norm + rope (neox) + kv_store (fused)`, `rms_norm + add (fused)`); where the GPU
//! would run the separate ops, so does the lockstep, comparing each. A scratch output that the
//! fused kernel leaves untouched (`matmul_add`'s and `rms_norm_add`'s `tmp`, `matmul_glu`'s
//! `up`) is copied across uncompared.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::gpu::backend::{
    AttnParams, Buf, Glu, HeadNorms, Instrument, KvLayout, KvShift, KvType, Memory, MemoryPlan,
    MoeFfn, OpLabel, Ops, Result, RopeParams, SeqPos, Weight, WeightData, add_separately,
    glu_separately, qkv_separately,
};
use crate::gpu::compute::GpuCompute;
use crate::gpu::cpu::CpuBackend;
use crate::gpu::quant::GgmlType;
use crate::gpu::snapshot::{ArenaSnapshot, DeviceRelease, DeviceSummary, QuitStep};

/// The worst difference seen for one kind of op.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpError {
    /// ‖gpu − cpu‖₂ / ‖cpu‖₂, worst call.
    pub rel_l2: f64,
    /// Where the worst call was (`layer 3 · ffn_down`).
    pub worst_at: String,
    pub calls: usize,
    /// Rows left out of the comparison: a MoE op's tokens whose router put two experts within
    /// [`ROUTE_TIE`] of each other at the k-th place (see [`route_ties`]).
    pub tied_rows: usize,
}

/// Router logits this close (relative to the token's largest) at the k-th place are a tie that f32
/// rounding decides: the router's own bound (1e-5), so either backend's choice is right.
pub const ROUTE_TIE: f32 = 1e-5;

/// For each of `n` tokens of `ne` router logits (the values the top k are chosen by), whether the
/// k-th and (k+1)-th largest differ by more than nothing and at most [`ROUTE_TIE`] of the token's
/// largest magnitude: the two backends may then route the token to different experts, both
/// correctly, and its output differs by a whole expert's share (the first Qwen3-MoE Q4_K_M run
/// showed one token of 800 so: 0.19 of its row, the rest of the batch at 2e-3). Exactly equal
/// logits are not a tie here: both backends take the lower expert.
pub fn route_ties(logits: &[f32], ne: usize, k: usize) -> Vec<bool> {
    logits
        .chunks(ne.max(1))
        .map(|row| {
            if k == 0 || k >= row.len() {
                return false;
            }
            let mut v = row.to_vec();
            v.sort_by(|a, b| b.total_cmp(a));
            let scale = row.iter().fold(0f32, |m, x| m.max(x.abs()));
            let gap = v[k - 1] - v[k];
            gap > 0.0 && gap <= ROUTE_TIE * scale
        })
        .collect()
}

/// Per op kind (`matmul Q4_0 (mv)`, `rope`, …), the worst difference.
pub type OpErrors = BTreeMap<String, OpError>;

/// Both backends, op by op.
pub struct Lockstep {
    cpu: CpuBackend,
    gpu: GpuCompute,
    /// Type, rows, cols of each weight.
    weight_shapes: Vec<(GgmlType, usize, usize)>,
    errors: Arc<Mutex<OpErrors>>,
}

/// ‖a − b‖₂ / ‖b‖₂ (a non-finite value anywhere counts as infinitely wrong).
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let mut num = 0f64;
    let mut den = 0f64;
    for (&x, &y) in a.iter().zip(b) {
        if !x.is_finite() || !y.is_finite() {
            return f64::INFINITY;
        }
        num += (x as f64 - y as f64).powi(2);
        den += (y as f64).powi(2);
    }
    if den == 0.0 {
        if num == 0.0 { 0.0 } else { f64::INFINITY }
    } else {
        (num / den).sqrt()
    }
}

impl Lockstep {
    /// The wrapper, and the table it fills (readable after the model has taken the backend).
    pub fn new(cpu: CpuBackend, gpu: GpuCompute) -> (Lockstep, Arc<Mutex<OpErrors>>) {
        let errors = Arc::new(Mutex::new(OpErrors::new()));
        (
            Lockstep {
                cpu,
                gpu,
                weight_shapes: Vec::new(),
                errors: errors.clone(),
            },
            errors,
        )
    }

    /// Compares the first `n` elements of `b` on both sides and makes the GPU's equal the CPU's.
    fn check(&mut self, b: Buf, n: usize, kind: String, at: OpLabel) -> Result<()> {
        self.check_rows(b, n, &[], kind, at)
    }

    /// [`Lockstep::check`] with the rows (of `n / skip.len()` elements) whose `skip` is true left
    /// out of the comparison, and counted.
    fn check_rows(
        &mut self,
        b: Buf,
        n: usize,
        skip: &[bool],
        kind: String,
        at: OpLabel,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let mut c = vec![0f32; n];
        let mut g = vec![0f32; n];
        self.cpu.read(b, 0, &mut c)?;
        self.gpu.read(b, 0, &mut g)?;
        let tied = skip.iter().filter(|&&s| s).count();
        let e = if tied == 0 {
            rel_l2(&g, &c)
        } else {
            let row = n / skip.len();
            let keep = |v: &[f32]| -> Vec<f32> {
                v.chunks(row)
                    .zip(skip)
                    .filter(|(_, s)| !**s)
                    .flat_map(|(r, _)| r.iter().copied())
                    .collect()
            };
            rel_l2(&keep(&g), &keep(&c))
        };
        if let Ok(mut errors) = self.errors.lock() {
            let slot = errors.entry(kind).or_default();
            slot.calls += 1;
            slot.tied_rows += tied;
            if e > slot.rel_l2 || slot.calls == 1 {
                slot.rel_l2 = e;
                slot.worst_at = at.to_string();
            }
        }
        self.gpu.write_buffer(b, &c)
    }

    /// Makes the first `n` elements of `b` on the GPU equal the CPU's, uncompared (a scratch
    /// output that a fused kernel leaves untouched).
    fn sync(&mut self, b: Buf, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let mut c = vec![0f32; n];
        self.cpu.read(b, 0, &mut c)?;
        self.gpu.write_buffer(b, &c)
    }

    /// The GPU's path for a product of type `ty` over `n_tokens` rows, as the kinds name it.
    fn matmul_path(&self, ty: GgmlType, n_tokens: usize) -> &'static str {
        if n_tokens < self.gpu.options().gemm_min_tokens {
            "mv"
        } else if self.gpu.prefill_is_f16(ty) {
            "gemm f16"
        } else {
            "gemm"
        }
    }

    /// The kind of a fused product over weight `w`: `matmul_qkv Q4_0 (mv fused)`.
    fn fused_kind(&self, op: &str, w: Weight) -> String {
        format!("{op} {} (mv fused)", self.weight_shapes[w.0 as usize].0)
    }
}

/// The kind of an attention call: prompt or decode, global or windowed.
fn attention_kind(p: &AttnParams) -> &'static str {
    match (p.n_tokens > 1, p.window > 0) {
        (true, false) => "attention (prompt)",
        (false, false) => "attention (decode)",
        (true, true) => "attention (prompt, window)",
        (false, true) => "attention (decode, window)",
    }
}

fn same<T: PartialEq + std::fmt::Debug>(a: T, b: T, what: &str) -> Result<T> {
    if a == b {
        Ok(a)
    } else {
        Err(crate::gpu::backend::BackendError::Invalid(format!(
            "lockstep: the backends numbered {what} differently ({a:?} vs {b:?})"
        )))
    }
}

impl Ops for Lockstep {
    fn embed(&mut self, table: Weight, tokens: &[u32], out: Buf) -> Result<()> {
        self.cpu.embed(table, tokens, out)?;
        self.gpu.embed(table, tokens, out)?;
        let (ty, _, cols) = self.weight_shapes[table.0 as usize];
        let n = tokens.len() * cols;
        self.check(out, n, format!("embed {ty}"), OpLabel::global("embed"))
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
        self.cpu
            .rms_norm(x, weight, out, n_tokens, dim, eps, label)?;
        self.gpu
            .rms_norm(x, weight, out, n_tokens, dim, eps, label)?;
        self.check(out, n_tokens * dim, "rms_norm".into(), label)
    }

    fn matmul(
        &mut self,
        w: Weight,
        x: Buf,
        out: Buf,
        n_tokens: usize,
        label: OpLabel,
    ) -> Result<()> {
        self.cpu.matmul(w, x, out, n_tokens, label)?;
        self.gpu.matmul(w, x, out, n_tokens, label)?;
        let (ty, rows, _) = self.weight_shapes[w.0 as usize];
        let path = self.matmul_path(ty, n_tokens);
        let n = n_tokens * rows;
        self.check(out, n, format!("matmul {ty} ({path})"), label)
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
        if !self.gpu.fuses(&w, n_tokens) {
            return qkv_separately(self, w, bias, x, out, n_tokens, layer);
        }
        self.cpu.matmul_qkv(w, bias, x, out, n_tokens, layer)?;
        self.gpu.matmul_qkv(w, bias, x, out, n_tokens, layer)?;
        let kind = self.fused_kind("matmul_qkv", w[0]);
        for (i, name) in ["attn_q", "attn_k", "attn_v"].into_iter().enumerate() {
            let rows = self.weight_shapes[w[i].0 as usize].1;
            let at = OpLabel::layer(layer, name);
            self.check(out[i], n_tokens * rows, kind.clone(), at)?;
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
        let w = [w_gate, w_up];
        if !self.gpu.fuses(&w, n_tokens) {
            return glu_separately(self, w, x, gate, up, n_tokens, ffn_dim, act, layer);
        }
        self.cpu
            .matmul_glu(w_gate, w_up, x, gate, up, n_tokens, ffn_dim, act, layer)?;
        self.gpu
            .matmul_glu(w_gate, w_up, x, gate, up, n_tokens, ffn_dim, act, layer)?;
        let name = match act {
            Glu::Silu => "matmul_swiglu",
            Glu::GeluTanh => "matmul_geglu",
        };
        let kind = self.fused_kind(name, w_gate);
        let n = n_tokens * ffn_dim;
        self.check(gate, n, kind, OpLabel::layer(layer, "ffn_gate_up"))?;
        self.sync(up, n)
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
        // The GPU adds in the norm's launch: the sum compared, the CPU's scratch copied over.
        self.cpu
            .rms_norm_add(x, weight, acc, tmp, n_tokens, dim, eps, label, add_label)?;
        self.gpu
            .rms_norm_add(x, weight, acc, tmp, n_tokens, dim, eps, label, add_label)?;
        self.check(acc, n_tokens * dim, "rms_norm + add (fused)".into(), label)?;
        self.sync(tmp, n_tokens * dim)
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
        if !self.gpu.fuses(&[w], n_tokens) {
            return add_separately(self, w, x, acc, tmp, n_tokens, dim, label, add_label);
        }
        self.cpu
            .matmul_add(w, x, acc, tmp, n_tokens, dim, label, add_label)?;
        self.gpu
            .matmul_add(w, x, acc, tmp, n_tokens, dim, label, add_label)?;
        let kind = self.fused_kind("matmul_add", w);
        self.check(acc, n_tokens * dim, kind, label)?;
        self.sync(tmp, n_tokens * dim)
    }

    fn moe_ffn(&mut self, m: &MoeFfn) -> Result<()> {
        self.cpu.moe_ffn(m)?;
        self.gpu.moe_ffn(m)?;
        let ty = self.weight_shapes[m.gate.0 as usize].0;
        let at = OpLabel::layer(m.layer, "ffn_moe");
        // The router's logits, then the residual with the experts' sum added.
        self.check(
            m.logits,
            m.n_tokens * m.n_expert,
            "moe router F32".into(),
            at,
        )?;
        let path = if m.n_tokens == 1 {
            "1"
        } else if self.gpu.moe_grouped(m.n_tokens, m.gate, m.down) {
            "gemm f16"
        } else {
            "chunks"
        };
        // Tokens routed at a tie are left out (`route_ties`): the logits are the CPU's, which the
        // check above has just given the GPU too, within the router's bound of its own.
        let mut logits = vec![0f32; m.n_tokens * m.n_expert];
        self.cpu.read(m.logits, 0, &mut logits)?;
        let ties = route_ties(&logits, m.n_expert, m.n_used);
        self.check_rows(
            m.acc,
            m.n_tokens * m.dim,
            &ties,
            format!("moe experts {ty} ({path})"),
            at,
        )
    }

    fn add_bias(&mut self, x: Buf, bias: Weight, n_tokens: usize, label: OpLabel) -> Result<()> {
        self.cpu.add_bias(x, bias, n_tokens, label)?;
        self.gpu.add_bias(x, bias, n_tokens, label)?;
        let width = self.weight_shapes[bias.0 as usize].2;
        self.check(x, n_tokens * width, "add_bias".into(), label)
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
        self.cpu
            .rope(x, row0, n_tokens, n_heads, head_dim, pos0, params, label)?;
        self.gpu
            .rope(x, row0, n_tokens, n_heads, head_dim, pos0, params, label)?;
        let kind = if params.neox { "rope (neox)" } else { "rope" };
        self.check(
            x,
            (row0 + n_tokens) * n_heads * head_dim,
            kind.into(),
            label,
        )
    }

    fn attention(&mut self, q: Buf, k: Buf, v: Buf, out: Buf, p: &AttnParams) -> Result<()> {
        self.cpu.attention(q, k, v, out, p)?;
        self.gpu.attention(q, k, v, out, p)?;
        self.check(
            out,
            (p.row0 + p.n_tokens) * p.n_heads * p.head_dim,
            attention_kind(p).into(),
            OpLabel::layer(p.layer as u32, "attention"),
        )
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
        // The GPU normalizes (Qwen 3, Gemma 3) and rotates q and k in place in the launch that
        // writes the cache (`rope + kv_store`), then attends: both rotations compared, then the
        // attention's output.
        self.cpu.rope_attention(q, k, v, out, norms, rope, p)?;
        self.gpu.rope_attention(q, k, v, out, norms, rope, p)?;
        let l = p.layer as u32;
        let normed = if norms.q.is_some() || norms.k.is_some() {
            "qk_norm + "
        } else {
            ""
        };
        let kind = if rope.neox {
            format!("{normed}rope (neox) + kv_store (fused)")
        } else {
            format!("{normed}rope + kv_store (fused)")
        };
        let (q_len, k_len) = (p.n_heads * p.head_dim, p.n_kv_heads * p.head_dim);
        let rows = p.row0 + p.n_tokens;
        self.check(q, rows * q_len, kind.clone(), OpLabel::layer(l, "rope_q"))?;
        self.check(k, rows * k_len, kind, OpLabel::layer(l, "rope_k"))?;
        let at = OpLabel::layer(l, "attention");
        self.check(out, rows * q_len, attention_kind(p).into(), at)
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
        // The GPU runs every sequence's row in one launch of each kernel; the CPU a row at a
        // time. The rotated q and k, then the attention's output, of every row.
        self.cpu
            .rope_attention_rows(q, k, v, out, norms, rope, p, rows)?;
        self.gpu
            .rope_attention_rows(q, k, v, out, norms, rope, p, rows)?;
        let l = p.layer as u32;
        let n = rows.len();
        let kind = "rope + kv_store (sequences)".to_string();
        let (q_len, k_len) = (p.n_heads * p.head_dim, p.n_kv_heads * p.head_dim);
        self.check(q, n * q_len, kind.clone(), OpLabel::layer(l, "rope_q"))?;
        self.check(k, n * k_len, kind, OpLabel::layer(l, "rope_k"))?;
        let at = if p.window > 0 {
            "attention (sequences, window)"
        } else {
            "attention (sequences)"
        };
        self.check(out, n * q_len, at.into(), OpLabel::layer(l, "attention"))
    }

    fn swiglu(&mut self, gate: Buf, up: Buf, len: usize, label: OpLabel) -> Result<()> {
        self.cpu.swiglu(gate, up, len, label)?;
        self.gpu.swiglu(gate, up, len, label)?;
        self.check(gate, len, "swiglu".into(), label)
    }

    fn geglu(&mut self, gate: Buf, up: Buf, len: usize, label: OpLabel) -> Result<()> {
        self.cpu.geglu(gate, up, len, label)?;
        self.gpu.geglu(gate, up, len, label)?;
        self.check(gate, len, "geglu".into(), label)
    }

    fn scale(&mut self, x: Buf, len: usize, factor: f32, label: OpLabel) -> Result<()> {
        self.cpu.scale(x, len, factor, label)?;
        self.gpu.scale(x, len, factor, label)?;
        self.check(x, len, "scale".into(), label)
    }

    fn add(&mut self, acc: Buf, x: Buf, len: usize, label: OpLabel) -> Result<()> {
        self.cpu.add(acc, x, len, label)?;
        self.gpu.add(acc, x, len, label)?;
        self.check(acc, len, "add".into(), label)
    }

    fn set_exact_rows_below(&mut self, rows: usize) {
        self.cpu.set_exact_rows_below(rows);
        self.gpu.set_exact_rows_below(rows);
    }

    fn copy(
        &mut self,
        src: Buf,
        src_off: usize,
        dst: Buf,
        dst_off: usize,
        len: usize,
    ) -> Result<()> {
        self.cpu.copy(src, src_off, dst, dst_off, len)?;
        self.gpu.copy(src, src_off, dst, dst_off, len)?;
        self.check(dst, dst_off + len, "copy".into(), OpLabel::global("copy"))
    }
}

impl Memory for Lockstep {
    fn plan(&mut self, plan: &MemoryPlan) -> Result<()> {
        self.cpu.plan(plan)?;
        self.gpu.plan(plan)
    }

    fn plan_bytes(&self, plan: &MemoryPlan) -> Option<u64> {
        self.gpu.plan_bytes(plan)
    }

    fn load_weight(&mut self, data: &WeightData) -> Result<Weight> {
        let a = self.cpu.load_weight(data)?;
        let b = self.gpu.load_weight(data)?;
        self.weight_shapes.push((data.ty, data.rows, data.cols));
        same(a, b, "a weight")
    }

    fn stage_weights(&mut self, data: &[WeightData]) -> Result<Vec<Weight>> {
        let a = self.cpu.stage_weights(data)?;
        let b = self.gpu.stage_weights(data)?;
        if a != b {
            return Err(crate::gpu::backend::BackendError::Invalid(format!(
                "lockstep: the CPU and the GPU staged weights as {a:?} and {b:?}"
            )));
        }
        Ok(b)
    }

    fn pin_host(
        &mut self,
        storage: &crate::gpu::backend::SharedBytes,
        range: std::ops::Range<usize>,
    ) -> Result<bool> {
        self.cpu.pin_host(storage, range.clone())?;
        self.gpu.pin_host(storage, range)
    }

    /// The CPU's rows, as [`Memory::read`] answers with the CPU's values (the GPU's are
    /// downloaded too, so that its copy path runs in the selftest).
    fn kv_rows_out(
        &mut self,
        layer: usize,
        seq: usize,
        pos: std::ops::Range<usize>,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let mut gpu = Vec::new();
        self.gpu.kv_rows_out(layer, seq, pos.clone(), &mut gpu)?;
        self.cpu.kv_rows_out(layer, seq, pos, out)
    }

    fn kv_rows_in(&mut self, layer: usize, seq: usize, pos0: usize, data: &[u8]) -> Result<()> {
        self.cpu.kv_rows_in(layer, seq, pos0, data)?;
        self.gpu.kv_rows_in(layer, seq, pos0, data)
    }

    fn alloc(&mut self, name: &'static str, len: usize) -> Result<Buf> {
        let a = self.cpu.alloc(name, len)?;
        let b = self.gpu.alloc(name, len)?;
        same(a, b, "a buffer")
    }

    fn alloc_kv_cache(&mut self, layout: &KvLayout) -> Result<()> {
        self.cpu.alloc_kv_cache(layout)?;
        self.gpu.alloc_kv_cache(layout)
    }

    fn kv_type(&self) -> KvType {
        self.gpu.kv_type()
    }

    fn kv_shift(&mut self, s: &KvShift) -> Result<()> {
        // The caches are not compared directly: the attention that reads them next is.
        self.cpu.kv_shift(s)?;
        self.gpu.kv_shift(s)
    }

    fn read(&mut self, buf: Buf, offset: usize, out: &mut [f32]) -> Result<()> {
        // Every op was already compared and resynchronised: the CPU's values are the answer.
        self.cpu.read(buf, offset, out)
    }

    fn write(&mut self, buf: Buf, offset: usize, data: &[f32]) -> Result<()> {
        self.cpu.write(buf, offset, data)?;
        self.gpu.write(buf, offset, data)
    }

    fn cross_out(&mut self, buf: Buf, out: &mut [f32], label: OpLabel) -> Result<()> {
        self.cpu.cross_out(buf, out, label)
    }

    fn cross_in(&mut self, buf: Buf, data: &[f32], label: OpLabel) -> Result<()> {
        self.cpu.cross_in(buf, data, label)?;
        self.gpu.cross_in(buf, data, label)
    }

    fn arena(&self) -> ArenaSnapshot {
        self.gpu.arena()
    }
}

impl Instrument for Lockstep {
    fn device(&self) -> DeviceSummary {
        self.gpu.device()
    }

    fn shutdown(
        &mut self,
        drain_deadline: Duration,
        on_step: &mut dyn FnMut(QuitStep),
    ) -> DeviceRelease {
        self.gpu.shutdown(drain_deadline, on_step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_error_is_the_l2_ratio_and_flags_non_finite_values() {
        assert_eq!(rel_l2(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        let e = rel_l2(&[1.0, 2.0, 2.0], &[0.0, 2.0, 2.0]);
        assert!((e - 1.0 / 8f64.sqrt()).abs() < 1e-12);
        assert_eq!(rel_l2(&[f32::NAN], &[1.0]), f64::INFINITY);
        assert_eq!(rel_l2(&[1.0], &[0.0]), f64::INFINITY);
        assert_eq!(rel_l2(&[0.0], &[0.0]), 0.0);
    }

    #[test]
    fn a_route_tie_is_a_near_tie_at_the_kth_place() {
        // k = 2 of 4 experts, three tokens: the 2nd and 3rd largest 1e-6 apart (relative to 4.0),
        // a clear gap, an exact tie (not one: both backends take the lower expert).
        let logits = [
            4.0, 1.0, 1.000_004, -2.0, //
            4.0, 1.0, 0.5, -2.0, //
            4.0, 1.0, 1.0, -2.0,
        ];
        assert_eq!(route_ties(&logits, 4, 2), [true, false, false]);
        // A near tie inside the top k changes nothing: not a tie.
        assert_eq!(route_ties(&[1.0, 1.000_001, -3.0, -4.0], 4, 2), [false]);
        assert_eq!(route_ties(&[1.0, 2.0], 2, 2), [false]);
    }
}
