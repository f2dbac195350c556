//! The formats a model file without a chat template is chatted in. llama.cpp's server falls back
//! to ChatML for every such file, so a Gemma base model there is prompted with `<|im_start|>`,
//! markers its vocabulary does not have, and answers with them as text. Here a file gets the
//! format of its architecture when its vocabulary has that format's markers as special tokens
//! (Gemma's `<start_of_turn>`, Llama 3's headers, ChatML's `<|im_start|>`), written as
//! llama.cpp's built-in templates write them; otherwise the chat is a plain continuation of the
//! text, as `llama-cli -no-cnv` runs a model without a template.

use crate::model::tokenizer::{TokenKind, Tokenizer};

/// A built-in way of writing a conversation into a prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Gemma,
    Llama3,
    ChatMl,
    /// No turns at all: the messages are one text, continued by the model.
    Plain,
}

/// Each format with the architectures it belongs to (empty: any) and the special tokens its
/// prompt needs. The first that fits is used; `Plain` fits everything.
const FORMATS: &[(Format, &[&str], &[&str])] = &[
    (
        Format::Gemma,
        &["gemma", "gemma2", "gemma3", "gemma3n"],
        &["<start_of_turn>", "<end_of_turn>"],
    ),
    (
        Format::Llama3,
        &["llama"],
        &["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    ),
    (Format::ChatMl, &[], &["<|im_start|>", "<|im_end|>"]),
];

impl Format {
    /// The format for a file of architecture `arch` with vocabulary `tok` and no template.
    pub fn for_model(arch: &str, tok: &Tokenizer) -> Format {
        FORMATS
            .iter()
            .find(|(_, archs, markers)| {
                (archs.is_empty() || archs.contains(&arch))
                    && markers.iter().all(|m| is_special(tok, m))
            })
            .map_or(Format::Plain, |(f, ..)| *f)
    }

    /// The Jinja source (rendered by the same engine as a model's own template).
    pub fn source(self) -> &'static str {
        match self {
            Format::Gemma => include_str!("../../../assets/gemma.jinja"),
            Format::Llama3 => include_str!("../../../assets/llama3.jinja"),
            Format::ChatMl => include_str!("../../../assets/chatml.jinja"),
            Format::Plain => include_str!("../../../assets/plain.jinja"),
        }
    }

    /// How the chat names it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Gemma => "Gemma's turn format (<start_of_turn>user … <end_of_turn>)",
            Format::Llama3 => {
                "Llama 3's header format (<|start_header_id|>user<|end_header_id|> …)"
            }
            Format::ChatMl => "ChatML (<|im_start|>user … <|im_end|>)",
            Format::Plain => "plain text continuation",
        }
    }

    /// The token that opens a turn: generated, it can only start another message, so the
    /// answer ends there (as at the model's end-of-generation tokens).
    pub fn turn_opener(self) -> Option<&'static str> {
        match self {
            Format::Gemma => Some("<start_of_turn>"),
            Format::Llama3 => Some("<|start_header_id|>"),
            Format::ChatMl => Some("<|im_start|>"),
            Format::Plain => None,
        }
    }

    /// What a user is told about a file without a template (`file` names it).
    pub fn note(self, file: &str) -> String {
        match self {
            Format::Plain => format!(
                "{file} has no chat template and its vocabulary has no chat markers: the chat \
                 continues your text as written (plain completion, as llama-cli -no-cnv); \
                 it stops at the model's end-of-text token or the token limit"
            ),
            f => format!(
                "{file} has no chat template (a base model?): chatting in {}, whose markers its \
                 vocabulary has",
                f.name()
            ),
        }
    }
}

/// Whether the vocabulary has `text` as one special (control or user-defined) token, which a
/// rendered prompt's text turns into.
fn is_special(tok: &Tokenizer, text: &str) -> bool {
    tok.token_id(text)
        .is_some_and(|id| matches!(tok.kind(id), TokenKind::Control | TokenKind::UserDefined))
}
