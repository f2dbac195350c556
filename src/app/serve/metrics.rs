//! `/metrics` (Prometheus text), `/slots` and `/props` as llama-server writes them (names of
//! b11434's `server-task.cpp` and `server-context.cpp`), so that `hipscope top --remote`,
//! `chat --remote` and dashboards made for llama-server read hipscope alike.

use std::fmt::Write;

use serde_json::{Value, json};

use crate::model::scheduler::{ServeSnapshot, SlotState};

/// The Prometheus text of a snapshot.
pub fn prometheus(s: &ServeSnapshot) -> String {
    let c = &s.counters;
    let per_s = |n: u64, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    let busy_per_decode = if c.n_decode_total > 0 {
        c.n_busy_slots_total as f64 / c.n_decode_total as f64
    } else {
        0.0
    };
    let processing = s.busy();
    let rows: [(&str, &str, &str, f64); 11] = [
        (
            "prompt_tokens_total",
            "counter",
            "Number of prompt tokens processed.",
            c.prompt_tokens_total as f64,
        ),
        (
            "prompt_seconds_total",
            "counter",
            "Prompt process time",
            c.prompt_seconds_total,
        ),
        (
            "tokens_predicted_total",
            "counter",
            "Number of generation tokens processed.",
            c.tokens_predicted_total as f64,
        ),
        (
            "tokens_predicted_seconds_total",
            "counter",
            "Predict process time",
            c.tokens_predicted_seconds_total,
        ),
        (
            "n_decode_total",
            "counter",
            "Total number of llama_decode() calls",
            c.n_decode_total as f64,
        ),
        (
            "n_busy_slots_per_decode",
            "counter",
            "Average number of busy slots per llama_decode() call",
            busy_per_decode,
        ),
        (
            "prompt_tokens_seconds",
            "gauge",
            "Average prompt throughput in tokens/s.",
            per_s(c.prompt_tokens_total, c.prompt_seconds_total),
        ),
        (
            "predicted_tokens_seconds",
            "gauge",
            "Average generation throughput in tokens/s.",
            per_s(c.tokens_predicted_total, c.tokens_predicted_seconds_total),
        ),
        (
            "requests_processing",
            "gauge",
            "Number of requests processing.",
            processing as f64,
        ),
        (
            "requests_deferred",
            "gauge",
            "Number of requests deferred.",
            s.queued.len() as f64,
        ),
        (
            "kv_cache_tokens",
            "gauge",
            "KV-cache tokens.",
            s.slots.iter().map(|x| x.held).sum::<usize>() as f64,
        ),
    ];
    let mut out = String::new();
    for (name, kind, help, v) in rows {
        let _ = writeln!(out, "# HELP llamacpp:{name} {help}");
        let _ = writeln!(out, "# TYPE llamacpp:{name} {kind}");
        let _ = writeln!(out, "llamacpp:{name} {v}");
    }
    out
}

/// `/slots`: one object per slot with the fields llama-server's clients read.
pub fn slots(s: &ServeSnapshot) -> Value {
    Value::Array(
        s.slots
            .iter()
            .map(|x| {
                json!({
                    "id": x.id,
                    "n_ctx": s.n_ctx,
                    "is_processing": x.request.is_some(),
                    "n_prompt_tokens": x.held,
                    "state": match x.state {
                        SlotState::Idle => "idle",
                        SlotState::Prompt { .. } => "prompt",
                        SlotState::Generating => "generating",
                    },
                    "next_token": [{"n_decoded": x.generated}],
                })
            })
            .collect(),
    )
}

/// `/props`.
pub fn props(model_path: &str, alias: &str, n_slots: usize, n_ctx: usize) -> Value {
    json!({
        "model_path": model_path,
        "model_alias": alias,
        "total_slots": n_slots,
        "build_info": format!("hipscope {}", env!("CARGO_PKG_VERSION")),
        "default_generation_settings": {"n_ctx": n_ctx},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::remote::prom::Metrics;

    /// The page reads back through hipscope's own Prometheus parser under llama-server's names,
    /// as `top --remote` reads it.
    #[test]
    fn the_page_parses_under_llama_servers_names() {
        let mut s = ServeSnapshot::idle(2, 512);
        s.counters.tokens_predicted_total = 30;
        s.counters.tokens_predicted_seconds_total = 1.5;
        s.slots[1].request = Some(4);
        let m = Metrics::parse(&prometheus(&s)).expect("parses");
        assert_eq!(m.sum("llamacpp:requests_processing"), Some(1.0));
        assert_eq!(m.sum("llamacpp:predicted_tokens_seconds"), Some(20.0));
        assert_eq!(m.sum("llamacpp:requests_deferred"), Some(0.0));
        let slots = crate::model::remote::panels::parse_slots(&slots(&s).to_string()).unwrap();
        assert_eq!(
            (slots.len(), slots[1].processing, slots[0].n_ctx),
            (2, true, 512)
        );
    }
}
