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
use crate::gpu::trace;
use crate::model::protocol::{Command, Event, ModelSource};
use crate::model::worker::WorkerHandle;
use crate::ui::msg::TraceRequest;
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
    /// Time between redraws while something changes.
    pub frame: Duration,
    /// The quit's deadline: started when the worker is asked to quit (or at a signal); its one
    /// timer leaves the process if the quit overruns (tests use a reporting coordinator, whose
    /// overrun ends the loop instead).
    pub quit: Arc<QuitCoordinator>,
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
    // The profile while the Profile panel is shown, and the answers to `/trace`.
    let (profile_tx, mut profile_rx) = unbounded_channel();
    let (traced_tx, mut traced_rx) = unbounded_channel::<Msg>();
    let mut worker_open = true;
    let mut terminal_open = true;
    let mut signals_open = true;
    let mut dirty = true;
    let mut reported_failure = false;
    // The view lays itself out by the terminal's size (crossterm reports only changes of it).
    if let Ok(s) = terminal.size() {
        app.update(Msg::Resize(s.width, s.height));
    }

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
                    note_event(&e, io.transcript);
                    msgs.push(Msg::Worker(e));
                    // Take what else is queued now, so a burst of tokens costs one redraw.
                    while msgs.len() < 256 {
                        match worker.events.try_recv() {
                            Ok(e) => {
                                note_event(&e, io.transcript);
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
                Some(name) => msgs.push(Msg::Terminate(name)),
                None => signals_open = false,
            },
            found = found_rx.recv() => {
                if let Some((entries, searched)) = found {
                    msgs.push(Msg::Models { entries, searched });
                }
            },
            _ = io.quit.overrun() => {
                // The last frame, as the worker was left.
                draw(terminal, app);
                return Ending::Forced(format!(
                    "the worker did not finish quitting within {}",
                    crate::ui::units::duration(io.quit.config().deadline())
                ));
            },
            _ = ticker.tick() => {
                msgs.push(Msg::Tick(start.elapsed()));
            },
            Some(t) = tele_rx.recv() => {
                msgs.push(Msg::Worker(Event::Telemetry(t)));
            },
            Some(p) = profile_rx.recv() => {
                msgs.push(Msg::Profile(p));
            },
            Some(m) = traced_rx.recv() => {
                msgs.push(m);
            },
            _ = hangup_check.tick() => {
                // A terminal that went away without SIGHUP (the pty closed) reads EOF or EIO
                // forever: that is a quit. (The input thread ends on it too; this is the
                // backstop should that thread be caught in crossterm's reader.)
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
                        io.transcript.command(&cmd);
                        match &cmd {
                            Command::Quit { .. } => {
                                io.quit.begin();
                            }
                            Command::LoadModel(ModelSource::File(path)) => {
                                super::signals::note_mapped_file(path);
                            }
                            _ => {}
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
                        let (text, error) =
                            match super::config::keep_sampler_defaults(&io.config_file, &s) {
                                Ok(()) => (
                                    format!(
                                        "kept the sampler settings as defaults in {}",
                                        io.config_file.display()
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
                    Effect::Trace(req) => {
                        let tx = traced_tx.clone();
                        let profile = profile_tx.clone();
                        let device = app.device().cloned();
                        let dir = io.export_dir.clone();
                        // The collector answers within a bounded wait, and closing a file
                        // writes what is left: off the UI thread.
                        tokio::task::spawn_blocking(move || {
                            for m in carry_out_trace(req, profile, device.as_ref(), &dir) {
                                let _ = tx.send(m);
                            }
                        });
                    }
                    Effect::ForceExit => {
                        draw(terminal, app);
                        return Ending::Forced("a second Ctrl-C during the quit".into());
                    }
                }
            }
        }
        if !reported_failure && let Some(f) = io.transcript.failure() {
            reported_failure = true;
            app.update(Msg::Notice {
                text: f.to_string(),
                error: true,
            });
        }
        // Terminal input redraws at once; worker events wait for the next tick, so that a burst
        // of tokens costs one frame. Spinners and progress bars redraw on every tick.
        let animating = app.generation.is_busy() || !app.progress.is_empty() || app.is_quitting();
        if (draw_now || (ticked && (dirty || animating))) && draw(terminal, app) {
            dirty = false;
        }
    }
}

/// Starts or stops what `/trace` and the Profile panel ask for; returns what to tell the view.
fn carry_out_trace(
    req: TraceRequest,
    profile: UnboundedSender<crate::gpu::trace::ProfileSnapshot>,
    device: Option<&crate::gpu::snapshot::DeviceSummary>,
    export_dir: &std::path::Path,
) -> Vec<Msg> {
    let notice = |text: String, error: bool| Msg::Notice { text, error };
    match req {
        TraceRequest::Profile(true) => {
            trace::set_bandwidth(device.and_then(super::cmd::bench::known_bandwidth));
            trace::enable_profile(
                trace::profile::DEFAULT_STEPS,
                Some(Box::new(move |s| {
                    let _ = profile.send(s);
                })),
            );
            Vec::new()
        }
        TraceRequest::Profile(false) => {
            trace::disable_profile();
            Vec::new()
        }
        TraceRequest::FileOn(path) => {
            let path = path.unwrap_or_else(|| {
                let secs = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                export_dir.join(format!("hipscope-trace-{secs}.json"))
            });
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty())
                && let Err(e) = std::fs::create_dir_all(parent)
            {
                return vec![notice(format!("/trace: {}: {e}", parent.display()), true)];
            }
            match trace::start_file(&path) {
                Ok(()) => vec![
                    notice(
                        format!(
                            "tracing every op to {} (/trace off stops it; open it in \
                             ui.perfetto.dev or chrome://tracing)",
                            path.display()
                        ),
                        false,
                    ),
                    Msg::Tracing(Some(path)),
                ],
                Err(e) => vec![notice(format!("/trace: {e}"), true)],
            }
        }
        TraceRequest::FileOff => match trace::stop_file() {
            Ok((path, events)) => vec![
                notice(
                    format!(
                        "trace: {events} events in {} (open it in ui.perfetto.dev or \
                         chrome://tracing)",
                        path.display()
                    ),
                    false,
                ),
                Msg::Tracing(None),
            ],
            Err(e) => vec![notice(format!("/trace off: {e}"), true), Msg::Tracing(None)],
        },
    }
}

/// Draws one frame of `app`, unless the terminal has not yet taken the last one (it does not
/// read: the frame is skipped, the view stays dirty and the next tick tries again). Returns
/// whether it drew; a failure is logged (the next frame tries again).
pub fn draw<B: Backend>(terminal: &mut Terminal<B>, app: &App) -> bool {
    let _frame_slice = trace::slice(trace::TrackId::UI, "frame");
    if !super::terminal_out::frame_ready() {
        return false;
    }
    if let Err(e) = terminal.draw(|f| crate::ui::render(app, f)) {
        tracing::warn!("drawing failed: {e:?}");
    }
    true
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

/// What the loop keeps of a worker's event besides the view: the transcript's record, the mapped
/// model file for a fault's message, and the log's line.
fn note_event(e: &Event, transcript: &mut Transcript) {
    if let Event::ModelLoaded { model, .. } = e
        && let Some(p) = &model.path
    {
        super::signals::note_mapped_file(p);
    }
    log_event(e);
    transcript.event(e);
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
