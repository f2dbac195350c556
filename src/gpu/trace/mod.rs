//! The tracer: where every microsecond goes. Hooks in the backends (each CPU op and pool job,
//! each GPU kernel, copy and graph replay, timed by the kernels' own stamps, `stamps.rs`, or the
//! runtime's events, `device.rs`), in the forward pass (decode steps, prompt batches), the
//! session (sampling, detokenizing), the load and the UI (frames) push small plain events into
//! one bounded ring; one collector thread (`collector.rs`) takes them off and hands them to the
//! timeline file (`writer.rs`: Chrome's trace-event JSON, which Perfetto's UI and
//! `chrome://tracing` open) and to the profile (`profile.rs`: each op family's share of a step,
//! for the Profile panel and `bench --profile`).
//!
//! Off, a hook costs one relaxed atomic load. On, a push is a `try_send` into the ring and never
//! blocks: when the collector falls behind, events are dropped and counted (the file says how
//! many). Nothing here waits on the worker or the device.
//!
//! Names are resolved late: an op event carries its stream's interned label id, and the collector
//! reads the text from the stream's lock-free label table (`StreamShared::label`).

mod collector;
pub mod device;
pub mod label;
pub mod profile;
pub mod stamps;
pub mod writer;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use crate::gpu::stream::{LabelId, OpKind, StreamShared};

pub use collector::{
    ProfileSink, TraceError, TraceStatus, disable_profile, enable_profile, profile_now,
    reset_profile, set_bandwidth, set_op_costs, start_file, status, stop_file,
};
pub use label::{OpCost, OpCosts, ParsedLabel, parse_label};
pub use profile::{ProfileRow, ProfileSnapshot, ProfileTable};

/// Events the ring holds (each at most 72 bytes: under 5 MiB in all). A decode step of a 7B
/// model is about 300 kernels, so the ring holds some 200 steps the collector has not yet taken.
pub const RING_EVENTS: usize = 1 << 16;

/// A track of the timeline (a `tid` in the file): one per device stream, one per CPU worker
/// thread, and the fixed host tracks below.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrackId(pub u16);

impl TrackId {
    /// Decode steps and prompt batches (the model's view), and the model load.
    pub const STEPS: TrackId = TrackId(1);
    /// The inference worker's host work around the steps: sampling, detokenizing.
    pub const WORKER: TrackId = TrackId(2);
    /// The UI thread's frames.
    pub const UI: TrackId = TrackId(3);
    /// The CPU backend's pool threads: `CPU_THREADS + index` (index 0 is the worker itself).
    pub const CPU_THREADS: u16 = 100;
    /// First id handed to a registered stream.
    const FIRST_STREAM: u16 = 10;

    pub fn cpu_thread(index: usize) -> TrackId {
        TrackId(Self::CPU_THREADS + index.min(999) as u16)
    }
}

/// What an event is (its `cat` in the file, and how the profile counts it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cat {
    /// An op on a stream (kernel, copy, BLAS call, graph replay, CPU op).
    Op(OpKind),
    /// One pool thread's share of a CPU op.
    Job,
    /// One forward step: a decode step (`tokens == 1`) or a prompt batch.
    Step,
    /// A step has begun (not drawn: it tells the collector the step's position and tokens, which
    /// its ops' bytes depend on, before they arrive).
    StepBegin,
    /// Host work on a fixed track (sampling, detokenizing, a frame, the load).
    Host,
}

/// An event's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Name {
    /// A label interned in the track's stream (resolved by the collector).
    Label(LabelId),
    Static(&'static str),
}

/// One complete event (`"ph":"X"`): plain data, copied into the ring.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ev {
    pub track: TrackId,
    pub cat: Cat,
    pub name: Name,
    /// Nanoseconds since the trace epoch ([`now_ns`]).
    pub start_ns: u64,
    pub dur_ns: u64,
    /// The step the event belongs to ([`current_step`] when it was issued; 0 outside steps).
    pub step: u32,
    /// Ops: the op's seq on its stream. Steps: the first position. Graph replays: the seq.
    pub a: u64,
    /// Steps: tokens in the step. Graph replays: `slot << 32 | kernels`. Copies: bytes. Jobs: the
    /// track whose labels name it.
    pub b: u64,
}

