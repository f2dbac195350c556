//! Conversations saved as they happen: one JSON record per line (JSONL), appended with one
//! `write` per record to a file opened for appending, so that a crash or a hard exit loses at
//! most the record being written, and a torn last line is skipped when the file is read back.
//! `/save` exports Markdown; `--resume` reopens the newest conversation.
//!
//! The transcript is fed the same commands and events as the worker and the view, so it needs
//! no state of its own beyond what it replays.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::model::protocol::{Command, Event, GenStats};
use crate::ui::chat::{reason_text, stats_line};

/// One line of the file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Record {
    Start {
        version: u32,
        /// Seconds since the Unix epoch.
        time: u64,
        app: String,
    },
    Model {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
    },
    System {
        text: String,
    },
    User {
        text: String,
    },
    /// A piece of the answer being generated.
    Token {
        text: String,
    },
    Done {
        reason: String,
        prompt_tokens: usize,
        cached_tokens: usize,
        generated_tokens: usize,
        prompt_ms: f64,
        gen_ms: f64,
        ttft_ms: f64,
    },
    /// The last answer was dropped to be generated again.
    Regen,
    /// The sampler settings from here on, by their `/set` names (added later: older files have
    /// none, and a resumed conversation then keeps the configured settings).
    Sampler {
        values: std::collections::BTreeMap<String, String>,
    },
    Clear,
}

/// One question and its answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Turn {
    pub user: String,
    pub answer: String,
    /// The stats line, once the answer finished.
    pub summary: Option<String>,
}

/// A conversation, as replayed from its records.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Conversation {
    pub started: Option<u64>,
    pub model: Option<String>,
    pub system: String,
    pub turns: Vec<Turn>,
    /// The last sampler settings recorded, by `/set` name.
    pub sampler: Option<std::collections::BTreeMap<String, String>>,
}

impl Conversation {
    pub fn apply(&mut self, r: &Record) {
        match r {
            Record::Start { time, .. } => {
                self.started.get_or_insert(*time);
            }
            Record::Model { name, .. } => self.model = Some(name.clone()),
            Record::System { text } => self.system = text.clone(),
            Record::User { text } => self.turns.push(Turn {
                user: text.clone(),
                ..Turn::default()
            }),
            Record::Token { text } => {
                if let Some(t) = self.turns.last_mut() {
                    t.answer.push_str(text);
                }
            }
            Record::Done {
                reason,
                prompt_tokens,
                cached_tokens,
                generated_tokens,
                prompt_ms,
                gen_ms,
                ttft_ms,
            } => {
                if let Some(t) = self.turns.last_mut() {
                    let ms = |x: f64| std::time::Duration::from_secs_f64((x / 1e3).max(0.0));
                    let stats = GenStats {
                        prompt_tokens: *prompt_tokens,
                        cached_tokens: *cached_tokens,
                        prompt_time: ms(*prompt_ms),
                        generated_tokens: *generated_tokens,
                        gen_time: ms(*gen_ms),
                        time_to_first_token: ms(*ttft_ms),
                    };
                    t.summary = Some(stats_line(&stats, reason));
                }
            }
            Record::Regen => {
                if let Some(t) = self.turns.last_mut() {
                    t.answer.clear();
                    t.summary = None;
                }
            }
            Record::Clear => self.turns.clear(),
            Record::Sampler { values } => self.sampler = Some(values.clone()),
        }
    }

    /// The turns as (question, answer) pairs, for the worker and the view.
    pub fn pairs(&self) -> Vec<(String, String)> {
        self.turns
            .iter()
            .map(|t| (t.user.clone(), t.answer.clone()))
            .collect()
    }

    /// The conversation as a Markdown document.
    pub fn to_markdown(&self, now: SystemTime) -> String {
        let model = self.model.as_deref().unwrap_or("the assistant");
        let mut md = format!("# Conversation with {model}\n\n");
        let when = match self.started {
            Some(t) => format!("started {}", format_utc(t)),
            None => String::new(),
        };
        md.push_str(&format!(
            "_Exported by hipscope {} on {}{}._\n\n",
            env!("CARGO_PKG_VERSION"),
            format_utc(unix_secs(now)),
            if when.is_empty() {
                String::new()
            } else {
                format!("; {when}")
            }
        ));
        if !self.system.is_empty() {
            md.push_str("**System prompt:**\n\n");
            for line in self.system.lines() {
                md.push_str(&format!("> {line}\n"));
            }
            md.push('\n');
        }
        for t in &self.turns {
            md.push_str("## You\n\n");
            md.push_str(t.user.trim_end());
            md.push_str("\n\n");
            md.push_str(&format!("## {model}\n\n"));
            if t.answer.trim().is_empty() {
                md.push_str("_(no answer)_\n\n");
            } else {
                md.push_str(t.answer.trim_end());
                md.push_str("\n\n");
            }
            if let Some(s) = &t.summary {
                md.push_str(&format!("_{s}_\n\n"));
            }
        }
        md
    }
}

