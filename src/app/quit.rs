//! The quit coordinator: the one path by which the UI, Ctrl-C, SIGTERM and panics leave.
//!
//! Normal path: stop intake → the worker's bounded drain and device teardown (each step reported
//! as a `QuitStep`, see `gpu::handle::Gpu::teardown`) → exit hooks (restore the terminal, flush
//! logs and transcripts) → return the exit code from `main`.
//!
//! Hard path, when the drain times out, a GPU call fails with a sticky error, the whole quit
//! overruns its deadline, or a second interrupt arrives: no further GPU call, run the exit hooks
//! (with a time limit of their own), then `libc::_exit(3)`, so that no atexit handler — the HIP
//! runtime's fat-binary unregistration waits on every stream without a limit (pytorch#160759,
//! ROCm/TheRock#999) — can keep the process alive.
//!
//! The deadline: one timer thread, started by [`QuitCoordinator::begin`] — from the signal
//! thread (`app/signals.rs`) at a signal, whatever the UI thread is doing, or from the event loop
//! when it asks the worker to quit. Nothing on the way out waits on the terminal without a
//! limit: the screen's restore waits only while the terminal reads, messages go to stderr with
//! [`eprint_bounded`].
//!
//! Panics: the coordinator's panic hook is the process's only one. It restores the terminal,
//! prints the message on the normal screen and takes the hard path with code 101.
//!
//! The time limits are [`QuitConfig`] (defined in `model::protocol`, beside `Command::Quit`): the
//! chat reads them from the config file once and hands the same value to the view, the event
//! loop, this coordinator and the worker.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::terminal;
use super::terminal_out::eprint_bounded;
use crate::app::exit_code::{self, HARD as EXIT_HARD, OK as EXIT_OK, PANIC as EXIT_PANIC};
use crate::gpu::handle::TeardownOutcome;
use crate::gpu::snapshot::{QuitStep, QuitStepStatus};

/// The quit's time limits; defined beside `Command::Quit` so that the view and the worker get the
/// same value the coordinator runs on.
pub use crate::model::protocol::QuitConfig;

