//! The real event loop (`app::event_loop::event_loop`) driven like a user drives it: key presses and
//! signals go in through its input channels, a scripted fake worker answers on a thread of its
//! own, and the test watches the screen it draws. Covers streaming, stopping, every way out
//! (clean quit, SIGTERM mid-answer, a worker that hangs, a second Ctrl-C, a worker that dies),
//! typing while the GPU is hung, /save, the clipboard, the model picker with a corrupt file,
//! and a 100 KB paste.

mod ui_common;

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crossterm::event::{Event as TermEvent, KeyCode, KeyEvent, KeyModifiers};
use hipscope::app::discover::Places;
use hipscope::app::event_loop::{Inputs, LoopIo, event_loop};
use hipscope::app::quit::{QuitConfig, QuitCoordinator};
use hipscope::app::shutdown::Ending;
use hipscope::app::transcript::{self, Transcript};
use hipscope::model::protocol::{Command, ModelSource};
use hipscope::model::worker::WorkerHandle;
use hipscope::ui::App;
use ratatui::Terminal;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use ui_common::fake_worker::{self, Mode};
use ui_common::{SharedBackend, settings};

const ANSWER: &str = "Reverse a list with slicing: xs[::-1] makes a reversed copy, while \
    xs.reverse() works in place and returns None, so never assign its result. For iteration \
    only, reversed(xs) is cheapest because it makes no copy at all.";

/// The user's side: a keyboard, a signal sender, and a view of the screen.
struct User {
    keys: UnboundedSender<io::Result<TermEvent>>,
    signals: UnboundedSender<&'static str>,
    screen: SharedBackend,
}

impl User {
    fn press(&self, code: KeyCode, mods: KeyModifiers) {
        let _ = self
            .keys
            .send(Ok(TermEvent::Key(KeyEvent::new(code, mods))));
    }

    fn key(&self, code: KeyCode) {
        self.press(code, KeyModifiers::NONE);
    }

    fn ctrl(&self, c: char) {
        self.press(KeyCode::Char(c), KeyModifiers::CONTROL);
    }

    fn type_text(&self, s: &str) {
        for c in s.chars() {
            self.key(KeyCode::Char(c));
        }
    }

    fn paste(&self, s: &str) {
        let _ = self.keys.send(Ok(TermEvent::Paste(s.to_string())));
    }

