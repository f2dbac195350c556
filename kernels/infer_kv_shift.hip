// The context shift (gpu::compute::kv_shift): kept rows of the KV cache move down and their keys
// are rotated by the shift's delta (RoPE is a rotation linear in the position, so this gives the
// keys of their new positions). The angles are built as hs_rope and the CPU backend build them:
// delta * freq_scale, repeated multiplication by theta_scale, division by the llama-3 factor.
//
// One block per (row, layer): grid (n rows, n_layers). The host launches chunks of at most
// (src - dst) rows, so that no block of a launch writes a row another block of it reads.

#define HS_SHIFT_MAX_PAIRS 256

__device__ __forceinline__ float shift_load(const float *p, hs_u64 i) { return p[i]; }
__device__ __forceinline__ float shift_load(const unsigned short *p, hs_u64 i) {
    return hs_half_to_float(p[i]);
}
__device__ __forceinline__ void shift_store(float *p, hs_u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void shift_store(unsigned short *p, hs_u64 i, float v) {
    p[i] = hs_float_to_half(v);
}

template <typename KV>
__device__ void infer_kv_shift(KV *kc, KV *vc, hs_u64 layer_stride, hs_u32 kv_dim,
                               hs_u32 head_dim, hs_u32 n_rot, hs_u32 dst, hs_u32 src,
                               float delta, float freq_scale, float theta_scale,
                               const float *factors, hs_u32 neox) {
    __shared__ float cs[HS_SHIFT_MAX_PAIRS];
    __shared__ float sn[HS_SHIFT_MAX_PAIRS];
    const hs_u32 half = n_rot / 2;
    for (hs_u32 i = threadIdx.x; i < half && i < HS_SHIFT_MAX_PAIRS; i += blockDim.x) {
        float theta = delta * freq_scale;
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
    const hs_u64 base = (hs_u64)blockIdx.y * layer_stride;
    const hs_u64 from = base + (hs_u64)(src + blockIdx.x) * kv_dim;
    const hs_u64 to = base + (hs_u64)(dst + blockIdx.x) * kv_dim;
    // Values and the unrotated tail of each key head: a plain move.
    for (hs_u32 d = threadIdx.x; d < kv_dim; d += blockDim.x) {
        shift_store(vc, to + d, shift_load(vc, from + d));
        if (d % head_dim >= n_rot) {
            shift_store(kc, to + d, shift_load(kc, from + d));
        }
    }
    // Rotated pairs of the keys.
    const hs_u32 pairs = (kv_dim / head_dim) * half;
    for (hs_u32 idx = threadIdx.x; idx < pairs; idx += blockDim.x) {
        const hs_u32 h = idx / half;
        const hs_u32 i = idx % half;
        const hs_u64 head = (hs_u64)h * head_dim;
        const hs_u32 a = neox ? i : 2 * i;
        const hs_u32 b = neox ? i + half : 2 * i + 1;
        const float x0 = shift_load(kc, from + head + a);
        const float x1 = shift_load(kc, from + head + b);
        shift_store(kc, to + head + a, x0 * cs[i] - x1 * sn[i]);
        shift_store(kc, to + head + b, x0 * sn[i] + x1 * cs[i]);
    }
}

HS_KERNEL void hs_kv_shift_f32(HS_TRACK_PARAMS, float *kc, float *vc, hs_u64 layer_stride,
                               hs_u32 kv_dim, hs_u32 head_dim, hs_u32 n_rot, hs_u32 dst,
                               hs_u32 src, float delta, float freq_scale, float theta_scale,
                               const float *factors, hs_u32 neox) {
    HS_BREADCRUMB();
    infer_kv_shift(kc, vc, layer_stride, kv_dim, head_dim, n_rot, dst, src, delta, freq_scale,
                   theta_scale, factors, neox);
}

HS_KERNEL void hs_kv_shift_f16(HS_TRACK_PARAMS, unsigned short *kc, unsigned short *vc,
                               hs_u64 layer_stride, hs_u32 kv_dim, hs_u32 head_dim, hs_u32 n_rot,
                               hs_u32 dst, hs_u32 src, float delta, float freq_scale,
                               float theta_scale, const float *factors, hs_u32 neox) {
    HS_BREADCRUMB();
    infer_kv_shift(kc, vc, layer_stride, kv_dim, head_dim, n_rot, dst, src, delta, freq_scale,
                   theta_scale, factors, neox);
}
