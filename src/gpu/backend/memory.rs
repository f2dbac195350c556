//! What a backend holds and how data gets in and out ([`Memory`]): the model's weights as
//! stored ([`WeightData`]), the memory plan made before the first of them ([`MemoryPlan`]), the
//! activation buffers and the KV cache.

use std::sync::Arc;

use super::kv_layout::{KvLayout, KvShift, KvType};
use super::{BackendError, Buf, OpLabel, Result, Weight};
use crate::gpu::quant::GgmlType;
use crate::gpu::snapshot::ArenaSnapshot;

/// The memory side of a backend: the plan, the weights, the activation buffers and the KV cache,
/// and the copies between them and the host. No method has a default body, so that a wrapper
/// passes each on to what it wraps.
pub trait Memory {
    /// Told once, before any weight or buffer, how much the model will need.
    fn plan(&mut self, plan: &MemoryPlan) -> Result<()>;

    /// Bytes of device memory this backend would set aside for `plan` (its arena), for deciding
    /// how many layers fit (`-ngl auto`); `None` where the backend has no device memory.
    fn plan_bytes(&self, plan: &MemoryPlan) -> Option<u64>;

    /// Takes a weight (checked: `len` matches the shape and type, the range lies in storage).
    fn load_weight(&mut self, data: &WeightData) -> Result<Weight>;

    /// An f32 buffer of `len` elements (zeroed).
    fn alloc(&mut self, name: &'static str, len: usize) -> Result<Buf>;

    /// The KV cache, layer by layer as `layout` says.
    fn alloc_kv_cache(&mut self, layout: &KvLayout) -> Result<()>;

    /// The element type its KV cache is allocated in (so that the CPU part of a split model
    /// keeps the GPU part's).
    fn kv_type(&self) -> KvType;

    /// Moves cached keys and values down in every layer and re-rotates the keys for their new
    /// positions (see [`KvShift`]).
    fn kv_shift(&mut self, s: &KvShift) -> Result<()>;

    /// Waits for every op before it and copies `out.len()` elements from `buf[offset..]`.
    fn read(&mut self, buf: Buf, offset: usize, out: &mut [f32]) -> Result<()>;

    /// Overwrites `buf[offset..offset + data.len()]` with `data`, after every op before it (the
    /// hand-over of activations between the two backends of a split model); an `Unsupported`
    /// error from a backend that cannot take activations from another.
    fn write(&mut self, buf: Buf, offset: usize, data: &[f32]) -> Result<()>;

    /// One crossing of a model split over several devices, its sending half: `read` of
    /// `buf[..out.len()]` as one op labelled `label` on this backend's stream (`cross 0→1`), so
    /// that the Streams panel and the watchdog see it on both devices.
    fn cross_out(&mut self, buf: Buf, out: &mut [f32], label: OpLabel) -> Result<()>;

    /// The receiving half of a crossing: `write` of `data` to `buf[..data.len()]` as one op
    /// labelled `label` on this backend's stream.
    fn cross_in(&mut self, buf: Buf, data: &[f32], label: OpLabel) -> Result<()>;

    /// Weights another part of a split model keeps, put where this backend's next ops read
    /// them (op offload: a prompt batch's CPU layers run on the GPU, `model/split/`), into the
    /// room [`MemoryPlan::stage_bytes`] set aside. The handles hold until the next call, which
    /// reuses that room: a backend whose ops run in order on one stream needs no more than that
    /// order to keep the next op's copy from overwriting what the previous op reads.
    fn stage_weights(&mut self, data: &[WeightData]) -> Result<Vec<Weight>>;

    /// Lets this backend's [`Memory::stage_weights`] read `storage`'s bytes `range` where they
    /// lie (a GPU registers them with its runtime, so that streaming a weight from there is one
    /// asynchronous copy, no copy into its staging first); `Ok(false)`: it copies them as before.
    fn pin_host(&mut self, storage: &SharedBytes, range: std::ops::Range<usize>) -> Result<bool>;

    /// The cached keys and values of positions `pos` of sequence `seq` at layer `layer`, as the
    /// cache keeps them ([`Memory::kv_type`]'s little-endian elements): every position's keys,
    /// then every position's values, `kv_dim` elements each, into `out` (resized). Op
    /// offload's attention borrows a layer's rows through it (`model/split/`); a ring keeps its
    /// last positions only, which the caller asks for.
    fn kv_rows_out(
        &mut self,
        layer: usize,
        seq: usize,
        pos: std::ops::Range<usize>,
        out: &mut Vec<u8>,
    ) -> Result<()>;

    /// Overwrites the cached rows of positions `pos0..` of sequence `seq` at layer `layer` with
    /// `data`, laid out as [`Memory::kv_rows_out`] gives them (of more positions than a ring
    /// keeps, the last land), after every op before it.
    fn kv_rows_in(&mut self, layer: usize, seq: usize, pos0: usize, data: &[u8]) -> Result<()>;

    /// Memory held by the backend, for the UI.
    fn arena(&self) -> ArenaSnapshot;
}

/// Puts `w` in the `i`th slot a backend's [`Memory::stage_weights`] fills at every call (its
/// index in `weights`, recorded in `staged` the first time), so that streaming never grows the
/// backend's weight table; returns its index.
pub fn stage_slot<W>(weights: &mut Vec<W>, staged: &mut Vec<usize>, i: usize, w: W) -> usize {
    match staged.get(i) {
        Some(&k) => {
            weights[k] = w;
            k
        }
        None => {
            weights.push(w);
            staged.push(weights.len() - 1);
            weights.len() - 1
        }
    }
}

/// Bytes that outlive any borrower: a memory-mapped model file, or one built in memory.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A weight as stored in the model file: `rows` rows of `cols` elements of type `ty` (GGUF dims
/// `[cols, rows]`) at `storage[offset..offset + len]`. The CPU backend keeps pointing into the
/// storage (no copy of a memory-mapped file); GPU backends upload it.
#[derive(Clone)]
pub struct WeightData<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub storage: &'a SharedBytes,
    pub offset: usize,
    pub len: usize,
}

