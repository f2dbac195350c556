//! AVX-512 kernels (F, BW, VL and VNNI) for Q4_1, Q5_1, Q8_0 and MXFP4 against Q8x32 (Q4_0, Q5_0
//! and IQ4_NL measured faster on the AVX2 ones: see `kernel`). The K-quants
//! and float weights run the AVX2 kernels on such a CPU (their cost is in unpacking, not in the
//! multiply-add that VNNI fuses).
//!
//! One 512-bit register holds two weight blocks; `vpdpbusd` multiplies unsigned weight bytes by
//! signed activation bytes and sums each four into an i32 lane in one instruction (AVX2 needs
//! `maddubs` + `madd`). Instead of reducing the eight lanes of each block to one number, the lanes
//! are scaled by a vector holding d_w·d_a of block 0 in lanes 0..8 and of block 1 in lanes 8..16
//! (one multiply of [d_w, m_w] pairs by the activation's [d, d·Σq] pairs and one permute), and
//! accumulated in floats; the sum over lanes is taken once per row.

#![allow(clippy::needless_range_loop)] // indexing per token keeps the accumulators in registers

use super::super::blocks::{QK, layout};
use super::super::mxfp4;
use super::*;
use std::arch::x86_64::*;

/// The AVX-512 kernel for `ty`, or `None` where the AVX2 one serves.
///
/// Q4_0, Q5_0 and IQ4_NL take the AVX2 kernels: on the one AVX-512 CPU measured (the lent GPU
/// host's Intel Xeon, 2 threads, `docs/runs/cpu-avx512-2026-11-27.txt`) these kernels decoded a
/// Qwen2.5-0.5B shape 20-40% slower than the AVX2 ones (Q4_0 tg32 33.6-41.8 t/s against
/// 50.3-54.0, Q5_0 31.9 against 41.4-42.8, IQ4_NL 35.2-39.7 against 54.5-56.2), while Q4_1, Q5_1
/// and Q8_0 came out level; no AMD AVX-512 CPU (Zen 4/5) has run them.
///
/// MXFP4 takes the AVX2 kernel on AMD CPUs: on the 2-core AMD EPYC (Zen 5) development machine
/// the AVX2 one decoded gpt-oss-20b's first 2 layers 10% faster (`-t 1` tg32 31.6-32.2 t/s
/// against 28.7-29.1, `docs/runs/cpu-2026-11-28.txt`); Intel CPUs keep this one.
pub(super) fn kernel(ty: GgmlType) -> Option<KernelFn> {
    use GgmlType::*;
    Some(match ty {
        Q4_1 => rows::<B4_1>,
        Q5_1 => rows::<B5_1>,
        Q8_0 => rows::<B8_0>,
        Mxfp4 if !amd() => rows::<BMxfp4>,
        _ => return None,
    })
}

/// Whether the CPU's vendor string is AMD's.
fn amd() -> bool {
    static AMD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AMD.get_or_init(|| {
        // SAFETY: cpuid leaf 0 exists on every x86-64 CPU (newer Rust declares it safe).
        #[allow(unused_unsafe)]
        let r = unsafe { __cpuid(0) };
        let mut v = [0u8; 12];
        v[..4].copy_from_slice(&r.ebx.to_le_bytes());
        v[4..8].copy_from_slice(&r.edx.to_le_bytes());
        v[8..].copy_from_slice(&r.ecx.to_le_bytes());
        &v == b"AuthenticAMD"
    })
}

/// Bytes ahead of the current weight block to prefetch (a prefetch never faults).
const PREFETCH: usize = 4096;

/// A 32-element weight block type, two blocks at a time.
trait Blk {
    const BYTES: usize;
    /// Quants are signed (Q8_0): `vpdpbusd` then takes |q| and moves the sign to the activation.
    const SIGNED: bool;
    /// Whether the m·(d_a·Σq_a) term exists (every type but Q8_0).
    const HAS_M: bool;
    /// The 32 quants of the block at p0 in bytes 0..32 and of the block at p1 in 32..64.
    unsafe fn quants2(p0: *const u8, p1: *const u8) -> __m512i;
    /// [d0, m0, d1, m1], where a value of block k is d_k·q + m_k.
    unsafe fn dm2(p0: *const u8, p1: *const u8) -> __m128;
}

