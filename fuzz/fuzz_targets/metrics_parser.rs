//! Feeds arbitrary text to the Prometheus text-format parser (a remote server's `/metrics`) and
//! to the readers built on it: it may refuse the page, never panic.
#![no_main]

use hipscope::model::remote::panels::{self, RemoteSample};
use hipscope::model::remote::prom::Metrics;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(m) = Metrics::parse(text) {
        let mut s = RemoteSample::default();
        panels::apply_llama_metrics(&mut s, &m);
        panels::apply_vllm_metrics(&mut s, &m);
        let _ = panels::streams(&s);
        let _ = panels::arena(&s);
    }
    let _ = panels::parse_slots(text);
    let _ = panels::parse_ollama_ps(text);
});
