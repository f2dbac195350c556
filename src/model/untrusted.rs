//! Everything that reads an untrusted GGUF file, run once over some bytes: the reader, tensor
//! data access, metadata rendering, the model config check, the tokenizer and the chat template.
//! The fuzz target (`fuzz/fuzz_targets/gguf_reader.rs`) calls it with libFuzzer's inputs, and
//! `tests/it/fuzz_regressions.rs` replays the inputs kept from fuzzing; neither may ever panic.

use std::path::Path;

use crate::model::config::ModelConfig;
use crate::model::gguf::GgufFile;
use crate::model::template::{ChatTemplate, Message};
use crate::model::tokenizer::Tokenizer;

/// How far an input got, for the regression test to report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reach {
    pub parsed: bool,
    pub config: bool,
    pub tokenizer: bool,
    pub template: bool,
}

pub fn exercise(bytes: &[u8]) -> Reach {
    let mut reach = Reach::default();
    let Ok(f) = GgufFile::from_bytes(Path::new("untrusted.gguf"), bytes.to_vec()) else {
        return reach;
    };
    reach.parsed = true;
    let mut sum = 0u64;
    for t in f.tensors() {
        sum = sum.wrapping_add(f.tensor_data(t).iter().map(|&b| b as u64).sum::<u64>());
    }
    std::hint::black_box(sum);
    for (_, v) in f.metadata() {
        std::hint::black_box(v.summary());
    }
    if let Ok(c) = ModelConfig::from_gguf(&f) {
        reach.config = c.check_tensors(&f).is_ok();
    }
    if let Ok(tok) = Tokenizer::from_gguf(&f) {
        reach.tokenizer = true;
        let ids = tok.encode("Hello <|im_start|> wörld 123\n\n  x", true, true);
        std::hint::black_box(tok.decode(&ids, true));
        if let Ok(t) = ChatTemplate::from_gguf(&f, &tok) {
            reach.template = t.render(&[Message::new("user", "hi")], true).is_ok();
        }
    }
    reach
}
