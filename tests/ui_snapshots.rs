//! Whole-screen snapshots, driven by scripted messages through the real `App::update` path and
//! drawn into ratatui's `TestBackend`. CI runs with `INSTA_UPDATE=no CI=true`: a new or changed
//! snapshot fails the test instead of being written.

mod ui_common;

use crossterm::event::KeyCode;
use hipscope::gpu::snapshot::{QuitStepStatus, WatchState};
use hipscope::model::protocol::{Event, StopReason};
use hipscope::ui::Msg;
use ui_common::*;

#[test]
fn empty_chat_while_loading() {
    let mut app = hipscope::ui::App::new(settings());
    worker(
        &mut app,
        Event::Progress {
            task: "loading model".into(),
            fraction: Some(0.62),
            detail: "uploading blk.18.ffn_down.weight (Q4_1, 1.1 MiB)".into(),
        },
    );
    worker(
        &mut app,
        Event::Progress {
            task: "compiling kernels".into(),
            fraction: None,
            detail: "hiprtc --offload-arch=gfx1100: matvec_q4_1".into(),
        },
    );
    insta::assert_snapshot!(draw(&app, 100, 24));
}

#[test]
fn empty_chat_loaded() {
    let app = loaded_app();
    insta::assert_snapshot!(draw(&app, 100, 24));
}

const QUESTION: &str = "How do I reverse a list in Python?";

const SHORT_ANSWER: &str = "You can reverse a list **in place** with `list.reverse()`, or make a \
reversed copy with slicing:\n\n```python\nxs = [1, 2, 3]\nys = xs[::-1]  # [3, 2, 1]\nxs.reverse()\n```\n\n\
Both are O(n). Use `reversed(xs)` when you only need to iterate.";

const LONG_ANSWER: &str = "# Reversing sequences in Python\n\n\
There are three common ways, and they differ in whether they **copy** the list.\n\n\
## 1. Slicing\n\n\
```python\nnumbers = [1, 2, 3, 4, 5]\nbackwards = numbers[::-1]\nprint(backwards)  # [5, 4, 3, 2, 1]\n```\n\n\
Slicing with a step of `-1` builds a *new* list; the original is unchanged.\n\n\
## 2. `list.reverse()`\n\n\
- reverses **in place**\n- returns `None`, so `xs = xs.reverse()` is a classic bug\n- uses no extra memory\n\n\
## 3. `reversed()`\n\n\
> `reversed()` returns an iterator, which is the cheapest option when you only loop once.\n\n\
```python\nfor n in reversed(numbers):\n    print(n)\n```\n\n\
| method | copies | returns |\n|---|---|---|\n| `[::-1]` | yes | list |\n| `.reverse()` | no | None |\n| `reversed()` | no | iterator |\n\n\
For strings, only slicing works, because strings are immutable: `\"abc\"[::-1]` gives `\"cba\"`.";

fn asked(app: &mut hipscope::ui::App) {
    tick(app, 500);
    submit(app, QUESTION);
    tick(app, 560);
}

#[test]
fn streaming_mid_answer() {
    let mut app = loaded_app();
    asked(&mut app);
    stream_answer(&mut app, &SHORT_ANSWER[..150], 3);
    tick(&mut app, 800);
    insta::assert_snapshot!(draw(&app, 100, 30));
}

#[test]
fn answer_done_with_stats() {
    let mut app = loaded_app();
    asked(&mut app);
    stream_answer(&mut app, SHORT_ANSWER, 4);
    finish(&mut app, 71);
    tick(&mut app, 1200);
    insta::assert_snapshot!(draw(&app, 100, 30));
}

const REASONING: &str = "The user wants to reverse a list. Options: slicing with [::-1] makes a \
copy; list.reverse() works in place and returns None; reversed() gives an iterator.\n\n\
Mention all three briefly, with a short example.";

/// A reasoning model's answer streaming: the reasoning in its dimmed block under "thinking…",
/// then the answer streaming in below it.
#[test]
fn reasoning_streaming_then_the_answer() {
    let mut app = loaded_app();
    asked(&mut app);
    stream_answer(&mut app, "", 1);
    stream_reasoning(&mut app, REASONING, 6);
    tick(&mut app, 800);
    insta::assert_snapshot!("reasoning_streaming_before_the_answer", draw(&app, 100, 30));
    for piece in ["You can reverse ", "a list **in place**"] {
        worker(&mut app, Event::Token { text: piece.into() });
    }
    tick(&mut app, 900);
    insta::assert_snapshot!(
        "reasoning_block_then_the_answer_streaming",
        draw(&app, 100, 30)
    );
}

