//! What the engine shows other threads after each step: plain copies, never handles.

use std::time::{Duration, Instant};

use super::Active;
use crate::gpu::snapshot::ArenaSnapshot;

/// A slot's state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum SlotState {
    #[default]
    Idle,
    /// Reading the prompt: `done` of `total` tokens in the cache.
    Prompt {
        done: usize,
        total: usize,
    },
    Generating,
}

/// One slot and its request, if any.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlotSnapshot {
    pub id: usize,
    pub state: SlotState,
    /// Tokens the slot's cache holds.
    pub held: usize,
    pub request: Option<u64>,
    pub client: String,
    pub kind: &'static str,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub generated: usize,
    /// Generation speed so far (tokens after the first over the time since it).
    pub tokens_per_s: Option<f64>,
    pub ttft: Option<Duration>,
    pub queue_wait: Duration,
    /// Since the request arrived.
    pub age: Duration,
}

impl SlotSnapshot {
    pub(super) fn of(id: usize, held: usize, a: Option<&Active>, now: Instant) -> SlotSnapshot {
        let Some(a) = a else {
            return SlotSnapshot {
                id,
                held,
                ..SlotSnapshot::default()
            };
        };
        let state = if a.done < a.req.prompt.len() {
            SlotState::Prompt {
                done: a.done,
                total: a.req.prompt.len(),
            }
        } else {
            SlotState::Generating
        };
        let tokens_per_s = a.first_token.and_then(|t| {
            let s = now.duration_since(t).as_secs_f64();
            (a.generated.len() > 1 && s > 0.0).then(|| (a.generated.len() - 1) as f64 / s)
        });
        SlotSnapshot {
            id,
            state,
            held,
            request: Some(a.req.id),
            client: a.req.client.clone(),
            kind: a.req.kind,
            prompt_tokens: a.req.prompt.len(),
            cached_tokens: a.cached,
            generated: a.generated.len(),
            tokens_per_s,
            ttft: a.first_token.map(|t| t.duration_since(a.req.queued_at)),
            queue_wait: a.assigned_at.duration_since(a.req.queued_at),
            age: now.duration_since(a.req.queued_at),
        }
    }
}

/// A request waiting for a slot.
#[derive(Clone, Debug, PartialEq)]
pub struct QueuedSnapshot {
    pub id: u64,
    pub client: String,
    pub prompt_tokens: usize,
    pub waiting: Duration,
}

/// Totals over the server's life, named after llama-server's `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counters {
    pub prompt_tokens_total: u64,
    pub prompt_seconds_total: f64,
    pub tokens_predicted_total: u64,
    pub tokens_predicted_seconds_total: f64,
    pub n_decode_total: u64,
    pub n_busy_slots_total: u64,
    pub requests_total: u64,
}

/// The engine after its last step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServeSnapshot {
    pub slots: Vec<SlotSnapshot>,
    pub queued: Vec<QueuedSnapshot>,
    /// The requests of the step running now (a hang in it is theirs).
    pub in_step: Vec<u64>,
    pub counters: Counters,
    /// Positions each slot's cache holds.
    pub n_ctx: usize,
    /// Why the engine stopped serving, if it did.
    pub broken: Option<String>,
    /// The device memory (refreshed about once a second).
    pub arena: Option<ArenaSnapshot>,
}

impl ServeSnapshot {
    pub fn idle(n_slots: usize, n_ctx: usize) -> ServeSnapshot {
        ServeSnapshot {
            slots: (0..n_slots)
                .map(|id| SlotSnapshot {
                    id,
                    ..SlotSnapshot::default()
                })
                .collect(),
            n_ctx,
            ..ServeSnapshot::default()
        }
    }

    /// Slots with a request.
    pub fn busy(&self) -> usize {
        self.slots.iter().filter(|s| s.request.is_some()).count()
    }
}
