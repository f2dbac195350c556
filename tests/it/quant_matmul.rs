//! The threaded, tiled matrix product against a naive one, for every type, thread count and a
//! spread of token counts (1 = decode; 3, 17 = ragged tiles; 64 = a prompt chunk).

use crate::common;
use common::quant_ref::q8_1_excess;
use hipscope::gpu::cpu::matmul::{MatmulScratch, QuantMatrix, matmul, matmul_prepared};
use hipscope::gpu::cpu::pool::ThreadPool;
use hipscope::gpu::quant::dot::{Activation, Isa};
use hipscope::gpu::quant::{self, COMPUTE_TYPES, GgmlType};

fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Naive reference: dequantized weights times the activation exactly as the kernels see it
/// (quantized and dequantized again, and Q8_1's rounded sum term), summed in f64. Returns y and Σ|w·x| per output.
fn naive(
    ty: GgmlType,
    q: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n_tokens: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut w = vec![0f32; rows * cols];
    quant::dequantize(ty, q, &mut w).expect("dequantize");
    let mut act = Activation::new();
    act.quantize(Isa::Scalar, ty, x, n_tokens, cols)
        .expect("activation");
    let mut y = vec![0f64; rows * n_tokens];
    let mut mag = vec![0f64; rows * n_tokens];
    for t in 0..n_tokens {
        let xd = act.dequantized(t);
        for r in 0..rows {
            let wr = &w[r * cols..(r + 1) * cols];
            let rb = q.len() / rows;
            y[t * rows + r] = wr
                .iter()
                .zip(&xd)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                + q8_1_excess(ty, &q[r * rb..(r + 1) * rb], &act, t);
            mag[t * rows + r] = wr
                .iter()
                .zip(&xd)
                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                .sum();
        }
    }
    (y, mag)
}

fn run_case(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    n_tokens: usize,
    pools: &[ThreadPool],
    isa: Isa,
) {
    let wf = noise(rows * cols, rows as u64 * 31 + cols as u64);
    let q = quant::quantize(ty, &wf).expect("quantize");
    let w = QuantMatrix::new(ty, rows, cols, &q).expect("matrix");
    let x = noise(n_tokens * cols, n_tokens as u64 + 7);
    let (want, mag) = naive(ty, &q, rows, cols, &x, n_tokens);
    let mut first: Option<Vec<f32>> = None;
    for pool in pools {
        let mut scratch = MatmulScratch::with_isa(isa);
        // Poison the output so that a row left unwritten shows.
        let mut y = vec![f32::NAN; rows * n_tokens];
        matmul(pool, &w, &x, n_tokens, &mut y, &mut scratch);
        for (i, (&g, (&e, &m))) in y.iter().zip(want.iter().zip(&mag)).enumerate() {
            // Only the order of f32 additions differs from the f64 sum.
            let tol = m * (cols as f64 / 8.0 + 16.0) * f32::EPSILON as f64 + 1e-30;
            assert!(
                (g as f64 - e).abs() <= tol,
                "{ty} {isa:?} {rows}x{cols} tokens {n_tokens} threads {}: y[{i}] = {g}, naive {e}",
                pool.n_threads()
            );
        }
        // The thread count changes which thread computes a row, never how.
        match &first {
            None => first = Some(y),
            Some(f) => assert!(
                f.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ty} {isa:?}: {} threads differ from 1",
                pool.n_threads()
            ),
        }
    }
}

#[test]
fn matmul_equals_naive_for_all_types_threads_and_token_counts() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let mut isas = vec![Isa::Scalar];
    for isa in [Isa::Avx2, Isa::Avx512] {
        if isa.is_available() {
            isas.push(isa);
        }
    }
    for &ty in COMPUTE_TYPES {
        // 37 rows: several chunks with a ragged last one; 512 columns: two K super-blocks.
        let cols = 512;
        for n_tokens in [1, 3, 17, 64] {
            for &isa in &isas {
                run_case(ty, 37, cols, n_tokens, &pools, isa);
            }
        }
    }
}

#[test]
fn matmul_rows_of_whole_and_partial_block_groups() {
    // The 32-element kernels take blocks four at a time, then the remainder one by one:
    // 3 blocks (remainder only), 5 (one group + 1), 18 (SmolLM2's 576: four groups + 2).
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let isa = Isa::detect();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ] {
        for cols in [96, 160, 576] {
            for n_tokens in [1, 2, 4, 7] {
                run_case(ty, 19, cols, n_tokens, &pools, isa);
            }
        }
    }
}

