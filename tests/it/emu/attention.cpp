// The attention kernels on the CPU stand-in (simt.h), against attention computed in double
// precision from the same (f16-rounded) cache: prints one line per case,
//   case <name> [tiled <rel> mma <rel>] [unsplit <rel>] [split<S> <rel> ...]
// tiled, mma: a prompt batch (16 rows or more): hs_attention_tiled_*, hs_attention_mma_*;
// unsplit: fewer than 20 rows: hs_attention_{f16,f32}, a block per head and row;
// split<S>: one decode token over 16 keys or more: hs_attention_split_f16 + _combine.
// rel = ||kernel - reference|| / ||reference|| over the whole output. Compiled after the kernel
// sources by tests/it/kernel_emulation.rs, which holds the bounds.

struct Case {
    const char *name;
    int hd, nh, nkv, nt, pos0, window, slots;
    float softcap;
    int f32, sinks;
};

static const Case CASES[] = {
    // name               hd  heads kv  rows pos0  win slots  cap  f32 sinks
    {"plain-64", 64, 4, 2, 40, 0, 0, 64, 0, 0, 0},
    {"deep-128-gqa4", 128, 4, 1, 100, 300, 0, 512, 0, 0, 0},
    {"partial-96", 96, 2, 2, 70, 10, 0, 128, 0, 0, 0},
    {"window-ring-64", 64, 2, 1, 130, 200, 128, 400, 0, 0, 0},
    {"window-softcap-128", 128, 2, 2, 65, 1000, 256, 2000, 30, 0, 0},
    {"f32-sinks-64", 64, 4, 4, 17, 50, 0, 128, 0, 1, 1},
    {"sinks-128", 128, 2, 1, 64, 0, 0, 64, 0, 0, 1},
    {"decode-256-global", 256, 4, 1, 1, 4095, 0, 4096, 0, 0, 0},
    {"decode-256-window", 256, 4, 1, 1, 4095, 512, 4096, 0, 0, 0},
    {"decode-64-sinks", 64, 4, 2, 1, 700, 0, 1024, 0, 0, 1},
    {"decode-64-empty-splits", 64, 4, 2, 1, 20, 0, 1024, 0, 0, 1},
    {"decode-64-few-keys", 64, 4, 2, 1, 5, 0, 64, 0, 0, 0},
    {"decode-128-f32-few-keys", 128, 2, 1, 1, 3, 0, 64, 0, 1, 0},
    {"decode-256-window-softcap", 256, 4, 1, 1, 100, 64, 128, 30, 0, 1},
    {"rows-96-few-keys", 96, 2, 1, 5, 7, 0, 64, 0, 0, 0},
    {"decode-256-f32", 256, 2, 1, 1, 300, 0, 512, 0, 1, 0},
    {"decode-80", 80, 4, 2, 1, 200, 0, 256, 0, 0, 0},
    {"decode-40-window", 40, 2, 1, 1, 150, 100, 128, 0, 0, 0},
    // Head sizes that the cache's 16-byte loads do not divide (f16: 8 elements, f32: 4): the
    // decode kernels' element-by-element path.
    {"decode-36-odd", 36, 4, 2, 1, 300, 0, 512, 0, 0, 1},
    {"decode-42-f32-odd-window", 42, 2, 1, 1, 150, 100, 128, 0, 1, 0},
};

static double rel(const std::vector<float> &out, const std::vector<double> &ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < out.size(); ++i) {
        const double d = std::isfinite(out[i]) ? out[i] - ref[i] : 1e30;
        num += d * d;
        den += ref[i] * ref[i];
    }
    return std::sqrt(num / den);
}

