//! Matrix-vector and matrix-matrix products of quantized weights with f32 activations.
//!
//! `y[t·rows + r] = Σ_c W[r, c] · x[t·cols + c]`. The activation is quantized once per call (see
//! `quant::dot` for the formats), in parallel when it is large; the rows are cut into chunks that
//! threads claim from a shared counter (each starts with its own, so a short product costs one
//! atomic per thread), and within a chunk each weight row is computed against up to
//! `MAX_TILE` tokens per pass so that it is unpacked once for all of them while it sits in L1.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::pool::ThreadPool;
use crate::gpu::quant::dot::{
    Activation, ActivationParts, Isa, Kernel, MAX_TILE, PACK_ROWS, PACK_TILE, PackedMatrix,
    row_bytes,
};
use crate::gpu::quant::{GgmlType, QuantError, is_supported, unsupported};

/// A weight matrix as GGUF stores it: `rows` rows of `cols` elements, row-major (a tensor with
/// GGUF dims `[cols, rows]`).
#[derive(Clone, Copy, Debug)]
pub struct QuantMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl<'a> QuantMatrix<'a> {
    /// Checks that the type is one we compute on, that rows are whole blocks and that `data`
    /// holds exactly `rows` of them.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, QuantError> {
        if !is_supported(ty) {
            return Err(unsupported(ty));
        }
        let bad = |what: String| QuantError::BadMatrix {
            ty,
            rows,
            cols,
            what,
        };
        if !cols.is_multiple_of(ty.block_len()) {
            return Err(bad(format!(
                "a row of {cols} is not a whole number of {}-element blocks",
                ty.block_len()
            )));
        }
        let want = rows
            .checked_mul(row_bytes(ty, cols))
            .ok_or_else(|| bad("size overflows".into()))?;
        if data.len() != want {
            return Err(bad(format!("needs {want} bytes, got {}", data.len())));
        }
        Ok(QuantMatrix {
            ty,
            rows,
            cols,
            data,
        })
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        row_bytes(self.ty, self.cols)
    }

    fn assert_consistent(&self) {
        assert!(
            is_supported(self.ty)
                && self.cols.is_multiple_of(self.ty.block_len())
                && Some(self.data.len()) == self.rows.checked_mul(self.row_bytes()),
            "inconsistent QuantMatrix {} {}x{} with {} bytes (build it with QuantMatrix::new)",
            self.ty,
            self.rows,
            self.cols,
            self.data.len()
        );
    }
}

/// Reusable buffers for the quantized activation, so that steady state allocates nothing.
#[derive(Debug)]
pub struct MatmulScratch {
    isa: Isa,
    act: Activation,
}

impl Default for MatmulScratch {
    fn default() -> Self {
        Self::new()
    }
}

impl MatmulScratch {
    /// Scratch using the kernels of [`Isa::detect`] (the fastest this CPU runs).
    pub fn new() -> MatmulScratch {
        MatmulScratch::with_isa(Isa::detect())
    }

