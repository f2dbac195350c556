// hipscope kernel prelude: prepended to every kernels/*.hip source before compilation.
// One source serves hiprtc (HIP) and nvrtc (CUDA); the host passes -DHS_BACKEND_HIP=1 or
// -DHS_BACKEND_CUDA=1. No standard includes: hiprtc already defines the vector/half types and an
// explicit <hip/hip_fp16.h> or <hip/hip_runtime.h> include fails under it (ROCm 5.2, 5.7).

#if !defined(HS_BACKEND_HIP) && !defined(HS_BACKEND_CUDA)
#error "compile with -DHS_BACKEND_HIP=1 or -DHS_BACKEND_CUDA=1"
#endif

#if !defined(__HIPCC_RTC__) && defined(HS_BACKEND_HIP) && !defined(HS_NO_INCLUDES)
// Only reached by an offline hipcc build; hiprtc defines __HIPCC_RTC__ and needs no include.
#include <hip/hip_runtime.h>
#endif

typedef unsigned int hs_u32;
typedef int hs_i32;
typedef unsigned long long hs_u64;
typedef long long hs_i64;

#define HS_KERNEL extern "C" __global__

// Warp-level exchange. HIP 5.7 has no __shfl_xor_sync; CUDA needs the _sync form since Volta.
#if defined(HS_BACKEND_HIP)
#define HS_SHFL_XOR(v, m) __shfl_xor((v), (m))
#define HS_SHFL_UP(v, d) __shfl_up((v), (d))
#define HS_SHFL(v, l) __shfl((v), (l))
#else
#define HS_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#define HS_SHFL_UP(v, d) __shfl_up_sync(0xffffffffu, (v), (d))
#define HS_SHFL(v, l) __shfl_sync(0xffffffffu, (v), (l))
#endif

// Every hipscope kernel takes these two parameters first. hs_crumb points into pinned host-mapped
// memory (or is null when tracking is off); hs_op is the op's sequence number on its stream.
#define HS_TRACK_PARAMS volatile hs_u64 *hs_crumb, hs_u64 hs_op

// The device's own clock, as the tracer reads it (src/gpu/trace/stamps.rs): CUDA's global
// nanosecond timer; HIP's constant-rate wall clock (s_memrealtime, 100 MHz; on gfx11 the
// steady counter HIP 5.7 reads through __ockl_steadyctr_u64). The host maps it onto its own
// clock with a calibration launch (hs_clock_probe); its rate need not be known here.
__device__ __forceinline__ hs_u64 hs_now() {
#if defined(HS_BACKEND_CUDA)
    hs_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#else
    return (hs_u64)wall_clock64();
#endif
}

// Set in hs_op (bit 62) when the tracer wants the kernel to time itself. hs_crumb then points at
// the stream's stamp block in device memory: [0] the host breadcrumb's address, [1] the host
// stamp ring's address (pinned, host-mapped: two words a slot, start and end), then from word
// HS_STAMP_ENDS one word per slot: the latest time a block of the slot's op left. The slot is the
// op's seq modulo HS_STAMP_SLOTS (more than the stream's in-flight table holds).
#define HS_STAMP_OP (1ULL << 62)
#define HS_STAMP_SLOTS 8192u
#define HS_STAMP_ENDS 8
// The ops before a stamped kernel whose ends it hands to the host: its predecessor, and two more
// for a kernel that follows copies (a decode step's last kernel, then the logits' download and
// the next token's upload, then the next step's first kernel).
#define HS_STAMP_BEHIND 3u

// HS_LAUNCH_ORDER(): launch overlap on CUDA sm_90 and later (programmatic dependent launch;
// src/gpu/cuda/mod.rs launches every hipscope kernel with the attribute that allows it, unless
// HIPSCOPE_PDL=0). The next kernel on the stream may then be scheduled while this one runs, so
// its launch latency hides behind this kernel's work instead of following it. Every kernel first
// waits until the kernels before it have finished and their writes are visible
// (griddepcontrol.wait: at once for a kernel launched without the attribute, or after a copy or a
// library's kernel), then lets the next one be scheduled (griddepcontrol.launch_dependents).
// Waiting first keeps every rule below true: nothing a kernel does, its breadcrumb included,
// happens before its predecessor is done.
// Elsewhere (HIP, older NVIDIA cards) it is nothing.
#if defined(HS_BACKEND_CUDA) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define HS_LAUNCH_ORDER()                                                                      \
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define HS_LAUNCH_ORDER() ((void)0)
#endif

