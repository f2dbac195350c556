//! What the keys and the slash commands do: sending, stopping, clearing, loading, copying,
//! quitting, and the diagnostics column's layout. Shared by `keys.rs` and `update.rs`.

use std::path::PathBuf;

use crate::model::protocol::{Command, ModelSource, SamplerConfig};

use super::commands::{self, CopyTarget, Parsed, SlashCommand};
use super::markdown;
use super::msg::{Effect, TraceRequest};
use super::picker::{ModelEntry, Picker};
use super::quit_screen::{QuitState, WorkerEnd};
use super::sampler::{self, SamplerForm};
use super::settings::{PANEL_EXTRA_MAX, PANEL_EXTRA_MIN, Panels};
use super::state::{App, GenState, Overlay};
use super::system_editor::SystemEditor;
use super::units;

impl App {
    /// F10: the Profile panel in the column, full screen, hidden; profiling runs while shown.
    pub(super) fn toggle_profile(&mut self) -> Vec<Effect> {
        let was = self.profile.mode != super::profile::ProfileMode::Hidden;
        let now = self.profile.cycle();
        if now && self.profile.mode == super::profile::ProfileMode::Column {
            self.sidebar = Some(true);
        }
        if was == now {
            return Vec::new();
        }
        vec![Effect::Trace(TraceRequest::Profile(now))]
    }

