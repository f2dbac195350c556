//! The inference worker: one thread that owns the model, the device and the conversation, driven
//! by [`Command`]s and reporting [`Event`]s. The UI never waits on it; it never waits on the UI.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::gpu::backend::{Backend, BackendMonitor};
use crate::gpu::compute::KernelNeeds;
use crate::gpu::kernels::CompileProgress;
use crate::gpu::snapshot::{DeviceRelease, QuitStep, QuitStepStatus};
use crate::gpu::watchdog::{WatchEvent, WatchSink};
use crate::model::loader::{self, LoadOptions};
use crate::model::protocol::{Command, Event, ModelSource, StopReason};
use crate::model::remote::{self, client::RemoteSpec, session::RemoteSession};
use crate::model::session::{Control, Progress, Session};

/// Finds (fetching if need be) the default model, reporting `(task, detail, fraction)` as it
/// goes: one task per phase, each a bar of its own on the screen.
pub type DefaultModel =
    Box<dyn Fn(&mut dyn FnMut(&str, &str, Option<f32>)) -> Result<PathBuf, String> + Send>;

/// Makes the backend a model is loaded onto, with the process's watchdog on its device
/// reporting to the sink given (`gpu::open::open`): a GPU backend compiles the kernels the model
/// needs (its architecture's and weight types', `loader::kernel_needs`) as it opens, telling the
/// callback how a first start's compile goes.
pub type BackendFactory = Box<
    dyn Fn(
            WatchSink,
            KernelNeeds,
            &mut dyn FnMut(&CompileProgress),
        ) -> Result<Box<dyn Backend>, String>
        + Send,
>;

pub struct WorkerOptions {
    /// The model to load at start; `None` loads the default model.
    pub source: Option<ModelSource>,
    pub default_model: DefaultModel,
    pub backend: BackendFactory,
    pub load: LoadOptions,
    pub system: Option<String>,
    /// The configured drain deadline (`QuitConfig::drain_deadline`), for a quit the UI did not
    /// ask for: its end of the command channel dropped.
    pub drain_deadline: Duration,
    /// How often a remote engine's panels are read from the server (the telemetry interval).
    pub remote_poll: Duration,
}

/// The app's end of a worker: its command and event channels and its thread. The real worker
/// ([`spawn`]) and the tests' scripted stand-in both hand out this one type.
pub struct WorkerHandle {
    pub commands: Sender<Command>,
    /// Raised with a stop or a quit so that the model stops between prompt batches and layers
    /// (a long prompt would otherwise run to its end first); lowered with the next request.
    pub interrupt: Arc<AtomicBool>,
    pub events: UnboundedReceiver<Event>,
    /// Taken when the app joins the thread after the worker reported `Exited`.
    pub thread: Option<JoinHandle<()>>,
}

/// Starts the worker thread.
pub fn spawn(opts: WorkerOptions) -> WorkerHandle {
    let (ctx, crx) = mpsc::channel();
    let (etx, erx) = unbounded_channel();
    let interrupt = Arc::new(AtomicBool::new(false));
    let flag = interrupt.clone();
    let thread = std::thread::Builder::new()
        .name("hipscope-worker".into())
        .spawn(move || Worker::new(opts, crx, etx, flag).run())
        .unwrap_or_else(|e| {
            // Without a thread there is no worker; the UI sees the channel close at once.
            tracing::error!("could not start the inference worker: {e}");
            std::thread::spawn(|| {})
        });
    WorkerHandle {
        commands: ctx,
        interrupt,
        events: erx,
        thread: Some(thread),
    }
}

struct Worker {
    opts: WorkerOptions,
    commands: Receiver<Command>,
    events: UnboundedSender<Event>,
    session: Option<Session>,
    /// Where the loaded model came from, to load it again if a switch fails half-way.
    current: Option<ModelSource>,
    /// Shared with every model loaded: see [`WorkerHandle::interrupt`].
    interrupt: Arc<AtomicBool>,
    /// Commands that arrived during a generation, handled after it.
    deferred: Vec<Command>,
    /// A remote engine in place of the local model (then `session` is `None`).
    remote: Option<Remote>,
    /// During a `/set ctx` reload: the context before it, which a failed reload goes back to.
    revert_ctx: Option<Option<usize>>,
}

/// A connected remote engine and its panel poller (stopped when this drops; never joined, so
/// that a server that stopped answering cannot hold up a quit).
struct Remote {
    session: RemoteSession,
    _poller: Option<mpsc::Sender<()>>,
}

