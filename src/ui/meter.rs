//! Small drawing pieces shared by the panels and windows: text bars, labelled rows, panel frames,
//! centred window areas, the spinner.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Paragraph, Sparkline, Wrap};

use super::series::Series;
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

/// Draws `lines` at the top of `area` and returns the rows below them (empty when they fill it).
pub fn lines_on_top(frame: &mut Frame, area: Rect, lines: Vec<Line<'static>>) -> Rect {
    let rows = u16::try_from(lines.len())
        .unwrap_or(u16::MAX)
        .min(area.height);
    frame.render_widget(
        Paragraph::new(lines),
        Rect::new(area.x, area.y, area.width, rows),
    );
    Rect::new(area.x, area.y + rows, area.width, area.height - rows)
}

/// A history graph: `label` on the first row of `area`, then the newest values of `series` as a
/// sparkline over the rows below, scaled to `max`. Draws nothing in fewer than two rows.
pub fn history(
    frame: &mut Frame,
    area: Rect,
    label: &str,
    series: &Series,
    max: u64,
    style: Style,
    theme: &Theme,
) {
    if area.height < 2 || area.width == 0 {
        return;
    }
    frame.render_widget(
        Paragraph::new(text(ellipsize(label, usize::from(area.width)), theme.dim)),
        Rect::new(area.x, area.y, area.width, 1),
    );
    let data = series.tail(usize::from(area.width));
    frame.render_widget(
        Sparkline::default()
            .data(&data)
            .max(max.max(1))
            .style(style),
        Rect::new(area.x, area.y + 1, area.width, area.height - 1),
    );
}

pub fn text(s: impl Into<String>, style: Style) -> Span<'static> {
    Span::styled(s.into(), style)
}

/// Draws a side panel's frame titled `title` over `area` and returns the space inside it, or
/// `None` when that is too small to show anything (no rows, or under `min_width` columns).
pub fn open_panel(
    frame: &mut Frame,
    area: Rect,
    title: &str,
    theme: &Theme,
    min_width: u16,
) -> Option<Rect> {
    let block = Block::bordered()
        .border_type(BorderType::Rounded)
        .border_style(theme.border)
        .title(Span::styled(format!(" {title} "), theme.title));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    (inner.height > 0 && inner.width >= min_width).then_some(inner)
}

/// A panel's one dim, word-wrapped line about why it has nothing to show.
pub fn panel_note(frame: &mut Frame, inner: Rect, msg: &str, theme: &Theme) {
    frame.render_widget(
        Paragraph::new(text(msg, theme.dim)).wrap(Wrap { trim: true }),
        inner,
    );
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

/// Word-wraps `s` into at most `max_lines` lines of `width` columns; if text is left over, the
/// last line ends in `…`. Words longer than a line are cut.
pub fn wrap_words(s: &str, width: usize, max_lines: usize) -> Vec<String> {
    use unicode_width::UnicodeWidthStr;
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for word in s.split_whitespace() {
        if !cur.is_empty() && cur.width() + 1 + word.width() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    let mut out: Vec<String> = lines.iter().map(|l| ellipsize(l, width)).collect();
    if max_lines > 0 && out.len() > max_lines {
        out.truncate(max_lines);
        let last = ellipsize(&out[max_lines - 1], width.saturating_sub(1));
        out[max_lines - 1] = if last.ends_with('…') {
            last
        } else {
            format!("{last}…")
        };
    }
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

/// A `width`×`height` rectangle centred in `area` (clipped to it).
pub fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let w = width.min(area.width);
    let h = height.min(area.height);
    Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    )
}

const SPINNER: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

/// The activity spinner's frame `frame` (one per tick).
pub fn spinner(frame: u64) -> &'static str {
    SPINNER[(frame % SPINNER.len() as u64) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_wrap_and_the_rest_is_cut() {
        assert_eq!(
            wrap_words("auto: HIP unavailable (no device)", 12, 4),
            vec!["auto: HIP", "unavailable", "(no device)"]
        );
        assert_eq!(wrap_words("one two three four", 9, 1), vec!["one two…"]);
        assert_eq!(wrap_words("abcdefghijkl", 5, 3), vec!["abcd…"]);
        assert!(wrap_words("", 5, 3).is_empty());
    }

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
