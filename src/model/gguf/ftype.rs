//! A file's type as llama.cpp names it: `general.file_type` (`LLAMA_FTYPE_MOSTLY_*`) read and
//! named with llama.cpp's own strings (`llama_model_ftype_name` in `src/llama-model-loader.cpp`:
//! "Q4_K - Medium"), so that `bench`, `info` and the chat header call a file what llama.cpp and
//! the model's download page call it; and the value `synth` and `convert` write for a weight type.

use crate::gpu::quant::GgmlType;

/// Set in `general.file_type` when llama.cpp guessed the type (it never writes that to a file,
/// but a file may carry it).
const GUESSED: u32 = 1024;

/// `LLAMA_FTYPE_*` values, llama.cpp's name for each (`llama_model_ftype_name`) and
/// llama-quantize's (the one a file name carries: `Qwen3-30B-A3B-Q4_K_M.gguf`).
const FTYPES: &[(u32, &str, &str)] = &[
    (0, "all F32", "F32"),
    (1, "F16", "F16"),
    (2, "Q4_0", "Q4_0"),
    (3, "Q4_1", "Q4_1"),
    (7, "Q8_0", "Q8_0"),
    (8, "Q5_0", "Q5_0"),
    (9, "Q5_1", "Q5_1"),
    (10, "Q2_K - Medium", "Q2_K"),
    (11, "Q3_K - Small", "Q3_K_S"),
    (12, "Q3_K - Medium", "Q3_K_M"),
    (13, "Q3_K - Large", "Q3_K_L"),
    (14, "Q4_K - Small", "Q4_K_S"),
    (15, "Q4_K - Medium", "Q4_K_M"),
    (16, "Q5_K - Small", "Q5_K_S"),
    (17, "Q5_K - Medium", "Q5_K_M"),
    (18, "Q6_K", "Q6_K"),
    (19, "IQ2_XXS - 2.0625 bpw", "IQ2_XXS"),
    (20, "IQ2_XS - 2.3125 bpw", "IQ2_XS"),
    (21, "Q2_K - Small", "Q2_K_S"),
    (22, "IQ3_XS - 3.3 bpw", "IQ3_XS"),
    (23, "IQ3_XXS - 3.0625 bpw", "IQ3_XXS"),
    (24, "IQ1_S - 1.5625 bpw", "IQ1_S"),
    (25, "IQ4_NL - 4.5 bpw", "IQ4_NL"),
    (26, "IQ3_S - 3.4375 bpw", "IQ3_S"),
    (27, "IQ3_S mix - 3.66 bpw", "IQ3_M"),
    (28, "IQ2_S - 2.5 bpw", "IQ2_S"),
    (29, "IQ2_M - 2.7 bpw", "IQ2_M"),
    (30, "IQ4_XS - 4.25 bpw", "IQ4_XS"),
    (31, "IQ1_M - 1.75 bpw", "IQ1_M"),
    (32, "BF16", "BF16"),
    (36, "TQ1_0 - 1.69 bpw ternary", "TQ1_0"),
    (37, "TQ2_0 - 2.06 bpw ternary", "TQ2_0"),
    (38, "MXFP4 MoE", "MXFP4_MOE"),
    (39, "NVFP4", "NVFP4"),
    (40, "Q1_0", "Q1_0"),
    (41, "Q2_0", "Q2_0"),
];

fn entry(ftype: u32) -> Option<&'static (u32, &'static str, &'static str)> {
    FTYPES.iter().find(|e| e.0 == ftype & !GUESSED)
}

/// llama.cpp's name of a `general.file_type` value ("Q4_K - Medium"); `None` for a value it does
/// not know (llama.cpp says "unknown, may not work").
pub fn ftype_name(ftype: u32) -> Option<&'static str> {
    entry(ftype).map(|e| e.1)
}

/// llama-quantize's name of a `general.file_type` value ("Q4_K_M"), as file names carry it.
pub fn ftype_short_name(ftype: u32) -> Option<&'static str> {
    entry(ftype).map(|e| e.2)
}

/// The ways a name may end in the type `label` (a [`GgufFile::type_label`]): the label itself,
/// llama-quantize's name of it ("Q4_K_M" for "Q4_K - Medium"), its first word ("Q4_K", what
/// `synth` puts in `general.name`).
///
/// [`GgufFile::type_label`]: super::GgufFile::type_label
pub fn name_suffixes(label: &str) -> Vec<&str> {
    let mut v = vec![label];
    if let Some(e) = FTYPES.iter().find(|e| e.1 == label) {
        v.push(e.2);
    }
    if let Some(first) = label.split(' ').next() {
        v.push(first);
    }
    v.dedup();
    v
}

/// The `general.file_type` of a file whose matrices are all of type `ty` (as `llama-quantize
/// --pure` writes it: Q4_K is Q4_K_M, MXFP4 is MXFP4_MOE); 0 ("all F32") for a type llama.cpp
/// has no file type for.
pub fn ftype_of(ty: GgmlType) -> u32 {
    match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q8_0 => 7,
        GgmlType::Q5_0 => 8,
        GgmlType::Q5_1 => 9,
        GgmlType::Q2K => 10,
        GgmlType::Q3K => 12,
        GgmlType::Q4K => 15,
        GgmlType::Q5K => 17,
        GgmlType::Q6K => 18,
        GgmlType::Iq4Nl => 25,
        GgmlType::Iq4Xs => 30,
        GgmlType::Bf16 => 32,
        GgmlType::Mxfp4 => 38,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_llama_cpps() {
        assert_eq!(ftype_name(15), Some("Q4_K - Medium"));
        assert_eq!(ftype_short_name(15), Some("Q4_K_M"));
        assert_eq!(ftype_name(0), Some("all F32"));
        assert_eq!(ftype_name(38), Some("MXFP4 MoE"));
        assert_eq!(ftype_name(15 | GUESSED), Some("Q4_K - Medium"));
        // Removed from llama.cpp (Q4_2, Q4_0_4_4): unknown.
        assert_eq!(ftype_name(5), None);
        assert_eq!(ftype_name(34), None);
    }

    #[test]
    fn a_name_may_end_in_the_label_its_quantize_name_or_its_type() {
        assert_eq!(
            name_suffixes("Q4_K - Medium"),
            ["Q4_K - Medium", "Q4_K_M", "Q4_K"]
        );
        assert_eq!(name_suffixes("Q4_1"), ["Q4_1"]);
    }

    #[test]
    fn every_type_synth_writes_has_a_named_file_type() {
        for ty in GgmlType::all().filter(|&t| crate::gpu::quant::is_supported(t)) {
            let ft = ftype_of(ty);
            let short = ftype_short_name(ft).unwrap_or("?");
            assert!(
                short.starts_with(ty.name()) || (ty == GgmlType::F32 && ft == 0),
                "{ty}: file type {ft} ({short})"
            );
        }
    }
}
