// The f16 matrix kernel of the prefill path (hs_gemm_f16): a weight tile dequantized to f16 times
// the batch's Q8-rounded f16 activations, on the matrix-unit core of mma.h (compiled before this
// file, which describes the contract; gemm_moe.hip's grouped expert products share it).

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
