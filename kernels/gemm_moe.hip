// The grouped expert products of a prompt batch (mixture of experts): the sorted entries of each
// expert times that expert's weights, on the matrix units (mma.h's core), with the weights
// dequantized to f16 as they are staged (per type, below) and read once per chunk of up to 64
// entries, as the route's chunk table (blockIdx.y) gives them (infer_moe.hip routes and sorts).
// blockIdx.x: 64 rows of the expert's matrix. B rows are f16 activations already Q8-rounded
// (hs_quantize_act_f16), so these products multiply the numbers the one-token kernels multiply,
// as the dense prefill GEMM does. Before them, a prompt batch ran its experts as matrix-vector
// products over 8 entries at a time: 1.6 ms of gate/up a layer for a 512-token Qwen3-30B-A3B
// prompt on the H100 (llama.cpp's grouped mul_mat_q: 0.28 ms). The common expert types (Q4_0,
// Q8_0, MXFP4) load a step ahead and turn bytes into halves in pairs (MmStage*, below):
// Qwen3-30B-A3B's pp512 9,581 -> 11,734 t/s and gpt-oss-20b's 8,660 -> 10,261 on the H100.

// 16 elements c0 .. c0 + 15 (c0 a multiple of 16) of weight row `row` as f16 pairs into w: by the
// element functions of dequant.h (BL-element blocks of BB bytes), or, for the K-quants and
// IQ4_XS, from whole words of the block (below). A product's weights are dequantized once per
// chunk that reads them, so this is most of a grouped product's work.
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

// The K-quants and IQ4_XS from whole words: 16 elements lie in one 32-element sub-block, so its
// scale (and min) is decoded once and its 16 quant bytes read as words, where the element
// functions decode both for every element (4x the Q4_0 kernel's time on a Q4_K prompt). The
// values are dq_<type>'s, factor for factor.

// Each as a pair (K below): load, what a thread's 16 elements c0 .. c0 + 15 need from memory
// (Raw: into registers, a step ahead where a product stages it, MmStageWords), and conv, those
// registers into the 16 values as f16 pairs. mm_dq16_words<K> does both at once.

// Q4_K and Q5_K (144- and 176-byte super-blocks, 16-byte aligned): sub-block 2 chunk + hi, its
// quants the low (hi 0) or high nibbles of qs[32 chunk + l0 ..][16] (qs at byte 16, or 48 after
// Q5_K's qh); Q5_K's fifth bit of element l of sub-block s is bit s of qh[l]. Loaded: d and dmin
// (one word), the 12 scale bytes (three words, as dq_k_scale_min_words reads them), the quants.
template <bool Q5> struct MmK45 {
    struct Raw {
        uint4 qs, qh;
        hs_u32 dm, sw[3];
    };
    static __device__ __forceinline__ void load(const unsigned char *row, hs_u32 c0, Raw &r) {
        const unsigned char *b = row + (hs_u64)(c0 / 256) * (Q5 ? 176 : 144);
        const hs_u32 j = c0 % 256;
        const hs_u32 *words = (const hs_u32 *)b;
        r.dm = words[0];
        r.sw[0] = words[1];
        r.sw[1] = words[2];
        r.sw[2] = words[3];
        r.qs = *(const uint4 *)(b + (Q5 ? 48 : 16) + 32 * (j / 64) + j % 32);
        r.qh = Q5 ? *(const uint4 *)(b + 16 + j % 32) : make_uint4(0, 0, 0, 0);
    }
    static __device__ __forceinline__ void conv(const Raw &r, hs_u32 c0, hs_u32 *w) {
        const hs_u32 j = c0 % 256;
        const hs_u32 hi = (j % 64) / 32;
        const hs_u32 sub = 2 * (j / 64) + hi;
        hs_u32 sc, mn;
        dq_k_scale_min_words(r.sw, sub, &sc, &mn);
        const float d = hs_half_to_float((unsigned short)r.dm) * (float)sc;
        const float m = hs_half_to_float((unsigned short)(r.dm >> 16)) * (float)mn;
        const hs_u32 qs[4] = {r.qs.x, r.qs.y, r.qs.z, r.qs.w};
        const hs_u32 qh[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const hs_u32 u =
                ((qs[i] >> (4 * hi)) & 0x0F0F0F0F) | (((qh[i] >> sub) & 0x01010101) << 4);
            w[2 * i] = mm_half2(d * (float)(u & 0xFF) - m, d * (float)((u >> 8) & 0xFF) - m);
            w[2 * i + 1] = mm_half2(d * (float)((u >> 16) & 0xFF) - m, d * (float)(u >> 24) - m);
        }
    }
};

