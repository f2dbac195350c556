//! The Profile panel (F10: in the diagnostics column, again: full screen, again: hidden): over
//! the last decode steps and the last prompt, each op family with its time per step, share of
//! the step, achieved GB/s and share of the bound, longest first, each with a sparkline of its
//! time in every step; the step's time the ops do not cover is "host/launch". Drawn from the
//! collector's [`ProfileSnapshot`] (`gpu/trace/profile.rs`); profiling runs only while the panel
//! is shown.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph};

use crate::gpu::trace::profile::HOST_ROW;
use crate::gpu::trace::{ProfileRow, ProfileSnapshot, ProfileTable};

use super::meter::{ellipsize, open_panel, panel_note, text, wrap_words};
use super::theme::Theme;

/// Where the panel is shown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProfileMode {
    #[default]
    Hidden,
    Column,
    Full,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProfilePanel {
    pub mode: ProfileMode,
    pub snapshot: Option<ProfileSnapshot>,
    /// The timeline file being written (`--trace`, `/trace on`), named in the title.
    pub trace_file: Option<String>,
}

/// Op rows the column shows at most (the host/launch row comes on top of them).
const COLUMN_ROWS: usize = 8;
/// Width from which the table shows every column.
const WIDE: u16 = 80;
const BLOCKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

impl ProfilePanel {
    /// F10: hidden → column → full screen → hidden. Returns whether the profile is wanted now.
    pub fn cycle(&mut self) -> bool {
        self.mode = match self.mode {
            ProfileMode::Hidden => ProfileMode::Column,
            ProfileMode::Column => ProfileMode::Full,
            ProfileMode::Full => ProfileMode::Hidden,
        };
        if self.mode == ProfileMode::Hidden {
            self.snapshot = None;
        }
        self.mode != ProfileMode::Hidden
    }

    pub fn apply(&mut self, s: ProfileSnapshot) {
        if self.mode != ProfileMode::Hidden {
            self.snapshot = Some(s);
        }
    }

    /// Rows the panel asks of the column: its frame, the decode table's head and rows.
    pub fn wanted_height(&self) -> u16 {
        let rows = self
            .snapshot
            .as_ref()
            .and_then(|s| s.decode.as_ref().or(s.prompt.as_ref()))
            .map_or(2, |t| {
                3 + t.rows.len().min(COLUMN_ROWS + 1) + usize::from(t.note.is_some())
            });
        rows as u16 + 2
    }

    /// Draws the panel over `area` (`full`: the whole middle of the screen).
    pub fn render(&self, frame: &mut Frame, area: Rect, theme: &Theme) {
        let full = self.mode == ProfileMode::Full;
        if full {
            frame.render_widget(Clear, area);
        }
        let title = match &self.trace_file {
            Some(f) => format!("Profile · tracing to {f}"),
            None if full => "Profile · F10 closes".to_string(),
            None => "Profile".to_string(),
        };
        let Some(inner) = open_panel(frame, area, &title, theme, 16) else {
            return;
        };
        let snap = self.snapshot.as_ref();
        let tables: Vec<&ProfileTable> = snap
            .map(|s| s.decode.iter().chain(s.prompt.iter()).collect())
            .unwrap_or_default();
        if tables.is_empty() {
            panel_note(
                frame,
                inner,
                "Profiling: each op's share of a step shows here after the next decode step \
                 or prompt.",
                theme,
            );
            return;
        }
        let w = usize::from(inner.width);
        let mut lines: Vec<Line<'static>> = Vec::new();
        let room = usize::from(inner.height);
        for (i, t) in tables.iter().enumerate() {
            if i > 0 {
                if !full || lines.len() + 6 > room {
                    break;
                }
                lines.push(Line::default());
            }
            let left = room.saturating_sub(lines.len());
            lines.extend(table_lines(
                t,
                w,
                left,
                full,
                inner.width >= WIDE,
                snap,
                theme,
            ));
        }
        frame.render_widget(Paragraph::new(lines), inner);
    }
}

/// `▁▃█`: the last `width` values, scaled to their largest.
pub fn spark(values: &[f32], width: usize) -> String {
    let tail = &values[values.len().saturating_sub(width)..];
    let max = tail.iter().copied().fold(0.0f32, f32::max);
    tail.iter()
        .map(|&v| {
            if max <= 0.0 {
                BLOCKS[0]
            } else {
                BLOCKS[((v / max) * 7.0).round().clamp(0.0, 7.0) as usize]
            }
        })
        .collect()
}

/// Microseconds in at most 7 columns.
fn us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn pct(v: Option<f64>) -> String {
    v.map_or("—".into(), |v| format!("{:.0}%", 100.0 * v))
}

