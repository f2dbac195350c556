// The KV-cache store and causal attention with GQA over an f32 or f16 cache (gpu::compute::attention),
// computing what the CPU backend (src/gpu/cpu/backend.rs) computes: a decode step's and short
// batches' (a query row a block, split over the keys from a few hundred on). Prompt batches take
// infer_attention_tiled.hip. Both are compiled with attention.h before them.


// The n elements of the keys and values of tokens at positions pos0.. (kv_dim a token) into the
// layer's cache (kc / vc), position p at slot p % slots (a sliding-window ring; a global layer has
// a slot per position).
__device__ __forceinline__ void infer_kv_put(float *p, hs_u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void infer_kv_put(unsigned short *p, hs_u64 i, float v) {
    p[i] = hs_float_to_half(v);
}

template <typename KV>
__device__ void infer_kv_store(const float *k, const float *v, KV *kc, KV *vc, hs_u32 pos0,
                               hs_u32 kv_dim, hs_u32 slots, hs_u64 n) {
    const hs_u64 stride = (hs_u64)gridDim.x * blockDim.x;
    for (hs_u64 i = (hs_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const hs_u64 t = i / kv_dim;
        const hs_u64 dst = ((pos0 + t) % slots) * kv_dim + i % kv_dim;
        infer_kv_put(kc, dst, k[i]);
        infer_kv_put(vc, dst, v[i]);
    }
}

// pos_dev, in every kernel here that takes it, when not null holds the position instead of pos0
// (a decode step replayed as a graph reads it from the device: src/gpu/handle/graph.rs).
#define HS_POS_FROM_DEVICE()                                                                   \
    do {                                                                                       \
        if (pos_dev != 0) {                                                                    \
            pos0 = *pos_dev;                                                                   \
        }                                                                                      \
    } while (0)

// Row t of a decode step of several sequences (rows not null: rows[2t] its sequence, rows[2t + 1]
// its position): moves kc / vc to that sequence's region of the layer (seq * slots * kv_dim
// elements on) and returns its position; with rows null, leaves them and returns `pos`.
template <typename P>
__device__ __forceinline__ hs_u32 infer_seq_row(const hs_u32 *rows, hs_u32 t, hs_u32 slots,
                                                hs_u32 kv_dim, P *&kc, P *&vc, hs_u32 pos) {
    if (rows == 0) {
        return pos;
    }
    const hs_u64 region = (hs_u64)rows[2 * t] * slots * kv_dim;
    kc += region;
    vc += region;
    return rows[2 * t + 1];
}

HS_KERNEL void hs_kv_store_f32(HS_TRACK_PARAMS, const float *k, const float *v, float *kc,
                               float *vc, hs_u32 pos0, hs_u32 kv_dim, hs_u32 slots, hs_u64 n,
                               const hs_u32 *pos_dev) {
    HS_BREADCRUMB();
    HS_POS_FROM_DEVICE();
    infer_kv_store<float>(k, v, kc, vc, pos0, kv_dim, slots, n);
}

// As hs_kv_store_f32 into an f16 cache (rounded to nearest even).
HS_KERNEL void hs_kv_store_f16(HS_TRACK_PARAMS, const float *k, const float *v,
                               unsigned short *kc, unsigned short *vc, hs_u32 pos0,
                               hs_u32 kv_dim, hs_u32 slots, hs_u64 n, const hs_u32 *pos_dev) {
    HS_BREADCRUMB();
    HS_POS_FROM_DEVICE();
    infer_kv_store<unsigned short>(k, v, kc, vc, pos0, kv_dim, slots, n);
}

// head_dim values of row (one head) = row / sqrt(mean(row^2) + eps) * w, in place (Qwen 3's and
// Gemma 3's attn_q_norm / attn_k_norm: hs_rms_norm_rows over rows of one head, the same numbers).
// Every thread of the block calls it; it ends with the block synchronised.
__device__ void infer_head_norm(float *row, hs_u32 head_dim, const float *w, float eps) {
    __shared__ float red[32];
    float sq = 0.0f;
    for (hs_u32 i = threadIdx.x; i < head_dim; i += blockDim.x) {
        sq += row[i] * row[i];
    }
    sq = hs_warp_sum(sq);
    if (threadIdx.x % warpSize == 0) {
        red[threadIdx.x / warpSize] = sq;
    }
    __syncthreads();
    float total = 0.0f;
    for (hs_u32 k = 0; k < blockDim.x / warpSize; ++k) {
        total += red[k];
    }
    const float scale = 1.0f / sqrtf(total / (float)head_dim + eps);
    for (hs_u32 i = threadIdx.x; i < head_dim; i += blockDim.x) {
        row[i] = row[i] * scale * w[i];
    }
    __syncthreads();
}

// RoPE fused with the KV-cache write, one block per head: block (t, h) for h < n_heads rotates
// token t's query head h in q; block (t, n_heads + j) rotates its key head j in k, then stores
// that head's keys and values at cache position pos0 + t (kc / vc: the layer's cache, kv_dim
// elements a slot, position p in slot p % slots). The numbers of hs_rope and hs_kv_store_*, in
// one launch; a block per head keeps every read-modify-write of the rotation independent of the
// others (one block per token row left them waiting on each other's memory round trips). Where
// qn / kn are not null, each query / key head is first normalized in place (infer_head_norm), so
// that Qwen 3's and Gemma 3's per-head norms cost no launch of their own. Where rows is not null,
// token t is one decode token of another sequence: rows[2t] its sequence (whose cache region of
// the layer starts seq * slots * kv_dim elements after kc / vc), rows[2t + 1] its position (a
// decode step of several sequences in one launch, instead of pos0 + t in one sequence).
template <typename KV>
__device__ void infer_rope_kv_store(float *q, float *k, const float *v, KV *kc, KV *vc,
                                    hs_u32 n_heads, hs_u32 n_kv_heads, hs_u32 head_dim,
                                    hs_u32 n_rot, hs_u32 pos0, float freq_scale,
                                    float theta_scale, const float *factors, hs_u32 neox,
                                    float mscale, float ext_factor, float corr_lo,
                                    float corr_hi, hs_u32 slots, const float *qn,
                                    const float *kn, float norm_eps, const hs_u32 *rows) {
    __shared__ float cs[HS_ROPE_MAX_PAIRS];
    __shared__ float sn[HS_ROPE_MAX_PAIRS];
    const hs_u32 t = blockIdx.x;
    const hs_u32 h = blockIdx.y;
    const hs_u32 kv_dim = n_kv_heads * head_dim;
    const hs_u32 pos = infer_seq_row(rows, t, slots, kv_dim, kc, vc, pos0 + t);
    if (h < n_heads) {
        float *qr = q + ((hs_u64)t * n_heads + h) * head_dim;
        if (qn != 0) {
            infer_head_norm(qr, head_dim, qn, norm_eps);
        }
        hs_rope_row(qr, 1, head_dim, n_rot, pos, freq_scale, theta_scale, factors, neox, mscale,
                    ext_factor, corr_lo, corr_hi, cs, sn);
        return;
    }
    const hs_u32 j = h - n_heads;
    float *kr = k + (hs_u64)t * kv_dim + (hs_u64)j * head_dim;
    if (kn != 0) {
        infer_head_norm(kr, head_dim, kn, norm_eps);
    }
    hs_rope_row(kr, 1, head_dim, n_rot, pos, freq_scale, theta_scale, factors, neox, mscale,
                ext_factor, corr_lo, corr_hi, cs, sn);
    const hs_u64 dst = (hs_u64)(pos % slots) * kv_dim + (hs_u64)j * head_dim;
    const float *vr = v + (hs_u64)t * kv_dim + (hs_u64)j * head_dim;
    for (hs_u32 i = threadIdx.x; i < head_dim; i += blockDim.x) {
        infer_kv_put(kc, dst + i, kr[i]);
        infer_kv_put(vc, dst + i, vr[i]);
    }
}

HS_KERNEL void hs_rope_kv_store_f32(HS_TRACK_PARAMS, float *q, float *k, const float *v,
                                    float *kc, float *vc, hs_u32 n_heads, hs_u32 n_kv_heads,
                                    hs_u32 head_dim, hs_u32 n_rot, hs_u32 pos0, float freq_scale,
                                    float theta_scale, const float *factors, hs_u32 neox,
                                    float mscale, float ext_factor, float corr_lo,
                                    float corr_hi, hs_u32 slots, const hs_u32 *pos_dev,
                                    const float *qn, const float *kn, float norm_eps,
                                    const hs_u32 *rows) {
    HS_BREADCRUMB();
    HS_POS_FROM_DEVICE();
    infer_rope_kv_store<float>(q, k, v, kc, vc, n_heads, n_kv_heads, head_dim, n_rot, pos0,
                               freq_scale, theta_scale, factors, neox, mscale, ext_factor,
                               corr_lo, corr_hi, slots, qn, kn, norm_eps, rows);
}

HS_KERNEL void hs_rope_kv_store_f16(HS_TRACK_PARAMS, float *q, float *k, const float *v,
                                    unsigned short *kc, unsigned short *vc, hs_u32 n_heads,
                                    hs_u32 n_kv_heads, hs_u32 head_dim, hs_u32 n_rot,
                                    hs_u32 pos0, float freq_scale, float theta_scale,
                                    const float *factors, hs_u32 neox, float mscale,
                                    float ext_factor, float corr_lo, float corr_hi,
                                    hs_u32 slots, const hs_u32 *pos_dev, const float *qn,
                                    const float *kn, float norm_eps, const hs_u32 *rows) {
    HS_BREADCRUMB();
    HS_POS_FROM_DEVICE();
    infer_rope_kv_store<unsigned short>(q, k, v, kc, vc, n_heads, n_kv_heads, head_dim, n_rot,
                                        pos0, freq_scale, theta_scale, factors, neox, mscale,
                                        ext_factor, corr_lo, corr_hi, slots, qn, kn, norm_eps,
                                        rows);
}

__device__ __forceinline__ float infer_kv_load(const float *p, hs_u64 i) { return p[i]; }
__device__ __forceinline__ float infer_kv_load(const unsigned short *p, hs_u64 i) {
    return hs_half_to_float(p[i]);
}

// Warps of a decode attention block at most (the narrowest warp is 32 lanes).
#define HS_ATTN_RED (HS_ATTN_THREADS / 32)
// Elements of a 16-byte cache load, and the most of any cache type.
#define HS_ATTN_W_MAX 8

template <typename KV> struct attn_w;
// W: elements of a 16-byte cache load; raw: such a load as it comes (attn_raw16).
template <> struct attn_w<float> {
    static const hs_u32 W = 4;
    typedef float4 raw;
};
template <> struct attn_w<unsigned short> {
    static const hs_u32 W = 8;
    typedef uint4 raw;
};

// Elements d..d + W of a cache row, by one 16-byte load (the row and d 16-byte aligned).
__device__ __forceinline__ void attn_load16(const float *row, hs_u32 d, float *r) {
    const float4 a = *(const float4 *)(row + d);
    r[0] = a.x;
    r[1] = a.y;
    r[2] = a.z;
    r[3] = a.w;
}
__device__ __forceinline__ void attn_load16(const unsigned short *row, hs_u32 d, float *r) {
    const uint4 u = *(const uint4 *)(row + d);
    const hs_u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        r[2 * i] = hs_half_to_float((unsigned short)(w[i] & 0xffffu));
        r[2 * i + 1] = hs_half_to_float((unsigned short)(w[i] >> 16));
    }
}

// Elements d..d + W of a cache row as one 16-byte load, unconverted (the row and d 16-byte
// aligned), and a + their dot product with q[0..W] (attn_key_part's two halves).
__device__ __forceinline__ float4 attn_raw16(const float *row, hs_u32 d) {
    return *(const float4 *)(row + d);
}
__device__ __forceinline__ uint4 attn_raw16(const unsigned short *row, hs_u32 d) {
    return *(const uint4 *)(row + d);
}
__device__ __forceinline__ float attn_dot16(float4 r, const float *q, float a) {
    a = fmaf(q[0], r.x, a);
    a = fmaf(q[1], r.y, a);
    a = fmaf(q[2], r.z, a);
    return fmaf(q[3], r.w, a);
}
__device__ __forceinline__ float attn_dot16(uint4 u, const float *q, float a) {
    const hs_u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        a = fmaf(q[2 * i], hs_half_to_float((unsigned short)(w[i] & 0xffffu)), a);
        a = fmaf(q[2 * i + 1], hs_half_to_float((unsigned short)(w[i] >> 16)), a);
    }
    return a;
}

