// A kernel that waits for the host: its first thread polls a flag in pinned host-mapped memory
// until the host sets it or `max_polls` reads have passed. The selftest uses it as a deliberately
// stuck op for the watchdog; the poll limit keeps a forgotten flag from wedging a shared GPU.
// result[0]: 1 = released by the host, 2 = gave up after max_polls.

HS_KERNEL void hs_spin_on_flag(HS_TRACK_PARAMS, volatile hs_u32 *flag, hs_u64 max_polls,
                               hs_u32 *result) {
    HS_BREADCRUMB();
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    hs_u64 polls = 0;
    while (*flag == 0 && polls < max_polls) {
        ++polls;
    }
    result[0] = (*flag != 0) ? 1u : 2u;
}

// The tracer's clock calibration (src/gpu/trace/stamps.rs): the first thread stores hs_now() into
// out[0] again and again, for the host to read beside its own clock, until the host sets the flag
// or `max_polls` stores have passed. out[1] = 1 when it has stopped.
HS_KERNEL void hs_clock_probe(HS_TRACK_PARAMS, volatile hs_u64 *out, volatile hs_u32 *flag,
                              hs_u64 max_polls) {
    HS_BREADCRUMB();
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    hs_u64 polls = 0;
    while (*flag == 0 && polls < max_polls) {
        out[0] = hs_now();
        ++polls;
    }
    out[1] = 1;
}