// HS_BREADCRUMB() is the first statement of every kernel, and begins with HS_LAUNCH_ORDER().
//
// On entry the first thread of the grid stores "op hs_op has started". On one stream ops run in
// order, so this also proves that op hs_op - 1 has finished; the watchdog reads it without any
// runtime call. No fence after the store: a late-visible value is still true, and a system fence
// would stall the thread for a bus round trip in every kernel.
//
// Inside a replayed graph (src/gpu/handle/graph.rs) hs_op is baked into the graph, so it is
// flagged (bit 63) and holds the kernel's node index; hs_crumb then points at the step block in
// device memory, written before each replay: [0] the replay's base, [1] the host breadcrumb's
// address. The kernel stores base + node there (decoded by src/gpu/stream/graph.rs).
//
// Kernels that time themselves are a build of their own (HS_STAMPS, defined by the host when a
// trace or a profile is asked for before the kernels are built: src/gpu/handle/launch.rs): their
// guard on entry and at every return costs 2-4% of a 7B decode step on an H100 even with
// tracing off (docs/runs/gpu-2026-12-06-trace.md), so the ordinary build keeps the plain
// breadcrumb, and the host launches a kernel stamped (HS_STAMP_OP) only from a stamped build.
#if defined(HS_STAMPS)
// With HS_STAMP_OP the first thread also stores the time it started into the op's ring slot, and
// the ends of the HS_STAMP_BEHIND ops before it into theirs: each of those has finished (stream
// order), so its end word holds the time its last block left. On leaving (the destructor, at
// every return) the first thread of each block raises its op's end word to now (an atomic max
// whose result nobody waits for). A block counts as done when its first thread leaves: its other
// warps finish with it. Nothing waits at a block's exit: a count of finished blocks, the last
// one storing the end, made every block wait for the count's round trip (tracing then cost 6.1%
// of a launch-bound decode step on an H100, 3.2% this way). A kernel followed by no kernel
// hands over no end: the host takes the next op's start event instead
// (src/gpu/trace/device.rs).
struct hs_op_guard {
    volatile hs_u64 *crumb;
    hs_u64 op;
    __device__ __forceinline__ hs_op_guard(volatile hs_u64 *c, hs_u64 o) : crumb(c), op(o) {
        if (c == 0 || threadIdx.x != 0 || threadIdx.y != 0 || threadIdx.z != 0 ||
            blockIdx.x != 0 || blockIdx.y != 0 || blockIdx.z != 0) {
            return;
        }
        if (o >> 63) {
            const hs_u64 *g = (const hs_u64 *)c;
            *(volatile hs_u64 *)g[1] = g[0] + (o & 0x7fffffffffffffffULL);
        } else if (o & HS_STAMP_OP) {
            const hs_u64 t = hs_now();
            const hs_u64 *b = (const hs_u64 *)c;
            const hs_u64 seq = o & ~HS_STAMP_OP;
            *(volatile hs_u64 *)b[0] = seq;
            volatile hs_u64 *ring = (volatile hs_u64 *)b[1];
            ring[2 * (seq & (HS_STAMP_SLOTS - 1))] = t;
            const volatile hs_u64 *ends = (const volatile hs_u64 *)(b + HS_STAMP_ENDS);
            hs_u64 e[HS_STAMP_BEHIND];
            for (hs_u32 i = 0; i < HS_STAMP_BEHIND; ++i) {
                e[i] = ends[(seq - 1 - i) & (HS_STAMP_SLOTS - 1)];
            }
            for (hs_u32 i = 0; i < HS_STAMP_BEHIND; ++i) {
                ring[2 * ((seq - 1 - i) & (HS_STAMP_SLOTS - 1)) + 1] = e[i];
            }
        } else {
            *c = o;
        }
    }
    __device__ __forceinline__ ~hs_op_guard() {
        if ((op >> 62) != 1 || crumb == 0 || threadIdx.x != 0 || threadIdx.y != 0 ||
            threadIdx.z != 0) {
            return;
        }
        hs_u64 *end = (hs_u64 *)crumb + HS_STAMP_ENDS + (op & (HS_STAMP_SLOTS - 1));
        atomicMax(end, hs_now());
    }
};

