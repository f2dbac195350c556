//! `hipscope top`: the telemetry full screen, every GPU with its readings and utilization
//! history, the host, and the processes using the GPUs (as nvtop lists them). State changes only
//! in [`TopView::apply`]; [`TopView::render`] is a pure function of it.

use std::collections::BTreeMap;

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::Paragraph;

use crate::gpu::snapshot::{GpuReading, TelemetrySample};
use crate::gpu::telemetry::PowerScope;

use super::meter::{bar, ellipsize, history, open_panel, text, wrap_words};
use super::series::Series;
use super::theme::Theme;
use super::units::{self, ratio};

#[derive(Clone, Debug, Default)]
pub struct TopView {
    pub sample: Option<TelemetrySample>,
    /// Utilization history per GPU id.
    util: BTreeMap<String, Series>,
    samples: u64,
}

impl TopView {
    pub fn apply(&mut self, sample: TelemetrySample) {
        for g in &sample.gpus {
            let s = self
                .util
                .entry(g.id.clone())
                .or_insert_with(|| Series::new(240));
            if let Some(u) = g.gpu_util_pct {
                s.push(u.clamp(0.0, 100.0).round() as u64);
            }
        }
        self.samples += 1;
        self.sample = Some(sample);
    }

    pub fn render(&self, frame: &mut Frame, area: Rect, theme: &Theme) {
        let Some(s) = &self.sample else {
            frame.render_widget(
                Paragraph::new(Line::from(text("sampling…", theme.dim))),
                area,
            );
            return;
        };
        let header = format!(
            " hipscope top · {} GPU{} · {} sample{} · q quits",
            s.gpus.len(),
            if s.gpus.len() == 1 { "" } else { "s" },
            self.samples,
            if self.samples == 1 { "" } else { "s" },
        );
        let mut y = area.y;
        frame.render_widget(
            Paragraph::new(Line::from(text(
                format!("{header:<w$}", w = usize::from(area.width)),
                theme.header,
            ))),
            Rect::new(area.x, y, area.width, 1),
        );
        y += 1;
        let w = usize::from(area.width);
        let h = &s.host;
        let mut host = vec![text("host  ", theme.dim)];
        if let Some(c) = h.cpu_pct {
            host.push(text(format!("cpu {c:.0}%  "), theme.text));
        }
        if let (Some(u), Some(t)) = (h.mem_used, h.mem_total) {
            host.push(text(
                format!("memory {} / {}", units::bytes(u), units::bytes(t)),
                theme.text,
            ));
        }
        frame.render_widget(
            Paragraph::new(Line::from(host)),
            Rect::new(area.x, y, area.width, 1),
        );
        y += 1;
        // The notes (with no GPU, the verdict: what runs, the next step per vendor), wrapped.
        let notes: Vec<String> = s
            .notes
            .iter()
            .flat_map(|n| wrap_words(n, w.max(1), 3))
            .take(6)
            .collect();
        for line in notes {
            if y >= area.bottom() {
                break;
            }
            frame.render_widget(
                Paragraph::new(Line::from(text(line, theme.notice))),
                Rect::new(area.x, y, area.width, 1),
            );
            y += 1;
        }
        // Each GPU gets a box; the processes take what is left (at least a few rows).
        let procs_rows = (s.processes.len() as u16 + 3).clamp(4, 12);
        let room = area.bottom().saturating_sub(y).saturating_sub(procs_rows);
        let per_gpu = if s.gpus.is_empty() {
            0
        } else {
            (room / s.gpus.len() as u16).clamp(0, 12)
        };
        for g in &s.gpus {
            if per_gpu < 5 || y + per_gpu > area.bottom() {
                break;
            }
            self.gpu_box(frame, Rect::new(area.x, y, area.width, per_gpu), g, theme);
            y += per_gpu;
        }
        if y + 2 <= area.bottom() {
            let rect = Rect::new(area.x, y, area.width, area.bottom() - y);
            processes(frame, rect, s, w, theme);
        }
    }

