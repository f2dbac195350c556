//! The message box: a multiline editor (ratatui-textarea) with the history of sent messages.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType};
use ratatui_textarea::{CursorMove, TextArea, WrapMode};
use unicode_width::UnicodeWidthStr;

use super::keymap::Edit;
use super::theme::Theme;

/// Most rows the box grows to before it scrolls.
pub const MAX_ROWS: u16 = 8;

#[derive(Clone, Debug)]
pub struct InputBox {
    area: TextArea<'static>,
    history: Vec<String>,
    /// Index into `history` while browsing it with ↑/↓.
    browsing: Option<usize>,
    /// What was typed before browsing began, restored when browsing past the newest entry.
    draft: String,
}

fn new_area(placeholder: &str, theme: &Theme) -> TextArea<'static> {
    let mut a = TextArea::default();
    a.set_placeholder_text(placeholder);
    a.set_placeholder_style(theme.dim);
    a.set_cursor_line_style(Style::default());
    a.set_wrap_mode(WrapMode::WordOrGlyph);
    a.set_max_histories(200);
    a
}

impl InputBox {
    pub fn new(placeholder: &str, history: Vec<String>, theme: &Theme) -> InputBox {
        InputBox {
            area: new_area(placeholder, theme),
            history,
            browsing: None,
            draft: String::new(),
        }
    }

    pub fn text(&self) -> String {
        self.area.lines().join("\n")
    }

    pub fn is_empty(&self) -> bool {
        self.area.lines().iter().all(|l| l.is_empty())
    }

    pub fn set_text(&mut self, s: &str) {
        self.area.select_all();
        self.area.cut();
        self.area.insert_str(s);
    }

    /// Empties the box and returns what it held.
    pub fn take(&mut self) -> String {
        let t = self.text();
        self.set_text("");
        self.browsing = None;
        self.draft.clear();
        t
    }

    pub fn history(&self) -> &[String] {
        &self.history
    }

    pub fn remember(&mut self, s: &str) {
        if s.trim().is_empty() || self.history.last().is_some_and(|l| l == s) {
            return;
        }
        self.history.push(s.to_string());
    }

    /// ↑ at the first line: the previous message. Returns false when not at the first line.
    pub fn history_prev(&mut self) -> bool {
        if self.area.cursor().0 != 0 || self.history.is_empty() {
            return false;
        }
        let i = match self.browsing {
            None => {
                self.draft = self.text();
                self.history.len() - 1
            }
            Some(0) => 0,
            Some(i) => i - 1,
        };
        self.browsing = Some(i);
        let t = self.history[i].clone();
        self.set_text(&t);
        self.area.move_cursor(CursorMove::Top);
        self.area.move_cursor(CursorMove::End);
        true
    }

    /// ↓ at the last line while browsing: the next message, then the draft.
    pub fn history_next(&mut self) -> bool {
        let Some(i) = self.browsing else {
            return false;
        };
        if self.area.cursor().0 + 1 < self.area.lines().len() {
            return false;
        }
        if i + 1 < self.history.len() {
            self.browsing = Some(i + 1);
            let t = self.history[i + 1].clone();
            self.set_text(&t);
        } else {
            self.browsing = None;
            let d = std::mem::take(&mut self.draft);
            self.set_text(&d);
        }
        true
    }

