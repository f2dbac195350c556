//! The CPU backend's context shift ([`KvShift`]): every layer's kept rows move down with
//! `copy_within` (a memmove: the ranges may overlap), then the moved keys are rotated by the
//! shift's delta. The angles are built as the RoPE op builds them (ggml's order: `δ · freq_scale`,
//! then repeated multiplication by `base^(-2/n_rot)`, then division by the llama-3 factor), once
//! per shift: every row moves by the same delta.

pub use super::attention::KvElem;
use crate::gpu::backend::{KvShift, Result};

/// (cos, sin) of the shift's angle for each rotated pair.
pub fn rotation(s: &KvShift, factors: Option<&[f32]>) -> Result<Vec<(f32, f32)>> {
    let half = s.rope.pairs(s.head_dim)?;
    let theta_scale = s.rope.base.powf(-2.0 / s.rope.n_rot as f32);
    let mut theta = s.delta() * s.rope.freq_scale;
    let mut cs = Vec::with_capacity(half);
    for i in 0..half {
        let th = match factors {
            Some(f) => theta / f[i],
            None => theta,
        };
        cs.push((th.cos(), th.sin()));
        theta *= theta_scale;
    }
    Ok(cs)
}

/// Applies the shift to caches laid out `[layer][position][kv_dim]` with `n_ctx` positions (f32
/// or f16 elements: an f16 key is rotated in f32 and rounded back once).
pub fn shift<E: KvElem>(
    k: &mut [E],
    v: &mut [E],
    n_ctx: usize,
    kv_dim: usize,
    s: &KvShift,
    factors: Option<&[f32]>,
) -> Result<()> {
    s.check(n_ctx, kv_dim)?;
    let cs = rotation(s, factors)?;
    let half = cs.len();
    let layer = n_ctx * kv_dim;
    if layer == 0 || s.n == 0 {
        return Ok(());
    }
    let src = s.src * kv_dim..(s.src + s.n) * kv_dim;
    let dst = s.dst * kv_dim;
    for (kl, vl) in k.chunks_exact_mut(layer).zip(v.chunks_exact_mut(layer)) {
        kl.copy_within(src.clone(), dst);
        vl.copy_within(src.clone(), dst);
        for head in kl[dst..dst + s.n * kv_dim].chunks_exact_mut(s.head_dim) {
            for (i, &(c, sn)) in cs.iter().enumerate() {
                let (a, b) = if s.rope.neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (head[a].to_f32(), head[b].to_f32());
                head[a] = E::from_f32(x0 * c - x1 * sn);
                head[b] = E::from_f32(x0 * sn + x1 * c);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::backend::RopeParams;

    /// Rotates one head as the RoPE op does at position `pos` (the independent reference).
    fn rope_at(head: &mut [f32], pos: f32, p: &RopeParams, factors: Option<&[f32]>) {
        let half = p.n_rot / 2;
        for i in 0..half {
            let mut th = pos as f64
                * p.freq_scale as f64
                * (p.base as f64).powf(-2.0 * i as f64 / p.n_rot as f64);
            if let Some(f) = factors {
                th /= f[i] as f64;
            }
            let (c, s) = (th.cos() as f32, th.sin() as f32);
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

    fn check_variant(neox: bool, freq_scale: f32, factors: Option<&[f32]>, n_rot: usize) {
        let (n_ctx, heads, hd) = (40, 2, 8);
        let kv_dim = heads * hd;
        let p = RopeParams {
            n_rot,
            base: 10000.0,
            freq_scale,
            neox,
            freq_factors: None,
            attn_factor: 1.0,
            yarn: None,
        };
        // Raw (unrotated) keys and values per position, two layers.
        let raw: Vec<f32> = (0..2 * n_ctx * kv_dim)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let mut k = raw.clone();
        for (j, head) in k.chunks_exact_mut(hd).enumerate() {
            let pos = (j / heads) % n_ctx;
            rope_at(head, pos as f32, &p, factors);
        }
        let mut v = raw.clone();
        let s = KvShift {
            dst: 3,
            src: 13,
            n: 20,
            n_kv_heads: heads,
            head_dim: hd,
            rope: p,
        };
        shift(&mut k, &mut v, n_ctx, kv_dim, &s, factors).unwrap();
        for l in 0..2 {
            for j in 0..s.n {
                let from = (l * n_ctx + s.src + j) * kv_dim;
                let to = (l * n_ctx + s.dst + j) * kv_dim;
                let mut want = raw[from..from + kv_dim].to_vec();
                for head in want.chunks_exact_mut(hd) {
                    rope_at(head, (s.dst + j) as f32, &p, factors);
                }
                assert_eq!(&v[to..to + kv_dim], &raw[from..from + kv_dim]);
                for (got, want) in k[to..to + kv_dim].iter().zip(&want) {
                    assert!(
                        (got - want).abs() < 2e-5,
                        "layer {l} row {j}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn shifted_keys_equal_keys_rotated_at_their_new_positions() {
        check_variant(false, 1.0, None, 8);
        check_variant(true, 1.0, None, 8);
        check_variant(false, 0.25, None, 8);
        check_variant(true, 1.0, None, 4);
        check_variant(false, 1.0, Some(&[1.0, 2.5, 8.0, 40.0]), 8);
    }

    #[test]
    fn a_shift_outside_the_cache_is_refused() {
        let p = RopeParams {
            n_rot: 4,
            base: 10000.0,
            freq_scale: 1.0,
            neox: false,
            freq_factors: None,
            attn_factor: 1.0,
            yarn: None,
        };
        let s = KvShift {
            dst: 2,
            src: 10,
            n: 8,
            n_kv_heads: 1,
            head_dim: 4,
            rope: p,
        };
        let (mut k, mut v) = (vec![0f32; 16 * 4], vec![0f32; 16 * 4]);
        let e = shift(&mut k, &mut v, 16, 4, &s, None).unwrap_err();
        assert!(e.to_string().contains("does not fit"), "{e}");
        let s = KvShift { dst: 10, ..s };
        assert!(shift(&mut k, &mut v, 16, 4, &s, None).is_err());
    }
}
