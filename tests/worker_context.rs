//! Issue 18 item 7: `/set ctx N` through the real inference worker, on a synthetic model on the
//! CPU. The model is loaded again with a KV cache of the new size and the conversation goes on
//! in it: whole, where it fits; without its oldest exchanges (and saying how many), where it
//! does not; and a reload that fails goes back to the context it had, conversation and all.

mod common;
use common::worker::until;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hipscope::gpu::cpu::CpuBackend;
use hipscope::model::loader::LoadOptions;
use hipscope::model::protocol::{Command, Event, ModelSource, SamplerConfig};
use hipscope::model::worker::{self, WorkerHandle, WorkerOptions};

/// The tokens kept free for an answer: the sampler's `n_predict` (below half the context).
const N_PREDICT: i32 = 8;

/// A worker on the synthetic tiny model with a context of `n_ctx`; the backend factory fails
/// on the calls `fail_on` lists (1-based), as a device that cannot take the reload would.
fn start(n_ctx: usize, fail_on: &'static [usize]) -> WorkerHandle {
    let calls = Arc::new(AtomicUsize::new(0));
    worker::spawn(WorkerOptions {
        source: Some(ModelSource::Synthetic {
            shape: "tiny".into(),
            quant: "Q8_0".into(),
            seed: 5,
        }),
        default_model: Box::new(|_| Err("no default model in this test".into())),
        backend: Box::new(move |_watch, _, _| {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            if fail_on.contains(&n) {
                return Err(format!("the device refused allocation number {n}"));
            }
            Ok(Box::new(CpuBackend::new(2)))
        }),
        load: LoadOptions {
            n_ctx: Some(n_ctx),
            n_batch: 32,
            sampler: SamplerConfig {
                temp: 0.0,
                n_predict: N_PREDICT,
                ..SamplerConfig::default()
            },
            ..LoadOptions::default()
        },
        system: Some("Answer briefly.".into()),
        drain_deadline: Duration::from_secs(5),
        remote_poll: Duration::from_millis(500),
    })
}

fn loaded(w: &mut WorkerHandle) -> (usize, Vec<Event>) {
    let seen = until(w, "model", |e| matches!(e, Event::ModelLoaded { .. }));
    match seen.last() {
        Some(Event::ModelLoaded { model, .. }) => (model.context_length, seen),
        _ => unreachable!(),
    }
}

/// Asks and waits for the answer; returns the prompt tokens it was given.
fn ask(w: &mut WorkerHandle, text: &str) -> usize {
    w.commands
        .send(Command::Generate { user: text.into() })
        .unwrap();
    let seen = until(w, "answer", |e| matches!(e, Event::AnswerDone { .. }));
    for e in &seen {
        assert!(!matches!(e, Event::Error { .. }), "{seen:?}");
    }
    match seen.last() {
        Some(Event::AnswerDone { stats, .. }) => stats.prompt_tokens,
        _ => unreachable!(),
    }
}

/// (n_ctx, kept, dropped, tokens) of the next `ContextResized`, and every event before it.
fn resized(w: &mut WorkerHandle) -> ((usize, usize, usize, usize), Vec<Event>) {
    let seen = until(w, "ContextResized", |e| {
        matches!(e, Event::ContextResized { .. })
    });
    match seen.last() {
        Some(&Event::ContextResized {
            n_ctx,
            kept,
            dropped,
            tokens,
        }) => ((n_ctx, kept, dropped, tokens), seen),
        _ => unreachable!(),
    }
}

fn quit(mut w: WorkerHandle) {
    w.commands
        .send(Command::Quit {
            drain_deadline: Duration::from_secs(5),
        })
        .unwrap();
    until(&mut w, "exit", |e| matches!(e, Event::Exited { .. }));
    w.thread.take().unwrap().join().unwrap();
}

const QUESTIONS: [&str; 4] = [
    "What is the capital of France and why is it famous?",
    "Name three rivers that flow through Germany, please.",
    "How many legs does a spider have, and an insect?",
    "Which planet is the largest in the solar system?",
];

#[test]
fn item7_set_ctx_reloads_with_the_new_context_and_keeps_what_fits() {
    let mut w = start(512, &[]);
    assert_eq!(loaded(&mut w).0, 512);
    let mut prompts = Vec::new();
    for q in QUESTIONS {
        prompts.push(ask(&mut w, q));
    }
    // The whole conversation so far, as the next prompt would hold it (minus the new message):
    // more than a context of `small` can take with room for an answer.
    let last = *prompts.last().unwrap();
    let small = 8 * last / 10;
    assert!(small > prompts[0] + N_PREDICT as usize, "{prompts:?}");

    // Larger: everything is kept.
    w.commands.send(Command::SetContext(Some(1024))).unwrap();
    let ((n, kept, dropped, tokens), seen) = resized(&mut w);
    assert!(
        seen.iter()
            .any(|e| matches!(e, Event::ModelLoaded { model, .. } if model.context_length == 1024)),
        "{seen:?}"
    );
    assert_eq!((n, kept, dropped), (1024, QUESTIONS.len(), 0));
    assert!(tokens > last, "{tokens} <= {last}");

    // Smaller: the oldest exchanges go, the rest fits with room for an answer.
    w.commands.send(Command::SetContext(Some(small))).unwrap();
    let ((n, kept, dropped, tokens), _) = resized(&mut w);
    assert_eq!(n, small);
    assert!(
        dropped >= 1 && kept + dropped == QUESTIONS.len(),
        "{kept} {dropped}"
    );
    assert!(tokens + N_PREDICT as usize <= small, "{tokens} of {small}");
    // The conversation goes on in the small context, with what was kept in the prompt.
    let p = ask(&mut w, "And the smallest?");
    assert!(p > tokens && p <= small, "{p}: kept {tokens} of {small}");

    // `None`: the model's own context (the synthetic model's, at most 4096).
    w.commands.send(Command::SetContext(None)).unwrap();
    let ((n, _, dropped, _), _) = resized(&mut w);
    assert!(n > small && n <= 4096, "{n}");
    assert_eq!(dropped, 0);
    quit(w);
}

#[test]
fn item7_a_context_reload_that_fails_goes_back_to_the_old_context_with_the_conversation() {
    // The first backend is the start; the second, the reload for the new context, fails.
    let mut w = start(256, &[2]);
    assert_eq!(loaded(&mut w).0, 256);
    let first = ask(&mut w, QUESTIONS[0]);
    w.commands.send(Command::SetContext(Some(2048))).unwrap();
    let (n, seen) = loaded(&mut w);
    assert_eq!(n, 256, "{seen:?}");
    let said = seen
        .iter()
        .find_map(|e| match e {
            Event::Error { message, .. } => Some(message.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no error: {seen:?}"));
    assert!(
        said.contains("the device refused") && said.contains("with the context it had"),
        "{said}"
    );
    assert!(
        !seen
            .iter()
            .any(|e| matches!(e, Event::ContextResized { .. })),
        "{seen:?}"
    );
    // The first exchange is still part of the conversation: the next prompt holds it.
    let second = ask(&mut w, QUESTIONS[0]);
    assert!(second > first, "{second} <= {first}");
    quit(w);
}
