//! Activation formats (quantized once per matrix product) and the buffers that hold them.

use super::super::blocks::{QK, QK_K, f16_to_f32, f32_to_f16};
use super::{GgmlType, Isa, QuantError, quantize_q8x32, quantize_q8xk};

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
    /// 32-element blocks; `q8_1` when the weights are Q4_1/Q5_1, whose llama.cpp activation is
    /// Q8_1 (the sum term stored as an f16), else Q8_0's (see [`q8x32_scales`]).
    Q8x32 {
        q8_1: bool,
    },
    Q8xK,
}

/// The `[d, s]` of a 32-element activation block whose largest magnitude is `amax` and whose
/// quants (rounded from `x · 127 / amax`) sum to `sum`, as llama.cpp stores them, so that both
/// engines multiply the same numbers: `d = amax / 127` rounded to f16 (`quantize_row_q8_0` and
/// `quantize_row_q8_1` keep an f16 `d`); `s` for Q8_1 is `(amax / 127) · sum` rounded to f16
/// (the unrounded `d`, as ggml computes it); for Q8_0 the f16 `d` times `sum`, exact in f32
/// (an f16 has 11 significant bits, |sum| ≤ 4096), which is what llama.cpp's integer offset term
/// (Q4_0's -8, Q5_0's -16) amounts to. The one place the 32-element activation scales are made:
/// the scalar and SIMD quantizers both call it.
#[inline]
pub fn q8x32_scales(amax: f32, sum: i32, q8_1: bool) -> [f32; 2] {
    let d = amax / 127.0;
    let d16 = f16_to_f32(f32_to_f16(d));
    let s = if q8_1 {
        f16_to_f32(f32_to_f16(d * sum as f32))
    } else {
        d16 * sum as f32
    };
    [d16, s]
}

/// The scale of a Q8xK activation block whose largest magnitude is `amax`, given `id`, the
/// multiplier its quants were rounded from (`127 / amax`, 0 for an all-zero block): `1 / id`, as
/// llama.cpp's `quantize_row_q8_K_ref` computes it (an f32, as Q8_K stores it).
#[inline]
pub fn q8xk_scale(amax: f32, id: f32) -> f32 {
    if amax != 0.0 { 1.0 / id } else { 0.0 }
}

/// The activation format for weights of `ty`, or the unsupported-type error.
pub fn act_kind(ty: GgmlType) -> Result<ActKind, QuantError> {
    use GgmlType::*;
    match ty {
        F32 | F16 | Bf16 => Ok(ActKind::F32),
        Q4_0 | Q5_0 | Q8_0 | Iq4Nl | Mxfp4 => Ok(ActKind::Q8x32 { q8_1: false }),
        Q4_1 | Q5_1 => Ok(ActKind::Q8x32 { q8_1: true }),
        Q2K | Q3K | Q4K | Q5K | Q6K | Iq4Xs => Ok(ActKind::Q8xK),
        _ => Err(super::super::unsupported(ty)),
    }
}

/// The activation of `n_tokens` tokens × `cols`, in the format one weight type needs. Buffers
/// are kept between uses, so that steady-state matrix products allocate nothing.
#[derive(Debug)]
pub struct Activation {
    pub(super) kind: ActKind,
    pub(super) n_tokens: usize,
    pub(super) cols: usize,
    pub(super) f: Vec<f32>,
    pub(super) q32: Vec<Q8x32>,
    pub(super) ds32: Vec<[f32; 2]>,
    pub(super) g32: Vec<Group4>,
    pub(super) qk: Vec<Q8xK>,
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
            ActKind::Q8x32 { q8_1 } => {
                quantize_q8x32(isa, x, self.q32, self.ds32, q8_1);
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
            ActKind::Q8x32 { .. } => QK,
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
            ActKind::Q8x32 { .. } => (0, n / QK, 0),
            ActKind::Q8xK => (0, 0, n / QK_K),
        };
        // Grow only: shrinking and regrowing would reallocate between prompt and decode steps.
        grow(&mut self.f, f, 0.0);
        grow(&mut self.q32, q32, Q8x32 { qs: [0; QK] });
        grow(&mut self.ds32, q32, [0.0; 2]);
        let g32 = if matches!(kind, ActKind::Q8x32 { .. }) {
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

    /// The Q8x32 blocks and their [d, s] of token `t` (see [`q8x32_scales`]).
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
            ActKind::Q8x32 { .. } => {
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
