//! The keys and commands as a user meets them, checked through `App::update`: which commands
//! reach the worker, what stays in the message box, when the app quits and when it leaves at
//! once.

use crate::ui_common;

use std::path::PathBuf;
use std::time::Duration;

use crossterm::event::KeyCode;
use hipscope::gpu::snapshot::{DeviceRelease, WatchState};
use hipscope::model::protocol::{Command, Event, ModelSource, StopReason};
use hipscope::ui::quit_screen::WorkerEnd;
use hipscope::ui::state::{GenState, Overlay};
use hipscope::ui::{App, Effect, Msg};
use ui_common::*;

fn is_quit(c: &Command) -> bool {
    matches!(c, Command::Quit { .. })
}

fn streaming_app() -> App {
    let mut app = loaded_app();
    submit(&mut app, "question");
    stream_answer(&mut app, "partial answer", 4);
    app
}

#[test]
fn ctrl_c_stops_an_answer_then_quits_then_leaves() {
    let mut app = streaming_app();
    assert_eq!(sent(&app.update(ctrl('c'))), [Command::Stop]);
    assert_eq!(app.generation, GenState::Stopping);
    // The stop was asked for and not confirmed: the next Ctrl-C quits.
    let fx = sent(&app.update(ctrl('c')));
    assert!(fx.iter().any(is_quit), "{fx:?}");
    assert!(app.is_quitting());
    assert_eq!(app.update(ctrl('c')), [Effect::ForceExit]);
}

#[test]
fn ctrl_c_when_hung_quits_at_once() {
    let mut app = streaming_app();
    worker(&mut app, Event::Watchdog(watchdog(WatchState::Hung, 9_000)));
    let fx = sent(&app.update(ctrl('c')));
    assert_eq!(fx.len(), 2, "{fx:?}");
    assert_eq!(fx[0], Command::Stop);
    assert!(is_quit(&fx[1]));
}

#[test]
fn ctrl_c_at_rest_asks_for_a_second_press_within_two_seconds() {
    let mut app = loaded_app();
    tick(&mut app, 1_000);
    assert!(
        app.update(ctrl('c')).is_empty(),
        "the first press only asks"
    );
    assert!(!app.is_quitting());
    assert!(
        screen(&app).contains("press Ctrl-C again (or Ctrl-D, /quit) to quit"),
        "{}",
        screen(&app)
    );
    // Too late: the question has gone and the next press asks again.
    tick(&mut app, 3_100);
    assert!(!screen(&app).contains("press Ctrl-C again"));
    assert!(app.update(ctrl('c')).is_empty());
    tick(&mut app, 4_500);
    let fx = sent(&app.update(ctrl('c')));
    assert!(fx.iter().any(is_quit), "{fx:?}");
}

#[test]
fn ctrl_c_that_stops_an_answer_does_not_count_towards_quitting() {
    let mut app = streaming_app();
    assert_eq!(sent(&app.update(ctrl('c'))), [Command::Stop]);
    finish(&mut app, 4);
    // Meant for the answer that just ended: asks first.
    assert!(app.update(ctrl('c')).is_empty());
    assert!(!app.is_quitting());
}

#[test]
fn alt_l_asks_before_clearing_and_any_other_key_keeps_the_conversation() {
    let mut app = loaded_app();
    submit(&mut app, "question");
    stream_answer(&mut app, "answer", 3);
    finish(&mut app, 3);
    let alt_l = || alt(KeyCode::Char('l'));
    assert!(sent(&app.update(alt_l())).is_empty());
    assert!(screen(&app).contains("press Alt-L again to clear"));
    app.update(key(KeyCode::Right));
    assert!(sent(&app.update(alt_l())).is_empty(), "asked again");
    assert_eq!(sent(&app.update(alt_l())), [Command::Clear]);
    assert!(!app.chat.has_user_message());
}