// Elements d..d + W of a cache row into r: one 16-byte load where `vec` (W divides head_dim, so
// the row and d are 16-byte aligned), else one by one, 0 beyond head_dim.
template <typename KV>
__device__ __forceinline__ void attn_load(const KV *row, hs_u32 d, hs_u32 head_dim, bool vec,
                                          float *r) {
    const hs_u32 W = attn_w<KV>::W;
    if (vec) {
        attn_load16(row, d, r);
        return;
    }
#pragma unroll
    for (hs_u32 i = 0; i < W; ++i) {
        r[i] = (d + i < head_dim) ? infer_kv_load(row, d + i) : 0.0f;
    }
}

// Lane sl's part (0 <= sl < L) of the dot product of key row kj with the query (qs, zero-padded
// to nw words of W): its 16-byte words sl, sl + L, sl + 2L, ... below nw, so that the L lanes of
// a key read adjacent words. Where W divides head_dim (vec), a lane's words
// are loaded together, HS_ATTN_KEY_BATCH at most (a row of HS_ATTN_MAX_HEAD_DIM elements: at most
// ceil(HS_ATTN_MAX_HEAD_DIM / (W * L)) words a lane), before their products; else element by
// element, zeros beyond head_dim. Used by attn_keys when L > 1.
template <typename KV, hs_u32 L>
__device__ __forceinline__ float attn_key_part(const KV *kj, const float *qs, hs_u32 nw,
                                               hs_u32 head_dim, bool vec, hs_u32 sl) {
    const hs_u32 W = attn_w<KV>::W;
    const hs_u32 lane_words = (HS_ATTN_MAX_HEAD_DIM / W + L - 1) / L;
    const hs_u32 B = (lane_words < HS_ATTN_KEY_BATCH) ? lane_words : HS_ATTN_KEY_BATCH;
    float a = 0.0f;
    if (vec) {
        for (hs_u32 w0 = sl; w0 < nw; w0 += B * L) {
            typename attn_w<KV>::raw r[B];
#pragma unroll
            for (hs_u32 b = 0; b < B; ++b) {
                if (w0 + b * L < nw) {
                    r[b] = attn_raw16(kj, W * (w0 + b * L));
                }
            }
#pragma unroll
            for (hs_u32 b = 0; b < B; ++b) {
                if (w0 + b * L < nw) {
                    a = attn_dot16(r[b], qs + W * (w0 + b * L), a);
                }
            }
        }
        return a;
    }
    for (hs_u32 w = sl; w < nw; w += L) {
        float r[HS_ATTN_W_MAX];
        attn_load(kj, W * w, head_dim, false, r);
#pragma unroll
        for (hs_u32 i = 0; i < W; ++i) {
            a = fmaf(qs[W * w + i], r[i], a);
        }
    }
    return a;
}