/// Done: the reasoning is one line saying how long it was; Alt-T opens it, and again closes it.
/// Copying the answer copies the answer alone.
#[test]
fn reasoning_collapsed_after_the_answer_and_expanded_with_alt_t() {
    let mut app = loaded_app();
    asked(&mut app);
    stream_answer(&mut app, "", 1);
    stream_reasoning(&mut app, REASONING, 6);
    stream_answer(&mut app, SHORT_ANSWER, 4);
    worker(
        &mut app,
        Event::AnswerDone {
            stats: hipscope::model::protocol::GenStats {
                reasoning_tokens: 48,
                reasoning_time: std::time::Duration::from_millis(2400),
                ..stats(31, 119)
            },
            reason: StopReason::Eog,
        },
    );
    tick(&mut app, 1200);
    let collapsed = draw(&app, 100, 30);
    let text = format!("{collapsed:?}");
    assert!(
        text.contains("▸ thought for 48 tokens · 2.40 s · Alt-T shows it"),
        "{text}"
    );
    assert!(!text.contains("Mention all three"), "{text}");
    insta::assert_snapshot!("reasoning_collapsed", collapsed);
    app.update(alt(KeyCode::Char('t')));
    let expanded = draw(&app, 100, 30);
    let text = format!("{expanded:?}");
    assert!(text.contains("▾ thought for 48 tokens"), "{text}");
    assert!(text.contains("Mention all three briefly"), "{text}");
    insta::assert_snapshot!("reasoning_expanded", expanded);
    app.update(alt(KeyCode::Char('t')));
    assert_eq!(
        format!("{:?}", draw(&app, 100, 30)),
        format!("{collapsed:?}")
    );
    let fx = app.update(alt(KeyCode::Char('y')));
    let copied = format!("{fx:?}");
    assert!(copied.contains("Both are O(n)"), "{copied}");
    assert!(!copied.contains("The user wants"), "{copied}");
}

#[test]
fn long_markdown_answer_scrolled() {
    let mut app = loaded_app();
    asked(&mut app);
    stream_answer(&mut app, LONG_ANSWER, 5);
    finish(&mut app, 212);
    // The terminal's size, as the event loop reports it, then up a page and three lines.
    app.update(Msg::Resize(100, 30));
    app.update(key(KeyCode::PageUp));
    app.update(wheel(true));
    insta::assert_snapshot!(draw(&app, 100, 30));
}

#[test]
fn narrow_80x24_streaming() {
    let mut app = loaded_app();
    feed_diagnostics(&mut app);
    asked(&mut app);
    stream_answer(&mut app, &LONG_ANSWER[..420], 4);
    tick(&mut app, 3900);
    insta::assert_snapshot!(draw(&app, 80, 24));
}

#[test]
fn wide_200x50_all_panels() {
    let mut app = loaded_app();
    feed_diagnostics(&mut app);
    asked(&mut app);
    stream_answer(&mut app, &LONG_ANSWER[..700], 4);
    tick(&mut app, 4100);
    insta::assert_snapshot!(draw(&app, 200, 50));
}

/// Shows one diagnostics panel alone (the others toggled off with their F-keys).
fn only_panel(app: &mut hipscope::ui::App, keep: u8) {
    for f in 5..=8u8 {
        if f != keep {
            app.update(key(KeyCode::F(f)));
        }
    }
}

#[test]
fn streams_panel() {
    let mut app = loaded_app();
    feed_diagnostics(&mut app);
    only_panel(&mut app, 5);
    insta::assert_snapshot!(draw(&app, 120, 24));
}

#[test]
fn arena_panel() {
    let mut app = loaded_app();
    feed_diagnostics(&mut app);
    only_panel(&mut app, 6);
    insta::assert_snapshot!(draw(&app, 120, 24));
}

#[test]
fn watchdog_panel_slow() {
    let mut app = loaded_app();
    feed_diagnostics(&mut app);
    worker(&mut app, Event::Watchdog(watchdog(WatchState::Slow, 1_430)));
    only_panel(&mut app, 7);
    insta::assert_snapshot!(draw(&app, 120, 24));
}

