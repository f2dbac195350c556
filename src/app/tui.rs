//! The chat app: terminal set-up and restore (on every way out: normal exit, error, panic,
//! SIGTERM, hard exit), the panic hook, and the tokio loop that feeds terminal input, worker
//! events, signals and a render tick into [`App::update`] and carries out the effects.
//!
//! The loop owns no state of its own beyond timers: the view is `ui::App`, the conversation on
//! disk is the [`Transcript`], the model and device belong to the worker thread. Nothing in the
//! loop waits on the worker, so typing, scrolling and quitting work while it computes or hangs.

use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crossterm::event::{
    DisableBracketedPaste, DisableMouseCapture, EnableBracketedPaste, EnableMouseCapture,
    Event as TermEvent, EventStream, KeyboardEnhancementFlags, PopKeyboardEnhancementFlags,
    PushKeyboardEnhancementFlags,
};
use crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use futures_util::StreamExt;
use ratatui::Terminal;
use ratatui::backend::{Backend, CrosstermBackend};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::chat_args::ChatArgs;
use super::config::{self, Config};
use super::discover::{self, Places};
use super::logging::{self, LogGuard};
use super::quit::{QuitConfig, QuitCoordinator};
use super::shutdown::{self, Ending};
use super::transcript::Transcript;
use super::{clipboard, transcript};
use crate::gpu::cpu::HostSampler;
use crate::model::protocol::{Command, Event};
use crate::ui::theme::ThemeName;
use crate::ui::{App, Effect, Msg, Settings};

/// The two ends of the worker's channels, and its thread.
pub struct WorkerLink {
    pub commands: std::sync::mpsc::Sender<Command>,
    /// See [`crate::model::worker::WorkerHandle::interrupt`].
    pub interrupt: Arc<AtomicBool>,
    pub events: UnboundedReceiver<Event>,
    pub thread: Option<std::thread::JoinHandle<()>>,
}

/// What the worker is started with (the coordinator's `WorkerOptions` is built from this).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerConfig {
    pub model: Option<PathBuf>,
    pub backend: config::BackendChoice,
    pub ctx_size: u32,
    pub threads: u32,
    pub device: Option<u32>,
    pub sampler: crate::model::protocol::SamplerConfig,
    pub system_prompt: String,
}

/// Everything `run_chat` needs: the flags, and where hipscope keeps its files.
#[derive(Clone, Debug)]
pub struct ChatOptions {
    pub args: ChatArgs,
    pub dirs: Dirs,
}

impl ChatOptions {
    pub fn new(args: ChatArgs) -> ChatOptions {
        ChatOptions {
            args,
            dirs: Dirs::from_env(),
        }
    }
}

/// hipscope's folders (`app::dirs`: the platform's, or under `HIPSCOPE_HOME`), as values so that
/// tests can point them elsewhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirs {
    pub config: PathBuf,
    pub data: PathBuf,
    pub cache: PathBuf,
    pub state: PathBuf,
}

impl Dirs {
    pub fn from_env() -> Dirs {
        // No home directory at all: keep everything beside the working directory.
        let fallback = Dirs::under(&PathBuf::from(".hipscope"));
        Dirs {
            config: super::dirs::config_dir().unwrap_or(fallback.config),
            data: super::dirs::data_dir().unwrap_or(fallback.data),
            cache: super::dirs::cache_dir().unwrap_or(fallback.cache),
            state: super::dirs::state_dir().unwrap_or(fallback.state),
        }
    }

    pub fn under(root: &std::path::Path) -> Dirs {
        Dirs {
            config: root.join("config"),
            data: root.join("data"),
            cache: root.join("cache"),
            state: root.join("state"),
        }
    }
}

// ---- terminal ------------------------------------------------------------------------------

static TERMINAL_ACTIVE: AtomicBool = AtomicBool::new(false);

/// Puts the terminal into the app's modes; restores them when dropped (also on unwinding).
pub struct TerminalGuard {
    mouse: bool,
}