impl Worker {
    fn new(
        opts: WorkerOptions,
        commands: Receiver<Command>,
        events: UnboundedSender<Event>,
        interrupt: Arc<AtomicBool>,
    ) -> Self {
        Worker {
            interrupt,
            opts,
            commands,
            events,
            session: None,
            current: None,
            deferred: Vec::new(),
            remote: None,
            revert_ctx: None,
        }
    }

    fn send(&self, e: Event) {
        // A closed channel means the UI is gone; the quit path ends us.
        let _ = self.events.send(e);
    }

    fn error(&self, context: &str, message: impl ToString) {
        self.send(Event::Error {
            context: context.into(),
            message: message.to_string(),
        });
    }

    fn run(mut self) {
        let first = self.opts.source.take();
        self.load(first);
        loop {
            let cmd = if self.deferred.is_empty() {
                match self.commands.recv_timeout(Duration::from_secs(1)) {
                    Ok(c) => c,
                    Err(RecvTimeoutError::Timeout) => {
                        self.snapshots();
                        continue;
                    }
                    // The UI dropped its sender without quitting: wind down all the same.
                    Err(RecvTimeoutError::Disconnected) => Command::Quit {
                        drain_deadline: self.opts.drain_deadline,
                    },
                }
            } else {
                self.deferred.remove(0)
            };
            if let Command::Quit { drain_deadline } = cmd {
                let release = self.quit(drain_deadline);
                self.send(Event::Exited { release });
                return;
            }
            self.handle(cmd);
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Generate { user } => self.generate(Some(user)),
            Command::Regenerate => self.generate(None),
            Command::Stop => {} // nothing running
            Command::Clear => {
                if let Some(s) = &mut self.session {
                    s.clear();
                }
                if let Some(r) = &mut self.remote {
                    r.session.clear();
                }
            }
            Command::SetSystem(sys) => {
                self.opts.system = Some(sys.clone());
                if let Some(s) = &mut self.session {
                    s.set_system(&sys);
                }
                if let Some(r) = &mut self.remote {
                    r.session.set_system(&sys);
                }
            }
            Command::SetSampler(cfg) => {
                self.opts.load.sampler = cfg.clone();
                if let Some(r) = &mut self.remote {
                    r.session.set_sampler(cfg.clone());
                }
                if let Some(s) = &mut self.session {
                    s.set_sampler(cfg);
                }
            }
            Command::Restore { turns } if self.remote.is_some() => {
                if let Some(r) = &mut self.remote {
                    r.session.restore(&turns);
                }
            }
            Command::Restore { turns } => match &mut self.session {
                Some(s) => s.restore(&turns),
                None => self.error(
                    "resume",
                    "no model is loaded: the reopened conversation is shown, but the model starts without it",
                ),
            },
            Command::SetContext(n) => self.set_context(n),
            Command::LoadModel(ModelSource::Remote(spec)) => self.connect(spec),
            Command::LoadModel(src) => {
                self.load(Some(src));
            }
            Command::Quit { .. } => {}
        }
    }

    /// Connects to a remote engine in place of the model; the local model (if any) is
    /// released once the server has answered, and stays if it does not.
    fn connect(&mut self, spec: RemoteSpec) {
        let _ = self.events.send(Event::Progress {
            task: "connect".into(),
            fraction: None,
            detail: format!("connecting to {}", spec.url),
        });
        let events = self.events.clone();
        let watch = Box::new(move |w| {
            let _ = events.send(Event::Watchdog(w));
        });
        let keeps = if self.session.is_some() {
            "; the current model stays loaded"
        } else {
            ""
        };
        let mut c = match remote::connect(spec, self.opts.load.sampler.clone(), watch) {
            Ok(c) => c,
            Err(e) => return self.error("connecting to the remote engine", format!("{e}{keeps}")),
        };
        if let Some(sys) = &self.opts.system {
            c.session.set_system(sys);
        }
        // The local model goes: its device memory is not needed while the server answers.
        self.session = None;
        self.current = None;
        let (stop_tx, stop_rx) = mpsc::channel();
        let client = c.session.client.clone();
        let kind = c.session.kind;
        let own = c.session.own.clone();
        let events = self.events.clone();
        let every = self.opts.remote_poll;
        let poller = std::thread::Builder::new()
            .name("hipscope-remote-panels".into())
            .spawn(move || {
                remote::panels::poll(client, kind, Some(own), every, stop_rx, |s| {
                    let mut ok = events
                        .send(Event::Streams(remote::panels::streams(&s)))
                        .is_ok();
                    if let Some(a) = remote::panels::arena(&s) {
                        ok &= events.send(Event::Arena(a)).is_ok();
                    }
                    ok
                })
            })
            .ok()
            .map(|_| stop_tx);
        self.remote = Some(Remote {
            session: c.session,
            _poller: poller,
        });
        self.send(Event::ModelLoaded {
            model: c.model,
            device: c.device,
        });
    }

