//! Scalar kernels: the numerical reference for every SIMD kernel, and the fallback.

use super::super::blocks::{self, QK, QK_K, f16_at, k_scale_min, layout};
use super::super::mxfp4;
use super::*;

/// Scalar Q8x32: q = x · 127 / max|x| rounded to nearest even; returns [d, s] of
/// [`q8x32_scales`] (Q8_0's, or with `q8_1` Q8_1's).
pub fn quantize_q8x32_block(x: &[f32; QK], qs: &mut [i8; QK], q8_1: bool) -> [f32; 2] {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(x) {
        let r = (v * id).round_ties_even() as i32;
        *q = r.clamp(-128, 127) as i8;
        sum += *q as i32;
    }
    q8x32_scales(amax, sum, q8_1)
}

/// Scalar Q8xK, with the same rounding as Q8x32 over 256 values.
pub fn quantize_q8xk_block(x: &[f32; QK_K], b: &mut Q8xK) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    b.d = q8xk_scale(amax, id);
    for (q, &v) in b.qs.iter_mut().zip(x) {
        *q = ((v * id).round_ties_even() as i32).clamp(-128, 127) as i8;
    }
    for (j, s) in b.bsums.iter_mut().enumerate() {
        *s = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum();
    }
}

pub(super) fn kernel(ty: GgmlType) -> KernelFn {
    use GgmlType::*;
    match ty {
        F32 => scalar_rows::<ScF32>,
        F16 => scalar_rows::<ScF16>,
        Bf16 => scalar_rows::<ScBf16>,
        Q4_0 => scalar_rows::<ScQ4_0>,
        Q4_1 => scalar_rows::<ScQ4_1>,
        Q5_0 => scalar_rows::<ScQ5_0>,
        Q5_1 => scalar_rows::<ScQ5_1>,
        Q8_0 => scalar_rows::<ScQ8_0>,
        Q4K => scalar_rows::<ScQ4K>,
        Q5K => scalar_rows::<ScQ5K>,
        Q2K => scalar_rows::<ScQ2K>,
        Q3K => scalar_rows::<ScQ3K>,
        Iq4Nl => scalar_rows::<ScIq4Nl>,
        Iq4Xs => scalar_rows::<ScIq4Xs>,
        Mxfp4 => scalar_rows::<ScMxfp4>,
        _ => scalar_rows::<ScQ6K>,
    }
}

/// One weight row against one token, in portable code.
trait ScalarDot {
    const TY: GgmlType;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32;
}

unsafe fn scalar_rows<S: ScalarDot>(
    w: &[u8],
    rows: usize,
    cols: usize,
    act: &Activation,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    let rb = row_bytes(S::TY, cols);
    for r in 0..rows {
        let row = &w[r * rb..(r + 1) * rb];
        for k in 0..nt {
            out[r * nt + k] = S::dot(row, act, t0 + k);
        }
    }
}

struct ScF32;
impl ScalarDot for ScF32 {
    const TY: GgmlType = GgmlType::F32;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32 {
        let x = act.f32s(t);
        w.as_chunks::<4>()
            .0
            .iter()
            .zip(x)
            .fold(0.0, |s, (b, &v)| s + f32::from_le_bytes(*b) * v)
    }
}

struct ScF16;
impl ScalarDot for ScF16 {
    const TY: GgmlType = GgmlType::F16;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32 {
        let x = act.f32s(t);
        w.as_chunks::<2>().0.iter().zip(x).fold(0.0, |s, (b, &v)| {
            s + super::super::f16_to_f32(u16::from_le_bytes(*b)) * v
        })
    }
}

struct ScBf16;
impl ScalarDot for ScBf16 {
    const TY: GgmlType = GgmlType::Bf16;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32 {
        let x = act.f32s(t);
        w.as_chunks::<2>().0.iter().zip(x).fold(0.0, |s, (b, &v)| {
            s + blocks::bf16_to_f32(u16::from_le_bytes(*b)) * v
        })
    }
}

/// The 32-element types as `(d, m)` and 32 integer quants, where the value is `d·q + m`
/// (Q4_0/Q5_0 have m = -8d / -16d in this form, so that q is unsigned as in the SIMD kernels).
trait Scalar32 {
    const TY: GgmlType;
    const BYTES: usize;
    fn unpack(b: &[u8], q: &mut [i32; QK]) -> (f32, f32);
}

