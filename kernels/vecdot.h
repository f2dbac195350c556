// Per-type dot products of one weight block with Q8-quantized activations, the one home of every
// weight type's block arithmetic on the GPU (as ggml's vecdotq.cuh serves mmvq.cu and mmq.cuh):
// the matrix-vector kernels of infer_matvec.hip use them for dense products and, with the MoE
// route as their `ids` argument, for the experts' products alike.
//
// Quantized weights are multiplied with Q8-quantized activations (hs_quantize_act) in integer
// dot products, as the CPU backend and llama.cpp compute them: per 32-element block
// d_w * d_x * sum(q_w * q_x) (+ m * d_x * sum(q_x) for types with a minimum), per K super-block
// d_x * (d * sum_s sc_s * dot_s - dmin * sum_s m_s * sum_s(q_x)). Three forms per type:
//   mv_part_<type>  a "part" of 8 elements of a block (a lane per part; every type);
//   mvw_<type>      a whole 32-element item read with aligned 16-byte loads (the "wide" one-token
//                   kernels of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q4_K);
//   mvf_<type>      an item against f32 activations (Q4_0, Q4_1: the activation-precision study).
// F32/F16/BF16 weights take the f32 activations element by element (mv_f32, mv_f16, mv_bf16).
// A part's weight bytes are read 16 bits at a time where the block layout only guarantees 2-byte
// alignment (Q4_0, Q5_0, Q8_0, Q6_K). Which form serves which type: the type table in
// src/gpu/compute/plan.rs, which generates each compile unit's type lists.


__device__ __forceinline__ int mv_i32(const unsigned char *p) { return *(const int *)p; }

__device__ __forceinline__ int mv_i32_2(const unsigned char *p) {
    const unsigned short *h = (const unsigned short *)p;
    return (int)((hs_u32)h[0] | ((hs_u32)h[1] << 16));
}

__device__ __forceinline__ float mv_half(const unsigned char *p) {
    return hs_half_to_float(*(const unsigned short *)p);
}

// Bits 0..3 of x to bit 4 of bytes 0..3 (the fifth bits of four Q5 quants).
__device__ __forceinline__ int mv_spread4(hs_u32 x) {
    return (int)(((x & 1) << 4) | ((x & 2) << 11) | ((x & 4) << 18) | ((x & 8) << 25));
}

#define MV_ONES 0x01010101

// --- 32-element blocks: 4 parts of 8 elements. xb: the token's 32 quants of this block;
// xd: its (d, d * sum q).

// Q4_0 (18 bytes: d, qs[16]); values (q - 8) * d, computed as q * d + (-8d).
__device__ float mv_part_q4_0(const unsigned char *b, hs_u32 s, const signed char *xb,
                              const float *xd) {
    const int v = mv_i32_2(b + 2 + 4 * s);
    const int lo = v & 0x0F0F0F0F;
    const int hi = (v >> 4) & 0x0F0F0F0F;
    const int sumi = HS_DP4A(lo, mv_i32((const unsigned char *)xb + 4 * s),
                             HS_DP4A(hi, mv_i32((const unsigned char *)xb + 16 + 4 * s), 0));
    const float d = mv_half(b);
    float r = d * xd[0] * (float)sumi;
    if (s == 0) {
        r += (d * -8.0f) * xd[1];
    }
    return r;
}

// Q4_1 (20 bytes: d, m, qs[16]).
__device__ float mv_part_q4_1(const unsigned char *b, hs_u32 s, const signed char *xb,
                              const float *xd) {
    const int v = mv_i32(b + 4 + 4 * s);
    const int lo = v & 0x0F0F0F0F;
    const int hi = (v >> 4) & 0x0F0F0F0F;
    const int sumi = HS_DP4A(lo, mv_i32((const unsigned char *)xb + 4 * s),
                             HS_DP4A(hi, mv_i32((const unsigned char *)xb + 16 + 4 * s), 0));
    float r = mv_half(b) * xd[0] * (float)sumi;
    if (s == 0) {
        r += mv_half(b + 2) * xd[1];
    }
    return r;
}