    /// A remote answer: streamed by the remote session, commands looked at while it waits.
    fn generate_remote(&mut self, user: Option<String>) {
        let Some(mut r) = self.remote.take() else {
            return;
        };
        let user = match user.or_else(|| r.session.pop_answer()) {
            Some(u) => u,
            None => {
                self.remote = Some(r);
                self.error("regenerate", "there is no answer to regenerate");
                return;
            }
        };
        let events = self.events.clone();
        let commands = &self.commands;
        let deferred = &mut self.deferred;
        let result = r.session.chat(&user, &mut |p| {
            match p {
                Progress::PromptDone(stats) => {
                    let _ = events.send(Event::AnswerStarted {
                        stats: stats.clone(),
                    });
                }
                Progress::Text(t) => {
                    let _ = events.send(Event::Token { text: t.into() });
                }
                Progress::Reasoning(t) => {
                    let _ = events.send(Event::Reasoning { text: t.into() });
                }
                Progress::Prompt { .. } | Progress::Trimmed(_) | Progress::Waiting => {}
            }
            let mut control = Control::Continue;
            while let Ok(c) = commands.try_recv() {
                match c {
                    Command::Stop => control = Control::Stop,
                    c @ Command::Quit { .. } => {
                        control = Control::Stop;
                        deferred.insert(0, c);
                    }
                    other => deferred.push(other),
                }
            }
            control
        });
        self.remote = Some(r);
        match result {
            Ok(answer) => self.send(Event::AnswerDone {
                stats: answer.stats,
                reason: answer.reason,
            }),
            Err(e) => {
                self.error("remote engine", &e);
                self.send(Event::AnswerDone {
                    stats: Default::default(),
                    reason: StopReason::User,
                });
            }
        }
    }

    /// `/set ctx`: the model is loaded again with a KV cache of the new size (the weights are
    /// memory-mapped, or uploaded again to a GPU), and the conversation restored into it, its
    /// oldest exchanges dropped where they no longer fit. A reload that fails goes back to the
    /// context before, with the whole conversation. Without a model, the next load uses it.
    fn set_context(&mut self, n_ctx: Option<usize>) {
        let before = std::mem::replace(&mut self.opts.load.n_ctx, n_ctx);
        let (Some(session), Some(src)) = (&self.session, self.current.clone()) else {
            return;
        };
        let turns = session.turns();
        self.revert_ctx = Some(before);
        let loaded = self.load(Some(src));
        self.revert_ctx = None;
        let Some(session) = &mut self.session else {
            return;
        };
        match session.restore_within_context(&turns) {
            Ok((dropped, tokens)) if loaded => {
                let n_ctx = session.model.n_ctx();
                let kept = session.messages().len() / 2;
                self.send(Event::ContextResized {
                    n_ctx,
                    kept,
                    dropped,
                    tokens,
                });
            }
            Ok(_) => {}
            Err(e) => self.error("restoring the conversation", e),
        }
    }