    /// A key with no binding of its own: typing, deleting and moving. The text area's own
    /// shortcuts (Ctrl-U undo, Ctrl-R redo, Ctrl-V page, …) are not used: the editing keys are
    /// those of the key table, carried out by [`InputBox::edit`].
    pub fn key(&mut self, key: KeyEvent) -> bool {
        let chord = key
            .modifiers
            .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT);
        let passes = match key.code {
            KeyCode::Char(_) | KeyCode::Tab | KeyCode::Enter => !chord,
            KeyCode::Backspace
            | KeyCode::Delete
            | KeyCode::Left
            | KeyCode::Right
            | KeyCode::Up
            | KeyCode::Down
            | KeyCode::Home
            | KeyCode::End => true,
            _ => false,
        };
        if !passes {
            return false;
        }
        self.browsing = None;
        self.area.input(key)
    }

    /// Carries out an editing key of the key table.
    pub fn edit(&mut self, op: Edit) -> bool {
        let moved = |a: &mut TextArea<'static>, m: CursorMove| {
            a.move_cursor(m);
            false
        };
        if !matches!(
            op,
            Edit::LineStart | Edit::LineEnd | Edit::CharBack | Edit::CharForward
        ) {
            self.browsing = None;
        }
        let a = &mut self.area;
        match op {
            Edit::LineStart => moved(a, CursorMove::Head),
            Edit::LineEnd => moved(a, CursorMove::End),
            Edit::CharBack => moved(a, CursorMove::Back),
            Edit::CharForward => moved(a, CursorMove::Forward),
            Edit::WordBack => moved(a, CursorMove::WordBack),
            Edit::WordForward => moved(a, CursorMove::WordForward),
            Edit::KillToStart => a.delete_line_by_head(),
            Edit::KillToEnd => a.delete_line_by_end(),
            Edit::KillWordBack => a.delete_word(),
            Edit::KillWordForward => a.delete_next_word(),
            Edit::Yank => a.paste(),
            Edit::Undo => a.undo(),
            Edit::Redo => a.redo(),
        }
    }

    /// Deletes the character after the cursor (Ctrl-D in a box with text in it).
    pub fn delete_next_char(&mut self) -> bool {
        self.browsing = None;
        self.area.delete_next_char()
    }

    /// The text before the cursor on the cursor's line, and whether the box has one line only.
    pub fn before_cursor(&self) -> (String, bool) {
        let c = self.area.cursor();
        let (row, col) = (c.0, c.1);
        let line = self.area.lines().get(row).map(String::as_str).unwrap_or("");
        (
            line.chars().take(col).collect(),
            self.area.lines().len() == 1,
        )
    }

    /// Types `s` at the cursor (a completion).
    pub fn insert(&mut self, s: &str) {
        self.browsing = None;
        self.area.insert_str(s);
    }

    pub fn newline(&mut self) {
        self.area.insert_newline();
    }

    pub fn paste(&mut self, s: &str) {
        self.browsing = None;
        // Terminals send pasted newlines as CR.
        let s = s.replace("\r\n", "\n").replace('\r', "\n");
        self.area.insert_str(s);
    }

    /// Rows the box wants at `width` (its frame included).
    pub fn height(&self, width: u16) -> u16 {
        let inner = usize::from(width.saturating_sub(3)).max(1);
        let rows: usize = self
            .area
            .lines()
            .iter()
            .map(|l| UnicodeWidthStr::width(l.as_str()).max(1).div_ceil(inner))
            .sum();
        (rows as u16).clamp(1, MAX_ROWS) + 2
    }

    pub fn render(
        &self,
        frame: &mut Frame,
        area: Rect,
        theme: &Theme,
        title: Line<'static>,
        focused: bool,
    ) {
        let border = if focused {
            theme.border_focus
        } else {
            theme.border
        };
        let block = Block::bordered()
            .border_type(BorderType::Rounded)
            .border_style(border)
            .title(title);
        let inner = block.inner(area);
        frame.render_widget(block, area);
        frame.render_widget(&self.area, inner);
        let lines = self.area.lines().len();
        if lines > 1 {
            let note = format!(" {lines} lines ");
            let w = note.len() as u16;
            if w + 4 < area.width {
                frame.render_widget(
                    Span::styled(note, theme.dim),
                    Rect::new(area.right() - w - 2, area.bottom() - 1, w, 1),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossterm::event::{KeyCode, KeyModifiers};

    fn typed(b: &mut InputBox, s: &str) {
        for c in s.chars() {
            b.key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE));
        }
    }

    #[test]
    fn history_browses_back_and_restores_the_draft() {
        let t = Theme::default();
        let mut b = InputBox::new("", vec!["first".into(), "second".into()], &t);
        typed(&mut b, "draft");
        assert!(b.history_prev());
        assert_eq!(b.text(), "second");
        assert!(b.history_prev());
        assert_eq!(b.text(), "first");
        assert!(b.history_prev());
        assert_eq!(b.text(), "first", "stays at the oldest");
        assert!(b.history_next());
        assert_eq!(b.text(), "second");
        assert!(b.history_next());
        assert_eq!(b.text(), "draft");
        assert!(!b.history_next(), "not browsing any more");
    }

    #[test]
    fn paste_keeps_every_byte_and_normalises_newlines() {
        let t = Theme::default();
        let mut b = InputBox::new("", vec![], &t);
        let big: String = (0..2000)
            .map(|i| format!("line {i:04} of a long paste ............................\r\n"))
            .collect();
        assert!(big.len() > 100_000);
        b.paste(&big);
        let expected = big.replace("\r\n", "\n");
        assert_eq!(b.text(), expected);
        assert_eq!(b.height(80), MAX_ROWS + 2);
        assert_eq!(b.take(), expected);
        assert!(b.is_empty());
    }

    fn ctrl(c: char) -> KeyEvent {
        KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL)
    }

    #[test]
    fn readline_keys_kill_move_yank_and_undo() {
        let t = Theme::default();
        let mut b = InputBox::new("", vec![], &t);
        typed(&mut b, "one two three");
        b.edit(Edit::WordBack);
        b.edit(Edit::KillToEnd);
        assert_eq!(b.text(), "one two ");
        b.edit(Edit::KillWordBack);
        assert_eq!(b.text(), "one ");
        b.edit(Edit::Yank);
        assert_eq!(b.text(), "one two ", "Ctrl-Y puts back what Ctrl-W took");
        b.edit(Edit::LineStart);
        typed(&mut b, ">");
        b.edit(Edit::LineEnd);
        typed(&mut b, "<");
        assert_eq!(b.text(), ">one two <");
        b.edit(Edit::CharBack);
        b.edit(Edit::KillToStart);
        assert_eq!(b.text(), "<");
        b.edit(Edit::Undo);
        assert_eq!(b.text(), ">one two <");
        b.edit(Edit::Redo);
        assert_eq!(b.text(), "<");
    }

    #[test]
    fn the_text_areas_own_shortcuts_do_nothing() {
        let t = Theme::default();
        let mut b = InputBox::new("", vec![], &t);
        typed(&mut b, "abc");
        // In tui-textarea Ctrl-U is undo, Ctrl-R redo, Ctrl-X cut, Ctrl-V a page down.
        for c in ['u', 'r', 'x', 'v', 'm'] {
            assert!(!b.key(ctrl(c)), "Ctrl-{c}");
        }
        assert_eq!(b.text(), "abc");
        b.key(KeyEvent::new(KeyCode::Backspace, KeyModifiers::NONE));
        b.key(KeyEvent::new(KeyCode::Left, KeyModifiers::NONE));
        typed(&mut b, "x");
        assert_eq!(b.text(), "axb");
        assert_eq!(b.before_cursor(), ("ax".to_string(), true));
    }

    #[test]
    fn height_grows_with_wrapped_rows() {
        let t = Theme::default();
        let mut b = InputBox::new("", vec![], &t);
        assert_eq!(b.height(40), 3);
        b.paste("a\nb\nc");
        assert_eq!(b.height(40), 5);
        b.set_text(&"x".repeat(74));
        assert_eq!(b.height(40), 4, "74 columns wrap into two rows of 37");
    }
}
