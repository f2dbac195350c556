//! Quantizers: the algorithms of llama.cpp's `quantize_row_*_ref` (`ggml-quants.c`), written
//! again so that they produce the same bytes. The float operations keep the reference's order
//! (no fused multiply-add, no reassociation), because the K-type searches compare errors and a
//! last-bit difference can flip a choice; `tests/it/quant_reference.rs` checks byte equality against
//! blocks produced by llama.cpp itself.

use super::GgmlType;
use super::blocks::{QK, QK_K, f32_to_f16, k_scale_min, layout};

/// Below this magnitude a group counts as all zero (llama.cpp's `GROUP_MAX_EPS`).
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

pub(crate) use super::round::nearest_int;

/// Quantizes whole blocks; the caller checked lengths and finiteness.
pub(crate) fn quantize_blocks(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    match ty {
        GgmlType::F32 => {
            for (o, v) in dst.as_chunks_mut::<4>().0.iter_mut().zip(src) {
                *o = v.to_le_bytes();
            }
        }
        GgmlType::F16 => {
            for (o, v) in dst.as_chunks_mut::<2>().0.iter_mut().zip(src) {
                *o = f32_to_f16(*v).to_le_bytes();
            }
        }
        GgmlType::Bf16 => {
            for (o, v) in dst.as_chunks_mut::<2>().0.iter_mut().zip(src) {
                *o = f32_to_bf16(*v).to_le_bytes();
            }
        }
        GgmlType::Q4_0 => each::<QK, { layout::Q4_0 }>(src, dst, q4_0),
        GgmlType::Q4_1 => each::<QK, { layout::Q4_1 }>(src, dst, q4_1),
        GgmlType::Q5_0 => each::<QK, { layout::Q5_0 }>(src, dst, q5_0),
        GgmlType::Q5_1 => each::<QK, { layout::Q5_1 }>(src, dst, q5_1),
        GgmlType::Q8_0 => each::<QK, { layout::Q8_0 }>(src, dst, q8_0),
        GgmlType::Q8_1 => each::<QK, { layout::Q8_1 }>(src, dst, q8_1),
        GgmlType::Q4K => each::<QK_K, { layout::Q4_K }>(src, dst, q4_k),
        GgmlType::Q5K => each::<QK_K, { layout::Q5_K }>(src, dst, q5_k),
        GgmlType::Q6K => each::<QK_K, { layout::Q6_K }>(src, dst, q6_k),
        GgmlType::Q8K => each::<QK_K, { layout::Q8_K }>(src, dst, q8_k),
        // `quantize` admits only the types above and those of `quantize_lowbit`.
        _ => {}
    }
}

pub(super) fn each<const N: usize, const B: usize>(
    src: &[f32],
    dst: &mut [u8],
    f: fn(&[f32; N], &mut [u8; B]),
) {
    for (x, b) in src
        .as_chunks::<N>()
        .0
        .iter()
        .zip(dst.as_chunks_mut::<B>().0)
    {
        f(x, b);
    }
}

/// f32 to bfloat16, rounding to nearest even, NaN kept quiet (as ggml's `ggml_compute_fp32_to_bf16`).
pub(crate) fn f32_to_bf16(v: f32) -> u16 {
    let u = v.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u as u64 + (0x7fff + ((u >> 16) & 1)) as u64) >> 16) as u16
}

#[inline]
pub(super) fn put_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
}

#[inline]
pub(super) fn get_f16(b: &[u8], off: usize) -> f32 {
    super::blocks::f16_at(b, off)
}

/// The element of largest magnitude (the first one on ties), with its sign.
#[inline]
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

#[inline]
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn q4_0(x: &[f32; QK], b: &mut [u8; layout::Q4_0]) {
    let (_, max) = signed_absmax(x);
    // Scale chosen so that the largest-magnitude element maps to -8 exactly.
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    for j in 0..16 {
        let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let q1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
        b[2 + j] = q0 | (q1 << 4);
    }
}

fn q4_1(x: &[f32; QK], b: &mut [u8; layout::Q4_1]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    for j in 0..16 {
        let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
        let q1 = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
        b[4 + j] = q0 | (q1 << 4);
    }
}

fn q5_0(x: &[f32; QK], b: &mut [u8; layout::Q5_0]) {
    let (_, max) = signed_absmax(x);
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    let mut qh = 0u32;
    for j in 0..16 {
        let q0 = ((x[j] * id + 16.5) as i8).min(31) as u8;
        let q1 = ((x[j + 16] * id + 16.5) as i8).min(31) as u8;
        b[6 + j] = (q0 & 0xF) | ((q1 & 0xF) << 4);
        qh |= (((q0 & 0x10) >> 4) as u32) << j;
        qh |= (((q1 & 0x10) >> 4) as u32) << (j + 16);
    }
    b[2..6].copy_from_slice(&qh.to_le_bytes());
}

