// Mixture-of-experts feed-forward (llama.cpp's build_moe_ffn with softmax gating, top-k, the
// chosen weights normalized to sum 1, SwiGLU experts), with the expert ids kept on the device:
//
//   hs_moe_route      softmax and top-k of each token's router logits, a warp per token (as the
//                     CPU backend: the exponentials in f32, their sum in f64, equal
//                     probabilities to the lower id), then (in the same launch for a decode
//                     step) a counting sort of the (token, slot) entries by expert into chunks
//                     of at most NT entries of one expert;
//   hs_moe_sort       that sort on its own, after a prompt batch's routing over many blocks;
//   hs_moe_gather     the entries' input rows, in sorted order (then Q8-quantized as any input);
//   hs_moe_combine    acc[t] += sum_i w_i * y[entry (t, i)], summed in the order chosen.
//
// The experts' products between gather and combine are infer_matvec.hip's kernels with this
// route as their `ids` argument (per chunk: silu(gate_e . x) * (up_e . x) by hs_mv_swiglu_* or
// hs_mv_gate_up_*, then down_e . h by hs_mv1_* or hs_mv_*: each expert's rows read once per
// chunk). A prompt batch runs them as grouped products on the matrix units instead:
// hs_moe_mm_* in gemm_moe.hip, over chunks of 64.
//
// gpt-oss's variant (MoeFfn::oai; the bias pointers not null): the router's bias added to its
// logits (in place, as the CPU backend's add_bias leaves them), the k largest logits chosen and
// weighted by the softmax of those k alone (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT); each
// expert's gate and up rows plus their biases into ggml's clamped swiglu_oai; the down bias added
// to each expert's output before its weight (ggml_add_id, then the weighting).
//
// The route buffer (floats, then ints): per token its k expert ids (as floats) and k weights;
// then pos[n*k] (the sorted index of entry t*k + i), tok[n*k] (the token of sorted entry j), and
// the chunk table: count, then per chunk (expert, first sorted entry, entries).

#define MOE_MAX_EXPERTS 512

// Routing is done a warp per token: lane l holds experts l, l + warpSize, ... in registers
// (P of them: the fewest that hold the layer's experts, a template parameter that hs_moe_route
// picks from ne), so the softmax, its f64 sum and each of the k choices are warp reductions. One
// thread per token, as before, took 82 µs a layer on the H100 for 128 experts (k passes over
// them, each recomputing every probability), 40% of a Qwen3-30B-A3B decode layer. One path for
// up to 512 experts (16 a lane, fully unrolled) then took 12.9 µs a decode step's routing against
// llama.cpp's 4.9, its one warp waiting on instruction fetch for most of its cycles; with 4 a
// lane for 128 experts and the chosen slots in registers, 9.5 µs (docs/PERFORMANCE.md).
#define MOE_PER_LANE (MOE_MAX_EXPERTS / 32)
#define MOE_NONE 0xffffffffu

__device__ __forceinline__ double moe_warp_sum_f64(double v) {
    for (int o = warpSize / 2; o > 0; o >>= 1) {
        v += HS_SHFL_XOR(v, o);
    }
    return v;
}

// The warp's largest of the values the lanes hold (v[j] for expert lane + j * warpSize, those
// not in `taken` and below ne): (value, expert), equal values to the lower expert, as the CPU
// backend's sort. Every lane gets the answer.
template <int P>
__device__ __forceinline__ void moe_warp_best(const float (&v)[P], hs_u32 taken, hs_u32 ne,
                                              float *bv_out, hs_u32 *be_out) {
    const hs_u32 lane = threadIdx.x % warpSize;
    float bv = 0.0f;
    hs_u32 be = MOE_NONE;
#pragma unroll
    for (int j = 0; j < P; ++j) {
        const hs_u32 e = lane + j * warpSize;
        if (e < ne && !((taken >> j) & 1u) && (be == MOE_NONE || v[j] > bv)) {
            bv = v[j];
            be = e;
        }
    }
    for (int o = warpSize / 2; o > 0; o >>= 1) {
        const float ov = HS_SHFL_XOR(bv, o);
        const hs_u32 oe = HS_SHFL_XOR(be, o);
        if (oe != MOE_NONE && (be == MOE_NONE || ov > bv || (ov == bv && oe < be))) {
            bv = ov;
            be = oe;
        }
    }
    *bv_out = bv;
    *be_out = be;
}

