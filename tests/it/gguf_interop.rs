//! GGUF files cross-checked with an independent implementation: the `gguf` Python package from
//! llama.cpp's source (`$HIPSCOPE_LLAMA_CPP_SRC/gguf-py`) reads what our writer writes, and our
//! reader reads what it wrote (fuzz/seeds/, made by scripts/gen_fuzz_seeds.py).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::repo_path;
use hipscope::gpu::quant::{self, GgmlType};
use hipscope::model::gguf::{Array, GgufFile, GgufWriter, TensorSpec, Value, ValueType};

fn gguf_py() -> PathBuf {
    let src = std::env::var_os("HIPSCOPE_LLAMA_CPP_SRC").map(PathBuf::from).expect(
        "HIPSCOPE_LLAMA_CPP_SRC is not set: run scripts/test.sh (it unpacks llama.cpp's sdist and \
         sets it), or point it at a llama.cpp source tree",
    );
    let p = src.join("gguf-py");
    assert!(p.is_dir(), "{} does not exist", p.display());
    p
}

#[test]
fn gguf_py_reads_what_we_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ours.gguf");
    let meta = vec![
        ("general.architecture".to_string(), Value::from("llama")),
        ("t.u8".into(), Value::U8(200)),
        ("t.i8".into(), Value::I8(-100)),
        ("t.u16".into(), Value::U16(60000)),
        ("t.i16".into(), Value::I16(-30000)),
        ("t.u32".into(), Value::U32(4_000_000_000)),
        ("t.i32".into(), Value::I32(-2_000_000_000)),
        ("t.f32".into(), Value::F32(1.5)),
        ("t.bool".into(), Value::Bool(true)),
        ("t.str".into(), Value::from("héllo 你好")),
        ("t.u64".into(), Value::U64(1 << 50)),
        ("t.i64".into(), Value::I64(-(1 << 50))),
        ("t.f64".into(), Value::F64(-0.25)),
        (
            "t.arr".into(),
            Value::Array(Array {
                ty: ValueType::I32,
                items: vec![Value::I32(1), Value::I32(-2), Value::I32(3)],
            }),
        ),
        ("general.alignment".into(), Value::U32(64)),
    ];
    let w_q8: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) / 7.0).collect();
    let tensors = [
        (TensorSpec::new("a.f32", &[4, 3], GgmlType::F32), {
            (0..12)
                .flat_map(|i| (i as f32).to_le_bytes())
                .collect::<Vec<u8>>()
        }),
        (
            TensorSpec::new("b.q8_0", &[32, 2], GgmlType::Q8_0),
            quant::quantize(GgmlType::Q8_0, &w_q8).unwrap(),
        ),
        (
            TensorSpec::new("c.f16", &[8], GgmlType::F16),
            quant::quantize(GgmlType::F16, &[0.5; 8]).unwrap(),
        ),
    ];
    let specs: Vec<TensorSpec> = tensors.iter().map(|t| t.0.clone()).collect();
    let mut w = GgufWriter::new(std::fs::File::create(&path).unwrap(), &meta, &specs).unwrap();
    for (_, d) in &tensors {
        w.write_tensor(d).unwrap();
    }
    w.finish().unwrap();

    let script = r#"
import json, sys
import numpy as np
from gguf import GGUFReader
r = GGUFReader(sys.argv[1])
fields = {}
for k, f in r.fields.items():
    if k.startswith("GGUF."): continue
    v = f.contents()
    fields[k] = v
tensors = {t.name: {"type": t.tensor_type.name, "shape": [int(x) for x in t.shape],
           "offset": int(t.data_offset),
           "values": [float(x) for x in np.asarray(
               __import__("gguf").quants.dequantize(t.data, t.tensor_type)).flatten()]}
           for t in r.tensors}
print(json.dumps({"fields": fields, "tensors": tensors, "alignment": int(r.alignment)},
                 default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&path)
        .env("PYTHONPATH", gguf_py())
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "gguf-py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = &v["fields"];
    assert_eq!(f["general.architecture"], "llama");
    assert_eq!(f["t.u8"], 200);
    assert_eq!(f["t.i8"], -100);
    assert_eq!(f["t.u16"], 60000);
    assert_eq!(f["t.i16"], -30000);
    assert_eq!(f["t.u32"], 4_000_000_000u64);
    assert_eq!(f["t.i32"], -2_000_000_000i64);
    assert_eq!(f["t.f32"], 1.5);
    assert_eq!(f["t.bool"], true);
    assert_eq!(f["t.str"], "héllo 你好");
    assert_eq!(f["t.u64"], 1u64 << 50);
    assert_eq!(f["t.i64"], -(1i64 << 50));
    assert_eq!(f["t.f64"], -0.25);
    assert_eq!(f["t.arr"], serde_json::json!([1, -2, 3]));
    assert_eq!(v["alignment"], 64);
    let t = &v["tensors"];
    assert_eq!(t["a.f32"]["type"], "F32");
    assert_eq!(t["a.f32"]["values"][11], 11.0);
    assert_eq!(t["b.q8_0"]["type"], "Q8_0");
    // gguf-py's dequantization of our Q8_0 equals ours.
    let mut ours = vec![0f32; 64];
    quant::dequantize(GgmlType::Q8_0, &tensors[1].1, &mut ours).unwrap();
    let theirs: Vec<f32> = t["b.q8_0"]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(ours, theirs);
    assert_eq!(t["c.f16"]["values"][7], 0.5);
    // Tensor data starts are aligned to 64 in the file.
    for name in ["a.f32", "b.q8_0", "c.f16"] {
        assert_eq!(t[name]["offset"].as_u64().unwrap() % 64, 0, "{name}");
    }
}

#[test]
fn we_read_what_gguf_py_wrote() {
    let f = GgufFile::open(Path::new(&repo_path("fuzz/seeds/tiny-llama.gguf"))).unwrap();
    assert_eq!(f.architecture(), Some("llama"));
    assert_eq!(f.get_u64("test.u64"), Some(1 << 40));
    assert_eq!(f.get_u64("test.u8"), Some(7));
    assert_eq!(f.get("test.i16").and_then(|v| v.as_i64()), Some(-3));
    assert_eq!(f.get_f64("test.f64"), Some(0.5));
    assert_eq!(f.get_bool("test.bool"), Some(true));
    let nested = f.get_array("test.nested").unwrap();
    assert_eq!(nested.ty, ValueType::Array);
    assert_eq!(nested.items[0].as_array().unwrap().ints(), Some(vec![1, 2]));
    let q = f.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!((q.ty, q.dims.clone()), (GgmlType::F16, vec![32, 32]));
    let o = f.tensor("blk.0.attn_output.weight").unwrap();
    assert_eq!(o.ty, GgmlType::Q8_0);
    assert_eq!(f.tensor_data(o).len(), 32 * 34);
    assert_eq!(
        f.get_array("tokenizer.ggml.tokens")
            .unwrap()
            .strings()
            .unwrap()[26],
        "Ġ"
    );
}
