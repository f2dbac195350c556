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

/// What runs one weight type on the GPU: the one row of the kernel type table. The kernels of
/// every type are generated from it — the compile units' type lists (`compute/units.rs` writes
/// them before `kernels/infer_matvec.hip` and `infer_dequant.hip`, whose X-macros expand them into
/// kernels) and the names the launchers find them by and label their launches with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeKernels {
    pub ty: GgmlType,
    /// Suffix of the kernel names: `hs_mv_<suffix>`, `hs_dequant_rows_<suffix>`.
    pub suffix: &'static str,
    pub act: ActFormat,
    /// Parts of 8 elements a block takes in the part-per-lane loop (`mv_part_<suffix>` in
    /// kernels/vecdot.h); 0 for float types.
    pub parts: u32,
    /// The one-token kernels run the wide loop (`mvw_<suffix>`: a lane per 32-element item,
    /// [`MV_WIDE_ROWS`] rows a warp) rather than the part-per-lane one.
    pub wide: bool,
    /// Has the activation-precision study's f32-activation kernels (`mvf_<suffix>`).
    pub f32_study: bool,
    /// A quantized type's grouped expert products (a prompt's experts, `kernels/gemm_moe.hip`)
    /// are kernels of its own (`hs_moe_mm_*_<suffix>`), not the `any` ones that pick the
    /// dequantization by the type's ggml id at run time.
    pub grouped_own: bool,
    pub names: KernelNames,
}

/// The kernels of one weight type and the labels of their launches (the Streams panel and hang
/// reports name the op by them). Float types have `mv`, `gate_up`, the dequantization kernels
/// and empty one-token names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelNames {
    /// Up to [`MV_MAX_TOKENS`] tokens (dense, or an expert chunk with the route as `ids`).
    pub mv: &'static str,
    /// Gate and up with the activation in the epilogue, up to [`MV_MAX_TOKENS`] tokens.
    pub gate_up: &'static str,
    /// One token, bias and residual add in the epilogue.
    pub mv1: &'static str,
    /// One token through gate and up, SwiGLU in the epilogue.
    pub swiglu: &'static str,
    /// One token through Q, K and V.
    pub qkv: &'static str,
    /// The study's f32-activation variants of mv1, swiglu, qkv (empty where there are none).
    pub mv1f: &'static str,
    pub swigluf: &'static str,
    pub qkvf: &'static str,
    /// Rows of a table to f32 (embeddings); row tiles to f16 (the prefill GEMM).
    pub dequant_rows: &'static str,
    pub dequant_tile: &'static str,
    /// Launch labels: mv, gate_up, mv1, mv1 with the residual add, swiglu, qkv, dequantization.
    pub label_mv: &'static str,
    pub label_gate_up: &'static str,
    pub label_mv1: &'static str,
    pub label_mv1_add: &'static str,
    pub label_swiglu: &'static str,
    pub label_qkv: &'static str,
    pub label_dequant: &'static str,
}

impl KernelNames {
    /// Every kernel name (empty where the type has no such kernel).
    pub fn kernels(&self) -> [&'static str; 10] {
        [
            self.mv,
            self.gate_up,
            self.mv1,
            self.swiglu,
            self.qkv,
            self.mv1f,
            self.swigluf,
            self.qkvf,
            self.dequant_rows,
            self.dequant_tile,
        ]
    }

    /// Every launch label (empty where the type has no such kernel).
    pub fn labels(&self) -> [&'static str; 7] {
        [
            self.label_mv,
            self.label_gate_up,
            self.label_mv1,
            self.label_mv1_add,
            self.label_swiglu,
            self.label_qkv,
            self.label_dequant,
        ]
    }
}

