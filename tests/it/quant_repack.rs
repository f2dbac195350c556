//! Weights repacked for the CPU GEMM (16 rows interleaved, `quant::dot::PackedMatrix`) and their
//! AVX2 kernel, against a naive f64 product of the dequantized weights and the scalar kernel on the file's
//! own layout, on random raw blocks (every quant byte value, random Q4_K scales and mins), ragged row
//! counts (a padded last group), odd block counts and every token tile size.

use crate::common;
use common::quant_ref::q8_1_excess;
use hipscope::gpu::cpu::matmul::{MatmulScratch, QuantMatrix, matmul, matmul_packed};
use hipscope::gpu::cpu::pool::ThreadPool;
use hipscope::gpu::quant::dot::{Activation, Isa, PACK_TILE, PackedMatrix};
use hipscope::gpu::quant::{self, GgmlType, f32_to_f16};

const PACKED: [GgmlType; 6] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    fn f(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// `rows` × `cols` of random raw blocks of `ty`: random quant bytes, scales of both signs
/// (Q4_K: random six-bit scales and mins too).
fn random_blocks(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let bb = ty.block_bytes();
    let mut out = vec![0u8; rows * cols / ty.block_len() * bb];
    for blk in out.chunks_exact_mut(bb) {
        for b in blk.iter_mut() {
            *b = rng.next() as u8;
        }
        let d = f32_to_f16(rng.f() * 0.02).to_le_bytes();
        blk[..2].copy_from_slice(&d);
        if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K) {
            let m = f32_to_f16(rng.f() * 0.1).to_le_bytes();
            blk[2..4].copy_from_slice(&m);
        }
    }
    out
}

/// y (f64) and Σ|w·x| per output, from the dequantized weights and the activation as the kernels
/// see it (quantized, then dequantized again, and Q8_1's rounded sum term).
fn naive(ty: GgmlType, q: &[u8], rows: usize, cols: usize, x: &[f32], nt: usize) -> [Vec<f64>; 2] {
    let mut w = vec![0f32; rows * cols];
    quant::dequantize(ty, q, &mut w).expect("dequantize");
    let mut act = Activation::new();
    act.quantize(Isa::Scalar, ty, x, nt, cols)
        .expect("activation");
    let mut y = vec![0f64; rows * nt];
    let mut mag = vec![0f64; rows * nt];
    for t in 0..nt {
        let xd = act.dequantized(t);
        for r in 0..rows {
            let wr = &w[r * cols..(r + 1) * cols];
            let p = wr.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64);
            let rb = q.len() / rows;
            y[t * rows + r] =
                p.clone().sum::<f64>() + q8_1_excess(ty, &q[r * rb..(r + 1) * rb], &act, t);
            mag[t * rows + r] = p.map(f64::abs).sum();
        }
    }
    [y, mag]
}

fn check(isa: Isa, ty: GgmlType, rows: usize, cols: usize, nt: usize, pools: &[ThreadPool]) {
    let q = random_blocks(ty, rows, cols, (rows * 1000 + cols + nt) as u64);
    let mut rng = Rng(nt as u64 * 77 + 5);
    let x: Vec<f32> = (0..nt * cols).map(|_| rng.f()).collect();
    let p = PackedMatrix::new(isa, ty, rows, cols, &q).expect("packs on AVX2");
    assert_eq!(p.bytes() % 64, 0);
    let [want, mag] = naive(ty, &q, rows, cols, &x, nt);
    let m = QuantMatrix::new(ty, rows, cols, &q).expect("matrix");
    let mut reference = vec![0f32; rows * nt];
    matmul(
        &pools[0],
        &m,
        &x,
        nt,
        &mut reference,
        &mut MatmulScratch::with_isa(Isa::Scalar),
    );
    let mut first: Option<Vec<f32>> = None;
    for pool in pools {
        let mut y = vec![f32::NAN; rows * nt];
        let mut scratch = MatmulScratch::with_isa(isa);
        matmul_packed(pool, &p, &x, nt, &mut y, &mut scratch);
        for (i, &yi) in y.iter().enumerate() {
            // The offset terms (−8·d, Q4_K's mins) cancel part of the main one: allow for the
            // magnitude of both, in f32 additions over the row.
            let tol = (mag[i] * 20.0) * (cols as f64 / 8.0 + 16.0) * f32::EPSILON as f64 + 1e-30;
            assert!(
                (yi as f64 - want[i]).abs() <= tol && (yi - reference[i]).abs() as f64 <= 2.0 * tol,
                "{ty} {isa:?} {rows}x{cols} tokens {nt} threads {}: y[{i}] = {}, naive {}, scalar {}",
                pool.n_threads(),
                yi,
                want[i],
                reference[i]
            );
        }
        match &first {
            None => first = Some(y),
            Some(f) => assert!(
                f.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ty}: {} threads differ from 1",
                pool.n_threads()
            ),
        }
    }
}

