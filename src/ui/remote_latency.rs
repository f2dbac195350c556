//! The GPU panel's view of a remote engine: what hipscope measures of its own requests, client
//! side, as the time the user waits: time to first token, mean inter-token latency and tokens per
//! second of each answer, the last values and their history (one point per answer). The
//! OpenAI-compatible APIs report no devices, so the panel says so rather than showing this
//! machine's GPU; the server's queue and KV cache are in the Streams and Arena panels.

use std::time::Duration;

use ratatui::text::Line;

use crate::model::protocol::GenStats;

use super::meter::text;
use super::series::Series;
use super::theme::Theme;

/// Client-side latency of this chat's answers from a remote engine.
#[derive(Clone, Debug, Default)]
pub struct RemoteLatency {
    answers: usize,
    /// Milliseconds from sending the request to the first piece of the answer.
    ttft_ms: Series,
    /// Mean milliseconds between pieces of an answer (answers of two or more pieces).
    itl_ms: Series,
    /// Tokens per second while the answer streamed.
    tps: Series,
    last: Option<Measured>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Measured {
    ttft: Duration,
    itl: Option<Duration>,
    tps: Option<f64>,
    tokens: usize,
}

impl RemoteLatency {
    /// Records a finished answer; one that never produced a token (refused, failed before the
    /// first one) has no latency to show and is left out.
    pub fn apply_answer(&mut self, s: &GenStats) {
        if s.generated_tokens == 0 || s.time_to_first_token.is_zero() {
            return;
        }
        let itl = (s.generated_tokens >= 2 && !s.gen_time.is_zero())
            .then(|| s.gen_time / (s.generated_tokens as u32 - 1).max(1));
        let tps = (!s.gen_time.is_zero()).then(|| s.gen_tps());
        self.answers += 1;
        self.ttft_ms.push(ms(s.time_to_first_token));
        if let Some(d) = itl {
            self.itl_ms.push(ms(d));
        }
        if let Some(t) = tps {
            self.tps.push(t.round() as u64);
        }
        self.last = Some(Measured {
            ttft: s.time_to_first_token,
            itl,
            tps,
            tokens: s.generated_tokens,
        });
    }

    /// The panel's lines: the last answer's numbers, each labelled, `label_w` wide labels.
    pub fn lines(&self, label_w: usize, theme: &Theme) -> Vec<Line<'static>> {
        let kv = |label: &str, value: String| {
            Line::from(vec![
                text(format!("{label:<label_w$}"), theme.dim),
                text(value, theme.text),
            ])
        };
        let mut lines = vec![Line::from(text(
            "devices: the server's API reports none",
            theme.dim,
        ))];
        let Some(m) = self.last else {
            lines.push(Line::from(text(
                "this chat: timed after its first answer",
                theme.dim,
            )));
            return lines;
        };
        let n = self.answers;
        lines.push(Line::from(text(
            format!(
                "this chat, client side ({n} answer{}):",
                if n == 1 { "" } else { "s" }
            ),
            theme.dim,
        )));
        lines.push(kv("ttft", format!("{:.0} ms", m.ttft.as_secs_f64() * 1e3)));
        lines.push(kv(
            "itl",
            match m.itl {
                Some(d) => format!("{:.1} ms mean", d.as_secs_f64() * 1e3),
                None => "– (one token)".into(),
            },
        ));
        lines.push(kv(
            "speed",
            match m.tps {
                Some(t) => format!("{t:.1} t/s · {} tokens", m.tokens),
                None => format!("– · {} tokens", m.tokens),
            },
        ));
        lines
    }

    /// The histories the panel draws, as (label, series, fixed maximum or 0, unit).
    pub fn graphs(&self) -> Vec<(&'static str, &Series, u64, &'static str)> {
        vec![
            ("ttft", &self.ttft_ms, 0, " ms"),
            ("itl", &self.itl_ms, 0, " ms"),
            ("speed", &self.tps, 0, " t/s"),
        ]
    }
}

fn ms(d: Duration) -> u64 {
    (d.as_secs_f64() * 1e3).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(ttft_ms: u64, tokens: usize, gen_ms: u64) -> GenStats {
        GenStats {
            generated_tokens: tokens,
            gen_time: Duration::from_millis(gen_ms),
            time_to_first_token: Duration::from_millis(ttft_ms),
            ..GenStats::default()
        }
    }

    #[test]
    fn each_answer_adds_one_point() {
        let mut r = RemoteLatency::default();
        r.apply_answer(&stats(180, 11, 500)); // 10 gaps of 50 ms; 22 t/s
        r.apply_answer(&stats(240, 1, 0)); // one token: no gap, no rate
        r.apply_answer(&stats(0, 0, 0)); // failed before its first token
        assert_eq!(r.answers, 2);
        assert_eq!(r.ttft_ms.tail(9), [180, 240]);
        assert_eq!(r.itl_ms.tail(9), [50]);
        assert_eq!(r.tps.tail(9), [22]);
        assert_eq!(r.last.unwrap().itl, None);
    }
}
