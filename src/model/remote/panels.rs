//! The server's own view, for the Streams, Arena and Watchdog panels and `hipscope top
//! --remote`: read on a poller thread of its own at the telemetry interval (never on the UI
//! thread), each reading marked with the endpoint it came from.
//!
//! llama-server: `/health`, `/props`, `/slots`, `/metrics`; vLLM: `/health`, `/metrics`; ollama:
//! `/api/version`, `/api/ps`. A page the server does not serve (llama-server without
//! `--metrics` or with `--no-slots` answers 501) is said so in the panel, not hidden.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use super::client::{Client, RemoteError};
use super::openai::ServerKind;
use super::prom::Metrics;
use super::session::{OwnRequest, Shared};
use crate::gpu::snapshot::{ArenaSnapshot, REMOTE_ARENA, RegionSnapshot, StreamSnapshot};

/// One llama-server slot (`/slots`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Slot {
    pub id: u64,
    pub processing: bool,
    pub n_ctx: u64,
    /// Tokens the slot holds in the KV cache (`n_prompt_tokens`: the prompt and what was
    /// generated after it), when the server says.
    pub tokens: Option<u64>,
    /// Tokens generated for the request in the slot (`next_token[0].n_decoded`).
    pub decoded: Option<u64>,
}

/// One model ollama has loaded (`/api/ps`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LoadedModel {
    pub name: String,
    pub size: u64,
    pub size_vram: u64,
    pub expires_at: String,
}

/// One reading of the server, everything optional: what the server did not say stays `None`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RemoteSample {
    pub server: String,
    pub host: String,
    /// `ok`, or what `/health` said instead.
    pub health: Option<String>,
    pub version: Option<String>,
    pub model: Option<String>,
    pub running: Option<f64>,
    pub waiting: Option<f64>,
    pub slots: Vec<Slot>,
    /// KV-cache use 0..=1 and where it came from.
    pub kv_usage: Option<f64>,
    pub kv_source: Option<String>,
    /// Tokens held and their capacity (llama-server's slots).
    pub kv_tokens: Option<(u64, u64)>,
    pub preemptions: Option<f64>,
    /// Server-side means over its life (histograms): seconds.
    pub ttft_mean_s: Option<f64>,
    pub itl_mean_s: Option<f64>,
    pub prompt_tps: Option<f64>,
    pub gen_tps: Option<f64>,
    pub loaded: Vec<LoadedModel>,
    /// What could not be read, and why (`/metrics: disabled on the server (start it with
    /// --metrics)`).
    pub notes: Vec<String>,
    /// This chat's own request, client side.
    pub own_phase: Option<String>,
    pub own_tokens: Option<usize>,
    pub own_ttft_ms: Option<f64>,
    pub own_itl_ms: Option<f64>,
}

/// Reads `/slots`.
pub fn parse_slots(body: &str) -> Result<Vec<Slot>, String> {
    let v: Value = serde_json::from_str(body).map_err(|e| format!("/slots: not JSON ({e})"))?;
    let list = v.as_array().ok_or("/slots: not a list")?;
    Ok(list
        .iter()
        .map(|s| Slot {
            id: s.get("id").and_then(Value::as_u64).unwrap_or(0),
            processing: s
                .get("is_processing")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            n_ctx: s.get("n_ctx").and_then(Value::as_u64).unwrap_or(0),
            tokens: s.get("n_prompt_tokens").and_then(Value::as_u64),
            decoded: s.pointer("/next_token/0/n_decoded").and_then(Value::as_u64),
        })
        .collect())
}

/// Reads `/api/ps`.
pub fn parse_ollama_ps(body: &str) -> Result<Vec<LoadedModel>, String> {
    let v: Value = serde_json::from_str(body).map_err(|e| format!("/api/ps: not JSON ({e})"))?;
    let list = v
        .get("models")
        .and_then(Value::as_array)
        .ok_or("/api/ps: no `models` list")?;
    Ok(list
        .iter()
        .map(|m| LoadedModel {
            name: m.get("name").and_then(Value::as_str).unwrap_or("?").into(),
            size: m.get("size").and_then(Value::as_u64).unwrap_or(0),
            size_vram: m.get("size_vram").and_then(Value::as_u64).unwrap_or(0),
            expires_at: m
                .get("expires_at")
                .and_then(Value::as_str)
                .unwrap_or("")
                .into(),
        })
        .collect())
}

/// Fills `s` from a llama-server `/metrics` page (names of b11434's `server-task.cpp`).
pub fn apply_llama_metrics(s: &mut RemoteSample, m: &Metrics) {
    s.running = m.sum("llamacpp:requests_processing");
    s.waiting = m.sum("llamacpp:requests_deferred");
    s.prompt_tps = m.sum("llamacpp:prompt_tokens_seconds");
    s.gen_tps = m.sum("llamacpp:predicted_tokens_seconds");
}

