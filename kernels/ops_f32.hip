// Plain f32 building blocks of one transformer decode step (RMS norm, matrix-vector product,
// residual add, SiLU gate). The selftest strings a few hundred of them together in the shape of a
// SmolLM2-135M decode step to measure what op tracking costs on a launch-bound sequence.

// The sum of v over the block: shuffles within each warp (wave32 or wave64: warpSize decides),
// then one partial per warp through `scratch` (at least blockDim.x / warpSize floats).
// blockDim.x is a multiple of warpSize. Called once per kernel (scratch is not reset).
__device__ float hs_block_sum(float v, float *scratch) {
    for (int o = warpSize / 2; o > 0; o >>= 1) {
        v += HS_SHFL_XOR(v, o);
    }
    const int lane = threadIdx.x % warpSize;
    const int warp = threadIdx.x / warpSize;
    if (lane == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    const int nwarps = blockDim.x / warpSize;
    if (warp == 0) {
        v = (lane < nwarps) ? scratch[lane] : 0.0f;
        for (int o = warpSize / 2; o > 0; o >>= 1) {
            v += HS_SHFL_XOR(v, o);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        scratch[0] = v;
    }
    __syncthreads();
    return scratch[0];
}

// One block: y = x / sqrt(mean(x^2) + eps) * w.
HS_KERNEL void hs_rmsnorm_f32(HS_TRACK_PARAMS, const float *x, const float *w, float *y, hs_u32 n,
                              float eps) {
    HS_BREADCRUMB();
    __shared__ float s[32];
    float acc = 0.0f;
    for (hs_u32 i = threadIdx.x; i < n; i += blockDim.x) {
        acc += x[i] * x[i];
    }
    const float total = hs_block_sum(acc, s);
    const float scale = rsqrtf(total / (float)n + eps);
    for (hs_u32 i = threadIdx.x; i < n; i += blockDim.x) {
        y[i] = x[i] * scale * w[i];
    }
}

// One block per row of a row-major rows x cols matrix: y[r] = W[r, :] . x
HS_KERNEL void hs_matvec_f32(HS_TRACK_PARAMS, const float *W, const float *x, float *y, hs_u32 rows,
                             hs_u32 cols) {
    HS_BREADCRUMB();
    __shared__ float s[32];
    const hs_u32 r = blockIdx.x;
    if (r >= rows) {
        return;
    }
    const float *wr = W + (hs_u64)r * cols;
    float acc = 0.0f;
    for (hs_u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        acc += wr[c] * x[c];
    }
    const float total = hs_block_sum(acc, s);
    if (threadIdx.x == 0) {
        y[r] = total;
    }
}

// y += x
HS_KERNEL void hs_add_f32(HS_TRACK_PARAMS, float *y, const float *x, hs_u32 n) {
    HS_BREADCRUMB();
    const hs_u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] += x[i];
    }
}

// y = silu(g) * u
HS_KERNEL void hs_silu_mul_f32(HS_TRACK_PARAMS, const float *g, const float *u, float *y, hs_u32 n) {
    HS_BREADCRUMB();
    const hs_u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = g[i];
        y[i] = v / (1.0f + expf(-v)) * u[i];
    }
}