// ---- One query row over a range of keys, L lanes a key ------------------------------------------
//
// The block (HS_ATTN_THREADS threads) walks keys lo..hi of one query row of head h (KV head kvh)
// in chunks of blockDim.x / L keys (L: attn_keys_for's choice by the head's size). With L = 1
// thread i scores key c0 + i against the query (qs, in shared memory) on its own, reading the key
// 16 bytes at a time (W = 4 f32 or 8 f16 elements), with no reduction across lanes. With L > 1
// threads iL .. iL + L - 1 score key c0 + i together: each reads every L-th 16-byte word of the
// row (attn_key_part: the L lanes' loads adjacent, a lane's words issued together), and the L
// partial sums are added by shuffles within the aligned group of L lanes (every lane then holds
// the score); only the group's lane 0 writes the key's weight and counts it in the sum. The
// chunk's max and the sum of its weights are block reductions, so the running max m and sum l
// are the whole block's (an online softmax a chunk at a time). The values are then summed by
// groups of ceil(head_dim / W) threads: thread (g, c) adds p_j * v_j[Wc..] for the chunk's keys
// j = g, g + groups, ..., so each value row is read coalesced by one group, and the groups,
// sharing m, add their sums without rescaling. Scores are soft-capped as
// cap * tanh(s / cap) where softcap > 0 (Gemma 2); key j sits in slot j % slots. A head_dim that
// W does not divide is read element by element (the same loop, zeros beyond head_dim).
//
// The form before this one gave each warp every fourth key and reduced each score across the
// warp: a serial chain of shuffles and exponentials per key, 11 us a SmolLM2 layer on an H100 at
// 16-48 keys. Leaves the block synchronised; o (shared, head_dim) holds the unnormalised output.
template <typename KV, hs_u32 L>
__device__ __forceinline__ void attn_keys(const float *qh, const KV *kc, const KV *vc,
                                          hs_u32 kv_dim, hs_u32 kvh, hs_u32 head_dim,
                                          hs_u32 lo, hs_u32 hi, hs_u32 slots, float scale,
                                          float softcap, float *o, float *m_out, float *l_out) {
    const hs_u32 W = attn_w<KV>::W;
    __shared__ float qs[HS_ATTN_MAX_HEAD_DIM + HS_ATTN_W_MAX];
    __shared__ float ps[HS_ATTN_THREADS];
    __shared__ float red_m[HS_ATTN_RED];
    __shared__ float red_l[HS_ATTN_RED];
    __shared__ float oacc[HS_ATTN_THREADS * HS_ATTN_W_MAX];
    const hs_u32 tid = threadIdx.x;
    const hs_u32 lane = tid % warpSize;
    const hs_u32 warp = tid / warpSize;
    const hs_u32 nwarps = blockDim.x / warpSize;
    // Keys of a chunk; this thread's key in it and its lane among the key's L.
    const hs_u32 keys = blockDim.x / L;
    const hs_u32 kk = tid / L;
    const hs_u32 sl = tid % L;
    const hs_u32 nw = (head_dim + W - 1) / W;
    const bool vec = (head_dim % W) == 0;
    for (hs_u32 d = tid; d < W * nw; d += blockDim.x) {
        qs[d] = (d < head_dim) ? qh[d] : 0.0f;
    }
    __syncthreads();
    const hs_u32 groups = blockDim.x / nw;
    const hs_u32 g = tid / nw;
    const hs_u32 c = tid % nw;
    const hs_u64 koff = (hs_u64)kvh * head_dim;
    float m = HS_NEG_INF;
    float l = 0.0f;
    float acc[HS_ATTN_W_MAX];
#pragma unroll
    for (hs_u32 i = 0; i < W; ++i) {
        acc[i] = 0.0f;
    }
    for (hs_u32 c0 = lo; c0 < hi; c0 += keys) {
        const hs_u32 j = c0 + kk;
        float s = HS_NEG_INF;
        if (L == 1) {
            if (j < hi) {
                const KV *kj = kc + (hs_u64)(j % slots) * kv_dim + koff;
                float a = 0.0f;
#pragma unroll 4
                for (hs_u32 k = 0; k < nw; ++k) {
                    float r[HS_ATTN_W_MAX];
                    attn_load(kj, W * k, head_dim, vec, r);
#pragma unroll
                    for (hs_u32 i = 0; i < W; ++i) {
                        a = fmaf(qs[W * k + i], r[i], a);
                    }
                }
                s = a * scale;
            }
        } else {
            float a = 0.0f;
            if (j < hi) {
                a = attn_key_part<KV, L>(kc + (hs_u64)(j % slots) * kv_dim + koff, qs, nw,
                                         head_dim, vec, sl);
            }
            // Every lane of the warp takes part (the key's L lanes are one aligned group of it).
#pragma unroll
            for (hs_u32 o = L / 2; o > 0; o >>= 1) {
                a += HS_SHFL_XOR(a, o);
            }
            if (j < hi) {
                s = a * scale;
            }
        }
        if (j < hi && softcap > 0.0f) {
            s = softcap * tanhf(s / softcap);
        }
        const float wmax = hs_warp_max(s);
        if (lane == 0) {
            red_m[warp] = wmax;
        }
        __syncthreads();
        float cmax = HS_NEG_INF;
        for (hs_u32 w = 0; w < nwarps; ++w) {
            cmax = fmaxf(cmax, red_m[w]);
        }
        const float m_new = fmaxf(m, cmax);
        const float p = (j < hi) ? expf(s - m_new) : 0.0f;
        // A key's weight once: from lane 0 of its L.
        if (sl == 0) {
            ps[kk] = p;
        }
        const float wsum = hs_warp_sum((sl == 0) ? p : 0.0f);
        if (lane == 0) {
            red_l[warp] = wsum;
        }
        __syncthreads();
        float csum = 0.0f;
        for (hs_u32 w = 0; w < nwarps; ++w) {
            csum += red_l[w];
        }
        // m = -inf before the first chunk: corr = 0 and the (zero) sums stay zero.
        const float corr = expf(m - m_new);
        l = l * corr + csum;
        m = m_new;
        if (g < groups) {
            const hs_u32 n = (hi - c0 < keys) ? hi - c0 : keys;
#pragma unroll
            for (hs_u32 i = 0; i < W; ++i) {
                acc[i] *= corr;
            }
#pragma unroll 8
            for (hs_u32 k = g; k < n; k += groups) {
                const float pk = ps[k];
                float r[HS_ATTN_W_MAX];
                attn_load(vc + (hs_u64)((c0 + k) % slots) * kv_dim + koff, W * c, head_dim, vec,
                          r);
#pragma unroll
                for (hs_u32 i = 0; i < W; ++i) {
                    acc[i] = fmaf(pk, r[i], acc[i]);
                }
            }
        }
        // The next chunk's first writes (red_m, then ps after a barrier) come after every
        // thread has passed this chunk's second barrier and read ps: no barrier needed here.
    }
    if (g < groups) {
#pragma unroll
        for (hs_u32 i = 0; i < W; ++i) {
            oacc[W * tid + i] = acc[i];
        }
    }
    __syncthreads();
    for (hs_u32 d = tid; d < head_dim; d += blockDim.x) {
        float v = 0.0f;
        for (hs_u32 k = 0; k < groups; ++k) {
            v += oacc[W * (k * nw) + d];
        }
        o[d] = v;
    }
    *m_out = m;
    *l_out = l;
    __syncthreads();
}