int main() {
    for (const Case &c : CASES) {
        std::mt19937 rng(7);
        std::normal_distribution<float> nd(0, 1);
        const int q_dim = c.nh * c.hd, kv_dim = c.nkv * c.hd;
        const size_t cache = (size_t)c.slots * kv_dim + 64;
        std::vector<float> q((size_t)c.nt * q_dim);
        for (auto &x : q) x = nd(rng) * 2.0f;
        std::vector<unsigned short> kh(cache), vh(cache);
        std::vector<float> kf(cache), vf(cache), sinks(c.nh);
        for (size_t i = 0; i < (size_t)c.slots * kv_dim; ++i) {
            kh[i] = hs_float_to_half(nd(rng));
            vh[i] = hs_float_to_half(nd(rng));
            kf[i] = hs_half_to_float(kh[i]);
            vf[i] = hs_half_to_float(vh[i]);
        }
        for (auto &x : sinks) x = nd(rng);
        const float *sk = c.sinks ? sinks.data() : nullptr;
        const float scale = 1.0f / std::sqrt((float)c.hd);
        std::vector<double> ref((size_t)c.nt * q_dim);
        for (int t = 0; t < c.nt; ++t)
            for (int h = 0; h < c.nh; ++h) {
                const int kvh = h / (c.nh / c.nkv), pos = c.pos0 + t;
                const int lo = (c.window > 0 && pos + 1 > c.window) ? pos + 1 - c.window : 0;
                std::vector<double> s;
                double mx = -1e300;
                for (int j = lo; j <= pos; ++j) {
                    double a = 0;
                    for (int d = 0; d < c.hd; ++d)
                        a += (double)q[(size_t)t * q_dim + h * c.hd + d] *
                             kf[(size_t)(j % c.slots) * kv_dim + kvh * c.hd + d];
                    a *= scale;
                    if (c.softcap > 0) a = c.softcap * std::tanh(a / c.softcap);
                    s.push_back(a);
                    mx = std::max(mx, a);
                }
                if (sk) mx = std::max(mx, (double)sk[h]);
                double l = 0;
                for (auto &x : s) l += (x = std::exp(x - mx));
                if (sk) l += std::exp(sk[h] - mx);
                for (int d = 0; d < c.hd; ++d) {
                    double o = 0;
                    for (int j = lo; j <= pos; ++j)
                        o += s[j - lo] * vf[(size_t)(j % c.slots) * kv_dim + kvh * c.hd + d];
                    ref[(size_t)t * q_dim + h * c.hd + d] = o / l;
                }
            }
        char kname[32];
        snprintf(kname, sizeof kname, "%s_%d", c.f32 ? "f32" : "f16", c.hd);
        const void *kc = c.f32 ? (const void *)kf.data() : (const void *)kh.data();
        const void *vc = c.f32 ? (const void *)vf.data() : (const void *)vh.data();
        printf("case %s", c.name);
        // A prompt batch: the tiled kernel and the matrix units' (mma.h's plain tile here).
        if (c.nt >= 16) {
            for (int mma = 0; mma < 2; ++mma) {
                std::vector<float> out(q.size(), NAN);
                const unsigned rows = mma ? 64 : 16;
                bool found = false;
                hs_emu_launch({(unsigned)c.nh, (c.nt + rows - 1) / rows, 1}, 128, [&] {
#define HS_EMU_CALL(T, KV, NC)                                                                 \
    if (!strcmp(#T, kname)) {                                                                  \
        found = true;                                                                          \
        if (mma)                                                                               \
            hs_attention_mma_##T(nullptr, 0, q.data(), (const KV *)kc, (const KV *)vc,         \
                                 out.data(), c.nt, c.nh, c.nkv, c.pos0, scale, c.window,       \
                                 c.slots, c.softcap, sk);                                      \
        else                                                                                   \
            hs_attention_tiled_##T(nullptr, 0, q.data(), (const KV *)kc, (const KV *)vc,       \
                                   out.data(), c.nt, c.nh, c.nkv, c.pos0, scale, c.window,     \
                                   c.slots, c.softcap, sk);                                    \
    }
                    HS_ATTN_MMA_TYPES(HS_EMU_CALL)
                });
                printf(" %s %.3e", mma ? "mma" : "tiled", found ? rel(out, ref) : -1.0);
            }
        }
        // The unsplit kernel (a decode token, a batch too small for the tiled kernels, rows of
        // several sequences): a block per head and row, on the cases of a few rows (a block of
        // the stand-in costs 128 threads' start).
        if (c.nt < 20) {
            std::vector<float> out(q.size(), NAN);
            hs_emu_launch({(unsigned)c.nh, (unsigned)c.nt, 1}, 128, [&] {
                if (c.f32)
                    hs_attention_f32(nullptr, 0, q.data(), kf.data(), vf.data(), out.data(), c.nh,
                                     c.nkv, c.hd, c.pos0, scale, c.window, c.slots, c.softcap,
                                     sk, nullptr, nullptr, 0, nullptr, nullptr);
                else
                    hs_attention_f16(nullptr, 0, q.data(), kh.data(), vh.data(), out.data(), c.nh,
                                     c.nkv, c.hd, c.pos0, scale, c.window, c.slots, c.softcap,
                                     sk, nullptr, nullptr, 0, nullptr, nullptr);
            });
            printf(" unsplit %.3e", rel(out, ref));
        }
        // One decode token over more than a handful of keys (the host splits from 64; the
        // empty-splits case holds splits over few keys): split over the keys, then merged.
        if (c.nt == 1 && c.pos0 >= 16) {
            for (unsigned splits : {2u, 16u, 64u}) {
                std::vector<float> out(q_dim, NAN), part((size_t)c.nh * splits * (c.hd + 2));
                hs_emu_launch({(unsigned)c.nh, splits, 1}, 128, [&] {
                    hs_attention_split_f16(nullptr, 0, q.data(), kh.data(), vh.data(),
                                           part.data(), c.nh, c.nkv, c.hd, c.pos0, scale,
                                           c.window, c.slots, c.softcap, nullptr, nullptr);
                });
                hs_emu_launch({(unsigned)c.nh, 1, 1}, 128, [&] {
                    hs_attention_combine(nullptr, 0, part.data(), out.data(), c.hd, splits, sk,
                                         nullptr, nullptr, 0);
                });
                printf(" split%u %.3e", splits, rel(out, ref));
            }
        }
        printf("\n");
    }
    return 0;
}
