// The element-wise and per-row ops of the llama-family forward pass (gpu::compute::ops): RMS norm,
// bias and residual adds, SwiGLU, RoPE, and the Q8 quantization of activations for the products
// (hs_quantize_act, hs_quantize_act_f16; the RMS norm can quantize its own output). Each computes what the CPU backend (src/gpu/cpu/backend.rs)
// computes, in the same order where rounding depends on it (RoPE angles), so that the two agree to
// f32 rounding.


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

// Elements of a row a thread loads together in the norms' second pass.
#define HS_NORM_BATCH 8

// One block per row: y = x / sqrt(mean(x^2) + eps) * w.
HS_KERNEL void hs_rms_norm_rows(HS_TRACK_PARAMS, const float *x, const float *w, float *y,
                                hs_u32 dim, float eps) {
    HS_BREADCRUMB();
    __shared__ float s[64];
    const float *xr = x + (hs_u64)blockIdx.x * dim;
    float *yr = y + (hs_u64)blockIdx.x * dim;
    float acc = 0.0f;
    // Unrolled so that the loads are in flight together; the additions keep their order.
#pragma unroll 8
    for (hs_u32 i = threadIdx.x; i < dim; i += blockDim.x) {
        acc += xr[i] * xr[i];
    }
    const float total = infer_block_sum(acc, s);
    const float scale = 1.0f / sqrtf(total / (float)dim + eps);
    // A thread's elements HS_NORM_BATCH at a time, every load of a batch before its stores (the
    // stores may alias the loads for all the compiler knows: element by element, each was a
    // memory round trip of its own).
    for (hs_u32 i0 = threadIdx.x; i0 < dim; i0 += HS_NORM_BATCH * blockDim.x) {
        float xv[HS_NORM_BATCH];
        float wv[HS_NORM_BATCH];
#pragma unroll
        for (hs_u32 k = 0; k < HS_NORM_BATCH; ++k) {
            const hs_u32 i = i0 + k * blockDim.x;
            if (i < dim) {
                xv[k] = xr[i];
                wv[k] = w[i];
            }
        }
#pragma unroll
        for (hs_u32 k = 0; k < HS_NORM_BATCH; ++k) {
            const hs_u32 i = i0 + k * blockDim.x;
            if (i < dim) {
                yr[i] = xv[k] * scale * wv[k];
            }
        }
    }
}

// One block per row: acc += x / sqrt(mean(x^2) + eps) * w (Gemma's norm after a block, with the
// residual add in the same launch: hs_rms_norm_rows then hs_add_inplace, the same numbers).
HS_KERNEL void hs_rms_norm_add_rows(HS_TRACK_PARAMS, const float *x, const float *w, float *acc,
                                    hs_u32 dim, float eps) {
    HS_BREADCRUMB();
    __shared__ float s[64];
    const float *xr = x + (hs_u64)blockIdx.x * dim;
    float *ar = acc + (hs_u64)blockIdx.x * dim;
    float sq = 0.0f;
#pragma unroll 8
    for (hs_u32 i = threadIdx.x; i < dim; i += blockDim.x) {
        sq += xr[i] * xr[i];
    }
    const float total = infer_block_sum(sq, s);
    const float scale = 1.0f / sqrtf(total / (float)dim + eps);
    // In batches, loads before stores, as hs_rms_norm_rows (5.8 us a launch on an H100 at
    // Gemma 3 1B's 1152 element by element: a memory round trip per element of a thread).
    for (hs_u32 i0 = threadIdx.x; i0 < dim; i0 += HS_NORM_BATCH * blockDim.x) {
        float xv[HS_NORM_BATCH];
        float wv[HS_NORM_BATCH];
        float av[HS_NORM_BATCH];
#pragma unroll
        for (hs_u32 k = 0; k < HS_NORM_BATCH; ++k) {
            const hs_u32 i = i0 + k * blockDim.x;
            if (i < dim) {
                xv[k] = xr[i];
                wv[k] = w[i];
                av[k] = ar[i];
            }
        }
#pragma unroll
        for (hs_u32 k = 0; k < HS_NORM_BATCH; ++k) {
            const hs_u32 i = i0 + k * blockDim.x;
            if (i < dim) {
                ar[i] = av[k] + xv[k] * scale * wv[k];
            }
        }
    }
}

// Lane l's elements l, l + warpSize, ... of Q8 block b of the row xr and of w (0 beyond bs, and
// for b >= nb).
__device__ __forceinline__ void infer_norm_block_load(const float *xr, const float *w, hs_u32 b,
                                                      hs_u32 nb, hs_u32 bs, float *xv,
                                                      float *wv) {
    const hs_u32 lane = threadIdx.x % warpSize;
#pragma unroll
    for (int k = 0; k < HS_Q8_MAX_BLOCK / 32; ++k) {
        const hs_u32 i = lane + k * warpSize;
        const bool in = b < nb && i < bs;
        xv[k] = in ? xr[(hs_u64)b * bs + i] : 0.0f;
        wv[k] = in ? w[(hs_u64)b * bs + i] : 0.0f;
    }
}

