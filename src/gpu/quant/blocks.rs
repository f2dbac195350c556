//! Block layouts (byte for byte those of llama.cpp's `ggml-common.h`) and dequantization.
//!
//! Blocks are handled as fixed-size byte arrays (`&[u8; N]`) rather than `#[repr(C)]` structs: the
//! scales are little-endian f16 at odd offsets in some types, and arrays keep this free of
//! `unsafe` and of bounds checks. Every function here is the scalar reference; the SIMD kernels in
//! `dot.rs` must agree with it.

use super::GgmlType;

/// Elements per block of the 32-element types (Q4_0 … Q8_1).
pub const QK: usize = 32;
/// Elements per super-block of the K types.
pub const QK_K: usize = 256;

/// Byte offsets inside each block type. `d`, `m`, `dmin` are f16 unless noted.
pub(crate) mod layout {
    /// Q4_0: d, qs[16] (element j in the low nibble of qs[j], element j+16 in the high one).
    pub const Q4_0: usize = 18;
    /// Q4_1: d, m, qs[16].
    pub const Q4_1: usize = 20;
    /// Q5_0: d, qh[4] (bit j = fifth bit of element j), qs[16].
    pub const Q5_0: usize = 22;
    /// Q5_1: d, m, qh[4], qs[16].
    pub const Q5_1: usize = 24;
    /// Q8_0: d, qs[32] (i8).
    pub const Q8_0: usize = 34;
    /// Q8_1: d, s (= d * sum(qs)), qs[32] (i8).
    pub const Q8_1: usize = 36;
    /// Q4_K: d, dmin, scales[12] (8 six-bit scales and mins), qs[128].
    pub const Q4_K: usize = 144;
    /// Q5_K: d, dmin, scales[12], qh[32], qs[128].
    pub const Q5_K: usize = 176;
    /// Q6_K: ql[128], qh[64], scales[16] (i8), d.
    pub const Q6_K: usize = 210;
    /// Q8_K: d (f32), qs[256] (i8), bsums[16] (i16, sums of 16 quants).
    pub const Q8_K: usize = 292;
    /// Q2_K: scales[16] (low nibble scale, high nibble min of each 16 elements), qs[64] (2 bits
    /// each), d, dmin.
    pub const Q2_K: usize = 84;
    /// Q3_K: hmask[32] (third bit, set = no -4 offset), qs[64] (low 2 bits), scales[12] (16
    /// six-bit scales, offset 32), d.
    pub const Q3_K: usize = 110;
    /// IQ4_NL: d, qs[16] (indices into `KVALUES_IQ4NL`, laid out as Q4_0's nibbles).
    pub const IQ4_NL: usize = 18;
    /// IQ4_XS: d, scales_h (u16: 2 high bits of each of 8 six-bit scales), scales_l[4] (low
    /// nibbles), qs[128] (each 32 elements laid out as IQ4_NL's).
    pub const IQ4_XS: usize = 136;

    pub const Q2_K_QS: usize = 16;
    pub const Q2_K_D: usize = 80;
    pub const Q3_K_QS: usize = 32;
    pub const Q3_K_SCALES: usize = 96;
    pub const Q3_K_D: usize = 108;
    pub const IQ4_XS_QS: usize = 8;

    pub const K_SCALES: usize = 4;
    pub const Q4_K_QS: usize = 16;
    pub const Q5_K_QH: usize = 16;
    pub const Q5_K_QS: usize = 48;
    pub const Q6_K_QH: usize = 128;
    pub const Q6_K_SCALES: usize = 192;
    pub const Q6_K_D: usize = 208;
}

