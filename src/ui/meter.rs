//! Small drawing pieces shared by the panels: text bars, labelled rows, panel frames.

use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType};

use super::theme::Theme;

const EIGHTHS: [char; 8] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'];

/// A bar `width` cells wide filled to `frac` (0..=1) with eighth-cell precision; the empty part
/// is drawn as `░` so that an empty bar is still visible.
pub fn bar(frac: f64, width: usize) -> String {
    let frac = if frac.is_finite() {
        frac.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let eighths = (frac * width as f64 * 8.0).round() as usize;
    let full = eighths / 8;
    let part = eighths % 8;
    let mut s = String::with_capacity(width * 3);
    for _ in 0..full.min(width) {
        s.push('█');
    }
    let mut used = full.min(width);
    if used < width && part > 0 {
        s.push(EIGHTHS[part]);
        used += 1;
    }
    for _ in used..width {
        s.push('░');
    }
    s
}

/// `label   value` with the label padded to `label_w`.
pub fn row(label: &str, label_w: usize, value: Vec<Span<'static>>, theme: &Theme) -> Line<'static> {
    let mut spans = vec![Span::styled(format!("{label:<label_w$} "), theme.dim)];
    spans.extend(value);
    Line::from(spans)
}

pub fn text(s: impl Into<String>, style: Style) -> Span<'static> {
    Span::styled(s.into(), style)
}

/// The frame every side panel is drawn in.
pub fn panel(title: &str, theme: &Theme) -> Block<'static> {
    Block::bordered()
        .border_type(BorderType::Rounded)
        .border_style(theme.border)
        .title(Span::styled(format!(" {title} "), theme.title))
}

/// Shortens `s` to at most `width` columns, ending with `…` when cut.
pub fn ellipsize(s: &str, width: usize) -> String {
    use unicode_width::UnicodeWidthChar;
    let total: usize = s.chars().map(|c| c.width().unwrap_or(0)).sum();
    if total <= width {
        return s.to_string();
    }
    if width == 0 {
        return String::new();
    }
    let mut out = String::new();
    let mut used = 0;
    for c in s.chars() {
        let w = c.width().unwrap_or(0);
        if used + w + 1 > width {
            break;
        }
        used += w;
        out.push(c);
    }
    out.push('…');
    out
}

/// Keeps the end of a path-like string (the file name matters most): `…/models/x.gguf`.
pub fn ellipsize_start(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        return s.to_string();
    }
    if width == 0 {
        return String::new();
    }
    let tail: String = s.chars().skip(n - (width - 1)).collect();
    format!("…{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_fill_in_eighths() {
        assert_eq!(bar(0.0, 4), "░░░░");
        assert_eq!(bar(1.0, 4), "████");
        assert_eq!(bar(0.5, 4), "██░░");
        assert_eq!(bar(0.5625, 4), "██▎░"); // 2.25 cells
        assert_eq!(bar(2.0, 3), "███");
        assert_eq!(bar(f64::NAN, 3), "░░░");
        assert_eq!(bar(0.3, 10).chars().count(), 10);
    }

    #[test]
    fn ellipsis_keeps_the_width() {
        assert_eq!(ellipsize("layer 12 / ffn_down", 10), "layer 12 …");
        assert_eq!(ellipsize("short", 10), "short");
        assert_eq!(ellipsize_start("/a/b/model.gguf", 10), "…odel.gguf");
    }
}