// Q6_K (210-byte super-blocks, 2-byte aligned: 16-bit loads): half h of 128 elements, quarter q
// of 32; the low four bits a nibble of ql (quarters 0, 2: low; 1, 3: high, of the next 32
// bytes), the top two bit pair q of qh; one signed scale per 16 elements. Loaded: 16 bytes of ql
// and of qh, the scale (bits 16..23 of sd) and d (its low half).
struct MmQ6K {
    struct Raw {
        hs_u32 ql[4], qh[4], sd;
    };
    static __device__ __forceinline__ void load(const unsigned char *row, hs_u32 c0, Raw &r) {
        const unsigned char *b = row + (hs_u64)(c0 / 256) * 210;
        const hs_u32 j = c0 % 256;
        const hs_u32 half = j / 128;
        const hs_u32 quarter = (j % 128) / 32;
        const hs_u32 l0 = j % 32;
        const unsigned char *ql = b + 64 * half + l0 + (quarter & 1) * 32;
        const unsigned char *qh = b + 128 + 32 * half + l0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            r.ql[i] = dq_u32_2(ql + 4 * i);
            r.qh[i] = dq_u32_2(qh + 4 * i);
        }
        r.sd = (hs_u32)*(const unsigned short *)(b + 208) |
               ((hs_u32)b[192 + 8 * half + l0 / 16 + 2 * quarter] << 16);
    }
    static __device__ __forceinline__ void conv(const Raw &r, hs_u32 c0, hs_u32 *w) {
        const hs_u32 quarter = (c0 % 128) / 32;
        const float d = hs_half_to_float((unsigned short)r.sd) * (float)(signed char)(r.sd >> 16);
        const hs_u32 nsh = quarter >= 2 ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const hs_u32 u = ((r.ql[i] >> nsh) & 0x0F0F0F0F) |
                             (((r.qh[i] >> (2 * quarter)) & 0x03030303) << 4);
            w[2 * i] = mm_half2(d * (float)((int)(u & 0xFF) - 32),
                                d * (float)((int)((u >> 8) & 0xFF) - 32));
            w[2 * i + 1] = mm_half2(d * (float)((int)((u >> 16) & 0xFF) - 32),
                                    d * (float)((int)(u >> 24) - 32));
        }
    }
};

