// Matrix-vector products y[t * rows + r] = W[r, :] . x[t, :] for up to HS_MV_MAX_TOK tokens, W
// in its stored (quantized) form, dequantized on the fly by the per-type dot products of
// vecdot.h (compiled before this file). One warp per row, lanes striding over the row's blocks,
// so the row's bytes are read once, coalesced, for all the tokens.
//
// Every kernel here serves dense products and the experts of a mixture of experts alike, as
// ggml's mmvq does: `ids` is the MoE route (infer_moe.hip's layout; null for a dense product).
// With it, blockIdx.y is a chunk of the route's sort (moe_chunk): the rows are expert e's (W is
// the experts' matrices one after another), the tokens the chunk's entries s .. s + c of the
// sorted inputs, and the outputs go to those entries' rows.
//
// (About 720 lines, over the 700 the style asks: the float products, 100 of them, share this
// source's compile units and type lists in units.rs; a file of their own would be one more
// source to scope there.)
//
// The kernels of each weight type are generated from the type lists that the host defines
// before this file for each compile unit (src/gpu/compute/units.rs, from plan.rs's type table: a
// unit holds one type's kernels, or a part of them, so a model compiles only what it launches):
//   HS_MV_TYPES(X)          X(type, BL, BB, PARTS): hs_mv_<type> (up to 8 tokens)
//   HS_MV_GATE_UP_TYPES(X)  X(type, BL, BB, PARTS): hs_mv_gate_up_<type> (gate and up, the
//                           activation in the epilogue, up to 8 tokens: the experts' chunks)
//   HS_MV1_PART_TYPES(X)    X(type, BL, BB, PARTS): the one-token kernels hs_mv1_<type>,
//                           hs_mv_swiglu_<type>, hs_mv_qkv_<type> on the part-per-lane loop
//   HS_MV1_WIDE_TYPES(X)    X(type, BL, BB): the same three on the wide loop (a lane per item)
//   HS_MVF_TYPES(X)         X(type, BL, BB): hs_mv1f_, hs_mv_swigluf_, hs_mv_qkvf_<type>, the
//                           activation-precision study's f32-activation variants
//   HS_MV_FLOAT_TYPES(X), HS_MV_FLOAT_GATE_UP_TYPES(X)
//                           X(type, ES): hs_mv_<type>, hs_mv_gate_up_<type> of F32/F16/BF16
// (BL elements and BB bytes per block, PARTS parts of 8 elements per block, ES bytes an element).

#define HS_MV_MAX_TOK 8

#define MV_CAT_(a, b) a##b
#define MV_CAT(a, b) MV_CAT_(a, b)

// This block's slice of the product: the expert (0 for a dense product) and the first of the
// tokens (entries) and their count; false past the route's last chunk.
__device__ __forceinline__ bool mv_slice(const float *ids, hs_u32 n, hs_u32 k, hs_u32 ntok,
                                         hs_u64 *e, hs_u64 *s, hs_u32 *c) {
    if (ids == 0) {
        *e = 0;
        *s = 0;
        *c = ntok;
        return true;
    }
    int ce, cs, cc;
    if (!moe_chunk(ids, n, k, &ce, &cs, &cc)) {
        return false;
    }
    *e = (hs_u64)ce;
    *s = (hs_u64)cs;
    *c = (hs_u32)cc;
    return true;
}

// The activation row of a gate/up slice starting at entry s: s, the entries' rows gathered in
// sorted order; for one token (a decode step: every entry is token 0) row 0, the token's row as
// it is, which the host quantizes once instead of gathering k copies.
__device__ __forceinline__ hs_u64 mv_act_row(const float *ids, hs_u32 n, hs_u64 s) {
    return (ids != 0 && n == 1) ? 0 : s;
}

// __syncwarp; a wavefront executes in lockstep, so a wavefront-scope fence pair around the wave
// barrier (which keeps the compiler from moving LDS accesses across it) is enough there.
#if defined(HS_BACKEND_HIP)
#define MV_SYNCWARP()                                                                          \
    do {                                                                                       \
        __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");                                 \
        __builtin_amdgcn_wave_barrier();                                                       \
        __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");                                 \
    } while (0)
#else
#define MV_SYNCWARP() __syncwarp()
#endif

// Staging of weight rows through shared memory: the warp copies a chunk of whole blocks of its
// row with 16-byte loads (every lane MV_STAGE_LOADS of them, all in flight before the first
// store), then the lanes read the parts out of shared memory. The quantized block layouts are
// only 2-byte aligned (18-byte Q4_0 blocks, 34-byte Q8_0 ones), so reading the parts straight
// from global memory takes 16-bit loads; staged, the row is read at the full load width. The
// chunk's first and last 16-byte words are aligned down and up: they may reach up to 15 bytes
// beyond the chunk, never beyond the 16-byte words holding the weights' own first and last
// bytes (the arena aligns every buffer to far more than 16).
#define MV_STAGE_LOADS 4
#define MV_STAGE_WORDS (MV_STAGE_LOADS * 32)
#define MV_STAGE_MAX_WARPS 4

