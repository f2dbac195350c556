//! The system prompt editor: a multiline box over the chat; Enter saves, Esc cancels.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Clear;

use super::input::InputBox;
use super::theme::Theme;

#[derive(Clone, Debug)]
pub struct SystemEditor {
    pub input: InputBox,
}

impl SystemEditor {
    pub fn new(current: &str, theme: &Theme) -> SystemEditor {
        let mut input = InputBox::new(
            "No system prompt: the model's chat template default applies",
            Vec::new(),
            theme,
        );
        input.set_text(current);
        SystemEditor { input }
    }

    pub fn render(&self, frame: &mut Frame, area: Rect, theme: &Theme) {
        let width = area.width.saturating_sub(4).min(100);
        let height = (self.input.height(width) + 4).min(area.height).max(5);
        let rect = super::meter::centered(area, width, height);
        frame.render_widget(Clear, rect);
        let title = Line::from(vec![
            Span::styled(" System prompt ", theme.title),
            Span::styled("Enter", theme.key),
            Span::styled(" save · ", theme.key_text),
            Span::styled("Alt-Enter", theme.key),
            Span::styled(" new line · ", theme.key_text),
            Span::styled("Esc", theme.key),
            Span::styled(" cancel ", theme.key_text),
        ]);
        self.input.render(frame, rect, theme, title, true);
    }
}
