//! The OpenAI-compatible request bodies `hipscope serve` takes, checked field by field before
//! anything runs, and the answers it writes (objects, stream chunks, errors) in the shapes the
//! `openai` package and llama-server's clients read.
//!
//! A field OpenAI documents but hipscope does not implement is accepted when it asks for nothing
//! (`n: 1`, `presence_penalty: 0`, `logprobs: false`) and refused with 400 otherwise; a field
//! nobody documents is refused with 400 naming it, as OpenAI's own API does.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::model::protocol::{GenStats, SamplerConfig, StopReason};
use crate::model::sampler::RANDOM_SEED;
use crate::model::template::Message;

/// A request the client got wrong: the status and the sentence it is told.
#[derive(Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

impl ApiError {
    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
        }
    }

    /// The OpenAI error object.
    pub fn body(&self) -> Value {
        let kind = match self.status {
            401 => "authentication_error",
            413 => "invalid_request_error",
            429 | 503 => "unavailable_error",
            s if s >= 500 => "server_error",
            _ => "invalid_request_error",
        };
        json!({"error": {"message": self.message, "type": kind, "code": self.status}})
    }
}

/// An error answer: the status, OpenAI's error object, and `Retry-After` with a 503.
pub fn error(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    let mut r = (status, Json(e.body())).into_response();
    if e.status == 503 {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

/// Fields of both endpoints: the sampler (OpenAI's and llama.cpp's names), limits, streaming.
const COMMON: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "n_predict",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repeat_penalty",
    "repeat_last_n",
    "seed",
    "stop",
    "n",
    "user",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "cache_prompt",
    "ignore_eos",
    "metadata",
    "store",
    "service_tier",
];
const CHAT_ONLY: &[&str] = &[
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "reasoning_effort",
    "chat_template_kwargs",
];
const COMPLETION_ONLY: &[&str] = &["prompt", "echo", "suffix", "best_of"];

/// What a request asks, checked.
#[derive(Debug)]
pub struct Asked {
    pub stream: bool,
    pub include_usage: bool,
    pub sampler: SamplerConfig,
    /// `max_tokens` as given (`None`: until the end of text or a full context).
    pub max_tokens: Option<usize>,
    /// llama.cpp's `ignore_eos`: end-of-generation tokens are never picked.
    pub ignore_eos: bool,
}

/// A chat request's messages, for the template.
pub fn chat_messages(body: &Map<String, Value>) -> Result<Vec<Message>, ApiError> {
    let list = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad("`messages` must be a list of messages"))?;
    if list.is_empty() {
        return Err(ApiError::bad("`messages` is empty"));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad(format!("messages[{i}] has no `role`")))?;
        let role = match role {
            "system" | "developer" => "system",
            "user" | "assistant" => role,
            other => {
                return Err(ApiError::bad(format!(
                    "messages[{i}]: role `{other}` is not supported (system, developer, user, assistant)"
                )));
            }
        };
        let content = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None if role == "assistant" => String::new(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(t))) => text.push_str(t),
                        _ => {
                            return Err(ApiError::bad(format!(
                                "messages[{i}]: only text content parts are supported"
                            )));
                        }
                    }
                }
                text
            }
            _ => {
                return Err(ApiError::bad(format!(
                    "messages[{i}]: `content` must be a string or a list of text parts"
                )));
            }
        };
        let mut msg = Message::new(role, content);
        if let Some(r) = m.get("reasoning_content").and_then(Value::as_str) {
            msg = msg.with_reasoning(r);
        }
        out.push(msg);
    }
    Ok(out)
}

/// A completion request's prompt: text, or token ids.
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

pub fn completion_prompt(body: &Map<String, Value>, n_vocab: usize) -> Result<Prompt, ApiError> {
    let bad = || ApiError::bad("`prompt` must be a string, a list of one string, or token ids");
    match body.get("prompt") {
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            Ok(Prompt::Text(a[0].as_str().unwrap_or_default().to_string()))
        }
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => {
            let ids: Vec<u32> = a
                .iter()
                .filter_map(Value::as_u64)
                .filter(|&t| (t as usize) < n_vocab)
                .map(|t| t as u32)
                .collect();
            if ids.len() != a.len() {
                return Err(ApiError::bad(format!(
                    "`prompt` has token ids outside the vocabulary of {n_vocab}"
                )));
            }
            Ok(Prompt::Tokens(ids))
        }
        _ => Err(bad()),
    }
}

