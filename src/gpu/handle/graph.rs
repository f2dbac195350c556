//! Graph replay of a repeated step (the decode step): its launches are recorded on the host
//! instead of enqueued, captured once into a graph (CUDA graphs / HIP graphs) when the step ends,
//! and replayed as one op at every later step whose launches are the same. Values that change
//! from step to step (position, token) are written before each replay into a small device block
//! by `hs_graph_step`, which the kernels read; the same block holds each replay's breadcrumb base
//! (`stream/graph.rs`), so the kernels inside a replay still say which of them runs.
//!
//! A step is only ever deferred, never changed: whatever cannot be put in a graph (an upload, a
//! download, a BLAS call, a wait, another step, a kernel that differs from the captured one)
//! first enqueues what the step recorded, in order, as ordinary tracked launches ("flush"), so
//! the stream runs exactly what it would have run without graphs. Graphs are keyed by the
//! caller's shape bucket (and whether breadcrumbs are on); a key whose launches change at every
//! step turns graphs off, with the reason.

use super::launch::launch_raw;
use super::{Arg, Gpu, KernelFn};
use crate::gpu::arena::DeviceBuffer;
use crate::gpu::device::{DevicePtr, GpuError, RawGraph};
use crate::gpu::stream::graph::{GRAPH_SLOTS, MAX_GRAPH_NODES, crumb_base, node_op};
use crate::gpu::stream::{Budget, LabelId, OpKind};

/// Bytes of the per-step device block: `[0]` breadcrumb base, `[1]` host breadcrumb address,
/// `[2]` position (u32, then 4 spare bytes).
pub(crate) const STEP_BLOCK_BYTES: u64 = 64;
/// Byte offset of the position in the step block.
const POS_OFFSET: u64 = 16;
/// Re-captures of one key without a replay between them before graphs are turned off.
const MAX_RECAPTURES: u32 = 3;

/// Whether graphs are used, and why (the GPU panel and the bench header say it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GraphMode {
    On,
    Off { reason: String },
}

impl GraphMode {
    pub fn is_on(&self) -> bool {
        *self == GraphMode::On
    }

    /// `on` or `off (reason)`.
    pub fn describe(&self) -> String {
        match self {
            GraphMode::On => "on".into(),
            GraphMode::Off { reason } => format!("off ({reason})"),
        }
    }
}