// attn_keys with the lanes a key for a head of head_dim elements: HS_ATTN_KEY_LANES_WIDE from
// HS_ATTN_WIDE_HEAD on, HS_ATTN_KEY_LANES below (attention.h).
template <typename KV>
__device__ __forceinline__ void attn_keys_for(const float *qh, const KV *kc, const KV *vc,
                                              hs_u32 kv_dim, hs_u32 kvh, hs_u32 head_dim,
                                              hs_u32 lo, hs_u32 hi, hs_u32 slots, float scale,
                                              float softcap, float *o, float *m_out,
                                              float *l_out) {
    if (head_dim >= HS_ATTN_WIDE_HEAD) {
        attn_keys<KV, HS_ATTN_KEY_LANES_WIDE>(qh, kc, vc, kv_dim, kvh, head_dim, lo, hi, slots,
                                              scale, softcap, o, m_out, l_out);
    } else {
        attn_keys<KV, HS_ATTN_KEY_LANES>(qh, kc, vc, kv_dim, kvh, head_dim, lo, hi, slots, scale,
                                         softcap, o, m_out, l_out);
    }
}

// Causal attention of one query row (token blockIdx.y, head blockIdx.x) over keys lo..pos0+t of
// its KV head (lo = 0, or pos0 + t + 1 - window for a sliding-window layer), by attn_keys.
// `kc`/`vc` point at the layer's cache: positions of kv_dim elements.
//
// sinks: attention sinks (attn_norm), or null. rows: as in infer_rope_kv_store (row t one decode
// token of sequence rows[2t] at position rows[2t + 1]), or null.
//
// With bs != 0 (a divisor of head_dim), the block then Q8-quantizes its head's output for the
// product that follows (hs_quantize_act's numbers and layout, without its launch; bs may carry
// HS_Q8_1_SUMS).
template <typename KV>
__device__ void infer_attention(const float *q, const KV *kc, const KV *vc, float *out,
                                hs_u32 n_heads, hs_u32 n_kv_heads, hs_u32 head_dim,
                                hs_u32 pos0, float scale, hs_u32 window, hs_u32 slots,
                                float softcap, const float *sinks, signed char *xq, float *xd,
                                hs_u32 bs_arg, const hs_u32 *rows) {
    __shared__ float o[HS_ATTN_MAX_HEAD_DIM];
    bool q8_1;
    const hs_u32 bs = hs_q8_args(bs_arg, &q8_1);
    const hs_u32 h = blockIdx.x;
    const hs_u32 t = blockIdx.y;
    const hs_u32 q_dim = n_heads * head_dim;
    const hs_u32 kvh = h / (n_heads / n_kv_heads);
    const hs_u32 n_keys =
        infer_seq_row(rows, t, slots, n_kv_heads * head_dim, kc, vc, pos0 + t) + 1;
    const hs_u32 lo = (window > 0 && n_keys > window) ? n_keys - window : 0;
    float m, l;
    attn_keys_for<KV>(q + (hs_u64)t * q_dim + (hs_u64)h * head_dim, kc, vc,
                      n_kv_heads * head_dim, kvh, head_dim, lo, n_keys, slots, scale, softcap, o,
                      &m, &l);
    const float inv = attn_norm(m, l, sinks, h);
    float *oh = out + (hs_u64)t * q_dim + (hs_u64)h * head_dim;
    for (hs_u32 d = threadIdx.x; d < head_dim; d += blockDim.x) {
        oh[d] = o[d] * inv;
    }
    if (bs != 0) {
        __syncthreads();
        const hs_u32 warp = threadIdx.x / warpSize;
        const hs_u32 nwarps = blockDim.x / warpSize;
        const hs_u64 e0 = (hs_u64)t * q_dim + (hs_u64)h * head_dim;
        for (hs_u32 b = warp; b < head_dim / bs; b += nwarps) {
            const hs_u64 e = e0 + (hs_u64)b * bs;
            hs_q8_block_warp(out + e, bs, xq + e, xd + 2 * (e / bs), 0, q8_1);
        }
    }
}

