// The element-wise and per-row ops of the llama-family forward pass (gpu::compute): RMS norm,
// bias and residual adds, SwiGLU, RoPE, the KV-cache store and causal attention with GQA over an
// f32 or f16 cache. Each computes what the CPU backend (src/gpu/cpu/backend.rs) computes, in the
// same order where rounding depends on it (RoPE angles), so that the two agree to f32 rounding.

#define HS_ROPE_MAX_PAIRS 256
#define HS_ATTN_MAX_HEAD_DIM 256
#define HS_ATTN_THREADS 128
// Head dimensions per lane: HS_ATTN_MAX_HEAD_DIM / the smallest warp (32).
#define HS_ATTN_DIMS_PER_LANE 8
// Warps per attention block: HS_ATTN_THREADS / the smallest warp (32).
#define HS_ATTN_MAX_WARPS 4
// -inf without <math.h> (nvrtc and hiprtc get no includes).
#define HS_NEG_INF __int_as_float(0xff800000)

// The sum of v over the block, every thread gets it. blockDim.x is a multiple of warpSize;
// `scratch` holds at least blockDim.x / warpSize floats and is reused after the call returns.
__device__ float infer_block_sum(float v, float *scratch) {
    v = hs_warp_sum(v);
    const int lane = threadIdx.x % warpSize;
    const int warp = threadIdx.x / warpSize;
    if (lane == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    const int nwarps = blockDim.x / warpSize;
    float total = 0.0f;
    for (int w = 0; w < nwarps; ++w) {
        total += scratch[w];
    }
    __syncthreads();
    return total;
}

// One block per row: y = x / sqrt(mean(x^2) + eps) * w.
HS_KERNEL void hs_rms_norm_rows(HS_TRACK_PARAMS, const float *x, const float *w, float *y,
                                hs_u32 dim, float eps) {
    HS_BREADCRUMB();
    __shared__ float s[64];
    const float *xr = x + (hs_u64)blockIdx.x * dim;
    float *yr = y + (hs_u64)blockIdx.x * dim;
    float acc = 0.0f;
    for (hs_u32 i = threadIdx.x; i < dim; i += blockDim.x) {
        acc += xr[i] * xr[i];
    }
    const float total = infer_block_sum(acc, s);
    const float scale = 1.0f / sqrtf(total / (float)dim + eps);
    for (hs_u32 i = threadIdx.x; i < dim; i += blockDim.x) {
        yr[i] = xr[i] * scale * w[i];
    }
}

// x[i] += b[i % width] over n elements.
HS_KERNEL void hs_add_bias_rows(HS_TRACK_PARAMS, float *x, const float *b, hs_u32 width,
                                hs_u64 n) {
    HS_BREADCRUMB();
    const hs_u64 stride = (hs_u64)gridDim.x * blockDim.x;
    for (hs_u64 i = (hs_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        x[i] += b[i % width];
    }
}

// acc += x over n elements.
HS_KERNEL void hs_add_inplace(HS_TRACK_PARAMS, float *acc, const float *x, hs_u64 n) {
    HS_BREADCRUMB();
    const hs_u64 stride = (hs_u64)gridDim.x * blockDim.x;
    for (hs_u64 i = (hs_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        acc[i] += x[i];
    }
}

// gate = silu(gate) * up over n elements.
HS_KERNEL void hs_swiglu_inplace(HS_TRACK_PARAMS, float *gate, const float *up, hs_u64 n) {
    HS_BREADCRUMB();
    const hs_u64 stride = (hs_u64)gridDim.x * blockDim.x;
    for (hs_u64 i = (hs_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// One block per token row of n_heads heads of head_dim. The angle of pair i at position p is
// p * freq_scale * theta_scale^i (/ factors[i]), the power built by repeated multiplication in
// f32 exactly as the CPU backend (and ggml) builds it; sin and cos are taken in double, because
// the fast single-precision ones lose accuracy for angles of thousands of radians.
HS_KERNEL void hs_rope(HS_TRACK_PARAMS, float *x, hs_u32 n_heads, hs_u32 head_dim, hs_u32 n_rot,
                       hs_u32 pos0, float freq_scale, float theta_scale, const float *factors,
                       hs_u32 neox) {
    HS_BREADCRUMB();
    __shared__ float cs[HS_ROPE_MAX_PAIRS];
    __shared__ float sn[HS_ROPE_MAX_PAIRS];
    const hs_u32 half = n_rot / 2;
    const hs_u32 t = blockIdx.x;
    for (hs_u32 i = threadIdx.x; i < half && i < HS_ROPE_MAX_PAIRS; i += blockDim.x) {
        float theta = (float)(pos0 + t) * freq_scale;
        for (hs_u32 k = 0; k < i; ++k) {
            theta *= theta_scale;
        }
        if (factors != 0) {
            theta = HS_DIV_RN(theta, factors[i]);
        }
        cs[i] = (float)cos((double)theta);
        sn[i] = (float)sin((double)theta);
    }
    __syncthreads();
    float *row = x + (hs_u64)t * n_heads * head_dim;
    const hs_u32 pairs = n_heads * half;
    for (hs_u32 idx = threadIdx.x; idx < pairs; idx += blockDim.x) {
        const hs_u32 h = idx / half;
        const hs_u32 i = idx % half;
        float *head = row + (hs_u64)h * head_dim;
        const hs_u32 a = neox ? i : 2 * i;
        const hs_u32 b = neox ? i + half : 2 * i + 1;
        const float x0 = head[a];
        const float x1 = head[b];
        head[a] = x0 * cs[i] - x1 * sn[i];
        head[b] = x0 * sn[i] + x1 * cs[i];
    }
}

// cache[dst + i] = src[i] for the keys and the values of n elements (f32 cache).
HS_KERNEL void hs_kv_store_f32(HS_TRACK_PARAMS, const float *k, const float *v, float *kc,
                               float *vc, hs_u64 dst, hs_u64 n) {
    HS_BREADCRUMB();
    const hs_u64 stride = (hs_u64)gridDim.x * blockDim.x;
    for (hs_u64 i = (hs_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        kc[dst + i] = k[i];
        vc[dst + i] = v[i];
    }
}

// As hs_kv_store_f32 into an f16 cache (rounded to nearest even).
HS_KERNEL void hs_kv_store_f16(HS_TRACK_PARAMS, const float *k, const float *v,
                               unsigned short *kc, unsigned short *vc, hs_u64 dst, hs_u64 n) {
    HS_BREADCRUMB();
    const hs_u64 stride = (hs_u64)gridDim.x * blockDim.x;
    for (hs_u64 i = (hs_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        kc[dst + i] = hs_float_to_half(k[i]);
        vc[dst + i] = hs_float_to_half(v[i]);
    }
}

__device__ __forceinline__ float infer_kv_load(const float *p, hs_u64 i) { return p[i]; }
__device__ __forceinline__ float infer_kv_load(const unsigned short *p, hs_u64 i) {
    return hs_half_to_float(p[i]);
}

// Causal attention of one query row (token blockIdx.y, head blockIdx.x) over keys 0..pos0+t of
// its KV head. Each warp takes every nwarps-th key with an online softmax (running max, sum and
// weighted values, lanes splitting the head's dimensions); the warps' partial results are then
// merged. `kc`/`vc` point at the layer's cache: positions of kv_dim elements.
template <typename KV>
__device__ void infer_attention(const float *q, const KV *kc, const KV *vc, float *out,
                                hs_u32 n_heads, hs_u32 n_kv_heads, hs_u32 head_dim,
                                hs_u32 pos0, float scale) {
    __shared__ float qs[HS_ATTN_MAX_HEAD_DIM];
    __shared__ float wm[HS_ATTN_MAX_WARPS];
    __shared__ float wl[HS_ATTN_MAX_WARPS];
    __shared__ float wacc[HS_ATTN_MAX_WARPS][HS_ATTN_MAX_HEAD_DIM];
    const hs_u32 h = blockIdx.x;
    const hs_u32 t = blockIdx.y;
    const hs_u32 q_dim = n_heads * head_dim;
    const hs_u32 kv_dim = n_kv_heads * head_dim;
    const hs_u32 kvh = h / (n_heads / n_kv_heads);
    const hs_u32 n_keys = pos0 + t + 1;
    const float *qh = q + (hs_u64)t * q_dim + (hs_u64)h * head_dim;
    for (hs_u32 d = threadIdx.x; d < head_dim; d += blockDim.x) {
        qs[d] = qh[d];
    }
    __syncthreads();
    const hs_u32 lane = threadIdx.x % warpSize;
    const hs_u32 warp = threadIdx.x / warpSize;
    const hs_u32 nwarps = blockDim.x / warpSize;
    float m = HS_NEG_INF;
    float l = 0.0f;
    float acc[HS_ATTN_DIMS_PER_LANE];
#pragma unroll
    for (int i = 0; i < HS_ATTN_DIMS_PER_LANE; ++i) {
        acc[i] = 0.0f;
    }
    for (hs_u32 j = warp; j < n_keys; j += nwarps) {
        const KV *kj = kc + (hs_u64)j * kv_dim + (hs_u64)kvh * head_dim;
        const KV *vj = vc + (hs_u64)j * kv_dim + (hs_u64)kvh * head_dim;
        float part = 0.0f;
#pragma unroll
        for (int i = 0; i < HS_ATTN_DIMS_PER_LANE; ++i) {
            const hs_u32 d = lane + i * warpSize;
            if (d < head_dim) {
                part += qs[d] * infer_kv_load(kj, d);
            }
        }
        const float s = hs_warp_sum(part) * scale;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);
        const float p = expf(s - m_new);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < HS_ATTN_DIMS_PER_LANE; ++i) {
            const hs_u32 d = lane + i * warpSize;
            if (d < head_dim) {
                acc[i] = acc[i] * corr + p * infer_kv_load(vj, d);
            }
        }
        m = m_new;
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < HS_ATTN_DIMS_PER_LANE; ++i) {
        const hs_u32 d = lane + i * warpSize;
        if (d < head_dim) {
            wacc[warp][d] = acc[i];
        }
    }
    __syncthreads();
    float mx = HS_NEG_INF;
    for (hs_u32 w = 0; w < nwarps; ++w) {
        mx = fmaxf(mx, wm[w]);
    }
    float total = 0.0f;
    for (hs_u32 w = 0; w < nwarps; ++w) {
        // A warp that saw no key has l = 0 (and m = -inf): it contributes nothing.
        total += (wl[w] > 0.0f) ? wl[w] * expf(wm[w] - mx) : 0.0f;
    }
    const float inv = 1.0f / total;
    float *oh = out + (hs_u64)t * q_dim + (hs_u64)h * head_dim;
    for (hs_u32 d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.0f;
        for (hs_u32 w = 0; w < nwarps; ++w) {
            o += (wl[w] > 0.0f) ? wacc[w][d] * expf(wm[w] - mx) : 0.0f;
        }
        oh[d] = o * inv;
    }
}

HS_KERNEL void hs_attention_f32(HS_TRACK_PARAMS, const float *q, const float *kc,
                                const float *vc, float *out, hs_u32 n_heads, hs_u32 n_kv_heads,
                                hs_u32 head_dim, hs_u32 pos0, float scale) {
    HS_BREADCRUMB();
    infer_attention<float>(q, kc, vc, out, n_heads, n_kv_heads, head_dim, pos0, scale);
}

HS_KERNEL void hs_attention_f16(HS_TRACK_PARAMS, const float *q, const unsigned short *kc,
                                const unsigned short *vc, float *out, hs_u32 n_heads,
                                hs_u32 n_kv_heads, hs_u32 head_dim, hs_u32 pos0, float scale) {
    HS_BREADCRUMB();
    infer_attention<unsigned short>(q, kc, vc, out, n_heads, n_kv_heads, head_dim, pos0, scale);
}
