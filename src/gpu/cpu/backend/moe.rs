//! The mixture-of-experts feed-forward on the CPU ([`Ops::moe_ffn`]), as llama.cpp's CPU
//! backend computes `build_moe_ffn`: the router product, softmax (ggml's: f32 exponentials, the
//! sum in f64), top-k largest first, the chosen probabilities divided by their sum (clamped below
//! at 2^-14), then each expert's SwiGLU FFN over the tokens routed to it (tokens grouped by
//! expert, so that each expert's weights are read once per batch), and the weighted outputs
//! summed in the order they were chosen before the residual add.
//!
//! gpt-oss's variant ([`MoeFfn::oai`]): the router's bias added to its logits, the top k of the
//! logits themselves chosen, their weights a softmax over those k logits
//! (`LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT`), each expert product plus its bias, and
//! ggml's clamped `swiglu_oai` in place of SwiGLU.
//!
//! [`Ops::moe_ffn`]: crate::gpu::backend::Ops::moe_ffn

use super::{CpuBackend, invalid};
use crate::gpu::backend::{MoeFfn, OpLabel, Ops, Result, Weight};
use crate::gpu::cpu::activation::swiglu_oai;
use crate::gpu::cpu::matmul::{MatmulScratch, QuantMatrix, matmul, matmul_packed};
use crate::gpu::cpu::pool::ThreadPool;
use crate::gpu::quant;
use crate::gpu::quant::dot::PackedMatrix;

/// The fewest tokens routed to one expert for which its matrices are repacked for the GEMM
/// kernel for this product alone (the packed copy is not kept: a whole MoE model's experts
/// twice would not fit beside the file in memory). Repacking is one pass over the expert's
/// bytes; on the 2-core AVX-512 machine it paid from a few tokens on (qwen3-30b-a3b-2l Q4_0
/// pp512: experts' time halved), where every expert of a 512-token prompt gets ~32 tokens.
const MOE_PACK_MIN_TOKENS: usize = 12;

/// One expert product: on a copy repacked for the GEMM kernel when `pack` and the type has
/// one, else on the file's layout.
fn expert_product(
    pool: &ThreadPool,
    m: &QuantMatrix,
    pack: bool,
    x: &[f32],
    nt: usize,
    y: &mut [f32],
    scratch: &mut MatmulScratch,
) {
    if pack && let Some(p) = PackedMatrix::new(scratch.isa(), m.ty, m.rows, m.cols, m.data) {
        return matmul_packed(pool, &p, x, nt, y, scratch);
    }
    matmul(pool, m, x, nt, y, scratch);
}

/// The routing of one token: its chosen experts, largest probability first, and their weights.
pub fn route(logits: &[f32], k: usize, experts: &mut Vec<usize>, weights: &mut Vec<f32>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    let mut p: Vec<f32> = logits
        .iter()
        .map(|&l| {
            let e = (l - max).exp();
            sum += e as f64;
            e
        })
        .collect();
    let inv = (1.0 / sum) as f32;
    for v in &mut p {
        *v *= inv;
    }
    experts.clear();
    experts.extend(0..p.len());
    // Descending; equal probabilities keep the lower id first.
    experts.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    experts.truncate(k);
    weights.clear();
    weights.extend(experts.iter().map(|&e| p[e]));
    let total: f64 = weights.iter().map(|&w| w as f64).sum();
    let total = (total as f32).max(6.103_515_6e-5);
    for w in weights.iter_mut() {
        *w /= total;
    }
}

/// gpt-oss's routing of one token (`SOFTMAX_WEIGHT` gating): the k largest (biased) logits,
/// largest first, weighted by the softmax of those k logits alone.
pub fn route_softmax_weight(
    logits: &[f32],
    k: usize,
    experts: &mut Vec<usize>,
    weights: &mut Vec<f32>,
) {
    experts.clear();
    experts.extend(0..logits.len());
    experts.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    experts.truncate(k);
    let max = experts
        .iter()
        .map(|&e| logits[e])
        .fold(f32::NEG_INFINITY, f32::max);
    weights.clear();
    let mut sum = 0f64;
    for &e in experts.iter() {
        let w = (logits[e] - max).exp();
        sum += w as f64;
        weights.push(w);
    }
    let inv = (1.0 / sum) as f32;
    for w in weights.iter_mut() {
        *w *= inv;
    }
}

/// Expert `e` of an expert tensor: its `rows` rows of `cols`.
fn view(w: &super::CpuWeight, e: usize, rows: usize, cols: usize) -> Result<QuantMatrix<'_>> {
    let rb = w.row_bytes();
    QuantMatrix::new(
        w.ty,
        rows,
        cols,
        &w.bytes()[e * rows * rb..(e + 1) * rows * rb],
    )
    .map_err(|err| invalid(format!("{}: {err}", w.name)))
}

