//! The architectures of issue 15 (qwen3, gemma2, gemma3, phi3) and the mixtures of experts of
//! issue 16 (Mixtral-style llama, qwen3moe, gpt-oss) against llama.cpp:
//! hipscope's synthetic models of each (the real architecture with a 512-token vocabulary), run by llama.cpp's
//! `llama-perplexity` (b11434, CPU) and recorded in `tests/data/reference/arch/reference.toml`,
//! `moe.toml` and `gpt-oss.toml` by `scripts/gen_arch_reference.sh`, with llama.cpp's logits of each Q8_0 file
//! (`SHAPE.kld`, its `--kl-divergence-base` format).
//!
//! Here: the synth files are the ones llama.cpp ran (same sha256); hipscope's perplexity of the
//! Q8_0 file is llama.cpp's within 1%; and hipscope's token distributions on llama.cpp's own
//! chunks (`perplexity --kl-divergence-base SHAPE.kld --kl-divergence`) are at least 10× closer to
//! llama.cpp's (mean KL divergence) than llama.cpp's Q4_0 file is to its Q8_0 file.

use crate::common;

use common::{repo_path, run_ok};

fn reference(toml: &str) -> toml::Table {
    toml::from_str(
        &std::fs::read_to_string(repo_path(&format!("tests/data/reference/arch/{toml}"))).unwrap(),
    )
    .unwrap()
}

fn check(shape: &str) {
    check_in("reference.toml", shape)
}

fn check_in(toml: &str, shape: &str) {
    let r = reference(toml);
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
    // llama.cpp's logits of the same file, on the chunks it scored.
    let base = repo_path(&format!(
        "tests/data/reference/arch/{}",
        case["kld"].as_str().unwrap()
    ));
    let out = run_ok(&[
        "perplexity",
        "-m",
        model.to_str().unwrap(),
        "--kl-divergence-base",
        base.to_str().unwrap(),
        "--kl-divergence",
        "--json",
    ]);
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kld = got["kld"][0].as_f64().unwrap();
    let q = case["kld_q4_0_vs_q8_0"].as_float().unwrap();
    assert!(
        kld < q / 10.0,
        "{shape}: mean KL divergence hipscope vs llama.cpp {kld:.6}; llama.cpp Q4_0 vs Q8_0 {q:.6}"
    );
    let ppl = got["ppl"][0].as_f64().unwrap();
    assert!(
        (ppl / want - 1.0).abs() < 0.01,
        "{shape}: perplexity on llama.cpp's chunks {ppl:.4} vs llama.cpp {want:.4}"
    );
    // Random weights make many near-ties; still, the same top token nearly everywhere.
    let top = got["same_top"][0].as_f64().unwrap();
    assert!(top >= 0.95, "{shape}: same top token {top:.4}");
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

#[test]
fn mixtral_style_moe_perplexity_matches_llama_cpp() {
    check_in("moe.toml", "mixtral-tiny-2l");
}

#[test]
fn qwen3moe_perplexity_matches_llama_cpp() {
    check_in("moe.toml", "tiny-qwen3moe");
}

/// gpt-oss (attention sinks, alternating sliding-window layers, YaRN RoPE, biased MXFP4 experts
/// with softmax-after-top-k routing and the clamped SwiGLU), on the backend `perplexity`'s
/// `--backend auto` picks (the CPU where CI runs; the GPU backends' gpt-oss is checked against the
/// CPU by `hipscope selftest --compute`, docs/runs/gpt-oss-gpu-h100.txt).
#[test]
fn gpt_oss_perplexity_matches_llama_cpp() {
    check_in("gpt-oss.toml", "tiny-gpt-oss");
}

/// The same in batches of 5 tokens: the sliding layers' rings (window 16 plus a batch) wrap
/// within each 128-token chunk, and each batch's attention sees earlier batches' keys through
/// them, sinks and YaRN included; llama.cpp's perplexity still, within 1%.
#[test]
fn gpt_oss_in_small_batches_matches_llama_cpp() {
    let shape = "tiny-gpt-oss";
    let case = reference("gpt-oss.toml")[shape].as_table().unwrap().clone();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    let m = model.to_str().unwrap();
    run_ok(&["synth", shape, "--quant", "Q8_0", "--seed", "1", "-o", m]);
    let text = repo_path("tests/data/gpl-3.0.txt");
    let out = run_ok(&[
        "perplexity",
        "-m",
        m,
        "-f",
        text.to_str().unwrap(),
        "-c",
        "128",
        "--chunks",
        "4",
        "-b",
        "5",
        "--json",
    ]);
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ppl = got["ppl"].as_f64().unwrap();
    let want = case["ppl_q8_0"].as_float().unwrap();
    assert!(
        (ppl / want - 1.0).abs() < 0.01,
        "{shape} in batches of 5: perplexity {ppl:.4} vs llama.cpp {want:.4}"
    );
}
