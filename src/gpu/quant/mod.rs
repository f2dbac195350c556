//! GGML tensor element types and their block layouts: what every backend computes on.
//!
//! Sizes are facts of the GGUF format (llama.cpp `ggml/src/ggml-common.h`). Every type GGUF can
//! hold is named here, so that a file using one we cannot compute on still parses and the error
//! names the type and the tensor.

use std::fmt;

mod blocks;
pub mod dot;
pub mod mxfp4;
mod qkx2_lanes;
mod quantize;
mod quantize_lowbit;
mod round;

pub use blocks::{QK, QK_K, f16_to_f32, f32_to_f16};

/// What went wrong converting or computing on quantized data. The caller adds the tensor name.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    #[error("{ty} is not supported (supported: {list})", list = TypeList(supported))]
    Unsupported {
        ty: GgmlType,
        supported: &'static [GgmlType],
    },
    #[error("{ty}: {elements} elements is not a whole number of {block_len}-element blocks")]
    PartialBlock {
        ty: GgmlType,
        elements: usize,
        block_len: usize,
    },
    #[error("{ty}: {bytes} bytes is not a whole number of {block_bytes}-byte blocks")]
    PartialBlockBytes {
        ty: GgmlType,
        bytes: usize,
        block_bytes: usize,
    },
    #[error("{ty}: {bytes} bytes hold {have} elements, but {want} were expected")]
    LengthMismatch {
        ty: GgmlType,
        bytes: usize,
        have: usize,
        want: usize,
    },
    #[error("{ty}: input element {index} is {value}; only finite values can be quantized")]
    NonFinite {
        ty: GgmlType,
        index: usize,
        value: f32,
    },
    #[error("{ty} matrix of {rows} x {cols}: {what}")]
    BadMatrix {
        ty: GgmlType,
        rows: usize,
        cols: usize,
        what: String,
    },
}

/// Displays a list of types as `F32, F16, …`.
struct TypeList<'a>(&'a [GgmlType]);

impl fmt::Display for TypeList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(t.name())?;
        }
        Ok(())
    }
}

/// Weight types the engine computes on: dequantize, quantize and dot products against activations.
pub const COMPUTE_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Iq4Nl,
    GgmlType::Iq4Xs,
    GgmlType::Mxfp4,
];

/// Types `dequantize` and `quantize` accept: the compute types plus the activation formats Q8_1
/// and Q8_K, which llama.cpp never stores as weights but which are handy to check against it.
pub const CODEC_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q8K,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Iq4Nl,
    GgmlType::Iq4Xs,
    GgmlType::Mxfp4,
];

/// Types we can compute on (dequantize + dot).
pub fn is_supported(ty: GgmlType) -> bool {
    COMPUTE_TYPES.contains(&ty)
}

/// The error for a type outside `COMPUTE_TYPES`, for callers that check up front.
pub fn unsupported(ty: GgmlType) -> QuantError {
    QuantError::Unsupported {
        ty,
        supported: COMPUTE_TYPES,
    }
}

/// Dequantize `src` (whole blocks of `ty`) into `dst` (len = elements). Error if sizes disagree or
/// `ty` is unsupported.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    if !CODEC_TYPES.contains(&ty) {
        return Err(QuantError::Unsupported {
            ty,
            supported: CODEC_TYPES,
        });
    }
    let bb = ty.block_bytes();
    if !src.len().is_multiple_of(bb) {
        return Err(QuantError::PartialBlockBytes {
            ty,
            bytes: src.len(),
            block_bytes: bb,
        });
    }
    let have = src.len() / bb * ty.block_len();
    if have != dst.len() {
        return Err(QuantError::LengthMismatch {
            ty,
            bytes: src.len(),
            have,
            want: dst.len(),
        });
    }
    blocks::dequantize_blocks(ty, src, dst);
    Ok(())
}

