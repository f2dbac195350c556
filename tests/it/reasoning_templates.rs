//! A reasoning model's earlier answers in the next prompt, against Python's jinja2: each
//! assistant turn goes to the template with its reasoning apart from its content
//! (`reasoning_content`, and `thinking` for gpt-oss's harmony template, as llama.cpp passes
//! them), and the real templates of gpt-oss, Qwen3, DeepSeek-R1 and SmolLM3 (llama.cpp's
//! `models/templates/`, read from `HIPSCOPE_LLAMA_CPP_SRC`) must render what jinja2 renders:
//! earlier turns' reasoning dropped; a last assistant turn's reasoning shown where the template
//! shows it (which proves the fields reach it). Also which reasoning format each template makes
//! hipscope read. The reference: `scripts/gen_reasoning_ref.py`.

use crate::common;
use std::path::PathBuf;

use hipscope::model::loader;
use hipscope::model::protocol::ModelSource;
use hipscope::model::reasoning::ReasoningFormat;
use hipscope::model::template::{ChatTemplate, Message};
use hipscope::model::tokenizer::Tokenizer;
use serde::Deserialize;
use sha2::{Digest, Sha256};

#[derive(Deserialize)]
struct Reference {
    now_unix: i64,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Msg {
    role: String,
    content: String,
    #[serde(default)]
    reasoning_content: Option<String>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    file: String,
    sha256: String,
    bos_token: String,
    eos_token: String,
    reasoning: String,
    messages: Vec<Msg>,
    expected: String,
    expected_last: String,
}

fn reference() -> Reference {
    common::read_json("tests/data/tokenizer/reasoning_history.json")
}

fn template(c: &Case) -> ChatTemplate {
    let src = PathBuf::from(
        std::env::var_os("HIPSCOPE_LLAMA_CPP_SRC").unwrap_or_else(|| {
            panic!("HIPSCOPE_LLAMA_CPP_SRC is not set: it must name llama.cpp's source tree")
        }),
    );
    let path = src.join(&c.file);
    let source =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let digest: String = Sha256::digest(source.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(digest, c.sha256, "{} changed", path.display());
    ChatTemplate::from_source(
        path.display().to_string(),
        source,
        c.bos_token.clone(),
        c.eos_token.clone(),
        false,
        false,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The conversation as hipscope's session holds it: the reasoning in `Message::reasoning`.
fn messages(m: &[Msg]) -> Vec<Message> {
    m.iter()
        .map(|m| {
            Message::new(&m.role, &m.content)
                .with_reasoning(m.reasoning_content.as_deref().unwrap_or(""))
        })
        .collect()
}

#[test]
fn earlier_reasoning_renders_as_jinja2_renders_it() {
    let r = reference();
    assert_eq!(r.cases.len(), 4);
    for c in &r.cases {
        let t = template(c);
        let m = messages(&c.messages);
        let next = t.render_at(&m, true, r.now_unix).unwrap();
        assert_eq!(next, c.expected, "{}: the next prompt", c.name);
        assert!(
            !next.contains(&c.reasoning),
            "{}: an earlier turn's reasoning stays out of the prompt",
            c.name
        );
        assert!(!next.contains("<think>\nThe user"), "{}", c.name);
        let last = t.render_at(&m[..3], false, r.now_unix).unwrap();
        assert_eq!(last, c.expected_last, "{}: ending with the answer", c.name);
    }
    // The fields reached the templates that show a last turn's reasoning.
    let shows: Vec<&str> = r
        .cases
        .iter()
        .filter(|c| c.expected_last.contains(&c.reasoning))
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(shows, ["openai-gpt-oss-120b", "Qwen-Qwen3-0.6B"]);
}

#[test]
fn reasoning_format_read_from_template_and_vocabulary() {
    let r = reference();
    // The synthetic gpt-oss's vocabulary has the harmony tokens and no `<think>`.
    let file = loader::open(
        &ModelSource::Synthetic {
            shape: "tiny-gpt-oss".into(),
            quant: "Q8_0".into(),
            seed: 1,
        },
        &mut |_, _| {},
    )
    .unwrap();
    let harmony_vocab = Tokenizer::from_gguf(&file).unwrap();
    let file = loader::open(
        &ModelSource::Synthetic {
            shape: "tiny".into(),
            quant: "Q8_0".into(),
            seed: 1,
        },
        &mut |_, _| {},
    )
    .unwrap();
    let plain_vocab = Tokenizer::from_gguf(&file).unwrap();
    for c in &r.cases {
        let t = template(c);
        let want = match c.name.as_str() {
            "openai-gpt-oss-120b" => ReasoningFormat::Harmony,
            // Its generation prompt ends with `<think>\n`: the answer starts inside.
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B" => {
                ReasoningFormat::Think { starts_open: true }
            }
            _ => ReasoningFormat::Think { starts_open: false },
        };
        assert_eq!(ReasoningFormat::of(&t, &harmony_vocab), want, "{}", c.name);
    }
    // A harmony template without the harmony tokens in the vocabulary is not read as one.
    let gpt_oss = template(&r.cases[0]);
    assert_eq!(
        ReasoningFormat::of(&gpt_oss, &plain_vocab),
        ReasoningFormat::None
    );
    // The built-in ChatML template with a vocabulary without `<think>`: no reasoning.
    assert_eq!(
        ReasoningFormat::of(&ChatTemplate::chatml(&plain_vocab), &plain_vocab),
        ReasoningFormat::None
    );
}
