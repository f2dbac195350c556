//! The whole view state, [`App`]: what the screen shows and nothing else. It changes only
//! through [`App::update`] (in `update.rs`, with key dispatch in `keys.rs` and the actions both
//! share in `actions.rs`); `screen.rs` draws it. Nothing here does I/O or reads a
//! clock.

use std::collections::VecDeque;
use std::time::Duration;

use crate::gpu::snapshot::DeviceSummary;
use crate::model::protocol::{GenStats, ModelSummary, SamplerConfig};

use super::arena::ArenaPanel;
use super::chat::{Activity, Chat, EntryKind, NoticeLevel};
use super::error_dialog::ErrorInfo;
use super::gpu::GpuPanel;
use super::input::InputBox;
use super::picker::{ModelEntry, Picker};
use super::profile::ProfilePanel;
use super::quit_screen::{QuitState, WorkerEnd};
use super::sampler::SamplerForm;
use super::settings::{
    AUTO_SIDEBAR_MIN_WIDTH, PanelId, Panels, SIDEBAR_MAX, SIDEBAR_MIN, Settings,
};
use super::streams::StreamsPanel;
use super::system_editor::SystemEditor;
use super::theme::Theme;
use super::units;
use super::watchdog::WatchdogPanel;

/// Where the answer in progress stands.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GenState {
    Idle,
    /// Sent; waiting for the first token.
    Waiting {
        since: Duration,
    },
    Streaming {
        since: Duration,
        tokens: usize,
    },
    /// Stop requested; waiting for `AnswerDone`.
    Stopping,
}

impl GenState {
    pub fn is_busy(&self) -> bool {
        !matches!(self, GenState::Idle)
    }
}

/// A long task the worker reports progress on.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    pub task: String,
    pub fraction: Option<f32>,
    pub detail: String,
}

/// The window over the chat, if any.
#[derive(Clone, Debug)]
pub enum Overlay {
    None,
    Help { scroll: u16 },
    Picker(Picker),
    Sampler(SamplerForm),
    System(Box<SystemEditor>),
}

/// The whole view state.
#[derive(Debug)]
pub struct App {
    pub theme: Theme,
    pub settings: Settings,
    /// Time since start, from the last tick.
    pub now: Duration,
    /// Ticks so far (animation frame).
    pub tick: u64,
    pub chat: Chat,
    pub input: InputBox,
    pub generation: GenState,
    pub model: Option<ModelSummary>,
    /// The model being loaded, if any.
    pub loading: Option<String>,
    pub progress: Vec<Progress>,
    pub sampler: SamplerConfig,
    pub system_prompt: String,
    pub streams: StreamsPanel,
    pub arena: ArenaPanel,
    pub watchdog: WatchdogPanel,
    pub gpu: GpuPanel,
    /// F10: each op's share of a step (`profile.rs`).
    pub profile: ProfilePanel,
    pub sidebar: Option<bool>,
    pub sidebar_width: u16,
    pub panels: Panels,
    /// The panel that Alt-+ / Alt-- resize, once the user has picked one (Alt-↑ / Alt-↓).
    pub panel_focus: Option<PanelId>,
    /// Rows added to (or taken from) each panel's own height, by [`PanelId::index`].
    pub panel_extra: [i16; 4],
    pub overlay: Overlay,
    pub errors: VecDeque<ErrorInfo>,
    pub quit: Option<QuitState>,
    pub worker_alive: bool,
    /// How the worker ended on its own (not asked to quit).
    pub worker_end: Option<WorkerEnd>,
    /// A message sent while the model was still loading: it goes out once the model is ready.
    pub pending: Option<String>,
    /// Models found by the last discovery (kept for the next time the picker opens).
    pub models: Option<(Vec<ModelEntry>, Vec<String>)>,
    pub size: (u16, u16),
    /// When Ctrl-C was pressed at rest: a second press within [`QUIT_CONFIRM`] quits.
    pub quit_armed: Option<Duration>,
    /// Tokens of the conversation in the context after the last answer (None: not known, as
    /// after `--resume` until the next answer).
    pub context_used: Option<usize>,
    /// The prompt's tokens counted when the answer in progress started.
    pub prompt_tokens: usize,
    /// Prompt processing of the answer being prepared: tokens done of those to compute.
    pub prompt_progress: Option<(usize, usize)>,
    /// Alt-L was pressed once: a second Alt-L clears the conversation, any other key keeps it.
    pub clear_armed: bool,
    /// A one-line note on the footer until the next key (Tab's list of matches).
    pub hint: Option<String>,
}

