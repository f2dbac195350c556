//! The endpoints. Every answer that is not a success is OpenAI's error object with the status
//! that says what went wrong: 400 (the request), 401 (the key), 404, 405, 408 (a body that did
//! not arrive in time), 413 (too large), 503 with `Retry-After` (every slot busy and the queue
//! full, or the server draining).

use crate::app::stderr::errln;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::answer::{Answer, Kind};
use super::api::{self, ApiError, error};
use super::metrics;
use super::{AppState, Peer};
use crate::model::reasoning::ReasoningFormat;
use crate::model::scheduler::{GenRequest, Submit};

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(prometheus))
        .route("/slots", get(slots))
        .route("/props", get(props))
        .fallback(not_found)
        .method_not_allowed_fallback(not_allowed)
        .with_state(state)
}

async fn not_found() -> Response {
    error(ApiError {
        status: 404,
        message: "no such endpoint".into(),
    })
}

async fn not_allowed() -> Response {
    error(ApiError {
        status: 405,
        message: "method not allowed".into(),
    })
}

/// 401 unless the request carries the key (when there is one). `/health` needs none.
fn check_key(st: &AppState, req: &Request) -> Result<(), Box<Response>> {
    match &st.cfg.key {
        None => Ok(()),
        Some(k) => {
            let h = req
                .headers()
                .get(header::AUTHORIZATION)
                .map(HeaderValue::as_bytes);
            if k.admits(h) {
                Ok(())
            } else {
                Err(Box::new(error(ApiError {
                    status: 401,
                    message: "invalid or missing API key (Authorization: Bearer KEY)".into(),
                })))
            }
        }
    }
}

/// The body, within the size and time limits.
async fn read_body(st: &AppState, body: Body) -> Result<axum::body::Bytes, ApiError> {
    let read = axum::body::to_bytes(body, st.cfg.body_limit);
    match tokio::time::timeout(st.cfg.read_timeout, read).await {
        Err(_) => Err(ApiError {
            status: 408,
            message: format!(
                "the request body did not arrive within {} s",
                st.cfg.read_timeout.as_secs()
            ),
        }),
        Ok(Err(e)) => {
            // axum's limit error says "length limit exceeded" somewhere in its chain.
            let too_big = std::error::Error::source(&e)
                .is_some_and(|s| s.to_string().contains("length limit"))
                || e.to_string().contains("length limit");
            Err(if too_big {
                ApiError {
                    status: 413,
                    message: format!(
                        "the request body is larger than {} bytes",
                        st.cfg.body_limit
                    ),
                }
            } else {
                ApiError::bad(format!("the request body could not be read: {e}"))
            })
        }
        Ok(Ok(b)) => Ok(b),
    }
}

async fn chat(
    State(st): State<Arc<AppState>>,
    Extension(peer): Extension<Peer>,
    req: Request,
) -> Response {
    generate(st, peer, req, Kind::Chat).await
}

async fn completions(
    State(st): State<Arc<AppState>>,
    Extension(peer): Extension<Peer>,
    req: Request,
) -> Response {
    generate(st, peer, req, Kind::Completion).await
}

