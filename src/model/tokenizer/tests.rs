//! Unit tests on small synthetic vocabularies, written as GGUF files in memory. The expected ids
//! are worked out by hand from the algorithms' definitions (SentencePiece: merge the
//! highest-scoring adjacent pair; BPE: merge the lowest-ranked pair); the comments show the work.

use std::path::Path;

use super::unicode::BYTE_TO_CHAR;
use super::*;
use crate::model::gguf::{Array, GgufFile, GgufWriter, Value, ValueType, string_array};

fn file(meta: Vec<(&str, Value)>) -> GgufFile {
    let meta: Vec<(String, Value)> = meta.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let bytes = GgufWriter::new(Vec::new(), &meta, &[])
        .and_then(|w| w.finish())
        .expect("writing an in-memory GGUF");
    GgufFile::from_bytes(Path::new("synthetic.gguf"), bytes).expect("reading it back")
}

fn f32s(v: &[f32]) -> Value {
    Value::Array(Array {
        ty: ValueType::F32,
        items: v.iter().map(|&x| Value::F32(x)).collect(),
    })
}

fn i32s(v: &[i32]) -> Value {
    Value::Array(Array {
        ty: ValueType::I32,
        items: v.iter().map(|&x| Value::I32(x)).collect(),
    })
}

const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER: i32 = 4;
const BYTE: i32 = 6;

/// A SentencePiece vocabulary: `<unk>`, `<s>`, `</s>`, the 256 byte tokens (ids 3..=258, byte
/// `b` is `3 + b`), then the pieces below.
fn spm_vocab(extra: &[(&str, f32, i32)], with_bytes: bool) -> Vec<(String, f32, i32)> {
    let mut v = vec![
        ("<unk>".to_string(), 0.0, UNKNOWN),
        ("<s>".to_string(), 0.0, CONTROL),
        ("</s>".to_string(), 0.0, CONTROL),
    ];
    for b in 0..=255u8 {
        let text = if with_bytes {
            format!("<0x{b:02X}>")
        } else {
            format!("[unused byte {b}]")
        };
        v.push((text, 0.0, if with_bytes { BYTE } else { NORMAL }));
    }
    let pieces: [(&str, f32, i32); 15] = [
        ("▁", -1.0, NORMAL),            // 259
        ("h", -2.0, NORMAL),            // 260
        ("e", -2.0, NORMAL),            // 261
        ("l", -2.0, NORMAL),            // 262
        ("o", -2.0, NORMAL),            // 263
        ("▁h", -1.5, NORMAL),           // 264
        ("he", -1.0, NORMAL),           // 265
        ("ll", -0.5, NORMAL),           // 266
        ("▁he", -0.8, NORMAL),          // 267
        ("llo", -0.7, NORMAL),          // 268
        ("▁hello", -0.2, NORMAL),       // 269
        ("<|user|>", 0.0, USER),        // 270
        ("<|im_start|>", 0.0, CONTROL), // 271
        ("[x]", 0.0, USER),             // 272
        ("[x][y]", 0.0, USER),          // 273
    ];
    v.extend(pieces.iter().map(|&(t, s, k)| (t.to_string(), s, k)));
    v.extend(extra.iter().map(|&(t, s, k)| (t.to_string(), s, k)));
    v
}

fn spm(extra_meta: Vec<(&str, Value)>, vocab: &[(String, f32, i32)]) -> Tokenizer {
    let texts: Vec<&str> = vocab.iter().map(|t| t.0.as_str()).collect();
    let scores: Vec<f32> = vocab.iter().map(|t| t.1).collect();
    let types: Vec<i32> = vocab.iter().map(|t| t.2).collect();
    let mut meta = vec![
        ("tokenizer.ggml.model", Value::from("llama")),
        ("tokenizer.ggml.tokens", string_array(&texts)),
        ("tokenizer.ggml.scores", f32s(&scores)),
        ("tokenizer.ggml.token_type", i32s(&types)),
    ];
    meta.extend(extra_meta);
    Tokenizer::from_gguf(&file(meta)).expect("a valid vocabulary")
}

fn byte(b: u8) -> u32 {
    3 + b as u32
}