type Hook = Box<dyn FnOnce() + Send>;
type SignalHandler = Box<dyn Fn(&'static str) + Send + Sync>;

/// Coordinates leaving the process. Shared (`Arc`) between the UI loop, the signal thread and
/// the quit timer; holds no GPU state.
pub struct QuitCoordinator {
    cfg: QuitConfig,
    /// Whether the timer ends the process at the deadline (false only for tests of the loop,
    /// which are told of the overrun instead).
    exits_at_deadline: bool,
    /// Told when the deadline passed (the event loop waits on it).
    overrun: tokio::sync::Notify,
    hooks: Mutex<Vec<(String, Hook)>>,
    on_signal: Mutex<Option<SignalHandler>>,
    /// Printed last on the hard path (the chat: where the conversation is saved).
    hard_exit_note: Mutex<Option<String>>,
    /// Set while exit hooks run: a panic in one is caught there and must not start a second exit.
    in_hooks: AtomicBool,
    interrupts: AtomicU32,
    quitting: AtomicBool,
    finished: Arc<AtomicBool>,
    exiting: AtomicBool,
}

impl QuitCoordinator {
    pub fn new(cfg: QuitConfig) -> Arc<QuitCoordinator> {
        Self::with(cfg, true)
    }

    /// A coordinator whose deadline only reports the overrun ([`QuitCoordinator::overrun`]) and
    /// never ends the process: for tests that run the event loop inside the test process.
    pub fn reporting(cfg: QuitConfig) -> Arc<QuitCoordinator> {
        Self::with(cfg, false)
    }

    fn with(cfg: QuitConfig, exits_at_deadline: bool) -> Arc<QuitCoordinator> {
        Arc::new(QuitCoordinator {
            cfg,
            exits_at_deadline,
            overrun: tokio::sync::Notify::new(),
            hooks: Mutex::new(Vec::new()),
            on_signal: Mutex::new(None),
            hard_exit_note: Mutex::new(None),
            in_hooks: AtomicBool::new(false),
            interrupts: AtomicU32::new(0),
            quitting: AtomicBool::new(false),
            finished: Arc::new(AtomicBool::new(false)),
            exiting: AtomicBool::new(false),
        })
    }

    pub fn config(&self) -> QuitConfig {
        self.cfg
    }

    /// Adds a hook run once before leaving, on either path, in the order added (the TUI adds
    /// "restore terminal"; the app adds "flush transcript", "flush logs").
    pub fn add_exit_hook(&self, name: &str, f: impl FnOnce() + Send + 'static) {
        self.hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((name.to_string(), Box::new(f)));
    }

    /// What a signal does besides starting the deadline, given the signal's name (the chat:
    /// raise the worker's interrupt and tell the event loop, which asks the worker to quit).
    pub fn set_interrupt_handler(&self, f: impl Fn(&'static str) + Send + Sync + 'static) {
        *self.on_signal.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(f));
    }

    /// A quit signal (`SIGINT`, `SIGTERM`, `SIGHUP`; from `app/signals.rs`): starts the quit's
    /// deadline at once, whatever the UI thread is doing, and runs the handler. A second SIGINT
    /// or SIGTERM forces the hard exit.
    pub fn signal(self: &Arc<Self>, name: &'static str) {
        tracing::info!("{name} received");
        if name != "SIGHUP" && self.interrupts.fetch_add(1, Ordering::AcqRel) >= 1 {
            self.hard_exit("second interrupt: leaving without waiting for the GPU");
        }
        self.begin();
        if let Some(f) = self
            .on_signal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            f(name);
        }
    }

    /// A line printed last when the process takes the hard path (after the reason).
    pub fn set_hard_exit_note(&self, note: impl Into<String>) {
        *self
            .hard_exit_note
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(note.into());
    }

    /// The process's one panic hook; installed once (later calls do nothing), on the thread that
    /// owns the screen. A panic restores the terminal, prints its message on the normal screen,
    /// then takes the quit protocol's hard path: the exit hooks, `_exit(101)` — unwinding out of
    /// `main` would run the runtime's atexit handlers with work in flight.
    ///
    /// Two panics are only reported: one on another thread while the screen is up (printed, it
    /// would land mid-screen; it goes to the log, and the UI sees the worker's channel close and
    /// quits through the protocol), and one inside an exit hook (the hook runner catches it).
    pub fn install_panic_hook(self: &Arc<Self>) {
        static INSTALLED: AtomicBool = AtomicBool::new(false);
        if INSTALLED.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        let owner = std::thread::current().id();
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let on_owner = std::thread::current().id() == owner;
            if !on_owner && terminal::is_active() {
                let name = std::thread::current()
                    .name()
                    .unwrap_or("unnamed")
                    .to_string();
                tracing::error!("thread `{name}` panicked: {info}");
                return;
            }
            let had_screen = terminal::is_active();
            terminal::restore_terminal();
            tracing::error!("panic: {info}");
            if had_screen {
                // Printed by us, not the default hook: stderr is the terminal, which may not be
                // reading, and this must not wait on it without a limit.
                let name = std::thread::current()
                    .name()
                    .unwrap_or("unnamed")
                    .to_string();
                eprint_bounded(
                    &format!("\r\nthread '{name}' {info}\r\n"),
                    me.cfg.hook_timeout,
                );
            } else {
                prev(info);
            }
            if me.in_hooks.load(Ordering::Acquire) {
                return;
            }
            let who = if on_owner { "the UI" } else { "a thread" };
            me.leave(
                EXIT_PANIC,
                &format!("{who} failed (the message is above); left without waiting for the GPU"),
            );
        }));
    }

    pub fn is_quitting(&self) -> bool {
        self.quitting.load(Ordering::Acquire)
    }

    /// Starts the quit: from now on the whole quit must finish within drain deadline + grace,
    /// or the timer thread (which makes no GPU call) takes the hard path. Returns false if a quit
    /// was already under way.
    pub fn begin(self: &Arc<Self>) -> bool {
        if self.quitting.swap(true, Ordering::AcqRel) {
            return false;
        }
        let me = self.clone();
        let limit = self.cfg.drain_deadline + self.cfg.grace;
        let finished = self.finished.clone();
        let spawned = std::thread::Builder::new()
            .name("hipscope-quit-timer".into())
            .spawn(move || {
                let t = Instant::now();
                while t.elapsed() < limit {
                    if finished.load(Ordering::Acquire) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                if !finished.load(Ordering::Acquire) {
                    me.overrun.notify_one();
                    if me.exits_at_deadline {
                        me.hard_exit(&format!(
                            "quit did not finish within {:.1} s (the worker is stuck in a GPU call)",
                            limit.as_secs_f64()
                        ));
                    }
                }
            });
        if spawned.is_err() {
            // Without a timer the quit is still bounded by the worker's own deadlines.
            tracing::warn!("could not start the quit timer thread");
        }
        true
    }

    /// Resolves once a quit overran its deadline. (The chat's coordinator leaves the process at
    /// that moment from its timer thread; the event loop's wait matters for tests.)
    pub async fn overrun(&self) {
        self.overrun.notified().await;
    }

    /// Ends the quit with the worker's outcome: clean → hooks run and the code is returned for
    /// `main` to return; otherwise the hard path (does not return).
    pub fn finish(&self, code: i32, reason: Option<&str>) -> i32 {
        self.finished.store(true, Ordering::Release);
        if code == EXIT_OK {
            self.run_hooks();
            EXIT_OK
        } else {
            self.hard_exit(reason.unwrap_or("the GPU could not be shut down cleanly"))
        }
    }

    /// As [`QuitCoordinator::finish`], from a teardown outcome.
    pub fn finish_teardown(&self, outcome: &TeardownOutcome) -> i32 {
        self.finish(
            exit_code::after(outcome.release()),
            outcome.reason.as_deref(),
        )
    }

    /// Runs the exit hooks once (later calls do nothing).
    pub fn run_hooks(&self) {
        let hooks: Vec<(String, Hook)> = {
            let mut g = self.hooks.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::take(&mut *g)
        };
        self.in_hooks.store(true, Ordering::Release);
        for (name, h) in hooks {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(h)).is_err() {
                eprintln!("hipscope: exit hook {name:?} panicked");
            }
        }
        self.in_hooks.store(false, Ordering::Release);
    }

    /// The hard path: exit hooks (bounded), a one-line reason on stderr, `_exit(3)`.
    pub fn hard_exit(&self, reason: &str) -> ! {
        self.leave(EXIT_HARD, reason)
    }

    fn leave(&self, code: i32, reason: &str) -> ! {
        if self.exiting.swap(true, Ordering::AcqRel) {
            // Another thread is already leaving; it will end the process.
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        // Hooks run on a helper thread so a hook stuck on I/O cannot hold the exit.
        self.in_hooks.store(true, Ordering::Release);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let hooks: Vec<(String, Hook)> = {
            let mut g = self.hooks.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::take(&mut *g)
        };
        let _ = std::thread::Builder::new()
            .name("hipscope-exit-hooks".into())
            .spawn(move || {
                for (_, h) in hooks {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(h));
                }
                let _ = tx.send(());
            });
        let _ = rx.recv_timeout(self.cfg.hook_timeout);
        let mut text =
            format!("hipscope: {reason}; exiting with code {code} without GPU cleanup\n");
        if let Some(note) = self
            .hard_exit_note
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_deref()
        {
            text.push_str(note);
            text.push('\n');
        }
        eprint_bounded(&text, self.cfg.hook_timeout);
        hard_exit_now(code)
    }
}

