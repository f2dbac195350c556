//! Inputs kept from fuzzing the GGUF reader (`cargo fuzz run gguf_reader`, see fuzz/), replayed
//! through the same code the fuzz target runs: each must be handled without a panic
//! (`slow-block-count.gguf` is a unit the fuzzer flagged as slow: a block count of 65537 made the
//! tensor check list 786k names before refusing). The seeds the fuzzer started from must still get
//! all the way through, so that a regression that refuses every file cannot pass unnoticed.

use crate::common;

use common::repo_path;
use hipscope::model::untrusted::{Reach, exercise};

fn replay(dir: &str) -> Vec<(String, Reach)> {
    let mut out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(repo_path(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        let bytes = std::fs::read(&p).unwrap();
        let reach = exercise(&bytes);
        out.push((p.file_name().unwrap().to_string_lossy().into_owned(), reach));
    }
    out
}

#[test]
fn kept_fuzz_inputs_are_handled() {
    let found = replay("tests/data/fuzz");
    assert!(!found.is_empty());
}

#[test]
fn seeds_get_through_every_stage() {
    let found = replay("fuzz/seeds");
    let get = |name: &str| {
        found
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, r)| *r)
            .unwrap_or_else(|| panic!("seed {name} missing"))
    };
    let full = Reach {
        parsed: true,
        config: true,
        tokenizer: true,
        template: true,
    };
    assert_eq!(get("tiny-llama.gguf"), full);
    assert!(get("bpe-vocab.gguf").tokenizer && get("bpe-vocab.gguf").template);
    assert!(get("spm-vocab.gguf").tokenizer);
}
