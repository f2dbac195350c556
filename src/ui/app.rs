//! The view state and its one entry point, [`App::update`]: terminal input, worker events and
//! clock ticks go in; the state changes; effects for the app layer (commands for the worker,
//! clipboard writes, exports) come out. Nothing here does I/O or reads a clock, so a test can
//! drive the real update path with scripted messages and snapshot the result.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Duration;

use crossterm::event::{
    Event as TermEvent, KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseEvent, MouseEventKind,
};

use crate::gpu::stats::{DeviceSummary, HostSample, WatchState};
use crate::model::protocol::{Command, Event, GenStats, ModelSource, ModelSummary, SamplerConfig};

use super::arena::ArenaPanel;
use super::chat::{Activity, Chat, NoticeLevel};
use super::commands::{self, CopyTarget, Parsed, SlashCommand};
use super::error_dialog::ErrorInfo;
use super::gpu::GpuPanel;
use super::input::InputBox;
use super::markdown;
use super::picker::{ModelEntry, Picker};
use super::quit_screen::QuitState;
use super::sampler::{self, FormOutcome, SamplerForm};
use super::streams::StreamsPanel;
use super::system_editor::SystemEditor;
use super::theme::{Theme, ThemeName};
use super::units;
use super::watchdog::WatchdogPanel;

/// Everything that can change the view.
// Worker events are the bulk of messages and are moved once, straight into `update`: boxing
// them would add an allocation per token for no gain.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Msg {
    Key(KeyEvent),
    Mouse(MouseEvent),
    Paste(String),
    Resize(u16, u16),
    /// An event from the inference worker.
    Worker(Event),
    /// The worker's event channel closed.
    WorkerGone,
    /// The clock: time since the app started.
    Tick(Duration),
    /// The host's CPU use and memory (sampled by the app once a second).
    Host(HostSample),
    /// Model discovery finished: the files found and the folders searched.
    Models {
        entries: Vec<ModelEntry>,
        searched: Vec<String>,
    },
    /// A `/save` export finished.
    Saved(Result<PathBuf, String>),
    /// SIGTERM or SIGHUP: quit as if the user asked; a second one leaves at once.
    Terminate(&'static str),
    /// Something the app layer wants the user to know (a transcript that cannot be written).
    Notice {
        text: String,
        error: bool,
    },
}

impl Msg {
    /// Maps a terminal event; `None` for events the view ignores (focus changes).
    pub fn from_terminal(e: TermEvent) -> Option<Msg> {
        match e {
            TermEvent::Key(k) => Some(Msg::Key(k)),
            TermEvent::Mouse(m) => Some(Msg::Mouse(m)),
            TermEvent::Paste(s) => Some(Msg::Paste(s)),
            TermEvent::Resize(w, h) => Some(Msg::Resize(w, h)),
            TermEvent::FocusGained | TermEvent::FocusLost => None,
        }
    }
}

/// What the app layer must do after an update.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Send a command to the worker.
    Send(Command),
    /// Put text on the clipboard (OSC 52); `what` says what it is, for the log.
    Copy { text: String, what: String },
    /// Export the conversation as Markdown (to this path, or a fresh one in the data folder).
    Export {
        path: Option<PathBuf>,
        /// `/save!`: an existing regular file may be replaced.
        overwrite: bool,
    },
    /// Look for model files (answered with [`Msg::Models`]).
    Discover,
    /// Leave now: restore the terminal, flush, hard exit (second Ctrl-C during a quit).
    ForceExit,
}

/// Which diagnostics panels are shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Panels {
    pub streams: bool,
    pub arena: bool,
    pub watchdog: bool,
    pub gpu: bool,
}

/// One of the diagnostics panels, in the order the column shows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PanelId {
    Streams,
    Arena,
    Watchdog,
    Gpu,
}

impl PanelId {
    pub const ALL: [PanelId; 4] = [
        PanelId::Streams,
        PanelId::Arena,
        PanelId::Watchdog,
        PanelId::Gpu,
    ];

    pub fn index(self) -> usize {
        self as usize
    }
}

impl Panels {
    pub fn shown(&self, id: PanelId) -> bool {
        match id {
            PanelId::Streams => self.streams,
            PanelId::Arena => self.arena,
            PanelId::Watchdog => self.watchdog,
            PanelId::Gpu => self.gpu,
        }
    }

    /// The shown panels, top to bottom.
    pub fn visible(&self) -> Vec<PanelId> {
        PanelId::ALL
            .into_iter()
            .filter(|&p| self.shown(p))
            .collect()
    }
}

impl Default for Panels {
    fn default() -> Self {
        Panels {
            streams: true,
            arena: true,
            watchdog: true,
            gpu: true,
        }
    }
}

