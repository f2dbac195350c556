// The GEMM used when rocBLAS is absent (Debian bookworm ships none) or has no code for the device
// (no Debian rocBLAS ships gfx1151 kernels). Same contract as rocblas_sgemm / cublasSgemm in device
// pointer mode: column-major, C = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T, alpha and
// beta read from device memory, C not read when beta == 0. A 16x16 shared-memory tile per block.
// Then the f16 matrix kernel of the prefill path (hs_gemm_f16) and the grouped expert products of
// a prompt's mixture-of-experts op (hs_moe_mm_*), which share its matrix-unit core. The module is
// compiled with infer_dequant.hip's element functions before it (gpu/kernels.rs, USES).

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

HS_KERNEL void hs_gemm_f16(HS_TRACK_PARAMS, hs_i32 m, hs_i32 n, hs_i32 k,
                           const unsigned short *A, hs_i32 lda, const unsigned short *B,
                           hs_i32 ldb, float *C, hs_i32 ldc) {
    HS_BREADCRUMB();
    __shared__ __attribute__((aligned(16))) unsigned short As[HS_MM_BM * HS_MM_LDS];
    __shared__ __attribute__((aligned(16))) unsigned short Bs[HS_MM_BN * HS_MM_LDS];
    const hs_i32 row0 = blockIdx.x * HS_MM_BM;
    const hs_i32 col0 = blockIdx.y * HS_MM_BN;
    const hs_u32 tid = threadIdx.x;
    hs_mm_acc acc;
    hs_mm_zero(acc);
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
        hs_mm_tile(As, Bs, acc);
        __syncthreads();
    }
#pragma unroll
    for (int e = 0; e < HS_MM_ACC; ++e) {
        float v;
        hs_i32 r, c;
        hs_mm_at(acc, e, &v, &r, &c);
        if (row0 + r < m && col0 + c < n) {
            C[(hs_i64)(col0 + c) * ldc + row0 + r] = v;
        }
    }
}

// ---- The grouped expert products of a prompt batch (mixture of experts) --------------------
// The sorted entries of each expert times that expert's weights, on the matrix units, with the
// weights dequantized to f16 as they are staged (per type: the element functions of
// infer_dequant.hip, compiled before this file) and read once per chunk of up to 64 entries, as
// the route's chunk table (blockIdx.y) gives them (infer_moe.hip routes and sorts). blockIdx.x: 64
// rows of the expert's matrix. B rows are f16 activations already Q8-rounded
// (hs_quantize_act_f16), so these products multiply the numbers the one-token kernels multiply,
// as the dense prefill GEMM does. Before them, a prompt batch ran its experts as matrix-vector
// products over 8 entries at a time: 1.6 ms of gate/up a layer for a 512-token Qwen3-30B-A3B
// prompt on the H100 (llama.cpp's grouped mul_mat_q: 0.28 ms).

// 16 elements c0 .. c0 + 15 (c0 a multiple of 16) of weight row `row` as f16 pairs into w: by the
// element functions of infer_dequant.hip (BL-element blocks of BB bytes), or, for the common
// expert types, from whole words of the block (below). A product's weights are dequantized once
// per chunk that reads them, so this is most of a grouped product's work.
template <float (*DQ)(const unsigned char *, hs_u32), hs_u32 BL, hs_u32 BB>
__device__ __forceinline__ void mm_dq16(const unsigned char *row, hs_u32 c0, hs_u32 *w) {
#pragma unroll
    for (hs_u32 e = 0; e < 16; e += 2) {
        const hs_u32 c = c0 + e;
        const float a = DQ(row + (hs_u64)(c / BL) * BB, c % BL);
        const float b = DQ(row + (hs_u64)((c + 1) / BL) * BB, (c + 1) % BL);
        w[e / 2] = (hs_u32)hs_float_to_half(a) | ((hs_u32)hs_float_to_half(b) << 16);
    }
}

__device__ __forceinline__ hs_u32 mm_half2(float a, float b) {
    return (hs_u32)hs_float_to_half(a) | ((hs_u32)hs_float_to_half(b) << 16);
}

