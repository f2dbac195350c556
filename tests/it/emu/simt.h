// A CPU stand-in for the GPU runtime, enough to run hipscope's attention kernels as written
// (tests/it/kernel_emulation.rs): one block at a time, a context (its own stack, ucontext) per GPU
// thread, switched cooperatively on one OS thread: each runs to its next __syncthreads, then the
// next one; when all have arrived, all go on (a round visits the threads in ascending order, the
// next in descending, so that a read that lacks its barrier meets the other order too). Warp
// shuffles are two barriers (every thread of the block reaches each shuffle in these kernels);
// __shared__ are function statics (shared by the block's threads; blocks run one after another).
// A std::thread per GPU thread and a std::barrier did the same in minutes of futex waits a run. Neither backend macro is defined, so mma.h takes its plain-FMA tile and the prelude's
// helpers their portable forms: what this checks is each kernel's own logic (indexing, masks,
// the online softmax, the splits and their merge), not a device's matrix-unit layout.
#include <memory>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <random>
#include <ucontext.h>
#include <vector>

#define __device__
#define __forceinline__ inline
#define __global__
#define __shared__ static
#define HS_KERNEL extern "C"
struct hs_dim3 {
    unsigned x, y, z;
};
hs_dim3 threadIdx, blockIdx;
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
// The scheduler's context and the running thread's (hs_emu_launch).
static ucontext_t hs_emu_main;
static ucontext_t *hs_emu_self;
inline void __syncthreads() { swapcontext(hs_emu_self, &hs_emu_main); }
static float hs_emu_lanes[1024];
inline float hs_emu_shfl_xor(float v, int m) {
    hs_emu_lanes[threadIdx.x] = v;
    __syncthreads();
    const float r = hs_emu_lanes[threadIdx.x ^ (unsigned)m];
    __syncthreads();
    return r;
}
#define HS_SHFL_XOR(v, m) hs_emu_shfl_xor((v), (m))

static void (*hs_emu_run)(void *);
static void *hs_emu_arg;
static bool *hs_emu_done;
// A GPU thread's context runs this, and returns to the scheduler (uc_link) when it is done.
static void hs_emu_entry() {
    const unsigned t = threadIdx.x;
    hs_emu_run(hs_emu_arg);
    hs_emu_done[t] = true;
}

// Runs `body` as a grid of gx x gy x gz blocks of `threads` threads.
template <class F> void hs_emu_launch(hs_dim3 grid, unsigned threads, F body) {
    const size_t stack = 256 << 10;
    gridDim = grid;
    blockDim = {threads, 1, 1};
    // The stacks, kept from launch to launch (uninitialised: a GPU thread's locals start so too).
    static std::unique_ptr<char[]> stacks;
    static size_t stacks_size;
    if (stacks_size < stack * threads) {
        stacks.reset(new char[stack * threads]);
        stacks_size = stack * threads;
    }
    std::vector<ucontext_t> ctx(threads);
    std::unique_ptr<bool[]> done(new bool[threads]);
    hs_emu_run = [](void *f) { (*(F *)f)(); };
    hs_emu_arg = &body;
    hs_emu_done = done.get();
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                blockIdx = {bx, by, bz};
                for (unsigned t = 0; t < threads; ++t) {
                    done[t] = false;
                    getcontext(&ctx[t]);
                    ctx[t].uc_stack.ss_sp = &stacks[stack * t];
                    ctx[t].uc_stack.ss_size = stack;
                    ctx[t].uc_link = &hs_emu_main;
                    makecontext(&ctx[t], hs_emu_entry, 0);
                }
                // Rounds until every thread has returned; a thread that returns while others
                // still wait at a barrier is an error of the kernel (GPU threads of these
                // kernels all reach every barrier).
                for (unsigned round = 0;; ++round) {
                    unsigned left = 0, finished = 0;
                    for (unsigned i = 0; i < threads; ++i) {
                        const unsigned t = (round % 2) ? threads - 1 - i : i;
                        if (done[t]) continue;
                        threadIdx = {t, 0, 0};
                        hs_emu_self = &ctx[t];
                        swapcontext(&hs_emu_main, &ctx[t]);
                        (done[t] ? finished : left) += 1;
                    }
                    if (left == 0) break;
                    if (finished != 0) {
                        fprintf(stderr, "block (%u %u %u): %u threads left at a barrier that %u "
                                "had passed by returning\n", bx, by, bz, left, finished);
                        std::abort();
                    }
                }
            }
}