#[test]
fn gpu_panel() {
    let mut app = loaded_app();
    feed_diagnostics(&mut app);
    only_panel(&mut app, 8);
    insta::assert_snapshot!(draw(&app, 120, 30));
}

#[test]
fn cpu_backend_panels() {
    let mut app = loaded_cpu_app();
    worker(&mut app, Event::Watchdog(cpu_watchdog()));
    for i in 0..8u64 {
        tick(&mut app, 1000 + i * 250);
        let cpu = [20.0, 55.0, 98.0, 99.0, 97.0, 99.0, 60.0, 15.0][i as usize];
        app.update(Msg::Host(host(Some(cpu))));
    }
    insta::assert_snapshot!(draw(&app, 140, 36));
}

/// A machine without a GPU, in a terminal too narrow for the diagnostics column: the header says
/// the watchdog watches the CPU (no "GPU OK", no device queue).
#[test]
fn narrow_80x24_on_the_cpu() {
    let mut app = loaded_cpu_app();
    worker(&mut app, Event::Watchdog(cpu_watchdog()));
    let screen = draw(&app, 80, 24);
    let text = screen.to_string();
    let header = text.lines().next().unwrap_or_default().to_string();
    assert!(header.contains("CPU OK"), "{header}");
    assert!(!header.contains("GPU"), "{header}");
    insta::assert_snapshot!(screen);
}

/// On the CPU with a conversation going: the Arena panel tells the fixed weights from the live
/// KV cache (1,231 of 8,192 tokens) and scratch, never "100% used"; the Host panel shows the
/// machine's CPU use and hipscope's own, each graph with its scale.
#[test]
fn cpu_backend_panels_during_a_conversation() {
    let mut app = loaded_cpu_app();
    worker(&mut app, Event::Watchdog(cpu_watchdog()));
    worker(&mut app, Event::Arena(cpu_arena()));
    asked(&mut app);
    stream_answer(&mut app, "You can reverse a list", 4);
    worker(
        &mut app,
        Event::AnswerDone {
            stats: stats(1_200, 31),
            reason: StopReason::Eog,
        },
    );
    for i in 0..8u64 {
        tick(&mut app, 1000 + i * 250);
        let cpu = [20.0, 55.0, 98.0, 99.0, 97.0, 99.0, 60.0, 15.0][i as usize];
        app.update(Msg::Host(host(Some(cpu))));
    }
    let screen = draw(&app, 140, 40);
    let text = format!("{screen:?}");
    assert!(
        !text.contains("largest free"),
        "nothing reads as full:\n{text}"
    );
    assert!(text.contains("1,231 / 8,192 tok"), "{text}");
    insta::assert_snapshot!(screen);
}

/// Before any model is loaded the side column shows the host, not "Waiting for the device…".
#[test]
fn panels_before_a_model_is_loaded() {
    let mut app = hipscope::ui::App::new(settings());
    for i in 0..4u64 {
        tick(&mut app, 1000 + i * 250);
        app.update(Msg::Host(host(Some([30.0, 80.0, 60.0, 40.0][i as usize]))));
    }
    let screen = draw(&app, 140, 36);
    let text = format!("{screen:?}");
    assert!(!text.contains("Waiting for the device"), "{text}");
    insta::assert_snapshot!(screen);
}

#[test]
fn hung_banner() {
    let mut app = loaded_app();
    feed_diagnostics(&mut app);
    asked(&mut app);
    stream_answer(&mut app, "You can reverse a list", 4);
    worker(
        &mut app,
        Event::Watchdog(watchdog(WatchState::Hung, 14_250)),
    );
    tick(&mut app, 16_000);
    insta::assert_snapshot!(draw(&app, 140, 36));
}

#[test]
fn quit_in_progress() {
    let mut app = loaded_app();
    feed_diagnostics(&mut app);
    tick(&mut app, 10_000);
    assert!(
        app.update(ctrl('c')).is_empty(),
        "the first Ctrl-C at rest asks"
    );
    let fx = app.update(ctrl('c'));
    assert!(!fx.is_empty(), "the second Ctrl-C at rest starts the quit");
    for step in [
        quit_step("stop intake", QuitStepStatus::Done, 40),
        quit_step(
            "drain hip:0 stream 0 (37 ops)",
            QuitStepStatus::Done,
            12_400,
        ),
        quit_step(
            "destroy rocBLAS handle",
            QuitStepStatus::Skipped("no BLAS in use".into()),
            3,
        ),
        quit_step("destroy 96 events", QuitStepStatus::Done, 210),
        quit_step("unload 7 kernel modules", QuitStepStatus::Running, 900),
    ] {
        worker(&mut app, Event::QuitStep(step));
    }
    tick(&mut app, 11_350);
    insta::assert_snapshot!(draw(&app, 100, 30));
}