    /// Scratch using the kernels of `isa` (scalar ones where it is not available here).
    pub fn with_isa(isa: Isa) -> MatmulScratch {
        let isa = if isa.is_available() { isa } else { Isa::Scalar };
        MatmulScratch {
            isa,
            act: Activation::new(),
        }
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Quantizes `x` (`n_tokens` × `cols`) for weights of type `ty` and keeps it, for several
    /// products with the same input (`matmul_prepared`), e.g. the q, k and v projections.
    pub fn prepare(
        &mut self,
        pool: &ThreadPool,
        ty: GgmlType,
        x: &[f32],
        n_tokens: usize,
        cols: usize,
    ) -> Result<(), QuantError> {
        let isa = self.isa;
        let parts = self.act.prepare_for(ty, x, n_tokens, cols)?;
        let n_threads = pool.n_threads();
        // Below this the dispatch costs more than the quantization it would spread.
        const PARALLEL_MIN: usize = 16 * 1024;
        if n_threads == 1 || n_tokens < 2 || x.len() < PARALLEL_MIN {
            parts.fill(isa, x);
            return Ok(());
        }
        let kind = parts.kind;
        let per_token = |len: usize| len / n_tokens;
        let nf = per_token(parts.f.len());
        let n32 = per_token(parts.q32.len());
        let ng = per_token(parts.g32.len());
        let nk = per_token(parts.qk.len());
        let f = SharedMut::new(parts.f);
        let q32 = SharedMut::new(parts.q32);
        let ds32 = SharedMut::new(parts.ds32);
        let g32 = SharedMut::new(parts.g32);
        let qk = SharedMut::new(parts.qk);
        pool.run(&|i, n| {
            let (t0, t1) = (n_tokens * i / n, n_tokens * (i + 1) / n);
            // SAFETY: thread i alone touches tokens t0..t1 of each buffer.
            let part = unsafe {
                ActivationParts {
                    kind,
                    cols,
                    f: f.range(t0 * nf, t1 * nf),
                    q32: q32.range(t0 * n32, t1 * n32),
                    ds32: ds32.range(t0 * n32, t1 * n32),
                    g32: g32.range(t0 * ng, t1 * ng),
                    qk: qk.range(t0 * nk, t1 * nk),
                }
            };
            part.fill(isa, &x[t0 * cols..t1 * cols]);
        });
        Ok(())
    }
}

/// `y[t·rows + r] = Σ_c W[r, c] · x[t·cols + c]` for t in 0..n_tokens.
///
/// # Panics
/// If `x` or `y` do not hold `n_tokens` rows of `w.cols` / `w.rows` values, or `w` was built
/// without `QuantMatrix::new` and is inconsistent: shapes come from the engine, so these are bugs.
pub fn matmul(
    pool: &ThreadPool,
    w: &QuantMatrix,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
    scratch: &mut MatmulScratch,
) {
    w.assert_consistent();
    assert_eq!(
        x.len(),
        n_tokens * w.cols,
        "matmul input: {n_tokens} tokens of {}",
        w.cols
    );
    if let Err(e) = scratch.prepare(pool, w.ty, x, n_tokens, w.cols) {
        // Unreachable for a consistent matrix: its type and row length were checked above.
        panic!("matmul: {e}");
    }
    matmul_prepared(pool, w, scratch, y);
}

/// As `matmul`, with the activation `scratch.prepare` left for this weight type and width.
///
/// # Panics
/// If the prepared activation does not fit `w` (another activation format or width), or `y`
/// does not hold `rows` × the prepared number of tokens.
pub fn matmul_prepared(pool: &ThreadPool, w: &QuantMatrix, scratch: &MatmulScratch, y: &mut [f32]) {
    w.assert_consistent();
    let act = &scratch.act;
    let n_tokens = act.n_tokens();
    assert_eq!(act.cols(), w.cols, "prepared activation width");
    assert_eq!(
        y.len(),
        n_tokens * w.rows,
        "matmul output: {n_tokens} tokens of {}",
        w.rows
    );
    if n_tokens == 0 || w.rows == 0 {
        return;
    }
    let kernel = match Kernel::new(scratch.isa, w.ty) {
        Ok(k) => k,
        Err(e) => panic!("matmul: {e}"),
    };
    let rb = w.row_bytes();
    let chunk = chunk_rows(w.rows, rb, n_tokens, pool.n_threads());
    let n_chunks = w.rows.div_ceil(chunk);
    let next = AtomicUsize::new(pool.n_threads());
    let rows = w.rows;
    let out = SharedMut::new(y);
    let work = |first: usize| {
        let mut tile = [0f32; MAX_CHUNK * MAX_TILE];
        let mut c = first;
        while c < n_chunks {
            let (r0, r1) = (c * chunk, ((c + 1) * chunk).min(rows));
            let wr = &w.data[r0 * rb..r1 * rb];
            let mut t0 = 0;
            while t0 < n_tokens {
                let nt = (n_tokens - t0).min(MAX_TILE);
                kernel.dot_rows(wr, r1 - r0, act, t0, nt, &mut tile);
                for r in 0..r1 - r0 {
                    for k in 0..nt {
                        // SAFETY: rows r0..r1 of every token belong to this chunk alone.
                        unsafe { out.write((t0 + k) * rows + r0 + r, tile[r * nt + k]) };
                    }
                }
                t0 += nt;
            }
            c = next.fetch_add(1, Ordering::Relaxed);
        }
    };
    if n_chunks == 1 {
        work(0);
    } else {
        pool.run(&|i, _| work(i));
    }
}

/// `y[t·rows + r] = Σ_c W[r, c] · x[t·cols + c]` for weights repacked at load ([`PackedMatrix`]):
/// the same product as [`matmul`], 16 rows × up to [`PACK_TILE`] tokens per kernel pass.
///
/// # Panics
/// As [`matmul`].
pub fn matmul_packed(
    pool: &ThreadPool,
    w: &PackedMatrix,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
    scratch: &mut MatmulScratch,
) {
    assert_eq!(
        x.len(),
        n_tokens * w.cols(),
        "matmul input: {n_tokens} tokens of {}",
        w.cols()
    );
    if let Err(e) = scratch.prepare(pool, w.ty(), x, n_tokens, w.cols()) {
        panic!("matmul: {e}");
    }
    let act = &scratch.act;
    let rows = w.rows();
    assert_eq!(
        y.len(),
        n_tokens * rows,
        "matmul output: {n_tokens} tokens of {rows}"
    );
    if n_tokens == 0 || rows == 0 {
        return;
    }
    let groups = w.groups();
    let rb = row_bytes(w.ty(), w.cols());
    let chunk = chunk_rows(rows, rb, n_tokens, pool.n_threads()).div_ceil(PACK_ROWS);
    let n_chunks = groups.div_ceil(chunk);
    let next = AtomicUsize::new(pool.n_threads());
    let out = SharedMut::new(y);
    let work = |first: usize| {
        let mut tile = [0f32; MAX_CHUNK.div_ceil(PACK_ROWS) * PACK_ROWS * PACK_TILE];
        let mut c = first;
        while c < n_chunks {
            let (g0, g1) = (c * chunk, ((c + 1) * chunk).min(groups));
            let mut t0 = 0;
            while t0 < n_tokens {
                let nt = (n_tokens - t0).min(PACK_TILE);
                w.dot_groups(act, g0, g1, t0, nt, &mut tile);
                for g in g0..g1 {
                    let r0 = g * PACK_ROWS;
                    let n = PACK_ROWS.min(rows - r0);
                    for k in 0..nt {
                        let src = &tile[((g - g0) * nt + k) * PACK_ROWS..][..n];
                        // SAFETY: rows r0..r0 + n of every token belong to this chunk alone.
                        unsafe { out.range((t0 + k) * rows + r0, (t0 + k) * rows + r0 + n) }
                            .copy_from_slice(src);
                    }
                }
                t0 += nt;
            }
            c = next.fetch_add(1, Ordering::Relaxed);
        }
    };
    if n_chunks == 1 {
        work(0);
    } else {
        pool.run(&|i, _| work(i));
    }
}

/// The most rows in a chunk (bounds the per-thread output tile on the stack).
const MAX_CHUNK: usize = 128;

/// Rows per chunk: about four chunks per thread, so that a thread slowed by the OS leaves
/// work to the others; at least 8 rows so that claiming one costs little; and, with several
/// tokens, few enough rows that the chunk stays in L1/L2 while the token tiles pass over it.
fn chunk_rows(rows: usize, row_bytes: usize, n_tokens: usize, n_threads: usize) -> usize {
    let mut c = rows.div_ceil(4 * n_threads).max(8);
    if n_tokens > MAX_TILE {
        const CHUNK_BYTES: usize = 64 * 1024;
        c = c.min((CHUNK_BYTES / row_bytes.max(1)).max(8));
    }
    c.min(MAX_CHUNK)
}

/// A slice several threads write at disjoint indices.
struct SharedMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: access goes through the unsafe methods, whose callers guarantee disjointness.
unsafe impl<T: Send> Sync for SharedMut<'_, T> {}
unsafe impl<T: Send> Send for SharedMut<'_, T> {}

impl<'a, T> SharedMut<'a, T> {
    fn new(s: &'a mut [T]) -> Self {
        SharedMut {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _borrow: PhantomData,
        }
    }

