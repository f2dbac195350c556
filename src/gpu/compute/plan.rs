//! The host-side arithmetic of the GPU forward pass, kept free of device calls so that it can be
//! tested anywhere: which kernel serves which weight type, how big each arena region must be for
//! a model, how a matrix product is cut into launches and tiles.

use crate::gpu::arena::{ALIGN, ArenaPlan, Region};
use crate::gpu::backend::{KvType, MemoryPlan};
use crate::gpu::quant::GgmlType;

/// The activation a weight type multiplies with (what the CPU backend uses for the same type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActFormat {
    /// f32 as computed (F32, F16, BF16 weights).
    F32,
    /// Q8 blocks of `bs` values: 32 for the 32-element types, 256 for the K types; for Q4_1 and
    /// Q5_1, `32 | Q8_1_SUMS` (see [`Q8_1_SUMS`]).
    Q8 { bs: u32 },
}

/// A bit of a Q8 format's `bs`: the blocks' sum term is Q8_1's, `(amax / 127) · Σq` rounded to
/// f16 from the unrounded scale, as llama.cpp's `quantize_row_q8_1` and the CPU backend
/// (`quant::dot::act::q8x32_scales`) store it for Q4_1 / Q5_1 weights; without it `d · Σq` with
/// the f16 `d` (Q8_0's). The kernels' quantizers take `bs` with this bit (`HS_Q8_1_SUMS` in
/// kernels/prelude.h), and the workspace's cache key keeps the two apart.
pub const Q8_1_SUMS: u32 = 0x1_0000;

/// The block length of a Q8 format's `bs` (without [`Q8_1_SUMS`]).
pub fn q8_block(bs: u32) -> u32 {
    bs & !Q8_1_SUMS
}

/// The kernels and activation format of one weight type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeKernels {
    /// Suffix of the kernel names: `hs_mv_<suffix>`, `hs_dequant_rows_<suffix>`.
    pub suffix: &'static str,
    pub act: ActFormat,
}

/// What runs a weight type on the GPU, or `None` for a type the kernels do not handle.
pub fn type_kernels(ty: GgmlType) -> Option<TypeKernels> {
    use GgmlType::*;
    let (suffix, act) = match ty {
        F32 => ("f32", ActFormat::F32),
        F16 => ("f16", ActFormat::F32),
        Bf16 => ("bf16", ActFormat::F32),
        Q4_0 => ("q4_0", ActFormat::Q8 { bs: 32 }),
        Q4_1 => ("q4_1", ActFormat::Q8 { bs: 32 | Q8_1_SUMS }),
        Q5_0 => ("q5_0", ActFormat::Q8 { bs: 32 }),
        Q5_1 => ("q5_1", ActFormat::Q8 { bs: 32 | Q8_1_SUMS }),
        Q8_0 => ("q8_0", ActFormat::Q8 { bs: 32 }),
        Q4K => ("q4_k", ActFormat::Q8 { bs: 256 }),
        Q5K => ("q5_k", ActFormat::Q8 { bs: 256 }),
        Q6K => ("q6_k", ActFormat::Q8 { bs: 256 }),
        Q2K => ("q2_k", ActFormat::Q8 { bs: 256 }),
        Q3K => ("q3_k", ActFormat::Q8 { bs: 256 }),
        Iq4Nl => ("iq4_nl", ActFormat::Q8 { bs: 32 }),
        Iq4Xs => ("iq4_xs", ActFormat::Q8 { bs: 256 }),
        Mxfp4 => ("mxfp4", ActFormat::Q8 { bs: 32 }),
        _ => return None,
    };
    Some(TypeKernels { suffix, act })
}

/// Every weight type the GPU kernels handle: all of the CPU backend's compute types, so that a
/// model that runs on one runs on the other.
pub const GPU_TYPES: &[GgmlType] = crate::gpu::quant::COMPUTE_TYPES;

/// Which GEMM multiplies prompt batches (`HIPSCOPE_PREFILL_GEMM`, read at the app edge:
/// `app/settings.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefillGemm {
    /// f16 tiles through the BLAS where it multiplies f16 (cuBLAS, rocBLAS with gemm_ex), else
    /// hipscope's own f16 matrix kernel.
    #[default]
    Auto,
    /// The BLAS's f16 GEMM; an error where there is none.
    Blas,
    /// hipscope's own f16 matrix kernel (`hs_gemm_f16`), even where a BLAS would serve.
    Own,
    /// The f32 path: f32 tiles through `gemm_f32` (as before the matrix units were used).
    F32,
}

