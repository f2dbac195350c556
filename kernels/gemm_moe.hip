// The grouped expert products of a prompt batch (mixture of experts): the sorted entries of each
// expert times that expert's weights, on the matrix units (mma.h's core), with the weights
// dequantized to f16 as they are staged (per type: from whole words of its blocks, or dequant.h's
// element functions for the rare types) and read once per chunk of up to 64 entries, as the
// route's chunk table (blockIdx.y) gives them (infer_moe.hip routes and sorts). blockIdx.x: 64
// rows of the expert's matrix. B rows are f16 activations already Q8-rounded
// (hs_quantize_act_f16), so these products multiply the numbers the one-token kernels multiply,
// as the dense prefill GEMM does. Before them, a prompt batch ran its experts as matrix-vector
// products over 8 entries at a time: 1.6 ms of gate/up a layer for a 512-token Qwen3-30B-A3B
// prompt on the H100 (llama.cpp's grouped mul_mat_q: 0.28 ms).

// 16 elements c0 .. c0 + 15 (c0 a multiple of 16) of weight row `row` as f16 pairs into w: by the
// element functions of dequant.h (BL-element blocks of BB bytes), or, for the common
// expert types and the K-quants, from whole words of the block (below). A product's weights are dequantized once
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

// The K-quants and IQ4_XS from whole words: 16 elements lie in one 32-element sub-block, so its
// scale (and min) is decoded once and its 16 quant bytes read as words, where the element
// functions decode both for every element (4x the Q4_0 kernel's time on a Q4_K prompt). The
// values are dq_<type>'s, factor for factor.

// Q4_K and Q5_K (144- and 176-byte super-blocks, 16-byte aligned): sub-block 2 chunk + hi, its
// quants the low (hi 0) or high nibbles of qs[32 chunk + l0 ..][16] (qs at byte 16, or 48 after
// Q5_K's qh); Q5_K's fifth bit of element l of sub-block s is bit s of qh[l].
template <bool Q5>
__device__ __forceinline__ void mm_dq16_k45(const unsigned char *row, hs_u32 c0, hs_u32 *w) {
    const unsigned char *b = row + (hs_u64)(c0 / 256) * (Q5 ? 176 : 144);
    const hs_u32 j = c0 % 256;
    const hs_u32 chunk = j / 64;
    const hs_u32 hi = (j % 64) / 32;
    const hs_u32 sub = 2 * chunk + hi;
    hs_u32 sc, mn;
    dq_k_scale_min(b + 4, sub, &sc, &mn);
    const float d = dq_half(b) * (float)sc;
    const float m = dq_half(b + 2) * (float)mn;
    const uint4 v = *(const uint4 *)(b + (Q5 ? 48 : 16) + 32 * chunk + j % 32);
    const hs_u32 qs[4] = {v.x, v.y, v.z, v.w};
    hs_u32 qh[4] = {0, 0, 0, 0};
    if (Q5) {
        const uint4 h = *(const uint4 *)(b + 16 + j % 32);
        qh[0] = h.x;
        qh[1] = h.y;
        qh[2] = h.z;
        qh[3] = h.w;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const hs_u32 u = ((qs[i] >> (4 * hi)) & 0x0F0F0F0F) | (((qh[i] >> sub) & 0x01010101) << 4);
        w[2 * i] = mm_half2(d * (float)(u & 0xFF) - m, d * (float)((u >> 8) & 0xFF) - m);
        w[2 * i + 1] = mm_half2(d * (float)((u >> 16) & 0xFF) - m, d * (float)(u >> 24) - m);
    }
}

__device__ __forceinline__ void mm_dq16_q4_k(hs_u32, const unsigned char *row, hs_u32 c0,
                                             hs_u32 *w) {
    mm_dq16_k45<false>(row, c0, w);
}

__device__ __forceinline__ void mm_dq16_q5_k(hs_u32, const unsigned char *row, hs_u32 c0,
                                             hs_u32 *w) {
    mm_dq16_k45<true>(row, c0, w);
}

// Q6_K (210-byte super-blocks, 2-byte aligned: 16-bit loads): half h of 128 elements, quarter q
// of 32; the low four bits a nibble of ql (quarters 0, 2: low; 1, 3: high, of the next 32
// bytes), the top two bit pair q of qh; one signed scale per 16 elements.
__device__ __forceinline__ void mm_dq16_q6_k(hs_u32, const unsigned char *row, hs_u32 c0,
                                             hs_u32 *w) {
    const unsigned char *b = row + (hs_u64)(c0 / 256) * 210;
    const hs_u32 j = c0 % 256;
    const hs_u32 half = j / 128;
    const hs_u32 quarter = (j % 128) / 32;
    const hs_u32 l0 = j % 32;
    const unsigned char *ql = b + 64 * half + l0 + (quarter & 1) * 32;
    const unsigned char *qh = b + 128 + 32 * half + l0;
    const int sc = (signed char)b[192 + 8 * half + l0 / 16 + 2 * quarter];
    const float d = dq_half(b + 208) * (float)sc;
    const hs_u32 nsh = quarter >= 2 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const hs_u32 u = ((dq_u32_2(ql + 4 * i) >> nsh) & 0x0F0F0F0F) |
                         (((dq_u32_2(qh + 4 * i) >> (2 * quarter)) & 0x03030303) << 4);
        w[2 * i] = mm_half2(d * (float)((int)(u & 0xFF) - 32),
                            d * (float)((int)((u >> 8) & 0xFF) - 32));
        w[2 * i + 1] = mm_half2(d * (float)((int)((u >> 16) & 0xFF) - 32),
                                d * (float)((int)(u >> 24) - 32));
    }
}