#[test]
fn spm_merges_highest_score_first() {
    let tok = spm(vec![], &spm_vocab(&[], true));
    // "▁hell": ll (-0.5) → he (-1) → ▁he (-0.8); "▁hell" is no token: [▁he, ll].
    assert_eq!(tok.encode("hell", false, false), [267, 266]);
    // "▁hello": ll → llo (-0.7) → he → ▁he → ▁hello (-0.2).
    assert_eq!(tok.encode("hello", false, false), [269]);
    // Each text fragment starts with the SentencePiece space.
    assert_eq!(tok.encode("hell hello", false, false), [267, 266, 269]);
}

#[test]
fn spm_without_space_prefix() {
    let tok = spm(
        vec![("tokenizer.ggml.add_space_prefix", Value::Bool(false))],
        &spm_vocab(&[], true),
    );
    assert_eq!(tok.encode("hell", false, false), [265, 266]);
}

#[test]
fn spm_byte_fallback_and_unknown() {
    let tok = spm(vec![], &spm_vocab(&[], true));
    // "▁hé": ▁h, then é (C3 A9) is no token: its bytes.
    assert_eq!(
        tok.encode("hé", false, false),
        [264, byte(0xC3), byte(0xA9)]
    );
    assert_eq!(tok.decode(&[264, byte(0xC3), byte(0xA9)], false), "hé");
    assert_eq!(tok.kind(byte(0xC3)), TokenKind::Byte);
    assert_eq!(tok.piece(byte(0xC3), false), [0xC3]);
    // Without byte tokens an unknown character is the unknown token, once.
    let tok = spm(vec![], &spm_vocab(&[], false));
    assert_eq!(tok.encode("hé", false, false), [264, 0]);
    assert_eq!(tok.kind(0), TokenKind::Unknown);
    // The unknown token prints only with `special`.
    assert_eq!(tok.decode(&[264, 0], false), "h");
    assert_eq!(tok.decode(&[264, 0], true), "h<unk>");
}

#[test]
fn bos_and_eos_follow_the_model() {
    // SentencePiece adds BOS by default.
    let tok = spm(vec![], &spm_vocab(&[], true));
    assert_eq!(tok.encode("hell", true, false), [1, 267, 266]);
    assert_eq!(tok.encode("", true, false), [1]);
    assert_eq!(tok.encode("", false, false), Vec::<u32>::new());
    assert_eq!((tok.bos(), tok.eos()), (Some(1), Some(2)));
    let tok = spm(
        vec![
            ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
            ("tokenizer.ggml.add_eos_token", Value::Bool(true)),
        ],
        &spm_vocab(&[], true),
    );
    assert_eq!(tok.encode("hell", true, false), [267, 266, 2]);
    // BOS/EOS given by key.
    let tok = spm(
        vec![
            ("tokenizer.ggml.bos_token_id", Value::U32(271)),
            ("tokenizer.ggml.eos_token_id", Value::U32(270)),
        ],
        &spm_vocab(&[], true),
    );
    assert_eq!((tok.bos(), tok.eos()), (Some(271), Some(270)));
    // An id outside the vocabulary is ignored, leaving the default.
    let tok = spm(
        vec![("tokenizer.ggml.bos_token_id", Value::U32(100_000))],
        &spm_vocab(&[], true),
    );
    assert_eq!(tok.bos(), Some(1));
}

#[test]
fn special_tokens_are_parsed_on_request() {
    let tok = spm(vec![], &spm_vocab(&[], true));
    // Control token: a token with parse_special, text without. Text after a special token gets
    // the SentencePiece space again.
    assert_eq!(tok.encode("<|im_start|>hell", false, true), [271, 267, 266]);
    let mut plain = vec![259];
    plain.extend("<|im_start|>".bytes().map(byte));
    plain.extend([265, 266]);
    assert_eq!(tok.encode("<|im_start|>hell", false, false), plain);
    // User-defined tokens are always matched.
    assert_eq!(tok.encode("<|user|>hell", false, false), [270, 267, 266]);
    assert_eq!(tok.encode("hell<|user|>", false, false), [267, 266, 270]);
    // Longest first: "[x][y]" before "[x]".
    assert_eq!(tok.encode("[x][y][x]", false, false), [273, 272]);
    // Control tokens print only with `special`; user-defined ones always.
    assert_eq!(tok.decode(&[271, 270], false), "<|user|>");
    assert_eq!(tok.decode(&[271, 270], true), "<|im_start|><|user|>");
    assert_eq!(tok.kind(271), TokenKind::Control);
    assert_eq!(tok.kind(270), TokenKind::UserDefined);
    assert_eq!(tok.kind(259), TokenKind::Normal);
    assert_eq!(tok.token_id("<|user|>"), Some(270));
    assert_eq!(tok.token_text(264), "▁h");
    assert_eq!(tok.token_text(1_000_000), "");
}