impl WeightData<'_> {
    pub fn bytes(&self) -> &[u8] {
        &(**self.storage).as_ref()[self.offset..self.offset + self.len]
    }

    /// Checks that `len` bytes hold `rows × cols` elements of `ty` and that the range lies in the
    /// storage, before any backend trusts them.
    pub fn check(&self) -> Result<()> {
        let expected = self
            .cols
            .checked_mul(self.rows)
            .and_then(|n| self.ty.bytes_for(n as u64));
        let in_storage = self
            .offset
            .checked_add(self.len)
            .is_some_and(|end| end <= (**self.storage).as_ref().len());
        if expected != Some(self.len as u64) || !in_storage {
            return Err(BackendError::Invalid(format!(
                "tensor {}: {} bytes do not hold {} × {} {}",
                self.name, self.len, self.rows, self.cols, self.ty
            )));
        }
        Ok(())
    }
}

/// What a model will ask of a backend, known before its first weight is loaded, so that a GPU
/// backend can make its few large allocations up front (and refuse at once, with the numbers, a
/// model that does not fit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Bytes of all weights, as stored.
    pub weights: u64,
    /// Number of weight tensors.
    pub weight_tensors: usize,
    /// f32 elements of all activation buffers.
    pub activation_elems: u64,
    /// KV cache: the positions of every layer ([`KvLayout`]) × kv_dim, for keys and for values
    /// each.
    pub kv_elems: u64,
    /// Most tokens in one forward step (the width of a prompt batch).
    pub n_batch: usize,
    /// Sequences the KV cache holds (`serve`'s slots; 1 for a chat).
    pub n_seq: usize,
    /// The widest input of any matrix product (elements per token row).
    pub max_cols: usize,
    /// Elements of all one-row tensors (norms, biases, RoPE factors), which a backend may keep
    /// as f32 whatever their stored type.
    pub vector_elems: u64,
    /// Room for the weights of one op streamed in from another part of a split model
    /// ([`Memory::stage_weights`]); 0 where nothing is.
    pub stage_bytes: u64,
}
