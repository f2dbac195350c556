//! Markdown to styled, word-wrapped terminal lines (pulldown-cmark events in, ratatui lines out).
//!
//! Answers stream in token by token, so the renderer must accept any prefix of a document: an
//! unclosed code fence renders as a code block running to the end, which is what the user will
//! see once the fence closes.

use pulldown_cmark::{CodeBlockKind, Event, HeadingLevel, Options, Parser, Tag, TagEnd};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use unicode_width::UnicodeWidthChar;

use super::theme::Theme;

/// Text pieces with their styles.
type Styled = Vec<(String, Style)>;

/// One logical line before wrapping: a prefix for the first row, one for the rows after it, and
/// the content.
struct Logical {
    first_prefix: Vec<(String, Style)>,
    rest_prefix: Vec<(String, Style)>,
    content: Vec<(String, Style)>,
    kind: LineKind,
}

#[derive(Clone, Copy, PartialEq)]
enum LineKind {
    /// Word-wrapped prose.
    Prose,
    /// A code line: broken at the width, never at spaces, padded with the code background.
    Code,
    /// Drawn to the full width (rules, code block frames) and never wrapped.
    Rule,
    Blank,
}

/// A container (list item, block quote) that prefixes the lines inside it.
struct Container {
    first: String,
    rest: String,
    style: Style,
    /// Whether the first line of this container has been emitted (list items show their bullet
    /// only there).
    started: bool,
}

struct ListState {
    next_number: Option<u64>,
}

struct Renderer<'t> {
    theme: &'t Theme,
    out: Vec<Logical>,
    containers: Vec<Container>,
    lists: Vec<ListState>,
    styles: Vec<Style>,
    current: Vec<(String, Style)>,
    /// Inside a fenced or indented code block: its language and text so far.
    code: Option<(String, String)>,
    link_urls: Vec<String>,
    /// A blank line is owed before the next block.
    pending_blank: bool,
    table_row: Vec<Styled>,
    table_cell: Option<Styled>,
    in_table_head: bool,
    /// Rows of the table being read (cells, and whether it is the header row); a table is
    /// drawn once its column widths are known.
    table: Vec<(Vec<Styled>, bool)>,
}

/// Renders `text` as Markdown into lines at most `width` columns wide.
pub fn render(text: &str, width: u16, theme: &Theme) -> Vec<Line<'static>> {
    let width = usize::from(width.max(8));
    let mut r = Renderer {
        theme,
        out: Vec::new(),
        containers: Vec::new(),
        lists: Vec::new(),
        styles: vec![theme.text],
        current: Vec::new(),
        code: None,
        link_urls: Vec::new(),
        pending_blank: false,
        table_row: Vec::new(),
        table_cell: None,
        in_table_head: false,
        table: Vec::new(),
    };
    let options = Options::ENABLE_TABLES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_FOOTNOTES;
    for event in Parser::new_ext(text, options) {
        r.event(event);
    }
    // A stream can stop anywhere: whatever is still open is shown as it stands.
    if r.code.is_some() {
        r.finish_code_block();
    }
    if r.table_cell.is_some() || !r.table_row.is_empty() {
        r.end(TagEnd::TableRow);
    }
    r.finish_table();
    r.flush_line();
    while r.out.last().is_some_and(|l| l.kind == LineKind::Blank) {
        r.out.pop();
    }
    let mut lines = Vec::new();
    for logical in r.out {
        wrap_logical(&logical, width, theme, &mut lines);
    }
    lines
}

/// Wraps plain text (no Markdown: the user's own words are shown as typed).
pub fn render_plain(text: &str, width: u16, style: Style) -> Vec<Line<'static>> {
    let width = usize::from(width.max(8));
    let theme = Theme::default();
    let mut lines = Vec::new();
    for raw in text.split('\n') {
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        let logical = Logical {
            first_prefix: Vec::new(),
            rest_prefix: Vec::new(),
            content: vec![(expand_tabs(raw), style)],
            kind: if raw.is_empty() {
                LineKind::Blank
            } else {
                LineKind::Prose
            },
        };
        wrap_logical(&logical, width, &theme, &mut lines);
    }
    lines
}