    /// Loads `src` (the default model for `None`); whether it was loaded. On a failure after the
    /// old model was released, the old model is loaded again.
    fn load(&mut self, src: Option<ModelSource>) -> bool {
        if let Some(ModelSource::Remote(spec)) = src {
            self.connect(spec);
            return self.remote.is_some();
        }
        let events = self.events.clone();
        let progress = |task: &str, fraction: Option<f32>, detail: &str| {
            let _ = events.send(Event::Progress {
                task: task.into(),
                fraction,
                detail: detail.into(),
            });
        };
        let src = match src {
            Some(s) => s,
            None => {
                let r = (self.opts.default_model)(&mut |task, step, f| progress(task, f, step));
                match r {
                    Ok(p) => ModelSource::File(p),
                    Err(e) => {
                        self.error("default model", e);
                        return false;
                    }
                }
            }
        };
        let keeps = if self.session.is_some() {
            "; the current model stays loaded"
        } else {
            ""
        };
        // Everything that can be checked without the device is checked while the old model
        // still answers: a file that cannot run here never unloads the working one.
        let file = match loader::open(&src, &mut |f, what| progress("build", Some(f), what))
            .and_then(|f| loader::check(&f).map(|()| f))
        {
            Ok(f) => f,
            Err(e) => {
                self.error("loading the model", format!("{e}{keeps}"));
                return false;
            }
        };
        // The old model goes now: two models may not fit at once. If the new one still fails
        // on the device, the old one is loaded again.
        let previous = self.session.take().and(self.current.take());
        let failed = |w: &mut Self, context: &str, e: String| {
            match (previous.clone(), w.revert_ctx.take()) {
                (Some(prev), Some(ctx)) => {
                    w.opts.load.n_ctx = ctx;
                    w.error(
                        context,
                        format!("{e}; loading the model again with the context it had"),
                    );
                    w.load(Some(prev));
                }
                (Some(prev), None) => {
                    w.error(context, format!("{e}; loading the previous model again"));
                    w.load(Some(prev));
                }
                (None, _) => w.error(context, e),
            }
            false
        };
        let needs = loader::kernel_needs(&file);
        let mut compiling = |p: &CompileProgress| {
            progress("kernels", Some(p.fraction()), &p.describe());
        };
        let backend = match (self.opts.backend)(self.watch_sink(), needs, &mut compiling) {
            Ok(b) => b,
            Err(e) => return failed(self, "opening the device", e),
        };
        let mut load = self.opts.load.clone();
        load.more_gpus = load.more_gpus.map(|m| m.with_sink(self.other_gpus_sink()));
        match loader::load(file, backend, &load, &mut |f, what| {
            progress("load", Some(f), what)
        }) {
            Ok(loaded) => {
                self.current = Some(src);
                self.remote = None;
                // Notices, not errors: an error during a load would end the load in the UI.
                for w in &loaded.warnings {
                    self.send(Event::Notice {
                        context: "model".into(),
                        message: w.clone(),
                    });
                }
                let mut session = loaded.session;
                // After the load: a split model's device says how it is split; `-ngl auto` with
                // every layer on the GPU says so too.
                let mut device = session.model.backend().device();
                if let Some(o) = &loaded.offload
                    && !device.reason.contains(o.as_str())
                {
                    device.reason = format!("{}; {o}", device.reason);
                }
                session.model.set_interrupt(self.interrupt.clone());
                if let Some(sys) = &self.opts.system {
                    session.set_system(sys);
                }
                self.session = Some(session);
                self.send(Event::ModelLoaded {
                    model: loaded.summary,
                    device,
                });
                self.snapshots();
                true
            }
            Err(e) => failed(self, "loading the model", e.to_string()),
        }
    }

    /// The watchdog's verdicts, straight to the UI: they arrive while this thread is stuck.
    /// The watchdog sinks of the GPUs a split opens beside the first: only what is not OK
    /// reaches the Watchdog panel (the first GPU's heartbeat keeps it current), so that a GPU
    /// whose op is SLOW or HUNG is what it shows, named by its stream.
    fn other_gpus_sink(&self) -> crate::gpu::open::SinkMaker {
        let events = self.events.clone();
        std::sync::Arc::new(move || {
            let events = events.clone();
            Box::new(move |ev| {
                let snapshot = match ev {
                    WatchEvent::Snapshot(s) | WatchEvent::Hung { snapshot: s, .. } => s,
                };
                if snapshot.state != crate::gpu::snapshot::WatchState::Ok {
                    let _ = events.send(Event::Watchdog(snapshot));
                }
            })
        })
    }

    fn watch_sink(&self) -> WatchSink {
        let events = self.events.clone();
        Box::new(move |ev| {
            let snapshot = match ev {
                WatchEvent::Snapshot(s) | WatchEvent::Hung { snapshot: s, .. } => s,
            };
            let _ = events.send(Event::Watchdog(snapshot));
        })
    }

    fn snapshots(&self) {
        if let Some(s) = &self.session {
            let b = s.model.backend();
            self.send(Event::Streams(b.streams()));
            self.send(Event::Arena(b.arena()));
        }
    }

