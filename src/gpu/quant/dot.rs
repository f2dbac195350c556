//! Dot products of weight rows against quantized activations: the CPU backend's hot path.
//!
//! As in llama.cpp, the activation (one row of `cols` floats per token) is quantized once per
//! matrix product, so that every weight block meets an 8-bit activation block and the inner loop
//! is integer multiply-adds:
//!
//! | weights                        | activation                                             |
//! |--------------------------------|--------------------------------------------------------|
//! | Q4_0, Q4_1, Q5_0, Q5_1, Q8_0   | `Q8x32`: 32 × i8 with an f32 scale `d` and `d·Σq`      |
//! | Q4_K, Q5_K, Q6_K               | `Q8xK`: 256 × i8, f32 `d`, sums of each 16 quants      |
//! | F32, F16, BF16                 | the f32 activation itself                              |
//!
//! Differences from llama.cpp, on purpose: the activation scales stay f32 (llama.cpp rounds the
//! Q8_0/Q8_1 scale to f16), which is both more precise and saves a conversion per block; the
//! 32-element activation always carries its sum (Q8_1-style), so that Q4_0/Q5_0 use the same
//! unsigned multiply-add as Q4_1/Q5_1 and fold their offset (-8 / -16) into the sum term; and
//! float weights dot against the f32 activation (llama.cpp converts it to F16 first) because those
//! types serve as the precision reference for perplexity checks, and their dot product is bound
//! by memory, not arithmetic. Rounding is to nearest even in both the scalar and SIMD
//! quantizers, so the two produce identical activations.
//!
//! Each kernel exists as scalar code (the reference, and the fallback) and as AVX2+FMA+F16C code
//! selected at run time. A kernel computes up to `MAX_TILE` tokens per pass over a weight row, so
//! that prompt processing unpacks each weight block once for several tokens. The 32-element
//! kernels take blocks four at a time: the four integer dot products are reduced into the lanes
//! of one vector, so that one conversion and one multiply by the four blocks' scales
//! (`Group4`, prepared with the activation) replace four of each.

use super::blocks::{QK, QK_K, f16_at, k_scale_min, layout};
use super::{GgmlType, QuantError};

/// Tokens computed per pass over a weight row.
pub const MAX_TILE: usize = 4;

/// The instruction set a kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust; the numerical reference.
    Scalar,
    /// x86-64 AVX2 with FMA and F16C (Haswell, Zen and later).
    Avx2,
}

impl Isa {
    /// The fastest instruction set this CPU runs.
    pub fn detect() -> Isa {
        if Isa::Avx2.is_available() {
            Isa::Avx2
        } else {
            Isa::Scalar
        }
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
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 => false,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
        }
    }
}

/// 32 quantized activation values (aligned so that a SIMD load never splits a cache line).
#[repr(C, align(32))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q8x32 {
    pub qs: [i8; QK],
}

/// 256 quantized activation values with the sums of each 16 and their f32 scale.
#[repr(C, align(32))]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q8xK {
    pub qs: [i8; QK_K],
    pub bsums: [i16; 16],
    pub d: f32,
}

impl Default for Q8xK {
    fn default() -> Self {
        Q8xK {
            qs: [0; QK_K],
            bsums: [0; 16],
            d: 0.0,
        }
    }
}

/// The activation scales of four consecutive Q8x32 blocks, laid out for the SIMD kernels:
/// `d = [d0, d1, d2, d3, d0, d1, d2, d3]` and `s = [s0, s1, s2, s3, 0, 0, 0, 0]` (s = d·Σq), so
/// that one multiply scales the per-block dot products of a whole group.
#[repr(C, align(32))]
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Group4 {
    pub d: [f32; 8],
    pub s: [f32; 8],
}

/// Blocks per `Group4`.
pub const GROUP: usize = 4;

/// The activation format a weight type computes against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActKind {
    F32,
    Q8x32,
    Q8xK,
}

/// The activation format for weights of `ty`, or the unsupported-type error.
pub fn act_kind(ty: GgmlType) -> Result<ActKind, QuantError> {
    use GgmlType::*;
    match ty {
        F32 | F16 | Bf16 => Ok(ActKind::F32),
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 => Ok(ActKind::Q8x32),
        Q4K | Q5K | Q6K => Ok(ActKind::Q8xK),
        _ => Err(super::unsupported(ty)),
    }
}

/// The activation of `n_tokens` tokens × `cols`, in the format one weight type needs. Buffers
/// are kept between uses, so that steady-state matrix products allocate nothing.
#[derive(Debug)]
pub struct Activation {
    kind: ActKind,
    n_tokens: usize,
    cols: usize,
    f: Vec<f32>,
    q32: Vec<Q8x32>,
    ds32: Vec<[f32; 2]>,
    g32: Vec<Group4>,
    qk: Vec<Q8xK>,
}

impl Default for Activation {
    fn default() -> Self {
        Self::new()
    }
}

/// Mutable views of an activation's buffers, for filling them (possibly from several threads,
/// token range by token range).
pub struct ActivationParts<'a> {
    pub kind: ActKind,
    pub cols: usize,
    pub f: &'a mut [f32],
    pub q32: &'a mut [Q8x32],
    pub ds32: &'a mut [[f32; 2]],
    /// `cols / (32·GROUP)` per token (whole groups only; the last blocks of a row may have none).
    pub g32: &'a mut [Group4],
    pub qk: &'a mut [Q8xK],
}

impl ActivationParts<'_> {
    /// Quantizes `x` into these buffers; `x` holds as many whole tokens as the buffers.
    pub fn fill(self, isa: Isa, x: &[f32]) {
        match self.kind {
            ActKind::F32 => self.f.copy_from_slice(&x[..self.f.len()]),
            ActKind::Q8x32 => {
                quantize_q8x32(isa, x, self.q32, self.ds32);
                let nb = self.cols / QK;
                let ng = nb / GROUP;
                if ng > 0 {
                    for (ds, g) in self
                        .ds32
                        .chunks_exact(nb)
                        .zip(self.g32.chunks_exact_mut(ng))
                    {
                        for (dsg, gv) in ds.chunks_exact(GROUP).zip(g.iter_mut()) {
                            for (j, v) in dsg.iter().enumerate() {
                                gv.d[j] = v[0];
                                gv.d[j + GROUP] = v[0];
                                gv.s[j] = v[1];
                            }
                        }
                    }
                }
            }
            ActKind::Q8xK => quantize_q8xk(isa, x, self.qk),
        }
    }
}

impl Activation {
    pub fn new() -> Activation {
        Activation {
            kind: ActKind::F32,
            n_tokens: 0,
            cols: 0,
            f: Vec::new(),
            q32: Vec::new(),
            ds32: Vec::new(),
            g32: Vec::new(),
            qk: Vec::new(),
        }
    }

