//! Weights repacked at first use for the CPU GEMM (prompt processing, and decode as well).
//!
//! As llama.cpp's CPU repack (`ggml-cpu/repack.cpp`) interleaves several rows per block, a
//! [`PackedMatrix`] stores each group of [`PACK_ROWS`] = 16 consecutive rows block by block so
//! that one 64-byte chunk holds four quant bytes of each of the 16 rows: 32-bit lane `i` belongs
//! to row `i` (a 256-bit half holds rows 0..8 or 8..16). A multiply-add of the chunk against four
//! activation bytes broadcast to every lane then advances 8 or 16 dot products by four elements
//! each, and after a block the integer sums sit one lane per row, ready for one conversion and
//! one multiply by the rows' scales. The file's layout (one row, one block at a time) needs a
//! horizontal reduction and a scale per block and row; here they are spent once per 8 rows.
//!
//! Layout of one group (16 rows, `nb` blocks; every group starts on a 64-byte boundary):
//! - Q4_0/Q4_1: quants, block after block, four 64-byte chunks per block, chunk `j` holding
//!   bytes `qs[4j..4j+4]` of each row (low nibble: element `4j+k`, high nibble: `16+4j+k`, as the
//!   file has them); then the 16 rows' f16 `d` of every block; then, for Q4_1 only, their f16 `m`.
//!   A value is `d·q + m`, with `m` = −8·d (Q4_0) or the stored `m` (Q4_1); the `m` term
//!   multiplies the activation's `d·Σq`.
//! - Q5_0/Q5_1/Q8_0: each row's 32 values widened to a byte each at the repack (Q5: the nibble
//!   and its fifth bit, 0..32; Q8_0: as stored, signed), eight 64-byte chunks per block, chunk `j`
//!   holding elements `4j..4j+4` of each row; then the f16 `d` of every block and, for Q5_1, the
//!   f16 `m`. A value is `d·q + m` with `m` = −16·d (Q5_0), the stored `m` (Q5_1) or 0 (Q8_0).
//! - Q4_K: per 256-element block, 32 quant chunks (chunk 8h + k holds `qs[32h + 4k..+4]` of each
//!   row: low nibbles are sub-block 2h, high ones 2h+1), the rows' six-bit scales and mins
//!   unpacked to a byte each, then their f16 d and dmin (offsets `Q4K_*`).
//!
//! Q4_0, Q4_1 and Q8_0 take exactly the file's bytes (a last group of fewer than 16 rows is padded
//! with zero rows); Q4_K takes 2.8% more (its scales unpacked), Q5_0 55% and Q5_1 50% more (their
//! five-bit values widened to bytes). The original stays in the file's
//! mapping for row lookups (embeddings), so a repacked matrix costs its size in memory once.
//!
//! The kernel is AVX2 (`avx2_packed.rs`), or on AVX-512 VNNI CPUs `avx512_packed.rs` for the
//! 32-element types (Q4_K stays on AVX2 there); other types (the other K-quants, IQ4_*, MXFP4,
//! floats) and the portable path compute on the file's layout.

use super::{GgmlType, Isa};
use crate::gpu::quant::blocks::{QK, QK_K, k_scale_min, k_scales};

/// Offsets inside a packed Q4_K block of 16 rows: 32 quant chunks, the 8 six-bit scales of each
/// row (`[sub-block][row]`, u8), its 8 mins as pairs (`[pair][row][2]`, u8, widened to i16 pairs
/// for `vpmaddwd` against pairs of activation sums), then the rows' f16 d and dmin.
pub(super) const Q4K_SC: usize = 2048;
pub(super) const Q4K_MIN: usize = Q4K_SC + 128;
pub(super) const Q4K_D: usize = Q4K_MIN + 128;
pub(super) const Q4K_DMIN: usize = Q4K_D + 32;
pub(super) const Q4K_BLOCK: usize = Q4K_DMIN + 32;

/// Rows interleaved per group.
pub const PACK_ROWS: usize = 16;