impl<S: Scalar32> ScalarDot for S {
    const TY: GgmlType = S::TY;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32 {
        let (qa, ds) = act.q8x32(t);
        let mut q = [0i32; QK];
        let mut sum = 0.0f32;
        for ((b, a), ds) in w.chunks_exact(S::BYTES).zip(qa).zip(ds) {
            let (d, m) = S::unpack(b, &mut q);
            let sumi: i32 = q.iter().zip(&a.qs).map(|(&x, &y)| x * y as i32).sum();
            sum += d * ds[0] * sumi as f32 + m * ds[1];
        }
        sum
    }
}

fn nibbles(qs: &[u8], q: &mut [i32; QK]) {
    for j in 0..16 {
        q[j] = (qs[j] & 0xF) as i32;
        q[j + 16] = (qs[j] >> 4) as i32;
    }
}

fn fifth_bits(qh: &[u8], q: &mut [i32; QK]) {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    for (j, v) in q.iter_mut().enumerate() {
        *v |= (((h >> j) & 1) << 4) as i32;
    }
}

struct ScQ4_0;
impl Scalar32 for ScQ4_0 {
    const TY: GgmlType = GgmlType::Q4_0;
    const BYTES: usize = layout::Q4_0;
    fn unpack(b: &[u8], q: &mut [i32; QK]) -> (f32, f32) {
        nibbles(&b[2..18], q);
        let d = f16_at(b, 0);
        (d, d * -8.0)
    }
}

struct ScQ4_1;
impl Scalar32 for ScQ4_1 {
    const TY: GgmlType = GgmlType::Q4_1;
    const BYTES: usize = layout::Q4_1;
    fn unpack(b: &[u8], q: &mut [i32; QK]) -> (f32, f32) {
        nibbles(&b[4..20], q);
        (f16_at(b, 0), f16_at(b, 2))
    }
}

struct ScQ5_0;
impl Scalar32 for ScQ5_0 {
    const TY: GgmlType = GgmlType::Q5_0;
    const BYTES: usize = layout::Q5_0;
    fn unpack(b: &[u8], q: &mut [i32; QK]) -> (f32, f32) {
        nibbles(&b[6..22], q);
        fifth_bits(&b[2..6], q);
        let d = f16_at(b, 0);
        (d, d * -16.0)
    }
}

struct ScQ5_1;
impl Scalar32 for ScQ5_1 {
    const TY: GgmlType = GgmlType::Q5_1;
    const BYTES: usize = layout::Q5_1;
    fn unpack(b: &[u8], q: &mut [i32; QK]) -> (f32, f32) {
        nibbles(&b[8..24], q);
        fifth_bits(&b[4..8], q);
        (f16_at(b, 0), f16_at(b, 2))
    }
}

struct ScQ8_0;
impl Scalar32 for ScQ8_0 {
    const TY: GgmlType = GgmlType::Q8_0;
    const BYTES: usize = layout::Q8_0;
    fn unpack(b: &[u8], q: &mut [i32; QK]) -> (f32, f32) {
        for (v, &x) in q.iter_mut().zip(&b[2..34]) {
            *v = x as i8 as i32;
        }
        (f16_at(b, 0), 0.0)
    }
}

struct ScIq4Nl;
impl Scalar32 for ScIq4Nl {
    const TY: GgmlType = GgmlType::Iq4Nl;
    const BYTES: usize = layout::IQ4_NL;
    fn unpack(b: &[u8], q: &mut [i32; QK]) -> (f32, f32) {
        for j in 0..16 {
            q[j] = blocks::KVALUES_IQ4NL[(b[2 + j] & 0xF) as usize] as i32;
            q[j + 16] = blocks::KVALUES_IQ4NL[(b[2 + j] >> 4) as usize] as i32;
        }
        (f16_at(b, 0), 0.0)
    }
}

struct ScMxfp4;
impl Scalar32 for ScMxfp4 {
    const TY: GgmlType = GgmlType::Mxfp4;
    const BYTES: usize = mxfp4::BYTES;
    fn unpack(b: &[u8], q: &mut [i32; QK]) -> (f32, f32) {
        for j in 0..16 {
            q[j] = mxfp4::KVALUES_MXFP4[(b[1 + j] & 0xF) as usize] as i32;
            q[j + 16] = mxfp4::KVALUES_MXFP4[(b[1 + j] >> 4) as usize] as i32;
        }
        (mxfp4::e8m0_to_fp32_half(b[0]), 0.0)
    }
}