/// Why a transcript could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TranscriptError {
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path}: not a hipscope conversation (line {line}: {message})")]
    Malformed {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

/// The conversation being recorded.
#[derive(Debug, Default)]
pub struct Transcript {
    conversation: Conversation,
    file: Option<File>,
    path: Option<PathBuf>,
    /// The first write error; recording to disk stops there, the conversation stays in memory.
    failed: Option<String>,
}

impl Transcript {
    /// Records in memory only (`[transcript] enabled = false`): `/save` still works.
    pub fn in_memory() -> Transcript {
        Transcript::default()
    }

    /// Starts a new conversation file in `dir`.
    pub fn create(dir: &Path, now: SystemTime) -> Result<Transcript, TranscriptError> {
        let io = |cause| TranscriptError::Io {
            path: dir.to_path_buf(),
            cause,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let stamp = file_stamp(unix_secs(now));
        let mut n = 0;
        let (file, path) = loop {
            let name = if n == 0 {
                format!("conversation-{stamp}.jsonl")
            } else {
                format!("conversation-{stamp}-{n}.jsonl")
            };
            let path = dir.join(name);
            match OpenOptions::new().append(true).create_new(true).open(&path) {
                Ok(f) => break (f, path),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => {
                    return Err(TranscriptError::Io { path, cause: e });
                }
            }
        };
        let mut t = Transcript {
            file: Some(file),
            path: Some(path),
            ..Transcript::default()
        };
        t.record(Record::Start {
            version: 1,
            time: unix_secs(now),
            app: format!("hipscope {}", env!("CARGO_PKG_VERSION")),
        });
        Ok(t)
    }

    /// Reopens `path` to go on appending to it.
    pub fn open(path: &Path) -> Result<Transcript, TranscriptError> {
        let conversation = read(path)?;
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|cause| TranscriptError::Io {
                path: path.to_path_buf(),
                cause,
            })?;
        Ok(Transcript {
            conversation,
            file: Some(file),
            path: Some(path.to_path_buf()),
            failed: None,
        })
    }

    /// The newest conversation file in `dir`, if any.
    pub fn latest(dir: &Path) -> Option<PathBuf> {
        let entries = std::fs::read_dir(dir).ok()?;
        entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.extension().is_some_and(|x| x == "jsonl")
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("conversation-"))
            })
            .max_by_key(|p| {
                let modified = std::fs::metadata(p).and_then(|m| m.modified()).ok();
                (modified, p.clone())
            })
    }

    pub fn conversation(&self) -> &Conversation {
        &self.conversation
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The write error that stopped recording to disk, if one did.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    fn record(&mut self, r: Record) {
        self.conversation.apply(&r);
        let Some(file) = self.file.as_mut() else {
            return;
        };
        let mut line = match serde_json::to_string(&r) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("transcript record not serialisable: {e}");
                return;
            }
        };
        line.push('\n');
        // One write per record: on a file opened for appending, a record is never interleaved
        // with another, and a crash tears at most this one.
        if let Err(e) = file.write_all(line.as_bytes()) {
            let path = self.path.as_ref().map(|p| p.display().to_string());
            let msg = format!(
                "could not write the conversation to {}: {e}; it is kept in memory (/save exports it)",
                path.unwrap_or_default()
            );
            tracing::warn!("{msg}");
            self.failed = Some(msg);
            self.file = None;
        }
    }

    /// Notes what the UI sent to the worker.
    pub fn command(&mut self, c: &Command) {
        match c {
            Command::Generate { user } => self.record(Record::User { text: user.clone() }),
            Command::Regenerate => self.record(Record::Regen),
            Command::Clear => self.record(Record::Clear),
            Command::SetSystem(s) => self.record(Record::System { text: s.clone() }),
            Command::SetSampler(s) => self.record(Record::Sampler {
                values: crate::ui::sampler::FIELDS
                    .iter()
                    .map(|f| (f.name.to_string(), (f.get)(s)))
                    .collect(),
            }),
            _ => {}
        }
    }

    /// Notes what the worker answered.
    pub fn event(&mut self, e: &Event) {
        match e {
            Event::Token { text } => self.record(Record::Token { text: text.clone() }),
            Event::AnswerDone { stats, reason } => {
                let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
                self.record(Record::Done {
                    reason: reason_text(reason),
                    prompt_tokens: stats.prompt_tokens,
                    cached_tokens: stats.cached_tokens,
                    generated_tokens: stats.generated_tokens,
                    prompt_ms: ms(stats.prompt_time),
                    gen_ms: ms(stats.gen_time),
                    ttft_ms: ms(stats.time_to_first_token),
                });
                // An answer is a natural point to make the file durable, not just written.
                self.sync();
            }
            Event::ModelLoaded { model, .. } => self.record(Record::Model {
                name: model.name.clone(),
                path: model.path.as_ref().map(|p| p.display().to_string()),
            }),
            _ => {}
        }
    }

    /// Pushes what was written to the disk.
    pub fn sync(&mut self) {
        if let Some(f) = self.file.as_mut()
            && let Err(e) = f.sync_data()
        {
            tracing::warn!("transcript sync failed: {e}");
        }
    }

    /// Writes the conversation as Markdown to `path`, or to a fresh file in `default_dir`.
    pub fn export_markdown(
        &self,
        path: Option<PathBuf>,
        default_dir: &Path,
        now: SystemTime,
    ) -> Result<PathBuf, String> {
        let path = match path {
            Some(p) if p.is_dir() => {
                p.join(format!("conversation-{}.md", file_stamp(unix_secs(now))))
            }
            Some(p) => p,
            None => default_dir.join(format!("conversation-{}.md", file_stamp(unix_secs(now)))),
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        // Write beside it, then rename: a failed export never leaves half a file behind.
        let tmp = path.with_extension("md.partial");
        std::fs::write(&tmp, self.conversation.to_markdown(now))
            .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("cannot write {}: {e}", path.display())
        })?;
        Ok(path)
    }
}