#[test]
fn phi3_strips_whitespace_after_special_tokens() {
    // llama.cpp gives Phi-3's special tokens the rstrip attribute (by model name), except
    // <unk>, <s> and <|endoftext|>.
    let vocab = spm_vocab(&[], true);
    let tok = spm(vec![("general.name", Value::from("Phi3"))], &vocab);
    assert_eq!(
        tok.encode("<|user|>  \n hell", false, false),
        [270, 267, 266]
    );
    let other = spm(vec![("general.name", Value::from("Other"))], &vocab);
    assert_ne!(
        other.encode("<|user|>  \n hell", false, false),
        [270, 267, 266]
    );
}

#[test]
fn spm_decode_drops_the_prefix_space_of_the_first_token_only() {
    let tok = spm(vec![], &spm_vocab(&[], true));
    assert_eq!(tok.decode(&[267, 266, 269], false), "hell hello");
    // As llama.cpp: with BOS first, the space after it stays (BOS was "the first token").
    assert_eq!(tok.decode(&[1, 267, 266], false), " hell");
}

#[test]
fn end_of_generation_set() {
    let extra = [
        ("<|im_end|>", 0.0, NORMAL),
        ("<|end|>", 0.0, CONTROL),
        ("<|return|>", 0.0, CONTROL),
        ("<|call|>", 0.0, CONTROL),
        ("<unused7>", 0.0, CONTROL),
        ("<|fim_pad|>", 0.0, CONTROL),
    ];
    let vocab = spm_vocab(&extra, true);
    let id = |t: &str| vocab.iter().position(|v| v.0 == t).unwrap() as u32;
    let tok = spm(vec![], &vocab);
    // EOS, the listed end tokens (a normal-typed one becomes control), FIM padding; "<|end|>"
    // is not an end when "<|return|>" and "<|call|>" exist (gpt-oss).
    let mut want = [
        2,
        id("<|im_end|>"),
        id("<|return|>"),
        id("<|call|>"),
        id("<|fim_pad|>"),
    ];
    want.sort();
    assert_eq!(tok.eog_tokens(), &want[..]);
    assert!(tok.is_eog(2) && !tok.is_eog(id("<|end|>")) && !tok.is_eog(1));
    assert_eq!(tok.kind(id("<|im_end|>")), TokenKind::Control);
    assert_eq!(tok.kind(id("<|end|>")), TokenKind::UserDefined);
    assert_eq!(tok.kind(id("<unused7>")), TokenKind::Unused);
    assert_eq!(tok.eot(), Some(id("<|im_end|>")));
    // Without "<|call|>", "<|end|>" ends generations too.
    let vocab = spm_vocab(&extra[..3], true);
    let tok = spm(vec![], &vocab);
    assert!(tok.is_eog(vocab.iter().position(|v| v.0 == "<|end|>").unwrap() as u32));
    // An EOT named by the file wins over the text rules.
    let tok = spm(
        vec![("tokenizer.ggml.eot_token_id", Value::U32(270))],
        &spm_vocab(&extra, true),
    );
    assert_eq!(tok.eot(), Some(270));
    assert!(tok.is_eog(270));
}

