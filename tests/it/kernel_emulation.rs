//! The attention kernels' own logic, checked on every machine: the shipped sources of
//! `kernels/infer_attention_tiled.hip` and `kernels/infer_attention.hip` (with mma.h, attention.h
//! and the prelude's helpers) compiled by the host's C++ compiler over a CPU stand-in for the GPU
//! runtime (`emu/simt.h`: a thread per GPU thread, barriers for __syncthreads and shuffles), and
//! run against attention computed in double precision from the same f16 cache (`emu/attention.cpp`).
//! The prompt kernels, the decode split and its merge, and the unsplit decode kernel. The
//! stand-in takes mma.h's plain-FMA tile, so this holds each kernel's indexing, masks (causal,
//! sliding window over the cache's ring), soft-cap, sinks, online softmax, splits and their merge
//! — not a device's matrix-unit layouts, which `selftest --compute` checks on a GPU. The decode
//! kernels score a key by `HS_ATTN_KEY_LANES` lanes (`HS_ATTN_KEY_LANES_WIDE` for heads of 128
//! and more; attention.h: their defaults, 1 and 2, and the values a kernels directory may set
//! instead); the translation unit is compiled and run once for each of [`KEY_LANES`], both set
//! to it, so that every head size runs every value.

use std::process::Command;

use hipscope::gpu::kernels::{KernelSources, PRELUDE};

/// The prompt kernels this checks, as the host's unit lists name them (the FMA kernel and the
/// matrix units' for each).
const LISTS: &str = "#define HS_ATTN_TILED_TYPES(X) X(f16_64, unsigned short, 2) \
X(f16_96, unsigned short, 3) X(f16_128, unsigned short, 4) X(f32_64, float, 2)\n\
#define HS_ATTN_MMA_TYPES(X) X(f16_64, unsigned short, 2) X(f16_96, unsigned short, 3) \
X(f16_128, unsigned short, 4) X(f32_64, float, 2)\n";

/// The values of `HS_ATTN_KEY_LANES` checked: 1 (the shipped default) and the variants that
/// scripts/device/attn-lanes-variants.sh makes. 32 (the most attention.h allows: a warp a key)
/// passed by hand on 2026-12-07; left out here, as its 4 keys a chunk cost the stand-in the most
/// barriers (about 95 s of CPU).
const KEY_LANES: [u32; 5] = [1, 2, 4, 8, 16];

/// The translation unit: the stand-in, the lists, the prelude's helpers, the headers and the
/// two sources as they ship, then the harness.
fn translation_unit() -> String {
    let src = KernelSources::embedded();
    let helpers = PRELUDE
        .find("// ---- Helpers of the inference kernels")
        .expect("the prelude's helpers section");
    let mut tu = String::from(include_str!("emu/simt.h"));
    tu.push_str(LISTS);
    tu.push_str(&PRELUDE[helpers..]);
    for h in ["attention.h", "mma.h"] {
        let s = src.headers.iter().find(|s| s.name == h).expect(h);
        tu.push_str(&s.text);
    }
    for f in ["infer_attention_tiled", "infer_attention"] {
        tu.push_str(&src.get(f).expect(f).text);
    }
    tu.push_str(include_str!("emu/attention.cpp"));
    tu
}

#[test]
fn attention_kernels_match_double_precision_attention_on_a_cpu_stand_in() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tu = translation_unit();
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