// The dot products of one weight row `wr` with NT tokens' Q8 activations, summed over the warp
// (every lane gets the sums). The row goes through shared memory in chunks (above). PARTS divides
// the warp, so lane l takes the same part, l % PARTS, of every warpSize / PARTS-th block, starting
// at block l / PARTS: the warp reads consecutive bytes, and the loop carries a block index and
// nothing else (the general item index, its division and remainder cost more instructions than
// the part's own arithmetic, and decode is bound by instruction issue before bandwidth). U blocks
// per lane are issued together. NT and U are template constants, so a one-token product keeps one
// accumulator and no per-token branches. Every lane of the warp must call it (the staging
// synchronises the warp). Every function that calls it is __forceinline__ too: its `stage` must
// belong to the kernel that uses it. Reached through a function that is not inlined, ROCm 5.2's
// compiler puts the stage of every instantiation in the module into every such kernel (nine of
// them, 72 KiB, over the 64 KiB a workgroup has on gfx1030).
template <float (*PART)(const unsigned char *, hs_u32, const signed char *, const float *),
          hs_u32 BL, hs_u32 BB, hs_u32 PARTS, int NT, int U>
__device__ __forceinline__ void mv_row_dots(const unsigned char *wr, const signed char *xq,
                                            const float *xd, hs_u32 cols, hs_u32 ntok,
                                            float *acc) {
    __shared__ uint4 stage[MV_STAGE_MAX_WARPS][MV_STAGE_WORDS];
    const hs_u32 lane = threadIdx.x % warpSize;
    const hs_u32 wid = (threadIdx.x / warpSize) % MV_STAGE_MAX_WARPS;
    uint4 *sw = stage[wid];
    const hs_u32 nblocks = cols / BL;
    // Whole blocks per chunk: what fits in the stage with room for the 16-byte misalignment,
    // spread evenly over the chunks.
    const hs_u32 fit = (MV_STAGE_WORDS * 16 - 16) / BB;
    const hs_u32 nchunks = (nblocks + fit - 1) / fit;
    const hs_u32 per = (nblocks + nchunks - 1) / nchunks;
    const hs_u32 part = lane % PARTS;
    const hs_u32 bstep = warpSize / PARTS;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        acc[t] = 0.0f;
    }
    for (hs_u32 blk0 = 0; blk0 < nblocks; blk0 += per) {
        const hs_u32 nb = (nblocks - blk0 < per) ? nblocks - blk0 : per;
        const unsigned char *g0 = wr + (hs_u64)blk0 * BB;
        const hs_u64 a0 = (hs_u64)g0 & ~(hs_u64)15;
        const hs_u64 a1 = ((hs_u64)(g0 + (hs_u64)nb * BB) + 15) & ~(hs_u64)15;
        const hs_u32 nwords = (hs_u32)((a1 - a0) / 16);
        const uint4 *src = (const uint4 *)a0;
        uint4 v[MV_STAGE_LOADS];
#pragma unroll
        for (int k = 0; k < MV_STAGE_LOADS; ++k) {
            const hs_u32 i = lane + k * warpSize;
            if (i < nwords && i < MV_STAGE_WORDS) {
                v[k] = src[i];
            }
        }
#pragma unroll
        for (int k = 0; k < MV_STAGE_LOADS; ++k) {
            const hs_u32 i = lane + k * warpSize;
            if (i < nwords && i < MV_STAGE_WORDS) {
                sw[i] = v[k];
            }
        }
        MV_SYNCWARP();
        const unsigned char *sb = (const unsigned char *)sw + ((hs_u64)g0 & 15);
        const signed char *xqc = xq + (hs_u64)blk0 * BL;
        const float *xdc = xd + 2 * (hs_u64)blk0;
        for (hs_u32 b0 = lane / PARTS; b0 < nb; b0 += U * bstep) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const hs_u32 b = b0 + u * bstep;
                if (b < nb) {
#pragma unroll
                    for (int t = 0; t < NT; ++t) {
                        if (NT == 1 || (hs_u32)t < ntok) {
                            acc[t] += PART(sb + b * BB, part, xqc + (hs_u64)t * cols + b * BL,
                                           xdc + 2 * ((hs_u64)t * nblocks + b));
                        }
                    }
                }
            }
        }
        MV_SYNCWARP();
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        acc[t] = hs_warp_sum(acc[t]);
    }
}

// ---- The part-per-lane loop: every quantized type, up to HS_MV_MAX_TOK tokens ----------------

// One warp per row (rows beyond the grid's first pass are taken in further passes, so any warp
// size works with any grid). NT tokens at most (c of them); y[t * rows + row] = dot (+ bias[row]
// where bias is given; added to y[...] where `accumulate`: the residual add in the product's
// epilogue, summed as the separate add kernels sum, term for term).
template <float (*PART)(const unsigned char *, hs_u32, const signed char *, const float *),
          hs_u32 BL, hs_u32 BB, hs_u32 PARTS, int NT>
