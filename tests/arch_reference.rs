//! The architectures of issue 15 (qwen3, gemma2, gemma3, phi3) against llama.cpp: hipscope's
//! synthetic models of each (the real architecture with a 512-token vocabulary), run by
//! llama.cpp's `llama-perplexity` (b11434, CPU) and recorded in
//! `tests/data/reference/arch/reference.toml` by `scripts/gen_arch_reference.sh`, with
//! llama.cpp's logits of each Q8_0 file (`SHAPE.kld`, its `--kl-divergence-base` format).
//!
//! Here: the synth files are the ones llama.cpp ran (same sha256), and hipscope's perplexity of
//! the Q8_0 file is llama.cpp's within 1%.

mod common;

use common::{repo_path, run_ok};

fn reference() -> toml::Table {
    toml::from_str(
        &std::fs::read_to_string(repo_path("tests/data/reference/arch/reference.toml")).unwrap(),
    )
    .unwrap()
}

fn check(shape: &str) {
    let r = reference();
    let case = r[shape].as_table().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join(format!("{shape}-Q8_0.gguf"));
    run_ok(&[
        "synth",
        shape,
        "--quant",
        "Q8_0",
        "--seed",
        "1",
        "-o",
        model.to_str().unwrap(),
    ]);
    assert_eq!(
        hipscope::app::fetch::sha256_file(&model).unwrap(),
        case["q8_0_sha256"].as_str().unwrap(),
        "{shape}: the synth file differs from the one llama.cpp ran"
    );
    let n_ctx = case["n_ctx"].as_integer().unwrap().to_string();
    let chunks = case["chunks"].as_integer().unwrap().to_string();
    let out = run_ok(&[
        "perplexity",
        "-m",
        model.to_str().unwrap(),
        "-f",
        repo_path("tests/data/gpl-3.0.txt").to_str().unwrap(),
        "-c",
        &n_ctx,
        "--chunks",
        &chunks,
        "--json",
    ]);
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ppl = got["ppl"].as_f64().unwrap();
    let want = case["ppl_q8_0"].as_float().unwrap();
    let rel = (ppl - want).abs() / want;
    assert!(
        rel < 0.01,
        "{shape}: perplexity {ppl:.4} vs llama.cpp {want:.4}: {:.3}% apart",
        rel * 100.0
    );
}

#[test]
fn qwen3_perplexity_matches_llama_cpp() {
    check("tiny-qwen3");
}

#[test]
fn gemma2_perplexity_matches_llama_cpp() {
    check("tiny-gemma2");
}

#[test]
fn gemma3_perplexity_matches_llama_cpp() {
    check("tiny-gemma3");
}

#[test]
fn phi3_perplexity_matches_llama_cpp() {
    check("tiny-phi3");
}
