//! The conversation as shown: user messages, streamed answers rendered as Markdown, notices;
//! wrapped to the panel, scrolled, following the bottom unless the user scrolled up.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use ratatui::Frame;
use ratatui::layout::{Alignment, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Scrollbar, ScrollbarOrientation, ScrollbarState, Wrap};

use crate::model::protocol::{GenStats, StopReason};

use super::markdown;
use super::meter::text;
use super::reasoning;
use super::theme::Theme;
use super::units;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoticeLevel {
    Info,
    Warn,
    Error,
}

#[derive(Clone, Debug, PartialEq)]
pub enum EntryKind {
    User(String),
    Assistant {
        /// The model that wrote it (answers keep their model's name after a switch).
        model: String,
        text: String,
        /// A reasoning model's reasoning before the answer (`ui/reasoning.rs` draws it).
        reasoning: String,
        /// Set when the answer is done.
        stats: Option<GenStats>,
        reason: Option<StopReason>,
        /// No more tokens will come (finished, or reopened from a transcript).
        done: bool,
    },
    Notice {
        text: String,
        level: NoticeLevel,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub id: u64,
    /// Bumped on every change, so that the wrap cache knows when to redo this entry.
    rev: u64,
    pub kind: EntryKind,
}

/// What is happening at the end of the conversation, drawn after the last entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Activity {
    Idle,
    /// Waiting for the first token: the spinner frame, and how far the prompt is read.
    Thinking(u64, Option<String>),
    Streaming(u64),
}

/// How tall the chat's view is and how many lines the conversation has at its width: what a
/// render draws, worked out by [`Chat::measure`] where a key needs it (render writes nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Viewport {
    pub height: usize,
    pub total: usize,
}

