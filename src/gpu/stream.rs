//! (Over 700 lines on purpose: the in-flight table, its labels and the completion tracking share
//! one lock-free state and are read together by the watchdog; the polling wait, the graph's
//! breadcrumb encoding and the kernel stamps' layout are already apart in `stream/`, the tests
//! in `stream/tests.rs`.)
//!
//! The tracked stream: every op enqueued on the device's one stream gets a sequence number and a
//! label in a lock-free in-flight table, completion is observed through pre-created events (event
//! queries only) and kernel breadcrumbs, and queue depth is `enqueued − completed`.
//!
//! [`StreamShared`] is what other threads see (the watchdog, the UI's snapshots, the event prober):
//! atomics only, no lock shared with the worker, so a worker stuck inside a runtime call cannot
//! stall them. [`TrackedStream`] is the worker's side.
//!
//! Over 700 lines on purpose: the in-flight table, the event pool and the enqueue/poll paths share
//! one set of ordering rules (what a reader may see between a slot's claim and its completion);
//! split across files, those rules would be argued in two places. Host-op tracking (`host`) and
//! the tests live beside it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::gpu::device::{Device, DevicePtr, GpuError, RawEvent};
use crate::gpu::snapshot::StreamSnapshot;

/// Slots in the in-flight table; the worker never lets more ops than this be in flight.
pub const RING: usize = 4096;
/// Distinct labels a stream can intern.
pub const MAX_LABELS: usize = 16384;
/// Events in the pool (created once, at open).
pub const EVENT_POOL: usize = 64;

/// An interned op label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LabelId(pub u32);

impl LabelId {
    /// Label 0: what an op is called when the table is full.
    pub const OVERFLOW: LabelId = LabelId(0);
}

/// What an op is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum OpKind {
    Kernel = 1,
    CopyH2D = 2,
    CopyD2H = 3,
    CopyD2D = 4,
    Blas = 5,
    /// Run by the host thread that issued it (the CPU backend): running as soon as it is in
    /// flight, finished when the call returns.
    Host = 6,
    /// One replay of a captured graph (`stream/graph.rs`): its kernels write breadcrumbs that
    /// name the kernel inside it.
    Graph = 7,
}

impl OpKind {
    fn from_u8(v: u8) -> Option<OpKind> {
        Some(match v {
            1 => OpKind::Kernel,
            2 => OpKind::CopyH2D,
            3 => OpKind::CopyD2H,
            4 => OpKind::CopyD2D,
            5 => OpKind::Blas,
            6 => OpKind::Host,
            7 => OpKind::Graph,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Kernel => "kernel",
            OpKind::CopyH2D => "copy h2d",
            OpKind::CopyD2H => "copy d2h",
            OpKind::CopyD2D => "copy d2d",
            OpKind::Blas => "blas",
            OpKind::Host => "cpu",
            OpKind::Graph => "graph",
        }
    }

    /// Kernels write breadcrumbs; copies and vendor BLAS calls are only seen through events.
    pub fn writes_breadcrumb(self) -> bool {
        matches!(self, OpKind::Kernel | OpKind::Graph)
    }
}

/// How long an op may take before the watchdog calls it SLOW, then HUNG.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub slow: Duration,
    pub hung: Duration,
}

impl Budget {
    /// Generous: a prompt-processing GEMM on a slow iGPU can take a second.
    pub const DEFAULT: Budget = Budget {
        slow: Duration::from_secs(2),
        hung: Duration::from_secs(15),
    };
}

struct OpSlot {
    /// The op's sequence number; `u64::MAX` while being written (a seqlock).
    seq: AtomicU64,
    label: AtomicU32,
    kind: AtomicU8,
    enqueued_ns: AtomicU64,
    slow_ms: AtomicU32,
    hung_ms: AtomicU32,
}

/// One op as read from the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpRecord {
    pub seq: u64,
    pub label: String,
    pub kind: OpKind,
    /// Nanoseconds since the stream's epoch.
    pub enqueued_ns: u64,
    pub budget: Budget,
}

