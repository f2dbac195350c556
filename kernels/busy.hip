// A small kernel that keeps the GPU busy for a controllable time (a dependent FMA chain of
// `iters` steps per thread): the selftest launches bursts of it to watch queue depth rise and fall.

HS_KERNEL void hs_busy(HS_TRACK_PARAMS, float *out, hs_u32 n, hs_u32 iters) {
    HS_BREADCRUMB();
    const hs_u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    float x = (float)i * 1.0e-3f;
    float y = 1.0f;
    for (hs_u32 k = 0; k < iters; ++k) {
        y = y * 0.999f + x;
        x = x * 1.0001f + 1.0e-7f;
    }
    out[i] = y;
}