#[test]
fn error_dialog_after_a_failed_load() {
    let mut app = loaded_app();
    submit(&mut app, "/model /home/ada/models/broken.gguf");
    worker(
        &mut app,
        Event::Error {
            context: "loading /home/ada/models/broken.gguf".into(),
            message: "tensor `blk.3.attn_q.weight` ends at byte 61,440,128, past the end of the \
                      file (41,943,040 bytes): the file is truncated. Download it again."
                .into(),
        },
    );
    insta::assert_snapshot!(draw(&app, 100, 24));
}

#[test]
fn help_screen() {
    let mut app = loaded_app();
    app.update(key(KeyCode::F(1)));
    insta::assert_snapshot!(draw(&app, 100, 40));
}

#[test]
fn sampler_form_with_a_bad_value() {
    let mut app = loaded_app();
    submit(&mut app, "/set");
    app.update(key(KeyCode::Down)); // top_k
    app.update(key(KeyCode::Down)); // top_p
    app.update(ctrl('u'));
    type_text(&mut app, "1.5");
    app.update(key(KeyCode::Enter));
    insta::assert_snapshot!(draw(&app, 100, 24));
}

#[test]
fn unknown_command_keeps_the_text() {
    let mut app = loaded_app();
    submit(&mut app, "/frobnicate the model");
    insta::assert_snapshot!(draw(&app, 80, 24));
}

#[test]
fn system_prompt_editor() {
    let mut app = loaded_app();
    submit(&mut app, "/system");
    type_text(&mut app, "You are a terse assistant.");
    app.update(alt(KeyCode::Enter));
    type_text(&mut app, "Answer in one sentence.");
    insta::assert_snapshot!(draw(&app, 100, 24));
}

#[test]
fn stopped_answer() {
    let mut app = loaded_app();
    asked(&mut app);
    stream_answer(&mut app, "Sure! Here is a long explanation of", 5);
    let fx = app.update(key(KeyCode::Esc));
    assert_eq!(
        fx,
        vec![hipscope::ui::Effect::Send(
            hipscope::model::protocol::Command::Stop
        )]
    );
    worker(
        &mut app,
        Event::AnswerDone {
            stats: stats(31, 7),
            reason: StopReason::User,
        },
    );
    app.update(Msg::Tick(std::time::Duration::from_secs(2)));
    insta::assert_snapshot!(draw(&app, 80, 24));
}

#[test]
fn model_picker_with_an_unreadable_file() {
    use hipscope::ui::picker::{ModelEntry, ModelHeader};
    let mut app = loaded_app();
    let fx = submit(&mut app, "/model");
    assert_eq!(fx, vec![hipscope::ui::Effect::Discover]);
    let entry = |name: &str, path: &str, source: &str, size: u64, header| ModelEntry {
        remote: None,
        name: name.into(),
        path: path.into(),
        source: source.into(),
        size,
        header,
    };
    let ok = |arch: &str, quant: &str, params: u64| {
        Ok(ModelHeader {
            architecture: arch.into(),
            quant: quant.into(),
            parameters: Some(params),
            context_length: Some(8192),
            name: None,
        })
    };
    app.update(Msg::Models {
        entries: vec![
            entry(
                "SmolLM2-135M-Instruct.Q4_1",
                "/home/ada/.cache/hipscope/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                "hipscope",
                98_362_432,
                ok("llama", "Q4_1", 134_515_008),
            ),
            entry(
                "qwen2.5:0.5b",
                "/home/ada/.ollama/models/blobs/sha256-c5396e06af294bd101b30dce59131a76d2b773e76950acc870eda801d3ab0515",
                "ollama",
                397_807_936,
                ok("qwen2", "Q4_K", 494_032_768),
            ),
            entry(
                "Llama-3.2-1B-Instruct-Q4_K_M (bartowski/Llama-3.2-1B-Instruct-GGUF)",
                "/home/ada/.cache/huggingface/hub/models--bartowski--Llama-3.2-1B-Instruct-GGUF/snapshots/067b946/Llama-3.2-1B-Instruct-Q4_K_M.gguf",
                "Hugging Face",
                807_690_656,
                ok("llama", "Q4_K", 1_235_814_432),
            ),
            entry(
                "broken-7b.Q4_K_M",
                "/home/ada/models/broken-7b.Q4_K_M.gguf",
                "config",
                41_943_040,
                Err("/home/ada/models/broken-7b.Q4_K_M.gguf: the file ends before the tensor infos (in tensor 183, at byte 41943040)".into()),
            ),
        ],
        searched: vec![],
    });
    app.update(key(KeyCode::Down));
    insta::assert_snapshot!(draw(&app, 110, 26));
}

