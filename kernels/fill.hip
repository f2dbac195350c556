// Fill a range of 32-bit words with one value. The stream rules forbid hipMemset (it runs on the
// null stream); this kernel runs on our stream like every other op.

HS_KERNEL void hs_fill_u32(HS_TRACK_PARAMS, hs_u32 *dst, hs_u64 nwords, hs_u32 value) {
    HS_BREADCRUMB();
    const hs_u64 stride = (hs_u64)gridDim.x * blockDim.x;
    for (hs_u64 i = (hs_u64)blockIdx.x * blockDim.x + threadIdx.x; i < nwords; i += stride) {
        dst[i] = value;
    }
}