// Q5_0 (22 bytes: d, qh[4], qs[16]); values (q - 16) * d.
__device__ float mv_part_q5_0(const unsigned char *b, hs_u32 s, const signed char *xb,
                              const float *xd) {
    const hs_u32 qh = (hs_u32)mv_i32_2(b + 2);
    const int v = mv_i32_2(b + 6 + 4 * s);
    const int lo = (v & 0x0F0F0F0F) | mv_spread4(qh >> (4 * s));
    const int hi = ((v >> 4) & 0x0F0F0F0F) | mv_spread4(qh >> (16 + 4 * s));
    const int sumi = HS_DP4A(lo, mv_i32((const unsigned char *)xb + 4 * s),
                             HS_DP4A(hi, mv_i32((const unsigned char *)xb + 16 + 4 * s), 0));
    const float d = mv_half(b);
    float r = d * xd[0] * (float)sumi;
    if (s == 0) {
        r += (d * -16.0f) * xd[1];
    }
    return r;
}

// Q5_1 (24 bytes: d, m, qh[4], qs[16]).
__device__ float mv_part_q5_1(const unsigned char *b, hs_u32 s, const signed char *xb,
                              const float *xd) {
    const hs_u32 qh = (hs_u32)mv_i32(b + 4);
    const int v = mv_i32(b + 8 + 4 * s);
    const int lo = (v & 0x0F0F0F0F) | mv_spread4(qh >> (4 * s));
    const int hi = ((v >> 4) & 0x0F0F0F0F) | mv_spread4(qh >> (16 + 4 * s));
    const int sumi = HS_DP4A(lo, mv_i32((const unsigned char *)xb + 4 * s),
                             HS_DP4A(hi, mv_i32((const unsigned char *)xb + 16 + 4 * s), 0));
    float r = mv_half(b) * xd[0] * (float)sumi;
    if (s == 0) {
        r += mv_half(b + 2) * xd[1];
    }
    return r;
}

// Q8_0 (34 bytes: d, qs[32]); part s covers elements 8s..8s+7.
__device__ float mv_part_q8_0(const unsigned char *b, hs_u32 s, const signed char *xb,
                              const float *xd) {
    const int w0 = mv_i32_2(b + 2 + 8 * s);
    const int w1 = mv_i32_2(b + 2 + 8 * s + 4);
    const int sumi = HS_DP4A(w0, mv_i32((const unsigned char *)xb + 8 * s),
                             HS_DP4A(w1, mv_i32((const unsigned char *)xb + 8 * s + 4), 0));
    return mv_half(b) * xd[0] * (float)sumi;
}

// --- K super-blocks of 256: 32 parts of 8 elements. xb: the token's 256 quants; xd[0]: its d.

__device__ __forceinline__ void mv_k_scale_min(const unsigned char *q, hs_u32 s, int *sc,
                                               int *mn) {
    if (s < 4) {
        *sc = q[s] & 63;
        *mn = q[s + 4] & 63;
    } else {
        *sc = (q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4);
        *mn = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
    }
}

// Q4_K (144 bytes: d, dmin, scales[12], qs[128]). Part s: chunk c = s / 8 (64 elements: two
// sub-blocks, low then high nibbles), bytes 4g..4g+3 of the chunk's 32 (g = s % 8).
__device__ float mv_part_q4_k(const unsigned char *b, hs_u32 s, const signed char *xb,
                              const float *xd) {
    const hs_u32 c = s / 8;
    const hs_u32 g = s % 8;
    const int v = mv_i32(b + 16 + 32 * c + 4 * g);
    const int lo = v & 0x0F0F0F0F;
    const int hi = (v >> 4) & 0x0F0F0F0F;
    const int xlo = mv_i32((const unsigned char *)xb + 64 * c + 4 * g);
    const int xhi = mv_i32((const unsigned char *)xb + 64 * c + 32 + 4 * g);
    int s0, m0, s1, m1;
    mv_k_scale_min(b + 4, 2 * c, &s0, &m0);
    mv_k_scale_min(b + 4, 2 * c + 1, &s1, &m1);
    const int sumi = s0 * HS_DP4A(lo, xlo, 0) + s1 * HS_DP4A(hi, xhi, 0);
    const int summ = m0 * HS_DP4A(MV_ONES, xlo, 0) + m1 * HS_DP4A(MV_ONES, xhi, 0);
    return xd[0] * mv_half(b) * (float)sumi - xd[0] * mv_half(b + 2) * (float)summ;
}

