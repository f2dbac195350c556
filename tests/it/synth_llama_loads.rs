//! Every `hipscope synth` shape loads in llama.cpp (issue 13 item 7). The record,
//! tests/data/reference/synth-llama-cpp.toml, written by scripts/synth-llama-loads.sh, holds per
//! shape the llama-bench command that loaded and ran the Q4_0 file (llama.cpp b11434, CPU) and what
//! llama.cpp read from it. These tests need no llama.cpp: they check that the record covers the
//! shape table, that every shape loaded and ran, and that what hipscope writes today still reads
//! (through hipscope's own GGUF reader) as llama.cpp read it, so that a shape added or changed
//! without rerunning the script fails here.

use std::collections::BTreeMap;
use std::path::Path;

use hipscope::model::config::ModelConfig;
use hipscope::model::gguf::GgufFile;
use hipscope::model::synthetic;

const RECORD: &str = include_str!("../data/reference/synth-llama-cpp.toml");

/// The record's entries by shape name; a name recorded twice fails.
fn record() -> BTreeMap<String, toml::Table> {
    let t: toml::Table = RECORD.parse().expect("synth-llama-cpp.toml parses");
    let entries = t["shape"].as_array().expect("[[shape]] entries");
    let mut by_name = BTreeMap::new();
    for e in entries {
        let e = e.as_table().expect("a [[shape]] table").clone();
        let name = e["name"].as_str().expect("name").to_string();
        assert!(
            by_name.insert(name.clone(), e).is_none(),
            "{name} recorded twice"
        );
    }
    by_name
}

fn int(e: &toml::Table, key: &str) -> Option<u64> {
    e.get(key).map(|v| {
        let n = v.as_integer().unwrap_or_else(|| {
            panic!("{}: {key} = {v} is not one number", e["name"]);
        });
        u64::try_from(n).expect("a count")
    })
}

fn string<'a>(e: &'a toml::Table, key: &str) -> &'a str {
    e.get(key)
        .and_then(|v| v.as_str())
        .unwrap_or_else(|| panic!("{}: no {key}", e["name"]))
}

/// (a) The record covers exactly the shapes of synth's own table.
#[test]
fn every_synth_shape_is_recorded() {
    let rec = record();
    let missing: Vec<&str> = synthetic::SHAPES
        .iter()
        .map(|s| s.name)
        .filter(|n| !rec.contains_key(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "shapes synth writes that llama.cpp was never shown (run scripts/synth-llama-loads.sh): \
         {missing:?}"
    );
    let unknown: Vec<&String> = rec
        .keys()
        .filter(|n| synthetic::shape(n).is_err())
        .collect();
    assert!(
        unknown.is_empty(),
        "recorded shapes synth no longer has: {unknown:?}"
    );
}

/// (b) llama.cpp loaded every recorded file and ran both its tests on it, with the command and
/// build recorded.
#[test]
fn every_recorded_shape_loaded_and_ran() {
    for (name, e) in record() {
        assert_eq!(e["loaded"].as_bool(), Some(true), "{name}: not loaded");
        assert_eq!(e["ran"].as_bool(), Some(true), "{name}: did not run");
        assert_eq!(int(&e, "exit_status"), Some(0), "{name}: exit status");
        let cmd = string(&e, "command");
        assert!(
            cmd.starts_with(&format!("llama-bench -m {name}.gguf -p 8 -n 2 ")),
            "{name}: command {cmd:?}"
        );
        assert!(
            string(&e, "llama_cpp").starts_with("b11434 "),
            "{name}: build"
        );
        assert!(!string(&e, "date").is_empty(), "{name}: date");
        let quant = string(&e, "quant");
        assert!(
            synthetic::quant_type(quant).is_ok(),
            "{name}: quant {quant}"
        );
        let model_type = string(&e, "model_type");
        assert!(
            model_type.starts_with(string(&e, "arch")) && model_type.ends_with(quant),
            "{name}: llama-bench's model type {model_type:?}"
        );
    }
}

/// What hipscope reads from `f`, under llama.cpp's print_info names (and llama-bench's
/// `model_n_params`, `model_size`).
fn hipscope_facts(f: &GgufFile) -> BTreeMap<&'static str, u64> {
    let c = ModelConfig::from_gguf(f).expect("the config reads");
    c.check_tensors(f).expect("every tensor is there");
    let moe = c.moe;
    let mut m = BTreeMap::from([
        ("n_ctx_train", c.train_ctx as u64),
        ("n_embd", c.dim as u64),
        ("n_layer", c.n_layers as u64),
        ("n_head", c.n_heads as u64),
        ("n_head_kv", c.n_kv_heads as u64),
        ("n_rot", c.n_rot as u64),
        ("n_swa", c.sliding_window as u64),
        ("n_embd_head_k", c.head_dim as u64),
        ("n_embd_head_v", c.head_dim as u64),
        ("n_ff", c.ffn_dim as u64),
        ("n_expert", moe.map_or(0, |m| m.n_expert as u64)),
        ("n_expert_used", moe.map_or(0, |m| m.n_used as u64)),
        ("n_vocab", c.vocab_size as u64),
        ("n_params", f.parameter_count()),
        ("model_size", f.tensors().iter().map(|t| t.size).sum()),
    ]);
    // llama.cpp's print_info prints the experts' own width for qwen3moe and gpt-oss (its
    // n_ff_exp).
    if let Some(moe) = moe.filter(|_| matches!(c.arch_name.as_str(), "qwen3moe" | "gpt-oss")) {
        m.insert("n_ff_exp", moe.ffn_dim as u64);
    }
    m
}

