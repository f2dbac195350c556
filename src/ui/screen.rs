//! The whole screen as a pure function of [`App`]: header, progress, HUNG banner, chat and
//! message box, the diagnostics column, the footer, and whichever window is open on top.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph};

use crate::gpu::snapshot::WatchState;
use crate::model::remote::INSECURE_MARK;

use super::meter::{bar, ellipsize, spinner, text};
use super::profile::ProfileMode;
use super::settings::PanelId;
use super::state::{App, GenState, Overlay};
use super::theme::Theme;
use super::watchdog::{state_label, state_style, watched};
use super::{error_dialog, help, quit_screen, units};

/// The smallest terminal the screen is drawn in (columns, rows); below it, a note says so.
pub const MIN_SIZE: (u16, u16) = (20, 6);

/// Where each part of the screen goes: one layout, used by [`render`] and by `App::update`
/// (which scrolls the chat by the height it will have).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Areas {
    pub header: Rect,
    pub progress: Rect,
    pub banner: Rect,
    /// Everything between the header and the footer (the windows open over it).
    pub body: Rect,
    pub footer: Rect,
    pub chat: Rect,
    pub input: Rect,
    pub sidebar: Option<Rect>,
}

/// The screen's layout for `app` in `area`; `None` when the terminal is too small.
pub fn layout(app: &App, area: Rect) -> Option<Areas> {
    if area.width < MIN_SIZE.0 || area.height < MIN_SIZE.1 {
        return None;
    }
    let progress_rows = app.progress.len().min(2) as u16;
    let banner_rows = app.watchdog.banner_height();
    let [header, progress, banner, body, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(progress_rows),
        Constraint::Length(banner_rows),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(area);
    let sidebar = app.sidebar_visible(area.width) && body.width >= 60;
    let (left, sidebar) = if sidebar {
        let w = app.sidebar_width.min(body.width - 32);
        let [l, r] = Layout::horizontal([Constraint::Min(32), Constraint::Length(w)]).areas(body);
        (l, Some(r))
    } else {
        (body, None)
    };
    let input_h = app
        .input
        .height(left.width)
        .min(left.height.saturating_sub(1));
    let [chat, input] =
        Layout::vertical([Constraint::Min(1), Constraint::Length(input_h)]).areas(left);
    Some(Areas {
        header,
        progress,
        banner,
        body,
        footer,
        chat,
        input,
        sidebar,
    })
}

/// Draws everything.
pub fn render(app: &App, frame: &mut Frame) {
    let area = frame.area();
    let Some(Areas {
        header,
        progress,
        banner,
        body,
        footer,
        chat: chat_area,
        input: input_area,
        sidebar: right,
    }) = layout(app, area)
    else {
        frame.render_widget(
            Paragraph::new(format!(
                "hipscope: the terminal is too small ({}×{}); it needs at least {}×{}",
                area.width, area.height, MIN_SIZE.0, MIN_SIZE.1
            ))
            .wrap(ratatui::widgets::Wrap { trim: true }),
            area,
        );
        return;
    };
    let theme = &app.theme;

    render_header(app, frame, header, theme);
    render_progress(app, frame, progress, theme);
    app.watchdog.render_banner(frame, banner, theme);

    app.chat
        .render(frame, chat_area, theme, app.activity(), welcome(app, theme));
    let typing_here = matches!(app.overlay, Overlay::None | Overlay::Help { .. });
    app.input.render(
        frame,
        input_area,
        theme,
        input_title(app, theme),
        typing_here,
    );
    if let Some(r) = right {
        let r = profile_in_column(app, frame, r, theme);
        render_sidebar(app, frame, r, theme);
    }
    render_footer(app, frame, footer, theme);

    if app.profile.mode == ProfileMode::Full && matches!(app.overlay, Overlay::None) {
        app.profile.render(frame, body, theme);
    }
    match &app.overlay {
        Overlay::None => {}
        // The big windows take the whole middle of the screen, with nothing peeking around them.
        Overlay::Help { scroll } => {
            frame.render_widget(Clear, body);
            help::render(frame, body, theme, *scroll)
        }
        Overlay::Picker(p) => {
            frame.render_widget(Clear, body);
            p.render(frame, body, theme)
        }
        Overlay::Sampler(f) => f.render(frame, body, theme),
        Overlay::System(ed) => ed.render(frame, body, theme),
    }
    if let Some(e) = app.errors.front() {
        error_dialog::render(frame, body, theme, e, app.errors.len() - 1);
    }
    if let Some(q) = &app.quit {
        quit_screen::render(
            frame,
            body,
            theme,
            q,
            app.now,
            app.settings.quit.deadline(),
            app.tick,
        );
    }
}

fn model_line(app: &App) -> String {
    match &app.model {
        Some(m) => {
            let mut s = m.name.clone();
            if !m.quant.is_empty() {
                s.push_str(&format!(" · {}", m.quant));
            }
            s
        }
        None => match &app.loading {
            Some(l) => format!("loading {l}…"),
            None => "no model".to_string(),
        },
    }
}

fn render_header(app: &App, frame: &mut Frame, area: Rect, theme: &Theme) {
    let w = usize::from(area.width);
    let mut right: Vec<Span<'static>> = Vec::new();
    let status = match app.generation {
        GenState::Idle if app.quit.is_some() => "quitting".to_string(),
        GenState::Idle if !app.worker_alive => "worker stopped".to_string(),
        GenState::Idle if app.loading.is_some() => "loading".to_string(),
        GenState::Idle => "idle".to_string(),
        GenState::Waiting { since } => match app.prompt_rate() {
            Some((done, total, _, _)) => format!(
                "{} prompt {:.0}%",
                spinner(app.tick),
                100.0 * units::ratio(done as u64, total as u64)
            ),
            None => format!(
                "{} prompt {}",
                spinner(app.tick),
                units::duration(app.now.saturating_sub(since))
            ),
        },
        GenState::Streaming { .. } => {
            let (tokens, rate) = app.live_rate().unwrap_or((0, 0.0));
            format!(
                "{} {} tok · {}",
                spinner(app.tick),
                tokens,
                units::rate(rate, "t/s")
            )
        }
        GenState::Stopping => "stopping…".to_string(),
    };
    // How full the context is, in sight wherever the model's name still fits beside it.
    let name_w = model_line(app).chars().count() + 12;
    if let Some((used, n_ctx)) = app.context_fill() {
        let (bar, count) = match used {
            Some(u) => (
                bar(units::ratio(u as u64, n_ctx as u64), 5),
                units::count(u as u64),
            ),
            None => ("░".repeat(5), "–".to_string()),
        };
        let gauge = format!(" ctx {bar} {count}/{} ", units::count(n_ctx as u64));
        let status_w = status.chars().count()
            + 2
            + if app.sidebar_visible(area.width) {
                0
            } else {
                16
            };
        if name_w + gauge.chars().count() + status_w <= w {
            right.push(Span::styled(gauge, theme.header));
        } else if w >= 40 {
            // Short of room: the share alone, before the model's name is given room.
            let short = match used {
                Some(u) => format!(" ctx {:.0}% ", 100.0 * units::ratio(u as u64, n_ctx as u64)),
                None => " ctx – ".to_string(),
            };
            right.push(Span::styled(short, theme.header));
        }
    }
    right.push(Span::styled(format!(" {status} "), theme.header));
    // Without the diagnostics column, the header carries the one number that matters most.
    if !app.sidebar_visible(area.width)
        && let Some(s) = &app.watchdog.snapshot
    {
        let style = if s.state == WatchState::Ok {
            theme.header
        } else {
            state_style(s.state, theme)
        };
        // The CPU backend has no queue: its ops run as they are issued.
        let queue = match watched(s) {
            "CPU" => String::new(),
            _ => format!(" q{}", s.queue_depth),
        };
        right.push(Span::styled(
            format!(" {} {}{queue} ", watched(s), state_label(s.state)),
            style,
        ));
    }
    if app
        .device()
        .is_some_and(|d| d.backend == "remote" && d.reason.contains(INSECURE_MARK))
    {
        right.insert(0, Span::styled(" TLS NOT VERIFIED ", theme.hung_banner));
    }
    let right_w: usize = right.iter().map(|s| s.width()).sum();
    let device = app
        .device()
        .map(|d| {
            if d.backend == "cpu" {
                "cpu".to_string()
            } else if d.backend == "remote" {
                d.name.clone()
            } else if d.arch.is_empty() {
                d.backend.clone()
            } else {
                format!("{} {}", d.backend, d.arch)
            }
        })
        .unwrap_or_default();
    let mut left = format!(" hipscope │ {}", model_line(app));
    let room = w.saturating_sub(right_w + 1);
    // The device goes only where it fits whole; the model name is cut before that.
    if !device.is_empty() && left.chars().count() + device.chars().count() + 3 <= room {
        left.push_str(&format!(" │ {device}"));
    }
    let left = ellipsize(&left, room);
    let pad = w.saturating_sub(left.chars().count() + right_w);
    let mut spans = vec![
        Span::styled(left, theme.header),
        Span::styled(" ".repeat(pad), theme.header),
    ];
    spans.extend(right);
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn render_progress(app: &App, frame: &mut Frame, area: Rect, theme: &Theme) {
    let label_w = app
        .progress
        .iter()
        .map(|p| p.task.chars().count())
        .max()
        .unwrap_or(0)
        .min(24);
    for (i, p) in app
        .progress
        .iter()
        .take(usize::from(area.height))
        .enumerate()
    {
        let row = Rect::new(area.x, area.y + i as u16, area.width, 1);
        let w = usize::from(area.width);
        let label = format!(" {:<label_w$} ", ellipsize(&p.task, label_w));
        let (bar_text, pct) = match p.fraction {
            Some(f) => (bar(f64::from(f), 24), format!(" {:>3.0}% ", f * 100.0)),
            None => {
                // Unknown length: a block that walks along the bar.
                let pos = (app.tick % 24) as usize;
                let s: String = (0..24).map(|j| if j == pos { '█' } else { '░' }).collect();
                (s, " ".to_string())
            }
        };
        let used = label.chars().count() + 24 + pct.chars().count();
        let detail = ellipsize(&p.detail, w.saturating_sub(used));
        frame.render_widget(
            Paragraph::new(Line::from(vec![
                text(label, theme.key),
                text(bar_text, theme.gauge),
                text(pct, theme.text),
                text(detail, theme.dim),
            ])),
            row,
        );
    }
}

fn render_sidebar(app: &App, frame: &mut Frame, area: Rect, theme: &Theme) {
    let shown = app.panels.visible();
    if shown.is_empty() {
        frame.render_widget(
            Paragraph::new(vec![
                Line::from(text(" All panels hidden.", theme.dim)),
                Line::from(text(" F5–F8 show them, F9 hides", theme.dim)),
                Line::from(text(" this column.", theme.dim)),
            ]),
            area,
        );
        return;
    }
    let wanted: Vec<u16> = shown
        .iter()
        .map(|&id| {
            let own = match id {
                PanelId::Streams => app.streams.wanted_height(app.device()),
                PanelId::Arena => app.arena.wanted_height(),
                PanelId::Watchdog => app.watchdog.wanted_height(),
                PanelId::Gpu => GPU_PANEL_ROWS,
            };
            let h = i32::from(own) + i32::from(app.panel_extra[id.index()]);
            h.clamp(i32::from(PANEL_MIN_ROWS), i32::from(u16::MAX)) as u16
        })
        .collect();
    let focus = app
        .panel_focus
        .and_then(|f| shown.iter().position(|&p| p == f));
    let heights = panel_heights(&wanted, focus, area.height);
    // The picked panel's frame in the focus colour (a theme copy only while one is picked).
    let focused_theme = focus.map(|_| Theme {
        border: theme.border_focus,
        ..theme.clone()
    });
    let device = app.device();
    let model_bytes = app.model.as_ref().map(|m| m.file_bytes);
    let mut y = area.y;
    for (i, (&id, &h)) in shown.iter().zip(&heights).enumerate() {
        let rect = Rect::new(area.x, y, area.width, h);
        y += h;
        let t = match &focused_theme {
            Some(f) if focus == Some(i) => f,
            _ => theme,
        };
        match id {
            PanelId::Streams => app.streams.render(frame, rect, t, device),
            PanelId::Arena => app.arena.render(
                frame,
                rect,
                t,
                device,
                app.gpu.host.as_ref(),
                model_bytes,
                app.context_fill(),
            ),
            PanelId::Watchdog => app.watchdog.render(frame, rect, t),
            PanelId::Gpu => app.gpu.render(frame, rect, t),
        }
        if focus == Some(i) {
            resize_hint(frame, rect, theme);
        }
    }
}

/// Draws the Profile panel at the top of the column when it is shown there (up to two thirds of
/// the column's rows); returns the rows left for the other panels.
fn profile_in_column(app: &App, frame: &mut Frame, area: Rect, theme: &Theme) -> Rect {
    if app.profile.mode != ProfileMode::Column {
        return area;
    }
    let most = if app.panels.visible().is_empty() {
        area.height
    } else {
        area.height * 2 / 3
    };
    let h = app.profile.wanted_height().min(most);
    app.profile
        .render(frame, Rect::new(area.x, area.y, area.width, h), theme);
    Rect::new(area.x, area.y + h, area.width, area.height - h)
}

/// The fewest rows a panel is given while there is room: its frame and one line.
const PANEL_MIN_ROWS: u16 = 3;
/// What the GPU panel asks for before the user resizes it; as the last panel it also takes
/// whatever is left.
const GPU_PANEL_ROWS: u16 = 6;

/// Heights of the shown panels, top to bottom, in `total` rows. Each gets what it wants
/// (`wanted`, its content's rows plus what the user added); the last one also takes the rows
/// left over. When they do not fit, the tallest panel gives up a row, then the tallest again,
/// down to [`PANEL_MIN_ROWS`] each, and the focused one only when no other can, so that the
/// panel the user is growing keeps its size; if even that is too much, the bottom panels
/// disappear first.
pub fn panel_heights(wanted: &[u16], focus: Option<usize>, total: u16) -> Vec<u16> {
    let mut h = wanted.to_vec();
    let sum: u32 = h.iter().map(|&x| u32::from(x)).sum();
    if sum <= u32::from(total) {
        if let Some(last) = h.last_mut() {
            *last += total - sum as u16;
        }
        return h;
    }
    let mut over = sum - u32::from(total);
    while over > 0 {
        // The tallest that can still give (the upper of equals: the diagnostics that matter
        // most when something is wrong, the watchdog's, sit lower), the focused one last.
        let giver = (0..h.len())
            .rev()
            .filter(|&i| h[i] > PANEL_MIN_ROWS && Some(i) != focus)
            .max_by_key(|&i| h[i])
            .or(focus.filter(|&f| h[f] > PANEL_MIN_ROWS));
        let Some(i) = giver else { break };
        h[i] -= 1;
        over -= 1;
    }
    for i in (0..h.len()).rev() {
        let give = u32::from(h[i]).min(over);
        h[i] -= give as u16;
        over -= give;
    }
    h
}

/// Says, on the bottom edge of the focused panel, how to resize it.
fn resize_hint(frame: &mut Frame, rect: Rect, theme: &Theme) {
    const HINT: &str = " Alt-+/- height · Alt-0 reset ";
    let w = HINT.chars().count() as u16;
    if rect.height < 2 || rect.width < w + 4 {
        return;
    }
    frame.render_widget(
        Paragraph::new(text(HINT, theme.key_text)),
        Rect::new(rect.right() - w - 2, rect.bottom() - 1, w, 1),
    );
}

fn input_title(app: &App, theme: &Theme) -> Line<'static> {
    let mut spans = vec![Span::styled(" Message ", theme.title)];
    match app.generation {
        GenState::Idle => {}
        GenState::Stopping => spans.push(text("· stopping… ", theme.dim)),
        _ => {
            spans.push(text("· generating, ", theme.dim));
            spans.push(text("Esc", theme.key));
            spans.push(text(" stops ", theme.dim));
        }
    }
    Line::from(spans)
}

fn render_footer(app: &App, frame: &mut Frame, area: Rect, theme: &Theme) {
    if app.quit.is_none() && app.clear_armed {
        let line = Line::from(vec![
            Span::styled(" press ", theme.key_text),
            Span::styled("Alt-L", theme.key),
            Span::styled(
                " again to clear the conversation (any other key keeps it) ",
                theme.key_text,
            ),
        ]);
        frame.render_widget(Paragraph::new(line), area);
        return;
    }
    if app.quit.is_none()
        && let Some(h) = &app.hint
    {
        let w = usize::from(area.width).saturating_sub(2);
        frame.render_widget(
            Paragraph::new(Span::styled(
                format!(" {}", ellipsize(h, w)),
                theme.key_text,
            )),
            area,
        );
        return;
    }
    if app.quit.is_none() && app.quit_confirm_pending() {
        let line = Line::from(vec![
            Span::styled(" press ", theme.key_text),
            Span::styled("Ctrl-C", theme.key),
            Span::styled(" again (or ", theme.key_text),
            Span::styled("Ctrl-D", theme.key),
            Span::styled(", ", theme.key_text),
            Span::styled("/quit", theme.key),
            Span::styled(") to quit ", theme.key_text),
        ]);
        frame.render_widget(Paragraph::new(line), area);
        return;
    }
    let keys: Vec<(&str, &str)> = if app.quit.is_some() {
        vec![("Ctrl-C", "leave now")]
    } else if !app.errors.is_empty() {
        vec![("Enter/Esc", "dismiss"), ("Ctrl-C", "quit")]
    } else {
        match &app.overlay {
            Overlay::Help { .. } => vec![("Esc", "close"), ("↑↓", "scroll")],
            Overlay::Picker(_) => vec![("Enter", "load"), ("Esc", "close"), ("type", "filter")],
            Overlay::Sampler(_) => vec![("Enter", "apply"), ("Esc", "cancel"), ("↑↓", "field")],
            Overlay::System(_) => vec![
                ("Enter", "save"),
                ("Alt-Enter", "new line"),
                ("Esc", "cancel"),
            ],
            Overlay::None => {
                let mut k = if app.generation.is_busy() {
                    vec![("Esc", "stop"), ("PgUp/PgDn", "scroll")]
                } else {
                    vec![
                        ("Enter", "send"),
                        ("Alt-Enter", "new line"),
                        ("↑", "history"),
                        ("Alt-R", "regenerate"),
                    ]
                };
                if !app.chat.is_following() {
                    k.insert(0, ("Ctrl-End", "follow"));
                }
                k.extend([("F1", "help"), ("F2", "models")]);
                k.push((
                    "Ctrl-C",
                    if app.generation.is_busy() {
                        "stop"
                    } else {
                        "quit"
                    },
                ));
                k
            }
        }
    };
    let mut spans = Vec::new();
    let mut used = 0;
    let w = usize::from(area.width);
    for (k, what) in keys {
        let piece = k.chars().count() + what.chars().count() + 3;
        if used + piece > w {
            break;
        }
        spans.push(Span::styled(format!(" {k}"), theme.key));
        spans.push(Span::styled(format!(" {what} "), theme.key_text));
        used += piece;
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn welcome(app: &App, theme: &Theme) -> Vec<Line<'static>> {
    let mut lines = vec![Line::from(text("hipscope", theme.title)), Line::default()];
    match (&app.model, &app.loading) {
        (Some(m), _) => {
            let mut what = vec![m.architecture.clone(), m.quant.clone()];
            if m.parameters > 0 {
                what.push(units::params(m.parameters));
            }
            what.retain(|s| !s.is_empty());
            let on = app
                .device()
                .map(|d| {
                    if d.name.is_empty() {
                        d.backend.clone()
                    } else {
                        d.name.clone()
                    }
                })
                .unwrap_or_default();
            lines.push(Line::from(vec![
                text("Chat with ", theme.text),
                text(m.name.clone(), theme.assistant_label),
                text(format!(" ({})", what.join(" · ")), theme.dim),
            ]));
            if !on.is_empty() {
                lines.push(Line::from(text(
                    format!("on {on} · loaded in {}", units::duration(m.load_time)),
                    theme.dim,
                )));
            }
            lines.push(Line::default());
            lines.push(Line::from(text(
                "Type a message and press Enter.",
                theme.text,
            )));
        }
        (None, Some(l)) => lines.push(Line::from(text(format!("Loading {l}…"), theme.dim))),
        (None, None) => lines.push(Line::from(text(
            "No model loaded: /model picks one.",
            theme.notice,
        ))),
    }
    lines.push(Line::from(vec![
        text("F1", theme.key),
        text(" keys · ", theme.dim),
        text("/help", theme.key),
        text(" commands · ", theme.dim),
        text("/model", theme.key),
        text(" switch model", theme.dim),
    ]));
    lines
}
