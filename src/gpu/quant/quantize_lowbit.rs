//! Quantizers of the low-bit types, as llama-quantize runs them without an importance matrix:
//! Q2_K and Q3_K by `quantize_row_q2_K_ref` / `quantize_row_q3_K_ref`, IQ4_NL and IQ4_XS by
//! `quantize_iq4_nl` / `quantize_iq4_xs` (`quantize_row_iq4_nl_impl` with 7 tries each side).
//! Float operations keep the reference's order, as in `quantize.rs`.

use super::GgmlType;
use super::blocks::{KVALUES_IQ4NL, QK, QK_K, layout};
use super::quantize::{GROUP_MAX_EPS, each, get_f16, make_qkx2_quants, nearest_int, put_f16};

/// Quantizes whole blocks of the low-bit types, else hands over to `quantize.rs`; the caller
/// checked lengths and finiteness.
pub(crate) fn quantize_blocks(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    match ty {
        GgmlType::Q2K => each::<QK_K, { layout::Q2_K }>(src, dst, q2_k),
        GgmlType::Q3K => each::<QK_K, { layout::Q3_K }>(src, dst, q3_k),
        GgmlType::Iq4Nl => each::<QK, { layout::IQ4_NL }>(src, dst, iq4_nl),
        GgmlType::Iq4Xs => each::<QK_K, { layout::IQ4_XS }>(src, dst, iq4_xs),
        GgmlType::Mxfp4 => each::<QK, { super::mxfp4::BYTES }>(src, dst, super::mxfp4::quantize),
        _ => super::quantize::quantize_blocks(ty, src, dst),
    }
}

/// Packs 2-bit values of 256 elements as Q2_K/Q3_K store them: byte l of half h holds elements
/// 128h + l, +32, +64, +96 in its bit pairs.
fn pack_two_bits(l: &[u8; QK_K], qs: &mut [u8]) {
    for h in 0..2 {
        for i in 0..32 {
            let j = 128 * h + i;
            qs[32 * h + i] = l[j] | (l[j + 32] << 2) | (l[j + 64] << 4) | (l[j + 96] << 6);
        }
    }
}

