//! The quit screen: the steps of the synchronized quit as they happen, with their timings.

use std::time::Duration;

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Clear, Paragraph};

use crate::gpu::snapshot::{DeviceRelease, QuitStep, QuitStepStatus};

use super::meter::{centered, ellipsize, spinner, text};
use super::theme::Theme;
use super::units;

/// The quit in progress.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuitState {
    /// When the quit began (time since start).
    pub started: Duration,
    /// Steps in the order they were first reported; a later report of a step updates it.
    pub steps: Vec<QuitStep>,
    /// What asked for the quit (`Ctrl-C`, `/quit`, `SIGTERM`).
    pub reason: String,
    /// How the worker ended, once it has.
    pub exited: Option<WorkerEnd>,
}

/// How the inference worker ended; the app layer turns it into the process's exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerEnd {
    /// It finished its quit (or stopped on its own) and released the device so.
    Released(DeviceRelease),
    /// Its channel closed without a word (the thread died).
    Vanished,
}

impl WorkerEnd {
    pub fn describe(self) -> &'static str {
        match self {
            WorkerEnd::Released(DeviceRelease::Clean) => "device released cleanly",
            WorkerEnd::Released(DeviceRelease::Abandoned) => {
                "the GPU did not answer: device abandoned"
            }
            WorkerEnd::Vanished => "the worker thread ended without a word",
        }
    }
}

impl QuitState {
    pub fn step(&mut self, step: QuitStep) {
        match self.steps.iter_mut().find(|s| s.name == step.name) {
            Some(s) => *s = step,
            None => self.steps.push(step),
        }
    }
}

/// `deadline`: how long after the quit began the app leaves on its own.
pub fn render(
    frame: &mut Frame,
    area: Rect,
    theme: &Theme,
    quit: &QuitState,
    now: Duration,
    deadline: Duration,
    tick: u64,
) {
    let width = area.width.saturating_sub(4).min(64);
    let height = (quit.steps.len().max(1) as u16 + 5).min(area.height);
    let rect = centered(area, width, height);
    frame.render_widget(Clear, rect);
    let inner_w = usize::from(width.saturating_sub(4));
    let time_w = 10;
    let name_w = inner_w.saturating_sub(time_w + 3);
    let mut lines = Vec::new();
    if quit.steps.is_empty() {
        lines.push(Line::from(text(
            format!("{} asking the worker to stop…", spinner(tick)),
            theme.dim,
        )));
    }
    for s in &quit.steps {
        let (icon, icon_style, note) = match &s.status {
            QuitStepStatus::Running => (spinner(tick), theme.slow, None),
            QuitStepStatus::Done => ("✓", theme.ok, None),
            QuitStepStatus::Skipped(why) => ("–", theme.dim, Some(why.clone())),
            QuitStepStatus::Failed(why) => ("✗", theme.error, Some(why.clone())),
        };
        let mut name = s.name.clone();
        if let Some(n) = note {
            name.push_str(&format!(" ({n})"));
        }
        lines.push(Line::from(vec![
            text(format!("{icon} "), icon_style),
            text(format!("{:<name_w$}", ellipsize(&name, name_w)), theme.text),
            text(
                format!("{:>time_w$}", units::duration(s.elapsed)),
                theme.dim,
            ),
        ]));
    }
    lines.push(Line::default());
    let waited = now.saturating_sub(quit.started);
    match quit.exited {
        Some(end) => lines.push(Line::from(text(
            format!(
                "worker finished ({}); restoring the terminal",
                end.describe()
            ),
            theme.ok,
        ))),
        None => lines.push(Line::from(text(
            format!(
                "waited {} · leaving anyway after {}",
                units::duration(waited),
                units::duration(deadline)
            ),
            theme.dim,
        ))),
    }
    lines.push(Line::from(vec![
        Span::styled("Ctrl-C", theme.key),
        Span::styled(
            " again: leave now without waiting for the GPU",
            theme.key_text,
        ),
    ]));
    let title = if quit.reason.is_empty() {
        " Quitting ".to_string()
    } else {
        format!(" Quitting ({}) ", quit.reason)
    };
    frame.render_widget(
        Paragraph::new(lines).block(
            Block::bordered()
                .border_type(BorderType::Rounded)
                .border_style(theme.border_focus)
                .padding(ratatui::widgets::Padding::horizontal(1))
                .title(Span::styled(title, theme.title)),
        ),
        rect,
    );
}
