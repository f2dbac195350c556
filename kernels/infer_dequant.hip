// Dequantization of weight rows (embedding lookups, and row tiles of a weight matrix turned into
// f32, or f16 for the matrix units, for the GEMM of a prompt batch) and the Q8 quantization of
// activations. Block layouts are ggml's (src/gpu/quant/blocks.rs describes them byte by byte);
// the element formulas are those of the CPU backend's scalar reference, term for term.

__device__ __forceinline__ float dq_half(const unsigned char *p) {
    return hs_half_to_float(*(const unsigned short *)p);
}

__device__ __forceinline__ hs_u32 dq_u32_2(const unsigned char *p) {
    const unsigned short *h = (const unsigned short *)p;
    return (hs_u32)h[0] | ((hs_u32)h[1] << 16);
}

__device__ float dq_f32(const unsigned char *b, hs_u32 j) { return ((const float *)b)[j]; }
__device__ float dq_f16(const unsigned char *b, hs_u32 j) {
    return hs_half_to_float(((const unsigned short *)b)[j]);
}
__device__ float dq_bf16(const unsigned char *b, hs_u32 j) {
    return hs_bf16_to_float(((const unsigned short *)b)[j]);
}

// Q4_0: d, qs[16]; element j in the low nibble of qs[j], element j+16 in the high one.
__device__ float dq_q4_0(const unsigned char *b, hs_u32 j) {
    const hs_u32 q = (b[2 + (j & 15)] >> ((j >> 4) * 4)) & 0xF;
    return (float)((int)q - 8) * dq_half(b);
}

// Q4_1: d, m, qs[16].
__device__ float dq_q4_1(const unsigned char *b, hs_u32 j) {
    const hs_u32 q = (b[4 + (j & 15)] >> ((j >> 4) * 4)) & 0xF;
    return (float)q * dq_half(b) + dq_half(b + 2);
}

// Q5_0: d, qh[4] (bit j is element j's fifth bit), qs[16].
__device__ float dq_q5_0(const unsigned char *b, hs_u32 j) {
    const hs_u32 qh = dq_u32_2(b + 2);
    const hs_u32 q = ((b[6 + (j & 15)] >> ((j >> 4) * 4)) & 0xF) | (((qh >> j) & 1) << 4);
    return (float)((int)q - 16) * dq_half(b);
}

// Q5_1: d, m, qh[4], qs[16].
__device__ float dq_q5_1(const unsigned char *b, hs_u32 j) {
    const hs_u32 qh = dq_u32_2(b + 4);
    const hs_u32 q = ((b[8 + (j & 15)] >> ((j >> 4) * 4)) & 0xF) | (((qh >> j) & 1) << 4);
    return (float)q * dq_half(b) + dq_half(b + 2);
}

// Q8_0: d, qs[32] (signed).
__device__ float dq_q8_0(const unsigned char *b, hs_u32 j) {
    return (float)(signed char)b[2 + j] * dq_half(b);
}

// The six-bit scale and min of sub-block `s` (0..7) of a Q4_K/Q5_K super-block.
__device__ __forceinline__ void dq_k_scale_min(const unsigned char *q, hs_u32 s, hs_u32 *sc,
                                               hs_u32 *mn) {
    if (s < 4) {
        *sc = q[s] & 63;
        *mn = q[s + 4] & 63;
    } else {
        *sc = (q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4);
        *mn = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
    }
}

// Q4_K: d, dmin, scales[12], qs[128]; each 32 bytes of qs hold two 32-element sub-blocks (low
// nibbles, then high nibbles).
__device__ float dq_q4_k(const unsigned char *b, hs_u32 j) {
    const hs_u32 chunk = j / 64;
    const hs_u32 hi = (j % 64) / 32;
    const hs_u32 l = j % 32;
    hs_u32 sc, mn;
    dq_k_scale_min(b + 4, 2 * chunk + hi, &sc, &mn);
    const hs_u32 q = (b[16 + 32 * chunk + l] >> (4 * hi)) & 0xF;
    return dq_half(b) * (float)sc * (float)q - dq_half(b + 2) * (float)mn;
}

