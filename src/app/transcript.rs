//! Conversations saved as they happen: one JSON record per line (JSONL), appended with one
//! `write` per record to a file opened for appending. A record is on disk whole or not at all:
//! after a failed write (a full disk) the file is cut back to the last complete record, with a
//! notice, and the records from there on wait in memory; at each turn (a question, an answer's
//! end, a regeneration, a clear) and at the quit they are tried again, in order, so that once
//! there is room the file holds the whole conversation again (with a notice that says so). A
//! quit with records still waiting is held once to say so and offer `/save` (`event_loop.rs`).
//! The file is synced at the end of every answer. Reading back takes every complete record and
//! says how many bytes of a torn end it skipped.
//!
//! The file is created at the first message (a session in which nothing was said leaves none),
//! 0600 in a 0700 folder whatever the umask (`gpu::dirs`), and held with an exclusive advisory
//! lock (`flock`, Unix) so that two instances never write into one file. `/save` exports
//! Markdown; `--resume` reopens the newest conversation with a turn in it.
//!
//! The transcript is fed the same commands and events as the worker and the view, so it needs
//! no state of its own beyond what it replays.
//!
//! This file is the journal (the file being written); beside it, by job: `record.rs` (the
//! records and the conversation they replay to), `replay.rs` (reading a file back),
//! `markdown.rs` (`/save`), `lock.rs` (`flock` and its holder), `calendar.rs` (dates),
//! `resume.rs` (the model `--resume` goes on with).

mod calendar;
mod lock;
mod markdown;
mod record;
mod replay;
mod resume;

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub use calendar::{file_stamp, format_utc, unix_secs};
use lock::lock;
pub use record::{Conversation, Record, Turn};
pub use replay::{Replay, read, replay};
pub use resume::resume_model;

use crate::model::protocol::{Command, Event};
use crate::ui::chat::reason_text;

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
    #[error("{path} is open in another hipscope{}", holder.map(|p| format!(" (process {p})")).unwrap_or_default())]
    Locked { path: PathBuf, holder: Option<u32> },
}

/// The conversation being recorded.
#[derive(Debug, Default)]
pub struct Transcript {
    conversation: Conversation,
    file: Option<File>,
    path: Option<PathBuf>,
    /// Where the file will be created at the first message (`None`: memory only, or created).
    dir: Option<PathBuf>,
    /// Records not on disk yet, in order, each with whether it starts a turn: those made before
    /// the file exists (the start, the model, the system prompt) and, after a failed write,
    /// every record since.
    unwritten: VecDeque<(String, bool)>,
    /// The file's length up to the end of the last record written whole.
    committed: u64,
    /// Why the records in `unwritten` are not on disk, for the user: a write failed (tried
    /// again at each turn); and the error alone.
    failed: Option<String>,
    failed_why: String,
    /// What the user should be told, oldest first (text, whether it is an error).
    notices: VecDeque<(String, bool)>,
}

impl Transcript {
    /// Records in memory only (`[transcript] enabled = false`): `/save` still works.
    pub fn in_memory() -> Transcript {
        Transcript::default()
    }

    /// Starts a new conversation, whose file is created in `dir` at the first message.
    pub fn create(dir: &Path, now: SystemTime) -> Transcript {
        let mut t = Transcript {
            dir: Some(dir.to_path_buf()),
            ..Transcript::default()
        };
        t.record(Record::Start {
            version: 1,
            time: unix_secs(now),
            app: format!("hipscope {}", env!("CARGO_PKG_VERSION")),
        });
        t
    }