async fn generate(st: Arc<AppState>, peer: Peer, req: Request, kind: Kind) -> Response {
    let t0 = Instant::now();
    let id = st.next_id.fetch_add(1, Ordering::Relaxed) + 1;
    let client = peer.0.to_string();
    let log_refusal = |st: &AppState, status: u16, why: &str| {
        if st.cfg.log_lines {
            errln!("req {id} {client} {} -> {status} ({why})", kind.path());
        }
        tracing::info!("serve: request {id} from {client}: {status} ({why})");
    };
    if let Err(r) = check_key(&st, &req) {
        log_refusal(&st, 401, "no valid key");
        return *r;
    }
    // A declared length past the limit is refused before a byte of the body is read (a client
    // that sent `Expect: 100-continue` then sends nothing).
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let prepared = async {
        if declared.is_some_and(|n| n > st.cfg.body_limit as u64) {
            return Err(ApiError {
                status: 413,
                message: format!(
                    "the request body is larger than {} bytes",
                    st.cfg.body_limit
                ),
            });
        }
        let body = read_body(&st, req.into_body()).await?;
        let map = api::parse(&body, kind == Kind::Chat)?;
        let asked = api::asked(&map, st.cfg.max_tokens)?;
        let (prompt, reasoning, text) = match kind {
            Kind::Chat => {
                let messages = api::chat_messages(&map)?;
                let text = st
                    .template
                    .render(&messages, true)
                    .map_err(|e| ApiError::bad(format!("the chat template failed: {e}")))?;
                (st.tok.encode(&text, true, true), st.reasoning.clone(), text)
            }
            Kind::Completion => match api::completion_prompt(&map, st.tok.n_vocab())? {
                api::Prompt::Text(t) => (st.tok.encode(&t, true, true), ReasoningFormat::None, t),
                api::Prompt::Tokens(ids) => (ids, ReasoningFormat::None, String::new()),
            },
        };
        if prompt.is_empty() {
            return Err(ApiError::bad("the prompt is empty"));
        }
        if prompt.len() >= st.cfg.n_ctx {
            return Err(ApiError::bad(format!(
                "the prompt is {} tokens; a slot holds {} (the answer needs room too)",
                prompt.len(),
                st.cfg.n_ctx
            )));
        }
        Ok((asked, prompt, reasoning, text))
    };
    let (asked, prompt, reasoning, text) = match prepared.await {
        Ok(x) => x,
        Err(e) => {
            log_refusal(&st, e.status, &e.message);
            return error(e);
        }
    };
    if st.cfg.log_prompts {
        tracing::info!("serve: request {id} prompt: {text:?}");
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let n_prompt = prompt.len();
    let g = GenRequest {
        id,
        client: client.clone(),
        kind: kind.name(),
        prompt,
        sampler: asked.sampler,
        ignore_eos: asked.ignore_eos,
        reasoning,
        events: tx,
        queued_at: t0,
    };
    match st.sched.submit(g) {
        Ok(()) => {}
        Err(Submit::Busy) => {
            log_refusal(&st, 503, "every slot busy and the queue full");
            return error(ApiError {
                status: 503,
                message: "the server is busy: every slot is taken and the queue is full; retry"
                    .into(),
            });
        }
        Err(Submit::Closed) => {
            log_refusal(&st, 503, "shutting down");
            return error(ApiError {
                status: 503,
                message: "the server is shutting down".into(),
            });
        }
    }
    let answer = Answer::new(st.clone(), id, client, kind, n_prompt, rx, t0);
    if asked.stream {
        answer.stream(asked.include_usage)
    } else {
        answer.whole().await
    }
}

async fn models(State(st): State<Arc<AppState>>, req: Request) -> Response {
    if let Err(r) = check_key(&st, &req) {
        return *r;
    }
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.cfg.model_name,
            "object": "model",
            "created": st.created,
            "owned_by": "hipscope",
            "meta": {"n_ctx_train": st.cfg.n_ctx, "n_slots": st.cfg.n_slots},
        }],
    }))
    .into_response()
}

/// 200 while the engine serves; 503 once it stopped (draining, or a failure it cannot recover
/// from), as llama-server answers while it cannot take requests.
async fn health(State(st): State<Arc<AppState>>) -> Response {
    let snap = st.sched.snapshot().borrow().clone();
    match snap.broken {
        Some(why) => error(ApiError {
            status: 503,
            message: why,
        }),
        None => Json(json!({"status": "ok"})).into_response(),
    }
}

async fn prometheus(State(st): State<Arc<AppState>>, req: Request) -> Response {
    if let Err(r) = check_key(&st, &req) {
        return *r;
    }
    let snap = st.sched.snapshot().borrow().clone();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics::prometheus(&snap),
    )
        .into_response()
}

async fn slots(State(st): State<Arc<AppState>>, req: Request) -> Response {
    if let Err(r) = check_key(&st, &req) {
        return *r;
    }
    let snap = st.sched.snapshot().borrow().clone();
    Json(metrics::slots(&snap)).into_response()
}

async fn props(State(st): State<Arc<AppState>>, req: Request) -> Response {
    if let Err(r) = check_key(&st, &req) {
        return *r;
    }
    let v: Value = metrics::props(
        &st.cfg.model_path,
        &st.cfg.model_name,
        st.cfg.n_slots,
        st.cfg.n_ctx,
    );
    Json(v).into_response()
}
