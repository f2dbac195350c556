//! The KV cache's element type ([`KvType`]), its shape layer by layer with the ring of a
//! sliding-window layer ([`KvLayout`]), and a context shift's move ([`KvShift`]).

use super::{AttnParams, BackendError, Result, RopeParams};

/// Element type of the KV cache, on every backend (`--kv-type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    F32,
    /// Half the memory and bandwidth of f32, as llama.cpp keeps it by default.
    #[default]
    F16,
}

impl KvType {
    pub fn bytes(self) -> u64 {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
        }
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            other => Err(format!("unknown KV cache type {other:?} (f32 or f16)")),
        }
    }
}

/// The KV cache's shape: for each layer, the positions it keeps, of `kv_dim` keys and as many
/// values. A global layer keeps the whole context; a sliding-window layer keeps a ring of its
/// window plus a batch (position p lives in slot p mod slots), which is all its attention can
/// read.
///
/// A cache may hold several sequences (`hipscope serve`'s slots, [`KvLayout::with_seqs`]): each
/// layer's region is then `n_seq` regions of its positions, sequence `s` at
/// [`KvLayout::seq_offset`], each with its own ring. One sequence is the chat's layout, element
/// for element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// The model's layer number of this layout's first layer: 0, or where a split model's
    /// part starts ([`KvLayout::part`]).
    first: usize,
    n_ctx: usize,
    kv_dim: usize,
    n_seq: usize,
    slots: Vec<usize>,
    /// Element offset of each layer, and the total after the last.
    offsets: Vec<usize>,
}

impl KvLayout {
    /// `slots[l]` positions for layer `l` (each at most `n_ctx`); an error if the sizes
    /// overflow.
    pub fn new(n_ctx: usize, kv_dim: usize, slots: Vec<usize>) -> Result<KvLayout> {
        KvLayout::build(n_ctx, kv_dim, 1, slots)
    }

    /// This layout for `n_seq` sequences (at least 1), each with the positions one had.
    pub fn with_seqs(self, n_seq: usize) -> Result<KvLayout> {
        let mut l = KvLayout::build(self.n_ctx, self.kv_dim, n_seq.max(1), self.slots)?;
        l.first = self.first;
        Ok(l)
    }

    fn build(n_ctx: usize, kv_dim: usize, n_seq: usize, slots: Vec<usize>) -> Result<KvLayout> {
        let mut offsets = Vec::with_capacity(slots.len() + 1);
        let mut at = 0usize;
        for &s in &slots {
            if s == 0 || s > n_ctx {
                return Err(BackendError::Invalid(format!(
                    "a KV cache layer of {s} positions in a context of {n_ctx}"
                )));
            }
            offsets.push(at);
            at = s
                .checked_mul(kv_dim)
                .and_then(|n| n.checked_mul(n_seq))
                .and_then(|n| n.checked_add(at))
                .ok_or_else(|| BackendError::OutOfMemory("KV cache size overflows".into()))?;
        }
        offsets.push(at);
        Ok(KvLayout {
            first: 0,
            n_ctx,
            kv_dim,
            n_seq,
            slots,
            offsets,
        })
    }

    /// Every one of `n_layers` layers keeps the whole context.
    pub fn uniform(n_layers: usize, n_ctx: usize, kv_dim: usize) -> Result<KvLayout> {
        KvLayout::new(n_ctx, kv_dim, vec![n_ctx; n_layers])
    }