/// Flushes stdio (for at most a second: it may be a terminal or a pipe that does not read) and
/// ends the process without atexit handlers or destructors.
pub fn hard_exit_now(code: i32) -> ! {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    if std::thread::Builder::new()
        .name("hipscope-flush".into())
        .spawn(move || {
            use std::io::Write;
            let _ = std::io::stdout().flush();
            let _ = std::io::stderr().flush();
            let _ = tx.send(());
        })
        .is_ok()
    {
        let _ = rx.recv_timeout(Duration::from_secs(1));
    }
    // SAFETY: _exit ends the process at once; nothing runs after it.
    unsafe { libc::_exit(code) }
}

/// A one-line rendering of a quit step for logs and the selftest.
pub fn describe_step(s: &QuitStep) -> String {
    let status = match &s.status {
        QuitStepStatus::Running => "running".to_string(),
        QuitStepStatus::Done => "done".to_string(),
        QuitStepStatus::Skipped(r) => format!("skipped ({r})"),
        QuitStepStatus::Failed(r) => format!("FAILED ({r})"),
    };
    format!(
        "{:<30} {:>9.3} ms  {status}",
        s.name,
        s.elapsed.as_secs_f64() * 1e3
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_finish_runs_each_hook_once_in_order_and_returns_zero() {
        let q = QuitCoordinator::new(QuitConfig::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        for name in ["restore terminal", "flush transcript"] {
            let o = order.clone();
            q.add_exit_hook(name, move || o.lock().expect("lock").push(name));
        }
        assert!(q.begin());
        assert!(!q.begin(), "a second begin is refused");
        assert_eq!(q.finish(EXIT_OK, None), EXIT_OK);
        q.run_hooks();
        assert_eq!(
            *order.lock().expect("lock"),
            ["restore terminal", "flush transcript"]
        );
    }

    #[test]
    fn the_first_signal_starts_the_deadline_and_asks_for_a_graceful_quit() {
        let q = QuitCoordinator::reporting(QuitConfig::default());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let a = asked.clone();
        q.set_interrupt_handler(move |name| a.lock().expect("lock").push(name));
        q.signal("SIGHUP");
        assert!(q.is_quitting(), "the deadline started");
        assert!(!q.begin(), "the quit is under way");
        // A SIGHUP is not an interrupt: a SIGTERM after it is still the first.
        q.signal("SIGTERM");
        assert_eq!(*asked.lock().expect("lock"), ["SIGHUP", "SIGTERM"]);
        // The second interrupt takes the hard path; that is tested in a child process
        // (tests/gpu_quit.rs) because it ends the process.
    }

    #[test]
    fn a_reporting_coordinator_tells_of_the_overrun_and_leaves_the_process_alone() {
        let q = QuitCoordinator::reporting(QuitConfig {
            drain_deadline: Duration::from_millis(20),
            grace: Duration::from_millis(20),
            hook_timeout: Duration::from_millis(20),
        });
        let t = Instant::now();
        assert!(q.begin());
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(q.overrun());
        assert!(
            t.elapsed() >= Duration::from_millis(40),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn step_lines_show_status_and_duration() {
        let s = QuitStep {
            name: "drain stream".into(),
            status: QuitStepStatus::Failed("timed out".into()),
            elapsed: Duration::from_millis(1500),
        };
        let line = describe_step(&s);
        assert!(
            line.contains("drain stream") && line.contains("1500.000 ms"),
            "{line}"
        );
        assert!(line.contains("FAILED (timed out)"));
    }
}
