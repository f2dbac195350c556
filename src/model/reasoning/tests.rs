//! The parser on whole outputs, and on the same outputs cut at every position and fed a
//! character at a time: the split never depends on where the pieces break.

use super::{Part, ReasoningFormat};

/// (reasoning, answer) of `text` pushed as `pieces`, with the parts checked to alternate.
fn run(format: &ReasoningFormat, pieces: &[&str]) -> (String, String) {
    let mut p = format.parser();
    let mut parts = Vec::new();
    for piece in pieces {
        parts.extend(p.push(piece));
    }
    parts.extend(p.finish());
    let (mut r, mut a) = (String::new(), String::new());
    for part in parts {
        match part {
            Part::Reasoning(t) => r.push_str(&t),
            Part::Answer(t) => a.push_str(&t),
        }
    }
    (r, a)
}

/// Checks `text` whole, cut in two at every character boundary, cut in three, and a character
/// at a time: every way gives `want`.
fn check(format: &ReasoningFormat, text: &str, want: (&str, &str)) {
    let want = (want.0.to_string(), want.1.to_string());
    assert_eq!(run(format, &[text]), want, "whole: {text:?}");
    let cuts: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain([text.len()])
        .collect();
    for &i in &cuts {
        let got = run(format, &[&text[..i], &text[i..]]);
        assert_eq!(got, want, "cut at {i}: {:?} | {:?}", &text[..i], &text[i..]);
        for &j in cuts.iter().filter(|&&j| j >= i).step_by(3) {
            let got = run(format, &[&text[..i], &text[i..j], &text[j..]]);
            assert_eq!(got, want, "cut at {i} and {j}");
        }
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(run(format, &refs), want, "a character at a time: {text:?}");
}

const H: ReasoningFormat = ReasoningFormat::Harmony;
const THINK: ReasoningFormat = ReasoningFormat::Think { starts_open: false };
const THINK_OPEN: ReasoningFormat = ReasoningFormat::Think { starts_open: true };

#[test]
fn harmony_analysis_then_final() {
    check(
        &H,
        "<|channel|>analysis<|message|>User asks capital. Paris.<|end|><|start|>assistant<|channel|>final<|message|>The capital is **Paris**.",
        ("User asks capital. Paris.", "The capital is **Paris**."),
    );
}

#[test]
fn harmony_markers_that_end_the_output_are_not_shown() {
    // `<|return|>` and `<|call|>` are end-of-generation tokens and stop the worker first; text
    // that still holds them ends there.
    check(
        &H,
        "<|channel|>final<|message|>Hi<|return|>ignored",
        ("", "Hi"),
    );
    check(
        &H,
        "<|channel|>analysis<|message|>need weather<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
        (
            "need weather\n\n→ functions.get_weather: {\"city\":\"Paris\"}",
            "",
        ),
    );
}

#[test]
fn harmony_several_analysis_messages_and_a_preamble() {
    check(
        &H,
        "<|channel|>analysis<|message|>one<|end|><|start|>assistant<|channel|>analysis<|message|>two<|end|><|start|>assistant<|channel|>commentary<|message|>Let me check. <|end|><|start|>assistant<|channel|>final<|message|>Done.",
        ("one\n\ntwo", "Let me check. Done."),
    );
}

#[test]
fn harmony_recipient_in_the_role_and_a_stray_commentary() {
    check(
        &H,
        " to=functions.f<|channel|>commentary json<|message|>{}<|call|>",
        ("→ functions.f: {}", ""),
    );
    check(
        &H,
        "<|channel|>commentary<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary to=assistant<|channel|>final<|message|>y",
        ("x", "y"),
    );
}

#[test]
fn harmony_without_headers_is_plain_answer() {
    // A model (or a random-weight one) that writes no header: nothing is lost.
    check(
        &H,
        "Just text, no channels.",
        ("", "Just text, no channels."),
    );
    check(&H, "<b>bold</b> text", ("", "<b>bold</b> text"));
    // Stopped in the middle of a header: the unfinished header is not shown.
    check(
        &H,
        "<|channel|>analysis<|message|>hmm<|end|><|start|>assis",
        ("hmm", ""),
    );
}

#[test]
fn harmony_stopped_mid_reasoning_keeps_it_as_reasoning() {
    check(
        &H,
        "<|channel|>analysis<|message|>still thinking <|e",
        ("still thinking <|e", ""),
    );
}

#[test]
fn think_tags_before_the_answer() {
    check(
        &THINK,
        "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?",
        ("The user greets me.\n", "Hello! How can I help?"),
    );
    // Empty reasoning (Qwen3 with thinking off writes it into the prompt; some models repeat it).
    check(&THINK, "<think>\n\n</think>\n\nHi.", ("", "Hi."));
}

#[test]
fn think_tags_only_at_the_start() {
    check(
        &THINK,
        "Sure: write <think> in XML.",
        ("", "Sure: write <think> in XML."),
    );
    check(&THINK, "  <thin", ("", "  <thin"));
    check(&THINK, "<thinking>x", ("", "<thinking>x"));
    // A later `</think>` in the answer is text too.
    check(
        &THINK,
        "<think>a</think>b </think> c",
        ("a", "b </think> c"),
    );
}

#[test]
fn think_opened_by_the_prompt() {
    // DeepSeek-R1's template ends the generation prompt with `<think>\n`.
    check(
        &THINK_OPEN,
        "Let me see.\n</think>\n\nFour.",
        ("Let me see.\n", "Four."),
    );
    // A model that writes the tag again anyway.
    check(&THINK_OPEN, "<think>\nx</think>y", ("x", "y"));
    // Never closed: all of it is reasoning (as llama.cpp's parser has it).
    check(&THINK_OPEN, "going on and on", ("going on and on", ""));
}

#[test]
fn no_format_passes_everything() {
    check(
        &ReasoningFormat::None,
        "<think>x</think><|channel|>",
        ("", "<think>x</think><|channel|>"),
    );
}

#[test]
fn multibyte_text_around_markers() {
    check(
        &H,
        "<|channel|>analysis<|message|>é→ü<|end|><|start|>assistant<|channel|>final<|message|>日本",
        ("é→ü", "日本"),
    );
    check(&THINK, "<think>ß</think>ñ", ("ß", "ñ"));
}

#[test]
fn answering_says_when_the_answer_began() {
    let mut p = H.parser();
    p.push("<|channel|>analysis<|message|>x<|end|>");
    assert!(!p.answering());
    p.push("<|start|>assistant<|channel|>final<|message|>");
    assert!(p.answering());
    let mut p = THINK.parser();
    p.push("Plain");
    assert!(p.answering());
}
