// The MoE routing kernels (kernels/infer_moe.hip: hs_moe_route, hs_moe_sort) on the CPU stand-in
// (simt.h). Reads cases from stdin, each a header line
//   case <name> <n> <ne> <k> <nt> <threads> <oai> <sort_in_route>
// then n * ne router logits and, for oai (gpt-oss's gating), ne router biases; runs the routing
// as the launcher does (one block of `threads`; the sort in the same launch, or by hs_moe_sort
// after) and prints what it wrote:
//   case <name>
//   logits <n * ne values as they are left (oai: with the bias added)>
//   route <t> <k ids> <k weights>     (one line per token)
//   pos <n * k>, tok <n * k>, chunks <count> <expert first entries ...>
// tests/it/kernel_emulation.rs compares them with the CPU backend's routing.
#include <iostream>
#include <string>

int main() {
    std::string word, name;
    while (std::cin >> word >> name) {
        unsigned n, ne, k, nt, threads, oai, in_route;
        std::cin >> n >> ne >> k >> nt >> threads >> oai >> in_route;
        std::vector<float> logits((size_t)n * ne), bias(ne);
        for (auto &v : logits) std::cin >> v;
        if (oai)
            for (auto &v : bias) std::cin >> v;
        const size_t entries = (size_t)n * k;
        // Room for the most chunks any nt can make: one per entry.
        std::vector<float> route(4 * entries + 1 + 3 * entries, NAN);
        const float *b = oai ? bias.data() : nullptr;
        hs_emu_launch({1, 1, 1}, threads, [&] {
            hs_moe_route(nullptr, 0, logits.data(), route.data(), n, ne, k, nt, b, in_route);
        });
        if (!in_route)
            hs_emu_launch({1, 1, 1}, threads,
                          [&] { hs_moe_sort(nullptr, 0, route.data(), n, ne, k, nt); });
        printf("case %s\nlogits", name.c_str());
        for (float v : logits) printf(" %.9g", v);
        printf("\n");
        for (unsigned t = 0; t < n; ++t) {
            printf("route %u", t);
            for (unsigned i = 0; i < 2 * k; ++i) printf(" %.9g", route[(size_t)t * 2 * k + i]);
            printf("\n");
        }
        const int *ints = (const int *)(route.data() + 2 * entries);
        printf("pos");
        for (size_t j = 0; j < entries; ++j) printf(" %d", ints[j]);
        printf("\ntok");
        for (size_t j = 0; j < entries; ++j) printf(" %d", ints[entries + j]);
        const int *chunks = ints + 2 * entries;
        printf("\nchunks %d", chunks[0]);
        for (int c = 0; c < 3 * chunks[0] && c < (int)(3 * entries); ++c)
            printf(" %d", chunks[1 + c]);
        printf("\n");
    }
    return 0;
}