HS_KERNEL void hs_attention_f32(HS_TRACK_PARAMS, const float *q, const float *kc,
                                const float *vc, float *out, hs_u32 n_heads, hs_u32 n_kv_heads,
                                hs_u32 head_dim, hs_u32 pos0, float scale, hs_u32 window,
                                hs_u32 slots, float softcap, const float *sinks,
                                signed char *xq, float *xd, hs_u32 bs, const hs_u32 *pos_dev,
                                const hs_u32 *rows) {
    HS_BREADCRUMB();
    HS_POS_FROM_DEVICE();
    infer_attention<float>(q, kc, vc, out, n_heads, n_kv_heads, head_dim, pos0, scale, window,
                           slots, softcap, sinks, xq, xd, bs, rows);
}

HS_KERNEL void hs_attention_f16(HS_TRACK_PARAMS, const float *q, const unsigned short *kc,
                                const unsigned short *vc, float *out, hs_u32 n_heads,
                                hs_u32 n_kv_heads, hs_u32 head_dim, hs_u32 pos0, float scale,
                                hs_u32 window, hs_u32 slots, float softcap,
                                const float *sinks, signed char *xq, float *xd, hs_u32 bs,
                                const hs_u32 *pos_dev, const hs_u32 *rows) {
    HS_BREADCRUMB();
    HS_POS_FROM_DEVICE();
    infer_attention<unsigned short>(q, kc, vc, out, n_heads, n_kv_heads, head_dim, pos0, scale,
                                    window, slots, softcap, sinks, xq, xd, bs, rows);
}

