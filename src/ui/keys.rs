//! Key dispatch: what a key press does, in order of precedence: Ctrl-C (even while quitting),
//! the error dialog, the open window's own keys, then the bindings of [`super::keymap`], and
//! last the message box. The bindings themselves are written once, in `keymap.rs`.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::commands::CopyTarget;
use super::help;
use super::keymap::{self, Action};
use super::msg::Effect;
use super::sampler::{FormOutcome, SamplerForm};
use super::settings::{PANEL_STEP, PanelId, SIDEBAR_MAX, SIDEBAR_MIN};
use super::state::{App, GenState, Overlay};
use super::system_editor::SystemEditor;

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
    pub(super) fn on_key(&mut self, k: KeyEvent) -> Vec<Effect> {
        if k.kind == KeyEventKind::Release {
            return Vec::new();
        }
        let action = keymap::action(&k);
        let is_ctrl_c = action == Some(Action::Interrupt);
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
            if stoppable && self.worker_alive && !self.watchdog.is_hung() {
                return self.stop();
            }
            // At rest a single press may have been meant for an answer that just ended: as in
            // llama-cli, it asks for a second press within QUIT_CONFIRM. A stop already asked
            // for, a hung GPU or a dead worker quit at once (two presses always get out).
            let at_rest =
                self.generation == GenState::Idle && self.worker_alive && !self.watchdog.is_hung();
            if at_rest && !self.quit_confirm_pending() {
                self.quit_armed = Some(self.now);
                return Vec::new();
            }
            return self.start_quit("Ctrl-C");
        }
        // The footer's note and Alt-L's question last until the next key.
        self.hint = None;
        let clear_armed = std::mem::take(&mut self.clear_armed);
        if !self.errors.is_empty() && matches!(k.code, KeyCode::Enter | KeyCode::Esc) {
            self.errors.pop_front();
            return Vec::new();
        }
        if let Some(fx) = self.overlay_key(k) {
            return fx;
        }
        match action {
            Some(Action::Clear) if !clear_armed && self.chat.has_user_message() => {
                // Clearing cannot be undone: the first Alt-L asks.
                self.clear_armed = true;
                Vec::new()
            }
            Some(a) => self.run_action(a, k),
            None => {
                self.input.key(k);
                Vec::new()
            }
        }
    }

    /// Carries out a binding of the keymap for the key press `k`.
    fn run_action(&mut self, action: Action, k: KeyEvent) -> Vec<Effect> {
        let page = self.chat.viewport().height.saturating_sub(2).max(1);
        match action {
            Action::Send => return self.submit(),
            Action::NewLine => self.input.newline(),
            Action::HistoryPrev => {
                if !self.input.history_prev() {
                    self.input.key(k);
                }
            }
            Action::HistoryNext => {
                if !self.input.history_next() {
                    self.input.key(k);
                }
            }
            Action::Stop => {
                if self.generation.is_busy() {
                    return self.stop();
                }
                self.chat.follow();
            }
            // Handled in `on_key`, before the windows see the key.
            Action::Interrupt => {}
            Action::QuitIfEmpty => {
                if self.input.is_empty() {
                    return self.start_quit("Ctrl-D");
                }
                // readline's Ctrl-D in a line with text: delete the character after the cursor.
                self.input.delete_next_char();
            }
            Action::Regenerate => return self.regenerate(),
            Action::Clear => return self.clear(),
            Action::CopyAnswer => return self.copy(CopyTarget::Answer),
            Action::CopyCode => return self.copy(CopyTarget::Code(None)),
            Action::ToggleReasoning => {
                self.chat.toggle_reasoning();
                if !self.chat.has_reasoning() {
                    self.hint = Some(
                        "no answer has reasoning to show (Alt-T is for reasoning models)".into(),
                    );
                }
            }
            Action::ScrollPageUp => self.chat.scroll_up(page),
            Action::ScrollPageDown => self.chat.scroll_down(page),
            Action::ScrollLineUp => self.chat.scroll_up(1),
            Action::ScrollLineDown => self.chat.scroll_down(1),
            Action::ScrollTop => self.chat.scroll_to_top(),
            Action::ScrollBottom => self.chat.follow(),
            Action::Help => self.overlay = Overlay::Help { scroll: 0 },
            Action::Picker => return self.open_picker(),
            Action::SamplerForm => self.overlay = Overlay::Sampler(SamplerForm::new(&self.sampler)),
            Action::SystemEditor => {
                self.overlay = Overlay::System(Box::new(SystemEditor::new(
                    &self.system_prompt,
                    &self.theme,
                )))
            }
            Action::TogglePanel(id) => self.toggle_panel(|p| match id {
                PanelId::Streams => &mut p.streams,
                PanelId::Arena => &mut p.arena,
                PanelId::Watchdog => &mut p.watchdog,
                PanelId::Gpu => &mut p.gpu,
            }),
            Action::Profile => return self.toggle_profile(),
            Action::ToggleSidebar => {
                let shown = self.sidebar_visible(self.size.0);
                self.sidebar = Some(!shown);
            }
            Action::SidebarNarrower => {
                self.sidebar = Some(true);
                self.sidebar_width = self.sidebar_width.saturating_sub(4).max(SIDEBAR_MIN);
            }
            Action::SidebarWider => {
                self.sidebar = Some(true);
                self.sidebar_width = (self.sidebar_width + 4).min(SIDEBAR_MAX);
            }
            Action::FocusPanelAbove => self.focus_panel(-1),
            Action::FocusPanelBelow => self.focus_panel(1),
            Action::GrowPanel => self.resize_panel(PANEL_STEP),
            Action::ShrinkPanel => self.resize_panel(-PANEL_STEP),
            Action::ResetPanels => self.panel_extra = [0; 4],
            Action::Complete => return self.complete(),
            Action::Edit(op) => {
                self.input.edit(op);
            }
        }
        Vec::new()
    }

    /// Keys for the open window; `None` lets the key through to the chat.
    fn overlay_key(&mut self, k: KeyEvent) -> Option<Vec<Effect>> {
        match &mut self.overlay {
            Overlay::None => None,
            Overlay::Help { scroll } => {
                let max = help::len() as u16;
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
                    _ => match keymap::action(&k) {
                        Some(Action::Edit(op)) => {
                            ed.input.edit(op);
                        }
                        _ => {
                            ed.input.key(k);
                        }
                    },
                }
                Some(Vec::new())
            }
        }
    }
}