/// Where a document being streamed can be cut into finished blocks and the block being
/// written: just after the last blank line that is outside a fenced code block (0 if none).
pub fn stable_prefix_len(text: &str) -> usize {
    let mut fence: Option<(char, usize)> = None;
    let mut cut = 0;
    let mut pos = 0;
    let mut prev_blank = false;
    for line in text.split_inclusive('\n') {
        let start = pos;
        pos += line.len();
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let marker = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        if let Some(m) = marker
            && indent < 4
        {
            let run = trimmed.chars().take_while(|c| *c == m).count();
            if run >= 3 {
                match fence {
                    None => fence = Some((m, run)),
                    Some((open, n))
                        if open == m && run >= n && trimmed[run..].trim().is_empty() =>
                    {
                        fence = None
                    }
                    Some(_) => {}
                }
                prev_blank = false;
                continue;
            }
        }
        let blank = line.trim().is_empty() && line.ends_with('\n');
        if fence.is_none() && blank && !prev_blank && start > 0 {
            // The text after this blank line starts a new block; keep the blank with the head.
            cut = pos;
        }
        prev_blank = blank;
    }
    cut
}

/// The text of every code block in `text`, in order (for copying one to the clipboard).
pub fn code_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for event in Parser::new_ext(text, Options::empty()) {
        match event {
            Event::Start(Tag::CodeBlock(_)) => current = Some(String::new()),
            Event::Text(t) => {
                if let Some(c) = current.as_mut() {
                    c.push_str(&t);
                }
            }
            Event::End(TagEnd::CodeBlock) => {
                if let Some(c) = current.take() {
                    blocks.push(c);
                }
            }
            _ => {}
        }
    }
    if let Some(c) = current {
        blocks.push(c);
    }
    blocks
}