// ---- Flash-decoding: one query row's attention split over the KV length -------------------------
//
// For one decode token (t = 0) over a long cache: block (h, c) of gridDim.y splits takes keys
// lo + c * len .. of head h (len = ceil((n_keys - lo) / gridDim.y), n_keys = pos0 + 1, read from
// pos_dev inside a replayed graph, so one grid serves every length of its bucket) by attn_keys,
// and writes its max, sum and unnormalised values to part:
// [(h * gridDim.y + c) * (head_dim + 2)] = m, l, acc[head_dim]. A split that gets no key writes
// l = 0. hs_attention_combine then merges the splits of each head. Where rows is not null (as in
// infer_rope_kv_store), blockIdx.z is the row, one decode token of another sequence, and its
// partial results follow the previous row's: [((t * n_heads + h) * gridDim.y + c) * ...].
template <typename KV>
__device__ void infer_attention_split(const float *q, const KV *kc, const KV *vc, float *part,
                                      hs_u32 n_heads, hs_u32 n_kv_heads, hs_u32 head_dim,
                                      hs_u32 pos0, float scale, hs_u32 window, hs_u32 slots,
                                      float softcap, const hs_u32 *rows) {
    __shared__ float o[HS_ATTN_MAX_HEAD_DIM];
    const hs_u32 h = blockIdx.x;
    const hs_u32 c = blockIdx.y;
    const hs_u32 t = blockIdx.z;
    const hs_u32 kvh = h / (n_heads / n_kv_heads);
    const hs_u32 n_keys = infer_seq_row(rows, t, slots, n_kv_heads * head_dim, kc, vc, pos0) + 1;
    const hs_u32 lo0 = (window > 0 && n_keys > window) ? n_keys - window : 0;
    const hs_u32 len = (n_keys - lo0 + gridDim.y - 1) / gridDim.y;
    const hs_u32 lo = lo0 + c * len;
    const hs_u32 hi = (lo + len < n_keys) ? lo + len : n_keys;
    float m, l;
    attn_keys_for<KV>(q + ((hs_u64)t * n_heads + h) * head_dim, kc, vc, n_kv_heads * head_dim,
                      kvh, head_dim, lo, hi, slots, scale, softcap, o, &m, &l);
    float *ph = part + (((hs_u64)t * n_heads + h) * gridDim.y + c) * (head_dim + 2);
    if (threadIdx.x == 0) {
        ph[0] = m;
        ph[1] = l;
    }
    for (hs_u32 d = threadIdx.x; d < head_dim; d += blockDim.x) {
        ph[2 + d] = o[d];
    }
}

