// The matrix-unit core of the f16 products (hs_gemm_f16 in gemm.hip, hs_moe_mm_* in
// gemm_moe.hip, a prompt's attention in infer_attention_tiled.hip): a 64 x 64 tile of C from
// staged 64 x 32 tiles of A and B.
//
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
// HS_MM_HAS_UNITS: the tile runs on matrix units (one of the three above), as
// src/gpu/compute/dequant.rs `tensor_units` says for the same arch.
#if defined(HS_MM_MMA_SYNC) || defined(HS_MM_WMMA) || defined(HS_MM_MFMA)
#define HS_MM_HAS_UNITS 1
#endif

// One 32-bit word of two halves at shared index i (i even).
__device__ __forceinline__ hs_u32 hs_mm_word(const unsigned short *s, hs_u32 i) {
    return *(const hs_u32 *)(s + i);
}

// The block's 64 x 64 tile of C as the matrix units hold it: HS_MM_ACC floats a thread, whatever
// the units. hs_mm_zero clears it, hs_mm_tile adds the product of one staged step (As: 64 rows x
// BK of A, Bs: 64 rows x BK of B, HS_MM_LDS halves apart), hs_mm_at names element i's value and
// its row and column in the tile.
#define HS_MM_ACC 32

struct hs_mm_acc {
#if defined(HS_MM_MMA_SYNC)
    // Warp w: rows 32 (w / 2), columns 32 (w % 2); 2 x 4 fragments of 16 x 8.
    float v[2][4][4];
#elif defined(HS_MM_WMMA)
    // Wave w: rows 32 (w / 2), columns 32 (w % 2); 2 x 2 fragments of 16 x 16.
    hs_mm_float8 v[2][2];
#elif defined(HS_MM_MFMA)
    // Wave w (of 2): rows 32 w, all 64 columns; 2 x 4 fragments of 16 x 16.
    hs_mm_float4 v[2][4];
#else
    // Thread: rows tr + 16 i (i < 4), columns tc + 8 j (j < 8).
    float v[4][8];
#endif
};

__device__ __forceinline__ void hs_mm_zero(hs_mm_acc &acc) {
#if defined(HS_MM_MMA_SYNC)
#pragma unroll
    for (int e = 0; e < HS_MM_ACC; ++e) acc.v[e / 16][(e / 4) % 4][e % 4] = 0.0f;
#elif defined(HS_MM_WMMA)
#pragma unroll
    for (int e = 0; e < HS_MM_ACC; ++e) acc.v[e / 16][(e / 8) % 2][e % 8] = 0.0f;
#elif defined(HS_MM_MFMA)
#pragma unroll
    for (int e = 0; e < HS_MM_ACC; ++e) acc.v[e / 16][(e / 4) % 4][e % 4] = 0.0f;
#else
#pragma unroll
    for (int e = 0; e < HS_MM_ACC; ++e) acc.v[e / 8][e % 8] = 0.0f;
#endif
}

__device__ __forceinline__ void hs_mm_at(const hs_mm_acc &acc, int e, float *val, hs_i32 *r,
                                         hs_i32 *c) {
    const hs_u32 tid = threadIdx.x;
    const hs_u32 lane = tid % warpSize;
    const hs_u32 wave = tid / warpSize;
#if defined(HS_MM_MMA_SYNC)
    // c0, c1: row g, columns 2t, 2t + 1; c2, c3: row g + 8.
    const hs_u32 wm = (wave / 2) * 32, wn = (wave % 2) * 32;
    const int i = e / 16, j = (e / 4) % 4, q = e % 4;
    *val = acc.v[i][j][q];
    *r = (hs_i32)(wm + 16 * i + lane / 4 + 8 * (q / 2));
    *c = (hs_i32)(wn + 8 * j + 2 * (lane % 4) + q % 2);
#elif defined(HS_MM_WMMA)
    // Element q of lane l: row 2q + l / 16, column l % 16.
    const hs_u32 wm = (wave / 2) * 32, wn = (wave % 2) * 32;
    const int i = e / 16, j = (e / 8) % 2, q = e % 8;
    *val = acc.v[i][j][q];
    *r = (hs_i32)(wm + 16 * i + 2 * q + lane / 16);
    *c = (hs_i32)(wn + 16 * j + lane % 16);
#elif defined(HS_MM_MFMA)
    // Element q of lane l: row 4 (l / 16) + q, column l % 16.
    const int i = e / 16, j = (e / 4) % 4, q = e % 4;
    *val = acc.v[i][j][q];
    *r = (hs_i32)(wave * 32 + 16 * i + 4 * (lane / 16) + q);
    *c = (hs_i32)(16 * j + lane % 16);
#else
    const int i = e / 8, j = e % 8;
    *val = acc.v[i][j];
    *r = (hs_i32)(tid % 16 + 16 * i);
    *c = (hs_i32)(tid / 16 + 8 * j);
#endif
}

// Multiplies element e of the tile (hs_mm_at names its row and column) by f.
__device__ __forceinline__ void hs_mm_mul(hs_mm_acc &acc, int e, float f) {
#if defined(HS_MM_MMA_SYNC)
    acc.v[e / 16][(e / 4) % 4][e % 4] *= f;
#elif defined(HS_MM_WMMA)
    acc.v[e / 16][(e / 8) % 2][e % 8] *= f;
#elif defined(HS_MM_MFMA)
    acc.v[e / 16][(e / 4) % 4][e % 4] *= f;
#else
    acc.v[e / 8][e % 8] *= f;
#endif
}

__device__ __forceinline__ void hs_mm_tile(const unsigned short *As, const unsigned short *Bs,
                                           hs_mm_acc &acc) {
    const hs_u32 tid = threadIdx.x;
    const hs_u32 lane = tid % warpSize;
    const hs_u32 wave = tid / warpSize;
#pragma unroll
    for (hs_u32 kk = 0; kk < HS_MM_BK; kk += 16) {
#if defined(HS_MM_MMA_SYNC)
        const hs_u32 wm = (wave / 2) * 32, wn = (wave % 2) * 32;
        const hs_u32 g = lane / 4, t = lane % 4;
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
                             : "+f"(acc.v[i][j][0]), "+f"(acc.v[i][j][1]), "+f"(acc.v[i][j][2]),
                               "+f"(acc.v[i][j][3])
                             : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]),
                               "r"(b[j][0]), "r"(b[j][1]));
#elif defined(HS_MM_WMMA)
        // Lane l holds row (A) / column (B) l % 16, all 16 k of the step.
        const hs_u32 wm = (wave / 2) * 32, wn = (wave % 2) * 32;
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
                acc.v[i][j] = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a[i], b[j], acc.v[i][j]);
#elif defined(HS_MM_MFMA)
        // Lane l holds row (A) / column (B) l % 16, k 4 (l / 16) .. + 4.
        const hs_u32 wm = wave * 32;
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
                acc.v[i][j] = __builtin_amdgcn_mfma_f32_16x16x16f16(a[i], b[j], acc.v[i][j], 0, 0, 0);
#else
        const hs_u32 tr = tid % 16, tc = tid / 16;
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
                for (int j = 0; j < 8; ++j) acc.v[i][j] = fmaf(a[i], b[j], acc.v[i][j]);
        }
#endif
    }
}
