//! Issue 12 on the engine: a message that can never fit is refused before any history is
//! dropped (item 8); a raised interrupt flag stops a prompt between batches and the session
//! goes on afterwards (item 9); `n_predict = 0` generates nothing (item 15).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use hipscope::gpu::cpu::CpuBackend;
use hipscope::model::loader::{self, LoadOptions};
use hipscope::model::protocol::{ModelSource, SamplerConfig, StopReason};
use hipscope::model::session::{Control, Session, SessionError};

fn session(n_ctx: usize, n_predict: i32) -> Session {
    let src = ModelSource::Synthetic {
        shape: "tiny".into(),
        quant: "Q8_0".into(),
        seed: 3,
    };
    let file = loader::open(&src, &mut |_, _| {}).unwrap();
    let opts = LoadOptions {
        n_ctx: Some(n_ctx),
        n_batch: 32,
        all_logits: false,
        sampler: SamplerConfig {
            temp: 0.0,
            n_predict,
            ..SamplerConfig::default()
        },
        ..LoadOptions::default()
    };
    loader::load(file, Box::new(CpuBackend::new(2)), &opts, &mut |_, _| {})
        .unwrap()
        .session
}

#[test]
fn item8_a_message_longer_than_the_context_is_refused_with_the_history_kept() {
    let mut s = session(256, 16);
    for q in ["hello", "and again"] {
        s.chat(q, &mut |_| Control::Continue).unwrap();
    }
    let before = s.messages().to_vec();
    assert_eq!(before.len(), 4);
    let long = "word ".repeat(600);
    let e = s.chat(&long, &mut |_| Control::Continue).unwrap_err();
    let SessionError::MessageTooLong {
        tokens,
        fits,
        n_ctx,
    } = e
    else {
        panic!("{e}");
    };
    assert!(tokens > fits && n_ctx == 256, "{tokens} {fits} {n_ctx}");
    assert!(e.to_string().contains("The conversation is kept"));
    assert_eq!(s.messages(), &before[..], "the history was dropped");
}

#[test]
fn item9_an_interrupt_stops_the_prompt_and_the_session_goes_on() {
    let mut s = session(2048, 8);
    let flag = Arc::new(AtomicBool::new(true));
    s.model.set_interrupt(flag.clone());
    // Long enough for many batches of 32, short enough to fit.
    let long = "word ".repeat(300);
    let a = s.chat(&long, &mut |_| Control::Continue).unwrap();
    assert_eq!(a.reason, StopReason::User);
    assert!(a.tokens.is_empty());
    flag.store(false, Ordering::Relaxed);
    let a = s.chat("hello", &mut |_| Control::Continue).unwrap();
    assert_eq!(a.tokens.len(), 8);
}

#[test]
fn item15_n_predict_0_generates_nothing() {
    let mut s = session(256, 0);
    let a = s.chat("hello", &mut |_| Control::Continue).unwrap();
    assert_eq!(a.reason, StopReason::Limit);
    assert!(a.tokens.is_empty() && a.text.is_empty());
}
