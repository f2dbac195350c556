//! The grouped expert products' weight staging (`kernels/gemm_moe.hip`: `mm_dq16_*`, the
//! per-type 16-element dequantization a prompt's experts run on every GPU) compiled for the host
//! with the system C++ compiler, from the kernel source's own text: for every quantized type,
//! random rows quantized by the CPU backend give the same f16 bits through the word-wise forms
//! (Q4_0, Q8_0, MXFP4, Q4_K, Q6_K of their own; Q5_K, IQ4_XS in the `any` switch) as through
//! dequant.h's element functions, and both agree with the CPU backend's dequantization rounded to
//! f16. On an AMD GPU these functions never ran (docs/runs: on an H100 the word-wise and element
//! forms gave the same selftest errors); this runs them on every test run.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use hipscope::gpu::quant::{self, GgmlType};

fn kernel_text(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("kernels")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The lines of `text` from the one starting with `from` up to (not with) the one starting with
/// `to`, or through the one starting with `through`.
fn slice(text: &str, from: &str, end: &str, inclusive: bool) -> String {
    let a = text.find(from).unwrap_or_else(|| panic!("no {from:?}"));
    let b = a + text[a..].find(end).unwrap_or_else(|| panic!("no {end:?}"));
    let b = if inclusive {
        b + text[b..].find('\n').map_or(text.len() - b, |n| n + 1)
    } else {
        b
    };
    text[a..b].to_string()
}

const SHIM: &str = r#"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#define __device__
#define __forceinline__ inline
typedef unsigned int hs_u32;
typedef int hs_i32;
typedef unsigned long long hs_u64;
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float hs_half_to_float(unsigned short h) { _Float16 v; memcpy(&v, &h, 2); return (float)v; }
static inline unsigned short hs_float_to_half(float f) { _Float16 v = (_Float16)f; unsigned short h; memcpy(&h, &v, 2); return h; }
static inline float hs_bf16_to_float(unsigned short h) { return __int_as_float(((int)h) << 16); }
"#;

/// main: reads (ggml id, columns, bytes, the row), writes the row's f16 bits twice: through the
/// form a grouped product uses for the type, then through the element function.
const MAIN: &str = r#"
static void elementwise(hs_u32 ty, const unsigned char *row, hs_u32 c0, hs_u32 *w) {
    switch (ty) {
    case 2: mm_dq16<dq_q4_0, 32, 18>(row, c0, w); break;
    case 3: mm_dq16<dq_q4_1, 32, 20>(row, c0, w); break;
    case 6: mm_dq16<dq_q5_0, 32, 22>(row, c0, w); break;
    case 7: mm_dq16<dq_q5_1, 32, 24>(row, c0, w); break;
    case 8: mm_dq16<dq_q8_0, 32, 34>(row, c0, w); break;
    case 10: mm_dq16<dq_q2_k, 256, 84>(row, c0, w); break;
    case 11: mm_dq16<dq_q3_k, 256, 110>(row, c0, w); break;
    case 12: mm_dq16<dq_q4_k, 256, 144>(row, c0, w); break;
    case 13: mm_dq16<dq_q5_k, 256, 176>(row, c0, w); break;
    case 14: mm_dq16<dq_q6_k, 256, 210>(row, c0, w); break;
    case 20: mm_dq16<dq_iq4_nl, 32, 18>(row, c0, w); break;
    case 23: mm_dq16<dq_iq4_xs, 256, 136>(row, c0, w); break;
    case 39: mm_dq16<dq_mxfp4, 32, 17>(row, c0, w); break;
    default: fprintf(stderr, "type %u\n", ty); exit(2);
    }
}
static void grouped(hs_u32 ty, const unsigned char *row, hs_u32 c0, hs_u32 *w) {
    switch (ty) {
    case 2: mm_dq16_q4_0(ty, row, c0, w); break;
    case 8: mm_dq16_q8_0(ty, row, c0, w); break;
    case 39: mm_dq16_mxfp4(ty, row, c0, w); break;
    case 12: mm_dq16_q4_k(ty, row, c0, w); break;
    case 14: mm_dq16_q6_k(ty, row, c0, w); break;
    default: mm_dq16_any(ty, row, c0, w); break;
    }
}
int main() {
    hs_u32 head[3];
    if (fread(head, 4, 3, stdin) != 3) return 2;
    std::vector<uint4> buf(head[2] / 16 + 1);
    unsigned char *row = (unsigned char *)buf.data();
    if (fread(row, 1, head[2], stdin) != head[2]) return 2;
    for (int pass = 0; pass < 2; ++pass) {
        for (hs_u32 c0 = 0; c0 < head[1]; c0 += 16) {
            hs_u32 w[8];
            if (pass == 0) grouped(head[0], row, c0, w); else elementwise(head[0], row, c0, w);
            fwrite(w, 4, 8, stdout);
        }
    }
    return 0;
}
"#;

/// Builds the harness in `dir` from the kernel sources' text.
fn harness(dir: &Path) -> std::path::PathBuf {
    let prelude = kernel_text("prelude.h");
    let gemm = kernel_text("gemm_moe.hip");
    let src = [
        SHIM.to_string(),
        slice(
            &prelude,
            "__device__ __forceinline__ int hs_lut16_4",
            "#define HS_LUT_IQ4NL",
            true,
        ),
        kernel_text("dequant.h"),
        slice(
            &gemm,
            "// 16 elements c0 .. c0 + 15",
            "// The 16 elements through DQ16 into shared row position",
            false,
        ),
        MAIN.to_string(),
    ]
    .join("\n");
    crate::common::compile_cpp(dir, "dq", &src, &["-O1", "-std=c++17"])
}

#[test]
fn grouped_products_stage_every_type_as_the_element_functions_and_the_cpu_do() {
    let dir = tempfile::tempdir().unwrap();
    let exe = harness(dir.path());
    let cols = 1024usize;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut checked = 0;
    for ty in GgmlType::all().filter(|&t| quant::is_supported(t) && t.block_len() > 1) {
        // Uneven magnitudes: blocks of small and of large values, a few outliers.
        let vals: Vec<f32> = (0..cols)
            .map(|i| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                let scale = [0.02, 1.0, 7.5][(i / 96) % 3];
                if i % 211 == 7 { u * 40.0 } else { u * scale }
            })
            .collect();
        let bytes = quant::quantize(ty, &vals).unwrap();
        let mut cpu = vec![0f32; cols];
        quant::dequantize(ty, &bytes, &mut cpu).unwrap();
        let mut child = Command::new(&exe)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = Vec::new();
        for v in [ty.id(), cols as u32, bytes.len() as u32] {
            input.extend(v.to_le_bytes());
        }
        input.extend(&bytes);
        child.stdin.take().unwrap().write_all(&input).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{ty}: harness exit {}", out.status);
        let halves: Vec<u16> = out
            .stdout
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(halves.len(), 2 * cols, "{ty}");
        let (grouped, element) = halves.split_at(cols);
        for i in 0..cols {
            assert_eq!(
                grouped[i], element[i],
                "{ty}: element {i}: the grouped form {:#06x}, the element function {:#06x}",
                grouped[i], element[i]
            );
            let want = half::f16::from_f32(cpu[i]);
            let got = half::f16::from_bits(grouped[i]);
            // The CPU's f32 value rounded to f16; the kernel's f32 may differ from it in the
            // last bit (its products in another order), which can move the f16 by one step.
            let step = (f32::from(want).abs() * 2f32.powi(-10)).max(2f32.powi(-24));
            assert!(
                (f32::from(got) - f32::from(want)).abs() <= step,
                "{ty}: element {i}: kernel {got}, CPU {} (f16 {want})",
                cpu[i]
            );
        }
        checked += 1;
    }
    assert!(checked >= 13, "{checked} types checked");
}