/// (c) For every shape, a file written today (its header: the weights are a hole, so that the
/// 17 GB Qwen3-30B-A3B costs nothing) reads in hipscope as llama.cpp read the recorded file:
/// architecture, every hyperparameter llama.cpp printed, the parameter count and data size.
#[test]
fn the_record_matches_what_synth_writes_today() {
    let dir = tempfile::tempdir().unwrap();
    let mut wrong = Vec::new();
    for (name, e) in record() {
        // A name synth no longer has fails `every_synth_shape_is_recorded`.
        let Ok(s) = synthetic::shape(&name) else {
            continue;
        };
        let ty = synthetic::quant_type(string(&e, "quant")).unwrap();
        let path = dir.path().join(format!("{name}.gguf"));
        synthetic::write_header_file(s, ty, 1, &path).unwrap();
        let f = GgufFile::open(&path).unwrap();
        if f.architecture() != Some(string(&e, "arch")) {
            wrong.push(format!(
                "{name}: arch {:?}, llama.cpp read {}",
                f.architecture(),
                e["arch"]
            ));
        }
        let ours = hipscope_facts(&f);
        // Every fact both sides know, llama.cpp's n_ff_exp included where only it printed one.
        let keys: Vec<&str> = ours
            .keys()
            .copied()
            .chain(e.contains_key("n_ff_exp").then_some("n_ff_exp"))
            .collect();
        for key in keys {
            let (theirs, mine) = (int(&e, key), ours.get(key).copied());
            if theirs != mine {
                wrong.push(format!(
                    "{name}: {key}: llama.cpp {theirs:?}, hipscope today {mine:?}"
                ));
            }
        }
        std::fs::remove_file(&path).unwrap();
    }
    assert!(
        wrong.is_empty(),
        "the record is stale or a shape reads differently (rerun \
         scripts/synth-llama-loads.sh):\n{}",
        wrong.join("\n")
    );
}

/// The shortcut above is faithful: for the small shapes, the header file is the full file's
/// header, byte for byte, and as long.
#[test]
fn header_file_is_the_synth_files_header() {
    let dir = tempfile::tempdir().unwrap();
    let ty = synthetic::quant_type("Q4_0").unwrap();
    let small: Vec<_> = synthetic::SHAPES
        .iter()
        .filter(|s| s.vocab <= 512)
        .collect();
    assert!(small.len() >= 5, "{} small shapes", small.len());
    for s in small {
        let (full, head) = (dir.path().join("full.gguf"), dir.path().join("head.gguf"));
        synthetic::write_file(s, ty, 1, &full, &mut |_, _| {}).unwrap();
        synthetic::write_header_file(s, ty, 1, &head).unwrap();
        let (full, head) = (std::fs::read(&full).unwrap(), std::fs::read(&head).unwrap());
        assert_eq!(full.len(), head.len(), "{}", s.name);
        let f = GgufFile::from_bytes(Path::new("full.gguf"), full.clone()).unwrap();
        let at = f.data_offset() as usize;
        assert!(full[..at] == head[..at], "{}: headers differ", s.name);
        assert!(
            head[at..].iter().all(|&b| b == 0),
            "{}: data not a hole",
            s.name
        );
        assert!(full[at..].iter().any(|&b| b != 0), "{}: no weights", s.name);
    }
}