/// Tokens computed per pass over a group of packed rows.
pub const PACK_TILE: usize = 4;

/// The fewest tokens of a product that runs on the packed copy. Decode (one token) reads the
/// file's layout: measured on the 2-core AVX2 machine, the packed kernel's single-token pass was
/// slower than the row kernel there (tg32 of a Qwen2.5-0.5B-shape Q4_0, `-t 1`: 4.7–5.1 t/s
/// against 7.8–8.6), while prompts gain (pp256: 27–32 t/s against 17–18).
pub const PACK_MIN_TOKENS: usize = PACK_TILE;

/// The packed formats: how one block of one row is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PackFmt {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
}

impl PackFmt {
    fn of(ty: GgmlType) -> Option<PackFmt> {
        Some(match ty {
            GgmlType::Q4_0 => PackFmt::Q4_0,
            GgmlType::Q4_1 => PackFmt::Q4_1,
            GgmlType::Q5_0 => PackFmt::Q5_0,
            GgmlType::Q5_1 => PackFmt::Q5_1,
            GgmlType::Q8_0 => PackFmt::Q8_0,
            GgmlType::Q4K => PackFmt::Q4K,
            _ => return None,
        })
    }

    /// Bytes of one block of the original type.
    fn src_bytes(self) -> usize {
        match self {
            PackFmt::Q4_0 => 18,
            PackFmt::Q4_1 => 20,
            PackFmt::Q5_0 => 22,
            PackFmt::Q5_1 => 24,
            PackFmt::Q8_0 => 34,
            PackFmt::Q4K => 144,
        }
    }

    /// Elements per block.
    pub(super) fn block_len(self) -> usize {
        if self == PackFmt::Q4K { QK_K } else { QK }
    }

    /// Quant bytes of one block of a whole group (for Q4_K, the whole packed block: quants,
    /// scales, mins, d and dmin).
    pub(super) fn quant_bytes(self) -> usize {
        match self {
            PackFmt::Q4_0 | PackFmt::Q4_1 => 256,
            PackFmt::Q5_0 | PackFmt::Q5_1 | PackFmt::Q8_0 => 512,
            PackFmt::Q4K => Q4K_BLOCK,
        }
    }

    /// f16 scale arrays per block after all the quants (d, and m for Q4_1; none for Q4_K, whose
    /// scales sit in each block).
    pub(super) fn scale_arrays(self) -> usize {
        match self {
            PackFmt::Q4_1 | PackFmt::Q5_1 => 2,
            PackFmt::Q4K => 0,
            _ => 1,
        }
    }
}

/// Row `i` of a packed Q4_K block `q` from the file's block `src`. Quant chunk `c` = 8·h + k
/// (h = 0..4 a 64-element half, k = 0..8) holds bytes `qs[32h + 4k..+4]` of each row: low
/// nibbles are elements 64h + 4k.. (sub-block 2h), high nibbles 64h + 32 + 4k.. (sub-block 2h+1).
fn pack_q4k_row(src: &[u8], i: usize, q: &mut [u8]) {
    let qs = &src[16..144];
    for c in 0..32 {
        let (h, k) = (c / 8, c % 8);
        q[c * 64 + i * 4..][..4].copy_from_slice(&qs[32 * h + 4 * k..][..4]);
    }
    let sc = k_scales(src);
    for s in 0..8 {
        let (scale, min) = k_scale_min(s, &sc);
        q[Q4K_SC + s * PACK_ROWS + i] = scale;
        q[Q4K_MIN + (s / 2) * 2 * PACK_ROWS + i * 2 + s % 2] = min;
    }
    q[Q4K_D + 2 * i..][..2].copy_from_slice(&src[0..2]);
    q[Q4K_DMIN + 2 * i..][..2].copy_from_slice(&src[2..4]);
}

