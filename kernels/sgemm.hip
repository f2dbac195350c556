// The GEMM used when rocBLAS is absent (Debian bookworm ships none) or has no code for the device
// (no Debian rocBLAS ships gfx1151 kernels). Same contract as rocblas_sgemm / cublasSgemm in device
// pointer mode: column-major, C = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T, alpha and
// beta read from device memory, C not read when beta == 0. A 16x16 shared-memory tile per block.

#define HS_GEMM_TILE 16

HS_KERNEL void hs_sgemm(HS_TRACK_PARAMS, hs_i32 transa, hs_i32 transb, hs_i32 m, hs_i32 n,
                        hs_i32 k, const float *alpha, const float *A, hs_i32 lda, const float *B,
                        hs_i32 ldb, const float *beta, float *C, hs_i32 ldc) {
    HS_BREADCRUMB();
    __shared__ float As[HS_GEMM_TILE][HS_GEMM_TILE + 1];
    __shared__ float Bs[HS_GEMM_TILE][HS_GEMM_TILE + 1];
    const hs_i32 tx = threadIdx.x;
    const hs_i32 ty = threadIdx.y;
    const hs_i32 row = blockIdx.x * HS_GEMM_TILE + tx;
    const hs_i32 col = blockIdx.y * HS_GEMM_TILE + ty;
    float acc = 0.0f;
    for (hs_i32 t = 0; t < k; t += HS_GEMM_TILE) {
        const hs_i32 ka = t + ty;
        float a = 0.0f;
        if (row < m && ka < k) {
            a = transa ? A[ka + (hs_i64)row * lda] : A[row + (hs_i64)ka * lda];
        }
        As[tx][ty] = a;
        const hs_i32 kb = t + tx;
        float b = 0.0f;
        if (col < n && kb < k) {
            b = transb ? B[col + (hs_i64)kb * ldb] : B[kb + (hs_i64)col * ldb];
        }
        Bs[tx][ty] = b;
        __syncthreads();
        for (hs_i32 j = 0; j < HS_GEMM_TILE; ++j) {
            acc += As[tx][j] * Bs[j][ty];
        }
        __syncthreads();
    }
    if (row < m && col < n) {
        const float be = *beta;
        const hs_i64 idx = row + (hs_i64)col * ldc;
        const float prev = (be == 0.0f) ? 0.0f : be * C[idx];
        C[idx] = (*alpha) * acc + prev;
    }
}