__device__ __forceinline__ void mv_quant(const unsigned char *w, const signed char *xq,
                                         const float *xd, float *y, const float *bias,
                                         hs_u32 rows, hs_u32 cols, hs_u32 ntok,
                                         hs_u32 accumulate, const float *ids, hs_u32 n,
                                         hs_u32 k) {
    hs_u64 e, s;
    hs_u32 c;
    if (!mv_slice(ids, n, k, ntok, &e, &s, &c)) {
        return;
    }
    const hs_u32 lane = threadIdx.x % warpSize;
    const hs_u32 nwarps = blockDim.x / warpSize;
    const hs_u64 row_bytes = (hs_u64)(cols / BL) * BB;
    w += e * rows * row_bytes;
    xq += s * cols;
    xd += 2 * s * (cols / BL);
    y += s * rows;
    for (hs_u32 row = blockIdx.x * nwarps + threadIdx.x / warpSize; row < rows;
         row += gridDim.x * nwarps) {
        float acc[NT];
        mv_row_dots<PART, BL, BB, PARTS, NT, (NT == 1 ? 8 : 4)>(w + (hs_u64)row * row_bytes, xq,
                                                                xd, cols, c, acc);
        if (lane == 0) {
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if ((hs_u32)t < c) {
                    float v = acc[t];
                    if (bias != 0) {
                        v += bias[e * rows + row];
                    }
                    if (accumulate != 0) {
                        v = y[(hs_u64)t * rows + row] + v;
                    }
                    y[(hs_u64)t * rows + row] = v;
                }
            }
        }
    }
}

// Gate and up in one launch, the activation in the epilogue: h[t * rows + row] =
// moe_act(gate . x[t], up . x[t]) (silu(gate) * up, as hs_swiglu_inplace computes it; with
// gpt-oss's biases gb / ub, rows per expert, its clamped SwiGLU). A dense product (ids null) has
// no use for n and k: k then names the activation (0 SiLU, 1 GELU: Gemma's GeGLU).
template <float (*PART)(const unsigned char *, hs_u32, const signed char *, const float *),
          hs_u32 BL, hs_u32 BB, hs_u32 PARTS, int NT>
__device__ __forceinline__ void mv_quant_gate_up(const unsigned char *wg, const unsigned char *wu,
                                                 const signed char *xq, const float *xd,
                                                 float *h, hs_u32 rows, hs_u32 cols,
                                                 hs_u32 ntok, const float *gb, const float *ub,
                                                 const float *ids, hs_u32 n, hs_u32 k) {
    hs_u64 e, s;
    hs_u32 c;
    if (!mv_slice(ids, n, k, ntok, &e, &s, &c)) {
        return;
    }
    const hs_u32 act = (ids == 0) ? k : 0;
    const hs_u32 lane = threadIdx.x % warpSize;
    const hs_u32 nwarps = blockDim.x / warpSize;
    const hs_u64 row_bytes = (hs_u64)(cols / BL) * BB;
    const hs_u64 sx = mv_act_row(ids, n, s);
    xq += sx * cols;
    xd += 2 * sx * (cols / BL);
    h += s * rows;
    for (hs_u32 row = blockIdx.x * nwarps + threadIdx.x / warpSize; row < rows;
         row += gridDim.x * nwarps) {
        const hs_u64 r = e * rows + row;
        float g[NT];
        float u[NT];
        mv_row_dots<PART, BL, BB, PARTS, NT, (NT == 1 ? 8 : 4)>(wg + r * row_bytes, xq, xd, cols,
                                                                c, g);
        mv_row_dots<PART, BL, BB, PARTS, NT, (NT == 1 ? 8 : 4)>(wu + r * row_bytes, xq, xd, cols,
                                                                c, u);
        if (lane == 0) {
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if ((hs_u32)t < c) {
                    h[(hs_u64)t * rows + row] = moe_act(g[t], u[t], gb, ub, r, act);
                }
            }
        }
    }
}

// One token through Q, K and V in one launch: rows 0..r0 of the grid are W0's, the next r1 W1's,
// the next r2 W2's, each written (with its bias, where given) to its own output.
template <float (*PART)(const unsigned char *, hs_u32, const signed char *, const float *),
          hs_u32 BL, hs_u32 BB, hs_u32 PARTS>
