//! The collector thread (`hipscope-trace`): the one reader of the ring. It holds a step's op
//! events until the step is over (its ops' bytes depend on the whole step: an op of several
//! kernels shares its bytes among them by time), then writes them to the timeline file and feeds
//! the profile. Started on first use and left blocked on the ring when nothing collects; the
//! app talks to it through orders on the same ring ([`Control`]), each answered within a bounded
//! wait, so neither the worker nor the UI thread ever waits on the file.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, sync_channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::label::{OpCosts, parse_label};
use super::profile::{ProfileSnapshot, Profiler};
use super::writer::{Args, TraceFile};
use super::{
    Cat, Ev, Msg, Name, TrackId, TrackInfo, dropped, fixed_track_name, registered_tracks, ring,
    set_on,
};
use crate::gpu::stream::OpKind;

/// Receives the profile as it changes (at most every [`PUBLISH_EVERY`]).
pub type ProfileSink = Box<dyn Fn(ProfileSnapshot) + Send>;

/// How often the profile is handed to its sink while steps arrive.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(250);
/// A step whose end arrived this long ago is written even if ops of it might still come.
const STEP_GRACE: Duration = Duration::from_millis(300);
/// How often the collector takes what the ring holds while something collects (the ring holds
/// far more than arrives in this time).
const POLL: Duration = Duration::from_millis(10);
/// How long an order waits for the collector's answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot write the trace file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("a trace is already being written to {0}")]
    Busy(PathBuf),
    #[error("no trace is being written")]
    NotTracing,
    #[error("the trace collector did not answer")]
    Gone,
}

/// Where tracing stands.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceStatus {
    /// The timeline file being written.
    pub file: Option<PathBuf>,
    /// Events written to it so far.
    pub events: u64,
    /// Events the ring dropped since the process started.
    pub dropped: u64,
    /// Whether the profile is collected.
    pub profile: bool,
    /// Why the last file stopped early (a failed write), if it did.
    pub error: Option<String>,
}

pub(crate) enum Control {
    StartFile(Box<TraceFile>, SyncSender<()>),
    StopFile(SyncSender<Result<(PathBuf, u64), TraceError>>),
    Profile(Option<(usize, Option<ProfileSink>)>, SyncSender<()>),
    Snapshot(SyncSender<ProfileSnapshot>),
    Reset,
    Status(SyncSender<TraceStatus>),
}

fn send(c: Control) -> Result<(), TraceError> {
    start_collector();
    ring().tx.send(Msg::Ctl(c)).map_err(|_| TraceError::Gone)
}

fn ask<T>(make: impl FnOnce(SyncSender<T>) -> Control) -> Result<T, TraceError> {
    let (tx, rx) = sync_channel(1);
    send(make(tx))?;
    rx.recv_timeout(ANSWER_WITHIN).map_err(|_| TraceError::Gone)
}

/// Whether the collector thread was ever started (nothing to ask it otherwise).
fn collector_started() -> bool {
    ring()
        .rx
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_none()
}

fn start_collector() {
    let rx = ring().rx.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(rx) = rx {
        let spawned = std::thread::Builder::new()
            .name("hipscope-trace".into())
            .spawn(move || Collector::new().run(rx));
        if let Err(e) = spawned {
            tracing::warn!("could not start the trace collector: {e}");
        }
    }
}

