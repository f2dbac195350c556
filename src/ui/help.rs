//! The help screen: every key and every slash command.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Clear, Paragraph};

use super::commands::COMMANDS;
use super::meter::text;
use super::theme::Theme;

/// Every key, grouped as the help screen shows them.
pub const KEYS: &[(&str, &[(&str, &str)])] = &[
    (
        "Chat",
        &[
            ("Enter", "send the message (or run the /command)"),
            (
                "Alt-Enter, Ctrl-J",
                "new line in the message (Shift-Enter too, if the terminal tells)",
            ),
            (
                "↑ / ↓",
                "earlier / later sent messages (from the first / last line)",
            ),
            ("Esc", "stop the answer being generated; close a window"),
            (
                "Ctrl-C",
                "stop the answer; if idle, quit; while quitting, leave at once",
            ),
            ("Ctrl-D", "quit (when the message is empty)"),
            ("Alt-R", "regenerate the last answer"),
            ("Alt-L", "clear the conversation"),
            ("Alt-Y", "copy the last answer to the clipboard (OSC 52)"),
            ("Alt-C", "copy the last code block of the last answer"),
        ],
    ),
    (
        "Scrolling",
        &[
            ("PgUp / PgDn", "scroll the conversation a page"),
            (
                "Ctrl-↑ / Ctrl-↓",
                "scroll a line (the mouse wheel scrolls three)",
            ),
            (
                "Ctrl-Home / Ctrl-End",
                "top / bottom (the bottom follows new text)",
            ),
        ],
    ),
    (
        "Windows",
        &[
            ("F1", "this help"),
            ("F2", "model picker"),
            ("F3", "sampler settings"),
            ("F4", "system prompt editor"),
            ("F5 F6 F7 F8", "show/hide Streams, Arena, Watchdog, GPU"),
            ("F9", "show/hide the diagnostics column"),
            ("Alt-← / Alt-→", "narrower / wider diagnostics column"),
            ("Alt-↑ / Alt-↓", "pick the panel above / below (to resize)"),
            (
                "Alt-+ / Alt--",
                "taller / shorter picked panel (Alt-0: all as they were)",
            ),
        ],
    ),
    (
        "Editing",
        &[
            ("Ctrl-A / Ctrl-E", "start / end of line"),
            ("Ctrl-W, Alt-Backspace", "delete the word before the cursor"),
            ("Ctrl-K / Ctrl-U", "delete to end of line / undo"),
            ("Ctrl-R", "redo"),
        ],
    ),
];

/// All lines of the help text (the overlay scrolls through them).
pub fn lines(theme: &Theme) -> Vec<Line<'static>> {
    let key_w = KEYS
        .iter()
        .flat_map(|(_, ks)| ks.iter().map(|(k, _)| k.chars().count()))
        .chain(COMMANDS.iter().map(|(c, _)| c.chars().count()))
        .max()
        .unwrap_or(10);
    let mut out = Vec::new();
    for (group, keys) in KEYS {
        out.push(Line::from(text(format!(" {group}"), theme.title)));
        for (k, what) in keys.iter() {
            out.push(Line::from(vec![
                text(format!("   {k:<key_w$}  "), theme.key),
                text(what.to_string(), theme.text),
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
    let rect = super::screen::centered(area, width, height);
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