__device__ __forceinline__ void mv_quant_qkv(const unsigned char *w0, const unsigned char *w1,
                                             const unsigned char *w2, float *y0, float *y1,
                                             float *y2, const float *b0, const float *b1,
                                             const float *b2, const signed char *xq,
                                             const float *xd, hs_u32 r0, hs_u32 r1, hs_u32 r2,
                                             hs_u32 cols) {
    const hs_u32 lane = threadIdx.x % warpSize;
    const hs_u32 nwarps = blockDim.x / warpSize;
    const hs_u64 row_bytes = (hs_u64)(cols / BL) * BB;
    const hs_u32 rows = r0 + r1 + r2;
    for (hs_u32 g = blockIdx.x * nwarps + threadIdx.x / warpSize; g < rows;
         g += gridDim.x * nwarps) {
        const unsigned char *w = w0;
        float *y = y0;
        const float *b = b0;
        hs_u32 row = g;
        if (g >= r0 + r1) {
            w = w2;
            y = y2;
            b = b2;
            row = g - r0 - r1;
        } else if (g >= r0) {
            w = w1;
            y = y1;
            b = b1;
            row = g - r0;
        }
        float acc[1];
        mv_row_dots<PART, BL, BB, PARTS, 1, 8>(w + (hs_u64)row * row_bytes, xq, xd, cols, 1, acc);
        if (lane == 0) {
            y[row] = (b != 0) ? acc[0] + b[row] : acc[0];
        }
    }
}

// ---- The wide loop: one token, a lane per 32-element item --------------------------------------
//
// The one-token kernels of the types vecdot.h gives an mvw_<type> (a fifth of the instructions of
// the part-per-lane loop, and no shared memory). Two items a lane are in flight together, and mv1
// and qkv take two rows a warp, swiglu gate and up.

// The dot products of R weight rows wr[r] with one token's Q8 activations over `items` items,
// summed over the warp (every lane gets them). Two items a lane per step, both always computed (the
// second on a clamped index and dropped past the end) so that all their loads are issued together.
// Every lane of the warp must call it.
template <typename X, float (*DOT)(const unsigned char *, hs_u32, const X &),
          void (*LX)(const signed char *, const float *, hs_u32, X &), int R>
