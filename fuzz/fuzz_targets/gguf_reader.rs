//! Feeds arbitrary bytes to the GGUF reader and everything that reads a parsed header (model
//! config, tokenizer, chat template): none of them may panic, read out of bounds or allocate
//! without bound.
#![no_main]

use std::path::Path;

use hipscope::model::config::ModelConfig;
use hipscope::model::gguf::GgufFile;
use hipscope::model::template::ChatTemplate;
use hipscope::model::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(Path::new("fuzz.gguf"), data.to_vec()) else {
        return;
    };
    let mut sum = 0u64;
    for t in f.tensors() {
        sum = sum.wrapping_add(f.tensor_data(t).iter().map(|&b| b as u64).sum::<u64>());
    }
    std::hint::black_box(sum);
    for (_, v) in f.metadata() {
        std::hint::black_box(v.summary());
    }
    if let Ok(c) = ModelConfig::from_gguf(&f) {
        let _ = c.check_tensors(&f);
    }
    if let Ok(tok) = Tokenizer::from_gguf(&f) {
        let ids = tok.encode("Hello <|im_start|> wörld 123", true, true);
        std::hint::black_box(tok.decode(&ids, true));
        let _ = ChatTemplate::from_gguf(&f, &tok);
    }
});
