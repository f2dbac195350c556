//! One request's answer: the engine's events read until `Done` or `Failed`, as SSE chunks
//! (`stream: true`) or one JSON object; the request's deadline; a hang the watchdog called in the
//! step that ran this request ends it with an error naming the op; and one log line when it ends,
//! however it ends (a client that left mid-stream included: its stream is dropped, the engine
//! sees the channel closed and frees the slot).

use crate::app::stderr::errln;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::api::{self, ApiError, error};
use super::{AppState, HangNote};
use crate::model::protocol::{GenStats, StopReason};
use crate::model::scheduler::GenEvent;

/// Which endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Chat => "chat",
            Kind::Completion => "completion",
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            Kind::Chat => "/v1/chat/completions",
            Kind::Completion => "/v1/completions",
        }
    }
}

/// How a request ended, for its log line.
#[derive(Clone, Debug, Default)]
struct Outcome {
    slot: Option<usize>,
    status: String,
    stats: Option<GenStats>,
    queue_wait: Option<Duration>,
}

/// Writes the request's log line when dropped (the end of a stream, or its client leaving).
struct LogLine {
    st: Arc<AppState>,
    id: u64,
    client: String,
    kind: Kind,
    n_prompt: usize,
    t0: Instant,
    out: Outcome,
}

impl Drop for LogLine {
    fn drop(&mut self) {
        let o = &self.out;
        let status = if o.status.is_empty() {
            "client left"
        } else {
            o.status.as_str()
        };
        let slot = o.slot.map_or("-".into(), |s| s.to_string());
        let timing = match &o.stats {
            Some(s) => format!(
                "prompt {} (cached {}), generated {}, ttft {:.0} ms, {:.1} t/s, queue {:.0} ms",
                s.prompt_tokens,
                s.cached_tokens,
                s.generated_tokens,
                s.time_to_first_token.as_secs_f64() * 1e3,
                s.gen_tps(),
                o.queue_wait.unwrap_or_default().as_secs_f64() * 1e3
            ),
            None => format!("prompt {}", self.n_prompt),
        };
        let line = format!(
            "req {} {} {} slot {slot} -> {status}: {timing}, {:.2} s",
            self.id,
            self.client,
            self.kind.path(),
            self.t0.elapsed().as_secs_f64()
        );
        if self.st.cfg.log_lines {
            errln!("{line}");
        }
        tracing::info!("serve: {line}");
    }
}

/// A request's events and what it has said so far.
pub struct Answer {
    st: Arc<AppState>,
    rx: mpsc::UnboundedReceiver<GenEvent>,
    hang: tokio::sync::watch::Receiver<Option<HangNote>>,
    hang_closed: bool,
    deadline: Instant,
    id: u64,
    kind: Kind,
    created: u64,
    log: LogLine,
}

/// The next thing that happened to a request.
enum Next {
    Event(GenEvent),
    /// The engine dropped the request without a word (it stopped).
    Gone,
    TimedOut,
    Hung(HangNote),
}

impl Answer {
    pub fn new(
        st: Arc<AppState>,
        id: u64,
        client: String,
        kind: Kind,
        n_prompt: usize,
        rx: mpsc::UnboundedReceiver<GenEvent>,
        t0: Instant,
    ) -> Answer {
        let mut hang = st.hang.clone();
        hang.mark_unchanged();
        Answer {
            deadline: t0 + st.cfg.request_timeout,
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            log: LogLine {
                st: st.clone(),
                id,
                client,
                kind,
                n_prompt,
                t0,
                out: Outcome::default(),
            },
            st,
            rx,
            hang,
            hang_closed: false,
            id,
            kind,
        }
    }

    async fn next(&mut self) -> Next {
        loop {
            let until = tokio::time::Instant::from_std(self.deadline);
            tokio::select! {
                ev = self.rx.recv() => return ev.map_or(Next::Gone, Next::Event),
                _ = tokio::time::sleep_until(until) => return Next::TimedOut,
                r = self.hang.changed(), if !self.hang_closed => {
                    if r.is_err() {
                        // No watchdog any more: nothing more to wait for from it.
                        self.hang_closed = true;
                        continue;
                    }
                    let note = self.hang.borrow_and_update().clone();
                    if let Some(n) = note.filter(|n| n.requests.contains(&self.id)) {
                        return Next::Hung(n);
                    }
                }
            }
        }
    }