__device__ __forceinline__ void mvw_dots(const unsigned char *const *wr, const signed char *xq,
                                         const float *xd, hs_u32 items, float *acc) {
    const hs_u32 lane = threadIdx.x % warpSize;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        acc[r] = 0.0f;
    }
    for (hs_u32 i = lane; i < items; i += 2 * warpSize) {
        const hs_u32 j = i + warpSize;
        const bool two = j < items;
        const hs_u32 jj = two ? j : i;
        X x0;
        X x1;
        LX(xq, xd, i, x0);
        LX(xq, xd, jj, x1);
        float p0[R];
        float p1[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            p0[r] = DOT(wr[r], i, x0);
            p1[r] = DOT(wr[r], jj, x1);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            acc[r] += p0[r];
            if (two) {
                acc[r] += p1[r];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        acc[r] = hs_warp_sum(acc[r]);
    }
}
// Rows a warp of the wide mv1 and qkv kernels (`MV_WIDE_ROWS` in src/gpu/compute/plan.rs).
#define MVW_ROWS 2

// One token, MVW_ROWS rows a warp: as mv_quant with NT = 1.
template <typename X, float (*DOT)(const unsigned char *, hs_u32, const X &),
          void (*LX)(const signed char *, const float *, hs_u32, X &), hs_u32 BL, hs_u32 BB>
__device__ __forceinline__ void mvw_mv1(const unsigned char *w, const signed char *xq,
                                        const float *xd, float *y, const float *bias,
                                        hs_u32 rows, hs_u32 cols, hs_u32 accumulate,
                                        const float *ids, hs_u32 n, hs_u32 k) {
    hs_u64 e, s;
    hs_u32 c;
    if (!mv_slice(ids, n, k, 1, &e, &s, &c)) {
        return;
    }
    const hs_u32 lane = threadIdx.x % warpSize;
    const hs_u32 nwarps = blockDim.x / warpSize;
    const hs_u64 row_bytes = (hs_u64)(cols / BL) * BB;
    w += e * rows * row_bytes;
    xq += s * cols;
    xd += 2 * s * (cols / BL);
    y += s * rows;
    for (hs_u32 r0 = (blockIdx.x * nwarps + threadIdx.x / warpSize) * MVW_ROWS; r0 < rows;
         r0 += gridDim.x * nwarps * MVW_ROWS) {
        const unsigned char *wr[MVW_ROWS];
#pragma unroll
        for (int r = 0; r < MVW_ROWS; ++r) {
            const hs_u32 row = (r0 + r < rows) ? r0 + r : r0;
            wr[r] = w + (hs_u64)row * row_bytes;
        }
        float acc[MVW_ROWS];
        mvw_dots<X, DOT, LX, MVW_ROWS>(wr, xq, xd, cols / 32, acc);
#pragma unroll
        for (int r = 0; r < MVW_ROWS; ++r) {
            const hs_u32 row = r0 + r;
            if (lane == 0 && row < rows) {
                float v = acc[r];
                if (bias != 0) {
                    v += bias[e * rows + row];
                }
                if (accumulate != 0) {
                    v = y[row] + v;
                }
                y[row] = v;
            }
        }
    }
}

// One token through Q, K and V in one launch, MVW_ROWS rows a warp: as mv_quant_qkv.
template <typename X, float (*DOT)(const unsigned char *, hs_u32, const X &),
          void (*LX)(const signed char *, const float *, hs_u32, X &), hs_u32 BL, hs_u32 BB>
__device__ __forceinline__ void mvw_qkv(const unsigned char *w0, const unsigned char *w1,
                                        const unsigned char *w2, float *y0, float *y1,
                                        float *y2, const float *b0, const float *b1,
                                        const float *b2, const signed char *xq,
                                        const float *xd, hs_u32 r0, hs_u32 r1, hs_u32 r2,
                                        hs_u32 cols) {
    const hs_u32 lane = threadIdx.x % warpSize;
    const hs_u32 nwarps = blockDim.x / warpSize;
    const hs_u64 row_bytes = (hs_u64)(cols / BL) * BB;
    const hs_u32 rows = r0 + r1 + r2;
    for (hs_u32 g0 = (blockIdx.x * nwarps + threadIdx.x / warpSize) * MVW_ROWS; g0 < rows;
         g0 += gridDim.x * nwarps * MVW_ROWS) {
        const unsigned char *wr[MVW_ROWS];
        float *yr[MVW_ROWS];
        const float *br[MVW_ROWS];
        hs_u32 row[MVW_ROWS];
#pragma unroll
        for (int r = 0; r < MVW_ROWS; ++r) {
            const hs_u32 g = (g0 + r < rows) ? g0 + r : g0;
            const unsigned char *wm = w0;
            yr[r] = y0;
            br[r] = b0;
            row[r] = g;
            if (g >= r0 + r1) {
                wm = w2;
                yr[r] = y2;
                br[r] = b2;
                row[r] = g - r0 - r1;
            } else if (g >= r0) {
                wm = w1;
                yr[r] = y1;
                br[r] = b1;
                row[r] = g - r0;
            }
            wr[r] = wm + (hs_u64)row[r] * row_bytes;
        }
        float acc[MVW_ROWS];
        mvw_dots<X, DOT, LX, MVW_ROWS>(wr, xq, xd, cols / 32, acc);
#pragma unroll
        for (int r = 0; r < MVW_ROWS; ++r) {
            if (lane == 0 && g0 + r < rows) {
                yr[r][row[r]] = (br[r] != 0) ? acc[r] + br[r][row[r]] : acc[r];
            }
        }
    }
}

// One token through gate and up in one launch, a row a warp (its gate and up rows share the
// activation loads), the activation in the epilogue: as mv_quant_gate_up with NT = 1.
template <typename X, float (*DOT)(const unsigned char *, hs_u32, const X &),
          void (*LX)(const signed char *, const float *, hs_u32, X &), hs_u32 BL, hs_u32 BB>
__device__ __forceinline__ void mvw_gate_up(const unsigned char *wg, const unsigned char *wu,
                                            const signed char *xq, const float *xd, float *h,
                                            hs_u32 rows, hs_u32 cols, const float *gb,
                                            const float *ub, const float *ids, hs_u32 n,
                                            hs_u32 k) {
    hs_u64 e, s;
    hs_u32 c;
    if (!mv_slice(ids, n, k, 1, &e, &s, &c)) {
        return;
    }
    const hs_u32 act = (ids == 0) ? k : 0;
    const hs_u32 lane = threadIdx.x % warpSize;
    const hs_u32 nwarps = blockDim.x / warpSize;
    const hs_u64 row_bytes = (hs_u64)(cols / BL) * BB;
    const hs_u64 sx = mv_act_row(ids, n, s);
    xq += sx * cols;
    xd += 2 * sx * (cols / BL);
    h += s * rows;
    for (hs_u32 row = blockIdx.x * nwarps + threadIdx.x / warpSize; row < rows;
         row += gridDim.x * nwarps) {
        const hs_u64 r = e * rows + row;
        const unsigned char *wr[2] = {wg + r * row_bytes, wu + r * row_bytes};
        float acc[2];
        mvw_dots<X, DOT, LX, 2>(wr, xq, xd, cols / 32, acc);
        if (lane == 0) {
            h[row] = moe_act(acc[0], acc[1], gb, ub, r, act);
        }
    }
}

// ---- F32 / F16 / BF16 weights against f32 activations ------------------------------------------
//
// A block per row (the launcher's grid is the row count, capped; further rows in further passes),
// its threads striding over the row's elements, sixteen of a thread's loads issued together (a
// 2048-wide row in one pass of a 128-thread block), the partial sums reduced over the block.
// These products are few-row ones (MoE routers: 128 × 2048 for Qwen3-30B-A3B, 32 × 2880 for
// gpt-oss): a warp per row gave a 32-block grid on a 132-SM H100 (25 µs against llama.cpp's 4).
// With a gate (wu not null), h = moe_act(gate . x, up . x), as the quantized gate_up.

template <float (*DQ)(const unsigned char *, hs_u32), hs_u32 ES>
__device__ __forceinline__ void mv_float(const unsigned char *wg, const unsigned char *wu,
                                         const float *x, float *y, hs_u32 rows, hs_u32 cols,
                                         hs_u32 ntok, const float *gb, const float *ub,
                                         const float *ids, hs_u32 n, hs_u32 k) {
    __shared__ float red[2][HS_MV_MAX_TOK][32];
    hs_u64 e, s;
    hs_u32 c;
    if (!mv_slice(ids, n, k, ntok, &e, &s, &c)) {
        return;
    }
    const hs_u32 lane = threadIdx.x % warpSize;
    const hs_u32 wid = threadIdx.x / warpSize;
    const hs_u32 nwarps = blockDim.x / warpSize;
    const int nw = (wu != 0) ? 2 : 1;
    x += s * cols;
    y += s * rows;
    for (hs_u32 row = blockIdx.x; row < rows; row += gridDim.x) {
        const hs_u64 r = e * rows + row;
        for (int m = 0; m < nw; ++m) {
            const unsigned char *wr = (m == 0 ? wg : wu) + r * cols * ES;
            float acc[HS_MV_MAX_TOK];
#pragma unroll
            for (int t = 0; t < HS_MV_MAX_TOK; ++t) {
                acc[t] = 0.0f;
            }
            for (hs_u32 c0 = threadIdx.x; c0 < cols; c0 += blockDim.x * 16) {
                float wv[16];
#pragma unroll
                for (int u = 0; u < 16; ++u) {
                    const hs_u32 cc = c0 + (hs_u32)u * blockDim.x;
                    wv[u] = cc < cols ? DQ(wr, cc) : 0.0f;
                }
                if (c == 1) {
                    // One token (a decode step's router): its inputs loaded with the weights,
                    // before any product (behind the per-token guards below, each product
                    // waited on its own load: 11.8 us a Qwen3-30B-A3B router on the H100).
                    float xv[16];
#pragma unroll
                    for (int u = 0; u < 16; ++u) {
                        const hs_u32 cc = c0 + (hs_u32)u * blockDim.x;
                        xv[u] = cc < cols ? x[cc] : 0.0f;
                    }
#pragma unroll
                    for (int u = 0; u < 16; ++u) {
                        if (c0 + (hs_u32)u * blockDim.x < cols) {
                            acc[0] += wv[u] * xv[u];
                        }
                    }
                    continue;
                }
#pragma unroll
                for (int u = 0; u < 16; ++u) {
                    const hs_u32 cc = c0 + (hs_u32)u * blockDim.x;
                    if (cc < cols) {
#pragma unroll
                        for (int t = 0; t < HS_MV_MAX_TOK; ++t) {
                            if ((hs_u32)t < c) {
                                acc[t] += wv[u] * x[(hs_u64)t * cols + cc];
                            }
                        }
                    }
                }
            }
#pragma unroll
            for (int t = 0; t < HS_MV_MAX_TOK; ++t) {
                if ((hs_u32)t < c) {
                    const float v = hs_warp_sum(acc[t]);
                    if (lane == 0) {
                        red[m][t][wid] = v;
                    }
                }
            }
        }
        __syncthreads();
        if (threadIdx.x < c) {
            float v[2] = {0.0f, 0.0f};
            for (int m = 0; m < nw; ++m) {
                for (hs_u32 i = 0; i < nwarps; ++i) {
                    v[m] += red[m][threadIdx.x][i];
                }
            }
            y[(hs_u64)threadIdx.x * rows + row] =
                (nw == 2) ? moe_act(v[0], v[1], gb, ub, r, 0) : v[0];
        }
        __syncthreads();
    }
}

// ---- The kernels, generated per weight type from the unit's type lists ----------------------
// Every kernel of a family takes the same arguments, so the host launches any type alike:
//   hs_mv_<t>         (w, xq, xd, xf, y, rows, cols, ntok, ids, n, k): quantized kernels read
//                     the Q8 quants xq and their per-block (d, d * sum) xd, float ones xf;
//   hs_mv_gate_up_<t> (wg, wu, xq, xd, xf, h, rows, cols, ntok, gb, ub, ids, n, k);
//   hs_mv1_<t>        (w, xq, xd, y, bias, rows, cols, accumulate, ids, n, k);
//   hs_mv_swiglu_<t>  (wg, wu, xq, xd, h, rows, cols, gb, ub, ids, n, k) (ids null: k is the
//                     activation, 0 SiLU, 1 GELU);
//   hs_mv_qkv_<t>     (w0, w1, w2, y0, y1, y2, b0, b1, b2, xq, xd, r0, r1, r2, cols);
//   hs_mv1f_, hs_mv_swigluf_, hs_mv_qkvf_<t>: as mv1, swiglu, qkv with the f32 input in xq's
//                     place and xd unused.

#define HS_MV_KERNELS(T, BL, BB, PARTS)                                                        \
    HS_KERNEL void hs_mv_##T(HS_TRACK_PARAMS, const unsigned char *w, const signed char *xq,   \
                             const float *xd, const float *xf, float *y, hs_u32 rows,          \
                             hs_u32 cols, hs_u32 ntok, const float *ids, hs_u32 n, hs_u32 k) { \
        HS_BREADCRUMB();                                                                       \
        mv_quant<mv_part_##T, BL, BB, PARTS, HS_MV_MAX_TOK>(w, xq, xd, y, 0, rows, cols, ntok, \
                                                            0, ids, n, k);                     \
    }