    pub fn kind(&self) -> ActKind {
        self.kind
    }

    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Sizes the buffers for `n_tokens` × `cols` of `kind` (contents unspecified until filled),
    /// and returns them. `cols` must be a multiple of the format's block length.
    pub fn prepare(
        &mut self,
        ty: GgmlType,
        n_tokens: usize,
        cols: usize,
    ) -> Result<ActivationParts<'_>, QuantError> {
        let kind = act_kind(ty)?;
        let bl = match kind {
            ActKind::F32 => 1,
            ActKind::Q8x32 => QK,
            ActKind::Q8xK => QK_K,
        };
        if !cols.is_multiple_of(bl) {
            return Err(QuantError::PartialBlock {
                ty,
                elements: cols,
                block_len: bl,
            });
        }
        let n = n_tokens.checked_mul(cols).ok_or(QuantError::BadMatrix {
            ty,
            rows: n_tokens,
            cols,
            what: "activation size overflows".into(),
        })?;
        self.kind = kind;
        self.n_tokens = n_tokens;
        self.cols = cols;
        let (f, q32, qk) = match kind {
            ActKind::F32 => (n, 0, 0),
            ActKind::Q8x32 => (0, n / QK, 0),
            ActKind::Q8xK => (0, 0, n / QK_K),
        };
        // Grow only: shrinking and regrowing would reallocate between prompt and decode steps.
        grow(&mut self.f, f, 0.0);
        grow(&mut self.q32, q32, Q8x32 { qs: [0; QK] });
        grow(&mut self.ds32, q32, [0.0; 2]);
        let g32 = if kind == ActKind::Q8x32 {
            n_tokens * (cols / QK / GROUP)
        } else {
            0
        };
        grow(&mut self.g32, g32, Group4::default());
        grow(&mut self.qk, qk, Q8xK::default());
        Ok(ActivationParts {
            kind,
            cols,
            f: &mut self.f[..f],
            q32: &mut self.q32[..q32],
            ds32: &mut self.ds32[..q32],
            g32: &mut self.g32[..g32],
            qk: &mut self.qk[..qk],
        })
    }

    /// [`Activation::prepare`] for the input `x`, which must hold `n_tokens` rows of `cols`.
    pub fn prepare_for(
        &mut self,
        ty: GgmlType,
        x: &[f32],
        n_tokens: usize,
        cols: usize,
    ) -> Result<ActivationParts<'_>, QuantError> {
        if Some(x.len()) != n_tokens.checked_mul(cols) {
            return Err(QuantError::BadMatrix {
                ty,
                rows: n_tokens,
                cols,
                what: format!("activation has {} values", x.len()),
            });
        }
        self.prepare(ty, n_tokens, cols)
    }

    /// Quantizes `x` (`n_tokens` rows of `cols`) for weights of type `ty`.
    pub fn quantize(
        &mut self,
        isa: Isa,
        ty: GgmlType,
        x: &[f32],
        n_tokens: usize,
        cols: usize,
    ) -> Result<(), QuantError> {
        self.prepare_for(ty, x, n_tokens, cols)?.fill(isa, x);
        Ok(())
    }

    /// The Q8x32 blocks and their [d, d·Σq] of token `t`.
    pub fn q8x32(&self, t: usize) -> (&[Q8x32], &[[f32; 2]]) {
        let nb = self.cols / QK;
        (
            &self.q32[t * nb..(t + 1) * nb],
            &self.ds32[t * nb..(t + 1) * nb],
        )
    }

    /// The Q8xK blocks of token `t`.
    pub fn q8xk(&self, t: usize) -> &[Q8xK] {
        let nb = self.cols / QK_K;
        &self.qk[t * nb..(t + 1) * nb]
    }

    /// The f32 values of token `t`.
    pub fn f32s(&self, t: usize) -> &[f32] {
        &self.f[t * self.cols..(t + 1) * self.cols]
    }

    /// The activation as floats again (d·q), for error analysis in tests.
    pub fn dequantized(&self, t: usize) -> Vec<f32> {
        match self.kind {
            ActKind::F32 => self.f32s(t).to_vec(),
            ActKind::Q8x32 => {
                let (qs, ds) = self.q8x32(t);
                qs.iter()
                    .zip(ds)
                    .flat_map(|(q, d)| q.qs.map(|v| v as f32 * d[0]))
                    .collect()
            }
            ActKind::Q8xK => self
                .q8xk(t)
                .iter()
                .flat_map(|b| b.qs.map(|v| v as f32 * b.d))
                .collect(),
        }
    }
}

fn grow<T: Copy>(v: &mut Vec<T>, n: usize, fill: T) {
    if v.len() < n {
        v.resize(n, fill);
    }
}

/// Q8x32 blocks of `x` (whole blocks), on `isa` where available; identical results either way.
pub fn quantize_q8x32(isa: Isa, x: &[f32], q32: &mut [Q8x32], ds32: &mut [[f32; 2]]) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && isa.is_available() {
        // SAFETY: AVX2/FMA/F16C presence checked just above.
        unsafe { avx2::quantize_q8x32(x, q32, ds32) };
        return;
    }
    let _ = isa;
    for ((xb, q), ds) in x.as_chunks::<QK>().0.iter().zip(q32).zip(ds32) {
        *ds = quantize_q8x32_block(xb, &mut q.qs);
    }
}

/// Q8xK blocks of `x` (whole blocks), on `isa` where available; identical results either way.
pub fn quantize_q8xk(isa: Isa, x: &[f32], qk: &mut [Q8xK]) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && isa.is_available() {
        // SAFETY: as above.
        unsafe { avx2::quantize_q8xk(x, qk) };
        return;
    }
    let _ = isa;
    for (xb, b) in x.as_chunks::<QK_K>().0.iter().zip(qk) {
        quantize_q8xk_block(xb, b);
    }
}

/// Scalar Q8x32: d = max|x| / 127, q = x · 127 / max|x| rounded to nearest even; returns
/// [d, d·Σq].
pub fn quantize_q8x32_block(x: &[f32; QK], qs: &mut [i8; QK]) -> [f32; 2] {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(x) {
        let r = (v * id).round_ties_even() as i32;
        *q = r.clamp(-128, 127) as i8;
        sum += *q as i32;
    }
    [d, d * sum as f32]
}