// Token t's routing by the warp, P experts a lane (ne <= P * warpSize): ids (as floats) and
// weights into route (2k floats); returns the expert of the lane's own slot (slot `lane`, when
// lane < k). Softmax gating: the probabilities (f32 exponentials, their sum in f64), the k
// largest, divided by their f64 sum clamped below at 2^-14. gpt-oss (bias not null): the
// router's bias added to the logits in place, the k largest logits, weighted by the softmax of
// those k alone.
template <int P>
__device__ __forceinline__ hs_u32 moe_warp_route(float *l, const float *bias, hs_u32 ne,
                                                 hs_u32 k, float *ids, float *ws) {
    const hs_u32 lane = threadIdx.x % warpSize;
    float v[P];
#pragma unroll
    for (int j = 0; j < P; ++j) {
        const hs_u32 e = lane + j * warpSize;
        v[j] = 0.0f;
        if (e < ne) {
            v[j] = l[e];
            if (bias != 0) {
                v[j] = v[j] + bias[e];
                l[e] = v[j];
            }
        }
    }
    if (bias == 0) {
        float mx = -3.402823466e+38f;
#pragma unroll
        for (int j = 0; j < P; ++j) {
            if (lane + j * warpSize < ne) {
                mx = fmaxf(mx, v[j]);
            }
        }
        mx = hs_warp_max(mx);
        double sum = 0.0;
#pragma unroll
        for (int j = 0; j < P; ++j) {
            if (lane + j * warpSize < ne) {
                v[j] = expf(v[j] - mx);
                sum += (double)v[j];
            }
        }
        const float inv = (float)(1.0 / moe_warp_sum_f64(sum));
#pragma unroll
        for (int j = 0; j < P; ++j) {
            v[j] = v[j] * inv;
        }
    }
    // Slot i's choice is kept by lane i % warpSize (the normalization below reads them back by
    // shuffles, in slot order): slots below warpSize (every model's k) in registers, the rest
    // (k > warpSize: at most P a lane, as k <= ne) in an array the compiler keeps in local
    // memory, touched only then. Lane 0 writing them to the route and reading them back made a
    // decode step's routing a chain of global-memory round trips; an array for every slot,
    // indexed by i / warpSize, put them all in local memory.
    hs_u32 taken = 0;
    float w0 = 0.0f;
    hs_u32 e0 = 0;
    float wx[P];
    hs_u32 ex[P];
    for (hs_u32 i = 0; i < k; ++i) {
        float bv;
        hs_u32 be;
        moe_warp_best<P>(v, taken, ne, &bv, &be);
        if (be == MOE_NONE) {
            be = 0;  // fewer than k experts: the launcher refuses k > ne, so never reached
        }
        if (be % warpSize == lane) {
            taken |= 1u << (be / warpSize);
        }
        if (i % warpSize == lane) {
            if (i < (hs_u32)warpSize) {
                w0 = bv;
                e0 = be;
            } else {
                wx[i / warpSize] = bv;
                ex[i / warpSize] = be;
            }
        }
    }
    // The weights: divided by their f64 sum clamped below at 2^-14 (softmax gating), or the
    // softmax of the chosen logits (gpt-oss); every lane sums the same values in slot order.
    const float first = HS_SHFL(w0, 0);
    const hs_u32 slots = (k + warpSize - 1) / warpSize;
    if (bias != 0) {
        if (lane < k) {
            w0 = expf(w0 - first);
        }
        for (hs_u32 j = 1; j < slots; ++j) {
            if (j * warpSize + lane < k) {
                wx[j] = expf(wx[j] - first);
            }
        }
    }
    double total = 0.0;
    for (hs_u32 l = 0; l < (hs_u32)warpSize && l < k; ++l) {
        total += (double)HS_SHFL(w0, (int)l);
    }
    for (hs_u32 j = 1; j < slots; ++j) {
        for (hs_u32 l = 0; l < (hs_u32)warpSize && j * warpSize + l < k; ++l) {
            total += (double)HS_SHFL(wx[j], (int)l);
        }
    }
    const float tot = fmaxf((float)total, 6.103515625e-5f);
    const float inv = (float)(1.0 / total);
    if (lane < k) {
        ids[lane] = (float)e0;
        ws[lane] = (bias == 0) ? w0 / tot : w0 * inv;
    }
    for (hs_u32 j = 1; j < slots; ++j) {
        const hs_u32 i = j * warpSize + lane;
        if (i < k) {
            ids[i] = (float)ex[j];
            ws[i] = (bias == 0) ? wx[j] / tot : wx[j] * inv;
        }
    }
    return e0;
}