#define HS_MV_GATE_UP_KERNELS(T, BL, BB, PARTS)                                                \
    HS_KERNEL void hs_mv_gate_up_##T(HS_TRACK_PARAMS, const unsigned char *wg,                 \
                                     const unsigned char *wu, const signed char *xq,           \
                                     const float *xd, const float *xf, float *h, hs_u32 rows,  \
                                     hs_u32 cols, hs_u32 ntok, const float *gb,                \
                                     const float *ub, const float *ids, hs_u32 n, hs_u32 k) {  \
        HS_BREADCRUMB();                                                                       \
        mv_quant_gate_up<mv_part_##T, BL, BB, PARTS, HS_MV_MAX_TOK>(wg, wu, xq, xd, h, rows,   \
                                                                    cols, ntok, gb, ub, ids,   \
                                                                    n, k);                     \
    }

#define HS_MV1_PART_KERNELS(T, BL, BB, PARTS)                                                  \
    HS_KERNEL void hs_mv1_##T(HS_TRACK_PARAMS, const unsigned char *w, const signed char *xq,  \
                              const float *xd, float *y, const float *bias, hs_u32 rows,       \
                              hs_u32 cols, hs_u32 accumulate, const float *ids, hs_u32 n,      \
                              hs_u32 k) {                                                      \
        HS_BREADCRUMB();                                                                       \
        mv_quant<mv_part_##T, BL, BB, PARTS, 1>(w, xq, xd, y, bias, rows, cols, 1, accumulate, \
                                                ids, n, k);                                    \
    }                                                                                          \
    HS_KERNEL void hs_mv_swiglu_##T(HS_TRACK_PARAMS, const unsigned char *wg,                  \
                                    const unsigned char *wu, const signed char *xq,            \
                                    const float *xd, float *h, hs_u32 rows, hs_u32 cols,       \
                                    const float *gb, const float *ub, const float *ids,        \
                                    hs_u32 n, hs_u32 k) {                                      \
        HS_BREADCRUMB();                                                                       \
        mv_quant_gate_up<mv_part_##T, BL, BB, PARTS, 1>(wg, wu, xq, xd, h, rows, cols, 1, gb,  \
                                                        ub, ids, n, k);                        \
    }                                                                                          \
    HS_KERNEL void hs_mv_qkv_##T(HS_TRACK_PARAMS, const unsigned char *w0,                     \
                                 const unsigned char *w1, const unsigned char *w2, float *y0,  \
                                 float *y1, float *y2, const float *b0, const float *b1,       \
                                 const float *b2, const signed char *xq, const float *xd,      \
                                 hs_u32 r0, hs_u32 r1, hs_u32 r2, hs_u32 cols) {               \
        HS_BREADCRUMB();                                                                       \
        mv_quant_qkv<mv_part_##T, BL, BB, PARTS>(w0, w1, w2, y0, y1, y2, b0, b1, b2, xq, xd,   \
                                                 r0, r1, r2, cols);                            \
    }

