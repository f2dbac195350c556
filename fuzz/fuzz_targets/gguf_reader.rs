//! Feeds arbitrary bytes to the GGUF reader and everything that reads a parsed header (model
//! config, tokenizer, chat template): none of them may panic, read out of bounds or allocate
//! without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    hipscope::model::untrusted::exercise(data);
});
