//! The GPU panel: backend, device, arch and memory now, and the telemetry history (utilization,
//! memory, temperature, power, clocks, fan) as the sampler delivers it. Readings the source lacks are
//! left out, not drawn as zero. On the CPU backend it shows the host; for a remote engine, this
//! chat's latency as measured here (`remote_latency.rs`).

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::Line;

use crate::gpu::snapshot::{DeviceSummary, GpuReading, HostSample, TelemetrySample};

use super::meter::{
    bar, ellipsize, history, lines_on_top, open_panel, panel_note, text, wrap_words,
};
use super::remote_latency::RemoteLatency;
use super::series::Series;
use super::theme::Theme;
use super::units::{self, ratio};
use crate::gpu::telemetry::PowerScope;
use crate::model::protocol::GenStats;

#[derive(Clone, Debug, Default)]
pub struct GpuPanel {
    pub device: Option<DeviceSummary>,
    pub telemetry: Option<TelemetrySample>,
    pub host: Option<HostSample>,
    util: Series,
    power: Series,
    temp: Series,
    mem: Series,
    sclk: Series,
    /// Fan speed in rpm, or in % of its maximum where the source has no rpm (`fan_in_pct`).
    fan: Series,
    fan_in_pct: bool,
    host_cpu: Series,
    own_cpu: Series,
    remote: RemoteLatency,
}

impl GpuPanel {
    pub fn set_device(&mut self, device: DeviceSummary) {
        self.device = Some(device);
    }

    pub fn apply(&mut self, sample: TelemetrySample) {
        if let Some(g) = self.pick(&sample) {
            if let Some(u) = g.gpu_util_pct {
                self.util.push(u.clamp(0.0, 100.0).round() as u64);
            }
            if let Some(p) = g.power_w {
                self.power.push(p.max(0.0).round() as u64);
            }
            if let Some(t) = g.temp_junction_c.or(g.temp_edge_c) {
                self.temp.push(t.max(0.0).round() as u64);
            }
            if let Some((_, used, total)) = g.headline_memory() {
                self.mem.push((ratio(used, total) * 100.0).round() as u64);
            }
            if let Some(c) = g.sclk_mhz {
                self.sclk.push(u64::from(c));
            }
            match (g.fan_rpm, g.fan_pct) {
                (Some(r), _) => {
                    self.fan_in_pct = false;
                    self.fan.push(u64::from(r));
                }
                (None, Some(p)) => {
                    self.fan_in_pct = true;
                    self.fan.push(p.clamp(0.0, 100.0).round() as u64);
                }
                _ => {}
            }
        }
        if sample.host.mem_total.is_some() {
            self.apply_host(sample.host.clone());
        }
        self.telemetry = Some(sample);
    }

