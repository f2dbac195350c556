// Prompt batches: attention tiled over queries and keys (flash attention), with attention.h
// compiled before this file. Its kernels are generated per cache type and head dimension from the
// list the host defines before the file for each unit (src/gpu/compute/units.rs):
// HS_ATTN_TILED_TYPES(X), X(name, KV, NC) for hs_attention_tiled_<name> over a cache of KV
// elements and heads of 32 * NC dimensions (64, 96, 128 or 256; other sizes take
// infer_attention.hip's kernels).
//
// Block (h, b) computes the outputs of query rows t0 = b * HS_FA_BQ .. t0 + HS_FA_BQ of head h.
// The keys and values its rows see are read a tile of HS_FA_BK positions at a time into shared
// memory, once for all HS_FA_BQ rows (infer_attention reads every key once per query). Thread
// (r, c) of the block, HS_FA_TPR threads a row, holds row r's query dimensions 4c + 32i ..
// 4c + 32i + 3 (i < NC, head_dim = 32 * NC) in registers, and the same dimensions of its output:
// a score is the sum of the row's HS_FA_TPR partial dots (three shuffles), and every shared-memory
// read is 16 bytes. The softmax is online as in infer_attention (running max and sum per row),
// rescaled once per tile. Masking (causal, sliding window), soft-capping and sinks are as there;
// the block reads keys from the first any of its rows sees to the last. Not used inside a decode
// graph and never fused with the Q8 quantization (a prompt batch's products dequantize anyway).
#define HS_FA_BQ 16
#define HS_FA_BK 16
#define HS_FA_TPR 8
#define HS_FA_THREADS (HS_FA_BQ * HS_FA_TPR)

__device__ __forceinline__ float4 infer_kv_load4(const float *p, hs_u64 i) {
    return *(const float4 *)(p + i);
}
__device__ __forceinline__ float4 infer_kv_load4(const unsigned short *p, hs_u64 i) {
    const uint2 u = *(const uint2 *)(p + i);
    float4 r;
    r.x = hs_half_to_float((unsigned short)(u.x & 0xffffu));
    r.y = hs_half_to_float((unsigned short)(u.x >> 16));
    r.z = hs_half_to_float((unsigned short)(u.y & 0xffffu));
    r.w = hs_half_to_float((unsigned short)(u.y >> 16));
    return r;
}

__device__ __forceinline__ float hs_dot4(float4 a, float4 b, float acc) {
    return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}

