//! Perplexity of SmolLM2 (F16, converted by hipscope from the default Q4_1 model) over a public
//! text, against llama-perplexity's figure on the same file and text
//! (tests/data/reference/perplexity.toml records it with the command that produced it).
//!
//! The first [`CHUNKS`] of the text's 14 chunks: llama-perplexity prints the estimate after each
//! chunk (the perplexity of the chunks so far), and the record keeps every one, so the figure
//! after chunk 4 is llama.cpp's own for those 4. All 14 took ~300 s of CPU on the 2-core AVX2
//! development machine (F16 on the CPU), a fifth of the suite's; 4 take ~85 s.

use crate::common;

use common::{repo_path, run_ok, smollm2};

/// Chunks of 512 tokens scored.
const CHUNKS: usize = 4;

#[test]
fn f16_perplexity_matches_llama_cpp_within_half_a_percent() {
    let reference: toml::Table = toml::from_str(
        &std::fs::read_to_string(repo_path("tests/data/reference/perplexity.toml")).unwrap(),
    )
    .unwrap();
    let f16 = &reference["f16"];
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("smollm2-f16.gguf");
    run_ok(&[
        "convert",
        smollm2().to_str().unwrap(),
        "--type",
        "F16",
        "-o",
        model.to_str().unwrap(),
    ]);
    // The file llama.cpp measured is the file measured here.
    assert_eq!(
        hipscope::app::fetch::sha256_file(&model).unwrap(),
        f16["model_sha256"].as_str().unwrap()
    );
    let out = run_ok(&[
        "perplexity",
        "-m",
        model.to_str().unwrap(),
        "-f",
        repo_path("tests/data/gpl-3.0.txt").to_str().unwrap(),
        "-c",
        "512",
        "--chunks",
        &CHUNKS.to_string(),
        "--json",
    ]);
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["chunks"].as_u64(), Some(CHUNKS as u64));
    assert_eq!(
        f16["chunks"].as_integer(),
        Some(14),
        "the record covers the whole text"
    );
    // llama.cpp's estimate after each of the first CHUNKS chunks, and ours ("[1]16.2659,[2]…").
    let want: Vec<f64> = f16["per_chunk"].as_array().unwrap()[..CHUNKS]
        .iter()
        .map(|v| v.as_float().unwrap())
        .collect();
    let ours: Vec<f64> = got["per_chunk"]
        .as_str()
        .unwrap()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.split_once(']').unwrap().1.parse().unwrap())
        .collect();
    assert_eq!(ours.len(), CHUNKS, "{got}");
    for (i, (o, w)) in ours.iter().zip(&want).enumerate() {
        let rel = (o - w).abs() / w;
        assert!(
            rel < 0.005,
            "after chunk {}: perplexity {o:.4} vs llama.cpp {w:.4}: {:.2}% apart",
            i + 1,
            rel * 100.0
        );
    }
    let ppl = got["ppl"].as_f64().unwrap();
    assert!((ppl - ours[CHUNKS - 1]).abs() < 1e-3, "{got}");
}
