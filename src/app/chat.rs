//! The chat, wired: settings from the config file and the flags, the log, the transcript, the
//! quit coordinator (with its exit hooks and the one panic hook), the terminal, the worker thread
//! and the event loop; then the way out the loop's ending asks for.

use std::io::{self, IsTerminal};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use tokio::sync::mpsc::unbounded_channel;

use super::chat_args::ChatArgs;
use super::config::{self, Config};
use super::discover::Places;
use super::event_loop::{Inputs, LoopIo, draw, event_loop};
use super::logging::{self, LogGuard};
use super::quit::QuitCoordinator;

use super::shutdown::{self, Ending};
use super::signals;
use super::terminal::{TerminalGuard, restore_terminal, spawn_input};
use super::transcript::{self, Transcript};
use crate::app::exit_code;
use crate::app::stderr::errln;
use crate::model::protocol::Command;
use crate::model::worker::WorkerHandle;
use crate::ui::theme::ThemeName;
use crate::ui::{App, Msg, Settings};

/// What the worker is started with (the coordinator's `WorkerOptions` is built from this).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerConfig {
    pub model: Option<PathBuf>,
    /// A remote engine to connect to instead of loading `model`.
    pub remote: Option<crate::model::remote::client::RemoteSpec>,
    pub backend: config::BackendChoice,
    /// `None`: the model's trained context, at most 4096; `Some(0)`: all of it that fits.
    pub ctx_size: Option<u32>,
    pub threads: u32,
    pub n_gpu_layers: crate::model::split::GpuLayers,
    pub device: Option<u32>,
    /// A model over several GPUs (`--split-mode`, `--tensor-split`, `--main-gpu`).
    pub split: crate::model::split::SplitOptions,
    /// Graph replay of the GPU decode step (config `graphs`, `--no-graphs`).
    pub graphs: bool,
    /// Most tokens per forward step of a prompt (`-b`).
    pub n_batch: usize,
    /// Element type of the KV cache (`--kv-type`).
    pub kv_type: crate::gpu::compute::KvType,
    pub sampler: crate::model::protocol::SamplerConfig,
    pub system_prompt: String,
    pub ctx_discard: u8,
    /// The configured drain deadline, for a quit the UI could not ask for.
    pub drain_deadline: Duration,
    /// How patient the download of the default model is.
    pub fetch: config::FetchConfig,
    /// How often a remote engine's panels are read (the telemetry interval).
    pub remote_poll: Duration,
    /// The environment's switches for measuring code paths (`app/settings.rs`).
    pub tuning: super::settings::Tuning,
}

impl WorkerConfig {
    /// The chat's flags that set the worker alone (no config key): `-b`, `--kv-type`.
    pub fn apply_flags(&mut self, args: &ChatArgs) {
        if let Some(b) = args.batch_size {
            self.n_batch = b;
        }
        if let Some(k) = args.kv_type {
            self.kv_type = k;
        }
    }
}

/// Everything `run_chat` needs: the flags, and the settings resolved as for every command
/// (where hipscope keeps its files among them).
#[derive(Clone, Debug)]
pub struct ChatOptions {
    pub args: ChatArgs,
    pub settings: super::settings::Settings,
}

pub use crate::gpu::dirs::Dirs;

/// The settings, from the config file and the flags; an error is for the user as is. The first
/// start writes the documented defaults where the file is looked for, to edit.
pub fn load_config(opts: &ChatOptions) -> Result<(Config, PathBuf), String> {
    let path = opts.settings.config_path.clone();
    if !opts.settings.named
        && let Err(e) = config::write_default_if_missing(&path)
    {
        // Not fatal: the defaults apply.
        errln!("hipscope: could not write {}: {e}", path.display());
    }
    let mut config = opts.settings.config.clone();
    opts.args.apply(&mut config)?;
    if std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()) {
        config.ui.theme = ThemeName::Mono;
    }
    Ok((config, path))
}

