//! A reasoning model's output split into its reasoning and its answer, as it streams: the one
//! home of that split for every model and engine that streams raw text.
//!
//! Which format a model writes is read from its chat template and vocabulary, never its name
//! ([`ReasoningFormat::detect`]):
//! - **harmony** (gpt-oss): the template writes `<|channel|>` (llama.cpp's own test,
//!   `common/chat.cpp`) and the vocabulary has `<|channel|>` and `<|message|>`. The model writes
//!   messages `<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…`
//!   and ends with `<|return|>` (or `<|call|>` after a tool call), both end-of-generation tokens,
//!   so they never reach the parser; `<|end|>` only ends a message. The `analysis` channel is
//!   reasoning, `final` and a `commentary` preamble are the answer, a message addressed to a
//!   recipient (` to=functions.x`) is a tool call, shown with the reasoning (hipscope runs no
//!   tools). As llama.cpp's parser (`common/parsers/gpt-oss.cpp`), a stray
//!   `<|channel|>commentary` before a channel is skipped.
//! - **think tags** (Qwen3, DeepSeek-R1, SmolLM3, …): the vocabulary has `<think>` and
//!   `</think>` tokens, or the template writes both. Reasoning is what sits between them at the
//!   start of the answer; when the generation prompt itself ends with `<think>` (DeepSeek-R1's
//!   templates) the answer starts inside the reasoning. A `<think>` later in the answer is text.
//!
//! The parser works on decoded text (these markers are printed tokens: the tokenizer makes
//! gpt-oss's markers user-defined, as llama.cpp does), so a marker may arrive cut across pieces:
//! text that could still become a marker is held back until it cannot.

use crate::model::template::{ChatTemplate, is_harmony};
use crate::model::tokenizer::Tokenizer;

/// How a model's output carries its reasoning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// No reasoning: all text is the answer.
    None,
    /// gpt-oss's channels.
    Harmony,
    /// `<think>…</think>` before the answer; `starts_open`: the generation prompt opened it.
    Think { starts_open: bool },
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const CONSTRAIN: &str = "<|constrain|>";
const END: &str = "<|end|>";
const RETURN: &str = "<|return|>";
const CALL: &str = "<|call|>";
/// Markers that end a message's body.
const BODY_ENDS: &[&str] = &[END, START, RETURN, CALL];
/// How a message header may begin (after `<|end|>`, or right after the generation prompt).
const HEADER_STARTS: &[&str] = &[START, CHANNEL, CONSTRAIN, " to="];
/// A header longer than this without `<|message|>` is taken as text.
const HEADER_MAX: usize = 256;

impl ReasoningFormat {
    /// The format a model writes, from its chat template and its vocabulary.
    pub fn of(template: &ChatTemplate, tok: &Tokenizer) -> ReasoningFormat {
        ReasoningFormat::detect(template.source(), tok, &template.generation_prompt())
    }

    /// [`ReasoningFormat::of`] from the template's source and the generation prompt it renders
    /// (the text after the last user message).
    pub fn detect(template: &str, tok: &Tokenizer, generation_prompt: &str) -> ReasoningFormat {
        let has = |t: &str| tok.token_id(t).is_some();
        if is_harmony(template) && has(CHANNEL) && has(MESSAGE) {
            return ReasoningFormat::Harmony;
        }
        let vocab = has(THINK_OPEN) && has(THINK_CLOSE);
        let written = template.contains(THINK_OPEN) && template.contains(THINK_CLOSE);
        if vocab || written {
            let starts_open = generation_prompt.trim_end().ends_with(THINK_OPEN);
            return ReasoningFormat::Think { starts_open };
        }
        ReasoningFormat::None
    }

    /// A parser for one answer.
    pub fn parser(&self) -> ReasoningParser {
        let state = match self {
            ReasoningFormat::None => State::Answer,
            ReasoningFormat::Harmony => State::Header,
            ReasoningFormat::Think { starts_open } => State::ThinkStart { open: *starts_open },
        };
        ReasoningParser {
            state,
            pending: String::new(),
            reasoned: false,
        }
    }
}