#[test]
fn stream_decoder_holds_back_split_characters() {
    let tok = spm(vec![], &spm_vocab(&[], true));
    let ids = tok.encode("😀", false, false);
    // "▁" then the four bytes of U+1F600.
    assert_eq!(ids, [259, byte(0xF0), byte(0x9F), byte(0x98), byte(0x80)]);
    let mut dec = StreamDecoder::new();
    let chunks: Vec<String> = ids.iter().map(|&id| dec.push(&tok, id, false)).collect();
    assert_eq!(chunks, [" ", "", "", "", "😀"]);
    assert_eq!(dec.finish(), "");
    // A byte that can never start a character is replaced at once; a lead byte followed by
    // something that is not a continuation too.
    let mut dec = StreamDecoder::new();
    assert_eq!(dec.push(&tok, byte(0xFF), false), "\u{FFFD}");
    assert_eq!(dec.push(&tok, byte(0xF0), false), "");
    assert_eq!(dec.push(&tok, 260, false), "\u{FFFD}h");
    // A character cut off by the end of the stream.
    assert_eq!(dec.push(&tok, byte(0xE4), false), "");
    assert_eq!(dec.finish(), "\u{FFFD}");
    assert_eq!(dec.pending(), 0);
}

/// A byte-level BPE vocabulary: the 256 byte characters (id = byte), then merges.
fn bpe(
    merges: &[&str],
    extra: &[(&str, i32)],
    meta: Vec<(&str, Value)>,
) -> (Tokenizer, Vec<String>) {
    let mut texts: Vec<String> = BYTE_TO_CHAR.iter().map(|c| c.to_string()).collect();
    for m in merges {
        let joined = m.replace(' ', "");
        if !texts.contains(&joined) {
            texts.push(joined);
        }
    }
    let mut types = vec![NORMAL; texts.len()];
    for &(t, k) in extra {
        texts.push(t.to_string());
        types.push(k);
    }
    let mut all = vec![
        ("tokenizer.ggml.model", Value::from("gpt2")),
        ("tokenizer.ggml.pre", Value::from("gpt-2")),
        ("tokenizer.ggml.tokens", string_array(&texts)),
        ("tokenizer.ggml.token_type", i32s(&types)),
        ("tokenizer.ggml.merges", string_array(merges)),
    ];
    // Keys given by the caller replace the defaults.
    all.retain(|(k, _)| !meta.iter().any(|(m, _)| m == k));
    all.extend(meta);
    (
        Tokenizer::from_gguf(&file(all)).expect("a valid vocabulary"),
        texts,
    )
}

#[test]
fn bpe_merges_lowest_rank_first() {
    let (tok, texts) = bpe(&["Ġ t", "h e", "Ġt he", "a b", "b c"], &[], vec![]);
    let id = |t: &str| texts.iter().position(|x| x == t).unwrap() as u32;
    // " the" = Ġ t h e: Ġt (rank 0), he (1), then Ġt+he (2).
    assert_eq!(tok.encode(" the", false, false), [id("Ġthe")]);
    // "abc": ab (rank 3) beats bc (rank 4), leaving c alone.
    assert_eq!(tok.encode("abc", false, false), [id("ab"), b'c' as u32]);
    // The GPT-2 split keeps " the" and "abc" apart: " theabc" is one word, though.
    assert_eq!(
        tok.encode("abc the", false, false),
        [id("ab"), b'c' as u32, id("Ġthe")]
    );
    // Byte-level: any byte is a token, decoding gives the bytes back.
    let ids = tok.encode("é\n", false, false);
    assert_eq!(ids, [0xC3, 0xA9, b'\n' as u32]);
    assert_eq!(tok.decode(&ids, false), "é\n");
    assert_eq!(tok.piece(id("Ġthe"), false), b" the");
    assert_eq!(tok.token_text(id("Ġthe")), "Ġthe");
}

#[test]
fn bpe_rank_order_decides_between_overlapping_merges() {
    let (tok, texts) = bpe(&["b c", "a b"], &[], vec![]);
    let id = |t: &str| texts.iter().position(|x| x == t).unwrap() as u32;
    assert_eq!(tok.encode("abc", false, false), [b'a' as u32, id("bc")]);
}