#[test]
fn matmul_handles_many_rows_and_odd_float_widths() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let isa = Isa::detect();
    // More rows than MAX_CHUNK × threads × 4, so that chunks are claimed dynamically.
    run_case(GgmlType::Q8_0, 1100, 64, 2, &pools, isa);
    run_case(GgmlType::Q4_1, 1100, 64, 5, &pools, isa);
    // Float weights accept any width: the SIMD loop's scalar tail must be right.
    for cols in [1, 7, 15, 17, 33] {
        run_case(GgmlType::F16, 9, cols, 3, &pools, isa);
        run_case(GgmlType::F32, 9, cols, 1, &pools, isa);
        run_case(GgmlType::Bf16, 9, cols, 2, &pools, isa);
    }
}

#[test]
fn prepared_activation_serves_several_matrices() {
    let pool = ThreadPool::new(2);
    let (rows_a, rows_b, cols, n_tokens) = (24, 40, 96, 5);
    let qa = quant::quantize(GgmlType::Q4_1, &noise(rows_a * cols, 1)).expect("q");
    let qb = quant::quantize(GgmlType::Q4_1, &noise(rows_b * cols, 2)).expect("q");
    let a = QuantMatrix::new(GgmlType::Q4_1, rows_a, cols, &qa).expect("a");
    let b = QuantMatrix::new(GgmlType::Q4_1, rows_b, cols, &qb).expect("b");
    let x = noise(n_tokens * cols, 3);
    let mut s = MatmulScratch::new();
    let (mut ya, mut yb) = (vec![0f32; rows_a * n_tokens], vec![0f32; rows_b * n_tokens]);
    s.prepare(&pool, GgmlType::Q4_1, &x, n_tokens, cols)
        .expect("prepare");
    matmul_prepared(&pool, &a, &s, &mut ya);
    matmul_prepared(&pool, &b, &s, &mut yb);
    let (mut ya2, mut yb2) = (vec![0f32; rows_a * n_tokens], vec![0f32; rows_b * n_tokens]);
    matmul(&pool, &a, &x, n_tokens, &mut ya2, &mut s);
    matmul(&pool, &b, &x, n_tokens, &mut yb2, &mut s);
    assert_eq!(ya, ya2);
    assert_eq!(yb, yb2);
}

#[test]
fn large_activation_is_quantized_in_parallel_identically() {
    // Above the parallel threshold the activation is split over threads by token; it must
    // come out the same as quantizing on one thread.
    let (cols, n_tokens) = (1536, 64);
    let x = noise(n_tokens * cols, 11);
    for ty in [GgmlType::Q8_0, GgmlType::Q4K, GgmlType::F16] {
        let q = quant::quantize(ty, &noise(8 * cols, 12)).expect("q");
        let w = QuantMatrix::new(ty, 8, cols, &q).expect("w");
        let mut y1 = vec![0f32; 8 * n_tokens];
        let mut y3 = vec![0f32; 8 * n_tokens];
        matmul(
            &ThreadPool::new(1),
            &w,
            &x,
            n_tokens,
            &mut y1,
            &mut MatmulScratch::new(),
        );
        matmul(
            &ThreadPool::new(3),
            &w,
            &x,
            n_tokens,
            &mut y3,
            &mut MatmulScratch::new(),
        );
        assert_eq!(y1, y3, "{ty}");
    }
}

#[test]
fn zero_tokens_or_rows_do_nothing() {
    let pool = ThreadPool::new(2);
    let q = quant::quantize(GgmlType::Q8_0, &noise(64, 1)).expect("q");
    let w = QuantMatrix::new(GgmlType::Q8_0, 2, 32, &q).expect("w");
    let mut y: Vec<f32> = vec![];
    matmul(&pool, &w, &[], 0, &mut y, &mut MatmulScratch::new());
    let w0 = QuantMatrix::new(GgmlType::Q8_0, 0, 32, &[]).expect("empty");
    matmul(
        &pool,
        &w0,
        &noise(32, 2),
        1,
        &mut y,
        &mut MatmulScratch::new(),
    );
}

#[test]
#[should_panic(expected = "matmul input")]
fn wrong_input_length_is_a_loud_bug() {
    let pool = ThreadPool::new(1);
    let q = quant::quantize(GgmlType::Q8_0, &noise(64, 1)).expect("q");
    let w = QuantMatrix::new(GgmlType::Q8_0, 2, 32, &q).expect("w");
    let mut y = vec![0f32; 2];
    matmul(
        &pool,
        &w,
        &noise(31, 2),
        1,
        &mut y,
        &mut MatmulScratch::new(),
    );
}