template <typename KV, int NC>
__device__ __forceinline__ void infer_attention_tiled(const float *q, const KV *kc, const KV *vc,
                                                      float *out, hs_u32 n_tokens,
                                                      hs_u32 n_heads, hs_u32 n_kv_heads,
                                                      hs_u32 pos0, float scale, hs_u32 window,
                                                      hs_u32 slots, float softcap,
                                                      const float *sinks) {
    __shared__ float4 ks[HS_FA_BK][HS_ATTN_MAX_HEAD_DIM / 4];
    __shared__ float4 vs[HS_FA_BK][HS_ATTN_MAX_HEAD_DIM / 4];
    const hs_u32 head_dim = 32 * NC;
    const hs_u32 nq = 8 * NC; // 16-byte words of a head
    const hs_u32 h = blockIdx.x;
    const hs_u32 t0 = blockIdx.y * HS_FA_BQ;
    const hs_u32 r = threadIdx.x / HS_FA_TPR;
    const hs_u32 c = threadIdx.x % HS_FA_TPR;
    const hs_u32 t = t0 + r;
    const bool live = t < n_tokens;
    const hs_u32 q_dim = n_heads * head_dim;
    const hs_u32 kv_dim = n_kv_heads * head_dim;
    const hs_u32 kvh = h / (n_heads / n_kv_heads);
    const hs_u32 t_last = (t0 + HS_FA_BQ < n_tokens ? t0 + HS_FA_BQ : n_tokens) - 1;
    // Keys lo..hi for the block; own_lo..own_hi for this row.
    const hs_u32 hi = pos0 + t_last;
    const hs_u32 lo = (window > 0 && pos0 + t0 + 1 > window) ? pos0 + t0 + 1 - window : 0;
    const hs_u32 own_hi = pos0 + t;
    const hs_u32 own_lo = (window > 0 && pos0 + t + 1 > window) ? pos0 + t + 1 - window : 0;
    const float *qh = q + (hs_u64)(live ? t : t0) * q_dim + (hs_u64)h * head_dim + 4 * c;
    float4 qr[NC];
    float4 acc[NC];
#pragma unroll
    for (int i = 0; i < NC; ++i) {
        qr[i] = *(const float4 *)(qh + 32 * i);
        acc[i].x = 0.0f;
        acc[i].y = 0.0f;
        acc[i].z = 0.0f;
        acc[i].w = 0.0f;
    }
    float m = HS_NEG_INF;
    float l = 0.0f;
    for (hs_u32 j0 = lo; j0 <= hi; j0 += HS_FA_BK) {
        __syncthreads(); // every thread is done with the previous tile
        for (hs_u32 i = threadIdx.x; i < HS_FA_BK * nq; i += HS_FA_THREADS) {
            const hs_u32 jj = i / nq;
            const hs_u32 w = i % nq;
            const hs_u32 j = j0 + jj;
            float4 k4;
            float4 v4;
            if (j <= hi) {
                const hs_u64 off =
                    (hs_u64)(j % slots) * kv_dim + (hs_u64)kvh * head_dim + 4 * (hs_u64)w;
                k4 = infer_kv_load4(kc, off);
                v4 = infer_kv_load4(vc, off);
            } else {
                k4.x = k4.y = k4.z = k4.w = 0.0f;
                v4 = k4;
            }
            ks[jj][w] = k4;
            vs[jj][w] = v4;
        }
        __syncthreads();
        float s[HS_FA_BK];
        float mt = HS_NEG_INF;
#pragma unroll
        for (int jj = 0; jj < HS_FA_BK; ++jj) {
            float part = 0.0f;
#pragma unroll
            for (int i = 0; i < NC; ++i) {
                part = hs_dot4(qr[i], ks[jj][c + 8 * i], part);
            }
            part += HS_SHFL_XOR(part, 1);
            part += HS_SHFL_XOR(part, 2);
            part += HS_SHFL_XOR(part, 4);
            float sc = part * scale;
            if (softcap > 0.0f) {
                sc = softcap * tanhf(sc / softcap);
            }
            const hs_u32 j = j0 + jj;
            s[jj] = (live && j <= own_hi && j >= own_lo) ? sc : HS_NEG_INF;
            mt = fmaxf(mt, s[jj]);
        }
        const float m_new = fmaxf(m, mt);
        if (m_new == HS_NEG_INF) {
            continue; // no key of this row yet
        }
        const float corr = expf(m - m_new);
        float ps = 0.0f;
#pragma unroll
        for (int jj = 0; jj < HS_FA_BK; ++jj) {
            s[jj] = expf(s[jj] - m_new);
            ps += s[jj];
        }
        l = l * corr + ps;
#pragma unroll
        for (int i = 0; i < NC; ++i) {
            float4 a = acc[i];
            a.x *= corr;
            a.y *= corr;
            a.z *= corr;
            a.w *= corr;
#pragma unroll
            for (int jj = 0; jj < HS_FA_BK; ++jj) {
                const float4 v4 = vs[jj][c + 8 * i];
                a.x = fmaf(s[jj], v4.x, a.x);
                a.y = fmaf(s[jj], v4.y, a.y);
                a.z = fmaf(s[jj], v4.z, a.z);
                a.w = fmaf(s[jj], v4.w, a.w);
            }
            acc[i] = a;
        }
        m = m_new;
    }
    if (live) {
        const float inv = attn_norm(m, l, sinks, h);
        float *oh = out + (hs_u64)t * q_dim + (hs_u64)h * head_dim + 4 * c;
#pragma unroll
        for (int i = 0; i < NC; ++i) {
            float4 o = acc[i];
            o.x *= inv;
            o.y *= inv;
            o.z *= inv;
            o.w *= inv;
            *(float4 *)(oh + 32 * i) = o;
        }
    }
}

// hs_attention_tiled_<name> (q, kc, vc, out, n_tokens, n_heads, n_kv_heads, pos0, scale, window,
// slots, softcap, sinks).
#define HS_ATTN_TILED_KERNELS(T, KV, NC)                                                       \
    HS_KERNEL void hs_attention_tiled_##T(HS_TRACK_PARAMS, const float *q, const KV *kc,       \
                                          const KV *vc, float *out, hs_u32 n_tokens,           \
                                          hs_u32 n_heads, hs_u32 n_kv_heads, hs_u32 pos0,      \
                                          float scale, hs_u32 window, hs_u32 slots,            \
                                          float softcap, const float *sinks) {                 \
        HS_BREADCRUMB();                                                                       \
        infer_attention_tiled<KV, NC>(q, kc, vc, out, n_tokens, n_heads, n_kv_heads, pos0,     \
                                      scale, window, slots, softcap, sinks);                   \
    }