// Q5_K (176 bytes: d, dmin, scales[12], qh[32], qs[128]); sub-block k takes bit k of qh[l].
__device__ float mv_part_q5_k(const unsigned char *b, hs_u32 s, const signed char *xb,
                              const float *xd) {
    const hs_u32 c = s / 8;
    const hs_u32 g = s % 8;
    const int v = mv_i32(b + 48 + 32 * c + 4 * g);
    const hs_u32 qh = (hs_u32)mv_i32(b + 16 + 4 * g);
    const int lo = (v & 0x0F0F0F0F) | (int)(((qh >> (2 * c)) & MV_ONES) << 4);
    const int hi = ((v >> 4) & 0x0F0F0F0F) | (int)(((qh >> (2 * c + 1)) & MV_ONES) << 4);
    const int xlo = mv_i32((const unsigned char *)xb + 64 * c + 4 * g);
    const int xhi = mv_i32((const unsigned char *)xb + 64 * c + 32 + 4 * g);
    int s0, m0, s1, m1;
    mv_k_scale_min(b + 4, 2 * c, &s0, &m0);
    mv_k_scale_min(b + 4, 2 * c + 1, &s1, &m1);
    const int sumi = s0 * HS_DP4A(lo, xlo, 0) + s1 * HS_DP4A(hi, xhi, 0);
    const int summ = m0 * HS_DP4A(MV_ONES, xlo, 0) + m1 * HS_DP4A(MV_ONES, xhi, 0);
    return xd[0] * mv_half(b) * (float)sumi - xd[0] * mv_half(b + 2) * (float)summ;
}

// Q6_K (210 bytes: ql[128], qh[64], scales[16], d). Part s: half h = s / 16 (128 elements),
// quarter pair p = (s % 16) / 8 (quarters p and p + 2 share the bytes ql[64h + 32p + l]), bytes
// l = 4g..4g+3 (g = s % 8). Values (q - 32) * sc * d.
__device__ float mv_part_q6_k(const unsigned char *b, hs_u32 s, const signed char *xb,
                              const float *xd) {
    const hs_u32 h = s / 16;
    const hs_u32 p = (s % 16) / 8;
    const hs_u32 g = s % 8;
    const int ql = mv_i32_2(b + 64 * h + 32 * p + 4 * g);
    const int qh = mv_i32_2(b + 128 + 32 * h + 4 * g);
    const int qa = (ql & 0x0F0F0F0F) | (((qh >> (2 * p)) & 0x03030303) << 4);
    const int qb = ((ql >> 4) & 0x0F0F0F0F) | (((qh >> (2 * p + 4)) & 0x03030303) << 4);
    const int xa = mv_i32((const unsigned char *)xb + 128 * h + 32 * p + 4 * g);
    const int xbv = mv_i32((const unsigned char *)xb + 128 * h + 32 * (p + 2) + 4 * g);
    const int da = HS_DP4A(qa, xa, 0) - 32 * HS_DP4A(MV_ONES, xa, 0);
    const int db = HS_DP4A(qb, xbv, 0) - 32 * HS_DP4A(MV_ONES, xbv, 0);
    const int sa = (signed char)b[192 + 8 * h + g / 4 + 2 * p];
    const int sb = (signed char)b[192 + 8 * h + g / 4 + 2 * (p + 2)];
    const int sumi = sa * da + sb * db;
    return xd[0] * mv_half(b + 208) * (float)sumi;
}