/// Parses a body and checks every field; `chat` picks the endpoint's own fields.
pub fn parse(bytes: &[u8], chat: bool) -> Result<Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(map) = v else {
        return Err(ApiError::bad("the body must be a JSON object"));
    };
    let own = if chat { CHAT_ONLY } else { COMPLETION_ONLY };
    if let Some(k) = map
        .keys()
        .find(|k| !COMMON.contains(&k.as_str()) && !own.contains(&k.as_str()))
    {
        return Err(ApiError::bad(format!("unknown field `{k}`")));
    }
    Ok(map)
}

fn num(body: &Map<String, Value>, key: &str) -> Result<Option<f64>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| ApiError::bad(format!("`{key}` must be a number"))),
    }
}

fn in_range(key: &str, v: Option<f64>, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
    match v {
        Some(x) if !(lo..=hi).contains(&x) || x.is_nan() => Err(ApiError::bad(format!(
            "`{key}` must be between {lo} and {hi}"
        ))),
        other => Ok(other),
    }
}

/// The sampler and limits a request asks for; `max_tokens_limit` is the most it may ask.
pub fn asked(body: &Map<String, Value>, max_tokens_limit: usize) -> Result<Asked, ApiError> {
    let mut s = SamplerConfig::default();
    if let Some(t) = in_range("temperature", num(body, "temperature")?, 0.0, 2.0)? {
        s.temp = t as f32;
    }
    if let Some(p) = in_range("top_p", num(body, "top_p")?, 0.0, 1.0)? {
        s.top_p = p as f32;
    }
    if let Some(p) = in_range("min_p", num(body, "min_p")?, 0.0, 1.0)? {
        s.min_p = p as f32;
    }
    if let Some(k) = in_range("top_k", num(body, "top_k")?, -1.0, 1e6)? {
        s.top_k = k.max(0.0) as u32;
    }
    if let Some(r) = in_range("repeat_penalty", num(body, "repeat_penalty")?, 0.0, 10.0)? {
        s.repeat_penalty = r as f32;
    }
    if let Some(n) = in_range("repeat_last_n", num(body, "repeat_last_n")?, 0.0, 1e6)? {
        s.repeat_last_n = n as u32;
    }
    match body.get("seed") {
        None | Some(Value::Null) => s.seed = RANDOM_SEED,
        Some(v) => {
            s.seed = v
                .as_u64()
                .or_else(|| v.as_i64().map(|i| i as u64))
                .ok_or_else(|| ApiError::bad("`seed` must be an integer"))?
        }
    }
    for key in ["presence_penalty", "frequency_penalty"] {
        if in_range(key, num(body, key)?, -2.0, 2.0)?.is_some_and(|x| x != 0.0) {
            return Err(ApiError::bad(format!(
                "`{key}` is not supported (use repeat_penalty)"
            )));
        }
    }
    if num(body, "n")?.is_some_and(|n| n != 1.0) {
        return Err(ApiError::bad("`n` must be 1"));
    }
    if body
        .get("logprobs")
        .is_some_and(|v| v.as_bool() != Some(false) && !v.is_null())
    {
        return Err(ApiError::bad("`logprobs` is not supported"));
    }
    if body
        .get("tools")
        .is_some_and(|t| t.as_array().is_some_and(|a| !a.is_empty()))
    {
        return Err(ApiError::bad("`tools` are not supported"));
    }
    if body.get("echo").is_some_and(|v| v.as_bool() == Some(true)) {
        return Err(ApiError::bad("`echo` is not supported"));
    }
    s.stop = match body.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(x)) => vec![x.clone()],
        Some(Value::Array(a)) if a.len() <= 16 && a.iter().all(Value::is_string) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => {
            return Err(ApiError::bad(
                "`stop` must be a string or a list of at most 16 strings",
            ));
        }
    };
    let mut max_tokens = None;
    for key in ["max_tokens", "max_completion_tokens", "n_predict"] {
        match num(body, key)? {
            None => {}
            Some(n) if n == -1.0 && key == "n_predict" => {}
            Some(n) if n < 0.0 || n.fract() != 0.0 => {
                return Err(ApiError::bad(format!("`{key}` must be a whole number")));
            }
            Some(n) if n as usize > max_tokens_limit => {
                return Err(ApiError::bad(format!(
                    "`{key}` is {n}; this server generates at most {max_tokens_limit} tokens a request"
                )));
            }
            Some(n) => max_tokens = Some(n as usize),
        }
    }
    s.n_predict = max_tokens.map_or(-1, |n| n as i32);
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        _ => return Err(ApiError::bad("`stream` must be true or false")),
    };
    let include_usage = body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let ignore_eos = match body.get("ignore_eos") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        _ => return Err(ApiError::bad("`ignore_eos` must be true or false")),
    };
    Ok(Asked {
        stream,
        include_usage,
        sampler: s,
        max_tokens,
        ignore_eos,
    })
}

