// Element c of a weight block, per type: dq_<type>(block, c). Block layouts are ggml's
// (src/gpu/quant/blocks.rs describes them byte by byte); the formulas are those of the CPU
// backend's scalar reference, term for term. Used by infer_dequant.hip (embedding rows, weight
// tiles for the prefill GEMM) and gemm_moe.hip (the grouped expert products).

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

// The same six-bit scale and min of sub-block `s`, from the 12 scale bytes held as three words
// (sw[i]: bytes 4i .. 4i + 3; the grouped products load them ahead of use, kernels/gemm_moe.hip).
__device__ __forceinline__ void dq_k_scale_min_words(const hs_u32 *sw, hs_u32 s, hs_u32 *sc,
                                                     hs_u32 *mn) {
    const hs_u32 sh = 8 * (s & 3);
    if (s < 4) {
        *sc = (sw[0] >> sh) & 63;
        *mn = (sw[1] >> sh) & 63;
    } else {
        *sc = ((sw[2] >> sh) & 0xF) | (((sw[0] >> sh) & 0xFF) >> 6 << 4);
        *mn = (((sw[2] >> sh) & 0xFF) >> 4) | (((sw[1] >> sh) & 0xFF) >> 6 << 4);
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
