//! The error dialog: what went wrong, where, and that the app is still running.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Clear, Paragraph, Wrap};

use super::meter::text;
use super::theme::Theme;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorInfo {
    /// What was being done (`loading model /m/x.gguf`).
    pub context: String,
    pub message: String,
}

/// Draws the oldest of `pending` errors; the title says how many more wait behind it.
pub fn render(frame: &mut Frame, area: Rect, theme: &Theme, error: &ErrorInfo, more: usize) {
    let width = area.width.saturating_sub(4).min(72);
    let inner_w = usize::from(width.saturating_sub(4)).max(1);
    let body_rows = |s: &str| -> u16 {
        s.split('\n')
            .map(|l| (l.chars().count().max(1)).div_ceil(inner_w) as u16)
            .sum()
    };
    // Context, a blank line, the message, and the frame.
    let height = (body_rows(&error.context) + body_rows(&error.message) + 3).min(area.height);
    let rect = super::meter::centered(area, width, height);
    frame.render_widget(Clear, rect);
    let title = if more > 0 {
        format!(" Error (+{more} more) ")
    } else {
        " Error ".to_string()
    };
    let lines = vec![
        Line::from(text(error.context.clone(), theme.error)),
        Line::default(),
        Line::from(text(error.message.clone(), theme.text)),
    ];
    frame.render_widget(
        Paragraph::new(lines).wrap(Wrap { trim: false }).block(
            Block::bordered()
                .border_type(BorderType::Rounded)
                .border_style(theme.error)
                .padding(ratatui::widgets::Padding::horizontal(1))
                .title(Span::styled(title, theme.error))
                .title_bottom(Line::from(vec![
                    Span::styled(" Enter/Esc", theme.key),
                    Span::styled(" dismiss · the app keeps running ", theme.key_text),
                ])),
        ),
        rect,
    );
}