/// Σ over a Q4_K/Q5_K super-block: d·Σ_j sc_j·(q·a)_j − dmin·Σ_j m_j·(Σa)_j, all in integers
/// except the two final scales.
fn k_superblock(d: f32, dmin: f32, sc: &[u8; 12], q: &[i32; QK_K], a: &Q8xK) -> f32 {
    let (mut sumi, mut summ) = (0i32, 0i32);
    for j in 0..8 {
        let (s, m) = k_scale_min(j, sc);
        let dot: i32 = (0..32)
            .map(|l| q[32 * j + l] * a.qs[32 * j + l] as i32)
            .sum();
        sumi += s as i32 * dot;
        summ += m as i32 * (a.bsums[2 * j] as i32 + a.bsums[2 * j + 1] as i32);
    }
    a.d * d * sumi as f32 - a.d * dmin * summ as f32
}

struct ScQ4K;
impl ScalarDot for ScQ4K {
    const TY: GgmlType = GgmlType::Q4K;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32 {
        let mut q = [0i32; QK_K];
        let mut sum = 0.0f32;
        for (b, a) in w.chunks_exact(layout::Q4_K).zip(act.q8xk(t)) {
            let qs = &b[layout::Q4_K_QS..];
            for c in 0..4 {
                for l in 0..32 {
                    q[64 * c + l] = (qs[32 * c + l] & 0xF) as i32;
                    q[64 * c + 32 + l] = (qs[32 * c + l] >> 4) as i32;
                }
            }
            sum += k_superblock(f16_at(b, 0), f16_at(b, 2), &blocks::k_scales(b), &q, a);
        }
        sum
    }
}

struct ScQ5K;
impl ScalarDot for ScQ5K {
    const TY: GgmlType = GgmlType::Q5K;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32 {
        let mut q = [0i32; QK_K];
        let mut sum = 0.0f32;
        for (b, a) in w.chunks_exact(layout::Q5_K).zip(act.q8xk(t)) {
            let qh = &b[layout::Q5_K_QH..layout::Q5_K_QH + 32];
            let qs = &b[layout::Q5_K_QS..];
            for c in 0..4 {
                for l in 0..32 {
                    let h0 = ((qh[l] >> (2 * c)) & 1) << 4;
                    let h1 = ((qh[l] >> (2 * c + 1)) & 1) << 4;
                    q[64 * c + l] = ((qs[32 * c + l] & 0xF) | h0) as i32;
                    q[64 * c + 32 + l] = ((qs[32 * c + l] >> 4) | h1) as i32;
                }
            }
            sum += k_superblock(f16_at(b, 0), f16_at(b, 2), &blocks::k_scales(b), &q, a);
        }
        sum
    }
}

struct ScQ6K;
impl ScalarDot for ScQ6K {
    const TY: GgmlType = GgmlType::Q6K;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32 {
        let mut sum = 0.0f32;
        for (b, a) in w.chunks_exact(layout::Q6_K).zip(act.q8xk(t)) {
            let ql = &b[..128];
            let qh = &b[layout::Q6_K_QH..layout::Q6_K_QH + 64];
            let sc = &b[layout::Q6_K_SCALES..layout::Q6_K_SCALES + 16];
            let mut q = [0i32; QK_K];
            for h in 0..2 {
                for l in 0..32 {
                    let hb = qh[32 * h + l];
                    let (lo, hi) = (ql[64 * h + l], ql[64 * h + l + 32]);
                    q[128 * h + l] = ((lo & 0xF) | ((hb & 3) << 4)) as i32 - 32;
                    q[128 * h + l + 32] = ((hi & 0xF) | (((hb >> 2) & 3) << 4)) as i32 - 32;
                    q[128 * h + l + 64] = ((lo >> 4) | (((hb >> 4) & 3) << 4)) as i32 - 32;
                    q[128 * h + l + 96] = ((hi >> 4) | (((hb >> 6) & 3) << 4)) as i32 - 32;
                }
            }
            let mut sumi = 0i32;
            for g in 0..16 {
                let dot: i32 = (0..16)
                    .map(|l| q[16 * g + l] * a.qs[16 * g + l] as i32)
                    .sum();
                sumi += (sc[g] as i8) as i32 * dot;
            }
            sum += a.d * f16_at(b, layout::Q6_K_D) * sumi as f32;
        }
        sum
    }
}

