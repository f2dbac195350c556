//! The Streams panel: every stream the app owns, its queue depth now and over time, the op in
//! flight and its age, ops completed per second, the last op completed.

use std::collections::HashMap;
use std::time::Duration;

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Sparkline};

use crate::gpu::snapshot::{DeviceSummary, StreamSnapshot};

use super::meter::{ellipsize, open_panel, panel_note, text};
use super::series::Series;
use super::theme::Theme;
use super::units;

#[derive(Clone, Debug, Default)]
pub struct StreamsPanel {
    pub streams: Vec<StreamSnapshot>,
    depth: HashMap<String, Series>,
    rate: HashMap<String, f64>,
    /// Per stream: when its completed count was last used for a rate, and that count.
    mark: HashMap<String, (Duration, u64)>,
}

impl StreamsPanel {
    /// Takes a new set of snapshots received at `now` (time since start).
    pub fn apply(&mut self, snapshots: Vec<StreamSnapshot>, now: Duration) {
        for s in &snapshots {
            self.depth
                .entry(s.name.clone())
                .or_default()
                .push(u64::from(s.queue_depth));
            match self.mark.get(&s.name) {
                Some(&(t, done)) if now > t => {
                    let dt = (now - t).as_secs_f64();
                    let rate = s.completed.saturating_sub(done) as f64 / dt;
                    self.rate.insert(s.name.clone(), rate);
                    self.mark.insert(s.name.clone(), (now, s.completed));
                }
                // Several snapshots within one tick: keep the older mark so the next rate
                // spans real time.
                Some(_) => {}
                None => {
                    self.mark.insert(s.name.clone(), (now, s.completed));
                }
            }
        }
        self.streams = snapshots;
    }

    pub fn ops_per_second(&self, stream: &str) -> Option<f64> {
        self.rate.get(stream).copied()
    }

    pub fn depth_history(&self, stream: &str) -> Option<&Series> {
        self.depth.get(stream)
    }

    /// Rows this panel would like: four per stream (two for a remote server's, which has no
    /// op counts), a blank between streams, and its frame.
    pub fn wanted_height(&self, device: Option<&DeviceSummary>) -> u16 {
        let rows = if self.streams.is_empty() {
            3
        } else {
            stream_rows(self.streams.len(), per_stream(device))
        };
        rows.saturating_add(2)
    }

