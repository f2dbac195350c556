//! A reasoning model's reasoning, drawn apart from its answer (the split itself is made in
//! `model/reasoning.rs`): while the answer streams, a dimmed block under a "thinking…" label, the
//! answer below it; once the answer is done, one line that says how long the reasoning was,
//! which Alt-T (`Action::ToggleReasoning`) opens into the block again.

use ratatui::text::{Line, Span};

use crate::model::protocol::GenStats;

use super::markdown;
use super::theme::Theme;
use super::units;

/// The bar in front of each line of the block.
const BAR: &str = "┊ ";

/// How the block is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shown {
    /// The answer is still coming; `answering`: the reasoning is over.
    Streaming { answering: bool },
    /// Done: one line.
    Collapsed,
    /// Done: the line and the block (Alt-T).
    Expanded,
}

/// The lines of the reasoning block at `width` (none for empty reasoning).
pub fn lines(
    reasoning: &str,
    stats: Option<&GenStats>,
    shown: Shown,
    width: u16,
    theme: &Theme,
) -> Vec<Line<'static>> {
    let body = reasoning.trim();
    if body.is_empty() {
        return Vec::new();
    }
    let head = match shown {
        Shown::Streaming { answering: false } => "thinking…".to_string(),
        Shown::Streaming { answering: true } => "reasoning".to_string(),
        Shown::Collapsed => format!("▸ {} · Alt-T shows it", summary(body, stats)),
        Shown::Expanded => format!("▾ {} · Alt-T hides it", summary(body, stats)),
    };
    let mut out = Vec::new();
    if matches!(shown, Shown::Streaming { .. }) {
        out.push(Line::from(vec![
            Span::styled(BAR, theme.dim),
            Span::styled(head, theme.stats),
        ]));
    } else {
        out.push(Line::from(Span::styled(head, theme.stats)));
    }
    if shown != Shown::Collapsed {
        for mut line in markdown::render_plain(body, width.saturating_sub(2), theme.quote) {
            line.spans.insert(0, Span::styled(BAR, theme.dim));
            out.push(line);
        }
    }
    out
}

/// `thought for 183 tokens · 4.2 s`, or without statistics (an answer reopened from a
/// transcript that did not record them) `reasoning · 57 words`.
pub fn summary(body: &str, stats: Option<&GenStats>) -> String {
    match stats {
        Some(s) if s.reasoning_tokens > 0 => format!(
            "thought for {} tokens · {}",
            units::count(s.reasoning_tokens as u64),
            units::duration(s.reasoning_time)
        ),
        _ => format!(
            "reasoning · {} words",
            units::count(body.split_whitespace().count() as u64)
        ),
    }
}
