//! Device times for the tracer. Kernels time themselves (`stamps.rs`) once the device clock is
//! mapped onto the host's; every other op — a copy, a vendor BLAS call, a graph replay, and a
//! kernel before the first calibration — is timed by the runtime's events: the tracked stream
//! records a timed event before and after the op (from a pool of [`POOL`] events created the
//! first time tracing is on), and reads them back once the device has passed them. The op's
//! duration is the time between its two events (what the device spent on it, launch latency
//! excluded), placed on the host clock through an anchor — a timed event recorded while the
//! stream was idle, so that the device reached it at the host time it was recorded. The in-flight
//! table's own events stay without timing (docs/ARCHITECTURE.md, "The GPU rules"): with tracing
//! off, nothing here runs.
//!
//! [`TraceEvents`] (`HIPSCOPE_TRACE_EVENTS`, resolved by `app/settings.rs` and passed down
//! through `GpuConfig`): `stamps` (the default) as above; `pairs` times kernels by events too;
//! `ends` records only the event after each op (half the calls): an op then starts when the
//! previous one ended or when it was enqueued, whichever is later, which counts launch latency
//! into ops that start on an idle device.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::stamps::{self, ClockMap, StampRing};
use super::{Cat, Ev, Name, TrackId, now_ns, push, stream_track};
use crate::gpu::device::{Device, GpuError, RawEvent};
use crate::gpu::stream::{Backoff, LabelId, OpKind, StreamShared};

/// Timed events per device (two per op in flight between harvests).
pub const POOL: usize = 2048;
/// Ops between two harvests while the device runs ahead.
const HARVEST_EVERY: usize = 64;
/// An anchor older than this is replaced at the next idle moment (the two clocks drift, and
/// `event_elapsed_ms`'s f32 loses precision far from its anchor).
const ANCHOR_AGE_NS: u64 = 50_000_000;

/// How the tracer times each op.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TraceEvents {
    /// Kernels by their own stamps, other ops by a pair of events.
    #[default]
    Stamps,
    /// One event before and one after each op: the op's own device time.
    Pairs,
    /// Only the one after each op (half the calls; launch latency counts into an op that starts
    /// on an idle device).
    Ends,
}

/// How a pending op was timed.
enum Timing {
    Events {
        start: Option<RawEvent>,
        end: RawEvent,
        anchor: usize,
    },
    /// By the kernel itself, into its ring slot.
    Stamped,
}

/// One op whose times are not read back yet.
struct Pending {
    timing: Timing,
    kind: OpKind,
    label: LabelId,
    seq: u64,
    step: u32,
    enqueued_ns: u64,
    b: u64,
}

/// The kernels' stamps of one stream: the ring they write and the clock map.
struct Stamps {
    ring: StampRing,
    /// The stamp block's device address (`hs_crumb` of a stamped launch).
    block: u64,
    clock: Option<ClockMap>,
    nominal: f64,
}

/// A kernel whose stamps have not arrived this long after the op following it finished is
/// counted untimed.
const STAMP_GRACE_NS: u64 = 100_000_000;

struct Anchor {
    ev: RawEvent,
    host_ns: u64,
    /// Pending ops measured against it.
    users: usize,
}

/// Per-device state of the tracer's timing (owned by the `Gpu`).
pub struct DeviceTimer {
    track: TrackId,
    graph_track: TrackId,
    pairs: bool,
    all: Vec<RawEvent>,
    free: Vec<RawEvent>,
    pending: VecDeque<Pending>,
    anchors: Vec<Option<Anchor>>,
    current: Option<usize>,
    /// Where the last op read back ended (host clock, ns): ops on one stream do not overlap.
    last_end_ns: u64,
    /// The start event recorded by `before` for the op `after` completes.
    open_start: Option<RawEvent>,
    since_harvest: usize,
    stamps: Option<Stamps>,
    /// The stream's completed seq as last told (`note_completed`), and since when (host clock)
    /// the oldest pending stamped op has been complete without its stamps.
    completed: u64,
    stale_since: Option<u64>,
    /// Ops not timed (no anchor yet, the pool was exhausted, stamps that never came).
    pub untimed: u64,
}