impl CpuBackend {
    /// The `rows` × `cols` f32 values of a bias tensor (gpt-oss's per-expert biases).
    fn bias_rows(&self, w: Weight, rows: usize, cols: usize, what: &str) -> Result<Vec<f32>> {
        let cw = self.weight(w)?;
        if cw.rows * cw.cols != rows * cols || cw.cols != cols {
            return Err(invalid(format!(
                "{}: {} × {}, the MoE {what} needs {rows} × {cols}",
                cw.name, cw.rows, cw.cols
            )));
        }
        let mut v = vec![0f32; rows * cols];
        quant::dequantize(cw.ty, cw.bytes(), &mut v)
            .map_err(|e| invalid(format!("{}: {e}", cw.name)))?;
        Ok(v)
    }

    /// Checks that `w` has `rows` rows of `cols` (an expert tensor of the MoE op).
    fn moe_shape(&self, w: Weight, rows: usize, cols: usize, what: &str) -> Result<()> {
        let cw = self.weight(w)?;
        if cw.rows != rows || cw.cols != cols {
            return Err(invalid(format!(
                "{}: {} × {}, the MoE {what} needs {rows} × {cols}",
                cw.name, cw.rows, cw.cols
            )));
        }
        Ok(())
    }

    pub(super) fn moe(&mut self, m: &MoeFfn) -> Result<()> {
        let (n, dim, ff, ne, k) = (m.n_tokens, m.dim, m.ffn_dim, m.n_expert, m.n_used);
        if k == 0 || k > ne {
            return Err(invalid(format!("MoE: {k} of {ne} experts asked for")));
        }
        self.moe_shape(m.router, ne, dim, "router")?;
        self.moe_shape(m.gate, ne * ff, dim, "gate experts")?;
        self.moe_shape(m.up, ne * ff, dim, "up experts")?;
        self.moe_shape(m.down, ne * dim, ff, "down experts")?;
        self.matmul(
            m.router,
            m.x,
            m.logits,
            n,
            OpLabel::layer(m.layer, "ffn_moe_router"),
        )?;
        // gpt-oss: the biases, as f32 rows (router; per expert gate, up, down).
        let biases = match &m.oai {
            Some(o) => {
                self.add_bias(
                    m.logits,
                    o.router_bias,
                    n,
                    OpLabel::layer(m.layer, "ffn_moe_router_bias"),
                )?;
                Some((
                    self.bias_rows(o.gate_bias, ne, ff, "gate bias")?,
                    self.bias_rows(o.up_bias, ne, ff, "up bias")?,
                    self.bias_rows(o.down_bias, ne, dim, "down bias")?,
                ))
            }
            None => None,
        };
        let oai = biases.is_some();
        let _op = self.ops.begin(OpLabel::layer(m.layer, "ffn_moe_experts"));
        // Routing: each token's expert ids (as floats), then their weights.
        let mut sel = self.take(m.route, n * k * 2)?;
        let routed = self.buf(m.logits, n * ne).map(|logits| {
            let (mut ex, mut wt) = (Vec::new(), Vec::new());
            for t in 0..n {
                let row = &logits[t * ne..(t + 1) * ne];
                if oai {
                    route_softmax_weight(row, k, &mut ex, &mut wt);
                } else {
                    route(row, k, &mut ex, &mut wt);
                }
                let (ids, ws) = sel[t * 2 * k..(t + 1) * 2 * k].split_at_mut(k);
                for (id, &e) in ids.iter_mut().zip(&ex) {
                    *id = e as f32;
                }
                ws.copy_from_slice(&wt);
            }
        });
        let sel_copy = sel[..n * k * 2].to_vec();
        self.put(m.route, sel);
        routed?;
        // Tokens (and the slot they chose it in) per expert.
        let mut by_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); ne];
        for t in 0..n {
            for i in 0..k {
                by_expert[sel_copy[t * 2 * k + i] as usize].push((t, i));
            }
        }
        let mut y = self.take(m.y, n * k * dim)?;
        let mut scratch = std::mem::take(&mut self.scratch);
        let res = (|| {
            let x = self.buf(m.x, n * dim)?;
            let (g, u, d) = (
                self.weight(m.gate)?,
                self.weight(m.up)?,
                self.weight(m.down)?,
            );
            let (mut xg, mut hg, mut hu, mut yd) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for (e, toks) in by_expert.iter().enumerate() {
                if toks.is_empty() {
                    continue;
                }
                let nt = toks.len();
                xg.clear();
                for &(t, _) in toks {
                    xg.extend_from_slice(&x[t * dim..(t + 1) * dim]);
                }
                hg.resize(nt * ff, 0.0);
                hu.resize(nt * ff, 0.0);
                yd.resize(nt * dim, 0.0);
                let pack = self.repack && nt >= self.pack_min_rows.max(MOE_PACK_MIN_TOKENS);
                let (pool, s) = (&self.pool, &mut scratch);
                expert_product(pool, &view(g, e, ff, dim)?, pack, &xg, nt, &mut hg, s);
                expert_product(pool, &view(u, e, ff, dim)?, pack, &xg, nt, &mut hu, s);
                match &biases {
                    Some((gb, ub, _)) => {
                        let (gb, ub) = (&gb[e * ff..(e + 1) * ff], &ub[e * ff..(e + 1) * ff]);
                        for (gr, ur) in hg.chunks_exact_mut(ff).zip(hu.chunks_exact(ff)) {
                            for (((gv, &uv), &gbv), &ubv) in gr.iter_mut().zip(ur).zip(gb).zip(ub) {
                                *gv = swiglu_oai(*gv + gbv, uv + ubv);
                            }
                        }
                    }
                    None => {
                        for (gv, &uv) in hg.iter_mut().zip(&hu) {
                            *gv = *gv / (1.0 + (-*gv).exp()) * uv;
                        }
                    }
                }
                let s = &mut scratch;
                expert_product(pool, &view(d, e, dim, ff)?, pack, &hg, nt, &mut yd, s);
                if let Some((_, _, db)) = &biases {
                    let db = &db[e * dim..(e + 1) * dim];
                    for yr in yd.chunks_exact_mut(dim) {
                        for (y, &b) in yr.iter_mut().zip(db) {
                            *y += b;
                        }
                    }
                }
                for (j, &(t, i)) in toks.iter().enumerate() {
                    let w = sel_copy[t * 2 * k + k + i];
                    let dst = &mut y[(t * k + i) * dim..(t * k + i + 1) * dim];
                    for (o, &v) in dst.iter_mut().zip(&yd[j * dim..(j + 1) * dim]) {
                        *o = v * w;
                    }
                }
            }
            Ok(())
        })();
        self.scratch = scratch;
        if let Err(e) = res {
            self.put(m.y, y);
            return Err(e);
        }
        let mut acc = match self.take(m.acc, n * dim) {
            Ok(a) => a,
            Err(e) => {
                self.put(m.y, y);
                return Err(e);
            }
        };
        let mut sum = vec![0f32; dim];
        for t in 0..n {
            sum.copy_from_slice(&y[t * k * dim..(t * k + 1) * dim]);
            for i in 1..k {
                let yi = &y[(t * k + i) * dim..(t * k + i + 1) * dim];
                for (s, &v) in sum.iter_mut().zip(yi) {
                    *s += v;
                }
            }
            for (a, &s) in acc[t * dim..(t + 1) * dim].iter_mut().zip(&sum) {
                *a += s;
            }
        }
        self.put(m.acc, acc);
        self.put(m.y, y);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::route;

    /// Probabilities ∝ 1, 2, 4, ~0: the top two are experts 2 and 1, weighted 4/6 and 2/6;
    /// equal probabilities go to the lower id first.
    #[test]
    fn route_takes_the_largest_first_and_normalizes_their_weights() {
        let (mut ex, mut wt) = (Vec::new(), Vec::new());
        let l = [0.0, 2f32.ln(), 4f32.ln(), -80.0];
        route(&l, 2, &mut ex, &mut wt);
        assert_eq!(ex, [2, 1]);
        assert!((wt[0] - 4.0 / 6.0).abs() < 1e-6 && (wt[1] - 2.0 / 6.0).abs() < 1e-6);
        route(&[1.0, 1.0, 1.0], 2, &mut ex, &mut wt);
        assert_eq!(ex, [0, 1]);
        assert_eq!(wt, [0.5, 0.5]);
        route(&l, 4, &mut ex, &mut wt);
        assert_eq!(ex, [2, 1, 0, 3]);
        assert!((wt.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    /// gpt-oss: the top two of logits 0, ln 2, ln 4, 5 are experts 3 and 2, weighted by the
    /// softmax of (5, ln 4) alone: e^5 / (e^5 + 4) and 4 / (e^5 + 4).
    #[test]
    fn softmax_weight_routing_normalizes_over_the_chosen_logits_only() {
        let (mut ex, mut wt) = (Vec::new(), Vec::new());
        let l = [0.0, 2f32.ln(), 4f32.ln(), 5.0];
        super::route_softmax_weight(&l, 2, &mut ex, &mut wt);
        assert_eq!(ex, [3, 2]);
        let e5 = 5f32.exp();
        assert!((wt[0] - e5 / (e5 + 4.0)).abs() < 1e-6, "{wt:?}");
        assert!((wt[1] - 4.0 / (e5 + 4.0)).abs() < 1e-6, "{wt:?}");
    }
}