// Q2_K (84 bytes: scales[16], qs[64], d, dmin). Part s: sub-block i = s / 2 (16 elements, scale
// and min in b[i]), its elements 8e..8e+7 (e = s % 2): bit pair (i % 8) / 2 of qs bytes
// 32 (i / 8) + 16 (i % 2) + 8e.
__device__ float mv_part_q2_k(const unsigned char *b, hs_u32 s, const signed char *xb,
                              const float *xd) {
    const hs_u32 i = s / 2;
    const unsigned char *q = b + 16 + 32 * (i / 8) + 16 * (i % 2) + 8 * (s % 2);
    const hs_u32 shift = 2 * ((i % 8) / 2);
    const int q0 = (mv_i32(q) >> shift) & 0x03030303;
    const int q1 = (mv_i32(q + 4) >> shift) & 0x03030303;
    const int x0 = mv_i32((const unsigned char *)xb + 8 * s);
    const int x1 = mv_i32((const unsigned char *)xb + 8 * s + 4);
    const int sumi = (b[i] & 0xF) * HS_DP4A(q0, x0, HS_DP4A(q1, x1, 0));
    const int summ = (b[i] >> 4) * HS_DP4A(MV_ONES, x0, HS_DP4A(MV_ONES, x1, 0));
    return xd[0] * mv_half(b + 80) * (float)sumi - xd[0] * mv_half(b + 82) * (float)summ;
}

// Q3_K (110 bytes: hmask[32], qs[64], scales[12], d; 2-byte aligned). Part s as Q2_K's; the
// third bit is bit i / 2 of hmask bytes 16 (i % 2) + 8e; values (q - 4) * (sc - 32) * d.
__device__ float mv_part_q3_k(const unsigned char *b, hs_u32 s, const signed char *xb,
                              const float *xd) {
    const hs_u32 i = s / 2;
    const hs_u32 off = 16 * (i % 2) + 8 * (s % 2);
    const unsigned char *q = b + 32 + 32 * (i / 8) + off;
    const hs_u32 shift = 2 * ((i % 8) / 2);
    const int h0 = ((mv_i32_2(b + off) >> (i / 2)) & MV_ONES) << 2;
    const int h1 = ((mv_i32_2(b + off + 4) >> (i / 2)) & MV_ONES) << 2;
    const int q0 = ((mv_i32_2(q) >> shift) & 0x03030303) | h0;
    const int q1 = ((mv_i32_2(q + 4) >> shift) & 0x03030303) | h1;
    const int x0 = mv_i32((const unsigned char *)xb + 8 * s);
    const int x1 = mv_i32((const unsigned char *)xb + 8 * s + 4);
    const int dot = HS_DP4A(q0, x0, HS_DP4A(q1, x1, 0)) -
                    4 * HS_DP4A(MV_ONES, x0, HS_DP4A(MV_ONES, x1, 0));
    const int sc = (int)(((b[96 + i % 8] >> (4 * (i / 8))) & 0xF) |
                         (((b[104 + i % 4] >> (2 * (i / 4))) & 3) << 4)) - 32;
    return xd[0] * mv_half(b + 108) * (float)(sc * dot);
}

// Four IQ4 values (signed bytes) for the nibbles in bytes 0..3 of n (the table in registers).
__device__ __forceinline__ int mv_iq4_values(hs_u32 n) { return hs_lut16_4(n, HS_LUT_IQ4NL); }

// IQ4_NL (18 bytes: d, qs[16] laid out as Q4_0's; a nibble indexes IQ4_NL's table).
__device__ float mv_part_iq4_nl(const unsigned char *b, hs_u32 s, const signed char *xb,
                                const float *xd) {
    const hs_u32 v = (hs_u32)mv_i32_2(b + 2 + 4 * s);
    const int sumi = HS_DP4A(mv_iq4_values(v), mv_i32((const unsigned char *)xb + 4 * s),
                             HS_DP4A(mv_iq4_values(v >> 4),
                                     mv_i32((const unsigned char *)xb + 16 + 4 * s), 0));
    return mv_half(b) * xd[0] * (float)sumi;
}