// Q5_K: d, dmin, scales[12], qh[32], qs[128]; sub-block s takes its fifth bit from bit s of qh[l].
__device__ float dq_q5_k(const unsigned char *b, hs_u32 j) {
    const hs_u32 chunk = j / 64;
    const hs_u32 hi = (j % 64) / 32;
    const hs_u32 l = j % 32;
    const hs_u32 sub = 2 * chunk + hi;
    hs_u32 sc, mn;
    dq_k_scale_min(b + 4, sub, &sc, &mn);
    const hs_u32 q = ((b[48 + 32 * chunk + l] >> (4 * hi)) & 0xF) | (((b[16 + l] >> sub) & 1) << 4);
    return dq_half(b) * (float)sc * (float)q - dq_half(b + 2) * (float)mn;
}

// Q6_K: ql[128], qh[64], scales[16] (signed), d. Per half of 128 elements, element
// l + 32 * quarter takes a nibble of ql[l] (quarters 0, 2) or ql[l + 32] (1, 3) and bit pair
// `quarter` of qh[l].
__device__ float dq_q6_k(const unsigned char *b, hs_u32 j) {
    const hs_u32 half = j / 128;
    const hs_u32 w = j % 128;
    const hs_u32 quarter = w / 32;
    const hs_u32 l = w % 32;
    const hs_u32 qlb = b[64 * half + l + (quarter & 1) * 32];
    const hs_u32 nib = (quarter >= 2) ? (qlb >> 4) : (qlb & 0xF);
    const hs_u32 hb = (b[128 + 32 * half + l] >> (2 * quarter)) & 3;
    const int q = (int)(nib | (hb << 4)) - 32;
    const int sc = (signed char)b[192 + 8 * half + l / 16 + 2 * quarter];
    return dq_half(b + 208) * (float)sc * (float)q;
}

// Q2_K: scales[16] (scale | min << 4 of each 16 elements), qs[64], d, dmin. Element 16i + l
// is bit pair (i % 8) / 2 of qs[32 (i / 8) + 16 (i % 2) + l].
__device__ float dq_q2_k(const unsigned char *b, hs_u32 j) {
    const hs_u32 i = j / 16;
    const hs_u32 q = (b[16 + 32 * (i / 8) + 16 * (i % 2) + j % 16] >> (2 * ((i % 8) / 2))) & 3;
    return dq_half(b + 80) * (float)(b[i] & 0xF) * (float)q -
           dq_half(b + 82) * (float)(b[i] >> 4);
}

// Q3_K: hmask[32], qs[64] (as Q2_K's), scales[12] (16 six-bit, offset 32), d. The third bit of
// element 16i + l is bit i / 2 of hmask[16 (i % 2) + l]; clear means -4.
__device__ float dq_q3_k(const unsigned char *b, hs_u32 j) {
    const hs_u32 i = j / 16;
    const hs_u32 l = 16 * (i % 2) + j % 16;
    const int low = (b[32 + 32 * (i / 8) + l] >> (2 * ((i % 8) / 2))) & 3;
    const int q = (b[l] >> (i / 2)) & 1 ? low : low - 4;
    const int sc = (int)(((b[96 + i % 8] >> (4 * (i / 8))) & 0xF) |
                         (((b[104 + i % 4] >> (2 * (i / 4))) & 3) << 4)) - 32;
    return dq_half(b + 108) * (float)sc * (float)q;
}

// IQ4_NL: d, qs[16] laid out as Q4_0's; a nibble indexes IQ4_NL's table (hs_lut16_1).
__device__ float dq_iq4_nl(const unsigned char *b, hs_u32 j) {
    const hs_u32 q = (b[2 + (j & 15)] >> ((j >> 4) * 4)) & 0xF;
    return dq_half(b) * hs_lut16_1(q, HS_LUT_IQ4NL);
}

