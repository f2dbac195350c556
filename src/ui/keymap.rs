//! (A few lines over 700 on purpose: the key table is one list, and splitting it would give
//! the help screen and the README test two places to read; its tests are in `keymap/tests.rs`.)
//!
//! Every key binding of the chat, written once: which keys, in which context, doing what, and
//! the line the F1 help screen shows for them. Dispatch (`keys.rs`) looks keys up here, the
//! help screen (`help.rs`) is drawn from here, and a test holds the README's key tables to it
//! row for row (as gitui's `KeysList`).
//!
//! The keys of an open window (help, model picker, sampler form, system prompt editor) are
//! contexts of their own ([`Context::is_window`]): the window looks its keys up there first
//! ([`action_in`]); what none of them binds is typed into the window (or, for help, closes it).

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::settings::PanelId;

/// Where a binding is listed on the help screen (and in the README), in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Context {
    Chat,
    Scrolling,
    Windows,
    /// The message box's own editing keys (it passes them to the text area).
    Editing,
    /// The help window (F1).
    HelpWindow,
    /// The model picker (F2).
    Picker,
    /// The sampler settings form (F3).
    Sampler,
    /// The system prompt editor (F4).
    SystemEditor,
}

impl Context {
    /// The order the help screen shows the groups in.
    pub const ALL: [Context; 8] = [
        Context::Chat,
        Context::Scrolling,
        Context::Windows,
        Context::Editing,
        Context::HelpWindow,
        Context::Picker,
        Context::Sampler,
        Context::SystemEditor,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Context::Chat => "Chat",
            Context::Scrolling => "Scrolling",
            Context::Windows => "Windows",
            Context::Editing => "Editing",
            Context::HelpWindow => "In the help (F1)",
            Context::Picker => "In the model picker (F2)",
            Context::Sampler => "In the sampler settings (F3)",
            Context::SystemEditor => "In the system prompt editor (F4)",
        }
    }

    /// Whether these are an open window's keys (looked up before the chat's, only while it is
    /// open).
    pub fn is_window(self) -> bool {
        matches!(
            self,
            Context::HelpWindow | Context::Picker | Context::Sampler | Context::SystemEditor
        )
    }
}

/// What a key does (carried out by `App::on_key`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send the message or run the /command.
    Send,
    NewLine,
    /// The sent message before (from the first line of the box; otherwise the cursor moves).
    HistoryPrev,
    HistoryNext,
    /// Stop the answer; when idle, follow the conversation's end.
    Stop,
    /// Ctrl-C: stop the answer, or quit, or (while quitting) leave at once.
    Interrupt,
    /// Quit when the message box is empty (otherwise the box gets the key).
    QuitIfEmpty,
    Regenerate,
    Clear,
    CopyAnswer,
    CopyCode,
    /// Show finished answers' reasoning whole, or as one line.
    ToggleReasoning,
    ScrollPageUp,
    ScrollPageDown,
    ScrollLineUp,
    ScrollLineDown,
    ScrollTop,
    /// Scroll to the end and follow new text.
    ScrollBottom,
    Help,
    Picker,
    SamplerForm,
    SystemEditor,
    TogglePanel(PanelId),
    /// The Profile panel: in the column, full screen, hidden.
    Profile,
    ToggleSidebar,
    SidebarNarrower,
    SidebarWider,
    FocusPanelAbove,
    FocusPanelBelow,
    GrowPanel,
    ShrinkPanel,
    ResetPanels,
    /// Tab: complete the /command or the path after `/model` and `/save`.
    Complete,
    /// An editing key of the message box.
    Edit(Edit),
    /// A key of an open window.
    Window(Nav),
}

/// What a key does in an open window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nav {
    Close,
    /// The line, entry or field above.
    Prev,
    /// The line, entry or field below.
    Next,
    PagePrev,
    PageNext,
    First,
    /// Delete the character before the cursor (the filter's, the field's).
    Erase,
    /// Delete the whole filter or value.
    EraseAll,
    /// Load the picked model, apply the form, set the prompt.
    Confirm,
}

/// What an editing key does to the message box (readline's names in the comments).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edit {
    /// beginning-of-line
    LineStart,
    /// end-of-line
    LineEnd,
    /// backward-char
    CharBack,
    /// forward-char
    CharForward,
    /// backward-word
    WordBack,
    /// forward-word
    WordForward,
    /// unix-line-discard
    KillToStart,
    /// kill-line
    KillToEnd,
    /// unix-word-rubout
    KillWordBack,
    /// kill-word
    KillWordForward,
    /// yank
    Yank,
    Undo,
    Redo,
}

