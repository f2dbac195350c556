//! Kernels' own logic, checked on every machine: the shipped sources compiled by the host's C++
//! compiler over a CPU stand-in for the GPU runtime (`emu/simt.h`: a context per GPU thread,
//! block barriers for __syncthreads, warp barriers for shuffles).
//!
//! The attention kernels: `kernels/infer_attention_tiled.hip` and `kernels/infer_attention.hip`
//! (with mma.h, attention.h and the prelude's helpers) against attention computed in double
//! precision from the same f16 cache (`emu/attention.cpp`). The prompt kernels, the decode split
//! and its merge, and the unsplit decode kernel. The stand-in takes mma.h's plain-FMA tile, so
//! this holds each kernel's indexing, masks (causal, sliding window over the cache's ring),
//! soft-cap, sinks, online softmax, splits and their merge — not a device's matrix-unit layouts,
//! which `selftest --compute` checks on a GPU. The decode kernels score a key by
//! `HS_ATTN_KEY_LANES` lanes (`HS_ATTN_KEY_LANES_WIDE` for heads of 128 and more; attention.h:
//! their defaults, 1 and 2, and the values a kernels directory may set instead); the translation
//! unit is compiled and run once for each of [`KEY_LANES`], both set to it, so that every head
//! size runs every value.
//!
//! The MoE routing kernels: `kernels/infer_moe.hip`'s hs_moe_route and hs_moe_sort
//! (`emu/moe_route.cpp`) against the CPU backend's routing of the same logits.
//!
//! The grouped expert products of a prompt: `kernels/gemm_moe.hip`'s two products against double
//! precision (`emu/moe_mm.cpp`).

use std::process::Command;

use hipscope::gpu::kernels::{KernelSources, PRELUDE};

/// The prompt kernels this checks, as the host's unit lists name them (the FMA kernel and the
/// matrix units' for each).
const LISTS: &str = "#define HS_ATTN_TILED_TYPES(X) X(f16_64, unsigned short, 2) \
X(f16_96, unsigned short, 3) X(f16_128, unsigned short, 4) X(f32_64, float, 2)\n\
#define HS_ATTN_MMA_TYPES(X) X(f16_64, unsigned short, 2) X(f16_96, unsigned short, 3) \
X(f16_128, unsigned short, 4) X(f32_64, float, 2)\n";

/// The values of `HS_ATTN_KEY_LANES` checked: every one attention.h allows (1, the shipped
/// default, and the variants scripts/device/attn-lanes-variants.sh makes).
const KEY_LANES: [u32; 6] = [1, 2, 4, 8, 16, 32];

/// A translation unit for the stand-in: simt.h, the host's unit lists (`lists`), the prelude's
/// helpers, the kernel headers and sources named as they ship, then the harness.
fn translation_unit(lists: &str, headers: &[&str], sources: &[&str], harness: &str) -> String {
    let src = KernelSources::embedded();
    let helpers = PRELUDE
        .find("// ---- Helpers of the inference kernels")
        .expect("the prelude's helpers section");
    let mut tu = String::from(include_str!("emu/simt.h"));
    tu.push_str(lists);
    tu.push_str(&PRELUDE[helpers..]);
    for &h in headers {
        let s = src.headers.iter().find(|s| s.name == h).expect(h);
        tu.push_str(&s.text);
    }
    for &f in sources {
        tu.push_str(&src.get(f).expect(f).text);
    }
    tu.push_str(harness);
    tu
}