#[test]
fn tab_completes_commands_and_lists_the_matches() {
    let mut app = loaded_app();
    type_text(&mut app, "/cl");
    assert!(app.update(key(KeyCode::Tab)).is_empty());
    assert_eq!(app.input.text(), "/clear ");
    app.input.take();
    type_text(&mut app, "/s");
    app.update(key(KeyCode::Tab));
    assert_eq!(app.input.text(), "/s", "three commands start with /s");
    let s = screen(&app);
    assert!(s.contains("/system  /set  /save"), "{s}");
    // The list goes with the next key.
    type_text(&mut app, "a");
    assert!(!screen(&app).contains("/system  /set"));
    app.update(key(KeyCode::Tab));
    assert_eq!(app.input.text(), "/save ");
    // After /save, Tab asks the app layer for the folder's files.
    type_text(&mut app, "out/co");
    assert_eq!(
        app.update(key(KeyCode::Tab)),
        [Effect::ListPaths("out/co".into())]
    );
    app.update(Msg::Paths {
        typed: "out/co".into(),
        names: vec!["out/conv-1.md".into(), "out/conv-2.md".into()],
    });
    assert_eq!(app.input.text(), "/save out/conv-");
    assert!(screen(&app).contains("conv-1.md  conv-2.md"));
    app.update(Msg::Paths {
        typed: "out/conv-".into(),
        names: vec!["out/conv-2.md".into()],
    });
    assert_eq!(app.input.text(), "/save out/conv-2.md ");
}

#[test]
fn readline_keys_reach_the_message_box() {
    let mut app = loaded_app();
    type_text(&mut app, "first second");
    app.update(ctrl('w'));
    assert_eq!(app.input.text(), "first ");
    app.update(ctrl('a'));
    app.update(ctrl('k'));
    assert!(app.input.is_empty());
    app.update(ctrl('z'));
    assert_eq!(app.input.text(), "first ");
    app.update(ctrl('u'));
    assert!(
        app.input.is_empty(),
        "Ctrl-U deletes to the start of the line"
    );
}

#[test]
fn ctrl_c_twice_at_rest_quits_with_the_configured_drain_deadline() {
    let mut app = loaded_app();
    assert!(app.update(ctrl('c')).is_empty());
    assert_eq!(
        sent(&app.update(ctrl('c'))),
        [Command::Quit {
            drain_deadline: Duration::from_secs(5)
        }]
    );
    // Keys other than Ctrl-C do nothing during the quit.
    assert!(app.update(key(KeyCode::Char('x'))).is_empty());
    assert!(app.input.is_empty());
    worker(
        &mut app,
        Event::Exited {
            release: DeviceRelease::Clean,
        },
    );
    assert_eq!(
        app.worker_ended(),
        Some(WorkerEnd::Released(DeviceRelease::Clean))
    );
}

#[test]
fn ctrl_d_quits_only_an_empty_message_box() {
    let mut app = loaded_app();
    type_text(&mut app, "abc");
    app.update(key(KeyCode::Left));
    assert!(sent(&app.update(ctrl('d'))).is_empty());
    assert_eq!(
        app.input.text(),
        "ab",
        "Ctrl-D deletes the character under the cursor"
    );
    app.input.take();
    assert!(sent(&app.update(ctrl('d'))).iter().any(is_quit));
}

#[test]
fn plain_letters_always_type() {
    // While an answer streams.
    let mut app = streaming_app();
    type_text(&mut app, "next q");
    assert_eq!(app.input.text(), "next q");
    // Over the help screen: the window closes and the letter lands in the box.
    app.update(key(KeyCode::F(1)));
    assert!(matches!(app.overlay, Overlay::Help { .. }));
    type_text(&mut app, "!");
    assert!(matches!(app.overlay, Overlay::None));
    assert_eq!(app.input.text(), "next q!");
    // Under an error dialog.
    worker(
        &mut app,
        Event::Error {
            context: "x".into(),
            message: "y".into(),
        },
    );
    assert_eq!(app.errors.len(), 1);
    type_text(&mut app, "?");
    assert_eq!(app.input.text(), "next q!?");
    app.update(key(KeyCode::Esc));
    assert!(app.errors.is_empty());
}

#[test]
fn enter_during_an_answer_keeps_the_message() {
    let mut app = streaming_app();
    let fx = submit(&mut app, "follow-up");
    assert!(sent(&fx).is_empty());
    assert_eq!(app.input.text(), "follow-up");
    finish(&mut app, 4);
    let fx = app.update(key(KeyCode::Enter));
    assert_eq!(
        sent(&fx),
        [Command::Generate {
            user: "follow-up".into()
        }]
    );
    assert!(app.input.is_empty());
}

