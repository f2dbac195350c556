//! The remote engine: an OpenAI-compatible server (llama-server, vLLM, ollama, SGLang) behind
//! the same worker protocol as the local model, so that the chat, `/save`, transcripts and
//! markdown work unchanged, and the server's own metrics feeding the diagnostics panels.
//!
//! `client` (HTTP, key, errors) → `sse`, `prom`, `openai` (formats) → `session` (one
//! conversation, streamed) and `panels` (the poller) → [`connect`].

pub mod client;
pub mod openai;
pub mod panels;
pub mod prom;
pub mod session;
pub mod sse;

use client::{Client, RemoteSpec};
use openai::ServerKind;

use crate::gpu::snapshot::{DeviceSummary, WatchdogSnapshot};
use crate::model::protocol::{ModelSummary, SamplerConfig};
use session::RemoteSession;

/// In a remote device's `reason` when TLS certificates are not checked: the status bar shows it.
pub const INSECURE_MARK: &str = "TLS NOT VERIFIED (--insecure)";

/// What [`connect`] found.
pub struct Connected {
    pub session: RemoteSession,
    pub model: ModelSummary,
    pub device: DeviceSummary,
}

/// Finds out which server answers at `spec.url` and which model to ask for: `GET /v1/models`
/// (the model named in the spec must be listed), then the server's kind from `owned_by`, or
/// from `/api/version` (ollama) and `/version` (vLLM).
pub fn connect(
    spec: RemoteSpec,
    sampler: SamplerConfig,
    watch: Box<dyn Fn(WatchdogSnapshot) + Send>,
) -> Result<Connected, String> {
    let t0 = std::time::Instant::now();
    let client = Client::new(spec)?;
    let body = client.get_ok("/v1/models").map_err(|e| e.to_string())?;
    let models = openai::parse_models(&body).map_err(|e| format!("{}: {e}", client.spec.host()))?;
    if models.is_empty() {
        return Err(format!(
            "{} serves no model (/v1/models is empty)",
            client.spec.host()
        ));
    }
    let chosen = match &client.spec.model {
        Some(want) => models.iter().find(|m| &m.id == want).ok_or_else(|| {
            format!(
                "{}: model `{want}` is not served; the server has: {}",
                client.spec.host(),
                models
                    .iter()
                    .map(|m| m.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?,
        None => &models[0],
    };
    let kind = ServerKind::from_owner(&chosen.owned_by)
        .or_else(|| {
            matches!(client.get("/api/version"), Ok((200, _))).then_some(ServerKind::Ollama)
        })
        .or_else(|| matches!(client.get("/version"), Ok((200, _))).then_some(ServerKind::Vllm))
        .unwrap_or(ServerKind::Other);
    let mut context = chosen.context.unwrap_or(0) as usize;
    if kind == ServerKind::LlamaServer
        && let Ok(b) = client.get_ok("/props")
        && let Ok(v) = serde_json::from_str::<serde_json::Value>(&b)
        && let Some(n) = v
            .pointer("/default_generation_settings/n_ctx")
            .and_then(|n| n.as_u64())
    {
        context = n as usize;
    }
    let name = chosen
        .id
        .rsplit('/')
        .next()
        .unwrap_or(&chosen.id)
        .to_string();
    let model = ModelSummary {
        name,
        path: None,
        architecture: kind.label().to_string(),
        quant: String::new(),
        parameters: 0,
        file_bytes: 0,
        context_length: context,
        n_layers: 0,
        load_time: t0.elapsed(),
    };
    let insecure = if client.spec.insecure {
        format!(" · {INSECURE_MARK}")
    } else {
        String::new()
    };
    let device = DeviceSummary {
        backend: "remote".into(),
        name: format!("{} at {}", kind.label(), client.spec.host()),
        arch: client.spec.name.clone(),
        reason: format!("remote engine {}{insecure}", client.spec.url),
        ..DeviceSummary::default()
    };
    let session = RemoteSession::new(client, kind, chosen.id.clone(), sampler, watch);
    Ok(Connected {
        session,
        model,
        device,
    })
}
