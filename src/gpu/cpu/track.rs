//! The CPU backend's ops in a tracked stream ([`TrackedStream::on_host`]): each op is in the
//! in-flight table while its call runs, so that the process's watchdog names a CPU op that never
//! finishes as it names a GPU kernel. A few atomic stores per op.

use std::collections::HashMap;
use std::sync::Arc;

use crate::gpu::backend::OpLabel;
use crate::gpu::stream::{Budget, HostOp, LabelId, StreamShared, TrackedStream};

/// The stream's name in the Watchdog panel, the banner and hang reports.
pub const CPU_STREAM: &str = "cpu";

pub struct HostOps {
    stream: TrackedStream,
    labels: HashMap<OpLabel, LabelId>,
}

impl HostOps {
    pub fn new() -> HostOps {
        HostOps {
            stream: TrackedStream::on_host(CPU_STREAM),
            labels: HashMap::new(),
        }
    }

    pub fn shared(&self) -> Arc<StreamShared> {
        self.stream.shared().clone()
    }

    /// Starts op `label` with the default budget; it ends when the guard drops.
    pub fn begin(&mut self, label: OpLabel) -> HostOp {
        self.begin_budgeted(label, None)
    }

    pub fn begin_budgeted(&mut self, label: OpLabel, budget: Option<Budget>) -> HostOp {
        let id = match self.labels.get(&label) {
            Some(id) => *id,
            None => {
                let id = self.stream.label(&label.to_string());
                self.labels.insert(label, id);
                id
            }
        };
        self.stream.host_op(id, budget)
    }

    /// An op named by text made at run time (`load · blk.3.ffn_up.weight`).
    pub fn begin_named(&mut self, label: &str) -> HostOp {
        let id = self.stream.label(label);
        self.stream.host_op(id, None)
    }
}

impl Default for HostOps {
    fn default() -> Self {
        HostOps::new()
    }
}
