//! Issue 32 item 8: a model given by name (`hipscope llama3.2`, `generate -m org/repo`) is looked
//! up where discovery looks, in fixture stores laid out as ollama, LM Studio and the Hugging Face
//! cache lay theirs out; a name that matches nothing lists the closest names and points to F2.

mod common;
mod pty;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hipscope::gpu::quant::GgmlType;
use hipscope::model::synthetic;

/// A home with one small synthetic model reachable under several names: ollama's `llama3.2`
/// (`:latest` and `:1b`) and `qwen2.5:0.5b`, an LM Studio file and a Hugging Face snapshot.
fn fixture_home() -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let tiny = h.join("tiny.gguf");
    synthetic::write_file(
        synthetic::shape("tiny").unwrap(),
        GgmlType::Q8_0,
        1,
        &tiny,
        &mut |_, _| {},
    )
    .unwrap();
    let ollama = h.join(".ollama/models");
    std::fs::create_dir_all(ollama.join("blobs")).unwrap();
    std::fs::copy(&tiny, ollama.join("blobs/sha256-0a1b2c")).unwrap();
    for (model, tag) in [
        ("llama3.2", "latest"),
        ("llama3.2", "1b"),
        ("qwen2.5", "0.5b"),
    ] {
        let m = ollama
            .join("manifests/registry.ollama.ai/library")
            .join(model)
            .join(tag);
        std::fs::create_dir_all(m.parent().unwrap()).unwrap();
        std::fs::write(
            m,
            r#"{"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:0a1b2c"}]}"#,
        )
        .unwrap();
    }
    let lms = h.join(".lmstudio/models/pub/repo");
    std::fs::create_dir_all(&lms).unwrap();
    std::fs::copy(&tiny, lms.join("lms-tiny-Q8_0.gguf")).unwrap();
    let hf = h.join(".cache/huggingface/hub/models--org--Tiny-GGUF");
    std::fs::create_dir_all(hf.join("blobs")).unwrap();
    std::fs::create_dir_all(hf.join("snapshots/rev1")).unwrap();
    std::fs::copy(&tiny, hf.join("blobs/beef")).unwrap();
    std::os::unix::fs::symlink(
        hf.join("blobs/beef"),
        hf.join("snapshots/rev1/tiny-q8_0.gguf"),
    )
    .unwrap();
    std::fs::remove_file(tiny).unwrap();
    home
}

/// hipscope with `HOME` at the fixture and no other store named by the environment.
fn in_home(home: &Path) -> Command {
    let mut c = common::hipscope();
    c.env("HOME", home)
        .env("HIPSCOPE_HOME", home.join("hipscope"));
    for k in [
        "LLAMA_CACHE",
        "OLLAMA_MODELS",
        "HF_HUB_CACHE",
        "HF_HOME",
        "HIPSCOPE_CONFIG",
    ] {
        c.env_remove(k);
    }
    c
}

fn generate(home: &Path, name: &str) -> std::process::Output {
    in_home(home)
        .args([
            "generate",
            "--backend",
            "cpu",
            "-n",
            "2",
            "--temp",
            "0",
            "-p",
            "Hi",
            "-m",
        ])
        .arg(name)
        .output()
        .unwrap()
}

#[test]
fn names_from_every_store_resolve_to_their_files() {
    let home = fixture_home();
    let h = home.path();
    let blob = h.join(".ollama/models/blobs/sha256-0a1b2c");
    for (name, file, label) in [
        ("llama3.2", blob.clone(), "llama3.2:latest (ollama, "),
        ("llama3.2:1b", blob.clone(), "llama3.2:1b (ollama, "),
        ("qwen2.5", blob, "qwen2.5:0.5b (ollama, "),
        (
            "lms-tiny-Q8_0",
            h.join(".lmstudio/models/pub/repo/lms-tiny-Q8_0.gguf"),
            "lms-tiny-Q8_0 (LM Studio, ",
        ),
        (
            "org/Tiny-GGUF",
            h.join(".cache/huggingface/hub/models--org--Tiny-GGUF/snapshots/rev1/tiny-q8_0.gguf"),
            "org/Tiny-GGUF (Hugging Face, ",
        ),
    ] {
        let out = generate(h, name);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {err}");
        let line = format!("model: {label}{})", file.display());
        assert!(err.contains(&line), "{name}: want {line:?} in:\n{err}");
    }
}

#[test]
fn an_unknown_name_lists_the_closest_and_points_to_f2() {
    let home = fixture_home();
    for args in [&["llama3.1"][..], &["chat", "-m", "llama3.1"]] {
        let out = in_home(home.path()).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("no model file or known model named 'llama3.1'"),
            "{err}"
        );
        assert!(err.contains("the closest found: llama3.2:"), "{err}");
        assert!(err.contains("F2"), "{err}");
        assert!(!err.contains("model file not found"), "{err}");
    }
    let out = generate(home.path(), "llama3.1");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("the closest found: llama3.2:"), "{err}");
}

/// The chat in a terminal, started as an ollama user starts one: `hipscope NAME`.
#[test]
fn the_chat_opens_a_model_by_its_ollama_name() {
    let home = fixture_home();
    let h = home.path();
    // The real SmolLM2 under an ollama name, so that the chat has a model that talks.
    let blob = h.join(".ollama/models/blobs/sha256-5m0l");
    std::os::unix::fs::symlink(pty::model(), &blob).unwrap();
    let m = h.join(".ollama/models/manifests/registry.ollama.ai/library/smollm2/135m");
    std::fs::create_dir_all(m.parent().unwrap()).unwrap();
    std::fs::write(
        m,
        r#"{"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:5m0l"}]}"#,
    )
    .unwrap();
    let home_s = h.display().to_string();
    std::fs::create_dir_all(h.join("hipscope")).unwrap();
    let mut s = pty::Session::start_model_with_env(
        &h.join("hipscope"),
        &PathBuf::from("smollm2"),
        &[],
        &[("HOME", home_s.as_str())],
    );
    s.sees("Chat with", Duration::from_secs(60));
    s.type_line("Hi");
    pty::sees_tokens(&s, 1);
    s.send(b"\x04");
    assert_eq!(s.wait(Duration::from_secs(30)), 0);
}