    /// Waits until `text` is on the screen (fails the test after 20 s).
    async fn sees(&self, text: &str) {
        let start = Instant::now();
        loop {
            if self.screen.screen().contains(text) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "never saw {text:?}; the screen:\n{}",
                self.screen.screen()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn until(what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

struct Run {
    ending: Ending,
    app: App,
    clipboard: Vec<u8>,
    transcript: Transcript,
    screen: SharedBackend,
    worker: WorkerHandle,
}

/// Runs the loop with `script` playing the user; returns once the loop has ended.
async fn run<F, Fut>(
    mut worker: WorkerHandle,
    dir: &Path,
    places: Places,
    quit_deadline: Duration,
    script: F,
) -> Run
where
    F: FnOnce(User) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let screen = SharedBackend::new(100, 30);
    let (keys, term_rx) = unbounded_channel();
    let (signals, sig_rx) = unbounded_channel();
    let user = User {
        keys: keys.clone(),
        signals,
        screen: screen.clone(),
    };
    let mut app = App::new(settings());
    let mut transcript =
        Transcript::create(&dir.join("conversations"), std::time::SystemTime::now());
    let mut clipboard = Vec::new();
    let mut terminal = Terminal::new(screen.clone()).unwrap();
    let script = tokio::spawn(script(user));
    let ending = event_loop(
        &mut terminal,
        Inputs {
            terminal: term_rx,
            signals: sig_rx,
        },
        &mut app,
        &mut worker,
        LoopIo {
            transcript: &mut transcript,
            clipboard: &mut clipboard,
            places,
            export_dir: dir.join("exports"),
            config_file: dir.join("config.toml"),
            frame: Duration::from_millis(15),
            // The quit's one timer, reporting its overrun to the loop instead of ending the
            // test process.
            quit: QuitCoordinator::reporting(QuitConfig {
                drain_deadline: quit_deadline,
                grace: Duration::ZERO,
                hook_timeout: Duration::from_secs(1),
            }),
            telemetry: None,
            remotes: Vec::new(),
        },
    )
    .await;
    // The script may still be waiting to type; it has nothing left to check.
    script.abort();
    drop(keys);
    Run {
        ending,
        app,
        clipboard,
        transcript,
        screen,
        worker,
    }
}

fn no_places() -> Places {
    Places::default()
}

#[tokio::test]
async fn ask_see_the_answer_stream_stop_it_and_quit() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, log) = fake_worker::spawn(ANSWER, Duration::from_millis(25), Mode::Normal);
    let script_log = log.clone();
    let r = run(
        worker,
        dir.path(),
        no_places(),
        Duration::from_secs(10),
        |u| async move {
            u.sees("Type a message and press Enter").await;
            u.type_text("How do I reverse a list?");
            u.key(KeyCode::Enter);
            // The answer streams in: a few words appear before it is done.
            u.sees("Reverse a list with").await;
            u.sees("Esc stops").await;
            u.key(KeyCode::Esc);
            u.sees("· stopped").await;
            until("stop sent", || {
                fake_worker::commands(&script_log).contains(&Command::Stop)
            })
            .await;
            // At rest the first Ctrl-C asks, the second quits.
            u.ctrl('c');
            u.ctrl('c');
        },
    )
    .await;
    assert_eq!(r.ending, Ending::Exited(0));
    let cmds = fake_worker::commands(&log);
    assert_eq!(
        cmds[0],
        Command::Generate {
            user: "How do I reverse a list?".into()
        }
    );
    assert!(cmds.contains(&Command::Stop));
    assert!(matches!(cmds.last(), Some(Command::Quit { .. })));
    // Stopped part-way: the answer on screen and in the transcript is a true prefix.
    let answer = r.app.chat.last_answer().unwrap().to_string();
    assert!(
        ANSWER.starts_with(&answer) && answer.len() < ANSWER.len(),
        "{answer}"
    );
    let saved = transcript::read(r.transcript.path().unwrap()).unwrap();
    assert_eq!(
        saved.pairs(),
        [("How do I reverse a list?".to_string(), answer.clone())]
    );
    assert!(
        saved.turns[0]
            .summary
            .as_deref()
            .unwrap()
            .ends_with("stopped")
    );
    // The last frame showed the quit steps.
    assert!(r.screen.screen().contains("release host arena"));
    drop(r.worker);
}

#[tokio::test]
async fn sigterm_mid_answer_quits_cleanly_with_the_transcript_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, log) = fake_worker::spawn(ANSWER, Duration::from_millis(25), Mode::Normal);
    let r = run(
        worker,
        dir.path(),
        no_places(),
        Duration::from_secs(10),
        |u| async move {
            u.sees("Type a message").await;
            u.type_text("Tell me about lists");
            u.key(KeyCode::Enter);
            u.sees("slicing").await;
            let _ = u.signals.send("SIGTERM");
        },
    )
    .await;
    assert_eq!(r.ending, Ending::Exited(0));
    let cmds = fake_worker::commands(&log);
    let n = cmds.len();
    assert_eq!(cmds[n - 2], Command::Stop, "{cmds:?}");
    assert!(matches!(cmds[n - 1], Command::Quit { .. }));
    let saved = transcript::read(r.transcript.path().unwrap()).unwrap();
    assert_eq!(saved.turns.len(), 1);
    assert_eq!(saved.turns[0].user, "Tell me about lists");
    assert!(
        saved.turns[0]
            .answer
            .starts_with("Reverse a list with slicing")
    );
    assert_eq!(saved.turns[0].answer, r.app.chat.last_answer().unwrap());
    assert!(r.screen.screen().contains("Quitting (SIGTERM)"));
}

#[tokio::test]
async fn typing_works_while_the_gpu_hangs_and_the_quit_deadline_forces_the_exit() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, log) = fake_worker::spawn(ANSWER, Duration::from_millis(5), Mode::HangOnGenerate);
    let started = Instant::now();
    let deadline = Duration::from_millis(400);
    let r = run(worker, dir.path(), no_places(), deadline, |u| async move {
        u.sees("Type a message").await;
        u.type_text("hello?");
        u.key(KeyCode::Enter);
        u.sees("GPU HUNG").await;
        // The worker is stuck inside a GPU call; the UI is not.
        u.type_text("still typing");
        u.sees("still typing").await;
        u.key(KeyCode::PageUp);
        u.ctrl('c');
        u.sees("Quitting (Ctrl-C)").await;
    })
    .await;
    assert!(matches!(r.ending, Ending::Forced(ref why) if why.contains("did not finish quitting")));
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(r.app.input.text(), "still typing");
    let cmds = fake_worker::commands(&log);
    assert_eq!(
        cmds,
        [Command::Generate {
            user: "hello?".into()
        }]
    );
    // The worker never read the quit: it is still stuck. The app leaves without it.
    assert!(r.worker.thread.as_ref().is_some_and(|t| !t.is_finished()));
}