/// How the view starts (from the config file and the command line).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub theme: ThemeName,
    /// `None`: show the diagnostics column when the terminal is at least
    /// [`AUTO_SIDEBAR_MIN_WIDTH`] columns wide.
    pub sidebar: Option<bool>,
    pub sidebar_width: u16,
    pub panels: Panels,
    pub sampler: SamplerConfig,
    pub system_prompt: String,
    /// What to call the model until the worker says what it loaded.
    pub model_label: String,
    /// How long the worker may take to drain the device on quit.
    pub drain_deadline: Duration,
    /// When the app leaves on its own if the worker has not finished quitting.
    pub quit_deadline: Duration,
    /// Messages sent before (for ↑).
    pub history: Vec<String>,
    /// Where the log goes, named in error messages.
    pub log_path: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            theme: ThemeName::Dark,
            sidebar: None,
            sidebar_width: 44,
            panels: Panels::default(),
            sampler: SamplerConfig::default(),
            system_prompt: String::new(),
            model_label: String::new(),
            drain_deadline: Duration::from_secs(5),
            quit_deadline: Duration::from_secs(7),
            history: Vec::new(),
            log_path: None,
        }
    }
}

pub const AUTO_SIDEBAR_MIN_WIDTH: u16 = 120;
/// Rows a panel grows or shrinks by per key press (Alt-+ / Alt--).
pub const PANEL_STEP: i16 = 2;
/// How far a panel's height may move from what its content wants.
pub const PANEL_EXTRA_MIN: i16 = -40;
pub const PANEL_EXTRA_MAX: i16 = 60;
pub const SIDEBAR_MIN: u16 = 28;
pub const SIDEBAR_MAX: u16 = 100;

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
    /// The code the worker exited with on its own (not asked to quit).
    pub worker_code: Option<i32>,
    /// A message sent while the model was still loading: it goes out once the model is ready.
    pub pending: Option<String>,
    /// Models found by the last discovery (kept for the next time the picker opens).
    pub models: Option<(Vec<ModelEntry>, Vec<String>)>,
    pub size: (u16, u16),
}

fn ctrl(k: &KeyEvent) -> bool {
    k.modifiers.contains(KeyModifiers::CONTROL)
}

fn alt(k: &KeyEvent) -> bool {
    k.modifiers.contains(KeyModifiers::ALT)
}