/// Which of stdin (bit 0) and stdout (bit 1) were the app's terminal when it started.
static TERMINAL_FDS: AtomicU8 = AtomicU8::new(0);

/// Whether the app's terminal has gone away: its other side closed (the terminal emulator or
/// tmux gone), which poll reports as a hang-up. When the terminal is not the process's
/// controlling one no SIGHUP comes, and reads just return nothing, forever.
pub fn terminal_gone() -> bool {
    #[cfg(unix)]
    {
        let mask = TERMINAL_FDS.load(Ordering::SeqCst);
        let mut fds: Vec<libc::pollfd> = [0, 1]
            .into_iter()
            .filter(|fd| mask & (1 << fd) != 0)
            .map(|fd| libc::pollfd {
                fd,
                events: 0,
                revents: 0,
            })
            .collect();
        if fds.is_empty() {
            return false;
        }
        // SAFETY: poll over a valid array of pollfd, without waiting.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
        n > 0
            && fds
                .iter()
                .any(|f| f.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0)
    }
    #[cfg(not(unix))]
    false
}

/// What [`restore_terminal`] sends, as raw bytes for the fatal-signal handler (which may not
/// format): keyboard flags popped, mouse reports, bracketed paste and the alternate screen off,
/// the cursor shown.
const FATAL_RESTORE: &[u8] =
    b"\x1b[<1u\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1015l\x1b[?1006l\x1b[?2004l\x1b[?1049l\x1b[?25h";

impl TerminalGuard {
    pub fn enter(mouse: bool) -> io::Result<TerminalGuard> {
        // A SIGBUS (a model file truncated under its map) or SIGSEGV puts these modes back too.
        crate::gpu::fatal_signal::arm_terminal(0, 1, FATAL_RESTORE);
        TERMINAL_FDS.store(
            u8::from(io::stdin().is_terminal()) | u8::from(io::stdout().is_terminal()) << 1,
            Ordering::SeqCst,
        );
        enable_raw_mode()?;
        TERMINAL_ACTIVE.store(true, Ordering::SeqCst);
        let mut out = io::stdout();
        let setup = (|| {
            crossterm::execute!(out, EnterAlternateScreen, EnableBracketedPaste)?;
            if mouse {
                crossterm::execute!(out, EnableMouseCapture)?;
            }
            Ok::<(), io::Error>(())
        })();
        if let Err(e) = setup {
            restore_terminal();
            return Err(e);
        }
        // Reports Esc and modified keys (Shift-Enter) unambiguously where the terminal speaks
        // the kitty keyboard protocol; others ignore the request.
        let _ = crossterm::execute!(
            out,
            PushKeyboardEnhancementFlags(KeyboardEnhancementFlags::DISAMBIGUATE_ESCAPE_CODES)
        );
        Ok(TerminalGuard { mouse })
    }

    pub fn mouse(&self) -> bool {
        self.mouse
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// Leaves the app's terminal modes. Safe to call more than once, from any thread (the panic
/// hook, the hard exit).
pub fn restore_terminal() {
    if !TERMINAL_ACTIVE.swap(false, Ordering::SeqCst) {
        return;
    }
    crate::gpu::fatal_signal::disarm_terminal();
    let mut out = io::stdout();
    let _ = crossterm::execute!(
        out,
        PopKeyboardEnhancementFlags,
        DisableMouseCapture,
        DisableBracketedPaste,
        LeaveAlternateScreen,
        crossterm::cursor::Show
    );
    let _ = disable_raw_mode();
    let _ = out.flush();
}

/// Restores the terminal before a panic message is printed on the UI thread. A panic on another
/// thread goes to the log only: printed, it would land in the middle of the screen; the UI
/// notices the worker's channel closing and says so.
fn install_panic_hook() {
    let ui_thread = std::thread::current().id();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().id() == ui_thread || !TERMINAL_ACTIVE.load(Ordering::SeqCst) {
            restore_terminal();
            tracing::error!("panic: {info}");
            previous(info);
        } else {
            let name = std::thread::current()
                .name()
                .unwrap_or("unnamed")
                .to_string();
            tracing::error!("thread `{name}` panicked: {info}");
        }
    }));
}

