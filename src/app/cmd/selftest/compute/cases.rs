//! The case matrix of `selftest --compute`: which synthetic shapes, weight types and KV-cache
//! types run (and any files given), and in what order.

use super::ComputeCheckOptions;
use crate::gpu::compute::KvType;
use crate::model::protocol::ModelSource;

/// The default matrix: the synthetic shapes and weight types the task's table asks for.
pub const SHAPES: &[&str] = &[
    "tiny",
    "tiny-qwen2",
    "tiny-llama3",
    "smollm2-135m",
    "tiny-qwen3",
    "tiny-gemma2",
    "tiny-gemma3",
    "tiny-phi3",
    "mixtral-tiny-2l",
    "tiny-qwen3moe",
    "tiny-gpt-oss",
    "gpt-oss-20b-2l",
];
/// Shapes that run only these of the asked weight types (the first of them when none is asked):
/// gpt-oss-20b's vocabulary of 201,088 × 2,880 makes an F32 file of 4.6 GB, and a case holds
/// five copies of it (the GPU's, the CPU's, two nudged CPU ones, the op-by-op run's). The synth
/// writes gpt-oss's experts MXFP4 whatever the type asked, as the converter does.
const SHAPE_QUANTS: &[(&str, &[&str])] = &[("gpt-oss-20b-2l", &["Q8_0", "Q4_K"])];
pub const QUANTS: &[&str] = &["F32", "F16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"];
/// Types the default matrix covers on the `tiny` shape only (every other GPU type).
pub const EXTRA_TINY: &[&str] = &[
    "BF16", "Q5_0", "Q5_1", "Q5_K", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "MXFP4",
];

/// Shapes run once more over an f16 cache, in Q4_0 (smollm2-135m whatever types were asked; the
/// rest when Q4_0 was): the app's default cache on the real shape, and the prompt attention's
/// matrix-unit kernel on heads of 96 (tiny-qwen3) and 128 with soft-capping and sliding windows
/// (tiny-gemma2, tiny-gemma3).
const F16_CACHE_SHAPES: [&str; 4] = ["smollm2-135m", "tiny-qwen3", "tiny-gemma2", "tiny-gemma3"];

/// One case: a model, its weight type's label and the KV-cache type it runs over.
pub(super) struct Case {
    pub name: String,
    pub quant: String,
    pub source: ModelSource,
    pub kv: KvType,
}

/// The cases `o` asks for, in the order they run.
pub(super) fn cases(o: &ComputeCheckOptions) -> Vec<Case> {
    let mut v = Vec::new();
    let synth = |shape: &str, quant: &str, kv| Case {
        name: shape.to_string(),
        quant: quant.to_string(),
        source: ModelSource::Synthetic {
            shape: shape.to_string(),
            quant: quant.to_string(),
            seed: 7,
        },
        kv,
    };
    for s in &o.shapes {
        let quants: Vec<&str> = match SHAPE_QUANTS.iter().find(|(name, _)| name == s) {
            Some((_, only)) => {
                let asked: Vec<&str> = o
                    .quants
                    .iter()
                    .map(String::as_str)
                    .filter(|q| only.contains(q))
                    .collect();
                if asked.is_empty() {
                    only[..1].to_vec()
                } else {
                    asked
                }
            }
            None => o.quants.iter().map(String::as_str).collect(),
        };
        for q in quants {
            v.push(synth(s, q, KvType::F32));
        }
        if s == "tiny" && o.quants.iter().any(|q| q == "Q4_0") {
            for q in EXTRA_TINY {
                v.push(synth(s, q, KvType::F32));
            }
        }
    }
    // The cache type the app uses by default, on the real shape, and where a prompt's attention
    // runs on the matrix units (an f16 cache only): heads of 96 and 128, soft-capping, sliding
    // windows.
    for s in F16_CACHE_SHAPES {
        let asked = s == "smollm2-135m" || o.quants.iter().any(|q| q == "Q4_0");
        if asked && o.shapes.iter().any(|x| x == s) {
            v.push(synth(s, "Q4_0", KvType::F16));
        }
    }
    for f in &o.files {
        for kv in [KvType::F32, KvType::F16] {
            v.push(Case {
                name: f
                    .file_name()
                    .map_or_else(|| f.display().to_string(), |n| n.to_string_lossy().into()),
                quant: "(file)".into(),
                source: ModelSource::File(f.clone()),
                kv,
            });
        }
    }
    v
}
