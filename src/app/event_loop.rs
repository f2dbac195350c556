//! The chat's event loop: one tokio task that feeds terminal input, worker events, signals, the
//! host sampler and a render tick into [`App::update`] and carries out the effects it returns.
//!
//! The loop owns no state of its own beyond timers: the view is `ui::App`, the conversation on
//! disk is the [`Transcript`], the model and device belong to the worker thread. Nothing in the
//! loop waits on the worker, so typing, scrolling and quitting work while it computes or hangs.

use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use crossterm::event::Event as TermEvent;
use ratatui::Terminal;
use ratatui::backend::Backend;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::clipboard;
use super::discover::{self, Places};
use super::exit_code;
use super::quit::QuitCoordinator;
use super::shutdown::Ending;
use super::transcript::Transcript;
use crate::model::protocol::{Command, Event};
use crate::model::worker::WorkerHandle;
use crate::ui::{App, Effect, Msg};

/// Where the loop's inputs come from.
pub struct Inputs {
    /// Terminal events; the channel closing means the terminal is gone.
    pub terminal: UnboundedReceiver<io::Result<TermEvent>>,
    /// Names of signals received (`SIGTERM`, `SIGHUP`, `SIGINT`).
    pub signals: UnboundedReceiver<&'static str>,
}

/// What the loop needs to carry out effects.
pub struct LoopIo<'a> {
    pub transcript: &'a mut Transcript,
    /// Where OSC 52 sequences go (the terminal).
    pub clipboard: &'a mut dyn Write,
    pub places: Places,
    /// Where `/save` writes when given no path.
    pub export_dir: PathBuf,
    /// The config file `/set save` writes the sampler settings into.
    pub config_file: PathBuf,
    /// How long after asking the worker to quit the app leaves without it: the chat passes
    /// `QuitConfig::deadline()`, the same value the coordinator's timer runs on; tests, which
    /// have no coordinator, pass a short one.
    pub quit_deadline: Duration,
    /// Time between redraws while something changes.
    pub frame: Duration,
    /// Started when the worker is asked to quit: its timer thread leaves the process if the
    /// quit overruns even when this loop cannot (tests run without one).
    pub quit: Option<Arc<QuitCoordinator>>,
    /// The telemetry sampler's interval (`[telemetry] interval_ms`); `None`: no sampler.
    pub telemetry: Option<Duration>,
    /// The configured remote engines (`[remote.NAME]`), listed first in the model picker.
    pub remotes: Vec<crate::model::remote::client::RemoteSpec>,
}

