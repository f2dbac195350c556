//! The OpenAI-compatible API these servers share: which server it is, the model list, the chat
//! request with the sampler settings mapped onto it, and the streamed chunks read back.

use serde_json::{Value, json};

use crate::model::protocol::{SamplerConfig, StopReason};

/// Which engine answers: decides the extra sampler fields sent and the panels polled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum ServerKind {
    LlamaServer,
    Vllm,
    Ollama,
    Sglang,
    /// An OpenAI-compatible server of another kind: chat only, no panels.
    Other,
}

impl ServerKind {
    pub fn label(self) -> &'static str {
        match self {
            ServerKind::LlamaServer => "llama-server",
            ServerKind::Vllm => "vLLM",
            ServerKind::Ollama => "ollama",
            ServerKind::Sglang => "SGLang",
            ServerKind::Other => "OpenAI-compatible server",
        }
    }

    /// From `owned_by` in `/v1/models` (llama-server: `llamacpp`, vLLM: `vllm`, SGLang:
    /// `sglang`, ollama: `library` or the user's namespace).
    pub fn from_owner(owner: &str) -> Option<ServerKind> {
        match owner {
            // `hipscope serve` speaks llama-server's dialect (its /props, /slots, /metrics).
            "llamacpp" | "hipscope" => Some(ServerKind::LlamaServer),
            "vllm" => Some(ServerKind::Vllm),
            "sglang" => Some(ServerKind::Sglang),
            "library" | "ollama" => Some(ServerKind::Ollama),
            _ => None,
        }
    }
}

/// One entry of `GET /v1/models`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInfo {
    pub id: String,
    pub owned_by: String,
    /// vLLM's `max_model_len`, llama-server's `meta.n_ctx_train`, when given.
    pub context: Option<u64>,
}

/// Reads a `/v1/models` answer.
pub fn parse_models(body: &str) -> Result<Vec<ModelInfo>, String> {
    let v: Value =
        serde_json::from_str(body).map_err(|e| format!("/v1/models did not answer JSON ({e})"))?;
    let data = v
        .get("data")
        .and_then(Value::as_array)
        .ok_or("/v1/models has no `data` list")?;
    Ok(data
        .iter()
        .filter_map(|m| {
            Some(ModelInfo {
                id: m.get("id")?.as_str()?.to_string(),
                owned_by: m
                    .get("owned_by")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                context: m
                    .get("max_model_len")
                    .and_then(Value::as_u64)
                    .or_else(|| m.pointer("/meta/n_ctx_train").and_then(Value::as_u64)),
            })
        })
        .collect())
}

/// The request body of `POST /v1/chat/completions`.
pub fn chat_body(
    kind: ServerKind,
    model: &str,
    messages: &[(&str, &str)],
    s: &SamplerConfig,
) -> Value {
    let msgs: Vec<Value> = messages
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    let mut b = json!({
        "model": model,
        "messages": msgs,
        "stream": true,
        "stream_options": {"include_usage": true},
        "temperature": s.temp,
        "top_p": s.top_p,
    });
    let o = b.as_object_mut().expect("a JSON object");
    // Not OpenAI's: only to the servers known to take them (OpenAI itself refuses them).
    if matches!(
        kind,
        ServerKind::LlamaServer | ServerKind::Vllm | ServerKind::Sglang
    ) {
        o.insert(
            "top_k".into(),
            json!(if s.top_k == 0 { -1 } else { i64::from(s.top_k) }),
        );
        o.insert("min_p".into(), json!(s.min_p));
        if s.repeat_penalty != 1.0 {
            let key = if kind == ServerKind::LlamaServer {
                "repeat_penalty"
            } else {
                "repetition_penalty"
            };
            o.insert(key.into(), json!(s.repeat_penalty));
        }
    }
    if kind == ServerKind::LlamaServer && s.top_k == 0 {
        o.insert("top_k".into(), json!(0));
    }
    if s.seed != 0xFFFF_FFFF {
        o.insert("seed".into(), json!(s.seed));
    }
    if s.n_predict >= 0 {
        o.insert("max_tokens".into(), json!(s.n_predict));
    }
    if !s.stop.is_empty() {
        o.insert("stop".into(), json!(s.stop));
    }
    b
}

/// What one streamed chunk says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chunk {
    pub text: String,
    /// The reasoning the server split off: `delta.reasoning_content` (llama-server,
    /// `tools/server/server-chat.cpp`), or `delta.reasoning` where a server names it so.
    pub reasoning: String,
    pub finish: Option<StopReason>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// llama-server's `timings`: prompt ms, cached prompt tokens.
    pub prompt_ms: Option<f64>,
    pub cached: Option<u64>,
    /// `[DONE]`.
    pub done: bool,
}