impl DeviceTimer {
    /// Creates the event pool on `dev` for the stream `stream`, recording `events` per op.
    pub fn new(
        dev: &mut dyn Device,
        stream: &Arc<StreamShared>,
        events: TraceEvents,
    ) -> Result<DeviceTimer, GpuError> {
        let pairs = events != TraceEvents::Ends;
        let mut all = Vec::with_capacity(POOL);
        for _ in 0..POOL {
            match dev.create_timed_event() {
                Ok(e) => all.push(e),
                Err(e) => {
                    for ev in all {
                        // SAFETY: created above, never recorded.
                        let _ = unsafe { dev.destroy_event(ev) };
                    }
                    return Err(e);
                }
            }
        }
        Ok(DeviceTimer {
            track: stream_track(stream, false),
            graph_track: stream_track(stream, true),
            pairs,
            free: all.clone(),
            all,
            pending: VecDeque::new(),
            anchors: Vec::new(),
            current: None,
            last_end_ns: 0,
            open_start: None,
            since_harvest: 0,
            stamps: None,
            completed: 0,
            stale_since: None,
            untimed: 0,
        })
    }

    /// Lets kernels stamp themselves into `ring`, through the stamp block at device address
    /// `block`, once [`DeviceTimer::calibrate`] has mapped the clock (`nominal` ns a tick until
    /// measured).
    pub fn set_stamps(&mut self, ring: StampRing, block: u64, nominal: f64) {
        self.stamps = Some(Stamps {
            ring,
            block,
            clock: None,
            nominal,
        });
    }

    /// Whether kernels should be launched stamped: a ring and a clock map.
    pub fn stamping(&self) -> bool {
        self.stamps.as_ref().is_some_and(|s| s.clock.is_some())
    }

    /// Whether the clock map is missing or old (the caller then calibrates at an idle moment).
    pub fn wants_calibration(&self) -> bool {
        self.stamps.as_ref().is_some_and(|s| {
            s.clock
                .is_none_or(|c| c.made_ns() + stamps::RECALIBRATE_NS < now_ns())
        })
    }

    /// Maps the clocks from calibration samples `(host_ns, ticks)` (none: the map stays).
    pub fn calibrate(&mut self, samples: &[(u64, u64)]) {
        if let Some(s) = self.stamps.as_mut()
            && let Some(m) = ClockMap::from_samples(samples, s.nominal, s.clock.as_ref())
        {
            s.clock = Some(m);
        }
    }

    /// The stamp block's device address and the `hs_op` for a stamped launch of op `seq`; `None`
    /// when kernels are not stamped now or the slot's previous op is still unread (the op is
    /// then timed by events).
    pub fn stamp_launch(
        &mut self,
        dev: &mut dyn Device,
        seq: u64,
    ) -> Result<Option<(u64, u64)>, GpuError> {
        if !self.stamping() {
            return Ok(None);
        }
        if self.slot_busy(seq) {
            self.harvest(dev)?;
            if self.slot_busy(seq) {
                return Ok(None);
            }
        }
        Ok(self
            .stamps
            .as_ref()
            .map(|s| (s.block, seq | stamps::STAMP_OP)))
    }

    /// Whether an unread op may still hold `seq`'s slot: pending ops are in seq order, so the
    /// oldest one tells.
    fn slot_busy(&self, seq: u64) -> bool {
        self.pending
            .front()
            .is_some_and(|p| p.seq + stamps::SLOTS as u64 <= seq)
    }

    /// The stream's completed seq, so that a stamped op whose stamps never come is let go.
    pub fn note_completed(&mut self, completed: u64) {
        self.completed = self.completed.max(completed);
    }