#[tokio::test]
async fn a_second_ctrl_c_leaves_without_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, log) = fake_worker::spawn(ANSWER, Duration::from_millis(5), Mode::HangOnQuit);
    let script_log = log.clone();
    let r = run(
        worker,
        dir.path(),
        no_places(),
        Duration::from_secs(60),
        |u| async move {
            u.sees("Type a message").await;
            // At rest the first Ctrl-C asks, the second quits.
            u.ctrl('c');
            u.ctrl('c');
            u.sees("drain hip:0 stream 0").await;
            until("quit sent", || {
                !fake_worker::commands(&script_log).is_empty()
            })
            .await;
            u.ctrl('c');
        },
    )
    .await;
    assert_eq!(
        r.ending,
        Ending::Forced("a second Ctrl-C during the quit".into())
    );
    assert!(matches!(
        fake_worker::commands(&log).as_slice(),
        [Command::Quit { .. }]
    ));
}

#[tokio::test]
async fn a_worker_that_dies_is_reported_and_the_app_still_quits() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, _log) = fake_worker::spawn(
        "short answer",
        Duration::from_millis(5),
        Mode::DieAfterFirstAnswer,
    );
    let r = run(
        worker,
        dir.path(),
        no_places(),
        Duration::from_secs(10),
        |u| async move {
            u.sees("Type a message").await;
            u.type_text("hi");
            u.key(KeyCode::Enter);
            u.sees("stopped unexpectedly").await;
            u.key(KeyCode::Esc);
            u.type_text("again");
            u.key(KeyCode::Enter);
            u.sees("has stopped; no more answers").await;
            u.ctrl('c');
        },
    )
    .await;
    assert_eq!(r.ending, Ending::Exited(1));
    // The message that could not be sent is still in the box.
    assert_eq!(r.app.input.text(), "again");
}

#[tokio::test]
async fn save_exports_markdown_and_alt_y_copies_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, _log) =
        fake_worker::spawn("Use `xs[::-1]`.", Duration::from_millis(5), Mode::Normal);
    let out = dir.path().join("chat.md");
    let out2 = out.clone();
    let r = run(
        worker,
        dir.path(),
        no_places(),
        Duration::from_secs(10),
        |u| async move {
            u.sees("Type a message").await;
            u.type_text("reverse?");
            u.key(KeyCode::Enter);
            u.sees("end of text").await;
            u.press(KeyCode::Char('y'), KeyModifiers::ALT);
            u.sees("copied the last answer").await;
            u.type_text(&format!("/save {}", out2.display()));
            u.key(KeyCode::Enter);
            u.sees("saved the conversation").await;
            // At rest the first Ctrl-C asks, the second quits.
            u.ctrl('c');
            u.ctrl('c');
        },
    )
    .await;
    assert_eq!(r.ending, Ending::Exited(0));
    let md = std::fs::read_to_string(&out).unwrap();
    assert!(
        md.contains("## You\n\nreverse?\n\n## SmolLM2-135M-Instruct\n\nUse `xs[::-1]`.\n"),
        "{md}"
    );
    assert_eq!(
        String::from_utf8(r.clipboard).unwrap(),
        hipscope::app::clipboard::osc52("Use `xs[::-1]`.")
    );
}

#[tokio::test]
async fn save_to_a_relative_name_says_the_full_path_it_wrote() {
    // The tests run in the package root: a name relative to it, inside cargo's scratch folder.
    let scratch = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let full = scratch.path().join("notes.md");
    let relative = full
        .strip_prefix(std::env::current_dir().unwrap())
        .expect("the scratch folder is under the working directory")
        .to_path_buf();
    assert!(relative.is_relative());
    let (worker, _log) = fake_worker::spawn("Hi.", Duration::from_millis(5), Mode::Normal);
    let dir = tempfile::tempdir().unwrap();
    let name = relative.display().to_string();
    let r = run(
        worker,
        dir.path(),
        no_places(),
        Duration::from_secs(10),
        |u| async move {
            u.sees("Type a message").await;
            u.type_text(&format!("/save {name}"));
            u.key(KeyCode::Enter);
            u.sees("saved the conversation").await;
            // At rest the first Ctrl-C asks, the second quits.
            u.ctrl('c');
            u.sees("again (or").await;
            u.ctrl('c');
        },
    )
    .await;
    assert_eq!(r.ending, Ending::Exited(0));
    assert!(full.is_file());
    let said = r
        .app
        .chat
        .entries
        .iter()
        .find_map(|e| match &e.kind {
            hipscope::ui::chat::EntryKind::Notice { text, .. } if text.starts_with("saved") => {
                Some(text.clone())
            }
            _ => None,
        })
        .expect("a notice about the save");
    assert_eq!(
        said,
        format!("saved the conversation to {}", full.display())
    );
}

