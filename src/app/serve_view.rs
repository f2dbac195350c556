//! `hipscope serve`'s terminal: the full-screen view (`ui/serve_screen.rs`) redrawn from the
//! engine's snapshots, the device monitor, the watchdog and the telemetry sampler; `q` or Ctrl-C
//! stops serving (the second Ctrl-C forces the exit, as everywhere). The terminal is restored on
//! every way out (`terminal.rs`'s guard, the panic hook, the quit's exit hooks).

use crate::app::stderr::errln;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};
use tokio::sync::watch;

use super::quit::QuitCoordinator;
use super::serve::HangNote;
use super::terminal::{TerminalGuard, spawn_input};
use crate::gpu::backend::BackendMonitor;
use crate::gpu::snapshot::{DeviceSummary, WatchdogSnapshot};
use crate::model::scheduler::ServeSnapshot;
use crate::ui::serve_screen::ServeScreen;
use crate::ui::theme::{Theme, ThemeName};

/// What the view watches.
pub struct Inputs {
    pub snapshot: watch::Receiver<ServeSnapshot>,
    pub watchdog: watch::Receiver<Option<WatchdogSnapshot>>,
    pub monitor: Option<Arc<dyn BackendMonitor>>,
    pub hang: watch::Receiver<Option<HangNote>>,
    pub device: DeviceSummary,
    pub title: String,
    pub quit: Arc<QuitCoordinator>,
    /// Longest the view waits for the slots to empty after a stop.
    pub drain_deadline: Duration,
}

/// Runs the view until serving stops (`stop` set by a key here or by a signal). A terminal that
/// cannot be set up leaves the server running headless, with a line saying so.
pub async fn run(
    mut io: Inputs,
    stop_tx: Arc<watch::Sender<bool>>,
    mut stop: watch::Receiver<bool>,
) {
    let guard = match TerminalGuard::enter(false) {
        Ok(g) => g,
        Err(e) => {
            errln!("no full-screen view ({e}); serving headless");
            return;
        }
    };
    let mut term =
        match ratatui::Terminal::new(ratatui::backend::CrosstermBackend::new(guard.output())) {
            Ok(t) => t,
            Err(e) => {
                drop(guard);
                errln!("no full-screen view ({e}); serving headless");
                return;
            }
        };
    // The hard path of the quit (a second Ctrl-C, a drain that overruns) puts the terminal back.
    io.quit
        .add_exit_hook("restore terminal", super::terminal::restore_terminal);
    let mut stopped_at: Option<Instant> = None;
    let mut screen = ServeScreen::new(
        io.title.clone(),
        Theme::new(ThemeName::default()),
        io.device,
    );
    let (tele_tx, mut tele_rx) = tokio::sync::mpsc::unbounded_channel();
    let (_tele_stop, tele_stop_rx) = std::sync::mpsc::channel::<()>();
    let roots = crate::gpu::telemetry::Roots::from_env();
    let every = crate::gpu::telemetry::interval(1000);
    if let Err(e) =
        crate::gpu::telemetry::spawn(roots, every, tele_stop_rx, move |t| tele_tx.send(t).is_ok())
    {
        tracing::warn!("telemetry sampler not started: {e}");
    }
    // The chat's input thread: a terminal that hangs up ends the channel, never a spinning read.
    let (keys_tx, mut keys) = tokio::sync::mpsc::unbounded_channel();
    if let Err(e) = spawn_input(keys_tx) {
        tracing::warn!("the view reads no keys ({e}); serving goes on headless");
    }
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let start = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            k = keys.recv() => match k {
                Some(Ok(Event::Key(k))) if k.kind == KeyEventKind::Press => {
                    let ctrl_c = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if ctrl_c {
                        // As SIGINT: the first stops serving, a second forces the exit.
                        io.quit.signal("SIGINT");
                    } else if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) {
                        stop_tx.send_replace(true);
                    }
                }
                Some(Ok(_)) => {}
                // The terminal went away: serving goes on headless until a signal stops it.
                Some(Err(_)) | None => break,
            },
            Some(t) = tele_rx.recv() => screen.apply_telemetry(t),
            _ = stop.wait_for(|s| *s), if !screen.stopping => {
                screen.stopping = true;
                stopped_at = Some(Instant::now());
            }
        }
        screen.apply_snapshot(io.snapshot.borrow_and_update().clone());
        if let Some(w) = io.watchdog.borrow_and_update().clone() {
            screen.apply_watchdog(w);
        }
        if let Some(h) = io.hang.borrow_and_update().clone() {
            screen.hang = Some(format!(
                "HUNG: {} — failed requests {:?}{}",
                h.op,
                h.requests,
                h.report
                    .map(|r| format!(" (report {r})"))
                    .unwrap_or_default()
            ));
        }
        if let Some(m) = &io.monitor {
            screen.apply_streams(m.streams(), start.elapsed());
        }
        let idle = screen.snapshot.busy() == 0 && screen.snapshot.queued.is_empty();
        if stopped_at.is_some_and(|t| idle || t.elapsed() > io.drain_deadline) {
            break;
        }
        if crate::app::terminal_out::frame_ready() && term.draw(|f| screen.render(f)).is_err() {
            break;
        }
    }
    drop(term);
    drop(guard);
}