    pub fn render(
        &self,
        frame: &mut Frame,
        area: Rect,
        theme: &Theme,
        device: Option<&DeviceSummary>,
    ) {
        let Some(inner) = open_panel(frame, area, "Streams", theme, 4) else {
            return;
        };
        let w = usize::from(inner.width);
        if self.streams.is_empty() {
            let msg = match device {
                Some(d) if d.backend == "cpu" => {
                    "No device queue: the CPU backend computes each op on the worker thread \
                     as it is issued."
                }
                Some(_) => "No stream reported yet.",
                None => "No device open yet: it opens with the model.",
            };
            panel_note(frame, inner, msg, theme);
            return;
        }
        // Rows beyond the four each stream needs (and the blank between streams) make its
        // depth history taller, below its name, instead of one row beside it.
        let n = u16::try_from(self.streams.len()).unwrap_or(u16::MAX);
        let remote = per_stream(device) == REMOTE_ROWS;
        let tall = inner
            .height
            .saturating_sub(stream_rows(self.streams.len(), per_stream(device)))
            / n;
        let mut y = inner.y;
        for s in &self.streams {
            if y >= inner.bottom() {
                break;
            }
            // Row 1: name and depth now; the depth history beside them, or below them when
            // there are spare rows.
            let hist = self.depth.get(&s.name);
            let head = format!("{} ", ellipsize(&s.name, w.saturating_sub(14)));
            let depth = match hist {
                Some(h) if tall > 0 => format!("depth {} · peak {}", s.queue_depth, h.max()),
                _ => format!("depth {:<3}", s.queue_depth),
            };
            let depth_style = if s.queue_depth == 0 {
                theme.dim
            } else {
                theme.text
            };
            let head_w = (head.chars().count() + depth.chars().count()) as u16;
            frame.render_widget(
                Paragraph::new(Line::from(vec![
                    text(head, theme.key),
                    text(depth, depth_style),
                ])),
                Rect::new(inner.x, y, inner.width, 1),
            );
            let spark = match hist {
                Some(_) if tall > 0 => Some(Rect::new(
                    inner.x,
                    y + 1,
                    inner.width,
                    tall.min(inner.bottom() - y - 1),
                )),
                Some(_) if inner.width > head_w + 1 => Some(Rect::new(
                    inner.x + head_w + 1,
                    y,
                    inner.width - head_w - 1,
                    1,
                )),
                _ => None,
            };
            if let (Some(rect), Some(hist)) = (spark, hist) {
                let data = hist.tail(usize::from(rect.width));
                frame.render_widget(
                    Sparkline::default()
                        .data(&data)
                        .max(hist.max().max(4))
                        .style(theme.sparkline),
                    rect,
                );
            }
            y += 1 + tall;
            if y >= inner.bottom() {
                break;
            }
            let mut lines = Vec::new();
            match &s.in_flight {
                Some((op, age)) => {
                    let age = format!(" {}", units::duration(*age));
                    let op_w = w.saturating_sub(age.chars().count() + 2);
                    lines.push(Line::from(vec![
                        text("▸ ", theme.slow),
                        text(ellipsize(op, op_w), theme.text),
                        text(age, theme.dim),
                    ]));
                }
                None => lines.push(Line::from(vec![
                    text("▸ ", theme.dim),
                    text("idle", theme.dim),
                ])),
            }
            if remote {
                // A server's request or slot: what it does now (the server gives no age), or
                // its state when idle.
                let (what, style) = match &s.in_flight {
                    Some((op, _)) => (op.as_str(), theme.text),
                    None => (s.last_completed.as_deref().unwrap_or("idle"), theme.dim),
                };
                let lines = vec![Line::from(vec![
                    text(
                        "▸ ",
                        if s.in_flight.is_some() {
                            theme.slow
                        } else {
                            theme.dim
                        },
                    ),
                    text(ellipsize(what, w.saturating_sub(2)), style),
                ])];
                frame.render_widget(Paragraph::new(lines), Rect::new(inner.x, y, inner.width, 1));
                y += 2;
                continue;
            }
            let rate = self
                .rate
                .get(&s.name)
                .map(|r| format!(" {}", units::rate(*r, "op/s")))
                .unwrap_or_default();
            let last = s.last_completed.as_deref().unwrap_or("–");
            let last_w = w.saturating_sub(rate.chars().count() + 2);
            lines.push(Line::from(vec![
                text("✓ ", theme.ok),
                text(ellipsize(last, last_w), theme.dim),
                text(rate, theme.text),
            ]));
            lines.push(Line::from(vec![
                text("  ", theme.dim),
                text(units::count(s.enqueued), theme.text),
                text(" enqueued · ", theme.dim),
                text(units::count(s.completed), theme.text),
                text(" done", theme.dim),
            ]));
            let rows = (inner.bottom() - y).min(3);
            frame.render_widget(
                Paragraph::new(lines),
                Rect::new(inner.x, y, inner.width, rows),
            );
            y += rows + 1;
        }
    }
}

/// Rows `n` streams need: four each and a blank between them.
fn stream_rows(n: usize, per: usize) -> u16 {
    u16::try_from(n.saturating_mul(per + 1).saturating_sub(1)).unwrap_or(u16::MAX)
}

/// Rows of one remote stream (its name, what it does).
const REMOTE_ROWS: usize = 2;

fn per_stream(device: Option<&DeviceSummary>) -> usize {
    if device.is_some_and(|d| d.backend == "remote") {
        REMOTE_ROWS
    } else {
        4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(name: &str, depth: u32, completed: u64) -> StreamSnapshot {
        StreamSnapshot {
            name: name.into(),
            queue_depth: depth,
            enqueued: completed + u64::from(depth),
            completed,
            in_flight: None,
            last_completed: None,
        }
    }

    #[test]
    fn ops_per_second_spans_real_time_between_ticks() {
        let mut p = StreamsPanel::default();
        p.apply(vec![snap("s", 2, 1000)], Duration::from_millis(0));
        assert_eq!(p.ops_per_second("s"), None);
        // Two snapshots in the same tick: no rate from a zero interval.
        p.apply(vec![snap("s", 3, 1500)], Duration::from_millis(0));
        assert_eq!(p.ops_per_second("s"), None);
        p.apply(vec![snap("s", 1, 3000)], Duration::from_millis(500));
        // 2000 ops in 0.5 s.
        assert_eq!(p.ops_per_second("s"), Some(4000.0));
        assert_eq!(p.depth_history("s").unwrap().tail(5), [2, 3, 1]);
    }
}
