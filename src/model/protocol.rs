//! The worker's command/event protocol: plain data over channels between the UI thread and the
//! inference worker that owns the model and the device.

use std::path::PathBuf;
use std::time::Duration;

use crate::gpu::snapshot::{
    ArenaSnapshot, DeviceSummary, StreamSnapshot, TelemetrySample, WatchdogSnapshot,
};
pub use crate::gpu::snapshot::{DeviceRelease, QuitStep, QuitStepStatus};

/// Sampling settings, named as llama.cpp names them.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// 0 means greedy.
    pub temp: f32,
    /// 0 disables.
    pub top_k: u32,
    /// 1.0 disables.
    pub top_p: f32,
    /// 0.0 disables.
    pub min_p: f32,
    /// 1.0 disables.
    pub repeat_penalty: f32,
    /// How many of the last tokens the repeat penalty looks at.
    pub repeat_last_n: u32,
    pub seed: u64,
    /// Most tokens to generate in one answer (-1: until the context is full).
    pub n_predict: i32,
    /// Extra strings that end an answer.
    pub stop: Vec<String>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        // llama.cpp's common defaults (common/common.h).
        SamplerConfig {
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0xFFFF_FFFF,
            n_predict: -1,
            stop: Vec::new(),
        }
    }
}

/// Where a model comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelSource {
    File(PathBuf),
    /// A synthetic model: shape name (`tiny`, `smollm2-135m`, …) and quant type name.
    Synthetic {
        shape: String,
        quant: String,
        seed: u64,
    },
    /// An OpenAI-compatible server (`--remote URL`, `[remote.NAME]`).
    Remote(RemoteSpec),
}

/// UI → worker.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Append a user message and generate the assistant's answer.
    Generate {
        user: String,
    },
    /// Stop the generation in progress (the partial answer stays in the conversation).
    Stop,
    /// Drop the last answer and generate it again.
    Regenerate,
    /// Forget the conversation (the system prompt stays).
    Clear,
    SetSystem(String),
    SetSampler(SamplerConfig),
    /// `/set ctx N`: the model is loaded again with a KV cache of `N` positions (`None`: the
    /// model's own context, at most 4096); the conversation is kept as far as it fits.
    SetContext(Option<usize>),
    /// Take these (question, answer) turns as the conversation so far: a conversation reopened
    /// from its transcript (`--resume`). Replaces the current conversation.
    Restore {
        turns: Vec<(String, String)>,
    },
    LoadModel(ModelSource),
    /// Start the synchronized quit; the worker answers with `QuitStep`s and then `Exited`.
    Quit {
        drain_deadline: Duration,
    },
}

/// The quit's time limits: the one home of these settings. The app reads them from the config
/// file's `[quit]` table (the defaults here are the ones `config.toml` documents) and passes the
/// same value to the view (which sends `Command::Quit` and shows the countdown), the event loop,
/// the quit coordinator and the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuitConfig {
    /// How long the worker may wait for the device queue to drain.
    pub drain_deadline: Duration,
    /// Extra time for the teardown steps after the drain before the app leaves without the
    /// worker.
    pub grace: Duration,
    /// How long the exit hooks (restore the terminal, flush the log) may run on the hard path.
    pub hook_timeout: Duration,
}

impl Default for QuitConfig {
    fn default() -> Self {
        QuitConfig {
            drain_deadline: Duration::from_millis(5000),
            grace: Duration::from_millis(2000),
            hook_timeout: Duration::from_secs(2),
        }
    }
}

impl QuitConfig {
    /// When the app leaves on its own during a quit: the drain deadline plus the grace.
    pub fn deadline(&self) -> Duration {
        self.drain_deadline + self.grace
    }
}

/// Why an answer ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// End-of-generation token.
    Eog,
    /// A stop string.
    StopString(String),
    /// The token limit (`n_predict`).
    Limit,
    /// The user stopped it.
    User,
    /// The context is full.
    ContextFull,
    /// The remote server's stream broke mid-answer (why); the partial answer is kept.
    Dropped(String),
}

/// Timings of one answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenStats {
    pub prompt_tokens: usize,
    /// Prompt tokens served from the KV cache (not recomputed).
    pub cached_tokens: usize,
    pub prompt_time: Duration,
    pub generated_tokens: usize,
    pub gen_time: Duration,
    pub time_to_first_token: Duration,
    /// Of the generated tokens, those before the answer began (a reasoning model's reasoning,
    /// with its markers); 0 for a model that does not reason.
    pub reasoning_tokens: usize,
    /// How long the reasoning took, from the first generated token.
    pub reasoning_time: Duration,
}

impl GenStats {
    pub fn prompt_tps(&self) -> f64 {
        per_second(
            self.prompt_tokens.saturating_sub(self.cached_tokens),
            self.prompt_time,
        )
    }
    pub fn gen_tps(&self) -> f64 {
        per_second(self.generated_tokens, self.gen_time)
    }
}

fn per_second(n: usize, t: Duration) -> f64 {
    let s = t.as_secs_f64();
    if s > 0.0 { n as f64 / s } else { 0.0 }
}

/// What the loaded model is.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelSummary {
    pub name: String,
    pub path: Option<PathBuf>,
    pub architecture: String,
    /// Most common weight type (`Q4_1`).
    pub quant: String,
    pub parameters: u64,
    pub file_bytes: u64,
    pub context_length: usize,
    pub n_layers: usize,
    pub load_time: Duration,
}