/// What travels through the ring: events, and the collector's orders (never dropped).
pub(crate) enum Msg {
    Ev(Ev),
    Ctl(collector::Control),
}

static ON: AtomicBool = AtomicBool::new(false);
/// The CPU op the pool's threads are working for: its track and label (`track << 32 | label`).
static CPU_OP: AtomicU64 = AtomicU64::new(0);
/// Steps numbered so far, and the one running now (0: none).
static STEPS_SEEN: AtomicU32 = AtomicU32::new(0);
static STEP: AtomicU32 = AtomicU32::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);

struct Ring {
    tx: SyncSender<Msg>,
    rx: Mutex<Option<Receiver<Msg>>>,
}

fn ring() -> &'static Ring {
    static RING: OnceLock<Ring> = OnceLock::new();
    RING.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::sync_channel(RING_EVENTS);
        Ring {
            tx,
            rx: Mutex::new(Some(rx)),
        }
    })
}

/// Whether anything is collecting (a timeline file or the profile). The one check every hook
/// makes first.
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

static STAMPED_KERNELS: AtomicBool = AtomicBool::new(false);

/// Asks for kernels that time themselves (`trace/stamps.rs`), for a command that will trace or
/// profile once its model is loaded (`bench --profile`, `selftest`): the GPU builds them when it
/// builds its kernels, as it does when a trace is already on then (`--trace`).
pub fn ask_stamped_kernels() {
    STAMPED_KERNELS.store(true, Ordering::Relaxed);
}

/// Whether kernels built now should be the stamped build: a trace or profile is on, or was asked
/// for.
pub fn stamped_kernels_wanted() -> bool {
    on() || STAMPED_KERNELS.load(Ordering::Relaxed)
}

pub(crate) fn set_on(on: bool) {
    ON.store(on, Ordering::Release);
}

/// The trace's clock: nanoseconds since the first call in this process (`Instant`, the same
/// monotonic clock as every `Instant` the app reads).
pub fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

#[inline]
pub fn now_ns() -> u64 {
    ns_of(Instant::now())
}

/// An instant on the trace's clock (0 for one before the epoch).
pub fn ns_of(t: Instant) -> u64 {
    t.saturating_duration_since(epoch()).as_nanos() as u64
}