// K's load and conv at once, as the element functions' form (the run-time switch's Q5_K).
template <class K>
__device__ __forceinline__ void mm_dq16_words(hs_u32, const unsigned char *row, hs_u32 c0,
                                              hs_u32 *w) {
    typename K::Raw r;
    K::load(row, c0, r);
    K::conv(r, c0, w);
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
    case 13: mm_dq16_words<MmK45<true>>(ty, row, c0, w); break;
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

// ---- Staging a step's weights ---------------------------------------------------------------
// A step stages 32 columns (one block of Q4_0, Q8_0, MXFP4) of each of the tile's 64 rows, two
// threads a row (half h = tid % 2). Each staging type says what a thread loads for a step (Raw,
// held in registers: the next step's loads are issued before this step's product and waited on
// after it, so their latency hides behind the matrix units) and how it writes its 16 halves of
// the row into shared memory.

// Eight bytes from p, in the widest loads p's alignment allows. The rows of a warp may differ in
// it (gpt-oss's MXFP4 rows are 1,530 bytes: 2 mod 8), so the branches can diverge; each is a few
// loads. Q4_0's and Q8_0's rows of whole 32-block multiples are even, MXFP4's are where their
// block count is, so the byte loads are rare.
__device__ __forceinline__ uint2 mm_ld8(const unsigned char *p) {
    const hs_u64 a = (hs_u64)p;
    if ((a & 7) == 0) {
        return *(const uint2 *)p;
    }
    if ((a & 3) == 0) {
        return make_uint2(((const hs_u32 *)p)[0], ((const hs_u32 *)p)[1]);
    }
    if ((a & 1) == 0) {
        return make_uint2(dq_u32_2(p), dq_u32_2(p + 4));
    }
    return make_uint2((hs_u32)p[0] | ((hs_u32)p[1] << 8) | ((hs_u32)p[2] << 16) |
                          ((hs_u32)p[3] << 24),
                      (hs_u32)p[4] | ((hs_u32)p[5] << 8) | ((hs_u32)p[6] << 16) |
                          ((hs_u32)p[7] << 24));
}

// Half-precision pairs without a float round trip: the half with bits 0x6400 | b is 1024 + b
// exactly (b < 1024), so a biased integer becomes a half by a byte move, loses its bias exactly
// (sub), and is scaled by the block's half scale with one rounding (mul) — the same rounding as
// the float product rounded to half that dequant.h's functions and the one-token kernels use,
// because the float product of a byte and a half is exact. Bit for bit the same halves.
#if defined(HS_BACKEND_CUDA)
__device__ __forceinline__ hs_u32 mm_h2_unbias_scale(hs_u32 v, hs_u32 bias, hs_u32 d) {
    hs_u32 t, r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(t) : "r"(v), "r"(bias));
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(t), "r"(d));
    return r;
}
#elif defined(HS_BACKEND_HIP)
typedef _Float16 mm_f16x2 __attribute__((ext_vector_type(2)));
__device__ __forceinline__ hs_u32 mm_h2_unbias_scale(hs_u32 v, hs_u32 bias, hs_u32 d) {
    mm_f16x2 x, b, s;
    __builtin_memcpy(&x, &v, 4);
    __builtin_memcpy(&b, &bias, 4);
    __builtin_memcpy(&s, &d, 4);
    const mm_f16x2 r = (x - b) * s;
    hs_u32 o;
    __builtin_memcpy(&o, &r, 4);
    return o;
}
#else
// Portable (the CPU stand-in of the tests): the same halves through float, where the difference
// is exact and the product of two halves is too, so one rounding to half.
__device__ __forceinline__ hs_u32 mm_h2_unbias_scale(hs_u32 v, hs_u32 bias, hs_u32 d) {
    hs_u32 o = 0;
    for (int i = 0; i < 2; ++i) {
        const float x = hs_half_to_float((unsigned short)(v >> (16 * i))) -
                        hs_half_to_float((unsigned short)(bias >> (16 * i)));
        o |= (hs_u32)hs_float_to_half(x * hs_half_to_float((unsigned short)(d >> (16 * i))))
             << (16 * i);
    }
    return o;
}
#endif

// The four bytes of v (each an integer plus `bias`, below 1024) times the half d (its bits in
// both halves of d2), as two half pairs into w[0], w[1]; bias2: the half 1024 + bias, twice.
__device__ __forceinline__ void mm_bytes_h2(hs_u32 v, hs_u32 bias2, hs_u32 d2, hs_u32 *w) {
    const hs_u32 lo = (v & 0xFFu) | ((v << 8) & 0xFF0000u) | 0x64006400u;
    const hs_u32 hi = ((v >> 16) & 0xFFu) | ((v >> 8) & 0xFF0000u) | 0x64006400u;
    w[0] = mm_h2_unbias_scale(lo, bias2, d2);
    w[1] = mm_h2_unbias_scale(hi, bias2, d2);
}

// Eight bytes of values (v.x, v.y) into 8 halves at s (16-byte aligned).
__device__ __forceinline__ void mm_store8(uint2 v, hs_u32 bias2, hs_u32 d2, unsigned short *s) {
    hs_u32 w[4];
    mm_bytes_h2(v.x, bias2, d2, w);
    mm_bytes_h2(v.y, bias2, d2, w + 2);
    *(uint4 *)s = make_uint4(w[0], w[1], w[2], w[3]);
}

