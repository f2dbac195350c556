//! Continuous batching for `hipscope serve`: `n_slots` slots, each a sequence of the model's KV
//! cache ([`Model::forward_seqs`]), run by one engine thread. Every step is one batch: a token for
//! each slot that is generating, then a chunk of a prompt that is still being read (at most
//! `prefill_chunk` tokens while others generate, so a long prompt never stalls them for long).
//! A request that finishes, or whose client went away (its event channel closed), frees its slot
//! at once. A slot keeps the tokens its cache holds after its request, and a new request goes to
//! the free slot whose tokens share the longest prefix with its prompt (llama-server's
//! `cache_prompt`), which then reads only the rest.
//!
//! The engine publishes a plain-data [`ServeSnapshot`] after every step (a `watch` channel):
//! what the HTTP layer's `/metrics` and `/slots`, the Requests panel and the per-request log read.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::model::forward::{Model, SeqChunk};
use crate::model::protocol::{GenStats, SamplerConfig, StopReason};
use crate::model::reasoning::{Part, ReasoningFormat, ReasoningParser};
use crate::model::sampler::Sampler;
use crate::model::session::stop::StopFilter;
use crate::model::tokenizer::{StreamDecoder, Tokenizer};

mod snapshot;
pub use snapshot::{Counters, QueuedSnapshot, ServeSnapshot, SlotSnapshot, SlotState};

/// How the engine runs.
#[derive(Clone, Copy, Debug)]
pub struct SchedulerConfig {
    /// Slots (sequences of the KV cache): requests generating at once.
    pub n_slots: usize,
    /// Requests waiting for a slot beyond which new ones are refused ([`Submit::Busy`]).
    pub max_queue: usize,
    /// Most prompt tokens a step takes while other slots generate.
    pub prefill_chunk: usize,
}

/// One generation asked of the engine.
pub struct GenRequest {
    pub id: u64,
    /// Who asked (the client's address), for the panel and the log.
    pub client: String,
    /// `chat` or `completion`.
    pub kind: &'static str,
    pub prompt: Vec<u32>,
    /// The sampler, `n_predict` (max_tokens) and `stop` included.
    pub sampler: SamplerConfig,
    /// End-of-generation tokens are never picked (llama.cpp's `ignore_eos`).
    pub ignore_eos: bool,
    /// How the answer carries its reasoning (`None` for raw completions).
    pub reasoning: ReasoningFormat,
    /// Where the answer goes; the engine drops the request when it is closed.
    pub events: mpsc::UnboundedSender<GenEvent>,
    pub queued_at: Instant,
}

/// What the engine tells a request, in order: `Started`, text, then `Done` or `Failed`.
#[derive(Clone, Debug, PartialEq)]
pub enum GenEvent {
    /// A slot took it; `cached` prompt tokens were already in its cache.
    Started {
        slot: usize,
        cached: usize,
    },
    Text(String),
    Reasoning(String),
    Done {
        reason: StopReason,
        stats: GenStats,
        /// Time spent waiting for a slot.
        queue_wait: Duration,
    },
    Failed(String),
}

/// Why a request was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Submit {
    /// Every slot is busy and the queue is full: come back later.
    Busy,
    /// The engine has stopped (drained or failed).
    Closed,
}

enum Msg {
    Request(Box<GenRequest>),
}

/// The HTTP side's handle on the engine thread.
#[derive(Clone)]
pub struct SchedulerHandle {
    tx: SyncSender<Msg>,
    /// Requests submitted and not yet finished (queued or in a slot).
    pending: Arc<AtomicUsize>,
    draining: Arc<AtomicBool>,
    abort: Arc<AtomicBool>,
    limit: usize,
    snapshot: watch::Receiver<ServeSnapshot>,
}

impl SchedulerHandle {
    /// Hands a request to the engine, or says why not (no waiting: the queue is bounded).
    pub fn submit(&self, req: GenRequest) -> Result<(), Submit> {
        if self.draining.load(Ordering::Acquire) {
            return Err(Submit::Closed);
        }
        let n = self.pending.fetch_add(1, Ordering::AcqRel);
        if n >= self.limit {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            return Err(Submit::Busy);
        }
        match self.tx.try_send(Msg::Request(Box::new(req))) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.pending.fetch_sub(1, Ordering::AcqRel);
                Err(match e {
                    TrySendError::Full(_) => Submit::Busy,
                    TrySendError::Disconnected(_) => Submit::Closed,
                })
            }
        }
    }

    /// The engine's latest snapshot, and a receiver to wait for the next.
    pub fn snapshot(&self) -> watch::Receiver<ServeSnapshot> {
        self.snapshot.clone()
    }

    /// Requests queued or running.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Stops taking requests; those queued and running finish.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Ends every request now (the drain's deadline passed): each is told it failed.
    pub fn abort(&self) {
        self.drain();
        self.abort.store(true, Ordering::Release);
    }
}

