//! Chat templates against references:
//! - the template cases of llama.cpp's `tests/test-chat-template.cpp` (35 real templates of
//!   many families, each with the prompt llama.cpp's Jinja engine must produce for its fixed
//!   six-message conversation), recorded in `tests/data/tokenizer/chat_templates.json`;
//! - real templates shipped in llama.cpp's `models/templates/` (Llama 3.x, Qwen 2.5/3, Mistral
//!   Nemo, Gemma 2, Phi-3.5, SmolLM3, DeepSeek-R1, Granite), read from `HIPSCOPE_LLAMA_CPP_SRC`,
//!   against what Python's jinja2 renders with Hugging Face's settings; likewise real templates
//!   that tree lacks, kept in `tests/data/tokenizer/templates/` (Phi-4-mini, Gemma 3; sources
//!   and licences in its SOURCES.md); each with the six-message conversation and five more (no
//!   system message, a system message with one user message, a finished conversation with
//!   padded texts, and two whose roles do not alternate, which Gemma's and Mistral's templates
//!   refuse with `raise_exception`: hipscope must fail with that message and the template line);
//! - the SmolLM2 model's own template, rendered and tokenized, against llama.cpp's tokens.
//!
//! All made by `scripts/gen_tokenizer_ref.py templates`.

use crate::common;
use std::path::PathBuf;

use hipscope::model::gguf::GgufFile;
use hipscope::model::template::{ChatTemplate, Message, TemplateError};
use hipscope::model::tokenizer::Tokenizer;
use serde::Deserialize;
use sha2::{Digest, Sha256};

#[derive(Deserialize)]
struct Reference {
    now_unix: i64,
    inline_cases: Vec<InlineCase>,
    real_templates: Vec<RealTemplate>,
}

#[derive(Deserialize)]
struct Msg {
    role: String,
    content: String,
}

#[derive(Deserialize)]
struct InlineCase {
    name: String,
    template: String,
    bos_token: String,
    eos_token: String,
    messages: Vec<Msg>,
    expected: String,
}

#[derive(Deserialize)]
struct RealTemplate {
    name: String,
    file: String,
    sha256: String,
    bos_token: String,
    eos_token: String,
    messages: Vec<Msg>,
    system_merged: bool,
    expected: String,
    more: Vec<MoreConversation>,
}

/// Another conversation rendered with a real template: what jinja2 printed, or the message of the
/// `raise_exception` with which the template refused it.
#[derive(Deserialize)]
struct MoreConversation {
    what: String,
    messages: Vec<Msg>,
    add_generation_prompt: bool,
    expected: Option<String>,
    raises: Option<String>,
}

fn reference() -> Reference {
    common::read_json("tests/data/tokenizer/chat_templates.json")
}

fn messages(m: &[Msg]) -> Vec<Message> {
    m.iter()
        .map(|m| Message::new(&m.role, &m.content))
        .collect()
}

fn env_path(var: &str, what: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(p) => PathBuf::from(p),
        None => panic!("{var} is not set: it must name {what}"),
    }
}

#[test]
fn llama_cpp_test_chat_template_cases() {
    let r = reference();
    assert!(r.inline_cases.len() >= 30);
    let mut failures = Vec::new();
    for c in &r.inline_cases {
        // test-chat-template.cpp renders with no model, so nothing is stripped (add_bos false).
        let t = ChatTemplate::from_source(
            c.name.clone(),
            c.template.clone(),
            c.bos_token.clone(),
            c.eos_token.clone(),
            false,
            false,
        );
        let got = t.and_then(|t| t.render_at(&messages(&c.messages), true, r.now_unix));
        note_difference(&mut failures, &c.name, &c.expected, got);
    }
    assert!(
        failures.is_empty(),
        "{} of {} differ:\n{}",
        failures.len(),
        r.inline_cases.len(),
        failures.join("\n")
    );
}

/// Adds a line to `failures` when a rendering is not what the reference expects.
fn note_difference<E: std::fmt::Display>(
    failures: &mut Vec<String>,
    name: &str,
    expected: &str,
    got: Result<String, E>,
) {
    match got {
        Ok(s) if s == expected => {}
        Ok(s) => failures.push(format!("{name}:\n  want {expected:?}\n  got  {s:?}")),
        Err(e) => failures.push(format!("{name}: {e}")),
    }
}

