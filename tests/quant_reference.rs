//! Block formats against independent implementations: dequantization against the `gguf` Python
//! package and quantization against llama.cpp's reference quantizers, through the fixtures of
//! `scripts/gen_quant_ref.py` (real SmolLM2 blocks, random blocks of every type, hostile blocks).

use std::path::{Path, PathBuf};

use hipscope::gpu::quant::{self, GgmlType};
use serde::Deserialize;

#[derive(Deserialize)]
struct Manifest {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Case {
    Dequant {
        #[serde(rename = "type")]
        ty: String,
        source: String,
        blocks: String,
        expected: String,
        nan_equal: bool,
    },
    Quantize {
        #[serde(rename = "type")]
        ty: String,
        source: String,
        input: String,
        expected: String,
    },
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant")
}

fn read(name: &str) -> Vec<u8> {
    let p = dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn manifest() -> Manifest {
    serde_json::from_slice(&read("manifest.json")).expect("manifest.json parses")
}

fn ty(name: &str) -> GgmlType {
    GgmlType::from_name(name).unwrap_or_else(|| panic!("unknown type {name} in manifest"))
}

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    let mut seen = std::collections::BTreeSet::new();
    let mut n = 0;
    for case in manifest().cases {
        let Case::Dequant {
            ty: t,
            source,
            blocks,
            expected,
            nan_equal,
        } = case
        else {
            continue;
        };
        let t = ty(&t);
        let blocks = read(&blocks);
        let want = f32s(&read(&expected));
        let mut got = vec![0f32; want.len()];
        quant::dequantize(t, &blocks, &mut got).unwrap_or_else(|e| panic!("{t} {source}: {e}"));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let same = g.to_bits() == w.to_bits() || (nan_equal && g.is_nan() && w.is_nan());
            assert!(
                same,
                "{t} {source}: element {i}: got {g:e} ({:#x}), gguf-py {w:e} ({:#x})",
                g.to_bits(),
                w.to_bits()
            );
        }
        seen.insert(t.name());
        n += 1;
    }
    // Every compute type has fixtures (a manifest that lost some must fail here).
    for t in quant::COMPUTE_TYPES {
        assert!(seen.contains(t.name()), "no dequant fixture for {t}");
    }
    assert!(n >= 26, "only {n} dequant cases");
}

#[test]
fn quantize_matches_llama_cpp_reference_byte_for_byte() {
    let mut n = 0;
    for case in manifest().cases {
        let Case::Quantize {
            ty: t,
            source,
            input,
            expected,
        } = case
        else {
            continue;
        };
        let t = ty(&t);
        let x = f32s(&read(&input));
        let want = read(&expected);
        let got = quant::quantize(t, &x).unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!(got.len(), want.len(), "{t} ({source}) size");
        let bb = t.block_bytes();
        for (b, (g, w)) in got.chunks(bb).zip(want.chunks(bb)).enumerate() {
            assert_eq!(g, w, "{t} ({source}) block {b} differs");
        }
        n += 1;
    }
    // 12 of the first types, 4 of the low-bit ones (`gen_quant_ref.py --lowbit`), MXFP4 (`--mxfp4`).
    assert_eq!(n, 17, "quantize cases");
}

#[test]
fn real_model_blocks_dequantize_to_plausible_weights() {
    // A sanity anchor independent of gguf-py: SmolLM2's attention weights are small.
    let blocks = read("q4_1_real.blocks");
    let mut out = vec![0f32; blocks.len() / 20 * 32];
    quant::dequantize(GgmlType::Q4_1, &blocks, &mut out).expect("dequantize");
    let max = out.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(max > 0.01 && max < 2.0, "max |w| = {max}");
}