    /// The events, for teardown (after the drain).
    pub fn events(&self) -> &[RawEvent] {
        &self.all
    }

    /// Ops whose events have not been read back.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether the clocks want (re)anchoring at host time `now`: no anchor yet, or an old one.
    /// The caller then polls the stream, so that an idle stream is seen as idle.
    pub fn wants_anchor(&self, now: u64) -> bool {
        self.current.is_none_or(|a| {
            self.anchors[a]
                .as_ref()
                .is_none_or(|a| a.host_ns + ANCHOR_AGE_NS < now)
        })
    }

    /// A free timed event, harvesting (and, while the device is a pool's worth of ops ahead,
    /// waiting up to `wait`) when none is; `None` after the wait.
    fn take_event(
        &mut self,
        dev: &mut dyn Device,
        wait: Duration,
    ) -> Result<Option<RawEvent>, GpuError> {
        if self.free.is_empty() {
            self.harvest(dev)?;
        }
        if self.free.is_empty() && !self.pending.is_empty() {
            // The device is more than a pool's worth of ops ahead: waiting costs it nothing.
            let deadline = Instant::now() + wait;
            let mut backoff = Backoff::new();
            while self.free.is_empty() && !self.pending.is_empty() {
                if Instant::now() > deadline {
                    return Ok(None);
                }
                backoff.wait();
                self.harvest(dev)?;
            }
        }
        Ok(self.free.pop())
    }

    /// Before an op is enqueued: anchors the clocks when the stream is idle (`idle`), and records
    /// the op's start event unless the op stamps itself (`stamped`).
    pub fn before(
        &mut self,
        dev: &mut dyn Device,
        idle: bool,
        stamped: bool,
        wait: Duration,
    ) -> Result<(), GpuError> {
        if self.since_harvest >= HARVEST_EVERY || idle {
            self.harvest(dev)?;
        }
        if idle
            && self.wants_anchor(now_ns())
            && let Some(ev) = self.take_event(dev, wait)?
        {
            // SAFETY: a timed event of this device, not in flight (taken from the free list).
            unsafe { dev.record_event(ev) }?;
            let a = Anchor {
                ev,
                host_ns: now_ns(),
                users: 0,
            };
            let slot = match self.anchors.iter().position(|x| x.is_none()) {
                Some(i) => {
                    self.anchors[i] = Some(a);
                    i
                }
                None => {
                    self.anchors.push(Some(a));
                    self.anchors.len() - 1
                }
            };
            let old = self.current.replace(slot);
            if let Some(o) = old {
                self.release_anchor_if_unused(o);
            }
        }
        if self.pairs && !stamped && self.current.is_some() {
            self.open_start = self.take_event(dev, wait)?;
            if let Some(ev) = self.open_start {
                // SAFETY: as above.
                unsafe { dev.record_event(ev) }?;
            }
        }
        Ok(())
    }

    fn release_anchor_if_unused(&mut self, i: usize) {
        let unused =
            self.current != Some(i) && self.anchors[i].as_ref().is_some_and(|a| a.users == 0);
        if unused && let Some(a) = self.anchors[i].take() {
            self.free.push(a.ev);
        }
    }

    /// After op `seq` was enqueued: records its end event, or for an op that stamps itself
    /// (`stamped`) only notes it.
    #[allow(clippy::too_many_arguments)]
    pub fn after(
        &mut self,
        dev: &mut dyn Device,
        seq: u64,
        kind: OpKind,
        label: LabelId,
        enqueued_ns: u64,
        b: u64,
        stamped: bool,
        wait: Duration,
    ) -> Result<(), GpuError> {
        let timing = if stamped {
            Timing::Stamped
        } else {
            let start = self.open_start.take();
            let Some(anchor) = self.current else {
                self.untimed += 1;
                return Ok(());
            };
            let Some(end) = self.take_event(dev, wait)? else {
                if let Some(s) = start {
                    self.free.push(s);
                }
                self.untimed += 1;
                return Ok(());
            };
            // SAFETY: a timed event of this device, not in flight.
            unsafe { dev.record_event(end) }?;
            if let Some(a) = self.anchors[anchor].as_mut() {
                a.users += 1;
            }
            Timing::Events { start, end, anchor }
        };
        self.pending.push_back(Pending {
            timing,
            kind,
            label,
            seq,
            step: super::current_step(),
            enqueued_ns,
            b,
        });
        self.since_harvest += 1;
        Ok(())
    }