/// Which modifiers a chord needs; the others are not looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mods {
    Any,
    /// No modifier at all.
    None,
    /// Ctrl held (with or without others).
    Ctrl,
    /// Alt held (with or without others).
    Alt,
    /// Alt or Shift held.
    AltOrShift,
    /// Neither Alt nor Shift held.
    NoAltShift,
}

impl Mods {
    fn matches(self, m: KeyModifiers) -> bool {
        let alt_shift = KeyModifiers::ALT | KeyModifiers::SHIFT;
        match self {
            Mods::Any => true,
            Mods::None => m.is_empty(),
            Mods::Ctrl => m.contains(KeyModifiers::CONTROL),
            Mods::Alt => m.contains(KeyModifiers::ALT),
            Mods::AltOrShift => m.intersects(alt_shift),
            Mods::NoAltShift => !m.intersects(alt_shift),
        }
    }
}

/// One key press and what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chord {
    pub code: KeyCode,
    pub mods: Mods,
    pub action: Action,
}

impl Chord {
    pub fn matches(&self, k: &KeyEvent) -> bool {
        self.code == k.code && self.mods.matches(k.modifiers)
    }
}

const fn on(code: KeyCode, mods: Mods, action: Action) -> Chord {
    Chord { code, mods, action }
}

const fn ch(c: char, mods: Mods, action: Action) -> Chord {
    on(KeyCode::Char(c), mods, action)
}

/// One line of the help screen: the keys as written for people, and the chords they stand for.
#[derive(Clone, Copy, Debug)]
pub struct Binding {
    pub keys: &'static str,
    pub context: Context,
    pub help: &'static str,
    pub chords: &'static [Chord],
}

const fn bind(
    context: Context,
    keys: &'static str,
    help: &'static str,
    chords: &'static [Chord],
) -> Binding {
    Binding {
        keys,
        context,
        help,
        chords,
    }
}

use Action as A;
use Context::{Chat, Editing, HelpWindow, Picker, Sampler, Scrolling, SystemEditor, Windows};
use KeyCode as K;

const fn nav(code: KeyCode, nav: Nav) -> Chord {
    on(code, Mods::Any, A::Window(nav))
}