type Cached = (u64, u16, Rc<Vec<Line<'static>>>);
/// The finished blocks of the answer streaming in: entry id, bytes covered, width, lines.
type StableBlocks = (u64, usize, u16, Rc<Vec<Line<'static>>>);

#[derive(Debug, Default)]
pub struct Chat {
    pub entries: Vec<Entry>,
    next_id: u64,
    /// First line shown; `None` follows the bottom.
    pub scroll_top: Option<usize>,
    /// The answer tokens go to (notices may come after it while it streams).
    open_answer: Option<u64>,
    /// Name shown over the answers to come.
    pub assistant_name: String,
    /// Finished answers show their reasoning whole (Alt-T), not as one line.
    pub show_reasoning: bool,
    cache: RefCell<HashMap<u64, Cached>>,
    /// The answer streaming in, rendered up to its last finished block: (entry, bytes, width,
    /// lines). Each frame then renders only the block being written.
    stable: RefCell<Option<StableBlocks>>,
}

impl Chat {
    pub fn new(assistant_name: &str) -> Chat {
        Chat {
            assistant_name: assistant_name.to_string(),
            ..Chat::default()
        }
    }

    fn push(&mut self, kind: EntryKind) {
        self.next_id += 1;
        self.entries.push(Entry {
            id: self.next_id,
            rev: 0,
            kind,
        });
    }

    pub fn push_user(&mut self, text: &str) {
        self.push(EntryKind::User(text.to_string()));
    }

    pub fn notice(&mut self, text: impl Into<String>, level: NoticeLevel) {
        self.push(EntryKind::Notice {
            text: text.into(),
            level,
        });
    }

    /// Starts an answer unless one is open.
    pub fn begin_answer(&mut self) {
        if self.open_entry().is_none() {
            self.push(EntryKind::Assistant {
                model: self.assistant_name.clone(),
                text: String::new(),
                reasoning: String::new(),
                stats: None,
                reason: None,
                done: false,
            });
            self.open_answer = Some(self.next_id);
        }
    }

    fn open_entry(&mut self) -> Option<&mut Entry> {
        let id = self.open_answer?;
        self.entries.iter_mut().rev().find(|e| e.id == id)
    }

    pub fn append_token(&mut self, piece: &str) {
        self.begin_answer();
        if let Some(e) = self.open_entry()
            && let EntryKind::Assistant { text, .. } = &mut e.kind
        {
            text.push_str(piece);
            e.rev += 1;
        }
    }

    /// A piece of the open answer's reasoning.
    pub fn append_reasoning(&mut self, piece: &str) {
        self.begin_answer();
        if let Some(e) = self.open_entry()
            && let EntryKind::Assistant { reasoning, .. } = &mut e.kind
        {
            reasoning.push_str(piece);
            e.rev += 1;
        }
    }

    /// Alt-T: finished answers show their reasoning whole, or as one line again.
    pub fn toggle_reasoning(&mut self) {
        self.show_reasoning = !self.show_reasoning;
        for e in &mut self.entries {
            if matches!(&e.kind, EntryKind::Assistant { reasoning, .. } if !reasoning.is_empty()) {
                e.rev += 1;
            }
        }
    }

    /// Whether any answer has reasoning (Alt-T has something to show).
    pub fn has_reasoning(&self) -> bool {
        self.entries.iter().any(
            |e| matches!(&e.kind, EntryKind::Assistant { reasoning, .. } if !reasoning.trim().is_empty()),
        )
    }

    pub fn finish_answer(&mut self, stats: GenStats, reason: StopReason) {
        self.begin_answer();
        self.open_answer = None;
        if let Some(e) = self.last_answer_entry()
            && let EntryKind::Assistant {
                stats: s,
                reason: r,
                done,
                ..
            } = &mut e.kind
        {
            *s = Some(stats);
            *r = Some(reason);
            *done = true;
            e.rev += 1;
        }
    }

    /// Closes the open answer without statistics (an answer reopened from a transcript).
    pub fn finish_restored_answer(&mut self) {
        if let Some(e) = self.open_entry()
            && let EntryKind::Assistant { done, .. } = &mut e.kind
        {
            *done = true;
            e.rev += 1;
        }
        self.open_answer = None;
    }

    fn last_answer_entry(&mut self) -> Option<&mut Entry> {
        self.entries
            .iter_mut()
            .rev()
            .find(|e| matches!(e.kind, EntryKind::Assistant { .. }))
    }

    /// Removes the last answer (for regenerate); returns whether there was one.
    pub fn drop_last_answer(&mut self) -> bool {
        let Some(i) = self
            .entries
            .iter()
            .rposition(|e| matches!(e.kind, EntryKind::Assistant { .. }))
        else {
            return false;
        };
        // Only if no user message came after it.
        if self.entries[i + 1..]
            .iter()
            .any(|e| matches!(e.kind, EntryKind::User(_)))
        {
            return false;
        }
        let removed = self.entries.remove(i);
        self.cache.borrow_mut().remove(&removed.id);
        if self.open_answer == Some(removed.id) {
            self.open_answer = None;
        }
        true
    }

    pub fn has_user_message(&self) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(e.kind, EntryKind::User(_)))
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.open_answer = None;
        self.cache.borrow_mut().clear();
        self.scroll_top = None;
    }

    pub fn last_answer(&self) -> Option<&str> {
        self.entries.iter().rev().find_map(|e| match &e.kind {
            EntryKind::Assistant { text, .. } if !text.is_empty() => Some(text.as_str()),
            _ => None,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn is_following(&self) -> bool {
        self.scroll_top.is_none()
    }

    /// Scrolls up `n` lines of the view `v` (leaves follow mode).
    pub fn scroll_up(&mut self, n: usize, v: Viewport) {
        let bottom_top = v.total.saturating_sub(v.height);
        let top = self.scroll_top.unwrap_or(bottom_top);
        self.scroll_top = Some(top.saturating_sub(n));
    }

    /// Scrolls down `n` lines of the view `v`; reaching the bottom follows again.
    pub fn scroll_down(&mut self, n: usize, v: Viewport) {
        let Some(top) = self.scroll_top else {
            return;
        };
        let bottom_top = v.total.saturating_sub(v.height);
        let top = top + n;
        self.scroll_top = if top >= bottom_top { None } else { Some(top) };
    }

    pub fn scroll_to_top(&mut self) {
        self.scroll_top = Some(0);
    }

    pub fn follow(&mut self) {
        self.scroll_top = None;
    }

    fn entry_lines(&self, e: &Entry, width: u16, theme: &Theme) -> Rc<Vec<Line<'static>>> {
        if let Some((rev, w, lines)) = self.cache.borrow().get(&e.id)
            && *rev == e.rev
            && *w == width
        {
            return Rc::clone(lines);
        }
        let lines = Rc::new(self.build_entry(e, width, theme));
        self.cache
            .borrow_mut()
            .insert(e.id, (e.rev, width, Rc::clone(&lines)));
        lines
    }

    fn build_entry(&self, e: &Entry, width: u16, theme: &Theme) -> Vec<Line<'static>> {
        let mut out = Vec::new();
        match &e.kind {
            EntryKind::User(t) => {
                out.push(Line::from(text("You", theme.user_label)));
                out.extend(markdown::render_plain(t, width, theme.user_text));
            }
            EntryKind::Assistant {
                model,
                text: body,
                reasoning: thought,
                stats,
                reason,
                done,
            } => {
                out.push(Line::from(text(model.clone(), theme.assistant_label)));
                let shown = match (*done, self.show_reasoning) {
                    (false, _) => reasoning::Shown::Streaming {
                        answering: !body.is_empty(),
                    },
                    (true, false) => reasoning::Shown::Collapsed,
                    (true, true) => reasoning::Shown::Expanded,
                };
                let block = reasoning::lines(thought, stats.as_ref(), shown, width, theme);
                let apart = block.len() > 1 && !body.trim().is_empty();
                out.extend(block);
                if apart {
                    out.push(Line::default());
                }
                if !body.trim().is_empty() {
                    if *done {
                        out.extend(markdown::render(body, width, theme));
                    } else {
                        out.extend(self.render_streaming(e.id, body, width, theme));
                    }
                } else if *done {
                    out.push(Line::from(text("(no text)", theme.dim)));
                }
                if let (Some(s), Some(r)) = (stats, reason) {
                    out.extend(markdown::render_plain(
                        &stats_line(s, &reason_text(r)),
                        width,
                        theme.stats,
                    ));
                }
            }
            EntryKind::Notice { text: t, level } => {
                let style = match level {
                    NoticeLevel::Info => theme.dim,
                    NoticeLevel::Warn => theme.notice,
                    NoticeLevel::Error => theme.error,
                };
                let mark = match level {
                    NoticeLevel::Info => "· ",
                    NoticeLevel::Warn => "! ",
                    NoticeLevel::Error => "✗ ",
                };
                out.extend(markdown::render_plain(&format!("{mark}{t}"), width, style));
            }
        }
        out
    }

    /// Renders an answer still streaming in: the finished blocks come from a cache, only the
    /// block being written is rendered again. (The whole answer is rendered once more when it
    /// is done, so a construct that spans blocks, like a loose list, ends up exact.)
    fn render_streaming(
        &self,
        id: u64,
        body: &str,
        width: u16,
        theme: &Theme,
    ) -> Vec<Line<'static>> {
        let split = markdown::stable_prefix_len(body);
        if split == 0 {
            return markdown::render(body, width, theme);
        }
        let cached = self
            .stable
            .borrow()
            .as_ref()
            .filter(|(i, n, w, _)| *i == id && *n == split && *w == width)
            .map(|(_, _, _, lines)| Rc::clone(lines));
        let head = cached.unwrap_or_else(|| {
            let lines = Rc::new(markdown::render(&body[..split], width, theme));
            *self.stable.borrow_mut() = Some((id, split, width, Rc::clone(&lines)));
            lines
        });
        let tail = markdown::render(&body[split..], width, theme);
        let mut out: Vec<Line<'static>> = head.iter().cloned().collect();
        if !tail.is_empty() {
            out.push(Line::default());
            out.extend(tail);
        }
        out
    }

    /// The conversation at `width` as pieces whose lines are shared with the wrap cache, so
    /// that a frame copies only the lines it shows.
    fn segments(&self, width: u16, theme: &Theme, activity: Activity) -> Vec<Segment> {
        let mut segs = Vec::with_capacity(self.entries.len() * 2 + 1);
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                segs.push(Segment::Line(Line::default()));
            }
            let lines = self.entry_lines(e, width, theme);
            if matches!(activity, Activity::Streaming(_)) && self.open_answer == Some(e.id) {
                // The cursor goes at the end of the answer streaming in.
                let cursor = Span::styled("▍", theme.assistant_label);
                let mut last = lines.last().cloned().unwrap_or_default();
                let head = Segment::Shared(Rc::clone(&lines), lines.len().saturating_sub(1));
                segs.push(head);
                if last.width() < usize::from(width) {
                    last.spans.push(cursor);
                    segs.push(Segment::Line(last));
                } else {
                    segs.push(Segment::Line(last));
                    segs.push(Segment::Line(Line::from(cursor)));
                }
            } else {
                let n = lines.len();
                segs.push(Segment::Shared(lines, n));
            }
        }
        if let Activity::Thinking(frame, progress) = activity {
            if !segs.is_empty() {
                segs.push(Segment::Line(Line::default()));
            }
            let what = progress.as_deref().unwrap_or("reading the prompt…");
            segs.push(Segment::Line(Line::from(text(
                format!("{} {what}", super::meter::spinner(frame)),
                theme.dim,
            ))));
        }
        segs
    }

    /// All lines of the conversation at `width`, with the activity indicator: a spinner after
    /// the question while the prompt is read, a cursor at the end of the answer streaming in.
    pub fn lines(&self, width: u16, theme: &Theme, activity: Activity) -> Vec<Line<'static>> {
        let segs = self.segments(width, theme, activity);
        let total = segs.iter().map(Segment::len).sum();
        window(&segs, 0, total)
    }

    /// The view [`Chat::render`] draws in `area`.
    pub fn measure(&self, area: Rect, theme: &Theme, activity: Activity) -> Viewport {
        let height = usize::from(area.height);
        if area.width < 4 || (self.entries.is_empty() && activity == Activity::Idle) {
            return Viewport { height, total: 0 };
        }
        let segs = self.segments(area.width - 2, theme, activity);
        Viewport {
            height,
            total: segs.iter().map(Segment::len).sum(),
        }
    }

    /// Draws the conversation; `welcome` is shown while it is empty.
    pub fn render(
        &self,
        frame: &mut Frame,
        area: Rect,
        theme: &Theme,
        activity: Activity,
        welcome: Vec<Line<'static>>,
    ) {
        if area.width < 4 || area.height == 0 {
            return;
        }
        // One column of margin on the left, one for the scrollbar on the right.
        let text_area = Rect::new(area.x + 1, area.y, area.width - 2, area.height);
        if self.entries.is_empty() && activity == Activity::Idle {
            let h = welcome.len() as u16;
            let y = area.y + area.height.saturating_sub(h) / 2;
            frame.render_widget(
                Paragraph::new(welcome)
                    .alignment(Alignment::Center)
                    .wrap(Wrap { trim: true }),
                Rect::new(text_area.x, y, text_area.width, h.min(area.height)),
            );
            return;
        }
        let segs = self.segments(text_area.width, theme, activity);
        let height = usize::from(area.height);
        let total: usize = segs.iter().map(Segment::len).sum();
        let bottom_top = total.saturating_sub(height);
        let top = self.scroll_top.map_or(bottom_top, |t| t.min(bottom_top));
        let visible = window(&segs, top, height);
        frame.render_widget(Paragraph::new(visible), text_area);
        if total > height {
            let mut state = ScrollbarState::new(bottom_top).position(top);
            frame.render_stateful_widget(
                Scrollbar::new(ScrollbarOrientation::VerticalRight)
                    .begin_symbol(None)
                    .end_symbol(None)
                    .track_style(theme.border)
                    .thumb_style(theme.dim),
                area,
                &mut state,
            );
            if top < bottom_top {
                let below = bottom_top - top;
                let note = format!(" ↓ {below} more · Ctrl-End ");
                let w = note.chars().count() as u16;
                if w + 2 < area.width {
                    frame.render_widget(
                        Paragraph::new(Span::styled(note, theme.selected)),
                        Rect::new(area.right() - w - 2, area.bottom() - 1, w, 1),
                    );
                }
            }
        }
    }
}