/// Runs until the worker has quit (or the app leaves without it). Draws into `terminal`.
pub async fn event_loop<B: Backend>(
    terminal: &mut Terminal<B>,
    mut inputs: Inputs,
    app: &mut App,
    worker: &mut WorkerHandle,
    mut io: LoopIo<'_>,
) -> Ending {
    let start = Instant::now();
    let mut ticker = tokio::time::interval(io.frame);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // GPU and host telemetry from the sampler's own thread; it stops when `_stop` drops.
    let (tele_tx, mut tele_rx) = unbounded_channel();
    let mut hangup_check = tokio::time::interval(Duration::from_secs(1));
    let (_stop, stop_rx) = std::sync::mpsc::channel::<()>();
    if let Some(every) = io.telemetry {
        let roots = crate::gpu::telemetry::Roots::from_env();
        let deliver = move |t| tele_tx.send(t).is_ok();
        if let Err(e) = crate::gpu::telemetry::spawn(roots, every, stop_rx, deliver) {
            tracing::warn!("telemetry sampler not started: {e}");
        }
    }
    let (found_tx, mut found_rx) = unbounded_channel();
    let mut worker_open = true;
    let mut terminal_open = true;
    let mut signals_open = true;
    let mut quit_deadline: Option<tokio::time::Instant> = None;
    let mut dirty = true;
    // A quit the user asked for while turns are not saved is held once, to say so.
    let mut unsaved_said = false;

    loop {
        if let Some(end) = app.worker_ended() {
            draw(terminal, app);
            return Ending::Exited(exit_code::after_worker(end));
        }
        let mut msgs: Vec<Msg> = Vec::new();
        let mut draw_now = false;
        tokio::select! {
            ev = inputs.terminal.recv(), if terminal_open => match ev {
                Some(Ok(e)) => {
                    if let Some(m) = Msg::from_terminal(e) {
                        msgs.push(m);
                        draw_now = true;
                    }
                }
                Some(Err(e)) => {
                    tracing::error!("reading the terminal failed: {e}");
                    terminal_open = false;
                    msgs.push(Msg::Terminate("terminal error"));
                }
                None => {
                    terminal_open = false;
                    msgs.push(Msg::Terminate("terminal closed"));
                }
            },
            ev = worker.events.recv(), if worker_open => match ev {
                Some(e) => {
                    log_event(&e);
                    io.transcript.event(&e);
                    msgs.push(Msg::Worker(e));
                    // Take what else is queued now, so a burst of tokens costs one redraw.
                    while msgs.len() < 256 {
                        match worker.events.try_recv() {
                            Ok(e) => {
                                log_event(&e);
                                io.transcript.event(&e);
                                msgs.push(Msg::Worker(e));
                            }
                            Err(_) => break,
                        }
                    }
                }
                None => {
                    worker_open = false;
                    msgs.push(Msg::WorkerGone);
                }
            },
            sig = inputs.signals.recv(), if signals_open => match sig {
                Some(name) => {
                    tracing::info!("{name} received");
                    msgs.push(Msg::Terminate(name));
                }
                None => signals_open = false,
            },
            found = found_rx.recv() => {
                if let Some((entries, searched)) = found {
                    msgs.push(Msg::Models { entries, searched });
                }
            },
            _ = sleep_until(quit_deadline), if quit_deadline.is_some() => {
                // The last frame, as the worker was left.
                draw(terminal, app);
                return Ending::Forced(format!(
                    "the worker did not finish quitting within {}",
                    crate::ui::units::duration(io.quit_deadline)
                ));
            },
            _ = ticker.tick() => {
                msgs.push(Msg::Tick(start.elapsed()));
            },
            Some(t) = tele_rx.recv() => {
                msgs.push(Msg::Worker(Event::Telemetry(t)));
            },
            _ = hangup_check.tick() => {
                // A terminal that went away without SIGHUP (the pty closed) reads EOF or EIO
                // forever: that is a quit.
                if terminal_open && super::terminal::terminal_gone() {
                    tracing::info!("the terminal went away");
                    terminal_open = false;
                    msgs.push(Msg::Terminate("terminal closed"));
                }
            },
        }

        let mut ticked = false;
        for msg in msgs {
            let is_tick = matches!(msg, Msg::Tick(_));
            ticked |= is_tick;
            let effects = app.update(msg);
            if !is_tick {
                dirty = true;
            }
            for effect in effects {
                match effect {
                    Effect::Send(cmd) => {
                        if let Command::Quit { .. } = cmd
                            && !unsaved_said
                            && app.quit.as_ref().is_some_and(|q| asked_by_user(&q.reason))
                            && let Some(what) = io.transcript.unsaved()
                        {
                            // Not quitting yet: what would be lost, and the way to keep it.
                            unsaved_said = true;
                            app.quit = None;
                            app.update(Msg::Notice {
                                text: format!(
                                    "{what}: /save PATH writes the conversation elsewhere; quit \
                                     again to leave without it"
                                ),
                                error: true,
                            });
                            continue;
                        }
                        io.transcript.command(&cmd);
                        if let Command::Quit { .. } = cmd {
                            quit_deadline = Some(tokio::time::Instant::now() + io.quit_deadline);
                            if let Some(q) = &io.quit {
                                q.begin();
                            }
                        }
                        // A stop or a quit also stops a prompt between batches and layers; a
                        // new request lowers the flag first (same thread, so in order).
                        match cmd {
                            Command::Stop | Command::Quit { .. } => {
                                worker.interrupt.store(true, Ordering::SeqCst)
                            }
                            Command::Generate { .. } | Command::Regenerate => {
                                worker.interrupt.store(false, Ordering::SeqCst)
                            }
                            _ => {}
                        }
                        tracing::debug!("→ worker: {}", command_name(&cmd));
                        if worker.commands.send(cmd).is_err() {
                            app.update(Msg::WorkerGone);
                        }
                    }
                    Effect::Copy { text, what } => {
                        if let Err(e) = clipboard::copy(io.clipboard, &text) {
                            app.update(Msg::Notice {
                                text: format!("could not copy {what}: {e}"),
                                error: true,
                            });
                        }
                    }
                    Effect::Export { path, overwrite } => {
                        let r = io
                            .transcript
                            .export_markdown(path, overwrite, &io.export_dir, SystemTime::now())
                            // The full path, so that `/save notes.md` says where it went.
                            .map(|p| std::path::absolute(&p).unwrap_or(p));
                        app.update(Msg::Saved(r));
                    }
                    Effect::KeepSettings(s) => {
                        // What `/set` changed: the settings since the start (flags included).
                        let start = &app.settings.sampler;
                        let file = &io.config_file;
                        let (text, error) =
                            match super::config::keep_sampler_defaults(file, start, &s) {
                                Ok(keys) if keys.is_empty() => (
                                    "no sampler setting was changed with /set: nothing to keep"
                                        .to_string(),
                                    false,
                                ),
                                Ok(keys) => (
                                    format!(
                                        "kept the sampler settings ({}) as defaults in {}",
                                        keys.join(", "),
                                        file.display()
                                    ),
                                    false,
                                ),
                                Err(e) => (format!("could not keep the settings: {e}"), true),
                            };
                        app.update(Msg::Notice { text, error });
                    }
                    Effect::Discover => {
                        io.places.current = app.model.as_ref().and_then(|m| m.path.clone());
                        let roots = io.places.roots();
                        let tx: UnboundedSender<_> = found_tx.clone();
                        let remotes = discover::remote_entries(&io.remotes);
                        // Reading headers touches the disk: off the UI thread.
                        tokio::task::spawn_blocking(move || {
                            let (mut entries, searched) = discover::scan(&roots);
                            entries.splice(0..0, remotes);
                            let _ = tx.send((entries, searched));
                        });
                    }
                    Effect::ListPaths(typed) => {
                        let names = discover::complete_path(&typed);
                        app.update(Msg::Paths { typed, names });
                    }
                    Effect::ForceExit => {
                        draw(terminal, app);
                        return Ending::Forced("a second Ctrl-C during the quit".into());
                    }
                }
            }
        }
        while let Some((text, error)) = io.transcript.take_notice() {
            app.update(Msg::Notice { text, error });
        }
        // Terminal input redraws at once; worker events wait for the next tick, so that a burst
        // of tokens costs one frame. Spinners and progress bars redraw on every tick.
        let animating = app.generation.is_busy() || !app.progress.is_empty() || app.is_quitting();
        if draw_now || (ticked && (dirty || animating)) {
            draw(terminal, app);
            dirty = false;
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Draws one frame of `app`; a failure is logged (the next frame tries again).
pub fn draw<B: Backend>(terminal: &mut Terminal<B>, app: &App) {
    // One frame at a time against `restore_terminal` (the hard exit's, on another thread): no
    // frame, and no hidden cursor, lands on the terminal after it was given back.
    let out = std::io::stdout();
    let _frame = out.lock();
    if !super::terminal::draw_allowed() {
        return;
    }
    if let Err(e) = terminal.draw(|f| crate::ui::render(app, f)) {
        tracing::warn!("drawing failed: {e:?}");
    }
}

/// Whether a quit was asked for by the user (a key or `/quit`), not by a signal or a terminal
/// that went away: only those are held to warn about unsaved turns.
fn asked_by_user(reason: &str) -> bool {
    matches!(reason, "Ctrl-C" | "Ctrl-D" | "/quit")
}

fn command_name(c: &Command) -> &'static str {
    match c {
        Command::Generate { .. } => "generate",
        Command::Stop => "stop",
        Command::Regenerate => "regenerate",
        Command::Clear => "clear",
        Command::SetSystem(_) => "set system",
        Command::SetSampler(_) => "set sampler",
        Command::SetContext(_) => "set context",
        Command::Restore { .. } => "restore",
        Command::LoadModel(_) => "load model",
        Command::Quit { .. } => "quit",
    }
}

/// What the log keeps of the worker's events at the default level: models loaded and every
/// error (a model that failed to load, a device that failed), so that a failure seen on the
/// screen can be read again after the screen is gone.
fn log_event(e: &Event) {
    match e {
        Event::ModelLoaded { model, device } => tracing::info!(
            "model loaded: {} ({}, {}) on {}",
            model.name,
            model.quant,
            model
                .path
                .as_ref()
                .map_or(String::new(), |p| p.display().to_string()),
            device.backend
        ),
        Event::Error { context, message } => tracing::error!("{context}: {message}"),
        Event::Notice { context, message } => tracing::warn!("{context}: {message}"),
        _ => {}
    }
}
