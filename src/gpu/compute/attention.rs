//! The KV-cache store and causal attention (`kernels/infer_attention.hip`); a decode token over a
//! long cache is split over the KV length (flash-decoding: partial results per split, then a
//! combine kernel), the split count chosen from the number of keys and of query heads. A decode
//! step of several sequences ([`Ops::rope_attention_rows`]) runs every sequence's row in one
//! launch of each kernel, each row's sequence and position read from a table on the device.
//!
//! [`Ops::rope_attention_rows`]: crate::gpu::backend::Ops::rope_attention_rows

use super::*;

/// Head dimensions of the tiled prompt kernels (`hs_attention_tiled_{f32,f16}_{d}`).
pub(super) const TILED_HEAD_DIMS: [usize; 4] = [64, 96, 128, 256];
/// Head dimensions of the matrix units' prompt kernels (`hs_attention_mma_{f32,f16}_{d}`): the
/// block's f16 queries, one staged tile and the scores fit 48 KiB of shared memory up to 128.
pub(super) const MMA_HEAD_DIMS: [usize; 3] = [64, 96, 128];
/// Query rows of one block of the matrix units' kernel (`HS_FM_ROWS`, mma.h's 64 x 64 tile).
const MMA_ROWS: usize = 64;
/// Query rows from which a batch takes the matrix units' kernel where the device has them: a
/// 64-row block then has work for a quarter of its rows or more, and the selftest's 24-token
/// prompts run it.
const MMA_MIN_TOKENS: usize = 16;
/// Query rows of one block of the tiled kernels (`HS_FA_BQ`), and its threads (`HS_FA_THREADS`).
pub(super) const TILED_ROWS: usize = 16;
const TILED_THREADS: u32 = 128;
/// Query rows from which a batch takes the tiled kernel (a block of 16 rows then has work for
/// most of its threads).
const TILED_MIN_TOKENS: usize = 8;

/// Keys from which a decode token's attention is split over the KV length. A block of the
/// unsplit kernel scores a chunk of 128 keys at once (a thread each), so below this a split
/// would only add the combine kernel's launch.
pub(super) const FLASH_MIN_KEYS: usize = 256;
/// About this many keys per split, one chunk of the kernel (a power-of-two number of splits, at
/// most [`LENGTH_SPLITS`]).
const KEYS_PER_SPLIT: usize = 128;
/// Most splits by length alone: more (64 at 4,097 keys) measured slower on the H200 for 9 and 16
/// heads (SmolLM2 702 → 656 t/s, Qwen3-0.6B 558 → 548 at depth 4096).
const LENGTH_SPLITS: usize = 32;
/// Most splits of one head (few heads: [`FEW_HEADS`]); `HS_ATTN_MAX_SPLITS` in
/// kernels/attention.h, the combine kernel's shared table (a test holds the two equal).
pub(super) const MAX_SPLITS: usize = 64;
/// Query heads under which the unsplit kernel's grid (a block per head) leaves most of a GPU
/// idle: Gemma 3 1B's 4, SmolLM2's 9. Such models split from [`FEW_HEADS_MIN_KEYS`] keys, into
/// splits of at least [`FEW_HEADS_KEYS_PER_SPLIT`], aiming at [`FEW_HEADS_BLOCKS`] blocks.
const FEW_HEADS: usize = 16;
const FEW_HEADS_MIN_KEYS: usize = 64;
const FEW_HEADS_KEYS_PER_SPLIT: usize = 32;
const FEW_HEADS_BLOCKS: usize = 256;

/// Splits of a decode token's attention over `n_keys` keys for `n_heads` query heads (0: not
/// split). A power of two, so that a graph captured for it serves every length up to the next
/// (the kernels divide the keys they read from the device among the grid's splits).
pub fn flash_splits(n_keys: usize, n_heads: usize) -> usize {
    let by_length = if n_keys < FLASH_MIN_KEYS {
        0
    } else {
        n_keys
            .div_ceil(KEYS_PER_SPLIT)
            .next_power_of_two()
            .min(LENGTH_SPLITS)
    };
    let by_heads = if n_heads < FEW_HEADS && n_keys >= FEW_HEADS_MIN_KEYS {
        let fill = FEW_HEADS_BLOCKS.div_ceil(n_heads.max(1));
        fill.min(n_keys / FEW_HEADS_KEYS_PER_SPLIT)
    } else {
        0
    };
    match by_length.max(by_heads) {
        0 | 1 => 0,
        s => s.next_power_of_two().min(MAX_SPLITS),
    }
}