fn q2_k(x: &[f32; QK_K], b: &mut [u8; layout::Q2_K]) {
    let mut l = [0u8; QK_K];
    let mut l_aux = [0u8; 16];
    let mut weights = [0f32; 16];
    let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        let (s, m) = make_qkx2_quants(
            3,
            xs,
            &weights,
            &mut l[16 * j..16 * j + 16],
            &mut l_aux,
            -0.5,
            0.1,
            15,
            true,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for j in 0..16 {
            b[j] = nearest_int(iscale * scales[j]) as u8;
        }
        put_f16(b, layout::Q2_K_D, max_scale / 15.0);
    } else {
        b[..16].fill(0);
        put_f16(b, layout::Q2_K_D, 0.0);
    }
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for j in 0..16 {
            b[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
        put_f16(b, layout::Q2_K_D + 2, max_min / 15.0);
    } else {
        put_f16(b, layout::Q2_K_D + 2, 0.0);
    }
    let (d_all, dmin_all) = (get_f16(b, layout::Q2_K_D), get_f16(b, layout::Q2_K_D + 2));
    for j in 0..16 {
        let d = d_all * (b[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * (b[j] >> 4) as f32;
        for i in 0..16 {
            l[16 * j + i] = nearest_int((x[16 * j + i] + dm) / d).clamp(0, 3) as u8;
        }
    }
    pack_two_bits(&l, &mut b[layout::Q2_K_QS..layout::Q2_K_QS + 64]);
}

/// Symmetric fit x ≈ scale · (L − nmax), L in 0..2·nmax, refined by moving single quants while
/// the x²-weighted error falls (llama.cpp's `make_q3_quants` with `do_rmse`).
fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (li, &v) in l_out.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *li = l as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (li, &v) in l_out.iter_mut().zip(x) {
            let w = v * v;
            let cur = *li as f32;
            let mut slx = sumlx - w * v * cur;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * cur * cur;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *li as i32 {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for li in l_out.iter_mut() {
        *li += nmax as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

fn q3_k(x: &[f32; QK_K], b: &mut [u8; layout::Q3_K]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut amax) = (0f32, 0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    let sc = layout::Q3_K_SCALES;
    b[sc..sc + 12].fill(0);
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for j in 0..16 {
            let v = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
            if j < 8 {
                b[sc + j] = (v & 0xF) as u8;
            } else {
                b[sc + j - 8] |= ((v & 0xF) << 4) as u8;
            }
            b[sc + 8 + j % 4] |= ((v as u8) >> 4) << (2 * (j / 4));
        }
        put_f16(b, layout::Q3_K_D, 1.0 / iscale);
    } else {
        put_f16(b, layout::Q3_K_D, 0.0);
    }
    let packed = super::blocks::q3_k_scales(&b[sc..]);
    let d_all = get_f16(b, layout::Q3_K_D);
    for j in 0..16 {
        let d = d_all * (packed[j] as i32 - 32) as f32;
        if d == 0.0 {
            continue;
        }
        for i in 0..16 {
            l[16 * j + i] = (nearest_int(x[16 * j + i] / d).clamp(-4, 3) + 4) as i8;
        }
    }
    let mut low = [0u8; QK_K];
    b[..32].fill(0);
    for (j, (&v, lo)) in l.iter().zip(low.iter_mut()).enumerate() {
        let mut v = v as u8;
        if v > 3 {
            b[j % 32] |= 1 << (j / 32);
            v -= 4;
        }
        *lo = v;
    }
    pack_two_bits(&low, &mut b[layout::Q3_K_QS..layout::Q3_K_QS + 64]);
}

/// llama.cpp's `best_index_int8` over `KVALUES_IQ4NL`: the nearest value's index, ties to the
/// upper one.
fn best_index(x: f32) -> u8 {
    let v = |i: usize| KVALUES_IQ4NL[i] as f32;
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - v(mu - 1) < v(mu) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// The best scale of one 32-element block for the IQ4 grid (x²-weighted least squares over
/// 15 trial grids), and its indices into `l` (`quantize_row_iq4_nl_impl`, ntry = 7, no weights).
fn iq4_block_scale(xb: &[f32], l: &mut [u8]) -> f32 {
    const NTRY: i32 = 7;
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in xb {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v0 = KVALUES_IQ4NL[0] as f32;
    let mut d = -max / v0;
    let mut id = 1.0 / d;
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for (lj, &x) in l.iter_mut().zip(xb) {
        let i = best_index(id * x);
        *lj = i;
        let q = KVALUES_IQ4NL[i as usize] as f32;
        let w = x * x;
        sumqx += w * q * x;
        sumq2 += w * q * q;
    }
    d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        id = (itry + KVALUES_IQ4NL[0] as i32) as f32 / max;
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for &x in xb {
            let q = KVALUES_IQ4NL[best_index(id * x) as usize] as f32;
            let w = x * x;
            sumqx += w * q * x;
            sumq2 += w * q * q;
        }
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Element 32i + j in the low nibble of byte 16i + j, 32i + 16 + j in its high nibble.
fn pack_iq4(l: &[u8], qs: &mut [u8]) {
    for i in 0..l.len() / 32 {
        for j in 0..16 {
            qs[16 * i + j] = l[32 * i + j] | (l[32 * i + 16 + j] << 4);
        }
    }
}

fn iq4_nl(x: &[f32; QK], b: &mut [u8; layout::IQ4_NL]) {
    let mut l = [0u8; QK];
    let scale = iq4_block_scale(x, &mut l);
    put_f16(b, 0, scale);
    let id = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    for (lj, &v) in l.iter_mut().zip(x) {
        *lj = best_index(id * v);
    }
    pack_iq4(&l, &mut b[2..]);
}

fn iq4_xs(x: &[f32; QK_K], b: &mut [u8; layout::IQ4_XS]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 8];
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    for ib in 0..8 {
        let d = iq4_block_scale(&x[32 * ib..32 * ib + 32], &mut l[32 * ib..32 * ib + 32]);
        scales[ib] = d;
        if d.abs() > amax_scale {
            amax_scale = d.abs();
            max_scale = d;
        }
    }
    let d = -max_scale / 32.0;
    put_f16(b, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut scales_h = 0u16;
    b[4..8].fill(0);
    for ib in 0..8 {
        let ls = nearest_int(id * scales[ib]).clamp(-32, 31);
        let dl = d * ls as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        for j in 0..32 {
            l[32 * ib + j] = best_index(idl * x[32 * ib + j]);
        }
        let ls = (ls + 32) as u8;
        b[4 + ib / 2] |= (ls & 0xF) << (4 * (ib % 2));
        scales_h |= ((ls >> 4) as u16) << (2 * ib);
    }
    b[2..4].copy_from_slice(&scales_h.to_le_bytes());
    pack_iq4(&l, &mut b[layout::IQ4_XS_QS..]);
}
