//! The Watchdog panel (state, op, age against budget) and the HUNG banner shown above the chat.

use std::time::Duration;

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};

use crate::gpu::cpu::CPU_STREAM;
use crate::gpu::snapshot::{REMOTE_STREAM, WatchState, WatchdogSnapshot};

use super::meter::{
    bar, ellipsize, ellipsize_start, history, lines_on_top, open_panel, panel_note, text,
};
use super::series::Series;
use super::theme::Theme;
use super::units::{self};

#[derive(Clone, Debug, Default)]
pub struct WatchdogPanel {
    pub snapshot: Option<WatchdogSnapshot>,
    /// The age of the oldest op in flight at each check, in milliseconds (0 when idle).
    age_ms: Series,
}

pub fn state_label(state: WatchState) -> &'static str {
    match state {
        WatchState::Ok => "OK",
        WatchState::Slow => "SLOW",
        WatchState::Hung => "HUNG",
    }
}

/// What the watchdog watches, in one word for the header: the GPU's stream, the CPU backend's
/// ops, or a remote engine's request.
pub fn watched(s: &WatchdogSnapshot) -> &'static str {
    if s.is_remote() {
        "SERVER"
    } else if s.stream == CPU_STREAM {
        "CPU"
    } else {
        "GPU"
    }
}

/// What is in flight on the watched stream, in words that are true of it: a device queue (or a
/// server's) holds work; the CPU backend has no queue, it runs each op on the worker thread as it
/// is issued.
fn in_flight(s: &WatchdogSnapshot) -> String {
    match (watched(s), s.queue_depth) {
        ("CPU", 0) => "idle".to_string(),
        ("CPU", _) => "an op running".to_string(),
        (_, n) => format!("{n} queued"),
    }
}

pub fn state_style(state: WatchState, theme: &Theme) -> ratatui::style::Style {
    match state {
        WatchState::Ok => theme.ok,
        WatchState::Slow => theme.slow,
        WatchState::Hung => theme.hung,
    }
}

impl WatchdogPanel {
    pub fn apply(&mut self, snapshot: WatchdogSnapshot) {
        let age = if snapshot.op.is_some() {
            snapshot.age.as_millis().min(u128::from(u64::MAX)) as u64
        } else {
            0
        };
        self.age_ms.push(age);
        self.snapshot = Some(snapshot);
    }

    pub fn is_hung(&self) -> bool {
        self.snapshot
            .as_ref()
            .is_some_and(|s| s.state == WatchState::Hung)
    }

    pub fn wanted_height(&self) -> u16 {
        match &self.snapshot {
            // State, op, age and last; with an op in flight also whether it started and the
            // age's bar.
            Some(s) => {
                2 + 4
                    + 2 * u16::from(s.op.is_some())
                    + u16::from(s.event_queries_stuck)
                    + u16::from(s.report.is_some())
            }
            None => 5,
        }
    }

    pub fn render(&self, frame: &mut Frame, area: Rect, theme: &Theme) {
        let Some(inner) = open_panel(frame, area, "Watchdog", theme, 8) else {
            return;
        };
        let w = usize::from(inner.width);
        // The watchdog starts with the device (the CPU backend's ops too) and reports at once.
        let Some(s) = &self.snapshot else {
            panel_note(frame, inner, "No check yet.", theme);
            return;
        };
        let label_w = 7;
        let what = in_flight(s);
        let mut lines = vec![Line::from(vec![
            text("● ", state_style(s.state, theme)),
            text(state_label(s.state), state_style(s.state, theme)),
            text(
                format!(
                    "  {} · {what}",
                    ellipsize(&s.stream, w.saturating_sub(12 + what.chars().count())),
                ),
                theme.dim,
            ),
        ])];
        let value_w = w.saturating_sub(label_w);
        lines.push(Line::from(vec![
            text(format!("{:<label_w$}", "op"), theme.dim),
            text(
                ellipsize(s.op.as_deref().unwrap_or("–"), value_w),
                theme.text,
            ),
        ]));
        if s.op.is_some() {
            // The breadcrumb says whether the kernel began: running long, or never launched.
            let (what, style) = match (s.is_remote(), s.op_started) {
                (false, true) => ("started (breadcrumb seen)", theme.dim),
                (false, false) => ("queued, not started yet", theme.slow),
                (true, true) => ("the server has started answering", theme.dim),
                (true, false) => ("no answer from the server yet", theme.slow),
            };
            lines.push(Line::from(vec![
                text(format!("{:<label_w$}", ""), theme.dim),
                text(ellipsize(what, value_w), style),
            ]));
        }
        if s.op.is_some() {
            let age = format!(
                "{} of {}",
                units::duration(s.age),
                units::duration(s.budget)
            );
            lines.push(Line::from(vec![
                text(format!("{:<label_w$}", "age"), theme.dim),
                text(age, state_style(s.state, theme)),
            ]));
            let frac = if s.budget.is_zero() {
                0.0
            } else {
                s.age.as_secs_f64() / s.budget.as_secs_f64()
            };
            lines.push(Line::from(vec![
                text(format!("{:<label_w$}", ""), theme.dim),
                text(bar(frac, value_w), state_style(s.state, theme)),
            ]));
        } else {
            // Nothing in flight has no age and no budget to be measured against.
            lines.push(Line::from(vec![
                text(format!("{:<label_w$}", "age"), theme.dim),
                text("– (nothing in flight)", theme.dim),
            ]));
        }
        lines.push(Line::from(vec![
            text(format!("{:<label_w$}", "last"), theme.dim),
            text(
                ellipsize(s.last_completed.as_deref().unwrap_or("–"), value_w),
                theme.dim,
            ),
        ]));
        if s.event_queries_stuck {
            lines.push(Line::from(text(
                ellipsize("event queries stuck: judged by breadcrumbs", w),
                theme.slow,
            )));
        }
        if let Some(report) = &s.report {
            lines.push(Line::from(vec![
                text(format!("{:<label_w$}", "report"), theme.dim),
                text(
                    ellipsize_start(&report.display().to_string(), value_w),
                    theme.text,
                ),
            ]));
        }
        // Spare rows (a taller panel) show how old the oldest op has been at each check,
        // against the budget: a queue that stalls now and then shows up as spikes.
        let spare = lines_on_top(frame, inner, lines);
        if self.age_ms.len() > 1 {
            let budget_ms = s.budget.as_millis().min(u128::from(u64::MAX)) as u64;
            let peak = Duration::from_millis(self.age_ms.max());
            let label = format!(
                "op age over time · peak {} / {}",
                units::duration(peak),
                units::duration(s.budget)
            );
            history(
                frame,
                spare,
                &label,
                &self.age_ms,
                budget_ms,
                state_style(s.state, theme),
                theme,
            );
        }
    }