/// An exchange reopened from a transcript (`--resume`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reopened {
    pub user: String,
    /// The reasoning before the answer (empty for a model that does not reason).
    pub reasoning: String,
    pub answer: String,
    /// The stats line the transcript kept, shown under the answer.
    pub summary: Option<String>,
}

/// How long after a first Ctrl-C at rest a second one quits.
pub const QUIT_CONFIRM: Duration = Duration::from_secs(2);

impl App {
    pub fn new(settings: Settings) -> App {
        let theme = Theme::new(settings.theme);
        let input = InputBox::new(
            "Ask anything · /help for commands",
            settings.history.clone(),
            &theme,
        );
        let label = if settings.model_label.is_empty() {
            "assistant".to_string()
        } else {
            settings.model_label.clone()
        };
        App {
            chat: Chat::new(&label),
            input,
            generation: GenState::Idle,
            model: None,
            loading: (!settings.model_label.is_empty()).then(|| settings.model_label.clone()),
            progress: Vec::new(),
            sampler: settings.sampler.clone(),
            system_prompt: settings.system_prompt.clone(),
            streams: StreamsPanel::default(),
            arena: ArenaPanel::default(),
            watchdog: WatchdogPanel::default(),
            gpu: GpuPanel::default(),
            profile: ProfilePanel::default(),
            sidebar: settings.sidebar,
            sidebar_width: settings.sidebar_width.clamp(SIDEBAR_MIN, SIDEBAR_MAX),
            panels: settings.panels,
            panel_focus: None,
            panel_extra: [0; 4],
            overlay: Overlay::None,
            errors: VecDeque::new(),
            quit: None,
            worker_alive: true,
            worker_end: None,
            pending: None,
            models: None,
            size: (0, 0),
            quit_armed: None,
            context_used: None,
            prompt_tokens: 0,
            prompt_progress: None,
            clear_armed: false,
            hint: None,
            now: Duration::ZERO,
            tick: 0,
            theme,
            settings,
        }
    }

    /// Shows a conversation reopened from a transcript (`--resume`); `model` is the name the
    /// answers were written under.
    pub fn restore(&mut self, turns: &[(String, String)], model: Option<&str>, note: &str) {
        let with: Vec<_> = turns
            .iter()
            .map(|(u, a)| Reopened {
                user: u.clone(),
                answer: a.clone(),
                ..Reopened::default()
            })
            .collect();
        self.restore_with_stats(&with, model, note);
    }

    /// As [`App::restore`], with each answer's reasoning and its stats line as the transcript
    /// kept them.
    pub fn restore_with_stats(&mut self, turns: &[Reopened], model: Option<&str>, note: &str) {
        let current = self.chat.assistant_name.clone();
        if let Some(m) = model {
            self.chat.assistant_name = m.to_string();
        }
        for Reopened {
            user,
            reasoning,
            answer,
            summary,
        } in turns
        {
            self.chat.push_user(user);
            if !answer.is_empty() || !reasoning.is_empty() {
                self.chat.append_reasoning(reasoning);
                self.chat.append_token(answer);
                self.chat.finish_restored_answer();
                if let Some(s) = summary {
                    self.chat.notice(s.clone(), NoticeLevel::Info);
                }
            }
            self.input.remember(user);
        }
        self.chat.assistant_name = current;
        self.chat.notice(note.to_string(), NoticeLevel::Info);
        // Counted again by the next answer.
        self.context_used = None;
    }

    /// The exit code once the worker has finished quitting.
    pub fn worker_ended(&self) -> Option<WorkerEnd> {
        self.quit.as_ref().and_then(|q| q.exited)
    }