/// An event of the pool as other threads see it.
pub struct EventSlot {
    pub handle: AtomicU64,
    /// The last op seq the event's latest record covers; 0 idle, `u64::MAX` while re-recording.
    pub covers: AtomicU64,
}

/// Append-only interned labels, readable without a lock.
struct LabelTable {
    slots: Box<[OnceLock<Box<str>>]>,
    len: AtomicU32,
}

/// The lock-free shared view of one stream.
pub struct StreamShared {
    pub name: String,
    epoch: Instant,
    /// The coarse clock's reading at `epoch` (see `coarse_ns`).
    epoch_coarse_ns: u64,
    enqueued: AtomicU64,
    completed: AtomicU64,
    completed_at_ns: AtomicU64,
    ops: Box<[OpSlot]>,
    labels: LabelTable,
    pub(crate) events: Box<[EventSlot]>,
    /// Host address of the breadcrumb word (pinned, device-mapped); null when none.
    crumb: AtomicPtr<AtomicU64>,
    crumb_readers: AtomicUsize,
    tracking: AtomicBool,
    /// Set by the event prober around each query: when it started (ns since epoch), 0 if idle.
    pub(crate) probe_busy_since_ns: AtomicU64,
    pub(crate) probe_error: OnceLock<String>,
    poisoned: OnceLock<String>,
    graph_nodes: GraphNodes,
}

impl StreamShared {
    pub fn new(name: impl Into<String>) -> StreamShared {
        StreamShared {
            name: name.into(),
            epoch: Instant::now(),
            epoch_coarse_ns: coarse_clock_ns(),
            enqueued: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            completed_at_ns: AtomicU64::new(0),
            ops: (0..RING)
                .map(|_| OpSlot {
                    seq: AtomicU64::new(0),
                    label: AtomicU32::new(0),
                    kind: AtomicU8::new(0),
                    enqueued_ns: AtomicU64::new(0),
                    slow_ms: AtomicU32::new(0),
                    hung_ms: AtomicU32::new(0),
                })
                .collect(),
            labels: LabelTable {
                slots: (0..MAX_LABELS).map(|_| OnceLock::new()).collect(),
                len: AtomicU32::new(0),
            },
            events: (0..EVENT_POOL)
                .map(|_| EventSlot {
                    handle: AtomicU64::new(0),
                    covers: AtomicU64::new(0),
                })
                .collect(),
            crumb: AtomicPtr::new(std::ptr::null_mut()),
            crumb_readers: AtomicUsize::new(0),
            tracking: AtomicBool::new(true),
            probe_busy_since_ns: AtomicU64::new(0),
            probe_error: OnceLock::new(),
            poisoned: OnceLock::new(),
            graph_nodes: GraphNodes::new(),
        }
    }