#define HS_MV1_WIDE_KERNELS(T, BL, BB)                                                         \
    HS_KERNEL void hs_mv1_##T(HS_TRACK_PARAMS, const unsigned char *w, const signed char *xq,  \
                              const float *xd, float *y, const float *bias, hs_u32 rows,       \
                              hs_u32 cols, hs_u32 accumulate, const float *ids, hs_u32 n,      \
                              hs_u32 k) {                                                      \
        HS_BREADCRUMB();                                                                       \
        mvw_mv1<mvw_x, mvw_##T, MV_CAT(mvw_x, BL), BL, BB>(w, xq, xd, y, bias, rows, cols,     \
                                                           accumulate, ids, n, k);             \
    }                                                                                          \
    HS_KERNEL void hs_mv_swiglu_##T(HS_TRACK_PARAMS, const unsigned char *wg,                  \
                                    const unsigned char *wu, const signed char *xq,            \
                                    const float *xd, float *h, hs_u32 rows, hs_u32 cols,       \
                                    const float *gb, const float *ub, const float *ids,        \
                                    hs_u32 n, hs_u32 k) {                                      \
        HS_BREADCRUMB();                                                                       \
        mvw_gate_up<mvw_x, mvw_##T, MV_CAT(mvw_x, BL), BL, BB>(wg, wu, xq, xd, h, rows, cols,  \
                                                               gb, ub, ids, n, k);             \
    }                                                                                          \
    HS_KERNEL void hs_mv_qkv_##T(HS_TRACK_PARAMS, const unsigned char *w0,                     \
                                 const unsigned char *w1, const unsigned char *w2, float *y0,  \
                                 float *y1, float *y2, const float *b0, const float *b1,       \
                                 const float *b2, const signed char *xq, const float *xd,      \
                                 hs_u32 r0, hs_u32 r1, hs_u32 r2, hs_u32 cols) {               \
        HS_BREADCRUMB();                                                                       \
        mvw_qkv<mvw_x, mvw_##T, MV_CAT(mvw_x, BL), BL, BB>(w0, w1, w2, y0, y1, y2, b0, b1, b2, \
                                                           xq, xd, r0, r1, r2, cols);          \
    }