#define HS_BREADCRUMB()                                                                        \
    HS_LAUNCH_ORDER();                                                                         \
    hs_op_guard hs_guard_(hs_crumb, hs_op)
#else
#define HS_BREADCRUMB()                                                                        \
    do {                                                                                       \
        HS_LAUNCH_ORDER();                                                                     \
        if (hs_crumb != 0 && threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 &&      \
            blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {                           \
            if (hs_op >> 63) {                                                                 \
                const hs_u64 *hs_g = (const hs_u64 *)hs_crumb;                                 \
                *(volatile hs_u64 *)hs_g[1] = hs_g[0] + (hs_op & 0x7fffffffffffffffULL);       \
            } else {                                                                           \
                *hs_crumb = hs_op;                                                             \
            }                                                                                  \
        }                                                                                      \
    } while (0)
#endif

// ---- Helpers of the inference kernels (kernels/infer_*.hip) --------------------------------

// IEEE half (as its 16 bits) to float, exactly. No <cuda_fp16.h> / <hip/hip_fp16.h>: neither
// header may be included under the run-time compilers (see above).
#if defined(HS_BACKEND_CUDA)
__device__ __forceinline__ float hs_half_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
// Round to nearest even, as the CPU backend's f32 -> f16 conversion does.
__device__ __forceinline__ unsigned short hs_float_to_half(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
// Correctly rounded division even under --use_fast_math (activation quantization must round
// exactly as the CPU backend does).
#define HS_DIV_RN(a, b) __fdiv_rn((a), (b))
#else
__device__ inline float hs_half_to_float(unsigned short h) {
    _Float16 v;
    __builtin_memcpy(&v, &h, 2);
    return (float)v;
}
__device__ inline unsigned short hs_float_to_half(float f) {
    _Float16 v = (_Float16)f;
    unsigned short h;
    __builtin_memcpy(&h, &v, 2);
    return h;
}
// HIP divides correctly rounded by default (no fast-math option is passed to hiprtc).
#define HS_DIV_RN(a, b) ((a) / (b))
#endif

__device__ __forceinline__ float hs_bf16_to_float(unsigned short h) {
    return __int_as_float(((int)h) << 16);
}

// c + the dot product of the four signed bytes of a and b.
#if defined(HS_BACKEND_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
#define HS_DP4A(a, b, c) __dp4a((a), (b), (c))
#elif defined(HS_BACKEND_HIP) && (defined(__gfx906__) || defined(__gfx908__) ||              \
                                  defined(__gfx90a__) || defined(__gfx1030__) ||             \
                                  defined(__gfx1031__) || defined(__gfx1032__))
// v_dot4_i32_i8 (gfx906/908/90a, gfx10.3: the "dot1" instructions); no clamp.
#define HS_DP4A(a, b, c) __builtin_amdgcn_sdot4((a), (b), (c), false)
#else
// Portable form (gfx11 has only the mixed-sign v_dot4_i32_iu8, not yet checked here on a
// compiler of this build, so the compiler is left to pick; the arithmetic is exact either way).
__device__ __forceinline__ int hs_dp4a_portable(int a, int b, int c) {
    return c + (int)(signed char)(a) * (int)(signed char)(b) +
           (int)(signed char)(a >> 8) * (int)(signed char)(b >> 8) +
           (int)(signed char)(a >> 16) * (int)(signed char)(b >> 16) +
           (int)(signed char)(a >> 24) * (int)(signed char)(b >> 24);
}
#define HS_DP4A(a, b, c) hs_dp4a_portable((a), (b), (c))
#endif

// Lookups in a 16-entry table of signed bytes (IQ4_NL's and MXFP4's values) held in registers as
// four words, t0 = entries 0..3 (entry 0 in the low byte) .. t3 = entries 12..15. A table in
// __constant__ memory, indexed by a different nibble on every lane, serialises the lanes' reads:
// MXFP4 experts decoded at 160 GB/s on the H100 that way.
//
// hs_lut16_4: the entries for the four indices in the low nibbles of q's bytes, as the four bytes
// of the result (byte i: entry (q >> 8i) & 15). Byte permutes where the device has them: the low
// three bits of an index pick a byte from entries 0..7 and from 8..15, bit 3 picks between them.
__device__ __forceinline__ int hs_lut16_4(hs_u32 q, hs_u32 t0, hs_u32 t1, hs_u32 t2, hs_u32 t3) {
#if defined(HS_BACKEND_CUDA)
    // __byte_perm reads a selector nibble per result byte from the low 16 bits, low 3 bits each.
    const hs_u32 s = (q & 0xFu) | ((q >> 4) & 0xF0u) | ((q >> 8) & 0xF00u) | ((q >> 12) & 0xF000u);
    const hs_u32 lo = __byte_perm(t0, t1, s);
    const hs_u32 hi = __byte_perm(t2, t3, s);
    return (int)__byte_perm(lo, hi, 0x3210u | ((s & 0x8888u) >> 1));
#elif defined(HS_BACKEND_HIP)
    // v_perm_b32: a selector byte per result byte, 0..3 from the second operand, 4..7 the first.
    const hs_u32 s = q & 0x07070707u;
    const hs_u32 lo = __builtin_amdgcn_perm(t1, t0, s);
    const hs_u32 hi = __builtin_amdgcn_perm(t3, t2, s);
    return (int)__builtin_amdgcn_perm(hi, lo, 0x03020100u | ((q & 0x08080808u) >> 1));
#else
    const unsigned long long lo = (unsigned long long)t0 | ((unsigned long long)t1 << 32);
    const unsigned long long hi = (unsigned long long)t2 | ((unsigned long long)t3 << 32);
    hs_u32 r = 0;
    for (int i = 0; i < 4; ++i) {
        const hs_u32 n = (q >> (8 * i)) & 0xFu;
        r |= (hs_u32)(((n & 8u) ? hi : lo) >> ((n & 7u) * 8) & 0xFFu) << (8 * i);
    }
    return (int)r;
#endif
}

// One entry (index n, 0..15) of such a table, as a float.
__device__ __forceinline__ float hs_lut16_1(hs_u32 n, hs_u32 t0, hs_u32 t1, hs_u32 t2,
                                            hs_u32 t3) {
    const unsigned long long lo = (unsigned long long)t0 | ((unsigned long long)t1 << 32);
    const unsigned long long hi = (unsigned long long)t2 | ((unsigned long long)t3 << 32);
    return (float)(signed char)(((n & 8u) ? hi : lo) >> ((n & 7u) * 8));
}

// The tables, as hs_lut16_4's words: MXFP4's doubled E2M1 values (0, 1, 2, 3, 4, 6, 8, 12, then
// their negatives) and IQ4_NL's (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69,
// 89, 113).
#define HS_LUT_MXFP4 0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu
#define HS_LUT_IQ4NL 0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u

// The sum of v over the warp (wave32 or wave64: warpSize decides); every lane gets it. Every
// lane of the warp must call it.
__device__ __forceinline__ float hs_warp_sum(float v) {
    for (int o = warpSize / 2; o > 0; o >>= 1) {
        v += HS_SHFL_XOR(v, o);
    }
    return v;
}

__device__ __forceinline__ float hs_warp_max(float v) {
    for (int o = warpSize / 2; o > 0; o >>= 1) {
        v = fmaxf(v, HS_SHFL_XOR(v, o));
    }
    return v;
}

#define HS_Q8_MAX_BLOCK 256

// The scale d of a Q8 activation block whose largest magnitude is amax, its quants rounded from
// x * id (id = 127 / amax, 0 for an all-zero block), as the CPU backend (src/gpu/quant/dot/act.rs,
// q8x32_scales / q8xk_scale) and llama.cpp store it: 32-element blocks amax / 127 rounded to f16
// (Q8_0 / Q8_1 keep an f16 d), K-quant super-blocks 1 / id (Q8_K's f32 d).
__device__ __forceinline__ float hs_q8_scale(float amax, float id, hs_u32 bs) {
    if (bs == HS_Q8_MAX_BLOCK) {
        return (amax != 0.0f) ? HS_DIV_RN(1.0f, id) : 0.0f;
    }
    return hs_half_to_float(hs_float_to_half(HS_DIV_RN(amax, 127.0f)));
}

// A quantizer's `bs` argument with this bit set: the block's sum term is Q8_1's, for Q4_1 / Q5_1
// weights (see hs_q8_block_warp_regs). hs_q8_args splits such an argument.
#define HS_Q8_1_SUMS 0x10000u

__device__ __forceinline__ hs_u32 hs_q8_args(hs_u32 bs_arg, bool *q8_1) {
    *q8_1 = (bs_arg & HS_Q8_1_SUMS) != 0;
    return bs_arg & ~HS_Q8_1_SUMS;
}

// Q8 quantization of one block of `bs` activations by the warp, exactly as the CPU backend
// quantizes them: q = round-half-even(x * 127 / max|x|), d of hs_q8_scale. Lane l holds elements
// l, l + warpSize, ... in x[0], x[1], ... (0 beyond bs), so a kernel that has just computed them
// quantizes from registers; max and the integer sum are exact in any order (|sum q| <= 256 * 128
// is exact in f32). Writes the quants and (d, s) where q / dd are given, the dequantized values
// (q * d) where dq is given. s, as the CPU backend (act.rs, q8x32_scales) and llama.cpp store it:
// for Q8_1 (q8_1, 32-element blocks for Q4_1 / Q5_1 weights) (amax / 127) * sum q rounded to
// f16, from the unrounded d; else d * sum q, exact for the f16 d (Q8_0's integer offset term).
// Shared by hs_quantize_act, the RMS norm that quantizes its own output and the attention that
// quantizes its output. bs is at most HS_Q8_MAX_BLOCK (K-quant super-blocks). Every lane of the
// warp must call it; lane 0 writes dd.
__device__ __forceinline__ void hs_q8_block_warp_regs(const float *x, hs_u32 bs, signed char *q,
                                                      float *dd, float *dq, bool q8_1) {
    const hs_u32 lane = threadIdx.x % warpSize;
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < HS_Q8_MAX_BLOCK / 32; ++k) {
        amax = fmaxf(amax, fabsf(x[k]));
    }
    amax = hs_warp_max(amax);
    const float id = (amax != 0.0f) ? HS_DIV_RN(127.0f, amax) : 0.0f;
    const float d = hs_q8_scale(amax, id, bs);
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < HS_Q8_MAX_BLOCK / 32; ++k) {
        const hs_u32 i = lane + k * warpSize;
        if (i >= bs) {
            break;
        }
        int v = (int)rintf(x[k] * id);
        v = v < -128 ? -128 : (v > 127 ? 127 : v);
        sum += (float)v;
        if (q != 0) {
            q[i] = (signed char)v;
        }
        if (dq != 0) {
            dq[i] = (float)v * d;
        }
    }
    sum = hs_warp_sum(sum);
    if (dd != 0 && lane == 0) {
        dd[0] = d;
        dd[1] = q8_1 ? hs_half_to_float(hs_float_to_half(HS_DIV_RN(amax, 127.0f) * sum))
                     : d * sum;
    }
}

