//! Dot products of weight rows against quantized activations: the CPU backend's hot path.
//!
//! As in llama.cpp, the activation (one row of `cols` floats per token) is quantized once per
//! matrix product, so that every weight block meets an 8-bit activation block and the inner loop
//! is integer multiply-adds:
//!
//! | weights                        | activation                                             |
//! |--------------------------------|--------------------------------------------------------|
//! | Q4_0, Q4_1, Q5_0, Q5_1, Q8_0   | `Q8x32`: 32 × i8 with a scale `d` and a sum term `s`   |
//! | Q4_K, Q5_K, Q6_K               | `Q8xK`: 256 × i8, f32 `d`, sums of each 16 quants      |
//! | F32, F16, BF16                 | the f32 activation itself                              |
//!
//! The activation is the one llama.cpp's x86 CPU backend makes (`quantize_row_q8_0`/`_q8_1`,
//! `quantize_row_q8_K_ref`): the same quants, and the scales rounded as it stores them (the
//! 32-element `d` to f16, Q8_1's sum term to f16 for Q4_1/Q5_1, Q8_K's `d` as `1 / iscale`;
//! `act::q8x32_scales`, `act::q8xk_scale`). Kept f32, these scales gave pure-Q2_K/Q3_K
//! perplexities about 1% away from llama.cpp's (docs/runs/quant-lowbit.txt).
//!
//! Differences from llama.cpp, on purpose: the 32-element activation always carries its sum
//! (Q8_1-style), so that Q4_0/Q5_0 use the same unsigned multiply-add as Q4_1/Q5_1 and fold
//! their offset (-8 / -16) into the sum term (exact: see `act::q8x32_scales`); and
//! float weights dot against the f32 activation (llama.cpp converts it to F16 first) because those
//! types serve as the precision reference for perplexity checks, and their dot product is bound
//! by memory, not arithmetic. Rounding is to nearest even in both the scalar and SIMD
//! quantizers, so the two produce identical activations.
//!
//! Each kernel exists as scalar code (the reference, and the fallback), as AVX2+FMA+F16C code and,
//! for the 32-element types, as AVX-512 VNNI code; the instruction set is chosen per CPU backend
//! (`CpuOptions::isa`: [`Isa::detect`] unless a lower one was asked for). A kernel computes up
//! to `MAX_TILE` tokens per pass over a weight row, so that prompt processing unpacks each weight
//! block once for several tokens. The 32-element kernels take blocks four at a time: the four
//! integer dot products are reduced into the lanes of one vector, so that one conversion and one
//! multiply by the four blocks' scales (`Group4`, prepared with the activation) replace four of
//! each.
//!
//! Files: `act.rs` (activation formats and their buffers), `scalar.rs` (the reference kernels),
//! `avx2/` (AVX2 kernels: `mod.rs` for the 32-element types, `kquants.rs` for K-quants and floats),
//! `avx512.rs` (AVX-512 VNNI kernels for the 32-element types), `packed.rs`,
//! `avx2_packed.rs` and `avx512_packed.rs` (weights repacked at first use, 16 rows interleaved,
//! and their GEMM kernels).

use super::blocks::{QK, QK_K};
use super::{GgmlType, QuantError};

mod act;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_packed;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_kquants;
#[cfg(target_arch = "x86_64")]
mod avx512_packed;
mod packed;
/// The AVX2 kernel over `packed`'s layout, reached from `packed` through here so that the layout
/// and the kernel reading it do not import each other.
#[cfg(target_arch = "x86_64")]
use avx2_packed::groups as packed_groups_avx2;
#[cfg(target_arch = "x86_64")]
use avx512_packed::{covers as packed_avx512_covers, groups as packed_groups_avx512};
mod scalar;

pub use act::*;
pub use packed::{PACK_MIN_TOKENS, PACK_ROWS, PACK_TILE, PackedMatrix};
pub use scalar::{quantize_q8x32_block, quantize_q8xk_block};

/// Tokens computed per pass over a weight row.
pub const MAX_TILE: usize = 4;

/// The instruction set a kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust; the numerical reference.
    Scalar,
    /// x86-64 AVX2 with FMA and F16C (Haswell, Zen and later).
    Avx2,
    /// AVX2 plus AVX-512 F, BW, VL and VNNI (Ice Lake, Zen 4 and later): the 32-element types
    /// run 512-bit `vpdpbusd` kernels, the others the AVX2 ones.
    Avx512,
}

impl Isa {
    /// The fastest instruction set this CPU runs.
    pub fn detect() -> Isa {
        [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .find(|i| i.is_available())
            .unwrap_or(Isa::Scalar)
    }

    /// The instruction set called `name` (as [`Isa::name`] writes it).
    pub fn from_name(name: &str) -> Option<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .find(|i| i.name() == name)
    }

