//! The Arena panel: capacity, used, high-water, per-region bars, largest free block, device
//! allocations made, and the runtime's own overhead outside the arena.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Wrap};

use crate::gpu::snapshot::{ArenaSnapshot, DeviceSummary, HostSample, REMOTE_ARENA, SplitSnapshot};

use super::meter::{bar, ellipsize, history, lines_on_top, open_panel, text};
use super::series::Series;
use super::theme::Theme;
use super::units::{self, ratio};

#[derive(Clone, Debug, Default)]
pub struct ArenaPanel {
    pub arena: Option<ArenaSnapshot>,
    used: Series,
}

impl ArenaPanel {
    pub fn apply(&mut self, snapshot: ArenaSnapshot) {
        self.used.push(snapshot.used);
        self.arena = Some(snapshot);
    }

    pub fn wanted_height(&self) -> u16 {
        match &self.arena {
            Some(a) if a.kind.starts_with(REMOTE_ARENA) => 2 + 3,
            Some(a) => 2 + 6 + a.regions.len() as u16 + if a.split.is_some() { 2 } else { 0 },
            None => 5,
        }
    }

    /// `model_bytes`: the model file's size, for the CPU backend's note on memory-mapped weights;
    /// `context`: tokens in the context (if known) and its size, for the KV cache's live share.
    #[allow(clippy::too_many_arguments)]
    pub fn render(
        &self,
        frame: &mut Frame,
        area: Rect,
        theme: &Theme,
        device: Option<&DeviceSummary>,
        host: Option<&HostSample>,
        model_bytes: Option<u64>,
        context: Option<(Option<usize>, usize)>,
    ) {
        let title = match &self.arena {
            Some(a) if !a.kind.is_empty() => format!("Arena · {}", a.kind),
            _ => "Arena".to_string(),
        };
        let Some(inner) = open_panel(frame, area, &title, theme, 8) else {
            return;
        };
        let w = usize::from(inner.width);
        let Some(a) = &self.arena else {
            let mut lines = Vec::new();
            match device {
                Some(d) if d.backend == "cpu" => {
                    let weights = model_bytes
                        .map(|b| format!(" ({})", units::bytes(b)))
                        .unwrap_or_default();
                    lines.push(Line::from(text(
                        format!(
                            "No device arena on the CPU backend: weights are memory-mapped \
                             from the model file{weights}."
                        ),
                        theme.dim,
                    )));
                    if let Some(h) = host
                        && let (Some(used), Some(total)) = (h.mem_used, h.mem_total)
                    {
                        lines.push(Line::from(vec![
                            text("host ", theme.dim),
                            text(
                                format!("{} / {}", units::bytes(used), units::bytes(total)),
                                theme.text,
                            ),
                        ]));
                    }
                }
                Some(_) => lines.push(Line::from(text("No arena reported yet.", theme.dim))),
                None => {
                    lines.push(Line::from(text(
                        "Nothing allocated: no model is loaded yet.",
                        theme.dim,
                    )));
                    if let Some(l) = host_line(host, theme) {
                        lines.push(l);
                    }
                }
            }
            frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: true }), inner);
            return;
        };

        if a.kind.starts_with(REMOTE_ARENA) {
            frame.render_widget(Paragraph::new(remote_arena(a, w, theme)), inner);
            return;
        }
        if a.kind == "host" {
            let lines = host_arena(a, host, context, w, theme);
            frame.render_widget(Paragraph::new(lines), inner);
            return;
        }
        let frac = ratio(a.used, a.capacity);
        let pct = format!(" {:>3.0}%", frac * 100.0);
        let mut lines = vec![
            Line::from(vec![
                text("used ", theme.dim),
                text(
                    format!("{} / {}", units::bytes(a.used), units::bytes(a.capacity)),
                    theme.text,
                ),
                text(pct, theme.dim),
            ]),
            Line::from(text(
                bar(frac, w),
                if frac > 0.9 {
                    theme.gauge_warn
                } else {
                    theme.gauge
                },
            )),
            Line::from(vec![
                text("peak ", theme.dim),
                text(units::bytes(a.high_water), theme.text),
                text(" · largest free ", theme.dim),
                text(units::bytes(a.largest_free), theme.text),
            ]),
        ];
        if let Some(sp) = &a.split {
            lines.extend(split_lines(sp, w, theme));
        }
        let name_w = a
            .regions
            .iter()
            .map(|r| r.name.chars().count())
            .max()
            .unwrap_or(0)
            .min(16);
        let amount = |r: &crate::gpu::snapshot::RegionSnapshot| {
            if r.used == r.capacity {
                units::bytes(r.used)
            } else {
                format!("{}/{}", units::bytes(r.used), units::bytes(r.capacity))
            }
        };
        let amount_w = a
            .regions
            .iter()
            .map(|r| amount(r).chars().count())
            .max()
            .unwrap_or(0);
        // One bar width for every region, so that the bars line up.
        let bar_w = w.saturating_sub(name_w + amount_w + 2).min(20);
        for r in &a.regions {
            let amount = amount(r);
            lines.push(Line::from(vec![
                text(
                    format!("{:<name_w$} ", ellipsize(&r.name, name_w)),
                    theme.dim,
                ),
                text(bar(ratio(r.used, r.capacity), bar_w), theme.gauge),
                text(format!(" {amount}"), theme.text),
            ]));
        }
        let mut tail = vec![
            text(units::count(a.device_allocations), theme.text),
            text(
                if a.kind == "host" {
                    " allocations"
                } else {
                    " device allocs"
                },
                theme.dim,
            ),
        ];
        if let Some(o) = a.runtime_overhead {
            tail.push(text(" · runtime ", theme.dim));
            tail.push(text(units::bytes(o), theme.text));
        }
        lines.push(Line::from(tail));
        if a.pinned_host_bytes > 0 {
            lines.push(Line::from(vec![
                text("pinned host ", theme.dim),
                text(units::bytes(a.pinned_host_bytes), theme.text),
                text(" (staging)", theme.dim),
            ]));
        }
        if let (Some(total), Some(free)) = (a.device_total, a.device_free) {
            lines.push(Line::from(vec![
                text(
                    if a.kind == "host" { "host " } else { "device " },
                    theme.dim,
                ),
                text(
                    format!(
                        "{} used of {}",
                        units::bytes(total.saturating_sub(free)),
                        units::bytes(total)
                    ),
                    theme.text,
                ),
            ]));
        }
        // Whatever height is left shows how use changed over time.
        let spare = lines_on_top(frame, inner, lines);
        if self.used.len() > 1 {
            let label = format!("used over time · 0–{}", units::bytes(a.capacity));
            history(
                frame,
                spare,
                &label,
                &self.used,
                a.capacity,
                theme.sparkline,
                theme,
            );
        }
    }
}