// Q4_0 (d, qs[16]; element j the low nibble of qs[j], j + 16 the high one): half h loads bytes
// 8h .. 8h + 7 of the quants and writes elements 8h .. 8h + 7 (low nibbles) and 16 + 8h ..
// (high nibbles), the values as dq_q4_0 computes them.
struct MmStageQ4_0 {
    struct Raw {
        uint2 q;
        hs_u32 d;
    };
    static __device__ __forceinline__ void load(hs_u32, const unsigned char *row, hs_u32 kt,
                                                hs_u32 h, Raw &r) {
        const unsigned char *b = row + (hs_u64)(kt / 32) * 18;
        r.d = *(const unsigned short *)b;
        r.q = mm_ld8(b + 2 + 8 * h);
    }
    static __device__ __forceinline__ void store(hs_u32, const Raw &r, const unsigned char *,
                                                 hs_u32, hs_u32 h, unsigned short *s) {
        const hs_u32 d2 = r.d | (r.d << 16);
        const hs_u32 bias2 = 0x64086408u; // 1024 + 8
        mm_store8(make_uint2(r.q.x & 0x0F0F0F0Fu, r.q.y & 0x0F0F0F0Fu), bias2, d2, s + 8 * h);
        mm_store8(make_uint2((r.q.x >> 4) & 0x0F0F0F0Fu, (r.q.y >> 4) & 0x0F0F0F0Fu), bias2, d2,
                  s + 16 + 8 * h);
    }
};

// Q8_0 (d, qs[32] signed; 34-byte blocks): half h loads quants 16h .. 16h + 15 and writes those
// elements (the signed bytes biased by 128 with an exclusive or).
struct MmStageQ8_0 {
    struct Raw {
        uint2 q[2];
        hs_u32 d;
    };
    static __device__ __forceinline__ void load(hs_u32, const unsigned char *row, hs_u32 kt,
                                                hs_u32 h, Raw &r) {
        const unsigned char *b = row + (hs_u64)(kt / 32) * 34;
        r.d = *(const unsigned short *)b;
        r.q[0] = mm_ld8(b + 2 + 16 * h);
        r.q[1] = mm_ld8(b + 10 + 16 * h);
    }
    static __device__ __forceinline__ void store(hs_u32, const Raw &r, const unsigned char *,
                                                 hs_u32, hs_u32 h, unsigned short *s) {
        const hs_u32 d2 = r.d | (r.d << 16);
        const hs_u32 bias2 = 0x64806480u; // 1024 + 128
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            mm_store8(make_uint2(r.q[i].x ^ 0x80808080u, r.q[i].y ^ 0x80808080u), bias2, d2,
                      s + 16 * h + 8 * i);
        }
    }
};