fn q5_1(x: &[f32; QK], b: &mut [u8; layout::Q5_1]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    let mut qh = 0u32;
    for j in 0..16 {
        // No clamp here in the reference either: (max - min) * id rounds to at most 31.
        let q0 = ((x[j] - min) * id + 0.5) as u8;
        let q1 = ((x[j + 16] - min) * id + 0.5) as u8;
        b[8 + j] = (q0 & 0xF) | ((q1 & 0xF) << 4);
        qh |= (((q0 & 0x10) >> 4) as u32) << j;
        qh |= (((q1 & 0x10) >> 4) as u32) << (j + 16);
    }
    b[4..8].copy_from_slice(&qh.to_le_bytes());
}

fn absmax(x: &[f32]) -> f32 {
    x.iter()
        .fold(0.0f32, |a, v| if a > v.abs() { a } else { v.abs() })
}

fn q8_0(x: &[f32; QK], b: &mut [u8; layout::Q8_0]) {
    let amax = absmax(x);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    for j in 0..QK {
        b[2 + j] = (x[j] * id).round() as i8 as u8;
    }
}

fn q8_1(x: &[f32; QK], b: &mut [u8; layout::Q8_1]) {
    let amax = absmax(x);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    let mut sum = 0i32;
    for j in 0..QK {
        let q = (x[j] * id).round() as i8;
        b[4 + j] = q as u8;
        sum += q as i32;
    }
    put_f16(b, 2, sum as f32 * d);
}

/// Fits x ≈ scale * L + min (L in 0..=nmax, min <= 0) minimising the weighted squared error:
/// starts from the min/max grid, then tries `nstep + 1` stretched grids and keeps the best
/// least-squares (scale, min) found. Returns (scale, -min). llama.cpp's `make_qkx2_quants`.
#[allow(clippy::too_many_arguments)]
pub(super) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    l_aux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        let diff = if use_mad { diff.abs() } else { diff * diff };
        best_error += weights[i] * diff;
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            l_aux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * l_aux[i] as f32 + this_min - x[i];
                let diff = if use_mad { diff.abs() } else { diff * diff };
                cur_error += weights[i] * diff;
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&l_aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Shared by Q4_K and Q5_K: per 32-element sub-block (scale, min) fits, their 6-bit packing
/// against the super-block's f16 `d`/`dmin`, and the final quants L (0..=nmax) recomputed with
/// the packed scales. Writes d, dmin and scales into `b`; returns L.
fn k_scales_and_quants(
    x: &[f32; QK_K],
    b: &mut [u8],
    nmax: i32,
    rmin: f32,
    nstep: i32,
) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    let mut weights = [[0f32; 32]; 8];
    for (j, w) in weights.iter_mut().enumerate() {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in w.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
    }
    // The eight sub-blocks' searches side by side (the same bits as one at a time).
    let (scales, mins) =
        super::qkx2_lanes::make_qkx2_quants_x8(nmax, x, &weights, &mut l, rmin, 0.1, nstep);
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut b[layout::K_SCALES..layout::K_SCALES + 12];
    sc.fill(0);
    for j in 0..8 {
        // `as u8` wraps like the reference's uint8_t store before the clamp.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    put_f16(b, 0, max_scale / 63.0);
    put_f16(b, 2, max_min / 63.0);
    let d_all = get_f16(b, 0);
    let dmin_all = get_f16(b, 2);
    let packed = super::blocks::k_scales(b);
    for j in 0..8 {
        let (s, m) = k_scale_min(j, &packed);
        let d = d_all * s as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for i in 0..32 {
            l[32 * j + i] = nearest_int((x[32 * j + i] + dm) / d).clamp(0, nmax) as u8;
        }
    }
    l
}

fn q4_k(x: &[f32; QK_K], b: &mut [u8; layout::Q4_K]) {
    let l = k_scales_and_quants(x, b, 15, -1.0, 20);
    let qs = &mut b[layout::Q4_K_QS..];
    for c in 0..4 {
        for i in 0..32 {
            qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
        }
    }
}

fn q5_k(x: &[f32; QK_K], b: &mut [u8; layout::Q5_K]) {
    let l = k_scales_and_quants(x, b, 31, -0.5, 15);
    let (head, qs) = b.split_at_mut(layout::Q5_K_QS);
    let qh = &mut head[layout::Q5_K_QH..];
    qh.fill(0);
    for c in 0..4 {
        for i in 0..32 {
            let mut l1 = l[64 * c + i];
            let mut l2 = l[64 * c + 32 + i];
            if l1 > 15 {
                l1 -= 16;
                qh[i] |= 1 << (2 * c);
            }
            if l2 > 15 {
                l2 -= 16;
                qh[i] |= 2 << (2 * c);
            }
            qs[32 * c + i] = l1 | (l2 << 4);
        }
    }
}