#[allow(clippy::too_many_arguments)]
fn table_lines(
    t: &ProfileTable,
    w: usize,
    room: usize,
    full: bool,
    wide: bool,
    snap: Option<&ProfileSnapshot>,
    theme: &Theme,
) -> Vec<Line<'static>> {
    let mut out = Vec::new();
    let steps = if t.kind == "decode" {
        format!("{} steps", t.steps)
    } else {
        format!("{} batches, {} tokens", t.steps, t.tokens)
    };
    let head = format!(
        "{} · {steps} · {} µs/step · {:.1} t/s",
        t.kind,
        us(t.wall_us),
        t.tokens_per_s()
    );
    out.push(Line::from(text(ellipsize(&head, w), theme.key)));
    let label = "step ";
    out.push(Line::from(vec![
        text(label, theme.dim),
        text(
            spark(&t.step_us, w.saturating_sub(label.len())),
            theme.sparkline,
        ),
    ]));
    // Columns: op, [calls], µs, share, [bytes, GB/s], bound, sparkline.
    let op_w = if wide {
        26
    } else {
        w.saturating_sub(24).clamp(6, 18)
    };
    let fixed = if wide {
        op_w + 7 + 10 + 7 + 10 + 8 + 6
    } else {
        op_w + 8 + 6 + 5
    };
    let spark_w = w.saturating_sub(fixed + 1);
    let header = if wide {
        format!(
            "{:<op_w$} {:>6} {:>9} {:>6} {:>9} {:>7} {:>5} {}",
            "op", "calls", "µs/step", "share", "bytes", "GB/s", "bound", "per step"
        )
    } else {
        format!(
            "{:<op_w$} {:>7} {:>5} {:>4} {}",
            "op", "µs/step", "share", "bnd", "per step"
        )
    };
    out.push(Line::from(text(ellipsize(&header, w), theme.dim)));
    let (ops, host): (Vec<&ProfileRow>, Vec<&ProfileRow>) =
        t.rows.iter().partition(|r| r.op != HOST_ROW);
    let note_rows = usize::from(t.note.is_some() && full) * 2;
    let max_rows = if full {
        room.saturating_sub(out.len() + host.len() + note_rows)
    } else {
        COLUMN_ROWS.min(room.saturating_sub(out.len() + host.len()))
    };
    // A last row says how many did not fit.
    let shown = if ops.len() > max_rows {
        max_rows.saturating_sub(1)
    } else {
        ops.len()
    };
    for r in ops.iter().take(shown).chain(host.iter()) {
        let is_host = r.op == HOST_ROW;
        let cells = if wide {
            format!(
                "{:<op_w$} {:>6} {:>9} {:>5.1}% {:>9} {:>7} {:>5} ",
                ellipsize(&r.op, op_w),
                if is_host {
                    String::new()
                } else {
                    format!("{:.1}", r.calls)
                },
                us(r.us),
                100.0 * r.share,
                r.bytes
                    .map_or("—".into(), crate::gpu::trace::profile::human),
                r.gbps.map_or("—".into(), |g| format!("{g:.1}")),
                pct(r.bound),
            )
        } else {
            format!(
                "{:<op_w$} {:>7} {:>4.0}% {:>4} ",
                ellipsize(&r.op, op_w),
                us(r.us),
                100.0 * r.share,
                pct(r.bound),
            )
        };
        let style = if is_host { theme.slow } else { theme.text };
        out.push(Line::from(vec![
            Span::styled(cells, style),
            text(spark(&r.per_step, spark_w), theme.sparkline),
        ]));
    }
    if shown < ops.len() {
        let more = format!("… {} more op families", ops.len() - shown);
        out.push(Line::from(text(ellipsize(&more, w), theme.dim)));
    }
    if let Some(n) = &t.note {
        if full {
            for l in wrap_words(n, w, 2) {
                out.push(Line::from(text(l, theme.dim)));
            }
        } else {
            out.push(Line::from(text(
                ellipsize("graph replay hides kernels: --no-graphs", w),
                theme.dim,
            )));
        }
    }
    if let Some(s) = snap.filter(|s| s.dropped > 0 && full) {
        out.push(Line::from(text(
            format!("{} events dropped: the collector fell behind", s.dropped),
            theme.slow,
        )));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparklines_scale_to_the_largest_value_and_keep_the_newest() {
        assert_eq!(spark(&[0.0, 1.0, 2.0, 4.0], 4), "▁▃▅█");
        assert_eq!(spark(&[9.0, 1.0, 1.0], 2), "██");
        assert_eq!(spark(&[0.0, 0.0], 5), "▁▁");
        assert_eq!(spark(&[], 5), "");
    }

    #[test]
    fn f10_cycles_column_full_hidden() {
        let mut p = ProfilePanel::default();
        assert!(p.cycle());
        assert_eq!(p.mode, ProfileMode::Column);
        assert!(p.cycle());
        assert_eq!(p.mode, ProfileMode::Full);
        assert!(!p.cycle());
        assert_eq!(p.mode, ProfileMode::Hidden);
        // A snapshot arriving after it was hidden is not kept.
        p.apply(ProfileSnapshot::default());
        assert!(p.snapshot.is_none());
    }
}
