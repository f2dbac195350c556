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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::scheduler::{QueuedSnapshot, SlotState};
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    fn screen_text(s: &ServeScreen) -> String {
        let mut t = Terminal::new(TestBackend::new(140, 30)).unwrap();
        t.draw(|f| s.render(f)).unwrap();
        let buf = t.backend().buffer().clone();
        (0..buf.area.height)
            .map(|y| {
                (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol().to_string())
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn the_requests_panel_shows_each_slot_the_queue_and_a_hang() {
        let device = DeviceSummary {
            backend: "cpu".into(),
            name: "CPU".into(),
            ..DeviceSummary::default()
        };
        let mut s = ServeScreen::new(
            "serving SmolLM2 on http://127.0.0.1:8080".into(),
            Theme::new(crate::ui::theme::ThemeName::Mono),
            device,
        );
        let mut snap = ServeSnapshot::idle(2, 1024);
        snap.slots[0].request = Some(7);
        snap.slots[0].client = "127.0.0.1:50000".into();
        snap.slots[0].state = SlotState::Generating;
        snap.slots[0].prompt_tokens = 31;
        snap.slots[0].generated = 12;
        snap.slots[0].tokens_per_s = Some(42.5);
        snap.slots[0].ttft = Some(Duration::from_millis(180));
        snap.slots[1].held = 55;
        snap.queued.push(QueuedSnapshot {
            id: 8,
            client: "127.0.0.1:50001".into(),
            prompt_tokens: 20,
            waiting: Duration::from_millis(300),
        });
        s.apply_snapshot(snap);
        s.hang = Some("HUNG: layer 15 · stuck op — failed requests [7]".into());
        let text = screen_text(&s);
        for want in [
            "Requests · 1 of 2 slots busy · 1 queued",
            "127.0.0.1:50000",
            "generating",
            "42.5",
            "(55 held)",
            "#8",
            "HUNG: layer 15",
            "Streams",
            "Watchdog",
            "q stop serving",
        ] {
            assert!(text.contains(want), "{want:?} missing from\n{text}");
        }
    }
}