/// A model split between the GPU and the CPU (`-ngl`): the layers and weight bytes on each
/// side, and a bar of the GPU's share of the weights, with the bytes op offload has streamed up
/// so far.
fn split_lines(s: &SplitSnapshot, w: usize, theme: &Theme) -> Vec<Line<'static>> {
    let gpu_share = ratio(s.gpu_weight_bytes, s.gpu_weight_bytes + s.cpu_weight_bytes);
    vec![
        Line::from(vec![
            text("GPU ", theme.dim),
            text(
                format!(
                    "{} layers · {}",
                    s.gpu_layers,
                    units::bytes(s.gpu_weight_bytes)
                ),
                theme.text,
            ),
            text(" │ CPU ", theme.dim),
            text(
                format!(
                    "{} layers · {}",
                    s.cpu_layers,
                    units::bytes(s.cpu_weight_bytes)
                ),
                theme.text,
            ),
        ]),
        {
            // Op offload: the CPU layers' weights streamed up for prompts so far.
            let streamed = match s.streamed_bytes {
                0 => String::new(),
                b => format!(" · {} streamed", units::bytes(b)),
            };
            let room = w.saturating_sub(6 + streamed.chars().count()).min(40);
            Line::from(vec![
                text("split ", theme.dim),
                text(bar(gpu_share, room), theme.gauge),
                text(streamed, theme.dim),
            ])
        },
    ]
    .into_iter()
    .chain(gpu_blocks(s, w, theme))
    .collect()
}

/// A model over several GPUs (`--split-mode layer`): a block per GPU, its layers, weights and
/// its own arena's use.
fn gpu_blocks(s: &SplitSnapshot, w: usize, theme: &Theme) -> Vec<Line<'static>> {
    if s.gpus.len() < 2 {
        return Vec::new();
    }
    let mut v = Vec::new();
    for (i, g) in s.gpus.iter().enumerate() {
        v.push(Line::from(vec![
            text(format!("GPU {i} "), theme.dim),
            text(
                format!(
                    "{} · {} layers · {}",
                    g.name,
                    g.layers,
                    units::bytes(g.weight_bytes)
                ),
                theme.text,
            ),
        ]));
        let used = ratio(g.arena.used, g.arena.capacity);
        v.push(Line::from(vec![
            text("      ", theme.dim),
            text(bar(used, w.saturating_sub(30).clamp(4, 30)), theme.gauge),
            text(
                format!(
                    " {} of {}",
                    units::bytes(g.arena.used),
                    units::bytes(g.arena.capacity)
                ),
                theme.text,
            ),
        ]));
    }
    v
}

/// The host's memory in use, as one line.
fn host_line(host: Option<&HostSample>, theme: &Theme) -> Option<Line<'static>> {
    let h = host?;
    let (used, total) = (h.mem_used?, h.mem_total?);
    Some(Line::from(vec![
        text("host    ", theme.dim),
        text(
            format!("{} used of {}", units::bytes(used), units::bytes(total)),
            theme.text,
        ),
    ]))
}