    /// Whether a first Ctrl-C at rest is waiting for its second press.
    pub fn quit_confirm_pending(&self) -> bool {
        self.quit_armed
            .is_some_and(|t| self.now.saturating_sub(t) <= QUIT_CONFIRM)
    }

    pub fn is_quitting(&self) -> bool {
        self.quit.is_some()
    }

    pub fn device(&self) -> Option<&DeviceSummary> {
        self.gpu.device.as_ref()
    }

    /// Whether the diagnostics column is shown at `width` columns.
    pub fn sidebar_visible(&self, width: u16) -> bool {
        self.sidebar.unwrap_or(width >= AUTO_SIDEBAR_MIN_WIDTH)
    }

    pub fn activity(&self) -> Activity {
        match self.generation {
            GenState::Idle => Activity::Idle,
            GenState::Waiting { .. } => Activity::Thinking(
                self.tick,
                self.prompt_rate().map(|(done, total, rate, left)| {
                    let mut s = format!(
                        "reading the prompt: {} / {} tokens · {}",
                        units::count(done as u64),
                        units::count(total as u64),
                        units::rate(rate, "t/s")
                    );
                    if let Some(l) = left {
                        s.push_str(&format!(" · {} left", units::duration_coarse(l)));
                    }
                    s
                }),
            ),
            GenState::Streaming { .. } | GenState::Stopping => Activity::Streaming(self.tick),
        }
    }

    /// Live generation rate of the answer in progress.
    pub fn live_rate(&self) -> Option<(usize, f64)> {
        match self.generation {
            GenState::Streaming { since, tokens } => {
                let dt = self.now.saturating_sub(since).as_secs_f64();
                Some((tokens, if dt > 0.0 { tokens as f64 / dt } else { 0.0 }))
            }
            _ => None,
        }
    }

    /// How full the context is: tokens of the conversation (with the answer streaming in) and
    /// the context's size; `None` without a model.
    pub fn context_fill(&self) -> Option<(Option<usize>, usize)> {
        let n_ctx = self.model.as_ref()?.context_length;
        let used = match self.generation {
            GenState::Streaming { tokens, .. } => Some(self.prompt_tokens + tokens),
            _ => self.context_used,
        };
        Some((used, n_ctx))
    }

    /// Prompt processing in progress: tokens done, tokens in all, tokens a second, time left.
    pub fn prompt_rate(&self) -> Option<(usize, usize, f64, Option<Duration>)> {
        let GenState::Waiting { since } = self.generation else {
            return None;
        };
        let (done, total) = self.prompt_progress?;
        let dt = self.now.saturating_sub(since).as_secs_f64();
        let rate = if dt > 0.0 { done as f64 / dt } else { 0.0 };
        let left =
            (rate > 0.0).then(|| Duration::from_secs_f64(total.saturating_sub(done) as f64 / rate));
        Some((done, total, rate, left))
    }

    /// The answer statistics of the last finished answer, if any.
    pub fn last_stats(&self) -> Option<&GenStats> {
        self.chat.entries.iter().rev().find_map(|e| match &e.kind {
            EntryKind::Assistant { stats: Some(s), .. } => Some(s),
            _ => None,
        })
    }

    // ---- notes in the conversation -----------------------------------------------------------

    pub(super) fn error(&mut self, context: &str, message: &str) {
        self.chat
            .notice(format!("{context}: {message}"), NoticeLevel::Error);
        self.errors.push_back(ErrorInfo {
            context: context.to_string(),
            message: message.to_string(),
        });
    }

    pub(super) fn warn(&mut self, message: impl Into<String>) {
        self.chat.notice(message, NoticeLevel::Warn);
    }

    pub(super) fn info(&mut self, message: impl Into<String>) {
        self.chat.notice(message, NoticeLevel::Info);
    }

    pub(super) fn log_hint(&self) -> String {
        match &self.settings.log_path {
            Some(p) => format!(" The log is {}.", p.display()),
            None => String::new(),
        }
    }
}
