//! What a conversation file holds: one [`Record`] per line, and the [`Conversation`] the records
//! replay to (the chat's `--resume`, `/save`, the tests).

use serde::{Deserialize, Serialize};

use crate::model::protocol::GenStats;
use crate::ui::chat::stats_line;

/// One line of the file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Record {
    Start {
        version: u32,
        /// Seconds since the Unix epoch.
        time: u64,
        app: String,
    },
    Model {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
    },
    System {
        text: String,
    },
    User {
        text: String,
    },
    /// A piece of the answer being generated.
    Token {
        text: String,
    },
    /// A piece of a reasoning model's reasoning before its answer (added later: older files
    /// have none).
    Reasoning {
        text: String,
    },
    Done {
        reason: String,
        prompt_tokens: usize,
        cached_tokens: usize,
        generated_tokens: usize,
        prompt_ms: f64,
        gen_ms: f64,
        ttft_ms: f64,
        /// Of the generated tokens, the reasoning's (written only when there was reasoning).
        #[serde(default, skip_serializing_if = "is_zero")]
        reasoning_tokens: usize,
        #[serde(default, skip_serializing_if = "is_zero_f")]
        reasoning_ms: f64,
    },
    /// The last answer was dropped to be generated again.
    Regen,
    /// The sampler settings from here on, by their `/set` names (added later: older files have
    /// none, and a resumed conversation then keeps the configured settings).
    Sampler {
        values: std::collections::BTreeMap<String, String>,
    },
    Clear,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn is_zero_f(x: &f64) -> bool {
    *x == 0.0
}

/// One question and its answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Turn {
    pub user: String,
    pub answer: String,
    /// The reasoning before the answer (a reasoning model's; empty otherwise).
    pub reasoning: String,
    /// The stats line, once the answer finished.
    pub summary: Option<String>,
    /// The system prompt in force when the question was asked.
    pub system: String,
    /// The model that answered (its name when the question was asked).
    pub model: Option<String>,
}

/// A conversation, as replayed from its records.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Conversation {
    pub started: Option<u64>,
    pub model: Option<String>,
    /// The file of the model last loaded, as recorded (older files record none).
    pub model_path: Option<String>,
    pub system: String,
    pub turns: Vec<Turn>,
    /// The last sampler settings recorded, by `/set` name.
    pub sampler: Option<std::collections::BTreeMap<String, String>>,
}

impl Conversation {
    pub fn apply(&mut self, r: &Record) {
        match r {
            Record::Start { time, .. } => {
                self.started.get_or_insert(*time);
            }
            Record::Model { name, path } => {
                self.model = Some(name.clone());
                self.model_path = path.clone();
            }
            Record::System { text } => self.system = text.clone(),
            Record::User { text } => self.turns.push(Turn {
                user: text.clone(),
                system: self.system.clone(),
                model: self.model.clone(),
                ..Turn::default()
            }),
            Record::Token { text } => {
                if let Some(t) = self.turns.last_mut() {
                    t.answer.push_str(text);
                }
            }
            Record::Reasoning { text } => {
                if let Some(t) = self.turns.last_mut() {
                    t.reasoning.push_str(text);
                }
            }
            Record::Done {
                reason,
                prompt_tokens,
                cached_tokens,
                generated_tokens,
                prompt_ms,
                gen_ms,
                ttft_ms,
                reasoning_tokens,
                reasoning_ms,
            } => {
                if let Some(t) = self.turns.last_mut() {
                    let ms = |x: f64| std::time::Duration::from_secs_f64((x / 1e3).max(0.0));
                    let stats = GenStats {
                        prompt_tokens: *prompt_tokens,
                        cached_tokens: *cached_tokens,
                        prompt_time: ms(*prompt_ms),
                        generated_tokens: *generated_tokens,
                        gen_time: ms(*gen_ms),
                        time_to_first_token: ms(*ttft_ms),
                        reasoning_tokens: *reasoning_tokens,
                        reasoning_time: ms(*reasoning_ms),
                    };
                    t.summary = Some(stats_line(&stats, reason));
                }
            }
            Record::Regen => {
                if let Some(t) = self.turns.last_mut() {
                    t.answer.clear();
                    t.reasoning.clear();
                    t.summary = None;
                }
            }
            Record::Clear => self.turns.clear(),
            Record::Sampler { values } => self.sampler = Some(values.clone()),
        }
    }

    /// The turns as (question, answer) pairs, for the worker and the view.
    pub fn pairs(&self) -> Vec<(String, String)> {
        self.turns
            .iter()
            .map(|t| (t.user.clone(), t.answer.clone()))
            .collect()
    }
}