    fn gpu_box(&self, frame: &mut Frame, area: Rect, g: &GpuReading, theme: &Theme) {
        let mut title = g.name.clone();
        if let Some(a) = &g.arch {
            title.push_str(&format!(" [{a}]"));
        }
        title.push_str(if g.apu { " · APU" } else { "" });
        if g.ours {
            title.push_str(" · hipscope");
        }
        let Some(inner) = open_panel(frame, area, &format!("{} {}", g.id, title), theme, 3) else {
            return;
        };
        let w = usize::from(inner.width);
        let bar_w = (w / 3).clamp(8, 30);
        let mut lines = Vec::new();
        if g.suspended {
            lines.push(Line::from(text(
                "runtime-suspended: not woken to be read",
                theme.dim,
            )));
        }
        if let Some(u) = g.gpu_util_pct {
            lines.push(Line::from(vec![
                text(format!("{:<7}", "util"), theme.dim),
                text(bar(f64::from(u) / 100.0, bar_w), theme.gauge),
                text(format!(" {u:.0}%"), theme.text),
            ]));
        }
        if let Some((name, used, total)) = g.headline_memory() {
            lines.push(Line::from(vec![
                text(format!("{:<7}", name.to_lowercase()), theme.dim),
                text(bar(ratio(used, total), bar_w), theme.gauge),
                text(
                    format!(" {} / {}", units::bytes(used), units::bytes(total)),
                    theme.text,
                ),
            ]));
        }
        let mut now = Vec::new();
        if let Some(t) = g.temp_edge_c {
            now.push(format!("{t:.0} °C"));
        }
        if let Some(t) = g.temp_junction_c {
            now.push(format!("hot {t:.0} °C"));
        }
        if let Some(t) = g.temp_mem_c {
            now.push(format!("mem {t:.0} °C"));
        }
        if let Some(p) = g.power_w {
            now.push(match g.power_scope {
                PowerScope::Package => format!("{p:.0} W package"),
                PowerScope::Gpu => format!("{p:.0} W"),
            });
        }
        if let Some(p) = g.gpu_power_w {
            now.push(format!("gpu {p:.0} W"));
        }
        if let Some(c) = g.sclk_mhz {
            now.push(format!("sclk {c} MHz"));
        }
        if let Some(c) = g.mclk_mhz {
            now.push(format!("mclk {c} MHz"));
        }
        match (g.fan_rpm, g.fan_pct) {
            (Some(r), _) => now.push(format!("fan {r} rpm")),
            (None, Some(p)) => now.push(format!("fan {p:.0}%")),
            _ => {}
        }
        if let (Some(s), Some(wd)) = (&g.pcie_speed, g.pcie_width) {
            now.push(format!("x{wd} {s}"));
        }
        if !now.is_empty() {
            lines.push(Line::from(text(ellipsize(&now.join(" · "), w), theme.text)));
        }
        // Where each number came from: `sysfs: util vram … · hwmon: temp power …`.
        let from: Vec<String> = g
            .sources()
            .into_iter()
            .map(|(src, labels)| format!("{}: {}", g.source_label(src), labels.join(", ")))
            .collect();
        if !from.is_empty() {
            let v = format!("from {}", from.join(" · "));
            for l in wrap_words(&v, w, 2) {
                lines.push(Line::from(text(l, theme.dim)));
            }
        }
        let rows = (lines.len() as u16).min(inner.height);
        frame.render_widget(
            Paragraph::new(lines),
            Rect::new(inner.x, inner.y, inner.width, rows),
        );
        let left = inner.height - rows;
        if let Some(series) = self.util.get(&g.id).filter(|s| s.len() >= 2)
            && left >= 2
        {
            history(
                frame,
                Rect::new(inner.x, inner.y + rows, inner.width, left),
                "util %",
                series,
                100,
                theme.sparkline,
                theme,
            );
        }
    }
}

fn processes(frame: &mut Frame, area: Rect, s: &TelemetrySample, w: usize, theme: &Theme) {
    let mut lines = vec![Line::from(text(
        format!(
            "{:<w$}",
            format!(
                "{:>8}  {:<16} {:<9} {:>10} {:>10}",
                "PID", "NAME", "GPU", "VRAM", "GTT"
            )
        ),
        theme.header,
    ))];
    if s.processes.is_empty() {
        lines.push(Line::from(text(
            "no process we may read has a GPU open",
            theme.dim,
        )));
    }
    let dash = || "-".to_string();
    for p in &s.processes {
        let row = format!(
            "{:>8}  {:<16} {:<9} {:>10} {:>10}{}",
            p.pid,
            ellipsize(&p.name, 16),
            p.gpu,
            p.vram.map(units::bytes).unwrap_or_else(dash),
            p.gtt.map(units::bytes).unwrap_or_else(dash),
            if p.ours { "  (hipscope)" } else { "" }
        );
        lines.push(Line::from(text(
            row,
            if p.ours { theme.title } else { theme.text },
        )));
    }
    frame.render_widget(Paragraph::new(lines), area);
}