impl PrefillGemm {
    /// The variable that sets it, for messages (read at the app edge, never here).
    pub const ENV: &'static str = "HIPSCOPE_PREFILL_GEMM";
}

impl std::str::FromStr for PrefillGemm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(PrefillGemm::Auto),
            "blas" => Ok(PrefillGemm::Blas),
            "own" => Ok(PrefillGemm::Own),
            "f32" => Ok(PrefillGemm::F32),
            other => Err(format!(
                "unknown prefill GEMM {other:?} (auto, blas, own or f32)"
            )),
        }
    }
}

/// How the GPU backend computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ComputeOptions {
    pub kv: KvType,
    /// Which GEMM multiplies prompt batches.
    pub prefill: PrefillGemm,
    /// Matrix products of at least this many tokens dequantize weight tiles and run a GEMM;
    /// fewer run the matrix-vector kernels, up to [`MV_MAX_TOKENS`] tokens per launch.
    pub gemm_min_tokens: usize,
    /// Most bytes of one dequantized weight tile for the GEMM path (the f16 path also keeps the
    /// batch's f16 activations at its start).
    pub tile_bytes: u64,
    /// Replay the decode step as a graph where the runtime can (`--no-graphs`, config `graphs`).
    pub graphs: bool,
    /// The one-token products take f32 activations where a kernel for it exists (Q4_0, Q4_1),
    /// instead of Q8 ones (`HIPSCOPE_MV_ACT=f32`: issue 13 item 8's measurement).
    pub mv_act_f32: bool,
}

impl Default for ComputeOptions {
    fn default() -> Self {
        ComputeOptions {
            kv: KvType::F16,
            prefill: PrefillGemm::Auto,
            gemm_min_tokens: 16,
            tile_bytes: 64 << 20,
            graphs: true,
            mv_act_f32: false,
        }
    }
}

/// Tokens one matrix-vector launch handles (`HS_MV_MAX_TOK` in kernels/infer_matvec.hip).
pub const MV_MAX_TOKENS: usize = 8;
/// Threads per matrix-vector block.
pub const MV_THREADS: u32 = 128;
/// Largest head dimension and RoPE pair count the kernels hold in shared memory.
pub const MAX_HEAD_DIM: usize = 256;
pub const MAX_ROPE_PAIRS: usize = 256;
/// The most rows one 2-D launch may have in its y dimension (CUDA's limit; HIP's is larger).
pub const MAX_GRID_Y: usize = 65_535;

/// Where each buffer of the backend's own workspace lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkspaceSizes {
    /// Token ids of one batch (u32).
    pub tokens: u64,
    /// Q8 quants of one batch's widest input.
    pub xq: u64,
    /// Per-block (d, d·Σq) of the same, for 32-element blocks (the most blocks).
    pub xd: u64,
    /// The batch's input quantized and dequantized again (f32), for the GEMM path; 0 when a
    /// batch never reaches the GEMM path.
    pub xdq: u64,
    /// One dequantized weight tile; 0 when the GEMM path is never taken.
    pub tile: u64,
    /// The partial results of decode attention split over the keys (flash-decoding).
    pub attn_part: u64,
}

/// The backend's own buffers for a model of this plan.
pub fn workspace_sizes(plan: &MemoryPlan, opts: &ComputeOptions) -> WorkspaceSizes {
    let n = plan.n_batch.max(1) as u64;
    let cols = plan.max_cols.max(1) as u64;
    let gemm = plan.n_batch >= opts.gemm_min_tokens.max(1);
    WorkspaceSizes {
        tokens: n * 4,
        xq: n * cols,
        xd: n * cols.div_ceil(32) * 8,
        xdq: if gemm { n * cols * 4 } else { 0 },
        tile: if gemm {
            opts.tile_bytes.max(cols * 4)
        } else {
            0
        },
        attn_part: super::attention::flash_part_bytes(plan.max_cols),
    }
}