/// Reads one event's data. An `error` object, or data that is not a chunk, is an error.
pub fn parse_chunk(data: &str) -> Result<Chunk, String> {
    if data.trim() == "[DONE]" {
        return Ok(Chunk {
            done: true,
            ..Chunk::default()
        });
    }
    let v: Value = serde_json::from_str(data).map_err(|e| {
        let q: String = data.chars().take(80).collect();
        format!("the server sent a malformed event ({e}): `{q}`")
    })?;
    if let Some(e) = v.get("error") {
        let msg = e
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| e.to_string());
        return Err(format!("the server reported an error: {msg}"));
    }
    let mut c = Chunk::default();
    let choices = v.get("choices").and_then(Value::as_array);
    if choices.is_none() && v.get("usage").is_none() {
        let q: String = data.chars().take(80).collect();
        return Err(format!(
            "the server sent an event that is not a chat chunk: `{q}`"
        ));
    }
    if let Some(ch) = choices.and_then(|c| c.first()) {
        if let Some(t) = ch.pointer("/delta/content").and_then(Value::as_str) {
            c.text = t.to_string();
        }
        if let Some(t) = ch
            .pointer("/delta/reasoning_content")
            .or_else(|| ch.pointer("/delta/reasoning"))
            .and_then(Value::as_str)
        {
            c.reasoning = t.to_string();
        }
        c.finish = match ch.get("finish_reason").and_then(Value::as_str) {
            Some("length") => Some(StopReason::Limit),
            Some(_) => Some(StopReason::Eog),
            None => None,
        };
    }
    if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
        c.prompt_tokens = u.get("prompt_tokens").and_then(Value::as_u64);
        c.completion_tokens = u.get("completion_tokens").and_then(Value::as_u64);
    }
    if let Some(t) = v.get("timings") {
        c.prompt_ms = t.get("prompt_ms").and_then(Value::as_f64);
        c.cached = t.get("cache_n").and_then(Value::as_u64);
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_settings_map_per_server() {
        let s = SamplerConfig {
            temp: 0.0,
            seed: 7,
            n_predict: 32,
            repeat_penalty: 1.1,
            stop: vec!["END".into()],
            ..SamplerConfig::default()
        };
        let b = chat_body(ServerKind::LlamaServer, "m", &[("user", "hi")], &s);
        assert_eq!(b["temperature"], 0.0);
        assert_eq!(b["top_k"], 40);
        assert_eq!(b["seed"], 7);
        assert_eq!(b["max_tokens"], 32);
        assert_eq!(
            b["repeat_penalty"].as_f64().map(|x| (x * 10.0).round()),
            Some(11.0)
        );
        assert_eq!(b["stop"][0], "END");
        assert_eq!(b["messages"][0]["content"], "hi");
        let v = chat_body(ServerKind::Vllm, "m", &[], &s);
        assert!(v.get("repetition_penalty").is_some() && v.get("repeat_penalty").is_none());
        let o = chat_body(ServerKind::Ollama, "m", &[], &SamplerConfig::default());
        assert!(
            o.get("top_k").is_none() && o.get("seed").is_none() && o.get("max_tokens").is_none()
        );
    }

    #[test]
    fn chunks_errors_and_done() {
        let c = parse_chunk(
            r#"{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}"#,
        )
        .unwrap();
        assert_eq!(c.text, "Hi");
        // llama-server's reasoning delta (`delta["reasoning_content"]` in server-chat.cpp).
        let c = parse_chunk(
            r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"reasoning_content":"Let me"}}]}"#,
        )
        .unwrap();
        assert_eq!((c.reasoning.as_str(), c.text.as_str()), ("Let me", ""));
        let c = parse_chunk(r#"{"choices":[{"delta":{},"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":3}}"#).unwrap();
        assert_eq!(c.finish, Some(StopReason::Limit));
        assert_eq!(c.completion_tokens, Some(3));
        assert!(parse_chunk("[DONE]").unwrap().done);
        assert!(
            parse_chunk("{oops")
                .unwrap_err()
                .contains("malformed event")
        );
        assert!(
            parse_chunk(r#"{"error":{"message":"boom"}}"#)
                .unwrap_err()
                .contains("boom")
        );
        assert!(parse_chunk(r#"{"x":1}"#).is_err());
    }
}
