//! Conversations on a synthetic model: the KV cache is reused across turns without changing the
//! result, the oldest turns are dropped when the context fills (the system prompt kept), and
//! answers can be regenerated.

use std::sync::Arc;

use hipscope::gpu::cpu::CpuBackend;
use hipscope::model::loader::{self, LoadOptions};
use hipscope::model::protocol::{ModelSource, SamplerConfig, StopReason};
use hipscope::model::session::{Answer, Control, Progress, Session};

fn session(n_ctx: usize, n_predict: i32) -> Session {
    session_batched(n_ctx, n_predict, 32)
}

fn session_batched(n_ctx: usize, n_predict: i32, n_batch: usize) -> Session {
    let src = ModelSource::Synthetic {
        shape: "tiny".into(),
        quant: "Q8_0".into(),
        seed: 3,
    };
    let file = loader::open(&src, &mut |_, _| {}).unwrap();
    let opts = LoadOptions {
        n_ctx: Some(n_ctx),
        n_batch,
        all_logits: false,
        sampler: SamplerConfig {
            temp: 0.0,
            n_predict,
            ..SamplerConfig::default()
        },
        ..LoadOptions::default()
    };
    loader::load(
        Arc::clone(&file),
        Box::new(CpuBackend::new(2)),
        &opts,
        &mut |_, _| {},
    )
    .unwrap()
    .session
}

fn say(s: &mut Session, text: &str) -> (Answer, usize) {
    let mut trimmed = 0;
    let a = s
        .chat(text, &mut |p| {
            if let Progress::Trimmed(t) = p {
                trimmed += t.messages;
            }
            Control::Continue
        })
        .unwrap();
    (a, trimmed)
}

#[test]
fn second_turn_reuses_the_cache_and_matches_a_fresh_run() {
    let mut s = session(512, 12);
    s.set_system("be brief");
    let (first, _) = say(&mut s, "hello there");
    assert_eq!(first.reason, StopReason::Limit);
    assert_eq!(first.tokens.len(), 12);
    assert_eq!(first.stats.cached_tokens, 0);
    let (second, _) = say(&mut s, "and again");
    // Everything up to the first answer's text was in the cache.
    assert!(
        second.stats.cached_tokens >= first.stats.prompt_tokens,
        "cached {} of a first prompt of {}",
        second.stats.cached_tokens,
        first.stats.prompt_tokens
    );
    // The same conversation with the cache forgotten before turn two recomputes the whole
    // prompt, and must answer the same.
    let mut other = session(512, 12);
    other.set_system("be brief");
    let (o1, _) = say(&mut other, "hello there");
    assert_eq!(o1.tokens, first.tokens);
    other.model_mut();
    let (s2, _) = say(&mut other, "and again");
    assert_eq!(s2.stats.cached_tokens, 0);
    assert_eq!(s2.tokens, second.tokens, "reused cache changed the answer");
}

#[test]
fn a_full_context_drops_the_oldest_turns_but_keeps_the_system_prompt() {
    let mut s = session(160, 8);
    s.set_system("SYSTEM PROMPT");
    let mut total_dropped = 0;
    for i in 0..12 {
        let (a, dropped) = say(&mut s, &format!("message number {i} with some words in it"));
        assert!(
            a.stats.prompt_tokens + 8 <= 160,
            "prompt {}",
            a.stats.prompt_tokens
        );
        total_dropped += dropped;
    }
    assert!(total_dropped > 0, "a 160-token context never filled");
    assert_eq!(s.system(), Some("SYSTEM PROMPT"));
    // The newest exchange is still there, the oldest is gone.
    let msgs = s.messages();
    assert!(msgs.iter().any(|m| m.content.contains("message number 11")));
    assert!(!msgs.iter().any(|m| m.content.contains("message number 0 ")));
    assert_eq!(msgs.first().map(|m| m.role.as_str()), Some("user"));
}

#[test]
fn a_prompt_longer_than_the_context_is_refused_and_forgotten() {
    let mut s = session(64, 4);
    let long = "word ".repeat(200);
    let e = s.chat(&long, &mut |_| Control::Continue).unwrap_err();
    assert!(e.to_string().contains("in the context of 64"), "{e}");
    assert!(s.messages().is_empty());
    // The session still works afterwards.
    let (a, _) = say(&mut s, "hi");
    assert_eq!(a.tokens.len(), 4);
}

#[test]
fn regenerate_replaces_the_last_answer() {
    let mut s = session(256, 6);
    let (a, _) = say(&mut s, "first");
    assert_eq!(s.messages().len(), 2);
    let user = s.pop_answer().unwrap();
    assert_eq!(user, "first");
    assert!(s.messages().is_empty());
    let (b, _) = say(&mut s, &user);
    // Greedy: the same answer again, now entirely from the cache but the last prompt token.
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(b.stats.cached_tokens + 1, b.stats.prompt_tokens);
}

#[test]
fn stopping_from_the_callback_ends_the_answer() {
    let mut s = session(256, 50);
    let mut pieces = 0;
    let a = s
        .chat("go", &mut |p| {
            if let Progress::Text(_) = p {
                pieces += 1;
            }
            if pieces >= 3 {
                Control::Stop
            } else {
                Control::Continue
            }
        })
        .unwrap();
    assert_eq!(a.reason, StopReason::User);
    assert!(a.tokens.len() < 50);
}

/// A long prompt reports its progress between batches, and reading it a batch at a time gives
/// the answer that one batch for the whole prompt gives.
#[test]
fn a_long_prompt_reports_progress_between_batches() {
    let question = "tell me about the sea and the ships on it ".repeat(8);
    let mut s = session_batched(512, 6, 32);
    let mut seen = Vec::new();
    let a = s
        .chat(&question, &mut |p| {
            if let Progress::Prompt { done, total } = p {
                seen.push((done, total));
            }
            Control::Continue
        })
        .unwrap();
    let total = a.stats.prompt_tokens;
    assert!(total > 64, "the prompt is {total} tokens");
    let want: Vec<(usize, usize)> = (1..)
        .map(|i| i * 32)
        .take_while(|&d| d < total)
        .map(|d| (d, total))
        .collect();
    assert_eq!(seen, want);
    let mut one = session_batched(512, 6, 512);
    let (b, _) = say(&mut one, &question);
    assert_eq!(a.tokens, b.tokens);
}