/// Fills `s` from a vLLM `/metrics` page (V1 names, and V0's `gpu_cache_usage_perc`).
pub fn apply_vllm_metrics(s: &mut RemoteSample, m: &Metrics) {
    s.running = m.sum("vllm:num_requests_running");
    s.waiting = m.sum("vllm:num_requests_waiting");
    for name in ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"] {
        if let Some(v) = m.mean(name) {
            s.kv_usage = Some(v);
            s.kv_source = Some(format!("/metrics {name}"));
            break;
        }
    }
    s.preemptions = m.sum("vllm:num_preemptions_total");
    s.ttft_mean_s = m
        .histogram("vllm:time_to_first_token_seconds")
        .and_then(|h| h.mean());
    s.itl_mean_s = m
        .histogram("vllm:inter_token_latency_seconds")
        .or_else(|| m.histogram("vllm:time_per_output_token_seconds"))
        .and_then(|h| h.mean());
}

/// Fills `s` from llama-server's slots: KV use is the tokens the slots hold over their sizes.
pub fn apply_slots(s: &mut RemoteSample, slots: Vec<Slot>) {
    let cap: u64 = slots.iter().map(|x| x.n_ctx).sum();
    let held: u64 = slots.iter().filter_map(|x| x.tokens).sum();
    if cap > 0 {
        s.kv_tokens = Some((held, cap));
        s.kv_usage = Some(held as f64 / cap as f64);
        s.kv_source = Some("/slots".into());
    }
    if s.running.is_none() {
        s.running = Some(slots.iter().filter(|x| x.processing).count() as f64);
    }
    s.slots = slots;
}

/// Why a page could not be read, for the panel's notes.
fn note(path: &str, e: &RemoteError) -> String {
    match e {
        RemoteError::Status { status: 501, .. } if path == "/metrics" => {
            "/metrics: disabled on the server (start llama-server with --metrics)".into()
        }
        RemoteError::Status { status: 501, .. } if path == "/slots" => {
            "/slots: disabled on the server (started with --no-slots)".into()
        }
        other => format!("{path}: {other}"),
    }
}

/// Takes one reading of the server.
pub fn sample(client: &Client, kind: ServerKind, own: Option<&OwnRequest>) -> RemoteSample {
    let mut s = RemoteSample {
        server: kind.label().into(),
        host: client.spec.host().into(),
        ..RemoteSample::default()
    };
    let health = |s: &mut RemoteSample| match client.get("/health") {
        Ok((200, _)) => s.health = Some("ok".into()),
        Ok((code, body)) => {
            s.health = Some(format!("HTTP {code}: {}", super::client::short_body(&body)))
        }
        Err(e) => s.health = Some(e.to_string()),
    };
    match kind {
        ServerKind::LlamaServer => {
            health(&mut s);
            match client.get_ok("/props") {
                Ok(b) => {
                    if let Ok(v) = serde_json::from_str::<Value>(&b) {
                        s.model = v
                            .get("model_alias")
                            .or_else(|| v.get("model_path"))
                            .and_then(Value::as_str)
                            .map(str::to_string);
                        s.version = v
                            .get("build_info")
                            .and_then(Value::as_str)
                            .map(str::to_string);
                    }
                }
                Err(e) => s.notes.push(note("/props", &e)),
            }
            match client.get_ok("/metrics").map(|b| Metrics::parse(&b)) {
                Ok(Ok(m)) => apply_llama_metrics(&mut s, &m),
                Ok(Err(e)) => s.notes.push(format!("/metrics: {e}")),
                Err(e) => s.notes.push(note("/metrics", &e)),
            }
            match client.get_ok("/slots").map(|b| parse_slots(&b)) {
                Ok(Ok(slots)) => apply_slots(&mut s, slots),
                Ok(Err(e)) => s.notes.push(e),
                Err(e) => s.notes.push(note("/slots", &e)),
            }
        }
        ServerKind::Vllm | ServerKind::Sglang => {
            health(&mut s);
            match client.get_ok("/metrics").map(|b| Metrics::parse(&b)) {
                Ok(Ok(m)) => {
                    apply_vllm_metrics(&mut s, &m);
                    if kind == ServerKind::Sglang {
                        s.running = m.sum("sglang:num_running_reqs");
                        s.waiting = m.sum("sglang:num_queue_reqs");
                        if let Some(u) = m.mean("sglang:token_usage") {
                            s.kv_usage = Some(u);
                            s.kv_source = Some("/metrics sglang:token_usage".into());
                        }
                    }
                }
                Ok(Err(e)) => s.notes.push(format!("/metrics: {e}")),
                Err(e) => s.notes.push(note("/metrics", &e)),
            }
        }
        ServerKind::Ollama => {
            match client.get_ok("/api/version") {
                Ok(b) => {
                    s.health = Some("ok".into());
                    s.version = serde_json::from_str::<Value>(&b)
                        .ok()
                        .and_then(|v| v.get("version")?.as_str().map(str::to_string));
                }
                Err(e) => s.health = Some(e.to_string()),
            }
            match client.get_ok("/api/ps").map(|b| parse_ollama_ps(&b)) {
                Ok(Ok(l)) => s.loaded = l,
                Ok(Err(e)) => s.notes.push(e),
                Err(e) => s.notes.push(note("/api/ps", &e)),
            }
            s.notes
                .push("ollama reports no queue or KV cache; loaded models from /api/ps".into());
        }
        ServerKind::Other => {
            s.notes
                .push("this server kind reports no metrics hipscope knows".into());
        }
    }
    if let Some(o) = own
        && o.started.is_some()
    {
        s.own_phase = Some(o.phase.clone());
        s.own_tokens = Some(o.tokens);
    }
    if let Some(o) = own {
        s.own_ttft_ms = o.ttft.map(|d| d.as_secs_f64() * 1e3);
        s.own_itl_ms = o.itl.map(|d| d.as_secs_f64() * 1e3);
    }
    s
}