    fn id_str(&self) -> String {
        match self.kind {
            Kind::Chat => format!("chatcmpl-{}", self.id),
            Kind::Completion => format!("cmpl-{}", self.id),
        }
    }

    /// A chunk (streaming) or object (whole) around `choice`.
    fn object(&self, chunk: bool, choice: Value) -> Value {
        let object = match (self.kind, chunk) {
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Completion, _) => "text_completion",
        };
        json!({
            "id": self.id_str(),
            "object": object,
            "created": self.created,
            "model": self.st.cfg.model_name,
            "system_fingerprint": format!("hipscope-{}", env!("CARGO_PKG_VERSION")),
            "choices": [choice],
        })
    }

    fn delta(&self, content: Option<&str>, reasoning: Option<&str>, finish: Option<&str>) -> Value {
        match self.kind {
            Kind::Chat => {
                let mut d = serde_json::Map::new();
                if let Some(c) = content {
                    d.insert("content".into(), json!(c));
                }
                if let Some(r) = reasoning {
                    d.insert("reasoning_content".into(), json!(r));
                }
                json!({"index": 0, "delta": d, "finish_reason": finish})
            }
            Kind::Completion => json!({
                "index": 0,
                "text": content.unwrap_or(""),
                "logprobs": null,
                "finish_reason": finish,
            }),
        }
    }

    fn hang_message(n: &HangNote, id: u64) -> String {
        format!(
            "request {id}: the device op `{}` did not finish (the watchdog called it HUNG){}",
            n.op,
            n.report
                .as_ref()
                .map(|r| format!("; report: {r}"))
                .unwrap_or_default()
        )
    }

    /// The answer as one JSON object, once it is complete.
    pub async fn whole(mut self) -> Response {
        let mut text = String::new();
        let mut reasoning = String::new();
        loop {
            match self.next().await {
                Next::Event(GenEvent::Started { slot, .. }) => self.log.out.slot = Some(slot),
                Next::Event(GenEvent::Text(t)) => text.push_str(&t),
                Next::Event(GenEvent::Reasoning(t)) => reasoning.push_str(&t),
                Next::Event(GenEvent::Done {
                    reason,
                    stats,
                    queue_wait,
                }) => {
                    let finish = api::finish_reason(&reason);
                    let choice = match self.kind {
                        Kind::Chat => {
                            let mut m = json!({"role": "assistant", "content": text});
                            if !reasoning.is_empty() {
                                m["reasoning_content"] = json!(reasoning);
                            }
                            json!({"index": 0, "message": m, "finish_reason": finish})
                        }
                        Kind::Completion => self.delta(Some(&text), None, Some(finish)),
                    };
                    let mut o = self.object(false, choice);
                    o["usage"] = api::usage(&stats);
                    o["timings"] = api::timings(&stats);
                    self.log.out.status = format!("200 {finish}");
                    self.log.out.stats = Some(stats);
                    self.log.out.queue_wait = Some(queue_wait);
                    return Json(o).into_response();
                }
                Next::Event(GenEvent::Failed(why)) => {
                    self.log.out.status = format!("500 {why}");
                    return error(ApiError {
                        status: 500,
                        message: why,
                    });
                }
                Next::Gone => {
                    self.log.out.status = "503 engine stopped".into();
                    return error(ApiError {
                        status: 503,
                        message: "the server stopped before the answer was complete".into(),
                    });
                }
                Next::TimedOut => {
                    self.log.out.status = "503 timed out".into();
                    return error(ApiError {
                        status: 503,
                        message: format!(
                            "the answer took longer than the server's limit of {} s",
                            self.st.cfg.request_timeout.as_secs()
                        ),
                    });
                }
                Next::Hung(n) => {
                    let m = Answer::hang_message(&n, self.id);
                    self.log.out.status = format!("500 {m}");
                    return error(ApiError {
                        status: 500,
                        message: m,
                    });
                }
            }
        }
    }

    /// The answer as server-sent events: a first chunk with the role, text and reasoning deltas,
    /// a last chunk with `finish_reason` (and llama-server's `timings`), the usage chunk when
    /// asked, then `[DONE]`. An error after the stream began is an `error` event.
    pub fn stream(self, include_usage: bool) -> Response {
        let mut first = VecDeque::new();
        if self.kind == Kind::Chat {
            let c = json!({"index": 0, "delta": {"role": "assistant", "content": null}, "finish_reason": null});
            first.push_back(data(&self.object(true, c)));
        }
        let s = StreamState {
            a: self,
            queue: first,
            ended: false,
            include_usage,
        };
        let events = stream::unfold(s, |mut s| async move {
            loop {
                if let Some(e) = s.queue.pop_front() {
                    return Some((Ok::<Event, Infallible>(e), s));
                }
                if s.ended {
                    return None;
                }
                s.advance().await;
            }
        });
        Sse::new(events)
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
            .into_response()
    }
}