    /// One line for people: the kernels' instruction set and what it needs, e.g.
    /// `avx512 (AVX-512 F/BW/VL/VNNI + AVX2/FMA/F16C)`.
    pub fn describe(self) -> String {
        let what = match self {
            Isa::Scalar => "portable Rust",
            Isa::Avx2 => "AVX2/FMA/F16C",
            Isa::Avx512 => "AVX-512 F/BW/VL/VNNI + AVX2/FMA/F16C",
        };
        format!("{} ({what})", self.name())
    }

    /// Whether this CPU can run kernels of this instruction set.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => false,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

/// Q8x32 blocks of `x` (whole blocks) with Q8_0's or (`q8_1`) Q8_1's scales, on `isa` where
/// available; identical results either way.
pub fn quantize_q8x32(isa: Isa, x: &[f32], q32: &mut [Q8x32], ds32: &mut [[f32; 2]], q8_1: bool) {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) && Isa::Avx2.is_available() {
        // SAFETY: AVX2/FMA/F16C presence checked just above.
        unsafe { avx2::quantize_q8x32(x, q32, ds32, q8_1) };
        return;
    }
    let _ = isa;
    for ((xb, q), ds) in x.as_chunks::<QK>().0.iter().zip(q32).zip(ds32) {
        *ds = scalar::quantize_q8x32_block(xb, &mut q.qs, q8_1);
    }
}

/// Q8xK blocks of `x` (whole blocks), on `isa` where available; identical results either way.
pub fn quantize_q8xk(isa: Isa, x: &[f32], qk: &mut [Q8xK]) {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) && Isa::Avx2.is_available() {
        // SAFETY: as above.
        unsafe { avx2::quantize_q8xk(x, qk) };
        return;
    }
    let _ = isa;
    for (xb, b) in x.as_chunks::<QK_K>().0.iter().zip(qk) {
        scalar::quantize_q8xk_block(xb, b);
    }
}

/// Bytes of one row of `cols` elements of `ty`.
pub fn row_bytes(ty: GgmlType, cols: usize) -> usize {
    cols / ty.block_len() * ty.block_bytes()
}

type KernelFn = unsafe fn(
    w: &[u8],
    rows: usize,
    cols: usize,
    act: &Activation,
    t0: usize,
    nt: usize,
    out: &mut [f32],
);

/// A dot-product kernel for one weight type and instruction set.
#[derive(Clone, Copy)]
pub struct Kernel {
    ty: GgmlType,
    isa: Isa,
    kind: ActKind,
    f: KernelFn,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({}, {})", self.ty, self.isa.name())
    }
}

impl Kernel {
    /// The kernel for `ty` on `isa`; falls back to scalar if `isa` is not available here.
    pub fn new(isa: Isa, ty: GgmlType) -> Result<Kernel, QuantError> {
        let kind = act_kind(ty)?;
        let isa = if isa.is_available() { isa } else { Isa::Scalar };
        let f: KernelFn = match isa {
            Isa::Scalar => scalar::kernel(ty),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2::kernel(ty),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => avx512::kernel(ty)
                .or_else(|| avx512_kquants::kernel(ty))
                .unwrap_or_else(|| avx2::kernel(ty)),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => scalar::kernel(ty),
        };
        Ok(Kernel { ty, isa, kind, f })
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// `out[r * nt + k] = row r of w · token t0 + k of act`, for `rows` consecutive rows in `w`
    /// and `nt` (1..=MAX_TILE) tokens.
    ///
    /// # Panics
    /// If the sizes disagree (a caller bug: the shapes come from the engine, not from a file).
    pub fn dot_rows(
        &self,
        w: &[u8],
        rows: usize,
        act: &Activation,
        t0: usize,
        nt: usize,
        out: &mut [f32],
    ) {
        let cols = act.cols;
        assert_eq!(act.kind, self.kind, "activation prepared for another type");
        assert!(
            cols.is_multiple_of(self.ty.block_len()),
            "{cols} cols not whole blocks"
        );
        assert_eq!(w.len(), rows * row_bytes(self.ty, cols), "weight rows size");
        assert!(
            (1..=MAX_TILE).contains(&nt) && t0 + nt <= act.n_tokens,
            "token tile"
        );
        assert!(out.len() >= rows * nt, "output size");
        // SAFETY: sizes checked above; `f` was chosen for an ISA verified present in `new`.
        unsafe { (self.f)(w, rows, cols, act, t0, nt, out) }
    }
}