// As hs_q8_block_warp_regs, the block read from xb (lane l loads elements l, l + warpSize, ...).
__device__ __forceinline__ void hs_q8_block_warp(const float *xb, hs_u32 bs, signed char *q,
                                                 float *dd, float *dq, bool q8_1) {
    const hs_u32 lane = threadIdx.x % warpSize;
    // The lane's elements, loaded together before any use: the stores of the quantization may
    // alias them (char), which would otherwise order each load after them.
    float x[HS_Q8_MAX_BLOCK / 32];
#pragma unroll
    for (int k = 0; k < HS_Q8_MAX_BLOCK / 32; ++k) {
        const hs_u32 i = lane + k * warpSize;
        x[k] = (i < bs) ? xb[i] : 0.0f;
    }
    hs_q8_block_warp_regs(x, bs, q, dd, dq, q8_1);
}

#define HS_ROPE_MAX_PAIRS 256

// Products and sums that the compiler must not contract into one fused multiply-add (the YaRN
// angle below is mixed exactly as the CPU backend mixes it). HIP: hiprtc gets no fast-math option
// and these are left as written.
#if defined(HS_BACKEND_CUDA)
#define HS_MUL_RN(a, b) __fmul_rn((a), (b))
#define HS_ADD_RN(a, b) __fadd_rn((a), (b))
#else
#define HS_MUL_RN(a, b) ((a) * (b))
#define HS_ADD_RN(a, b) ((a) + (b))
#endif