#[test]
fn watchdog_panel_grown_from_the_keyboard() {
    // Alt-↓ three times focuses the Watchdog panel; Alt-+ four times gives it eight more rows,
    // which show its age history, taken from the tallest panel (the arena).
    let mut app = loaded_app();
    feed_diagnostics(&mut app);
    for ms in [300, 900, 1_430, 200, 0, 2_600] {
        let state = if ms > 2_000 {
            WatchState::Hung
        } else if ms > 1_000 {
            WatchState::Slow
        } else {
            WatchState::Ok
        };
        worker(&mut app, Event::Watchdog(watchdog(state, ms)));
    }
    worker(&mut app, Event::Watchdog(watchdog(WatchState::Ok, 150)));
    for _ in 0..3 {
        app.update(alt(KeyCode::Down));
    }
    for _ in 0..4 {
        app.update(alt(KeyCode::Char('+')));
    }
    let backend = draw(&app, 140, 40);
    // The focused panel's frame is drawn in the focus colour, the others in the plain one.
    let buf = backend.buffer();
    let theme = hipscope::ui::theme::Theme::default();
    let corner = |title: &str| {
        (0..40)
            .find_map(|y| {
                let row: String = (0..140).map(|x| buf[(x, y)].symbol()).collect();
                row.find(&format!("╭ {title} "))
                    .map(|i| &buf[(row[..i].chars().count() as u16, y)])
            })
            .unwrap_or_else(|| panic!("{title} panel drawn"))
    };
    assert_eq!(corner("Watchdog").fg, theme.border_focus.fg.unwrap());
    assert_eq!(corner("Streams").fg, theme.border.fg.unwrap());
    insta::assert_snapshot!(backend);
}

#[test]
fn theme_styles_reach_the_screen() {
    // Snapshots show text only; this checks that the HUNG banner is drawn in its own style and
    // that code blocks carry the code background.
    let mut app = loaded_app();
    asked(&mut app);
    stream_answer(&mut app, SHORT_ANSWER, 8);
    finish(&mut app, 20);
    worker(&mut app, Event::Watchdog(watchdog(WatchState::Hung, 5_000)));
    let backend = draw(&app, 100, 30);
    let buf = backend.buffer();
    let theme = hipscope::ui::theme::Theme::default();
    let banner = (0..100)
        .map(|x| &buf[(x, 1)])
        .find(|c| c.symbol() == "⚠")
        .expect("banner on row 1");
    assert_eq!(banner.bg, theme.hung_banner.bg.unwrap());
    let row = (0..30)
        .find(|&y| {
            (0..100)
                .map(|x| buf[(x, y)].symbol())
                .collect::<String>()
                .contains("xs = [1, 2, 3]")
        })
        .expect("code row");
    let code_cell = &buf[(4, row)];
    assert_eq!(code_cell.bg, theme.code_block.bg.unwrap());
}