/// A piece of the output, in the order written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    Reasoning(String),
    Answer(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    Reasoning,
    Answer,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// All text is the answer.
    Answer,
    /// harmony: reading a message header, up to `<|message|>` (in `pending`).
    Header,
    /// harmony: a message's body, up to a marker that ends it.
    Body(Body),
    /// harmony: `<|return|>` or `<|call|>` was read: nothing more.
    Done,
    /// think: before the first text; `open`: the prompt opened the reasoning.
    ThinkStart { open: bool },
    /// think: inside the reasoning; `started`: its first text came (white space before it is
    /// dropped).
    Thinking { started: bool },
    /// think: after `</think>`, white space before the answer is dropped.
    AnswerStart,
}

/// Splits one answer's text, pushed piece by piece, into reasoning and answer.
#[derive(Clone, Debug)]
pub struct ReasoningParser {
    state: State,
    /// Text held back: a header being read, or a tail that may still become a marker.
    pending: String,
    /// Reasoning was emitted (a second reasoning message is set apart by a blank line).
    reasoned: bool,
}

impl ReasoningParser {
    /// Adds a piece of text; returns what can be told apart now, in order (adjacent parts of one
    /// kind merged).
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    /// The end of the output: what was held back goes where it was heading.
    pub fn finish(&mut self) -> Vec<Part> {
        let mut out = Vec::new();
        while self.step(&mut out) {}
        let rest = std::mem::take(&mut self.pending);
        match self.state {
            State::Answer | State::Body(Body::Answer) => emit(&mut out, Body::Answer, &rest),
            State::Body(Body::Reasoning) | State::Thinking { .. } => {
                emit(&mut out, Body::Reasoning, &rest)
            }
            // An unfinished header is dropped unless it is plain text.
            State::Header if !rest.contains("<|") => emit(&mut out, Body::Answer, &rest),
            State::ThinkStart { open: false } => emit(&mut out, Body::Answer, &rest),
            State::ThinkStart { open: true } => emit(&mut out, Body::Reasoning, &rest),
            State::Header | State::Done | State::AnswerStart => {}
        }
        out
    }

    /// Whether the answer has begun (what comes now is not reasoning).
    pub fn answering(&self) -> bool {
        matches!(self.state, State::Answer | State::Body(Body::Answer))
    }

    /// One step over `pending`; whether another step may make progress.
    fn step(&mut self, out: &mut Vec<Part>) -> bool {
        match self.state.clone() {
            State::Answer => {
                let t = std::mem::take(&mut self.pending);
                emit(out, Body::Answer, &t);
                false
            }
            State::Done => {
                self.pending.clear();
                false
            }
            State::Header => self.header(out),
            State::Body(kind) => match self.until(out, kind, BODY_ENDS) {
                Some(m) if m == END => {
                    self.state = State::Header;
                    true
                }
                Some(m) if m == START => {
                    self.pending.insert_str(0, START);
                    self.state = State::Header;
                    true
                }
                Some(_) => {
                    self.state = State::Done;
                    true
                }
                None => false,
            },
            State::ThinkStart { open } => {
                let t = self.pending.trim_start();
                if let Some(rest) = t.strip_prefix(THINK_OPEN) {
                    self.pending = rest.to_string();
                    self.state = State::Thinking { started: false };
                    true
                } else if THINK_OPEN.starts_with(t) {
                    // Empty, white space, or a start of `<think>`: wait.
                    false
                } else {
                    self.state = if open {
                        State::Thinking { started: false }
                    } else {
                        State::Answer
                    };
                    true
                }
            }
            State::Thinking { started: false } => {
                self.skip_white_space_then(State::Thinking { started: true })
            }
            State::Thinking { started: true } => {
                match self.until(out, Body::Reasoning, &[THINK_CLOSE]) {
                    Some(_) => {
                        self.state = State::AnswerStart;
                        true
                    }
                    None => false,
                }
            }
            State::AnswerStart => self.skip_white_space_then(State::Answer),
        }
    }

    /// Drops the white space at the start of `pending`; once text follows it, moves to `next`
    /// (`true`: go on). All white space so far: kept waiting for more (`false`).
    fn skip_white_space_then(&mut self, next: State) -> bool {
        let t = self.pending.trim_start();
        if t.is_empty() {
            self.pending.clear();
            false
        } else {
            self.pending = t.to_string();
            self.state = next;
            true
        }
    }