    /// Moves the resize focus `step` panels down (negative: up) among the shown ones, showing
    /// the diagnostics column if it was hidden.
    pub(super) fn focus_panel(&mut self, step: isize) {
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
    pub(super) fn resize_panel(&mut self, rows: i16) {
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

    pub(super) fn toggle_panel(&mut self, f: impl FnOnce(&mut Panels) -> &mut bool) {
        let b = f(&mut self.panels);
        *b = !*b;
        // Showing a panel shows the column it lives in.
        if *b {
            self.sidebar = Some(true);
        }
    }

    pub(super) fn submit(&mut self) -> Vec<Effect> {
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

    pub(super) fn send_message(&mut self, m: String) -> Vec<Effect> {
        self.prompt_progress = None;
        self.chat.push_user(&m);
        self.chat.follow();
        self.generation = GenState::Waiting { since: self.now };
        vec![Effect::Send(Command::Generate { user: m })]
    }

    pub(super) fn cannot_generate(&self) -> Option<String> {
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

    pub(super) fn run_command(&mut self, c: SlashCommand) -> Vec<Effect> {
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
            SlashCommand::Context(n) => self.set_context(n),
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
            SlashCommand::KeepSettings => vec![Effect::KeepSettings(self.sampler.clone())],
            SlashCommand::Model(None) => self.open_picker(),
            SlashCommand::Model(Some(path)) => self.load(path),
            SlashCommand::Save { path, overwrite } => vec![Effect::Export { path, overwrite }],
            SlashCommand::Trace(Some(path)) => vec![Effect::Trace(TraceRequest::FileOn(path))],
            SlashCommand::Trace(None) => vec![Effect::Trace(TraceRequest::FileOff)],
            SlashCommand::Copy(t) => self.copy(t),
            SlashCommand::Help => {
                self.overlay = Overlay::Help { scroll: 0 };
                Vec::new()
            }
            SlashCommand::Quit => self.start_quit("/quit"),
        }
    }

    pub(super) fn stop(&mut self) -> Vec<Effect> {
        if !self.generation.is_busy() {
            return Vec::new();
        }
        self.generation = GenState::Stopping;
        vec![Effect::Send(Command::Stop)]
    }

    pub(super) fn clear(&mut self) -> Vec<Effect> {
        if self.generation.is_busy() {
            self.warn("an answer is being generated: stop it first (Esc)");
            return Vec::new();
        }
        self.chat.clear();
        self.context_used = Some(0);
        self.info("conversation cleared (the system prompt stays)");
        vec![Effect::Send(Command::Clear)]
    }

    pub(super) fn regenerate(&mut self) -> Vec<Effect> {
        if let Some(why) = self.cannot_generate() {
            self.warn(why);
            return Vec::new();
        }
        if !self.chat.has_user_message() {
            self.warn("nothing to regenerate yet: ask something first");
            return Vec::new();
        }
        self.chat.drop_last_answer();
        self.prompt_progress = None;
        self.chat.follow();
        self.generation = GenState::Waiting { since: self.now };
        vec![Effect::Send(Command::Regenerate)]
    }

    pub(super) fn set_system(&mut self, text: String) -> Vec<Effect> {
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

    pub(super) fn set_sampler(&mut self, cfg: SamplerConfig) -> Vec<Effect> {
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

    /// `/set ctx N`: the model is loaded again with a context of `N` tokens (0: the model's own,
    /// at most 4096), the conversation kept as far as it fits (the worker says how far).
    pub(super) fn set_context(&mut self, n: usize) -> Vec<Effect> {
        if self.generation.is_busy() {
            self.warn("an answer is being generated: stop it first (Esc), then change the context");
            return Vec::new();
        }
        if !self.worker_alive {
            self.warn("the inference worker has stopped; the context cannot be changed");
            return Vec::new();
        }
        if let Some(m) = self.model.clone() {
            if n == m.context_length {
                self.info(format!(
                    "the context is already {} tokens",
                    units::count(n as u64)
                ));
                return Vec::new();
            }
            self.info(format!(
                "changing the context from {} to {}: loading {} again",
                units::count(m.context_length as u64),
                if n == 0 {
                    "the model's own".to_string()
                } else {
                    format!("{} tokens", units::count(n as u64))
                },
                m.name
            ));
            self.loading = Some(m.name);
        } else {
            self.info("the context applies when the model is loaded");
        }
        vec![Effect::Send(Command::SetContext(
            Some(n).filter(|&n| n > 0),
        ))]
    }

    pub(super) fn open_picker(&mut self) -> Vec<Effect> {
        let current = self.model.as_ref().and_then(|m| m.path.clone());
        let mut picker = Picker::new(None, current);
        if let Some((entries, searched)) = &self.models {
            picker.searched = searched.clone();
            picker.set_entries(entries.clone());
        }
        self.overlay = Overlay::Picker(picker);
        vec![Effect::Discover]
    }

    pub(super) fn pick(&mut self, entry: ModelEntry) -> Vec<Effect> {
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
        match entry.remote {
            Some(spec) => self.connect(spec),
            None => self.load(entry.path),
        }
    }

    /// Switches to a remote engine (picked in the model picker).
    pub(super) fn connect(
        &mut self,
        spec: crate::model::remote::client::RemoteSpec,
    ) -> Vec<Effect> {
        if self.generation.is_busy() {
            self.warn("an answer is being generated: stop it first (Esc), then switch");
            return Vec::new();
        }
        if !self.worker_alive {
            self.warn("the inference worker has stopped; no engine can be connected");
            return Vec::new();
        }
        self.info(format!("connecting to {} ({})", spec.name, spec.url));
        self.loading = Some(format!("remote {}", spec.name));
        vec![Effect::Send(Command::LoadModel(ModelSource::Remote(spec)))]
    }

    pub(super) fn load(&mut self, path: PathBuf) -> Vec<Effect> {
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

    pub(super) fn copy(&mut self, target: CopyTarget) -> Vec<Effect> {
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

    pub(super) fn start_quit(&mut self, reason: &str) -> Vec<Effect> {
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
            q.exited = Some(self.worker_end.unwrap_or(WorkerEnd::Vanished));
            self.quit = Some(q);
            return Vec::new();
        }
        self.quit = Some(q);
        let mut fx = Vec::new();
        if self.generation.is_busy() {
            fx.push(Effect::Send(Command::Stop));
        }
        fx.push(Effect::Send(Command::Quit {
            drain_deadline: self.settings.quit.drain_deadline,
        }));
        fx
    }
}
