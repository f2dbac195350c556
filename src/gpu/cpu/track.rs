//! The CPU backend's ops in a tracked stream ([`TrackedStream::on_host`]): each op is in the
//! in-flight table while its call runs, so that the process's watchdog names a CPU op that never
//! finishes as it names a GPU kernel. A few atomic stores per op. With tracing on, each op is
//! also a complete event on the stream's track of the timeline (`gpu/trace`), and the pool's
//! threads name their share of it after it (`trace::cpu_op`).

use std::collections::HashMap;
use std::sync::Arc;

use crate::gpu::backend::OpLabel;
use crate::gpu::stream::{Budget, HostOp, LabelId, OpKind, StreamShared, TrackedStream};
use crate::gpu::trace::{self, Cat, Ev, Name, TrackId};

/// The stream's name in the Watchdog panel, the banner and hang reports.
pub const CPU_STREAM: &str = "cpu";

pub struct HostOps {
    stream: TrackedStream,
    labels: HashMap<OpLabel, LabelId>,
    /// The stream's track in the timeline, once traced.
    track: Option<TrackId>,
}

/// A CPU op in flight: in the in-flight table until dropped, and with tracing on an event of the
/// timeline when it ends.
pub struct CpuOp {
    _op: HostOp,
    traced: Option<(TrackId, LabelId, u64, u64, u32)>,
}

impl Drop for CpuOp {
    fn drop(&mut self) {
        if let Some((track, label, seq, start, step)) = self.traced {
            trace::push(Ev {
                track,
                cat: Cat::Op(OpKind::Host),
                name: Name::Label(label),
                start_ns: start,
                dur_ns: trace::now_ns().saturating_sub(start),
                step,
                a: seq,
                b: 0,
            });
        }
    }
}

impl HostOps {
    pub fn new() -> HostOps {
        HostOps {
            stream: TrackedStream::on_host(CPU_STREAM),
            labels: HashMap::new(),
            track: None,
        }
    }

    pub fn shared(&self) -> Arc<StreamShared> {
        self.stream.shared().clone()
    }

    /// Starts op `label` with the default budget; it ends when the guard drops.
    pub fn begin(&mut self, label: OpLabel) -> CpuOp {
        self.begin_budgeted(label, None)
    }

    pub fn begin_budgeted(&mut self, label: OpLabel, budget: Option<Budget>) -> CpuOp {
        let id = match self.labels.get(&label) {
            Some(id) => *id,
            None => {
                let id = self.stream.label(&label.to_string());
                self.labels.insert(label, id);
                id
            }
        };
        let op = self.stream.host_op(id, budget);
        self.traced(op, id)
    }

    /// An op named by text made at run time (`load · blk.3.ffn_up.weight`).
    pub fn begin_named(&mut self, label: &str) -> CpuOp {
        let id = self.stream.label(label);
        let op = self.stream.host_op(id, None);
        self.traced(op, id)
    }

    fn traced(&mut self, op: HostOp, id: LabelId) -> CpuOp {
        if !trace::on() {
            return CpuOp {
                _op: op,
                traced: None,
            };
        }
        let track = *self
            .track
            .get_or_insert_with(|| trace::stream_track(self.stream.shared(), false));
        trace::cpu_op(track, id);
        CpuOp {
            _op: op,
            traced: Some((
                track,
                id,
                self.stream.last_seq(),
                trace::now_ns(),
                trace::current_step(),
            )),
        }
    }
}

impl Default for HostOps {
    fn default() -> Self {
        HostOps::new()
    }
}