/// Bytes of the partial results for `q_dim` query elements at most (`head_dim + 2` floats per
/// head and split; a head has at least 16 dimensions).
pub(super) fn flash_part_bytes(q_dim: usize) -> u64 {
    ((q_dim + 2 * q_dim.div_ceil(16)) * MAX_SPLITS * 4) as u64
}

impl GpuCompute {
    /// The tiled prompt kernel for this call and its query rows a block: a batch of at least
    /// [`TILED_MIN_TOKENS`] rows whose head dimension has one, not fused with the quantization
    /// (the caller also keeps it out of a recorded decode step: the tiled kernels take the
    /// position as an argument only). On a device with matrix units, a batch of at least
    /// [`MMA_MIN_TOKENS`] rows over an f16 cache whose head dimension has one takes the kernel
    /// on those units.
    fn tiled_kernel(&mut self, p: &AttnParams, fused: bool) -> Result<Option<(KernelFn, usize)>> {
        if !TILED_HEAD_DIMS.contains(&p.head_dim) || p.n_tokens < TILED_MIN_TOKENS || fused {
            return Ok(None);
        }
        // An f32 cache asks for attention in f32: the matrix units' kernel rounds the queries
        // and the softmax weights to f16 (as llama.cpp's tensor-core kernels do), 4e-4 of the
        // output, where the FMA kernel computes the CPU's numbers.
        let gpu = self.live_gpu()?;
        let mma = self.opts.kv == KvType::F16
            && MMA_HEAD_DIMS.contains(&p.head_dim)
            && p.n_tokens >= MMA_MIN_TOKENS
            && dequant::tensor_units(gpu.kind(), &gpu.info().arch).is_some();
        let rows = if mma { MMA_ROWS } else { TILED_ROWS };
        Ok(Some((self.tiled_fn(self.opts.kv, p.head_dim, mma)?, rows)))
    }

    /// The position a launch passes: `(pos0, pos_dev)`. Inside a decode step recorded for graph
    /// replay the kernels read it from the step block (`pos_dev`), so one graph serves every
    /// position; otherwise `pos_dev` is null and `pos0` is the position.
    pub(super) fn step_position(&mut self, pos: usize, bucket: Option<u64>) -> Result<(Arg, Arg)> {
        match self
            .gpu_mut()?
            .graph_position(pos as u32, bucket)
            .map_err(gpu_err)?
        {
            Some(dev) => Ok((Arg::U32(0), Arg::Ptr(dev))),
            None => Ok((Arg::U32(pos as u32), Arg::U64(0))),
        }
    }

    /// The table of a decode step of several sequences on the device: (sequence, position) a
    /// row, after the batch's token ids in the tokens buffer. Uploaded once a step (every layer
    /// passes the same rows).
    fn seq_rows_table(&mut self, rows: &[SeqPos]) -> Result<DevicePtr> {
        let n_batch = self.n_batch();
        if rows.is_empty() || rows.len() > n_batch {
            return Err(invalid(format!(
                "{} sequences in one step; the plan allows {n_batch}",
                rows.len()
            )));
        }
        let tokens = self.workspace()?.tokens;
        let dst = tokens
            .slice(n_batch as u64 * 4, rows.len() as u64 * 8)
            .map_err(gpu_err)?;
        let pairs = rows.iter().map(|r| [r.seq as u32, r.pos as u32]);
        // Every layer after the first finds the table on the device already.
        if self
            .seq_rows_up
            .as_chunks::<2>()
            .0
            .iter()
            .copied()
            .ne(pairs.clone())
        {
            let l = self.label(OpLabel::global("attention"), "sequence rows")?;
            self.seq_rows_up.clear();
            self.seq_rows_up.extend(pairs.flatten());
            self.host_bytes.clear();
            self.host_bytes
                .extend(self.seq_rows_up.iter().flat_map(|v| v.to_le_bytes()));
            let bytes = std::mem::take(&mut self.host_bytes);
            let r = self
                .gpu_mut()
                .and_then(|g| g.upload(l, dst, &bytes).map_err(gpu_err));
            self.host_bytes = bytes;
            if r.is_err() {
                // Nothing is known to be on the device: the next call uploads again.
                self.seq_rows_up.clear();
            }
            r?;
        }
        Ok(dst.ptr)
    }

