//! A conversation with a remote engine: the same calls as the local [`Session`] (chat, stop,
//! regenerate, clear, system prompt, sampler, restore), answered by streaming
//! `POST /v1/chat/completions` on a reader thread of its own.
//!
//! The worker thread never blocks on the network: it waits on the reader's channel in short
//! steps, asking its caller between them whether to stop ([`Progress::Waiting`]) and publishing
//! the request's watchdog state. Stopping drops the reader, which closes the connection, so the
//! server stops generating; a reader stuck in a read that never returns is left behind (it
//! holds nothing the app waits for).
//!
//! [`Session`]: crate::model::session::Session

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::client::{Client, RemoteError};
use super::openai::{self, ServerKind};
use super::sse::SseParser;
use crate::gpu::snapshot::{REMOTE_STREAM, WatchdogSnapshot};
use crate::gpu::watchdog;
use crate::model::protocol::{GenStats, SamplerConfig, StopReason};
use crate::model::session::{Answer, Control, Progress};

/// Where this chat's request is, shared with the panel poller (which adds the server's queue).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OwnRequest {
    /// `connecting`, `waiting for the first token`, `mid-answer`, or a Retry-After wait.
    pub phase: String,
    pub started: Option<Instant>,
    /// When the last byte of the answer arrived.
    pub last: Option<Instant>,
    pub tokens: usize,
    /// Requests the server says are waiting (from its metrics), for the watchdog's "where".
    pub server_waiting: Option<u64>,
    /// Client-side time to first token and the latest inter-token gap, for the panels.
    pub ttft: Option<Duration>,
    pub itl: Option<Duration>,
}

pub type Shared = Arc<Mutex<OwnRequest>>;

/// The steps the worker waits in.
const STEP: Duration = Duration::from_millis(50);
/// How often the watchdog state is published during a request.
const WATCH_EVERY: Duration = Duration::from_millis(250);
/// The longest Retry-After honoured by waiting; longer ones are reported.
const MAX_RETRY_AFTER: u64 = 60;

enum Piece {
    Connected,
    Data(String),
    /// The stream ended: `None` cleanly, `Some(why)` not.
    End(Option<String>),
    Failed(RemoteError),
}

pub struct RemoteSession {
    pub client: Client,
    pub kind: ServerKind,
    pub model: String,
    system: Option<String>,
    sampler: SamplerConfig,
    turns: Vec<(String, String)>,
    pub own: Shared,
    /// Where watchdog snapshots go (the worker's event channel).
    watch: Box<dyn Fn(WatchdogSnapshot) + Send>,
}

impl RemoteSession {
    pub fn new(
        client: Client,
        kind: ServerKind,
        model: String,
        sampler: SamplerConfig,
        watch: Box<dyn Fn(WatchdogSnapshot) + Send>,
    ) -> RemoteSession {
        RemoteSession {
            client,
            kind,
            model,
            system: None,
            sampler,
            turns: Vec::new(),
            own: Arc::default(),
            watch,
        }
    }

    pub fn set_system(&mut self, s: &str) {
        self.system = (!s.trim().is_empty()).then(|| s.to_string());
    }
    pub fn set_sampler(&mut self, s: SamplerConfig) {
        self.sampler = s;
    }
    pub fn clear(&mut self) {
        self.turns.clear();
    }
    pub fn restore(&mut self, turns: &[(String, String)]) {
        self.turns = turns.to_vec();
    }
    /// Drops the last answer; its question comes back (to be asked again).
    pub fn pop_answer(&mut self) -> Option<String> {
        self.turns.pop().map(|(q, _)| q)
    }
    pub fn turns(&self) -> &[(String, String)] {
        &self.turns
    }

