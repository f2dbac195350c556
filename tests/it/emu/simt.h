// A CPU stand-in for the GPU runtime, enough to run hipscope's attention kernels as written
// (tests/it/kernel_emulation.rs): one block at a time, a std::thread per GPU thread, a barrier
// for __syncthreads and for warp shuffles (every thread of the block reaches each shuffle in these
// kernels), __shared__ as function statics (shared by the block's threads; blocks run one after
// another). Neither backend macro is defined, so mma.h takes its plain-FMA tile and the prelude's
// helpers their portable forms: what this checks is each kernel's own logic (indexing, masks,
// the online softmax, the splits and their merge), not a device's matrix-unit layout.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <random>
#include <thread>
#include <vector>

#define __device__
#define __forceinline__ inline
#define __global__
#define __shared__ static
#define HS_KERNEL extern "C"
struct hs_dim3 {
    unsigned x, y, z;
};
thread_local hs_dim3 threadIdx, blockIdx;
hs_dim3 blockDim, gridDim;
const unsigned warpSize = 32;
struct uint4 {
    unsigned x, y, z, w;
};
struct uint2 {
    unsigned x, y;
};
struct float4 {
    float x, y, z, w;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
typedef unsigned int hs_u32;
typedef int hs_i32;
typedef unsigned long long hs_u64;
typedef long long hs_i64;
#define HS_TRACK_PARAMS volatile hs_u64 *hs_crumb, hs_u64 hs_op
#define HS_BREADCRUMB()                                                                        \
    do {                                                                                       \
        (void)hs_crumb;                                                                        \
        (void)hs_op;                                                                           \
    } while (0)
std::barrier<> *hs_emu_barrier;
inline void __syncthreads() { hs_emu_barrier->arrive_and_wait(); }
static float hs_emu_lanes[1024];
inline float hs_emu_shfl_xor(float v, int m) {
    hs_emu_lanes[threadIdx.x] = v;
    __syncthreads();
    const float r = hs_emu_lanes[threadIdx.x ^ (unsigned)m];
    __syncthreads();
    return r;
}
#define HS_SHFL_XOR(v, m) hs_emu_shfl_xor((v), (m))

// Runs `body` as a grid of gx x gy x gz blocks of `threads` threads.
template <class F> void hs_emu_launch(hs_dim3 grid, unsigned threads, F body) {
    gridDim = grid;
    blockDim = {threads, 1, 1};
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                std::barrier<> bar(threads);
                hs_emu_barrier = &bar;
                std::vector<std::thread> ts;
                for (unsigned t = 0; t < threads; ++t)
                    ts.emplace_back([&, t] {
                        threadIdx = {t, 0, 0};
                        blockIdx = {bx, by, bz};
                        body();
                    });
                for (auto &t : ts) t.join();
            }
}
