//! `hipscope top --remote`: a remote engine's own numbers full screen (requests running and
//! waiting, KV-cache use with its history, slots, server-side latencies, loaded models), each
//! marked with the endpoint it came from; and the same as plain text for `--once`.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::Line;
use ratatui::widgets::Paragraph;

use super::meter::{bar, history, open_panel, text};
use super::series::Series;
use super::theme::Theme;
use super::units;
use crate::model::remote::panels::RemoteSample;

#[derive(Clone, Debug, Default)]
pub struct RemoteTopView {
    pub sample: Option<RemoteSample>,
    /// KV-cache use in thousandths, requests running and waiting: one value per sample.
    kv: Series,
    running: Series,
    waiting: Series,
}

impl RemoteTopView {
    pub fn apply(&mut self, s: RemoteSample) {
        if let Some(u) = s.kv_usage {
            self.kv.push((u.clamp(0.0, 1.0) * 1000.0) as u64);
        }
        self.running.push(s.running.unwrap_or(0.0).max(0.0) as u64);
        self.waiting.push(s.waiting.unwrap_or(0.0).max(0.0) as u64);
        self.sample = Some(s);
    }

    pub fn render(&self, frame: &mut Frame, area: Rect, theme: &Theme) {
        let Some(s) = &self.sample else {
            let Some(inner) = open_panel(frame, area, "hipscope top --remote", theme, 8) else {
                return;
            };
            frame.render_widget(
                Paragraph::new(text("Reading the server…  (q quits)", theme.dim)),
                inner,
            );
            return;
        };
        let title = format!("{} at {} · q quits", s.server, s.host);
        let Some(inner) = open_panel(frame, area, &title, theme, 8) else {
            return;
        };
        let w = usize::from(inner.width);
        let lines = lines(s, w, theme);
        let n = lines.len() as u16;
        let [top, graphs] =
            Layout::vertical([Constraint::Length(n.min(inner.height)), Constraint::Min(0)])
                .areas(inner);
        frame.render_widget(Paragraph::new(lines), top);
        if graphs.height >= 2 {
            let [a, b] = Layout::vertical([Constraint::Fill(1), Constraint::Fill(1)]).areas(graphs);
            history(
                frame,
                a,
                "KV-cache use over time (‰)",
                &self.kv,
                1000,
                theme.sparkline,
                theme,
            );
            let max = self.running.max().max(self.waiting.max()).max(1);
            history(
                frame,
                b,
                "requests running over time",
                &self.running,
                max,
                theme.sparkline,
                theme,
            );
        }
    }
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".into())
}

fn lines(s: &RemoteSample, w: usize, theme: &Theme) -> Vec<Line<'static>> {
    let mut out = Vec::new();
    let health = s.health.clone().unwrap_or_else(|| "-".into());
    out.push(Line::from(vec![
        text("health ", theme.dim),
        text(
            health.clone(),
            if health == "ok" { theme.ok } else { theme.hung },
        ),
        text("  version ", theme.dim),
        text(s.version.clone().unwrap_or_else(|| "-".into()), theme.text),
    ]));
    if let Some(m) = &s.model {
        out.push(Line::from(vec![
            text("model ", theme.dim),
            text(m.clone(), theme.text),
        ]));
    }
    out.push(Line::from(vec![
        text("requests ", theme.dim),
        text(
            format!(
                "{} running, {} waiting",
                opt(s.running, |v| format!("{v:.0}")),
                opt(s.waiting, |v| format!("{v:.0}"))
            ),
            theme.text,
        ),
        text(
            s.preemptions
                .map(|p| format!("  {p:.0} preemptions"))
                .unwrap_or_default(),
            theme.dim,
        ),
    ]));
    if let Some(u) = s.kv_usage {
        let amount = match s.kv_tokens {
            Some((h, c)) => format!("{h} / {c} tokens"),
            None => format!("{:.1}%", u * 100.0),
        };
        out.push(Line::from(vec![
            text("KV cache ", theme.dim),
            text(amount, theme.text),
            text(
                format!("  ({})", s.kv_source.clone().unwrap_or_default()),
                theme.dim,
            ),
        ]));
        out.push(Line::from(text(
            bar(u, w),
            if u > 0.9 {
                theme.gauge_warn
            } else {
                theme.gauge
            },
        )));
    }
    let lat: Vec<String> = [
        s.ttft_mean_s.map(|v| format!("TTFT mean {}", ms(v))),
        s.itl_mean_s.map(|v| format!("inter-token mean {}", ms(v))),
        s.prompt_tps
            .map(|v| format!("prompt {}", units::rate(v, "tok/s"))),
        s.gen_tps
            .map(|v| format!("generation {}", units::rate(v, "tok/s"))),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !lat.is_empty() {
        out.push(Line::from(vec![
            text("server ", theme.dim),
            text(lat.join("  "), theme.text),
        ]));
    }
    for slot in &s.slots {
        out.push(Line::from(vec![
            text(format!("slot {:<3}", slot.id), theme.dim),
            text(
                if slot.processing {
                    "processing "
                } else {
                    "idle       "
                },
                if slot.processing { theme.ok } else { theme.dim },
            ),
            text(
                format!(
                    "{} / {} tokens{}",
                    slot.tokens.unwrap_or(0),
                    slot.n_ctx,
                    slot.decoded
                        .filter(|_| slot.processing)
                        .map(|d| format!(", {d} generated"))
                        .unwrap_or_default()
                ),
                theme.text,
            ),
        ]));
    }
    for m in &s.loaded {
        out.push(Line::from(vec![
            text(format!("{} ", m.name), theme.text),
            text(
                format!(
                    "{} in VRAM of {}, loaded until {}",
                    units::bytes(m.size_vram),
                    units::bytes(m.size),
                    m.expires_at
                ),
                theme.dim,
            ),
        ]));
    }
    for n in &s.notes {
        out.push(Line::from(text(format!("note: {n}"), theme.notice)));
    }
    out
}

fn ms(seconds: f64) -> String {
    format!("{:.1} ms", seconds * 1e3)
}

/// `top --remote --once` without `--json`: the same readings as plain lines.
pub fn text_report(s: &RemoteSample) -> String {
    let theme = Theme::new(super::theme::ThemeName::Mono);
    let mut o = format!("{} at {}\n", s.server, s.host);
    for l in lines(s, 40, &theme) {
        let t: String = l.spans.iter().map(|sp| sp.content.as_ref()).collect();
        o.push_str(t.trim_end());
        o.push('\n');
    }
    o
}