// The study's variants: the f32 input in xq's place (dense products only: ids null).
#define HS_MVF_KERNELS(T, BL, BB)                                                              \
    HS_KERNEL void hs_mv1f_##T(HS_TRACK_PARAMS, const unsigned char *w, const signed char *xq, \
                               const float *xd, float *y, const float *bias, hs_u32 rows,      \
                               hs_u32 cols, hs_u32 accumulate, const float *ids, hs_u32 n,     \
                               hs_u32 k) {                                                     \
        HS_BREADCRUMB();                                                                       \
        mvw_mv1<mvf_x, mvf_##T, mvf_load, BL, BB>(w, xq, xd, y, bias, rows, cols, accumulate,  \
                                                  0, n, k);                                    \
    }                                                                                          \
    HS_KERNEL void hs_mv_swigluf_##T(HS_TRACK_PARAMS, const unsigned char *wg,                 \
                                     const unsigned char *wu, const signed char *xq,           \
                                     const float *xd, float *h, hs_u32 rows, hs_u32 cols,      \
                                     const float *gb, const float *ub, const float *ids,       \
                                     hs_u32 n, hs_u32 k) {                                     \
        HS_BREADCRUMB();                                                                       \
        mvw_gate_up<mvf_x, mvf_##T, mvf_load, BL, BB>(wg, wu, xq, xd, h, rows, cols, gb, ub,   \
                                                      0, n, k);                                \
    }                                                                                          \
    HS_KERNEL void hs_mv_qkvf_##T(HS_TRACK_PARAMS, const unsigned char *w0,                    \
                                  const unsigned char *w1, const unsigned char *w2, float *y0, \
                                  float *y1, float *y2, const float *b0, const float *b1,      \
                                  const float *b2, const signed char *xq, const float *xd,     \
                                  hs_u32 r0, hs_u32 r1, hs_u32 r2, hs_u32 cols) {              \
        HS_BREADCRUMB();                                                                       \
        mvw_qkv<mvf_x, mvf_##T, mvf_load, BL, BB>(w0, w1, w2, y0, y1, y2, b0, b1, b2, xq, xd,  \
                                                  r0, r1, r2, cols);                           \
    }

#define HS_MV_FLOAT_KERNELS(T, ES)                                                             \
    HS_KERNEL void hs_mv_##T(HS_TRACK_PARAMS, const unsigned char *w, const signed char *xq,   \
                             const float *xd, const float *xf, float *y, hs_u32 rows,          \
                             hs_u32 cols, hs_u32 ntok, const float *ids, hs_u32 n, hs_u32 k) { \
        HS_BREADCRUMB();                                                                       \
        mv_float<mv_##T, ES>(w, 0, xf, y, rows, cols, ntok, 0, 0, ids, n, k);                  \
    }

#define HS_MV_FLOAT_GATE_UP_KERNELS(T, ES)                                                     \
    HS_KERNEL void hs_mv_gate_up_##T(HS_TRACK_PARAMS, const unsigned char *wg,                 \
                                     const unsigned char *wu, const signed char *xq,           \
                                     const float *xd, const float *xf, float *h, hs_u32 rows,  \
                                     hs_u32 cols, hs_u32 ntok, const float *gb,                \
                                     const float *ub, const float *ids, hs_u32 n, hs_u32 k) {  \
        HS_BREADCRUMB();                                                                       \
        mv_float<mv_##T, ES>(wg, wu, xf, h, rows, cols, ntok, gb, ub, ids, n, k);              \
    }

HS_MV_TYPES(HS_MV_KERNELS)
HS_MV_GATE_UP_TYPES(HS_MV_GATE_UP_KERNELS)
HS_MV1_PART_TYPES(HS_MV1_PART_KERNELS)
HS_MV1_WIDE_TYPES(HS_MV1_WIDE_KERNELS)
HS_MVF_TYPES(HS_MVF_KERNELS)
HS_MV_FLOAT_TYPES(HS_MV_FLOAT_KERNELS)
HS_MV_FLOAT_GATE_UP_TYPES(HS_MV_FLOAT_GATE_UP_KERNELS)