    /// Nanoseconds since this stream's epoch.
    pub fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Nanoseconds since the epoch on the coarse clock: a few ns to read instead of ~20, which
    /// matters once per op on a launch-bound stream; it lags `now_ns` by at most one tick
    /// (about 4 ms), far below any op budget.
    pub fn coarse_ns(&self) -> u64 {
        coarse_clock_ns().saturating_sub(self.epoch_coarse_ns)
    }

    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    pub fn enqueued(&self) -> u64 {
        self.enqueued.load(Ordering::Acquire)
    }

    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Acquire)
    }

    pub fn completed_at_ns(&self) -> u64 {
        self.completed_at_ns.load(Ordering::Acquire)
    }

    pub fn tracking(&self) -> bool {
        self.tracking.load(Ordering::Relaxed)
    }

    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.get().map(|s| s.as_str())
    }

    pub(crate) fn poison(&self, reason: String) {
        let _ = self.poisoned.set(reason);
    }

    /// Records that every op up to `seq` has finished (from an event or a breadcrumb).
    pub fn advance_completed(&self, seq: u64) {
        let seq = seq.min(self.enqueued());
        let prev = self.completed.fetch_max(seq, Ordering::AcqRel);
        if seq > prev {
            self.completed_at_ns.store(self.now_ns(), Ordering::Release);
        }
    }

    /// The breadcrumb: the seq of the last kernel that has started, 0 if none or no crumb.
    /// Reads through a reader count so teardown can free the pinned word safely.
    pub fn read_breadcrumb(&self) -> u64 {
        self.crumb_readers.fetch_add(1, Ordering::AcqRel);
        let p = self.crumb.load(Ordering::Acquire);
        let v = if p.is_null() {
            0
        } else {
            // SAFETY: non-null only while the pinned word lives; `detach_breadcrumb` waits for
            // readers to leave before the memory is freed.
            unsafe { (*p).load(Ordering::Acquire) }
        };
        self.crumb_readers.fetch_sub(1, Ordering::AcqRel);
        v
    }

    /// Folds the breadcrumb into `completed`: kernel K started proves K−1 finished. Returns the
    /// seq of the op that has started (a replayed graph's own seq when one of its kernels wrote
    /// the breadcrumb).
    pub fn fold_breadcrumb(&self) -> u64 {
        let raw = self.read_breadcrumb();
        let c = GraphCrumb::decode(raw).map_or(raw, |g| g.seq);
        if c > 0 {
            self.advance_completed(c - 1);
        }
        c
    }

    /// # Safety
    /// `p` points at a live, 8-byte aligned pinned word that stays valid until
    /// `detach_breadcrumb` returns.
    pub(crate) unsafe fn attach_breadcrumb(&self, p: *mut u64) {
        self.crumb.store(p as *mut AtomicU64, Ordering::Release);
    }

    /// Stops readers from using the breadcrumb word; afterwards it may be freed.
    pub(crate) fn detach_breadcrumb(&self) {
        self.crumb.store(std::ptr::null_mut(), Ordering::Release);
        // Readers only do one memory load while counted: this wait is a few nanoseconds.
        while self.crumb_readers.load(Ordering::Acquire) != 0 {
            std::hint::spin_loop();
        }
    }

    /// Publishes the node labels of the graph in `slot` (before its first replay).
    pub(crate) fn set_graph_nodes(&self, slot: usize, nodes: &[LabelId]) {
        self.graph_nodes.set(slot, nodes);
    }

    /// For a graph op in flight: the kernel inside it that has started, from the breadcrumb, as
    /// `(node, of, label)`; `None` when the breadcrumb is not this replay's.
    pub fn graph_kernel(&self, op: &OpRecord) -> Option<(usize, usize, String)> {
        if op.kind != OpKind::Graph {
            return None;
        }
        let g = GraphCrumb::decode(self.read_breadcrumb()).filter(|g| g.seq == op.seq)?;
        let label = self.graph_nodes.get(g.slot, g.node)?;
        Some((
            g.node,
            self.graph_nodes.len(g.slot),
            self.label(label).unwrap_or("(unlabelled)").to_string(),
        ))
    }

    /// Kernels in the graph of `slot`.
    pub fn graph_node_count(&self, slot: usize) -> usize {
        self.graph_nodes.len(slot)
    }

    /// The labels of the kernels of the graph in `slot`, in capture order (the tracer names a
    /// replay's kernels with them).
    pub fn graph_node_labels(&self, slot: usize) -> Vec<String> {
        (0..self.graph_nodes.len(slot))
            .filter_map(|i| self.graph_nodes.get(slot, i))
            .map(|l| self.label(l).unwrap_or("(unlabelled)").to_string())
            .collect()
    }

    /// The op's label, with the kernel running inside it when it is a replayed graph
    /// (`decode step graph › kernel 41/302 · layer 4 · attention`).
    pub fn op_label_now(&self, op: &OpRecord) -> String {
        match self.graph_kernel(op) {
            Some((node, of, label)) => {
                format!("{} › kernel {}/{of} · {label}", op.label, node + 1)
            }
            None => op.label.clone(),
        }
    }

    pub fn label(&self, id: LabelId) -> Option<&str> {
        self.labels
            .slots
            .get(id.0 as usize)
            .and_then(|s| s.get())
            .map(|s| &**s)
    }

    /// The op with this seq, if it is still in the table (and was tracked).
    pub fn op(&self, seq: u64) -> Option<OpRecord> {
        if seq == 0 {
            return None;
        }
        let slot = &self.ops[(seq % RING as u64) as usize];
        for _ in 0..4 {
            let s1 = slot.seq.load(Ordering::Acquire);
            if s1 != seq {
                if s1 == u64::MAX {
                    std::hint::spin_loop();
                    continue;
                }
                return None;
            }
            let label = slot.label.load(Ordering::Relaxed);
            let kind = slot.kind.load(Ordering::Relaxed);
            let enq = slot.enqueued_ns.load(Ordering::Relaxed);
            let slow = slot.slow_ms.load(Ordering::Relaxed);
            let hung = slot.hung_ms.load(Ordering::Relaxed);
            std::sync::atomic::fence(Ordering::Acquire);
            if slot.seq.load(Ordering::Relaxed) != s1 {
                continue;
            }
            return Some(OpRecord {
                seq,
                label: self
                    .label(LabelId(label))
                    .unwrap_or("(unlabelled)")
                    .to_string(),
                kind: OpKind::from_u8(kind)?,
                enqueued_ns: enq,
                budget: Budget {
                    slow: Duration::from_millis(slow as u64),
                    hung: Duration::from_millis(hung as u64),
                },
            });
        }
        None
    }

    fn write_op(&self, seq: u64, label: LabelId, kind: OpKind, budget: Budget) {
        let slot = &self.ops[(seq % RING as u64) as usize];
        slot.seq.store(u64::MAX, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        slot.label.store(label.0, Ordering::Relaxed);
        slot.kind.store(kind as u8, Ordering::Relaxed);
        slot.enqueued_ns.store(self.coarse_ns(), Ordering::Relaxed);
        slot.slow_ms.store(
            budget.slow.as_millis().min(u32::MAX as u128) as u32,
            Ordering::Relaxed,
        );
        slot.hung_ms.store(
            budget.hung.as_millis().min(u32::MAX as u128) as u32,
            Ordering::Relaxed,
        );
        slot.seq.store(seq, Ordering::Release);
    }

    /// Ops enqueued and not yet known complete.
    pub fn queue_depth(&self) -> u64 {
        self.enqueued().saturating_sub(self.completed())
    }

    /// The last `n` completed ops still in the table, oldest first.
    pub fn recent_completed(&self, n: usize) -> Vec<OpRecord> {
        let c = self.completed();
        let from = c.saturating_sub(n as u64) + 1;
        (from..=c).filter_map(|s| self.op(s)).collect()
    }

    /// Ops in flight, oldest first (at most `n`).
    pub fn in_flight(&self, n: usize) -> Vec<OpRecord> {
        let c = self.completed();
        let e = self.enqueued();
        (c + 1..=e).take(n).filter_map(|s| self.op(s)).collect()
    }

    /// A plain-data snapshot for the UI.
    pub fn snapshot(&self) -> StreamSnapshot {
        self.fold_breadcrumb();
        let enq = self.enqueued();
        let comp = self.completed();
        let now = self.now_ns();
        let head = (enq > comp).then(|| self.op(comp + 1)).flatten();
        StreamSnapshot {
            name: self.name.clone(),
            queue_depth: enq.saturating_sub(comp).min(u32::MAX as u64) as u32,
            enqueued: enq,
            completed: comp,
            in_flight: head.map(|h| {
                (
                    self.op_label_now(&h),
                    Duration::from_nanos(now.saturating_sub(h.enqueued_ns)),
                )
            }),
            last_completed: self.op(comp).map(|o| o.label),
        }
    }
}

