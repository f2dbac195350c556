//! The doctor's report: checks grouped in sections, each PASS / WARN / FAIL / SKIP with a
//! one-line reason and what to do; drawn as text for a terminal or a bug report, or as JSON.

use std::fmt::Write as _;

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    Pass,
    Skip,
    Warn,
    Fail,
}

impl Status {
    pub fn word(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Skip => "SKIP",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Check {
    pub section: &'static str,
    pub name: String,
    pub status: Status,
    pub detail: String,
    /// What to do about it; empty when nothing.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub advice: String,
    /// Wall time of a functional check, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ms: Option<u64>,
}

impl Check {
    pub fn new(
        section: &'static str,
        name: impl Into<String>,
        status: Status,
        detail: impl Into<String>,
    ) -> Check {
        Check {
            section,
            name: name.into(),
            status,
            detail: detail.into(),
            advice: String::new(),
            ms: None,
        }
    }

    pub fn advise(mut self, advice: impl Into<String>) -> Check {
        self.advice = advice.into();
        self
    }
}

/// Exit codes of `hipscope doctor` (also in the README).
pub const EXIT_OK: i32 = 0;
pub const EXIT_FAIL: i32 = 1;
pub const EXIT_USAGE: i32 = 2;

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    pub fn push(&mut self, c: Check) {
        self.checks.push(c);
    }

    pub fn worst(&self) -> Status {
        self.checks
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(Status::Pass)
    }

    /// 1 when any check failed, else 0 (warnings do not fail the run).
    pub fn exit_code(&self) -> i32 {
        if self.worst() == Status::Fail {
            EXIT_FAIL
        } else {
            EXIT_OK
        }
    }

    pub fn count(&self, s: Status) -> usize {
        self.checks.iter().filter(|c| c.status == s).count()
    }

    /// The one-screen text: a heading per section, one line per check, advice indented below.
    pub fn text(&self) -> String {
        let mut o = String::new();
        let mut section = "";
        let name_w = self
            .checks
            .iter()
            .map(|c| c.name.chars().count())
            .max()
            .unwrap_or(0)
            .min(28);
        for c in &self.checks {
            if c.section != section {
                section = c.section;
                let _ = writeln!(o, "\n[{section}]");
            }
            let ms = c.ms.map(|m| format!(" ({m} ms)")).unwrap_or_default();
            let _ = writeln!(
                o,
                "{} {:<name_w$}  {}{ms}",
                c.status.word(),
                c.name,
                c.detail
            );
            if !c.advice.is_empty() {
                let _ = writeln!(o, "     {:<name_w$}  → {}", "", c.advice);
            }
        }
        let _ = writeln!(
            o,
            "\n{} passed, {} warnings, {} failed, {} skipped",
            self.count(Status::Pass),
            self.count(Status::Warn),
            self.count(Status::Fail),
            self.count(Status::Skip)
        );
        o
    }
}