HS_ATTN_TILED_TYPES(HS_ATTN_TILED_KERNELS)

// ---- Prompt batches on the matrix units ------------------------------------------------------
//
// hs_attention_mma_<name>: the same attention as hs_attention_tiled_<name> (masks, soft-cap,
// sinks, the ring of a sliding-window layer), its two products on the matrix units through
// mma.h's 64 x 64 tile (mma.sync on CUDA sm_80+, WMMA on gfx11, MFMA on gfx90a; plain FMA
// elsewhere, where the host keeps the tiled kernel above). Generated, for head dimensions of at
// most 128, from the list HS_ATTN_MMA_TYPES(X), X(name, KV, NC), that the host defines beside
// HS_ATTN_TILED_TYPES.
//
// Block (h, b) of HS_MM_THREADS threads computes query rows t0 = 64 b .. t0 + 64 of head h. Its
// queries are staged once as f16 (qs: NC steps of 32 dimensions). For each tile of 64 keys from
// the first any of its rows sees to the last:
//   1. S = Q K^T on the matrix units, the tile's keys staged 32 dimensions at a time (bs);
//   2. S scaled, soft-capped and masked into shared memory (sp), then two threads a row take its
//      max and the exponentials (the online softmax: running max, sum and the correction of the
//      output so far per row, in row_m / row_l / row_c), writing P as f16 over the scores;
//   3. the output tiles (64 dimensions each, in the matrix units' registers) rescaled per row,
//      then O += P V, V staged transposed (dimensions as rows), 32 keys at a time.
// The queries and P are rounded to f16 as llama.cpp's tensor-core attention rounds them; the
// cache is f16 by default (an f32 cache is rounded as it is staged). 42 KiB of shared memory at
// 128 dimensions (HS_MM_LDS-padded rows), under the 48 KiB a CUDA block has without opting in.
// A device without matrix units (gfx1030, CUDA before sm_80) never launches them (the host keeps
// the tiled kernel there: src/gpu/compute/attention.rs), so its build leaves them out: the unit
// compiles in a fifth of the time for it. The CPU stand-in of the tests (HS_EMU_STANDIN) keeps
// them, on mma.h's plain tile.
#if defined(HS_ATTN_MMA_TYPES) && (defined(HS_MM_HAS_UNITS) || defined(HS_EMU_STANDIN))

#define HS_FM_ROWS 64 // query rows of a block (HS_MM_BM)
#define HS_FM_KEYS 64 // keys of a tile (HS_MM_BN)
#define HS_FM_LDSS 65 // floats per row of the staged scores

__device__ __forceinline__ hs_u32 fm_pack2(float a, float b) {
    return (hs_u32)hs_float_to_half(a) | ((hs_u32)hs_float_to_half(b) << 16);
}

// Eight consecutive elements (16-byte aligned) as eight halves.
__device__ __forceinline__ uint4 fm_load8(const unsigned short *p, hs_u64 i) {
    return *(const uint4 *)(p + i);
}
__device__ __forceinline__ uint4 fm_load8(const float *p, hs_u64 i) {
    const float4 a = *(const float4 *)(p + i);
    const float4 b = *(const float4 *)(p + i + 4);
    uint4 r;
    r.x = fm_pack2(a.x, a.y);
    r.y = fm_pack2(a.z, a.w);
    r.z = fm_pack2(b.x, b.y);
    r.w = fm_pack2(b.z, b.w);
    return r;
}