/// The arena a model needs: every weight as stored (vectors as f32), the KV cache, the
/// activations and the workspace, each allocation rounded up to the arena's alignment.
pub fn arena_plan(plan: &MemoryPlan, opts: &ComputeOptions) -> ArenaPlan {
    let mut a = ArenaPlan::new();
    // Vectors are uploaded as f32 (at most 4 bytes per element instead of their stored size);
    // every tensor may waste up to one alignment unit.
    let weights = plan
        .weights
        .saturating_add(plan.vector_elems.saturating_mul(4))
        .saturating_add(plan.weight_tensors as u64 * ALIGN);
    a.add(Region::Weights, weights);
    let kv = plan.kv_elems.saturating_mul(opts.kv.bytes());
    a.add(Region::KvCache, kv);
    a.add(Region::KvCache, kv);
    // The forward pass allocates about a dozen buffers; room for 64 roundings.
    a.add(
        Region::Activations,
        plan.activation_elems
            .saturating_mul(4)
            .saturating_add(64 * ALIGN),
    );
    let ws = workspace_sizes(plan, opts);
    for b in [ws.tokens, ws.xq, ws.xd, ws.xdq, ws.tile, ws.attn_part] {
        if b > 0 {
            a.add(Region::Workspace, b);
        }
    }
    a
}

/// Rows of one dequantized tile of a `rows × cols` matrix within `tile_bytes` of f32.
pub fn tile_rows(rows: usize, cols: usize, tile_bytes: u64) -> usize {
    let per_tile = (tile_bytes / (cols.max(1) as u64 * 4)).max(1) as usize;
    per_tile.min(rows.max(1)).min(MAX_GRID_Y)
}

/// The launches of a product over `n` tokens: `(first token, tokens)` of at most `MV_MAX_TOKENS`.
pub fn mv_chunks(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n)
        .step_by(MV_MAX_TOKENS)
        .map(move |t0| (t0, (n - t0).min(MV_MAX_TOKENS)))
}

/// Blocks of a matrix-vector launch: one warp per row, `MV_THREADS / warp` rows per block (the
/// kernel loops over further rows, so a wrong guess of the warp size costs speed, not results).
pub fn mv_grid(rows: usize, warp: u32) -> u32 {
    let per_block = (MV_THREADS / warp.clamp(1, MV_THREADS)).max(1) as usize;
    rows.div_ceil(per_block).clamp(1, u32::MAX as usize) as u32
}

/// Weight types whose one-token kernels (`hs_mv1_*`, `hs_mv_qkv_*`) are the wide ones of
/// kernels/infer_matvec.hip: a lane per 32 elements, [`MV_WIDE_ROWS`] rows a warp (`MVW_ROWS`).
pub const MV_WIDE_TYPES: &[&str] = &["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k"];
pub const MV_WIDE_ROWS: usize = 2;

/// Rows a warp of the one-token `hs_mv1_*` / `hs_mv_qkv_*` kernels of a type (by kernel suffix).
pub fn mv1_rows_per_warp(suffix: &str) -> usize {
    if MV_WIDE_TYPES.contains(&suffix) {
        MV_WIDE_ROWS
    } else {
        1
    }
}

/// Blocks of an element-wise launch of 256 threads over `n` elements (the kernels loop).
pub fn elementwise_grid(n: u64) -> u32 {
    n.div_ceil(256).clamp(1, 4096) as u32
}