/// The 32 values of one Q5_0/Q5_1/Q8_0 block `src`, a byte each (Q5: 0..32, unsigned; Q8_0: the
/// stored signed bytes).
fn widen_row(fmt: PackFmt, src: &[u8]) -> [u8; QK] {
    let five = |qh: &[u8], qs: &[u8]| {
        let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        std::array::from_fn(|e| {
            let low = if e < 16 { qs[e] & 0xF } else { qs[e - 16] >> 4 };
            low | ((((h >> e) & 1) as u8) << 4)
        })
    };
    match fmt {
        PackFmt::Q5_0 => five(&src[2..6], &src[6..22]),
        PackFmt::Q5_1 => five(&src[4..8], &src[8..24]),
        PackFmt::Q8_0 => std::array::from_fn(|e| src[2 + e]),
        _ => unreachable!("{fmt:?} is not a byte format"),
    }
}

/// 64 bytes, so that every group starts on a cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A weight matrix repacked for the packed kernels (see the module documentation).
pub struct PackedMatrix {
    ty: GgmlType,
    /// Whether the AVX-512 kernel runs it (asked for, present here, and one for the format).
    avx512: bool,
    pub(super) fmt: PackFmt,
    rows: usize,
    cols: usize,
    /// Bytes of one group, a multiple of 64.
    pub(super) group_bytes: usize,
    lines: Vec<Line>,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedMatrix({} {}x{}, {} bytes)",
            self.ty,
            self.rows,
            self.cols,
            self.bytes()
        )
    }
}

impl PackedMatrix {
    /// The weight types repacked when the kernels run on `isa` (none: the file's layout serves),
    /// where repacking is on (`CpuOptions::repack`).
    pub fn packed_types(isa: Isa) -> Vec<GgmlType> {
        use GgmlType::*;
        [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4K]
            .into_iter()
            .filter(|&t| Self::packs(isa, t))
            .collect()
    }

    /// Whether weights of `ty` are repacked when the kernels run on `isa` (where repacking is
    /// on).
    pub fn packs(isa: Isa, ty: GgmlType) -> bool {
        matches!(isa, Isa::Avx2 | Isa::Avx512) && isa.is_available() && PackFmt::of(ty).is_some()
    }

