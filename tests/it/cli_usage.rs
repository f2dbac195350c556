//! The command line as a newcomer types it: mistyped commands, missing files and the ways of
//! giving a model and a prompt. Exit codes are asserted (2: a usage error, as clap's own) and
//! so is the absence of any file written.

use crate::common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::smollm2;

/// hipscope with a fresh, empty home of its own (no config, no conversations, no log).
fn fresh(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hipscope"));
    c.env("HIPSCOPE_HOME", home)
        .env_remove("HIPSCOPE_CONFIG")
        .current_dir(home)
        .stdin(Stdio::null());
    c
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn a_guessed_command_is_a_usage_error_that_writes_nothing() {
    // Words users of ollama, llama.cpp and nvtop type that hipscope does not have (`top` and
    // `doctor` are left out: they are becoming commands).
    for (word, suggestion) in [
        ("rm", None),
        ("list", None),
        ("pull", Some("fetch")),
        ("ps", None),
        ("version", None),
        ("benchmark", Some("bench")),
        ("generat", Some("generate")),
    ] {
        let home = tempfile::tempdir().unwrap();
        let out = fresh(home.path()).arg(word).output().unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{word}: {err}");
        assert!(err.contains(&format!("unknown command '{word}'")), "{err}");
        if let Some(s) = suggestion {
            assert!(err.contains(&format!("did you mean {s}")), "{word}: {err}");
        } else {
            // No close name: the list of commands instead.
            assert!(
                err.contains("the commands are") && err.contains("generate"),
                "{err}"
            );
        }
        assert_eq!(files_under(home.path()), Vec::<String>::new(), "{word}");
    }
}

#[test]
fn an_existing_file_named_like_a_word_is_still_a_model() {
    // `hipscope ps` where ./ps exists is that file as the model: not "unknown command".
    // It is not a GGUF file, so the chat fails, but later (without a terminal, at the terminal).
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("ps"), b"not a model").unwrap();
    let out = fresh(home.path()).arg("ps").output().unwrap();
    assert!(
        !text(&out.stderr).contains("unknown command"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_missing_model_file_is_refused_before_anything_is_written() {
    for args in [
        &["missing.gguf"][..],
        &["-m", "missing.gguf"],
        &["chat", "--model", "dir/missing.gguf"],
    ] {
        let home = tempfile::tempdir().unwrap();
        let out = fresh(home.path()).args(args).output().unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("model file not found"), "{err}");
        assert_eq!(files_under(home.path()), Vec::<String>::new(), "{args:?}");
    }
}

#[test]
fn the_chat_takes_the_model_as_an_argument_or_with_dash_m_not_both() {
    let home = tempfile::tempdir().unwrap();
    let out = fresh(home.path())
        .args(["a.gguf", "-m", "b.gguf"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("cannot be used with"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn tokenize_falls_back_to_the_configured_model() {
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("config.toml");
    std::fs::write(
        &config,
        format!("model = {:?}\n", smollm2().to_str().unwrap()),
    )
    .unwrap();
    let with_m = fresh(home.path())
        .args([
            "tokenize",
            "--ids",
            "-m",
            smollm2().to_str().unwrap(),
            "Hello",
        ])
        .output()
        .unwrap();
    let without = fresh(home.path())
        .env("HIPSCOPE_CONFIG", &config)
        .args(["tokenize", "--ids", "Hello"])
        .output()
        .unwrap();
    assert!(with_m.status.success(), "{}", text(&with_m.stderr));
    assert!(without.status.success(), "{}", text(&without.stderr));
    assert_eq!(text(&without.stdout).trim(), "[19556]");
    assert_eq!(with_m.stdout, without.stdout);
}

fn generate(home: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let model = smollm2();
    let mut c = fresh(home);
    c.args([
        "generate",
        "-m",
        model.to_str().unwrap(),
        "-n",
        "6",
        "--temp",
        "0",
    ])
    .args(args)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if stdin.is_some() {
        c.stdin(Stdio::piped());
    }
    let mut child = c.spawn().unwrap();
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    out
}

#[test]
fn generate_reads_its_prompt_from_a_file_or_stdin_as_llama_cli() {
    let home = tempfile::tempdir().unwrap();
    let prompt = "The capital of France is";
    std::fs::write(home.path().join("prompt.txt"), prompt).unwrap();
    let given = generate(home.path(), &["-p", prompt], None).stdout;
    assert!(text(&given).starts_with(prompt), "{}", text(&given));
    assert!(text(&given).len() > prompt.len() + 1, "nothing generated");
    let file = generate(home.path(), &["-f", "prompt.txt"], None).stdout;
    let dash = generate(home.path(), &["-p", "-"], Some(prompt)).stdout;
    let piped = generate(home.path(), &[], Some(prompt)).stdout;
    assert_eq!(text(&file), text(&given));
    assert_eq!(text(&dash), text(&given));
    assert_eq!(text(&piped), text(&given));
}

#[test]
fn generate_with_an_unreadable_prompt_file_says_which() {
    let home = tempfile::tempdir().unwrap();
    let out = fresh(home.path())
        .args(["generate", "-f", "no-such-prompt.txt"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("reading the prompt from no-such-prompt.txt"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn an_explicit_gpu_backend_that_cannot_start_is_refused_before_the_terminal() {
    // This machine has no GPU (the tests run on CPU-only machines): HIP and CUDA cannot start.
    for (backend, reason) in [("cuda", "CUDA"), ("hip", "HIP")] {
        let home = tempfile::tempdir().unwrap();
        let out = fresh(home.path())
            .args(["--backend", backend])
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{backend}: {err}");
        assert!(
            err.contains(&format!("the {backend} backend cannot start")) && err.contains(reason),
            "{err}"
        );
        assert!(!err.contains("terminal"), "{err}");
        assert_no_chat_files(home.path());
    }
    // `auto` falls back to the CPU and goes on to the next check, the terminal, which a test's
    // piped stdout is not: that refusal (also exit 2) names the terminal, not a backend. The
    // backend is checked first because its reason is the one a user must act on even with a
    // terminal; the terminal check stays for every backend that can start.
    let home = tempfile::tempdir().unwrap();
    let out = fresh(home.path())
        .args(["--backend", "auto"])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("the chat needs a terminal on stdout"), "{err}");
    assert!(!err.contains("backend cannot start"), "{err}");
    assert_no_chat_files(home.path());
}

/// A chat refused before it started leaves no conversation and no log behind.
fn assert_no_chat_files(home: &Path) {
    let files = files_under(home);
    assert!(
        !files
            .iter()
            .any(|f| f.contains("conversations") || f.ends_with(".log")),
        "{files:?}"
    );
}

#[test]
fn convert_refuses_to_requantize_without_allow_requantize() {
    let home = tempfile::tempdir().unwrap();
    let q4 = home.path().join("tiny-q4.gguf");
    let f16 = home.path().join("tiny-f16.gguf");
    for (path, quant) in [(&q4, "Q4_0"), (&f16, "F16")] {
        let out = fresh(home.path())
            .args(["synth", "tiny", "--quant", quant, "-o"])
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let out_path = home.path().join("tiny-q8.gguf");
    let convert = |input: &Path, extra: &[&str]| {
        fresh(home.path())
            .arg("convert")
            .arg(input)
            .args(["--type", "Q8_0", "-o"])
            .arg(&out_path)
            .args(extra)
            .output()
            .unwrap()
    };
    let out = convert(&q4, &[]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("already quantized (Q4_0)")
            && err.contains("loses quality")
            && err.contains("--allow-requantize"),
        "{err}"
    );
    assert!(!out_path.exists(), "nothing is written when refused");
    let out = convert(&q4, &["--allow-requantize"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(out_path.exists());
    std::fs::remove_file(&out_path).unwrap();
    // From a float original: no flag needed.
    let out = convert(&f16, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn the_kernel_list_is_aligned() {
    let home = tempfile::tempdir().unwrap();
    let out = fresh(home.path()).arg("kernels").output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listing = text(&out.stdout);
    let lines: Vec<&str> = listing.lines().collect();
    assert!(lines.len() > 2, "{listing}");
    // Every list starts in the same column: after the name and at least two spaces.
    let starts: Vec<usize> = lines
        .iter()
        .map(|l| {
            let name = l.split(' ').next().unwrap().len();
            name + l[name..].len() - l[name..].trim_start().len()
        })
        .collect();
    assert!(starts.iter().all(|&s| s == starts[0]), "{listing}");
}

/// Issue 18 item 7: the seed is "random" (or -1) as a word on the command line too; anything
/// else is a usage error that says what is allowed.
#[test]
fn item7_generate_takes_a_random_seed_by_name() {
    let home = tempfile::tempdir().unwrap();
    for seed in ["random", "-1", "42"] {
        let out = fresh(home.path())
            .args([
                "generate",
                "--synthetic",
                "tiny",
                "--quant",
                "Q8_0",
                "--backend",
                "cpu",
                "-p",
                "hi",
                "-n",
                "2",
                "-s",
                seed,
            ])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "-s {seed}: {}",
            text(&out.stderr)
        );
    }
    let out = fresh(home.path())
        .args([
            "generate",
            "--synthetic",
            "tiny",
            "-p",
            "hi",
            "-s",
            "sometimes",
        ])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("random"), "{err}");
}

/// Issue 18 item 4: an empty prompt is refused (exit 2) before a model is loaded, naming where
/// it came from.
#[test]
fn item4_an_empty_prompt_says_where_it_came_from() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("empty.txt"), "  \n").unwrap();
    let out = fresh(home.path())
        .args(["generate", "--synthetic", "tiny", "-f", "empty.txt"])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("the prompt file empty.txt is empty"), "{err}");
    assert!(out.stdout.is_empty());
    let out = fresh(home.path())
        .args(["generate", "--synthetic", "tiny", "-p", "-"])
        .stdin(std::fs::File::open(home.path().join("empty.txt")).unwrap())
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("the prompt on stdin is empty"), "{err}");
}