/// One slot's part of a batch.
struct Planned {
    slot: usize,
    pos0: usize,
    tokens: Vec<u32>,
    logits: bool,
    /// Prompt tokens (else the slot's last generated token).
    prompt: bool,
}

/// A request in a slot.
struct Active {
    req: GenRequest,
    /// Prompt tokens whose keys and values are in the slot's cache.
    done: usize,
    cached: usize,
    sampler: Sampler,
    decoder: StreamDecoder,
    stop: StopFilter,
    split: ReasoningParser,
    generated: Vec<u32>,
    assigned_at: Instant,
    prompt_started: Instant,
    first_token: Option<Instant>,
    prompt_time: Duration,
    reasoning_tokens: usize,
}

struct Slot {
    /// Tokens whose keys and values the slot's cache holds, positions 0..len.
    cached: Vec<u32>,
    active: Option<Active>,
    last_used: u64,
}

/// The engine: the model and its slots, on the thread [`spawn`] starts.
struct Engine {
    model: Model,
    tok: Arc<Tokenizer>,
    cfg: SchedulerConfig,
    slots: Vec<Slot>,
    queue: VecDeque<GenRequest>,
    pending: Arc<AtomicUsize>,
    draining: Arc<AtomicBool>,
    abort: Arc<AtomicBool>,
    snap: watch::Sender<ServeSnapshot>,
    counters: Counters,
    uses: u64,
    logits: Vec<f32>,
    /// Set when a step failed in a way the model cannot recover from.
    broken: Option<String>,
    /// The last arena snapshot and when it was taken.
    arena: Option<(Instant, crate::gpu::snapshot::ArenaSnapshot)>,
}

/// Starts the engine thread on `model` (loaded with at least `cfg.n_slots` sequences). It runs
/// until the drain ends with nothing left, or every handle is dropped; it returns the model so
/// that the caller can shut its device down.
pub fn spawn(
    model: Model,
    tok: Arc<Tokenizer>,
    cfg: SchedulerConfig,
) -> std::io::Result<(SchedulerHandle, std::thread::JoinHandle<Model>)> {
    let n_slots = cfg.n_slots.clamp(1, model.n_seq());
    let cfg = SchedulerConfig {
        n_slots,
        prefill_chunk: cfg.prefill_chunk.max(1),
        ..cfg
    };
    let limit = n_slots + cfg.max_queue;
    let mut model = model;
    // A decode step of all the slots multiplies on the kernels a single sequence's step uses.
    model.set_exact_rows_below(n_slots + 1);
    let (tx, rx) = std::sync::mpsc::sync_channel(limit.max(1));
    let pending = Arc::new(AtomicUsize::new(0));
    let draining = Arc::new(AtomicBool::new(false));
    let abort = Arc::new(AtomicBool::new(false));
    let n_ctx = model.n_ctx();
    let (snap, snap_rx) = watch::channel(ServeSnapshot::idle(n_slots, n_ctx));
    let engine = Engine {
        model,
        tok,
        cfg,
        slots: (0..n_slots)
            .map(|_| Slot {
                cached: Vec::new(),
                active: None,
                last_used: 0,
            })
            .collect(),
        queue: VecDeque::new(),
        pending: pending.clone(),
        draining: draining.clone(),
        abort: abort.clone(),
        snap,
        counters: Counters::default(),
        uses: 0,
        logits: Vec::new(),
        broken: None,
        arena: None,
    };
    let join = std::thread::Builder::new()
        .name("hipscope-serve-engine".into())
        .spawn(move || engine.run(rx))?;
    Ok((
        SchedulerHandle {
            tx,
            pending,
            draining,
            abort,
            limit,
            snapshot: snap_rx,
        },
        join,
    ))
}