#[test]
fn a_message_sent_while_loading_goes_out_when_the_model_is_ready() {
    let mut app = App::new(settings());
    assert!(sent(&submit(&mut app, "too early")).is_empty());
    assert!(app.input.is_empty(), "the message waits outside the box");
    // A second one cannot queue behind it: it stays in the box.
    assert!(sent(&submit(&mut app, "second")).is_empty());
    assert_eq!(app.input.text(), "second");
    let fx = worker(
        &mut app,
        Event::ModelLoaded {
            model: smollm2(),
            device: rx7900xtx(),
        },
    );
    assert_eq!(
        sent(&fx),
        [Command::Generate {
            user: "too early".into()
        }]
    );
    assert!(matches!(app.generation, GenState::Waiting { .. }));
}

#[test]
fn a_message_waiting_for_a_model_that_fails_comes_back_to_the_box() {
    let mut app = App::new(settings());
    submit(&mut app, "hello");
    worker(
        &mut app,
        Event::Error {
            context: "loading the model".into(),
            message: "truncated file".into(),
        },
    );
    assert_eq!(app.input.text(), "hello");
    assert!(app.pending.is_none());
}

#[test]
fn history_recalls_sent_messages() {
    let mut app = loaded_app();
    submit(&mut app, "first");
    finish(&mut app, 1);
    submit(&mut app, "second\nline two");
    finish(&mut app, 1);
    type_text(&mut app, "draft");
    app.update(key(KeyCode::Up));
    assert_eq!(app.input.text(), "second\nline two");
    app.update(key(KeyCode::Up));
    assert_eq!(app.input.text(), "first");
    app.update(key(KeyCode::Down));
    app.update(key(KeyCode::Down));
    app.update(key(KeyCode::Down));
    assert_eq!(app.input.text(), "draft");
}

#[test]
fn alt_enter_and_ctrl_j_insert_new_lines() {
    let mut app = loaded_app();
    type_text(&mut app, "a");
    app.update(alt(KeyCode::Enter));
    type_text(&mut app, "b");
    app.update(ctrl('j'));
    type_text(&mut app, "c");
    assert_eq!(app.input.text(), "a\nb\nc");
    assert_eq!(
        sent(&app.update(key(KeyCode::Enter))),
        [Command::Generate {
            user: "a\nb\nc".into()
        }]
    );
}

#[test]
fn slash_commands_reach_the_worker() {
    let mut app = loaded_app();
    submit(&mut app, "q");
    stream_answer(&mut app, "a", 1);
    finish(&mut app, 1);
    assert_eq!(sent(&submit(&mut app, "/regen")), [Command::Regenerate]);
    assert!(app.chat.last_answer().is_none(), "the old answer is gone");
    stream_answer(&mut app, "b", 1);
    finish(&mut app, 1);
    assert_eq!(
        sent(&submit(&mut app, "/system Be terse.")),
        [Command::SetSystem("Be terse.".into())]
    );
    let fx = sent(&submit(&mut app, "/set temp 0.25"));
    let [Command::SetSampler(cfg)] = fx.as_slice() else {
        panic!("{fx:?}")
    };
    assert_eq!(cfg.temp, 0.25);
    assert_eq!(app.sampler.temp, 0.25);
    assert_eq!(
        sent(&submit(&mut app, "/model /m/other.gguf")),
        [Command::LoadModel(ModelSource::File(
            "/m/other.gguf".into()
        ))]
    );
    assert_eq!(
        submit(&mut app, "/save /tmp/x.md"),
        [Effect::Export {
            path: Some(PathBuf::from("/tmp/x.md")),
            overwrite: false
        }]
    );
    assert_eq!(sent(&submit(&mut app, "/clear")), [Command::Clear]);
    assert!(app.chat.last_answer().is_none());
    assert!(sent(&submit(&mut app, "/quit")).iter().any(is_quit));
}

#[test]
fn a_bad_set_changes_nothing_and_says_why() {
    let mut app = loaded_app();
    let before = app.sampler.clone();
    assert!(sent(&submit(&mut app, "/set temp 9")).is_empty());
    assert_eq!(app.sampler, before);
    let last = format!("{:?}", app.chat.entries.last().unwrap().kind);
    assert!(last.contains("a number from 0 to 5"), "{last}");
}

#[test]
fn an_unknown_command_stays_in_the_box_to_be_fixed() {
    let mut app = loaded_app();
    assert!(submit(&mut app, "/frobnicate").is_empty());
    assert_eq!(app.input.text(), "/frobnicate");
    let last = format!("{:?}", app.chat.entries.last().unwrap().kind);
    assert!(last.contains("unknown command /frobnicate"), "{last}");
}