    /// Emits `pending` as `kind` up to the first of `markers`, which is consumed and returned;
    /// without one, emits all but a tail that may still become a marker.
    fn until(
        &mut self,
        out: &mut Vec<Part>,
        kind: Body,
        markers: &[&'static str],
    ) -> Option<&'static str> {
        if let Some((at, m)) = first(&self.pending, markers) {
            let rest = self.pending.split_off(at);
            let before = std::mem::replace(&mut self.pending, rest[m.len()..].to_string());
            emit(out, kind, &before);
            return Some(m);
        }
        let keep = held_tail(&self.pending, markers);
        let tail = self.pending.split_off(self.pending.len() - keep);
        let head = std::mem::replace(&mut self.pending, tail);
        emit(out, kind, &head);
        None
    }

    /// A harmony header: `[<|start|>ROLE][ to=RECIPIENT]<|channel|>NAME[ to=…][ <|constrain|>T]<|message|>`.
    fn header(&mut self, out: &mut Vec<Part>) -> bool {
        if let Some(at) = self.pending.find(MESSAGE) {
            let header = self.pending[..at].to_string();
            self.pending.drain(..at + MESSAGE.len());
            let (kind, call) = classify(&header);
            if kind == Body::Reasoning {
                if self.reasoned {
                    emit(out, Body::Reasoning, "\n\n");
                }
                if let Some(to) = call {
                    emit(out, Body::Reasoning, &format!("→ {to}: "));
                }
                self.reasoned = true;
            }
            self.state = State::Body(kind);
            return true;
        }
        let p = &self.pending;
        let could_be = p.len() <= HEADER_MAX
            && HEADER_STARTS
                .iter()
                .any(|s| p.starts_with(s) || s.starts_with(p.as_str()));
        if could_be {
            return false;
        }
        // Not a header: the model wrote plain text; it is the answer.
        self.state = State::Answer;
        true
    }
}

/// Which body a header opens, and the recipient of a tool call.
fn classify(header: &str) -> (Body, Option<String>) {
    let recipient = header.split(" to=").nth(1).map(|r| {
        r.split(|c: char| c.is_whitespace() || c == '<')
            .next()
            .unwrap_or("")
            .to_string()
    });
    // The last channel named counts (a stray `<|channel|>commentary` may come first).
    let channel = header
        .rsplit(CHANNEL)
        .next()
        .filter(|_| header.contains(CHANNEL))
        .map(|c| {
            c.split(|ch: char| ch.is_whitespace() || ch == '<')
                .next()
                .unwrap_or("")
        })
        .unwrap_or("");
    match (channel, recipient) {
        ("analysis", r) => (Body::Reasoning, r),
        (_, Some(r)) if channel != "final" => (Body::Reasoning, Some(r)),
        _ => (Body::Answer, None),
    }
}

fn emit(out: &mut Vec<Part>, kind: Body, text: &str) {
    if text.is_empty() {
        return;
    }
    match (out.last_mut(), kind) {
        (Some(Part::Reasoning(s)), Body::Reasoning) | (Some(Part::Answer(s)), Body::Answer) => {
            s.push_str(text)
        }
        (_, Body::Reasoning) => out.push(Part::Reasoning(text.to_string())),
        (_, Body::Answer) => out.push(Part::Answer(text.to_string())),
    }
}

/// The earliest of `markers` in `text`: its byte offset and the marker.
fn first<'m>(text: &str, markers: &[&'m str]) -> Option<(usize, &'m str)> {
    markers
        .iter()
        .filter_map(|m| text.find(m).map(|i| (i, *m)))
        .min_by_key(|&(i, _)| i)
}

/// The length of the longest tail of `text` that is a proper start of one of `markers`.
fn held_tail(text: &str, markers: &[&str]) -> usize {
    text.char_indices()
        .map(|(i, _)| i)
        .find(|&i| markers.iter().any(|m| m.starts_with(&text[i..])))
        .map_or(0, |i| text.len() - i)
}

#[cfg(test)]
mod tests;
