// A CPU stand-in for the GPU runtime, enough to run hipscope's attention kernels, MoE routing and
// grouped expert products as written (tests/it/kernel_emulation.rs): one block at a time, a context
// (its own stack, hs_emu_ctx) per GPU thread, switched cooperatively on one OS thread: each runs to
// its next barrier and waits there until every thread the barrier names has arrived — the block's
// for __syncthreads, its warp's for a shuffle (two warp barriers: leave the value, take the other
// lane's) — then all of those go on (a round visits the threads in ascending order, the next in
// descending, so that a read that lacks its barrier meets the other order too). A barrier that can
// never be passed (a thread of the block, or of the warp for a shuffle, has returned) stops the run
// with a message. __shared__ are function statics (shared by the block's threads; blocks run one
// after another). A std::thread per GPU thread and a std::barrier did the same in minutes of futex
// waits a run. Neither backend macro is defined, so mma.h takes its plain-FMA tile and the
// prelude's helpers their portable forms: what this checks is each kernel's own logic (indexing,
// masks, the online softmax, the splits and their merge, the routing's choices and its sort, the
// experts' staging), not a device's matrix-unit layout.
#include <algorithm>
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

// The prompt attention's matrix-unit kernels are built here too, on the plain tile
// (kernels/infer_attention_tiled.hip).
#define HS_EMU_STANDIN 1
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
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
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
// Contexts: on x86-64 a stack pointer and a switch of our own (the callee-saved registers, the
// SSE and x87 control words; nothing else is live across a call); elsewhere ucontext, whose
// swapcontext also sets the signal mask, a system call each switch: with it, one run of the
// attention cases took 39 s here, 3 s with this switch.
#if defined(__x86_64__)
struct hs_emu_ctx {
    void *sp;
};
extern "C" void hs_emu_switch(void **save_sp, void *load_sp);
asm(R"(
    .text
    .globl hs_emu_switch
    .type hs_emu_switch, @function
hs_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size hs_emu_switch, .-hs_emu_switch
)");
inline void hs_emu_swap(hs_emu_ctx *from, hs_emu_ctx *to) { hs_emu_switch(&from->sp, to->sp); }
// A context that starts in entry() on the given stack: the frame hs_emu_switch pops (control
// words, six registers), then entry as its return address, 16-byte aligned as a call leaves it.
inline void hs_emu_make(hs_emu_ctx *c, char *stack, size_t size, void (*entry)()) {
    uintptr_t top = ((uintptr_t)(stack + size) & ~(uintptr_t)15) - 16;
    void **sp = (void **)top;
    *sp = (void *)entry;  // top % 16 == 0: entry starts with rsp % 16 == 8, as after a call
    sp -= 6;
    for (int i = 0; i < 6; ++i) sp[i] = nullptr;
    sp -= 1;
    const uint32_t words[2] = {0x1F80u, 0x037Fu};  // MXCSR and x87 control word defaults
    std::memcpy(sp, words, 8);
    c->sp = sp;
}
#else
struct hs_emu_ctx {
    ucontext_t uc;
};
inline void hs_emu_swap(hs_emu_ctx *from, hs_emu_ctx *to) { swapcontext(&from->uc, &to->uc); }
inline void hs_emu_make(hs_emu_ctx *c, char *stack, size_t size, void (*entry)()) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, entry, 0);
}
#endif