impl Engine {
    fn run(mut self, rx: Receiver<Msg>) -> Model {
        loop {
            let idle = self.slots.iter().all(|s| s.active.is_none()) && self.queue.is_empty();
            if idle && self.draining.load(Ordering::Acquire) {
                // Take what was already sent before the drain began, then stop.
                while let Ok(Msg::Request(r)) = rx.try_recv() {
                    self.queue.push_back(*r);
                }
                if self.queue.is_empty() {
                    break;
                }
            }
            // Wait for work when there is none; otherwise take what arrived and step.
            let first = if idle {
                match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else {
                None
            };
            for Msg::Request(r) in first.into_iter().chain(rx.try_iter()) {
                self.queue.push_back(*r);
            }
            if self.abort.load(Ordering::Acquire) {
                self.fail_all("the server is shutting down");
                if self.draining.load(Ordering::Acquire) {
                    break;
                }
            }
            if let Some(why) = self.broken.clone() {
                self.fail_all(&why);
            }
            self.drop_gone();
            self.assign();
            if !self.slots.iter().any(|s| s.active.is_some()) {
                self.publish(Vec::new());
                continue;
            }
            self.step();
        }
        self.fail_all("the server is shutting down");
        self.publish(Vec::new());
        self.model
    }

    /// Requests whose client left: their slots are freed now.
    fn drop_gone(&mut self) {
        let gone: Vec<usize> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.active.as_ref().is_some_and(|a| a.req.events.is_closed()))
            .map(|(i, _)| i)
            .collect();
        for i in gone {
            self.finish_slot(i, None);
        }
        let before = self.queue.len();
        self.queue.retain(|r| !r.events.is_closed());
        let n = before - self.queue.len();
        self.pending.fetch_sub(n, Ordering::AcqRel);
    }

    /// Queued requests into free slots, each to the free slot whose cache shares the longest
    /// prefix with its prompt (the least recently used among equals).
    fn assign(&mut self) {
        while !self.queue.is_empty() {
            let free: Vec<usize> = (0..self.slots.len())
                .filter(|&i| self.slots[i].active.is_none())
                .collect();
            if free.is_empty() {
                return;
            }
            let Some(req) = self.queue.pop_front() else {
                return;
            };
            let common = |i: usize| {
                self.slots[i]
                    .cached
                    .iter()
                    .zip(&req.prompt)
                    .take_while(|(a, b)| a == b)
                    .count()
            };
            let Some(i) = free.iter().copied().max_by_key(|&i| {
                (
                    common(i),
                    std::cmp::Reverse(self.slots[i].last_used),
                    std::cmp::Reverse(i),
                )
            }) else {
                return;
            };
            // At least the last prompt token runs again: its logits pick the first token. And at
            // least as many as make a product of the batch kernels (`set_exact_rows_below`,
            // n_slots + 1 rows): the prompt's last rows are then computed as a prompt read
            // afresh computes them, so a cached prefix never changes a greedy answer (one row
            // alone takes the row kernel, whose sums round otherwise).
            let rerun = (self.cfg.n_slots + 1).min(req.prompt.len()).max(1);
            let reuse = self
                .model
                .kv_resume_seq(i, common(i).min(req.prompt.len().saturating_sub(rerun)));
            self.uses += 1;
            let slot = &mut self.slots[i];
            slot.cached.truncate(reuse);
            slot.last_used = self.uses;
            let mut sampler = Sampler::new(req.sampler.clone());
            for &t in &req.prompt {
                sampler.accept(t);
            }
            let _ = req.events.send(GenEvent::Started {
                slot: i,
                cached: reuse,
            });
            let now = Instant::now();
            slot.active = Some(Active {
                stop: StopFilter::new(&req.sampler.stop),
                split: req.reasoning.parser(),
                req,
                done: reuse,
                cached: reuse,
                sampler,
                decoder: StreamDecoder::new(),
                generated: Vec::new(),
                assigned_at: now,
                prompt_started: now,
                first_token: None,
                prompt_time: Duration::ZERO,
                reasoning_tokens: 0,
            });
        }
    }