impl Renderer<'_> {
    fn style(&self) -> Style {
        self.styles.last().copied().unwrap_or(self.theme.text)
    }

    fn push_style(&mut self, f: impl FnOnce(Style) -> Style) {
        let s = f(self.style());
        self.styles.push(s);
    }

    fn pop_style(&mut self) {
        if self.styles.len() > 1 {
            self.styles.pop();
        }
    }

    fn push_text(&mut self, text: &str, style: Style) {
        if let Some(cell) = self.table_cell.as_mut() {
            cell.push((text.to_string(), style));
        } else {
            self.current.push((text.to_string(), style));
        }
    }

    fn prefixes(&mut self) -> (Styled, Styled) {
        let mut first = Vec::new();
        let mut rest = Vec::new();
        for c in &mut self.containers {
            if c.started {
                first.push((c.rest.clone(), c.style));
            } else {
                first.push((c.first.clone(), c.style));
                c.started = true;
            }
            rest.push((c.rest.clone(), c.style));
        }
        (first, rest)
    }

    fn blank_prefix(&self) -> Vec<(String, Style)> {
        // Blank lines inside a quote keep its bar; inside list items they stay empty.
        self.containers
            .iter()
            .map(|c| {
                let trimmed = c.rest.trim_end();
                let keep = if trimmed.is_empty() {
                    " ".repeat(c.rest.chars().count())
                } else {
                    c.rest.clone()
                };
                (keep, c.style)
            })
            .collect()
    }

    /// Emits the blank line owed before the next block, with the prefixes open now.
    fn emit_pending_blank(&mut self) {
        if self.pending_blank && !self.out.is_empty() {
            let prefix = self.blank_prefix();
            self.out.push(Logical {
                first_prefix: prefix.clone(),
                rest_prefix: prefix,
                content: Vec::new(),
                kind: LineKind::Blank,
            });
        }
        self.pending_blank = false;
    }

    fn emit(&mut self, content: Vec<(String, Style)>, kind: LineKind) {
        self.emit_pending_blank();
        let (first_prefix, rest_prefix) = self.prefixes();
        self.out.push(Logical {
            first_prefix,
            rest_prefix,
            content,
            kind,
        });
    }

    fn flush_line(&mut self) {
        if self.current.is_empty() {
            return;
        }
        let content = std::mem::take(&mut self.current);
        self.emit(content, LineKind::Prose);
    }

    fn end_block(&mut self) {
        self.flush_line();
        self.pending_blank = true;
    }

    /// Draws the buffered table with its columns padded to a common width.
    fn finish_table(&mut self) {
        let rows = std::mem::take(&mut self.table);
        if rows.is_empty() {
            return;
        }
        let cell_w = |cell: &Styled| cell.iter().map(|(t, _)| str_width(t)).sum::<usize>();
        let columns = rows.iter().map(|(r, _)| r.len()).max().unwrap_or(0);
        let mut widths = vec![0usize; columns];
        for (row, _) in &rows {
            for (i, cell) in row.iter().enumerate() {
                widths[i] = widths[i].max(cell_w(cell));
            }
        }
        let sep = self.theme.dim;
        for (row, head) in rows {
            let mut content = Vec::new();
            let n = row.len();
            for (i, cell) in row.into_iter().enumerate() {
                if i > 0 {
                    content.push((" │ ".to_string(), sep));
                }
                let w = cell_w(&cell);
                for (t, s) in cell {
                    let s = if head {
                        s.add_modifier(Modifier::BOLD)
                    } else {
                        s
                    };
                    content.push((t, s));
                }
                if i + 1 < n {
                    content.push((" ".repeat(widths[i] - w), self.theme.text));
                }
            }
            self.emit(content, LineKind::Prose);
            if head {
                let total = widths.iter().sum::<usize>() + 3 * widths.len().saturating_sub(1);
                self.emit(vec![("─".repeat(total.max(1)), sep)], LineKind::Prose);
            }
        }
    }

    fn finish_code_block(&mut self) {
        let Some((lang, body)) = self.code.take() else {
            return;
        };
        let frame = self.theme.code_label;
        let label = if lang.is_empty() {
            "╭─".to_string()
        } else {
            format!("╭─ {lang} ")
        };
        self.emit(vec![(label, frame)], LineKind::Rule);
        let body = body.strip_suffix('\n').unwrap_or(&body);
        for line in body.split('\n') {
            self.emit(
                vec![
                    ("│ ".to_string(), frame),
                    (expand_tabs(line), self.theme.code_block),
                ],
                LineKind::Code,
            );
        }
        self.emit(vec![("╰─".to_string(), frame)], LineKind::Rule);
        self.pending_blank = true;
    }

    fn event(&mut self, event: Event<'_>) {
        if let Some((_, body)) = self.code.as_mut() {
            match event {
                Event::Text(t) => {
                    body.push_str(&t);
                    return;
                }
                Event::End(TagEnd::CodeBlock) => {
                    self.finish_code_block();
                    return;
                }
                _ => {}
            }
        }
        match event {
            Event::Start(tag) => self.start(tag),
            Event::End(tag) => self.end(tag),
            Event::Text(t) => {
                let style = self.style();
                self.push_text(&t, style);
            }
            Event::Code(t) => {
                let style = self.theme.inline_code;
                self.push_text(&t, style);
            }
            Event::InlineMath(t) | Event::DisplayMath(t) => {
                let style = self.theme.inline_code;
                self.push_text(&t, style);
            }
            Event::Html(t) | Event::InlineHtml(t) => {
                let style = self.theme.dim;
                for (i, part) in t.split('\n').enumerate() {
                    if i > 0 {
                        self.flush_line();
                    }
                    if !part.is_empty() {
                        self.push_text(part, style);
                    }
                }
            }
            Event::FootnoteReference(name) => {
                let style = self.theme.dim;
                self.push_text(&format!("[^{name}]"), style);
            }
            Event::SoftBreak => {
                let style = self.style();
                self.push_text(" ", style);
            }
            Event::HardBreak => self.flush_line(),
            Event::Rule => {
                self.flush_line();
                let style = self.theme.dim;
                self.emit(vec![("─".to_string(), style)], LineKind::Rule);
                self.pending_blank = true;
            }
            Event::TaskListMarker(done) => {
                let style = self.theme.bullet;
                self.push_text(if done { "[x] " } else { "[ ] " }, style);
            }
        }
    }

    fn start(&mut self, tag: Tag<'_>) {
        match tag {
            Tag::Paragraph => self.flush_line(),
            Tag::Heading { level, .. } => {
                self.flush_line();
                let hashes = match level {
                    HeadingLevel::H1 => 1,
                    HeadingLevel::H2 => 2,
                    HeadingLevel::H3 => 3,
                    HeadingLevel::H4 => 4,
                    HeadingLevel::H5 => 5,
                    HeadingLevel::H6 => 6,
                };
                let heading = self.theme.heading;
                self.styles.push(heading);
                self.push_text(&format!("{} ", "#".repeat(hashes)), heading);
            }
            Tag::BlockQuote(_) => {
                self.flush_line();
                // The blank line before a quote is outside it (no bar).
                self.emit_pending_blank();
                let quote = self.theme.quote;
                self.containers.push(Container {
                    first: "│ ".to_string(),
                    rest: "│ ".to_string(),
                    style: self.theme.dim,
                    started: true,
                });
                self.styles.push(quote);
            }
            Tag::CodeBlock(kind) => {
                self.flush_line();
                let lang = match kind {
                    CodeBlockKind::Fenced(info) => {
                        info.split_whitespace().next().unwrap_or("").to_string()
                    }
                    CodeBlockKind::Indented => String::new(),
                };
                self.code = Some((lang, String::new()));
            }
            Tag::List(start) => {
                self.flush_line();
                if self.lists.is_empty() {
                    // A list is one block; its items follow each other without blank lines
                    // unless the list is loose (then paragraphs inside items add them).
                } else {
                    self.pending_blank = false;
                }
                self.lists.push(ListState { next_number: start });
            }
            Tag::Item => {
                self.flush_line();
                let bullet = match self.lists.last_mut() {
                    Some(ListState {
                        next_number: Some(n),
                    }) => {
                        let b = format!("{n}. ");
                        *n += 1;
                        b
                    }
                    _ => match self.lists.len() {
                        1 => "• ".to_string(),
                        2 => "◦ ".to_string(),
                        _ => "▪ ".to_string(),
                    },
                };
                let indent = " ".repeat(bullet.chars().count());
                self.containers.push(Container {
                    first: bullet,
                    rest: indent,
                    style: self.theme.bullet,
                    started: false,
                });
            }
            Tag::Emphasis => self.push_style(|s| s.add_modifier(Modifier::ITALIC)),
            Tag::Strong => self.push_style(|s| s.add_modifier(Modifier::BOLD)),
            Tag::Strikethrough => self.push_style(|s| s.add_modifier(Modifier::CROSSED_OUT)),
            Tag::Link { dest_url, .. } => {
                let link = self.theme.link;
                self.styles.push(link);
                self.link_urls.push(dest_url.to_string());
            }
            Tag::Image { dest_url, .. } => {
                let dim = self.theme.dim;
                self.push_text("[image: ", dim);
                self.styles.push(dim);
                self.link_urls.push(dest_url.to_string());
            }
            Tag::Table(_) => self.flush_line(),
            Tag::TableHead => {
                self.in_table_head = true;
                self.table_row.clear();
            }
            Tag::TableRow => self.table_row.clear(),
            Tag::TableCell => self.table_cell = Some(Vec::new()),
            Tag::FootnoteDefinition(name) => {
                self.flush_line();
                let dim = self.theme.dim;
                self.push_text(&format!("[^{name}]: "), dim);
            }
            Tag::HtmlBlock
            | Tag::MetadataBlock(_)
            | Tag::DefinitionList
            | Tag::DefinitionListTitle
            | Tag::DefinitionListDefinition
            | Tag::Superscript
            | Tag::Subscript => {}
        }
    }

    fn end(&mut self, tag: TagEnd) {
        match tag {
            TagEnd::Paragraph => self.end_block(),
            TagEnd::Heading(_) => {
                self.pop_style();
                self.end_block();
            }
            TagEnd::BlockQuote(_) => {
                self.flush_line();
                self.containers.pop();
                self.pop_style();
                self.pending_blank = true;
            }
            TagEnd::CodeBlock => self.finish_code_block(),
            TagEnd::List(_) => {
                self.flush_line();
                self.lists.pop();
                self.pending_blank = self.lists.is_empty();
            }
            TagEnd::Item => {
                self.flush_line();
                self.containers.pop();
            }
            TagEnd::Emphasis | TagEnd::Strong | TagEnd::Strikethrough => self.pop_style(),
            TagEnd::Link => {
                self.pop_style();
                if let Some(url) = self.link_urls.pop() {
                    let shown: String = self.current.iter().map(|(t, _)| t.as_str()).collect();
                    if !url.is_empty() && !shown.ends_with(&url) {
                        let dim = self.theme.dim;
                        self.push_text(&format!(" ({url})"), dim);
                    }
                }
            }
            TagEnd::Image => {
                self.pop_style();
                let dim = self.theme.dim;
                if let Some(url) = self.link_urls.pop() {
                    self.push_text(&format!(" {url}]"), dim);
                }
            }
            TagEnd::TableCell => {
                if let Some(cell) = self.table_cell.take() {
                    self.table_row.push(cell);
                }
            }
            TagEnd::TableHead | TagEnd::TableRow => {
                if let Some(cell) = self.table_cell.take() {
                    self.table_row.push(cell);
                }
                let row = std::mem::take(&mut self.table_row);
                self.table.push((row, self.in_table_head));
                self.in_table_head = false;
            }
            TagEnd::Table => {
                self.finish_table();
                self.pending_blank = true;
            }
            TagEnd::FootnoteDefinition => self.end_block(),
            TagEnd::HtmlBlock => self.end_block(),
            TagEnd::MetadataBlock(_)
            | TagEnd::DefinitionList
            | TagEnd::DefinitionListTitle
            | TagEnd::DefinitionListDefinition
            | TagEnd::Superscript
            | TagEnd::Subscript => {}
        }
    }
}