#[test]
fn bpe_special_tokens_and_defaults() {
    let (tok, texts) = bpe(&["h i"], &[("<|endoftext|>", CONTROL)], vec![]);
    let eot = texts.iter().position(|x| x == "<|endoftext|>").unwrap() as u32;
    assert_eq!(
        tok.encode("<|endoftext|>hi", false, true),
        [eot, texts.len() as u32 - 2]
    );
    assert!(tok.is_eog(eot));
    // GPT-2 BPE adds no BOS by default.
    assert!(!tok.add_bos());
    assert_eq!(tok.encode("hi", true, false), [texts.len() as u32 - 2]);
}

#[test]
fn clean_up_spaces_as_llama_cpp() {
    let clean = |s: &str| {
        let mut v = s.as_bytes().to_vec();
        clean_up_spaces(&mut v);
        String::from_utf8(v).unwrap()
    };
    assert_eq!(
        clean("Hello , world ! Is it ok ? Yes ."),
        "Hello, world! Is it ok? Yes."
    );
    assert_eq!(clean("it ' s"), "it's");
    assert_eq!(
        clean("I 'm sure we 're fine , they 've said"),
        "I'm sure we're fine, they've said"
    );
    // Kept: " 't", " 'd", " 'll" (llama.cpp leaves them; HF's rule removes " n't" instead).
    assert_eq!(clean("don 't you 'd we 'll"), "don 't you 'd we 'll");
    assert_eq!(clean(""), "");
    assert_eq!(clean(" ,"), ",");
}

#[test]
fn malformed_vocabularies_give_errors_naming_key_and_file() {
    let err = |meta: Vec<(&str, Value)>| match Tokenizer::from_gguf(&file(meta)) {
        Ok(_) => panic!("accepted"),
        Err(e) => e,
    };
    let tokens = ("tokenizer.ggml.tokens", string_array(&["a", "b"]));

    let e = err(vec![tokens.clone()]);
    assert!(matches!(&e, TokenizerError::MissingKey { key, .. } if key == "tokenizer.ggml.model"));
    assert!(e.to_string().contains("synthetic.gguf"), "{e}");

    let e = err(vec![("tokenizer.ggml.model", Value::from("llama"))]);
    assert!(matches!(&e, TokenizerError::MissingKey { key, .. } if key == "tokenizer.ggml.tokens"));

    let e = err(vec![
        ("tokenizer.ggml.model", Value::from("llama")),
        ("tokenizer.ggml.tokens", Value::U32(3)),
    ]);
    assert!(matches!(&e, TokenizerError::BadKey { key, .. } if key == "tokenizer.ggml.tokens"));

    let e = err(vec![
        ("tokenizer.ggml.model", Value::from("llama")),
        tokens.clone(),
        ("tokenizer.ggml.scores", f32s(&[0.0])),
    ]);
    assert!(e.to_string().contains("has 1 entries for 2 tokens"), "{e}");

    let e = err(vec![
        ("tokenizer.ggml.model", Value::from("llama")),
        tokens.clone(),
        ("tokenizer.ggml.add_bos_token", Value::U32(1)),
    ]);
    assert!(
        matches!(&e, TokenizerError::BadKey { key, .. } if key == "tokenizer.ggml.add_bos_token")
    );

    let e = err(vec![
        ("tokenizer.ggml.model", Value::from("t5")),
        tokens.clone(),
    ]);
    assert!(matches!(&e, TokenizerError::UnsupportedModel { model, .. } if model == "t5"));

    let e = err(vec![
        ("tokenizer.ggml.model", Value::from("gpt2")),
        ("tokenizer.ggml.pre", Value::from("kimi-k2")),
        tokens.clone(),
    ]);
    assert!(matches!(&e, TokenizerError::UnsupportedPre { pre, .. } if pre == "kimi-k2"));

    let e = err(vec![
        ("tokenizer.ggml.model", Value::from("gpt2")),
        tokens.clone(),
    ]);
    assert!(matches!(&e, TokenizerError::MissingKey { key, .. } if key == "tokenizer.ggml.merges"));

    let e = err(vec![
        ("tokenizer.ggml.model", Value::from("llama")),
        ("tokenizer.ggml.tokens", string_array::<&str>(&[])),
    ]);
    assert!(matches!(&e, TokenizerError::BadKey { key, .. } if key == "tokenizer.ggml.tokens"));
}