    fn messages<'a>(&'a self, user: &'a str) -> Vec<(&'a str, &'a str)> {
        let mut m = Vec::new();
        if let Some(s) = &self.system {
            m.push(("system", s.as_str()));
        }
        for (q, a) in &self.turns {
            m.push(("user", q.as_str()));
            m.push(("assistant", a.as_str()));
        }
        m.push(("user", user));
        m
    }

    fn set_phase(&self, phase: &str) {
        if let Ok(mut o) = self.own.lock() {
            o.phase = phase.to_string();
        }
    }

    /// Asks for the answer to `user` and streams it through `on`; the exchange joins the
    /// history unless the request failed before any text came.
    pub fn chat(
        &mut self,
        user: &str,
        on: &mut dyn FnMut(Progress) -> Control,
    ) -> Result<Answer, String> {
        let body = openai::chat_body(self.kind, &self.model, &self.messages(user), &self.sampler);
        let t0 = Instant::now();
        if let Ok(mut o) = self.own.lock() {
            *o = OwnRequest {
                phase: "connecting".into(),
                started: Some(t0),
                server_waiting: o.server_waiting,
                ..OwnRequest::default()
            };
        }
        let mut retried = false;
        let result = loop {
            match self.stream(&body, t0, on) {
                Err(RemoteError::Status {
                    status: s @ (429 | 503),
                    retry_after: Some(secs),
                    ..
                }) if !retried && secs <= MAX_RETRY_AFTER => {
                    // Honour Retry-After once, stoppable meanwhile.
                    retried = true;
                    let until = Instant::now() + Duration::from_secs(secs);
                    let mut stopped = false;
                    while Instant::now() < until {
                        let left = until.saturating_duration_since(Instant::now()).as_secs() + 1;
                        self.set_phase(&format!(
                            "server busy (HTTP {s}): retrying in {left} s as Retry-After asks"
                        ));
                        self.publish(t0, None, false);
                        if on(Progress::Waiting) == Control::Stop {
                            stopped = true;
                            break;
                        }
                        std::thread::sleep(STEP);
                    }
                    if stopped {
                        break Err(format!(
                            "the server was busy (HTTP {s}); stopped while waiting to retry"
                        ));
                    }
                    self.set_phase("connecting");
                }
                Err(RemoteError::Status {
                    status: 404, body, ..
                }) => break Err(self.not_found(&body)),
                Err(RemoteError::Status {
                    status: s @ (429 | 503),
                    retry_after,
                    body,
                    what,
                }) => {
                    let when = match retry_after {
                        Some(n) => format!("; it asks to retry after {n} s (Alt-R)"),
                        None => "; retry later (Alt-R)".into(),
                    };
                    break Err(format!("{what} answered HTTP {s} (busy): {body}{when}"));
                }
                Err(e) => break Err(e.to_string()),
                Ok(a) => break Ok(a),
            }
        };
        if let Ok(mut o) = self.own.lock() {
            o.phase.clear();
            o.started = None;
        }
        (self.watch)(WatchdogSnapshot {
            stream: format!("{REMOTE_STREAM}{}", self.client.spec.host()),
            ..WatchdogSnapshot::default()
        });
        let answer = result?;
        self.turns.push((user.to_string(), answer.text.clone()));
        Ok(answer)
    }

    /// A 404: the model is not served; the message lists the ones that are.
    fn not_found(&self, body: &str) -> String {
        let listed = self
            .client
            .get_ok("/v1/models")
            .ok()
            .and_then(|b| openai::parse_models(&b).ok())
            .map(|m| m.into_iter().map(|m| m.id).collect::<Vec<_>>().join(", "))
            .unwrap_or_else(|| "(the list could not be read)".into());
        format!(
            "{}: model `{}` not found ({}); the server has: {listed}",
            self.client.spec.host(),
            self.model,
            super::client::short_body(body)
        )
    }

    /// Publishes the watchdog's view of the request.
    fn publish(&self, t0: Instant, first: Option<Instant>, _done: bool) {
        let o = self.own.lock().map(|o| o.clone()).unwrap_or_default();
        let b = self.client.spec.budgets;
        let now = Instant::now();
        let (since, budget) = match (first, o.last) {
            (Some(_), Some(l)) => (l, b.between_tokens),
            _ => (t0, b.first_token),
        };
        let age = now.saturating_duration_since(since);
        let state = watchdog::verdict(age, &watchdog::halving(budget));
        // Until the response's headers arrive, connecting and the server's work look the
        // same from here (llama-server answers only with its first token); its metrics say
        // whether the request waits in its queue.
        let where_ = match (first, o.server_waiting) {
            (None, Some(n)) if n > 0 => format!("waiting in the server's queue ({n} waiting)"),
            (None, _) if o.phase == "connecting" => {
                "no answer yet: connecting, or prompt processing on the server".to_string()
            }
            (None, _) if o.phase == "waiting for the first token" => {
                "prompt processing (connected, no token yet)".to_string()
            }
            _ => o.phase.clone(),
        };
        (self.watch)(WatchdogSnapshot {
            state,
            stream: format!("{REMOTE_STREAM}{}", self.client.spec.host()),
            op: Some(where_),
            age,
            budget,
            last_completed: (o.tokens > 0).then(|| format!("{} tokens received", o.tokens)),
            queue_depth: 1,
            // Started: the server has begun answering (its headers or a token came).
            op_started: first.is_some() || o.phase == "waiting for the first token",
            ..WatchdogSnapshot::default()
        });
    }

    fn stream(
        &mut self,
        body: &serde_json::Value,
        t0: Instant,
        on: &mut dyn FnMut(Progress) -> Control,
    ) -> Result<Answer, RemoteError> {
        let (tx, rx) = mpsc::channel::<Piece>();
        let cancel = Arc::new(AtomicBool::new(false));
        let client = self.client.clone();
        let body = body.clone();
        let stop = cancel.clone();
        let agent = client.stream_agent();
        let reader_agent = agent.clone();
        std::thread::Builder::new()
            .name("hipscope-remote-stream".into())
            .spawn(move || reader(client, reader_agent, body, tx, stop))
            .map_err(|e| RemoteError::Other(format!("cannot start the reader thread: {e}")))?;
        // Closes the connection at once whichever way this ends, even with the reader blocked
        // in a read (so that the server stops generating now, not at its next token).
        struct Cancel(Arc<AtomicBool>, Option<ureq::Agent>);
        impl Drop for Cancel {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
                if let Some(a) = self.1.take() {
                    a.shutdown();
                }
            }
        }
        let _cancel = Cancel(cancel, Some(agent));

        let mut acc = Acc::default();
        let mut reason: Option<StopReason> = None;
        let mut last_watch = Instant::now() - WATCH_EVERY;
        loop {
            if last_watch.elapsed() >= WATCH_EVERY {
                self.publish(t0, acc.first, false);
                last_watch = Instant::now();
            }
            let piece = match rx.recv_timeout(STEP) {
                Ok(p) => p,
                Err(RecvTimeoutError::Timeout) => {
                    if on(Progress::Waiting) == Control::Stop {
                        return Ok(acc.finish(StopReason::User));
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    Piece::End(Some("the reader thread ended without a word".into()))
                }
            };
            match piece {
                Piece::Connected => self.set_phase("waiting for the first token"),
                Piece::Failed(e) => {
                    if acc.text.is_empty() {
                        return Err(e);
                    }
                    let r = StopReason::Dropped(e.to_string());
                    return Ok(acc.finish(r));
                }
                Piece::End(None) => {
                    let r = reason.take().unwrap_or_else(|| {
                        StopReason::Dropped(
                            "the server closed the stream without finishing the answer".into(),
                        )
                    });
                    if acc.text.is_empty() && matches!(r, StopReason::Dropped(_)) {
                        return Err(RemoteError::Protocol(format!(
                            "{} closed the stream before any answer",
                            self.client.spec.host()
                        )));
                    }
                    return Ok(acc.finish(r));
                }
                Piece::End(Some(why)) => {
                    if acc.text.is_empty() && reason.is_none() {
                        return Err(RemoteError::Protocol(why));
                    }
                    let r = match reason.take() {
                        // The answer was complete; what broke came after it.
                        Some(r) => r,
                        None => StopReason::Dropped(why),
                    };
                    return Ok(acc.finish(r));
                }
                Piece::Data(data) => {
                    let chunk = match openai::parse_chunk(&data) {
                        Ok(c) => c,
                        Err(e) if acc.text.is_empty() => return Err(RemoteError::Protocol(e)),
                        Err(e) => {
                            let r = StopReason::Dropped(e);
                            return Ok(acc.finish(r));
                        }
                    };
                    if chunk.done {
                        let r = reason.take().unwrap_or(StopReason::Eog);
                        return Ok(acc.finish(r));
                    }
                    if let Some(p) = chunk.prompt_tokens {
                        acc.stats.prompt_tokens = p as usize;
                    }
                    if let Some(c) = chunk.cached {
                        acc.stats.cached_tokens = c as usize;
                    }
                    if let Some(ms) = chunk.prompt_ms {
                        acc.stats.prompt_time = Duration::from_secs_f64(ms.max(0.0) / 1e3);
                    }
                    if chunk.completion_tokens.is_some() {
                        acc.usage = chunk.completion_tokens;
                    }
                    if chunk.finish.is_some() {
                        reason = chunk.finish;
                    }
                    if !chunk.text.is_empty() || !chunk.reasoning.is_empty() {
                        let now = Instant::now();
                        if acc.first.is_none() {
                            acc.first = Some(now);
                            acc.stats.time_to_first_token = now - t0;
                            if acc.stats.prompt_time.is_zero() {
                                acc.stats.prompt_time = now - t0;
                            }
                            if let Ok(mut o) = self.own.lock() {
                                o.phase = "mid-answer".into();
                                o.ttft = Some(now - t0);
                            }
                            on(Progress::PromptDone(&acc.stats));
                        }
                        if let Ok(mut o) = self.own.lock() {
                            if let Some(l) = acc.last {
                                o.itl = Some(now - l);
                            }
                            o.last = Some(now);
                            o.tokens += 1;
                        }
                        acc.last = Some(now);
                        acc.pieces += 1;
                        let mut control = Control::Continue;
                        if !chunk.reasoning.is_empty() {
                            acc.reasoning.push_str(&chunk.reasoning);
                            acc.stats.reasoning_tokens += 1;
                            acc.stats.reasoning_time =
                                now.saturating_duration_since(acc.first.unwrap_or(now));
                            control = on(Progress::Reasoning(&chunk.reasoning));
                        }
                        if !chunk.text.is_empty() {
                            acc.text.push_str(&chunk.text);
                            control = on(Progress::Text(&chunk.text));
                        }
                        if control == Control::Stop {
                            return Ok(acc.finish(StopReason::User));
                        }
                    }
                }
            }
        }
    }
}