    /// Reads back every op the device has passed, oldest first, and pushes its event.
    pub fn harvest(&mut self, dev: &mut dyn Device) -> Result<(), GpuError> {
        self.since_harvest = 0;
        while let Some(p) = self.pending.front() {
            let times = match p.timing {
                Timing::Events { start, end, anchor } => {
                    if !dev.query_event(end)? {
                        break;
                    }
                    self.event_times(dev, start, end, anchor, p.enqueued_ns)?
                        .map(|(s, e)| (s, e, 0))
                }
                Timing::Stamped => match self.stamp_times(dev, p.seq, p.enqueued_ns)? {
                    Stamp::Read(t) => Some(t),
                    Stamp::Wait => break,
                    Stamp::Lost => None,
                },
            };
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            if let Timing::Events { start, end, anchor } = p.timing {
                self.free.extend(start);
                self.free.push(end);
                if let Some(a) = self.anchors[anchor].as_mut() {
                    a.users = a.users.saturating_sub(1);
                }
                self.release_anchor_if_unused(anchor);
            }
            let Some((start_ns, end_ns, dispatch_ns)) = times else {
                self.untimed += 1;
                continue;
            };
            let b = match p.timing {
                Timing::Stamped => stamps::stamped_b(dispatch_ns),
                Timing::Events { .. } => p.b,
            };
            self.last_end_ns = end_ns;
            push(Ev {
                track: if p.kind == OpKind::Graph {
                    self.graph_track
                } else {
                    self.track
                },
                cat: Cat::Op(p.kind),
                name: Name::Label(p.label),
                start_ns,
                dur_ns: end_ns - start_ns,
                step: p.step,
                a: p.seq,
                b,
            });
        }
        Ok(())
    }

    /// An event-timed op's start and end on the host clock; `None` when its anchor is gone.
    fn event_times(
        &self,
        dev: &mut dyn Device,
        start: Option<RawEvent>,
        end: RawEvent,
        anchor: usize,
        enqueued_ns: u64,
    ) -> Result<Option<(u64, u64)>, GpuError> {
        let Some(a) = self.anchors[anchor].as_ref() else {
            return Ok(None);
        };
        let end_ns = at_anchor(dev, a, end)?;
        Ok(Some(match start {
            Some(s) => {
                // Its length is the device's; it is moved, not cut, to start no earlier than the
                // previous op ended (the anchor and the stamps' clock map each place ops to
                // within about a microsecond, not always the same one).
                let dur = ms_to_ns(dev.event_elapsed_ms(s, end)?);
                let start = end_ns.saturating_sub(dur).max(self.last_end_ns);
                (start, start + dur)
            }
            None => {
                let start = self.last_end_ns.max(enqueued_ns).min(end_ns);
                (start, end_ns)
            }
        }))
    }