    /// The GPU this panel is about: the one hipscope has open, else the first of the backend's
    /// vendor, else the first.
    fn pick<'a>(&self, sample: &'a TelemetrySample) -> Option<&'a GpuReading> {
        let vendor = match self.device.as_ref().map(|d| d.backend.as_str()) {
            Some("hip") => "amd",
            Some("cuda") => "nvidia",
            _ => "",
        };
        sample
            .gpus
            .iter()
            .find(|g| g.ours)
            .or_else(|| sample.gpus.iter().find(|g| g.vendor == vendor))
            .or(sample.gpus.first())
    }

    /// A finished answer: its client-side latency, when the engine is remote (a local model's
    /// answers are timed by the device's own panels).
    pub fn apply_answer(&mut self, stats: &GenStats) {
        if self.is_remote() {
            self.remote.apply_answer(stats);
        }
    }

    fn is_remote(&self) -> bool {
        self.device.as_ref().is_some_and(|d| d.backend == "remote")
    }

    pub fn apply_host(&mut self, sample: HostSample) {
        if let Some(c) = sample.cpu_pct {
            self.host_cpu.push(c.clamp(0.0, 100.0).round() as u64);
        }
        if let Some(c) = sample.own_cpu_pct {
            self.own_cpu.push(c.clamp(0.0, 100.0).round() as u64);
        }
        self.host = Some(sample);
    }

    /// The host is what this panel shows: on the CPU backend, and before any device is open.
    fn is_cpu(&self) -> bool {
        self.device.as_ref().is_none_or(|d| d.backend == "cpu")
    }

    /// The machine's CPU use and hipscope's own share of it, one line each.
    fn cpu_lines(&self, label_w: usize, theme: &Theme) -> Vec<Line<'static>> {
        let Some(h) = &self.host else {
            return Vec::new();
        };
        let mut lines = Vec::new();
        if let Some(c) = h.cpu_pct {
            lines.push(kv("cpu", &format!("{c:>3.0}% machine"), label_w, theme));
        }
        if let Some(c) = h.own_cpu_pct {
            lines.push(kv("", &format!("{c:>3.0}% hipscope"), label_w, theme));
        }
        lines
    }

    pub fn render(&self, frame: &mut Frame, area: Rect, theme: &Theme) {
        let title = if self.is_cpu() {
            "Host"
        } else if self.is_remote() {
            "GPU · remote engine"
        } else {
            "GPU"
        };
        let Some(inner) = open_panel(frame, area, title, theme, 8) else {
            return;
        };
        let w = usize::from(inner.width);
        let label_w = 8;
        let value_w = w.saturating_sub(label_w);
        let Some(d) = &self.device else {
            // No model yet: the host, which is what there is to see.
            let Some(h) = &self.host else {
                panel_note(
                    frame,
                    inner,
                    "No device open yet: it opens with the model.",
                    theme,
                );
                return;
            };
            let mut lines = vec![Line::from(text("no model loaded yet", theme.dim))];
            if let (Some(used), Some(total)) = (h.mem_used, h.mem_total) {
                lines.push(kv(
                    "memory",
                    &format!("{} / {}", units::bytes(used), units::bytes(total)),
                    label_w,
                    theme,
                ));
            }
            lines.extend(self.cpu_lines(label_w, theme));
            let y = lines_on_top(frame, inner, lines).y;
            self.graphs(frame, inner, y, theme);
            return;
        };
        if self.is_remote() {
            // This machine's GPU readings would be about the wrong machine: the server's and
            // this chat's latency instead.
            let mut lines = vec![kv("server", &ellipsize(&d.name, value_w), label_w, theme)];
            lines.extend(self.remote.lines(label_w, theme));
            for l in wrap_words(&d.reason, w, 3) {
                lines.push(Line::from(text(l, theme.dim)));
            }
            let y = lines_on_top(frame, inner, lines).y;
            self.draw_graphs(frame, inner, y, self.remote.graphs(), theme);
            return;
        }
        let mut lines = vec![
            kv("backend", &d.backend, label_w, theme),
            kv("device", &ellipsize(&d.name, value_w), label_w, theme),
        ];
        let mut arch = d.arch.clone();
        if self.is_cpu() {
            if let Some(n) = d.compute_units {
                arch.push_str(&format!(" · {n} threads"));
            }
        } else {
            if let Some(n) = d.compute_units {
                arch.push_str(&format!(" · {n} CUs"));
            }
            if let Some(n) = d.warp_size {
                arch.push_str(&format!(" · wave{n}"));
            }
        }
        lines.push(kv("arch", &ellipsize(&arch, value_w), label_w, theme));
        let t = self.telemetry.as_ref().and_then(|s| self.pick(s));
        let host = self.host.as_ref();
        // Memory in use: the host's on the CPU backend; on a GPU the sampler's VRAM figures,
        // else the runtime's free-memory report.
        let used_total = if self.is_cpu() {
            host.and_then(|h| Some((h.mem_used?, h.mem_total?)))
        } else {
            match t.and_then(|t| t.headline_memory()) {
                Some((_, u, tot)) => Some((u, tot)),
                None => d
                    .total_memory
                    .zip(d.free_memory)
                    .map(|(tot, free)| (tot.saturating_sub(free), tot)),
            }
        };
        let mem_label = match t.and_then(|t| t.headline_memory()) {
            Some(("GTT", ..)) => "gtt",
            _ => "memory",
        };
        match used_total {
            Some((used, total)) => {
                lines.push(kv(
                    mem_label,
                    &format!("{} / {}", units::bytes(used), units::bytes(total)),
                    label_w,
                    theme,
                ));
                lines.push(Line::from(vec![
                    text(format!("{:<label_w$}", ""), theme.dim),
                    text(bar(ratio(used, total), value_w.min(24)), theme.gauge),
                ]));
            }
            None => {
                if let Some(total) = d.total_memory {
                    lines.push(kv("memory", &units::bytes(total), label_w, theme));
                }
            }
        }
        if self.is_cpu() {
            lines.extend(self.cpu_lines(label_w, theme));
        } else {
            if let Some(t) = t {
                let mut now = Vec::new();
                if let Some(u) = t.gpu_util_pct {
                    now.push(format!("{u:.0}%"));
                }
                if let Some(c) = t.temp_edge_c {
                    now.push(format!("{c:.0} °C"));
                }
                if let Some(c) = t.temp_junction_c {
                    now.push(format!("hot {c:.0} °C"));
                }
                if let Some(p) = t.power_w {
                    now.push(match t.power_scope {
                        PowerScope::Package => format!("{p:.0} W package"),
                        PowerScope::Gpu => format!("{p:.0} W"),
                    });
                }
                if !now.is_empty() {
                    lines.push(kv("now", &now.join(" · "), label_w, theme));
                }
                if let Some(p) = t.gpu_power_w {
                    lines.push(kv("gpu pwr", &format!("{p:.0} W"), label_w, theme));
                }
                // The other pool: the carve-out on an APU, GTT beside a discrete card's VRAM.
                let other = if t.apu {
                    t.vram_used.zip(t.vram_total).map(|m| ("vram", m))
                } else {
                    t.gtt_used.zip(t.gtt_total).map(|m| ("gtt", m))
                };
                if let Some((name, (u, tot))) = other {
                    let v = format!("{} / {}", units::bytes(u), units::bytes(tot));
                    lines.push(kv(name, &v, label_w, theme));
                }
                let clocks: Vec<String> = [("sclk", t.sclk_mhz), ("mclk", t.mclk_mhz)]
                    .iter()
                    .filter_map(|(n, v)| v.map(|v| format!("{n} {v} MHz")))
                    .collect();
                if !clocks.is_empty() {
                    lines.push(kv("clocks", &clocks.join(" · "), label_w, theme));
                }
                let mut fan_pcie = Vec::new();
                match (t.fan_rpm, t.fan_pct) {
                    (Some(r), _) => fan_pcie.push(format!("fan {r} rpm")),
                    (None, Some(p)) => fan_pcie.push(format!("fan {p:.0}%")),
                    _ => {}
                }
                if let (Some(s), Some(w)) = (&t.pcie_speed, t.pcie_width) {
                    fan_pcie.push(format!("x{w} {s}"));
                }
                if !fan_pcie.is_empty() {
                    let v = ellipsize(&fan_pcie.join(" · "), value_w);
                    lines.push(kv("", &v, label_w, theme));
                }
                // Which sources these numbers came from (`hipscope top` says which from which).
                let from = t.source_names();
                if !from.is_empty() {
                    let v = ellipsize(&from.join(", "), value_w);
                    lines.push(kv("from", &v, label_w, theme));
                }
            }
        }
        // A model over several GPUs: a line for each other GPU hipscope has open.
        lines.extend(self.other_gpu_lines(label_w, value_w, theme));
        // Whether the decode step is replayed as a graph, and why not.
        if let Some(g) = &d.graphs {
            lines.push(kv("graphs", &ellipsize(g, value_w), label_w, theme));
        }
        // Why this backend: often long (which runtime was missing, which device won), and the
        // first thing to read when the GPU was not used; a few lines of it.
        for l in wrap_words(&d.reason, w, 6) {
            lines.push(Line::from(text(l, theme.dim)));
        }
        let y = lines_on_top(frame, inner, lines).y;
        self.graphs(frame, inner, y, theme);
    }

    /// Every GPU hipscope has open besides the one the panel is about (a split over several):
    /// one line each, its use, power, temperature and memory.
    fn other_gpu_lines(&self, label_w: usize, value_w: usize, theme: &Theme) -> Vec<Line<'static>> {
        let Some(sample) = &self.telemetry else {
            return Vec::new();
        };
        let main = self.pick(sample).map(|g| g.id.as_str());
        let ours: Vec<&GpuReading> = sample.gpus.iter().filter(|g| g.ours).collect();
        if ours.len() < 2 {
            return Vec::new();
        }
        ours.iter()
            .filter(|g| Some(g.id.as_str()) != main)
            .map(|g| {
                let mut v = Vec::new();
                if let Some(u) = g.gpu_util_pct {
                    v.push(format!("{u:.0}%"));
                }
                if let Some(p) = g.power_w {
                    v.push(format!("{p:.0} W"));
                }
                if let Some(t) = g.temp_junction_c.or(g.temp_edge_c) {
                    v.push(format!("{t:.0}°C"));
                }
                if let Some((_, used, total)) = g.headline_memory() {
                    v.push(format!("{} / {}", units::bytes(used), units::bytes(total)));
                }
                kv(&g.id, &ellipsize(&v.join(" · "), value_w), label_w, theme)
            })
            .collect()
    }

    /// History below `y`: utilization, power, temperature, memory, clock and fan (or the host's
    /// CPU and hipscope's), as room allows; each label says its scale.
    fn graphs(&self, frame: &mut Frame, inner: Rect, y: u16, theme: &Theme) {
        let graphs: Vec<(&str, &Series, u64, &str)> = if self.is_cpu() {
            vec![
                ("machine cpu", &self.host_cpu, 100, "%"),
                ("hipscope cpu", &self.own_cpu, 100, "%"),
            ]
        } else {
            vec![
                ("util", &self.util, 100, "%"),
                ("power", &self.power, 0, " W"),
                ("temp", &self.temp, 0, " °C"),
                ("memory", &self.mem, 100, "%"),
                ("sclk", &self.sclk, 0, " MHz"),
                if self.fan_in_pct {
                    ("fan", &self.fan, 100, "%")
                } else {
                    ("fan", &self.fan, 0, " rpm")
                },
            ]
        };
        self.draw_graphs(frame, inner, y, graphs, theme);
    }

    /// Draws the histories with two or more points below `y`, sharing the rows left.
    fn draw_graphs(
        &self,
        frame: &mut Frame,
        inner: Rect,
        mut y: u16,
        graphs: Vec<(&str, &Series, u64, &str)>,
        theme: &Theme,
    ) {
        let graphs: Vec<_> = graphs.into_iter().filter(|h| h.1.len() >= 2).collect();
        let count = graphs.len() as u16;
        for (i, (label, series, max, unit)) in graphs.into_iter().enumerate() {
            if y + 2 > inner.bottom() {
                break;
            }
            // The rows left are shared among the histories still to draw, at least three each
            // (a label and two rows: a one-row sparkline shows little).
            let left = count - i as u16;
            let rows = ((inner.bottom() - y) / left).max(3).min(inner.bottom() - y);
            // A fixed scale where the reading has one (percentages), else up to the highest seen.
            let max = if max > 0 { max } else { series.max() };
            let label = format!("{label} · 0–{max}{unit}");
            history(
                frame,
                Rect::new(inner.x, y, inner.width, rows),
                &label,
                series,
                max,
                theme.sparkline,
                theme,
            );
            y += rows;
        }
    }
}