// moe_warp_route with the fewest experts a lane that hold ne (at most MOE_MAX_EXPERTS, which the
// launcher holds to).
__device__ __forceinline__ hs_u32 moe_warp_route_any(float *l, const float *bias, hs_u32 ne,
                                                     hs_u32 k, float *ids, float *ws) {
    if (ne <= (hs_u32)warpSize) {
        return moe_warp_route<1>(l, bias, ne, k, ids, ws);
    } else if (ne <= 2 * (hs_u32)warpSize) {
        return moe_warp_route<2>(l, bias, ne, k, ids, ws);
    } else if (ne <= 4 * (hs_u32)warpSize) {
        return moe_warp_route<4>(l, bias, ne, k, ids, ws);
    } else if (ne <= 8 * (hs_u32)warpSize) {
        return moe_warp_route<8>(l, bias, ne, k, ids, ws);
    }
    return moe_warp_route<MOE_PER_LANE>(l, bias, ne, k, ids, ws);
}

// The warp-wide inclusive prefix sum of v (every lane of the warp must call it).
__device__ __forceinline__ int moe_warp_scan(int v) {
    const int lane = (int)(threadIdx.x % warpSize);
    for (int o = 1; o < warpSize; o <<= 1) {
        const int t = HS_SHFL_UP(v, o);
        if (lane >= o) {
            v += t;
        }
    }
    return v;
}

// The sort of the n * k routed entries by expert, by one block (the routes written before it):
// the counts per expert; their prefix sums (first sorted entry, first chunk) by the first warp,
// 32 experts a step; the chunk table (a thread per expert); then each entry takes the next place
// of its expert's range by a shared-memory atomic. Within an expert's range the order is the
// atomics' (not token order): every product of an entry is computed on its own (a column of the
// grouped products, a row-dot of the chunked ones) and the combine finds each entry through pos,
// so the results do not depend on it. (One thread placing every entry took 0.85 ms a layer for a
// 512-token Qwen3-30B-A3B prompt on the H100; a thread per expert walking all entries, 0.19 ms.)
__device__ void moe_sort_block(float *route, hs_u32 n, hs_u32 ne, hs_u32 k, hs_u32 nt) {
    __shared__ int cnt[MOE_MAX_EXPERTS];
    __shared__ int first[MOE_MAX_EXPERTS];
    __shared__ int first_chunk[MOE_MAX_EXPERTS];
    int *pos = (int *)(route + (hs_u64)n * k * 2);
    int *tok = pos + (hs_u64)n * k;
    int *chunks = tok + (hs_u64)n * k;
    const hs_u32 nk = n * k;
    for (hs_u32 e = threadIdx.x; e < ne; e += blockDim.x) {
        cnt[e] = 0;
    }
    __syncthreads();
    for (hs_u32 j = threadIdx.x; j < nk; j += blockDim.x) {
        atomicAdd(&cnt[(int)route[(hs_u64)(j / k) * 2 * k + j % k]], 1);
    }
    __syncthreads();
    if (threadIdx.x < (hs_u32)warpSize) {
        int entries = 0;
        int nchunks = 0;
        for (hs_u32 base = 0; base < ne; base += warpSize) {
            const hs_u32 e = base + threadIdx.x;
            const int c = e < ne ? cnt[e] : 0;
            const int ch = (c + (int)nt - 1) / (int)nt;
            const int se = moe_warp_scan(c);
            const int sc = moe_warp_scan(ch);
            if (e < ne) {
                first[e] = entries + se - c;
                first_chunk[e] = nchunks + sc - ch;
            }
            entries += HS_SHFL(se, warpSize - 1);
            nchunks += HS_SHFL(sc, warpSize - 1);
        }
        if (threadIdx.x == 0) {
            chunks[0] = nchunks;
        }
    }
    __syncthreads();
    for (hs_u32 e = threadIdx.x; e < ne; e += blockDim.x) {
        const int c = cnt[e];
        for (int s = 0; s < c; s += (int)nt) {
            int *ch = chunks + 1 + 3 * (first_chunk[e] + s / (int)nt);
            ch[0] = (int)e;
            ch[1] = first[e] + s;
            ch[2] = (c - s < (int)nt) ? c - s : (int)nt;
        }
    }
    __syncthreads();
    for (hs_u32 j = threadIdx.x; j < nk; j += blockDim.x) {
        const int e = (int)route[(hs_u64)(j / k) * 2 * k + j % k];
        const int at = atomicAdd(&first[e], 1);
        pos[j] = at;
        tok[at] = (int)(j / k);
    }
}