/// RoPE's per-pair frequency step, as the CPU backend computes it (bit for bit).
pub fn rope_theta_scale(base: f32, n_rot: usize) -> f32 {
    base.powf(-2.0 / n_rot as f32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::quant;

    #[test]
    fn prefill_gemm_settings_parse_and_name_the_choices() {
        assert_eq!("OWN".parse::<PrefillGemm>(), Ok(PrefillGemm::Own));
        assert_eq!("blas".parse::<PrefillGemm>(), Ok(PrefillGemm::Blas));
        assert_eq!("f32".parse::<PrefillGemm>(), Ok(PrefillGemm::F32));
        assert_eq!("auto".parse::<PrefillGemm>(), Ok(PrefillGemm::Auto));
        let e = "fast".parse::<PrefillGemm>().unwrap_err();
        assert!(
            e.contains("\"fast\"") && e.contains("auto, blas, own or f32"),
            "{e}"
        );
    }

    fn smollm2_plan(n_batch: usize) -> MemoryPlan {
        // SmolLM2-135M: 30 layers, dim 576, 3 KV heads of 64, ffn 1536, vocab 49152.
        let (dim, kv_dim, ffn, vocab, layers, n_ctx) = (576, 192, 1536, 49152, 30, 4096);
        let b = n_batch;
        MemoryPlan {
            weights: 98_000_000,
            weight_tensors: 272,
            activation_elems: (b * dim * 3
                + b * dim * 2
                + b * kv_dim * 2
                + b * ffn * 2
                + dim
                + vocab) as u64,
            kv_elems: (layers * n_ctx * kv_dim) as u64,
            n_batch: b,
            max_cols: ffn,
            vector_elems: 61 * 576,
        }
    }

    #[test]
    fn every_compute_type_has_kernels_and_the_cpu_activation_format() {
        for &ty in quant::COMPUTE_TYPES {
            let k = type_kernels(ty).unwrap_or_else(|| panic!("{ty} has no GPU kernels"));
            let cpu = quant::dot::act_kind(ty).expect("compute type");
            let same = matches!(
                (k.act, cpu),
                (ActFormat::F32, quant::dot::ActKind::F32)
                    | (
                        ActFormat::Q8 { bs: 32 },
                        quant::dot::ActKind::Q8x32 { q8_1: false }
                    )
                    | (
                        ActFormat::Q8 {
                            bs: 0x1_0020 // 32 | Q8_1_SUMS
                        },
                        quant::dot::ActKind::Q8x32 { q8_1: true }
                    )
                    | (ActFormat::Q8 { bs: 256 }, quant::dot::ActKind::Q8xK)
            );
            assert!(same, "{ty}: GPU {:?} vs CPU {cpu:?}", k.act);
            if let ActFormat::Q8 { bs } = k.act {
                assert_eq!(q8_block(bs) as usize, ty.block_len(), "{ty}");
            }
        }
        assert_eq!(GPU_TYPES, quant::COMPUTE_TYPES);
        assert!(type_kernels(GgmlType::Q8K).is_none());
    }

    #[test]
    fn kernel_names_exist_in_the_sources() {
        let src = crate::gpu::kernels::embedded_sources();
        let names: Vec<String> = src
            .iter()
            .flat_map(|s| crate::gpu::kernels::kernel_names(&s.text))
            .collect();
        for &ty in GPU_TYPES {
            let k = type_kernels(ty).expect("kernels");
            for prefix in ["hs_mv_", "hs_dequant_rows_"] {
                let n = format!("{prefix}{}", k.suffix);
                assert!(names.contains(&n), "{n} is not defined in kernels/");
            }
            // A prompt's grouped expert products: a kernel of the type's own, or the `any` one,
            // whose run-time switch must know the type.
            if matches!(k.act, ActFormat::Q8 { .. }) {
                let own = super::super::moe::MM_OWN.contains(&k.suffix);
                let sfx = if own { k.suffix } else { "any" };
                for prefix in ["hs_moe_mm_gate_up_", "hs_moe_mm_down_"] {
                    let n = format!("{prefix}{sfx}");
                    assert!(names.contains(&n), "{n} is not defined in kernels/");
                }
                let gemm = &src
                    .iter()
                    .find(|s| s.name == "gemm")
                    .expect("gemm.hip")
                    .text;
                let case = format!("case {}: mm_dq16<", ty.id());
                assert!(own || gemm.contains(&case), "mm_dq16_any has no {case}");
            }
        }
        for n in [
            "hs_rms_norm_rows",
            "hs_add_bias_rows",
            "hs_add_inplace",
            "hs_swiglu_inplace",
            "hs_geglu_inplace",
            "hs_scale_inplace",
            "hs_rope",
            "hs_kv_store_f32",
            "hs_kv_store_f16",
            "hs_attention_f32",
            "hs_attention_f16",
            "hs_quantize_act",
            "hs_moe_route",
            "hs_moe_sort",
        ] {
            assert!(names.iter().any(|x| x == n), "{n} is not defined");
        }
        for kv in ["f32", "f16"] {
            for d in super::super::attention::TILED_HEAD_DIMS {
                let n = format!("hs_attention_tiled_{kv}_{d}");
                assert!(names.contains(&n), "{n} is not defined");
            }
        }
    }

    #[test]
    fn the_kernel_constants_match_the_sources() {
        let mut text: String = crate::gpu::kernels::embedded_sources()
            .iter()
            .map(|s| s.text.to_string())
            .collect();
        text.push_str(crate::gpu::kernels::PRELUDE);
        for (name, v) in [
            ("HS_MV_MAX_TOK", MV_MAX_TOKENS),
            ("HS_ATTN_MAX_HEAD_DIM", MAX_HEAD_DIM),
            ("HS_ROPE_MAX_PAIRS", MAX_ROPE_PAIRS),
        ] {
            assert!(
                text.contains(&format!("#define {name} {v}\n")),
                "{name} is not {v} in kernels/"
            );
        }
    }

    #[test]
    fn arena_plan_holds_weights_kv_activations_and_workspace() {
        let plan = smollm2_plan(512);
        let opts = ComputeOptions::default();
        let a = arena_plan(&plan, &opts);
        let w = a.size(Region::Weights);
        assert!(w >= plan.weights + plan.vector_elems * 4);
        assert!(w <= plan.weights + plan.vector_elems * 4 + 273 * ALIGN);
        // f16 cache: 30 × 4096 × 192 × 2 bytes, keys and values.
        assert_eq!(a.size(Region::KvCache), 2 * 30 * 4096 * 192 * 2);
        let f32kv = arena_plan(
            &plan,
            &ComputeOptions {
                kv: KvType::F32,
                ..opts
            },
        );
        assert_eq!(f32kv.size(Region::KvCache), 2 * a.size(Region::KvCache));
        assert!(a.size(Region::Activations) >= plan.activation_elems * 4);
        let ws = workspace_sizes(&plan, &opts);
        assert_eq!(ws.xq, 512 * 1536);
        assert_eq!(ws.xd, 512 * 48 * 8);
        assert_eq!(ws.xdq, 512 * 1536 * 4);
        assert_eq!(ws.tile, 64 << 20);
        assert!(
            a.size(Region::Workspace)
                >= ws.tokens + ws.xq + ws.xd + ws.xdq + ws.tile + ws.attn_part
        );
        // Decode-only batches never take the GEMM path: no tile, no dequantized input.
        let small = workspace_sizes(&smollm2_plan(8), &opts);
        assert_eq!((small.xdq, small.tile), (0, 0));
    }

    #[test]
    fn tiles_cover_the_matrix_within_the_budget() {
        // Llama-2-7B ffn_up: 11008 × 4096 in 64 MiB tiles.
        let r = tile_rows(11008, 4096, 64 << 20);
        assert_eq!(r, 4096);
        assert!(r as u64 * 4096 * 4 <= 64 << 20);
        assert_eq!(tile_rows(10, 4096, 64 << 20), 10);
        // A row wider than the budget still makes progress, one row at a time.
        assert_eq!(tile_rows(5, 1 << 30, 1024), 1);
        assert_eq!(tile_rows(1_000_000, 1, 1 << 40), MAX_GRID_Y);
    }

    #[test]
    fn matvec_chunks_and_grids() {
        assert_eq!(mv_chunks(1).collect::<Vec<_>>(), [(0, 1)]);
        assert_eq!(mv_chunks(8).collect::<Vec<_>>(), [(0, 8)]);
        assert_eq!(mv_chunks(19).collect::<Vec<_>>(), [(0, 8), (8, 8), (16, 3)]);
        assert_eq!(mv_chunks(0).count(), 0);
        // wave32: 4 rows per 128-thread block; wave64: 2.
        assert_eq!(mv_grid(576, 32), 144);
        assert_eq!(mv_grid(576, 64), 288);
        assert_eq!(mv_grid(1, 32), 1);
        // The wide one-token kernels take two rows a warp; the others one.
        assert_eq!(mv1_rows_per_warp("q4_0"), 2);
        assert_eq!(mv1_rows_per_warp("q4_k"), 2);
        assert_eq!(mv1_rows_per_warp("q6_k"), 1);
        assert_eq!(
            mv_grid(4096usize.div_ceil(mv1_rows_per_warp("q8_0")), 32),
            512
        );
        assert_eq!(elementwise_grid(0), 1);
        assert_eq!(elementwise_grid(1000), 4);
        assert_eq!(elementwise_grid(u64::MAX), 4096);
    }

    #[test]
    fn rope_step_matches_the_cpu_formula() {
        assert_eq!(rope_theta_scale(10000.0, 64), 10000f32.powf(-2.0 / 64.0));
        assert!((rope_theta_scale(10000.0, 2) - 1e-4).abs() < 1e-9);
    }

    #[test]
    fn kv_type_parses() {
        assert_eq!("F16".parse(), Ok(KvType::F16));
        assert_eq!("f32".parse(), Ok(KvType::F32));
        assert!("q8_0".parse::<KvType>().is_err());
    }
}