#[test]
fn packed_gemm_equals_naive_and_scalar_on_random_blocks() {
    if !Isa::Avx2.is_available() {
        // Without AVX2 nothing is packed: the portable kernels serve (tests/it/quant_matmul.rs).
        for ty in PACKED {
            assert!(!PackedMatrix::packs(Isa::detect(), ty));
            assert!(PackedMatrix::new(Isa::Avx2, ty, 16, 256, &[0u8; 16 * 144]).is_none());
        }
        eprintln!("this CPU has no AVX2: checked that nothing is packed");
        return;
    }
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    // AVX-512 CPUs run the AVX-512 kernel on the 32-element packed formats (Q4_K: the AVX2 one).
    let isas: Vec<Isa> = [Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|i| i.is_available())
        .collect();
    for ty in PACKED {
        // 16 rows: one whole group; 37: a padded last group; 1: padding only.
        let shapes: &[(usize, usize)] = if ty == GgmlType::Q4K {
            &[(16, 256), (37, 768), (1, 256), (50, 512)]
        } else {
            &[(16, 32), (37, 96), (1, 64), (50, 576)]
        };
        for &(rows, cols) in shapes {
            for nt in 1..=PACK_TILE + 1 {
                for &isa in &isas {
                    check(isa, ty, rows, cols, nt, &pools);
                }
            }
        }
        // Several chunks claimed dynamically, and a prompt-sized token count.
        for &isa in &isas {
            check(isa, ty, 600, 256, 33, &pools);
        }
    }
}

#[test]
fn packed_matrix_keeps_the_size_and_refuses_what_it_cannot_pack() {
    for ty in PACKED {
        let q = random_blocks(ty, 32, 256, 3);
        let Some(p) = PackedMatrix::new(Isa::Avx2, ty, 32, 256, &q) else {
            assert!(!Isa::Avx2.is_available());
            continue;
        };
        // Two groups of 16 rows: exactly the file's bytes (rounded up to a 64-byte line) for
        // Q4_0, Q4_1 and Q8_0; Q4_K keeps its six-bit scales and mins unpacked, one byte each
        // (+2.8%); Q5_0 and Q5_1 widen their values to a byte (8 blocks × 16 rows × 32 bytes,
        // plus the f16 d, and m for Q5_1).
        let want = match ty {
            GgmlType::Q4K => 2 * 2368,
            GgmlType::Q5_0 => 2 * 8 * (512 + 32),
            GgmlType::Q5_1 => 2 * 8 * (512 + 64),
            _ => q.len().div_ceil(128) * 128,
        };
        assert_eq!(p.bytes(), want);
        assert_eq!((p.rows(), p.cols(), p.groups()), (32, 256, 2));
        // The wrong byte count or a partial block: not packed (the caller reports the error).
        assert!(PackedMatrix::new(Isa::Avx2, ty, 33, 256, &q).is_none());
        assert!(PackedMatrix::new(Isa::Avx2, ty, 32, 224, &q).is_none());
        // The portable path runs the file's layout.
        assert!(PackedMatrix::new(Isa::Scalar, ty, 32, 256, &q).is_none());
    }
    assert!(!PackedMatrix::packs(Isa::Avx2, GgmlType::Q6K));
    assert!(!PackedMatrix::packs(Isa::Avx2, GgmlType::Q5K));
}