// MXFP4 (e, qs[16] laid out as Q4_0's; 17-byte blocks): as Q4_0, the nibbles through the value
// table in registers (hs_lut16_4; doubled E2M1 values, signed bytes). The scale 2^(e - 128) is a
// half for e in 104 ..= 143; a block scaled outside that (none in real files) takes the float
// products of dq_mxfp4, which round the same where the half path is exact.
struct MmStageMxfp4 {
    struct Raw {
        uint2 q;
        hs_u32 e;
    };
    static __device__ __forceinline__ void load(hs_u32, const unsigned char *row, hs_u32 kt,
                                                hs_u32 h, Raw &r) {
        const unsigned char *b = row + (hs_u64)(kt / 32) * 17;
        r.e = b[0];
        r.q = mm_ld8(b + 1 + 8 * h);
    }
    static __device__ __forceinline__ void store(hs_u32, const Raw &r, const unsigned char *,
                                                 hs_u32, hs_u32 h, unsigned short *s) {
        const hs_u32 lo[2] = {(hs_u32)hs_lut16_4(r.q.x, HS_LUT_MXFP4),
                              (hs_u32)hs_lut16_4(r.q.y, HS_LUT_MXFP4)};
        const hs_u32 hi[2] = {(hs_u32)hs_lut16_4(r.q.x >> 4, HS_LUT_MXFP4),
                              (hs_u32)hs_lut16_4(r.q.y >> 4, HS_LUT_MXFP4)};
        if (r.e >= 104 && r.e <= 143) {
            const hs_u32 dh = hs_float_to_half(dq_e8m0_half((unsigned char)r.e));
            const hs_u32 d2 = dh | (dh << 16);
            const hs_u32 bias2 = 0x64806480u; // 1024 + 128
            mm_store8(make_uint2(lo[0] ^ 0x80808080u, lo[1] ^ 0x80808080u), bias2, d2,
                      s + 8 * h);
            mm_store8(make_uint2(hi[0] ^ 0x80808080u, hi[1] ^ 0x80808080u), bias2, d2,
                      s + 16 + 8 * h);
            return;
        }
        const float d = dq_e8m0_half((unsigned char)r.e);
        hs_u32 w[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const hs_u32 t = i < 2 ? lo[i] : hi[i - 2];
            w[2 * i] = mm_half2((float)(signed char)t * d, (float)(signed char)(t >> 8) * d);
            w[2 * i + 1] =
                mm_half2((float)(signed char)(t >> 16) * d, (float)(signed char)(t >> 24) * d);
        }
        *(uint4 *)(s + 8 * h) = make_uint4(w[0], w[1], w[2], w[3]);
        *(uint4 *)(s + 16 + 8 * h) = make_uint4(w[4], w[5], w[6], w[7]);
    }
};

// 16 halves (w: 8 pairs) at s, 16-byte aligned.
__device__ __forceinline__ void mm_store16(const hs_u32 *w, unsigned short *s) {
    uint4 *o = (uint4 *)s;
    o[0] = make_uint4(w[0], w[1], w[2], w[3]);
    o[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// Every other type: a thread dequantizes its 16 elements 16h .. 16h + 15 through DQ16 when it
// stages them (nothing loaded ahead).
template <void (*DQ16)(hs_u32, const unsigned char *, hs_u32, hs_u32 *)> struct MmStageDq16 {
    struct Raw {};
    static __device__ __forceinline__ void load(hs_u32, const unsigned char *, hs_u32, hs_u32,
                                                Raw &) {}
    static __device__ __forceinline__ void store(hs_u32 ty, const Raw &, const unsigned char *row,
                                                 hs_u32 kt, hs_u32 h, unsigned short *s) {
        hs_u32 w[8];
        DQ16(ty, row, kt + 16 * h, w);
        mm_store16(w, s + 16 * h);
    }
};

// The K-quants (MmK45, MmQ6K): a thread's 16 elements 16h .. 16h + 15 loaded a step ahead, turned
// into halves when stored.
template <class K> struct MmStageWords {
    typedef typename K::Raw Raw;
    static __device__ __forceinline__ void load(hs_u32, const unsigned char *row, hs_u32 kt,
                                                hs_u32 h, Raw &r) {
        K::load(row, kt + 16 * h, r);
    }
    static __device__ __forceinline__ void store(hs_u32, const Raw &r, const unsigned char *,
                                                 hs_u32 kt, hs_u32 h, unsigned short *s) {
        hs_u32 w[8];
        K::conv(r, kt + 16 * h, w);
        mm_store16(w, s + 16 * h);
    }
};

// The chunk's 64 activation rows for step kt (zeros past its entries): two 16-byte loads a
// thread into v, from the rows the thread was given (xr[0], xr[1]: null past the chunk), and
// their stores into the staged tile.
__device__ __forceinline__ void moe_mm_load_b(const unsigned short *const *xr, hs_u32 kt,
                                              uint4 *v) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const hs_u32 i = threadIdx.x + h * HS_MM_THREADS;
        const hs_u32 c = (i % (HS_MM_BK / 8)) * 8;
        v[h] = xr[h] != 0 ? *(const uint4 *)(xr[h] + kt + c) : make_uint4(0, 0, 0, 0);
    }
}