    /// Creates the file (at the first message): a new name in `dir`, 0600, locked.
    fn create_file(dir: &Path, now: SystemTime) -> Result<(File, PathBuf), TranscriptError> {
        let io = |cause| TranscriptError::Io {
            path: dir.to_path_buf(),
            cause,
        };
        crate::gpu::dirs::create_private_dir(dir).map_err(io)?;
        let stamp = file_stamp(unix_secs(now));
        let mut n = 0;
        loop {
            let name = if n == 0 {
                format!("conversation-{stamp}.jsonl")
            } else {
                format!("conversation-{stamp}-{n}.jsonl")
            };
            let path = dir.join(name);
            let mut open = OpenOptions::new();
            open.append(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut open, crate::gpu::dirs::FILE_MODE);
            match open.open(&path) {
                Ok(f) => {
                    lock(&f, &path)?;
                    return Ok((f, path));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => {
                    return Err(TranscriptError::Io { path, cause: e });
                }
            }
        }
    }

    /// Reopens `path` to go on appending to it: locks it, reads every complete record, and cuts
    /// a torn end off so that what is appended starts on a line of its own. Returns how many
    /// bytes were skipped.
    pub fn open(path: &Path) -> Result<(Transcript, u64), TranscriptError> {
        let io = |cause| TranscriptError::Io {
            path: path.to_path_buf(),
            cause,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        lock(&file, path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io)?;
        let replay = replay(path, &bytes)?;
        if replay.complete_len < bytes.len() as u64 {
            file.set_len(replay.complete_len).map_err(io)?;
            file.seek(SeekFrom::End(0)).map_err(io)?;
        }
        let mut t = Transcript {
            conversation: replay.conversation,
            file: Some(file),
            path: Some(path.to_path_buf()),
            committed: replay.complete_len,
            ..Transcript::default()
        };
        // A file from before conversations were private (0644): made 0600, and said.
        match crate::gpu::dirs::tighten(path) {
            Ok(Some(t2)) => t.notices.push_back((t2.to_string(), false)),
            Ok(None) => {}
            Err(e) => tracing::warn!("{}: cannot make it private: {e}", path.display()),
        }
        Ok((t, replay.skipped_bytes))
    }

    /// The conversation files in `dir`, newest first.
    fn files(dir: &Path) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut files: Vec<(Option<SystemTime>, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.extension().is_some_and(|x| x == "jsonl")
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("conversation-"))
            })
            .map(|p| (std::fs::metadata(&p).and_then(|m| m.modified()).ok(), p))
            .collect();
        files.sort();
        files.into_iter().rev().map(|(_, p)| p).collect()
    }

    /// The newest conversation file in `dir` with at least one turn in it.
    pub fn latest(dir: &Path) -> Option<PathBuf> {
        Transcript::files(dir)
            .into_iter()
            .find(|p| read(p).is_ok_and(|c| !c.turns.is_empty()))
    }

    /// The chat's transcript: with `resume`, the newest conversation with a turn in it; else (or
    /// when there is none, or another instance holds it) a new one; in memory only when not
    /// `enabled`. The note, if any, is for the user.
    pub fn for_chat(dir: &Path, enabled: bool, resume: bool) -> (Transcript, Option<String>) {
        let fresh = || {
            if enabled {
                Transcript::create(dir, SystemTime::now())
            } else {
                Transcript::in_memory()
            }
        };
        if !resume {
            return (fresh(), None);
        }
        let Some(p) = Transcript::latest(dir) else {
            return (
                fresh(),
                Some(format!(
                    "no saved conversation to resume in {}; starting a new one",
                    dir.display()
                )),
            );
        };
        match Transcript::open(&p) {
            Ok((t, 0)) => (t, None),
            Ok((t, skipped)) => (
                t,
                Some(format!(
                    "{}: skipped {skipped} byte{} that were not a complete record (a torn write)",
                    p.display(),
                    if skipped == 1 { "" } else { "s" }
                )),
            ),
            Err(e @ TranscriptError::Locked { .. }) => {
                (fresh(), Some(format!("{e}; starting a new conversation")))
            }
            Err(e) => (
                fresh(),
                Some(format!("could not reopen the last conversation: {e}")),
            ),
        }
    }

    pub fn conversation(&self) -> &Conversation {
        &self.conversation
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The write error that keeps records from the disk now, if one does.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// The next thing the user should be told: a write that failed (once per failure), the
    /// conversation saved again, a file made private.
    pub fn take_notice(&mut self) -> Option<(String, bool)> {
        self.notices.pop_front()
    }

    /// What is not on disk, in words, after trying once more to write it; `None` when every
    /// record is saved (or the conversation is kept in memory only, by choice).
    pub fn unsaved(&mut self) -> Option<String> {
        self.flush();
        if self.failed.is_none() || self.unwritten.is_empty() {
            return None;
        }
        // The turns with a record waiting: those that start in memory, and the one the first
        // waiting record belongs to when it started on disk.
        let starts = self.unwritten.iter().filter(|(_, turn)| *turn).count();
        let torn = self.unwritten.front().is_some_and(|(_, turn)| !turn);
        let turns = starts + usize::from(torn);
        let why = &self.failed_why;
        Some(format!(
            "{} of this conversation {} not saved ({why})",
            if turns <= 1 {
                "the last turn".to_string()
            } else {
                format!("the last {turns} turns")
            },
            if turns <= 1 { "is" } else { "are" },
        ))
    }

    fn record(&mut self, r: Record) {
        self.conversation.apply(&r);
        if self.file.is_none() && self.dir.is_none() {
            // Kept in memory only.
            return;
        }
        let mut line = match serde_json::to_string(&r) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("transcript record not serialisable: {e}");
                return;
            }
        };
        line.push('\n');
        let starts_turn = matches!(r, Record::User { .. });
        self.unwritten.push_back((line, starts_turn));
        // The file comes with the first message; what came before waits for it. After a failed
        // write, records wait for the next turn's try (not one failed write per token).
        let turn = matches!(
            r,
            Record::User { .. } | Record::Done { .. } | Record::Regen | Record::Clear
        );
        let first = self.file.is_none() && self.failed.is_none();
        if (first && !starts_turn) || (self.failed.is_some() && !turn) {
            return;
        }
        self.flush();
    }

    /// Writes every waiting record, in order, creating the file first if it is not there yet;
    /// stops at the first that fails (a notice says why, once).
    fn flush(&mut self) {
        if self.unwritten.is_empty() && self.failed.is_none() {
            return;
        }
        // No file before the first message: a session in which nothing was said leaves none.
        if self.file.is_none() && !self.unwritten.iter().any(|(_, turn)| *turn) {
            return;
        }
        if self.file.is_none() {
            let Some(dir) = self.dir.clone() else {
                return;
            };
            match Transcript::create_file(&dir, SystemTime::now()) {
                Ok((file, path)) => {
                    self.file = Some(file);
                    self.path = Some(path);
                    self.dir = None;
                }
                Err(e) => return self.fail(e.to_string()),
            }
        }
        while let Some((line, _)) = self.unwritten.front() {
            let line = line.clone();
            if let Err(why) = self.write_line(&line) {
                return self.fail(why);
            }
            self.unwritten.pop_front();
        }
        if self.failed.take().is_some() {
            let path = self.path.as_ref().map(|p| p.display().to_string());
            let text = format!(
                "saving the conversation again: what was missing is written to {}",
                path.unwrap_or_default()
            );
            tracing::info!("{text}");
            self.notices.push_back((text, false));
        }
    }

    /// Appends one record. One write per record: on a file opened for appending, a record is
    /// never interleaved with another; a write that fails part-way (a full disk) is cut off
    /// again, so the file always ends with a whole record.
    fn write_line(&mut self, line: &str) -> Result<(), String> {
        let Some(file) = self.file.as_mut() else {
            return Err("no file".into());
        };
        match file.write_all(line.as_bytes()) {
            Ok(()) => {
                self.committed += line.len() as u64;
                Ok(())
            }
            Err(e) => {
                // Through the path: the appending handle may be the one that cannot write.
                let committed = self.committed;
                let cut = match &self.path {
                    Some(p) => OpenOptions::new()
                        .write(true)
                        .open(p)
                        .and_then(|f| f.set_len(committed)),
                    None => file.set_len(committed),
                };
                let path = self.path.as_ref().map(|p| p.display().to_string());
                let mut why = format!("{}: {e}", path.unwrap_or_default());
                if let Err(c) = cut {
                    why.push_str(&format!(" (and cutting the torn record off failed: {c})"));
                }
                Err(why)
            }
        }
    }

    /// A write failed: the records wait in memory, and the user hears it once per failure.
    fn fail(&mut self, why: String) {
        let msg = format!(
            "not saving the conversation for now: {why}; it is kept in memory and saved again \
             at the next turn once there is room (/save exports it elsewhere)"
        );
        if self.failed.is_none() {
            tracing::warn!("{msg}");
            self.notices.push_back((msg.clone(), true));
        }
        self.failed = Some(msg);
        self.failed_why = why;
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
            Event::Reasoning { text } => self.record(Record::Reasoning { text: text.clone() }),
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
                    reasoning_tokens: stats.reasoning_tokens,
                    reasoning_ms: ms(stats.reasoning_time),
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
            let path = self.path.as_ref().map(|p| p.display().to_string());
            let text = format!(
                "{}: syncing the conversation: {e}",
                path.unwrap_or_default()
            );
            tracing::warn!("{text}");
            self.notices.push_back((text, true));
        }
    }
}

#[cfg(test)]
mod tests;