/// The type table's rows, each name made from the suffix at compile time.
macro_rules! type_table {
    (@q $s:literal, $p:literal) => { concat!($p, $s) };
    (@f $s:literal, $p:literal) => { "" };
    (@study true, $s:literal, $p:literal) => { concat!($p, $s) };
    (@study false, $s:literal, $p:literal) => { "" };
    ($($kind:ident $ty:ident $sfx:literal $act:expr, parts $parts:literal, wide $wide:literal,
       study $study:tt, grouped_own $own:literal;)*) => {
        /// Every weight type the GPU kernels handle, and how (see [`TypeKernels`]).
        pub const TYPE_TABLE: &[TypeKernels] = &[$(TypeKernels {
            ty: GgmlType::$ty,
            suffix: $sfx,
            act: $act,
            parts: $parts,
            wide: $wide,
            f32_study: $study,
            grouped_own: $own,
            names: KernelNames {
                mv: concat!("hs_mv_", $sfx),
                gate_up: concat!("hs_mv_gate_up_", $sfx),
                mv1: type_table!(@$kind $sfx, "hs_mv1_"),
                swiglu: type_table!(@$kind $sfx, "hs_mv_swiglu_"),
                qkv: type_table!(@$kind $sfx, "hs_mv_qkv_"),
                mv1f: type_table!(@study $study, $sfx, "hs_mv1f_"),
                swigluf: type_table!(@study $study, $sfx, "hs_mv_swigluf_"),
                qkvf: type_table!(@study $study, $sfx, "hs_mv_qkvf_"),
                dequant_rows: concat!("hs_dequant_rows_", $sfx),
                dequant_tile: concat!("hs_dequant_tile_", $sfx),
                label_mv: concat!("mv_", $sfx),
                label_gate_up: concat!("mv_gate_up_", $sfx),
                label_mv1: type_table!(@$kind $sfx, "mv1_"),
                label_mv1_add: concat!("mv1_", $sfx, " + residual"),
                label_swiglu: type_table!(@$kind $sfx, "mv_swiglu_"),
                label_qkv: type_table!(@$kind $sfx, "mv_qkv_"),
                label_dequant: concat!("dequant_", $sfx),
            },
        }),*];
    };
}

const Q8_32: ActFormat = ActFormat::Q8 { bs: 32 };
const Q8_1_32: ActFormat = ActFormat::Q8 { bs: 32 | Q8_1_SUMS };
const Q8_K: ActFormat = ActFormat::Q8 { bs: 256 };

// kind (q: quantized, f: float), type, suffix, activation, parts a block, wide one-token loop,
// f32-activation study kernels, grouped expert products of its own.
type_table! {
    f F32 "f32" ActFormat::F32, parts 0, wide false, study false, grouped_own false;
    f F16 "f16" ActFormat::F32, parts 0, wide false, study false, grouped_own false;
    f Bf16 "bf16" ActFormat::F32, parts 0, wide false, study false, grouped_own false;
    q Q4_0 "q4_0" Q8_32, parts 4, wide true, study true, grouped_own true;
    q Q4_1 "q4_1" Q8_1_32, parts 4, wide true, study true, grouped_own false;
    q Q5_0 "q5_0" Q8_32, parts 4, wide true, study false, grouped_own false;
    q Q5_1 "q5_1" Q8_1_32, parts 4, wide true, study false, grouped_own false;
    q Q8_0 "q8_0" Q8_32, parts 4, wide true, study false, grouped_own true;
    q Q4K "q4_k" Q8_K, parts 32, wide true, study false, grouped_own true;
    q Q5K "q5_k" Q8_K, parts 32, wide false, study false, grouped_own false;
    q Q6K "q6_k" Q8_K, parts 32, wide false, study false, grouped_own true;
    q Q2K "q2_k" Q8_K, parts 32, wide false, study false, grouped_own false;
    q Q3K "q3_k" Q8_K, parts 32, wide false, study false, grouped_own false;
    q Iq4Nl "iq4_nl" Q8_32, parts 4, wide false, study false, grouped_own false;
    q Iq4Xs "iq4_xs" Q8_K, parts 32, wide false, study false, grouped_own false;
    q Mxfp4 "mxfp4" Q8_32, parts 4, wide false, study false, grouped_own true;
}

/// What runs a weight type on the GPU, or `None` for a type the kernels do not handle.
pub fn type_kernels(ty: GgmlType) -> Option<TypeKernels> {
    TYPE_TABLE.iter().find(|k| k.ty == ty).copied()
}

/// A set of weight types, one bit per ggml id (every id the kernels handle is below 64).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TypeSet(u64);

impl TypeSet {
    pub fn insert(&mut self, ty: GgmlType) {
        if ty.id() < 64 {
            self.0 |= 1 << ty.id();
        }
    }

    pub fn contains(&self, ty: GgmlType) -> bool {
        ty.id() < 64 && self.0 & (1 << ty.id()) != 0
    }

    /// The types in the set that have kernels, in the type table's order.
    pub fn kernels(&self) -> impl Iterator<Item = &'static TypeKernels> + '_ {
        TYPE_TABLE.iter().filter(|k| self.contains(k.ty))
    }

    pub fn is_empty(&self) -> bool {
        self.0 == 0
    }
}

