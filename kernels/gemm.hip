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

// ---- The f16 matrix kernel of the prefill path ---------------------------------------------
// C[c * ldc + r] = sum_k A[r * lda + k] * B[c * ldb + k] for r < m, c < n: A holds m rows of k
// halves (a dequantized weight tile), B n rows of k halves (the batch's Q8-rounded activations),
// C is f32, column-major (cuBLAS's C = op(A)^T-with-transa=T · B). Accumulates in f32.
// Contract (the host checks it): k a multiple of 32, lda and ldb multiples of 8, A and B 16-byte
// aligned. A 64 x 64 block of C per 128-thread block, staged through shared memory 32 k at a
// time; the product of the staged tiles runs on the device's matrix units where it has them:
//   CUDA sm_80+        mma.sync.m16n8k16 (f16 in, f32 accumulate), 4 warps of 32 x 32
//   gfx11 (wave32)     v_wmma_f32_16x16x16_f16, 4 waves of 32 x 32
//   gfx908/90a/94x     v_mfma_f32_16x16x16f16 (wave64), 2 waves of 32 x 64
//   anything else      plain FMA (gfx1030, older CUDA): 32 outputs a thread
// src/gpu/compute/dequant.rs (`matrix_units`) names the same choice for the UI: keep them in step.

#define HS_MM_BM 64
#define HS_MM_BN 64
#define HS_MM_BK 32
// Halves per shared row: BK plus 8 of padding (80 bytes: 16-byte aligned, conflict-free reads).
#define HS_MM_LDS 40
#define HS_MM_THREADS 128

#if defined(HS_BACKEND_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define HS_MM_MMA_SYNC 1
#elif defined(HS_BACKEND_HIP) &&                                                                \
    (defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) ||                    \
     defined(__gfx1103__) || defined(__gfx1150__) || defined(__gfx1151__) ||                    \
     defined(__gfx1152__))
#define HS_MM_WMMA 1
typedef _Float16 hs_mm_half16 __attribute__((ext_vector_type(16)));
typedef float hs_mm_float8 __attribute__((ext_vector_type(8)));
#elif defined(HS_BACKEND_HIP) && (defined(__gfx908__) || defined(__gfx90a__) ||                \
                                  defined(__gfx940__) || defined(__gfx941__) ||                 \
                                  defined(__gfx942__))
#define HS_MM_MFMA 1
typedef _Float16 hs_mm_half4 __attribute__((ext_vector_type(4)));
typedef float hs_mm_float4 __attribute__((ext_vector_type(4)));
#endif

// One 32-bit word of two halves at shared index i (i even).
__device__ __forceinline__ hs_u32 hs_mm_word(const unsigned short *s, hs_u32 i) {
    return *(const hs_u32 *)(s + i);
}

__device__ __forceinline__ void hs_mm_store(float *C, hs_i32 ldc, hs_i32 m, hs_i32 n, hs_i32 r,
                                            hs_i32 c, float v) {
    if (r < m && c < n) {
        C[(hs_i64)c * ldc + r] = v;
    }
}

HS_KERNEL void hs_gemm_f16(HS_TRACK_PARAMS, hs_i32 m, hs_i32 n, hs_i32 k,
                           const unsigned short *A, hs_i32 lda, const unsigned short *B,
                           hs_i32 ldb, float *C, hs_i32 ldc) {
    HS_BREADCRUMB();
    __shared__ __attribute__((aligned(16))) unsigned short As[HS_MM_BM * HS_MM_LDS];
    __shared__ __attribute__((aligned(16))) unsigned short Bs[HS_MM_BN * HS_MM_LDS];
    const hs_i32 row0 = blockIdx.x * HS_MM_BM;
    const hs_i32 col0 = blockIdx.y * HS_MM_BN;
    const hs_u32 tid = threadIdx.x;
    const hs_u32 lane = tid % warpSize;
    const hs_u32 wave = tid / warpSize;

#if defined(HS_MM_MMA_SYNC)
    // Warp w: rows 32 (w / 2), columns 32 (w % 2); 2 x 4 fragments of 16 x 8.
    const hs_u32 wm = (wave / 2) * 32, wn = (wave % 2) * 32;
    const hs_u32 g = lane / 4, t = lane % 4;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
#elif defined(HS_MM_WMMA)
    // Wave w: rows 32 (w / 2), columns 32 (w % 2); 2 x 2 fragments of 16 x 16.
    const hs_u32 wm = (wave / 2) * 32, wn = (wave % 2) * 32;
    hs_mm_float8 acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[i][j][e] = 0.0f;
#elif defined(HS_MM_MFMA)
    // Wave w (of 2): rows 32 w, all 64 columns; 2 x 4 fragments of 16 x 16.
    const hs_u32 wm = wave * 32;
    hs_mm_float4 acc[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
#else
    // Thread: rows tr + 16 i (i < 4), columns tc + 8 j (j < 8).
    const hs_u32 tr = tid % 16, tc = tid / 16;
    float acc[4][8];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
#endif

    for (hs_i32 kt = 0; kt < k; kt += HS_MM_BK) {
        // Stage 64 rows x 32 halves of each operand: 256 loads of 16 bytes, two a thread.
        for (hs_u32 i = tid; i < HS_MM_BM * (HS_MM_BK / 8); i += HS_MM_THREADS) {
            const hs_u32 r = i / (HS_MM_BK / 8);
            const hs_u32 c = (i % (HS_MM_BK / 8)) * 8;
            uint4 va = make_uint4(0, 0, 0, 0);
            if (row0 + (hs_i32)r < m) {
                va = *(const uint4 *)(A + (hs_i64)(row0 + r) * lda + kt + c);
            }
            *(uint4 *)(As + r * HS_MM_LDS + c) = va;
            uint4 vb = make_uint4(0, 0, 0, 0);
            if (col0 + (hs_i32)r < n) {
                vb = *(const uint4 *)(B + (hs_i64)(col0 + r) * ldb + kt + c);
            }
            *(uint4 *)(Bs + r * HS_MM_LDS + c) = vb;
        }
        __syncthreads();
#pragma unroll
        for (hs_u32 kk = 0; kk < HS_MM_BK; kk += 16) {
#if defined(HS_MM_MMA_SYNC)
            hs_u32 a[2][4], b[4][2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const hs_u32 r = (wm + 16 * i + g) * HS_MM_LDS + kk + 2 * t;
                a[i][0] = hs_mm_word(As, r);
                a[i][1] = hs_mm_word(As, r + 8 * HS_MM_LDS);
                a[i][2] = hs_mm_word(As, r + 8);
                a[i][3] = hs_mm_word(As, r + 8 * HS_MM_LDS + 8);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const hs_u32 c = (wn + 8 * j + g) * HS_MM_LDS + kk + 2 * t;
                b[j][0] = hs_mm_word(Bs, c);
                b[j][1] = hs_mm_word(Bs, c + 8);
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                                 : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]),
                                   "+f"(acc[i][j][3])
                                 : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]),
                                   "r"(b[j][0]), "r"(b[j][1]));
