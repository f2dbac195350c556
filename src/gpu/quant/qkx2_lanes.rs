//! llama.cpp's `make_qkx2_quants` for the eight 32-element sub-blocks of a Q4_K/Q5_K super-block
//! at once, one sub-block per lane. The scalar search is bound by the latency of its three running
//! sums (21 grids × 32 dependent adds per sub-block): side by side, the eight chains overlap (and
//! vectorize), about five times the throughput on one core. Each lane does the scalar version's
//! float operations in its order (no fused multiply-add, no reassociation), so the bytes are the
//! same: `tests` holds it to [`make_qkx2_quants`] bit for bit. This is what `synth` and `convert`
//! spend their time on for K-quant files (issue 33 item 7).

use super::round::nearest_int;

pub(super) const LANES: usize = 8;
pub(super) const N: usize = 32;

pub(super) type Lanes = [f32; LANES];

/// For sub-block `k` of `x` (elements `32k..32k+32`) with `weights[k]`: the fit's (scale, -min)
/// and its quants in `l[32k..32k+32]`, as `make_qkx2_quants(nmax, x_k, w_k, l_k, _, rmin,
/// rdelta, nstep, false)` gives them. Compiled twice, for AVX2 (one register holds the eight
/// lanes; taken where the CPU has it) and for the baseline; the same operations either way.
pub(super) fn make_qkx2_quants_x8(
    nmax: i32,
    x: &[f32; LANES * N],
    weights: &[[f32; N]; LANES],
    l: &mut [u8; LANES * N],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (Lanes, Lanes) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above). No FMA is enabled: products and sums stay
        // rounded one by one, as in the scalar search.
        return unsafe { x8_avx2(nmax, x, weights, l, rmin, rdelta, nstep) };
    }
    x8(nmax, x, weights, l, rmin, rdelta, nstep)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn x8_avx2(
    nmax: i32,
    x: &[f32; LANES * N],
    weights: &[[f32; N]; LANES],
    l: &mut [u8; LANES * N],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (Lanes, Lanes) {
    x8(nmax, x, weights, l, rmin, rdelta, nstep)
}

#[inline(always)]
fn x8(
    nmax: i32,
    x: &[f32; LANES * N],
    weights: &[[f32; N]; LANES],
    l: &mut [u8; LANES * N],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (Lanes, Lanes) {
    // Transposed: element i of every lane together.
    let mut xt = [[0f32; LANES]; N];
    let mut wt = [[0f32; LANES]; N];
    for k in 0..LANES {
        for i in 0..N {
            xt[i][k] = x[N * k + i];
            wt[i][k] = weights[k][i];
        }
    }
    let mut min = xt[0];
    let mut max = xt[0];
    let mut sum_w = wt[0];
    let mut sum_x = [0f32; LANES];
    for k in 0..LANES {
        sum_x[k] = sum_w[k] * xt[0][k];
    }
    for i in 1..N {
        for k in 0..LANES {
            let v = xt[i][k];
            if v < min[k] {
                min[k] = v;
            }
            if v > max[k] {
                max[k] = v;
            }
            let w = wt[i][k];
            sum_w[k] += w;
            sum_x[k] += w * v;
        }
    }
    let mut flat = [false; LANES];
    for k in 0..LANES {
        if min[k] > 0.0 {
            min[k] = 0.0;
        }
        flat[k] = max[k] == min[k];
    }
    let nmaxf = nmax as f32;
    let mut scale = [0f32; LANES];
    let mut best_error = [0f32; LANES];
    let mut lt = [[0u8; LANES]; N];
    // A flat lane's figures are computed and thrown away (its result is fixed below).
    let mut iscale0 = [0f32; LANES];
    for k in 0..LANES {
        iscale0[k] = nmaxf / (max[k] - min[k]);
        scale[k] = 1.0 / iscale0[k];
    }
    for i in 0..N {
        for k in 0..LANES {
            let iscale = iscale0[k];
            let q = nearest_int(iscale * (xt[i][k] - min[k])).clamp(0, nmax);
            lt[i][k] = q as u8;
            let diff = scale[k] * q as f32 + min[k] - xt[i][k];
            let diff = diff * diff;
            best_error[k] += wt[i][k] * diff;
        }
    }
    let mut aux = [[0u8; LANES]; N];
    for is in 0..=nstep {
        let mut iscale = [0f32; LANES];
        for k in 0..LANES {
            // `min` moves with each better fit, and the next grid follows it (as in the scalar
            // search).
            iscale[k] = (rmin + rdelta * is as f32 + nmaxf) / (max[k] - min[k]);
        }
        let (mut sum_l, mut sum_l2, mut sum_xl) = ([0f32; LANES], [0f32; LANES], [0f32; LANES]);
        for i in 0..N {
            for k in 0..LANES {
                let q = nearest_int(iscale[k] * (xt[i][k] - min[k])).clamp(0, nmax);
                aux[i][k] = q as u8;
                let w = wt[i][k];
                let lf = q as f32;
                sum_l[k] += w * lf;
                sum_l2[k] += w * lf * lf;
                sum_xl[k] += w * lf * xt[i][k];
            }
        }
        let mut this_scale = [0f32; LANES];
        let mut this_min = [0f32; LANES];
        let mut fits = [false; LANES];
        for k in 0..LANES {
            let det = sum_w[k] * sum_l2[k] - sum_l[k] * sum_l[k];
            fits[k] = det > 0.0;
            this_scale[k] = (sum_w[k] * sum_xl[k] - sum_x[k] * sum_l[k]) / det;
            this_min[k] = (sum_l2[k] * sum_x[k] - sum_l[k] * sum_xl[k]) / det;
            if this_min[k] > 0.0 {
                this_min[k] = 0.0;
                this_scale[k] = sum_xl[k] / sum_l2[k];
            }
        }
        let mut cur_error = [0f32; LANES];
        for i in 0..N {
            for k in 0..LANES {
                let diff = this_scale[k] * aux[i][k] as f32 + this_min[k] - xt[i][k];
                let diff = diff * diff;
                cur_error[k] += wt[i][k] * diff;
            }
        }
        for k in 0..LANES {
            if !flat[k] && fits[k] && cur_error[k] < best_error[k] {
                for i in 0..N {
                    lt[i][k] = aux[i][k];
                }
                best_error[k] = cur_error[k];
                scale[k] = this_scale[k];
                min[k] = this_min[k];
            }
        }
    }
    let mut neg_min = [0f32; LANES];
    for k in 0..LANES {
        if flat[k] {
            scale[k] = 0.0;
            for row in lt.iter_mut() {
                row[k] = 0;
            }
        }
        neg_min[k] = -min[k];
        for i in 0..N {
            l[N * k + i] = lt[i][k];
        }
    }
    (scale, neg_min)
}

/// Inputs of every kind for the tests: random of several scales, all positive, flat, zeros,
/// an outlier, integers; with their weights.
#[cfg(test)]
pub(super) fn lanes_case(
    round: usize,
    uni: &mut impl FnMut() -> f32,
) -> ([f32; LANES * N], [[f32; N]; LANES]) {
    let mut x = [0f32; LANES * N];
    for k in 0..LANES {
        let kind = (round + k) % 6;
        let scale = [1e-3f32, 1.0, 37.0, 1e4][(round / 6 + k) % 4];
        for i in 0..N {
            x[N * k + i] = match kind {
                0 => uni() * scale,
                1 => (uni().abs() + 0.5) * scale,
                2 => 0.25 * scale,
                3 => 0.0,
                4 => {
                    if i == 5 {
                        50.0 * scale
                    } else {
                        uni() * scale
                    }
                }
                _ => (uni() * scale).round(),
            };
        }
    }
    let mut weights = [[0f32; N]; LANES];
    for k in 0..LANES {
        for i in 0..N {
            weights[k][i] = 0.5 + x[N * k + i].abs() + (round % 3) as f32;
        }
    }
    (x, weights)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX2 and the baseline build of the search agree bit for bit on sub-blocks of every
    /// kind (`lanes_case`). The lanes against the scalar search, one sub-block at a time, are
    /// compared in `quantize.rs` (`eight_lanes_give_the_scalar_search_bit_for_bit`).
    #[test]
    fn the_two_builds_agree_bit_for_bit() {
        let mut rng = crate::gpu::test_rng::TestRng::new(7);
        let mut uni = || rng.f();
        for round in 0..400 {
            let (x, weights) = lanes_case(round, &mut uni);
            for (nmax, rmin, rdelta, nstep) in [(15, -1.0, 0.1, 20), (31, -0.5, 0.1, 15)] {
                let mut l = [0u8; LANES * N];
                let (s, m) = make_qkx2_quants_x8(nmax, &x, &weights, &mut l, rmin, rdelta, nstep);
                let mut l2 = [0u8; LANES * N];
                let (s2, m2) = x8(nmax, &x, &weights, &mut l2, rmin, rdelta, nstep);
                let bits = |v: Lanes| v.map(f32::to_bits);
                assert!(
                    bits(s) == bits(s2) && bits(m) == bits(m2) && l == l2,
                    "round {round}: the two builds differ"
                );
            }
        }
    }
}