#[test]
fn attention_kernels_match_double_precision_attention_on_a_cpu_stand_in() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tu = translation_unit(
        LISTS,
        &["attention.h", "mma.h"],
        &["infer_attention_tiled", "infer_attention"],
        include_str!("emu/attention.cpp"),
    );
    // Each value of HS_ATTN_KEY_LANES compiled and run on a thread of its own (the stand-in runs
    // on one OS thread), the outputs then checked in order.
    let outputs: Vec<(u32, String)> = std::thread::scope(|scope| {
        let runs: Vec<_> = KEY_LANES
            .iter()
            .map(|&lanes| {
                let (dir, tu) = (dir.path(), &tu);
                scope.spawn(move || {
                    let define = format!("-DHS_ATTN_KEY_LANES={lanes}");
                    let wide = format!("-DHS_ATTN_KEY_LANES_WIDE={lanes}");
                    let bin = crate::common::compile_cpp(
                        dir,
                        &format!("attention_lanes{lanes}"),
                        tu,
                        &["-std=c++20", "-O1", "-pthread", "-w", &define, &wide],
                    );
                    let out = Command::new(&bin).output().expect("run the emulation");
                    assert!(out.status.success(), "HS_ATTN_KEY_LANES={lanes}: {out:?}");
                    (lanes, String::from_utf8_lossy(&out.stdout).to_string())
                })
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("an emulation thread"))
            .collect()
    });
    for (lanes, text) in &outputs {
        check_cases(*lanes, text);
    }
}

/// One run's lines: every error within its bound, and every case run.
fn check_cases(lanes: u32, text: &str) {
    // Cases that ran the prompt kernels, the decode splits, the unsplit kernel.
    let (mut prompt, mut decode, mut unsplit) = (0, 0, 0);
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f[0], "case", "{line}");
        let name = f[1];
        for kv in f[2..].chunks(2) {
            let err: f64 = kv[1].parse().expect(line);
            // The FMA kernels and the splits compute in f32 (a few ulps of the reference); the
            // matrix units' kernel rounds queries and softmax weights to f16 (2e-4 – 4e-4).
            let bound = if kv[0] == "mma" { 1e-3 } else { 1e-5 };
            assert!(
                (0.0..=bound).contains(&err),
                "HS_ATTN_KEY_LANES={lanes}, {name}: {} at {err:e} (bound {bound:e})\n{text}",
                kv[0]
            );
        }
        prompt += usize::from(f.contains(&"tiled"));
        decode += usize::from(f.contains(&"split64"));
        unsplit += usize::from(f.contains(&"unsplit"));
    }
    assert_eq!(
        (prompt, decode, unsplit),
        (7, 10, 14),
        "HS_ATTN_KEY_LANES={lanes}: every case ran:\n{text}"
    );
}

/// One routing case: `n` tokens of `ne` router logits, the top `k`, sorted into chunks of at most
/// `nt` entries, by one block of `threads`; `oai`: gpt-oss's gating (biased logits, the softmax of
/// the chosen); `in_route`: the sort in the routing launch (the launcher's choice for a batch of
/// at most one token a warp), else by hs_moe_sort after.
struct RouteCase {
    name: &'static str,
    n: usize,
    ne: usize,
    k: usize,
    nt: usize,
    threads: usize,
    oai: bool,
    in_route: bool,
    /// Logits equal in pairs (expert 2i and 2i + 1, across lanes and registers): equal
    /// probabilities, which both backends break to the lower id.
    ties: bool,
}

#[rustfmt::skip]
const ROUTE_CASES: &[RouteCase] = &[
    // Qwen3-30B-A3B's decode step (128 experts, 8 chosen; 4 a lane) and gpt-oss's (32, 4).
    RouteCase { name: "qwen3moe-decode", n: 1, ne: 128, k: 8, nt: 8, threads: 32, oai: false, in_route: true, ties: false },
    RouteCase { name: "gpt-oss-decode", n: 1, ne: 32, k: 4, nt: 8, threads: 32, oai: true, in_route: true, ties: false },
    // A short batch routed and sorted in one launch of 4 warps (moe_sort_block), chunks of 3.
    RouteCase { name: "batch-in-route", n: 4, ne: 128, k: 8, nt: 3, threads: 128, oai: false, in_route: true, ties: false },
    // Experts not a multiple of the warp (a lane's last register past ne), hs_moe_sort after.
    RouteCase { name: "ragged-sort-after", n: 5, ne: 60, k: 6, nt: 2, threads: 32, oai: false, in_route: false, ties: false },
    RouteCase { name: "oai-batch", n: 3, ne: 96, k: 4, nt: 2, threads: 32, oai: true, in_route: false, ties: false },
    // More slots than a warp has lanes (a lane keeps two), the most experts a lane holds (16).
    RouteCase { name: "k40-of-512", n: 1, ne: 512, k: 40, nt: 8, threads: 32, oai: false, in_route: true, ties: false },
    RouteCase { name: "all-chosen", n: 2, ne: 20, k: 20, nt: 64, threads: 32, oai: false, in_route: false, ties: false },
    RouteCase { name: "ties-256", n: 2, ne: 256, k: 7, nt: 8, threads: 64, oai: false, in_route: true, ties: true },
    RouteCase { name: "ties-oai", n: 1, ne: 64, k: 5, nt: 8, threads: 32, oai: true, in_route: true, ties: true },
];