// IQ4_XS (136-byte super-blocks, 8-byte aligned): sub-block ib's 16 bytes of nibbles (low for
// elements 0..15, high for 16..31) through IQ4_NL's table in registers, times its six-bit scale.
__device__ __forceinline__ void mm_dq16_iq4_xs(hs_u32, const unsigned char *row, hs_u32 c0,
                                               hs_u32 *w) {
    const unsigned char *b = row + (hs_u64)(c0 / 256) * 136;
    const hs_u32 j = c0 % 256;
    const hs_u32 ib = j / 32;
    const hs_u32 sh = (hs_u32)b[2] | ((hs_u32)b[3] << 8);
    const int ls =
        (int)(((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4));
    const float d = dq_half(b) * (float)(ls - 32);
    const uint2 lo = *(const uint2 *)(b + 8 + 16 * ib);
    const uint2 hi = *(const uint2 *)(b + 16 + 16 * ib);
    const hs_u32 qs[4] = {lo.x, lo.y, hi.x, hi.y};
    const hs_u32 nsh = j % 32 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int t = hs_lut16_4(qs[i] >> nsh, HS_LUT_IQ4NL);
        w[2 * i] = mm_half2(d * (float)(signed char)t, d * (float)(signed char)(t >> 8));
        w[2 * i + 1] =
            mm_half2(d * (float)(signed char)(t >> 16), d * (float)(signed char)(t >> 24));
    }
}

// Every other type, the type (its ggml id) chosen at run time: Q5_K and IQ4_XS from words (above),
// the rest by their element functions. One kernel serves them all, which keeps this module's
// compile time (four targets in CI) from growing by a matrix-unit body per type; the types of
// the common expert files (Q4_0, Q8_0, MXFP4, Q4_K, Q6_K) have kernels of their own.
__device__ __forceinline__ void mm_dq16_any(hs_u32 ty, const unsigned char *row, hs_u32 c0,
                                            hs_u32 *w) {
    switch (ty) {
    case 3: mm_dq16<dq_q4_1, 32, 20>(row, c0, w); break;
    case 6: mm_dq16<dq_q5_0, 32, 22>(row, c0, w); break;
    case 7: mm_dq16<dq_q5_1, 32, 24>(row, c0, w); break;
    case 10: mm_dq16<dq_q2_k, 256, 84>(row, c0, w); break;
    case 11: mm_dq16<dq_q3_k, 256, 110>(row, c0, w); break;
    case 13: mm_dq16_q5_k(ty, row, c0, w); break;
    case 20: mm_dq16<dq_iq4_nl, 32, 18>(row, c0, w); break;
    case 23: mm_dq16_iq4_xs(ty, row, c0, w); break;
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
            h[((hs_u64)s + t) * ff + row] = moe_act(g, u, gb, ub, (hs_u64)e * ff + row, 0);
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

HS_KERNEL void hs_moe_mm_gate_up_q4_k(HS_TRACK_PARAMS, const unsigned char *wg,
                                    const unsigned char *wu, const unsigned short *xh, float *h,
                                    const float *route, hs_u32 n, hs_u32 k, hs_u32 ff,
                                    hs_u32 cols, const float *gb, const float *ub, hs_u32 ty,
                                    hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_gate_up<mm_dq16_q4_k>(wg, wu, xh, h, route, n, k, ff, cols, gb, ub, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_down_q4_k(HS_TRACK_PARAMS, const unsigned char *wd,
                                 const unsigned short *hh, float *y, const float *route,
                                 hs_u32 n, hs_u32 k, hs_u32 dim, hs_u32 ff, hs_u32 ty,
                                 hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_down<mm_dq16_q4_k>(wd, hh, y, route, n, k, dim, ff, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_gate_up_q6_k(HS_TRACK_PARAMS, const unsigned char *wg,
                                    const unsigned char *wu, const unsigned short *xh, float *h,
                                    const float *route, hs_u32 n, hs_u32 k, hs_u32 ff,
                                    hs_u32 cols, const float *gb, const float *ub, hs_u32 ty,
                                    hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_gate_up<mm_dq16_q6_k>(wg, wu, xh, h, route, n, k, ff, cols, gb, ub, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_down_q6_k(HS_TRACK_PARAMS, const unsigned char *wd,
                                 const unsigned short *hh, float *y, const float *route,
                                 hs_u32 n, hs_u32 k, hs_u32 dim, hs_u32 ff, hs_u32 ty,
                                 hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_down<mm_dq16_q6_k>(wd, hh, y, route, n, k, dim, ff, ty, row_bytes);
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