// IQ4_XS (136 bytes: d, scales_h, scales_l[4], qs[128]). Part s: sub-block ib = s / 4 (32
// elements laid out as IQ4_NL's), bytes 4g..4g+3 of its 16 (g = s % 4).
__device__ float mv_part_iq4_xs(const unsigned char *b, hs_u32 s, const signed char *xb,
                                const float *xd) {
    const hs_u32 ib = s / 4;
    const hs_u32 g = s % 4;
    const hs_u32 v = (hs_u32)mv_i32(b + 8 + 16 * ib + 4 * g);
    const hs_u32 sh = (hs_u32)b[2] | ((hs_u32)b[3] << 8);
    const int ls = (int)(((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4));
    const int dot = HS_DP4A(mv_iq4_values(v), mv_i32((const unsigned char *)xb + 32 * ib + 4 * g),
                            HS_DP4A(mv_iq4_values(v >> 4),
                                    mv_i32((const unsigned char *)xb + 32 * ib + 16 + 4 * g), 0));
    return xd[0] * mv_half(b) * (float)((ls - 32) * dot);
}


// MXFP4 (17 bytes: e, qs[16] laid out as Q4_0's; a nibble indexes the doubled E2M1 values, the
// E8M0 scale is halved to match). Blocks are byte-aligned, so the quants are read byte by byte.
__device__ __forceinline__ int mv_mxfp4_values(hs_u32 n) { return hs_lut16_4(n, HS_LUT_MXFP4); }

__device__ float mv_part_mxfp4(const unsigned char *b, hs_u32 s, const signed char *xb,
                               const float *xd) {
    const unsigned char *q = b + 1 + 4 * s;
    const hs_u32 v = (hs_u32)q[0] | ((hs_u32)q[1] << 8) | ((hs_u32)q[2] << 16) |
                     ((hs_u32)q[3] << 24);
    const int sumi = HS_DP4A(mv_mxfp4_values(v), mv_i32((const unsigned char *)xb + 4 * s),
                             HS_DP4A(mv_mxfp4_values(v >> 4),
                                     mv_i32((const unsigned char *)xb + 16 + 4 * s), 0));
    const hs_u32 e = b[0];
    const float d = __int_as_float((int)(e < 2 ? 0x00200000u << e : (e - 1) << 23));
    return d * xd[0] * (float)sumi;
}
// ---- Wide items: a lane per 32 elements ---------------------------------------------------
//
// Lane l of a warp takes whole 32-element items l, l + warpSize, ... of the row (a Q4_0 block, or
// 16 bytes of a Q4_K super-block's quants), so a warp step reads 32 consecutive items: one item's
// weights are read with 16-byte loads of the aligned 16-byte window around them (the blocks are
// only 2-byte aligned: 18-byte Q4_0, 34-byte Q8_0), the words picked out with two selects and a
// funnel shift; its activations (32 Q8 quants, two 16-byte loads) serve every row of the warp.

#if defined(HS_BACKEND_CUDA)
#define MVW_FUNNEL(lo, hi, sh) __funnelshift_r((lo), (hi), (sh))
#else
#define MVW_FUNNEL(lo, hi, sh) ((hs_u32)(((((hs_u64)(hi)) << 32) | (hs_u64)(lo)) >> (sh)))
#endif

// The NW little-endian words of the bytes p[0 .. 4 NW) (p 2-byte aligned; NB of them are the
// item's, the rest may be anything), read as NL aligned 16-byte loads. A load whose 16 bytes hold
// none of the NB bytes is not made, so nothing beyond the 16-byte word of the weights' last byte
// is read. NL = ceil((14 + NB) / 16).
template <int NB, int NW, int NL>
__device__ __forceinline__ void mvw_words(const unsigned char *p, hs_u32 *out) {
    const hs_u64 a = (hs_u64)p;
    const uint4 *q = (const uint4 *)(a & ~(hs_u64)15);
    const hs_u32 o = (hs_u32)(a & 15);
    hs_u32 w[4 * NL + 4];
#pragma unroll
    for (int k = 0; k < NL; ++k) {
        uint4 c;
        c.x = c.y = c.z = c.w = 0;
        if (k == 0 || (hs_u32)(16 * k) < o + NB) {
            c = q[k];
        }
        w[4 * k] = c.x;
        w[4 * k + 1] = c.y;
        w[4 * k + 2] = c.z;
        w[4 * k + 3] = c.w;
    }
#pragma unroll
    for (int k = 4 * NL; k < 4 * NL + 4; ++k) {
        w[k] = 0;
    }
    hs_u32 v[NW + 2];
#pragma unroll
    for (int k = 0; k < NW + 2; ++k) {
        v[k] = (o & 8) ? w[k + 2] : w[k];
    }
    hs_u32 u[NW + 1];
#pragma unroll
    for (int k = 0; k < NW + 1; ++k) {
        u[k] = (o & 4) ? v[k + 1] : v[k];
    }
    const hs_u32 sh = (o & 3) * 8;
#pragma unroll
    for (int k = 0; k < NW; ++k) {
        out[k] = MVW_FUNNEL(u[k], u[k + 1], sh);
    }
}

// One item's activations: quants a (first 16) and b (second 16) as words, the block's d and
// d * sum q (xs), and for Q4_K the plain sums of a's and b's quants.
struct mvw_x {
    int a[4];
    int b[4];
    float d;
    float s;
    int sa;
    int sb;
};

__device__ __forceinline__ void mvw_set_x(const signed char *p0, const signed char *p1,
                                          const float *dd, mvw_x &x) {
    const int4 A = *(const int4 *)p0;
    const int4 B = *(const int4 *)p1;
    const float2 D = *(const float2 *)dd;
    x.a[0] = A.x;
    x.a[1] = A.y;
    x.a[2] = A.z;
    x.a[3] = A.w;
    x.b[0] = B.x;
    x.b[1] = B.y;
    x.b[2] = B.z;
    x.b[3] = B.w;
    x.d = D.x;
    x.s = D.y;
}

// Item i of a 32-element-block row: block i.
__device__ __forceinline__ void mvw_x32(const signed char *xq, const float *xd, hs_u32 i,
                                        mvw_x &x) {
    mvw_set_x(xq + 32 * (hs_u64)i, xq + 32 * (hs_u64)i + 16, xd + 2 * (hs_u64)i, x);
    x.sa = 0;
    x.sb = 0;
}

// Item i of a row of 256-element super-blocks with Q4_K's layout (mvw_q4_k): super-block i / 8, its 16-byte slice g = i % 8 of the quants (chunk
// c = g / 2 of 64 elements, half h = g % 2): low nibbles are elements 64c + 16h + 0..15, high
// ones 64c + 32 + 16h + 0..15.
__device__ __forceinline__ void mvw_x256(const signed char *xq, const float *xd, hs_u32 i,
                                           mvw_x &x) {
    const hs_u32 s = i / 8;
    const hs_u32 g = i % 8;
    const signed char *xb = xq + 256 * (hs_u64)s + 64 * (g / 2) + 16 * (g % 2);
    mvw_set_x(xb, xb + 32, xd + 2 * (hs_u64)s, x);
    int sa = 0;
    int sb = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        sa = HS_DP4A(MV_ONES, x.a[k], sa);
        sb = HS_DP4A(MV_ONES, x.b[k], sb);
    }
    x.sa = sa;
    x.sb = sb;
}

