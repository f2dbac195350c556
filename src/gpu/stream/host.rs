//! A tracked stream for ops that run on the thread that issues them — the CPU backend's — so that
//! the one watchdog judges them as it judges a GPU's: each op is written into the in-flight
//! table when it starts and completed when its call returns.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Budget, LabelId, OpKind, StreamShared, TrackedStream};
use crate::gpu::device::DevicePtr;

impl TrackedStream {
    /// A stream without a device: no event pool and no breadcrumb (nothing runs asynchronously).
    pub fn on_host(name: &str) -> TrackedStream {
        let shared = Arc::new(StreamShared::new(name));
        let _ = shared.labels.slots[0].set("(label table full)".into());
        shared.labels.len.store(1, Ordering::Release);
        TrackedStream {
            shared,
            label_ids: HashMap::new(),
            next_seq: 1,
            pending: VecDeque::new(),
            free_events: Vec::new(),
            last_event_covers: 0,
            ops_since_event: 0,
            auto_event_interval: u32::MAX,
            default_budget: Budget::DEFAULT,
            crumb_device: DevicePtr::NULL,
            breadcrumbs: false,
        }
    }

    /// Starts a host op: it is in flight (and running) until the returned guard is dropped.
    pub fn host_op(&mut self, label: LabelId, budget: Option<Budget>) -> HostOp {
        let seq = self.begin(OpKind::Host, label, budget);
        self.commit(seq);
        HostOp {
            shared: self.shared.clone(),
            seq,
        }
    }
}

/// A host op in flight; dropping it (the op's call returned, or failed) completes it.
pub struct HostOp {
    shared: Arc<StreamShared>,
    seq: u64,
}

impl Drop for HostOp {
    fn drop(&mut self) {
        self.shared.advance_completed(self.seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_host_op_is_in_flight_until_its_guard_drops() {
        let mut s = TrackedStream::on_host("cpu");
        let l = s.label("layer 0 · matmul");
        let op = s.host_op(l, None);
        let shared = s.shared().clone();
        assert_eq!(shared.queue_depth(), 1);
        let head = shared.op(shared.completed() + 1).expect("in the table");
        assert_eq!(head.label, "layer 0 · matmul");
        assert_eq!(head.kind, OpKind::Host);
        assert_eq!(head.budget, Budget::DEFAULT);
        drop(op);
        assert_eq!(shared.queue_depth(), 0);
        assert_eq!(
            shared.op(shared.completed()).map(|o| o.label).as_deref(),
            Some("layer 0 · matmul")
        );
        let b = Budget {
            slow: Duration::from_millis(1),
            hung: Duration::from_millis(2),
        };
        let _op = s.host_op(l, Some(b));
        assert_eq!(shared.op(2).map(|o| o.budget), Some(b));
    }
}