    /// The layers `layers` of this layout, still numbered as the model numbers them (a split
    /// model's GPU part keeps layers 17.. as 17..); `None` for an empty or out-of-range part.
    pub fn part(&self, layers: std::ops::Range<usize>) -> Option<KvLayout> {
        let lo = layers.start.checked_sub(self.first)?;
        let hi = layers.end.checked_sub(self.first)?;
        if lo >= hi || hi > self.slots.len() {
            return None;
        }
        let mut p = KvLayout::build(
            self.n_ctx,
            self.kv_dim,
            self.n_seq,
            self.slots[lo..hi].to_vec(),
        )
        .ok()?;
        p.first = layers.start;
        Some(p)
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Sequences the cache holds (1: the chat's).
    pub fn n_seq(&self) -> usize {
        self.n_seq
    }

    pub fn n_layers(&self) -> usize {
        self.slots.len()
    }

    /// Positions layer `l` keeps (0 for a layer that does not exist here).
    pub fn slots(&self, l: usize) -> usize {
        l.checked_sub(self.first)
            .and_then(|i| self.slots.get(i))
            .copied()
            .unwrap_or(0)
    }

    /// First element of layer `l` in the keys (and in the values).
    pub fn offset(&self, l: usize) -> usize {
        l.checked_sub(self.first)
            .and_then(|i| self.offsets.get(i))
            .copied()
            .unwrap_or(0)
    }

    /// First element of sequence `seq` of layer `l` (sequence 0 at [`KvLayout::offset`]).
    pub fn seq_offset(&self, l: usize, seq: usize) -> usize {
        self.offset(l) + seq * self.slots(l) * self.kv_dim
    }

    /// Elements of the keys (as many again for the values).
    pub fn elems(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }

    /// Every layer keeps the whole context of one sequence (what a context shift needs).
    pub fn is_uniform(&self) -> bool {
        self.n_seq == 1 && self.slots.iter().all(|&s| s == self.n_ctx)
    }

    /// Checks an attention call against layer `p.layer`: the positions fit the context, and a
    /// ring is wide enough that the batch's first token still finds its window after the batch's
    /// keys went in.
    pub fn check_attention(&self, p: &AttnParams) -> Result<()> {
        let slots = self.slots(p.layer);
        let kv_dim = p.n_kv_heads * p.head_dim;
        let ring_ok = slots == self.n_ctx || (p.window > 0 && p.window + p.n_tokens <= slots + 1);
        if kv_dim != self.kv_dim
            || p.seq >= self.n_seq
            || slots == 0
            || p.n_kv_heads == 0
            || p.pos0 + p.n_tokens > self.n_ctx
            || !ring_ok
        {
            return Err(BackendError::Invalid(format!(
                "attention at layer {} sequence {} positions {}..{} (window {}) does not fit the \
                 KV cache ({} layers of {} sequences, this one {slots} positions of {}, context {})",
                p.layer,
                p.seq,
                p.pos0,
                p.pos0 + p.n_tokens,
                p.window,
                self.n_layers(),
                self.n_seq,
                self.kv_dim,
                self.n_ctx
            )));
        }
        Ok(())
    }
}

/// A context shift: in every layer's cache, positions `src..src + n` move down to
/// `dst..dst + n` (`dst < src`) and their keys are rotated by `dst − src` positions. RoPE is a
/// rotation by an angle linear in the position, so rotating a key stored at `p` by `δ` gives the
/// key a recompute at `p + δ` would store, to the rounding of the cache's element type
/// (llama.cpp's K-shift). Values carry no position and only move.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvShift {
    pub dst: usize,
    pub src: usize,
    pub n: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rope: RopeParams,
}

impl KvShift {
    /// The rotation applied to the keys, in positions (negative: they move down).
    pub fn delta(&self) -> f32 {
        -((self.src - self.dst) as f32)
    }

    /// Checks the move against a cache of `n_ctx` positions of `kv_dim`, before anything moves.
    pub fn check(&self, n_ctx: usize, kv_dim: usize) -> Result<()> {
        self.rope.pairs(self.head_dim)?;
        if self.dst >= self.src
            || self.src + self.n > n_ctx
            || self.n_kv_heads * self.head_dim != kv_dim
        {
            return Err(BackendError::Invalid(format!(
                "KV shift of positions {}..{} to {} does not fit the KV cache ({n_ctx} positions of {kv_dim})",
                self.src,
                self.src + self.n,
                self.dst
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_follow_each_other_within_a_layer_and_one_is_the_old_layout() {
        let one = KvLayout::new(10, 4, vec![10, 6]).unwrap();
        assert_eq!(one.clone().with_seqs(1).unwrap(), one);
        let three = one.with_seqs(3).unwrap();
        assert_eq!(three.n_seq(), 3);
        assert_eq!(three.seq_offset(0, 2), 2 * 10 * 4);
        assert_eq!(three.offset(1), 3 * 10 * 4);
        assert_eq!(three.seq_offset(1, 1), 3 * 10 * 4 + 6 * 4);
        assert_eq!(three.elems(), 3 * (10 + 6) * 4);
        assert!(!three.is_uniform(), "a shift moves one sequence only");
        let part = three.part(1..2).unwrap();
        assert_eq!((part.n_seq(), part.seq_offset(1, 2)), (3, 2 * 6 * 4));
    }
}
