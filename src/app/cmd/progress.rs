//! Progress on stderr for the headless commands: a one-line bar, fetch progress, and a first
//! start's kernel compile.

use std::io::Write;

use crate::app::fetch::{FetchProgress, Phase};
use crate::app::stderr::{err, errln};
use crate::gpu::kernels::CompileProgress;

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
        err!(
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
            err!("\r\x1b[2K");
            let _ = std::io::stderr().flush();
        }
        self.last = -1;
    }
}

/// Fetch progress on stderr: steps as lines; each phase (download, unpack, verify) a bar of its
/// own named for it, with MB/s and time left, which ends as a line saying what the phase did
/// (that line is printed when stderr is not a terminal too, so a log of the run shows it).
pub fn stderr_progress() -> impl FnMut(FetchProgress) {
    // The phase in progress, its bar, and whether its last bytes reached the total.
    let mut current: Option<(Phase, ProgressLine, String, bool)> = None;
    let end = |current: &mut Option<(Phase, ProgressLine, String, bool)>| {
        if let Some((phase, mut bar, last, _)) = current.take() {
            bar.finish();
            errln!("{}: {last}", phase.name());
        }
    };
    move |p| match p {
        FetchProgress::Step(s) => {
            // A step inside a phase (a retry) leaves the bar to go on; after a phase, it ends it.
            if current.as_ref().is_some_and(|c| c.3) {
                end(&mut current);
            } else if let Some((_, bar, _, _)) = current.as_mut() {
                bar.finish();
            }
            errln!("{s}");
        }
        FetchProgress::Bytes {
            phase,
            done,
            total,
            per_sec,
        } => {
            if current.as_ref().is_some_and(|c| c.0 != phase) {
                end(&mut current);
            }
            let (_, bar, last, complete) = current.get_or_insert_with(|| {
                (phase, ProgressLine::new(phase.name()), String::new(), false)
            });
            *last = FetchProgress::bytes_text(done, total, per_sec);
            *complete = total.is_some_and(|t| done >= t);
            bar.update(FetchProgress::fraction(done, total).unwrap_or(0.0), last);
        }
    }
}

/// A line of status on stderr, redrawn in place on a terminal; elsewhere (a log) its first and
/// last texts only, so that a long step is explained, not silent, and the log stays short.
pub struct LiveLine {
    tty: bool,
    drawn: bool,
    said: bool,
    last: Option<String>,
}

impl LiveLine {
    pub fn new() -> LiveLine {
        use std::io::IsTerminal;
        LiveLine {
            tty: std::io::stderr().is_terminal(),
            drawn: false,
            said: false,
            last: None,
        }
    }

    pub fn update(&mut self, text: &str) {
        if self.tty {
            err!("\r\x1b[2K{text}");
            let _ = std::io::stderr().flush();
            self.drawn = true;
        } else if !self.said {
            errln!("{text}");
            self.said = true;
            return;
        }
        self.last = Some(text.to_string());
    }

    /// Clears the line (a terminal) or says the last text (a log).
    pub fn finish(&mut self) {
        if self.drawn {
            err!("\r\x1b[2K");
            let _ = std::io::stderr().flush();
            self.drawn = false;
        }
        if let Some(t) = self.last.take()
            && !self.tty
        {
            errln!("{t}");
        }
    }
}

impl Default for LiveLine {
    fn default() -> Self {
        LiveLine::new()
    }
}

/// A first start's kernel compile on stderr: "compiling GPU kernels for gfx1100 (first run
/// only): k of N, ~T s left", then how long it took ([`LiveLine`]).
#[derive(Default)]
pub struct CompileLine(LiveLine);

impl CompileLine {
    pub fn new() -> CompileLine {
        CompileLine(LiveLine::new())
    }

    pub fn update(&mut self, p: &CompileProgress) {
        self.0.update(&p.describe());
    }

    pub fn finish(&mut self) {
        self.0.finish();
    }
}