__device__ __forceinline__ void moe_mm_store_b(const uint4 *v, unsigned short *Bs) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const hs_u32 i = threadIdx.x + h * HS_MM_THREADS;
        *(uint4 *)(Bs + (i / (HS_MM_BK / 8)) * HS_MM_LDS + (i % (HS_MM_BK / 8)) * 8) = v[h];
    }
}

// acc += the tile's expert rows (the thread's row at arow; alive: inside the matrix) times the
// chunk's activation rows (xr) over k columns, staged 32 at a time through As and Bs. Each step's
// loads are issued before the previous step's product and waited on after it.
template <class T>
__device__ __forceinline__ void moe_mm_steps(hs_u32 ty, const unsigned char *arow, bool alive,
                                             const unsigned short *const *xr, hs_u32 k,
                                             unsigned short *As, unsigned short *Bs,
                                             hs_mm_acc &acc) {
    const hs_u32 h = threadIdx.x % 2;
    unsigned short *as = As + (threadIdx.x / 2) * HS_MM_LDS;
    typename T::Raw ra;
    uint4 rb[2];
    if (alive) {
        T::load(ty, arow, 0, h, ra);
    }
    moe_mm_load_b(xr, 0, rb);
    for (hs_u32 kt = 0; kt < k; kt += HS_MM_BK) {
        if (alive) {
            T::store(ty, ra, arow, kt, h, as);
        } else {
            const uint4 z = make_uint4(0, 0, 0, 0);
            *(uint4 *)(as + 16 * h) = z;
            *(uint4 *)(as + 16 * h + 8) = z;
        }
        moe_mm_store_b(rb, Bs);
        __syncthreads();
        if (kt + HS_MM_BK < k) {
            if (alive) {
                T::load(ty, arow, kt + HS_MM_BK, h, ra);
            }
            moe_mm_load_b(xr, kt + HS_MM_BK, rb);
        }
        hs_mm_tile(As, Bs, acc);
        __syncthreads();
    }
}

