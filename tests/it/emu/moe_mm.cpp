// The grouped expert products of a prompt (kernels/gemm_moe.hip) on the CPU stand-in (simt.h),
// with the prelude's helpers, dequant.h and mma.h's plain-FMA tile: hs_moe_mm_gate_up_<type> and
// hs_moe_mm_down_<type> over a sorted route made here (experts with no entry, one, a chunk and a
// bit), against the same products in double precision from the halves dequant.h's element
// functions give (the staging's own halves are held to those bit for bit by
// kernel_dequant_host.rs): relative to the sum of the terms' sizes, within 2e-5 (the kernels add
// in f32), and SiLU(gate) * up within 1e-4. Prints "ok products <type> ..." or "FAIL products
// <type>: ..." a type (tests/it/kernel_emulation.rs reads them).
#include <string>

static std::mt19937 hs_rng(20261207);

// A random half of size 2^lo .. 2^hi, either sign.
static unsigned short rand_half(int lo, int hi) {
    std::uniform_real_distribution<float> m(1.0f, 2.0f);
    std::uniform_int_distribution<int> ex(lo, hi - 1), sign(0, 1);
    const float v = std::ldexp(m(hs_rng), ex(hs_rng)) * (sign(hs_rng) ? -1.0f : 1.0f);
    return hs_float_to_half(v);
}
static void put_half(unsigned char *p, unsigned short h) { std::memcpy(p, &h, 2); }

struct Type {
    const char *name;
    hs_u32 id, bl, bb;
    float (*dq)(const unsigned char *, hs_u32);
};
static const Type TYPES[] = {
    {"q4_0", 2, 32, 18, dq_q4_0},
    {"q8_0", 8, 32, 34, dq_q8_0},
    {"q4_k", 12, 256, 144, dq_q4_k},
    {"mxfp4", 39, 32, 17, dq_mxfp4},
};

// `rows` rows of `cols` columns of type t, random quants with finite scales of realistic size
// where the type keeps them (their byte offsets as ggml's block structs lay them out). MXFP4's
// scales are mostly 2^-10 .. 2^-2, with every fifth block's below the halves' range (the float
// path).
static std::vector<unsigned char> random_rows(const Type &t, hs_u32 rows, hs_u32 cols) {
    const hs_u32 blocks = rows * (cols / t.bl);
    std::vector<unsigned char> w((size_t)blocks * t.bb);
    for (auto &b : w) b = (unsigned char)hs_rng();
    for (hs_u32 i = 0; i < blocks; ++i) {
        unsigned char *b = w.data() + (size_t)i * t.bb;
        switch (t.id) {
        case 2: case 6: case 8: case 20: put_half(b, rand_half(-10, -3)); break;
        case 3: case 7: put_half(b, rand_half(-10, -3)); put_half(b + 2, rand_half(-8, -2)); break;
        case 10: put_half(b + 80, rand_half(-10, -4)); put_half(b + 82, rand_half(-10, -4)); break;
        case 11: put_half(b + 108, rand_half(-10, -4)); break;
        case 12: case 13:
            put_half(b, rand_half(-10, -4));
            put_half(b + 2, rand_half(-10, -4));
            break;
        case 14: put_half(b + 208, rand_half(-12, -6)); break;
        case 23: put_half(b, rand_half(-12, -6)); break;
        case 39: {
            static const unsigned char low[] = {0, 1, 20, 103};
            b[0] = i % 5 == 4 ? low[(i / 5) % 4] : (unsigned char)(118 + hs_rng() % 9);
            break;
        }
        }
    }
    return w;
}

// The half of element c of a row as the products must see it.
static unsigned short want_half(const Type &t, const unsigned char *row, hs_u32 c) {
    return hs_float_to_half(t.dq(row + (size_t)(c / t.bl) * t.bb, c % t.bl));
}

typedef void (*GateUp)(HS_TRACK_PARAMS, const unsigned char *, const unsigned char *,
                       const unsigned short *, float *, const float *, hs_u32, hs_u32, hs_u32,
                       hs_u32, const float *, const float *, hs_u32, hs_u64);
typedef void (*Down)(HS_TRACK_PARAMS, const unsigned char *, const unsigned short *, float *,
                     const float *, hs_u32, hs_u32, hs_u32, hs_u32, hs_u32, hs_u64);