#[test]
fn real_templates_from_llama_cpp_tree() {
    let src = env_path(
        "HIPSCOPE_LLAMA_CPP_SRC",
        "llama.cpp's source tree (models/templates/*.jinja); see tests/it/tokenizer_conformance.rs",
    );
    let r = reference();
    assert!(r.real_templates.len() >= 10);
    let mut failures = Vec::new();
    for c in &r.real_templates {
        let path = if c.file.starts_with("tests/") {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(&c.file)
        } else {
            src.join(&c.file)
        };
        let source =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let digest: String = Sha256::digest(source.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            digest,
            c.sha256,
            "{} differs from the one the reference was made from",
            path.display()
        );
        let t = ChatTemplate::from_source(
            path.display().to_string(),
            source,
            c.bos_token.clone(),
            c.eos_token.clone(),
            false,
            false,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            !t.supports_system_role(),
            c.system_merged,
            "{}: system-role detection",
            c.name
        );
        let got = t.render_at(&messages(&c.messages), true, r.now_unix);
        note_difference(&mut failures, &c.name, &c.expected, got);
        for m in &c.more {
            let name = format!("{} ({})", c.name, m.what);
            let got = t.render_at(&messages(&m.messages), m.add_generation_prompt, r.now_unix);
            match (&m.expected, &m.raises) {
                (Some(want), None) => note_difference(&mut failures, &name, want, got),
                (None, Some(why)) => note_refusal(&mut failures, &name, &path, why, got),
                _ => panic!("{name}: the reference has neither `expected` nor `raises`"),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} real templates' renderings differ:\n{}",
        failures.len(),
        r.real_templates
            .iter()
            .map(|c| 1 + c.more.len())
            .sum::<usize>(),
        failures.join("\n")
    );
}

/// Adds a line to `failures` unless the rendering failed as jinja2's did: with the template's
/// own `raise_exception` message, naming the template and the line that raised it.
fn note_refusal(
    failures: &mut Vec<String>,
    name: &str,
    path: &std::path::Path,
    why: &str,
    got: Result<String, TemplateError>,
) {
    match got {
        Ok(s) => failures.push(format!("{name}: rendered {s:?}, jinja2 raised {why:?}")),
        Err(e @ TemplateError::Render { line: Some(_), .. }) => {
            let text = e.to_string();
            let origin = path.display().to_string();
            if !text.contains(why)
                || !text.starts_with(&origin)
                || !text.contains("at template line")
            {
                failures.push(format!(
                    "{name}: error {text:?} should name {origin}, the line and {why:?}"
                ));
            }
        }
        Err(e) => failures.push(format!("{name}: {e} (not a render error at a line)")),
    }
}

#[test]
fn smollm2_template_from_the_model() {
    let path = env_path(
        "HIPSCOPE_TEST_MODEL",
        "SmolLM2-135M-Instruct.Q4_1.gguf (see tests/it/tokenizer_smollm2.rs)",
    );
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let tok = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{e}"));
    let t = ChatTemplate::from_gguf(&file, &tok).unwrap_or_else(|e| panic!("{e}"));
    assert!(!t.is_fallback() && t.supports_system_role());
    // The template adds its default system prompt when the conversation has none.
    let prompt = t.render(&[Message::new("user", "Hi")], true).unwrap();
    let want = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(prompt, want);
    let prompt = t
        .render(
            &[
                Message::new("system", "Be brief."),
                Message::new("user", "Hi"),
                Message::new("assistant", "Hello!"),
            ],
            false,
        )
        .unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
    );

    // Tokenized, the first prompt is what llama.cpp's llama-tokenize gives for the same text.
    let data: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/tokenizer/smollm2.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let case = data["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["text"] == want && c["parse_special"] == true)
        .expect("the SmolLM2 reference has this prompt");
    let ids: Vec<u32> = case["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(
        t.prompt_tokens(&tok, &[Message::new("user", "Hi")], true)
            .unwrap(),
        ids
    );
    assert_eq!(
        ids[0], 1,
        "starts with <|im_start|>, no BOS (SmolLM2 adds none)"
    );

    // The ChatML fallback gives the same turns without the default system prompt.
    let chatml = ChatTemplate::chatml(&tok);
    assert!(chatml.is_fallback());
    assert_eq!(
        chatml.render(&[Message::new("user", "Hi")], true).unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

/// A gemma3 file carrying Gemma 3's shipped template (`hipscope synth tiny-gemma3`, whose own
/// template is a short Gemma one, with the shipped one put in its place): hipscope renders it as
/// jinja2 does (the reference above), refuses roles that do not alternate with the template's own
/// message, and `<end_of_turn>`, which closes each turn, is an end-of-generation token, so a chat
/// answer stops there (`Session` stops on `Tokenizer::is_eog`).
#[test]
fn gemma3_file_chats_with_the_shipped_template() {
    use hipscope::gpu::quant::GgmlType;
    use hipscope::model::gguf::{GgufWriter, TensorSpec, Value};
    use hipscope::model::synthetic;
    let source = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tokenizer/templates/google-gemma-3-it.jinja"
    ))
    .unwrap();
    let synth = synthetic::build(
        synthetic::shape("tiny-gemma3").unwrap(),
        GgmlType::F32,
        1,
        &mut |_, _| {},
    )
    .expect("synthetic model");
    let key = "tokenizer.chat_template";
    let mut meta: Vec<(String, Value)> = synth
        .metadata()
        .iter()
        .filter(|(k, _)| k != key)
        .cloned()
        .collect();
    meta.push((key.into(), Value::String(source.clone())));
    let specs: Vec<TensorSpec> = synth
        .tensors()
        .iter()
        .map(|t| TensorSpec::new(t.name.clone(), &t.dims, t.ty))
        .collect();
    let mut w = GgufWriter::new(Vec::new(), &meta, &specs).unwrap();
    for t in synth.tensors() {
        w.write_tensor(synth.tensor_data(t)).unwrap();
    }
    let file = GgufFile::from_bytes(
        std::path::Path::new("gemma3-shipped-template.gguf"),
        w.finish().unwrap(),
    )
    .unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{e}"));
    let t = ChatTemplate::from_gguf(&file, &tok).unwrap_or_else(|e| panic!("{e}"));
    assert!(!t.is_fallback() && t.supports_system_role());

    let r = reference();
    let g = r
        .real_templates
        .iter()
        .find(|c| c.name == "google-gemma-3-it")
        .expect("the reference has Gemma 3");
    // The file's BOS/EOS texts are the reference's; a BOS the tokenizer adds itself is dropped.
    let got = t
        .render_at(&messages(&g.messages), true, r.now_unix)
        .unwrap();
    let want = if tok.add_bos() {
        g.expected.strip_prefix("<bos>").unwrap().to_string()
    } else {
        g.expected.clone()
    };
    assert_eq!(got, want);
    let e = t
        .render(
            &[Message::new("user", "Hi"), Message::new("user", "Hi again")],
            true,
        )
        .expect_err("roles that do not alternate");
    assert!(
        e.to_string()
            .contains("Conversation roles must alternate user/assistant/user/assistant/..."),
        "{e}"
    );

    let end = tok
        .token_id("<end_of_turn>")
        .expect("<end_of_turn> is a token");
    assert_eq!(tok.eot(), Some(end));
    assert!(tok.is_eog(end));
    // The prompt tokenizes with the turn markers as single control tokens, ending on the opening
    // of the model's turn.
    let ids = t
        .prompt_tokens(&tok, &[Message::new("user", "Hi")], true)
        .unwrap();
    let start = tok.token_id("<start_of_turn>").unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == start).count(), 2);
    assert_eq!(ids.iter().filter(|&&i| i == end).count(), 1);
    assert_eq!(ids.first().copied(), tok.bos(), "one BOS, first");
    assert_eq!(ids.iter().filter(|&&i| Some(i) == tok.bos()).count(), 1);
}