/// The 16 values an IQ4_NL/IQ4_XS index stands for (llama.cpp `kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// IEEE half to single; exact.
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// Single to IEEE half, rounding to nearest even (as F16C and numpy do).
#[inline]
pub fn f32_to_f16(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

#[inline]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

#[inline]
pub(crate) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Six-bit scale and min `j` (0..8) of a Q4_K/Q5_K block, from the 12 packed bytes: the first
/// four of each sit in the low six bits of bytes 0..4 / 4..8; the last four are split between
/// nibbles of bytes 8..12 and the top two bits of bytes 0..8.
#[inline]
pub(crate) fn k_scale_min(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// `M` bytes of `b` from `off`, as an array.
#[inline]
pub(crate) fn bytes_at<const M: usize>(b: &[u8], off: usize) -> [u8; M] {
    std::array::from_fn(|i| b[off + i])
}

/// The 12 scale bytes of a Q4_K/Q5_K block.
#[inline]
pub(crate) fn k_scales(b: &[u8]) -> [u8; 12] {
    bytes_at(b, layout::K_SCALES)
}

/// The 16 six-bit scales of a Q3_K block (0..64, before the -32 offset): scale `j` has its low
/// nibble in byte `j % 8` (low nibble for j < 8, high for j >= 8) and its top two bits in byte
/// `8 + j % 4` at bit `2 * (j / 4)`.
#[inline]
pub(crate) fn q3_k_scales(q: &[u8]) -> [u8; 16] {
    std::array::from_fn(|j| {
        ((q[j % 8] >> (4 * (j / 8))) & 0xF) | (((q[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)
    })
}

/// The eight six-bit scales of an IQ4_XS block (0..64, before the -32 offset).
#[inline]
pub(crate) fn iq4_xs_scales(b: &[u8]) -> [u8; 8] {
    let h = u16::from_le_bytes([b[2], b[3]]);
    std::array::from_fn(|ib| {
        ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | ((((h >> (2 * ib)) & 3) as u8) << 4)
    })
}

/// Dequantizes whole blocks; the caller has checked that the lengths agree.
pub(crate) fn dequantize_blocks(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (o, c) in dst.iter_mut().zip(src.as_chunks::<4>().0) {
                *o = f32::from_le_bytes(*c);
            }
        }
        GgmlType::F16 => {
            for (o, c) in dst.iter_mut().zip(src.as_chunks::<2>().0) {
                *o = f16_to_f32(u16::from_le_bytes(*c));
            }
        }
        GgmlType::Bf16 => {
            for (o, c) in dst.iter_mut().zip(src.as_chunks::<2>().0) {
                *o = bf16_to_f32(u16::from_le_bytes(*c));
            }
        }
        GgmlType::Q4_0 => each::<{ layout::Q4_0 }, QK>(src, dst, dequant_q4_0),
        GgmlType::Q4_1 => each::<{ layout::Q4_1 }, QK>(src, dst, dequant_q4_1),
        GgmlType::Q5_0 => each::<{ layout::Q5_0 }, QK>(src, dst, dequant_q5_0),
        GgmlType::Q5_1 => each::<{ layout::Q5_1 }, QK>(src, dst, dequant_q5_1),
        GgmlType::Q8_0 => each::<{ layout::Q8_0 }, QK>(src, dst, dequant_q8_0),
        GgmlType::Q8_1 => each::<{ layout::Q8_1 }, QK>(src, dst, dequant_q8_1),
        GgmlType::Q4K => each::<{ layout::Q4_K }, QK_K>(src, dst, dequant_q4_k),
        GgmlType::Q5K => each::<{ layout::Q5_K }, QK_K>(src, dst, dequant_q5_k),
        GgmlType::Q6K => each::<{ layout::Q6_K }, QK_K>(src, dst, dequant_q6_k),
        GgmlType::Q8K => each::<{ layout::Q8_K }, QK_K>(src, dst, dequant_q8_k),
        GgmlType::Q2K => each::<{ layout::Q2_K }, QK_K>(src, dst, dequant_q2_k),
        GgmlType::Q3K => each::<{ layout::Q3_K }, QK_K>(src, dst, dequant_q3_k),
        GgmlType::Iq4Nl => each::<{ layout::IQ4_NL }, QK>(src, dst, dequant_iq4_nl),
        GgmlType::Iq4Xs => each::<{ layout::IQ4_XS }, QK_K>(src, dst, dequant_iq4_xs),
        GgmlType::Mxfp4 => each::<{ super::mxfp4::BYTES }, QK>(src, dst, super::mxfp4::dequant),
        // `dequantize` admits only the types above.
        _ => dst.fill(f32::NAN),
    }
}

fn each<const B: usize, const N: usize>(
    src: &[u8],
    dst: &mut [f32],
    f: fn(&[u8; B], &mut [f32; N]),
) {
    for (b, o) in src
        .as_chunks::<B>()
        .0
        .iter()
        .zip(dst.as_chunks_mut::<N>().0)
    {
        f(b, o);
    }
}

pub(crate) fn dequant_q4_0(b: &[u8; layout::Q4_0], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        let q = b[2 + j];
        y[j] = ((q & 0xF) as i32 - 8) as f32 * d;
        y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

pub(crate) fn dequant_q4_1(b: &[u8; layout::Q4_1], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    for j in 0..16 {
        let q = b[4 + j];
        y[j] = (q & 0xF) as f32 * d + m;
        y[j + 16] = (q >> 4) as f32 * d + m;
    }
}

#[inline]
fn q5_high_bits(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

pub(crate) fn dequant_q5_0(b: &[u8; layout::Q5_0], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    let qh = q5_high_bits(b, 2);
    for j in 0..16 {
        let q = b[6 + j];
        let h0 = ((qh >> j) & 1) << 4;
        let h1 = ((qh >> (j + 16)) & 1) << 4;
        y[j] = (((q & 0xF) as u32 | h0) as i32 - 16) as f32 * d;
        y[j + 16] = (((q >> 4) as u32 | h1) as i32 - 16) as f32 * d;
    }
}

pub(crate) fn dequant_q5_1(b: &[u8; layout::Q5_1], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = q5_high_bits(b, 4);
    for j in 0..16 {
        let q = b[8 + j];
        let h0 = ((qh >> j) & 1) << 4;
        let h1 = ((qh >> (j + 16)) & 1) << 4;
        y[j] = ((q & 0xF) as u32 | h0) as f32 * d + m;
        y[j + 16] = ((q >> 4) as u32 | h1) as f32 * d + m;
    }
}

pub(crate) fn dequant_q8_0(b: &[u8; layout::Q8_0], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for j in 0..QK {
        y[j] = (b[2 + j] as i8) as f32 * d;
    }
}

pub(crate) fn dequant_q8_1(b: &[u8; layout::Q8_1], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for j in 0..QK {
        y[j] = (b[4 + j] as i8) as f32 * d;
    }
}

pub(crate) fn dequant_q4_k(b: &[u8; layout::Q4_K], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let sc = k_scales(b);
    let qs = &b[layout::Q4_K_QS..];
    // Each 32 bytes of qs hold two 32-element sub-blocks: low nibbles, then high nibbles.
    for chunk in 0..4 {
        let (s0, m0) = k_scale_min(2 * chunk, &sc);
        let (s1, m1) = k_scale_min(2 * chunk + 1, &sc);
        let (d0, mm0) = (d * s0 as f32, dmin * m0 as f32);
        let (d1, mm1) = (d * s1 as f32, dmin * m1 as f32);
        for l in 0..32 {
            let q = qs[32 * chunk + l];
            y[64 * chunk + l] = d0 * (q & 0xF) as f32 - mm0;
            y[64 * chunk + 32 + l] = d1 * (q >> 4) as f32 - mm1;
        }
    }
}

pub(crate) fn dequant_q5_k(b: &[u8; layout::Q5_K], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let sc = k_scales(b);
    let qh = &b[layout::Q5_K_QH..layout::Q5_K_QH + 32];
    let qs = &b[layout::Q5_K_QS..];
    // Sub-block i takes its fifth bit from bit i of qh[l].
    for chunk in 0..4 {
        let (s0, m0) = k_scale_min(2 * chunk, &sc);
        let (s1, m1) = k_scale_min(2 * chunk + 1, &sc);
        let (d0, mm0) = (d * s0 as f32, dmin * m0 as f32);
        let (d1, mm1) = (d * s1 as f32, dmin * m1 as f32);
        for l in 0..32 {
            let q = qs[32 * chunk + l];
            let h0 = ((qh[l] >> (2 * chunk)) & 1) << 4;
            let h1 = ((qh[l] >> (2 * chunk + 1)) & 1) << 4;
            y[64 * chunk + l] = d0 * ((q & 0xF) | h0) as f32 - mm0;
            y[64 * chunk + 32 + l] = d1 * ((q >> 4) | h1) as f32 - mm1;
        }
    }
}

pub(crate) fn dequant_q6_k(b: &[u8; layout::Q6_K], y: &mut [f32; QK_K]) {
    let d = f16_at(b, layout::Q6_K_D);
    let ql = &b[..128];
    let qh = &b[layout::Q6_K_QH..layout::Q6_K_QH + 64];
    let sc = &b[layout::Q6_K_SCALES..layout::Q6_K_SCALES + 16];
    // Each half (128 elements) uses 64 bytes of ql, 32 of qh and 8 scales; within it, element
    // l + 32*k takes a nibble of ql and bit pair k of qh[l].
    for half in 0..2 {
        let ql = &ql[64 * half..];
        let qh = &qh[32 * half..];
        let sc = &sc[8 * half..];
        let y = &mut y[128 * half..];
        for l in 0..32 {
            let is = l / 16;
            let h = qh[l];
            let q1 = ((ql[l] & 0xF) | ((h & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

pub(crate) fn dequant_q8_k(b: &[u8; layout::Q8_K], y: &mut [f32; QK_K]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for j in 0..QK_K {
        y[j] = d * (b[4 + j] as i8) as f32;
    }
}

pub(crate) fn dequant_q2_k(b: &[u8; layout::Q2_K], y: &mut [f32; QK_K]) {
    let d = f16_at(b, layout::Q2_K_D);
    let dmin = f16_at(b, layout::Q2_K_D + 2);
    let qs = &b[layout::Q2_K_QS..layout::Q2_K_QS + 64];
    // Sub-block i (16 elements): half i / 8 (32 bytes of qs), bit pair (i % 8) / 2, bytes
    // 16 * (i % 2) .. +16 of that half.
    for (i, &sc) in b[..16].iter().enumerate() {
        let dl = d * (sc & 0xF) as f32;
        let ml = dmin * (sc >> 4) as f32;
        let q = &qs[32 * (i / 8) + 16 * (i % 2)..];
        let shift = 2 * ((i % 8) / 2);
        for l in 0..16 {
            y[16 * i + l] = dl * ((q[l] >> shift) & 3) as f32 - ml;
        }
    }
}

pub(crate) fn dequant_q3_k(b: &[u8; layout::Q3_K], y: &mut [f32; QK_K]) {
    let d = f16_at(b, layout::Q3_K_D);
    let sc = q3_k_scales(&b[layout::Q3_K_SCALES..]);
    let hm = &b[..32];
    let qs = &b[layout::Q3_K_QS..layout::Q3_K_QS + 64];
    // As Q2_K for the low bits; the high bit of sub-block i is bit i / 2 of hmask.
    for (i, &s) in sc.iter().enumerate() {
        let dl = d * (s as i32 - 32) as f32;
        let off = 16 * (i % 2);
        let q = &qs[32 * (i / 8) + off..];
        let shift = 2 * ((i % 8) / 2);
        let m = 1u8 << (i / 2);
        for l in 0..16 {
            let low = ((q[l] >> shift) & 3) as i32;
            let v = if hm[off + l] & m != 0 { low } else { low - 4 };
            y[16 * i + l] = dl * v as f32;
        }
    }
}

pub(crate) fn dequant_iq4_nl(b: &[u8; layout::IQ4_NL], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        let q = b[2 + j];
        y[j] = d * KVALUES_IQ4NL[(q & 0xF) as usize] as f32;
        y[j + 16] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
    }
}

pub(crate) fn dequant_iq4_xs(b: &[u8; layout::IQ4_XS], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let sc = iq4_xs_scales(b);
    for (ib, &s) in sc.iter().enumerate() {
        let dl = d * (s as i32 - 32) as f32;
        let qs = &b[layout::IQ4_XS_QS + 16 * ib..];
        for j in 0..16 {
            y[32 * ib + j] = dl * KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as f32;
            y[32 * ib + j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
        }
    }
}