/// The view's starting settings.
pub fn settings(config: &Config, log: Option<PathBuf>) -> Settings {
    let model_label = match &config.remote.selected {
        Some(r) => format!("remote {}", r.name),
        None => config
            .model
            .as_ref()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "SmolLM2-135M-Instruct".into()),
    };
    Settings {
        theme: config.ui.theme,
        sidebar: config.ui.diagnostics,
        sidebar_width: config.ui.diagnostics_width,
        panels: config.ui.panels,
        sampler: config.sampler.clone(),
        system_prompt: config.system_prompt.clone(),
        model_label,
        quit: config.quit,
        history: Vec::new(),
        log_path: log,
    }
}

pub fn worker_config(config: &Config) -> WorkerConfig {
    WorkerConfig {
        model: config.model.clone(),
        remote: config.remote.selected.clone(),
        backend: config.backend,
        ctx_size: config.ctx_size,
        threads: config.threads,
        n_gpu_layers: config.n_gpu_layers,
        device: config.device,
        split: config.split.clone(),
        graphs: config.graphs,
        n_batch: crate::model::loader::LoadOptions::default().n_batch,
        kv_type: crate::gpu::compute::KvType::default(),
        sampler: config.sampler.clone(),
        system_prompt: config.system_prompt.clone(),
        ctx_discard: config.ctx_discard,
        drain_deadline: config.quit.drain_deadline,
        fetch: config.fetch,
        remote_poll: crate::gpu::telemetry::interval(config.telemetry.interval_ms),
        tuning: config.tuning,
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
pub fn run_chat_with(opts: ChatOptions, spawn: impl FnOnce(WorkerConfig) -> WorkerHandle) -> i32 {
    let (config, config_path) = match load_config(&opts) {
        Ok(c) => c,
        Err(e) => {
            errln!("hipscope: {e}");
            return exit_code::USAGE;
        }
    };
    // An explicit GPU that cannot start would leave the chat waiting for it forever: refuse it
    // here, before the terminal is taken (`auto` falls back to the CPU instead).
    if let Err(e) = crate::gpu::select::preflight(config.backend, config.device) {
        errln!(
            "hipscope: the {} backend cannot start: {e}\n  (--backend auto uses the CPU when no GPU can start)",
            config.backend
        );
        return exit_code::USAGE;
    }
    // The chat draws with escape sequences: into a file or a pipe they are noise, and the
    // terminal modes it sets cannot be set there. Refused before anything is started.
    if !io::stdout().is_terminal() {
        errln!(
            "hipscope: the chat needs a terminal on stdout; for text to a file or a pipe, use \
             `hipscope generate -m MODEL -p TEXT`"
        );
        return exit_code::USAGE;
    }
    let log_file = config
        .log
        .file
        .clone()
        .unwrap_or_else(|| opts.settings.dirs.state.join("hipscope.log"));
    let mut notices: Vec<(String, bool)> = opts
        .settings
        .notes
        .iter()
        .map(|n| (n.clone(), false))
        .collect();
    // Folders and files from before they were private: made so, and said once.
    for t in opts.settings.dirs.tighten_private() {
        notices.push((t.to_string(), false));
    }
    let log = match logging::init(&log_file, config.log.level) {
        Ok(mut g) => {
            notices.extend(g.tightened.take().map(|t| (t, false)));
            g
        }
        Err(e) => {
            notices.push((format!("no log file: {e}"), true));
            LogGuard::none()
        }
    };
    tracing::info!("config: {}", config_path.display());
    let quit = QuitCoordinator::new(config.quit);
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

    let (mut transcript, transcript_note) =
        open_transcript(&config, &opts.settings.dirs, opts.args.resume);
    if let Some(n) = transcript_note {
        notices.push((n, true));
    }
    if let Some(p) = transcript.path() {
        quit.set_hard_exit_note(format!(
            "hipscope: the conversation is saved in {}",
            p.display()
        ));
    }
    let mut config = config;
    if opts.args.resume {
        let named = opts.args.model_path().is_some();
        let said = transcript::resume_model(transcript.conversation(), named, &mut config);
        notices.extend(said.map(|n| (n, false)));
    }
    if opts.args.resume
        && let Some(values) = &transcript.conversation().sampler
    {
        // The conversation's own settings, under any given on the command line.
        for (k, v) in values {
            if let Some(f) = crate::ui::sampler::field(k) {
                let _ = (f.set)(&mut config.sampler, v);
            }
        }
        if let Err(e) = opts.args.apply(&mut config) {
            tracing::warn!("reapplying the flags: {e}");
        }
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
            let turns: Vec<_> = c
                .turns
                .iter()
                .map(|t| crate::ui::state::Reopened {
                    user: t.user.clone(),
                    reasoning: t.reasoning.clone(),
                    answer: t.answer.clone(),
                    summary: t.summary.clone(),
                })
                .collect();
            app.restore_with_stats(
                &turns,
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

    // `--trace`: a file that cannot be written is said before the terminal is taken.
    if let Some(p) = &opts.args.trace {
        if let Err(e) = crate::gpu::trace::start_file(p) {
            errln!("hipscope: --trace: {e}");
            return exit_code::USAGE;
        }
        app.update(Msg::Tracing(Some(p.clone())));
    }

    // The terminal and the runtime come first: if either cannot be had, no worker (and no
    // device) has been started that would need a quit.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            errln!("hipscope: cannot start the event loop: {e}");
            return exit_code::FAILED;
        }
    };
    quit.install_panic_hook();
    let guard = match TerminalGuard::enter(config.ui.mouse) {
        Ok(g) => g,
        Err(e) => {
            errln!("hipscope: cannot set up the terminal: {e}");
            return exit_code::FAILED;
        }
    };
    let mut terminal = match Terminal::new(CrosstermBackend::new(guard.output())) {
        Ok(t) => t,
        Err(e) => {
            drop(guard);
            errln!("hipscope: cannot draw on the terminal: {e}");
            return exit_code::FAILED;
        }
    };
    let (term_tx, term_rx) = unbounded_channel();
    if let Err(e) = spawn_input(term_tx) {
        drop(guard);
        errln!("hipscope: cannot read the terminal: {e}");
        return exit_code::FAILED;
    }

    if let Some(m) = &config.model {
        signals::note_mapped_file(m);
    }
    let mut wc = worker_config(&config);
    wc.apply_flags(&opts.args);
    let mut worker = spawn(wc);
    if app.system_prompt != config.system_prompt {
        let _ = worker
            .commands
            .send(Command::SetSystem(app.system_prompt.clone()));
    }
    if let Some(r) = restore {
        let _ = worker.commands.send(r);
    }

    // A panic in the loop does not come back here: the panic hook restores the terminal, prints
    // the message and leaves with `_exit`, so that the worker's device is never waited on.
    // A signal starts the quit's deadline on the signal thread, stops the worker's computation at
    // once and tells the loop, which asks the worker to quit.
    let (sig_tx, sig_rx) = unbounded_channel();
    let interrupt = worker.interrupt.clone();
    quit.set_interrupt_handler(move |name| {
        interrupt.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = sig_tx.send(name);
    });
    let q = quit.clone();
    if let Err(e) = signals::listen(move |name| q.signal(name)) {
        tracing::warn!("cannot listen for SIGINT/SIGTERM/SIGHUP: {e}");
    }
    let mut clipboard = guard.output();

    let ending = runtime.block_on(async {
        draw(&mut terminal, &app);
        if crate::gpu::fault::active() == Some(crate::gpu::fault::Fault::Panic) {
            // Fault injection for the end-to-end tests: a panic with the screen up.
            panic!("HIPSCOPE_FAULT=panic: a panic on the UI thread, as asked");
        }
        let io = LoopIo {
            transcript: &mut transcript,
            clipboard: &mut clipboard,
            places: Places::from_env(
                Some(opts.settings.dirs.cache.clone()),
                config.models.search_paths.clone(),
                config.models.scan_default_locations,
            ),
            export_dir: opts.settings.dirs.data.join("exports"),
            config_file: config_path.clone(),
            frame: Duration::from_secs_f64(1.0 / f64::from(config.ui.fps.max(1))),
            quit: quit.clone(),
            telemetry: Some(crate::gpu::telemetry::interval(
                config.telemetry.interval_ms,
            )),
            remotes: config.remote.endpoints.clone(),
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
    });
    drop(guard);
    // After the restore nothing reaches the terminal (the writer takes no more): ratatui's drop,
    // which shows the cursor, writes nothing.
    drop(terminal);
    transcript.sync();
    if let Some(what) = transcript.unsaved() {
        errln!("hipscope: {what}");
    }
    // The timeline file (`--trace`, `/trace on`) gets its closing bracket.
    super::cmd::model_args::stop_trace();
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
            quit.finish(code, Some(&reason))
        }
        Ending::Forced(why) => {
            tracing::error!("leaving without the worker: {why}");
            quit.hard_exit(&format!("{why}; left without waiting for the GPU"))
        }
    }
}

/// Starts the chat with the real inference worker.
pub fn run_chat(opts: ChatOptions) -> i32 {
    run_chat_with(opts, spawn_worker)
}

/// Starts the inference worker thread for `cfg`.
pub fn spawn_worker(cfg: WorkerConfig) -> WorkerHandle {
    use crate::app::fetch::{self, FetchProgress};
    use crate::model::loader::LoadOptions;
    use crate::model::protocol::ModelSource;
    use crate::model::worker::{self, WorkerOptions};

    let request = crate::gpu::open::BackendRequest {
        choice: cfg.backend,
        device: cfg.device,
        cpu: cfg.tuning.cpu(cfg.threads as usize),
        compute: cfg.tuning.compute(cfg.kv_type, cfg.graphs),
    };
    // The other GPUs a split over several opens (`--split-mode layer`, or a model too large for
    // one): as the first, each with its own watchdog.
    let more_gpus = crate::gpu::open::MoreGpus::for_request(&request);
    let opts = WorkerOptions {
        source: match cfg.remote {
            Some(spec) => Some(ModelSource::Remote(spec)),
            None => cfg.model.map(ModelSource::File),
        },
        default_model: Box::new(move |progress| {
            // Steps are logged; each phase (download, unpack, verify) is a bar of its own.
            let mut report = |p: FetchProgress| match p {
                FetchProgress::Step(s) => tracing::info!("default model: {s}"),
                FetchProgress::Bytes {
                    phase,
                    done,
                    total,
                    per_sec,
                } => progress(
                    phase.name(),
                    &FetchProgress::bytes_text(done, total, per_sec),
                    FetchProgress::fraction(done, total),
                ),
            };
            fetch::ensure_default_model(&fetch::FetchOptions::from_config(&cfg.fetch), &mut report)
                .map_err(|e| {
                    tracing::error!("fetching the default model: {e}");
                    e.to_string()
                })
        }),
        // Which backend and why reaches the GPU panel through the device summary's reason.
        backend: Box::new(move |watch, needs, progress| {
            // The kernels this model launches are compiled as the device opens; the rest at
            // their first use.
            let mut r = request.clone();
            r.compute.kernels = Some(needs);
            crate::gpu::open::open(&r, watch, progress).map(|(b, _)| b)
        }),
        load: LoadOptions {
            n_ctx: cfg.ctx_size.map(|n| n as usize),
            n_batch: cfg.n_batch,
            sampler: cfg.sampler,
            discard: f32::from(cfg.ctx_discard) / 100.0,
            gpu_layers: cfg.n_gpu_layers,
            cpu: cfg.tuning.cpu(cfg.threads as usize),
            split: cfg.split,
            more_gpus: Some(more_gpus),
            ..LoadOptions::default()
        },
        system: (!cfg.system_prompt.trim().is_empty()).then_some(cfg.system_prompt),
        drain_deadline: cfg.drain_deadline,
        remote_poll: cfg.remote_poll,
    };
    worker::spawn(opts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        chat: ChatArgs,
    }

    /// Issue 32 item 7: `-b` and `--kv-type`, as every command that runs a model takes them,
    /// reach the worker (they were "unexpected argument").
    #[test]
    fn batch_size_and_kv_type_reach_the_worker() {
        let parse = |v: &[&str]| Cli::try_parse_from(v.iter().copied());
        let mut w = worker_config(&Config::default());
        assert_eq!(
            (w.n_batch, w.kv_type),
            (512, crate::gpu::compute::KvType::F16)
        );
        let args = parse(&["hipscope", "-b", "256", "--kv-type", "f32"])
            .expect("parses")
            .chat;
        w.apply_flags(&args);
        assert_eq!(
            (w.n_batch, w.kv_type),
            (256, crate::gpu::compute::KvType::F32)
        );
        assert!(
            parse(&["hipscope", "-b", "0"]).is_err(),
            "a batch of 0 tokens"
        );
    }
}
