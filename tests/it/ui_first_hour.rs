//! Issue 18's `/set ctx` and first-run download as the view meets them, through `App::update`:
//! the command sent, the notices, the context gauge, and one bar per fetch phase. (Beside
//! `ui_update.rs`, which is long enough.)

use crate::ui_common;

use hipscope::model::protocol::{Command, Event};
use hipscope::ui::App;
use ui_common::*;

/// Issue 18 item 7: `/set ctx N` asks the worker to load the model again with that context and
/// says what became of the conversation; a bad value or a busy
/// worker changes nothing and says why.
#[test]
fn item7_set_ctx_changes_the_context_and_says_what_was_kept() {
    let mut app = loaded_app();
    submit(&mut app, "q");
    stream_answer(&mut app, "a", 1);
    finish(&mut app, 1);
    for bad in ["/set ctx lots", "/set ctx -1", "/set ctx 99999999"] {
        assert!(sent(&submit(&mut app, bad)).is_empty(), "{bad}");
        let last = format!("{:?}", app.chat.entries.last().unwrap().kind);
        assert!(
            last.contains("0 (the model's whole trained context) or a whole number"),
            "{last}"
        );
        app.input.set_text("");
    }
    assert_eq!(
        sent(&submit(&mut app, "/set ctx 1024")),
        [Command::SetContext(Some(1024))]
    );
    assert!(app.loading.is_some());
    let mut model = smollm2();
    model.context_length = 1024;
    worker(
        &mut app,
        Event::ModelLoaded {
            model,
            device: rx7900xtx(),
        },
    );
    worker(
        &mut app,
        Event::ContextResized {
            n_ctx: 1024,
            kept: 1,
            dropped: 0,
            tokens: 40,
        },
    );
    let last = format!("{:?}", app.chat.entries.last().unwrap().kind);
    assert!(
        last.contains(
            "the context is now 1,024 tokens; the conversation is kept (1 exchanges, 40 tokens)"
        ),
        "{last}"
    );
    assert_eq!(app.context_fill(), Some((Some(40), 1024)));
    // Smaller than the conversation: the notice says how many exchanges were left out.
    // 0 is the whole trained context, as `-c 0` (issue 32 item 5): sent as itself.
    assert_eq!(
        sent(&submit(&mut app, "/set context 0")),
        [Command::SetContext(Some(0))]
    );
    worker(
        &mut app,
        Event::ContextResized {
            n_ctx: 256,
            kept: 2,
            dropped: 3,
            tokens: 200,
        },
    );
    let last = format!("{:?}", app.chat.entries.last().unwrap().kind);
    assert!(
        last.contains("the context is now 256 tokens; the 3 oldest of 5 exchanges no longer fit"),
        "{last}"
    );
    assert_eq!(app.context_fill(), Some((Some(200), 256)));
    // During an answer it is refused, as loading a model is.
    let mut busy = loaded_app();
    submit(&mut busy, "question");
    stream_answer(&mut busy, "partial answer", 4);
    assert!(sent(&submit(&mut busy, "/set ctx 512")).is_empty());
    let last = format!("{:?}", busy.chat.entries.last().unwrap().kind);
    assert!(last.contains("stop it first"), "{last}");
}

/// Issue 18 item 11: the phases of the first-run download are bars of their own, by name; one
/// that is done goes, the next stays.
#[test]
fn item11_each_fetch_phase_is_a_bar_of_its_own() {
    let mut app = App::new(settings());
    let phase = |task: &str, f: f32, detail: &str| Event::Progress {
        task: task.into(),
        fraction: Some(f),
        detail: detail.into(),
    };
    worker(
        &mut app,
        phase("download", 0.5, "49.2 of 98.4 MB, 12.3 MB/s, 4 s left"),
    );
    let s = screen(&app);
    assert!(
        s.contains("download") && s.contains("12.3 MB/s, 4 s left"),
        "{s}"
    );
    worker(&mut app, phase("download", 1.0, "98.4 of 98.4 MB"));
    worker(&mut app, phase("unpack", 0.25, "24.6 of 98.4 MB"));
    assert_eq!(app.progress.len(), 1);
    assert_eq!(app.progress[0].task, "unpack");
    let s = screen(&app);
    assert!(!s.contains("download"), "{s}");
    assert!(s.contains("unpack") && s.contains(" 25% "), "{s}");
}
