//! Styled logical lines wrapped to a width: prose at spaces, code at the width (padded with
//! the code background), rules drawn to the full width. The Markdown renderer builds the
//! logical lines; this is where they become terminal rows.

use ratatui::style::Style;
use ratatui::text::{Line, Span};
use unicode_width::UnicodeWidthChar;

use super::theme::Theme;

/// One logical line before wrapping: a prefix for the first row, one for the rows after it, and
/// the content.
pub struct Logical {
    pub first_prefix: Vec<(String, Style)>,
    pub rest_prefix: Vec<(String, Style)>,
    pub content: Vec<(String, Style)>,
    pub kind: LineKind,
}

#[derive(Clone, Copy, PartialEq)]
pub enum LineKind {
    /// Word-wrapped prose.
    Prose,
    /// A code line: broken at the width, never at spaces, padded with the code background.
    Code,
    /// Drawn to the full width (rules, code block frames) and never wrapped.
    Rule,
    Blank,
}

/// `s` without terminal control sequences: escape sequences whole (CSI such as `ESC[2J`, OSC
/// such as a window title or an OSC 52 clipboard write, DCS/SOS/PM/APC strings, two-byte `ESC x`
/// ones, and their C1 forms) and every other control character but newline and tab. A model's
/// text goes through this before it is drawn and before `/save` writes it, so that neither the
/// screen nor a `cat` of an export runs what the model wrote.
pub fn strip_controls(s: &str) -> std::borrow::Cow<'_, str> {
    let keep = |c: char| c == '\n' || c == '\t' || !(c.is_control());
    if s.chars().all(keep) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    // A string sequence (OSC, DCS, ...) ends with BEL or ST (`ESC \` or U+009C).
    fn skip_string(it: &mut std::iter::Peekable<std::str::Chars<'_>>) {
        while let Some(c) = it.next() {
            match c {
                '\u{7}' | '\u{9c}' => return,
                '\u{1b}' => {
                    if it.peek() == Some(&'\\') {
                        it.next();
                    }
                    return;
                }
                _ => {}
            }
        }
    }
    // A control sequence (CSI) ends with a final byte from `@` to `~`.
    fn skip_csi(it: &mut std::iter::Peekable<std::str::Chars<'_>>) {
        for c in it.by_ref() {
            if ('\u{40}'..='\u{7e}').contains(&c) {
                return;
            }
        }
    }
    while let Some(c) = it.next() {
        match c {
            '\u{1b}' => match it.next() {
                Some('[') => skip_csi(&mut it),
                Some(']' | 'P' | 'X' | '^' | '_') => skip_string(&mut it),
                // Two-byte sequences (`ESC c`, `ESC 7`, ...): both bytes go.
                _ => {}
            },
            '\u{9b}' => skip_csi(&mut it),
            '\u{9d}' | '\u{90}' | '\u{98}' | '\u{9e}' | '\u{9f}' => skip_string(&mut it),
            c if keep(c) => out.push(c),
            _ => {}
        }
    }
    std::borrow::Cow::Owned(out)
}

pub fn expand_tabs(s: &str) -> String {
    s.replace('\t', "    ")
}

pub fn char_width(c: char) -> usize {
    UnicodeWidthChar::width(c).unwrap_or(0)
}

pub fn str_width(s: &str) -> usize {
    s.chars().map(char_width).sum()
}

/// Merges runs of characters with one style into spans.
pub fn spans_from_chars(chars: &[(char, Style)]) -> Vec<Span<'static>> {
    let mut spans: Vec<Span<'static>> = Vec::new();
    let mut run = String::new();
    let mut run_style: Option<Style> = None;
    for &(c, s) in chars {
        if run_style != Some(s) {
            if let Some(style) = run_style
                && !run.is_empty()
            {
                spans.push(Span::styled(std::mem::take(&mut run), style));
            }
            run_style = Some(s);
        }
        run.push(c);
    }
    if let Some(style) = run_style
        && !run.is_empty()
    {
        spans.push(Span::styled(run, style));
    }
    spans
}

pub fn prefix_spans(prefix: &[(String, Style)]) -> (Vec<Span<'static>>, usize) {
    let width = prefix.iter().map(|(t, _)| str_width(t)).sum();
    let spans = prefix
        .iter()
        .filter(|(t, _)| !t.is_empty())
        .map(|(t, s)| Span::styled(t.clone(), *s))
        .collect();
    (spans, width)
}