/// A run of lines: the first `n` lines of a cached entry, or one line made for this frame.
enum Segment {
    Shared(Rc<Vec<Line<'static>>>, usize),
    Line(Line<'static>),
}

impl Segment {
    fn len(&self) -> usize {
        match self {
            Segment::Shared(_, n) => *n,
            Segment::Line(_) => 1,
        }
    }
}

/// Copies lines `top..top + height` out of the segments.
fn window(segs: &[Segment], top: usize, height: usize) -> Vec<Line<'static>> {
    let mut out = Vec::with_capacity(height.min(4096));
    let mut pos = 0;
    for seg in segs {
        if out.len() >= height {
            break;
        }
        let len = seg.len();
        if pos + len <= top {
            pos += len;
            continue;
        }
        let skip = top.saturating_sub(pos);
        match seg {
            Segment::Shared(lines, n) => out.extend(
                lines[..*n]
                    .iter()
                    .skip(skip)
                    .take(height - out.len())
                    .cloned(),
            ),
            Segment::Line(l) => out.push(l.clone()),
        }
        pos += len;
    }
    out
}

/// `TTFT 85 ms · prompt 31 tok 410 t/s · 42 tok 205 t/s · end of text`
pub fn stats_line(s: &GenStats, reason: &str) -> String {
    let mut parts = vec![format!("TTFT {}", units::duration(s.time_to_first_token))];
    let fresh = s.prompt_tokens.saturating_sub(s.cached_tokens);
    let mut prompt = format!(
        "prompt {} tok {}",
        units::count(fresh as u64),
        units::rate(s.prompt_tps(), "t/s")
    );
    if s.cached_tokens > 0 {
        prompt.push_str(&format!(
            " (+{} cached)",
            units::count(s.cached_tokens as u64)
        ));
    }
    parts.push(prompt);
    let mut generated = format!(
        "gen {} tok {}",
        units::count(s.generated_tokens as u64),
        units::rate(s.gen_tps(), "t/s")
    );
    if s.reasoning_tokens > 0 {
        generated.push_str(&format!(
            " ({} reasoning)",
            units::count(s.reasoning_tokens as u64)
        ));
    }
    parts.push(generated);
    parts.push(reason.to_string());
    parts.join(" · ")
}

pub fn reason_text(r: &StopReason) -> String {
    match r {
        StopReason::Eog => "end of text".into(),
        StopReason::StopString(s) => format!("stop string {s:?}"),
        StopReason::Limit => "token limit".into(),
        StopReason::User => "stopped".into(),
        StopReason::ContextFull => "context full".into(),
        StopReason::Dropped(why) => {
            format!("connection dropped, answer incomplete ({why}); Alt-R retries")
        }
    }
}

#[cfg(test)]
mod tests;