// IQ4_XS: d, scales_h (u16), scales_l[4], qs[128]; each 32 elements as IQ4_NL's with the six-bit
// scale ib (offset 32).
__device__ float dq_iq4_xs(const unsigned char *b, hs_u32 j) {
    const hs_u32 ib = j / 32;
    const hs_u32 e = j % 32;
    const hs_u32 sh = (hs_u32)b[2] | ((hs_u32)b[3] << 8);
    const int ls = (int)(((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4));
    const hs_u32 q = (b[8 + 16 * ib + (e & 15)] >> ((e >> 4) * 4)) & 0xF;
    return dq_half(b) * (float)(ls - 32) * hs_lut16_1(q, HS_LUT_IQ4NL);
}

// MXFP4: e (E8M0 scale), qs[16] laid out as Q4_0's; a nibble indexes the doubled E2M1 values and
// the scale is halved to match (src/gpu/quant/mxfp4.rs). 17-byte blocks: byte loads only.
__device__ __forceinline__ float dq_e8m0_half(unsigned char x) {
    return __int_as_float((int)(x < 2 ? 0x00200000u << x : (hs_u32)(x - 1) << 23));
}

__device__ float dq_mxfp4(const unsigned char *b, hs_u32 j) {
    const hs_u32 q = (b[1 + (j & 15)] >> ((j >> 4) * 4)) & 0xF;
    return hs_lut16_1(q, HS_LUT_MXFP4) * dq_e8m0_half(b[0]);
}

// The kernels below; gemm.hip's grouped expert products take the element functions above
// without them.
#ifndef HS_DQ_TEMPLATES_ONLY

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

HS_KERNEL void hs_dequant_rows_f32(HS_TRACK_PARAMS, const unsigned char *table,
                                   const hs_u32 *tokens, float *out, hs_u32 cols,
                                   hs_u64 row_bytes, hs_u32 n_src_rows) {
    HS_BREADCRUMB();
    infer_dequant_rows<dq_f32, 1, 4>(table, tokens, out, cols, row_bytes, n_src_rows);
}

HS_KERNEL void hs_dequant_rows_f16(HS_TRACK_PARAMS, const unsigned char *table,
                                   const hs_u32 *tokens, float *out, hs_u32 cols,
                                   hs_u64 row_bytes, hs_u32 n_src_rows) {
    HS_BREADCRUMB();
    infer_dequant_rows<dq_f16, 1, 2>(table, tokens, out, cols, row_bytes, n_src_rows);
}

HS_KERNEL void hs_dequant_rows_bf16(HS_TRACK_PARAMS, const unsigned char *table,
                                    const hs_u32 *tokens, float *out, hs_u32 cols,
                                    hs_u64 row_bytes, hs_u32 n_src_rows) {
    HS_BREADCRUMB();
    infer_dequant_rows<dq_bf16, 1, 2>(table, tokens, out, cols, row_bytes, n_src_rows);
}

HS_KERNEL void hs_dequant_rows_q4_0(HS_TRACK_PARAMS, const unsigned char *table,
                                    const hs_u32 *tokens, float *out, hs_u32 cols,
                                    hs_u64 row_bytes, hs_u32 n_src_rows) {
    HS_BREADCRUMB();
    infer_dequant_rows<dq_q4_0, 32, 18>(table, tokens, out, cols, row_bytes, n_src_rows);
}

HS_KERNEL void hs_dequant_rows_q4_1(HS_TRACK_PARAMS, const unsigned char *table,
                                    const hs_u32 *tokens, float *out, hs_u32 cols,
                                    hs_u64 row_bytes, hs_u32 n_src_rows) {
    HS_BREADCRUMB();
    infer_dequant_rows<dq_q4_1, 32, 20>(table, tokens, out, cols, row_bytes, n_src_rows);
}

HS_KERNEL void hs_dequant_rows_q5_0(HS_TRACK_PARAMS, const unsigned char *table,
                                    const hs_u32 *tokens, float *out, hs_u32 cols,
                                    hs_u64 row_bytes, hs_u32 n_src_rows) {
    HS_BREADCRUMB();
    infer_dequant_rows<dq_q5_0, 32, 22>(table, tokens, out, cols, row_bytes, n_src_rows);
}

HS_KERNEL void hs_dequant_rows_q5_1(HS_TRACK_PARAMS, const unsigned char *table,
                                    const hs_u32 *tokens, float *out, hs_u32 cols,
                                    hs_u64 row_bytes, hs_u32 n_src_rows) {
    HS_BREADCRUMB();
    infer_dequant_rows<dq_q5_1, 32, 24>(table, tokens, out, cols, row_bytes, n_src_rows);
}

HS_KERNEL void hs_dequant_rows_q8_0(HS_TRACK_PARAMS, const unsigned char *table,
                                    const hs_u32 *tokens, float *out, hs_u32 cols,
                                    hs_u64 row_bytes, hs_u32 n_src_rows) {
    HS_BREADCRUMB();
    infer_dequant_rows<dq_q8_0, 32, 34>(table, tokens, out, cols, row_bytes, n_src_rows);
}

HS_KERNEL void hs_dequant_rows_q4_k(HS_TRACK_PARAMS, const unsigned char *table,
                                    const hs_u32 *tokens, float *out, hs_u32 cols,
                                    hs_u64 row_bytes, hs_u32 n_src_rows) {
    HS_BREADCRUMB();
    infer_dequant_rows<dq_q4_k, 256, 144>(table, tokens, out, cols, row_bytes, n_src_rows);
}

HS_KERNEL void hs_dequant_rows_q5_k(HS_TRACK_PARAMS, const unsigned char *table,
                                    const hs_u32 *tokens, float *out, hs_u32 cols,
                                    hs_u64 row_bytes, hs_u32 n_src_rows) {
    HS_BREADCRUMB();
    infer_dequant_rows<dq_q5_k, 256, 176>(table, tokens, out, cols, row_bytes, n_src_rows);
}

HS_KERNEL void hs_dequant_rows_q6_k(HS_TRACK_PARAMS, const unsigned char *table,
                                    const hs_u32 *tokens, float *out, hs_u32 cols,
                                    hs_u64 row_bytes, hs_u32 n_src_rows) {
    HS_BREADCRUMB();
    infer_dequant_rows<dq_q6_k, 256, 210>(table, tokens, out, cols, row_bytes, n_src_rows);
}

HS_KERNEL void hs_dequant_rows_q2_k(HS_TRACK_PARAMS, const unsigned char *table,
                                    const hs_u32 *tokens, float *out, hs_u32 cols,
                                    hs_u64 row_bytes, hs_u32 n_src_rows) {
    HS_BREADCRUMB();
    infer_dequant_rows<dq_q2_k, 256, 84>(table, tokens, out, cols, row_bytes, n_src_rows);
}

HS_KERNEL void hs_dequant_rows_q3_k(HS_TRACK_PARAMS, const unsigned char *table,
                                    const hs_u32 *tokens, float *out, hs_u32 cols,
                                    hs_u64 row_bytes, hs_u32 n_src_rows) {
    HS_BREADCRUMB();
    infer_dequant_rows<dq_q3_k, 256, 110>(table, tokens, out, cols, row_bytes, n_src_rows);
}

HS_KERNEL void hs_dequant_rows_iq4_nl(HS_TRACK_PARAMS, const unsigned char *table,
                                      const hs_u32 *tokens, float *out, hs_u32 cols,
                                      hs_u64 row_bytes, hs_u32 n_src_rows) {
    HS_BREADCRUMB();
    infer_dequant_rows<dq_iq4_nl, 32, 18>(table, tokens, out, cols, row_bytes, n_src_rows);
}

HS_KERNEL void hs_dequant_rows_iq4_xs(HS_TRACK_PARAMS, const unsigned char *table,
                                      const hs_u32 *tokens, float *out, hs_u32 cols,
                                      hs_u64 row_bytes, hs_u32 n_src_rows) {
    HS_BREADCRUMB();
    infer_dequant_rows<dq_iq4_xs, 256, 136>(table, tokens, out, cols, row_bytes, n_src_rows);
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

HS_KERNEL void hs_dequant_tile_f32(HS_TRACK_PARAMS, const unsigned char *table,
                                   unsigned short *out, hs_u32 cols, hs_u64 row_bytes,
                                   hs_u32 rows) {
    HS_BREADCRUMB();
    infer_dequant_tile<dq_f32, 1, 4>(table, out, cols, row_bytes, rows);
}

HS_KERNEL void hs_dequant_tile_f16(HS_TRACK_PARAMS, const unsigned char *table,
                                   unsigned short *out, hs_u32 cols, hs_u64 row_bytes,
                                   hs_u32 rows) {
    HS_BREADCRUMB();
    infer_dequant_tile<dq_f16, 1, 2>(table, out, cols, row_bytes, rows);
}

HS_KERNEL void hs_dequant_tile_bf16(HS_TRACK_PARAMS, const unsigned char *table,
                                    unsigned short *out, hs_u32 cols, hs_u64 row_bytes,
                                    hs_u32 rows) {
    HS_BREADCRUMB();
    infer_dequant_tile<dq_bf16, 1, 2>(table, out, cols, row_bytes, rows);
}

HS_KERNEL void hs_dequant_tile_q4_0(HS_TRACK_PARAMS, const unsigned char *table,
                                    unsigned short *out, hs_u32 cols, hs_u64 row_bytes,
                                    hs_u32 rows) {
    HS_BREADCRUMB();
    infer_dequant_tile<dq_q4_0, 32, 18>(table, out, cols, row_bytes, rows);
}

HS_KERNEL void hs_dequant_tile_q4_1(HS_TRACK_PARAMS, const unsigned char *table,
                                    unsigned short *out, hs_u32 cols, hs_u64 row_bytes,
                                    hs_u32 rows) {
    HS_BREADCRUMB();
    infer_dequant_tile<dq_q4_1, 32, 20>(table, out, cols, row_bytes, rows);
}

HS_KERNEL void hs_dequant_tile_q5_0(HS_TRACK_PARAMS, const unsigned char *table,
                                    unsigned short *out, hs_u32 cols, hs_u64 row_bytes,
                                    hs_u32 rows) {
    HS_BREADCRUMB();
    infer_dequant_tile<dq_q5_0, 32, 22>(table, out, cols, row_bytes, rows);
}

HS_KERNEL void hs_dequant_tile_q5_1(HS_TRACK_PARAMS, const unsigned char *table,
                                    unsigned short *out, hs_u32 cols, hs_u64 row_bytes,
                                    hs_u32 rows) {
    HS_BREADCRUMB();
    infer_dequant_tile<dq_q5_1, 32, 24>(table, out, cols, row_bytes, rows);
}

HS_KERNEL void hs_dequant_tile_q8_0(HS_TRACK_PARAMS, const unsigned char *table,
                                    unsigned short *out, hs_u32 cols, hs_u64 row_bytes,
                                    hs_u32 rows) {
    HS_BREADCRUMB();
    infer_dequant_tile<dq_q8_0, 32, 34>(table, out, cols, row_bytes, rows);
}

HS_KERNEL void hs_dequant_tile_q4_k(HS_TRACK_PARAMS, const unsigned char *table,
                                    unsigned short *out, hs_u32 cols, hs_u64 row_bytes,
                                    hs_u32 rows) {
    HS_BREADCRUMB();
    infer_dequant_tile<dq_q4_k, 256, 144>(table, out, cols, row_bytes, rows);
}

HS_KERNEL void hs_dequant_tile_q5_k(HS_TRACK_PARAMS, const unsigned char *table,
                                    unsigned short *out, hs_u32 cols, hs_u64 row_bytes,
                                    hs_u32 rows) {
    HS_BREADCRUMB();
    infer_dequant_tile<dq_q5_k, 256, 176>(table, out, cols, row_bytes, rows);
}

HS_KERNEL void hs_dequant_tile_q6_k(HS_TRACK_PARAMS, const unsigned char *table,
                                    unsigned short *out, hs_u32 cols, hs_u64 row_bytes,
                                    hs_u32 rows) {
    HS_BREADCRUMB();
    infer_dequant_tile<dq_q6_k, 256, 210>(table, out, cols, row_bytes, rows);
}

HS_KERNEL void hs_dequant_tile_q2_k(HS_TRACK_PARAMS, const unsigned char *table,
                                    unsigned short *out, hs_u32 cols, hs_u64 row_bytes,
                                    hs_u32 rows) {
    HS_BREADCRUMB();
    infer_dequant_tile<dq_q2_k, 256, 84>(table, out, cols, row_bytes, rows);
}

HS_KERNEL void hs_dequant_tile_q3_k(HS_TRACK_PARAMS, const unsigned char *table,
                                    unsigned short *out, hs_u32 cols, hs_u64 row_bytes,
                                    hs_u32 rows) {
    HS_BREADCRUMB();
    infer_dequant_tile<dq_q3_k, 256, 110>(table, out, cols, row_bytes, rows);
}

HS_KERNEL void hs_dequant_tile_iq4_nl(HS_TRACK_PARAMS, const unsigned char *table,
                                      unsigned short *out, hs_u32 cols, hs_u64 row_bytes,
                                      hs_u32 rows) {
    HS_BREADCRUMB();
    infer_dequant_tile<dq_iq4_nl, 32, 18>(table, out, cols, row_bytes, rows);
}

HS_KERNEL void hs_dequant_tile_iq4_xs(HS_TRACK_PARAMS, const unsigned char *table,
                                      unsigned short *out, hs_u32 cols, hs_u64 row_bytes,
                                      hs_u32 rows) {
    HS_BREADCRUMB();
    infer_dequant_tile<dq_iq4_xs, 256, 136>(table, out, cols, row_bytes, rows);
}

// Q8 quantization of activations, one thread per block of `bs` (32 or 256) values, exactly as the
// CPU backend quantizes them: q = round-half-even(x * 127 / max|x|), d of hs_q8_scale. Writes the
// quants and (d, d * sum q) per block where xq / xd are given, and the dequantized values
// (q * d) where xdq is given: the GEMM of a prompt batch then multiplies the same numbers the
// integer dot products of the matrix-vector kernels (and the CPU backend) multiply.
HS_KERNEL void hs_quantize_act(HS_TRACK_PARAMS, const float *x, signed char *xq, float *xd,
                               float *xdq, hs_u32 bs_arg, hs_u64 n_blocks) {
    HS_BREADCRUMB();
    bool q8_1;
    const hs_u32 bs = hs_q8_args(bs_arg, &q8_1);
    // One warp per block (grid-stride over the warps): lanes read consecutive elements.
    const hs_u64 nwarps = (hs_u64)gridDim.x * (blockDim.x / warpSize);
    for (hs_u64 blk = (hs_u64)blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize;
         blk < n_blocks; blk += nwarps) {
        hs_q8_block_warp(x + blk * bs, bs, (xq != 0) ? xq + blk * bs : 0,
                         (xd != 0) ? xd + 2 * blk : 0, (xdq != 0) ? xdq + blk * bs : 0, q8_1);
    }
}

// hs_quantize_act's dequantized values (q * d) written straight as f16, saturated to +-65504 (an
// outlier becomes large rather than infinite) and rounded to nearest even, for the f16 prefill
// GEMM: one pass over the batch where quantizing, then converting took two with an f32 copy
// between them. bs / 8 consecutive lanes take a block (bs = 32: 4 lanes, bs = 256: a warp of 32),
// each 8 elements read as two 16-byte words and written as one; the block's max is exchanged
// among its lanes (exact in any order) and the rounding is that of hs_q8_block_warp. The loop
// steps by whole grids, so every lane of a warp takes part in every exchange.
HS_KERNEL void hs_quantize_act_f16(HS_TRACK_PARAMS, const float *x, unsigned short *xh,
                                   hs_u32 bs, hs_u64 n_blocks) {
    HS_BREADCRUMB();
    const hs_u32 g = bs / 8;
    const hs_u64 total = n_blocks * g;
    const hs_u64 stride = (hs_u64)gridDim.x * blockDim.x;
    for (hs_u64 base = (hs_u64)blockIdx.x * blockDim.x; base < total; base += stride) {
        const hs_u64 i = base + threadIdx.x;
        const bool live = i < total;
        float4 a;
        float4 b;
        a.x = a.y = a.z = a.w = 0.0f;
        b = a;
        if (live) {
            a = ((const float4 *)x)[2 * i];
            b = ((const float4 *)x)[2 * i + 1];
        }
        float amax = fmaxf(fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(a.z), fabsf(a.w))),
                           fmaxf(fmaxf(fabsf(b.x), fabsf(b.y)), fmaxf(fabsf(b.z), fabsf(b.w))));
        for (hs_u32 m = 1; m < g; m <<= 1) {
            amax = fmaxf(amax, HS_SHFL_XOR(amax, m));
        }
        const float id = (amax != 0.0f) ? HS_DIV_RN(127.0f, amax) : 0.0f;
        const float d = hs_q8_scale(amax, id, bs);
        const float e[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        unsigned int h[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            int v = (int)rintf(e[k] * id);
            v = v < -128 ? -128 : (v > 127 ? 127 : v);
            h[k] = hs_float_to_half(fminf(fmaxf((float)v * d, -65504.0f), 65504.0f));
        }
        if (live) {
            uint4 o;
            o.x = h[0] | (h[1] << 16);
            o.y = h[2] | (h[3] << 16);
            o.z = h[4] | (h[5] << 16);
            o.w = h[6] | (h[7] << 16);
            ((uint4 *)xh)[i] = o;
        }
    }
}

HS_KERNEL void hs_dequant_rows_mxfp4(HS_TRACK_PARAMS, const unsigned char *table,
                                     const hs_u32 *tokens, float *out, hs_u32 cols,
                                     hs_u64 row_bytes, hs_u32 n_src_rows) {
    HS_BREADCRUMB();
    infer_dequant_rows<dq_mxfp4, 32, 17>(table, tokens, out, cols, row_bytes, n_src_rows);
}

HS_KERNEL void hs_dequant_tile_mxfp4(HS_TRACK_PARAMS, const unsigned char *table,
                                     unsigned short *out, hs_u32 cols, hs_u64 row_bytes,
                                     hs_u32 rows) {
    HS_BREADCRUMB();
    infer_dequant_tile<dq_mxfp4, 32, 17>(table, out, cols, row_bytes, rows);
}

#endif // HS_DQ_TEMPLATES_ONLY