template <typename KV, int NC>
__device__ __forceinline__ void infer_attention_mma(const float *q, const KV *kc, const KV *vc,
                                                    float *out, hs_u32 n_tokens, hs_u32 n_heads,
                                                    hs_u32 n_kv_heads, hs_u32 pos0, float scale,
                                                    hs_u32 window, hs_u32 slots, float softcap,
                                                    const float *sinks) {
    const int NO = (NC + 1) / 2; // 64-dimension tiles of the output
    __shared__ __attribute__((aligned(16))) unsigned short qs[NC][HS_MM_BM * HS_MM_LDS];
    __shared__ __attribute__((aligned(16))) unsigned short bs[HS_MM_BN * HS_MM_LDS];
    __shared__ __attribute__((aligned(16))) float sp[HS_FM_ROWS * HS_FM_LDSS];
    __shared__ float row_m[HS_FM_ROWS];
    __shared__ float row_l[HS_FM_ROWS];
    __shared__ float row_c[HS_FM_ROWS];
    // P over the scores: [2 steps of 32 keys][64 rows][HS_MM_LDS] halves (10 KiB of sp's 16).
    unsigned short *ps = (unsigned short *)sp;
    const hs_u32 head_dim = 32 * NC;
    const hs_u32 h = blockIdx.x;
    const hs_u32 t0 = blockIdx.y * HS_FM_ROWS;
    const hs_u32 tid = threadIdx.x;
    const hs_u32 q_dim = n_heads * head_dim;
    const hs_u32 kv_dim = n_kv_heads * head_dim;
    const hs_u32 kvh = h / (n_heads / n_kv_heads);
    const hs_u64 koff = (hs_u64)kvh * head_dim;
    const hs_u32 t_last = (t0 + HS_FM_ROWS < n_tokens ? t0 + HS_FM_ROWS : n_tokens) - 1;
    const hs_u32 hi = pos0 + t_last;
    const hs_u32 lo = (window > 0 && pos0 + t0 + 1 > window) ? pos0 + t0 + 1 - window : 0;
    // The queries as f16: row r's dimensions 8w .. 8w + 8 at qs[w / 4][r][8 (w % 4)].
    for (hs_u32 i = tid; i < HS_FM_ROWS * 4 * NC; i += blockDim.x) {
        const hs_u32 r = i / (4 * NC);
        const hs_u32 w = i % (4 * NC);
        uint4 u = make_uint4(0u, 0u, 0u, 0u);
        if (t0 + r < n_tokens) {
            u = fm_load8(q, (hs_u64)(t0 + r) * q_dim + (hs_u64)h * head_dim + 8 * w);
        }
        *(uint4 *)&qs[w / 4][r * HS_MM_LDS + 8 * (w % 4)] = u;
    }
    if (tid < HS_FM_ROWS) {
        row_m[tid] = HS_NEG_INF;
        row_l[tid] = 0.0f;
    }
    hs_mm_acc o[NO];
#pragma unroll
    for (int ot = 0; ot < NO; ++ot) {
        hs_mm_zero(o[ot]);
    }
    for (hs_u32 j0 = lo; j0 <= hi; j0 += HS_FM_KEYS) {
        // 1. S = Q K^T.
        hs_mm_acc s;
        hs_mm_zero(s);
#pragma unroll
        for (int ks = 0; ks < NC; ++ks) {
            __syncthreads(); // bs (and, at ks 0, sp's P) no longer read
            for (hs_u32 i = tid; i < HS_FM_KEYS * 4; i += blockDim.x) {
                const hs_u32 kk = i / 4;
                const hs_u32 w = i % 4;
                const hs_u32 j = j0 + kk;
                uint4 u = make_uint4(0u, 0u, 0u, 0u);
                if (j <= hi) {
                    u = fm_load8(kc, (hs_u64)(j % slots) * kv_dim + koff + 32 * ks + 8 * w);
                }
                *(uint4 *)&bs[kk * HS_MM_LDS + 8 * w] = u;
            }
            __syncthreads();
            hs_mm_tile(qs[ks], bs, s);
        }
        // 2. The scores, masked, then the rows' softmax.
#pragma unroll
        for (int e = 0; e < HS_MM_ACC; ++e) {
            float v;
            hs_i32 r, c;
            hs_mm_at(s, e, &v, &r, &c);
            const hs_u32 t = t0 + (hs_u32)r;
            const hs_u32 j = j0 + (hs_u32)c;
            const hs_u32 pos = pos0 + t;
            float x = v * scale;
            if (softcap > 0.0f) {
                x = softcap * tanhf(x / softcap);
            }
            const bool seen = t < n_tokens && j <= pos && (window == 0 || j + window > pos);
            sp[r * HS_FM_LDSS + c] = seen ? x : HS_NEG_INF;
        }
        __syncthreads();
        const hs_u32 r = tid / 2;
        const hs_u32 half = tid % 2;
        float x[32];
        float mt = HS_NEG_INF;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            x[i] = sp[r * HS_FM_LDSS + 32 * half + i];
            mt = fmaxf(mt, x[i]);
        }
        mt = fmaxf(mt, HS_SHFL_XOR(mt, 1));
        const float m_old = row_m[r];
        const float m_new = fmaxf(m_old, mt);
        const bool none = m_new == HS_NEG_INF; // no key of this row yet
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            x[i] = none ? 0.0f : expf(x[i] - m_new);
            sum += x[i];
        }
        sum += HS_SHFL_XOR(sum, 1);
        const float corr = none ? 1.0f : expf(m_old - m_new);
        __syncthreads(); // every score read before P overwrites them
        hs_u32 *pw = (hs_u32 *)&ps[(half * HS_FM_ROWS + r) * HS_MM_LDS];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            pw[i] = fm_pack2(x[2 * i], x[2 * i + 1]);
        }
        if (half == 0) {
            row_m[r] = m_new;
            row_l[r] = row_l[r] * corr + sum;
            row_c[r] = corr;
        }
        __syncthreads();
        // 3. O = O * corr + P V.
