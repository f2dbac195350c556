//! Every shape `hipscope synth` writes loads in llama.cpp (issue 13 item 7). CI does not build
//! llama.cpp, so `scripts/synth-llama-loads.sh` ran llama.cpp b11434's CPU `llama-bench` on each
//! shape's Q4_0 file and its record is kept in `tests/data/reference/synth-llama-cpp.toml`. This
//! test holds the record to what hipscope writes today: every shape recorded and loaded, with the
//! parameter count llama.cpp read from the file equal to the one hipscope's own tensor list gives,
//! so a shape added or changed without a new llama.cpp run fails here.

mod common;

use common::repo_path;
use hipscope::model::synthetic::{SHAPES, n_params};

/// llama-bench's markdown `params` column (`tools/llama-bench/llama-bench.cpp`).
fn llama_bench_params(n: u64) -> String {
    if n < 1_000_000_000 {
        format!("{:.2} M", n as f64 / 1e6)
    } else {
        format!("{:.2} B", n as f64 / 1e9)
    }
}

fn record() -> Vec<toml::Value> {
    let path = repo_path("tests/data/reference/synth-llama-cpp.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let t: toml::Table = toml::from_str(&text).unwrap();
    t["shape"].as_array().expect("[[shape]] entries").clone()
}

#[test]
fn every_synth_shape_is_recorded_as_loaded_by_llama_cpp() {
    let rec = record();
    let name = |r: &toml::Value| r["name"].as_str().unwrap().to_string();
    let missing: Vec<&str> = SHAPES
        .iter()
        .map(|s| s.name)
        .filter(|n| !rec.iter().any(|r| name(r) == *n))
        .collect();
    assert!(
        missing.is_empty(),
        "shapes with no llama.cpp record (run scripts/synth-llama-loads.sh): {missing:?}"
    );
    let stale: Vec<String> = rec
        .iter()
        .map(name)
        .filter(|n| !SHAPES.iter().any(|s| s.name == n))
        .collect();
    assert!(
        stale.is_empty(),
        "records of shapes synth no longer has: {stale:?}"
    );
    for r in &rec {
        assert_eq!(
            r["loaded"].as_bool(),
            Some(true),
            "llama.cpp did not load {}: {}",
            name(r),
            r.get("error").and_then(|e| e.as_str()).unwrap_or("")
        );
        let cmd = r["command"].as_str().unwrap();
        assert!(
            cmd.starts_with("llama-bench -m ") && cmd.contains(&name(r)),
            "{cmd}"
        );
    }
}

#[test]
fn llama_cpp_counts_the_parameters_hipscope_writes_today() {
    let rec = record();
    for s in SHAPES {
        let Some(r) = rec.iter().find(|r| r["name"].as_str() == Some(s.name)) else {
            continue; // reported by the test above
        };
        assert_eq!(
            r["params"].as_str().unwrap(),
            llama_bench_params(n_params(s)),
            "{}: llama.cpp's parameter count of the recorded file against the shape's tensors",
            s.name
        );
    }
}