// The scheduler's context and the running thread's (hs_emu_launch); what each thread waits at.
static hs_emu_ctx hs_emu_main;
static hs_emu_ctx *hs_emu_self;
enum hs_emu_wait : unsigned char { HS_EMU_RUN, HS_EMU_BLOCK, HS_EMU_WARP, HS_EMU_DONE };
static hs_emu_wait *hs_emu_state;
inline void hs_emu_barrier(hs_emu_wait w) {
    hs_emu_state[threadIdx.x] = w;
    hs_emu_swap(hs_emu_self, &hs_emu_main);
}
inline void __syncthreads() { hs_emu_barrier(HS_EMU_BLOCK); }
// A shuffle: every thread of the warp leaves its value, then takes lane `from(lane)`'s value of
// its own warp (its own value where `from` gives a lane outside the warp, as CUDA's shfl_up).
static unsigned char hs_emu_lanes[1024][8];
template <class T, class F> T hs_emu_shfl(T v, F from) {
    static_assert(sizeof(T) <= 8, "a shuffle of at most 8 bytes");
    std::memcpy(hs_emu_lanes[threadIdx.x], &v, sizeof(T));
    hs_emu_barrier(HS_EMU_WARP);
    const unsigned lane = threadIdx.x % warpSize;
    const int src = from((int)lane);
    T r = v;
    if (src >= 0 && src < (int)warpSize) {
        std::memcpy(&r, hs_emu_lanes[threadIdx.x - lane + (unsigned)src], sizeof(T));
    }
    hs_emu_barrier(HS_EMU_WARP);
    return r;
}
#define HS_SHFL_XOR(v, m) hs_emu_shfl((v), [&](int l) { return l ^ (int)(m); })
#define HS_SHFL(v, s) hs_emu_shfl((v), [&](int) { return (int)(s) % (int)warpSize; })
#define HS_SHFL_UP(v, d) hs_emu_shfl((v), [&](int l) { return l - (int)(d); })
// Atomics on one OS thread: plain read-modify-writes.
inline int atomicAdd(int *p, int v) {
    const int old = *p;
    *p = old + v;
    return old;
}
inline void __threadfence_block() {}

static void (*hs_emu_run)(void *);
static void *hs_emu_arg;
// A GPU thread's context runs this, then goes back to the scheduler for good.
static void hs_emu_entry() {
    const unsigned t = threadIdx.x;
    hs_emu_run(hs_emu_arg);
    hs_emu_state[t] = HS_EMU_DONE;
    hs_emu_swap(hs_emu_self, &hs_emu_main);
    std::abort();  // never resumed
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
    std::vector<hs_emu_ctx> ctx(threads);
    std::vector<hs_emu_wait> state(threads);
    hs_emu_run = [](void *f) { (*(F *)f)(); };
    hs_emu_arg = &body;
    hs_emu_state = state.data();
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                blockIdx = {bx, by, bz};
                for (unsigned t = 0; t < threads; ++t) {
                    state[t] = HS_EMU_RUN;
                    hs_emu_make(&ctx[t], &stacks[stack * t], stack, hs_emu_entry);
                }
                // Rounds until every thread has returned. A round first lets through the
                // barriers every thread they name has reached (the block's: all threads, none
                // returned; a warp's: its threads), then runs each runnable thread to its next.
                for (unsigned round = 0;; ++round) {
                    bool block = true, left = false;
                    for (unsigned t = 0; t < threads; ++t) {
                        block = block && state[t] == HS_EMU_BLOCK;
                        left = left || state[t] != HS_EMU_DONE;
                    }
                    if (!left) break;
                    for (unsigned w = 0; w < threads; w += warpSize) {
                        const unsigned end = w + warpSize < threads ? w + warpSize : threads;
                        bool warp = true;
                        for (unsigned t = w; t < end; ++t) warp = warp && state[t] == HS_EMU_WARP;
                        for (unsigned t = w; t < end; ++t)
                            if (warp || (block && state[t] == HS_EMU_BLOCK)) state[t] = HS_EMU_RUN;
                    }
                    unsigned ran = 0;
                    for (unsigned i = 0; i < threads; ++i) {
                        const unsigned t = (round % 2) ? threads - 1 - i : i;
                        if (state[t] != HS_EMU_RUN) continue;
                        threadIdx = {t, 0, 0};
                        hs_emu_self = &ctx[t];
                        hs_emu_swap(&hs_emu_main, &ctx[t]);
                        ++ran;
                    }
                    if (ran == 0) {
                        unsigned at_block = 0, at_warp = 0, done = 0;
                        for (unsigned t = 0; t < threads; ++t) {
                            at_block += state[t] == HS_EMU_BLOCK;
                            at_warp += state[t] == HS_EMU_WARP;
                            done += state[t] == HS_EMU_DONE;
                        }
                        fprintf(stderr,
                                "block (%u %u %u): stuck: %u threads at __syncthreads, %u at a "
                                "shuffle, %u returned\n",
                                bx, by, bz, at_block, at_warp, done);
                        std::abort();
                    }
                }
            }
}