/// The two blocks' 16 nibble bytes at offset `off`: low nibbles of a block in its bytes 0..16,
/// high nibbles in 16..32.
#[inline(always)]
unsafe fn nibbles2(p0: *const u8, p1: *const u8) -> __m512i {
    unsafe {
        let v = _mm256_set_m128i(
            _mm_loadu_si128(p1 as *const __m128i),
            _mm_loadu_si128(p0 as *const __m128i),
        );
        // 128-bit lanes [b0, b0, b1, b1], then the second copy of each shifted by 4.
        let z = _mm512_castsi256_si512(v);
        let z = _mm512_shuffle_i64x2::<0b0101_0000>(z, z);
        let z = _mm512_srlv_epi64(z, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
        _mm512_and_si512(z, _mm512_set1_epi8(0x0F))
    }
}

/// 0x10 in byte j where bit j of the little-endian u32 at h0 (j < 32) or h1 (j ≥ 32) is set.
#[inline(always)]
unsafe fn fifth_bits2(h0: *const u8, h1: *const u8) -> __m512i {
    unsafe {
        let lo = (h0 as *const u32).read_unaligned() as u64;
        let hi = (h1 as *const u32).read_unaligned() as u64;
        _mm512_maskz_mov_epi8(lo | (hi << 32), _mm512_set1_epi8(0x10))
    }
}

/// [d0, d0·k, d1, d1·k] from the f16 `d` at p0 and p1.
#[inline(always)]
unsafe fn d_scaled(p0: *const u8, p1: *const u8, k: f32) -> __m128 {
    unsafe {
        let h0 = (p0 as *const u16).read_unaligned() as i16;
        let h1 = (p1 as *const u16).read_unaligned() as i16;
        let d = _mm_cvtph_ps(_mm_setr_epi16(h0, h0, h1, h1, 0, 0, 0, 0));
        _mm_mul_ps(d, _mm_setr_ps(1.0, k, 1.0, k))
    }
}

/// [d0, m0, d1, m1] from the f16 pairs at p0 and p1.
#[inline(always)]
unsafe fn dm_pairs(p0: *const u8, p1: *const u8) -> __m128 {
    unsafe {
        let u0 = (p0 as *const u32).read_unaligned() as i32;
        let u1 = (p1 as *const u32).read_unaligned() as i32;
        _mm_cvtph_ps(_mm_setr_epi32(u0, u1, 0, 0))
    }
}

struct B4_1;
impl Blk for B4_1 {
    const BYTES: usize = layout::Q4_1;
    const SIGNED: bool = false;
    const HAS_M: bool = true;
    #[inline(always)]
    unsafe fn quants2(p0: *const u8, p1: *const u8) -> __m512i {
        unsafe { nibbles2(p0.add(4), p1.add(4)) }
    }
    #[inline(always)]
    unsafe fn dm2(p0: *const u8, p1: *const u8) -> __m128 {
        unsafe { dm_pairs(p0, p1) }
    }
}

struct B5_1;
impl Blk for B5_1 {
    const BYTES: usize = layout::Q5_1;
    const SIGNED: bool = false;
    const HAS_M: bool = true;
    #[inline(always)]
    unsafe fn quants2(p0: *const u8, p1: *const u8) -> __m512i {
        unsafe {
            _mm512_or_si512(
                nibbles2(p0.add(8), p1.add(8)),
                fifth_bits2(p0.add(4), p1.add(4)),
            )
        }
    }
    #[inline(always)]
    unsafe fn dm2(p0: *const u8, p1: *const u8) -> __m128 {
        unsafe { dm_pairs(p0, p1) }
    }
}

struct BMxfp4;
impl Blk for BMxfp4 {
    const BYTES: usize = mxfp4::BYTES;
    const SIGNED: bool = true;
    const HAS_M: bool = false;
    #[inline(always)]
    unsafe fn quants2(p0: *const u8, p1: *const u8) -> __m512i {
        unsafe {
            let table = _mm512_broadcast_i32x4(_mm_loadu_si128(
                mxfp4::KVALUES_MXFP4.as_ptr() as *const __m128i
            ));
            _mm512_shuffle_epi8(table, nibbles2(p0.add(1), p1.add(1)))
        }
    }
    #[inline(always)]
    unsafe fn dm2(p0: *const u8, p1: *const u8) -> __m128 {
        unsafe {
            _mm_setr_ps(
                mxfp4::e8m0_to_fp32_half(*p0),
                0.0,
                mxfp4::e8m0_to_fp32_half(*p1),
                0.0,
            )
        }
    }
}

struct B8_0;
impl Blk for B8_0 {
    const BYTES: usize = layout::Q8_0;
    const SIGNED: bool = true;
    const HAS_M: bool = false;
    #[inline(always)]
    unsafe fn quants2(p0: *const u8, p1: *const u8) -> __m512i {
        unsafe {
            let lo = _mm512_castsi256_si512(_mm256_loadu_si256(p0.add(2) as *const __m256i));
            _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(p1.add(2) as *const __m256i))
        }
    }
    #[inline(always)]
    unsafe fn dm2(p0: *const u8, p1: *const u8) -> __m128 {
        unsafe { d_scaled(p0, p1, 0.0) }
    }
}

