//! MXFP4 (OCP microscaling FP4, as gpt-oss ships its expert weights): the block layout, its
//! dequantization and llama.cpp's reference quantizer.
//!
//! A block (llama.cpp `block_mxfp4` in `ggml-common.h`) is 17 bytes for 32 elements: `e`, an
//! E8M0 scale (a bare power-of-two exponent, bias 127), then `qs[16]`, 4-bit E2M1 codes laid out
//! as Q4_0's nibbles (element j in the low nibble of `qs[j]`, element j + 16 in the high one).
//! As in llama.cpp, the E2M1 values are kept doubled as small integers (`KVALUES_MXFP4`) and the
//! scale halved (`e8m0_to_fp32_half`), so that the dot products run on the same 8-bit integer
//! multiply-adds as IQ4_NL against a Q8 activation.

/// Elements per block (ggml's `QK_MXFP4`; the same as the other 32-element types, kept here so
/// that `blocks.rs`, which dispatches to this file, is not imported back).
pub const QK: usize = 32;

/// Bytes per block: e, qs[16].
pub const BYTES: usize = 17;

/// Twice the 16 E2M1 values (llama.cpp `kvalues_mxfp4`): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
/// negatives (code 8 is -0, stored as 0).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half the E8M0 scale `x`: 2^(x − 128), exact (llama.cpp `ggml_e8m0_to_fp32_half`). x = 0 and 1
/// give the subnormals 2^-128 and 2^-127; x = 255 (E8M0's NaN) is read as 2^127, as llama.cpp
/// reads it.
#[inline]
pub fn e8m0_to_fp32_half(x: u8) -> f32 {
    let bits = if x < 2 {
        0x0020_0000u32 << x
    } else {
        (x as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

pub(crate) fn dequant(b: &[u8; BYTES], y: &mut [f32; QK]) {
    let d = e8m0_to_fp32_half(b[0]);
    for j in 0..16 {
        let q = b[1 + j];
        y[j] = KVALUES_MXFP4[(q & 0xF) as usize] as f32 * d;
        y[j + 16] = KVALUES_MXFP4[(q >> 4) as usize] as f32 * d;
    }
}

/// The code whose value is nearest `x` for half-scale `d`; ties go to the lower code
/// (`best_index_mxfp4`).
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (KVALUES_MXFP4[0] as f32 * d - x).abs();
    for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// llama.cpp's `quantize_row_mxfp4_ref` (what llama-quantize runs for MXFP4, which takes no
/// importance matrix): the scale is 2^(⌊log2 max|x|⌋ − 2), so that the largest value lands in
/// E2M1's top binade (4..6), then each element gets its nearest code.
pub(crate) fn quantize(x: &[f32; QK], b: &mut [u8; BYTES]) {
    let amax = x
        .iter()
        .fold(0f32, |m, v| if m < v.abs() { v.abs() } else { m });
    // The C code casts a float to uint8_t; for max|x| under 2^-125 the float is negative, which
    // x86-64 compilers convert through a 32-bit integer and truncate, as this does.
    let e = if amax > 0.0 {
        (amax.log2().floor() - 2.0 + 127.0) as i32 as u8
    } else {
        0
    };
    let d = e8m0_to_fp32_half(e);
    b[0] = e;
    for j in 0..16 {
        b[1 + j] = best_index(x[j], d) | (best_index(x[j + 16], d) << 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_is_a_power_of_two_halved() {
        assert_eq!(e8m0_to_fp32_half(127), 0.5);
        assert_eq!(e8m0_to_fp32_half(128), 1.0);
        assert_eq!(e8m0_to_fp32_half(2), 2f32.powi(-126));
        assert_eq!(e8m0_to_fp32_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_to_fp32_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_to_fp32_half(255), 2f32.powi(127));
    }

    #[test]
    fn values_on_the_grid_round_trip() {
        // Every E2M1 value times 2^-3 .. 2^3, with the block's maximum at 6 · 2^k.
        for k in -3..=3 {
            let s = 2f32.powi(k);
            let mut x = [0f32; QK];
            for (i, v) in x.iter_mut().enumerate() {
                *v = KVALUES_MXFP4[i % 16] as f32 * 0.5 * s;
            }
            x[31] = 6.0 * s;
            let mut b = [0u8; BYTES];
            quantize(&x, &mut b);
            let mut y = [0f32; QK];
            dequant(&b, &mut y);
            assert_eq!(x, y, "scale 2^{k}");
        }
    }
}