fn kv(label: &str, value: &str, label_w: usize, theme: &Theme) -> Line<'static> {
    Line::from(vec![
        text(format!("{label:<label_w$}"), theme.dim),
        text(value.to_string(), theme.text),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_other_gpu_of_a_split_gets_a_line() {
        let gpu = |id: &str, ours: bool, util: f32| GpuReading {
            id: id.into(),
            vendor: "nvidia".into(),
            ours,
            gpu_util_pct: Some(util),
            vram_used: Some(30 << 30),
            vram_total: Some(80 << 30),
            ..GpuReading::default()
        };
        let mut p = GpuPanel::default();
        p.set_device(DeviceSummary {
            backend: "cuda".into(),
            ..DeviceSummary::default()
        });
        let theme = Theme::default();
        let text = |p: &GpuPanel| -> Vec<String> {
            p.other_gpu_lines(8, 40, &theme)
                .iter()
                .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
                .collect()
        };
        // One GPU open: nothing more.
        p.apply(TelemetrySample {
            gpus: vec![gpu("nvidia0", true, 90.0), gpu("nvidia1", false, 0.0)],
            ..TelemetrySample::default()
        });
        assert!(text(&p).is_empty());
        // Both open (a split): the second gets its line, the first is the panel's own.
        p.apply(TelemetrySample {
            gpus: vec![gpu("nvidia0", true, 90.0), gpu("nvidia1", true, 45.0)],
            ..TelemetrySample::default()
        });
        let lines = text(&p);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].starts_with("nvidia1"), "{lines:?}");
        assert!(lines[0].contains("45% · 30.0 GiB / 80.0 GiB"), "{lines:?}");
    }
}
