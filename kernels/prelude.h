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
#else
#define HS_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#endif

// Every hipscope kernel takes these two parameters first. hs_crumb points into pinned host-mapped
// memory (or is null when tracking is off); hs_op is the op's sequence number on its stream.
#define HS_TRACK_PARAMS volatile hs_u64 *hs_crumb, hs_u64 hs_op

// The first thread of the grid stores "op hs_op has started". On one stream ops run in order, so
// this also proves that op hs_op - 1 has finished; the watchdog reads it without any runtime call.
// No fence after the store: a late-visible value is still true, and a system fence would stall
// the thread for a bus round trip in every kernel.
#define HS_BREADCRUMB()                                                                        \
    do {                                                                                       \
        if (hs_crumb != 0 && threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 &&      \
            blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {                           \
            *hs_crumb = hs_op;                                                                 \
        }                                                                                      \
    } while (0)
