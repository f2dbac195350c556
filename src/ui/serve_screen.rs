//! `hipscope serve`'s full-screen view: the Requests panel beside the device's Streams, Arena,
//! Watchdog and GPU panels (the chat's own panels), a title line and a key line. State changes
//! in `apply_*`; drawing is a pure function of it.

use std::time::Duration;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout};
use ratatui::text::Line;
use ratatui::widgets::Paragraph;

use crate::gpu::snapshot::{DeviceSummary, StreamSnapshot, TelemetrySample, WatchdogSnapshot};
use crate::model::scheduler::ServeSnapshot;

use super::arena::ArenaPanel;
use super::gpu::GpuPanel;
use super::meter::{ellipsize, text};
use super::requests;
use super::streams::StreamsPanel;
use super::theme::Theme;
use super::watchdog::WatchdogPanel;

pub struct ServeScreen {
    pub title: String,
    pub theme: Theme,
    pub device: DeviceSummary,
    pub snapshot: ServeSnapshot,
    /// A hang the watchdog called, with the requests it stopped.
    pub hang: Option<String>,
    pub stopping: bool,
    streams: StreamsPanel,
    arena: ArenaPanel,
    watchdog: WatchdogPanel,
    gpu: GpuPanel,
}

impl ServeScreen {
    pub fn new(title: String, theme: Theme, device: DeviceSummary) -> ServeScreen {
        let mut gpu = GpuPanel::default();
        gpu.set_device(device.clone());
        ServeScreen {
            title,
            theme,
            device,
            snapshot: ServeSnapshot::default(),
            hang: None,
            stopping: false,
            streams: StreamsPanel::default(),
            arena: ArenaPanel::default(),
            watchdog: WatchdogPanel::default(),
            gpu,
        }
    }

    pub fn apply_snapshot(&mut self, s: ServeSnapshot) {
        if let Some(a) = s.arena.clone() {
            self.arena.apply(a);
        }
        self.snapshot = s;
    }

    pub fn apply_streams(&mut self, s: Vec<StreamSnapshot>, now: Duration) {
        self.streams.apply(s, now);
    }

    pub fn apply_watchdog(&mut self, s: WatchdogSnapshot) {
        self.watchdog.apply(s);
    }

    pub fn apply_telemetry(&mut self, t: TelemetrySample) {
        self.gpu.apply(t);
    }

    pub fn render(&self, frame: &mut Frame) {
        let t = &self.theme;
        let [top, body, keys] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Min(4),
            Constraint::Length(1),
        ])
        .areas(frame.area());
        let w = usize::from(top.width);
        frame.render_widget(
            Paragraph::new(Line::from(text(ellipsize(&self.title, w), t.title))),
            top,
        );
        let [left, right] =
            Layout::horizontal([Constraint::Percentage(58), Constraint::Percentage(42)])
                .areas(body);
        requests::render(frame, left, t, &self.snapshot, self.hang.as_deref());
        let dev = Some(&self.device);
        let [s, a, wd, g] = Layout::vertical([
            Constraint::Length(self.streams.wanted_height(dev)),
            Constraint::Length(self.arena.wanted_height()),
            Constraint::Length(self.watchdog.wanted_height()),
            Constraint::Min(3),
        ])
        .areas(right);
        self.streams.render(frame, s, t, dev);
        let held: usize = self.snapshot.slots.iter().map(|x| x.held).sum();
        let ctx = self.snapshot.n_ctx * self.snapshot.slots.len();
        self.arena.render(
            frame,
            a,
            t,
            dev,
            self.gpu.host.as_ref(),
            None,
            Some((Some(held), ctx)),
        );
        self.watchdog.render(frame, wd, t);
        self.gpu.render(frame, g, t);
        let k = if self.stopping {
            "stopping: finishing the requests in flight…"
        } else {
            "q stop serving · Ctrl-C stop serving (twice: at once)"
        };
        frame.render_widget(
            Paragraph::new(Line::from(text(ellipsize(k, w), t.dim))),
            keys,
        );
    }
}
