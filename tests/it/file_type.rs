//! Files labelled as llama.cpp labels them (issue 33 item 9): `info`, `bench` and the chat
//! header name a file's type from `general.file_type` with llama.cpp's own strings
//! (`llama_model_ftype_name`: "Q4_K - Medium"), and fall back to the type most of its bytes have
//! only when the key is absent.

use std::path::{Path, PathBuf};

use crate::common::{hipscope, run_ok, smollm2};
use hipscope::model::gguf::{GgufFile, GgufWriter, TensorSpec};

fn synth(dir: &Path, quant: &str) -> PathBuf {
    let p = dir.join(format!("tiny-{quant}.gguf"));
    run_ok(&["synth", "tiny", "--quant", quant, "-o", p.to_str().unwrap()]);
    p
}

fn info_file_type(path: &Path) -> String {
    let out = run_ok(&["info", path.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("file type: "))
        .unwrap_or_else(|| panic!("no file type line:\n{text}"))
        .to_string()
}

/// A copy of `from` without its `general.file_type` key.
fn without_file_type(from: &Path, to: &Path) {
    let f = GgufFile::open(from).unwrap();
    let meta: Vec<_> = f
        .metadata()
        .iter()
        .filter(|(k, _)| k != "general.file_type" && k != "general.alignment")
        .cloned()
        .collect();
    let specs: Vec<TensorSpec> = f
        .tensors()
        .iter()
        .map(|t| TensorSpec::new(&t.name, &t.dims, t.ty))
        .collect();
    let out = std::fs::File::create(to).unwrap();
    let mut w = GgufWriter::new(std::io::BufWriter::new(out), &meta, &specs).unwrap();
    for t in f.tensors() {
        w.write_tensor(f.tensor_data(t)).unwrap();
    }
    w.finish().unwrap();
}

/// The real SmolLM2 file says `general.file_type = 3`, which llama.cpp names "Q4_1" (its
/// `print_info: file type = Q4_1`); its largest matrices are Q4_1 too.
#[test]
fn smollm2_is_labelled_from_its_file_type_key() {
    let f = GgufFile::open(&smollm2()).unwrap();
    assert_eq!(f.get_u64("general.file_type"), Some(3));
    assert_eq!(f.type_label().as_deref(), Some("Q4_1"));
    assert_eq!(info_file_type(&smollm2()), "Q4_1 (general.file_type 3)");
}

/// A Q4_K file is "Q4_K - Medium" (file type 15, as `llama-quantize --pure Q4_K_M` writes it) in
/// `info` and in `bench`'s model type; the largest-tensor type ("Q4_K") was the old label.
#[test]
fn a_k_quant_file_is_named_as_llama_cpp_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = synth(dir.path(), "Q4_K");
    let f = GgufFile::open(&p).unwrap();
    assert_eq!(f.get_u64("general.file_type"), Some(15));
    assert_eq!(f.type_label().as_deref(), Some("Q4_K - Medium"));
    assert_eq!(info_file_type(&p), "Q4_K - Medium (general.file_type 15)");
    let out = hipscope()
        .args([
            "bench",
            "--backend",
            "cpu",
            "-t",
            "1",
            "-p",
            "0",
            "-n",
            "1",
            "-r",
            "1",
        ])
        .args(["--json", "--model", p.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ty = rows[0]["model_type"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(ty.ends_with(" Q4_K - Medium"), "model_type {ty:?}");
    // The name keeps no type at its end in any of its forms.
    let name = rows[0]["model"].as_str().unwrap_or_default();
    assert_eq!(name, "synthetic tiny");
}

/// Without `general.file_type` the label is the type most of the matrices' bytes have.
#[test]
fn without_the_key_the_largest_type_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = synth(dir.path(), "Q8_0");
    let bare = dir.path().join("bare.gguf");
    without_file_type(&p, &bare);
    let f = GgufFile::open(&bare).unwrap();
    assert_eq!(f.get_u64("general.file_type"), None);
    assert_eq!(f.type_label().as_deref(), Some("Q8_0"));
    assert_eq!(
        info_file_type(&bare),
        "Q8_0 (no general.file_type: the type most bytes have)"
    );
}

/// `convert` writes the file type of the type it converted to (it wrote 0, "all F32", for
/// anything but F16 and Q8_0).
#[test]
fn convert_writes_the_file_type_of_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let p = synth(dir.path(), "F16");
    let out = dir.path().join("q4_0.gguf");
    run_ok(&[
        "convert",
        p.to_str().unwrap(),
        "--type",
        "Q4_0",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(info_file_type(&out), "Q4_0 (general.file_type 2)");
}
