//! A conversation on a loaded model: chat history, the tokens whose keys and values sit in the KV
//! cache (reused across turns for the prefix that did not change), generation with streaming
//! text, stop strings, and the context shift when the context fills: a block of the oldest whole
//! turns is dropped (a fraction of what follows the system prompt, so that shifts are rare), the
//! kept turns' keys and values move down in the cache and are re-rotated for their new positions
//! ([`Model::shift_kv`]), and the next turn processes only its own new tokens. Where the shift is
//! not possible (an architecture where it is not exact, kept tokens that no longer line up with
//! the new rendering) the kept turns are processed again, and the log says why.
//!
//! A shifted cache is llama.cpp's `--context-shift`: each kept token's keys are exactly those of
//! its new position at the first layer; at deeper layers they still carry what the token saw of
//! the dropped turns when it was computed (a recompute would not), so answers after a shift are
//! the recompute's answers only for one-layer models (tests/it/kv_shift.rs checks exactly that) and
//! close to them otherwise.

use std::time::{Duration, Instant};

use crate::gpu::trace::{self, TrackId};
use crate::model::forward::{Logits, Model, ModelError};
pub use crate::model::protocol::Trim;
use crate::model::protocol::{GenStats, SamplerConfig, StopReason};
use crate::model::reasoning::{Part, ReasoningFormat};
use crate::model::sampler::Sampler;
use crate::model::template::{ChatTemplate, Message, TemplateError};
use crate::model::tokenizer::{StreamDecoder, Tokenizer};

pub(crate) mod stop;
use stop::StopFilter;

/// What the caller wants after each piece of text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    Continue,
    Stop,
}

/// Things a generation reports as it goes.
pub enum Progress<'a> {
    /// `done` of the prompt's `total` new tokens are processed (between batches; the caller's
    /// answer is not looked at).
    Prompt { done: usize, total: usize },
    /// The prompt is processed; the first token follows.
    PromptDone(&'a GenStats),
    /// Text of the answer (valid UTF-8, stop strings withheld).
    Text(&'a str),
    /// Text of the reasoning before the answer (a reasoning model's, split off by
    /// [`crate::model::reasoning`]).
    Reasoning(&'a str),
    /// The oldest messages were dropped to fit the context.
    Trimmed(&'a Trim),
    /// Nothing new yet (a remote engine waiting on the server); the caller's answer is looked
    /// at, so that a stop ends the wait.
    Waiting,
}

/// The default share of the turns after the system prompt dropped at once when the context fills.
pub const DEFAULT_DISCARD: f32 = 0.5;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(
        "the prompt is {tokens} tokens, the context holds {n_ctx}: shorten it or ask for a larger context (-c)"
    )]
    PromptTooLong { tokens: usize, n_ctx: usize },
    #[error(
        "the message is {tokens} tokens; at most {fits} fit in the context of {n_ctx} with room for an answer: shorten it or ask for a larger context (-c). The conversation is kept"
    )]
    MessageTooLong {
        tokens: usize,
        fits: usize,
        n_ctx: usize,
    },
}

/// The result of one answer.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The answer proper (without the reasoning).
    pub text: String,
    /// The reasoning before it (empty for a model that does not reason).
    pub reasoning: String,
    pub tokens: Vec<u32>,
    pub stats: GenStats,
    pub reason: StopReason,
}

pub struct Session {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    system: Option<String>,
    messages: Vec<Message>,
    /// Tokens whose keys/values are in the cache at positions 0..len.
    cached: Vec<u32>,
    sampler: Sampler,
    logits: Vec<f32>,
    /// Share of the turns after the system prompt dropped when the context fills.
    discard: f32,
    /// How the model's answers carry their reasoning (from its template and vocabulary).
    reasoning: ReasoningFormat,
}

impl Session {
    pub fn new(
        model: Model,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        sampler: SamplerConfig,
    ) -> Session {
        let reasoning = ReasoningFormat::of(&template, &tokenizer);
        Session {
            model,
            tokenizer,
            template,
            reasoning,
            system: None,
            messages: Vec::new(),
            cached: Vec::new(),
            sampler: Sampler::new(sampler),
            logits: Vec::new(),
            discard: DEFAULT_DISCARD,
        }
    }