    /// Rows the HUNG banner needs (0 when nothing is hung).
    pub fn banner_height(&self) -> u16 {
        match &self.snapshot {
            Some(s) if s.state == WatchState::Hung && s.is_remote() => 3,
            _ if self.is_hung() => 5,
            _ => 0,
        }
    }

    /// The prominent banner: what is stuck, where the report is, what the user can do.
    pub fn render_banner(&self, frame: &mut Frame, area: Rect, theme: &Theme) {
        let Some(s) = self
            .snapshot
            .as_ref()
            .filter(|s| s.state == WatchState::Hung)
        else {
            return;
        };
        if s.is_remote() {
            let lines = vec![
                Line::from(vec![
                    text(" ⚠ SERVER HUNG ", theme.hung_banner),
                    text(
                        format!(
                            " nothing for {} (budget {}) from {}: {}",
                            units::duration(s.age),
                            units::duration(s.budget),
                            &s.stream[REMOTE_STREAM.len()..],
                            s.op.as_deref().unwrap_or("the request")
                        ),
                        theme.hung,
                    ),
                ]),
                Line::from(vec![
                    text("   You can ", theme.text),
                    text("wait", theme.key),
                    text(" · ", theme.text),
                    text("Esc", theme.key),
                    text(" cancels the request · ", theme.text),
                    text("Alt-R", theme.key),
                    text(" then asks again · ", theme.text),
                    text("Ctrl-C", theme.key),
                    text(" quits", theme.text),
                ]),
            ];
            hung_banner(frame, area, lines, theme);
            return;
        }
        let op = s.op.as_deref().unwrap_or("an op");
        let stuck = if s.op_started {
            "has not finished after"
        } else {
            "was queued and has not started after"
        };
        let mut lines = vec![
            Line::from(vec![
                text(format!(" ⚠ {} HUNG ", hung_device(s)), theme.hung_banner),
                text(
                    format!(
                        " {op} {stuck} {} (budget {}) on {}",
                        units::duration(s.age),
                        units::duration(s.budget),
                        s.stream
                    ),
                    theme.hung,
                ),
            ]),
            Line::from(text(
                format!(
                    "   last completed: {} · {} ops queued behind it{}",
                    s.last_completed.as_deref().unwrap_or("none"),
                    s.queue_depth,
                    if s.event_queries_stuck {
                        " · the runtime's event queries stopped answering too"
                    } else {
                        ""
                    }
                ),
                theme.text,
            )),
        ];
        lines.push(Line::from(match (&s.report, &s.report_error) {
            (Some(p), _) => text(format!("   report written to {}", p.display()), theme.text),
            (None, Some(e)) => text(format!("   no report could be written: {e}"), theme.hung),
            (None, None) => text("   the watchdog is writing a report…", theme.dim),
        }));
        lines.push(Line::from(vec![
            text("   You can ", theme.text),
            text("wait", theme.key),
            text(" (it may still finish) · ", theme.text),
            text("/save", theme.key),
            text(" the conversation · ", theme.text),
            text("Ctrl-C", theme.key),
            text(" quits (press it again to leave at once)", theme.text),
        ]));
        hung_banner(frame, area, lines, theme);
    }
}

/// The HUNG banner's lines over the panel's bottom rule, in the hung colour.
fn hung_banner(frame: &mut Frame, area: Rect, lines: Vec<Line<'static>>, theme: &Theme) {
    frame.render_widget(
        Paragraph::new(lines).wrap(Wrap { trim: false }).block(
            Block::new()
                .borders(Borders::BOTTOM)
                .border_style(theme.hung),
        ),
        area,
    );
}

/// What the hung stream runs on, for the banner and the chat's notice: the CPU backend's own ops
/// or a GPU's stream.
pub fn hung_device(s: &WatchdogSnapshot) -> &'static str {
    if s.stream == CPU_STREAM {
        "CPU"
    } else if s.is_remote() {
        "server"
    } else {
        "GPU"
    }
}
