// What the attention kernels share (infer_attention.hip, infer_attention_tiled.hip): the cache's
// limits and the output's normalisation.

#define HS_ATTN_MAX_HEAD_DIM 256
// Most splits of one head's decode attention over the KV length (gpu::compute::attention's
// MAX_SPLITS: hs_attention_combine keeps a weight per split in shared memory).
#define HS_ATTN_MAX_SPLITS 64
// Threads of a decode attention block (gpu::compute::attention launches it so).
#define HS_ATTN_THREADS 128
// Lanes that score one key together in a decode attention block (attn_keys in
// infer_attention.hip): lane s of a key's L lanes reads the 16-byte words s, s + L, s + 2L, ... of
// the key's row (the L lanes' loads adjacent: coalesced), and the L lanes add their partial dot
// products by shuffles within their aligned group. A chunk then covers HS_ATTN_THREADS / L keys.
// 1: a thread per key, reading the whole row. HS_ATTN_KEY_LANES for heads below
// HS_ATTN_WIDE_HEAD elements, HS_ATTN_KEY_LANES_WIDE from there: on the H100 (2026-12-07, tg128
// at depth 0 / 4096) two lanes a key took Gemma 3 1B (heads of 256) from 585 / 516 to 650 / 577
// t/s and Qwen3-0.6B (128) from 834 / 602 to 857 / 627, where SmolLM2 (64) ran faster with one
// (1058 / 827 against 1028 / 786); four and eight were slower still. Powers of two up to 32 (the
// narrowest warp); a kernels directory may set others (scripts/device/attn-lanes-variants.sh).
#ifndef HS_ATTN_KEY_LANES
#define HS_ATTN_KEY_LANES 1
#endif
#ifndef HS_ATTN_KEY_LANES_WIDE
#define HS_ATTN_KEY_LANES_WIDE 2
#endif
#define HS_ATTN_WIDE_HEAD 128
#if HS_ATTN_KEY_LANES < 1 || HS_ATTN_KEY_LANES > 32 ||                                          \
    (HS_ATTN_KEY_LANES & (HS_ATTN_KEY_LANES - 1)) != 0 || HS_ATTN_KEY_LANES_WIDE < 1 ||          \
    HS_ATTN_KEY_LANES_WIDE > 32 || (HS_ATTN_KEY_LANES_WIDE & (HS_ATTN_KEY_LANES_WIDE - 1)) != 0
#error "HS_ATTN_KEY_LANES and HS_ATTN_KEY_LANES_WIDE must be powers of two from 1 to 32"
#endif
// 16-byte words of a key that a lane of L > 1 loads together before their products (at most
// this many in flight, a lane's share of the row in batches of it).
#ifndef HS_ATTN_KEY_BATCH
#define HS_ATTN_KEY_BATCH 8
#endif
// -inf without <math.h> (nvrtc and hiprtc get no includes).
#define HS_NEG_INF __int_as_float(0xff800000)

// The factor that normalises the output of query head h whose keys gave running max m and sum l
// (attn_keys' online softmax): 1 / l, or with attention sinks (gpt-oss: one logit per query head,
// `sinks` not null) the sink counted in as llama.cpp's soft_max and the CPU backend count it, in
// the max and as one more term of the sum, adding no value.
__device__ __forceinline__ float attn_norm(float m, float l, const float *sinks, hs_u32 h) {
    if (sinks == 0) {
        return 1.0f / l;
    }
    const float s = sinks[h];
    const float mm = fmaxf(m, s);
    const float c = expf(m - mm);
    return c / (l * c + expf(s - mm));
}