#[test]
fn odd_vocabularies_do_not_panic() {
    // Empty token texts, duplicate texts, unknown type codes, a merge without a space, merges of
    // strings that are not tokens.
    let meta = vec![
        ("tokenizer.ggml.model", Value::from("gpt2")),
        ("tokenizer.ggml.pre", Value::from("llama-bpe")),
        (
            "tokenizer.ggml.tokens",
            string_array(&["a", "", "a", "b", "ab"]),
        ),
        ("tokenizer.ggml.token_type", i32s(&[1, 1, 1, 99, 1])),
        (
            "tokenizer.ggml.merges",
            string_array(&["nospace", "a b", "x y", "ab c"]),
        ),
    ];
    let tok = Tokenizer::from_gguf(&file(meta)).expect("accepted");
    assert_eq!(tok.token_text(1), "[EMPTY_1]");
    // A duplicate text maps to its last id.
    assert_eq!(tok.token_id("a"), Some(2));
    assert_eq!(tok.kind(3), TokenKind::Unused);
    assert_eq!(tok.encode("ab", false, false), [4]);
    // Characters with no token are dropped, as llama.cpp does.
    assert_eq!(tok.encode("abzc", false, false), [4]);
    assert_eq!(tok.decode(&[4, 3, 99], false), "ab");
}

mod properties {
    use proptest::prelude::*;

    use super::super::pretok::{PreTokenizer, pre_config};
    use super::*;

    /// Text mixing ASCII, accents, CJK, emoji, combining marks, odd whitespace and digits.
    fn text() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                "[a-zA-Z0-9 .,'!?]{1,6}",
                Just("é".to_string()),
                Just("中文".to_string()),
                Just("👋🏽".to_string()),
                Just("e\u{301}".to_string()),
                Just("\u{3000}".to_string()),
                Just("\r\n".to_string()),
                Just("\t  ".to_string()),
                Just("٣٤".to_string()),
                Just("'S".to_string()),
                Just("<|endoftext|>".to_string()),
                any::<char>().prop_map(|c| c.to_string()),
            ],
            0..24,
        )
        .prop_map(|v| v.concat())
    }

    proptest! {
        #[test]
        fn byte_level_bpe_round_trips(s in text()) {
            // "smollm" does not clean up spaces, so decoding must give the text back exactly;
            // the stream decoder must agree piece by piece.
            let (tok, _) = bpe(
                &["Ġ t", "h e", "Ġt he", "a b", "à ¤"],
                &[("<|endoftext|>", CONTROL)],
                vec![("tokenizer.ggml.pre", Value::from("smollm"))],
            );
            for parse_special in [false, true] {
                let ids = tok.encode(&s, false, parse_special);
                prop_assert_eq!(tok.decode(&ids, parse_special), s.clone());
                let mut dec = StreamDecoder::new();
                let mut streamed: String =
                    ids.iter().map(|&id| dec.push(&tok, id, parse_special)).collect();
                streamed.push_str(&dec.finish());
                prop_assert_eq!(streamed, s.clone());
            }
        }

        #[test]
        fn every_pre_tokenizer_covers_the_text(s in text()) {
            for name in ["default", "llama3", "qwen2", "qwen35", "smollm", "gpt-2",
                         "deepseek-llm", "deepseek-v3", "deepseek-coder", "falcon", "tekken",
                         "gpt-4o", "chameleon", "superbpe", "bloom", "exaone-moe", "gemma4"] {
                let cfg = pre_config(name).expect(name);
                let pre = PreTokenizer::new(cfg.patterns).expect(name);
                let words = pre.split(&s);
                let mut at = 0;
                for w in &words {
                    prop_assert_eq!(w.start, at, "{}: gap or overlap", name);
                    prop_assert!(w.end > w.start, "{}: empty word", name);
                    at = w.end;
                }
                prop_assert_eq!(at, s.len(), "{}: text not covered", name);
            }
        }

        #[test]
        fn spm_round_trips(s in text()) {
            let tok = spm(vec![], &spm_vocab(&[], true));
            let ids = tok.encode(&s, false, false);
            // Without BOS the prefixed space is dropped again; SPM spaces come back as spaces.
            prop_assert_eq!(tok.decode(&ids, false), s.clone());
        }
    }
}
