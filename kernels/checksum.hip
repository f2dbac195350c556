// Kernels that only read device memory: upload verification and the read-bandwidth probe.
//
// Upload verification (the gfx1151 "weights become zeros" reports: llama.cpp #28211, #25863,
// #26543). A position-weighted sum over the little-endian 32-bit words of a byte range, plus the
// count of non-zero words, one partial pair per block; the host adds the partials. The host side,
// gpu::upload::host_checksum, computes the same sums and must stay in step with this file.
//
//   sum = Σ_i w_i · (2i + 1)  (mod 2^64),  nonzero = #{i : w_i ≠ 0}
//
// The last word is zero-padded when the length is not a multiple of 4. `data` is 4-byte aligned.

#define HS_CHECKSUM_THREADS 256

HS_KERNEL void hs_checksum(HS_TRACK_PARAMS, const unsigned char *data, hs_u64 nbytes,
                           hs_u64 *partials) {
    HS_BREADCRUMB();
    __shared__ hs_u64 s_sum[HS_CHECKSUM_THREADS];
    __shared__ hs_u64 s_nz[HS_CHECKSUM_THREADS];
    const hs_u64 full = nbytes / 4;
    const hs_u64 nwords = (nbytes + 3) / 4;
    const hs_u64 stride = (hs_u64)gridDim.x * blockDim.x;
    hs_u64 sum = 0;
    hs_u64 nz = 0;
    for (hs_u64 i = (hs_u64)blockIdx.x * blockDim.x + threadIdx.x; i < nwords; i += stride) {
        hs_u32 w = 0;
        if (i < full) {
            w = ((const hs_u32 *)data)[i];
        } else {
            for (hs_u64 b = i * 4; b < nbytes; ++b) {
                w |= ((hs_u32)data[b]) << (8 * (hs_u32)(b - i * 4));
            }
        }
        sum += (hs_u64)w * (2 * i + 1);
        nz += (w != 0) ? 1 : 0;
    }
    s_sum[threadIdx.x] = sum;
    s_nz[threadIdx.x] = nz;
    __syncthreads();
    for (hs_u32 s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            s_sum[threadIdx.x] += s_sum[threadIdx.x + s];
            s_nz[threadIdx.x] += s_nz[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        partials[2 * blockIdx.x] = s_sum[0];
        partials[2 * blockIdx.x + 1] = s_nz[0];
    }
}

// Device memory read bandwidth (bench's decode bound, doctor): every thread streams 16-byte words
// of `data` (grid-stride, four loads in flight) and folds them with XOR. The fold is stored only
// if it equals `never`, which the host picks so that it does not happen; the compiler cannot know
// that, so every load stays. Nothing else is written: the kernel's time is the read alone.
HS_KERNEL void hs_read_bw(HS_TRACK_PARAMS, const uint4 *data, hs_u64 nvec, hs_u64 never,
                          hs_u64 *sink) {
    HS_BREADCRUMB();
    const hs_u64 stride = (hs_u64)gridDim.x * blockDim.x;
    hs_u32 x = 0, y = 0, z = 0, w = 0;
    hs_u64 i = (hs_u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < nvec; i += 4 * stride) {
        const uint4 a = data[i];
        const uint4 b = data[i + stride];
        const uint4 c = data[i + 2 * stride];
        const uint4 d = data[i + 3 * stride];
        x ^= a.x ^ b.x ^ c.x ^ d.x;
        y ^= a.y ^ b.y ^ c.y ^ d.y;
        z ^= a.z ^ b.z ^ c.z ^ d.z;
        w ^= a.w ^ b.w ^ c.w ^ d.w;
    }
    for (; i < nvec; i += stride) {
        const uint4 a = data[i];
        x ^= a.x;
        y ^= a.y;
        z ^= a.z;
        w ^= a.w;
    }
    const hs_u64 fold = ((hs_u64)(x ^ y) << 32) | (hs_u64)(z ^ w);
    if (fold == never) {
        sink[0] = fold;
    }
}