// ---- the loop ------------------------------------------------------------------------------

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
    /// How long after asking the worker to quit the app leaves without it.
    pub quit_deadline: Duration,
    /// Time between redraws while something changes.
    pub frame: Duration,
    /// Started when the worker is asked to quit: its timer thread leaves the process if the
    /// quit overruns even when this loop cannot (tests run without one).
    pub quit: Option<Arc<QuitCoordinator>>,
}

/// How often the host's CPU use and memory are sampled for the panels.
const HOST_SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Runs until the worker has quit (or the app leaves without it). Draws into `terminal`.
pub async fn event_loop<B: Backend>(
    terminal: &mut Terminal<B>,
    mut inputs: Inputs,
    app: &mut App,
    worker: &mut WorkerLink,
    mut io: LoopIo<'_>,
) -> Ending {
    let start = Instant::now();
    let mut ticker = tokio::time::interval(io.frame);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // The host panel's CPU and memory: two small /proc reads a second, done right here.
    let mut host_ticker = tokio::time::interval(HOST_SAMPLE_EVERY);
    host_ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut host = HostSampler::default();
    let (found_tx, mut found_rx) = unbounded_channel();
    let mut worker_open = true;
    let mut terminal_open = true;
    let mut signals_open = true;
    let mut quit_deadline: Option<tokio::time::Instant> = None;
    let mut dirty = true;
    let mut reported_failure = false;

    loop {
        if let Some(code) = app.exit_code() {
            draw(terminal, app);
            return Ending::Exited(code);
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
                    io.transcript.event(&e);
                    msgs.push(Msg::Worker(e));
                    // Take what else is queued now, so a burst of tokens costs one redraw.
                    while msgs.len() < 256 {
                        match worker.events.try_recv() {
                            Ok(e) => {
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
            _ = host_ticker.tick() => {
                msgs.push(Msg::Host(host.sample()));
                if terminal_open && terminal_gone() {
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
                        let r = io.transcript.export_markdown(
                            path,
                            overwrite,
                            &io.export_dir,
                            SystemTime::now(),
                        );
                        app.update(Msg::Saved(r));
                    }
                    Effect::Discover => {
                        io.places.current = app.model.as_ref().and_then(|m| m.path.clone());
                        let roots = io.places.roots();
                        let tx: UnboundedSender<_> = found_tx.clone();
                        // Reading headers touches the disk: off the UI thread.
                        tokio::task::spawn_blocking(move || {
                            let _ = tx.send(discover::scan(&roots));
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

fn draw<B: Backend>(terminal: &mut Terminal<B>, app: &App) {
    if let Err(e) = terminal.draw(|f| crate::ui::render(app, f)) {
        tracing::warn!("drawing failed: {e:?}");
    }
}

fn command_name(c: &Command) -> &'static str {
    match c {
        Command::Generate { .. } => "generate",
        Command::Stop => "stop",
        Command::Regenerate => "regenerate",
        Command::Clear => "clear",
        Command::SetSystem(_) => "set system",
        Command::SetSampler(_) => "set sampler",
        Command::Restore { .. } => "restore",
        Command::LoadModel(_) => "load model",
        Command::Quit { .. } => "quit",
    }
}

// ---- start-up ----------------------------------------------------------------------------

/// The settings, from the config file and the flags; an error is for the user as is.
pub fn load_config(opts: &ChatOptions) -> Result<(Config, PathBuf), String> {
    let path = match &opts.args.config {
        Some(p) => p.clone(),
        None => {
            let p = opts.dirs.config.join("config.toml");
            if let Err(e) = config::write_default_if_missing(&p) {
                // Not fatal: the defaults apply.
                eprintln!("hipscope: could not write {}: {e}", p.display());
            }
            p
        }
    };
    let mut config = Config::load(&path).map_err(|e| e.to_string())?;
    opts.args.apply(&mut config)?;
    if std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()) {
        config.ui.theme = ThemeName::Mono;
    }
    Ok((config, path))
}

/// The view's starting settings.
pub fn settings(config: &Config, log: Option<PathBuf>) -> Settings {
    let model_label = config
        .model
        .as_ref()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "SmolLM2-135M-Instruct".into());
    Settings {
        theme: config.ui.theme,
        sidebar: config.ui.diagnostics,
        sidebar_width: config.ui.diagnostics_width,
        panels: config.ui.panels,
        sampler: config.sampler.clone(),
        system_prompt: config.system_prompt.clone(),
        model_label,
        drain_deadline: config.quit.drain_timeout,
        quit_deadline: config.quit_deadline(),
        history: Vec::new(),
        log_path: log,
    }
}

pub fn worker_config(config: &Config) -> WorkerConfig {
    WorkerConfig {
        model: config.model.clone(),
        backend: config.backend,
        ctx_size: config.ctx_size,
        threads: config.threads,
        device: config.device,
        sampler: config.sampler.clone(),
        system_prompt: config.system_prompt.clone(),
    }
}

/// Opens the transcript (see [`Transcript::for_chat`]); the note, if any, is for the UI.
pub fn open_transcript(config: &Config, dirs: &Dirs, resume: bool) -> (Transcript, Option<String>) {
    let dir = config
        .transcript
        .dir
        .clone()
        .unwrap_or_else(|| dirs.data.join("conversations"));
    Transcript::for_chat(&dir, config.transcript.enabled, resume)
}

/// Starts the UI with a worker made by `spawn`, runs it, and returns the exit code. A forced
/// exit does not return: the terminal is restored, the transcript and log flushed, and the
/// process leaves with `_exit`.
pub fn run_chat_with(opts: ChatOptions, spawn: impl FnOnce(WorkerConfig) -> WorkerLink) -> i32 {
    let (config, config_path) = match load_config(&opts) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hipscope: {e}");
            return 2;
        }
    };
    // The chat draws with escape sequences: into a file or a pipe they are noise, and the
    // terminal modes it sets cannot be set there. Refused before anything is started.
    if !io::stdout().is_terminal() {
        eprintln!(
            "hipscope: the chat needs a terminal on stdout; for text to a file or a pipe, use \
             `hipscope generate -m MODEL -p TEXT`"
        );
        return 2;
    }
    let log_file = config
        .log
        .file
        .clone()
        .unwrap_or_else(|| opts.dirs.state.join("hipscope.log"));
    let mut notices: Vec<(String, bool)> = Vec::new();
    let log = match logging::init(&log_file, config.log.level) {
        Ok(g) => g,
        Err(e) => {
            notices.push((format!("no log file: {e}"), true));
            LogGuard::none()
        }
    };
    tracing::info!("config: {}", config_path.display());
    let quit = QuitCoordinator::new(QuitConfig {
        drain_deadline: config.quit.drain_timeout,
        grace: config.quit.grace,
        hook_timeout: Duration::from_secs(2),
    });
    // On every way out: the terminal first (so messages land on the normal screen), then the
    // log. Conversation records are written unbuffered as they happen; there is nothing to flush.
    quit.add_exit_hook("restore terminal", restore_terminal);
    let log_slot = Arc::new(Mutex::new(Some(log)));
    let slot = log_slot.clone();
    quit.add_exit_hook("flush log", move || {
        drop(slot.lock().map(|mut g| g.take()));
    });
    let log_path = log_slot
        .lock()
        .ok()
        .and_then(|g| g.as_ref().and_then(|l| l.path.clone()));

    let (mut transcript, transcript_note) = open_transcript(&config, &opts.dirs, opts.args.resume);
    if let Some(n) = transcript_note {
        notices.push((n, true));
    }
    let mut app = App::new(settings(&config, log_path));
    let mut restore: Option<Command> = None;
    if opts.args.resume {
        let c = transcript.conversation().clone();
        if !c.turns.is_empty() {
            let when = c
                .started
                .map(|t| format!(" from {}", transcript::format_utc(t)))
                .unwrap_or_default();
            app.restore(
                &c.pairs(),
                c.model.as_deref(),
                &format!(
                    "reopened {} exchange{}{when} ({})",
                    c.turns.len(),
                    if c.turns.len() == 1 { "" } else { "s" },
                    transcript
                        .path()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                ),
            );
            restore = Some(Command::Restore { turns: c.pairs() });
        }
        if !c.system.is_empty() && config.system_prompt.is_empty() {
            app.system_prompt = c.system.clone();
        }
    }
    for (text, error) in notices {
        app.update(Msg::Notice { text, error });
    }

    // The terminal and the runtime come first: if either cannot be had, no worker (and no
    // device) has been started that would need a quit.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("hipscope: cannot start the event loop: {e}");
            return 1;
        }
    };
    install_panic_hook();
    let guard = match TerminalGuard::enter(config.ui.mouse) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("hipscope: cannot set up the terminal: {e}");
            return 1;
        }
    };
    let mut terminal = match Terminal::new(CrosstermBackend::new(io::stdout())) {
        Ok(t) => t,
        Err(e) => {
            drop(guard);
            eprintln!("hipscope: cannot draw on the terminal: {e}");
            return 1;
        }
    };

    let mut worker = spawn(worker_config(&config));
    if app.system_prompt != config.system_prompt {
        let _ = worker
            .commands
            .send(Command::SetSystem(app.system_prompt.clone()));
    }
    if let Some(r) = restore {
        let _ = worker.commands.send(r);
    }

    // A panic in the loop has printed its message (the hook restored the terminal first); it
    // then ends like a forced exit, so that the worker's device is never waited on by atexit.
    let ending = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(async {
            let (term_tx, term_rx) = unbounded_channel();
            tokio::spawn(async move {
                let mut stream = EventStream::new();
                while let Some(ev) = stream.next().await {
                    if term_tx.send(ev).is_err() {
                        break;
                    }
                }
            });
            let (sig_tx, sig_rx) = unbounded_channel();
            forward_signals(sig_tx, &quit);
            let mut stdout = io::stdout();
            draw(&mut terminal, &app);
            if std::env::var_os("HIPSCOPE_FAULT").is_some_and(|f| f == "panic") {
                // Fault injection for the end-to-end tests: a panic with the screen up.
                panic!("HIPSCOPE_FAULT=panic: a panic on the UI thread, as asked");
            }
            let io = LoopIo {
                transcript: &mut transcript,
                clipboard: &mut stdout,
                places: Places::from_env(
                    Some(opts.dirs.cache.clone()),
                    config.models.search_paths.clone(),
                    config.models.scan_default_locations,
                ),
                export_dir: opts.dirs.data.join("exports"),
                quit_deadline: config.quit_deadline(),
                frame: Duration::from_secs_f64(1.0 / f64::from(config.ui.fps.max(1))),
                quit: Some(quit.clone()),
            };
            event_loop(
                &mut terminal,
                Inputs {
                    terminal: term_rx,
                    signals: sig_rx,
                },
                &mut app,
                &mut worker,
                io,
            )
            .await
        })
    }))
    .unwrap_or(Ending::Panicked);
    drop(guard);
    // A terminal that went away cannot show the cursor again, and ratatui's drop would say so
    // with `eprintln!`, which panics on a closed terminal: not dropped then.
    if terminal_gone() {
        std::mem::forget(terminal);
    } else {
        drop(terminal);
    }
    transcript.sync();
    let saved = transcript
        .path()
        .map(|p| format!("hipscope: the conversation is saved in {}", p.display()));
    match ending {
        Ending::Exited(code) => {
            tracing::info!("worker exited with code {code}");
            if let Some(t) = worker.thread.take() {
                shutdown::join_worker(t, Duration::from_secs(2));
            }
            // The runtime's blocking pool (model discovery) is not waited for.
            runtime.shutdown_timeout(Duration::from_millis(100));
            // Code 0: hooks run, the code comes back for `main`. Anything else means the device
            // may not be released cleanly: the hard path, which does not return.
            let reason = format!("the worker ended its quit with code {code}");
            if code != 0
                && let Some(s) = &saved
            {
                eprintln!("{s}");
            }
            quit.finish(code, Some(&reason))
        }
        Ending::Panicked => {
            tracing::error!("the UI panicked; leaving without the worker");
            quit.run_hooks();
            eprintln!(
                "hipscope: the UI failed (the message is above); left without waiting for the GPU."
            );
            if let Some(s) = &saved {
                eprintln!("{s}");
            }
            super::quit::hard_exit_now(shutdown::EXIT_PANIC)
        }
        Ending::Forced(why) => {
            tracing::error!("leaving without the worker: {why}");
            if let Some(s) = &saved {
                eprintln!("{s}");
            }
            quit.hard_exit(&format!("{why}; left without waiting for the GPU"))
        }
    }
}

