//! Device times for the tracer: while tracing is on, the tracked stream records a timed event
//! before and after each op (from a pool of [`POOL`] events created the first time tracing is
//! on), and reads them back once the device has passed them: the op's duration is the time
//! between its two events (what the device spent on it, launch latency excluded), placed on the
//! host clock through an anchor — a timed event recorded while the stream was idle, so that the
//! device reached it at the host time it was recorded. The in-flight table's own events stay
//! without timing (`GPU rules` in DESIGN.md): with tracing off, nothing here runs.
//!
//! [`TraceEvents::Ends`] (`HIPSCOPE_TRACE_EVENTS=ends`, resolved by `app/settings.rs` and passed
//! down through `GpuConfig`) records only the event after each op (half the calls): an op then
//! starts when the previous one ended or when it was enqueued, whichever is later, which counts
//! launch latency into ops that start on an idle device.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

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

/// Which timed events the tracer records per op.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TraceEvents {
    /// One before and one after each op: the op's own device time.
    #[default]
    Pairs,
    /// Only the one after each op (half the calls; launch latency counts into an op that starts
    /// on an idle device).
    Ends,
}

/// One op whose events are not read back yet.
struct Pending {
    start: Option<RawEvent>,
    end: RawEvent,
    kind: OpKind,
    label: LabelId,
    seq: u64,
    step: u32,
    enqueued_ns: u64,
    b: u64,
    anchor: usize,
}

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
    /// Ops not timed (no anchor yet, or the pool was exhausted).
    pub untimed: u64,
}

impl DeviceTimer {
    /// Creates the event pool on `dev` for the stream `stream`, recording `events` per op.
    pub fn new(
        dev: &mut dyn Device,
        stream: &Arc<StreamShared>,
        events: TraceEvents,
    ) -> Result<DeviceTimer, GpuError> {
        let pairs = events == TraceEvents::Pairs;
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
            untimed: 0,
        })
    }

    /// The events, for teardown (after the drain).
    pub fn events(&self) -> &[RawEvent] {
        &self.all
    }

    /// Ops whose events have not been read back.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether the clocks want (re)anchoring: no anchor yet, or an old one. The caller then
    /// polls the stream, so that an idle stream is seen as idle.
    pub fn wants_anchor(&self) -> bool {
        self.current.is_none_or(|a| {
            self.anchors[a]
                .as_ref()
                .is_none_or(|a| a.host_ns + ANCHOR_AGE_NS < now_ns())
        })
    }

    fn take_event(
        &mut self,
        dev: &mut dyn Device,
        deadline: Instant,
    ) -> Result<Option<RawEvent>, GpuError> {
        if self.free.is_empty() {
            self.harvest(dev)?;
        }
        let mut backoff = Backoff::new();
        while self.free.is_empty() && !self.pending.is_empty() {
            // The device is more than a pool's worth of ops ahead: waiting costs it nothing.
            if Instant::now() > deadline {
                return Ok(None);
            }
            backoff.wait();
            self.harvest(dev)?;
        }
        Ok(self.free.pop())
    }

    /// Before an op is enqueued: anchors the clocks when the stream is idle (`idle`), and records
    /// the op's start event.
    pub fn before(
        &mut self,
        dev: &mut dyn Device,
        idle: bool,
        deadline: Instant,
    ) -> Result<(), GpuError> {
        if self.since_harvest >= HARVEST_EVERY || idle {
            self.harvest(dev)?;
        }
        if idle
            && self.wants_anchor()
            && let Some(ev) = self.take_event(dev, deadline)?
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
        if self.pairs && self.current.is_some() {
            self.open_start = self.take_event(dev, deadline)?;
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

    /// After op `seq` was enqueued: records its end event.
    #[allow(clippy::too_many_arguments)]
    pub fn after(
        &mut self,
        dev: &mut dyn Device,
        seq: u64,
        kind: OpKind,
        label: LabelId,
        enqueued_ns: u64,
        b: u64,
        deadline: Instant,
    ) -> Result<(), GpuError> {
        let start = self.open_start.take();
        let Some(anchor) = self.current else {
            self.untimed += 1;
            return Ok(());
        };
        let Some(end) = self.take_event(dev, deadline)? else {
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
        self.pending.push_back(Pending {
            start,
            end,
            kind,
            label,
            seq,
            step: super::current_step(),
            enqueued_ns,
            b,
            anchor,
        });
        self.since_harvest += 1;
        Ok(())
    }

    /// Reads back every op the device has passed, oldest first, and pushes its event.
    pub fn harvest(&mut self, dev: &mut dyn Device) -> Result<(), GpuError> {
        self.since_harvest = 0;
        while let Some(p) = self.pending.front() {
            if !dev.query_event(p.end)? {
                break;
            }
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            let (anchor_ev, anchor_ns) = match self.anchors[p.anchor].as_ref() {
                Some(a) => (a.ev, a.host_ns),
                None => continue,
            };
            let to_ns = |ms: f32| (f64::from(ms) * 1e6).round().max(0.0) as u64;
            let end_ns = anchor_ns + to_ns(dev.event_elapsed_ms(anchor_ev, p.end)?);
            let (start_ns, end_ns) = match p.start {
                Some(s) => {
                    let dur = to_ns(dev.event_elapsed_ms(s, p.end)?);
                    let start = end_ns.saturating_sub(dur).max(self.last_end_ns);
                    (start, end_ns.max(start))
                }
                None => {
                    let start = self.last_end_ns.max(p.enqueued_ns).min(end_ns);
                    (start, end_ns)
                }
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
                b: p.b,
            });
            if let Some(s) = p.start {
                self.free.push(s);
            }
            self.free.push(p.end);
            if let Some(a) = self.anchors[p.anchor].as_mut() {
                a.users = a.users.saturating_sub(1);
            }
            self.release_anchor_if_unused(p.anchor);
        }
        Ok(())
    }
}