// The sort of one token's k entries (a decode step), by the warp that routed it: its k experts
// are distinct (top-k), so entry i's sorted place is the count of chosen experts below its own
// and every chunk is one entry — the table moe_sort_block makes, without its shared counts,
// atomics and block barriers (a decode step's routing took ~14 µs a layer with them on the
// H100, most of it the sort). mine: lane i's expert for slot i, as routing left it in a register
// (read back from the route, it was a global-memory round trip after the stores).
__device__ __forceinline__ void moe_sort_one(float *route, hs_u32 k, hs_u32 mine) {
    const hs_u32 lane = threadIdx.x % warpSize;
    int *pos = (int *)(route + 2 * k);
    int *tok = pos + k;
    int *chunks = tok + k;
    const int e = (lane < k) ? (int)mine : 0x7fffffff;
    int rank = 0;
    for (hs_u32 j = 0; j < k; ++j) {
        rank += (HS_SHFL(e, (int)j) < e) ? 1 : 0;
    }
    if (lane < k) {
        pos[lane] = rank;
        tok[rank] = 0;
        int *ch = chunks + 1 + 3 * rank;
        ch[0] = e;
        ch[1] = rank;
        ch[2] = 1;
    }
    if (lane == 0) {
        chunks[0] = (int)k;
    }
}

// Routing: token t by warp t of the grid (grid-stride), its ids and weights into route
// (moe_warp_route; bias: gpt-oss's router bias, or null). `sort` (a one-block launch, as a
// decode step's): the block then sorts the entries itself (one token: its warp, moe_sort_one;
// more: moe_sort_block), one launch for both;
// prompt batches route over many blocks and sort in hs_moe_sort after.
HS_KERNEL void hs_moe_route(HS_TRACK_PARAMS, float *logits, float *route, hs_u32 n, hs_u32 ne,
                            hs_u32 k, hs_u32 nt, const float *bias, hs_u32 sort) {
    HS_BREADCRUMB();
    const hs_u32 nwarps = blockDim.x / warpSize;
    hs_u32 mine = 0;
    for (hs_u32 t = blockIdx.x * nwarps + threadIdx.x / warpSize; t < n;
         t += gridDim.x * nwarps) {
        float *ids = route + (hs_u64)t * 2 * k;
        mine = moe_warp_route_any(logits + (hs_u64)t * ne, bias, ne, k, ids, ids + k);
    }
    if (sort != 0 && n == 1 && k <= (hs_u32)warpSize) {
        // Token 0 was routed by warp 0 of block 0 (the launch's only block).
        if (threadIdx.x < (hs_u32)warpSize) {
            moe_sort_one(route, k, mine);
        }
    } else if (sort != 0) {
        // The routes written by other warps of the block (global memory).
        __threadfence_block();
        __syncthreads();
        moe_sort_block(route, n, ne, k, nt);
    }
}

HS_KERNEL void hs_moe_sort(HS_TRACK_PARAMS, float *route, hs_u32 n, hs_u32 ne, hs_u32 k,
                           hs_u32 nt) {
    HS_BREADCRUMB();
    moe_sort_block(route, n, ne, k, nt);
}

HS_KERNEL void hs_moe_gather(HS_TRACK_PARAMS, const float *x, float *xs, const float *route,
                             hs_u32 n, hs_u32 k, hs_u32 dim) {
    HS_BREADCRUMB();
    const int *tok = (const int *)(route + (hs_u64)n * k * 2) + (hs_u64)n * k;
    const hs_u64 total = (hs_u64)n * k * dim;
    const hs_u64 stride = (hs_u64)gridDim.x * blockDim.x;
    for (hs_u64 i = (hs_u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const hs_u64 j = i / dim;
        xs[i] = x[(hs_u64)tok[j] * dim + i % dim];
    }
}

// db: gpt-oss's down biases (dim per expert), added to each entry's output before its weight; or
// null.
HS_KERNEL void hs_moe_combine(HS_TRACK_PARAMS, float *acc, const float *y, const float *route,
                              hs_u32 n, hs_u32 k, hs_u32 dim, const float *db) {
    HS_BREADCRUMB();
    const int *pos = (const int *)(route + (hs_u64)n * k * 2);
    const hs_u64 total = (hs_u64)n * dim;
    const hs_u64 stride = (hs_u64)gridDim.x * blockDim.x;
    for (hs_u64 i = (hs_u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const hs_u64 t = i / dim;
        const hs_u64 r = i % dim;
        const float *ids = route + t * 2 * k;
        const float *ws = ids + k;
        float s = 0.0f;
        for (hs_u32 j = 0; j < k; ++j) {
            float v = y[(hs_u64)pos[t * k + j] * dim + r];
            if (db != 0) {
                v = v + db[(hs_u64)ids[j] * dim + r];
            }
            s = (j == 0) ? v * ws[0] : s + v * ws[j];
        }
        acc[i] = acc[i] + s;
    }
}