#elif defined(HS_MM_WMMA)
            // Lane l holds row (A) / column (B) l % 16, all 16 k of the step.
            hs_mm_half16 a[2], b[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const uint4 *p = (const uint4 *)(As + (wm + 16 * i + lane % 16) * HS_MM_LDS + kk);
                uint4 v[2] = {p[0], p[1]};
                __builtin_memcpy(&a[i], v, 32);
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const uint4 *p = (const uint4 *)(Bs + (wn + 16 * j + lane % 16) * HS_MM_LDS + kk);
                uint4 v[2] = {p[0], p[1]};
                __builtin_memcpy(&b[j], v, 32);
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j)
                    acc[i][j] = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a[i], b[j], acc[i][j]);
#elif defined(HS_MM_MFMA)
            // Lane l holds row (A) / column (B) l % 16, k 4 (l / 16) .. + 4.
            hs_mm_half4 a[2], b[4];
            const hs_u32 ko = kk + 4 * (lane / 16);
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const uint2 v = *(const uint2 *)(As + (wm + 16 * i + lane % 16) * HS_MM_LDS + ko);
                __builtin_memcpy(&a[i], &v, 8);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const uint2 v = *(const uint2 *)(Bs + (16 * j + lane % 16) * HS_MM_LDS + ko);
                __builtin_memcpy(&b[j], &v, 8);
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    acc[i][j] = __builtin_amdgcn_mfma_f32_16x16x16f16(a[i], b[j], acc[i][j], 0, 0, 0);
#else
#pragma unroll
            for (hs_u32 q = kk; q < kk + 16; ++q) {
                float a[4], b[8];
#pragma unroll
                for (int i = 0; i < 4; ++i) a[i] = hs_half_to_float(As[(tr + 16 * i) * HS_MM_LDS + q]);
#pragma unroll
                for (int j = 0; j < 8; ++j) b[j] = hs_half_to_float(Bs[(tc + 8 * j) * HS_MM_LDS + q]);
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
#endif
        }
        __syncthreads();
    }

#if defined(HS_MM_MMA_SYNC)
    // c0, c1: row g, columns 2t, 2t + 1; c2, c3: row g + 8.
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const hs_i32 r = row0 + wm + 16 * i + g;
            const hs_i32 c = col0 + wn + 8 * j + 2 * t;
            hs_mm_store(C, ldc, m, n, r, c, acc[i][j][0]);
            hs_mm_store(C, ldc, m, n, r, c + 1, acc[i][j][1]);
            hs_mm_store(C, ldc, m, n, r + 8, c, acc[i][j][2]);
            hs_mm_store(C, ldc, m, n, r + 8, c + 1, acc[i][j][3]);
        }
#elif defined(HS_MM_WMMA)
    // Element e of lane l: row 2e + l / 16, column l % 16.
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 8; ++e)
                hs_mm_store(C, ldc, m, n, row0 + wm + 16 * i + 2 * e + lane / 16,
                            col0 + wn + 16 * j + lane % 16, acc[i][j][e]);
#elif defined(HS_MM_MFMA)
    // Element e of lane l: row 4 (l / 16) + e, column l % 16.
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                hs_mm_store(C, ldc, m, n, row0 + wm + 16 * i + 4 * (lane / 16) + e,
                            col0 + 16 * j + lane % 16, acc[i][j][e]);
#else
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
            hs_mm_store(C, ldc, m, n, row0 + tr + 16 * i, col0 + tc + 8 * j, acc[i][j]);
#endif
}
