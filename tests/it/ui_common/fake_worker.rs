//! A scripted stand-in for the inference worker: a thread that answers commands with the events
//! the real worker sends (load progress, tokens, stop, the quit steps, `Exited`), with modes
//! that hang or die, for driving the real event loop in tests.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hipscope::gpu::snapshot::{DeviceRelease, QuitStepStatus, WatchState};
use hipscope::model::protocol::{Command, Event, GenStats, StopReason};
use hipscope::model::worker::WorkerHandle;
use tokio::sync::mpsc::UnboundedSender;

use super::{cpu_device, quit_step, smollm2, watchdog};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Normal,
    /// On `Generate`: start the answer, report the GPU hung, and never answer again.
    HangOnGenerate,
    /// On `Quit`: report the drain running, and never finish it.
    HangOnQuit,
    /// After the first answer, the thread ends without `Exited` (a crash).
    DieAfterFirstAnswer,
}

pub type Log = Arc<Mutex<Vec<Command>>>;

pub fn commands(log: &Log) -> Vec<Command> {
    log.lock().expect("log").clone()
}

/// Starts the fake; it answers every question with `answer`, one word every `delay`.
pub fn spawn(answer: &'static str, delay: Duration, mode: Mode) -> (WorkerHandle, Log) {
    let (ctx, crx) = std::sync::mpsc::channel();
    let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
    let log: Log = Arc::default();
    let thread_log = log.clone();
    let thread = std::thread::Builder::new()
        .name("fake-worker".into())
        .spawn(move || run(crx, etx, thread_log, answer, delay, mode))
        .expect("thread");
    (
        WorkerHandle {
            commands: ctx,
            interrupt: Arc::default(),
            events: erx,
            thread: Some(thread),
        },
        log,
    )
}

fn run(
    commands: Receiver<Command>,
    events: UnboundedSender<Event>,
    log: Log,
    answer: &str,
    delay: Duration,
    mode: Mode,
) {
    let send = |e: Event| {
        let _ = events.send(e);
    };
    send(Event::Progress {
        task: "loading model".into(),
        fraction: Some(0.5),
        detail: "tensors".into(),
    });
    send(Event::ModelLoaded {
        model: smollm2(),
        device: cpu_device(),
    });
    let mut answers = 0;
    loop {
        let Ok(cmd) = commands.recv() else { return };
        log.lock().expect("log").push(cmd.clone());
        match cmd {
            Command::Generate { .. } | Command::Regenerate => {
                if mode == Mode::HangOnGenerate {
                    send(Event::AnswerStarted {
                        stats: GenStats::default(),
                    });
                    send(Event::Token { text: "The".into() });
                    send(Event::Watchdog(watchdog(WatchState::Hung, 9_000)));
                    // Stuck inside a GPU call: nothing is read or sent any more.
                    while commands.recv().is_ok() {}
                    return;
                }
                send(Event::AnswerStarted {
                    stats: GenStats {
                        prompt_tokens: 12,
                        ..GenStats::default()
                    },
                });
                let mut n = 0;
                let mut reason = StopReason::Eog;
                let mut quit_after = None;
                for (i, word) in answer.split(' ').enumerate() {
                    match commands.recv_timeout(delay) {
                        Ok(c) => {
                            log.lock().expect("log").push(c.clone());
                            match c {
                                Command::Stop => {
                                    reason = StopReason::User;
                                    break;
                                }
                                Command::Quit { .. } => {
                                    reason = StopReason::User;
                                    quit_after = Some(c);
                                    break;
                                }
                                _ => {}
                            }
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                    let text = if i == 0 {
                        word.to_string()
                    } else {
                        format!(" {word}")
                    };
                    send(Event::Token { text });
                    n += 1;
                }
                send(Event::AnswerDone {
                    stats: GenStats {
                        prompt_tokens: 12,
                        generated_tokens: n,
                        gen_time: delay * n as u32,
                        prompt_time: Duration::from_millis(3),
                        time_to_first_token: delay,
                        ..GenStats::default()
                    },
                    reason,
                });
                answers += 1;
                if quit_after.is_some() {
                    quit(&send, mode, &commands);
                    return;
                }
                if mode == Mode::DieAfterFirstAnswer && answers == 1 {
                    return;
                }
            }
            Command::Quit { .. } => {
                quit(&send, mode, &commands);
                return;
            }
            _ => {}
        }
    }
}

fn quit(send: &dyn Fn(Event), mode: Mode, commands: &Receiver<Command>) {
    send(Event::QuitStep(quit_step(
        "stop intake",
        QuitStepStatus::Done,
        15,
    )));
    if mode == Mode::HangOnQuit {
        send(Event::QuitStep(quit_step(
            "drain hip:0 stream 0",
            QuitStepStatus::Running,
            0,
        )));
        while commands.recv().is_ok() {}
        return;
    }
    send(Event::QuitStep(quit_step(
        "release host arena",
        QuitStepStatus::Done,
        120,
    )));
    send(Event::Exited {
        release: DeviceRelease::Clean,
    });
}