fn expand_tabs(s: &str) -> String {
    s.replace('\t', "    ")
}

fn char_width(c: char) -> usize {
    UnicodeWidthChar::width(c).unwrap_or(0)
}

fn str_width(s: &str) -> usize {
    s.chars().map(char_width).sum()
}

/// Merges runs of characters with one style into spans.
fn spans_from_chars(chars: &[(char, Style)]) -> Vec<Span<'static>> {
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

fn prefix_spans(prefix: &[(String, Style)]) -> (Vec<Span<'static>>, usize) {
    let width = prefix.iter().map(|(t, _)| str_width(t)).sum();
    let spans = prefix
        .iter()
        .filter(|(t, _)| !t.is_empty())
        .map(|(t, s)| Span::styled(t.clone(), *s))
        .collect();
    (spans, width)
}

fn wrap_logical(l: &Logical, width: usize, theme: &Theme, out: &mut Vec<Line<'static>>) {
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
    use super::*;

    fn text(lines: &[Line<'_>]) -> Vec<String> {
        lines
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect()
    }

    fn widths(lines: &[Line<'_>]) -> Vec<usize> {
        lines.iter().map(|l| l.width()).collect()
    }

    #[test]
    fn prose_wraps_at_word_boundaries() {
        let t = Theme::default();
        let lines = render("the quick brown fox jumps over the lazy dog", 16, &t);
        assert_eq!(
            text(&lines),
            ["the quick brown", "fox jumps over", "the lazy dog"]
        );
    }

    #[test]
    fn a_word_longer_than_the_width_is_broken() {
        let t = Theme::default();
        let lines = render("abcdefghijklmnopqrstuvwxyz end", 10, &t);
        assert_eq!(text(&lines), ["abcdefghij", "klmnopqrst", "uvwxyz end"]);
    }

    #[test]
    fn wide_characters_count_two_columns() {
        let t = Theme::default();
        // Eight CJK characters are 16 columns.
        let lines = render("日本語のテキスト", 10, &t);
        assert!(widths(&lines).iter().all(|&w| w <= 10), "{lines:?}");
        assert_eq!(text(&lines).concat(), "日本語のテキスト");
    }

    #[test]
    fn code_blocks_are_framed_unwrapped_and_padded() {
        let t = Theme::default();
        let md = "Intro.\n\n```rust\nfn main() {\n    println!(\"hi\");\n}\n```\n\nAfter.";
        let lines = render(md, 24, &t);
        assert_eq!(
            text(&lines),
            [
                "Intro.",
                "",
                "╭─ rust ────────────────",
                "│ fn main() {           ",
                "│     println!(\"hi\");   ",
                "│ }                     ",
                "╰───────────────────────",
                "",
                "After.",
            ]
        );
        // Code carries the code style (background), distinct from prose.
        let code_span = &lines[3].spans[1];
        assert_eq!(code_span.style, t.code_block);
    }

    #[test]
    fn an_unclosed_fence_renders_as_code_while_streaming() {
        let t = Theme::default();
        let lines = render("Here:\n\n```py\nprint(1)\nprint(2", 20, &t);
        let txt = text(&lines);
        assert!(txt.iter().any(|l| l.starts_with("│ print(1)")), "{txt:?}");
        assert!(txt.iter().any(|l| l.starts_with("│ print(2")), "{txt:?}");
    }

    #[test]
    fn long_code_lines_break_at_the_width() {
        let t = Theme::default();
        let lines = render("```\nabcdefghijklmnopqrstuvwxyz\n```", 12, &t);
        let txt = text(&lines);
        assert_eq!(txt[1], "│ abcdefghij");
        assert_eq!(txt[2], "│ klmnopqrst");
        assert_eq!(txt[3], "│ uvwxyz    ");
        assert!(widths(&lines).iter().all(|&w| w <= 12));
    }

    #[test]
    fn lists_have_bullets_and_hanging_indent() {
        let t = Theme::default();
        let md = "- first item that wraps around\n- second\n\n1. one\n2. two";
        let lines = render(md, 16, &t);
        assert_eq!(
            text(&lines),
            [
                "• first item",
                "  that wraps",
                "  around",
                "• second",
                "",
                "1. one",
                "2. two"
            ]
        );
    }

    #[test]
    fn nested_lists_indent_further() {
        let t = Theme::default();
        let lines = render("- a\n  - b\n- c", 20, &t);
        assert_eq!(text(&lines), ["• a", "  ◦ b", "• c"]);
    }

    #[test]
    fn headings_quotes_rules_and_links() {
        let t = Theme::default();
        let md = "# Title\n\n> quoted text\n\n---\n\nsee [docs](https://x.y)";
        let lines = render(md, 20, &t);
        assert_eq!(
            text(&lines),
            [
                "# Title",
                "",
                "│ quoted text",
                "",
                "────────────────────",
                "",
                "see docs",
                "(https://x.y)",
            ]
        );
        assert_eq!(lines[0].spans[0].style, t.heading);
    }

    #[test]
    fn emphasis_is_styled_not_marked() {
        let t = Theme::default();
        let lines = render("a **bold** and *it*", 40, &t);
        assert_eq!(text(&lines), ["a bold and it"]);
        let bold = lines[0].spans.iter().find(|s| s.content == "bold").unwrap();
        assert!(bold.style.add_modifier.contains(Modifier::BOLD));
        let it = lines[0].spans.iter().find(|s| s.content == "it").unwrap();
        assert!(it.style.add_modifier.contains(Modifier::ITALIC));
    }

    #[test]
    fn tables_render_as_rows() {
        let t = Theme::default();
        let lines = render(
            "| name | n |\n|---|---|\n| x | 10 |\n| longer | 2 |",
            30,
            &t,
        );
        assert_eq!(
            text(&lines),
            ["name   │ n", "───────────", "x      │ 10", "longer │ 2"]
        );
        // A table cut off mid-row while streaming still shows what has arrived.
        let lines = render("| a | b |\n|---|---|\n| 1 | 2", 30, &t);
        assert_eq!(text(&lines), ["a │ b", "─────", "1 │ 2"]);
    }

    #[test]
    fn plain_text_keeps_newlines_and_wraps() {
        let lines = render_plain("# not a heading\n\nsecond line here", 10, Style::new());
        assert_eq!(
            text(&lines),
            ["# not a", "heading", "", "second", "line here"]
        );
    }

    #[test]
    fn every_line_fits_the_width() {
        let t = Theme::default();
        let md = "Some text with `inline code` and a [link](http://example.com/a/very/long/path).\n\n\
                  > a quote that goes on and on and on to wrap\n\n\
                  1. item with a very long body that wraps several times over\n\
                  2. another\n   - nested with more words than fit\n\n\
                  ```\nlet x = 1;\n```";
        for w in [8u16, 13, 21, 40, 79] {
            for line in render(md, w, &t) {
                assert!(line.width() <= usize::from(w), "w={w}: {line:?}");
            }
        }
    }

    #[test]
    fn streams_are_cut_after_blank_lines_outside_fences() {
        assert_eq!(stable_prefix_len("one line"), 0);
        assert_eq!(stable_prefix_len("para one\n\npara two"), 10);
        // A blank line inside an open fence is not a cut.
        let t = "intro\n\n```\ncode\n\nmore code";
        assert_eq!(stable_prefix_len(t), 7);
        // Once the fence closes, the next blank line is.
        let t = "intro\n\n```\ncode\n\nx\n```\n\nafter";
        assert_eq!(&t[stable_prefix_len(t)..], "after");
        assert_eq!(stable_prefix_len("~~~\na\n\nb"), 0);
    }

    #[test]
    fn a_stream_cut_renders_like_the_whole() {
        let t = Theme::default();
        let doc = "# Title\n\nSome text that wraps around.\n\n```rust\nfn x() {}\n\nfn y() {}\n```\n\n- a\n- b\n\nlast para";
        let whole = text(&render(doc, 30, &t));
        let cut = stable_prefix_len(doc);
        let mut parts = text(&render(&doc[..cut], 30, &t));
        parts.push(String::new());
        parts.extend(text(&render(&doc[cut..], 30, &t)));
        assert_eq!(parts, whole);
    }

    #[test]
    fn code_blocks_are_extracted_in_order() {
        let md = "x\n```sh\nls -l\n```\ny\n```\na\nb\n```";
        assert_eq!(code_blocks(md), ["ls -l\n", "a\nb\n"]);
        assert_eq!(code_blocks("```\nunclosed"), ["unclosed"]);
        assert!(code_blocks("no code").is_empty());
    }
}