/// CLOCK_MONOTONIC_COARSE (the same clock as `Instant`, read from the vDSO without the TSC).
#[cfg(target_os = "linux")]
fn coarse_clock_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(not(target_os = "linux"))]
fn coarse_clock_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// The worker's side of the stream: seq numbers, labels, the event pool.
pub struct TrackedStream {
    shared: Arc<StreamShared>,
    label_ids: HashMap<String, LabelId>,
    next_seq: u64,
    /// Recorded events not yet seen complete: (pool index, covered seq), oldest first.
    pending: VecDeque<(usize, u64)>,
    free_events: Vec<usize>,
    /// Seq covered by the newest recorded event.
    last_event_covers: u64,
    ops_since_event: u32,
    /// With tracking on, an event is recorded at least every this many ops.
    pub auto_event_interval: u32,
    pub default_budget: Budget,
    crumb_device: DevicePtr,
    breadcrumbs: bool,
}

impl TrackedStream {
    /// Creates the stream's view and its event pool on `backend`.
    pub fn new(name: &str, backend: &mut dyn Device) -> Result<TrackedStream, GpuError> {
        let shared = Arc::new(StreamShared::new(name));
        let _ = shared.labels.slots[0].set("(label table full)".into());
        shared.labels.len.store(1, Ordering::Release);
        let mut created = Vec::with_capacity(EVENT_POOL);
        for i in 0..EVENT_POOL {
            match backend.create_event() {
                Ok(e) => {
                    shared.events[i].handle.store(e.0, Ordering::Release);
                    created.push(e);
                }
                Err(err) => {
                    for e in created {
                        // SAFETY: created above, never recorded.
                        let _ = unsafe { backend.destroy_event(e) };
                    }
                    return Err(err);
                }
            }
        }
        Ok(TrackedStream {
            shared,
            label_ids: HashMap::new(),
            next_seq: 1,
            pending: VecDeque::new(),
            free_events: (0..EVENT_POOL).rev().collect(),
            last_event_covers: 0,
            ops_since_event: 0,
            auto_event_interval: 64,
            default_budget: Budget::DEFAULT,
            crumb_device: DevicePtr::NULL,
            breadcrumbs: true,
        })
    }