/// hs_moe_route and hs_moe_sort (kernels/infer_moe.hip) on the stand-in, against the CPU
/// backend's routing (`moe_route`, `moe_route_softmax_weight`): the same experts in the same
/// order, weights within 5e-7 of each other, relative (the two sum the same f64 terms in
/// different orders), the biased logits left in place as the CPU leaves them, and a sort that
/// places every entry once, in a chunk of its own expert of at most `nt` entries.
#[test]
fn moe_routing_kernels_choose_the_cpu_backends_experts_on_a_cpu_stand_in() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tu = translation_unit("", &[], &["infer_moe"], include_str!("emu/moe_route.cpp"));
    let bin =
        crate::common::compile_cpp(dir.path(), "moe_route", &tu, &["-std=c++20", "-O1", "-w"]);

    // Logits: a shuffled ramp (distinct, 0.037 apart: no near-ties), or pairs of equal values.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || crate::common::xorshift(&mut state);
    let mut input = String::new();
    let mut cases = Vec::new();
    for c in ROUTE_CASES {
        let mut logits = Vec::with_capacity(c.n * c.ne);
        for _ in 0..c.n {
            let mut order: Vec<usize> = (0..c.ne).collect();
            for i in (1..c.ne).rev() {
                order.swap(i, (next() % (i as u64 + 1)) as usize);
            }
            let value = |e: usize| {
                let rank = if c.ties { order[e / 2] } else { order[e] };
                rank as f32 * 0.037 - 2.0
            };
            logits.extend((0..c.ne).map(value));
        }
        let bias: Vec<f32> = (0..c.ne)
            .map(|e| ((e * 7) % 5) as f32 * 0.25 - 0.5)
            .collect();
        let bias = if c.oai { bias } else { Vec::new() };
        let nums = |v: &[f32]| {
            v.iter()
                .map(|x| format!("{x:e}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        input.push_str(&format!(
            "case {} {} {} {} {} {} {} {}\n{}\n{}\n",
            c.name,
            c.n,
            c.ne,
            c.k,
            c.nt,
            c.threads,
            u8::from(c.oai),
            u8::from(c.in_route),
            nums(&logits),
            nums(&bias)
        ));
        cases.push((c, logits, bias));
    }
    let mut child = Command::new(&bin)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run the routing emulation");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), input.as_bytes())
        .expect("write the cases");
    let out = child.wait_with_output().expect("the routing emulation");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut lines = text.lines();
    for (c, logits, bias) in &cases {
        assert_eq!(
            lines.next(),
            Some(format!("case {}", c.name).as_str()),
            "{text}"
        );
        // The numbers of the next line, which `tag` begins.
        let mut line = |tag: &str| -> Vec<f64> {
            let l = lines
                .next()
                .unwrap_or_else(|| panic!("{}: no {tag} line\n{text}", c.name));
            let mut f = l.split_whitespace();
            assert_eq!(f.next(), Some(tag), "{}: {l}", c.name);
            f.map(|w| w.parse().expect(l)).collect()
        };
        // The logits as the kernel left them: the CPU's own add_bias for gpt-oss, else untouched.
        let want: Vec<f32> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| if c.oai { l + bias[i % c.ne] } else { l })
            .collect();
        let left = line("logits");
        assert!(
            left.iter().zip(&want).all(|(&a, &b)| a as f32 == b),
            "{}: logits left {left:?}, want {want:?}",
            c.name
        );
        let mut ids = Vec::new();
        for t in 0..c.n {
            let got = line("route");
            assert_eq!(got[0] as usize, t, "{}", c.name);
            let (mut experts, mut weights) = (Vec::new(), Vec::new());
            let row = &want[t * c.ne..(t + 1) * c.ne];
            if c.oai {
                hipscope::gpu::cpu::moe_route_softmax_weight(row, c.k, &mut experts, &mut weights);
            } else {
                hipscope::gpu::cpu::moe_route(row, c.k, &mut experts, &mut weights);
            }
            let got_ids: Vec<usize> = got[1..=c.k].iter().map(|&v| v as usize).collect();
            assert_eq!(got_ids, experts, "{}: token {t}'s experts", c.name);
            for (i, (&g, &w)) in got[c.k + 1..].iter().zip(&weights).enumerate() {
                assert!(
                    (g - w as f64).abs() <= 5e-7 * (w as f64).max(1e-3),
                    "{}: token {t}, slot {i}: weight {g} against the CPU's {w}",
                    c.name
                );
            }
            ids.extend(got_ids);
        }
        check_sort(c, &ids, &line("pos"), &line("tok"), &line("chunks"));
    }
}