fn shift(k: &KeyEvent) -> bool {
    k.modifiers.contains(KeyModifiers::SHIFT)
}

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
            sidebar: settings.sidebar,
            sidebar_width: settings.sidebar_width.clamp(SIDEBAR_MIN, SIDEBAR_MAX),
            panels: settings.panels,
            panel_focus: None,
            panel_extra: [0; 4],
            overlay: Overlay::None,
            errors: VecDeque::new(),
            quit: None,
            worker_alive: true,
            worker_code: None,
            pending: None,
            models: None,
            size: (0, 0),
            now: Duration::ZERO,
            tick: 0,
            theme,
            settings,
        }
    }

    /// Shows a conversation reopened from a transcript (`--resume`); `model` is the name the
    /// answers were written under.
    pub fn restore(&mut self, turns: &[(String, String)], model: Option<&str>, note: &str) {
        let current = self.chat.assistant_name.clone();
        if let Some(m) = model {
            self.chat.assistant_name = m.to_string();
        }
        for (user, answer) in turns {
            self.chat.push_user(user);
            if !answer.is_empty() {
                self.chat.append_token(answer);
                self.chat.finish_restored_answer();
            }
            self.input.remember(user);
        }
        self.chat.assistant_name = current;
        self.chat.notice(note.to_string(), NoticeLevel::Info);
    }

    /// The exit code once the worker has finished quitting.
    pub fn exit_code(&self) -> Option<i32> {
        self.quit.as_ref().and_then(|q| q.exited)
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
            GenState::Waiting { .. } => Activity::Thinking(self.tick),
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

    /// The one entry point.
    pub fn update(&mut self, msg: Msg) -> Vec<Effect> {
        match msg {
            Msg::Key(k) => self.on_key(k),
            Msg::Mouse(m) => {
                self.on_mouse(m);
                Vec::new()
            }
            Msg::Paste(s) => {
                self.on_paste(&s);
                Vec::new()
            }
            Msg::Resize(w, h) => {
                self.size = (w, h);
                Vec::new()
            }
            Msg::Worker(e) => self.on_worker(e),
            Msg::WorkerGone => {
                self.on_worker_gone();
                Vec::new()
            }
            Msg::Tick(now) => {
                self.now = now;
                self.tick += 1;
                Vec::new()
            }
            Msg::Host(h) => {
                self.gpu.apply_host(h);
                Vec::new()
            }
            Msg::Models { entries, searched } => {
                if let Overlay::Picker(p) = &mut self.overlay {
                    p.searched = searched.clone();
                    p.set_entries(entries.clone());
                }
                self.models = Some((entries, searched));
                Vec::new()
            }
            Msg::Saved(r) => {
                match r {
                    Ok(p) => self.chat.notice(
                        format!("saved the conversation to {}", p.display()),
                        NoticeLevel::Info,
                    ),
                    Err(e) => self.error("saving the conversation", &e),
                }
                Vec::new()
            }
            Msg::Notice { text, error } => {
                self.chat.notice(
                    text,
                    if error {
                        NoticeLevel::Error
                    } else {
                        NoticeLevel::Info
                    },
                );
                Vec::new()
            }
            Msg::Terminate(what) => {
                if self.quit.is_some() {
                    vec![Effect::ForceExit]
                } else {
                    self.start_quit(what)
                }
            }
        }
    }

    fn error(&mut self, context: &str, message: &str) {
        self.chat
            .notice(format!("{context}: {message}"), NoticeLevel::Error);
        self.errors.push_back(ErrorInfo {
            context: context.to_string(),
            message: message.to_string(),
        });
    }

    fn warn(&mut self, message: impl Into<String>) {
        self.chat.notice(message, NoticeLevel::Warn);
    }

    fn info(&mut self, message: impl Into<String>) {
        self.chat.notice(message, NoticeLevel::Info);
    }

    // ---- worker events -------------------------------------------------------------------

    fn on_worker(&mut self, e: Event) -> Vec<Effect> {
        match e {
            Event::Progress {
                task,
                fraction,
                detail,
            } => {
                let done = fraction.is_some_and(|f| f >= 1.0);
                match self.progress.iter_mut().position(|p| p.task == task) {
                    Some(i) if done => {
                        self.progress.remove(i);
                    }
                    Some(i) => {
                        self.progress[i].fraction = fraction;
                        self.progress[i].detail = detail;
                    }
                    None if done => {}
                    None => self.progress.push(Progress {
                        task,
                        fraction,
                        detail,
                    }),
                }
            }
            Event::ModelLoaded { model, device } => {
                self.loading = None;
                self.progress.clear();
                self.chat.assistant_name = model.name.clone();
                // The first model is introduced by the welcome screen; a switch is noted in
                // the conversation, where the answers before and after it are.
                if self.model.is_some() || !self.chat.is_empty() {
                    self.info(format!(
                        "loaded {} ({}, {}) on {} in {}",
                        model.name,
                        [model.architecture.as_str(), model.quant.as_str()]
                            .iter()
                            .filter(|s| !s.is_empty())
                            .copied()
                            .collect::<Vec<_>>()
                            .join(" "),
                        units::bytes(model.file_bytes),
                        if device.name.is_empty() {
                            device.backend.clone()
                        } else {
                            format!("{} ({})", device.name, device.backend)
                        },
                        units::duration(model.load_time)
                    ));
                }
                self.model = Some(model);
                self.gpu.set_device(device);
                if let Some(text) = self.pending.take() {
                    return self.send_message(text);
                }
            }
            Event::AnswerStarted { .. } => {
                self.chat.begin_answer();
                if !matches!(self.generation, GenState::Stopping) {
                    self.generation = GenState::Streaming {
                        since: self.now,
                        tokens: 0,
                    };
                }
            }
            Event::Token { text } => {
                self.chat.append_token(&text);
                match &mut self.generation {
                    GenState::Streaming { tokens, .. } => *tokens += 1,
                    GenState::Stopping => {}
                    g => {
                        *g = GenState::Streaming {
                            since: self.now,
                            tokens: 1,
                        }
                    }
                }
            }
            Event::AnswerDone { stats, reason } => {
                self.chat.finish_answer(stats, reason);
                self.generation = GenState::Idle;
            }
            Event::ContextTrimmed { dropped_messages } => self.warn(format!(
                "the context was full: the {dropped_messages} oldest messages were dropped from what the model sees"
            )),
            Event::Streams(s) => self.streams.apply(s, self.now),
            Event::Arena(a) => self.arena.apply(a),
            Event::Watchdog(w) => {
                let was_hung = self.watchdog.is_hung();
                let state = w.state;
                self.watchdog.apply(w);
                if state == WatchState::Hung && !was_hung {
                    self.chat.notice(
                        "the GPU stopped answering: see the banner above",
                        NoticeLevel::Error,
                    );
                } else if was_hung && state != WatchState::Hung {
                    self.info("the GPU is answering again");
                }
            }
            Event::Telemetry(t) => self.gpu.apply(t),
            Event::Error { context, message } => {
                // A failed request ends what was waiting on it; a started answer still gets
                // its AnswerDone from the worker.
                if matches!(self.generation, GenState::Waiting { .. }) {
                    self.generation = GenState::Idle;
                }
                if self.loading.is_some() {
                    self.loading = None;
                    self.progress.clear();
                    // The message waiting for the model goes back into the box.
                    if let Some(text) = self.pending.take() {
                        if self.input.is_empty() {
                            self.input.set_text(&text);
                        }
                        self.chat.notice(
                            "the model did not load; your message is back in the box",
                            NoticeLevel::Warn,
                        );
                    }
                }
                self.error(&context, &message);
            }
            Event::QuitStep(step) => {
                let q = self.quit.get_or_insert_with(|| QuitState {
                    started: self.now,
                    reason: "worker".into(),
                    ..QuitState::default()
                });
                q.step(step);
            }
            Event::Exited { code } => {
                self.worker_alive = false;
                match &mut self.quit {
                    Some(q) => q.exited = Some(code),
                    None => {
                        self.generation = GenState::Idle;
                        self.worker_code = Some(code);
                        self.error(
                            "the inference worker stopped",
                            &format!(
                                "It exited with code {code}. The conversation so far is saved; /save exports it. Ctrl-C quits.{}",
                                self.log_hint()
                            ),
                        );
                    }
                }
            }
        }
        Vec::new()
    }

    fn log_hint(&self) -> String {
        match &self.settings.log_path {
            Some(p) => format!(" The log is {}.", p.display()),
            None => String::new(),
        }
    }

    fn on_worker_gone(&mut self) {
        if !self.worker_alive {
            return;
        }
        self.worker_alive = false;
        match &mut self.quit {
            Some(q) => {
                if q.exited.is_none() {
                    q.exited = Some(1);
                }
            }
            None => {
                self.generation = GenState::Idle;
                let hint = self.log_hint();
                self.error(
                    "the inference worker stopped unexpectedly",
                    &format!(
                        "No more answers can be generated. The conversation so far is saved; /save exports it. Ctrl-C quits.{hint}"
                    ),
                );
            }
        }
    }

    // ---- input ----------------------------------------------------------------------------

    fn on_mouse(&mut self, m: MouseEvent) {
        let up = match m.kind {
            MouseEventKind::ScrollUp => true,
            MouseEventKind::ScrollDown => false,
            _ => return,
        };
        match &mut self.overlay {
            Overlay::Help { scroll } => {
                *scroll = if up {
                    scroll.saturating_sub(3)
                } else {
                    scroll.saturating_add(3)
                }
            }
            Overlay::Picker(p) => {
                if up {
                    p.up()
                } else {
                    p.down()
                }
            }
            _ => {
                if up {
                    self.chat.scroll_up(3)
                } else {
                    self.chat.scroll_down(3)
                }
            }
        }
    }

    fn on_paste(&mut self, s: &str) {
        if self.quit.is_some() {
            return;
        }
        match &mut self.overlay {
            Overlay::System(ed) => ed.input.paste(s),
            Overlay::Picker(p) => {
                for c in s.lines().next().unwrap_or("").chars() {
                    p.type_char(c);
                }
            }
            Overlay::Sampler(f) => {
                for c in s.trim().chars() {
                    f.type_char(c);
                }
            }
            Overlay::Help { .. } | Overlay::None => {
                self.overlay = Overlay::None;
                self.input.paste(s);
                if s.len() >= 16 * 1024 {
                    let lines = s.lines().count();
                    self.info(format!(
                        "pasted {} ({} line{}) into the message box; Enter sends it as one message",
                        units::bytes(s.len() as u64),
                        units::count(lines as u64),
                        if lines == 1 { "" } else { "s" }
                    ));
                }
            }
        }
    }

    fn on_key(&mut self, k: KeyEvent) -> Vec<Effect> {
        if k.kind == KeyEventKind::Release {
            return Vec::new();
        }
        let is_ctrl_c = ctrl(&k) && matches!(k.code, KeyCode::Char('c' | 'C'));
        if self.quit.is_some() {
            // During a quit only the second Ctrl-C matters: it leaves without waiting.
            return if is_ctrl_c {
                vec![Effect::ForceExit]
            } else {
                Vec::new()
            };
        }
        if is_ctrl_c {
            // The first Ctrl-C stops an answer, as in llama.cpp. If the stop was already asked
            // for, or the GPU is hung (the stop cannot be confirmed), it quits instead, so
            // that two presses always get the user out.
            let stoppable = matches!(
                self.generation,
                GenState::Waiting { .. } | GenState::Streaming { .. }
            );
            return if stoppable && self.worker_alive && !self.watchdog.is_hung() {
                self.stop()
            } else {
                self.start_quit("Ctrl-C")
            };
        }
        if !self.errors.is_empty() && matches!(k.code, KeyCode::Enter | KeyCode::Esc) {
            self.errors.pop_front();
            return Vec::new();
        }
        if let Some(fx) = self.overlay_key(k) {
            return fx;
        }
        if let Some(fx) = self.global_key(k) {
            return fx;
        }
        match k.code {
            KeyCode::Esc => {
                if self.generation.is_busy() {
                    return self.stop();
                }
                self.chat.follow();
            }
            KeyCode::Char('d') if ctrl(&k) && self.input.is_empty() => {
                return self.start_quit("Ctrl-D");
            }
            KeyCode::Enter if alt(&k) || shift(&k) => self.input.newline(),
            KeyCode::Char('j') if ctrl(&k) => self.input.newline(),
            KeyCode::Enter => return self.submit(),
            KeyCode::Up if k.modifiers.is_empty() => {
                if !self.input.history_prev() {
                    self.input.key(k);
                }
            }
            KeyCode::Down if k.modifiers.is_empty() => {
                if !self.input.history_next() {
                    self.input.key(k);
                }
            }
            _ => {
                self.input.key(k);
            }
        }
        Vec::new()
    }

    /// Keys for the open window; `None` lets the key through to the chat.
    fn overlay_key(&mut self, k: KeyEvent) -> Option<Vec<Effect>> {
        match &mut self.overlay {
            Overlay::None => None,
            Overlay::Help { scroll } => {
                let max = super::help::len() as u16;
                match k.code {
                    KeyCode::Esc | KeyCode::F(1) => self.overlay = Overlay::None,
                    KeyCode::Up => *scroll = scroll.saturating_sub(1),
                    KeyCode::Down => *scroll = (*scroll + 1).min(max),
                    KeyCode::PageUp => *scroll = scroll.saturating_sub(10),
                    KeyCode::PageDown => *scroll = (*scroll + 10).min(max),
                    KeyCode::Home => *scroll = 0,
                    // Anything else closes help and goes on to the chat, so typing is never lost.
                    _ => {
                        self.overlay = Overlay::None;
                        return None;
                    }
                }
                Some(Vec::new())
            }
            Overlay::Picker(p) => {
                match k.code {
                    KeyCode::Esc | KeyCode::F(2) => self.overlay = Overlay::None,
                    KeyCode::Up => p.up(),
                    KeyCode::Down | KeyCode::Tab => p.down(),
                    KeyCode::PageUp => p.page(-5),
                    KeyCode::PageDown => p.page(5),
                    KeyCode::Backspace => p.backspace(),
                    KeyCode::Char('u') if ctrl(&k) => p.filter.clear(),
                    KeyCode::Char(c) if !ctrl(&k) && !alt(&k) => p.type_char(c),
                    KeyCode::Enter => {
                        let Some(entry) = p.selected_entry().cloned() else {
                            return Some(Vec::new());
                        };
                        return Some(self.pick(entry));
                    }
                    _ => {}
                }
                Some(Vec::new())
            }
            Overlay::Sampler(f) => {
                match k.code {
                    KeyCode::Esc | KeyCode::F(3) => self.overlay = Overlay::None,
                    KeyCode::Up | KeyCode::BackTab => f.up(),
                    KeyCode::Down | KeyCode::Tab => f.down(),
                    KeyCode::Backspace => f.backspace(),
                    KeyCode::Char('u') if ctrl(&k) => f.clear_field(),
                    KeyCode::Char(c) if !ctrl(&k) && !alt(&k) => f.type_char(c),
                    KeyCode::Enter => {
                        if let FormOutcome::Apply(cfg) = f.apply(&self.sampler) {
                            self.overlay = Overlay::None;
                            return Some(self.set_sampler(cfg));
                        }
                    }
                    _ => {}
                }
                Some(Vec::new())
            }
            Overlay::System(ed) => {
                match k.code {
                    KeyCode::Esc | KeyCode::F(4) => self.overlay = Overlay::None,
                    KeyCode::Enter if alt(&k) || shift(&k) => ed.input.newline(),
                    KeyCode::Char('j') if ctrl(&k) => ed.input.newline(),
                    KeyCode::Enter => {
                        let text = ed.input.text();
                        self.overlay = Overlay::None;
                        return Some(self.set_system(text));
                    }
                    _ => {
                        ed.input.key(k);
                    }
                }
                Some(Vec::new())
            }
        }
    }

    /// Keys that work everywhere outside a window: F-keys, Alt combinations, scrolling.
    fn global_key(&mut self, k: KeyEvent) -> Option<Vec<Effect>> {
        let page = self.chat.viewport().height.saturating_sub(2).max(1);
        match k.code {
            KeyCode::F(1) => self.overlay = Overlay::Help { scroll: 0 },
            KeyCode::F(2) => return Some(self.open_picker()),
            KeyCode::F(3) => self.overlay = Overlay::Sampler(SamplerForm::new(&self.sampler)),
            KeyCode::F(4) => {
                self.overlay = Overlay::System(Box::new(SystemEditor::new(
                    &self.system_prompt,
                    &self.theme,
                )))
            }
            KeyCode::F(5) => self.toggle_panel(|p| &mut p.streams),
            KeyCode::F(6) => self.toggle_panel(|p| &mut p.arena),
            KeyCode::F(7) => self.toggle_panel(|p| &mut p.watchdog),
            KeyCode::F(8) => self.toggle_panel(|p| &mut p.gpu),
            KeyCode::F(9) => {
                let shown = self.sidebar_visible(self.size.0);
                self.sidebar = Some(!shown);
            }
            KeyCode::Left if alt(&k) => {
                self.sidebar = Some(true);
                self.sidebar_width = self.sidebar_width.saturating_sub(4).max(SIDEBAR_MIN);
            }
            KeyCode::Right if alt(&k) => {
                self.sidebar = Some(true);
                self.sidebar_width = (self.sidebar_width + 4).min(SIDEBAR_MAX);
            }
            KeyCode::Up if alt(&k) => self.focus_panel(-1),
            KeyCode::Down if alt(&k) => self.focus_panel(1),
            KeyCode::Char('+' | '=') if alt(&k) => self.resize_panel(PANEL_STEP),
            KeyCode::Char('-' | '_') if alt(&k) => self.resize_panel(-PANEL_STEP),
            KeyCode::Char('0') if alt(&k) => self.panel_extra = [0; 4],
            KeyCode::PageUp => self.chat.scroll_up(page),
            KeyCode::PageDown => self.chat.scroll_down(page),
            KeyCode::Up if ctrl(&k) => self.chat.scroll_up(1),
            KeyCode::Down if ctrl(&k) => self.chat.scroll_down(1),
            KeyCode::Home if ctrl(&k) => self.chat.scroll_to_top(),
            KeyCode::End if ctrl(&k) => self.chat.follow(),
            KeyCode::Char('r' | 'R') if alt(&k) => return Some(self.regenerate()),
            KeyCode::Char('l' | 'L') if alt(&k) => return Some(self.clear()),
            KeyCode::Char('y' | 'Y') if alt(&k) => return Some(self.copy(CopyTarget::Answer)),
            KeyCode::Char('c' | 'C') if alt(&k) => return Some(self.copy(CopyTarget::Code(None))),
            _ => return None,
        }
        Some(Vec::new())
    }

    /// Moves the resize focus `step` panels down (negative: up) among the shown ones, showing
    /// the diagnostics column if it was hidden.
    fn focus_panel(&mut self, step: isize) {
        let shown = self.panels.visible();
        if shown.is_empty() {
            return;
        }
        self.sidebar = Some(true);
        let next = match self
            .panel_focus
            .and_then(|f| shown.iter().position(|&p| p == f))
        {
            Some(i) => (i as isize + step).rem_euclid(shown.len() as isize) as usize,
            // The first press picks the top panel (Alt-↓) or the bottom one (Alt-↑).
            None if step > 0 => 0,
            None => shown.len() - 1,
        };
        self.panel_focus = Some(shown[next]);
    }

    /// Makes the focused panel `rows` taller (negative: shorter); with no focus yet, the top
    /// panel shown.
    fn resize_panel(&mut self, rows: i16) {
        let focus = match self.panel_focus.filter(|&f| self.panels.shown(f)) {
            Some(f) => f,
            None => match self.panels.visible().first() {
                Some(&f) => f,
                None => return,
            },
        };
        self.panel_focus = Some(focus);
        self.sidebar = Some(true);
        let e = &mut self.panel_extra[focus.index()];
        *e = (*e + rows).clamp(PANEL_EXTRA_MIN, PANEL_EXTRA_MAX);
    }

    fn toggle_panel(&mut self, f: impl FnOnce(&mut Panels) -> &mut bool) {
        let b = f(&mut self.panels);
        *b = !*b;
        // Showing a panel shows the column it lives in.
        if *b {
            self.sidebar = Some(true);
        }
    }

    // ---- actions ----------------------------------------------------------------------------

    fn submit(&mut self) -> Vec<Effect> {
        let text = self.input.text();
        if text.trim().is_empty() {
            return Vec::new();
        }
        match commands::parse(&text) {
            Parsed::Message(m) => {
                if self.model.is_none()
                    && self.loading.is_some()
                    && self.worker_alive
                    && self.pending.is_none()
                {
                    // Sent once the model is ready; back in the box if it fails to load.
                    self.input.take();
                    self.input.remember(&text);
                    self.info(format!(
                        "{} is still loading; your message goes out as soon as it is ready",
                        self.loading.as_deref().unwrap_or("the model")
                    ));
                    self.pending = Some(m);
                    return Vec::new();
                }
                if let Some(why) = self.cannot_generate() {
                    // The text stays in the box: nothing typed is lost.
                    self.warn(why);
                    return Vec::new();
                }
                self.input.take();
                self.input.remember(&text);
                self.send_message(m)
            }
            Parsed::Command(c) => {
                self.input.take();
                self.input.remember(&text);
                self.run_command(c)
            }
            Parsed::Invalid(why) => {
                self.input.remember(&text);
                self.warn(why);
                Vec::new()
            }
        }
    }

    fn send_message(&mut self, m: String) -> Vec<Effect> {
        self.chat.push_user(&m);
        self.chat.follow();
        self.generation = GenState::Waiting { since: self.now };
        vec![Effect::Send(Command::Generate { user: m })]
    }

    fn cannot_generate(&self) -> Option<String> {
        if !self.worker_alive {
            Some("the inference worker has stopped; no more answers can be generated".into())
        } else if self.generation.is_busy() {
            Some("an answer is still being generated: wait for it or press Esc to stop it (your message stays in the box)".into())
        } else if self.model.is_none() {
            Some(match &self.loading {
                Some(m) => format!(
                    "{m} is still loading and a message is already waiting for it; this one stays in the box"
                ),
                None => "no model is loaded: pick one with /model".into(),
            })
        } else {
            None
        }
    }

    fn run_command(&mut self, c: SlashCommand) -> Vec<Effect> {
        match c {
            SlashCommand::Clear => self.clear(),
            SlashCommand::Regen => self.regenerate(),
            SlashCommand::System(None) => {
                self.overlay = Overlay::System(Box::new(SystemEditor::new(
                    &self.system_prompt,
                    &self.theme,
                )));
                Vec::new()
            }
            SlashCommand::System(Some(t)) => self.set_system(t),
            SlashCommand::Set(None) => {
                self.overlay = Overlay::Sampler(SamplerForm::new(&self.sampler));
                Vec::new()
            }
            SlashCommand::Set(Some((key, value))) => {
                let mut cfg = self.sampler.clone();
                match sampler::set(&mut cfg, &key, &value) {
                    Ok(()) => self.set_sampler(cfg),
                    Err(e) => {
                        self.warn(e);
                        Vec::new()
                    }
                }
            }
            SlashCommand::Model(None) => self.open_picker(),
            SlashCommand::Model(Some(path)) => self.load(path),
            SlashCommand::Save { path, overwrite } => vec![Effect::Export { path, overwrite }],
            SlashCommand::Copy(t) => self.copy(t),
            SlashCommand::Help => {
                self.overlay = Overlay::Help { scroll: 0 };
                Vec::new()
            }
            SlashCommand::Quit => self.start_quit("/quit"),
        }
    }

    fn stop(&mut self) -> Vec<Effect> {
        if !self.generation.is_busy() {
            return Vec::new();
        }
        self.generation = GenState::Stopping;
        vec![Effect::Send(Command::Stop)]
    }

    fn clear(&mut self) -> Vec<Effect> {
        if self.generation.is_busy() {
            self.warn("an answer is being generated: stop it first (Esc)");
            return Vec::new();
        }
        self.chat.clear();
        self.info("conversation cleared (the system prompt stays)");
        vec![Effect::Send(Command::Clear)]
    }

    fn regenerate(&mut self) -> Vec<Effect> {
        if let Some(why) = self.cannot_generate() {
            self.warn(why);
            return Vec::new();
        }
        if !self.chat.has_user_message() {
            self.warn("nothing to regenerate yet: ask something first");
            return Vec::new();
        }
        self.chat.drop_last_answer();
        self.chat.follow();
        self.generation = GenState::Waiting { since: self.now };
        vec![Effect::Send(Command::Regenerate)]
    }

    fn set_system(&mut self, text: String) -> Vec<Effect> {
        let text = text.trim().to_string();
        if text == self.system_prompt {
            return Vec::new();
        }
        self.system_prompt = text.clone();
        if text.is_empty() {
            self.info("system prompt removed");
        } else {
            self.info(format!(
                "system prompt set ({} characters); it applies from the next answer",
                text.chars().count()
            ));
        }
        vec![Effect::Send(Command::SetSystem(text))]
    }

    fn set_sampler(&mut self, cfg: SamplerConfig) -> Vec<Effect> {
        let changed: Vec<String> = sampler::FIELDS
            .iter()
            .filter(|f| (f.get)(&cfg) != (f.get)(&self.sampler))
            .map(|f| format!("{} = {}", f.name, (f.get)(&cfg)))
            .collect();
        if changed.is_empty() {
            self.info("sampler settings unchanged");
            return Vec::new();
        }
        self.sampler = cfg.clone();
        self.info(format!("sampler: {}", changed.join(", ")));
        vec![Effect::Send(Command::SetSampler(cfg))]
    }

    fn open_picker(&mut self) -> Vec<Effect> {
        let current = self.model.as_ref().and_then(|m| m.path.clone());
        let mut picker = Picker::new(None, current);
        if let Some((entries, searched)) = &self.models {
            picker.searched = searched.clone();
            picker.set_entries(entries.clone());
        }
        self.overlay = Overlay::Picker(picker);
        vec![Effect::Discover]
    }

    fn pick(&mut self, entry: ModelEntry) -> Vec<Effect> {
        if let Err(why) = &entry.header {
            // A file whose header cannot be read would fail to load too: say why now and
            // keep the model that is loaded.
            self.error(
                &format!("cannot load {}", entry.path.display()),
                &format!("{why}. The current model stays loaded."),
            );
            return Vec::new();
        }
        self.overlay = Overlay::None;
        self.load(entry.path)
    }

    fn load(&mut self, path: PathBuf) -> Vec<Effect> {
        if self.generation.is_busy() {
            self.warn("an answer is being generated: stop it first (Esc), then load the model");
            return Vec::new();
        }
        if !self.worker_alive {
            self.warn("the inference worker has stopped; no model can be loaded");
            return Vec::new();
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        self.info(format!("loading {}", path.display()));
        self.loading = Some(name);
        vec![Effect::Send(Command::LoadModel(ModelSource::File(path)))]
    }

    fn copy(&mut self, target: CopyTarget) -> Vec<Effect> {
        let Some(answer) = self.chat.last_answer().map(str::to_string) else {
            self.warn("there is no answer to copy yet");
            return Vec::new();
        };
        let (text, what) = match target {
            CopyTarget::Answer => (answer, "the last answer".to_string()),
            CopyTarget::Code(n) => {
                let blocks = markdown::code_blocks(&answer);
                let count = blocks.len();
                let pick = match n {
                    None => count.checked_sub(1),
                    Some(n) => (n <= count).then(|| n - 1),
                };
                match pick {
                    Some(i) => (
                        blocks[i].clone(),
                        format!("code block {} of {count}", i + 1),
                    ),
                    None if count == 0 => {
                        self.warn("the last answer has no code block");
                        return Vec::new();
                    }
                    None => {
                        self.warn(format!("the last answer has {count} code blocks"));
                        return Vec::new();
                    }
                }
            }
        };
        self.info(format!(
            "copied {what} ({}) to the clipboard (OSC 52: the terminal must allow it)",
            units::bytes(text.len() as u64)
        ));
        vec![Effect::Copy { text, what }]
    }

    fn start_quit(&mut self, reason: &str) -> Vec<Effect> {
        if self.quit.is_some() {
            return Vec::new();
        }
        self.overlay = Overlay::None;
        let mut q = QuitState {
            started: self.now,
            reason: reason.to_string(),
            ..QuitState::default()
        };
        if !self.worker_alive {
            q.exited = Some(self.worker_code.unwrap_or(1));
            self.quit = Some(q);
            return Vec::new();
        }
        self.quit = Some(q);
        let mut fx = Vec::new();
        if self.generation.is_busy() {
            fx.push(Effect::Send(Command::Stop));
        }
        fx.push(Effect::Send(Command::Quit {
            drain_deadline: self.settings.drain_deadline,
        }));
        fx
    }

    /// The answer statistics of the last finished answer, if any.
    pub fn last_stats(&self) -> Option<&GenStats> {
        self.chat.entries.iter().rev().find_map(|e| match &e.kind {
            super::chat::EntryKind::Assistant { stats: Some(s), .. } => Some(s),
            _ => None,
        })
    }
}