#pragma unroll
        for (int ot = 0; ot < NO; ++ot) {
#pragma unroll
            for (int e = 0; e < HS_MM_ACC; ++e) {
                float v;
                hs_i32 rr, cc;
                hs_mm_at(o[ot], e, &v, &rr, &cc);
                hs_mm_mul(o[ot], e, row_c[rr]);
            }
        }
#pragma unroll
        for (int ot = 0; ot < NO; ++ot) {
#pragma unroll
            for (int kh = 0; kh < 2; ++kh) {
                __syncthreads(); // bs no longer read
                // V^T: row d = dimension 64 ot + d, column k = key j0 + 32 kh + k.
                for (hs_u32 i = tid; i < 32 * 8; i += blockDim.x) {
                    const hs_u32 k = i / 8;
                    const hs_u32 w = i % 8;
                    const hs_u32 j = j0 + 32 * kh + k;
                    const hs_u32 d0 = 64 * ot + 8 * w;
                    uint4 u = make_uint4(0u, 0u, 0u, 0u);
                    if (j <= hi && d0 < head_dim) {
                        u = fm_load8(vc, (hs_u64)(j % slots) * kv_dim + koff + d0);
                    }
                    const hs_u32 wv[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                    for (int b = 0; b < 4; ++b) {
                        bs[(8 * w + 2 * b) * HS_MM_LDS + k] = (unsigned short)(wv[b] & 0xffffu);
                        bs[(8 * w + 2 * b + 1) * HS_MM_LDS + k] = (unsigned short)(wv[b] >> 16);
                    }
                }
                __syncthreads();
                hs_mm_tile(ps + kh * HS_FM_ROWS * HS_MM_LDS, bs, o[ot]);
            }
        }
    }
    __syncthreads();
    if (tid < HS_FM_ROWS) {
        row_c[tid] = (t0 + tid < n_tokens) ? attn_norm(row_m[tid], row_l[tid], sinks, h) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int ot = 0; ot < NO; ++ot) {
#pragma unroll
        for (int e = 0; e < HS_MM_ACC; ++e) {
            float v;
            hs_i32 r, c;
            hs_mm_at(o[ot], e, &v, &r, &c);
            const hs_u32 t = t0 + (hs_u32)r;
            const hs_u32 d = 64 * ot + (hs_u32)c;
            if (t < n_tokens && d < head_dim) {
                out[(hs_u64)t * q_dim + (hs_u64)h * head_dim + d] = v * row_c[r];
            }
        }
    }
}

// hs_attention_mma_<name>: hs_attention_tiled_<name>'s arguments; HS_MM_THREADS threads a block,
// a block per head and 64 query rows.
#define HS_ATTN_MMA_KERNELS(T, KV, NC)                                                         \
    HS_KERNEL void hs_attention_mma_##T(HS_TRACK_PARAMS, const float *q, const KV *kc,         \
                                        const KV *vc, float *out, hs_u32 n_tokens,             \
                                        hs_u32 n_heads, hs_u32 n_kv_heads, hs_u32 pos0,        \
                                        float scale, hs_u32 window, hs_u32 slots,              \
                                        float softcap, const float *sinks) {                   \
        HS_BREADCRUMB();                                                                       \
        infer_attention_mma<KV, NC>(q, kc, vc, out, n_tokens, n_heads, n_kv_heads, pos0,       \
                                    scale, window, slots, softcap, sinks);                     \
    }

HS_ATTN_MMA_TYPES(HS_ATTN_MMA_KERNELS)

#endif