    /// How much of the conversation after the system prompt a full context drops at once (a
    /// share in 0..1; at least what the next turn needs is always dropped).
    pub fn set_discard(&mut self, share: f32) {
        self.discard = share.clamp(0.0, 0.95);
    }

    pub fn discard(&self) -> f32 {
        self.discard
    }

    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    pub fn system(&self) -> Option<&str> {
        self.system.as_deref()
    }

    pub fn set_system(&mut self, system: &str) {
        let s = system.trim();
        self.system = (!s.is_empty()).then(|| s.to_string());
    }

    pub fn set_sampler(&mut self, cfg: SamplerConfig) {
        self.sampler = Sampler::new(cfg);
    }

    pub fn sampler_config(&self) -> &SamplerConfig {
        self.sampler.config()
    }

    /// Forgets the conversation; the system prompt stays (and its cached tokens will be reused).
    pub fn clear(&mut self) {
        self.messages.clear();
        self.sampler.reset();
    }

    /// Takes these (question, answer) turns as the conversation so far (a conversation reopened
    /// from its transcript). Turns without an answer are left out: templates expect the roles
    /// to alternate.
    pub fn restore(&mut self, turns: &[(String, String)]) {
        self.messages.clear();
        for (user, answer) in turns.iter().filter(|(_, a)| !a.trim().is_empty()) {
            self.messages.push(Message::new("user", user.as_str()));
            self.messages
                .push(Message::new("assistant", answer.as_str()));
        }
        self.sampler.reset();
    }