/// Runs `rows_t::<B, T>` with the token tile `T` (1..=4) as a constant.
unsafe fn rows<B: Blk>(
    w: &[u8],
    rows: usize,
    cols: usize,
    act: &Activation,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller (Kernel::dot_rows) checked sizes; Kernel::new checked the ISA.
    unsafe {
        match nt {
            1 => rows_t::<B, 1>(w, rows, cols, act, t0, out),
            2 => rows_t::<B, 2>(w, rows, cols, act, t0, out),
            3 => rows_t::<B, 3>(w, rows, cols, act, t0, out),
            _ => rows_t::<B, 4>(w, rows, cols, act, t0, out),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn rows_t<B: Blk, const T: usize>(
    w: &[u8],
    rows: usize,
    cols: usize,
    act: &Activation,
    t0: usize,
    out: &mut [f32],
) {
    let nb = cols / QK;
    let rb = nb * B::BYTES;
    let qa = act.q32[t0 * nb..(t0 + T) * nb].as_ptr();
    let ds = act.ds32[t0 * nb..(t0 + T) * nb].as_ptr();
    // Lanes 0..8 take element 0 of a [d0·da0, m0·sa0, d1·da1, m1·sa1] product, 8..16 element 2.
    let spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
    let zero = _mm512_setzero_si512();
    for r in 0..rows {
        // SAFETY: row r spans rb bytes inside w; the token tile spans T·nb blocks of qa and ds.
        // A lone last block (odd nb) reads its own bytes twice and masks the second copy's
        // activation to zero, so nothing past the row or the token's blocks is read.
        unsafe {
            let row = w.as_ptr().add(r * rb);
            let mut acc = [[_mm512_setzero_ps(); T]; 2];
            let mut accm = [_mm_setzero_ps(); T];
            let mut b = 0;
            while b < nb {
                let pair = b + 1 < nb;
                let p0 = row.add(b * B::BYTES);
                let p1 = if pair { p0.add(B::BYTES) } else { p0 };
                _mm_prefetch::<_MM_HINT_T0>(p0.wrapping_add(PREFETCH) as *const i8);
                let qx = B::quants2(p0, p1);
                let dm = B::dm2(p0, p1);
                let (ax, neg) = if B::SIGNED {
                    (_mm512_abs_epi8(qx), _mm512_movepi8_mask(qx))
                } else {
                    (qx, 0)
                };
                let lanes: __mmask64 = if pair { !0 } else { 0xFFFF_FFFF };
                let k = (b / 2) % 2;
                for t in 0..T {
                    let a = qa.add(t * nb + b) as *const i8;
                    let qy = _mm512_maskz_loadu_epi8(lanes, a);
                    let qy = if B::SIGNED {
                        _mm512_mask_sub_epi8(qy, neg, _mm512_setzero_si512(), qy)
                    } else {
                        qy
                    };
                    let dot = _mm512_dpbusd_epi32(zero, ax, qy);
                    let dsa = if pair {
                        _mm_loadu_ps(ds.add(t * nb + b) as *const f32)
                    } else {
                        _mm_castpd_ps(_mm_load_sd(ds.add(t * nb + b) as *const f64))
                    };
                    let prod = _mm_mul_ps(dm, dsa);
                    let sc = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(prod));
                    acc[k][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, acc[k][t]);
                    if B::HAS_M {
                        accm[t] = _mm_add_ps(accm[t], prod);
                    }
                }
                b += 2;
            }
            for t in 0..T {
                let mut s = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][t], acc[1][t]));
                if B::HAS_M {
                    // Lanes 1 and 3 hold Σ m·(d_a·Σq_a); a lone last block left lane 3 at 0.
                    let m = _mm_movehdup_ps(accm[t]);
                    s += _mm_cvtss_f32(_mm_add_ss(m, _mm_movehl_ps(m, m)));
                }
                *out.get_unchecked_mut(r * T + t) = s;
            }
        }
    }
}
