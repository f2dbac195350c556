//! Graph replay as the stream sees it. A replayed graph is one op ([`OpKind::Graph`]) in the
//! in-flight table; its kernels still write breadcrumbs, but the value a captured kernel was
//! given (`hs_op`) is baked into the graph and repeats at every replay. So a captured kernel gets
//! `GRAPH_CRUMB | node` as `hs_op` and, as its breadcrumb pointer, a small device block written
//! before each replay: the replay's base (this encoding of the graph op's seq and the graph's
//! slot) and the host breadcrumb's address. It writes `base + node` (`HS_BREADCRUMB` in
//! `kernels/prelude.h`), which names the replay, the graph and the kernel inside it. The graph's
//! node labels live here, readable without a lock, so the Streams panel and the watchdog name the
//! kernel that runs inside the graph.
//!
//! [`OpKind::Graph`]: super::OpKind::Graph

use std::sync::atomic::{AtomicU32, Ordering};

use super::LabelId;

/// Set in a breadcrumb written by a kernel inside a replayed graph.
pub const GRAPH_CRUMB: u64 = 1 << 63;
/// Graphs whose node labels are kept at once (one per shape bucket in use).
pub const GRAPH_SLOTS: usize = 8;
/// Kernels one graph may hold (its node index has `NODE_BITS` bits).
pub const MAX_GRAPH_NODES: usize = 1 << NODE_BITS;
const NODE_BITS: u32 = 12;
const SLOT_BITS: u32 = 3;
const SEQ_SHIFT: u32 = NODE_BITS + SLOT_BITS;
const _: () = assert!(GRAPH_SLOTS == 1 << SLOT_BITS);

/// The base a replay's kernels add their node index to: the graph op's `seq`, its `slot`.
pub fn crumb_base(seq: u64, slot: usize) -> u64 {
    GRAPH_CRUMB | (seq << SEQ_SHIFT) | ((slot as u64) << NODE_BITS)
}

/// The `hs_op` a captured kernel gets: its node index, flagged.
pub fn node_op(node: usize) -> u64 {
    GRAPH_CRUMB | node as u64
}

/// Where a breadcrumb written inside a replayed graph points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphCrumb {
    /// The graph op's seq.
    pub seq: u64,
    pub slot: usize,
    /// The kernel (node index, in capture order) that has started.
    pub node: usize,
}

impl GraphCrumb {
    /// `None` for an ordinary breadcrumb (the seq of a kernel launched on its own).
    pub fn decode(crumb: u64) -> Option<GraphCrumb> {
        if crumb & GRAPH_CRUMB == 0 {
            return None;
        }
        Some(GraphCrumb {
            seq: (crumb & !GRAPH_CRUMB) >> SEQ_SHIFT,
            slot: ((crumb >> NODE_BITS) & ((1 << SLOT_BITS) - 1)) as usize,
            node: (crumb & ((1 << NODE_BITS) - 1)) as usize,
        })
    }
}

/// The node labels of each graph slot. A slot is rewritten only when its graph is replaced,
/// which happens only with no replay of it in flight.
pub(crate) struct GraphNodes {
    labels: Box<[AtomicU32]>,
    lens: [AtomicU32; GRAPH_SLOTS],
}

impl GraphNodes {
    pub(crate) fn new() -> GraphNodes {
        GraphNodes {
            labels: (0..GRAPH_SLOTS * MAX_GRAPH_NODES)
                .map(|_| AtomicU32::new(0))
                .collect(),
            lens: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    pub(crate) fn set(&self, slot: usize, nodes: &[LabelId]) {
        let n = nodes.len().min(MAX_GRAPH_NODES);
        self.lens[slot].store(0, Ordering::Release);
        for (i, l) in nodes[..n].iter().enumerate() {
            self.labels[slot * MAX_GRAPH_NODES + i].store(l.0, Ordering::Relaxed);
        }
        self.lens[slot].store(n as u32, Ordering::Release);
    }

    pub(crate) fn get(&self, slot: usize, node: usize) -> Option<LabelId> {
        let len = self.lens.get(slot)?.load(Ordering::Acquire) as usize;
        if node >= len {
            return None;
        }
        Some(LabelId(
            self.labels[slot * MAX_GRAPH_NODES + node].load(Ordering::Relaxed),
        ))
    }

    pub(crate) fn len(&self, slot: usize) -> usize {
        self.lens
            .get(slot)
            .map_or(0, |l| l.load(Ordering::Acquire) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graph_breadcrumb_names_its_replay_slot_and_node() {
        let base = crumb_base(123_456, 5);
        let written = base + (node_op(77) & !GRAPH_CRUMB);
        assert_eq!(
            GraphCrumb::decode(written),
            Some(GraphCrumb {
                seq: 123_456,
                slot: 5,
                node: 77
            })
        );
        // An ordinary breadcrumb is a plain seq.
        assert_eq!(GraphCrumb::decode(123_456), None);
    }

    #[test]
    fn node_labels_are_read_per_slot_and_bounded() {
        let g = GraphNodes::new();
        g.set(2, &[LabelId(4), LabelId(9)]);
        assert_eq!(g.get(2, 1), Some(LabelId(9)));
        assert_eq!(g.get(2, 2), None);
        assert_eq!(g.get(3, 0), None);
        assert_eq!(g.len(2), 2);
        assert_eq!(g.get(GRAPH_SLOTS, 0), None);
    }
}