/// The 2-bit quants of a Q2_K/Q3_K block in element order: sub-block i (16 elements) is bit pair
/// (i % 8) / 2 of bytes 16 * (i % 2) .. +16 of the 32-byte half i / 8.
fn two_bits(qs: &[u8], q: &mut [i32; QK_K]) {
    for i in 0..16 {
        let src = &qs[32 * (i / 8) + 16 * (i % 2)..];
        let shift = 2 * ((i % 8) / 2);
        for l in 0..16 {
            q[16 * i + l] = ((src[l] >> shift) & 3) as i32;
        }
    }
}

/// Σ_i scale_i · (q · a)_i over the 16 sub-blocks of 16.
fn sixteen_dots(sc: impl Fn(usize) -> i32, q: &[i32; QK_K], a: &Q8xK) -> i32 {
    (0..16)
        .map(|i| {
            let dot: i32 = (0..16)
                .map(|l| q[16 * i + l] * a.qs[16 * i + l] as i32)
                .sum();
            sc(i) * dot
        })
        .sum()
}

struct ScQ2K;
impl ScalarDot for ScQ2K {
    const TY: GgmlType = GgmlType::Q2K;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32 {
        let mut q = [0i32; QK_K];
        let mut sum = 0.0f32;
        for (b, a) in w.chunks_exact(layout::Q2_K).zip(act.q8xk(t)) {
            two_bits(&b[layout::Q2_K_QS..layout::Q2_K_QS + 64], &mut q);
            let sumi = sixteen_dots(|i| (b[i] & 0xF) as i32, &q, a);
            // The mins: dmin · Σ_i m_i · Σ a over sub-block i.
            let summ: i32 = (0..16)
                .map(|i| (b[i] >> 4) as i32 * a.bsums[i] as i32)
                .sum();
            let (d, dmin) = (f16_at(b, layout::Q2_K_D), f16_at(b, layout::Q2_K_D + 2));
            sum += a.d * d * sumi as f32 - a.d * dmin * summ as f32;
        }
        sum
    }
}

struct ScQ3K;
impl ScalarDot for ScQ3K {
    const TY: GgmlType = GgmlType::Q3K;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32 {
        let mut q = [0i32; QK_K];
        let mut sum = 0.0f32;
        for (b, a) in w.chunks_exact(layout::Q3_K).zip(act.q8xk(t)) {
            two_bits(&b[layout::Q3_K_QS..layout::Q3_K_QS + 64], &mut q);
            let hm = &b[..32];
            for i in 0..16 {
                let m = 1u8 << (i / 2);
                for l in 0..16 {
                    if hm[16 * (i % 2) + l] & m == 0 {
                        q[16 * i + l] -= 4;
                    }
                }
            }
            let sc = blocks::q3_k_scales(&b[layout::Q3_K_SCALES..]);
            let sumi = sixteen_dots(|i| sc[i] as i32 - 32, &q, a);
            sum += a.d * f16_at(b, layout::Q3_K_D) * sumi as f32;
        }
        sum
    }
}

struct ScIq4Xs;
impl ScalarDot for ScIq4Xs {
    const TY: GgmlType = GgmlType::Iq4Xs;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32 {
        let mut sum = 0.0f32;
        for (b, a) in w.chunks_exact(layout::IQ4_XS).zip(act.q8xk(t)) {
            let sc = blocks::iq4_xs_scales(b);
            let mut sumi = 0i32;
            for (ib, &s) in sc.iter().enumerate() {
                let qs = &b[layout::IQ4_XS_QS + 16 * ib..];
                let qa = &a.qs[32 * ib..];
                let dot: i32 = (0..16)
                    .map(|j| {
                        blocks::KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as i32 * qa[j] as i32
                            + blocks::KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32
                                * qa[j + 16] as i32
                    })
                    .sum();
                sumi += (s as i32 - 32) * dot;
            }
            sum += a.d * f16_at(b, 0) * sumi as f32;
        }
        sum
    }
}