/// Symmetric fit x ≈ scale * (L - nmax), L in 0..2*nmax, weighting each element by x² and trying
/// 18 nearby grids. llama.cpp's `make_qx_quants` with `rmse_type = 1`, no importance weights.
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let mut iscale = -nmaxf / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, &v) in x.iter().enumerate() {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        l_out[i] = (l + nmax) as i8;
        let w = v * v;
        let lf = l as f32;
        sumlx += w * v * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmaxf + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            let w = v * v;
            let lf = l as f32;
            sumlx += w * v * lf;
            suml2 += w * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (i, &v) in x.iter().enumerate() {
                let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
                l_out[i] = (nmax + l) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

fn q6_k(x: &[f32; QK_K], b: &mut [u8; layout::Q6_K]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for ib in 0..16 {
        let s = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        scales[ib] = s;
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
    b.fill(0);
    if max_abs_scale < GROUP_MAX_EPS {
        return;
    }
    let iscale = -128.0 / max_scale;
    put_f16(b, layout::Q6_K_D, 1.0 / iscale);
    for ib in 0..16 {
        b[layout::Q6_K_SCALES + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    let d_all = get_f16(b, layout::Q6_K_D);
    for j in 0..16 {
        let d = d_all * (b[layout::Q6_K_SCALES + j] as i8) as f32;
        if d == 0.0 {
            continue;
        }
        for i in 0..16 {
            let q = nearest_int(x[16 * j + i] / d).clamp(-32, 31);
            l[16 * j + i] = (q + 32) as i8;
        }
    }
    let (ql, rest) = b.split_at_mut(layout::Q6_K_QH);
    let qh = &mut rest[..64];
    for half in 0..2 {
        let l = &l[128 * half..];
        let ql = &mut ql[64 * half..];
        let qh = &mut qh[32 * half..];
        for i in 0..32 {
            let (a, bb, c, d) = (
                l[i] as u8,
                l[i + 32] as u8,
                l[i + 64] as u8,
                l[i + 96] as u8,
            );
            ql[i] = (a & 0xF) | ((c & 0xF) << 4);
            ql[i + 32] = (bb & 0xF) | ((d & 0xF) << 4);
            qh[i] = (a >> 4) | ((bb >> 4) << 2) | ((c >> 4) << 4) | ((d >> 4) << 6);
        }
    }
}

/// Q8_K: one f32 scale per 256 with the largest magnitude mapped to -127 (sign kept so that the
/// reference's "-127/max" matches), and the sums of each 16 quants for the K-type dot products.
pub(crate) fn q8_k_parts(x: &[f32; QK_K], qs: &mut [i8; QK_K], bsums: &mut [i16; 16]) -> f32 {
    let (amax, max) = signed_absmax(x);
    if amax == 0.0 {
        qs.fill(0);
        bsums.fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).min(127) as i8;
    }
    for (j, s) in bsums.iter_mut().enumerate() {
        *s = qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum();
    }
    1.0 / iscale
}

fn q8_k(x: &[f32; QK_K], b: &mut [u8; layout::Q8_K]) {
    let mut qs = [0i8; QK_K];
    let mut bsums = [0i16; 16];
    let d = q8_k_parts(x, &mut qs, &mut bsums);
    b[0..4].copy_from_slice(&d.to_le_bytes());
    for (o, q) in b[4..4 + QK_K].iter_mut().zip(qs) {
        *o = q as u8;
    }
    for (j, s) in bsums.iter().enumerate() {
        b[4 + QK_K + 2 * j..4 + QK_K + 2 * j + 2].copy_from_slice(&s.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `qkx2_lanes`'s eight sub-blocks side by side give, lane by lane, the same bits as the
    /// scalar search (llama.cpp's `make_qkx2_quants`) on sub-blocks of every kind.
    #[test]
    fn eight_lanes_give_the_scalar_search_bit_for_bit() {
        use crate::gpu::quant::qkx2_lanes::{LANES, N, lanes_case, make_qkx2_quants_x8};
        let mut rng = crate::gpu::test_rng::TestRng::new(7);
        let mut uni = || rng.f();
        for round in 0..400 {
            let (x, weights) = lanes_case(round, &mut uni);
            for (nmax, rmin, rdelta, nstep) in [(15, -1.0, 0.1, 20), (31, -0.5, 0.1, 15)] {
                let mut l = [0u8; LANES * N];
                let (s, m) = make_qkx2_quants_x8(nmax, &x, &weights, &mut l, rmin, rdelta, nstep);
                for k in 0..LANES {
                    let mut lk = [0u8; N];
                    let mut aux = [0u8; N];
                    let (sk, mk) = make_qkx2_quants(
                        nmax,
                        &x[N * k..N * k + N],
                        &weights[k],
                        &mut lk,
                        &mut aux,
                        rmin,
                        rdelta,
                        nstep,
                        false,
                    );
                    let at = format!("round {round}, lane {k}, nmax {nmax}");
                    assert_eq!(s[k].to_bits(), sk.to_bits(), "scale, {at}");
                    assert_eq!(m[k].to_bits(), mk.to_bits(), "min, {at}");
                    assert_eq!(&l[N * k..N * k + N], &lk, "quants, {at}");
                }
            }
        }
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-2.6), -3);
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_nan() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        let nan = f32_to_bf16(f32::from_bits(0x7f80_0001));
        assert!(f32::from_bits((nan as u32) << 16).is_nan());
    }
}