/// What has come of an answer so far.
#[derive(Default)]
struct Acc {
    text: String,
    reasoning: String,
    stats: GenStats,
    first: Option<Instant>,
    last: Option<Instant>,
    /// Pieces of text received (a token each on these servers), if the server sends no usage.
    pieces: usize,
    usage: Option<u64>,
}

impl Acc {
    fn finish(&mut self, reason: StopReason) -> Answer {
        self.stats.generated_tokens = self.usage.map(|u| u as usize).unwrap_or(self.pieces);
        if let (Some(f), Some(l)) = (self.first, self.last) {
            self.stats.gen_time = l.saturating_duration_since(f);
        }
        Answer {
            text: std::mem::take(&mut self.text),
            reasoning: std::mem::take(&mut self.reasoning),
            tokens: Vec::new(),
            stats: self.stats.clone(),
            reason,
        }
    }
}

/// The reader thread: sends the connection's events as they come; stops reading (closing the
/// connection) as soon as `cancel` is raised.
fn reader(
    client: Client,
    agent: ureq::Agent,
    body: serde_json::Value,
    tx: mpsc::Sender<Piece>,
    cancel: Arc<AtomicBool>,
) {
    let mut r = match client.post_stream(&agent, "/v1/chat/completions", &body) {
        Ok(r) => r,
        Err(e) => {
            let _ = tx.send(Piece::Failed(e));
            return;
        }
    };
    let _ = tx.send(Piece::Connected);
    let mut parser = SseParser::new();
    let mut buf = vec![0u8; 16 << 10];
    loop {
        if cancel.load(Ordering::SeqCst) {
            return; // dropping `r` closes the connection
        }
        match r.read(&mut buf) {
            Ok(0) => {
                let end = parser.finish().err().map(|e| e.to_string());
                let _ = tx.send(Piece::End(end));
                return;
            }
            Ok(n) => match parser.feed(&buf[..n]) {
                Ok(events) => {
                    for e in events {
                        if tx.send(Piece::Data(e.data)).is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    let _ = tx.send(Piece::End(Some(format!("the server's event stream: {e}"))));
                    return;
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let _ = tx.send(Piece::End(Some(format!(
                    "the connection to {} dropped mid-answer ({e})",
                    client.spec.host()
                ))));
                return;
            }
        }
    }
}
