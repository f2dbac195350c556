//! The f16 GEMM of the prefill path against the CPU: hipscope's own `hs_gemm_f16` (on the
//! device's matrix units, kernels/gemm.hip) and, where the BLAS has one, its f16 GEMM
//! (cublasGemmEx, rocblas_gemm_ex), on a shape with partial tiles in every direction.

use crate::gpu::arena::Region;
use crate::gpu::device::{GemmF32, GpuError, Op};
use crate::gpu::handle::Gpu;
use crate::gpu::quant::{f16_to_f32, f32_to_f16};

use super::mechanisms::{bytes_f32, f32_bytes, rand_f32};

/// `(passed, detail)`: every run within 1e-4 of the f64 product of the same f16 inputs (both
/// sides multiply exactly the same numbers; only the f32 summation order differs), and C's
/// rows past m untouched.
pub(super) fn gemm_f16(gpu: &mut Gpu) -> Result<(bool, String), GpuError> {
    // m and n leave partial 64-wide tiles; k is three of the kernel's 32-wide steps; the leading
    // dimensions are padded (multiples of 8 halves, as the kernel requires).
    let (m, n, k) = (67usize, 45usize, 96usize);
    let (lda, ldb, ldc) = (k + 8, k + 16, m + 7);
    let half = |v: Vec<f32>| -> Vec<u16> { v.into_iter().map(f32_to_f16).collect() };
    let a = half(rand_f32(lda * m, 41));
    let b = half(rand_f32(ldb * n, 43));
    let c0 = rand_f32(ldc * n, 47);
    let mut want = c0.clone();
    for j in 0..n {
        for i in 0..m {
            let s: f64 = (0..k)
                .map(|p| {
                    f64::from(f16_to_f32(a[p + i * lda])) * f64::from(f16_to_f32(b[p + j * ldb]))
                })
                .sum();
            want[i + j * ldc] = s as f32;
        }
    }
    let u16_bytes = |v: &[u16]| -> Vec<u8> { v.iter().flat_map(|h| h.to_le_bytes()).collect() };
    let da = gpu.alloc(Region::Activations, (a.len() * 2) as u64)?;
    let db = gpu.alloc(Region::Activations, (b.len() * 2) as u64)?;
    let dc = gpu.alloc(Region::Activations, (c0.len() * 4) as u64)?;
    let l = gpu.label("selftest · gemm f16");
    gpu.upload(l, da, &u16_bytes(&a))?;
    gpu.upload(l, db, &u16_bytes(&b))?;
    let g = GemmF32 {
        transa: Op::T,
        transb: Op::N,
        m: m as i32,
        n: n as i32,
        k: k as i32,
        alpha: gpu.scalar(1.0)?,
        a: da.ptr,
        lda: lda as i32,
        b: db.ptr,
        ldb: ldb as i32,
        beta: gpu.scalar(0.0)?,
        c: dc.ptr,
        ldc: ldc as i32,
    };
    let mut runs = vec!["hs_gemm_f16"];
    if let Some(lib) = gpu.blas_f16() {
        runs.push(if lib.contains("cuBLAS") {
            "cublasGemmEx"
        } else {
            "rocblas_gemm_ex"
        });
    }
    let mut worst = 0.0f32;
    for i in 0..runs.len() {
        gpu.upload(l, dc, &f32_bytes(&c0))?;
        if i == 0 {
            gpu.gemm_f16_own(l, &g)?;
        } else {
            gpu.gemm_f16_blas(l, &g)?;
        }
        let mut out = vec![0u8; c0.len() * 4];
        gpu.download(l, dc, &mut out)?;
        let got = bytes_f32(&out);
        let mut err = 0.0f32;
        for j in 0..n {
            for r in 0..m {
                let (x, y) = (got[r + j * ldc], want[r + j * ldc]);
                err = err.max((x - y).abs() / y.abs().max(1.0));
            }
            if (m..ldc).any(|r| got[r + j * ldc] != c0[r + j * ldc]) {
                err = f32::INFINITY;
            }
        }
        worst = worst.max(err);
    }
    gpu.free(da);
    gpu.free(db);
    gpu.free(dc);
    let units = crate::gpu::compute::matrix_units(gpu.kind(), &gpu.info().arch);
    Ok((
        worst < 1e-4,
        format!(
            "{m}×{n}×{k}, {} ({units}), max rel. error {worst:.2e}",
            runs.join(" and ")
        ),
    ))
}
