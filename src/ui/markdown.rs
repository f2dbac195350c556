//! Markdown to styled, word-wrapped terminal lines (pulldown-cmark events in, ratatui lines out).
//!
//! Answers stream in token by token, so the renderer must accept any prefix of a document: an
//! unclosed code fence renders as a code block running to the end, which is what the user will
//! see once the fence closes.

use pulldown_cmark::{CodeBlockKind, Event, HeadingLevel, Options, Parser, Tag, TagEnd};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;

use super::theme::Theme;
use super::wrap::{LineKind, Logical, expand_tabs, str_width, wrap_logical};

/// Text pieces with their styles.
type Styled = Vec<(String, Style)>;

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
    let text = &super::wrap::strip_controls(text);
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
    let text = &super::wrap::strip_controls(text);
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

#[cfg(test)]
mod tests;