/// The Streams panel's rows: the server's requests (slots on llama-server), this chat's
/// request marked.
pub fn streams(s: &RemoteSample) -> Vec<StreamSnapshot> {
    let mut out = Vec::new();
    let src = |p: &str| format!("{} {p}", s.server);
    for slot in &s.slots {
        let held = slot
            .tokens
            .map(|t| format!("{t}/{} tokens", slot.n_ctx))
            .unwrap_or_else(|| format!("0/{} tokens", slot.n_ctx));
        out.push(StreamSnapshot {
            name: format!("slot {} ({})", slot.id, src("/slots")),
            queue_depth: u32::from(slot.processing),
            in_flight: slot.processing.then(|| {
                (
                    format!(
                        "processing, {held}{}",
                        slot.decoded
                            .map(|d| format!(", {d} generated"))
                            .unwrap_or_default()
                    ),
                    Duration::ZERO,
                )
            }),
            last_completed: (!slot.processing).then(|| format!("idle, {held}")),
            ..StreamSnapshot::default()
        });
    }
    if s.running.is_some() || s.waiting.is_some() {
        // A gauge is a float: a server may print `Inf` or a huge value; the casts saturate, and
        // so must the sum (`cargo fuzz run metrics_parser` found `... Inf` overflowing it).
        let run = s.running.unwrap_or(0.0).max(0.0) as u32;
        let wait = s.waiting.unwrap_or(0.0).max(0.0) as u32;
        let depth = run.saturating_add(wait);
        out.push(StreamSnapshot {
            name: format!("requests ({})", src("/metrics")),
            queue_depth: depth,
            in_flight: (depth > 0)
                .then(|| (format!("{run} running, {wait} waiting"), Duration::ZERO)),
            last_completed: (depth == 0).then(|| "none running or waiting".into()),
            ..StreamSnapshot::default()
        });
    }
    for m in &s.loaded {
        out.push(StreamSnapshot {
            name: format!("{} ({})", m.name, src("/api/ps")),
            last_completed: Some(format!("loaded until {}", m.expires_at)),
            ..StreamSnapshot::default()
        });
    }
    if let Some(phase) = &s.own_phase {
        out.push(StreamSnapshot {
            name: "this chat (client)".into(),
            queue_depth: 1,
            in_flight: Some((
                format!("{phase}, {} tokens", s.own_tokens.unwrap_or(0)),
                Duration::ZERO,
            )),
            ..StreamSnapshot::default()
        });
    }
    out
}

/// The Arena panel: the server's KV cache. Token counts are shown as tokens (the region's
/// name says so), a bare percentage as a share of 100.
pub fn arena(s: &RemoteSample) -> Option<ArenaSnapshot> {
    let usage = s.kv_usage?;
    let source = s.kv_source.clone().unwrap_or_default();
    let (used, cap, unit) = match s.kv_tokens {
        Some((h, c)) => (h, c, "tokens"),
        None => ((usage.clamp(0.0, 1.0) * 1000.0).round() as u64, 1000, "‰"),
    };
    Some(ArenaSnapshot {
        kind: format!("{REMOTE_ARENA} ({} {source})", s.server),
        capacity: cap,
        used,
        high_water: used,
        regions: vec![RegionSnapshot {
            name: format!("KV cache, {unit}"),
            capacity: cap,
            used,
        }],
        largest_free: cap.saturating_sub(used),
        ..ArenaSnapshot::default()
    })
}