__device__ __forceinline__ float mvw_lo_half(hs_u32 w) {
    return hs_half_to_float((unsigned short)(w & 0xFFFF));
}
__device__ __forceinline__ float mvw_hi_half(hs_u32 w) {
    return hs_half_to_float((unsigned short)(w >> 16));
}

// sum over the 32 elements of q * x, the four words qs[k] holding elements 4k.. (low nibbles) and
// 16 + 4k.. (high nibbles), the high bits (Q5) from qh where given.
__device__ __forceinline__ int mvw_dot_nibbles(const hs_u32 *qs, const mvw_x &x) {
    int sumi = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        sumi = HS_DP4A((int)(qs[k] & 0x0F0F0F0F), x.a[k], sumi);
        sumi = HS_DP4A((int)((qs[k] >> 4) & 0x0F0F0F0F), x.b[k], sumi);
    }
    return sumi;
}

__device__ __forceinline__ int mvw_dot_nibbles5(const hs_u32 *qs, hs_u32 qh, const mvw_x &x) {
    int sumi = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int lo = (int)(qs[k] & 0x0F0F0F0F) | mv_spread4(qh >> (4 * k));
        const int hi = (int)((qs[k] >> 4) & 0x0F0F0F0F) | mv_spread4(qh >> (16 + 4 * k));
        sumi = HS_DP4A(lo, x.a[k], sumi);
        sumi = HS_DP4A(hi, x.b[k], sumi);
    }
    return sumi;
}

