//! Op offload's side of [`SplitBackend`]: where a CPU layer's op of a large batch runs
//! (`offload`, `attn_side`), the weights it lacks streamed to GPU 0 (`weights_at`, from the
//! registered file in place once `pin_streamed` registered it), and the KV rows its attention
//! borrows into GPU 0's stage and returns (`borrow_kv`, `return_kv`).

use std::sync::Arc;

use super::{Side, SplitBackend, part};
use crate::gpu::backend::{AttnParams, BackendError, Result, SharedBytes, Weight, WeightData};

impl SplitBackend {
    /// Where an op that would run on `s` runs for a batch of `n_tokens`: on GPU 0 for a CPU op
    /// of a batch large enough under op offload ([`Placement::op_offload`]), else on `s`.
    pub(super) fn offload(&self, s: Side, n_tokens: usize) -> Side {
        if s == Side::Cpu
            && self.place.streams()
            && self.place.op_offload.is_some_and(|min| n_tokens >= min)
            && self.parts.len() > 1
        {
            Side::Gpu(0)
        } else {
            s
        }
    }

    /// The handles on side `s` of an op's weights: those `s` holds, the others (a CPU layer's,
    /// on GPU 0 under op offload) streamed there in one call, since a call's handles hold only
    /// until the next.
    pub(super) fn weights_at(
        &mut self,
        ws: &[Option<Weight>],
        s: Side,
    ) -> Result<Vec<Option<Weight>>> {
        let mut out = vec![None; ws.len()];
        let mut missing = Vec::new();
        for (i, w) in ws.iter().enumerate() {
            let Some(w) = *w else { continue };
            let slot = self
                .weights
                .get(w.0 as usize)
                .ok_or_else(|| BackendError::Invalid(format!("split: no weight #{}", w.0)))?;
            match (slot.on.get(part(s)).copied().flatten(), &slot.host) {
                (Some(h), _) => out[i] = Some(h),
                (None, Some(h)) if s == Side::Gpu(0) => missing.push((i, slot, h)),
                (None, _) => {
                    return Err(BackendError::Invalid(format!(
                        "split: tensor {} is not on the {s}",
                        slot.name
                    )));
                }
            }
        }
        if missing.is_empty() {
            return Ok(out);
        }
        let data: Vec<WeightData> = missing
            .iter()
            .map(|(_, slot, h)| WeightData {
                name: &slot.name,
                ty: h.ty,
                rows: slot.rows,
                cols: slot.cols,
                storage: &h.storage,
                offset: h.offset,
                len: h.len,
            })
            .collect();
        let bytes: u64 = data.iter().map(|d| d.len as u64).sum();
        let handles = self.parts[part(s)].stage_weights(&data)?;
        let at: Vec<usize> = missing.iter().map(|m| m.0).collect();
        for (i, h) in at.into_iter().zip(handles) {
            out[i] = Some(h);
        }
        self.streamed_ops += 1;
        self.streamed_bytes += bytes;
        self.pin_streamed()?;
        Ok(out)
    }

    /// [`SplitBackend::weights_at`] of a few weights, those `s` holds looked up directly.
    pub(super) fn ws_at<const N: usize>(
        &mut self,
        ws: [Option<Weight>; N],
        s: Side,
    ) -> Result<[Option<Weight>; N]> {
        let mut out = [None; N];
        for (o, w) in out.iter_mut().zip(ws) {
            match w.map(|w| self.w_on(w, s)) {
                None => {}
                Some(Ok(h)) => *o = Some(h),
                Some(Err(_)) => {
                    let got = self.weights_at(&ws, s)?;
                    return Ok(std::array::from_fn(|i| got[i]));
                }
            }
        }
        Ok(out)
    }

    /// After the first weights streamed to GPU 0 (copied as before, so that a runtime that
    /// cannot register still streamed them), once: each file's span of the CPU's matrices GPU
    /// 0 may stream registered for in-place uploads ([`Memory::pin_host`]: one asynchronous copy
    /// from the mapped file per weight, no copy into pinned staging on the host first).
    pub(super) fn pin_streamed(&mut self) -> Result<()> {
        if self.pinned.is_some() {
            return Ok(());
        }
        let mut spans: Vec<(SharedBytes, std::ops::Range<usize>)> = Vec::new();
        for h in self
            .weights
            .iter()
            .filter(|w| w.rows > 1)
            .filter_map(|w| w.host.as_ref())
        {
            let at = Arc::as_ptr(&h.storage) as *const u8;
            match spans
                .iter_mut()
                .find(|(s, _)| std::ptr::eq(Arc::as_ptr(s) as *const u8, at))
            {
                Some((_, r)) => *r = r.start.min(h.offset)..r.end.max(h.offset + h.len),
                None => spans.push((h.storage.clone(), h.offset..h.offset + h.len)),
            }
        }
        let mut pinned = 0;
        for (s, r) in spans {
            let n = r.len() as u64;
            if self.parts[part(Side::Gpu(0))].pin_host(&s, r)? {
                pinned += n;
            }
        }
        self.pinned = Some(pinned);
        Ok(())
    }

    /// One weight's handle on side `s` ([`SplitBackend::weights_at`]); one `s` holds is looked
    /// up without the staging path's lists (every op of a decode step comes here).
    pub(super) fn w_at(&mut self, w: Weight, s: Side) -> Result<Weight> {
        if let Ok(h) = self.w_on(w, s) {
            return Ok(h);
        }
        self.weights_at(&[Some(w)], s)?
            .pop()
            .flatten()
            .ok_or_else(|| BackendError::Invalid(format!("split: no weight #{}", w.0)))
    }

    /// Where layer `p.layer`'s attention runs: on GPU 0 for a CPU layer's batch of
    /// [`Placement::op_offload`]'s size where GPU 0 has a stage for its rows, else on the side
    /// that keeps the layer's cache.
    pub(super) fn attn_side(&self, p: &AttnParams) -> Side {
        let home = self.place.layer_side(p.layer);
        match self.offload(home, p.n_tokens) {
            g if self.kv_stage && g != home => g,
            _ => home,
        }
    }

    /// Op offload's attention of a CPU layer on GPU 0, before it: the rows its batch reads (the
    /// sequence's positions before the batch, a sliding window's last) copied from the CPU's
    /// cache into GPU 0's stage, as llama.cpp's scheduler copies a CPU cache's view to the GPU
    /// that runs the attention.
    pub(super) fn borrow_kv(&mut self, p: &AttnParams) -> Result<()> {
        let from = match p.window {
            0 => 0,
            w => (p.pos0 + 1).saturating_sub(w),
        };
        if from < p.pos0 {
            self.move_kv(Side::Cpu, Side::Gpu(0), p, from..p.pos0)?;
        }
        Ok(())
    }

    /// After it: the batch's new rows back into the CPU's cache, where decode reads them.
    pub(super) fn return_kv(&mut self, p: &AttnParams) -> Result<()> {
        self.move_kv(Side::Gpu(0), Side::Cpu, p, p.pos0..p.pos0 + p.n_tokens)
    }

    pub(super) fn move_kv(
        &mut self,
        from: Side,
        to: Side,
        p: &AttnParams,
        pos: std::ops::Range<usize>,
    ) -> Result<()> {
        let mut rows = std::mem::take(&mut self.kv_rows);
        let pos0 = pos.start;
        let r = self
            .side(from)
            .kv_rows_out(p.layer, p.seq, pos, &mut rows)
            .and_then(|()| self.side(to).kv_rows_in(p.layer, p.seq, pos0, &rows));
        self.kv_rows_bytes += rows.len() as u64;
        self.kv_rows = rows;
        r
    }
}