/// Polls the server every `every` until `stop` says so (or its sender is dropped), handing
/// each sample to `deliver` (false: nobody listens, stop).
pub fn poll(
    client: Client,
    kind: ServerKind,
    own: Option<Shared>,
    every: Duration,
    stop: Receiver<()>,
    mut deliver: impl FnMut(RemoteSample) -> bool,
) {
    loop {
        let t = Instant::now();
        let own_now = own.as_ref().and_then(|o| o.lock().ok().map(|g| g.clone()));
        let s = sample(&client, kind, own_now.as_ref());
        if let Some(o) = &own
            && let Ok(mut g) = o.lock()
        {
            g.server_waiting = s.waiting.map(|w| w.max(0.0) as u64);
        }
        if !deliver(s) {
            return;
        }
        match stop.recv_timeout(every.saturating_sub(t.elapsed())) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(name: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/remote")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn infinite_gauges_saturate_the_queue_depth() {
        let page = "vllm:num_requests_running{engine=\"0\"} Inf\n\
                    vllm:num_requests_waiting{engine=\"0\"} 1.0\n";
        let mut s = RemoteSample::default();
        apply_vllm_metrics(&mut s, &Metrics::parse(page).unwrap());
        let rows = streams(&s);
        let req = rows
            .iter()
            .find(|r| r.name.starts_with("requests"))
            .unwrap();
        assert_eq!(req.queue_depth, u32::MAX);
    }

    #[test]
    fn llama_server_busy_pages() {
        let mut s = RemoteSample::default();
        apply_llama_metrics(
            &mut s,
            &Metrics::parse(&data("llama-server-metrics_busy.txt")).unwrap(),
        );
        assert_eq!(s.running, Some(1.0));
        assert_eq!(s.waiting, Some(0.0));
        apply_slots(
            &mut s,
            parse_slots(&data("llama-server-slots_busy.json")).unwrap(),
        );
        assert_eq!(s.slots.len(), 2);
        assert!(s.slots[1].processing && !s.slots[0].processing);
        assert_eq!(s.kv_tokens, Some((50, 2048)));
        let rows = streams(&s);
        assert_eq!(rows[1].queue_depth, 1);
        assert!(
            rows[1]
                .in_flight
                .as_ref()
                .unwrap()
                .0
                .contains("50/1024 tokens, 12 generated")
        );
        let a = arena(&s).unwrap();
        assert_eq!((a.used, a.capacity), (50, 2048));
    }

    #[test]
    fn llama_server_idle_slot_keeps_its_tokens() {
        let slots = parse_slots(&data("llama-server-slots_idle.json")).unwrap();
        assert_eq!(slots[1].tokens, Some(237));
        assert!(!slots[1].processing);
    }

    #[test]
    fn vllm_v1_and_v0_pages() {
        let mut s = RemoteSample::default();
        apply_vllm_metrics(
            &mut s,
            &Metrics::parse(&data("vllm-v1-metrics.txt")).unwrap(),
        );
        assert_eq!((s.running, s.waiting), (Some(3.0), Some(2.0)));
        assert_eq!(s.kv_usage, Some(0.4375));
        assert_eq!(s.preemptions, Some(1.0));
        assert!((s.ttft_mean_s.unwrap() - 0.12).abs() < 1e-9);
        assert!((s.itl_mean_s.unwrap() - 0.02).abs() < 1e-9);
        let a = arena(&s).unwrap();
        assert_eq!((a.used, a.capacity), (438, 1000));
        let mut s = RemoteSample::default();
        apply_vllm_metrics(
            &mut s,
            &Metrics::parse(&data("vllm-v0-metrics.txt")).unwrap(),
        );
        assert_eq!(s.kv_usage, Some(0.021));
        assert_eq!(
            s.kv_source.as_deref(),
            Some("/metrics vllm:gpu_cache_usage_perc")
        );
    }

    #[test]
    fn ollama_pages() {
        let l = parse_ollama_ps(&data("ollama-api-ps.json")).unwrap();
        assert_eq!(l[0].name, "mistral:latest");
        assert_eq!(l[0].size_vram, 5137025024);
        let v: Value = serde_json::from_str(&data("ollama-api-version.json")).unwrap();
        assert_eq!(v["version"], "0.5.1");
    }

    #[test]
    fn disabled_pages_are_named() {
        let body = data("llama-server-metrics_disabled.json");
        let e = RemoteError::Status {
            what: "h /metrics".into(),
            status: 501,
            body: super::super::client::short_body(&body),
            retry_after: None,
        };
        assert!(note("/metrics", &e).contains("--metrics"));
        assert!(parse_slots("<html>").is_err());
    }
}