// Q4_0 (18 bytes: d, qs[16]).
__device__ __forceinline__ float mvw_q4_0(const unsigned char *wr, hs_u32 i, const mvw_x &x) {
    hs_u32 w[5];
    mvw_words<18, 5, 2>(wr + 18 * (hs_u64)i, w);
    hs_u32 qs[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        qs[k] = MVW_FUNNEL(w[k], w[k + 1], 16);
    }
    const float d = mvw_lo_half(w[0]);
    return d * x.d * (float)mvw_dot_nibbles(qs, x) + (d * -8.0f) * x.s;
}

// Q4_1 (20 bytes: d, m, qs[16]).
__device__ __forceinline__ float mvw_q4_1(const unsigned char *wr, hs_u32 i, const mvw_x &x) {
    hs_u32 w[5];
    mvw_words<20, 5, 3>(wr + 20 * (hs_u64)i, w);
    return mvw_lo_half(w[0]) * x.d * (float)mvw_dot_nibbles(w + 1, x) + mvw_hi_half(w[0]) * x.s;
}

// Q5_0 (22 bytes: d, qh[4], qs[16]).
__device__ __forceinline__ float mvw_q5_0(const unsigned char *wr, hs_u32 i, const mvw_x &x) {
    hs_u32 w[6];
    mvw_words<22, 6, 3>(wr + 22 * (hs_u64)i, w);
    hs_u32 qs[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        qs[k] = MVW_FUNNEL(w[k + 1], w[k + 2], 16);
    }
    const float d = mvw_lo_half(w[0]);
    const hs_u32 qh = MVW_FUNNEL(w[0], w[1], 16);
    return d * x.d * (float)mvw_dot_nibbles5(qs, qh, x) + (d * -16.0f) * x.s;
}

// Q5_1 (24 bytes: d, m, qh[4], qs[16]).
__device__ __forceinline__ float mvw_q5_1(const unsigned char *wr, hs_u32 i, const mvw_x &x) {
    hs_u32 w[6];
    mvw_words<24, 6, 3>(wr + 24 * (hs_u64)i, w);
    return mvw_lo_half(w[0]) * x.d * (float)mvw_dot_nibbles5(w + 2, w[1], x) +
           mvw_hi_half(w[0]) * x.s;
}

// Q8_0 (34 bytes: d, qs[32]).
__device__ __forceinline__ float mvw_q8_0(const unsigned char *wr, hs_u32 i, const mvw_x &x) {
    hs_u32 w[9];
    mvw_words<34, 9, 3>(wr + 34 * (hs_u64)i, w);
    int sumi = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        sumi = HS_DP4A((int)MVW_FUNNEL(w[k], w[k + 1], 16), x.a[k], sumi);
        sumi = HS_DP4A((int)MVW_FUNNEL(w[k + 4], w[k + 5], 16), x.b[k], sumi);
    }
    return mvw_lo_half(w[0]) * x.d * (float)sumi;
}

// Q4_K (144 bytes: d, dmin, scales[12], qs[128]; 16-byte aligned, as 144 is a multiple of 16).
// The item's sub-blocks are j = 2c (low nibbles) and 2c + 1 (high); their 6-bit scale and min as
// mv_k_scale_min reads them, from the three scale words.
__device__ __forceinline__ float mvw_q4_k(const unsigned char *wr, hs_u32 i, const mvw_x &x) {
    const unsigned char *b = wr + 144 * (hs_u64)(i / 8);
    const hs_u32 g = i % 8;
    const hs_u32 c = g / 2;
    const uint4 v = *(const uint4 *)(b + 16 + 16 * g);
    const uint4 hd = *(const uint4 *)b;  // d, dmin | scales 0..3 | 4..7 | 8..11
    const hs_u32 sh0 = 16 * (c % 2);     // bytes 2c, 2c + 1 (mod 4) of a scale word
    int s0, m0, s1, m1;
    if (c < 2) {
        const hs_u32 a = hd.y >> sh0;
        const hs_u32 m = hd.z >> sh0;
        s0 = (int)(a & 63);
        s1 = (int)((a >> 8) & 63);
        m0 = (int)(m & 63);
        m1 = (int)((m >> 8) & 63);
    } else {
        const hs_u32 lo = hd.w >> sh0;  // bytes j + 4
        const hs_u32 a = hd.y >> sh0;   // bytes j - 4
        const hs_u32 m = hd.z >> sh0;   // bytes j
        s0 = (int)((lo & 0xF) | (((a >> 6) & 3) << 4));
        s1 = (int)(((lo >> 8) & 0xF) | (((a >> 14) & 3) << 4));
        m0 = (int)(((lo >> 4) & 0xF) | (((m >> 6) & 3) << 4));
        m1 = (int)(((lo >> 12) & 0xF) | (((m >> 14) & 3) << 4));
    }
    const hs_u32 qs[4] = {v.x, v.y, v.z, v.w};
    int dl = 0;
    int dh = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        dl = HS_DP4A((int)(qs[k] & 0x0F0F0F0F), x.a[k], dl);
        dh = HS_DP4A((int)((qs[k] >> 4) & 0x0F0F0F0F), x.b[k], dh);
    }
    const int sumi = s0 * dl + s1 * dh;
    const int summ = m0 * x.sa + m1 * x.sb;
    return x.d * mvw_lo_half(hd.x) * (float)sumi - x.d * mvw_hi_half(hd.x) * (float)summ;
}