/// The sorted entries: pos a permutation of the entries, tok[pos[j]] the token of entry j, and
/// the chunks, in order, covering the sorted entries once, each of one expert's entries only and
/// at most `nt` of them.
fn check_sort(c: &RouteCase, ids: &[usize], pos: &[f64], tok: &[f64], chunks: &[f64]) {
    let entries = c.n * c.k;
    let pos: Vec<usize> = pos.iter().map(|&p| p as usize).collect();
    let mut seen = vec![false; entries];
    for (j, &p) in pos.iter().enumerate() {
        assert!(p < entries && !seen[p], "{}: pos {pos:?}", c.name);
        seen[p] = true;
        assert_eq!(tok[p] as usize, j / c.k, "{}: tok of entry {j}", c.name);
    }
    let count = chunks[0] as usize;
    let table: Vec<usize> = chunks[1..].iter().map(|&v| v as usize).collect();
    assert_eq!(table.len(), 3 * count, "{}: chunks {chunks:?}", c.name);
    let mut expert_at = vec![usize::MAX; entries];
    let mut next = 0;
    for ch in table.chunks(3) {
        let (e, first, len) = (ch[0], ch[1], ch[2]);
        assert!(
            first == next && (1..=c.nt).contains(&len) && first + len <= entries,
            "{}: chunk {ch:?} (next {next}, {entries} entries)",
            c.name
        );
        expert_at[first..first + len].fill(e);
        next += len;
    }
    assert_eq!(
        next, entries,
        "{}: the chunks cover {next} of {entries} entries",
        c.name
    );
    for (j, &p) in pos.iter().enumerate() {
        assert_eq!(
            expert_at[p], ids[j],
            "{}: entry {j} sorted into another expert's chunk",
            c.name
        );
    }
}

/// The grouped expert products of a prompt (kernels/gemm_moe.hip) on the stand-in
/// (`emu/moe_mm.cpp`): hs_moe_mm_gate_up and hs_moe_mm_down in Q4_0, Q8_0, MXFP4 (their staging
/// a step ahead, in half pairs) and Q4_K (staged by words), over a sorted route (an expert with no
/// entry, one, a chunk and more), against the same products in double precision from the halves
/// dequant.h's element functions give (`kernel_dequant_host.rs` holds the staging to those bit
/// for bit).
#[test]
fn moe_grouped_products_match_double_precision_on_a_cpu_stand_in() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tu = translation_unit(
        "",
        &["dequant.h", "mma.h"],
        &["gemm_moe"],
        include_str!("emu/moe_mm.cpp"),
    );
    let bin = crate::common::compile_cpp(dir.path(), "moe_mm", &tu, &["-std=c++20", "-O1", "-w"]);
    let out = Command::new(&bin)
        .output()
        .expect("run the products' emulation");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{out:?}");
    assert!(!text.contains("FAIL"), "{text}");
    let ok: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("ok products "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        ok,
        ["q4_0", "mxfp4", "q8_0", "q4_k"],
        "every product ran:\n{text}"
    );
}