// RoPE of one token row of n_heads heads of head_dim at position `pos`, by the block (cs / sn:
// shared arrays of HS_ROPE_MAX_PAIRS). The angle of pair i is pos * freq_scale * theta_scale^i
// (/ factors[i]), the power built by repeated multiplication in f32 exactly as the CPU backend
// (and ggml) builds it; sin and cos are taken in double, because the fast single-precision ones
// lose accuracy for angles of thousands of radians. With YaRN the power starts from pos itself
// (the extrapolated angle) and the interpolated one, freq_scale times it, is mixed in by the
// pair's ramp, as ggml's rope_yarn and the CPU backend's `Yarn::angle` do (ext_factor != 0 turns
// YaRN on; corr_lo, corr_hi: its correction dimensions). mscale multiplies cosines and sines
// (attn_factor, times YaRN's 1 + 0.1 ln(1 / freq_scale)). Ends with the block synchronised.
__device__ __forceinline__ void hs_rope_row(float *row, hs_u32 n_heads, hs_u32 head_dim,
                                            hs_u32 n_rot, hs_u32 pos, float freq_scale,
                                            float theta_scale, const float *factors, hs_u32 neox,
                                            float mscale, float ext_factor, float corr_lo,
                                            float corr_hi, float *cs, float *sn) {
    const hs_u32 half = n_rot / 2;
    const bool yarn = ext_factor != 0.0f;
    for (hs_u32 i = threadIdx.x; i < half && i < HS_ROPE_MAX_PAIRS; i += blockDim.x) {
        float theta = yarn ? (float)pos : (float)pos * freq_scale;
        for (hs_u32 k = 0; k < i; ++k) {
            theta *= theta_scale;
        }
        if (factors != 0) {
            theta = HS_DIV_RN(theta, factors[i]);
        }
        if (yarn) {
            const float y = HS_DIV_RN((float)i - corr_lo, fmaxf(corr_hi - corr_lo, 0.001f));
            const float ramp = (1.0f - fminf(fmaxf(y, 0.0f), 1.0f)) * ext_factor;
            theta = HS_ADD_RN(HS_MUL_RN(HS_MUL_RN(freq_scale, theta), 1.0f - ramp),
                              HS_MUL_RN(theta, ramp));
        }
        cs[i] = (float)cos((double)theta) * mscale;
        sn[i] = (float)sin((double)theta) * mscale;
    }
    __syncthreads();
    const hs_u32 pairs = n_heads * half;
    for (hs_u32 idx = threadIdx.x; idx < pairs; idx += blockDim.x) {
        const hs_u32 h = idx / half;
        const hs_u32 i = idx % half;
        float *head = row + (hs_u64)h * head_dim;
        const hs_u32 a = neox ? i : 2 * i;
        const hs_u32 b = neox ? i + half : 2 * i + 1;
        const float x0 = head[a];
        const float x1 = head[b];
        head[a] = x0 * cs[i] - x1 * sn[i];
        head[b] = x0 * sn[i] + x1 * cs[i];
    }
    __syncthreads();
}