    /// Stores k and v in the cache and attends: one sequence's rows `p.row0..+p.n_tokens`
    /// (`seq_rows` `None`), or one row of each sequence of `seq_rows` (rows from 0). With `rope`,
    /// the head norms and the rotation go into the launch that writes the cache.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_attention(
        &mut self,
        q: Buf,
        k: Buf,
        v: Buf,
        out: Buf,
        p: &AttnParams,
        rope: Option<(&RopeParams, &HeadNorms)>,
        seq_rows: Option<&[SeqPos]>,
    ) -> Result<()> {
        let kv_dim = p.n_kv_heads * p.head_dim;
        let q_dim = p.n_heads * p.head_dim;
        // Several sequences: rows 0..n, sequence 0's region (each row adds its own), positions
        // from the table.
        let p = &match seq_rows {
            Some(r) => AttnParams {
                seq: 0,
                row0: 0,
                n_tokens: r.len(),
                pos0: 0,
                ..*p
            },
            None => *p,
        };
        let (k_cache, v_cache, layer_off, slots) = {
            let kv = self
                .kv
                .as_ref()
                .ok_or_else(|| invalid("attention before the KV cache was allocated".into()))?;
            match seq_rows {
                Some(rows) => {
                    for r in rows {
                        kv.layout.check_attention(&AttnParams {
                            seq: r.seq,
                            n_tokens: 1,
                            pos0: r.pos,
                            ..*p
                        })?;
                    }
                }
                None => kv.layout.check_attention(p)?,
            }
            (
                kv.k,
                kv.v,
                // Sequence `seq`'s region of the layer: the kernels see one sequence's cache.
                kv.layout.seq_offset(p.layer, p.seq) as u64,
                kv.layout.slots(p.layer),
            )
        };
        if !p.n_heads.is_multiple_of(p.n_kv_heads) || p.head_dim > MAX_HEAD_DIM {
            return Err(invalid(format!(
                "{} heads over {} KV heads of {} dimensions (heads must be a multiple of KV \
                 heads; at most {MAX_HEAD_DIM} dimensions)",
                p.n_heads, p.n_kv_heads, p.head_dim
            )));
        }
        if p.n_tokens == 0 {
            return Ok(());
        }
        if p.n_tokens > MAX_GRID_Y {
            return Err(invalid(format!("{} query rows in one call", p.n_tokens)));
        }
        // One decode token over a long cache: split over the KV length (the bucket of graphs).
        // Several sequences split by the longest, their rows' splits within the partial results
        // of one row's most splits.
        let keys = |pos: usize| {
            if p.window > 0 {
                (pos + 1).min(p.window)
            } else {
                pos + 1
            }
        };
        let eff = match seq_rows {
            Some(rows) => rows.iter().map(|r| keys(r.pos)).max().unwrap_or(0),
            None => keys(p.pos0),
        };
        let part = self.ws.as_ref().and_then(|w| w.attn_part);
        let part_fits =
            part.is_some_and(|b| b.bytes >= ((q_dim + 2 * p.n_heads) * MAX_SPLITS * 4) as u64);
        let splits = match seq_rows {
            _ if !part_fits => 0,
            None if p.n_tokens == 1 => flash_splits(eff, p.n_heads),
            None => 0,
            Some(rows) => {
                let most = MAX_SPLITS / rows.len();
                match flash_splits(eff, p.n_heads * rows.len()) {
                    s if most < 2 || s < 2 => 0,
                    s => s.min(1 << most.ilog2()),
                }
            }
        };
        let (pos0, pos_dev, rows_arg) = match seq_rows {
            Some(rows) => {
                let tab = self.seq_rows_table(rows)?;
                (Arg::U32(0), Arg::U64(0), Arg::Ptr(tab))
            }
            None => {
                // Each sequence's cache is another pointer in the recorded launches: its own
                // graph.
                let bucket = splits as u64 | (p.seq as u64) << 16;
                let (pos0, pos_dev) = self.step_position(p.pos0, Some(bucket))?;
                (pos0, pos_dev, Arg::U64(0))
            }
        };
        // gpt-oss's attention sinks: one f32 per query head, or a null pointer.
        let sinks = match p.sinks {
            Some(w) => Arg::Ptr(self.vector(w, p.n_heads)?.ptr),
            None => Arg::U64(0),
        };
        // A later group of a multi-sequence batch reads and writes its own rows: the pointers
        // move, the kernels are the same.
        let end = p.row0 + p.n_tokens;
        let rows = |b: DeviceBuffer, width: usize| {
            b.slice((p.row0 * width * 4) as u64, (p.n_tokens * width * 4) as u64)
                .map_err(gpu_err)
        };
        let qb = rows(self.buf(q, end * q_dim)?, q_dim)?;
        let kb = rows(self.buf(k, end * kv_dim)?, kv_dim)?;
        let vb = rows(self.buf(v, end * kv_dim)?, kv_dim)?;
        let ob = rows(self.buf(out, end * q_dim)?, q_dim)?;
        let eb = self.opts.kv.bytes();
        let n = (p.n_tokens * kv_dim) as u64;
        let li = p.layer as u32;
        let (store, store_name, attn, attn_name, attn_q8_name) = match self.opts.kv {
            KvType::F32 => (
                self.kernels.kv_store_f32,
                "kv_store_f32",
                self.kernels.attention_f32,
                "attention_f32",
                "attention_f32 + quantize_q8",
            ),
            KvType::F16 => (
                self.kernels.kv_store_f16,
                "kv_store_f16",
                self.kernels.attention_f16,
                "attention_f16",
                "attention_f16 + quantize_q8",
            ),
        };
        match rope {
            Some((r, norms)) => {
                let half = r.pairs(p.head_dim)?;
                if half > MAX_ROPE_PAIRS {
                    return Err(invalid(format!(
                        "RoPE over {half} pairs: the kernel rotates at most {MAX_ROPE_PAIRS}"
                    )));
                }
                let factors = match r.freq_factors {
                    Some(f) => Arg::Ptr(self.vector(f, half)?.ptr),
                    None => Arg::U64(0),
                };
                let [mscale, ext_factor, corr_lo, corr_hi] = ops::rope_scaling_args(r);
                // Qwen 3's and Gemma 3's per-head norms, in the same launch.
                let head_norm = |w: Option<Weight>| -> Result<Arg> {
                    Ok(match w {
                        Some(w) => Arg::Ptr(self.vector(w, p.head_dim)?.ptr),
                        None => Arg::U64(0),
                    })
                };
                let (qn, kn) = (head_norm(norms.q)?, head_norm(norms.k)?);
                let normed = norms.q.is_some() || norms.k.is_some();
                let (f, name, op) = match (self.opts.kv, normed) {
                    (KvType::F32, false) => (
                        self.kernels.rope_kv_store_f32,
                        "rope + kv_store_f32",
                        "rope_qk + kv_store",
                    ),
                    (KvType::F16, false) => (
                        self.kernels.rope_kv_store_f16,
                        "rope + kv_store_f16",
                        "rope_qk + kv_store",
                    ),
                    (KvType::F32, true) => (
                        self.kernels.rope_kv_store_f32,
                        "qk_norm + rope + kv_store_f32",
                        "qk_norm + rope_qk + kv_store",
                    ),
                    (KvType::F16, true) => (
                        self.kernels.rope_kv_store_f16,
                        "qk_norm + rope + kv_store_f16",
                        "qk_norm + rope_qk + kv_store",
                    ),
                };
                self.launch(
                    OpLabel::layer(li, op),
                    name,
                    f,
                    // A block per query head and per key head.
                    [p.n_tokens as u32, (p.n_heads + p.n_kv_heads) as u32, 1],
                    [128, 1, 1],
                    &[
                        Arg::Ptr(qb.ptr),
                        Arg::Ptr(kb.ptr),
                        Arg::Ptr(vb.ptr),
                        Arg::Ptr(k_cache.ptr.offset(layer_off * eb)),
                        Arg::Ptr(v_cache.ptr.offset(layer_off * eb)),
                        Arg::U32(p.n_heads as u32),
                        Arg::U32(p.n_kv_heads as u32),
                        Arg::U32(p.head_dim as u32),
                        Arg::U32(r.n_rot as u32),
                        pos0,
                        Arg::F32(r.freq_scale),
                        Arg::F32(rope_theta_scale(r.base, r.n_rot)),
                        factors,
                        Arg::U32(r.neox as u32),
                        mscale,
                        ext_factor,
                        corr_lo,
                        corr_hi,
                        Arg::U32(slots as u32),
                        pos_dev,
                        qn,
                        kn,
                        Arg::F32(norms.eps),
                        rows_arg,
                    ],
                )?;
                self.wrote(q);
                self.wrote(k);
            }
            None if seq_rows.is_some() => {
                return Err(invalid(
                    "a step of several sequences stores its keys with the rotation".into(),
                ));
            }
            None => {
                self.launch(
                    OpLabel::layer(li, "kv_store"),
                    store_name,
                    store,
                    [elementwise_grid(n), 1, 1],
                    [256, 1, 1],
                    &[
                        Arg::Ptr(kb.ptr),
                        Arg::Ptr(vb.ptr),
                        Arg::Ptr(k_cache.ptr.offset(layer_off * eb)),
                        Arg::Ptr(v_cache.ptr.offset(layer_off * eb)),
                        pos0,
                        Arg::U32(kv_dim as u32),
                        Arg::U32(slots as u32),
                        Arg::U64(n),
                        pos_dev,
                    ],
                )?;
            }
        }
        // Quantized for the output projection in the same launch, as the fused RMS norm does,
        // where the last product's Q8 block divides a head (a projection of another block size
        // quantizes again).
        let fuse_bs = self
            .fuse_bs_for(OpLabel::layer(li, "attention"))
            .filter(|&bs| {
                // The quantized copy covers rows from 0 only (the product's whole input).
                p.row0 == 0
                    && p.head_dim.is_multiple_of(q8_block(bs) as usize)
                    && p.n_tokens < self.opts.gemm_min_tokens.max(1)
                    && self
                        .ws
                        .as_ref()
                        .is_some_and(|ws| (p.n_tokens * q_dim) as u64 <= ws.xq.bytes)
            });
        let (xq, xd) = match (fuse_bs, self.ws.as_ref()) {
            (Some(_), Some(ws)) => (Arg::Ptr(ws.xq.ptr), Arg::Ptr(ws.xd.ptr)),
            _ => (Arg::U64(0), Arg::U64(0)),
        };
        if let (true, Some(part)) = (splits > 0, part) {
            let (split, split_name) = match self.opts.kv {
                KvType::F32 => (self.kernels.attention_split_f32, "attention_split_f32"),
                KvType::F16 => (self.kernels.attention_split_f16, "attention_split_f16"),
            };
            self.launch(
                OpLabel::layer(li, "attention"),
                split_name,
                split,
                [p.n_heads as u32, splits as u32, p.n_tokens as u32],
                [128, 1, 1],
                &[
                    Arg::Ptr(qb.ptr),
                    Arg::Ptr(k_cache.ptr.offset(layer_off * eb)),
                    Arg::Ptr(v_cache.ptr.offset(layer_off * eb)),
                    Arg::Ptr(part.ptr),
                    Arg::U32(p.n_heads as u32),
                    Arg::U32(p.n_kv_heads as u32),
                    Arg::U32(p.head_dim as u32),
                    pos0,
                    Arg::F32(p.scale),
                    Arg::U32(p.window as u32),
                    Arg::U32(slots as u32),
                    Arg::F32(p.softcap),
                    pos_dev,
                    rows_arg,
                ],
            )?;
            let combine = self.kernels.attention_combine;
            self.launch(
                OpLabel::layer(li, "attention"),
                if fuse_bs.is_some() {
                    "attention_combine + quantize_q8"
                } else {
                    "attention_combine"
                },
                combine,
                [p.n_heads as u32, p.n_tokens as u32, 1],
                [128, 1, 1],
                &[
                    Arg::Ptr(part.ptr),
                    Arg::Ptr(ob.ptr),
                    Arg::U32(p.head_dim as u32),
                    Arg::U32(splits as u32),
                    sinks,
                    xq,
                    xd,
                    Arg::U32(fuse_bs.unwrap_or(0)),
                ],
            )?;
        } else if let (Some((f, block_rows)), Arg::U64(0)) = (
            match (pos_dev, seq_rows) {
                (Arg::U64(0), None) => self.tiled_kernel(p, fuse_bs.is_some())?,
                _ => None,
            },
            pos_dev,
        ) {
            self.launch(
                OpLabel::layer(li, "attention"),
                if block_rows == MMA_ROWS {
                    "attention_mma"
                } else {
                    "attention_tiled"
                },
                f,
                [p.n_heads as u32, p.n_tokens.div_ceil(block_rows) as u32, 1],
                [TILED_THREADS, 1, 1],
                &[
                    Arg::Ptr(qb.ptr),
                    Arg::Ptr(k_cache.ptr.offset(layer_off * eb)),
                    Arg::Ptr(v_cache.ptr.offset(layer_off * eb)),
                    Arg::Ptr(ob.ptr),
                    Arg::U32(p.n_tokens as u32),
                    Arg::U32(p.n_heads as u32),
                    Arg::U32(p.n_kv_heads as u32),
                    pos0,
                    Arg::F32(p.scale),
                    Arg::U32(p.window as u32),
                    Arg::U32(slots as u32),
                    Arg::F32(p.softcap),
                    sinks,
                ],
            )?;
        } else {
            self.launch(
                OpLabel::layer(li, "attention"),
                if fuse_bs.is_some() {
                    attn_q8_name
                } else {
                    attn_name
                },
                attn,
                [p.n_heads as u32, p.n_tokens as u32, 1],
                [128, 1, 1],
                &[
                    Arg::Ptr(qb.ptr),
                    Arg::Ptr(k_cache.ptr.offset(layer_off * eb)),
                    Arg::Ptr(v_cache.ptr.offset(layer_off * eb)),
                    Arg::Ptr(ob.ptr),
                    Arg::U32(p.n_heads as u32),
                    Arg::U32(p.n_kv_heads as u32),
                    Arg::U32(p.head_dim as u32),
                    pos0,
                    Arg::F32(p.scale),
                    Arg::U32(p.window as u32),
                    Arg::U32(slots as u32),
                    Arg::F32(p.softcap),
                    sinks,
                    xq,
                    xd,
                    Arg::U32(fuse_bs.unwrap_or(0)),
                    pos_dev,
                    rows_arg,
                ],
            )?;
        }
        self.wrote(out);
        self.produced(out, OpLabel::layer(li, "attention"));
        if let Some(bs) = fuse_bs {
            self.quant = Some(QuantKey {
                buf: out,
                version: self.bufs[out.0 as usize].version,
                bs,
                n_tokens: p.n_tokens,
                dequantized: false,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_combine_kernels_table_holds_the_most_splits() {
        assert!(
            include_str!("../../../kernels/attention.h")
                .contains(&format!("#define HS_ATTN_MAX_SPLITS {MAX_SPLITS}\n"))
        );
    }

    #[test]
    fn many_heads_split_by_length_and_few_heads_earlier_and_finer() {
        // 32 query heads (llama-2-7b): as before, from 256 keys, 128 keys a split.
        assert_eq!(flash_splits(255, 32), 0);
        assert_eq!(flash_splits(256, 32), 2);
        assert_eq!(flash_splits(4096, 32), 32);
        assert_eq!(flash_splits(4097, 32), 32);
        assert_eq!(flash_splits(100_000, 16), 32);
        // 16 heads (Qwen3-0.6B): the same.
        assert_eq!(flash_splits(128, 16), 0);
        // 4 heads (Gemma 3 1B): from 64 keys, at least 32 keys a split, up to 256 blocks.
        assert_eq!(flash_splits(63, 4), 0);
        assert_eq!(flash_splits(64, 4), 2);
        assert_eq!(flash_splits(128, 4), 4);
        assert_eq!(flash_splits(4096, 4), MAX_SPLITS);
        // 9 heads (SmolLM2-135M): 256 / 9 = 29 splits' worth of blocks, as the keys allow.
        assert_eq!(flash_splits(100, 9), 4);
        assert_eq!(flash_splits(2000, 9), 32);
        for (keys, heads) in [(64, 1), (700, 4), (5000, 9), (100_000, 2), (100_000, 64)] {
            let s = flash_splits(keys, heads);
            assert!(
                s.is_power_of_two() && s <= MAX_SPLITS,
                "{keys} keys, {heads} heads: {s}"
            );
        }
    }
}