HS_KERNEL void hs_attention_split_f32(HS_TRACK_PARAMS, const float *q, const float *kc,
                                      const float *vc, float *part, hs_u32 n_heads,
                                      hs_u32 n_kv_heads, hs_u32 head_dim, hs_u32 pos0,
                                      float scale, hs_u32 window, hs_u32 slots, float softcap,
                                      const hs_u32 *pos_dev, const hs_u32 *rows) {
    HS_BREADCRUMB();
    HS_POS_FROM_DEVICE();
    infer_attention_split<float>(q, kc, vc, part, n_heads, n_kv_heads, head_dim, pos0, scale,
                                 window, slots, softcap, rows);
}

HS_KERNEL void hs_attention_split_f16(HS_TRACK_PARAMS, const float *q, const unsigned short *kc,
                                      const unsigned short *vc, float *part, hs_u32 n_heads,
                                      hs_u32 n_kv_heads, hs_u32 head_dim, hs_u32 pos0,
                                      float scale, hs_u32 window, hs_u32 slots, float softcap,
                                      const hs_u32 *pos_dev, const hs_u32 *rows) {
    HS_BREADCRUMB();
    HS_POS_FROM_DEVICE();
    infer_attention_split<unsigned short>(q, kc, vc, part, n_heads, n_kv_heads, head_dim, pos0,
                                          scale, window, slots, softcap, rows);
}