/// Scalar Q8xK, with the same rounding as Q8x32 over 256 values.
pub fn quantize_q8xk_block(x: &[f32; QK_K], b: &mut Q8xK) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    b.d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    for (q, &v) in b.qs.iter_mut().zip(x) {
        *q = ((v * id).round_ties_even() as i32).clamp(-128, 127) as i8;
    }
    for (j, s) in b.bsums.iter_mut().enumerate() {
        *s = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum();
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
            Isa::Scalar => scalar_kernel(ty),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2::kernel(ty),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 => scalar_kernel(ty),
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

// ---------------------------------------------------------------------------------------------
// Scalar kernels (the reference).

fn scalar_kernel(ty: GgmlType) -> KernelFn {
    use GgmlType::*;
    match ty {
        F32 => scalar_rows::<ScF32>,
        F16 => scalar_rows::<ScF16>,
        Bf16 => scalar_rows::<ScBf16>,
        Q4_0 => scalar_rows::<ScQ4_0>,
        Q4_1 => scalar_rows::<ScQ4_1>,
        Q5_0 => scalar_rows::<ScQ5_0>,
        Q5_1 => scalar_rows::<ScQ5_1>,
        Q8_0 => scalar_rows::<ScQ8_0>,
        Q4K => scalar_rows::<ScQ4K>,
        Q5K => scalar_rows::<ScQ5K>,
        _ => scalar_rows::<ScQ6K>,
    }
}

/// One weight row against one token, in portable code.
trait ScalarDot {
    const TY: GgmlType;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32;
}

unsafe fn scalar_rows<S: ScalarDot>(
    w: &[u8],
    rows: usize,
    cols: usize,
    act: &Activation,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    let rb = row_bytes(S::TY, cols);
    for r in 0..rows {
        let row = &w[r * rb..(r + 1) * rb];
        for k in 0..nt {
            out[r * nt + k] = S::dot(row, act, t0 + k);
        }
    }
}

struct ScF32;
impl ScalarDot for ScF32 {
    const TY: GgmlType = GgmlType::F32;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32 {
        let x = act.f32s(t);
        w.as_chunks::<4>()
            .0
            .iter()
            .zip(x)
            .fold(0.0, |s, (b, &v)| s + f32::from_le_bytes(*b) * v)
    }
}

struct ScF16;
impl ScalarDot for ScF16 {
    const TY: GgmlType = GgmlType::F16;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32 {
        let x = act.f32s(t);
        w.as_chunks::<2>().0.iter().zip(x).fold(0.0, |s, (b, &v)| {
            s + super::f16_to_f32(u16::from_le_bytes(*b)) * v
        })
    }
}

struct ScBf16;
impl ScalarDot for ScBf16 {
    const TY: GgmlType = GgmlType::Bf16;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32 {
        let x = act.f32s(t);
        w.as_chunks::<2>().0.iter().zip(x).fold(0.0, |s, (b, &v)| {
            s + super::blocks::bf16_to_f32(u16::from_le_bytes(*b)) * v
        })
    }
}

/// The 32-element types as `(d, m)` and 32 integer quants, where the value is `d·q + m`
/// (Q4_0/Q5_0 have m = -8d / -16d in this form, so that q is unsigned as in the SIMD kernels).
trait Scalar32 {
    const TY: GgmlType;
    const BYTES: usize;
    fn unpack(b: &[u8], q: &mut [i32; QK]) -> (f32, f32);
}

impl<S: Scalar32> ScalarDot for S {
    const TY: GgmlType = S::TY;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32 {
        let (qa, ds) = act.q8x32(t);
        let mut q = [0i32; QK];
        let mut sum = 0.0f32;
        for ((b, a), ds) in w.chunks_exact(S::BYTES).zip(qa).zip(ds) {
            let (d, m) = S::unpack(b, &mut q);
            let sumi: i32 = q.iter().zip(&a.qs).map(|(&x, &y)| x * y as i32).sum();
            sum += d * ds[0] * sumi as f32 + m * ds[1];
        }
        sum
    }
}

fn nibbles(qs: &[u8], q: &mut [i32; QK]) {
    for j in 0..16 {
        q[j] = (qs[j] & 0xF) as i32;
        q[j + 16] = (qs[j] >> 4) as i32;
    }
}

fn fifth_bits(qh: &[u8], q: &mut [i32; QK]) {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    for (j, v) in q.iter_mut().enumerate() {
        *v |= (((h >> j) & 1) << 4) as i32;
    }
}

struct ScQ4_0;
impl Scalar32 for ScQ4_0 {
    const TY: GgmlType = GgmlType::Q4_0;
    const BYTES: usize = layout::Q4_0;
    fn unpack(b: &[u8], q: &mut [i32; QK]) -> (f32, f32) {
        nibbles(&b[2..18], q);
        let d = f16_at(b, 0);
        (d, d * -8.0)
    }
}

struct ScQ4_1;
impl Scalar32 for ScQ4_1 {
    const TY: GgmlType = GgmlType::Q4_1;
    const BYTES: usize = layout::Q4_1;
    fn unpack(b: &[u8], q: &mut [i32; QK]) -> (f32, f32) {
        nibbles(&b[4..20], q);
        (f16_at(b, 0), f16_at(b, 2))
    }
}

struct ScQ5_0;
impl Scalar32 for ScQ5_0 {
    const TY: GgmlType = GgmlType::Q5_0;
    const BYTES: usize = layout::Q5_0;
    fn unpack(b: &[u8], q: &mut [i32; QK]) -> (f32, f32) {
        nibbles(&b[6..22], q);
        fifth_bits(&b[2..6], q);
        let d = f16_at(b, 0);
        (d, d * -16.0)
    }
}

struct ScQ5_1;
impl Scalar32 for ScQ5_1 {
    const TY: GgmlType = GgmlType::Q5_1;
    const BYTES: usize = layout::Q5_1;
    fn unpack(b: &[u8], q: &mut [i32; QK]) -> (f32, f32) {
        nibbles(&b[8..24], q);
        fifth_bits(&b[4..8], q);
        (f16_at(b, 0), f16_at(b, 2))
    }
}

struct ScQ8_0;
impl Scalar32 for ScQ8_0 {
    const TY: GgmlType = GgmlType::Q8_0;
    const BYTES: usize = layout::Q8_0;
    fn unpack(b: &[u8], q: &mut [i32; QK]) -> (f32, f32) {
        for (v, &x) in q.iter_mut().zip(&b[2..34]) {
            *v = x as i8 as i32;
        }
        (f16_at(b, 0), 0.0)
    }
}

/// Σ over a Q4_K/Q5_K super-block: d·Σ_j sc_j·(q·a)_j − dmin·Σ_j m_j·(Σa)_j, all in integers
/// except the two final scales.
fn k_superblock(d: f32, dmin: f32, sc: &[u8; 12], q: &[i32; QK_K], a: &Q8xK) -> f32 {
    let (mut sumi, mut summ) = (0i32, 0i32);
    for j in 0..8 {
        let (s, m) = k_scale_min(j, sc);
        let dot: i32 = (0..32)
            .map(|l| q[32 * j + l] * a.qs[32 * j + l] as i32)
            .sum();
        sumi += s as i32 * dot;
        summ += m as i32 * (a.bsums[2 * j] as i32 + a.bsums[2 * j + 1] as i32);
    }
    a.d * d * sumi as f32 - a.d * dmin * summ as f32
}

struct ScQ4K;
impl ScalarDot for ScQ4K {
    const TY: GgmlType = GgmlType::Q4K;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32 {
        let mut q = [0i32; QK_K];
        let mut sum = 0.0f32;
        for (b, a) in w.chunks_exact(layout::Q4_K).zip(act.q8xk(t)) {
            let qs = &b[layout::Q4_K_QS..];
            for c in 0..4 {
                for l in 0..32 {
                    q[64 * c + l] = (qs[32 * c + l] & 0xF) as i32;
                    q[64 * c + 32 + l] = (qs[32 * c + l] >> 4) as i32;
                }
            }
            sum += k_superblock(
                f16_at(b, 0),
                f16_at(b, 2),
                &super::blocks::k_scales(b),
                &q,
                a,
            );
        }
        sum
    }
}

struct ScQ5K;
impl ScalarDot for ScQ5K {
    const TY: GgmlType = GgmlType::Q5K;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32 {
        let mut q = [0i32; QK_K];
        let mut sum = 0.0f32;
        for (b, a) in w.chunks_exact(layout::Q5_K).zip(act.q8xk(t)) {
            let qh = &b[layout::Q5_K_QH..layout::Q5_K_QH + 32];
            let qs = &b[layout::Q5_K_QS..];
            for c in 0..4 {
                for l in 0..32 {
                    let h0 = ((qh[l] >> (2 * c)) & 1) << 4;
                    let h1 = ((qh[l] >> (2 * c + 1)) & 1) << 4;
                    q[64 * c + l] = ((qs[32 * c + l] & 0xF) | h0) as i32;
                    q[64 * c + 32 + l] = ((qs[32 * c + l] >> 4) | h1) as i32;
                }
            }
            sum += k_superblock(
                f16_at(b, 0),
                f16_at(b, 2),
                &super::blocks::k_scales(b),
                &q,
                a,
            );
        }
        sum
    }
}

struct ScQ6K;
impl ScalarDot for ScQ6K {
    const TY: GgmlType = GgmlType::Q6K;
    fn dot(w: &[u8], act: &Activation, t: usize) -> f32 {
        let mut sum = 0.0f32;
        for (b, a) in w.chunks_exact(layout::Q6_K).zip(act.q8xk(t)) {
            let ql = &b[..128];
            let qh = &b[layout::Q6_K_QH..layout::Q6_K_QH + 64];
            let sc = &b[layout::Q6_K_SCALES..layout::Q6_K_SCALES + 16];
            let mut q = [0i32; QK_K];
            for h in 0..2 {
                for l in 0..32 {
                    let hb = qh[32 * h + l];
                    let (lo, hi) = (ql[64 * h + l], ql[64 * h + l + 32]);
                    q[128 * h + l] = ((lo & 0xF) | ((hb & 3) << 4)) as i32 - 32;
                    q[128 * h + l + 32] = ((hi & 0xF) | (((hb >> 2) & 3) << 4)) as i32 - 32;
                    q[128 * h + l + 64] = ((lo >> 4) | (((hb >> 4) & 3) << 4)) as i32 - 32;
                    q[128 * h + l + 96] = ((hi >> 4) | (((hb >> 6) & 3) << 4)) as i32 - 32;
                }
            }
            let mut sumi = 0i32;
            for g in 0..16 {
                let dot: i32 = (0..16)
                    .map(|l| q[16 * g + l] * a.qs[16 * g + l] as i32)
                    .sum();
                sumi += (sc[g] as i8) as i32 * dot;
            }
            sum += a.d * f16_at(b, layout::Q6_K_D) * sumi as f32;
        }
        sum
    }
}

// ---------------------------------------------------------------------------------------------
// AVX2 kernels.

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // indexing per token keeps the accumulators in registers
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    pub(super) fn kernel(ty: GgmlType) -> KernelFn {
        use GgmlType::*;
        match ty {
            F32 => rows_f::<F32w>,
            F16 => rows_f::<F16w>,
            Bf16 => rows_f::<Bf16w>,
            Q4_0 => rows_32::<B4_0>,
            Q4_1 => rows_32::<B4_1>,
            Q5_0 => rows_32::<B5_0>,
            Q5_1 => rows_32::<B5_1>,
            Q8_0 => rows_32::<B8_0>,
            Q4K => rows_k::<K4>,
            Q5K => rows_k::<K5>,
            _ => rows_k::<K6>,
        }
    }

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }

    // --- activation quantization ---

    /// Q8x32 blocks of x, the same numbers as `quantize_q8x32_block`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_q8x32(x: &[f32], q32: &mut [Q8x32], ds32: &mut [[f32; 2]]) {
        let sign = _mm256_set1_ps(-0.0);
        let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for ((xb, q), ds) in x.as_chunks::<QK>().0.iter().zip(q32).zip(ds32) {
            // SAFETY: xb is 32 floats, q.qs 32 bytes; unaligned loads/stores.
            unsafe {
                let p = xb.as_ptr();
                let v = [
                    _mm256_loadu_ps(p),
                    _mm256_loadu_ps(p.add(8)),
                    _mm256_loadu_ps(p.add(16)),
                    _mm256_loadu_ps(p.add(24)),
                ];
                let m = _mm256_max_ps(
                    _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                    _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
                );
                let amax = hmax(m);
                let d = amax / 127.0;
                let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
                // cvtps rounds to nearest even under the default MXCSR, like round_ties_even.
                let i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], id));
                let i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], id));
                let i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], id));
                let i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], id));
                let s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
                let sum = hsum_i32(s);
                let p16a = _mm256_packs_epi32(i0, i1);
                let p16b = _mm256_packs_epi32(i2, i3);
                let p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), perm);
                _mm256_storeu_si256(q.qs.as_mut_ptr() as *mut __m256i, p8);
                *ds = [d, d * sum as f32];
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_q8xk(x: &[f32], qk: &mut [Q8xK]) {
        let sign = _mm256_set1_ps(-0.0);
        let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (xb, b) in x.as_chunks::<QK_K>().0.iter().zip(qk) {
            // SAFETY: xb is 256 floats, b.qs 256 bytes, b.bsums 16 × i16.
            unsafe {
                let p = xb.as_ptr();
                let mut m = _mm256_setzero_ps();
                for i in 0..32 {
                    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * i))));
                }
                let amax = hmax(m);
                b.d = amax / 127.0;
                let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
                for c in 0..8 {
                    let pc = p.add(32 * c);
                    let i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(pc), id));
                    let i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(pc.add(8)), id));
                    let i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(pc.add(16)), id));
                    let i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(pc.add(24)), id));
                    let p8 = _mm256_permutevar8x32_epi32(
                        _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3)),
                        perm,
                    );
                    _mm256_storeu_si256(b.qs.as_mut_ptr().add(32 * c) as *mut __m256i, p8);
                }
            }
            for (j, sum) in b.bsums.iter_mut().enumerate() {
                *sum = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum();
            }
        }
    }

    #[inline(always)]
    unsafe fn hmax(m: __m256) -> f32 {
        unsafe {
            let m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
            let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            _mm_cvtss_f32(m4)
        }
    }

    #[inline(always)]
    unsafe fn hsum_i32(v: __m256i) -> i32 {
        unsafe {
            let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
            _mm_cvtsi128_si32(s)
        }
    }

    // --- 32-element types against Q8x32 ---

    /// Bytes ahead of the current weight block to prefetch (a prefetch never faults, so running
    /// past the end of the matrix is harmless).
    const PREFETCH: usize = 4096;

    /// A 32-element weight block type as the SIMD kernel sees it.
    trait Blk32 {
        const BYTES: usize;
        /// Quants are signed (Q8_0), needing the sign trick before `maddubs`.
        const SIGNED: bool;
        /// Whether the [d, m] product's second lane matters.
        const HAS_M: bool;
        /// The 32 quants as bytes (unsigned unless SIGNED).
        unsafe fn quants(p: *const u8) -> __m256i;
        /// [d, m, 0, 0] where a value is d·q + m.
        unsafe fn dm(p: *const u8) -> __m128;
        /// For the GROUP blocks from p: ([d0, d1, d2, d3] twice, [m0, m1, m2, m3] twice).
        unsafe fn group_dm(p: *const u8) -> (__m256, __m256);
    }

    /// The f16 `d` of four consecutive blocks of `bytes` each, as [d0..d3] twice.
    #[inline(always)]
    unsafe fn group_d(p: *const u8, bytes: usize) -> __m256 {
        unsafe {
            let h = |j: usize| (p.add(j * bytes) as *const u16).read_unaligned() as i16;
            let d = _mm_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), 0, 0, 0, 0));
            _mm256_set_m128(d, d)
        }
    }

    /// The f16 pairs (d, m) of four consecutive blocks of `bytes` each, as ([d0..d3] twice,
    /// [m0..m3] twice).
    #[inline(always)]
    unsafe fn group_dm_pairs(p: *const u8, bytes: usize) -> (__m256, __m256) {
        unsafe {
            let u = |j: usize| (p.add(j * bytes) as *const u32).read_unaligned() as i32;
            let v = _mm256_cvtph_ps(_mm_setr_epi32(u(0), u(1), u(2), u(3)));
            (
                _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)),
                _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7)),
            )
        }
    }

    /// 32 nibbles from 16 bytes: low nibbles in bytes 0..16, high nibbles in 16..32.
    #[inline(always)]
    unsafe fn nibbles32(p: *const u8) -> __m256i {
        unsafe {
            let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
            let v = _mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4));
            _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
        }
    }

    /// 0x10 in byte j where bit j of the little-endian u32 at p is set.
    #[inline(always)]
    unsafe fn fifth_bits32(p: *const u8) -> __m256i {
        unsafe {
            let h = (p as *const u32).read_unaligned() as i32;
            let shuf = _mm256_setr_epi64x(
                0,
                0x0101_0101_0101_0101,
                0x0202_0202_0202_0202,
                0x0303_0303_0303_0303,
            );
            let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(h), shuf);
            let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
            _mm256_and_si256(set, _mm256_set1_epi8(0x10))
        }
    }

    #[inline(always)]
    unsafe fn half1(p: *const u8) -> __m128 {
        unsafe { _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const u16).read_unaligned() as i32)) }
    }

    #[inline(always)]
    unsafe fn half2(p: *const u8) -> __m128 {
        unsafe { _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const u32).read_unaligned() as i32)) }
    }

    struct B4_0;
    impl Blk32 for B4_0 {
        const BYTES: usize = layout::Q4_0;
        const SIGNED: bool = false;
        const HAS_M: bool = true;
        #[inline(always)]
        unsafe fn quants(p: *const u8) -> __m256i {
            unsafe { nibbles32(p.add(2)) }
        }
        #[inline(always)]
        unsafe fn dm(p: *const u8) -> __m128 {
            unsafe {
                let d = half1(p);
                _mm_mul_ps(_mm_shuffle_ps::<0>(d, d), _mm_setr_ps(1.0, -8.0, 0.0, 0.0))
            }
        }
        #[inline(always)]
        unsafe fn group_dm(p: *const u8) -> (__m256, __m256) {
            unsafe {
                let d = group_d(p, Self::BYTES);
                (d, _mm256_mul_ps(d, _mm256_set1_ps(-8.0)))
            }
        }
    }

    struct B4_1;
    impl Blk32 for B4_1 {
        const BYTES: usize = layout::Q4_1;
        const SIGNED: bool = false;
        const HAS_M: bool = true;
        #[inline(always)]
        unsafe fn quants(p: *const u8) -> __m256i {
            unsafe { nibbles32(p.add(4)) }
        }
        #[inline(always)]
        unsafe fn dm(p: *const u8) -> __m128 {
            unsafe { half2(p) }
        }
        #[inline(always)]
        unsafe fn group_dm(p: *const u8) -> (__m256, __m256) {
            unsafe { group_dm_pairs(p, Self::BYTES) }
        }
    }

    struct B5_0;
    impl Blk32 for B5_0 {
        const BYTES: usize = layout::Q5_0;
        const SIGNED: bool = false;
        const HAS_M: bool = true;
        #[inline(always)]
        unsafe fn quants(p: *const u8) -> __m256i {
            unsafe { _mm256_or_si256(nibbles32(p.add(6)), fifth_bits32(p.add(2))) }
        }
        #[inline(always)]
        unsafe fn dm(p: *const u8) -> __m128 {
            unsafe {
                let d = half1(p);
                _mm_mul_ps(_mm_shuffle_ps::<0>(d, d), _mm_setr_ps(1.0, -16.0, 0.0, 0.0))
            }
        }
        #[inline(always)]
        unsafe fn group_dm(p: *const u8) -> (__m256, __m256) {
            unsafe {
                let d = group_d(p, Self::BYTES);
                (d, _mm256_mul_ps(d, _mm256_set1_ps(-16.0)))
            }
        }
    }

    struct B5_1;
    impl Blk32 for B5_1 {
        const BYTES: usize = layout::Q5_1;
        const SIGNED: bool = false;
        const HAS_M: bool = true;
        #[inline(always)]
        unsafe fn quants(p: *const u8) -> __m256i {
            unsafe { _mm256_or_si256(nibbles32(p.add(8)), fifth_bits32(p.add(4))) }
        }
        #[inline(always)]
        unsafe fn dm(p: *const u8) -> __m128 {
            unsafe { half2(p) }
        }
        #[inline(always)]
        unsafe fn group_dm(p: *const u8) -> (__m256, __m256) {
            unsafe { group_dm_pairs(p, Self::BYTES) }
        }
    }

    struct B8_0;
    impl Blk32 for B8_0 {
        const BYTES: usize = layout::Q8_0;
        const SIGNED: bool = true;
        const HAS_M: bool = false;
        #[inline(always)]
        unsafe fn quants(p: *const u8) -> __m256i {
            unsafe { _mm256_loadu_si256(p.add(2) as *const __m256i) }
        }
        #[inline(always)]
        unsafe fn dm(p: *const u8) -> __m128 {
            unsafe { half1(p) }
        }
        #[inline(always)]
        unsafe fn group_dm(p: *const u8) -> (__m256, __m256) {
            unsafe { (group_d(p, Self::BYTES), _mm256_setzero_ps()) }
        }
    }

    /// Defines `$name::<B>`, which runs `$tiled::<B, T>` with the token tile `T` (1..=4) as a
    /// constant, so that each token's accumulators stay in registers.
    macro_rules! tile_dispatch {
        ($name:ident, $tiled:ident, $bound:ident) => {
            unsafe fn $name<B: $bound>(
                w: &[u8],
                rows: usize,
                cols: usize,
                act: &Activation,
                t0: usize,
                nt: usize,
                out: &mut [f32],
            ) {
                // SAFETY: the caller (Kernel::dot_rows) checked sizes; Kernel::new checked the
                // ISA.
                unsafe {
                    match nt {
                        1 => $tiled::<B, 1>(w, rows, cols, act, t0, out),
                        2 => $tiled::<B, 2>(w, rows, cols, act, t0, out),
                        3 => $tiled::<B, 3>(w, rows, cols, act, t0, out),
                        _ => $tiled::<B, 4>(w, rows, cols, act, t0, out),
                    }
                }
            }
        };
    }

    tile_dispatch!(rows_32, rows_32_t, Blk32);

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows_32_t<B: Blk32, const T: usize>(
        w: &[u8],
        rows: usize,
        cols: usize,
        act: &Activation,
        t0: usize,
        out: &mut [f32],
    ) {
        let nb = cols / QK;
        let ng = nb / GROUP;
        let rb = nb * B::BYTES;
        let qa = act.q32[t0 * nb..(t0 + T) * nb].as_ptr();
        let ds = act.ds32[t0 * nb..(t0 + T) * nb].as_ptr();
        let gs = act.g32[t0 * ng..(t0 + T) * ng].as_ptr();
        let ones = _mm256_set1_epi16(1);
        for r in 0..rows {
            // SAFETY: row r spans rb bytes inside w; the token tile spans T·nb blocks of qa/ds
            // and T·ng groups of gs.
            unsafe {
                let row = w.as_ptr().add(r * rb);
                let mut acc = [_mm256_setzero_ps(); T];
                // The min terms get their own chain when few tokens leave the FMA latency exposed.
                let mut accm = [_mm256_setzero_ps(); T];
                for g in 0..ng {
                    let p = row.add(g * GROUP * B::BYTES);
                    // Decode streams the weights from DRAM once: ask for them ahead of time.
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + 64) as *const i8);
                    let (wd, wm) = B::group_dm(p);
                    let qx: [__m256i; GROUP] =
                        std::array::from_fn(|j| B::quants(p.add(j * B::BYTES)));
                    let ax: [__m256i; GROUP] = std::array::from_fn(|j| {
                        if B::SIGNED {
                            _mm256_sign_epi8(qx[j], qx[j])
                        } else {
                            qx[j]
                        }
                    });
                    for t in 0..T {
                        let a = qa.add(t * nb + g * GROUP);
                        let dot = |j: usize| {
                            let qy = _mm256_load_si256(a.add(j) as *const __m256i);
                            let qy = if B::SIGNED {
                                _mm256_sign_epi8(qy, qx[j])
                            } else {
                                qy
                            };
                            _mm256_madd_epi16(_mm256_maddubs_epi16(ax[j], qy), ones)
                        };
                        // Lane j (mod 4) of the sum holds half of block j's dot product.
                        let h = _mm256_hadd_epi32(
                            _mm256_hadd_epi32(dot(0), dot(1)),
                            _mm256_hadd_epi32(dot(2), dot(3)),
                        );
                        let gv = &*gs.add(t * ng + g);
                        let sc = _mm256_mul_ps(wd, _mm256_load_ps(gv.d.as_ptr()));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), sc, acc[t]);
                        if B::HAS_M {
                            let s = _mm256_load_ps(gv.s.as_ptr());
                            if T <= 2 {
                                accm[t] = _mm256_fmadd_ps(wm, s, accm[t]);
                            } else {
                                acc[t] = _mm256_fmadd_ps(wm, s, acc[t]);
                            }
                        }
                    }
                }
                // The blocks after the last whole group, one at a time.
                let mut acc1 = [_mm_setzero_ps(); T];
                for b in ng * GROUP..nb {
                    step_32::<B, T>(row, b, nb, qa, ds, ones, &mut accm, &mut acc1);
                }
                for t in 0..T {
                    let mut s = hsum(_mm256_add_ps(acc[t], accm[t]));
                    if B::HAS_M {
                        s += _mm_cvtss_f32(_mm_movehdup_ps(acc1[t]));
                    }
                    *out.get_unchecked_mut(r * T + t) = s;
                }
            }
        }
    }

    /// Block b of a row against T tokens: acc += d_w·d_a·(q·a) per lane, accm lane 1 += m_w·s_a.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn step_32<B: Blk32, const T: usize>(
        row: *const u8,
        b: usize,
        nb: usize,
        qa: *const Q8x32,
        ds: *const [f32; 2],
        ones: __m256i,
        acc: &mut [__m256; T],
        accm: &mut [__m128; T],
    ) {
        unsafe {
            let p = row.add(b * B::BYTES);
            let qx = B::quants(p);
            let dm = B::dm(p);
            let ax = if B::SIGNED {
                _mm256_sign_epi8(qx, qx)
            } else {
                qx
            };
            for t in 0..T {
                let qy = _mm256_load_si256(qa.add(t * nb + b) as *const __m256i);
                let qy = if B::SIGNED {
                    _mm256_sign_epi8(qy, qx)
                } else {
                    qy
                };
                let p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, qy), ones);
                let dsa = _mm_castpd_ps(_mm_load_sd(ds.add(t * nb + b) as *const f64));
                let prod = _mm_mul_ps(dm, dsa);
                acc[t] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), _mm256_broadcastss_ps(prod), acc[t]);
                if B::HAS_M {
                    accm[t] = _mm_add_ps(accm[t], prod);
                }
            }
        }
    }

    // --- K types against Q8xK ---

    trait BlkK {
        const BYTES: usize;
        /// Adds this super-block's contribution for each of T tokens to acc.
        unsafe fn superblock<const T: usize>(
            p: *const u8,
            a: [*const Q8xK; T],
            acc: &mut [__m256; T],
        );
    }

    /// Byte-pair shuffles broadcasting i16 scale k of a 128-bit lane to all 16 of its i16s.
    #[inline(always)]
    unsafe fn scale_shuffle(k: usize) -> __m256i {
        unsafe { _mm256_set1_epi16((((2 * k + 1) << 8) | (2 * k)) as i16) }
    }

    /// Q4_K/Q5_K scales and mins as 16 × i16: [sc0..sc7, m0..m7].
    #[inline(always)]
    unsafe fn k_scales_mins(p: *const u8) -> __m256i {
        unsafe {
            let s = p.add(layout::K_SCALES);
            let u0 = (s as *const u32).read_unaligned();
            let u1 = (s.add(4) as *const u32).read_unaligned();
            let u2 = (s.add(8) as *const u32).read_unaligned();
            const M1: u32 = 0x3f3f_3f3f;
            const M2: u32 = 0x0f0f_0f0f;
            const M3: u32 = 0x0303_0303;
            let sc_lo = u0 & M1;
            let sc_hi = (u2 & M2) | (((u0 >> 6) & M3) << 4);
            let mn_lo = u1 & M1;
            let mn_hi = ((u2 >> 4) & M2) | (((u1 >> 6) & M3) << 4);
            _mm256_cvtepu8_epi16(_mm_setr_epi32(
                sc_lo as i32,
                sc_hi as i32,
                mn_lo as i32,
                mn_hi as i32,
            ))
        }
    }

    /// The mins term of Q4_K/Q5_K: −d_a·dmin·Σ_j m_j·(Σa)_j, added to acc as 4 partial lanes.
    #[inline(always)]
    unsafe fn k_mins<const T: usize>(
        dmin: f32,
        mins: __m128i,
        a: [*const Q8xK; T],
        acc: &mut [__m256; T],
    ) {
        unsafe {
            for t in 0..T {
                let bs = _mm256_load_si256((*a[t]).bsums.as_ptr() as *const __m256i);
                let q8s = _mm_hadd_epi16(
                    _mm256_castsi256_si128(bs),
                    _mm256_extracti128_si256::<1>(bs),
                );
                let prod = _mm_cvtepi32_ps(_mm_madd_epi16(mins, q8s));
                let f = _mm256_set1_ps(-(*a[t]).d * dmin);
                acc[t] = _mm256_fmadd_ps(f, _mm256_zextps128_ps256(prod), acc[t]);
            }
        }
    }

    struct K4;
    impl BlkK for K4 {
        const BYTES: usize = layout::Q4_K;
        #[inline(always)]
        unsafe fn superblock<const T: usize>(
            p: *const u8,
            a: [*const Q8xK; T],
            acc: &mut [__m256; T],
        ) {
            unsafe {
                let dd = half2(p);
                let (d, dmin) = (_mm_cvtss_f32(dd), _mm_cvtss_f32(_mm_movehdup_ps(dd)));
                let ms = k_scales_mins(p);
                k_mins::<T>(dmin, _mm256_extracti128_si256::<1>(ms), a, acc);
                let sc = _mm256_permute2x128_si256::<0>(ms, ms);
                let m4 = _mm256_set1_epi8(0x0F);
                let mut sumi = [_mm256_setzero_si256(); T];
                let q = p.add(layout::Q4_K_QS);
                for j in 0..4 {
                    let sl = _mm256_shuffle_epi8(sc, scale_shuffle(2 * j));
                    let sh = _mm256_shuffle_epi8(sc, scale_shuffle(2 * j + 1));
                    let bits = _mm256_loadu_si256(q.add(32 * j) as *const __m256i);
                    let lo = _mm256_and_si256(bits, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                    for t in 0..T {
                        let ya = (*a[t]).qs.as_ptr().add(64 * j);
                        let yl = _mm256_load_si256(ya as *const __m256i);
                        let yh = _mm256_load_si256(ya.add(32) as *const __m256i);
                        let pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(lo, yl));
                        let ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(hi, yh));
                        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(pl, ph));
                    }
                }
                for t in 0..T {
                    let f = _mm256_set1_ps((*a[t]).d * d);
                    acc[t] = _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
                }
            }
        }
    }

    struct K5;
    impl BlkK for K5 {
        const BYTES: usize = layout::Q5_K;
        #[inline(always)]
        unsafe fn superblock<const T: usize>(
            p: *const u8,
            a: [*const Q8xK; T],
            acc: &mut [__m256; T],
        ) {
            unsafe {
                let dd = half2(p);
                let (d, dmin) = (_mm_cvtss_f32(dd), _mm_cvtss_f32(_mm_movehdup_ps(dd)));
                let ms = k_scales_mins(p);
                k_mins::<T>(dmin, _mm256_extracti128_si256::<1>(ms), a, acc);
                let sc = _mm256_permute2x128_si256::<0>(ms, ms);
                let m4 = _mm256_set1_epi8(0x0F);
                let x10 = _mm256_set1_epi8(0x10);
                let hbits = _mm256_loadu_si256(p.add(layout::Q5_K_QH) as *const __m256i);
                let mut sumi = [_mm256_setzero_si256(); T];
                let q = p.add(layout::Q5_K_QS);
                for j in 0..4 {
                    let sl = _mm256_shuffle_epi8(sc, scale_shuffle(2 * j));
                    let sh = _mm256_shuffle_epi8(sc, scale_shuffle(2 * j + 1));
                    let bits = _mm256_loadu_si256(q.add(32 * j) as *const __m256i);
                    let bl = _mm256_set1_epi8((1u8 << (2 * j)) as i8);
                    let bh = _mm256_set1_epi8((2u8 << (2 * j)) as i8);
                    let hl =
                        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bl), bl), x10);
                    let hh =
                        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bh), bh), x10);
                    let lo = _mm256_or_si256(_mm256_and_si256(bits, m4), hl);
                    let hi =
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4), hh);
                    for t in 0..T {
                        let ya = (*a[t]).qs.as_ptr().add(64 * j);
                        let yl = _mm256_load_si256(ya as *const __m256i);
                        let yh = _mm256_load_si256(ya.add(32) as *const __m256i);
                        let pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(lo, yl));
                        let ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(hi, yh));
                        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(pl, ph));
                    }
                }
                for t in 0..T {
                    let f = _mm256_set1_ps((*a[t]).d * d);
                    acc[t] = _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
                }
            }
        }
    }

    struct K6;
    impl BlkK for K6 {
        const BYTES: usize = layout::Q6_K;
        #[inline(always)]
        unsafe fn superblock<const T: usize>(
            p: *const u8,
            a: [*const Q8xK; T],
            acc: &mut [__m256; T],
        ) {
            unsafe {
                let d = _mm_cvtss_f32(half1(p.add(layout::Q6_K_D)));
                let scales = _mm_loadu_si128(p.add(layout::Q6_K_SCALES) as *const __m128i);
                let scales16 = _mm256_cvtepi8_epi16(scales);
                let m4 = _mm256_set1_epi8(0x0F);
                let m3 = _mm256_set1_epi8(3);
                // Quants are stored +32: subtract 32·Σ_g sc_g·(Σa)_g once per token.
                let mut sumi = [_mm256_setzero_si256(); T];
                for t in 0..T {
                    let bs = _mm256_load_si256((*a[t]).bsums.as_ptr() as *const __m256i);
                    sumi[t] = _mm256_sub_epi32(
                        sumi[t],
                        _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs, scales16)),
                    );
                }
                for h in 0..2 {
                    let ql = p.add(64 * h);
                    let qh = _mm256_loadu_si256(p.add(layout::Q6_K_QH + 32 * h) as *const __m256i);
                    let b1 = _mm256_loadu_si256(ql as *const __m256i);
                    let b2 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
                    // Element l + 32k of this half: nibble of b1 (k = 0, 2) or b2 (k = 1, 3),
                    // with bit pair k of qh as bits 4..6.
                    let q = [
                        _mm256_or_si256(
                            _mm256_and_si256(b1, m4),
                            _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m3)),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(b2, m4),
                            _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(12))),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(b1), m4),
                            _mm256_and_si256(qh, _mm256_set1_epi8(48)),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(b2), m4),
                            _mm256_srli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(-64))),
                        ),
                    ];
                    for (k, qk) in q.iter().enumerate() {
                        // Sixteen-element groups 8h + 2k and 8h + 2k + 1 share this vector.
                        let g = 8 * h + 2 * k;
                        let s = _mm256_setr_m128i(
                            _mm_set1_epi16(*p.add(layout::Q6_K_SCALES + g) as i8 as i16),
                            _mm_set1_epi16(*p.add(layout::Q6_K_SCALES + g + 1) as i8 as i16),
                        );
                        for t in 0..T {
                            let y = _mm256_load_si256(
                                (*a[t]).qs.as_ptr().add(128 * h + 32 * k) as *const __m256i
                            );
                            let prod = _mm256_madd_epi16(s, _mm256_maddubs_epi16(*qk, y));
                            sumi[t] = _mm256_add_epi32(sumi[t], prod);
                        }
                    }
                }
                for t in 0..T {
                    let f = _mm256_set1_ps((*a[t]).d * d);
                    acc[t] = _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
                }
            }
        }
    }

    tile_dispatch!(rows_k, rows_k_t, BlkK);

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows_k_t<B: BlkK, const T: usize>(
        w: &[u8],
        rows: usize,
        cols: usize,
        act: &Activation,
        t0: usize,
        out: &mut [f32],
    ) {
        let nb = cols / QK_K;
        let rb = nb * B::BYTES;
        let qa = act.qk[t0 * nb..(t0 + T) * nb].as_ptr();
        for r in 0..rows {
            // SAFETY: sizes checked by the caller.
            unsafe {
                let row = w.as_ptr().add(r * rb);
                let mut acc = [_mm256_setzero_ps(); T];
                for b in 0..nb {
                    let p = row.add(b * B::BYTES);
                    let mut off = 0;
                    while off < B::BYTES {
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + off) as *const i8);
                        off += 64;
                    }
                    let a: [*const Q8xK; T] = std::array::from_fn(|t| qa.add(t * nb + b));
                    B::superblock::<T>(p, a, &mut acc);
                }
                for t in 0..T {
                    *out.get_unchecked_mut(r * T + t) = hsum(acc[t]);
                }
            }
        }
    }

    // --- float weights against f32 ---

    trait FloatW {
        const BYTES: usize;
        /// 8 weights from p as f32.
        unsafe fn load8(p: *const u8) -> __m256;
        fn one(p: &[u8]) -> f32;
    }

    struct F32w;
    impl FloatW for F32w {
        const BYTES: usize = 4;
        #[inline(always)]
        unsafe fn load8(p: *const u8) -> __m256 {
            unsafe { _mm256_loadu_ps(p as *const f32) }
        }
        fn one(p: &[u8]) -> f32 {
            f32::from_le_bytes([p[0], p[1], p[2], p[3]])
        }
    }

    struct F16w;
    impl FloatW for F16w {
        const BYTES: usize = 2;
        #[inline(always)]
        unsafe fn load8(p: *const u8) -> __m256 {
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
        }
        fn one(p: &[u8]) -> f32 {
            f16_at(p, 0)
        }
    }

    struct Bf16w;
    impl FloatW for Bf16w {
        const BYTES: usize = 2;
        #[inline(always)]
        unsafe fn load8(p: *const u8) -> __m256 {
            unsafe {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
            }
        }
        fn one(p: &[u8]) -> f32 {
            super::super::blocks::bf16_to_f32(u16::from_le_bytes([p[0], p[1]]))
        }
    }

    tile_dispatch!(rows_f, rows_f_t, FloatW);

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows_f_t<B: FloatW, const T: usize>(
        w: &[u8],
        rows: usize,
        cols: usize,
        act: &Activation,
        t0: usize,
        out: &mut [f32],
    ) {
        let x = act.f[t0 * cols..(t0 + T) * cols].as_ptr();
        let rb = cols * B::BYTES;
        let main = cols / 16 * 16;
        for r in 0..rows {
            // SAFETY: sizes checked by the caller; the vector loop stays below `main` <= cols.
            unsafe {
                let row = w.as_ptr().add(r * rb);
                let mut acc = [[_mm256_setzero_ps(); T]; 2];
                let mut c = 0;
                while c < main {
                    _mm_prefetch::<_MM_HINT_T0>(
                        row.wrapping_add(c * B::BYTES + PREFETCH) as *const i8
                    );
                    let w0 = B::load8(row.add(c * B::BYTES));
                    let w1 = B::load8(row.add((c + 8) * B::BYTES));
                    for t in 0..T {
                        let xp = x.add(t * cols + c);
                        acc[0][t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xp), acc[0][t]);
                        acc[1][t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xp.add(8)), acc[1][t]);
                    }
                    c += 16;
                }
                let rs = std::slice::from_raw_parts(row, rb);
                for t in 0..T {
                    let mut s = hsum(_mm256_add_ps(acc[0][t], acc[1][t]));
                    for cc in main..cols {
                        s += B::one(&rs[cc * B::BYTES..]) * *x.add(t * cols + cc);
                    }
                    *out.get_unchecked_mut(r * T + t) = s;
                }
            }
        }
    }
}
