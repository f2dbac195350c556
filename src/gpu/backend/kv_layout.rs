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
    /// The last entry of `slots` is a stage: a whole-context layer that every layer outside
    /// this part maps to ([`KvLayout::part_with_stage`]).
    stage: bool,
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
        l.stage = self.stage;
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
            stage: false,
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
        if lo >= hi {
            return None;
        }
        self.part_of(layers, Vec::new())
    }

    /// [`KvLayout::part`] (possibly of no layer) plus a stage: one more layer keeping the whole
    /// context, which every layer outside `layers` maps to. Op offload's attention of a layer
    /// another part of a split model keeps runs there, over rows borrowed from that part
    /// (`model/split/`).
    pub fn part_with_stage(&self, layers: std::ops::Range<usize>) -> Option<KvLayout> {
        let mut p = self.part_of(layers, vec![self.n_ctx])?;
        p.stage = true;
        Some(p)
    }

    fn part_of(&self, layers: std::ops::Range<usize>, extra: Vec<usize>) -> Option<KvLayout> {
        let lo = layers.start.checked_sub(self.first)?;
        let hi = layers.end.checked_sub(self.first)?;
        if lo > hi || hi > self.own_layers() {
            return None;
        }
        let mut slots = self.slots[lo..hi].to_vec();
        slots.extend(extra);
        let mut p = KvLayout::build(self.n_ctx, self.kv_dim, self.n_seq, slots).ok()?;
        p.first = layers.start;
        Some(p)
    }

    /// The layers this layout keeps as their own (not the stage).
    fn own_layers(&self) -> usize {
        self.slots.len() - usize::from(self.stage)
    }

    /// Index into `slots` of layer `l`: its own, else the stage where there is one.
    fn index(&self, l: usize) -> Option<usize> {
        match l.checked_sub(self.first) {
            Some(i) if i < self.own_layers() => Some(i),
            _ if self.stage => Some(self.slots.len() - 1),
            _ => None,
        }
    }

    /// Whether layer `l` is one of this layout's own (not the stage's).
    pub fn keeps(&self, l: usize) -> bool {
        l.checked_sub(self.first)
            .is_some_and(|i| i < self.own_layers())
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

    /// Layers of the cache, the stage counted.
    pub fn n_layers(&self) -> usize {
        self.slots.len()
    }

    /// Positions layer `l` keeps (0 for a layer that does not exist here); a layer outside a
    /// part with a stage keeps the stage's.
    pub fn slots(&self, l: usize) -> usize {
        self.index(l).map_or(0, |i| self.slots[i])
    }

    /// First element of layer `l` in the keys (and in the values).
    pub fn offset(&self, l: usize) -> usize {
        self.index(l).map_or(0, |i| self.offsets[i])
    }

    /// Where the rows of positions `pos` of sequence `seq` of layer `l` lie in the keys (and
    /// the values), in position order: (first element, index of its first row in `pos`, rows),
    /// one run, or two where a ring wraps. Of more positions than the layer keeps, the last
    /// `slots` (what storing them in turn would leave).
    pub fn row_runs(
        &self,
        l: usize,
        seq: usize,
        pos: std::ops::Range<usize>,
    ) -> Result<Vec<(usize, usize, usize)>> {
        let slots = self.slots(l);
        if slots == 0 || seq >= self.n_seq || pos.end > self.n_ctx || pos.start > pos.end {
            return Err(BackendError::Invalid(format!(
                "KV rows {}..{} of layer {l} sequence {seq} do not fit the KV cache ({} \
                 sequences, this layer {slots} positions, context {})",
                pos.start, pos.end, self.n_seq, self.n_ctx
            )));
        }
        let skip = pos.len().saturating_sub(slots);
        let base = self.seq_offset(l, seq);
        let mut runs = Vec::with_capacity(2);
        let (mut p, mut row) = (pos.start + skip, skip);
        while p < pos.end {
            let slot = p % slots;
            let n = (slots - slot).min(pos.end - p);
            runs.push((base + slot * self.kv_dim, row, n));
            p += n;
            row += n;
        }
        Ok(runs)
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

    #[test]
    fn a_stage_takes_every_layer_outside_the_part_and_rows_wrap_with_a_ring() {
        let full = KvLayout::new(12, 2, vec![12, 5, 12]).unwrap();
        let p = full.part_with_stage(1..2).unwrap();
        assert_eq!((p.n_layers(), p.slots(1), p.offset(1)), (2, 5, 0));
        // Layers 0 and 2 (and any other) are the stage's: the whole context after layer 1.
        assert_eq!((p.slots(0), p.offset(0), p.offset(2)), (12, 5 * 2, 5 * 2));
        assert_eq!(p.elems(), (5 + 12) * 2);
        assert!(p.keeps(1) && !p.keeps(0) && !p.keeps(2));
        // A part of no layer is the stage alone.
        let only = full.part_with_stage(3..3).unwrap();
        assert_eq!((only.elems(), only.slots(0)), (12 * 2, 12));
        assert!(full.part(3..3).is_none());
        // Positions 3..9 of the ring of 5: slots 3, 4, then 0..2 — the last 5 of 6 positions
        // (4..9), their first at row 1 of the range.
        assert_eq!(
            p.row_runs(1, 0, 3..9).unwrap(),
            vec![(4 * 2, 1, 1), (0, 2, 4)]
        );
        assert_eq!(p.row_runs(0, 0, 2..6).unwrap(), vec![(10 + 2 * 2, 0, 4)]);
        assert!(p.row_runs(0, 0, 10..13).is_err(), "past the context");
        assert!(p.row_runs(1, 1, 0..1).is_err(), "one sequence");
        assert!(
            full.part(1..2).unwrap().row_runs(0, 0, 0..1).is_err(),
            "no stage"
        );
    }
}