    pub fn shared(&self) -> &Arc<StreamShared> {
        &self.shared
    }

    pub fn set_breadcrumb(&mut self, device: DevicePtr) {
        self.crumb_device = device;
    }

    /// The breadcrumb address kernels get: null with tracking off.
    pub fn crumb_arg(&self) -> DevicePtr {
        if self.shared.tracking() && self.breadcrumbs {
            self.crumb_device
        } else {
            DevicePtr::NULL
        }
    }

    pub fn set_breadcrumbs(&mut self, on: bool) {
        self.breadcrumbs = on;
    }

    pub fn set_tracking(&mut self, on: bool) {
        self.shared.tracking.store(on, Ordering::Relaxed);
    }

    /// Interns a label (once per distinct text).
    pub fn label(&mut self, text: &str) -> LabelId {
        if let Some(id) = self.label_ids.get(text) {
            return *id;
        }
        let n = self.shared.labels.len.load(Ordering::Relaxed) as usize;
        if n >= MAX_LABELS {
            return LabelId::OVERFLOW;
        }
        let _ = self.shared.labels.slots[n].set(text.into());
        self.shared
            .labels
            .len
            .store(n as u32 + 1, Ordering::Release);
        let id = LabelId(n as u32);
        self.label_ids.insert(text.to_string(), id);
        id
    }

    /// The seq the next op will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Seq of the last op enqueued (0 if none).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Whether the table has room for another op (the caller waits for completions if not).
    pub fn has_room(&self) -> bool {
        !self.shared.tracking()
            || self.last_seq().saturating_sub(self.shared.completed()) < (RING as u64 - 64)
    }

