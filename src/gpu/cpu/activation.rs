//! The gated activations of the CPU reference as ggml writes them: SiLU (SwiGLU), GELU in its
//! tanh form (Gemma's feed-forward) and gpt-oss's clamped SwiGLU.
//!
//! The SwiGLU and GeGLU of a prompt run over the whole `n × ffn_dim` product, so they are split
//! over the pool's threads; GELU is written branch-free over [`exp_nonpositive`] and compiled once
//! more for AVX2 (libm's `tanhf` per element cost a third of Gemma 3's prompt time).

use std::sync::Mutex;

use super::exp::exp_nonpositive;
use super::pool::ThreadPool;

/// σ(v) = 1 / (1 + e^−v) for any v, from e^−|v| ≤ 1 alone (no overflow, no branch).
#[inline(always)]
fn sigmoid(v: f32) -> f32 {
    let e = exp_nonpositive(-v.abs());
    let r = 1.0 / (1.0 + e);
    if v >= 0.0 { r } else { e * r }
}

/// GELU in its tanh form through 0.5·(1 + tanh(u)) = σ(2u): `ggml_gelu_f32`'s function
/// (0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²)))), vectorizable.
#[inline(always)]
fn gelu_sigmoid(x: f32) -> f32 {
    const TWO_SQRT_2_OVER_PI: f32 = 2.0 * 0.797_884_6;
    x * sigmoid(TWO_SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x))
}

/// The gate's activation of a gated feed-forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// x·σ(x) (SwiGLU).
    Silu,
    /// GELU, tanh form (GeGLU).
    Gelu,
}

#[inline(always)]
fn gated_body(gate: &mut [f32], up: &[f32], act: Gate) {
    match act {
        // libm's expf, as before: SiLU was never the cost (2% of Qwen3's prompt), and the
        // default model's perplexity moved 0.12% on the last-bit changes of the sigmoid form.
        Gate::Silu => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = *g / (1.0 + (-*g).exp()) * u;
            }
        }
        Gate::Gelu => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = gelu_sigmoid(*g) * u;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn gated_avx2(gate: &mut [f32], up: &[f32], act: Gate) {
    gated_body(gate, up, act)
}

fn gated_part(gate: &mut [f32], up: &[f32], act: Gate) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { gated_avx2(gate, up, act) };
    }
    gated_body(gate, up, act)
}

/// Below this many elements (a decode step's row) the activation runs on the calling thread:
/// waking the pool costs more than it saves.
const PAR_MIN: usize = 32 * 1024;

/// `gate[i] = act(gate[i]) · up[i]`, over the pool's threads when it is large.
pub fn gated(pool: &ThreadPool, gate: &mut [f32], up: &[f32], act: Gate) {
    assert_eq!(gate.len(), up.len());
    let n = pool.n_threads();
    if n == 1 || gate.len() < PAR_MIN {
        return gated_part(gate, up, act);
    }
    // Parts of whole 64-byte lines, one per thread.
    let part = gate.len().div_ceil(n).next_multiple_of(16);
    let parts: Vec<Mutex<(&mut [f32], &[f32])>> = gate
        .chunks_mut(part)
        .zip(up.chunks(part))
        .map(Mutex::new)
        .collect();
    pool.run(&|i, _| {
        if let Some(p) = parts.get(i) {
            let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
            let (g, u) = &mut *p;
            gated_part(g, u, act);
        }
    });
}

/// ggml's `swiglu_oai` (alpha 1.702, limit 7): x = min(gate, limit), y = clamp(up, ±limit),
/// x·σ(alpha·x)·(y + 1).
pub fn swiglu_oai(gate: f32, up: f32) -> f32 {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    let x = gate.min(LIMIT);
    let y = up.clamp(-LIMIT, LIMIT);
    x / (1.0 + (ALPHA * -x).exp()) * (y + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorized GeGLU and SwiGLU hold to ggml's formulas computed in f64 over the range
    /// activations take, on one and two threads (parts and their tails).
    #[test]
    fn gated_matches_the_formulas() {
        let gelu = |x: f64| {
            0.5 * x * (1.0 + (0.797_884_560_802_865_4 * x * (1.0 + 0.044_715 * x * x)).tanh())
        };
        let silu = |x: f64| x / (1.0 + (-x).exp());
        let xs: Vec<f32> = (0..70_001)
            .map(|i| (i as f32 - 35_000.0) * 7.3e-4)
            .collect();
        let up: Vec<f32> = (0..xs.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            for act in [Gate::Gelu, Gate::Silu] {
                let mut g = xs.clone();
                gated(&pool, &mut g, &up, act);
                for ((&x, &u), &got) in xs.iter().zip(&up).zip(&g) {
                    let f = if act == Gate::Gelu { gelu } else { silu };
                    let want = f(x as f64) * u as f64;
                    let err = (got as f64 - want).abs();
                    assert!(
                        err <= 2e-6 * want.abs() + 1e-9,
                        "{act:?} {x}: {got} vs {want}"
                    );
                }
            }
        }
        let pool = ThreadPool::new(1);
        let mut g = vec![-200.0, 200.0, 0.0];
        gated(&pool, &mut g, &[1.0; 3], Gate::Gelu);
        assert!(g[0].abs() < 1e-30 && g[1] == 200.0 && g[2] == 0.0, "{g:?}");
    }

    /// ggml's `swiglu_oai`: the gate clamped above at 7, up to ±7, x·σ(1.702x)·(y + 1).
    #[test]
    fn swiglu_oai_clamps_as_ggml() {
        let sig = |v: f32| 1.0 / (1.0 + (-v).exp());
        assert!((swiglu_oai(10.0, -9.0) - 7.0 * sig(1.702 * 7.0) * -6.0).abs() < 1e-5);
        assert!((swiglu_oai(-2.0, 0.5) - -2.0 * sig(-3.404) * 1.5).abs() < 1e-6);
        assert!((swiglu_oai(1.0, 100.0) - sig(1.702) * 8.0).abs() < 1e-6);
    }
}