/// Starts writing the timeline to `path` (created, or emptied).
pub fn start_file(path: &Path) -> Result<(), TraceError> {
    if let Some(f) = status().ok().and_then(|s| s.file) {
        return Err(TraceError::Busy(f));
    }
    let file = TraceFile::create(path).map_err(|source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    ask(|tx| Control::StartFile(Box::new(file), tx))
}

/// Stops the timeline: the rest is written and the file closed. Returns its path and the events
/// written.
pub fn stop_file() -> Result<(PathBuf, u64), TraceError> {
    if !collector_started() {
        return Err(TraceError::NotTracing);
    }
    ask(Control::StopFile)?
}

/// Collects the profile over the last `keep` decode steps (and the last prompt); `sink` gets it
/// as it changes. Waits (bounded) until it is on, so that the next step counts.
pub fn enable_profile(keep: usize, sink: Option<ProfileSink>) {
    let _ = ask(|tx| Control::Profile(Some((keep, sink)), tx));
}

pub fn disable_profile() {
    if collector_started() {
        let _ = ask(|tx| Control::Profile(None, tx));
    }
}

/// The profile now, every event pushed before the call counted.
pub fn profile_now() -> Option<ProfileSnapshot> {
    ask(Control::Snapshot).ok()
}

/// Forgets the steps profiled so far.
pub fn reset_profile() {
    let _ = send(Control::Reset);
}

/// What the profile divides by, set by the model's load and the app; kept here (not sent) so
/// that setting it starts no thread when nothing collects.
struct Basis {
    version: u64,
    costs: Arc<OpCosts>,
    bandwidth: Option<f64>,
}

fn basis() -> &'static Mutex<Basis> {
    static BASIS: OnceLock<Mutex<Basis>> = OnceLock::new();
    BASIS.get_or_init(|| {
        Mutex::new(Basis {
            version: 0,
            costs: Arc::new(OpCosts::default()),
            bandwidth: None,
        })
    })
}

static BASIS_VERSION: AtomicU64 = AtomicU64::new(0);

fn set_basis(f: impl FnOnce(&mut Basis)) {
    let mut b = basis().lock().unwrap_or_else(|e| e.into_inner());
    f(&mut b);
    b.version += 1;
    BASIS_VERSION.store(b.version, Ordering::Release);
}

/// The bytes each op of the loaded model moves (`model::bound::op_costs`).
pub fn set_op_costs(costs: OpCosts) {
    set_basis(|b| b.costs = Arc::new(costs));
}

/// The device's memory bandwidth (bytes/s) the bound column divides by.
pub fn set_bandwidth(bw: Option<f64>) {
    set_basis(|b| b.bandwidth = bw);
}

pub fn status() -> Result<TraceStatus, TraceError> {
    if !collector_started() {
        return Ok(TraceStatus::default());
    }
    ask(Control::Status)
}

#[derive(Default)]
struct PendingStep {
    pos0: u64,
    tokens: u64,
    ops: Vec<Ev>,
    end: Option<(Ev, Instant)>,
}

struct Collector {
    file: Option<TraceFile>,
    error: Option<String>,
    profile: bool,
    sink: Option<ProfileSink>,
    profiler: Profiler,
    costs: Arc<OpCosts>,
    bandwidth: Option<f64>,
    basis_version: u64,
    tracks: HashMap<TrackId, TrackInfo>,
    steps: BTreeMap<u32, PendingStep>,
    newest_op_step: u32,
    last_flush: Instant,
    last_publish: Instant,
    dirty: bool,
}

impl Collector {
    fn new() -> Collector {
        Collector {
            file: None,
            error: None,
            profile: false,
            sink: None,
            profiler: Profiler::default(),
            costs: Arc::new(OpCosts::default()),
            bandwidth: None,
            basis_version: 0,
            tracks: HashMap::new(),
            steps: BTreeMap::new(),
            newest_op_step: 0,
            last_flush: Instant::now(),
            last_publish: Instant::now(),
            dirty: false,
        }
    }

    fn collecting(&self) -> bool {
        self.file.is_some() || self.profile
    }

    fn busy(&self) -> bool {
        self.file.as_ref().is_some_and(|f| f.pending_bytes() > 0)
            || !self.steps.is_empty()
            || (self.dirty && self.sink.is_some())
    }