/// Worker → UI.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Progress of a long task (download, load, upload, kernel compilation): 0.0..=1.0 or None.
    Progress {
        task: String,
        fraction: Option<f32>,
        detail: String,
    },
    ModelLoaded {
        model: ModelSummary,
        device: DeviceSummary,
    },
    /// `done` of the `total` prompt tokens that had to be computed (not cached) are processed:
    /// sent between batches of a long prompt.
    PromptProgress {
        done: usize,
        total: usize,
    },
    /// The answer started (prompt processed); carries the prompt's statistics so far.
    AnswerStarted {
        stats: GenStats,
    },
    /// A piece of text of the answer, valid UTF-8.
    Token {
        text: String,
    },
    /// A piece of the reasoning a reasoning model writes before its answer (gpt-oss's
    /// `analysis` channel, `<think>…</think>`), valid UTF-8.
    Reasoning {
        text: String,
    },
    /// The answer ended.
    AnswerDone {
        stats: GenStats,
        reason: StopReason,
    },
    /// Oldest turns were dropped to fit the context (and the cache shifted, or not).
    ContextTrimmed(Trim),
    /// The context was changed (`/set ctx`): it now holds `n_ctx` positions; `kept` exchanges of
    /// the conversation are what the model sees, rendered in `tokens`; the `dropped` oldest did
    /// not fit (the screen and the transcript keep them).
    ContextResized {
        n_ctx: usize,
        kept: usize,
        dropped: usize,
        tokens: usize,
    },
    Streams(Vec<StreamSnapshot>),
    Arena(ArenaSnapshot),
    Watchdog(WatchdogSnapshot),
    Telemetry(TelemetrySample),
    /// Something the user should know that is not a failure (a model file without a chat
    /// template and the format used instead, a context longer than the model was trained on).
    Notice {
        context: String,
        message: String,
    },
    /// Something went wrong; the worker keeps running if it can.
    Error {
        context: String,
        message: String,
    },
    QuitStep(QuitStep),
    /// The worker has finished; how the device was released decides how the process leaves.
    Exited {
        release: DeviceRelease,
    },
}

/// What a context shift did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trim {
    /// Messages dropped from what the model sees (the history keeps them for the transcript's
    /// owner; the session forgets them).
    pub messages: usize,
    /// Tokens of the rendered prompt those messages took.
    pub dropped_tokens: usize,
    /// Tokens whose cached keys and values were kept (the system prompt and the kept turns).
    pub kept_tokens: usize,
    /// `None`: the kept turns were moved in the cache; `Some(why)`: they are processed again.
    pub recompute: Option<String>,
}

impl std::fmt::Display for Trim {
    /// The line the chat shows: what was dropped, and what the shift kept.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "context full: the {} oldest messages ({} tokens) were dropped from what the model sees (the transcript keeps them); ",
            self.messages, self.dropped_tokens
        )?;
        match &self.recompute {
            None => write!(
                f,
                "the cache shift kept {} tokens, only the new message is processed",
                self.kept_tokens
            ),
            Some(why) => write!(
                f,
                "{} cached tokens kept, the rest is processed again ({why})",
                self.kept_tokens
            ),
        }
    }
}

/// Where the API key comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum KeySource {
    #[default]
    None,
    /// An environment variable's name.
    Env(String),
    /// A file readable by its owner only (mode 0600 or 0400).
    File(PathBuf),
}

impl std::fmt::Display for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySource::None => write!(f, "no key"),
            KeySource::Env(n) => write!(f, "the environment variable {n}"),
            KeySource::File(p) => write!(f, "the file {}", p.display()),
        }
    }
}

/// Watchdog budgets of a remote request (`[remote]` in config.toml).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budgets {
    /// How long the first token may take (connecting, queueing, the prompt).
    pub first_token: Duration,
    /// How long the answer may pause between two tokens.
    pub between_tokens: Duration,
    /// How long connecting may take (the TCP and TLS handshakes).
    pub connect: Duration,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            first_token: Duration::from_secs(60),
            between_tokens: Duration::from_secs(10),
            connect: Duration::from_secs(5),
        }
    }
}

/// One remote endpoint, as configured (`[remote.NAME]`) or given with `--remote URL`.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteSpec {
    /// The config table's name, or the host for `--remote URL`.
    pub name: String,
    /// The server's base address, without `/v1` (`http://host:8080`).
    pub url: String,
    /// The model to ask for; `None`: the first the server lists.
    pub model: Option<String>,
    pub key: KeySource,
    /// Skip TLS certificate checks (`--insecure`): shown in the status bar.
    pub insecure: bool,
    pub budgets: Budgets,
}

impl RemoteSpec {
    /// Checks and normalises a base address: `http(s)://host[:port][/prefix]`, no `/v1` at the
    /// end (it is added per call), no user or password in it (keys go in `api_key_env`).
    pub fn normalize_url(url: &str) -> Result<String, String> {
        let u = url.trim().trim_end_matches('/');
        let rest = u
            .strip_prefix("http://")
            .or_else(|| u.strip_prefix("https://"))
            .ok_or_else(|| {
                format!("remote address `{u}`: it must start with http:// or https://")
            })?;
        let host = rest.split('/').next().unwrap_or("");
        if host.is_empty() {
            return Err(format!("remote address `{u}`: no host"));
        }
        if host.contains('@') {
            return Err(
                "remote address: it holds a user or password before `@`; put the key in \
                        an environment variable (--api-key-env) instead, so that it never shows \
                        in a log"
                    .into(),
            );
        }
        Ok(u.strip_suffix("/v1").unwrap_or(u).to_string())
    }

    /// `host:port` for messages.
    pub fn host(&self) -> &str {
        let rest = self.url.split("://").nth(1).unwrap_or(&self.url);
        rest.split('/').next().unwrap_or(rest)
    }
}