    /// # Safety
    /// No other thread accesses index `i` concurrently.
    #[inline]
    unsafe fn write(&self, i: usize, v: T) {
        assert!(i < self.len);
        // SAFETY: in bounds; exclusive by the caller's contract.
        unsafe { self.ptr.add(i).write(v) }
    }

    /// # Safety
    /// No other thread accesses `a..b` while the returned slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn range(&self, a: usize, b: usize) -> &'a mut [T] {
        assert!(a <= b && b <= self.len);
        // SAFETY: in bounds; exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(a), b - a) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_balance_and_bound() {
        assert_eq!(chunk_rows(576, 360, 1, 2), 72);
        assert_eq!(chunk_rows(49152, 612, 1, 2), MAX_CHUNK);
        assert_eq!(chunk_rows(16, 360, 1, 2), 8);
        // Many tokens over wide rows: the chunk shrinks to stay in cache.
        assert_eq!(chunk_rows(576, 960, 64, 2), 68);
    }

    #[test]
    fn new_rejects_wrong_sizes_and_types() {
        let data = vec![0u8; 2 * 20];
        assert!(QuantMatrix::new(GgmlType::Q4_1, 2, 32, &data).is_ok());
        let e = QuantMatrix::new(GgmlType::Q4_1, 3, 32, &data).unwrap_err();
        assert!(e.to_string().contains("needs 60 bytes, got 40"), "{e}");
        let e = QuantMatrix::new(GgmlType::Q4_1, 2, 33, &data).unwrap_err();
        assert!(
            e.to_string()
                .contains("not a whole number of 32-element blocks"),
            "{e}"
        );
        let e = QuantMatrix::new(GgmlType::Iq2Xxs, 1, 256, &data).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("IQ2_XXS is not supported (supported: F32, F16"),
            "{e}"
        );
        let e = QuantMatrix::new(GgmlType::Q4_1, usize::MAX, 32, &data).unwrap_err();
        assert!(e.to_string().contains("overflows"), "{e}");
    }
}
