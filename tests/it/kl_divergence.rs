//! `hipscope perplexity --kl-divergence-base/--kl-divergence` against llama.cpp's own logits
//! files: a base file llama-perplexity wrote for the default model (recorded with its command in
//! tests/data/reference/kl-divergence.toml) is read by hipscope running the same model, and a
//! base file hipscope writes carries the same header and tokens as llama.cpp's.

use crate::common;

use std::io::Read;
use std::path::{Path, PathBuf};

use common::{hipscope, repo_path, run_ok, smollm2};

fn reference() -> toml::Table {
    toml::from_str(
        &std::fs::read_to_string(repo_path("tests/data/reference/kl-divergence.toml")).unwrap(),
    )
    .unwrap()
}

/// llama.cpp's base file, unpacked from its zip into `dir`.
fn llama_base(dir: &Path) -> PathBuf {
    let zip =
        std::fs::File::open(repo_path("tests/data/reference/kl-base-smollm2-q4_1.zip")).unwrap();
    let mut z = zip::ZipArchive::new(zip).unwrap();
    let mut entry = z.by_index(0).unwrap();
    let mut bytes = Vec::new();
    entry.read_to_end(&mut bytes).unwrap();
    let p = dir.join("llama-base.kld");
    std::fs::write(&p, bytes).unwrap();
    p
}

fn kl_json(model: &Path, base: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "perplexity",
        "-m",
        model.to_str().unwrap(),
        "--kl-divergence-base",
        base.to_str().unwrap(),
        "--kl-divergence",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = run_ok(&args);
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn hipscope_agrees_with_llama_cpp_far_more_closely_than_q4_0_with_q8_0() {
    let r = reference();
    let base_rec = &r["base"];
    let dir = tempfile::tempdir().unwrap();
    let base = llama_base(dir.path());
    assert_eq!(
        hipscope::app::fetch::sha256_file(&base).unwrap(),
        base_rec["sha256"].as_str().unwrap()
    );
    let got = kl_json(&smollm2(), &base, &[]);
    let kld = got["kld"][0].as_f64().unwrap();
    // llama.cpp's own figure for what a quantization step costs this model on this text.
    let q = r["q8_0_vs_q4_0"]["kld"].as_float().unwrap();
    assert!(
        kld < q / 10.0,
        "mean KL divergence hipscope vs llama.cpp {kld:.6}; llama.cpp Q4_0 vs Q8_0 {q:.6}"
    );
    let top = got["same_top"][0].as_f64().unwrap();
    let min_top = r["limits"]["same_top_min"].as_float().unwrap();
    assert!(top >= min_top, "same top token {top:.4} < {min_top}");
    // Perplexity over 60 tokens is a noisy figure: two builds of llama.cpp itself (AVX2 and
    // AVX-512) land 1.4% apart on it (kl-divergence.toml). What it must show is no bias beyond
    // its own standard error, which `ln_ppl_ratio` carries next to the value.
    let ppl = got["ppl"][0].as_f64().unwrap();
    let want = base_rec["ppl"].as_float().unwrap();
    assert!(
        (got["ppl_base"][0].as_f64().unwrap() / want - 1.0).abs() < 1e-4,
        "the base file's own perplexity {} vs the recorded {want}",
        got["ppl_base"][0]
    );
    let (ln_ratio, ln_err) = (
        got["ln_ppl_ratio"][0].as_f64().unwrap(),
        got["ln_ppl_ratio"][1].as_f64().unwrap(),
    );
    assert!(
        ln_ratio.abs() < 3.0 * ln_err && ln_ratio.abs() < 0.1,
        "perplexity {ppl:.4} vs llama.cpp {want:.4}: ln ratio {ln_ratio:.4} ± {ln_err:.4}"
    );
    assert_eq!(
        got["tokens"].as_u64(),
        Some(base_rec["scored"].as_integer().unwrap() as u64)
    );
}

#[test]
fn a_base_file_written_by_hipscope_has_llama_cpp_s_header_and_tokens_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let theirs = std::fs::read(llama_base(dir.path())).unwrap();
    let ours = dir.path().join("ours.kld");
    run_ok(&[
        "perplexity",
        "-m",
        smollm2().to_str().unwrap(),
        "-f",
        repo_path("tests/data/gpl-3.0.txt").to_str().unwrap(),
        "-c",
        "32",
        "--chunks",
        "4",
        "--kl-divergence-base",
        ours.to_str().unwrap(),
    ]);
    let ours_bytes = std::fs::read(&ours).unwrap();
    // Same length, same `_logits_`, n_ctx, n_vocab, n_chunk and the same 128 tokens.
    assert_eq!(ours_bytes.len(), theirs.len());
    let header = 20 + 4 * 32 * 4;
    assert_eq!(ours_bytes[..header], theirs[..header]);
    // The model against its own saved distributions: nothing between them but the 16-bit steps.
    let got = kl_json(&smollm2(), &ours, &[]);
    assert!(got["kld"][0].as_f64().unwrap() < 1e-4, "{got}");
    // Near-ties can round to one 16-bit step and then count as the first of them (llama.cpp
    // does the same): 1 of 60 here.
    assert!(got["same_top"][0].as_f64().unwrap() >= 0.95, "{got}");
}

#[test]
fn a_truncated_or_foreign_base_file_is_refused_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let base = llama_base(dir.path());
    let bytes = std::fs::read(&base).unwrap();
    let cut = dir.path().join("cut.kld");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    let foreign = dir.path().join("foreign.kld");
    std::fs::write(&foreign, b"GGUF and then some").unwrap();
    for (p, says) in [
        (&cut, "bytes, but a file of 4 chunks"),
        (&foreign, "`_logits_`"),
    ] {
        let out = hipscope()
            .args([
                "perplexity",
                "-m",
                smollm2().to_str().unwrap(),
                "--kl-divergence-base",
                p.to_str().unwrap(),
                "--kl-divergence",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains(p.to_str().unwrap()) && err.contains(says),
            "{err}"
        );
    }
}
