//! [`Gpu`]: the handle of one opened device — its tracked stream, arena, staging buffers, loaded
//! kernels and GEMM path — owned by the inference worker. Every op is labelled and tracked; no
//! call waits without a deadline; after a runtime error the device is poisoned and no further GPU
//! call is made. This file holds the type, the plain types it hands out (`KernelFn`, `Arg`,
//! `GemmPath`, `HostWord`, `SpinOnFlag`, `TeardownOutcome`), opening it and the tracked enqueue
//! every op goes through; the other files of the folder each add one concern to it (and import
//! only from this file):
//! `launch.rs` (kernels, GEMM, fills and copies), `memory.rs` (arena and host words),
//! `transfer.rs` (staged uploads and downloads, verified uploads), `teardown.rs` (the device half
//! of the quit protocol and the event prober), `stamps.rs` (the tracer's kernel stamps and clock
//! calibration).

mod graph;
mod launch;
mod memory;
mod registered;
mod stamps;
mod teardown;
mod transfer;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::gpu::arena::{Arena, DeviceBuffer};
use crate::gpu::device::{
    Device, DeviceInfo, DevicePtr, GpuError, MemInfo, PinnedRaw, RawBlas, RawFunction, RawModule,
    RuntimeKind,
};
pub use crate::gpu::snapshot::ReadBandwidth;
use crate::gpu::snapshot::{ArenaSnapshot, DeviceRelease, DeviceSummary, QuitStep, StreamSnapshot};
use crate::gpu::stream::{Backoff, Budget, LabelId, OpKind, RING, StreamShared, TrackedStream};
use crate::gpu::trace::{
    self,
    device::{DeviceTimer, TraceEvents},
};
pub use graph::{GraphMode, GraphStats};
pub use transfer::{READ_PROBE_BYTES, READ_PROBE_RUNS};

/// Settings of an opened device.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuConfig {
    /// Labels, in-flight table, breadcrumbs and periodic events (on by default; off only to
    /// measure what they cost).
    pub tracking: bool,
    /// Kernels write breadcrumbs (with tracking on). Off only to measure what they cost.
    pub breadcrumbs: bool,
    /// Checksum every uploaded tensor on the device against the host (on by default).
    pub verify_uploads: bool,
    /// Pinned staging buffers and their size (8 of 8 MiB: an upload fills half of them, split
    /// over threads, while the other half's chunks cross to the device).
    pub staging_buffers: usize,
    pub staging_bytes: usize,
    pub default_budget: Budget,
    /// Device memory left free beyond the arena for the runtime itself.
    pub runtime_reserve: u64,
    /// BLAS workspace carved from the arena's workspace region.
    pub blas_workspace: u64,
    /// Longest wait for a staging buffer, a download or a free event.
    pub wait_timeout: Duration,
    /// How the tracer times each op while tracing is on (kernel stamps, timed events).
    pub trace_events: TraceEvents,
    /// Launch overlap where the runtime has it ([`Device::set_launch_overlap`]; on unless
    /// `HIPSCOPE_PDL=0`).
    pub launch_overlap: bool,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            tracking: true,
            breadcrumbs: true,
            verify_uploads: true,
            staging_buffers: 8,
            staging_bytes: 8 << 20,
            default_budget: Budget::DEFAULT,
            runtime_reserve: 256 << 20,
            blas_workspace: 32 << 20,
            wait_timeout: Duration::from_secs(30),
            trace_events: TraceEvents::Stamps,
            launch_overlap: true,
        }
    }
}

/// A loaded kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelFn(u32);

/// One kernel argument (after the two tracking parameters every kernel takes first).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    Ptr(DevicePtr),
    U32(u32),
    I32(i32),
    U64(u64),
    F32(f32),
}

impl From<DeviceBuffer> for Arg {
    fn from(b: DeviceBuffer) -> Arg {
        Arg::Ptr(b.ptr)
    }
}

impl From<DevicePtr> for Arg {
    fn from(p: DevicePtr) -> Arg {
        Arg::Ptr(p)
    }
}

/// How GEMMs run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GemmPath {
    /// rocBLAS / cuBLAS, bound to our stream, device pointer mode, workspace from the arena.
    Blas { library: String },
    /// hipscope's own `hs_sgemm` kernel, and why.
    Fallback { reason: String },
    /// Not set up yet (no arena).
    NotReady,
}