// ---- Mixture of experts: shared by infer_moe.hip's kernels and gemm.hip's grouped products ----
// (the route buffer's layout: infer_moe.hip's head).

// The chunk of this block (blockIdx.y): expert, first sorted entry, entries; false past the end.
__device__ __forceinline__ bool moe_chunk(const float *route, hs_u32 n, hs_u32 k, int *e,
                                          int *s, int *c) {
    const int *chunks = (const int *)(route + (hs_u64)n * k * 2) + 2 * (hs_u64)n * k;
    if ((int)blockIdx.y >= chunks[0]) {
        return false;
    }
    const int *ch = chunks + 1 + 3 * blockIdx.y;
    *e = ch[0];
    *s = ch[1];
    *c = ch[2];
    return true;
}

// The gated activation of gate value g and up value u of hidden row i (e * ff + row): silu(g) * u
// (act 0), gelu(g) * u in ggml's tanh form (act 1: Gemma's GeGLU, as hs_geglu_inplace), or, with
// gpt-oss's biases (gb not null), ggml's swiglu_oai (alpha 1.702, limit 7) of g + gb[i] and
// u + ub[i], as the CPU backend's `swiglu_oai`.
__device__ __forceinline__ float moe_act(float g, float u, const float *gb, const float *ub,
                                         hs_u64 i, hs_u32 act) {
    if (gb == 0) {
        if (act == 1) {
            return 0.5f * g * (1.0f + tanhf(0.7978846f * g * (1.0f + 0.044715f * g * g))) * u;
        }
        return g / (1.0f + expf(-g)) * u;
    }
    const float x = fminf(g + gb[i], 7.0f);
    const float y = fminf(fmaxf(u + ub[i], -7.0f), 7.0f);
    return x / (1.0f + expf(1.702f * -x)) * (y + 1.0f);
}