fn data(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

struct StreamState {
    a: Answer,
    queue: VecDeque<Event>,
    ended: bool,
    include_usage: bool,
}

impl StreamState {
    /// Waits for the next event and queues what it becomes.
    async fn advance(&mut self) {
        let a = &mut self.a;
        let fail = |q: &mut VecDeque<Event>, status: u16, m: String| {
            q.push_back(data(&ApiError { status, message: m }.body()));
            q.push_back(Event::default().data("[DONE]"));
        };
        match a.next().await {
            Next::Event(GenEvent::Started { slot, .. }) => a.log.out.slot = Some(slot),
            Next::Event(GenEvent::Text(t)) => {
                let c = a.delta(Some(&t), None, None);
                self.queue.push_back(data(&a.object(true, c)));
            }
            Next::Event(GenEvent::Reasoning(t)) => {
                let c = a.delta(None, Some(&t), None);
                self.queue.push_back(data(&a.object(true, c)));
            }
            Next::Event(GenEvent::Done {
                reason,
                stats,
                queue_wait,
            }) => {
                let finish = api::finish_reason(&reason);
                let c = a.delta(None, None, Some(finish));
                let mut last = a.object(true, c);
                last["timings"] = api::timings(&stats);
                self.queue.push_back(data(&last));
                if self.include_usage {
                    let mut u = a.object(true, Value::Null);
                    u["choices"] = json!([]);
                    u["usage"] = api::usage(&stats);
                    self.queue.push_back(data(&u));
                }
                self.queue.push_back(Event::default().data("[DONE]"));
                a.log.out.status = format!("200 {finish}");
                if matches!(reason, StopReason::User) {
                    a.log.out.status = "200 stopped".into();
                }
                a.log.out.stats = Some(stats);
                a.log.out.queue_wait = Some(queue_wait);
                self.ended = true;
            }
            Next::Event(GenEvent::Failed(why)) => {
                a.log.out.status = format!("500 {why}");
                fail(&mut self.queue, 500, why);
                self.ended = true;
            }
            Next::Gone => {
                a.log.out.status = "503 engine stopped".into();
                fail(&mut self.queue, 503, "the server stopped mid-answer".into());
                self.ended = true;
            }
            Next::TimedOut => {
                // The limit ends the answer as a length stop would (the client keeps its text).
                let c = a.delta(None, None, Some("length"));
                self.queue.push_back(data(&a.object(true, c)));
                self.queue.push_back(Event::default().data("[DONE]"));
                a.log.out.status = "200 length (server time limit)".into();
                self.ended = true;
            }
            Next::Hung(n) => {
                let m = Answer::hang_message(&n, a.id);
                a.log.out.status = format!("500 {m}");
                fail(&mut self.queue, 500, m);
                self.ended = true;
            }
        }
    }
}
