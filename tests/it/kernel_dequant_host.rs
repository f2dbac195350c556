//! The grouped expert products' weight staging (`kernels/gemm_moe.hip`: the `MmStage*` types, a
//! step's per-type dequantization a prompt's experts run on every GPU) compiled for the host
//! with the system C++ compiler, from the kernel source's own text: for every quantized type,
//! random rows quantized by the CPU backend give the same f16 bits through the staging (Q4_0,
//! Q8_0 and MXFP4 loaded ahead and turned into halves in pairs; Q4_K and Q6_K loaded ahead as
//! words; Q5_K and IQ4_XS from words; the rest by element) as through dequant.h's element functions, at every byte alignment
//! of the row, and both agree with the CPU backend's dequantization rounded to f16; MXFP4 also
//! with block scales outside the halves' range (the float path). On an AMD GPU these functions
//! never ran (docs/runs: on an H100 the staged and element forms gave the same selftest errors);
//! this runs them on every test run. The products themselves run on the CPU stand-in
//! (`kernel_emulation.rs`).

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
static inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float hs_half_to_float(unsigned short h) { _Float16 v; memcpy(&v, &h, 2); return (float)v; }
static inline unsigned short hs_float_to_half(float f) { _Float16 v = (_Float16)f; unsigned short h; memcpy(&h, &v, 2); return h; }
static inline float hs_bf16_to_float(unsigned short h) { return __int_as_float(((int)h) << 16); }
"#;

/// main: reads (ggml id, columns, bytes, the row), writes the row's f16 bits twice: through the
/// staging a grouped product uses for the type (both threads of a row, each 32-column step), then
/// through the element function. The staging runs on copies of the row at byte offsets 0 .. 7
/// from an 8-byte boundary; a copy that stages other bits exits 3.
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
// The 32 halves of step kt as the kernel stages them (s: HS_MM_LDS halves).
template <class S> static void stage(hs_u32 ty, const unsigned char *row, hs_u32 kt,
                                     unsigned short *s) {
    for (hs_u32 h = 0; h < 2; ++h) {
        typename S::Raw raw;
        S::load(ty, row, kt, h, raw);
        S::store(ty, raw, row, kt, h, s);
    }
}
static void grouped(hs_u32 ty, const unsigned char *row, hs_u32 kt, unsigned short *s) {
    switch (ty) {
    case 2: stage<MmStageQ4_0>(ty, row, kt, s); break;
    case 8: stage<MmStageQ8_0>(ty, row, kt, s); break;
    case 39: stage<MmStageMxfp4>(ty, row, kt, s); break;
    case 12: stage<MmStageWords<MmK45<false>>>(ty, row, kt, s); break;
    case 14: stage<MmStageWords<MmQ6K>>(ty, row, kt, s); break;
    default: stage<MmStageDq16<mm_dq16_any>>(ty, row, kt, s); break;
    }
}
int main() {
    hs_u32 head[3];
    if (fread(head, 4, 3, stdin) != 3) return 2;
    std::vector<uint4> buf(head[2] / 16 + 2);
    unsigned char *row = (unsigned char *)buf.data();
    if (fread(row, 1, head[2], stdin) != head[2]) return 2;
    std::vector<unsigned short> first(head[1]);
    for (int off = 0; off < 8; ++off) {
        std::vector<uint4> copy(buf.size() + 1);
        unsigned char *at = (unsigned char *)copy.data() + off;
        memcpy(at, row, head[2]);
        for (hs_u32 kt = 0; kt < head[1]; kt += 32) {
            unsigned short s[HS_MM_LDS];
            grouped(head[0], at, kt, s);
            if (off == 0) {
                memcpy(&first[kt], s, 64);
            } else if (memcmp(&first[kt], s, 64) != 0) {
                fprintf(stderr, "offset %d, columns %u..: other halves\n", off, kt);
                return 3;
            }
        }
    }
    fwrite(first.data(), 2, head[1], stdout);
    for (hs_u32 c0 = 0; c0 < head[1]; c0 += 16) {
        hs_u32 w[8];
        elementwise(head[0], row, c0, w);
        fwrite(w, 4, 8, stdout);
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
        "#define HS_MM_LDS 40\n#define HS_MM_BK 32\n".to_string(),
        slice(
            &gemm,
            "// 16 elements c0 .. c0 + 15",
            "// The chunk's 64 activation rows",
            false,
        ),
        MAIN.to_string(),
    ]
    .join("\n");
    crate::common::compile_cpp(dir, "dq", &src, &["-O1", "-std=c++17"])
}

/// The harness's two f16 renderings of `bytes` (`cols` elements of `ty`): staged, by element.
fn stage_and_element(exe: &Path, ty: GgmlType, cols: usize, bytes: &[u8]) -> (Vec<u16>, Vec<u16>) {
    let mut child = Command::new(exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = Vec::new();
    for v in [ty.id(), cols as u32, bytes.len() as u32] {
        input.extend(v.to_le_bytes());
    }
    input.extend(bytes);
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{ty}: harness exit {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let halves: Vec<u16> = out
        .stdout
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(halves.len(), 2 * cols, "{ty}");
    let (staged, element) = halves.split_at(cols);
    (staged.to_vec(), element.to_vec())
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
        let mut bytes = quant::quantize(ty, &vals).unwrap();
        let mut cpu = vec![0f32; cols];
        quant::dequantize(ty, &bytes, &mut cpu).unwrap();
        let (grouped, element) = stage_and_element(&exe, ty, cols, &bytes);
        for i in 0..cols {
            assert_eq!(
                grouped[i], element[i],
                "{ty}: element {i}: the staged form {:#06x}, the element function {:#06x}",
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
        if ty == GgmlType::Mxfp4 {
            // Block scales (the first byte of each 17) outside the halves' range take the float
            // path: below it (products rounding to f16 subnormals or zero) and above (to
            // infinity), each block of the row one of them.
            for (b, e) in bytes
                .chunks_mut(17)
                .zip([0u8, 1, 20, 103, 144, 200, 254].iter().cycle())
            {
                b[0] = *e;
            }
            let (grouped, element) = stage_and_element(&exe, ty, cols, &bytes);
            assert_eq!(
                grouped, element,
                "{ty} with scales outside the halves' range"
            );
        }
        checked += 1;
    }
    assert!(checked >= 13, "{checked} types checked");
}