/// Counts for the selftest and the bench header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    pub captures: u64,
    pub replays: u64,
    /// Steps enqueued launch by launch after all (see the module comment).
    pub flushed: u64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum ItemKind {
    Kernel {
        f: KernelFn,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        args: (u32, u32),
    },
    Copy {
        dst: DeviceBuffer,
        src: DeviceBuffer,
        bytes: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Item {
    kind: ItemKind,
    label: LabelId,
    budget: Option<Budget>,
}

/// A recorded list of launches, their arguments stored flat.
#[derive(Clone, Debug, Default)]
struct Recording {
    items: Vec<Item>,
    args: Vec<Arg>,
}

impl Recording {
    fn args_of(&self, it: &Item) -> &[Arg] {
        match it.kind {
            ItemKind::Kernel { args: (s, n), .. } => &self.args[s as usize..(s + n) as usize],
            ItemKind::Copy { .. } => &[],
        }
    }

    /// Whether item `i` is `it`, whose arguments are `args`.
    fn same(&self, i: usize, it: &Item, args: &[Arg]) -> bool {
        let Some(mine) = self.items.get(i) else {
            return false;
        };
        let shape = |k: &ItemKind| match *k {
            ItemKind::Kernel {
                f,
                grid,
                block,
                shared,
                ..
            } => Some((f, grid, block, shared)),
            ItemKind::Copy { .. } => None,
        };
        let same_kind = match (mine.kind, it.kind) {
            (ItemKind::Kernel { .. }, ItemKind::Kernel { .. }) => {
                shape(&mine.kind) == shape(&it.kind)
            }
            (a @ ItemKind::Copy { .. }, b) => a == b,
            _ => false,
        };
        same_kind
            && mine.label == it.label
            && mine.budget == it.budget
            && self.args_of(mine) == args
    }

    /// Appends `it` from recording `from`.
    fn push(&mut self, from: &Recording, it: &Item) {
        self.push_with(it, from.args_of(it));
    }

    /// Appends `it`, whose arguments are `a`.
    fn push_with(&mut self, it: &Item, a: &[Arg]) {
        let mut it = *it;
        let start = self.args.len() as u32;
        let len = a.len() as u32;
        self.args.extend_from_slice(a);
        if let ItemKind::Kernel { ref mut args, .. } = it.kind {
            *args = (start, len);
        }
        self.items.push(it);
    }
}

struct Cached {
    key: u64,
    exec: RawGraph,
    rec: Recording,
    slot: usize,
    label: LabelId,
    budget: Option<Budget>,
    last_used: u64,
    /// Captures of this key since its last replay.
    recaptures: u32,
}

/// The step being recorded.
struct Step {
    key: u64,
    rec: Recording,
    /// The cached graph this step has matched so far (items not copied into `rec`), if any.
    replaying: Option<usize>,
    /// How many of the cached graph's items the step has matched.
    matched: usize,
    pos: Option<u32>,
    token: Option<(DevicePtr, u32)>,
}

/// The graph half of an opened device.
pub(crate) struct Graphs {
    mode: GraphMode,
    block: Option<DeviceBuffer>,
    step: Option<Step>,
    cache: Vec<Cached>,
    uses: u64,
    stats: GraphStats,
    label: Option<LabelId>,
    /// The key the last step ended with (a step starts from it: consecutive steps share it).
    last_key: Option<u64>,
}

impl Graphs {
    pub(crate) fn new(support: Result<(), String>) -> Graphs {
        Graphs {
            mode: match support {
                Ok(()) => GraphMode::On,
                Err(reason) => GraphMode::Off { reason },
            },
            block: None,
            step: None,
            cache: Vec::new(),
            uses: 0,
            stats: GraphStats::default(),
            label: None,
            last_key: None,
        }
    }

    pub(crate) fn set_block(&mut self, b: DeviceBuffer) {
        self.block = Some(b);
    }

    /// The executable graphs, for teardown (after the drain).
    pub(crate) fn take_all(&mut self) -> Vec<RawGraph> {
        self.step = None;
        self.cache.drain(..).map(|c| c.exec).collect()
    }
}

impl Gpu {
    pub fn graph_mode(&self) -> &GraphMode {
        &self.graphs.mode
    }

    pub fn graph_stats(&self) -> GraphStats {
        self.graphs.stats
    }

    /// Turns graphs off (`--no-graphs`, the config key) with the reason shown, or on again where
    /// the runtime supports them. Any step in progress is enqueued first.
    pub fn set_graphs(&mut self, on: bool, reason_off: &str) -> Result<(), GpuError> {
        self.graph_flush()?;
        self.graphs.mode = if !on {
            GraphMode::Off {
                reason: reason_off.to_string(),
            }
        } else {
            match self.backend.graph_support() {
                Ok(()) => GraphMode::On,
                Err(reason) => GraphMode::Off { reason },
            }
        };
        Ok(())
    }

    /// Whether a step is being recorded (kernels then read per-step values from the device).
    pub fn graph_step_active(&self) -> bool {
        self.graphs.step.is_some()
    }

    /// Starts recording a step of shape bucket `bucket`; `false` (nothing recorded) when graphs
    /// are off. A step still being recorded is enqueued first.
    pub fn graph_begin_step(&mut self, bucket: u64) -> Result<bool, GpuError> {
        self.graph_flush()?;
        if !self.graphs.mode.is_on() || self.graphs.block.is_none() {
            return Ok(false);
        }
        self.check_alive()?;
        // Graphs captured with breadcrumbs write them: a change of tracking is another key. The
        // bucket is the caller's, else the last step's (refined by `graph_position`).
        let crumbs = u64::from(self.stream.crumb_arg().is_null());
        let key = match self.graphs.last_key {
            Some(k) if bucket == 0 => (k & !1) | crumbs,
            _ => bucket << 1 | crumbs,
        };
        let replaying = self.graphs.cache.iter().position(|c| c.key == key);
        self.graphs.step = Some(Step {
            key,
            rec: Recording::default(),
            replaying,
            matched: 0,
            pos: None,
            token: None,
        });
        Ok(true)
    }

    /// Where the kernels of the step being recorded read the position (`None`: no step; pass
    /// the position itself). `bucket`, where given, is the shape bucket the position falls in
    /// (the launch grids that depend on it, such as the split count of flash-decoding): the
    /// step's graph is the one captured for that bucket. All position-dependent launches of a step must share
    /// `pos`; another value enqueues the step so far and ends it (the caller then passes its
    /// value directly).
    pub fn graph_position(
        &mut self,
        pos: u32,
        bucket: Option<u64>,
    ) -> Result<Option<DevicePtr>, GpuError> {
        let Some(step) = self.graphs.step.as_mut() else {
            return Ok(None);
        };
        match step.pos {
            Some(p) if p != pos => {
                self.graph_flush()?;
                return Ok(None);
            }
            _ => step.pos = Some(pos),
        }
        let key = bucket.map_or(step.key, |b| b << 1 | (step.key & 1));
        if key != step.key {
            step.key = key;
            let cache = &self.graphs.cache;
            let other = cache.iter().position(|c| c.key == key);
            // What the step holds so far: a matched prefix of a cached graph, or its recording.
            let (have, n) = match step.replaying {
                Some(ci) => (&cache[ci].rec, step.matched),
                None => (&step.rec, step.rec.items.len()),
            };
            // The launches before the first position-dependent one are the same in every
            // bucket; checked, the step follows the bucket's own graph, else it records.
            let same = other.is_some_and(|oi| {
                let b = &cache[oi].rec;
                b.items.len() >= n
                    && (0..n).all(|i| b.same(i, &have.items[i], have.args_of(&have.items[i])))
            });
            if same {
                step.replaying = other;
                step.matched = n;
                step.rec = Recording::default();
            } else if let Some(ci) = step.replaying.take() {
                let c = &cache[ci].rec;
                for prev in &c.items[..step.matched] {
                    step.rec.push(c, prev);
                }
            }
        }
        self.graphs.last_key = Some(step.key);
        Ok(self.graphs.block.map(|b| b.ptr.offset(POS_OFFSET)))
    }

    /// Writes `token` into `dst` (a u32) before the step runs, instead of an upload.
    pub fn graph_token(&mut self, dst: DevicePtr, token: u32) -> bool {
        match self.graphs.step.as_mut() {
            Some(step) => {
                step.token = Some((dst, token));
                true
            }
            None => false,
        }
    }

    /// Records a kernel of the step (`true`), or `false` when no step is being recorded.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn graph_record_kernel(
        &mut self,
        label: LabelId,
        f: KernelFn,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        args: &[Arg],
        budget: Option<Budget>,
    ) -> Result<bool, GpuError> {
        if self.graphs.step.is_none() {
            return Ok(false);
        }
        let it = Item {
            kind: ItemKind::Kernel {
                f,
                grid,
                block,
                shared,
                args: (0, args.len() as u32),
            },
            label,
            budget,
        };
        self.graph_record(it, args)
    }

    pub(super) fn graph_record_copy(
        &mut self,
        label: LabelId,
        dst: DeviceBuffer,
        src: DeviceBuffer,
        bytes: u64,
    ) -> Result<bool, GpuError> {
        if self.graphs.step.is_none() {
            return Ok(false);
        }
        let it = Item {
            kind: ItemKind::Copy { dst, src, bytes },
            label,
            budget: None,
        };
        self.graph_record(it, &[])
    }

    /// Records one item of the step (no allocation while a cached graph keeps matching: a decode
    /// step is a few hundred of these per token, all on the host before the replay starts).
    fn graph_record(&mut self, it: Item, args: &[Arg]) -> Result<bool, GpuError> {
        let Graphs { step, cache, .. } = &mut self.graphs;
        let Some(step) = step.as_mut() else {
            return Ok(false);
        };
        if let Some(ci) = step.replaying {
            let c = &cache[ci].rec;
            if c.same(step.matched, &it, args) {
                step.matched += 1;
                return Ok(true);
            }
            // It differs: the step is recorded afresh from what matched so far.
            for prev in &c.items[..step.matched] {
                step.rec.push(c, prev);
            }
            step.replaying = None;
        }
        if step.rec.items.len() >= MAX_GRAPH_NODES {
            self.graph_flush()?;
            return Ok(false);
        }
        step.rec.push_with(&it, args);
        Ok(true)
    }

    /// Ends the step: replays its graph (capturing it first when new). Nothing to do when no
    /// step is being recorded.
    pub fn graph_end_step(&mut self) -> Result<(), GpuError> {
        let Some(step) = self.graphs.step.take() else {
            return Ok(());
        };
        let ci = match step.replaying {
            Some(ci) if step.matched == self.graphs.cache[ci].rec.items.len() => ci,
            Some(ci) => {
                // A prefix of the cached graph: record it and capture afresh.
                let mut step = step;
                let c = &self.graphs.cache[ci].rec;
                for prev in &c.items[..step.matched] {
                    step.rec.push(c, prev);
                }
                step.replaying = None;
                return self.graph_capture_and_run(step);
            }
            None => return self.graph_capture_and_run(step),
        };
        self.graphs.uses += 1;
        let c = &mut self.graphs.cache[ci];
        c.last_used = self.graphs.uses;
        c.recaptures = 0;
        let (exec, slot, label, budget) = (c.exec, c.slot, c.label, c.budget);
        self.graph_launch(exec, slot, label, budget, step.pos, step.token)?;
        self.graphs.stats.replays += 1;
        Ok(())
    }

    /// Enqueues a step being recorded as ordinary launches and ends it.
    pub fn graph_flush(&mut self) -> Result<(), GpuError> {
        let Some(mut step) = self.graphs.step.take() else {
            return Ok(());
        };
        if let Some(ci) = step.replaying.take() {
            let c = &self.graphs.cache[ci].rec;
            for prev in &c.items[..step.matched] {
                step.rec.push(c, prev);
            }
        }
        if step.rec.items.is_empty() && step.token.is_none() {
            return Ok(());
        }
        self.graphs.stats.flushed += 1;
        self.run_step_eagerly(&step)
    }

    fn run_step_eagerly(&mut self, step: &Step) -> Result<(), GpuError> {
        // The per-step values first: the recorded kernels read them from the device block.
        self.graph_write_step_values(0, 0, step.pos, step.token)?;
        for it in &step.rec.items {
            match it.kind {
                ItemKind::Kernel {
                    f,
                    grid,
                    block,
                    shared,
                    ..
                } => {
                    let args = step.rec.args_of(it);
                    self.launch_now(it.label, f, grid, block, shared, args, it.budget)?;
                }
                ItemKind::Copy { dst, src, bytes } => {
                    self.copy_d2d_now(it.label, dst, src, bytes)?;
                }
            }
        }
        Ok(())
    }

    fn graph_capture_and_run(&mut self, step: Step) -> Result<(), GpuError> {
        if step.rec.items.len() < 2 {
            // Nothing a graph would save.
            return self.run_step_eagerly(&step);
        }
        // A key re-captured again and again changes between steps: graphs would only cost.
        let old = self.graphs.cache.iter().position(|c| c.key == step.key);
        let recaptures = old.map_or(0, |i| self.graphs.cache[i].recaptures + 1);
        if recaptures >= MAX_RECAPTURES {
            self.graphs.mode = GraphMode::Off {
                reason: format!(
                    "the decode step's launches changed at {recaptures} steps in a row; running \
                     launch by launch"
                ),
            };
            tracing::warn!("graphs off: {}", self.graphs.mode.describe());
            self.graph_drop_cached()?;
            return self.run_step_eagerly(&step);
        }
        // A slot for it: the old graph of this key, else a free one, else the least used.
        let slot_of = |cache: &[Cached]| -> (Option<usize>, usize) {
            if let Some(i) = old {
                return (Some(i), cache[i].slot);
            }
            if cache.len() < GRAPH_SLOTS {
                let used: Vec<usize> = cache.iter().map(|c| c.slot).collect();
                let free = (0..GRAPH_SLOTS).find(|s| !used.contains(s)).unwrap_or(0);
                return (None, free);
            }
            let lru = (0..cache.len())
                .min_by_key(|&i| cache[i].last_used)
                .unwrap_or(0);
            (Some(lru), cache[lru].slot)
        };
        let (evict, slot) = slot_of(&self.graphs.cache);
        if let Some(i) = evict {
            // Its replays must have finished before it is destroyed and its labels replaced.
            self.wait_idle(self.cfg.wait_timeout)?;
            let c = self.graphs.cache.swap_remove(i);
            // SAFETY: the stream is idle; the graph is not used again.
            let r = unsafe { self.backend.destroy_graph(c.exec) };
            self.guard(r)?;
        }
        let exec = match self.graph_capture(&step.rec) {
            Ok(g) => g,
            Err(e) => {
                self.graphs.mode = GraphMode::Off {
                    reason: format!("capture failed: {e}"),
                };
                tracing::warn!("graphs off: {}", self.graphs.mode.describe());
                self.graph_drop_cached()?;
                return self.run_step_eagerly(&step);
            }
        };
        let labels: Vec<LabelId> = step.rec.items.iter().map(|i| i.label).collect();
        self.stream.shared().set_graph_nodes(slot, &labels);
        let label = *self
            .graphs
            .label
            .get_or_insert_with(|| self.stream.label("decode step · graph"));
        // The graph's budget: the tightest any of its ops asked for, else the default.
        let budget = step
            .rec
            .items
            .iter()
            .filter_map(|i| i.budget)
            .min_by_key(|b| b.hung);
        self.graphs.uses += 1;
        self.graphs.cache.push(Cached {
            key: step.key,
            exec,
            rec: step.rec,
            slot,
            label,
            budget,
            last_used: self.graphs.uses,
            recaptures,
        });
        self.graphs.stats.captures += 1;
        self.graph_launch(exec, slot, label, budget, step.pos, step.token)?;
        Ok(())
    }

    /// Captures `rec` into an executable graph (nothing runs). Captured kernels get the step
    /// block as their breadcrumb pointer when breadcrumbs are on.
    fn graph_capture(&mut self, rec: &Recording) -> Result<RawGraph, GpuError> {
        let crumb = if self.stream.crumb_arg().is_null() {
            DevicePtr::NULL
        } else {
            self.graphs.block.map_or(DevicePtr::NULL, |b| b.ptr)
        };
        self.backend.begin_capture()?;
        let mut failed = None;
        for (i, it) in rec.items.iter().enumerate() {
            let r = match it.kind {
                ItemKind::Kernel {
                    f,
                    grid,
                    block,
                    shared,
                    ..
                } => {
                    let raw = self.raw_function(f)?;
                    let args = rec.args_of(it);
                    launch_raw(
                        self.backend.as_mut(),
                        raw,
                        grid,
                        block,
                        shared,
                        crumb,
                        node_op(i),
                        args,
                    )
                }
                // SAFETY: both ranges were checked against their arena buffers when recorded.
                ItemKind::Copy { dst, src, bytes } => unsafe {
                    self.backend.copy_d2d(dst.ptr, src.ptr, bytes as usize)
                },
            };
            if let Err(e) = r {
                failed = Some(e);
                break;
            }
        }
        // Always leave capture mode, whatever failed inside it.
        let end = self.backend.end_capture();
        match (failed, end) {
            (Some(e), Ok(g)) => {
                // SAFETY: never launched.
                let _ = unsafe { self.backend.destroy_graph(g) };
                Err(e)
            }
            (Some(e), Err(_)) | (None, Err(e)) => Err(e),
            (None, Ok(g)) => Ok(g),
        }
    }

    /// `hs_graph_step` (the step's values and the replay's breadcrumb base), then the graph.
    fn graph_launch(
        &mut self,
        exec: RawGraph,
        slot: usize,
        label: LabelId,
        budget: Option<Budget>,
        pos: Option<u32>,
        token: Option<(DevicePtr, u32)>,
    ) -> Result<(), GpuError> {
        // The graph op is the one after the setter.
        let graph_seq = self.stream.next_seq() + 1;
        self.graph_write_step_values(graph_seq, slot, pos, token)?;
        let kernels = self.stream.shared().graph_node_count(slot) as u64;
        self.enqueue_traced(
            OpKind::Graph,
            label,
            budget,
            (slot as u64) << 32 | kernels,
            false,
            |be, _, _| {
                // SAFETY: an executable graph of this backend; its buffers live in the arena.
                unsafe { be.launch_graph(exec) }
            },
        )?;
        Ok(())
    }

    fn graph_write_step_values(
        &mut self,
        graph_seq: u64,
        slot: usize,
        pos: Option<u32>,
        token: Option<(DevicePtr, u32)>,
    ) -> Result<(), GpuError> {
        let Some(block) = self.graphs.block else {
            return Ok(());
        };
        let f = self.function("hs_graph_step")?;
        let host_crumb = self
            .crumb
            .as_ref()
            .and_then(|c| c.device)
            .unwrap_or_default();
        let (tok_dst, tok) = token.unwrap_or((DevicePtr::NULL, 0));
        let l = self.label("decode step · position, token");
        self.launch_now(
            l,
            f,
            [1, 1, 1],
            [32, 1, 1],
            0,
            &[
                Arg::Ptr(block.ptr),
                Arg::U64(crumb_base(graph_seq, slot)),
                Arg::Ptr(host_crumb),
                Arg::U32(pos.unwrap_or(0)),
                Arg::Ptr(tok_dst),
                Arg::U32(tok),
            ],
            None,
        )?;
        Ok(())
    }

    fn graph_drop_cached(&mut self) -> Result<(), GpuError> {
        if self.graphs.cache.is_empty() {
            return Ok(());
        }
        self.wait_idle(self.cfg.wait_timeout)?;
        for c in std::mem::take(&mut self.graphs.cache) {
            // SAFETY: the stream is idle; the graph is not used again.
            let r = unsafe { self.backend.destroy_graph(c.exec) };
            self.guard(r)?;
        }
        Ok(())
    }
}