// ---- The activation-precision study (issue 13 item 8): Q4_0 / Q4_1 weights times the f32
// activations as computed, no Q8 step (hs_mv1f_*, hs_mv_qkvf_*, hs_mv_swigluf_*; chosen with
// HIPSCOPE_MV_ACT=f32). The same lane-per-block loop; a lane reads its block's 32 activations
// (128 bytes) itself. The kernels take the f32 input where the others take the Q8 quants.

struct mvf_x {
    float v[32];
    float sum;
};

__device__ __forceinline__ void mvf_load(const signed char *xq, const float *, hs_u32 i,
                                         mvf_x &x) {
    const float4 *p = (const float4 *)((const float *)xq + 32 * (hs_u64)i);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const float4 f = p[k];
        x.v[4 * k] = f.x;
        x.v[4 * k + 1] = f.y;
        x.v[4 * k + 2] = f.z;
        x.v[4 * k + 3] = f.w;
    }
#pragma unroll
    for (int k = 0; k < 32; ++k) {
        s += x.v[k];
    }
    x.sum = s;
}

// sum of q * x over the block's 32 nibbles (exact small integers as floats: 2^23 + q - 2^23).
__device__ __forceinline__ float mvf_nibbles(const hs_u32 *qs, const mvf_x &x) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float lo = __int_as_float((int)(0x4B000000u | ((qs[k] >> (8 * j)) & 15))) - 8388608.0f;
            const float hi = __int_as_float((int)(0x4B000000u | ((qs[k] >> (8 * j + 4)) & 15))) - 8388608.0f;
            s = fmaf(lo, x.v[4 * k + j], s);
            s = fmaf(hi, x.v[16 + 4 * k + j], s);
        }
    }
    return s;
}

__device__ __forceinline__ float mvf_q4_0(const unsigned char *wr, hs_u32 i, const mvf_x &x) {
    hs_u32 w[5];
    mvw_words<18, 5, 2>(wr + 18 * (hs_u64)i, w);
    hs_u32 qs[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        qs[k] = MVW_FUNNEL(w[k], w[k + 1], 16);
    }
    return mvw_lo_half(w[0]) * (mvf_nibbles(qs, x) - 8.0f * x.sum);
}

__device__ __forceinline__ float mvf_q4_1(const unsigned char *wr, hs_u32 i, const mvf_x &x) {
    hs_u32 w[5];
    mvw_words<20, 5, 3>(wr + 20 * (hs_u64)i, w);
    return mvw_lo_half(w[0]) * mvf_nibbles(w + 1, x) + mvw_hi_half(w[0]) * x.sum;
}


// F32 / F16 / BF16 weights: element c of row w.
__device__ float mv_f32(const unsigned char *w, hs_u32 c) { return ((const float *)w)[c]; }
__device__ float mv_f16(const unsigned char *w, hs_u32 c) {
    return hs_half_to_float(((const unsigned short *)w)[c]);
}
__device__ float mv_bf16(const unsigned char *w, hs_u32 c) {
    return hs_bf16_to_float(((const unsigned short *)w)[c]);
}

