//! MXFP4 against the `gguf` Python package of llama.cpp's source (`$HIPSCOPE_LLAMA_CPP_SRC/gguf-py`,
//! `gguf.quants`), run live on blocks made here: dequantization bit for bit on random blocks with
//! every E8M0 scale, and quantization byte for byte on rows of varied magnitude. (The recorded
//! fixtures in tests/data/quant also hold llama.cpp's own `quantize_mxfp4` output.)

use std::path::PathBuf;
use std::process::Command;

use hipscope::gpu::quant::{self, GgmlType};

fn gguf_py() -> PathBuf {
    let src = std::env::var_os("HIPSCOPE_LLAMA_CPP_SRC").map(PathBuf::from).expect(
        "HIPSCOPE_LLAMA_CPP_SRC is not set: run scripts/test.sh (it unpacks llama.cpp's sdist and \
         sets it), or point it at a llama.cpp source tree",
    );
    let p = src.join("gguf-py");
    assert!(p.is_dir(), "{} does not exist", p.display());
    p
}

/// Runs `gguf.quants.<op>(np.fromfile(IN, dtype), MXFP4)` and returns the bytes it writes.
fn gguf_py_run(op: &str, dtype: &str, input: &[u8]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let (inp, out) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::write(&inp, input).unwrap();
    let script = format!(
        "import sys, numpy as np\n\
         from gguf import GGMLQuantizationType as T\n\
         from gguf.quants import {op}\n\
         x = np.fromfile(sys.argv[1], dtype=np.{dtype})\n\
         if '{op}' == 'quantize': x = x.reshape(-1, 32)\n\
         np.ascontiguousarray({op}(x, T.MXFP4)).tofile(sys.argv[2])\n"
    );
    let run = Command::new("python3")
        .arg("-c")
        .arg(&script)
        .arg(&inp)
        .arg(&out)
        .env("PYTHONPATH", gguf_py())
        .output()
        .expect("python3");
    assert!(
        run.status.success(),
        "gguf-py {op} failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    std::fs::read(&out).unwrap()
}

/// xorshift64*: reproducible bytes without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    let mut rng = Rng(0x6d78_6670_3421);
    // Four blocks of every E8M0 value (0 and 1 are subnormal scales, 255 reads as 2^127), the
    // codes random.
    let mut blocks = Vec::new();
    for i in 0..1024usize {
        blocks.push((i % 256) as u8);
        blocks.extend((0..16).map(|_| rng.next() as u8));
    }
    let theirs = gguf_py_run("dequantize", "uint8", &blocks);
    let mut ours = vec![0f32; 1024 * 32];
    quant::dequantize(GgmlType::Mxfp4, &blocks, &mut ours).unwrap();
    assert_eq!(theirs.len(), ours.len() * 4, "gguf-py wrote another length");
    for (i, (o, t)) in ours.iter().zip(theirs.chunks_exact(4)).enumerate() {
        let t = f32::from_le_bytes([t[0], t[1], t[2], t[3]]);
        assert_eq!(
            o.to_bits(),
            t.to_bits(),
            "element {i} (block {}, e = {}): ours {o:e}, gguf-py {t:e}",
            i / 32,
            blocks[i / 32 * 17]
        );
    }
}

#[test]
fn quantize_matches_gguf_py_byte_for_byte() {
    let mut rng = Rng(0x0b5e_55ed);
    let mut x = Vec::new();
    for b in 0..512 {
        // Magnitudes 2^-100 .. 2^100; every fourth block on E2M1's grid of its scale, so that
        // ties between two codes occur; some blocks one-signed, one all zero.
        let scale = 2f32.powi((b % 201) - 100);
        for _ in 0..32 {
            let v = match b % 4 {
                0 => (rng.unit() * 16.0).round() / 4.0 - 2.0,
                1 => rng.unit(),
                _ => rng.unit() * 2.0 - 1.0,
            };
            x.push(if b == 7 { 0.0 } else { v * scale });
        }
    }
    let input: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let theirs = gguf_py_run("quantize", "float32", &input);
    let ours = quant::quantize(GgmlType::Mxfp4, &x).unwrap();
    assert_eq!(ours.len(), theirs.len(), "sizes differ");
    for (b, (o, t)) in ours.chunks(17).zip(theirs.chunks(17)).enumerate() {
        assert_eq!(
            o,
            t,
            "block {b} differs (input {:?})",
            &x[32 * b..32 * b + 32]
        );
    }
}