    /// The conversation as (question, answer) exchanges, as [`Session::restore`] takes them.
    pub fn turns(&self) -> Vec<(String, String)> {
        self.messages
            .chunks(2)
            .filter_map(|pair| match pair {
                [u, a] if u.role == "user" && a.role == "assistant" => {
                    Some((u.content.clone(), a.content.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// [`Session::restore`], then drops the oldest exchanges until the rest (with the system
    /// prompt) leaves room for an answer in this model's context. Returns how many were dropped
    /// and the tokens the kept conversation renders to.
    pub fn restore_within_context(
        &mut self,
        turns: &[(String, String)],
    ) -> Result<(usize, usize), SessionError> {
        self.restore(turns);
        let limit = self.model.n_ctx().saturating_sub(self.answer_room());
        let mut dropped = 0;
        let mut tokens = self.render()?.len();
        while tokens > limit && self.messages.len() >= 2 {
            self.messages.drain(..2);
            dropped += 1;
            tokens = self.render()?.len();
        }
        Ok((dropped, tokens))
    }

    /// Tokens currently in the KV cache.
    pub fn cached_tokens(&self) -> usize {
        self.cached.len()
    }

    /// The tokens whose keys and values the cache holds, at positions `0..`.
    pub fn cached_ids(&self) -> &[u32] {
        &self.cached
    }

    /// Removes the last answer so it can be generated again; returns the user message it
    /// answered.
    pub fn pop_answer(&mut self) -> Option<String> {
        if self.messages.last().is_some_and(|m| m.role == "assistant") {
            self.messages.pop();
        }
        match self.messages.last() {
            Some(m) if m.role == "user" => self.messages.pop().map(|m| m.content),
            _ => None,
        }
    }

    fn render(&self) -> Result<Vec<u32>, SessionError> {
        let mut all = Vec::with_capacity(self.messages.len() + 1);
        if let Some(s) = &self.system {
            all.push(Message::new("system", s.as_str()));
        }
        all.extend(self.messages.iter().cloned());
        // The template's own BOS text is dropped when the model adds BOS, so that the prompt
        // holds exactly one (as llama.cpp does).
        self.template
            .prompt_tokens(&self.tokenizer, &all, true)
            .map_err(SessionError::from)
    }

    /// Tokens kept free for the answer: the sampler's limit if it has one, else an eighth of the
    /// context (at least 16).
    fn answer_room(&self) -> usize {
        let n_ctx = self.model.n_ctx();
        let n_predict = self.sampler.config().n_predict;
        if n_predict > 0 {
            (n_predict as usize).min(n_ctx / 2)
        } else {
            (n_ctx / 8).max(16)
        }
    }

    /// Whether `user` could be answered with no history at all (the system prompt, the message
    /// and room for the answer): checked before anything of the history is dropped, so that a
    /// message that can never fit is refused with the conversation intact.
    pub fn check_fits(&self, user: &str) -> Result<(), SessionError> {
        let mut alone = Vec::with_capacity(2);
        if let Some(s) = &self.system {
            alone.push(Message::new("system", s.as_str()));
        }
        alone.push(Message::new("user", user));
        let tokens = self
            .template
            .prompt_tokens(&self.tokenizer, &alone, true)?
            .len();
        let n_ctx = self.model.n_ctx();
        let fits = n_ctx.saturating_sub(self.answer_room());
        if tokens > fits {
            return Err(SessionError::MessageTooLong {
                tokens,
                fits,
                n_ctx,
            });
        }
        Ok(())
    }

    /// Adds a user message and generates the assistant's answer, which joins the history.
    pub fn chat(
        &mut self,
        user: &str,
        on: &mut dyn FnMut(Progress) -> Control,
    ) -> Result<Answer, SessionError> {
        self.check_fits(user)?;
        let t0 = Instant::now();
        self.messages.push(Message::new("user", user));
        let n_ctx = self.model.n_ctx();
        // Room for at least a short answer; more if the sampler's limit asks for it.
        let room = self.answer_room();
        let mut prompt = self.render()?;
        if prompt.len() + room > n_ctx && self.messages.len() > 1 {
            let trim = self.trim(&mut prompt, room)?;
            on(Progress::Trimmed(&trim));
        }
        if prompt.len() >= n_ctx {
            self.messages.pop();
            return Err(SessionError::PromptTooLong {
                tokens: prompt.len(),
                n_ctx,
            });
        }
        let format = self.reasoning.clone();
        // A built-in format's turn opener ends the answer too (see `Format::turn_opener`).
        let stops = self.template.stop_tokens(&self.tokenizer);
        let result = self.generate(&prompt, t0, &format, &stops, on);
        match result {
            Ok(answer) => {
                // The answer and its reasoning apart, as the template expects them.
                self.messages.push(
                    Message::new("assistant", answer.text.as_str())
                        .with_reasoning(&answer.reasoning),
                );
                Ok(answer)
            }
            Err(e) => {
                self.messages.pop();
                Err(e)
            }
        }
    }

    /// Drops the oldest whole exchanges, at least enough for `room` tokens after the prompt and
    /// at least the configured share of the conversation after the system prompt, then shifts
    /// the cache so that the kept turns need no recompute. `prompt` becomes the new rendering.
    fn trim(&mut self, prompt: &mut Vec<u32>, room: usize) -> Result<Trim, SessionError> {
        let n_ctx = self.model.n_ctx();
        let before = prompt.len();
        let fixed = {
            let saved = std::mem::take(&mut self.messages);
            let r = self.render();
            self.messages = saved;
            let head = r?;
            head.iter()
                .zip(prompt.iter())
                .take_while(|(a, b)| a == b)
                .count()
        };
        let needed = (before + room).saturating_sub(n_ctx);
        let share = (before.saturating_sub(fixed) as f32 * self.discard) as usize;
        let want = needed.max(share);
        let mut messages = 0;
        while self.messages.len() > 1 && before.saturating_sub(prompt.len()) < want {
            // The system prompt stays in `self.system`; exchanges go whole.
            self.messages.remove(0);
            messages += 1;
            if self.messages.len() > 1 && self.messages[0].role == "assistant" {
                self.messages.remove(0);
                messages += 1;
            }
            *prompt = self.render()?;
        }
        let dropped_tokens = before.saturating_sub(prompt.len());
        let (kept_tokens, recompute) = self.shift_cache(prompt, dropped_tokens);
        if let Some(why) = &recompute {
            tracing::info!("context shift not possible, the kept turns are processed again: {why}");
        }
        Ok(Trim {
            messages,
            dropped_tokens,
            kept_tokens,
            recompute,
        })
    }

    /// Moves the cached tokens that follow the dropped ones down to where `prompt` (the new
    /// rendering) has them, re-rotating their keys. The dropped turns took about `dropped`
    /// tokens of the rendering; the exact offset is the one at which the cache and the new
    /// prompt agree longest (tokenizers may merge differently across a message boundary).
    /// Returns the tokens now valid in the cache and, if the shift was not possible, why.
    fn shift_cache(&mut self, prompt: &[u32], dropped: usize) -> (usize, Option<String>) {
        let p = self
            .cached
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        if p == self.cached.len() || p == prompt.len() || dropped == 0 {
            return (p, None);
        }
        if p + dropped >= self.cached.len() {
            // Every cached turn after the common prefix was dropped: nothing to move.
            self.cached.truncate(p);
            return (p, None);
        }
        let run = |d: usize| {
            self.cached.get(p + d..).map_or(0, |c| {
                c.iter()
                    .zip(&prompt[p..])
                    .take_while(|(a, b)| a == b)
                    .count()
            })
        };
        let (d, m) = (dropped.saturating_sub(8)..=dropped + 8)
            .filter(|&d| d > 0)
            .map(|d| (d, run(d)))
            .max_by_key(|&(d, m)| (m, std::cmp::Reverse(d.abs_diff(dropped))))
            .unwrap_or((dropped, 0));
        if m == 0 {
            self.cached.truncate(p);
            return (
                p,
                Some("the kept turns do not line up with the cache after the dropped ones".into()),
            );
        }
        match self.model.shift_kv(p, p + d, m) {
            Ok(()) => {
                self.cached.drain(p..p + d);
                self.cached.truncate(p + m);
                (p + m, None)
            }
            Err(e) => {
                self.cached.truncate(p);
                (p, Some(e.to_string()))
            }
        }
    }

    /// Continues raw text (no chat template), as `llama-cli -p` without conversation mode.
    pub fn complete(
        &mut self,
        text: &str,
        on: &mut dyn FnMut(Progress) -> Control,
    ) -> Result<Answer, SessionError> {
        let t0 = Instant::now();
        let prompt = self.tokenizer.encode(text, true, true);
        if prompt.len() >= self.model.n_ctx() {
            return Err(SessionError::PromptTooLong {
                tokens: prompt.len(),
                n_ctx: self.model.n_ctx(),
            });
        }
        self.generate(&prompt, t0, &ReasoningFormat::None, &[], on)
    }

    /// Processes `prompt` (reusing the cached prefix) and samples until a stop condition (the
    /// model's end-of-generation tokens, and `stop_tokens`); the text is split into reasoning
    /// and answer as `format` says.
    fn generate(
        &mut self,
        prompt: &[u32],
        t0: Instant,
        format: &ReasoningFormat,
        stop_tokens: &[u32],
        on: &mut dyn FnMut(Progress) -> Control,
    ) -> Result<Answer, SessionError> {
        let common = self
            .cached
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        // At least the last prompt token is run again: its logits pick the first answer token.
        // Sliding-window rings may have lost what a resume there needs (a regenerate that rolls
        // back a long answer): then from the start.
        let reuse = self
            .model
            .kv_resume(common.min(prompt.len().saturating_sub(1)));
        self.cached.truncate(reuse);
        let cfg = self.sampler.config().clone();
        for &t in &prompt[reuse..] {
            self.sampler.accept(t);
        }
        let tp = Instant::now();
        // A batch at a time, saying how far it got between batches.
        let todo = &prompt[reuse..];
        let batch = self.model.n_batch().max(1);
        let mut done = 0;
        while done < todo.len() {
            let n = (todo.len() - done).min(batch);
            let run = self.model.forward(
                &todo[done..done + n],
                reuse + done,
                Logits::Last,
                &mut self.logits,
            );
            if let Err(e) = run {
                // The cache may hold part of the prompt; forget everything after the reused prefix.
                if matches!(e, ModelError::Interrupted) {
                    // A stop during the prompt: an empty answer, stopped by the user.
                    return Ok(Answer {
                        text: String::new(),
                        reasoning: String::new(),
                        tokens: Vec::new(),
                        stats: GenStats {
                            prompt_tokens: prompt.len(),
                            cached_tokens: reuse,
                            prompt_time: tp.elapsed(),
                            time_to_first_token: t0.elapsed(),
                            ..GenStats::default()
                        },
                        reason: StopReason::User,
                    });
                }
                return Err(e.into());
            }
            done += n;
            if done < todo.len() {
                on(Progress::Prompt {
                    done,
                    total: todo.len(),
                });
            }
        }
        self.cached.extend_from_slice(&prompt[reuse..]);
        let mut stats = GenStats {
            prompt_tokens: prompt.len(),
            cached_tokens: reuse,
            prompt_time: tp.elapsed(),
            ..GenStats::default()
        };
        on(Progress::PromptDone(&stats));
        let tg = Instant::now();
        let mut decoder = StreamDecoder::new();
        let mut stop = StopFilter::new(&cfg.stop);
        let mut split = format.parser();
        let mut text = String::new();
        let mut reasoning = String::new();
        let mut tokens = Vec::new();
        let n_ctx = self.model.n_ctx();
        let reason = loop {
            // Checked before sampling, so that `-n 0` generates nothing.
            if cfg.n_predict >= 0 && tokens.len() >= cfg.n_predict as usize {
                break StopReason::Limit;
            }
            let tok = {
                let _s = trace::slice(TrackId::WORKER, "sample");
                self.sampler.sample(&self.logits)
            };
            if tokens.is_empty() {
                stats.time_to_first_token = t0.elapsed();
            }
            if self.tokenizer.is_eog(tok) || stop_tokens.contains(&tok) {
                break StopReason::Eog;
            }
            tokens.push(tok);
            self.sampler.accept(tok);
            let detok = trace::slice(TrackId::WORKER, "detokenize");
            let piece = decoder.push(&self.tokenizer, tok, false);
            let (emit, hit) = stop.push(&piece);
            let thinking = !split.answering();
            let control = deliver(split.push(&emit), &mut text, &mut reasoning, on);
            drop(detok);
            if thinking {
                stats.reasoning_tokens += 1;
                stats.reasoning_time = tg.elapsed();
            }
            if let Some(s) = hit {
                break StopReason::StopString(s);
            }
            if control == Control::Stop {
                break StopReason::User;
            }
            if cfg.n_predict >= 0 && tokens.len() >= cfg.n_predict as usize {
                break StopReason::Limit;
            }
            if self.cached.len() + 1 > n_ctx {
                break StopReason::ContextFull;
            }
            let pos = self.cached.len();
            match self
                .model
                .forward(&[tok], pos, Logits::Last, &mut self.logits)
            {
                Ok(()) => {}
                Err(ModelError::Interrupted) => break StopReason::User,
                Err(e) => return Err(e.into()),
            }
            self.cached.push(tok);
        };
        // Text held back (a possible stop-string prefix, or an incomplete character) is part of
        // the answer unless a stop string matched.
        let mut parts = Vec::new();
        if !matches!(reason, StopReason::StopString(_)) {
            let mut rest = stop.flush();
            rest.push_str(&decoder.finish());
            parts = split.push(&rest);
        }
        parts.extend(split.finish());
        deliver(parts, &mut text, &mut reasoning, on);
        if reasoning.is_empty() {
            // Tokens held while the parser looked for a header or `<think>` were the answer's.
            stats.reasoning_tokens = 0;
            stats.reasoning_time = Duration::ZERO;
        }
        stats.generated_tokens = tokens.len();
        stats.gen_time = tg.elapsed();
        if stats.time_to_first_token == Duration::ZERO {
            stats.time_to_first_token = t0.elapsed();
        }
        Ok(Answer {
            text,
            reasoning,
            tokens,
            stats,
            reason,
        })
    }

    /// The model, for direct use (benchmarks, perplexity); the session forgets what it believed
    /// was cached.
    pub fn model_mut(&mut self) -> &mut Model {
        // Direct use invalidates what the session believes is cached.
        self.cached.clear();
        &mut self.model
    }
}

/// Hands the parts of the output to `on` and adds them to the answer and the reasoning; `Stop`
/// if `on` answered it to any of them.
fn deliver(
    parts: Vec<Part>,
    text: &mut String,
    reasoning: &mut String,
    on: &mut dyn FnMut(Progress) -> Control,
) -> Control {
    let mut control = Control::Continue;
    for part in parts {
        let c = match &part {
            Part::Reasoning(t) => {
                reasoning.push_str(t);
                on(Progress::Reasoning(t))
            }
            Part::Answer(t) => {
                text.push_str(t);
                on(Progress::Text(t))
            }
        };
        if c == Control::Stop {
            control = Control::Stop;
        }
    }
    control
}