pub fn wrap_logical(l: &Logical, width: usize, theme: &Theme, out: &mut Vec<Line<'static>>) {
    let (first_prefix, first_w) = prefix_spans(&l.first_prefix);
    let (rest_prefix, rest_w) = prefix_spans(&l.rest_prefix);
    match l.kind {
        LineKind::Blank => {
            let mut spans = first_prefix;
            // Trailing prefix spaces carry no information; keep quote bars only.
            if let Some(last) = spans.last_mut() {
                let trimmed = last.content.trim_end().to_string();
                last.content = trimmed.into();
            }
            spans.retain(|s| !s.content.is_empty());
            out.push(Line::from(spans));
        }
        LineKind::Rule => {
            // Frames and rules run to the full width: the first piece is the label, the
            // last character of the last piece is repeated to fill.
            let avail = width.saturating_sub(first_w);
            let mut spans = first_prefix;
            let mut used = 0;
            let mut fill = ('─', theme.dim);
            for (text, style) in &l.content {
                let mut t = String::new();
                for c in text.chars() {
                    if used + char_width(c) > avail {
                        break;
                    }
                    used += char_width(c);
                    t.push(c);
                }
                if let Some(c) = text.chars().last() {
                    fill = (if c == ' ' { '─' } else { c }, *style);
                }
                spans.push(Span::styled(t, *style));
            }
            if used < avail {
                spans.push(Span::styled(
                    fill.0.to_string().repeat(avail - used),
                    fill.1,
                ));
            }
            out.push(Line::from(spans));
        }
        LineKind::Code => {
            // The first piece is the frame's gutter; the rest is code, broken at the width.
            let (gutter, code) = match l.content.split_first() {
                Some((g, rest)) => (Some(g), rest),
                None => (None, &l.content[..]),
            };
            let gutter_w = gutter.map(|(t, _)| str_width(t)).unwrap_or(0);
            let chars: Vec<(char, Style)> = code
                .iter()
                .flat_map(|(t, s)| t.chars().map(move |c| (c, *s)))
                .collect();
            let code_style = code.first().map(|(_, s)| *s).unwrap_or(theme.code_block);
            let mut start = 0;
            let mut first = true;
            loop {
                let (prefix, pw) = if first {
                    (first_prefix.clone(), first_w)
                } else {
                    (rest_prefix.clone(), rest_w)
                };
                let avail = width.saturating_sub(pw + gutter_w).max(1);
                let mut end = start;
                let mut used = 0;
                while end < chars.len() && used + char_width(chars[end].0) <= avail {
                    used += char_width(chars[end].0);
                    end += 1;
                }
                if end == start && end < chars.len() {
                    end += 1; // a character wider than the space: show it anyway
                    used += char_width(chars[start].0);
                }
                let mut spans = prefix;
                if let Some((g, s)) = gutter {
                    spans.push(Span::styled(g.clone(), *s));
                }
                spans.extend(spans_from_chars(&chars[start..end]));
                if used < avail {
                    spans.push(Span::styled(" ".repeat(avail - used), code_style));
                }
                out.push(Line::from(spans));
                start = end;
                first = false;
                if start >= chars.len() {
                    break;
                }
            }
        }
        LineKind::Prose => {
            let chars: Vec<(char, Style)> = l
                .content
                .iter()
                .flat_map(|(t, s)| t.chars().map(move |c| (c, *s)))
                .filter(|(c, _)| *c != '\n' && *c != '\r')
                .collect();
            let mut start = 0;
            let mut first = true;
            loop {
                let (prefix, pw) = if first {
                    (first_prefix.clone(), first_w)
                } else {
                    (rest_prefix.clone(), rest_w)
                };
                let avail = width.saturating_sub(pw).max(1);
                // Greedy fill; remember the last space to break after it.
                let mut end = start;
                let mut used = 0;
                let mut last_break: Option<usize> = None;
                while end < chars.len() {
                    let w = char_width(chars[end].0);
                    if used + w > avail {
                        break;
                    }
                    if chars[end].0 == ' ' {
                        last_break = Some(end);
                    }
                    used += w;
                    end += 1;
                }
                let (mut line_end, next_start) = if end >= chars.len() {
                    (end, end)
                } else if chars[end].0 == ' ' {
                    (end, end + 1)
                } else if let Some(b) = last_break.filter(|&b| b > start) {
                    (b, b + 1)
                } else if end == start {
                    (end + 1, end + 1) // one character wider than the space: show it anyway
                } else {
                    (end, end)
                };
                if next_start < chars.len() {
                    // Spaces where a line was broken are not shown at its end.
                    while line_end > start && chars[line_end - 1].0 == ' ' {
                        line_end -= 1;
                    }
                }
                let mut spans = prefix;
                spans.extend(spans_from_chars(&chars[start..line_end]));
                out.push(Line::from(spans));
                start = next_start;
                // A continuation row never starts with the spaces it was broken at.
                while start < chars.len() && chars[start].0 == ' ' {
                    start += 1;
                }
                if start >= chars.len() {
                    break;
                }
                first = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::strip_controls;

    #[test]
    fn escape_sequences_go_whole_and_text_stays() {
        let hostile = "a\x1b]0;pwned\x07b\x1b]52;c;ZWNobyBoaQ==\x1b\\c\x1b[2Jd\x1b[1;31me\u{9b}31mf\x1bcg\rh\u{7}i\u{7f}";
        assert_eq!(strip_controls(hostile), "abcdefghi");
        assert_eq!(strip_controls("line\n\tcode é 日本"), "line\n\tcode é 日本");
        assert!(matches!(
            strip_controls("plain"),
            std::borrow::Cow::Borrowed(_)
        ));
        // A sequence cut off at the end of the text takes the rest with it.
        assert_eq!(strip_controls("x\x1b]0;never ends"), "x");
    }
}
