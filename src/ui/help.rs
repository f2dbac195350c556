//! The help screen: every key (from [`super::keymap`]) and every slash command.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Clear, Paragraph};

use super::commands::COMMANDS;
use super::keymap::{self, Context, KEYMAP};
use super::meter::{centered, text};
use super::theme::Theme;

/// All lines of the help text (the overlay scrolls through them).
pub fn lines(theme: &Theme) -> Vec<Line<'static>> {
    let key_w = KEYMAP
        .iter()
        .map(|b| b.keys.chars().count())
        .chain(COMMANDS.iter().map(|(c, _)| c.chars().count()))
        .max()
        .unwrap_or(10);
    let mut out = Vec::new();
    for context in Context::ALL {
        out.push(Line::from(text(
            format!(" {}", context.title()),
            theme.title,
        )));
        for b in keymap::listed(context) {
            out.push(Line::from(vec![
                text(format!("   {:<key_w$}  ", b.keys), theme.key),
                text(b.help.to_string(), theme.text),
            ]));
        }
        out.push(Line::default());
    }
    out.push(Line::from(text(" Commands", theme.title)));
    for (c, what) in COMMANDS {
        out.push(Line::from(vec![
            text(format!("   {c:<key_w$}  "), theme.key),
            text(what.to_string(), theme.text),
        ]));
    }
    out.push(Line::from(vec![
        text(format!("   {:<key_w$}  ", "//text"), theme.key),
        text("send a message that starts with /", theme.text),
    ]));
    out.push(Line::default());
    out.push(Line::from(text(
        format!(" hipscope {}", env!("CARGO_PKG_VERSION")),
        theme.dim,
    )));
    out
}

/// Draws the help overlay scrolled by `scroll` lines.
pub fn render(frame: &mut Frame, area: Rect, theme: &Theme, scroll: u16) {
    let all = lines(theme);
    let width = area.width.saturating_sub(2).min(96);
    let height = area.height.min(all.len() as u16 + 2);
    let rect = centered(area, width, height);
    frame.render_widget(Clear, rect);
    let max_scroll = (all.len() as u16).saturating_sub(height.saturating_sub(2));
    let scroll = scroll.min(max_scroll);
    frame.render_widget(
        Paragraph::new(all)
            .wrap(ratatui::widgets::Wrap { trim: false })
            .scroll((scroll, 0))
            .block(
                Block::bordered()
                    .border_type(BorderType::Rounded)
                    .border_style(theme.border_focus)
                    .title(Span::styled(" Help ", theme.title))
                    .title_bottom(Line::from(vec![
                        Span::styled(" ↑↓ PgUp PgDn", theme.key),
                        Span::styled(" scroll  ", theme.key_text),
                        Span::styled("Esc", theme.key),
                        Span::styled(" close ", theme.key_text),
                    ])),
            ),
        rect,
    );
}

/// Lines in the help text, for clamping the scroll.
pub fn len() -> usize {
    lines(&Theme::default()).len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// F1 lists every key of the table, the windows' own included, under its context's title.
    #[test]
    fn help_lists_every_binding_under_its_context() {
        let text: Vec<String> = lines(&Theme::default())
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect();
        for c in Context::ALL {
            let at = text
                .iter()
                .position(|l| l.trim() == c.title())
                .unwrap_or_else(|| panic!("no {:?} heading", c.title()));
            for (i, b) in keymap::listed(c).enumerate() {
                let line = &text[at + 1 + i];
                assert!(
                    line.trim_start().starts_with(b.keys) && line.ends_with(b.help),
                    "{line:?} under {:?}",
                    c.title()
                );
            }
        }
    }
}
