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
