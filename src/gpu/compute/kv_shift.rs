//! The GPU backend's context shift ([`KvShift`]): `hs_kv_shift_f32` / `hs_kv_shift_f16`
//! (`kernels/infer_kv_shift.hip`) move the kept rows of every layer down and rotate their keys in
//! one launch per chunk of at most `src − dst` rows (within a chunk no block writes a row another
//! reads; chunks run in stream order). Nothing is allocated: the angles are built in shared
//! memory, as `hs_rope` builds them.

use super::plan::{MAX_GRID_Y, MAX_ROPE_PAIRS, rope_theta_scale};
use super::{GpuCompute, KvType, gpu_err, invalid};
use crate::gpu::backend::{KvShift, OpLabel, Result};
use crate::gpu::handle::Arg;

/// Threads per block: one row of `kv_dim` elements per block.
const THREADS: u32 = 128;

impl GpuCompute {
    pub(super) fn shift_kv(&mut self, s: &KvShift) -> Result<()> {
        let (k, v, n_layers, n_ctx, kv_dim) = {
            let kv = self
                .kv
                .as_ref()
                .ok_or_else(|| invalid("KV shift before the KV cache was allocated".into()))?;
            if !kv.layout.is_uniform() {
                return Err(crate::gpu::backend::BackendError::Unsupported(
                    "a KV shift of a cache with sliding-window rings".into(),
                ));
            }
            (
                kv.k,
                kv.v,
                kv.layout.n_layers(),
                kv.layout.n_ctx(),
                kv.layout.kv_dim(),
            )
        };
        s.check(n_ctx, kv_dim)?;
        if s.rope.yarn.is_some() {
            // The kernel rotates by delta · freq_scale · theta_scale^i; YaRN mixes another angle
            // in per pair. No YaRN model shifts (gpt-oss: `Arch::kv_shift_inexact`).
            return Err(crate::gpu::backend::BackendError::Unsupported(
                "a KV shift of keys rotated with YaRN RoPE".into(),
            ));
        }
        let half = s.rope.pairs(s.head_dim)?;
        if half > MAX_ROPE_PAIRS {
            return Err(invalid(format!(
                "RoPE over {half} pairs: the shift kernel rotates at most {MAX_ROPE_PAIRS}"
            )));
        }
        if n_layers > MAX_GRID_Y {
            return Err(invalid(format!("{n_layers} layers in one shift")));
        }
        if s.n == 0 || n_layers == 0 {
            return Ok(());
        }
        let factors = match s.rope.freq_factors {
            Some(f) => Arg::Ptr(self.vector(f, half)?.ptr),
            None => Arg::U64(0),
        };
        let (name, kernel) = match self.opts.kv {
            KvType::F32 => ("kv_shift_f32", "hs_kv_shift_f32"),
            KvType::F16 => ("kv_shift_f16", "hs_kv_shift_f16"),
        };
        let f = self.gpu_mut()?.function(kernel).map_err(gpu_err)?;
        let chunk = s.src - s.dst;
        let mut done = 0;
        while done < s.n {
            let rows = chunk.min(s.n - done);
            self.launch(
                OpLabel::global("kv_shift"),
                name,
                f,
                [rows as u32, n_layers as u32, 1],
                [THREADS, 1, 1],
                &[
                    Arg::Ptr(k.ptr),
                    Arg::Ptr(v.ptr),
                    Arg::U64((n_ctx * kv_dim) as u64),
                    Arg::U32(kv_dim as u32),
                    Arg::U32(s.head_dim as u32),
                    Arg::U32(s.rope.n_rot as u32),
                    Arg::U32((s.dst + done) as u32),
                    Arg::U32((s.src + done) as u32),
                    Arg::F32(s.delta()),
                    Arg::F32(s.rope.freq_scale),
                    Arg::F32(rope_theta_scale(s.rope.base, s.rope.n_rot)),
                    factors,
                    Arg::U32(s.rope.neox as u32),
                ],
            )?;
            done += rows;
        }
        Ok(())
    }
}