    /// A stamped op's start and end on the host clock and the part of it spent before its first
    /// block ran, once its start and its end are there: the end as the next kernel handed it
    /// over, or, where the next op is a copy (the step's last kernel before the logits'
    /// download), where the device reached that op's start event. Its own run is the device's,
    /// first block to last; it is placed no earlier than the previous op's end (ops on one
    /// stream do not overlap; the clock map is good to about a microsecond). When the host had
    /// enqueued it before the previous op ended, the device was busy and the gap between the two
    /// is its own dispatch (what `ncu` counts into a kernel's time too): it starts at the
    /// previous op's end. When the host enqueued it later, the device was waiting for the host:
    /// that gap stays outside.
    fn stamp_times(
        &mut self,
        dev: &mut dyn Device,
        seq: u64,
        enqueued_ns: u64,
    ) -> Result<Stamp, GpuError> {
        let Some(s) = self.stamps.as_ref() else {
            return Ok(Stamp::Lost);
        };
        let Some(clock) = s.clock else {
            return Ok(Stamp::Lost);
        };
        let (t0, end_ns) = match s.ring.take(seq) {
            Some((t0, t1)) => (t0, clock.host_ns(t0) + clock.span_ns(t0, t1)),
            None => {
                let t0 = s.ring.start(seq);
                match self.next_start_event_ns(dev, seq)? {
                    Some(end) if t0 != 0 => {
                        s.ring.empty(seq);
                        (t0, end)
                    }
                    _ => return Ok(self.not_there(seq)),
                }
            }
        };
        self.stale_since = None;
        let first_block = clock.host_ns(t0).max(self.last_end_ns);
        let run = end_ns.saturating_sub(clock.host_ns(t0));
        let gap = first_block - self.last_end_ns;
        let dispatch = if enqueued_ns <= self.last_end_ns && gap <= MAX_DISPATCH_NS {
            gap
        } else {
            0
        };
        Ok(Stamp::Read((
            first_block - dispatch,
            first_block + run,
            dispatch,
        )))
    }

    /// Where the device reached the start event of op `seq + 1`, if that op is timed by events
    /// and the device has passed it.
    fn next_start_event_ns(&self, dev: &mut dyn Device, seq: u64) -> Result<Option<u64>, GpuError> {
        let Some(next) = self.pending.get(1).filter(|n| n.seq == seq + 1) else {
            return Ok(None);
        };
        let Timing::Events {
            start: Some(ev),
            anchor,
            ..
        } = next.timing
        else {
            return Ok(None);
        };
        let Some(a) = self.anchors[anchor].as_ref() else {
            return Ok(None);
        };
        if !dev.query_event(ev)? {
            return Ok(None);
        }
        at_anchor(dev, a, ev).map(Some)
    }

    /// A stamped op whose start or end is not there: waited for while nothing after it has
    /// finished (its end comes with the next kernel); once the op after it has finished too,
    /// the stamps may still be on their way over the bus, and after a grace period the op is
    /// counted untimed.
    fn not_there(&mut self, seq: u64) -> Stamp {
        if self.completed <= seq {
            return Stamp::Wait;
        }
        let now = now_ns();
        let since = *self.stale_since.get_or_insert(now);
        if now < since + STAMP_GRACE_NS {
            return Stamp::Wait;
        }
        self.stale_since = None;
        // A stamp that comes after all must not pass for the slot's next op's.
        if let Some(s) = self.stamps.as_ref() {
            s.ring.empty(seq);
        }
        Stamp::Lost
    }
}

/// Nanoseconds of an event interval (`event_elapsed_ms`' f32 milliseconds).
fn ms_to_ns(ms: f32) -> u64 {
    (f64::from(ms) * 1e6).round().max(0.0) as u64
}

/// The host time at which the device reached timed event `ev`, through anchor `a`.
fn at_anchor(dev: &mut dyn Device, a: &Anchor, ev: RawEvent) -> Result<u64, GpuError> {
    Ok(a.host_ns + ms_to_ns(dev.event_elapsed_ms(a.ev, ev)?))
}

/// The longest gap before a stamped kernel counted as its dispatch (a longer one is the stream
/// waiting on something else).
const MAX_DISPATCH_NS: u64 = 20_000;

/// What a stamped op's slot holds now.
enum Stamp {
    /// Start, end, and the dispatch at its start (ns).
    Read((u64, u64, u64)),
    Wait,
    Lost,
}