// Q4_0 (d, qs[16]; element j the low nibble of qs[j], j + 16 the high one): the 16 quant bytes
// as 2-byte words (blocks are 18 bytes, so 2-aligned), the values as dq_q4_0 computes them.
__device__ __forceinline__ void mm_dq16_q4_0(hs_u32, const unsigned char *row, hs_u32 c0,
                                             hs_u32 *w) {
    const unsigned char *b = row + (hs_u64)(c0 / 32) * 18;
    const float d = dq_half(b);
    const unsigned short *q = (const unsigned short *)(b + 2);
    const hs_u32 sh = c0 & 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const hs_u32 u = q[i];
        w[i] = mm_half2((float)((int)((u >> sh) & 0xF) - 8) * d,
                        (float)((int)((u >> (8 + sh)) & 0xF) - 8) * d);
    }
}

// Q8_0 (d, qs[32] signed; 34-byte blocks): 2-byte words of quants.
__device__ __forceinline__ void mm_dq16_q8_0(hs_u32, const unsigned char *row, hs_u32 c0,
                                             hs_u32 *w) {
    const unsigned char *b = row + (hs_u64)(c0 / 32) * 34;
    const float d = dq_half(b);
    const unsigned short *q = (const unsigned short *)(b + 2 + (c0 & 16));
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const hs_u32 u = q[i];
        w[i] = mm_half2((float)(signed char)(u & 0xFF) * d, (float)(signed char)(u >> 8) * d);
    }
}

// MXFP4 (e, qs[16] laid out as Q4_0's; 17-byte blocks, byte loads): four nibbles at a time
// through the value table in registers (hs_lut16_4).
__device__ __forceinline__ void mm_dq16_mxfp4(hs_u32, const unsigned char *row, hs_u32 c0,
                                              hs_u32 *w) {
    const unsigned char *b = row + (hs_u64)(c0 / 32) * 17;
    const float d = dq_e8m0_half(b[0]);
    const hs_u32 sh = c0 & 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned char *q = b + 1 + 4 * i;
        const hs_u32 v = (hs_u32)q[0] | ((hs_u32)q[1] << 8) | ((hs_u32)q[2] << 16) |
                         ((hs_u32)q[3] << 24);
        const int t = hs_lut16_4(v >> sh, HS_LUT_MXFP4);
        w[2 * i] = mm_half2((float)(signed char)t * d, (float)(signed char)(t >> 8) * d);
        w[2 * i + 1] =
            mm_half2((float)(signed char)(t >> 16) * d, (float)(signed char)(t >> 24) * d);
    }
}

// Every other type by its element functions, the type (its ggml id) chosen at run time: one
// kernel serves them all, which keeps this module's compile time (four targets in CI) from
// growing by a matrix-unit body per type.
__device__ __forceinline__ void mm_dq16_any(hs_u32 ty, const unsigned char *row, hs_u32 c0,
                                            hs_u32 *w) {
    switch (ty) {
    case 3: mm_dq16<dq_q4_1, 32, 20>(row, c0, w); break;
    case 6: mm_dq16<dq_q5_0, 32, 22>(row, c0, w); break;
    case 7: mm_dq16<dq_q5_1, 32, 24>(row, c0, w); break;
    case 10: mm_dq16<dq_q2_k, 256, 84>(row, c0, w); break;
    case 11: mm_dq16<dq_q3_k, 256, 110>(row, c0, w); break;
    case 12: mm_dq16<dq_q4_k, 256, 144>(row, c0, w); break;
    case 13: mm_dq16<dq_q5_k, 256, 176>(row, c0, w); break;
    case 14: mm_dq16<dq_q6_k, 256, 210>(row, c0, w); break;
    case 20: mm_dq16<dq_iq4_nl, 32, 18>(row, c0, w); break;
    case 23: mm_dq16<dq_iq4_xs, 256, 136>(row, c0, w); break;
    default:
        // Unreachable: the host sends only the types above here (src/gpu/compute/plan.rs's test
        // holds every quantized type to a case). Should one slip through, NaN halves, so that
        // the result is visibly wrong (selftest --compute fails) rather than silently zero.
        for (int i = 0; i < 8; ++i) w[i] = 0x7E007E00u;
        break;
    }
}

