//! Progress on stderr for the headless commands: a one-line bar, and fetch progress.

use std::io::Write;

use crate::app::fetch::FetchProgress;

/// A one-line progress bar on stderr (only when stderr is a terminal).
pub struct ProgressLine {
    label: &'static str,
    tty: bool,
    last: i32,
}

impl ProgressLine {
    pub fn new(label: &'static str) -> ProgressLine {
        use std::io::IsTerminal;
        ProgressLine {
            label,
            tty: std::io::stderr().is_terminal(),
            last: -1,
        }
    }

    pub fn update(&mut self, fraction: f32, what: &str) {
        let pct = (fraction.clamp(0.0, 1.0) * 100.0) as i32;
        if !self.tty || pct == self.last {
            return;
        }
        self.last = pct;
        let width = 30;
        let filled = (pct as usize * width) / 100;
        let what: String = what.chars().take(40).collect();
        eprint!(
            "\r\x1b[2K{} [{}{}] {:3}% {}",
            self.label,
            "#".repeat(filled),
            "-".repeat(width - filled),
            pct,
            what
        );
        let _ = std::io::stderr().flush();
    }

    pub fn finish(&mut self) {
        if self.tty && self.last >= 0 {
            eprint!("\r\x1b[2K");
            let _ = std::io::stderr().flush();
        }
        self.last = -1;
    }
}

/// Fetch progress on stderr: steps as lines, bytes as a bar.
pub fn stderr_progress() -> impl FnMut(FetchProgress) {
    let mut bar = ProgressLine::new("downloading");
    move |p| match p {
        FetchProgress::Step(s) => {
            bar.finish();
            eprintln!("{s}");
        }
        FetchProgress::Bytes { done, total } => {
            let f = total.map_or(0.0, |t| done as f32 / t.max(1) as f32);
            bar.update(f, &format!("{} MiB", done >> 20));
        }
    }
}