/// Quantize `src` (len a multiple of the block length) into freshly allocated bytes of `ty`,
/// following llama.cpp's reference quantizers (`quantize_row_*_ref`) so that files we write
/// quantize as llama.cpp's would. Block types refuse NaN and infinities (one would silently
/// poison the scale of its whole block); F32, F16 and BF16 carry them as they are.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    if !CODEC_TYPES.contains(&ty) {
        return Err(QuantError::Unsupported {
            ty,
            supported: CODEC_TYPES,
        });
    }
    let bl = ty.block_len();
    if !src.len().is_multiple_of(bl) {
        return Err(QuantError::PartialBlock {
            ty,
            elements: src.len(),
            block_len: bl,
        });
    }
    if bl > 1
        && let Some((index, &value)) = src.iter().enumerate().find(|(_, v)| !v.is_finite())
    {
        return Err(QuantError::NonFinite { ty, index, value });
    }
    let mut out = vec![0u8; src.len() / bl * ty.block_bytes()];
    // Blocks are independent, so large inputs (whole tensors of a model being written) are
    // split across cores; the K-type searches cost ~100 ns per element.
    const PARALLEL_MIN: usize = 1 << 20;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if src.len() < PARALLEL_MIN || threads == 1 {
        quantize_lowbit::quantize_blocks(ty, src, &mut out);
        return Ok(out);
    }
    let blocks = src.len() / bl;
    let per = blocks.div_ceil(threads);
    std::thread::scope(|scope| {
        for (x, o) in src
            .chunks(per * bl)
            .zip(out.chunks_mut(per * ty.block_bytes()))
        {
            scope.spawn(move || quantize_lowbit::quantize_blocks(ty, x, o));
        }
    });
    Ok(out)
}

/// A GGML element type, by its on-disk id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    Iq2Xxs,
    Iq2Xs,
    Iq3Xxs,
    Iq1S,
    Iq4Nl,
    Iq3S,
    Iq2S,
    Iq4Xs,
    I8,
    I16,
    I32,
    I64,
    F64,
    Iq1M,
    Bf16,
    Tq1_0,
    Tq2_0,
    Mxfp4,
}

/// (type, id, name, elements per block, bytes per block)
const TABLE: &[(GgmlType, u32, &str, usize, usize)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 36),
    (GgmlType::Q2K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8K, 15, "Q8_K", 256, 292),
    (GgmlType::Iq2Xxs, 16, "IQ2_XXS", 256, 66),
    (GgmlType::Iq2Xs, 17, "IQ2_XS", 256, 74),
    (GgmlType::Iq3Xxs, 18, "IQ3_XXS", 256, 98),
    (GgmlType::Iq1S, 19, "IQ1_S", 256, 50),
    (GgmlType::Iq4Nl, 20, "IQ4_NL", 32, 18),
    (GgmlType::Iq3S, 21, "IQ3_S", 256, 110),
    (GgmlType::Iq2S, 22, "IQ2_S", 256, 82),
    (GgmlType::Iq4Xs, 23, "IQ4_XS", 256, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::Iq1M, 29, "IQ1_M", 256, 56),
    (GgmlType::Bf16, 30, "BF16", 1, 2),
    (GgmlType::Tq1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::Tq2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::Mxfp4, 39, "MXFP4", 32, 17),
];

impl GgmlType {
    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        // The table lists every variant; the search cannot miss.
        TABLE.iter().find(|r| r.0 == self).unwrap_or(&TABLE[0])
    }

    /// The type with this on-disk id, if GGML defines one.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|r| r.1 == id).map(|r| r.0)
    }

    /// The type with this name (`Q4_K`, `q8_0`, `bf16`), case-insensitive.
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TABLE
            .iter()
            .find(|r| r.2.eq_ignore_ascii_case(name))
            .map(|r| r.0)
    }

    pub fn id(self) -> u32 {
        self.row().1
    }

    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per block.
    pub fn block_len(self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.row().4
    }

    /// Bytes taken by `n` elements, or `None` if `n` is not a whole number of blocks or the size
    /// overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let bl = self.block_len() as u64;
        if !n.is_multiple_of(bl) {
            return None;
        }
        (n / bl).checked_mul(self.block_bytes() as u64)
    }

    /// Every type GGUF can hold.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|r| r.0)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_round_trip() {
        for t in GgmlType::all() {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(&t.name().to_lowercase()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None); // Q4_2, removed from GGML
    }

    #[test]
    fn sizes_follow_ggml_common_h() {
        // Spot checks against the struct layouts in ggml-common.h.
        assert_eq!(GgmlType::Q4K.block_bytes(), 2 * 2 + 12 + 128);
        assert_eq!(GgmlType::Q6K.block_bytes(), 128 + 64 + 16 + 2);
        assert_eq!(GgmlType::Q8_0.bytes_for(64), Some(68));
        assert_eq!(GgmlType::Q8_0.bytes_for(33), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }
}