// The 16 elements through DQ16 into shared row position s (16-byte aligned).
template <void (*DQ16)(hs_u32, const unsigned char *, hs_u32, hs_u32 *)>
__device__ __forceinline__ void moe_mm_dq16(hs_u32 ty, const unsigned char *row, hs_u32 c0,
                                            unsigned short *s) {
    hs_u32 w[8];
    DQ16(ty, row, c0, w);
    uint4 *o = (uint4 *)s;
    o[0] = make_uint4(w[0], w[1], w[2], w[3]);
    o[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// The chunk's 64 activation rows (zeros past its entries) for step kt: two 16-byte loads a
// thread, from the rows the thread was given (xr[0], xr[1]: null past the chunk).
__device__ __forceinline__ void moe_mm_stage_b(const unsigned short *const *xr, hs_u32 kt,
                                               unsigned short *Bs) {
    const hs_u32 tid = threadIdx.x;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const hs_u32 i = tid + h * HS_MM_THREADS;
        const hs_u32 r = i / (HS_MM_BK / 8);
        const hs_u32 c = (i % (HS_MM_BK / 8)) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (xr[h] != 0) {
            v = *(const uint4 *)(xr[h] + kt + c);
        }
        *(uint4 *)(Bs + r * HS_MM_LDS + c) = v;
    }
}

// h[s + t][row] = act(gate_e[row] . x[tok[s + t]], up_e[row] . x[tok[s + t]]) (moe_act; gb, ub:
// gpt-oss's biases or null) for the chunk's entries t and the block's 32 hidden rows: xh holds the
// batch's tokens (f16, `cols` each); `ff` rows per expert. The block's A tile is those 32 rows of
// gate (tile rows 0..31) over the same 32 of up (32..63), so one tile and one accumulator serve
// both; the up half goes through shared memory to the threads holding the gate half. (Two
// 64-row tiles and two accumulators a block ran at half the speed of the down product per row.)
#define MOE_MM_HALF (HS_MM_BM / 2)
template <void (*DQ16)(hs_u32, const unsigned char *, hs_u32, hs_u32 *)>
__device__ __forceinline__ void moe_mm_gate_up(const unsigned char *wg, const unsigned char *wu,
                                               const unsigned short *xh, float *h,
                                               const float *route, hs_u32 n, hs_u32 k,
                                               hs_u32 ff, hs_u32 cols, const float *gb,
                                               const float *ub, hs_u32 ty, hs_u64 row_bytes) {
    // As, Bs; after the products, the up half of the tile as floats (MOE_MM_HALF x 65).
    __shared__ __attribute__((aligned(16))) unsigned short S[(HS_MM_BM + HS_MM_BN) * HS_MM_LDS];
    unsigned short *As = S;
    unsigned short *Bs = S + HS_MM_BM * HS_MM_LDS;
    int e, s, c;
    const hs_u32 row0 = blockIdx.x * MOE_MM_HALF;
    if (row0 >= ff || !moe_chunk(route, n, k, &e, &s, &c)) {
        return;
    }
    const int *tok = (const int *)(route + (hs_u64)n * k * 2) + (hs_u64)n * k;
    const hs_u32 tid = threadIdx.x;
    // A: thread tid dequantizes half tid % 2 of tile row tid / 2 (gate, then up).
    const hs_u32 ar = tid / 2;
    const hs_u32 ah = (tid % 2) * 16;
    const hs_u32 hr = row0 + ar % MOE_MM_HALF;
    const bool alive = hr < ff;
    const unsigned char *arow =
        (ar < MOE_MM_HALF ? wg : wu) + ((hs_u64)e * ff + (alive ? hr : 0)) * row_bytes;
    const unsigned short *xr[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
        const hs_u32 r = (tid + q * HS_MM_THREADS) / (HS_MM_BK / 8);
        xr[q] = ((int)r < c) ? xh + (hs_u64)tok[s + r] * cols : 0;
    }
    hs_mm_acc acc;
    hs_mm_zero(acc);
    for (hs_u32 kt = 0; kt < cols; kt += HS_MM_BK) {
        if (alive) {
            moe_mm_dq16<DQ16>(ty, arow, kt + ah, As + ar * HS_MM_LDS + ah);
        } else {
            const uint4 z = make_uint4(0, 0, 0, 0);
            *(uint4 *)(As + ar * HS_MM_LDS + ah) = z;
            *(uint4 *)(As + ar * HS_MM_LDS + ah + 8) = z;
        }
        moe_mm_stage_b(xr, kt, Bs);
        __syncthreads();
        hs_mm_tile(As, Bs, acc);
        __syncthreads();
    }
    float *up = (float *)S;
#pragma unroll
    for (int q = 0; q < HS_MM_ACC; ++q) {
        float v;
        hs_i32 r, t;
        hs_mm_at(acc, q, &v, &r, &t);
        if (r >= MOE_MM_HALF) {
            up[(r - MOE_MM_HALF) * (HS_MM_BN + 1) + t] = v;
        }
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < HS_MM_ACC; ++q) {
        float g;
        hs_i32 r, t;
        hs_mm_at(acc, q, &g, &r, &t);
        const hs_u32 row = row0 + (hs_u32)r;
        if (r < MOE_MM_HALF && row < ff && t < c) {
            const float u = up[r * (HS_MM_BN + 1) + t];
            h[((hs_u64)s + t) * ff + row] = moe_act(g, u, gb, ub, (hs_u64)e * ff + row);
        }
    }
}

// y[s + t][row] = down_e[row] . hh[s + t] for the chunk's entries and the block's 64 rows; hh
// holds the entries' hidden rows in sorted order (f16, `ff` each); `dim` rows per expert.
template <void (*DQ16)(hs_u32, const unsigned char *, hs_u32, hs_u32 *)>
__device__ __forceinline__ void moe_mm_down(const unsigned char *wd, const unsigned short *hh,
                                            float *y, const float *route, hs_u32 n, hs_u32 k,
                                            hs_u32 dim, hs_u32 ff, hs_u32 ty, hs_u64 row_bytes) {
    __shared__ __attribute__((aligned(16))) unsigned short As[HS_MM_BM * HS_MM_LDS];
    __shared__ __attribute__((aligned(16))) unsigned short Bs[HS_MM_BN * HS_MM_LDS];
    int e, s, c;
    const hs_u32 row0 = blockIdx.x * HS_MM_BM;
    if (row0 >= dim || !moe_chunk(route, n, k, &e, &s, &c)) {
        return;
    }
    const hs_u32 tid = threadIdx.x;
    const hs_u32 ar = tid / 2;
    const hs_u32 ah = (tid % 2) * 16;
    const bool alive = row0 + ar < dim;
    const unsigned char *arow = wd + ((hs_u64)e * dim + row0 + ar) * row_bytes;
    const unsigned short *xr[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
        const hs_u32 r = (tid + q * HS_MM_THREADS) / (HS_MM_BK / 8);
        xr[q] = ((int)r < c) ? hh + ((hs_u64)s + r) * ff : 0;
    }
    hs_mm_acc acc;
    hs_mm_zero(acc);
    for (hs_u32 kt = 0; kt < ff; kt += HS_MM_BK) {
        if (alive) {
            moe_mm_dq16<DQ16>(ty, arow, kt + ah, As + ar * HS_MM_LDS + ah);
        } else {
            const uint4 z = make_uint4(0, 0, 0, 0);
            *(uint4 *)(As + ar * HS_MM_LDS + ah) = z;
            *(uint4 *)(As + ar * HS_MM_LDS + ah + 8) = z;
        }
        moe_mm_stage_b(xr, kt, Bs);
        __syncthreads();
        hs_mm_tile(As, Bs, acc);
        __syncthreads();
    }
#pragma unroll
    for (int q = 0; q < HS_MM_ACC; ++q) {
        float v;
        hs_i32 r, t;
        hs_mm_at(acc, q, &v, &r, &t);
        const hs_u32 row = row0 + (hs_u32)r;
        if (row < dim && t < c) {
            y[((hs_u64)s + t) * dim + row] = v;
        }
    }
}

// Two entry points for each of the types with their own dequantization above, and two for every
// other quantized type (`any`: ty is its ggml id); row_bytes: one expert row's bytes.

HS_KERNEL void hs_moe_mm_gate_up_q4_0(HS_TRACK_PARAMS, const unsigned char *wg,
                                    const unsigned char *wu, const unsigned short *xh, float *h,
                                    const float *route, hs_u32 n, hs_u32 k, hs_u32 ff,
                                    hs_u32 cols, const float *gb, const float *ub, hs_u32 ty,
                                    hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_gate_up<mm_dq16_q4_0>(wg, wu, xh, h, route, n, k, ff, cols, gb, ub, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_down_q4_0(HS_TRACK_PARAMS, const unsigned char *wd,
                                 const unsigned short *hh, float *y, const float *route,
                                 hs_u32 n, hs_u32 k, hs_u32 dim, hs_u32 ff, hs_u32 ty,
                                 hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_down<mm_dq16_q4_0>(wd, hh, y, route, n, k, dim, ff, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_gate_up_q8_0(HS_TRACK_PARAMS, const unsigned char *wg,
                                    const unsigned char *wu, const unsigned short *xh, float *h,
                                    const float *route, hs_u32 n, hs_u32 k, hs_u32 ff,
                                    hs_u32 cols, const float *gb, const float *ub, hs_u32 ty,
                                    hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_gate_up<mm_dq16_q8_0>(wg, wu, xh, h, route, n, k, ff, cols, gb, ub, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_down_q8_0(HS_TRACK_PARAMS, const unsigned char *wd,
                                 const unsigned short *hh, float *y, const float *route,
                                 hs_u32 n, hs_u32 k, hs_u32 dim, hs_u32 ff, hs_u32 ty,
                                 hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_down<mm_dq16_q8_0>(wd, hh, y, route, n, k, dim, ff, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_gate_up_mxfp4(HS_TRACK_PARAMS, const unsigned char *wg,
                                    const unsigned char *wu, const unsigned short *xh, float *h,
                                    const float *route, hs_u32 n, hs_u32 k, hs_u32 ff,
                                    hs_u32 cols, const float *gb, const float *ub, hs_u32 ty,
                                    hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_gate_up<mm_dq16_mxfp4>(wg, wu, xh, h, route, n, k, ff, cols, gb, ub, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_down_mxfp4(HS_TRACK_PARAMS, const unsigned char *wd,
                                 const unsigned short *hh, float *y, const float *route,
                                 hs_u32 n, hs_u32 k, hs_u32 dim, hs_u32 ff, hs_u32 ty,
                                 hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_down<mm_dq16_mxfp4>(wd, hh, y, route, n, k, dim, ff, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_gate_up_any(HS_TRACK_PARAMS, const unsigned char *wg,
                                    const unsigned char *wu, const unsigned short *xh, float *h,
                                    const float *route, hs_u32 n, hs_u32 k, hs_u32 ff,
                                    hs_u32 cols, const float *gb, const float *ub, hs_u32 ty,
                                    hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_gate_up<mm_dq16_any>(wg, wu, xh, h, route, n, k, ff, cols, gb, ub, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_down_any(HS_TRACK_PARAMS, const unsigned char *wd,
                                 const unsigned short *hh, float *y, const float *route,
                                 hs_u32 n, hs_u32 k, hs_u32 dim, hs_u32 ff, hs_u32 ty,
                                 hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_down<mm_dq16_any>(wd, hh, y, route, n, k, dim, ff, ty, row_bytes);
}
