//! Key dispatch: what a key press does, in order of precedence: Ctrl-C (even while quitting),
//! the error dialog, the open window's own keys (its context of [`super::keymap`]), then the
//! chat's bindings, and last the message box. The bindings themselves are written once, in
//! `keymap.rs`.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::commands::CopyTarget;
use super::help;
use super::keymap::{self, Action, Context, Nav};
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
            Action::ScrollPageUp | Action::ScrollPageDown => {
                let view = self.chat_view();
                let page = view.height.saturating_sub(2).max(1);
                if action == Action::ScrollPageUp {
                    self.chat.scroll_up(page, view);
                } else {
                    self.chat.scroll_down(page, view);
                }
            }
            Action::ScrollLineUp => self.chat.scroll_up(1, self.chat_view()),
            Action::ScrollLineDown => self.chat.scroll_down(1, self.chat_view()),
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
            // Bound only in the windows' contexts, which `overlay_key` looks up.
            Action::Window(_) => {}
        }
        Vec::new()
    }

    /// Keys for the open window, looked up in its context of the key table; `None` lets the key
    /// through to the chat.
    fn overlay_key(&mut self, k: KeyEvent) -> Option<Vec<Effect>> {
        let context = match &self.overlay {
            Overlay::None => return None,
            Overlay::Help { .. } => Context::HelpWindow,
            Overlay::Picker(_) => Context::Picker,
            Overlay::Sampler(_) => Context::Sampler,
            Overlay::System(_) => Context::SystemEditor,
        };
        let nav = match keymap::action_in(context, &k) {
            Some(Action::Window(Nav::Close)) => {
                self.overlay = Overlay::None;
                return Some(Vec::new());
            }
            Some(Action::Window(n)) => Some(n),
            Some(Action::NewLine) => {
                if let Overlay::System(ed) = &mut self.overlay {
                    ed.input.newline();
                }
                return Some(Vec::new());
            }
            _ => None,
        };
        match &mut self.overlay {
            Overlay::None => None,
            Overlay::Help { scroll } => {
                let max = help::len() as u16;
                match nav {
                    Some(Nav::Prev) => *scroll = scroll.saturating_sub(1),
                    Some(Nav::Next) => *scroll = (*scroll + 1).min(max),
                    Some(Nav::PagePrev) => *scroll = scroll.saturating_sub(10),
                    Some(Nav::PageNext) => *scroll = (*scroll + 10).min(max),
                    Some(Nav::First) => *scroll = 0,
                    // Anything else closes help and goes on to the chat, so typing is never lost.
                    _ => {
                        self.overlay = Overlay::None;
                        return None;
                    }
                }
                Some(Vec::new())
            }
            Overlay::Picker(p) => {
                match nav {
                    Some(Nav::Prev) => p.up(),
                    Some(Nav::Next) => p.down(),
                    Some(Nav::PagePrev) => p.page(-5),
                    Some(Nav::PageNext) => p.page(5),
                    Some(Nav::Erase) => p.backspace(),
                    Some(Nav::EraseAll) => p.filter.clear(),
                    Some(Nav::Confirm) => {
                        let Some(entry) = p.selected_entry().cloned() else {
                            return Some(Vec::new());
                        };
                        return Some(self.pick(entry));
                    }
                    Some(_) => {}
                    None => {
                        if let Some(c) = typed(&k) {
                            p.type_char(c);
                        }
                    }
                }
                Some(Vec::new())
            }
            Overlay::Sampler(f) => {
                match nav {
                    Some(Nav::Prev) => f.up(),
                    Some(Nav::Next) => f.down(),
                    Some(Nav::Erase) => f.backspace(),
                    Some(Nav::EraseAll) => f.clear_field(),
                    Some(Nav::Confirm) => {
                        if let FormOutcome::Apply(cfg) = f.apply(&self.sampler) {
                            self.overlay = Overlay::None;
                            return Some(self.set_sampler(cfg));
                        }
                    }
                    Some(_) => {}
                    None => {
                        if let Some(c) = typed(&k) {
                            f.type_char(c);
                        }
                    }
                }
                Some(Vec::new())
            }
            Overlay::System(ed) => {
                match nav {
                    Some(Nav::Confirm) => {
                        let text = ed.input.text();
                        self.overlay = Overlay::None;
                        return Some(self.set_system(text));
                    }
                    Some(_) => {}
                    // The message box's editing keys, from the same table.
                    None => match keymap::action_in(Context::Editing, &k) {
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

/// The character a key types into a window's filter or field (none with Ctrl or Alt held).
fn typed(k: &KeyEvent) -> Option<char> {
    match k.code {
        KeyCode::Char(c) if !ctrl(k) && !alt(k) => Some(c),
        _ => None,
    }
}