impl FromIterator<GgmlType> for TypeSet {
    fn from_iter<I: IntoIterator<Item = GgmlType>>(iter: I) -> Self {
        let mut s = TypeSet::default();
        for t in iter {
            s.insert(t);
        }
        s
    }
}

/// What a model launches on the GPU, as far as compiling goes: the types of its matrices (every
/// tensor of more than one row: the products and the embedding lookup) and whether it has
/// experts (routing, sorting and the grouped products of `infer_moe` and `gemm_moe`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelNeeds {
    pub types: TypeSet,
    pub moe: bool,
    /// The attention heads' dimension (the tiled prompt attention has a unit per dimension and
    /// cache type); 0 when unknown.
    pub head_dim: usize,
    /// The KV cache's element type (set from the backend's options when it opens).
    pub kv: KvType,
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
    /// The kernels to compile when the device opens: what this model launches
    /// (`model::loader::kernel_needs`); `None`: every kernel. Anything else is compiled when
    /// first needed.
    pub kernels: Option<KernelNeeds>,
    /// The one-token products take f32 activations where a kernel for it exists (Q4_0, Q4_1),
    /// instead of Q8 ones (`HIPSCOPE_MV_ACT=f32`: issue 13 item 8's measurement).
    pub mv_act_f32: bool,
    /// How the tracer times each op (`HIPSCOPE_TRACE_EVENTS`: kernel stamps or timed events).
    pub trace_events: crate::gpu::trace::device::TraceEvents,
    /// Launch overlap where the device has it (on unless `HIPSCOPE_PDL=0`).
    pub launch_overlap: bool,
}

impl Default for ComputeOptions {
    fn default() -> Self {
        ComputeOptions {
            kv: KvType::F16,
            prefill: PrefillGemm::Auto,
            gemm_min_tokens: 16,
            tile_bytes: 64 << 20,
            graphs: true,
            kernels: None,
            mv_act_f32: false,
            trace_events: crate::gpu::trace::device::TraceEvents::Stamps,
            launch_overlap: true,
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
    /// Token ids of one batch (u32), then each row's (sequence, position) (2 × u32) for a
    /// decode step of several sequences.
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
        tokens: n * 4 * 3,
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
    if plan.stage_bytes > 0 {
        a.add(Region::Weights, plan.stage_bytes);
    }
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

/// Rows a warp of the wide one-token kernels (`MVW_ROWS` in kernels/infer_matvec.hip).
pub const MV_WIDE_ROWS: usize = 2;

impl TypeKernels {
    /// Rows a warp of the one-token `hs_mv1_*` / `hs_mv_qkv_*` kernels.
    pub fn mv1_rows_per_warp(&self) -> usize {
        if self.wide { MV_WIDE_ROWS } else { 1 }
    }

    pub fn quantized(&self) -> bool {
        matches!(self.act, ActFormat::Q8 { .. })
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
            n_seq: 1,
            max_cols: ffn,
            vector_elems: 61 * 576,
            stage_bytes: 0,
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

    /// Every launch label and kernel name of a type names that type (before the table, a
    /// fallback arm labelled Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4 launches "mv_q6_k" in the
    /// Streams panel and in hang reports).
    #[test]
    fn every_types_labels_name_that_type() {
        for k in TYPE_TABLE {
            let all = k.names.kernels().into_iter().chain(k.names.labels());
            for name in all.into_iter().filter(|x| !x.is_empty()) {
                let tail = name.trim_end_matches(" + residual");
                assert!(
                    tail.ends_with(&format!("_{}", k.suffix)),
                    "{}: {name:?} does not name it",
                    k.ty
                );
            }
            assert_eq!(k.suffix, k.ty.name().to_ascii_lowercase(), "{}", k.ty);
        }
        let mut suffixes: Vec<&str> = TYPE_TABLE.iter().map(|k| k.suffix).collect();
        suffixes.sort_unstable();
        suffixes.dedup();
        assert_eq!(suffixes.len(), TYPE_TABLE.len(), "one row per type");
    }

    #[test]
    fn the_kernel_constants_match_the_sources() {
        let all = crate::gpu::kernels::KernelSources::embedded();
        let mut text: String = all
            .files
            .iter()
            .chain(&all.headers)
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
        let rows = |ty| type_kernels(ty).expect("row").mv1_rows_per_warp();
        assert_eq!(rows(GgmlType::Q4_0), 2);
        assert_eq!(rows(GgmlType::Q4K), 2);
        assert_eq!(rows(GgmlType::Q6K), 1);
        assert_eq!(mv_grid(4096usize.div_ceil(rows(GgmlType::Q8_0)), 32), 512);
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