    /// Claims the next seq and, with tracking on, writes the op into the table. Call before the
    /// runtime call that enqueues it; `enqueued` is published by `commit`.
    pub fn begin(&mut self, kind: OpKind, label: LabelId, budget: Option<Budget>) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.shared.tracking() {
            self.shared
                .write_op(seq, label, kind, budget.unwrap_or(self.default_budget));
        }
        seq
    }

    /// Publishes that `seq` is enqueued.
    pub fn commit(&mut self, seq: u64) {
        self.shared.enqueued.store(seq, Ordering::Release);
        self.ops_since_event += 1;
    }

    /// Whether an event should be recorded now to bound what breadcrumbs cannot show.
    pub fn wants_event(&self) -> bool {
        self.shared.tracking() && self.ops_since_event >= self.auto_event_interval
    }

    /// Seq covered by the newest recorded event.
    pub fn last_event_covers(&self) -> u64 {
        self.last_event_covers
    }

    /// Records a pool event after the last enqueued op. When the pool is exhausted, waits (up to
    /// `deadline`) for the oldest recorded event.
    pub fn record_event(
        &mut self,
        backend: &mut dyn Device,
        deadline: Instant,
    ) -> Result<(), GpuError> {
        let covers = self.last_seq();
        if covers == 0 || covers == self.last_event_covers {
            return Ok(());
        }
        if self.free_events.is_empty() {
            self.poll(backend)?;
        }
        let mut backoff = Backoff::new();
        while self.free_events.is_empty() {
            if Instant::now() > deadline {
                return Err(GpuError::Timeout {
                    what: format!(
                        "waiting for a free event on {} (oldest covers op {})",
                        self.shared.name,
                        self.pending.front().map(|p| p.1).unwrap_or(0)
                    ),
                    waited: backoff.waited(),
                });
            }
            backoff.wait();
            self.poll(backend)?;
        }
        let Some(idx) = self.free_events.pop() else {
            return Ok(());
        };
        let slot = &self.shared.events[idx];
        let handle = RawEvent(slot.handle.load(Ordering::Acquire));
        // The prober must not take an old completion for this new record (see EventSlot).
        slot.covers.store(u64::MAX, Ordering::Release);
        // SAFETY: the handle was created by this backend in `new`.
        let r = unsafe { backend.record_event(handle) };
        if let Err(e) = r {
            slot.covers.store(0, Ordering::Release);
            self.free_events.push(idx);
            return Err(e);
        }
        slot.covers.store(covers, Ordering::Release);
        self.pending.push_back((idx, covers));
        self.last_event_covers = covers;
        self.ops_since_event = 0;
        Ok(())
    }

    /// Queries recorded events, oldest first, and folds the breadcrumb; returns `completed`.
    /// Never blocks on the stream.
    pub fn poll(&mut self, backend: &mut dyn Device) -> Result<u64, GpuError> {
        self.shared.fold_breadcrumb();
        while let Some(&(idx, covers)) = self.pending.front() {
            let done = covers <= self.shared.completed() || {
                let h = RawEvent(self.shared.events[idx].handle.load(Ordering::Acquire));
                backend.query_event(h)?
            };
            if !done {
                break;
            }
            self.shared.advance_completed(covers);
            self.shared.events[idx].covers.store(0, Ordering::Release);
            self.pending.pop_front();
            self.free_events.push(idx);
        }
        Ok(self.shared.completed())
    }

    /// Waits, polling with backoff, until every op up to `seq` has finished or `deadline`
    /// passes. Records an event covering `seq` first if none does.
    pub fn wait_for(
        &mut self,
        backend: &mut dyn Device,
        seq: u64,
        deadline: Instant,
    ) -> Result<(), GpuError> {
        if seq == 0 || self.poll(backend)? >= seq {
            return Ok(());
        }
        if self.last_event_covers < seq {
            self.record_event(backend, deadline)?;
        }
        let mut backoff = Backoff::new();
        loop {
            if self.poll(backend)? >= seq {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let head = self.shared.completed() + 1;
                let label = self
                    .shared
                    .op(head)
                    .map(|o| o.label)
                    .unwrap_or_else(|| format!("op {head}"));
                return Err(GpuError::Timeout {
                    what: format!(
                        "{} (waiting for op {seq}; oldest unfinished: {label})",
                        self.shared.name
                    ),
                    waited: backoff.waited(),
                });
            }
            backoff.wait();
        }
    }

    /// The pool's handles, for teardown.
    pub fn event_handles(&self) -> Vec<RawEvent> {
        self.shared
            .events
            .iter()
            .map(|s| RawEvent(s.handle.load(Ordering::Acquire)))
            .filter(|e| e.0 != 0)
            .collect()
    }

    /// Forgets the pool after its events were destroyed.
    pub fn clear_events(&mut self) {
        for s in self.shared.events.iter() {
            s.handle.store(0, Ordering::Release);
            s.covers.store(0, Ordering::Release);
        }
        self.pending.clear();
        self.free_events.clear();
    }
}

mod backoff;
pub mod graph;
mod host;
pub mod stamp;
pub use backoff::Backoff;
use graph::{GraphCrumb, GraphNodes};
pub use host::HostOp;
#[cfg(test)]
mod tests;