// As hs_rms_norm_rows, then the row's Q8 quantization for `bs`-element blocks (the input of the
// products that follow: hs_quantize_act's numbers, without its launch; bs may carry
// HS_Q8_1_SUMS). dim is a multiple of bs.
// Grid (rows, slices): every block of a row sums the row's squares (the same order as
// hs_rms_norm_rows, so every block gets the same scale), then normalises and quantizes its
// slice of the row's Q8 blocks, a warp per Q8 block, from registers (hs_q8_block_warp_regs).
// A warp loads its first Q8 block's elements and weights before the sum of squares, so that
// their memory round trip overlaps the sum's. One block per row left a decode step's norm a
// chain of dependent memory round trips (18-22 us on an H100 at dim 4096).
HS_KERNEL void hs_rms_norm_q8(HS_TRACK_PARAMS, const float *x, const float *w, float *y,
                              signed char *xq, float *xd, hs_u32 dim, float eps,
                              hs_u32 bs_arg) {
    HS_BREADCRUMB();
    __shared__ float s[64];
    bool q8_1;
    const hs_u32 bs = hs_q8_args(bs_arg, &q8_1);
    const float *xr = x + (hs_u64)blockIdx.x * dim;
    float *yr = y + (hs_u64)blockIdx.x * dim;
    const hs_u32 lane = threadIdx.x % warpSize;
    const hs_u32 nwarps = blockDim.x / warpSize;
    const hs_u32 nb = dim / bs;
    const hs_u64 b0 = (hs_u64)blockIdx.x * nb;
    const hs_u32 first = blockIdx.y * nwarps + threadIdx.x / warpSize;
    float xv[HS_Q8_MAX_BLOCK / 32];
    float wv[HS_Q8_MAX_BLOCK / 32];
    infer_norm_block_load(xr, w, first, nb, bs, xv, wv);
    float acc = 0.0f;
    // Unrolled so that the loads are in flight together; the additions keep their order.
#pragma unroll 8
    for (hs_u32 i = threadIdx.x; i < dim; i += blockDim.x) {
        acc += xr[i] * xr[i];
    }
    const float total = infer_block_sum(acc, s);
    const float scale = 1.0f / sqrtf(total / (float)dim + eps);
    for (hs_u32 b = first; b < nb; b += gridDim.y * nwarps) {
        if (b != first) {
            infer_norm_block_load(xr, w, b, nb, bs, xv, wv);
        }
        float *yb = yr + (hs_u64)b * bs;
#pragma unroll
        for (int k = 0; k < HS_Q8_MAX_BLOCK / 32; ++k) {
            const hs_u32 i = lane + k * warpSize;
            xv[k] = xv[k] * scale * wv[k];
            if (i < bs) {
                yb[i] = xv[k];
            }
        }
        hs_q8_block_warp_regs(xv, bs, xq + (b0 + b) * bs, xd + 2 * (b0 + b), 0, q8_1);
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

// gate = gelu(gate) * up over n elements, GELU in ggml's tanh form (ggml_gelu_f32).
HS_KERNEL void hs_geglu_inplace(HS_TRACK_PARAMS, float *gate, const float *up, hs_u64 n) {
    HS_BREADCRUMB();
    const hs_u64 stride = (hs_u64)gridDim.x * blockDim.x;
    for (hs_u64 i = (hs_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float g = gate[i];
        gate[i] = 0.5f * g * (1.0f + tanhf(0.7978846f * g * (1.0f + 0.044715f * g * g))) * up[i];
    }
}

// x *= s over n elements.
HS_KERNEL void hs_scale_inplace(HS_TRACK_PARAMS, float *x, float s, hs_u64 n) {
    HS_BREADCRUMB();
    const hs_u64 stride = (hs_u64)gridDim.x * blockDim.x;
    for (hs_u64 i = (hs_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        x[i] *= s;
    }
}

// One block per token row of n_heads heads of head_dim (hs_rope_row, in the prelude).
// pos_dev, when not null, holds the position instead of pos0 (a step replayed as a graph).
HS_KERNEL void hs_rope(HS_TRACK_PARAMS, float *x, hs_u32 n_heads, hs_u32 head_dim, hs_u32 n_rot,
                       hs_u32 pos0, float freq_scale, float theta_scale, const float *factors,
                       hs_u32 neox, float mscale, float ext_factor, float corr_lo, float corr_hi,
                       const hs_u32 *pos_dev) {
    HS_BREADCRUMB();
    if (pos_dev != 0) {
        pos0 = *pos_dev;
    }
    __shared__ float cs[HS_ROPE_MAX_PAIRS];
    __shared__ float sn[HS_ROPE_MAX_PAIRS];
    hs_rope_row(x + (hs_u64)blockIdx.x * n_heads * head_dim, n_heads, head_dim, n_rot,
                pos0 + blockIdx.x, freq_scale, theta_scale, factors, neox, mscale, ext_factor,
                corr_lo, corr_hi, cs, sn);
}

// The values of one decode step replayed as a graph (src/gpu/handle/graph.rs), written before the
// replay into its step block: the replay's breadcrumb base and the host breadcrumb's address (read
// by HS_BREADCRUMB inside the graph), the position the graph's kernels read, and the token the
// embedding reads (when tok is not null).
HS_KERNEL void hs_graph_step(HS_TRACK_PARAMS, hs_u64 *block, hs_u64 crumb_base, hs_u64 host_crumb,
                             hs_u32 pos, hs_u32 *tok, hs_u32 token) {
    HS_BREADCRUMB();
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        block[0] = crumb_base;
        block[1] = host_crumb;
        ((hs_u32 *)block)[4] = pos;
        if (tok != 0) {
            *tok = token;
        }
    }
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