// Type t through its pair of kernels: n tokens, k = 1 slot each (the route's entries
// are the tokens, sorted by expert here as hs_moe_sort leaves them), ne experts with counts[e]
// entries each, ff hidden rows, dim model columns (both whole blocks of the type; dim not a
// multiple of 64 leaves rows of the down product's last tile outside the matrix).
static void check_products(const Type &t, GateUp gate_up, Down down, hs_u32 ff, hs_u32 dim) {
    const hs_u32 ne = 4, nt = 64;
    const hs_u32 counts[ne] = {70, 0, 1, 33};
    hs_u32 n = 0;
    for (hs_u32 c : counts) n += c;
    const hs_u32 k = 1;
    // Route: 2nk floats (ids, weights; unread here), then pos[nk], tok[nk], then the chunks.
    std::vector<float> route(4 * n + 1 + 3 * n, 0.0f);
    int *pos = (int *)(route.data() + 2 * n), *tok = pos + n, *chunks = tok + n;
    std::vector<int> order(n);
    for (hs_u32 i = 0; i < n; ++i) order[i] = (int)i;
    std::shuffle(order.begin(), order.end(), hs_rng);
    std::vector<int> owner(n);
    int nch = 0;
    for (hs_u32 e = 0, j = 0; e < ne; ++e) {
        for (hs_u32 s = 0; s < counts[e]; s += nt) {
            const int c = (int)std::min(nt, counts[e] - s);
            chunks[1 + 3 * nch] = (int)e;
            chunks[2 + 3 * nch] = (int)(j + s);
            chunks[3 + 3 * nch] = c;
            ++nch;
        }
        for (hs_u32 s = 0; s < counts[e]; ++s, ++j) {
            tok[j] = order[j];
            pos[order[j]] = (int)j;
            owner[j] = (int)e;
        }
    }
    chunks[0] = nch;
    const size_t up_rb = (size_t)(dim / t.bl) * t.bb, down_rb = (size_t)(ff / t.bl) * t.bb;
    const auto wg = random_rows(t, ne * ff, dim), wu = random_rows(t, ne * ff, dim);
    const auto wd = random_rows(t, ne * dim, ff);
    std::vector<unsigned short> x((size_t)n * dim), hh((size_t)n * ff);
    for (auto &v : x) v = rand_half(-3, 1);
    for (auto &v : hh) v = rand_half(-3, 1);
    std::vector<float> h((size_t)n * ff, NAN), y((size_t)n * dim, NAN);
    hs_emu_launch({(ff + 31) / 32, (unsigned)nch, 1}, HS_MM_THREADS, [&] {
        gate_up(nullptr, 0, wg.data(), wu.data(), x.data(), h.data(), route.data(), n, k, ff, dim,
                nullptr, nullptr, t.id, up_rb);
    });
    hs_emu_launch({(dim + 63) / 64, (unsigned)nch, 1}, HS_MM_THREADS, [&] {
        down(nullptr, 0, wd.data(), hh.data(), y.data(), route.data(), n, k, dim, ff, t.id,
             down_rb);
    });
    // dot: (sum, sum of |terms|) of expert row `row` of w (rb bytes a row) and activation a.
    auto dot = [&](const std::vector<unsigned char> &w, size_t rb, size_t row,
                   const unsigned short *a, hs_u32 cols) {
        double s = 0, m = 0;
        for (hs_u32 c = 0; c < cols; ++c) {
            const double p = (double)hs_half_to_float(want_half(t, w.data() + row * rb, c)) *
                             (double)hs_half_to_float(a[c]);
            s += p;
            m += std::fabs(p);
        }
        return std::make_pair(s, m);
    };
    double worst_gu = 0, worst_d = 0;
    for (hs_u32 j = 0; j < n; ++j) {
        const size_t e = (size_t)owner[j];
        for (hs_u32 r = 0; r < ff; ++r) {
            const auto g = dot(wg, up_rb, e * ff + r, x.data() + (size_t)tok[j] * dim, dim);
            const auto u = dot(wu, up_rb, e * ff + r, x.data() + (size_t)tok[j] * dim, dim);
            // d(silu(g) u) = u silu'(g) dg + silu(g) du, |silu'| < 1.1: the error the f32 sums
            // may leave, plus the activation's own rounding.
            const double want = g.first / (1.0 + std::exp(-g.first)) * u.first;
            const double bound = 2e-5 * (1.1 * std::fabs(u.first) * g.second +
                                         std::fabs(g.first) * u.second) +
                                 1e-4 * std::fabs(want) + 1e-30;
            const double err = std::fabs((double)h[(size_t)j * ff + r] - want) / bound;
            worst_gu = std::isnan(err) ? INFINITY : std::max(worst_gu, err);
        }
        for (hs_u32 r = 0; r < dim; ++r) {
            const auto d = dot(wd, down_rb, e * dim + r, hh.data() + (size_t)j * ff, ff);
            const double err =
                std::fabs((double)y[(size_t)j * dim + r] - d.first) / (2e-5 * d.second + 1e-30);
            worst_d = std::isnan(err) ? INFINITY : std::max(worst_d, err);
        }
    }
    if (worst_gu <= 1.0 && worst_d <= 1.0)
        printf("ok products %s (worst %.3f and %.3f of the bound)\n", t.name, worst_gu, worst_d);
    else
        printf("FAIL products %s: worst %.3g (gate/up) and %.3g (down) of the bound\n", t.name,
               worst_gu, worst_d);
}

static const Type &type(const char *name) {
    for (const auto &t : TYPES)
        if (std::string(name) == t.name) return t;
    std::abort();
}

int main() {
    check_products(type("q4_0"), hs_moe_mm_gate_up_q4_0, hs_moe_mm_down_q4_0, 96, 96);
    check_products(type("mxfp4"), hs_moe_mm_gate_up_mxfp4, hs_moe_mm_down_mxfp4, 96, 96);
    check_products(type("q8_0"), hs_moe_mm_gate_up_q8_0, hs_moe_mm_down_q8_0, 96, 96);
    check_products(type("q4_k"), hs_moe_mm_gate_up_q4_k, hs_moe_mm_down_q4_k, 256, 256);
    return 0;
}