    /// `rows` rows of `cols` elements of `ty` from `data` (as the file stores them) repacked for
    /// `isa`, or `None` where that instruction set has no packed kernel for the type (the portable
    /// path, and types other than Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q4_K). `None` too
    /// for a shape that is not whole blocks or a `data` of the wrong size (the caller checked the
    /// matrix already and runs the unpacked kernels on it).
    pub fn new(
        isa: Isa,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Option<PackedMatrix> {
        if !Self::packs(isa, ty) {
            return None;
        }
        let fmt = PackFmt::of(ty)?;
        if cols == 0 || !cols.is_multiple_of(fmt.block_len()) {
            return None;
        }
        let nb = cols / fmt.block_len();
        let sb = fmt.src_bytes();
        if Some(data.len()) != rows.checked_mul(nb * sb) {
            return None;
        }
        let raw = nb * (fmt.quant_bytes() + fmt.scale_arrays() * 2 * PACK_ROWS);
        let group_bytes = raw.div_ceil(64) * 64;
        let groups = rows.div_ceil(PACK_ROWS);
        let mut lines = vec![Line([0; 64]); groups * group_bytes / 64];
        // SAFETY: `Line` is 64 plain bytes; the slice covers exactly the vector's storage.
        let out: &mut [u8] = unsafe {
            std::slice::from_raw_parts_mut(lines.as_mut_ptr() as *mut u8, lines.len() * 64)
        };
        let qb = fmt.quant_bytes();
        for (g, dst) in out.chunks_exact_mut(group_bytes).enumerate() {
            let (quants, scales) = dst.split_at_mut(nb * qb);
            for i in 0..PACK_ROWS.min(rows - g * PACK_ROWS) {
                let row = &data[(g * PACK_ROWS + i) * nb * sb..][..nb * sb];
                for (b, src) in row.chunks_exact(sb).enumerate() {
                    let q = &mut quants[b * qb..(b + 1) * qb];
                    if fmt == PackFmt::Q4K {
                        pack_q4k_row(src, i, q);
                        continue;
                    }
                    let d = &mut scales[(b * PACK_ROWS + i) * 2..][..2];
                    d.copy_from_slice(&src[..2]);
                    match fmt {
                        PackFmt::Q4_0 | PackFmt::Q4_1 => {
                            let off = if fmt == PackFmt::Q4_0 { 2 } else { 4 };
                            for j in 0..4 {
                                q[j * 64 + i * 4..][..4]
                                    .copy_from_slice(&src[off + 4 * j..off + 4 * j + 4]);
                            }
                        }
                        PackFmt::Q5_0 | PackFmt::Q5_1 | PackFmt::Q8_0 => {
                            let v = widen_row(fmt, src);
                            for j in 0..8 {
                                q[j * 64 + i * 4..][..4].copy_from_slice(&v[4 * j..4 * j + 4]);
                            }
                        }
                        PackFmt::Q4K => unreachable!("packed above"),
                    }
                    if fmt.scale_arrays() == 2 {
                        let m = &mut scales[(nb + b) * PACK_ROWS * 2 + i * 2..][..2];
                        m.copy_from_slice(&src[2..4]);
                    }
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        let avx512 = isa == Isa::Avx512 && super::packed_avx512_covers(fmt);
        #[cfg(not(target_arch = "x86_64"))]
        let avx512 = false;
        Some(PackedMatrix {
            ty,
            avx512,
            fmt,
            rows,
            cols,
            group_bytes,
            lines,
        })
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Groups of [`PACK_ROWS`] rows (the last one possibly padded).
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(PACK_ROWS)
    }

    /// Bytes held (the memory the repack costs).
    pub fn bytes(&self) -> usize {
        self.lines.len() * 64
    }

    /// Groups `g0..g1`, as bytes.
    pub(super) fn group_data(&self, g0: usize, g1: usize) -> &[u8] {
        assert!(g0 <= g1 && g1 <= self.groups(), "groups {g0}..{g1}");
        // SAFETY: `Line` is 64 plain bytes; the range lies inside the vector.
        unsafe {
            std::slice::from_raw_parts(
                (self.lines.as_ptr() as *const u8).add(g0 * self.group_bytes),
                (g1 - g0) * self.group_bytes,
            )
        }
    }

    /// `out[(g − g0)·nt·16 + k·16 + i]` = row `16g + i` · token `t0 + k` of `act`, for groups
    /// `g0..g1` and `nt` (1..=[`PACK_TILE`]) tokens; padding rows come out 0.
    ///
    /// # Panics
    /// If the activation is not a Q8x32 one of this matrix's width, the token tile lies outside
    /// it, or `out` is short (caller bugs: the shapes come from the engine).
    pub fn dot_groups(
        &self,
        act: &super::Activation,
        g0: usize,
        g1: usize,
        t0: usize,
        nt: usize,
        out: &mut [f32],
    ) {
        let want = super::act_kind(self.ty).ok();
        assert_eq!(Some(act.kind), want, "activation kind");
        assert_eq!(act.cols, self.cols, "activation width");
        assert!(
            (1..=PACK_TILE).contains(&nt) && t0 + nt <= act.n_tokens,
            "token tile"
        );
        assert!(out.len() >= (g1 - g0) * nt * PACK_ROWS, "output size");
        let data = self.group_data(g0, g1);
        #[cfg(target_arch = "x86_64")]
        {
            if self.avx512 {
                // SAFETY: sizes checked above; `new` made `avx512` true only for a format the
                // kernel covers on a CPU with AVX-512 VNNI (`packs` checks availability).
                return unsafe {
                    super::packed_groups_avx512(self, data, g1 - g0, act, t0, nt, out)
                };
            }
            assert!(Isa::Avx2.is_available(), "packed kernels need AVX2");
            // SAFETY: sizes checked above; AVX2/FMA/F16C checked just above.
            unsafe { super::packed_groups_avx2(self, data, g1 - g0, act, t0, nt, out) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = data;
            unreachable!("PackedMatrix::new packs only on x86-64 with AVX2");
        }
    }
}
