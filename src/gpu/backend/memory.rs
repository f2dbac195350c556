//! What a backend is told and given before it computes: the model's weights as stored
//! ([`WeightData`]) and the memory plan made before the first of them ([`MemoryPlan`]).

use std::sync::Arc;

use super::{BackendError, Result};
use crate::gpu::quant::GgmlType;

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
    /// The widest input of any matrix product (elements per token row).
    pub max_cols: usize,
    /// Elements of all one-row tensors (norms, biases, RoPE factors), which a backend may keep
    /// as f32 whatever their stored type.
    pub vector_elems: u64,
}