/// OpenAI's `finish_reason`.
pub fn finish_reason(r: &StopReason) -> &'static str {
    match r {
        StopReason::Limit | StopReason::ContextFull => "length",
        _ => "stop",
    }
}

/// `usage`, with the cached prompt tokens as OpenAI reports them.
pub fn usage(s: &GenStats) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.generated_tokens,
        "total_tokens": s.prompt_tokens + s.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
    })
}

/// llama-server's `timings`.
pub fn timings(s: &GenStats) -> Value {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let n_prompt = s.prompt_tokens.saturating_sub(s.cached_tokens);
    json!({
        "cache_n": s.cached_tokens,
        "prompt_n": n_prompt,
        "prompt_ms": ms(s.prompt_time),
        "prompt_per_second": s.prompt_tps(),
        "predicted_n": s.generated_tokens,
        "predicted_ms": ms(s.gen_time),
        "predicted_per_second": s.gen_tps(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_and_bad_values_are_400_with_the_field() {
        let e = parse(br#"{"messages":[],"frobnicate":1}"#, true).unwrap_err();
        assert_eq!((e.status, e.message.contains("frobnicate")), (400, true));
        assert!(parse(b"{oops", true).unwrap_err().message.contains("JSON"));
        assert!(
            parse(br#"{"prompt":"x"}"#, true).is_err(),
            "prompt is not a chat field"
        );
        let b = parse(br#"{"temperature":3}"#, true).unwrap();
        assert!(asked(&b, 100).unwrap_err().message.contains("temperature"));
        let b = parse(br#"{"max_tokens":1000}"#, true).unwrap();
        assert!(asked(&b, 100).unwrap_err().message.contains("at most 100"));
        let b = parse(br#"{"n":2}"#, true).unwrap();
        assert!(asked(&b, 100).is_err());
    }

    #[test]
    fn sampler_fields_map_onto_the_sampler() {
        let b = parse(
            br#"{"temperature":0,"top_k":5,"seed":7,"stop":["a","b"],"max_tokens":9,"stream":true,"stream_options":{"include_usage":true}}"#,
            true,
        )
        .unwrap();
        let a = asked(&b, 100).unwrap();
        assert_eq!(
            (a.sampler.temp, a.sampler.top_k, a.sampler.seed),
            (0.0, 5, 7)
        );
        assert_eq!(
            (a.sampler.n_predict, a.stream, a.include_usage),
            (9, true, true)
        );
        assert_eq!(a.sampler.stop, vec!["a".to_string(), "b".to_string()]);
    }

    #[test]
    fn messages_take_text_parts_and_refuse_others() {
        let b = parse(
            br#"{"messages":[{"role":"developer","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}]}"#,
            true,
        )
        .unwrap();
        let m = chat_messages(&b).unwrap();
        assert_eq!(
            (m[0].role.as_str(), m[1].content.as_str()),
            ("system", "hi there")
        );
        let b = parse(
            br#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}"#,
            true,
        )
        .unwrap();
        assert!(chat_messages(&b).is_err());
        let b = parse(br#"{"messages":[{"role":"tool","content":"x"}]}"#, true).unwrap();
        assert!(chat_messages(&b).is_err());
    }
}
