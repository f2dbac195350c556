// Dequantization of weight rows: embedding lookups (rows picked by token id, to f32) and row
// tiles of a weight matrix turned into f16 for the GEMM of a prompt batch on the matrix units, by
// the element functions of dequant.h (compiled before this file). The kernels of each type are
// generated from the unit's type list, which the host defines before this file
// (src/gpu/compute/plan.rs's type table): HS_DQ_TYPES(X), X(type, BL, BB) with BL elements and
// BB bytes per block.

// out[r * cols + c] = element c of source row (tokens ? tokens[r] : r) of `table`, for
// blockIdx.y = r. A source row outside the table (the host checks token ids first) reads as 0.
template <float (*DQ)(const unsigned char *, hs_u32), hs_u32 BL, hs_u32 BB>
__device__ void infer_dequant_rows(const unsigned char *table, const hs_u32 *tokens, float *out,
                                   hs_u32 cols, hs_u64 row_bytes, hs_u32 n_src_rows) {
    const hs_u32 r = blockIdx.y;
    const hs_u32 src = (tokens != 0) ? tokens[r] : r;
    float *o = out + (hs_u64)r * cols;
    const unsigned char *row = table + (hs_u64)src * row_bytes;
    const hs_u32 stride = gridDim.x * blockDim.x;
    for (hs_u32 c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += stride) {
        o[c] = (src < n_src_rows) ? DQ(row + (hs_u64)(c / BL) * BB, c % BL) : 0.0f;
    }
}

// Weight rows to f16 for the prefill GEMM on the matrix units: thread i of the grid (grid-stride)
// converts 32 consecutive elements, chunk i % (cols / 32) of row i / (cols / 32), and stores them
// as four 16-byte words (cols a multiple of 32; `out` 16-byte aligned). A thread per element, as
// hs_dequant_rows_* does, spent its time scheduling blocks: 25% of Llama-2-7B's pp512 on the H100.
template <float (*DQ)(const unsigned char *, hs_u32), hs_u32 BL, hs_u32 BB>
__device__ void infer_dequant_tile(const unsigned char *table, unsigned short *out, hs_u32 cols,
                                   hs_u64 row_bytes, hs_u32 rows) {
    const hs_u32 chunks = cols / 32;
    const hs_u64 n = (hs_u64)rows * chunks;
    const hs_u64 stride = (hs_u64)gridDim.x * blockDim.x;
    for (hs_u64 i = (hs_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const hs_u64 r = i / chunks;
        const hs_u32 c0 = (hs_u32)(i % chunks) * 32;
        const unsigned char *row = table + r * row_bytes;
        hs_u32 w[16];
#pragma unroll
        for (hs_u32 e = 0; e < 32; e += 2) {
            const hs_u32 c = c0 + e;
            const float a = DQ(row + (hs_u64)(c / BL) * BB, c % BL);
            const float b = DQ(row + (hs_u64)((c + 1) / BL) * BB, (c + 1) % BL);
            w[e / 2] = (hs_u32)hs_float_to_half(a) | ((hs_u32)hs_float_to_half(b) << 16);
        }
        uint4 *o = (uint4 *)(out + r * cols + c0);
        o[0] = make_uint4(w[0], w[1], w[2], w[3]);
        o[1] = make_uint4(w[4], w[5], w[6], w[7]);
        o[2] = make_uint4(w[8], w[9], w[10], w[11]);
        o[3] = make_uint4(w[12], w[13], w[14], w[15]);
    }
}

// hs_dequant_rows_<t> (table, tokens, out, cols, row_bytes, n_src_rows) and
// hs_dequant_tile_<t> (table, out, cols, row_bytes, rows).
#define HS_DQ_KERNELS(T, BL, BB)                                                               \
    HS_KERNEL void hs_dequant_rows_##T(HS_TRACK_PARAMS, const unsigned char *table,            \
                                       const hs_u32 *tokens, float *out, hs_u32 cols,          \
                                       hs_u64 row_bytes, hs_u32 n_src_rows) {                  \
        HS_BREADCRUMB();                                                                       \
        infer_dequant_rows<dq_##T, BL, BB>(table, tokens, out, cols, row_bytes, n_src_rows);   \
    }                                                                                          \
    HS_KERNEL void hs_dequant_tile_##T(HS_TRACK_PARAMS, const unsigned char *table,            \
                                       unsigned short *out, hs_u32 cols, hs_u64 row_bytes,     \
                                       hs_u32 rows) {                                          \
        HS_BREADCRUMB();                                                                       \
        infer_dequant_tile<dq_##T, BL, BB>(table, out, cols, row_bytes, rows);                 \
    }

HS_DQ_TYPES(HS_DQ_KERNELS)