/// Every binding. A key press takes the first chord that matches, so the order here is the
/// dispatch order (Windows before Scrolling: Ctrl-Alt-↑ picks a panel); the help screen and
/// the README list them by [`Context::ALL`], in this order within a context.
pub const KEYMAP: &[Binding] = &[
    bind(
        Chat,
        "Enter",
        "send the message (or run the /command)",
        &[on(K::Enter, Mods::NoAltShift, A::Send)],
    ),
    bind(
        Chat,
        "Alt-Enter, Ctrl-J",
        "new line in the message (Shift-Enter too, if the terminal tells)",
        &[
            on(K::Enter, Mods::AltOrShift, A::NewLine),
            ch('j', Mods::Ctrl, A::NewLine),
        ],
    ),
    bind(
        Chat,
        "↑ / ↓",
        "earlier / later sent messages (from the first / last line)",
        &[
            on(K::Up, Mods::None, A::HistoryPrev),
            on(K::Down, Mods::None, A::HistoryNext),
        ],
    ),
    bind(
        Chat,
        "Esc",
        "stop the answer being generated; close a window",
        &[on(K::Esc, Mods::Any, A::Stop)],
    ),
    bind(
        Chat,
        "Ctrl-C",
        "stop the answer; twice when idle: quit; while quitting: leave now",
        &[
            ch('c', Mods::Ctrl, A::Interrupt),
            ch('C', Mods::Ctrl, A::Interrupt),
        ],
    ),
    bind(
        Chat,
        "Ctrl-D",
        "quit (when the message is empty)",
        &[ch('d', Mods::Ctrl, A::QuitIfEmpty)],
    ),
    bind(
        Chat,
        "Alt-R",
        "regenerate the last answer",
        &[
            ch('r', Mods::Alt, A::Regenerate),
            ch('R', Mods::Alt, A::Regenerate),
        ],
    ),
    bind(
        Chat,
        "Alt-L",
        "clear the conversation (press twice: it asks first)",
        &[ch('l', Mods::Alt, A::Clear), ch('L', Mods::Alt, A::Clear)],
    ),
    bind(
        Chat,
        "Alt-Y",
        "copy the last answer to the clipboard (OSC 52)",
        &[
            ch('y', Mods::Alt, A::CopyAnswer),
            ch('Y', Mods::Alt, A::CopyAnswer),
        ],
    ),
    bind(
        Chat,
        "Alt-C",
        "copy the last code block of the last answer",
        &[
            ch('c', Mods::Alt, A::CopyCode),
            ch('C', Mods::Alt, A::CopyCode),
        ],
    ),
    bind(
        Chat,
        "Alt-T",
        "show / hide the reasoning of finished answers (reasoning models)",
        &[
            ch('t', Mods::Alt, A::ToggleReasoning),
            ch('T', Mods::Alt, A::ToggleReasoning),
        ],
    ),
    bind(
        Windows,
        "F1",
        "this help",
        &[on(K::F(1), Mods::Any, A::Help)],
    ),
    bind(
        Windows,
        "F2",
        "model picker",
        &[on(K::F(2), Mods::Any, A::Picker)],
    ),
    bind(
        Windows,
        "F3",
        "sampler settings",
        &[on(K::F(3), Mods::Any, A::SamplerForm)],
    ),
    bind(
        Windows,
        "F4",
        "system prompt editor",
        &[on(K::F(4), Mods::Any, A::SystemEditor)],
    ),
    bind(
        Windows,
        "F5 F6 F7 F8",
        "show/hide Streams, Arena, Watchdog, GPU",
        &[
            on(K::F(5), Mods::Any, A::TogglePanel(PanelId::Streams)),
            on(K::F(6), Mods::Any, A::TogglePanel(PanelId::Arena)),
            on(K::F(7), Mods::Any, A::TogglePanel(PanelId::Watchdog)),
            on(K::F(8), Mods::Any, A::TogglePanel(PanelId::Gpu)),
        ],
    ),
    bind(
        Windows,
        "F9",
        "show/hide the diagnostics column",
        &[on(K::F(9), Mods::Any, A::ToggleSidebar)],
    ),
    bind(
        Windows,
        "F10",
        "Profile panel: time per op (again: full screen, again: hide)",
        &[on(K::F(10), Mods::Any, A::Profile)],
    ),
    bind(
        Windows,
        "Alt-← / Alt-→",
        "narrower / wider diagnostics column",
        &[
            on(K::Left, Mods::Alt, A::SidebarNarrower),
            on(K::Right, Mods::Alt, A::SidebarWider),
        ],
    ),
    bind(
        Windows,
        "Alt-↑ / Alt-↓",
        "pick the panel above / below (to resize)",
        &[
            on(K::Up, Mods::Alt, A::FocusPanelAbove),
            on(K::Down, Mods::Alt, A::FocusPanelBelow),
        ],
    ),
    bind(
        Windows,
        "Alt-+ / Alt--",
        "taller / shorter picked panel (Alt-0: all as they were)",
        &[
            ch('+', Mods::Alt, A::GrowPanel),
            ch('=', Mods::Alt, A::GrowPanel),
            ch('-', Mods::Alt, A::ShrinkPanel),
            ch('_', Mods::Alt, A::ShrinkPanel),
            ch('0', Mods::Alt, A::ResetPanels),
        ],
    ),
    bind(
        Scrolling,
        "PgUp / PgDn",
        "scroll the conversation a page",
        &[
            on(K::PageUp, Mods::Any, A::ScrollPageUp),
            on(K::PageDown, Mods::Any, A::ScrollPageDown),
        ],
    ),
    bind(
        Scrolling,
        "Ctrl-↑ / Ctrl-↓",
        "scroll a line (the mouse wheel scrolls three)",
        &[
            on(K::Up, Mods::Ctrl, A::ScrollLineUp),
            on(K::Down, Mods::Ctrl, A::ScrollLineDown),
        ],
    ),
    bind(
        Scrolling,
        "Ctrl-Home / Ctrl-End",
        "top / bottom (the bottom follows new text)",
        &[
            on(K::Home, Mods::Ctrl, A::ScrollTop),
            on(K::End, Mods::Ctrl, A::ScrollBottom),
        ],
    ),
    // The message box's editing keys (readline's). Other keys with Ctrl or Alt that are not
    // in this table do nothing in the box.
    bind(
        Editing,
        "Tab",
        "complete the /command, or the file after /model and /save",
        &[on(K::Tab, Mods::None, A::Complete)],
    ),
    bind(
        Editing,
        "Ctrl-A / Ctrl-E",
        "start / end of line",
        &[
            ch('a', Mods::Ctrl, A::Edit(Edit::LineStart)),
            ch('e', Mods::Ctrl, A::Edit(Edit::LineEnd)),
        ],
    ),
    bind(
        Editing,
        "Ctrl-B / Ctrl-F",
        "a character back / forward",
        &[
            ch('b', Mods::Ctrl, A::Edit(Edit::CharBack)),
            ch('f', Mods::Ctrl, A::Edit(Edit::CharForward)),
        ],
    ),
    bind(
        Editing,
        "Alt-B / Alt-F",
        "a word back / forward (Ctrl-← / Ctrl-→ too)",
        &[
            ch('b', Mods::Alt, A::Edit(Edit::WordBack)),
            ch('f', Mods::Alt, A::Edit(Edit::WordForward)),
            on(K::Left, Mods::Ctrl, A::Edit(Edit::WordBack)),
            on(K::Right, Mods::Ctrl, A::Edit(Edit::WordForward)),
        ],
    ),
    bind(
        Editing,
        "Ctrl-U / Ctrl-K",
        "delete to the start / end of the line",
        &[
            ch('u', Mods::Ctrl, A::Edit(Edit::KillToStart)),
            ch('k', Mods::Ctrl, A::Edit(Edit::KillToEnd)),
        ],
    ),
    bind(
        Editing,
        "Ctrl-W, Alt-Backspace",
        "delete the word before the cursor",
        &[
            ch('w', Mods::Ctrl, A::Edit(Edit::KillWordBack)),
            on(K::Backspace, Mods::Alt, A::Edit(Edit::KillWordBack)),
        ],
    ),
    bind(
        Editing,
        "Alt-D",
        "delete the word after the cursor",
        &[ch('d', Mods::Alt, A::Edit(Edit::KillWordForward))],
    ),
    bind(
        Editing,
        "Ctrl-Y",
        "put back the text last deleted",
        &[ch('y', Mods::Ctrl, A::Edit(Edit::Yank))],
    ),
    bind(
        Editing,
        "Ctrl-Z, Ctrl-_",
        "undo (Alt-Z: redo)",
        &[
            ch('z', Mods::Ctrl, A::Edit(Edit::Undo)),
            // Ctrl-_ (and Ctrl-/) reach the program as 0x1F, which crossterm reads as Ctrl-7;
            // terminals with the kitty protocol send the character itself.
            ch('7', Mods::Ctrl, A::Edit(Edit::Undo)),
            ch('_', Mods::Ctrl, A::Edit(Edit::Undo)),
            ch('/', Mods::Ctrl, A::Edit(Edit::Undo)),
            ch('z', Mods::Alt, A::Edit(Edit::Redo)),
        ],
    ),
    // The windows' own keys (looked up only while the window is open).
    bind(
        HelpWindow,
        "↑ / ↓",
        "scroll a line",
        &[nav(K::Up, Nav::Prev), nav(K::Down, Nav::Next)],
    ),
    bind(
        HelpWindow,
        "PgUp / PgDn",
        "scroll ten lines",
        &[
            nav(K::PageUp, Nav::PagePrev),
            nav(K::PageDown, Nav::PageNext),
        ],
    ),
    bind(
        HelpWindow,
        "Home",
        "back to the top",
        &[nav(K::Home, Nav::First)],
    ),
    bind(
        HelpWindow,
        "Esc, F1",
        "close (any other key closes it too, and goes on to the chat)",
        &[nav(K::Esc, Nav::Close), nav(K::F(1), Nav::Close)],
    ),
    bind(
        Picker,
        "↑ / ↓, Tab",
        "the model above / below",
        &[
            nav(K::Up, Nav::Prev),
            nav(K::Down, Nav::Next),
            nav(K::Tab, Nav::Next),
        ],
    ),
    bind(
        Picker,
        "PgUp / PgDn",
        "five models up / down",
        &[
            nav(K::PageUp, Nav::PagePrev),
            nav(K::PageDown, Nav::PageNext),
        ],
    ),
    bind(
        Picker,
        "Enter",
        "load the model picked",
        &[nav(K::Enter, Nav::Confirm)],
    ),
    bind(
        Picker,
        "Backspace, Ctrl-U",
        "delete a character / all of the filter (what you type filters the list)",
        &[
            nav(K::Backspace, Nav::Erase),
            ch('u', Mods::Ctrl, A::Window(Nav::EraseAll)),
        ],
    ),
    bind(
        Picker,
        "Esc, F2",
        "close",
        &[nav(K::Esc, Nav::Close), nav(K::F(2), Nav::Close)],
    ),
    bind(
        Sampler,
        "↑ / ↓, Shift-Tab / Tab",
        "the setting above / below",
        &[
            nav(K::Up, Nav::Prev),
            nav(K::BackTab, Nav::Prev),
            nav(K::Down, Nav::Next),
            nav(K::Tab, Nav::Next),
        ],
    ),
    bind(
        Sampler,
        "Enter",
        "apply the settings",
        &[nav(K::Enter, Nav::Confirm)],
    ),
    bind(
        Sampler,
        "Backspace, Ctrl-U",
        "delete a character / the whole value (what you type edits the value)",
        &[
            nav(K::Backspace, Nav::Erase),
            ch('u', Mods::Ctrl, A::Window(Nav::EraseAll)),
        ],
    ),
    bind(
        Sampler,
        "Esc, F3",
        "close without applying",
        &[nav(K::Esc, Nav::Close), nav(K::F(3), Nav::Close)],
    ),
    // Before Enter: Alt-Enter is a new line, not Enter.
    bind(
        SystemEditor,
        "Alt-Enter, Ctrl-J",
        "new line (Shift-Enter too, if the terminal tells); the editing keys as in the message box",
        &[
            on(K::Enter, Mods::AltOrShift, A::NewLine),
            ch('j', Mods::Ctrl, A::NewLine),
        ],
    ),
    bind(
        SystemEditor,
        "Enter",
        "set the system prompt (it applies from the next answer)",
        &[nav(K::Enter, Nav::Confirm)],
    ),
    bind(
        SystemEditor,
        "Esc, F4",
        "close without setting",
        &[nav(K::Esc, Nav::Close), nav(K::F(4), Nav::Close)],
    ),
];