/// A 32-bit word of pinned host memory mapped into the device (a flag a kernel polls).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostWord(usize);

/// A launched [`Gpu::launch_spin_on_flag`].
#[derive(Clone, Copy, Debug)]
pub struct SpinOnFlag {
    /// Setting it to non-zero releases the kernel.
    pub flag: HostWord,
    /// Where the kernel writes its u32 result.
    pub result: DeviceBuffer,
    pub label: LabelId,
}

/// The thread that queries the event pool for the watchdog, off the worker and off the watchdog
/// itself (a query can block inside a wedged runtime).
struct Prober {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

/// How the device half of the quit protocol ended.
#[derive(Clone, Debug, PartialEq)]
pub struct TeardownOutcome {
    /// Every step ran and succeeded: returning from `main` is safe.
    pub clean: bool,
    /// Why not, when not clean (the app then leaves with `_exit`).
    pub reason: Option<String>,
    pub steps: Vec<QuitStep>,
}

impl TeardownOutcome {
    /// What the worker reports in `Event::Exited`.
    pub fn release(&self) -> DeviceRelease {
        if self.clean {
            DeviceRelease::Clean
        } else {
            DeviceRelease::Abandoned
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Alive,
    Poisoned(String),
    TornDown,
}

struct StagingBuf {
    mem: PinnedRaw,
    /// Last op that reads or writes this buffer.
    last_seq: u64,
}

/// One opened device, owned by the worker thread.
pub struct Gpu {
    /// Launch overlap as the device took it: `on`, or `off (why)`.
    launch_overlap: String,
    backend: Box<dyn Device>,
    stream: TrackedStream,
    cfg: GpuConfig,
    arena: Option<Arena>,
    modules: Vec<(String, RawModule)>,
    functions: Vec<(String, RawFunction)>,
    /// Per function: from the stamped build of its unit (kernels/prelude.h, `HS_STAMPS`).
    stamped_fns: Vec<bool>,
    /// Whether any is.
    any_stamped: bool,
    by_name: HashMap<String, KernelFn>,
    blas: Option<RawBlas>,
    gemm_path: GemmPath,
    staging: Vec<StagingBuf>,
    staging_next: usize,
    crumb: Option<PinnedRaw>,
    /// Host words mapped into the device (flags the host sets for a kernel to see).
    host_words: Vec<PinnedRaw>,
    /// Device constants 0.0 and 1.0 (scalars for device pointer mode).
    scalars: Option<DeviceBuffer>,
    verify_scratch: Option<DeviceBuffer>,
    prober: Option<Prober>,
    state: State,
    mem_at_open: Option<MemInfo>,
    graphs: graph::Graphs,
    /// The tracer's timed events, made the first time tracing is on (`gpu/trace/device.rs`).
    timer: Option<DeviceTimer>,
    /// Why the timed events could not be made (tracing then shows no device ops).
    timer_failed: Option<String>,
    /// The kernels' stamp block (device memory, in the arena's workspace), whether the host ring
    /// is made, the calibration probe's host word, and why this device's kernels are timed by events
    /// instead (`stamps.rs`).
    stamp_block: Option<DeviceBuffer>,
    stamp_ring: bool,
    stamp_probe: Option<HostWord>,
    stamp_failed: Option<String>,
    /// Set while `stamps.rs` enqueues its own ops.
    stamp_busy: bool,
    /// Recorded after each crossing this device sends peer to peer (`send_to_peer`), for the
    /// receiving stream to wait on; made at the first.
    peer_event: Option<crate::gpu::device::RawEvent>,
    /// Peers whose memory this device may read directly (`enable_peer` said yes), by peer id;
    /// and those it may not.
    peers: std::collections::HashMap<u64, bool>,
    /// Host memory registered for in-place uploads (`registered.rs`).
    registered: Vec<registered::Registered>,
}

/// Partials the checksum kernel writes: one (sum, nonzero) pair per block.
pub(crate) const CHECKSUM_BLOCKS: u32 = 256;

impl Gpu {
    /// Sets up the tracked stream (event pool, breadcrumb word) and the staging buffers.
    pub fn open(mut backend: Box<dyn Device>, cfg: GpuConfig) -> Result<Gpu, GpuError> {
        let mem_at_open = backend.mem_info().ok();
        let name = format!("{}:{} stream 0", backend.kind(), backend.info().ordinal);
        let mut stream = TrackedStream::new(&name, backend.as_mut())?;
        stream.default_budget = cfg.default_budget;
        stream.set_tracking(cfg.tracking);
        stream.set_breadcrumbs(cfg.breadcrumbs);
        let graphs = graph::Graphs::new(backend.graph_support());
        let launch_overlap = match backend.set_launch_overlap(cfg.launch_overlap) {
            Ok(()) if cfg.launch_overlap => "on".to_string(),
            Ok(()) => "off (HIPSCOPE_PDL=0)".to_string(),
            Err(why) => format!("off ({why})"),
        };
        let mut gpu = Gpu {
            graphs,
            launch_overlap,
            backend,
            stream,
            cfg,
            arena: None,
            modules: Vec::new(),
            functions: Vec::new(),
            stamped_fns: Vec::new(),
            any_stamped: false,
            by_name: HashMap::new(),
            blas: None,
            gemm_path: GemmPath::NotReady,
            staging: Vec::new(),
            staging_next: 0,
            crumb: None,
            host_words: Vec::new(),
            scalars: None,
            verify_scratch: None,
            prober: None,
            state: State::Alive,
            mem_at_open,
            timer: None,
            timer_failed: None,
            stamp_block: None,
            stamp_ring: false,
            stamp_probe: None,
            stamp_failed: None,
            stamp_busy: false,
            peer_event: None,
            peers: std::collections::HashMap::new(),
            registered: Vec::new(),
        };
        match gpu.alloc_host_side() {
            Ok(()) => Ok(gpu),
            Err(e) => {
                // Give back what was made (nothing is in flight yet).
                let _ = gpu.teardown(Duration::from_secs(1), &mut |_| {});
                Err(e)
            }
        }
    }

    /// The breadcrumb word and the staging buffers.
    fn alloc_host_side(&mut self) -> Result<(), GpuError> {
        let crumb = self.backend.alloc_pinned(64, true)?;
        let Some(dev) = crumb.device else {
            self.host_words.push(crumb);
            return Err(GpuError::InvalidArgument(
                "mapped pinned memory without a device address".into(),
            ));
        };
        // SAFETY: 64 fresh bytes of pinned memory, 8-byte aligned (page-aligned by the runtime).
        unsafe {
            std::ptr::write_bytes(crumb.host, 0, 64);
            self.stream
                .shared()
                .attach_breadcrumb(crumb.host as *mut u64);
        }
        self.stream.set_breadcrumb(dev);
        self.crumb = Some(crumb);
        for _ in 0..self.cfg.staging_buffers.max(1) {
            let mem = self
                .backend
                .alloc_pinned(self.cfg.staging_bytes.max(4096), false)?;
            self.staging.push(StagingBuf { mem, last_seq: 0 });
        }
        Ok(())
    }

    pub fn info(&self) -> &DeviceInfo {
        self.backend.info()
    }

    pub fn kind(&self) -> RuntimeKind {
        self.backend.kind()
    }

    pub fn config(&self) -> &GpuConfig {
        &self.cfg
    }

    /// The shared, lock-free view of the stream, for the watchdog and the UI.
    pub fn stream_shared(&self) -> Arc<StreamShared> {
        self.stream.shared().clone()
    }

    pub fn set_tracking(&mut self, on: bool) {
        self.cfg.tracking = on;
        self.stream.set_tracking(on);
    }

    pub fn set_breadcrumbs(&mut self, on: bool) {
        self.cfg.breadcrumbs = on;
        self.stream.set_breadcrumbs(on);
    }

    pub fn set_verify_uploads(&mut self, on: bool) {
        self.cfg.verify_uploads = on;
    }

    pub fn label(&mut self, text: &str) -> LabelId {
        self.stream.label(text)
    }

    pub fn is_poisoned(&self) -> Option<&str> {
        match &self.state {
            State::Poisoned(r) => Some(r),
            _ => None,
        }
    }

    /// Device allocations made through the backend since open (independent of the arena).
    pub fn device_allocations(&self) -> u64 {
        self.backend.device_allocations()
    }

    pub fn mem_info(&mut self) -> Result<MemInfo, GpuError> {
        self.check_alive()?;
        let r = self.backend.mem_info();
        self.guard(r)
    }

    fn check_alive(&self) -> Result<(), GpuError> {
        match &self.state {
            State::Alive => Ok(()),
            State::Poisoned(r) => Err(GpuError::Poisoned { reason: r.clone() }),
            State::TornDown => Err(GpuError::TornDown),
        }
    }

    /// Passes a result through, poisoning the device on a runtime error.
    fn guard<T>(&mut self, r: Result<T, GpuError>) -> Result<T, GpuError> {
        if let Err(GpuError::Runtime(e)) = &r {
            let reason = e.to_string();
            self.stream.shared().poison(reason.clone());
            self.state = State::Poisoned(reason);
        }
        r
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.cfg.wait_timeout
    }

    /// Enqueues one op through `f`, tracking it. `f` gets the backend, the op's seq and the
    /// breadcrumb address to pass to a kernel.
    fn enqueue(
        &mut self,
        kind: OpKind,
        label: LabelId,
        budget: Option<Budget>,
        f: impl FnOnce(&mut dyn Device, u64, DevicePtr) -> Result<(), GpuError>,
    ) -> Result<u64, GpuError> {
        self.enqueue_traced(kind, label, budget, 0, false, f)
    }

    /// [`Gpu::enqueue`], with the number the tracer shows with the op (`trace::Ev::b`: a copy's
    /// bytes, a graph replay's slot and kernels), and whether the op is a kernel of the stamped
    /// build (`stampable`: it may then be launched stamped, `f` getting the stamp block and the
    /// flagged seq).
    fn enqueue_traced(
        &mut self,
        kind: OpKind,
        label: LabelId,
        budget: Option<Budget>,
        trace_b: u64,
        stampable: bool,
        f: impl FnOnce(&mut dyn Device, u64, DevicePtr) -> Result<(), GpuError>,
    ) -> Result<u64, GpuError> {
        self.check_alive()?;
        // An op that cannot join a recorded step runs after what the step recorded.
        self.graph_flush()?;
        if !self.stream.has_room() {
            let target = self.stream.last_seq().saturating_sub(RING as u64 / 2);
            let d = self.deadline();
            let r = self.stream.wait_for(self.backend.as_mut(), target, d);
            self.guard(r)?;
        }
        self.trace_prepare()?;
        // A stamped kernel gets the stamp block and its flagged seq as its tracking arguments
        // (`HS_BREADCRUMB`); while its slot is still unread it is timed by events instead.
        let stamp = match self.timer.as_mut() {
            Some(t) if stampable && trace::on() => {
                let r = t.stamp_launch(self.backend.as_mut(), self.stream.next_seq());
                self.guard(r)?
            }
            _ => None,
        };
        let traced = self.trace_before(stamp.is_some())?;
        let seq = self.stream.begin(kind, label, budget);
        let (crumb, op) = match stamp {
            Some((block, op)) => (DevicePtr(block), op),
            None => (self.stream.crumb_arg(), seq),
        };
        debug_assert!(stamp.is_none() || op == seq | trace::stamps::STAMP_OP);
        let r = f(self.backend.as_mut(), op, crumb);
        self.guard(r)?;
        self.stream.commit(seq);
        if let Some(enqueued_ns) = traced {
            self.trace_after(seq, kind, label, enqueued_ns, trace_b, stamp.is_some())?;
        }
        if self.stream.wants_event() {
            let d = self.deadline();
            let r = self.stream.record_event(self.backend.as_mut(), d);
            self.guard(r)?;
        }
        Ok(seq)
    }

    /// With tracing on: makes the timed events the first time, and records the op's start (not
    /// for a kernel that stamps itself). Returns the host time of the enqueue, `None` when the op
    /// is not timed.
    fn trace_before(&mut self, stamped: bool) -> Result<Option<u64>, GpuError> {
        if !trace::on() || self.timer_failed.is_some() {
            return Ok(None);
        }
        if self.timer.is_none() {
            match DeviceTimer::new(
                self.backend.as_mut(),
                self.stream.shared(),
                self.cfg.trace_events,
            ) {
                Ok(t) => self.timer = Some(t),
                Err(e) => {
                    tracing::warn!(
                        "trace: no device times on {}: {e}",
                        self.stream.shared().name
                    );
                    self.timer_failed = Some(e.to_string());
                    return Ok(None);
                }
            }
        }
        // One reading of the clock an op: the enqueue's time, and the anchor's age.
        let now = trace::now_ns();
        let mut idle = self.stream.shared().queue_depth() == 0;
        if !idle && !stamped && self.timer.as_ref().is_some_and(|t| t.wants_anchor(now)) {
            let r = self.stream.poll(self.backend.as_mut());
            idle = self.guard(r)? >= self.stream.last_seq();
        }
        let completed = self.stream.shared().completed();
        let wait = self.cfg.wait_timeout;
        let Some(t) = self.timer.as_mut() else {
            return Ok(None);
        };
        t.note_completed(completed);
        let r = t.before(self.backend.as_mut(), idle, stamped, wait);
        self.guard(r)?;
        Ok(Some(now))
    }

    fn trace_after(
        &mut self,
        seq: u64,
        kind: OpKind,
        label: LabelId,
        enqueued_ns: u64,
        b: u64,
        stamped: bool,
    ) -> Result<(), GpuError> {
        let wait = self.cfg.wait_timeout;
        let Some(t) = self.timer.as_mut() else {
            return Ok(());
        };
        let r = t.after(
            self.backend.as_mut(),
            seq,
            kind,
            label,
            enqueued_ns,
            b,
            stamped,
            wait,
        );
        self.guard(r)
    }

    /// Reads back the device times of the ops that have finished (tracing on, or its events
    /// still pending).
    pub(crate) fn trace_harvest(&mut self) -> Result<(), GpuError> {
        let completed = self.stream.shared().completed();
        let Some(t) = self.timer.as_mut() else {
            return Ok(());
        };
        if t.pending() == 0 {
            return Ok(());
        }
        t.note_completed(completed);
        let r = t.harvest(self.backend.as_mut());
        self.guard(r)
    }

    /// Why this device's ops carry no device times in a trace, if they do not.
    pub fn trace_unavailable(&self) -> Option<&str> {
        self.timer_failed.as_deref()
    }

    /// Records an event after the last op (end of a layer or phase), so that "K finished" is
    /// observable even when no kernel follows.
    pub fn mark_phase(&mut self) -> Result<(), GpuError> {
        self.check_alive()?;
        self.graph_flush()?;
        let d = self.deadline();
        let r = self.stream.record_event(self.backend.as_mut(), d);
        self.guard(r)
    }

    /// Waits, polling events with backoff, until everything enqueued has finished.
    pub fn wait_idle(&mut self, timeout: Duration) -> Result<(), GpuError> {
        self.check_alive()?;
        self.graph_flush()?;
        let last = self.stream.last_seq();
        let r = self
            .stream
            .wait_for(self.backend.as_mut(), last, Instant::now() + timeout);
        self.guard(r)?;
        self.trace_harvest()
    }

    /// Polls events without waiting; returns the number of ops known complete.
    pub fn poll(&mut self) -> Result<u64, GpuError> {
        self.check_alive()?;
        let r = self.stream.poll(self.backend.as_mut());
        self.guard(r)
    }

    pub fn stream_snapshot(&self) -> StreamSnapshot {
        self.stream.shared().snapshot()
    }

    pub fn arena_snapshot(&mut self) -> Option<ArenaSnapshot> {
        let mem = if self.state == State::Alive {
            self.backend.mem_info().ok()
        } else {
            None
        };
        self.arena.as_ref().map(|a| a.snapshot(mem))
    }

    pub fn summary(&mut self, reason: &str) -> DeviceSummary {
        let free = if self.state == State::Alive {
            self.backend.mem_info().ok().map(|m| m.free)
        } else {
            None
        };
        let i = self.info();
        DeviceSummary {
            backend: self.kind().name().into(),
            name: i.name.clone(),
            arch: i.arch.clone(),
            total_memory: Some(i.total_memory),
            free_memory: free,
            compute_units: Some(i.compute_units),
            warp_size: Some(i.warp_size),
            reason: reason.to_string(),
            graphs: Some(self.graph_mode().describe()),
            launch_overlap: Some(self.launch_overlap.clone()),
        }
    }

    /// Launch overlap as the device took it: `on`, or `off (why)`.
    pub fn launch_overlap(&self) -> &str {
        &self.launch_overlap
    }

    /// Free device memory when the device was opened.
    pub fn mem_at_open(&self) -> Option<MemInfo> {
        self.mem_at_open
    }
}

/// Waits with backoff until `cond` holds or `timeout` passes (host-side helper for tests and the
/// selftest; no GPU call).
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let mut b = Backoff::new();
    while b.waited() < timeout {
        if cond() {
            return true;
        }
        b.wait();
    }
    cond()
}
