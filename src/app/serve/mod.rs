//! `hipscope serve`'s HTTP side: an OpenAI-compatible endpoint (axum routes on hyper's HTTP/1
//! connections, on the current-thread tokio runtime) in front of the continuous-batching engine
//! (`model/scheduler.rs`).
//!
//! - `api.rs`: request bodies checked field by field, answers in OpenAI's shapes;
//! - `routes.rs`: the handlers (chat, completions, models, health, metrics, slots, props);
//! - `answer.rs`: one request's events from the engine as an SSE stream or one JSON answer, with
//!   its deadline, its hang note and its log line;
//! - `metrics.rs`: llama-server's `/metrics`, `/slots`, `/props`;
//! - `auth.rs`: the API key and the loopback rule.
//!
//! The accept loop is hyper's own (not `axum::serve`) for the one thing axum's does not set: a
//! time limit on reading a request's headers, so that a client that connects and says nothing
//! holds nothing for long.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;

use crate::gpu::snapshot::WatchdogSnapshot;
use crate::model::reasoning::ReasoningFormat;
use crate::model::scheduler::SchedulerHandle;
use crate::model::template::ChatTemplate;
use crate::model::tokenizer::Tokenizer;

pub mod answer;
pub mod api;
pub mod auth;
pub mod metrics;
pub mod routes;

pub use auth::{ApiKey, is_loopback};

/// The server's limits and identity.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The name `/v1/models` lists and answers carry.
    pub model_name: String,
    pub model_path: String,
    pub key: Option<ApiKey>,
    /// Largest request body (413 beyond).
    pub body_limit: usize,
    /// Time to read a request's headers, then its body (408 for the body).
    pub read_timeout: Duration,
    /// Longest a request may run, queue included; then it ends with `length` (a stream) or 503.
    pub request_timeout: Duration,
    pub n_ctx: usize,
    pub n_slots: usize,
    /// Most tokens a request may ask to generate (400 beyond).
    pub max_tokens: usize,
    /// Log each request's prompt text (off: lengths and timings only).
    pub log_prompts: bool,
    /// Write one line per request on stderr (headless).
    pub log_lines: bool,
}

/// A hang the watchdog called: the op, and the requests of the step that was running.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HangNote {
    pub op: String,
    pub requests: Vec<u64>,
    pub report: Option<String>,
}

/// What every handler shares.
pub struct AppState {
    pub cfg: ServerConfig,
    pub sched: SchedulerHandle,
    pub tok: Arc<Tokenizer>,
    pub template: Arc<ChatTemplate>,
    pub reasoning: ReasoningFormat,
    pub next_id: AtomicU64,
    pub hang: watch::Receiver<Option<HangNote>>,
    pub watchdog: watch::Receiver<Option<WatchdogSnapshot>>,
    pub created: u64,
}

/// The client's address, put on each request by the accept loop.
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub SocketAddr);

/// Accepts connections until `stop` fires, then waits for the connections' requests to end (at
/// most `grace`), each connection served by hyper with the header time limit.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
) {
    let router = routes::router(state.clone());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.wait_for(|s| *s) => break,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // Out of descriptors, say: wait a little rather than spin.
                tracing::warn!("serve: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Tokens go out as small writes: without this, Nagle's algorithm holds each one until
        // the client's delayed ACK (tens of ms a token).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!("serve: TCP_NODELAY for {peer}: {e}");
        }
        let svc = router.clone().layer(axum::Extension(Peer(peer)));
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(state.cfg.read_timeout)
            .keep_alive(true);
        let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("serve: connection from {peer}: {e}");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("serve: connections still open after {grace:?}; leaving them");
    }
}