    /// One step: a batch of one token per generating slot, then a batch of prompt chunks. The
    /// two are separate forward calls so that the decode rows are computed exactly as each
    /// sequence's own decode step would compute them (`Model::set_exact_rows_below`), whatever
    /// prompts arrive meanwhile.
    fn step(&mut self) {
        let n_batch = self.model.n_batch();
        let mut decode: Vec<Planned> = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            if let Some(a) = &s.active
                && a.done >= a.req.prompt.len()
                && decode.len() < n_batch
            {
                decode.push(Planned {
                    slot: i,
                    pos0: s.cached.len(),
                    tokens: vec![*a.generated.last().unwrap_or(&0)],
                    logits: true,
                    prompt: false,
                });
            }
        }
        // A prompt holds the generating slots for at most `prefill_chunk` tokens' work a step.
        let mut room = if decode.is_empty() {
            n_batch
        } else {
            self.cfg.prefill_chunk.min(n_batch)
        };
        let mut prefill: Vec<Planned> = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            let Some(a) = &s.active else { continue };
            let left = a.req.prompt.len().saturating_sub(a.done);
            if left == 0 || room == 0 {
                continue;
            }
            let mut n = left.min(room);
            // A rest of the prompt too short for the batch kernels goes now, with this chunk:
            // alone, those tokens would have run in one batch with it.
            if left - n < self.cfg.n_slots + 1 && left <= n_batch {
                n = left;
            }
            prefill.push(Planned {
                slot: i,
                pos0: a.done,
                tokens: a.req.prompt[a.done..a.done + n].to_vec(),
                logits: n == left,
                prompt: true,
            });
            room = room.saturating_sub(n);
        }
        if !decode.is_empty() {
            self.run_batch(decode);
        }
        // Slots that finished or failed in the decode batch left no prompt work behind.
        if !prefill.is_empty() {
            self.run_batch(prefill);
        }
    }

    /// Runs one batch and hands each slot its logits.
    fn run_batch(&mut self, plan: Vec<Planned>) {
        let chunks: Vec<SeqChunk> = plan
            .iter()
            .map(|p| SeqChunk {
                seq: p.slot,
                pos0: p.pos0,
                tokens: &p.tokens,
                logits: p.logits,
            })
            .collect();
        let in_step: Vec<u64> = plan
            .iter()
            .filter_map(|p| self.slots[p.slot].active.as_ref().map(|a| a.req.id))
            .collect();
        self.publish(in_step);
        let t0 = Instant::now();
        let mut logits = std::mem::take(&mut self.logits);
        let run = self.model.forward_seqs(&chunks, &mut logits);
        let dt = t0.elapsed();
        if let Err(e) = run {
            self.logits = logits;
            // The slots of this batch hold a partial write: they forget their caches, and
            // their requests fail with the error (which names the op); the others go on.
            let why = format!("the forward pass failed: {e}");
            tracing::error!("{why}");
            for p in &plan {
                self.slots[p.slot].cached.clear();
                self.finish_slot(p.slot, Some(why.clone()));
            }
            if matches!(
                e,
                crate::model::forward::ModelError::FileChanged(_)
                    | crate::model::forward::ModelError::Interrupted
            ) {
                self.broken = Some(why);
            }
            return;
        }
        self.counters.n_decode_total += 1;
        self.counters.n_busy_slots_total += plan.len() as u64;
        let n_tokens: usize = plan.iter().map(|p| p.tokens.len()).sum();
        if plan.first().is_some_and(|p| p.prompt) {
            self.counters.prompt_seconds_total += dt.as_secs_f64();
            self.counters.prompt_tokens_total += n_tokens as u64;
        } else {
            self.counters.tokens_predicted_seconds_total += dt.as_secs_f64();
        }
        let vocab = self.model.config.vocab_size;
        let mut row = 0;
        for p in &plan {
            let slot = &mut self.slots[p.slot];
            slot.cached.extend_from_slice(&p.tokens);
            let Some(a) = slot.active.as_mut() else {
                continue;
            };
            if p.prompt {
                a.done += p.tokens.len();
                if a.done >= a.req.prompt.len() {
                    a.prompt_time = a.prompt_started.elapsed();
                }
            }
            if p.logits {
                let l = &logits[row * vocab..(row + 1) * vocab];
                row += 1;
                if let Some(end) = self.sample_one(p.slot, l) {
                    self.end_request(p.slot, end);
                }
            }
        }
        self.logits = logits;
    }

    /// Samples slot `i`'s next token from `logits` and streams its text; the stop reason when
    /// the request is complete.
    fn sample_one(&mut self, i: usize, logits: &[f32]) -> Option<StopReason> {
        let n_ctx = self.model.n_ctx();
        let tok = self.tok.clone();
        let slot = &mut self.slots[i];
        let held = slot.cached.len();
        let a = slot.active.as_mut()?;
        let cfg = &a.req.sampler;
        if cfg.n_predict >= 0 && a.generated.len() >= cfg.n_predict as usize {
            return Some(StopReason::Limit);
        }
        let t = if a.req.ignore_eos {
            a.sampler.sample_excluding(logits, tok.eog_tokens())
        } else {
            a.sampler.sample(logits)
        };
        if a.first_token.is_none() {
            a.first_token = Some(Instant::now());
        }
        if tok.is_eog(t) {
            return Some(StopReason::Eog);
        }
        a.generated.push(t);
        a.sampler.accept(t);
        self.counters.tokens_predicted_total += 1;
        let piece = a.decoder.push(&tok, t, false);
        let (emit, hit) = a.stop.push(&piece);
        if !a.split.answering() {
            a.reasoning_tokens += 1;
        }
        let parts = a.split.push(&emit);
        send_parts(&a.req.events, parts);
        if let Some(s) = hit {
            return Some(StopReason::StopString(s));
        }
        if cfg.n_predict >= 0 && a.generated.len() >= cfg.n_predict as usize {
            return Some(StopReason::Limit);
        }
        if held + 1 > n_ctx {
            return Some(StopReason::ContextFull);
        }
        None
    }

    /// Flushes what the filters held back, sends `Done`, frees the slot.
    fn end_request(&mut self, i: usize, reason: StopReason) {
        if let Some(a) = self.slots[i].active.as_mut() {
            let mut parts = Vec::new();
            if !matches!(reason, StopReason::StopString(_)) {
                let mut rest = a.stop.flush();
                rest.push_str(&a.decoder.finish());
                parts = a.split.push(&rest);
            }
            parts.extend(a.split.finish());
            send_parts(&a.req.events, parts);
            let now = Instant::now();
            let first = a.first_token.unwrap_or(now);
            let stats = GenStats {
                prompt_tokens: a.req.prompt.len(),
                cached_tokens: a.cached,
                prompt_time: a.prompt_time,
                generated_tokens: a.generated.len(),
                gen_time: now.duration_since(first),
                time_to_first_token: first.duration_since(a.req.queued_at),
                reasoning_tokens: a.reasoning_tokens,
                reasoning_time: Duration::ZERO,
            };
            let _ = a.req.events.send(GenEvent::Done {
                reason,
                stats,
                queue_wait: a.assigned_at.duration_since(a.req.queued_at),
            });
        }
        self.finish_slot(i, None);
    }

    /// Frees slot `i`; with `failed`, its request is told why.
    fn finish_slot(&mut self, i: usize, failed: Option<String>) {
        let Some(a) = self.slots[i].active.take() else {
            return;
        };
        if let Some(why) = failed {
            let _ = a.req.events.send(GenEvent::Failed(why));
        }
        // The last generated token's keys were never written (it was sampled, not run): the
        // cache holds the prompt and the tokens before it.
        self.counters.requests_total += 1;
        self.pending.fetch_sub(1, Ordering::AcqRel);
    }

    fn fail_all(&mut self, why: &str) {
        for i in 0..self.slots.len() {
            self.finish_slot(i, Some(why.to_string()));
        }
        for r in self.queue.drain(..) {
            let _ = r.events.send(GenEvent::Failed(why.to_string()));
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn publish(&mut self, in_step: Vec<u64>) {
        let now = Instant::now();
        if self
            .arena
            .as_ref()
            .is_none_or(|(t, _)| now.duration_since(*t) >= Duration::from_secs(1))
        {
            self.arena = Some((now, self.model.backend().arena()));
        }
        let slots = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| SlotSnapshot::of(i, s.cached.len(), s.active.as_ref(), now))
            .collect();
        let queued = self
            .queue
            .iter()
            .map(|r| QueuedSnapshot {
                id: r.id,
                client: r.client.clone(),
                prompt_tokens: r.prompt.len(),
                waiting: now.duration_since(r.queued_at),
            })
            .collect();
        let snap = ServeSnapshot {
            slots,
            queued,
            in_step,
            counters: self.counters,
            n_ctx: self.model.n_ctx(),
            broken: self.broken.clone(),
            arena: self.arena.as_ref().map(|(_, a)| a.clone()),
        };
        self.snap.send_replace(snap);
    }
}

fn send_parts(tx: &mpsc::UnboundedSender<GenEvent>, parts: Vec<Part>) {
    for p in parts {
        let ev = match p {
            Part::Answer(t) if !t.is_empty() => GenEvent::Text(t),
            Part::Reasoning(t) if !t.is_empty() => GenEvent::Reasoning(t),
            _ => continue,
        };
        let _ = tx.send(ev);
    }
}
