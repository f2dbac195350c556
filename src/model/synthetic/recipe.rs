//! What a synthetic file's matrices are made of: one type for every matrix (as `llama-quantize
//! --pure` writes), or llama.cpp's Q4_K_M mix, so that a benchmark meets the types a published
//! Q4_K_M file has (Q6_K output, Q6_K `attn_v` and `ffn_down` in some layers — experts too —
//! Q4_K elsewhere). The mix follows `llama_tensor_get_type_impl` in llama.cpp's
//! `src/llama-quant.cpp` (b11434); `tests/data/reference/q4_k_m_types.toml` holds the types
//! llama-quantize chose for some shapes, and a test holds this to them.

use super::{Shape, type_for};
use crate::gpu::quant::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recipe {
    /// Every matrix of this type (narrow rows fall back: [`type_for`]).
    Pure(GgmlType),
    /// llama.cpp's `Q4_K_M` (`LLAMA_FTYPE_MOSTLY_Q4_K_M`).
    Q4KM,
}

impl From<GgmlType> for Recipe {
    fn from(t: GgmlType) -> Self {
        Recipe::Pure(t)
    }
}

impl std::fmt::Display for Recipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Recipe::Pure(t) => write!(f, "{t}"),
            Recipe::Q4KM => f.write_str("Q4_K_M"),
        }
    }
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third between.
fn use_more_bits(i: usize, n: usize) -> bool {
    let (i, n) = (i as i64, n as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The layer of a `blk.N.` tensor.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

impl Recipe {
    /// The `general.file_type` the file carries (llama.cpp's `llama_ftype`).
    pub fn file_type(self) -> u32 {
        match self {
            Recipe::Pure(t) => crate::model::gguf::ftype::ftype_of(t),
            Recipe::Q4KM => 15,
        }
    }

    /// The type of matrix `name` with rows of `cols` in shape `s`.
    pub fn matrix_type(self, s: &Shape, name: &str, cols: usize) -> GgmlType {
        let ty = match self {
            Recipe::Pure(t) => t,
            Recipe::Q4KM => q4_k_m(s, name, cols),
        };
        type_for(ty, cols)
    }
}

/// Q4_K_M's choice for one matrix, before the fallback for narrow rows.
fn q4_k_m(s: &Shape, name: &str, cols: usize) -> GgmlType {
    let output = name == "output.weight" || (s.tied && name == "token_embd.weight");
    if output {
        return if cols.is_multiple_of(256) {
            GgmlType::Q6K
        } else {
            GgmlType::Q8_0
        };
    }
    let eight_experts = s.n_expert == 8;
    let layer = layer_of(name).unwrap_or(0);
    if name.contains("attn_v.weight") || name.contains("attn_qkv.weight") {
        // `i_attention_wv` counts these tensors, one a layer.
        return if eight_experts {
            GgmlType::Q8_0
        } else if use_more_bits(layer, s.n_layers) {
            GgmlType::Q6K
        } else {
            GgmlType::Q4K
        };
    }
    if name.contains("attn_k.weight") && eight_experts {
        return GgmlType::Q8_0;
    }
    if name.contains("attn_output.weight") && eight_experts {
        return GgmlType::Q5K;
    }
    if name.contains("ffn_down") && use_more_bits(layer, s.n_layers) {
        return GgmlType::Q6K;
    }
    GgmlType::Q4K
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_bits_as_llama_cpp_counts_them() {
        // 28 layers (Qwen3-0.6B): 0..=2, 24..=27, and 5, 8, ..., 23.
        let picked: Vec<usize> = (0..28).filter(|&i| use_more_bits(i, 28)).collect();
        assert_eq!(picked, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]);
        assert_eq!(layer_of("blk.17.ffn_down_exps.weight"), Some(17));
        assert_eq!(layer_of("output.weight"), None);
    }
}