/// Replays a conversation file. A torn last line (a crash mid-write) is skipped; a bad line
/// before the end means the file is not a transcript.
pub fn read(path: &Path) -> Result<Conversation, TranscriptError> {
    let text = std::fs::read_to_string(path).map_err(|cause| TranscriptError::Io {
        path: path.to_path_buf(),
        cause,
    })?;
    let mut conversation = Conversation::default();
    let lines: Vec<&str> = text.split('\n').collect();
    let last = lines
        .iter()
        .rposition(|l| !l.trim().is_empty())
        .unwrap_or(0);
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Record>(line) {
            Ok(r) => conversation.apply(&r),
            Err(_) if i == last && !text.ends_with('\n') => {
                tracing::warn!("{}: skipping a torn last record", path.display());
            }
            Err(e) => {
                return Err(TranscriptError::Malformed {
                    path: path.to_path_buf(),
                    line: i + 1,
                    message: e.to_string(),
                });
            }
        }
    }
    Ok(conversation)
}

pub fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn parts(secs: u64) -> (i64, u32, u32, u64, u64, u64) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    (y, m, d, rem / 3600, (rem % 3600) / 60, rem % 60)
}

/// `2026-11-22 14:15 UTC`
pub fn format_utc(secs: u64) -> String {
    let (y, m, d, h, min, _) = parts(secs);
    format!("{y:04}-{m:02}-{d:02} {h:02}:{min:02} UTC")
}