// h[s + t][row] = act(gate_e[row] . x[tok[s + t]], up_e[row] . x[tok[s + t]]) (moe_act; gb, ub:
// gpt-oss's biases or null) for the chunk's entries t and the block's 32 hidden rows: xh holds the
// batch's tokens (f16, `cols` each); `ff` rows per expert. The block's A tile is those 32 rows of
// gate (tile rows 0..31) over the same 32 of up (32..63), so one tile and one accumulator serve
// both; the up half goes through shared memory to the threads holding the gate half. (Two
// 64-row tiles and two accumulators a block ran at half the speed of the down product per row.)
#define MOE_MM_HALF (HS_MM_BM / 2)
template <class T>
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
    // A: thread tid stages half tid % 2 of tile row tid / 2 (gate, then up).
    const hs_u32 ar = tid / 2;
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
    moe_mm_steps<T>(ty, arow, alive, xr, cols, As, Bs, acc);
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
template <class T>
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
    moe_mm_steps<T>(ty, arow, alive, xr, ff, As, Bs, acc);
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
    moe_mm_gate_up<MmStageQ4_0>(wg, wu, xh, h, route, n, k, ff, cols, gb, ub, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_down_q4_0(HS_TRACK_PARAMS, const unsigned char *wd,
                                 const unsigned short *hh, float *y, const float *route,
                                 hs_u32 n, hs_u32 k, hs_u32 dim, hs_u32 ff, hs_u32 ty,
                                 hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_down<MmStageQ4_0>(wd, hh, y, route, n, k, dim, ff, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_gate_up_q8_0(HS_TRACK_PARAMS, const unsigned char *wg,
                                    const unsigned char *wu, const unsigned short *xh, float *h,
                                    const float *route, hs_u32 n, hs_u32 k, hs_u32 ff,
                                    hs_u32 cols, const float *gb, const float *ub, hs_u32 ty,
                                    hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_gate_up<MmStageQ8_0>(wg, wu, xh, h, route, n, k, ff, cols, gb, ub, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_down_q8_0(HS_TRACK_PARAMS, const unsigned char *wd,
                                 const unsigned short *hh, float *y, const float *route,
                                 hs_u32 n, hs_u32 k, hs_u32 dim, hs_u32 ff, hs_u32 ty,
                                 hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_down<MmStageQ8_0>(wd, hh, y, route, n, k, dim, ff, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_gate_up_mxfp4(HS_TRACK_PARAMS, const unsigned char *wg,
                                    const unsigned char *wu, const unsigned short *xh, float *h,
                                    const float *route, hs_u32 n, hs_u32 k, hs_u32 ff,
                                    hs_u32 cols, const float *gb, const float *ub, hs_u32 ty,
                                    hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_gate_up<MmStageMxfp4>(wg, wu, xh, h, route, n, k, ff, cols, gb, ub, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_down_mxfp4(HS_TRACK_PARAMS, const unsigned char *wd,
                                 const unsigned short *hh, float *y, const float *route,
                                 hs_u32 n, hs_u32 k, hs_u32 dim, hs_u32 ff, hs_u32 ty,
                                 hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_down<MmStageMxfp4>(wd, hh, y, route, n, k, dim, ff, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_gate_up_q4_k(HS_TRACK_PARAMS, const unsigned char *wg,
                                    const unsigned char *wu, const unsigned short *xh, float *h,
                                    const float *route, hs_u32 n, hs_u32 k, hs_u32 ff,
                                    hs_u32 cols, const float *gb, const float *ub, hs_u32 ty,
                                    hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_gate_up<MmStageWords<MmK45<false>>>(wg, wu, xh, h, route, n, k, ff, cols, gb, ub, ty,
                                               row_bytes);
}

HS_KERNEL void hs_moe_mm_down_q4_k(HS_TRACK_PARAMS, const unsigned char *wd,
                                 const unsigned short *hh, float *y, const float *route,
                                 hs_u32 n, hs_u32 k, hs_u32 dim, hs_u32 ff, hs_u32 ty,
                                 hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_down<MmStageWords<MmK45<false>>>(wd, hh, y, route, n, k, dim, ff, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_gate_up_q6_k(HS_TRACK_PARAMS, const unsigned char *wg,
                                    const unsigned char *wu, const unsigned short *xh, float *h,
                                    const float *route, hs_u32 n, hs_u32 k, hs_u32 ff,
                                    hs_u32 cols, const float *gb, const float *ub, hs_u32 ty,
                                    hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_gate_up<MmStageWords<MmQ6K>>(wg, wu, xh, h, route, n, k, ff, cols, gb, ub, ty,
                                        row_bytes);
}

HS_KERNEL void hs_moe_mm_down_q6_k(HS_TRACK_PARAMS, const unsigned char *wd,
                                 const unsigned short *hh, float *y, const float *route,
                                 hs_u32 n, hs_u32 k, hs_u32 dim, hs_u32 ff, hs_u32 ty,
                                 hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_down<MmStageWords<MmQ6K>>(wd, hh, y, route, n, k, dim, ff, ty, row_bytes);
}

HS_KERNEL void hs_moe_mm_gate_up_any(HS_TRACK_PARAMS, const unsigned char *wg,
                                    const unsigned char *wu, const unsigned short *xh, float *h,
                                    const float *route, hs_u32 n, hs_u32 k, hs_u32 ff,
                                    hs_u32 cols, const float *gb, const float *ub, hs_u32 ty,
                                    hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_gate_up<MmStageDq16<mm_dq16_any>>(wg, wu, xh, h, route, n, k, ff, cols, gb, ub, ty,
                                             row_bytes);
}

HS_KERNEL void hs_moe_mm_down_any(HS_TRACK_PARAMS, const unsigned char *wd,
                                 const unsigned short *hh, float *y, const float *route,
                                 hs_u32 n, hs_u32 k, hs_u32 dim, hs_u32 ff, hs_u32 ty,
                                 hs_u64 row_bytes) {
    HS_BREADCRUMB();
    moe_mm_down<MmStageDq16<mm_dq16_any>>(wd, hh, y, route, n, k, dim, ff, ty, row_bytes);
}