#[tokio::test]
async fn set_save_keeps_the_sampler_settings_in_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, _log) = fake_worker::spawn("Hi.", Duration::from_millis(5), Mode::Normal);
    let r = run(
        worker,
        dir.path(),
        no_places(),
        Duration::from_secs(10),
        |u| async move {
            u.sees("Type a message").await;
            u.type_text("/set temp 0.3");
            u.key(KeyCode::Enter);
            u.type_text("/set save");
            u.key(KeyCode::Enter);
            u.sees("kept the sampler settings").await;
            // At rest the first Ctrl-C asks, the second quits.
            u.ctrl('c');
            u.sees("again (or").await;
            u.ctrl('c');
        },
    )
    .await;
    assert_eq!(r.ending, Ending::Exited(0));
    let kept = hipscope::app::config::Config::load(&dir.path().join("config.toml")).unwrap();
    assert_eq!(kept.sampler.temp, 0.3);
}

/// A GGUF that claims more tensors than the file holds.
fn corrupt_gguf(path: &PathBuf) {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&1_000_000u64.to_le_bytes()); // tensors
    b.extend_from_slice(&0u64.to_le_bytes()); // metadata
    std::fs::write(path, b).unwrap();
}

#[tokio::test]
async fn picking_a_corrupt_gguf_says_why_and_keeps_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    let bad = models.join("broken-7b.Q4_K_M.gguf");
    corrupt_gguf(&bad);
    let places = Places {
        extra: vec![models.clone()],
        scan_defaults: false,
        ..Places::default()
    };
    let (worker, log) = fake_worker::spawn(ANSWER, Duration::from_millis(5), Mode::Normal);
    let r = run(
        worker,
        dir.path(),
        places,
        Duration::from_secs(10),
        |u| async move {
            u.sees("Type a message").await;
            u.type_text("/model");
            u.key(KeyCode::Enter);
            u.sees("broken-7b.Q4_K_M").await;
            u.sees("unreadable:").await;
            u.key(KeyCode::Enter);
            u.sees("the app keeps running").await;
            u.key(KeyCode::Esc);
            // At rest the first Ctrl-C asks, the second quits.
            u.ctrl('c');
            u.ctrl('c');
        },
    )
    .await;
    assert_eq!(r.ending, Ending::Exited(0));
    let err = r
        .app
        .chat
        .entries
        .iter()
        .find_map(|e| match &e.kind {
            hipscope::ui::chat::EntryKind::Notice { text, .. }
                if text.starts_with("cannot load") =>
            {
                Some(text.clone())
            }
            _ => None,
        })
        .expect("an error notice");
    assert!(err.contains("broken-7b.Q4_K_M.gguf"), "{err}");
    assert!(err.contains("current model stays loaded"), "{err}");
    // Nothing was sent to the worker but the quit: the loaded model stays.
    assert!(
        !fake_worker::commands(&log)
            .iter()
            .any(|c| matches!(c, Command::LoadModel(ModelSource::File(_))))
    );
    assert_eq!(r.app.model.as_ref().unwrap().name, "SmolLM2-135M-Instruct");
}

#[tokio::test]
async fn a_100_kb_paste_is_sent_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, log) = fake_worker::spawn("ok", Duration::from_millis(5), Mode::Normal);
    let big: String = (0..1900)
        .map(|i| format!("{i:05} the quick brown fox jumps over the lazy dog, again.\n"))
        .collect();
    assert!(big.len() >= 100 * 1024);
    let paste = big.clone();
    let r = run(
        worker,
        dir.path(),
        no_places(),
        Duration::from_secs(10),
        |u| async move {
            u.sees("Type a message").await;
            u.paste(&paste);
            u.sees("1,900 lines").await;
            u.key(KeyCode::Enter);
            u.sees("end of text").await;
            // At rest the first Ctrl-C asks, the second quits.
            u.ctrl('c');
            u.ctrl('c');
        },
    )
    .await;
    assert_eq!(r.ending, Ending::Exited(0));
    assert_eq!(
        fake_worker::commands(&log)[0],
        Command::Generate {
            user: big.trim_end().to_string()
        }
    );
    let saved = transcript::read(r.transcript.path().unwrap()).unwrap();
    assert_eq!(saved.turns[0].user, big.trim_end());
}