#[test]
fn clearing_or_loading_during_an_answer_is_refused() {
    let mut app = streaming_app();
    assert!(sent(&submit(&mut app, "/clear")).is_empty());
    assert!(sent(&submit(&mut app, "/model /m/x.gguf")).is_empty());
    assert_eq!(app.chat.last_answer(), Some("partial answer"));
}

#[test]
fn copy_takes_the_answer_or_a_code_block() {
    let mut app = loaded_app();
    submit(&mut app, "q");
    stream_answer(
        &mut app,
        "Two:\n```sh\nls\n```\nand\n```py\nprint(1)\n```\n",
        7,
    );
    finish(&mut app, 9);
    let copied = |fx: Vec<Effect>| match fx.as_slice() {
        [Effect::Copy { text, .. }] => text.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(copied(app.update(alt(KeyCode::Char('c')))), "print(1)\n");
    assert_eq!(copied(submit(&mut app, "/copy code 1")), "ls\n");
    assert!(copied(app.update(alt(KeyCode::Char('y')))).starts_with("Two:"));
    assert!(submit(&mut app, "/copy code 3").is_empty());
}

#[test]
fn sigterm_quits_and_a_second_one_leaves() {
    let mut app = streaming_app();
    let fx = sent(&app.update(Msg::Terminate("SIGTERM")));
    assert_eq!(fx[0], Command::Stop);
    assert!(is_quit(&fx[1]));
    assert_eq!(app.update(Msg::Terminate("SIGTERM")), [Effect::ForceExit]);
}

#[test]
fn the_sampler_form_applies_valid_values() {
    let mut app = loaded_app();
    app.update(key(KeyCode::F(3)));
    app.update(ctrl('u'));
    type_text(&mut app, "0");
    let fx = sent(&app.update(key(KeyCode::Enter)));
    let [Command::SetSampler(cfg)] = fx.as_slice() else {
        panic!("{fx:?}")
    };
    assert_eq!(cfg.temp, 0.0);
    assert!(matches!(app.overlay, Overlay::None));
}

#[test]
fn the_system_editor_saves_on_enter() {
    let mut app = loaded_app();
    app.update(key(KeyCode::F(4)));
    type_text(&mut app, "Line one");
    app.update(alt(KeyCode::Enter));
    type_text(&mut app, "line two");
    assert_eq!(
        sent(&app.update(key(KeyCode::Enter))),
        [Command::SetSystem("Line one\nline two".into())]
    );
    assert_eq!(app.system_prompt, "Line one\nline two");
}

#[test]
fn panels_toggle_and_the_column_resizes_within_bounds() {
    let mut app = loaded_app();
    app.update(key(KeyCode::F(6)));
    assert!(!app.panels.arena);
    assert_eq!(app.sidebar, None);
    app.update(key(KeyCode::F(6)));
    assert!(app.panels.arena);
    assert_eq!(app.sidebar, Some(true), "showing a panel shows its column");
    for _ in 0..50 {
        app.update(alt(KeyCode::Right));
    }
    assert_eq!(app.sidebar_width, hipscope::ui::settings::SIDEBAR_MAX);
    for _ in 0..50 {
        app.update(alt(KeyCode::Left));
    }
    assert_eq!(app.sidebar_width, hipscope::ui::settings::SIDEBAR_MIN);
    app.update(Msg::Resize(200, 50));
    app.update(key(KeyCode::F(9)));
    assert!(!app.sidebar_visible(200));
}

#[test]
fn panels_take_focus_and_grow_or_shrink_from_the_keyboard() {
    use hipscope::ui::settings::{PANEL_EXTRA_MAX, PANEL_EXTRA_MIN, PANEL_STEP, PanelId};
    let mut app = loaded_app();
    // Nothing focused until asked: Alt-↓ picks the top panel, Alt-↑ the bottom one.
    assert_eq!(app.panel_focus, None);
    app.update(alt(KeyCode::Down));
    assert_eq!(app.panel_focus, Some(PanelId::Streams));
    assert_eq!(app.sidebar, Some(true), "focusing a panel shows its column");
    app.update(alt(KeyCode::Up));
    assert_eq!(app.panel_focus, Some(PanelId::Gpu), "wraps around");
    // Hidden panels are skipped.
    app.update(key(KeyCode::F(6)));
    app.update(alt(KeyCode::Down));
    app.update(alt(KeyCode::Down));
    assert_eq!(app.panel_focus, Some(PanelId::Watchdog));
    app.update(alt(KeyCode::Char('+')));
    app.update(alt(KeyCode::Char('=')));
    assert_eq!(app.panel_extra[PanelId::Watchdog.index()], 2 * PANEL_STEP);
    app.update(alt(KeyCode::Char('-')));
    assert_eq!(app.panel_extra[PanelId::Watchdog.index()], PANEL_STEP);
    assert_eq!(
        app.panel_extra[PanelId::Streams.index()],
        0,
        "only the focused one"
    );
    for _ in 0..100 {
        app.update(alt(KeyCode::Char('+')));
    }
    assert_eq!(app.panel_extra[PanelId::Watchdog.index()], PANEL_EXTRA_MAX);
    for _ in 0..100 {
        app.update(alt(KeyCode::Char('-')));
    }
    assert_eq!(app.panel_extra[PanelId::Watchdog.index()], PANEL_EXTRA_MIN);
    app.update(alt(KeyCode::Char('0')));
    assert_eq!(app.panel_extra, [0; 4]);
    // Plain keys still type.
    app.update(key(KeyCode::Char('+')));
    assert_eq!(app.input.text(), "+");
}

#[test]
fn resizing_with_nothing_focused_resizes_the_top_panel_shown() {
    use hipscope::ui::settings::{PANEL_STEP, PanelId};
    let mut app = loaded_app();
    app.update(key(KeyCode::F(5)));
    app.update(alt(KeyCode::Char('+')));
    assert_eq!(app.panel_focus, Some(PanelId::Arena));
    assert_eq!(app.panel_extra[PanelId::Arena.index()], PANEL_STEP);
    for f in 6..=8 {
        app.update(key(KeyCode::F(f)));
    }
    let before = app.panel_extra;
    app.update(alt(KeyCode::Char('+')));
    app.update(alt(KeyCode::Down));
    assert_eq!(app.panel_extra, before, "no panel shown: nothing to resize");
}

#[test]
fn panel_heights_fill_the_column_and_squeeze_the_tallest_first() {
    use hipscope::ui::screen::panel_heights;
    // Room to spare: the last panel takes it.
    assert_eq!(panel_heights(&[6, 15, 9, 6], None, 50), [6, 15, 9, 20]);
    // Four rows too many: the tallest (the arena) gives them up.
    assert_eq!(panel_heights(&[6, 15, 9, 6], None, 32), [6, 11, 9, 6]);
    // The focused panel keeps its rows while others can still give.
    assert_eq!(panel_heights(&[6, 15, 9, 6], Some(1), 32), [5, 15, 6, 6]);
    // Not even three rows each: the bottom ones go first.
    assert_eq!(panel_heights(&[6, 15, 9, 6], None, 7), [3, 3, 1, 0]);
    for total in 0..60 {
        for focus in [None, Some(0), Some(3)] {
            let h = panel_heights(&[6, 15, 9, 6], focus, total);
            assert_eq!(
                h.iter().sum::<u16>(),
                total,
                "{total} rows, focus {focus:?}"
            );
        }
    }
    assert!(panel_heights(&[], None, 10).is_empty());
}

#[test]
fn a_worker_that_exits_on_its_own_is_reported_and_its_end_kept() {
    let mut app = streaming_app();
    worker(
        &mut app,
        Event::Exited {
            release: DeviceRelease::Abandoned,
        },
    );
    assert!(!app.worker_alive);
    assert_eq!(app.generation, GenState::Idle);
    assert_eq!(app.errors.len(), 1);
    assert!(app.errors[0].message.contains("device abandoned"));
    assert!(sent(&app.update(ctrl('c'))).is_empty(), "no worker to ask");
    assert_eq!(
        app.worker_ended(),
        Some(WorkerEnd::Released(DeviceRelease::Abandoned))
    );
}

#[test]
fn progress_comes_and_goes() {
    let mut app = App::new(settings());
    let progress = |f: Option<f32>| Event::Progress {
        task: "downloading SmolLM2".into(),
        fraction: f,
        detail: String::new(),
    };
    worker(&mut app, progress(Some(0.1)));
    worker(&mut app, progress(Some(0.6)));
    assert_eq!(app.progress.len(), 1);
    assert_eq!(app.progress[0].fraction, Some(0.6));
    worker(&mut app, progress(Some(1.0)));
    assert!(app.progress.is_empty());
}

#[test]
fn scrolled_up_the_view_stays_put_while_text_streams() {
    let mut app = loaded_app();
    submit(&mut app, "q");
    let long: String = (0..80).map(|i| format!("line {i}\n\n")).collect();
    stream_answer(&mut app, &long, 50);
    draw(&app, 80, 24);
    app.update(wheel(true));
    let top = app.chat.scroll_top.expect("scrolled");
    worker(
        &mut app,
        Event::Token {
            text: "more\n\nand more".into(),
        },
    );
    draw(&app, 80, 24);
    assert_eq!(app.chat.scroll_top, Some(top));
    app.update(ctrl_end());
    assert!(app.chat.is_following());
    worker(
        &mut app,
        Event::AnswerDone {
            stats: stats(1, 1),
            reason: StopReason::Eog,
        },
    );
}

fn ctrl_end() -> Msg {
    Msg::Key(crossterm::event::KeyEvent::new(
        KeyCode::End,
        crossterm::event::KeyModifiers::CONTROL,
    ))
}

#[test]
fn a_resumed_conversation_is_shown_and_its_questions_are_in_the_history() {
    let mut app = loaded_app();
    app.restore(
        &[
            ("first question".into(), "first answer".into()),
            ("second question".into(), String::new()),
        ],
        Some("OldModel-1B"),
        "reopened 2 exchanges",
    );
    assert_eq!(app.chat.last_answer(), Some("first answer"));
    let names: Vec<String> = app
        .chat
        .entries
        .iter()
        .filter_map(|e| match &e.kind {
            hipscope::ui::chat::EntryKind::Assistant { model, .. } => Some(model.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        names,
        ["OldModel-1B"],
        "reopened answers keep their model's name"
    );
    app.update(key(KeyCode::Up));
    assert_eq!(app.input.text(), "second question");
    // New answers go to a new entry, not to the reopened one.
    submit(&mut app, "");
    app.input.take();
    submit(&mut app, "third");
    stream_answer(&mut app, "third answer", 5);
    assert_eq!(app.chat.last_answer(), Some("third answer"));
    let last = app.chat.entries.last().unwrap();
    assert!(matches!(
        &last.kind,
        hipscope::ui::chat::EntryKind::Assistant { model, .. } if model == "SmolLM2-135M-Instruct"
    ));
}

#[test]
fn prompt_progress_and_context_fill_are_shown() {
    let mut app = loaded_app();
    tick(&mut app, 1_000);
    submit(&mut app, "a long question");
    tick(&mut app, 3_000);
    worker(
        &mut app,
        Event::PromptProgress {
            done: 1_024,
            total: 4_096,
        },
    );
    let s = screen(&app);
    // 1,024 tokens in 2 s: 512 t/s, 3,072 left: 6 s.
    assert!(
        s.contains("reading the prompt: 1,024 / 4,096 tokens · 512 t/s · 6 s left"),
        "{s}"
    );
    assert!(s.contains("prompt 25%"), "{s}");
    assert!(s.contains("ctx ░░░░░ 0/8,192"), "{s}");
    // stream_answer starts the answer with a prompt of 31 tokens.
    stream_answer(&mut app, "an answer", 3);
    assert!(app.prompt_rate().is_none());
    let streamed = match app.generation {
        GenState::Streaming { tokens, .. } => tokens,
        ref g => panic!("{g:?}"),
    };
    assert_eq!(app.context_fill(), Some((Some(31 + streamed), 8_192)));
    worker(
        &mut app,
        Event::AnswerDone {
            stats: stats(4_096, 100),
            reason: StopReason::Eog,
        },
    );
    assert_eq!(app.context_fill(), Some((Some(4_196), 8_192)));
    assert!(
        screen(&app).contains("ctx ██▌░░ 4,196/8,192"),
        "{}",
        screen(&app)
    );
    // Clearing empties it.
    app.update(alt(KeyCode::Char('l')));
    app.update(alt(KeyCode::Char('l')));
    assert_eq!(app.context_fill(), Some((Some(0), 8_192)));
}

/// Issue 12, item 18: the notice after a long paste counts one line as "1 line".
#[test]
fn item18_a_long_one_line_paste_says_1_line() {
    let mut app = loaded_app();
    app.update(Msg::Paste("x".repeat(20_000)));
    let b = draw(&app, 160, 30);
    let text: String = b
        .buffer()
        .content()
        .iter()
        .map(|c| c.symbol())
        .collect::<String>();
    assert!(text.contains("(1 line)"), "{text}");
    assert!(!text.contains("(1 lines)"), "{text}");
}
