//! [`App::update`], the one entry point: terminal input, worker events and clock ticks go in;
//! the state changes; [`Effect`]s for the app layer come out. Keys are dispatched in `keys.rs`.

use crossterm::event::{MouseEvent, MouseEventKind};

use crate::gpu::snapshot::WatchState;
use crate::model::protocol::Event;

use ratatui::layout::Rect;

use super::chat::{NoticeLevel, Viewport};
use super::msg::{Effect, Msg};
use super::quit_screen::{QuitState, WorkerEnd};
use super::screen;
use super::state::{App, GenState, Overlay, Progress};
use super::units;

impl App {
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
            Msg::Profile(p) => {
                self.profile.apply(p);
                Vec::new()
            }
            Msg::Tracing(file) => {
                self.profile.trace_file = file.map(|f| f.display().to_string());
                Vec::new()
            }
            Msg::Paths { typed, names } => {
                self.on_paths(&typed, &names);
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
                if !self.chat.has_user_message() {
                    self.context_used = Some(0);
                }
                self.gpu.set_device(device);
                if let Some(text) = self.pending.take() {
                    return self.send_message(text);
                }
            }
            Event::PromptProgress { done, total } => self.prompt_progress = Some((done, total)),
            Event::AnswerStarted { stats } => {
                self.prompt_progress = None;
                self.prompt_tokens = stats.prompt_tokens;
                self.context_used = Some(stats.prompt_tokens);
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
                self.streamed();
            }
            Event::Reasoning { text } => {
                self.chat.append_reasoning(&text);
                self.streamed();
            }
            Event::AnswerDone { stats, reason } => {
                self.prompt_progress = None;
                // A failed answer carries no statistics: the count stays as it was.
                if stats.prompt_tokens > 0 {
                    self.context_used = Some(stats.prompt_tokens + stats.generated_tokens);
                }
                self.gpu.apply_answer(&stats);
                self.chat.finish_answer(stats, reason);
                self.generation = GenState::Idle;
            }
            Event::ContextTrimmed(trim) => self.warn(trim.to_string()),
            Event::ContextResized {
                n_ctx,
                kept,
                dropped,
                tokens,
            } => {
                if let Some(m) = &mut self.model {
                    m.context_length = n_ctx;
                }
                self.context_used = Some(tokens);
                let size = format!("the context is now {} tokens", units::count(n_ctx as u64));
                if dropped == 0 {
                    self.info(format!(
                        "{size}; the conversation is kept ({kept} exchanges, {} tokens)",
                        units::count(tokens as u64)
                    ));
                } else {
                    self.warn(format!(
                        "{size}; the {dropped} oldest of {} exchanges no longer fit and are left out of what the model sees (the screen and the transcript keep them)",
                        kept + dropped
                    ));
                }
            }
            Event::Streams(s) => self.streams.apply(s, self.now),
            Event::Arena(a) => self.arena.apply(a),
            Event::Watchdog(w) => {
                let was_hung = self.watchdog.is_hung();
                let state = w.state;
                let device = super::watchdog::hung_device(&w);
                self.watchdog.apply(w);
                if state == WatchState::Hung && !was_hung {
                    self.chat.notice(
                        format!("the {device} stopped answering: see the banner above"),
                        NoticeLevel::Error,
                    );
                } else if was_hung && state != WatchState::Hung {
                    self.info(format!("the {device} is answering again"));
                }
            }
            Event::Telemetry(t) => self.gpu.apply(t),
            Event::Notice { context, message } => {
                self.chat
                    .notice(format!("{context}: {message}"), NoticeLevel::Warn);
            }
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
            Event::Exited { release } => {
                self.worker_alive = false;
                let end = WorkerEnd::Released(release);
                match &mut self.quit {
                    Some(q) => q.exited = Some(end),
                    None => {
                        self.generation = GenState::Idle;
                        self.worker_end = Some(end);
                        self.error(
                            "the inference worker stopped",
                            &format!(
                                "It stopped ({}). The conversation so far is saved; /save exports it. Ctrl-C quits.{}",
                                end.describe(),
                                self.log_hint()
                            ),
                        );
                    }
                }
            }
        }
        Vec::new()
    }

    fn on_worker_gone(&mut self) {
        if !self.worker_alive {
            return;
        }
        self.worker_alive = false;
        match &mut self.quit {
            Some(q) => {
                if q.exited.is_none() {
                    q.exited = Some(WorkerEnd::Vanished);
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

    /// The chat's view as the next frame draws it: its height from the screen's layout at the
    /// terminal's size (set by `Msg::Resize`), its length from the conversation now.
    pub(super) fn chat_view(&self) -> Viewport {
        let area = Rect::new(0, 0, self.size.0, self.size.1);
        match screen::layout(self, area) {
            Some(a) => self.chat.measure(a.chat, &self.theme, self.activity()),
            None => Viewport::default(),
        }
    }

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
                let view = self.chat_view();
                if up {
                    self.chat.scroll_up(3, view)
                } else {
                    self.chat.scroll_down(3, view)
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
}

impl App {
    /// A piece of the answer (or its reasoning) arrived: the generation is streaming.
    fn streamed(&mut self) {
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
}