/// The CPU backend's memory: nothing there is a device arena that fills up. The weights are a
/// fixed, memory-mapped region; what lives and changes is the KV cache (tokens of the
/// conversation in the context) and the scratch buffers (as large as the largest batch needed).
fn host_arena(
    a: &ArenaSnapshot,
    host: Option<&HostSample>,
    context: Option<(Option<usize>, usize)>,
    w: usize,
    theme: &Theme,
) -> Vec<Line<'static>> {
    let region = |name: &str| a.regions.iter().find(|r| r.name.starts_with(name));
    let mut lines = Vec::new();
    if let Some(r) = region("weights") {
        lines.push(Line::from(vec![
            text("fixed   ", theme.dim),
            text(units::bytes(r.capacity), theme.text),
            text(" weights (mapped file)", theme.dim),
        ]));
    }
    if let Some(r) = region("kv") {
        lines.push(Line::from(text("live", theme.dim)));
        match context {
            Some((Some(used), n_ctx)) => {
                let frac = ratio(used as u64, n_ctx as u64);
                let tokens = format!(
                    " {} / {} tok",
                    units::count(used as u64),
                    units::count(n_ctx as u64)
                );
                let bar_w = w.saturating_sub(8 + tokens.chars().count()).min(16);
                lines.push(Line::from(vec![
                    text("KV      ", theme.dim),
                    text(
                        bar(frac, bar_w),
                        if frac > 0.9 {
                            theme.gauge_warn
                        } else {
                            theme.gauge
                        },
                    ),
                    text(tokens, theme.text),
                ]));
                lines.push(Line::from(vec![
                    text("        ", theme.dim),
                    text(
                        units::bytes((r.capacity as f64 * frac).round() as u64),
                        theme.text,
                    ),
                    text(
                        format!(" of {} reserved", units::bytes(r.capacity)),
                        theme.dim,
                    ),
                ]));
            }
            _ => lines.push(Line::from(vec![
                text("KV      ", theme.dim),
                text(units::bytes(r.capacity), theme.text),
                text(" reserved (use counted at the next answer)", theme.dim),
            ])),
        }
    }
    if let Some(r) = region("activations") {
        lines.push(Line::from(vec![
            text("scratch ", theme.dim),
            text(units::bytes(r.capacity), theme.text),
            text(" high-water", theme.dim),
        ]));
    }
    lines.extend(host_line(host, theme));
    lines
}

/// A remote server's KV cache: its amounts are tokens, or thousandths when the server gives
/// only a share (the region's name says which).
fn remote_arena(a: &ArenaSnapshot, w: usize, theme: &Theme) -> Vec<Line<'static>> {
    let frac = ratio(a.used, a.capacity);
    let per_mille = a.regions.first().is_some_and(|r| r.name.ends_with('‰'));
    let amount = if per_mille {
        format!("{:.1}%", frac * 100.0)
    } else {
        format!(
            "{} / {} tokens",
            units::count(a.used),
            units::count(a.capacity)
        )
    };
    vec![
        Line::from(vec![text("KV cache ", theme.dim), text(amount, theme.text)]),
        Line::from(text(
            bar(frac, w),
            if frac > 0.9 {
                theme.gauge_warn
            } else {
                theme.gauge
            },
        )),
        Line::from(text(
            ellipsize(&format!("from {}", &a.kind[REMOTE_ARENA.len()..].trim()), w),
            theme.dim,
        )),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::snapshot::SplitGpu;

    fn plain(lines: &[Line<'_>]) -> Vec<String> {
        lines
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect()
    }

    #[test]
    fn a_split_over_two_gpus_shows_a_block_per_gpu() {
        let gpu = |name: &str, layers, used| SplitGpu {
            name: name.into(),
            layers,
            weight_bytes: 3 << 30,
            arena: ArenaSnapshot {
                capacity: 20 << 30,
                used,
                ..ArenaSnapshot::default()
            },
        };
        let s = SplitSnapshot {
            gpu_layers: 33,
            cpu_layers: 0,
            gpus: vec![
                gpu("RX 7900 XTX", 17, 10 << 30),
                gpu("RX 7900 XT", 16, 5 << 30),
            ],
            ..SplitSnapshot::default()
        };
        let theme = Theme::default();
        let text = plain(&split_lines(&s, 60, &theme)).join("\n");
        assert!(text.contains("GPU 0 RX 7900 XTX · 17 layers"), "{text}");
        assert!(text.contains("GPU 1 RX 7900 XT · 16 layers"), "{text}");
        assert!(text.contains("10.0 GiB of 20.0 GiB"), "{text}");
        // One GPU (-ngl): the two lines of before, no blocks.
        let one = SplitSnapshot {
            gpus: vec![gpu("RX 7900 XTX", 17, 1)],
            ..s
        };
        assert_eq!(split_lines(&one, 60, &theme).len(), 2);
        assert!(!plain(&split_lines(&one, 60, &theme))[1].contains("streamed"));
        // Op offload's bytes beside the bar, which makes room for them.
        let streamed = SplitSnapshot {
            streamed_ops: 150,
            streamed_bytes: 8 << 30,
            ..one
        };
        let lines = plain(&split_lines(&streamed, 60, &theme));
        assert!(lines[1].ends_with(" · 8.00 GiB streamed"), "{lines:?}");
        assert!(lines[1].chars().count() <= 60, "{lines:?}");
    }
}