/// A remote llama-server in place of the model: the Streams panel shows its slots (from the
/// captured `/slots` and `/metrics` pages), the Arena its KV cache in tokens, the header marks an
/// unverified TLS connection, and a request that stopped answering gets the server's banner.
#[test]
fn remote_engine_panels_and_a_hung_server() {
    use hipscope::gpu::snapshot::{DeviceSummary, WatchdogSnapshot};
    use hipscope::model::protocol::ModelSummary;
    use hipscope::model::remote::panels::{self, RemoteSample};
    use hipscope::model::remote::prom::Metrics;
    let data = |f: &str| {
        std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data/remote")
                .join(f),
        )
        .unwrap()
    };
    let mut app = hipscope::ui::App::new(settings());
    worker(
        &mut app,
        Event::ModelLoaded {
            model: ModelSummary {
                name: "SmolLM2-135M-Instruct.Q4_1.gguf".into(),
                architecture: "llama-server".into(),
                context_length: 1024,
                ..ModelSummary::default()
            },
            device: DeviceSummary {
                backend: "remote".into(),
                name: "llama-server at gpu-box:8080".into(),
                arch: "gpu-box".into(),
                reason: format!(
                    "remote engine https://gpu-box:8080 · {}",
                    hipscope::model::remote::INSECURE_MARK
                ),
                ..DeviceSummary::default()
            },
        },
    );
    let mut s = RemoteSample {
        server: "llama-server".into(),
        ..RemoteSample::default()
    };
    panels::apply_llama_metrics(
        &mut s,
        &Metrics::parse(&data("llama-server-metrics_busy.txt")).unwrap(),
    );
    panels::apply_slots(
        &mut s,
        panels::parse_slots(&data("llama-server-slots_busy.json")).unwrap(),
    );
    worker(&mut app, Event::Streams(panels::streams(&s)));
    worker(&mut app, Event::Arena(panels::arena(&s).unwrap()));
    asked(&mut app);
    stream_answer(&mut app, "You can reverse a list", 4);
    worker(
        &mut app,
        Event::Watchdog(WatchdogSnapshot {
            state: WatchState::Hung,
            stream: "remote gpu-box:8080".into(),
            op: Some("mid-answer".into()),
            age: std::time::Duration::from_millis(12_500),
            budget: std::time::Duration::from_secs(10),
            last_completed: Some("4 tokens received".into()),
            queue_depth: 1,
            op_started: true,
            ..WatchdogSnapshot::default()
        }),
    );
    tick(&mut app, 16_000);
    let screen = draw(&app, 140, 36);
    let text = format!("{screen:?}");
    for want in [
        "SERVER HUNG",
        "TLS NOT VERIFIED",
        "KV cache 50 / 2,048 tokens",
        "slot 1 (llama-server /slots) depth 1",
        "the server stopped answering",
    ] {
        assert!(text.contains(want), "{want:?} not on the screen:\n{text}");
    }
    insta::assert_snapshot!(screen);
}

/// A remote engine's GPU panel: the server's API reports no devices (this machine's GPU is not
/// shown in their place), and this chat's latency as measured here — time to first token, mean
/// inter-token latency and tokens/s of the last answer — with one history point per answer.
#[test]
fn remote_engine_gpu_panel_latency_history() {
    use hipscope::gpu::snapshot::DeviceSummary;
    use hipscope::model::protocol::{GenStats, ModelSummary};
    use std::time::Duration;
    let mut app = hipscope::ui::App::new(settings());
    worker(
        &mut app,
        Event::ModelLoaded {
            model: ModelSummary {
                name: "Qwen3-235B-A22B".into(),
                architecture: "vLLM".into(),
                context_length: 32768,
                ..ModelSummary::default()
            },
            device: DeviceSummary {
                backend: "remote".into(),
                name: "vLLM at node7:8000".into(),
                arch: "cluster".into(),
                reason: "remote engine http://node7:8000".into(),
                ..DeviceSummary::default()
            },
        },
    );
    // (time to first token, tokens, streaming time) of three answers.
    for (ttft, n, streamed) in [(420u64, 40usize, 1600u64), (180, 64, 2100), (210, 25, 900)] {
        asked(&mut app);
        stream_answer(&mut app, "Paris.", 2);
        worker(
            &mut app,
            Event::AnswerDone {
                stats: GenStats {
                    prompt_tokens: 31,
                    generated_tokens: n,
                    gen_time: Duration::from_millis(streamed),
                    time_to_first_token: Duration::from_millis(ttft),
                    ..GenStats::default()
                },
                reason: StopReason::Eog,
            },
        );
    }
    only_panel(&mut app, 8);
    let screen = draw(&app, 120, 30);
    let text = format!("{screen:?}");
    for want in [
        "GPU · remote engine",
        "devices: the server's API reports none",
        "this chat, client side (3 answers):",
        "ttft    210 ms",
        // 900 ms over the 24 gaps between 25 tokens; 25 tokens in 0.9 s.
        "itl     37.5 ms mean",
        "speed   27.8 t/s · 25 tokens",
        "ttft · 0–420 ms",
        "itl · 0–41 ms",
        "speed · 0–30 t/s",
    ] {
        assert!(text.contains(want), "{want:?} not on the screen:\n{text}");
    }
    insta::assert_snapshot!(screen);
}
