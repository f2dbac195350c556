// Plain f32 building blocks of one transformer decode step (RMS norm, matrix-vector product,
// residual add, SiLU gate). The selftest strings a few hundred of them together in the shape of a
// SmolLM2-135M decode step to measure what op tracking costs on a launch-bound sequence.

#define HS_OPS_THREADS 256

// One block: y = x / sqrt(mean(x^2) + eps) * w.
HS_KERNEL void hs_rmsnorm_f32(HS_TRACK_PARAMS, const float *x, const float *w, float *y, hs_u32 n,
                              float eps) {
    HS_BREADCRUMB();
    __shared__ float s[HS_OPS_THREADS];
    float acc = 0.0f;
    for (hs_u32 i = threadIdx.x; i < n; i += blockDim.x) {
        acc += x[i] * x[i];
    }
    s[threadIdx.x] = acc;
    __syncthreads();
    for (hs_u32 st = blockDim.x / 2; st > 0; st >>= 1) {
        if (threadIdx.x < st) {
            s[threadIdx.x] += s[threadIdx.x + st];
        }
        __syncthreads();
    }
    const float scale = rsqrtf(s[0] / (float)n + eps);
    for (hs_u32 i = threadIdx.x; i < n; i += blockDim.x) {
        y[i] = x[i] * scale * w[i];
    }
}

// One block per row of a row-major rows x cols matrix: y[r] = W[r, :] . x
HS_KERNEL void hs_matvec_f32(HS_TRACK_PARAMS, const float *W, const float *x, float *y, hs_u32 rows,
                             hs_u32 cols) {
    HS_BREADCRUMB();
    __shared__ float s[HS_OPS_THREADS];
    const hs_u32 r = blockIdx.x;
    if (r >= rows) {
        return;
    }
    const float *wr = W + (hs_u64)r * cols;
    float acc = 0.0f;
    for (hs_u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        acc += wr[c] * x[c];
    }
    s[threadIdx.x] = acc;
    __syncthreads();
    for (hs_u32 st = blockDim.x / 2; st > 0; st >>= 1) {
        if (threadIdx.x < st) {
            s[threadIdx.x] += s[threadIdx.x + st];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        y[r] = s[0];
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
