//! llama.cpp's rounding of a float to the nearest integer, shared by the quantizers
//! (`quantize.rs`, `quantize_lowbit.rs`, `qkx2_lanes.rs`).

/// Round to nearest, ties to even, by the float-addition trick llama.cpp uses; valid for
/// |x| <= 2^22 - 1, which every caller guarantees by construction (out of range it returns a
/// wrong but harmless value, never panics).
#[inline]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}
