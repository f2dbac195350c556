// What the attention kernels share (infer_attention.hip, infer_attention_tiled.hip): the cache's
// limits and the output's normalisation.

#define HS_ATTN_MAX_HEAD_DIM 256
// Most splits of one head's decode attention over the KV length (gpu::compute::attention's
// MAX_SPLITS: hs_attention_combine keeps a weight per split in shared memory).
#define HS_ATTN_MAX_SPLITS 64
// Threads of a decode attention block (gpu::compute::attention launches it so).
#define HS_ATTN_THREADS 128
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
