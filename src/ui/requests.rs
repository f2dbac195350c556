//! The Requests panel of `hipscope serve`: one row per slot (its request's client, state, prompt
//! and generated tokens, speed, time to first token, time queued), then the requests waiting for
//! a slot, then the totals; a hang names the requests of the step it stopped.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::Paragraph;

use crate::model::scheduler::{ServeSnapshot, SlotState};

use super::meter::{ellipsize, open_panel, text};
use super::theme::Theme;
use super::units;

/// The panel's rows, drawn from the engine's last snapshot.
pub fn render(frame: &mut Frame, area: Rect, theme: &Theme, s: &ServeSnapshot, hang: Option<&str>) {
    let title = format!(
        "Requests · {} of {} slots busy · {} queued",
        s.busy(),
        s.slots.len(),
        s.queued.len()
    );
    let Some(inner) = open_panel(frame, area, &title, theme, 20) else {
        return;
    };
    let w = usize::from(inner.width);
    let mut lines = Vec::new();
    if let Some(h) = hang {
        lines.push(Line::from(text(ellipsize(h, w), theme.hung)));
    }
    if let Some(b) = &s.broken {
        lines.push(Line::from(text(ellipsize(b, w), theme.error)));
    }
    lines.push(Line::from(text(
        ellipsize(
            &format!(
                "{:<4} {:<21} {:<12} {:>7} {:>6} {:>7} {:>8} {:>7}",
                "slot", "client", "state", "prompt", "gen", "t/s", "ttft", "queued"
            ),
            w,
        ),
        theme.header,
    )));
    for slot in &s.slots {
        let (state, style) = match &slot.state {
            SlotState::Idle => ("idle".to_string(), theme.dim),
            SlotState::Prompt { done, total } => (format!("prompt {done}/{total}"), theme.text),
            SlotState::Generating => ("generating".to_string(), theme.ok),
        };
        let row = if slot.request.is_some() {
            format!(
                "{:<4} {:<21} {:<12} {:>7} {:>6} {:>7} {:>8} {:>7}",
                slot.id,
                ellipsize(&slot.client, 21),
                ellipsize(&state, 12),
                format!("{}", slot.prompt_tokens),
                slot.generated,
                slot.tokens_per_s.map_or("-".into(), |r| format!("{r:.1}")),
                slot.ttft.map_or("-".into(), units::duration),
                units::duration(slot.queue_wait),
            )
        } else {
            format!(
                "{:<4} {:<21} {:<12} {:>7}",
                slot.id,
                "",
                state,
                format!("({} held)", slot.held)
            )
        };
        lines.push(Line::from(text(ellipsize(&row, w), style)));
    }
    if !s.queued.is_empty() {
        lines.push(Line::from(text("waiting for a slot:", theme.header)));
        for q in &s.queued {
            let row = format!(
                "  #{:<5} {:<21} prompt {:>6}  waiting {}",
                q.id,
                ellipsize(&q.client, 21),
                q.prompt_tokens,
                units::duration(q.waiting)
            );
            lines.push(Line::from(text(ellipsize(&row, w), theme.text)));
        }
    }
    let c = &s.counters;
    let rate = |n: u64, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    lines.push(Line::from(""));
    lines.push(Line::from(text(
        ellipsize(
            &format!(
                "served {} · prompt {} tokens ({:.0} t/s) · generated {} tokens ({:.1} t/s) · {:.1} slots a step",
                c.requests_total,
                c.prompt_tokens_total,
                rate(c.prompt_tokens_total, c.prompt_seconds_total),
                c.tokens_predicted_total,
                rate(c.tokens_predicted_total, c.tokens_predicted_seconds_total),
                if c.n_decode_total > 0 {
                    c.n_busy_slots_total as f64 / c.n_decode_total as f64
                } else {
                    0.0
                }
            ),
            w,
        ),
        theme.stats,
    )));
    frame.render_widget(Paragraph::new(lines), inner);
}