/// What `k` does outside a window; `None`: the message box gets it.
pub fn action(k: &KeyEvent) -> Option<Action> {
    KEYMAP
        .iter()
        .filter(|b| !b.context.is_window())
        .flat_map(|b| b.chords.iter())
        .find(|c| c.matches(k))
        .map(|c| c.action)
}

/// What `k` does by the bindings of `context` alone (an open window's keys, or the message
/// box's editing keys in the system prompt editor); `None`: the context does not bind it.
pub fn action_in(context: Context, k: &KeyEvent) -> Option<Action> {
    listed(context)
        .flat_map(|b| b.chords.iter())
        .find(|c| c.matches(k))
        .map(|c| c.action)
}

/// The bindings listed under `context`, in order.
pub fn listed(context: Context) -> impl Iterator<Item = &'static Binding> {
    KEYMAP.iter().filter(move |b| b.context == context)
}

/// The README's key table rows (`| keys | help |`), in help-screen order, for the chat's keys.
pub fn readme_rows() -> Vec<String> {
    Context::ALL
        .into_iter()
        .filter(|c| !c.is_window())
        .flat_map(listed)
        .map(|b| format!("| {} | {} |", b.keys, b.help))
        .collect()
}

/// The README's window key table rows (`| window | keys | help |`), in help-screen order.
pub fn readme_window_rows() -> Vec<String> {
    Context::ALL
        .into_iter()
        .filter(|c| c.is_window())
        .flat_map(listed)
        .map(|b| format!("| {} | {} | {} |", window_name(b.context), b.keys, b.help))
        .collect()
}

/// The window's name in the README's window key table.
fn window_name(c: Context) -> &'static str {
    match c {
        Context::HelpWindow => "help (F1)",
        Context::Picker => "model picker (F2)",
        Context::Sampler => "sampler settings (F3)",
        Context::SystemEditor => "system prompt (F4)",
        _ => "",
    }
}

#[cfg(test)]
mod tests;
