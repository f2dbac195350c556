//! Perplexity of SmolLM2 (F16, converted by hipscope from the default Q4_1 model) over a public
//! text, against llama-perplexity's figure on the same file and text
//! (tests/data/reference/perplexity.toml records it with the command that produced it).

use crate::common;

use common::{repo_path, run_ok, smollm2};

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
        "--json",
    ]);
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ppl = got["ppl"].as_f64().unwrap();
    let want = f16["ppl"].as_float().unwrap();
    assert_eq!(
        got["chunks"].as_u64(),
        Some(f16["chunks"].as_integer().unwrap() as u64)
    );
    let rel = (ppl - want).abs() / want;
    assert!(
        rel < 0.005,
        "perplexity {ppl:.4} vs llama.cpp {want:.4}: {:.2}% apart",
        rel * 100.0
    );
}