// Merges the `splits` partial results of head blockIdx.x of row blockIdx.y (hs_attention_split_*;
// gridDim.x heads a row) into out, the head's attention sink (sinks not null) counted in as one
// more split of sum 1 and no value, and, with bs != 0, Q8-quantizes the head's output as
// infer_attention does. Thread c reads split c's max and sum once and keeps its weight
// exp(m_c - max) in shared memory, so that each output element is a sum of independent loads
// (every thread walking every split's max and sum, each weight an exponential per element, took
// 10 us a Gemma 3 layer on the H100 at 16 splits); the sums run in split order, as before.
HS_KERNEL void hs_attention_combine(HS_TRACK_PARAMS, const float *part, float *out,
                                    hs_u32 head_dim, hs_u32 splits, const float *sinks,
                                    signed char *xq, float *xd, hs_u32 bs_arg) {
    HS_BREADCRUMB();
    __shared__ float sm[HS_ATTN_MAX_SPLITS];
    __shared__ float sw[HS_ATTN_MAX_SPLITS];
    __shared__ float sl[HS_ATTN_MAX_SPLITS];
    bool q8_1;
    const hs_u32 bs = hs_q8_args(bs_arg, &q8_1);
    const hs_u32 h = blockIdx.x;
    const hs_u64 row_head = (hs_u64)blockIdx.y * gridDim.x + h;
    const hs_u64 stride = head_dim + 2;
    const float *ph = part + row_head * splits * stride;
    for (hs_u32 c = threadIdx.x; c < splits; c += blockDim.x) {
        const float l = ph[c * stride + 1];
        sl[c] = l;
        sm[c] = (l > 0.0f) ? ph[c * stride] : HS_NEG_INF;
    }
    __syncthreads();
    float mx = HS_NEG_INF;
    for (hs_u32 c = 0; c < splits; ++c) {
        mx = fmaxf(mx, sm[c]);
    }
    if (sinks != 0) {
        mx = fmaxf(mx, sinks[h]);
    }
    __syncthreads();
    for (hs_u32 c = threadIdx.x; c < splits; c += blockDim.x) {
        sw[c] = (sl[c] > 0.0f) ? expf(sm[c] - mx) : 0.0f;
    }
    __syncthreads();
    // An empty split (l = 0, its values 0: attn_keys over no key) has weight 0 and adds 0.
    float total = 0.0f;
    for (hs_u32 c = 0; c < splits; ++c) {
        total += sl[c] * sw[c];
    }
    if (sinks != 0) {
        total += expf(sinks[h] - mx);
    }
    const float inv = 1.0f / total;
    float *oh = out + row_head * head_dim;
    for (hs_u32 d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll 8
        for (hs_u32 c = 0; c < splits; ++c) {
            o += ph[c * stride + 2 + d] * sw[c];
        }
        oh[d] = o * inv;
    }
    if (bs != 0) {
        __syncthreads();
        const hs_u32 warp = threadIdx.x / warpSize;
        const hs_u32 nwarps = blockDim.x / warpSize;
        const hs_u64 e0 = row_head * head_dim;
        for (hs_u32 b = warp; b < head_dim / bs; b += nwarps) {
            const hs_u64 e = e0 + (hs_u64)b * bs;
            hs_q8_block_warp(out + e, bs, xq + e, xd + 2 * (e / bs), 0, q8_1);
        }
    }
}