/// Starts the chat with the real inference worker.
pub fn run_chat(opts: ChatOptions) -> i32 {
    run_chat_with(opts, spawn_worker)
}

/// Starts the inference worker thread for `cfg`.
pub fn spawn_worker(cfg: WorkerConfig) -> WorkerLink {
    use crate::app::fetch::{self, FetchProgress};
    use crate::model::loader::LoadOptions;
    use crate::model::protocol::ModelSource;
    use crate::model::worker::{self, WorkerOptions};

    let request = crate::app::backend::BackendRequest {
        choice: cfg.backend,
        device: cfg.device,
        threads: cfg.threads as usize,
        compute: crate::gpu::compute::ComputeOptions::default(),
    };
    let opts = WorkerOptions {
        source: cfg.model.map(ModelSource::File),
        default_model: Box::new(|progress| {
            let mut report = |p: FetchProgress| match p {
                FetchProgress::Step(s) => progress(&s, None),
                FetchProgress::Bytes { done, total } => progress(
                    "downloading SmolLM2-135M-Instruct",
                    total.filter(|&t| t > 0).map(|t| done as f32 / t as f32),
                ),
            };
            fetch::ensure_default_model(&mut report).map_err(|e| e.to_string())
        }),
        // Which backend and why reaches the GPU panel through the device summary's reason.
        backend: Box::new(move || crate::app::backend::open(&request).map(|(b, _)| b)),
        load: LoadOptions {
            n_ctx: (cfg.ctx_size > 0).then_some(cfg.ctx_size as usize),
            sampler: cfg.sampler,
            ..LoadOptions::default()
        },
        system: (!cfg.system_prompt.trim().is_empty()).then_some(cfg.system_prompt),
    };
    let h = worker::spawn(opts);
    WorkerLink {
        commands: h.commands,
        interrupt: h.interrupt,
        events: h.events,
        thread: Some(h.thread),
    }
}

/// SIGTERM and SIGINT go through the quit coordinator's signal thread, which leaves the process
/// on the second one even if this thread is stuck; the first is passed on to the loop (a quit,
/// as if the user asked) and starts the coordinator's backstop timer. SIGHUP (the terminal
/// closed) is read here. The terminal is in raw mode, so Ctrl-C arrives as a key, not SIGINT.
fn forward_signals(tx: UnboundedSender<&'static str>, quit: &Arc<QuitCoordinator>) {
    #[cfg(unix)]
    {
        let handler_tx = tx.clone();
        let q = Arc::downgrade(quit);
        quit.set_interrupt_handler(move || {
            let _ = handler_tx.send("SIGTERM/SIGINT");
            if let Some(q) = q.upgrade() {
                q.begin();
            }
        });
        if let Err(e) = quit.install_signal_handlers() {
            tracing::warn!("cannot listen for SIGTERM/SIGINT: {e}");
        }
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(mut s) => {
                tokio::spawn(async move {
                    while s.recv().await.is_some() {
                        if tx.send("SIGHUP").is_err() {
                            break;
                        }
                    }
                });
            }
            Err(e) => tracing::warn!("cannot listen for SIGHUP: {e}"),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (tx, quit);
    }
}
