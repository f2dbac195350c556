//! `hipscope synth` on every core and whole or not at all (issue 33 item 7): the file does not
//! depend on the number of threads that quantized it, and a synth killed half-way leaves nothing
//! under the output's name (an earlier file there stays as it was). `--quant Q4_K_M` gives each
//! matrix the type llama-quantize gives it.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{hipscope, run_ok};

fn synth(out: &Path, shape: &str, quant: &str, threads: &str) -> Vec<u8> {
    run_ok(&[
        "synth",
        shape,
        "--quant",
        quant,
        "--threads",
        threads,
        "-o",
        out.to_str().unwrap(),
    ]);
    std::fs::read(out).unwrap()
}

/// One thread, three (more than this machine may have) and every core: the same bytes, for a
/// K-quant (the slow quantizer) and a legacy type; tensors of several 64-row chunks each.
#[test]
fn threads_do_not_change_the_file() {
    let dir = tempfile::tempdir().unwrap();
    for quant in ["Q4_K", "Q8_0"] {
        let one = synth(&dir.path().join("one.gguf"), "tiny", quant, "1");
        let three = synth(&dir.path().join("three.gguf"), "tiny", quant, "3");
        let all = synth(&dir.path().join("all.gguf"), "tiny", quant, "0");
        assert!(one.len() > 100_000, "{quant}: {} bytes", one.len());
        assert!(one == three, "{quant}: 1 and 3 threads differ");
        assert!(one == all, "{quant}: 1 thread and every core differ");
    }
}

/// SIGKILL (no handler runs, no unwinding) while the weights are being written: the output's
/// name still holds the file that was there before, and no torn model.
#[test]
fn a_killed_synth_leaves_no_file_under_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("model.gguf");
    std::fs::write(&out, "the earlier file").unwrap();
    // About 0.5 GB of Q8_0: seconds of work, killed long before it ends.
    let mut child = hipscope()
        .args(["synth", "qwen2.5-0.5b", "--quant", "Q8_0", "-o"])
        .arg(&out)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the temporary file beside the output holds tensor data (over 1 MiB).
    let partial = |d: &Path| {
        std::fs::read_dir(d).unwrap().flatten().find_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            let len = e.metadata().map(|m| m.len()).unwrap_or(0);
            (n.ends_with(".partial") && len > (1 << 20)).then_some(n)
        })
    };
    let start = Instant::now();
    let tmp = loop {
        if let Some(n) = partial(dir.path()) {
            break n;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "synth ended before it was killed"
        );
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no temporary file after 120 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "the earlier file");
    assert!(tmp.starts_with(".model.gguf."), "{tmp}");
}

/// `synth --quant Q4_K_M` types every matrix as llama-quantize's Q4_K_M did (its choices
/// recorded in tests/data/reference/q4_k_m_types.toml: Q6_K output and, in the first and last
/// eighth of the layers and every third between, attn_v / attn_qkv and ffn_down; Mixtral's eight
/// experts' Q8_0 attn_v and attn_k and Q5_K attn_output; Q5_0 / Q8_0 for rows not whole
/// 256-blocks), and the file says Q4_K - Medium.
#[test]
fn q4_k_m_types_every_matrix_as_llama_quantize_does() {
    use hipscope::model::gguf::GgufFile;
    use hipscope::model::synthetic;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/reference/q4_k_m_types.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let reference: toml::Table = text.parse().expect("q4_k_m_types.toml");
    let dir = tempfile::tempdir().unwrap();
    assert!(reference.len() >= 7, "{} shapes recorded", reference.len());
    for (shape, types) in &reference {
        let types = types.as_table().expect("a table of tensor types");
        let s = synthetic::shape(shape).unwrap();
        let out = dir.path().join(format!("{shape}.gguf"));
        synthetic::write_header_file(s, synthetic::recipe("Q4_K_M").unwrap(), 1, &out).unwrap();
        let f = GgufFile::open(&out).unwrap();
        assert_eq!(f.type_label().as_deref(), Some("Q4_K - Medium"), "{shape}");
        let ours: Vec<(String, String)> = f
            .tensors()
            .iter()
            .filter(|t| t.dims.len() >= 2 && t.ty.name() != "F32")
            .map(|t| (t.name.clone(), t.ty.name().to_string()))
            .collect();
        // The routers stay F32, as llama-quantize leaves them (not recorded).
        assert_eq!(ours.len(), types.len(), "{shape}: quantized matrices");
        for (name, ty) in &ours {
            let want = types.get(name).and_then(|v| v.as_str());
            assert_eq!(Some(ty.as_str()), want, "{shape}: {name}");
        }
    }
}