/// Pushes an event; dropped (and counted) when the ring is full or nothing collects.
#[inline]
pub fn push(ev: Ev) {
    if !on() {
        return;
    }
    match ring().tx.try_send(Msg::Ev(ev)) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Events dropped because the ring was full, since the process started.
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// The step now running (0 before the first).
#[inline]
pub fn current_step() -> u32 {
    STEP.load(Ordering::Relaxed)
}

/// Names the CPU op that the pool's next jobs belong to (the CPU backend, as each op starts).
#[inline]
pub fn cpu_op(track: TrackId, label: LabelId) {
    CPU_OP.store((track.0 as u64) << 32 | label.0 as u64, Ordering::Relaxed);
}

/// Pool thread `index` ran its share of the current CPU op from `start_ns` until now.
pub fn cpu_job(index: usize, start_ns: u64) {
    let op = CPU_OP.load(Ordering::Relaxed);
    push(Ev {
        track: TrackId::cpu_thread(index),
        cat: Cat::Job,
        name: Name::Label(LabelId(op as u32)),
        start_ns,
        dur_ns: now_ns().saturating_sub(start_ns),
        step: current_step(),
        a: 0,
        b: op >> 32,
    });
}

/// An enclosing slice on a host track, pushed when the guard drops.
#[must_use = "the slice ends when the guard drops"]
pub struct Slice {
    track: TrackId,
    cat: Cat,
    name: &'static str,
    start: Option<u64>,
    step: u32,
    a: u64,
    b: u64,
}

impl Slice {
    /// Sets the slice's two numbers (steps: position and tokens).
    pub fn args(mut self, a: u64, b: u64) -> Slice {
        self.a = a;
        self.b = b;
        self
    }
}

impl Drop for Slice {
    fn drop(&mut self) {
        if let Some(start) = self.start {
            if self.cat == Cat::Step {
                // Ops after the step (an upload, a reload) belong to no step.
                STEP.store(0, Ordering::Relaxed);
            }
            push(Ev {
                track: self.track,
                cat: self.cat,
                name: Name::Static(self.name),
                start_ns: start,
                dur_ns: now_ns().saturating_sub(start),
                step: self.step,
                a: self.a,
                b: self.b,
            });
        }
    }
}

/// Starts host slice `name` on `track` (sampling, detokenizing, a frame, the load).
#[inline]
pub fn slice(track: TrackId, name: &'static str) -> Slice {
    Slice {
        track,
        cat: Cat::Host,
        name,
        start: on().then(now_ns),
        step: current_step(),
        a: 0,
        b: 0,
    }
}

/// Starts a forward step of `tokens` tokens from position `pos0`: a decode step (one token) or a
/// prompt batch. Every op issued until the next step belongs to it.
#[inline]
pub fn step(pos0: usize, tokens: usize) -> Slice {
    if !on() {
        // A step not traced: ops issued in it (tracing turned on halfway) belong to no step.
        STEP.store(0, Ordering::Relaxed);
        return Slice {
            track: TrackId::STEPS,
            cat: Cat::Step,
            name: "",
            start: None,
            step: 0,
            a: 0,
            b: 0,
        };
    }
    let id = STEPS_SEEN.fetch_add(1, Ordering::Relaxed) + 1;
    STEP.store(id, Ordering::Relaxed);
    let start = now_ns();
    push(Ev {
        track: TrackId::STEPS,
        cat: Cat::StepBegin,
        name: Name::Static(""),
        start_ns: start,
        dur_ns: 0,
        step: id,
        a: pos0 as u64,
        b: tokens as u64,
    });
    Slice {
        track: TrackId::STEPS,
        cat: Cat::Step,
        name: if tokens == 1 {
            "decode step"
        } else {
            "prompt batch"
        },
        start: Some(start),
        step: id,
        a: pos0 as u64,
        b: tokens as u64,
    }
}

/// What the collector knows of a track.
#[derive(Clone)]
pub(crate) struct TrackInfo {
    pub id: TrackId,
    pub name: String,
    /// Where its label ids resolve.
    pub labels: Option<Arc<StreamShared>>,
}

fn tracks() -> &'static Mutex<Vec<TrackInfo>> {
    static TRACKS: OnceLock<Mutex<Vec<TrackInfo>>> = OnceLock::new();
    TRACKS.get_or_init(|| Mutex::new(Vec::new()))
}

/// The track of `stream` (registered on first use), or of its graph replays when `graphs`.
/// A few per process: taken once per stream, not per op.
pub fn stream_track(stream: &Arc<StreamShared>, graphs: bool) -> TrackId {
    let mut t = tracks().lock().unwrap_or_else(|e| e.into_inner());
    let name = if graphs {
        format!("{} · graph replays", stream.name)
    } else {
        stream.name.clone()
    };
    if let Some(i) = t
        .iter()
        .find(|i| i.name == name && i.labels.as_ref().is_some_and(|l| Arc::ptr_eq(l, stream)))
    {
        return i.id;
    }
    let id = TrackId(TrackId::FIRST_STREAM + t.len() as u16);
    t.push(TrackInfo {
        id,
        name,
        labels: Some(stream.clone()),
    });
    id
}

/// Every registered track (streams), for the collector.
pub(crate) fn registered_tracks() -> Vec<TrackInfo> {
    tracks().lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The name of a fixed track, or of a CPU pool thread's.
pub(crate) fn fixed_track_name(id: TrackId) -> Option<String> {
    Some(match id {
        TrackId::STEPS => "model · steps".into(),
        TrackId::WORKER => "worker · sampling, detokenizing".into(),
        TrackId::UI => "UI · frames".into(),
        TrackId(n) if n >= TrackId::CPU_THREADS => {
            format!("cpu thread {}", n - TrackId::CPU_THREADS)
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_small() {
        // The ring's stated size assumes it.
        assert!(
            std::mem::size_of::<Msg>() <= 72,
            "{}",
            std::mem::size_of::<Msg>()
        );
    }

    #[test]
    fn a_slice_is_nothing_while_off() {
        // Off by default in a unit-test process that never enables it here.
        let s = slice(TrackId::WORKER, "sample");
        if !on() {
            assert!(s.start.is_none());
        }
    }
}