    fn run(mut self, rx: Receiver<Msg>) {
        loop {
            if self.collecting() || self.busy() {
                // Polled, not woken: a receiver blocked on the ring would be woken by every
                // event pushed, a context switch per op on the threads that compute.
                std::thread::sleep(POLL);
            } else {
                // Nothing collects, so nothing but an order can come.
                match rx.recv() {
                    Ok(m) => self.handle(m),
                    Err(_) => return,
                }
            }
            // At most a ring's worth at a time, so that files are flushed and orders answered
            // even while events pour in.
            for _ in 0..super::RING_EVENTS {
                match rx.try_recv() {
                    Ok(m) => self.handle(m),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            self.tick(false);
        }
    }

    fn handle(&mut self, m: Msg) {
        match m {
            Msg::Ev(ev) if self.collecting() => self.event(ev),
            Msg::Ev(_) => {}
            Msg::Ctl(c) => self.control(c),
        }
    }

    fn control(&mut self, c: Control) {
        match c {
            Control::StartFile(f, ack) => {
                self.file = Some(*f);
                self.error = None;
                self.tracks.clear();
                set_on(true);
                let _ = ack.send(());
            }
            Control::StopFile(reply) => {
                self.tick(true);
                let r = match self.file.take() {
                    Some(f) => {
                        let path = f.path().to_path_buf();
                        f.finish()
                            .map(|n| (path.clone(), n))
                            .map_err(|source| TraceError::Io { path, source })
                    }
                    None => Err(TraceError::NotTracing),
                };
                set_on(self.collecting());
                let _ = reply.send(r);
            }
            Control::Profile(on, ack) => {
                self.profile = on.is_some();
                match on {
                    Some((keep, sink)) => {
                        self.profiler = Profiler::new(keep);
                        self.sink = sink;
                    }
                    None => {
                        self.profiler.reset();
                        self.sink = None;
                    }
                }
                set_on(self.collecting());
                let _ = ack.send(());
            }
            Control::Snapshot(reply) => {
                self.tick(true);
                let _ = reply.send(self.snapshot());
            }
            Control::Reset => {
                self.tick(true);
                self.profiler.reset();
            }
            Control::Status(reply) => {
                let _ = reply.send(TraceStatus {
                    file: self.file.as_ref().map(|f| f.path().to_path_buf()),
                    events: self.file.as_ref().map_or(0, |f| f.events()),
                    dropped: dropped(),
                    profile: self.profile,
                    error: self.error.clone(),
                });
            }
        }
    }

    fn snapshot(&self) -> ProfileSnapshot {
        let mut s = self.profiler.snapshot(&self.costs, self.bandwidth);
        s.dropped = dropped();
        s
    }

    fn event(&mut self, ev: Ev) {
        match ev.cat {
            Cat::StepBegin => {
                let s = self.steps.entry(ev.step).or_default();
                s.pos0 = ev.a;
                s.tokens = ev.b;
            }
            Cat::Step => {
                let s = self.steps.entry(ev.step).or_default();
                s.pos0 = ev.a;
                s.tokens = ev.b;
                s.end = Some((ev, Instant::now()));
            }
            Cat::Op(_) if ev.step > 0 => {
                self.newest_op_step = self.newest_op_step.max(ev.step);
                self.steps.entry(ev.step).or_default().ops.push(ev);
            }
            // An op outside any step (the load's uploads): written as it comes.
            Cat::Op(_) if self.file.is_some() => self.finish_step(
                0,
                PendingStep {
                    ops: vec![ev],
                    ..PendingStep::default()
                },
            ),
            Cat::Op(_) => {}
            _ => self.write_plain(&ev),
        }
    }

    /// Writes the steps that are over, flushes and publishes what is due.
    fn tick(&mut self, all: bool) {
        if BASIS_VERSION.load(Ordering::Acquire) != self.basis_version {
            let b = basis().lock().unwrap_or_else(|e| e.into_inner());
            self.costs = b.costs.clone();
            self.bandwidth = b.bandwidth;
            self.basis_version = b.version;
        }
        let newest_end = self
            .steps
            .iter()
            .rev()
            .find(|(_, s)| s.end.is_some())
            .map_or(0, |(id, _)| *id);
        let ready: Vec<u32> = self
            .steps
            .iter()
            .filter(|(id, s)| {
                all || s.end.as_ref().is_some_and(|(_, at)| {
                    self.newest_op_step > **id || newest_end > **id || at.elapsed() > STEP_GRACE
                })
            })
            .map(|(id, _)| *id)
            .collect();
        for id in ready {
            if let Some(s) = self.steps.remove(&id) {
                self.finish_step(id, s);
            }
        }
        // A step whose end never came (an interrupted forward) is let go after a while.
        while self.steps.len() > 4096 {
            let Some((&id, _)) = self.steps.iter().next() else {
                break;
            };
            if let Some(s) = self.steps.remove(&id) {
                self.finish_step(id, s);
            }
        }
        let due = all
            || self.last_flush.elapsed() >= Duration::from_millis(super::writer::FLUSH_EVERY_MS)
            || self
                .file
                .as_ref()
                .is_some_and(|f| f.pending_bytes() >= super::writer::FLUSH_BYTES);
        if due {
            self.last_flush = Instant::now();
            if let Some(f) = self.file.as_mut()
                && let Err(e) = f.flush()
            {
                let msg = format!("{}: {e}", f.path().display());
                tracing::warn!("trace stopped: {msg}");
                self.error = Some(msg);
                self.file = None;
                set_on(self.collecting());
            }
        }
        if self.dirty && self.last_publish.elapsed() >= PUBLISH_EVERY {
            if let Some(sink) = &self.sink {
                sink(self.snapshot());
            }
            self.last_publish = Instant::now();
            self.dirty = false;
        }
    }

    fn track_info(&mut self, id: TrackId) -> Option<&TrackInfo> {
        if !self.tracks.contains_key(&id) {
            for t in registered_tracks() {
                self.tracks.insert(t.id, t);
            }
        }
        self.tracks.get(&id)
    }

    fn name_of(&mut self, track: TrackId, name: Name) -> String {
        match name {
            Name::Static(s) => s.to_string(),
            Name::Label(l) => self
                .track_info(track)
                .and_then(|t| t.labels.as_ref())
                .and_then(|s| s.label(l).map(str::to_string))
                .unwrap_or_else(|| format!("label {}", l.0)),
        }
    }

    fn name_track(&mut self, id: TrackId) {
        if self.file.as_ref().is_none_or(|f| f.is_named(id)) {
            return;
        }
        let name = fixed_track_name(id)
            .or_else(|| self.track_info(id).map(|t| t.name.clone()))
            .unwrap_or_else(|| format!("track {}", id.0));
        if let Some(f) = self.file.as_mut() {
            f.name_track(id, &name);
        }
    }

    /// A pool thread's job or a host slice: written as it comes.
    fn write_plain(&mut self, ev: &Ev) {
        if self.file.is_none() {
            return;
        }
        let (cat, name, args) = match ev.cat {
            Cat::Job => {
                // Named by the CPU stream's label it works for.
                let name = self.name_of(TrackId(ev.b as u16), ev.name);
                (
                    "cpu job",
                    name.clone(),
                    op_args(&name).u("step", ev.step as u64),
                )
            }
            _ => (
                "host",
                self.name_of(ev.track, ev.name),
                Args::default().u("step", ev.step as u64),
            ),
        };
        self.name_track(ev.track);
        if let Some(f) = self.file.as_mut() {
            f.complete(ev.track, cat, &name, ev.start_ns, ev.dur_ns, &args);
        }
    }

    fn finish_step(&mut self, id: u32, s: PendingStep) {
        // Each (layer, op)'s bytes, shared among its kernels by their time.
        let names: Vec<String> = s
            .ops
            .iter()
            .map(|e| self.name_of(e.track, e.name))
            .collect();
        let mut group_ns: HashMap<(Option<u32>, &str), u64> = HashMap::new();
        for (e, n) in s.ops.iter().zip(&names) {
            let p = parse_label(n);
            *group_ns.entry((p.layer, p.op)).or_default() += e.dur_ns;
        }
        let mut ops_ns = 0u64;
        for (e, n) in s.ops.iter().zip(&names) {
            ops_ns += e.dur_ns;
            let nodes = match e.cat {
                Cat::Op(OpKind::Graph) => self
                    .track_info(e.track)
                    .and_then(|t| t.labels.clone())
                    .map(|st| st.graph_node_labels((e.b >> 32) as usize)),
                _ => None,
            };
            if self.profile {
                self.profiler.op(id, n, e.dur_ns, nodes.as_deref());
                self.dirty = true;
            }
            if self.file.is_none() {
                continue;
            }
            let p = parse_label(n);
            let mut args = op_args(n).u("seq", e.a).u("step", id as u64);
            if e.cat == Cat::Op(OpKind::Kernel)
                && let Some(d) = super::stamps::stamped_dispatch(e.b)
            {
                args = args
                    .s("timed by", "kernel stamps")
                    .f("dispatch µs", d as f64 / 1e3);
            }
            let cost = match &nodes {
                Some(nodes) => {
                    args = args.u("kernels", nodes.len() as u64).s(
                        "note",
                        "a replayed graph hides its kernels' times; run with --no-graphs for each",
                    );
                    let mut seen = std::collections::HashSet::new();
                    let mut sum = Some((0u64, 0u64));
                    for node in nodes {
                        let q = parse_label(node);
                        if !seen.insert((q.layer, q.op)) {
                            continue;
                        }
                        sum = sum.zip(self.costs.get(q.layer, q.op)).map(|((r, w), c)| {
                            let (cr, cw) = c.bytes(s.pos0, s.tokens);
                            (r + cr, w + cw)
                        });
                    }
                    sum.map(|b| (b, e.dur_ns))
                }
                None => self.costs.get(p.layer, p.op).map(|c| {
                    let total = group_ns.get(&(p.layer, p.op)).copied().unwrap_or(e.dur_ns);
                    let (r, w) = c.bytes(s.pos0, s.tokens);
                    let share = if total > 0 {
                        e.dur_ns as f64 / total as f64
                    } else {
                        1.0
                    };
                    (
                        ((r as f64 * share) as u64, (w as f64 * share) as u64),
                        e.dur_ns,
                    )
                }),
            };
            if let Some(((r, w), ns)) = cost {
                args = with_bytes(args, r, w, ns);
            } else if let Cat::Op(k) = e.cat
                && is_copy(k)
                && e.b > 0
            {
                args = with_bytes(args, e.b, 0, e.dur_ns);
            }
            let cat = match e.cat {
                Cat::Op(k) => k.name(),
                _ => "op",
            };
            self.name_track(e.track);
            if let Some(f) = self.file.as_mut() {
                f.complete(e.track, cat, n, e.start_ns, e.dur_ns, &args);
            }
        }
        if let Some((end, _)) = s.end {
            if self.profile {
                self.profiler.step_end(id, s.pos0, s.tokens, end.dur_ns);
                self.dirty = true;
            }
            if self.file.is_some() {
                let name = self.name_of(end.track, end.name);
                let args = Args::default()
                    .u("step", id as u64)
                    .u("pos", s.pos0)
                    .u("tokens", s.tokens)
                    .f("ops µs", ops_ns as f64 / 1e3)
                    .f(
                        "host/launch µs",
                        end.dur_ns.saturating_sub(ops_ns) as f64 / 1e3,
                    );
                self.name_track(end.track);
                if let Some(f) = self.file.as_mut() {
                    f.complete(end.track, "step", &name, end.start_ns, end.dur_ns, &args);
                }
            }
        }
    }
}

fn is_copy(k: OpKind) -> bool {
    matches!(k, OpKind::CopyH2D | OpKind::CopyD2H | OpKind::CopyD2D)
}

fn op_args(label: &str) -> Args {
    let p = parse_label(label);
    let mut a = Args::default();
    if let Some(l) = p.layer {
        a = a.u("layer", l as u64);
    }
    a = a.s("op", p.op);
    if !p.kernel.is_empty() {
        a = a.s("kernel", p.kernel);
    }
    a
}

fn with_bytes(args: Args, read: u64, written: u64, ns: u64) -> Args {
    let a = args.u("bytes_read", read).u("bytes_written", written);
    if ns > 0 {
        a.f("GB/s", (read + written) as f64 / ns as f64)
    } else {
        a
    }
}