    fn generate(&mut self, user: Option<String>) {
        if self.remote.is_some() {
            return self.generate_remote(user);
        }
        let Some(mut session) = self.session.take() else {
            self.error("chat", "no model is loaded");
            return;
        };
        let user = match user {
            Some(u) => u,
            None => match session.pop_answer() {
                Some(u) => u,
                None => {
                    self.session = Some(session);
                    self.error("regenerate", "there is no answer to regenerate");
                    return;
                }
            },
        };
        let events = self.events.clone();
        // The session holds the backend for the whole answer: stream snapshots come from the
        // backend's monitor on a thread of their own meanwhile (the watchdog has its own thread).
        let monitor = session
            .model
            .backend()
            .monitor()
            .map(|m| MonitorThread::start(m, self.events.clone()));
        let commands = &self.commands;
        let deferred = &mut self.deferred;
        let result = session.chat(&user, &mut |p| {
            if let Progress::Prompt { done, total } = p {
                // Between batches of the prompt: the answer is not looked at, so commands wait.
                let _ = events.send(Event::PromptProgress { done, total });
                return Control::Continue;
            }
            match p {
                Progress::Prompt { .. } => {}
                Progress::PromptDone(stats) => {
                    let _ = events.send(Event::AnswerStarted {
                        stats: stats.clone(),
                    });
                }
                Progress::Text(t) => {
                    let _ = events.send(Event::Token { text: t.into() });
                }
                Progress::Reasoning(t) => {
                    let _ = events.send(Event::Reasoning { text: t.into() });
                }
                Progress::Trimmed(t) => {
                    let _ = events.send(Event::ContextTrimmed(t.clone()));
                }
                Progress::Waiting => {}
            }
            let mut control = Control::Continue;
            while let Ok(c) = commands.try_recv() {
                match c {
                    Command::Stop => control = Control::Stop,
                    c @ Command::Quit { .. } => {
                        control = Control::Stop;
                        deferred.insert(0, c);
                    }
                    other => deferred.push(other),
                }
            }
            control
        });
        if let Some(m) = monitor {
            m.stop();
        }
        match result {
            Ok(answer) => self.send(Event::AnswerDone {
                stats: answer.stats,
                reason: answer.reason,
            }),
            Err(e) => {
                self.error("generation", &e);
                self.send(Event::AnswerDone {
                    stats: Default::default(),
                    reason: StopReason::User,
                });
            }
        }
        self.session = Some(session);
        self.snapshots();
    }

    /// Releases the model and device in order, reporting each step; returns how the device
    /// was released.
    fn quit(&mut self, drain_deadline: Duration) -> DeviceRelease {
        let events = self.events.clone();
        let step = |name: &str, f: &mut dyn FnMut() -> Result<(), String>| {
            let t = Instant::now();
            let _ = events.send(Event::QuitStep(QuitStep {
                name: name.into(),
                status: QuitStepStatus::Running,
                elapsed: Duration::ZERO,
            }));
            let status = match f() {
                Ok(()) => QuitStepStatus::Done,
                Err(e) => QuitStepStatus::Failed(e),
            };
            let _ = events.send(Event::QuitStep(QuitStep {
                name: name.into(),
                status,
                elapsed: t.elapsed(),
            }));
        };
        let mut session = self.session.take();
        step("stop intake", &mut || Ok(()));
        if self.remote.take().is_some() {
            // The stream (if any) was closed when the answer stopped; the poller stops on its
            // own. Nothing here waits on the network.
            step("disconnect from the remote engine", &mut || Ok(()));
        }
        // The device half: bounded drain, then each GPU resource in order, each step reported.
        let release = match &mut session {
            Some(s) => s
                .model_mut()
                .backend_mut()
                .shutdown(drain_deadline, &mut |st| {
                    let _ = events.send(Event::QuitStep(st));
                }),
            None => DeviceRelease::Clean,
        };
        if release == DeviceRelease::Abandoned {
            // The GPU is wedged: touch nothing more of it; the process leaves with _exit.
            std::mem::forget(session.take());
            return release;
        }
        step("release model and backend", &mut || {
            session.take();
            Ok(())
        });
        release
    }
}

/// Sends `Streams` snapshots from a backend monitor every [`MONITOR_EVERY`] while a generation
/// runs (the monitor reads atomics only: it cannot block on the device).
struct MonitorThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

const MONITOR_EVERY: Duration = Duration::from_millis(250);

impl MonitorThread {
    fn start(m: Arc<dyn BackendMonitor>, events: UnboundedSender<Event>) -> MonitorThread {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let handle = std::thread::Builder::new()
            .name("hipscope-monitor".into())
            .spawn(move || {
                while !s2.load(Ordering::Acquire) {
                    let _ = events.send(Event::Streams(m.streams()));
                    std::thread::park_timeout(MONITOR_EVERY);
                }
            })
            .ok();
        MonitorThread { stop, handle }
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}