/// `20261122-141503`, for file names that sort by time.
pub fn file_stamp(secs: u64) -> String {
    let (y, m, d, h, min, s) = parts(secs);
    format!("{y:04}{m:02}{d:02}-{h:02}{min:02}{s:02}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::protocol::StopReason;
    use std::time::Duration;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn dates_match_known_instants() {
        assert_eq!(format_utc(0), "1970-01-01 00:00 UTC");
        // `date -u -d @1700000000`: Tue Nov 14 22:13:20 UTC 2023.
        assert_eq!(file_stamp(1_700_000_000), "20231114-221320");
        // A leap day: `date -u -d 2024-02-29T12:00:00Z +%s` = 1709208000.
        assert_eq!(format_utc(1_709_208_000), "2024-02-29 12:00 UTC");
        assert_eq!(format_utc(951_782_400), "2000-02-29 00:00 UTC");
    }

    fn exchange(t: &mut Transcript, q: &str, answer: &[&str]) {
        t.command(&Command::Generate { user: q.into() });
        for piece in answer {
            t.event(&Event::Token {
                text: (*piece).into(),
            });
        }
        t.event(&Event::AnswerDone {
            stats: GenStats {
                prompt_tokens: 12,
                generated_tokens: answer.len(),
                gen_time: Duration::from_millis(10 * answer.len() as u64),
                prompt_time: Duration::from_millis(24),
                ..GenStats::default()
            },
            reason: StopReason::Eog,
        });
    }

    #[test]
    fn a_conversation_replays_from_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = Transcript::create(dir.path(), at(1_700_000_000)).unwrap();
        let path = t.path().unwrap().to_path_buf();
        assert_eq!(
            path.file_name().unwrap(),
            "conversation-20231114-221320.jsonl"
        );
        t.command(&Command::SetSystem("Be brief.".into()));
        exchange(&mut t, "hi", &["Hel", "lo", "!"]);
        exchange(&mut t, "2+2?", &["5"]);
        t.command(&Command::Regenerate);
        t.event(&Event::Token { text: "4".into() });
        drop(t);
        let c = read(&path).unwrap();
        assert_eq!(c.system, "Be brief.");
        assert_eq!(
            c.pairs(),
            [
                ("hi".to_string(), "Hello!".to_string()),
                ("2+2?".to_string(), "4".to_string())
            ]
        );
        assert_eq!(c.started, Some(1_700_000_000));
        // Reopened, it goes on appending.
        let mut t = Transcript::open(&path).unwrap();
        t.command(&Command::Clear);
        exchange(&mut t, "again", &["yes"]);
        let c = read(&path).unwrap();
        assert_eq!(c.pairs(), [("again".to_string(), "yes".to_string())]);
        assert_eq!(Transcript::latest(dir.path()), Some(path));
    }

    #[test]
    fn a_torn_last_line_is_skipped_but_a_bad_line_inside_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("conversation-x.jsonl");
        std::fs::write(
            &p,
            "{\"t\":\"user\",\"text\":\"q\"}\n{\"t\":\"token\",\"text\":\"a\"}\n{\"t\":\"tok",
        )
        .unwrap();
        let c = read(&p).unwrap();
        assert_eq!(c.pairs(), [("q".to_string(), "a".to_string())]);
        std::fs::write(
            &p,
            "{\"t\":\"user\",\"text\":\"q\"}\nnot json\n{\"t\":\"clear\"}\n",
        )
        .unwrap();
        let e = read(&p).unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
    }

    #[test]
    fn two_conversations_in_one_second_get_two_files() {
        let dir = tempfile::tempdir().unwrap();
        let a = Transcript::create(dir.path(), at(5)).unwrap();
        let b = Transcript::create(dir.path(), at(5)).unwrap();
        assert_ne!(a.path(), b.path());
    }

    #[test]
    fn markdown_export_has_every_turn() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = Transcript::in_memory();
        t.event(&Event::ModelLoaded {
            model: crate::model::protocol::ModelSummary {
                name: "SmolLM2".into(),
                ..Default::default()
            },
            device: Default::default(),
        });
        t.command(&Command::SetSystem("Be brief.\nNo lists.".into()));
        exchange(&mut t, "hi", &["Hello", " there"]);
        let path = t
            .export_markdown(None, &dir.path().join("exports"), at(1_700_000_000))
            .unwrap();
        let md = std::fs::read_to_string(&path).unwrap();
        assert!(md.starts_with("# Conversation with SmolLM2\n"), "{md}");
        assert!(md.contains("> Be brief.\n> No lists.\n"), "{md}");
        assert!(
            md.contains("## You\n\nhi\n\n## SmolLM2\n\nHello there\n"),
            "{md}"
        );
        assert!(md.contains("_TTFT"), "{md}");
        assert!(md.contains("· end of text_"), "{md}");
        assert!(path.starts_with(dir.path().join("exports")));
        assert!(!path.with_extension("md.partial").exists());
    }

    #[test]
    fn a_write_failure_keeps_the_conversation_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = Transcript::create(dir.path(), at(0)).unwrap();
        // Swap the file for one opened read-only: every write now fails.
        let path = t.path().unwrap().to_path_buf();
        t.file = Some(File::open(&path).unwrap());
        exchange(&mut t, "q", &["a"]);
        assert!(t.failure().is_some_and(|m| m.contains("kept in memory")));
        assert_eq!(
            t.conversation().pairs(),
            [("q".to_string(), "a".to_string())]
        );
    }

    #[test]
    fn sampler_settings_are_kept_and_old_files_have_none() {
        let cfg = crate::model::protocol::SamplerConfig {
            temp: 0.25,
            ..Default::default()
        };
        let mut t = Transcript::in_memory();
        t.command(&Command::SetSampler(cfg));
        let line = serde_json::to_string(&Record::Sampler {
            values: [("temp".to_string(), "0.25".to_string())].into(),
        })
        .unwrap();
        let back: Record = serde_json::from_str(&line).unwrap();
        let mut c = Conversation::default();
        c.apply(&back);
        assert_eq!(c.sampler.unwrap()["temp"], "0.25");
        assert_eq!(
            t.conversation().sampler.as_ref().map(|m| m["temp"].clone()),
            Some("0.25".to_string())
        );
        // A file written before the record existed: no settings, the configured ones apply.
        let mut old = Conversation::default();
        for line in [
            r#"{"t":"start","version":1,"time":1,"app":"hipscope"}"#,
            r#"{"t":"user","text":"hi"}"#,
        ] {
            old.apply(&serde_json::from_str(line).unwrap());
        }
        assert_eq!(old.sampler, None);
        assert_eq!(old.turns.len(), 1);
    }
}
