//! (Over 700 lines on purpose: the writer and the reader of one file format stay in one file so
//! that they cannot drift apart; the tests are in `transcript/tests.rs`.)
//!
//! Conversations saved as they happen: one JSON record per line (JSONL), appended with one
//! `write` per record to a file opened for appending. A record is on disk whole or not at all:
//! after a failed write (a full disk) the file is cut back to the last complete record and
//! recording stops, with a notice; the file is synced at the end of every answer. Reading back
//! takes every complete record and says how many bytes of a torn end it skipped.
//!
//! The file is created at the first message (a session in which nothing was said leaves none),
//! and held with an exclusive advisory lock (`flock`) so that two instances never write into one
//! file. `/save` exports Markdown; `--resume` reopens the newest conversation with a turn in it.
//!
//! The transcript is fed the same commands and events as the worker and the view, so it needs
//! no state of its own beyond what it replays.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::app::atomic_file::{self, Replace};
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
    /// A piece of a reasoning model's reasoning before its answer (added later: older files
    /// have none).
    Reasoning {
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
        /// Of the generated tokens, the reasoning's (written only when there was reasoning).
        #[serde(default, skip_serializing_if = "is_zero")]
        reasoning_tokens: usize,
        #[serde(default, skip_serializing_if = "is_zero_f")]
        reasoning_ms: f64,
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

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn is_zero_f(x: &f64) -> bool {
    *x == 0.0
}

/// One question and its answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Turn {
    pub user: String,
    pub answer: String,
    /// The reasoning before the answer (a reasoning model's; empty otherwise).
    pub reasoning: String,
    /// The stats line, once the answer finished.
    pub summary: Option<String>,
    /// The system prompt in force when the question was asked.
    pub system: String,
    /// The model that answered (its name when the question was asked).
    pub model: Option<String>,
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
                system: self.system.clone(),
                model: self.model.clone(),
                ..Turn::default()
            }),
            Record::Token { text } => {
                if let Some(t) = self.turns.last_mut() {
                    t.answer.push_str(text);
                }
            }
            Record::Reasoning { text } => {
                if let Some(t) = self.turns.last_mut() {
                    t.reasoning.push_str(text);
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
                reasoning_tokens,
                reasoning_ms,
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
                        reasoning_tokens: *reasoning_tokens,
                        reasoning_time: ms(*reasoning_ms),
                    };
                    t.summary = Some(stats_line(&stats, reason));
                }
            }
            Record::Regen => {
                if let Some(t) = self.turns.last_mut() {
                    t.answer.clear();
                    t.reasoning.clear();
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
        // The system prompt at the top is the one the first question was asked under; where it
        // changed between questions, the new one is shown there (as the model's name is).
        let quote = |md: &mut String, title: &str, text: &str| {
            md.push_str(&format!("**{title}:**\n\n"));
            for line in text.lines() {
                md.push_str(&format!("> {line}\n"));
            }
            md.push('\n');
        };
        let first = self.turns.first().map_or(&self.system, |t| &t.system);
        if !first.is_empty() {
            quote(&mut md, "System prompt", first);
        }
        for (i, t) in self.turns.iter().enumerate() {
            if i > 0 && t.system != self.turns[i - 1].system {
                if t.system.is_empty() {
                    md.push_str("_The system prompt was removed here._\n\n");
                } else {
                    quote(&mut md, "System prompt from here on", &t.system);
                }
            }
            md.push_str("## You\n\n");
            md.push_str(t.user.trim_end());
            md.push_str("\n\n");
            let speaker = t.model.as_deref().unwrap_or(model);
            md.push_str(&format!("## {speaker}\n\n"));
            if !t.reasoning.trim().is_empty() {
                // Folded, as chat sites export it; GitHub and most viewers render <details>.
                md.push_str("<details><summary>Reasoning</summary>\n\n");
                md.push_str(t.reasoning.trim());
                md.push_str("\n\n</details>\n\n");
            }
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
    /// Records made before the file exists (the start, the model, the system prompt).
    pending: Vec<String>,
    /// The file's length up to the end of the last record written whole.
    committed: u64,
    /// The first write error; recording to disk stops there, the conversation stays in memory.
    failed: Option<String>,
}

/// What a conversation file held: every complete record, replayed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Replay {
    pub conversation: Conversation,
    /// Bytes up to the end of the last complete record.
    pub complete_len: u64,
    /// Bytes that were not a complete record (a torn end, or lines torn by an older version):
    /// skipped.
    pub skipped_bytes: u64,
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

    /// Creates the file (at the first message): a new name in `dir`, locked.
    fn create_file(dir: &Path, now: SystemTime) -> Result<(File, PathBuf), TranscriptError> {
        let io = |cause| TranscriptError::Io {
            path: dir.to_path_buf(),
            cause,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let stamp = file_stamp(unix_secs(now));
        let mut n = 0;
        loop {
            let name = if n == 0 {
                format!("conversation-{stamp}.jsonl")
            } else {
                format!("conversation-{stamp}-{n}.jsonl")
            };
            let path = dir.join(name);
            match OpenOptions::new().append(true).create_new(true).open(&path) {
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
        Ok((
            Transcript {
                conversation: replay.conversation,
                file: Some(file),
                path: Some(path.to_path_buf()),
                committed: replay.complete_len,
                ..Transcript::default()
            },
            replay.skipped_bytes,
        ))
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

    /// The write error that stopped recording to disk, if one did.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    fn record(&mut self, r: Record) {
        self.conversation.apply(&r);
        if self.failed.is_some() {
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
        if self.file.is_none() {
            let Some(dir) = self.dir.clone() else {
                return;
            };
            // The file comes with the first message; what came before waits for it.
            self.pending.push(line);
            if !matches!(r, Record::User { .. }) {
                return;
            }
            match Transcript::create_file(&dir, SystemTime::now()) {
                Ok((file, path)) => {
                    self.file = Some(file);
                    self.path = Some(path);
                    self.dir = None;
                    for line in std::mem::take(&mut self.pending) {
                        self.write_line(&line);
                    }
                }
                Err(e) => self.fail(e.to_string()),
            }
            return;
        }
        self.write_line(&line);
    }

    /// Appends one record. One write per record: on a file opened for appending, a record is
    /// never interleaved with another; a write that fails part-way (a full disk) is cut off
    /// again, so the file always ends with a whole record.
    fn write_line(&mut self, line: &str) {
        let Some(file) = self.file.as_mut() else {
            return;
        };
        match file.write_all(line.as_bytes()) {
            Ok(()) => self.committed += line.len() as u64,
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
                self.fail(why);
            }
        }
    }

    fn fail(&mut self, why: String) {
        let msg = format!(
            "not saving the conversation any more: {why}; it is kept in memory (/save exports it)"
        );
        tracing::warn!("{msg}");
        self.failed = Some(msg);
        self.file = None;
        self.pending.clear();
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
            self.fail(format!("{}: syncing: {e}", path.unwrap_or_default()));
        }
    }

    /// Writes the conversation as Markdown to `path`, or to a fresh file in `default_dir` (or in
    /// `path` when it is a folder). Only a new path or, with `overwrite` (`/save!`), an existing
    /// regular file is written: never through a symbolic link, never onto a device or a pipe.
    /// The file appears whole or not at all (a temporary file beside it, renamed into place).
    pub fn export_markdown(
        &self,
        path: Option<PathBuf>,
        overwrite: bool,
        default_dir: &Path,
        now: SystemTime,
    ) -> Result<PathBuf, String> {
        let text = self.conversation.to_markdown(now);
        let (dir, explicit) = match path {
            Some(p) if p.is_dir() && !p.is_symlink() => (p, None),
            Some(p) => (PathBuf::new(), Some(p)),
            None => (default_dir.to_path_buf(), None),
        };
        let Some(path) = explicit else {
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            // A name of its own: two saves in one second get two files.
            let stamp = file_stamp(unix_secs(now));
            for n in 0..1000 {
                let name = if n == 0 {
                    format!("conversation-{stamp}.md")
                } else {
                    format!("conversation-{stamp}-{n}.md")
                };
                let p = dir.join(name);
                match atomic_file::write_bytes(&p, Replace::Never, text.as_bytes()) {
                    Ok(()) => return Ok(p),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(format!("cannot write {}: {e}", p.display())),
                }
            }
            return Err(format!("cannot find a free file name in {}", dir.display()));
        };
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(format!(
                    "{} is a symbolic link; /save writes only to a regular file or a new path",
                    path.display()
                ));
            }
            Ok(m) if !m.is_file() => {
                return Err(format!(
                    "{} is not a regular file; /save writes only to a regular file or a new path",
                    path.display()
                ));
            }
            Ok(_) if !overwrite => {
                return Err(format!(
                    "{} exists; `/save! {}` replaces it",
                    path.display(),
                    path.display()
                ));
            }
            _ => {}
        }
        if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(d)
                .map_err(|e| format!("cannot create {}: {e}", d.display()))?;
        }
        let replace = if overwrite {
            Replace::Allow
        } else {
            Replace::Never
        };
        atomic_file::write_bytes(&path, replace, text.as_bytes()).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                format!(
                    "{} exists; `/save! {}` replaces it",
                    path.display(),
                    path.display()
                )
            } else {
                format!("cannot write {}: {e}", path.display())
            }
        })?;
        Ok(path)
    }
}

/// Replays a conversation file; see [`replay`].
pub fn read(path: &Path) -> Result<Conversation, TranscriptError> {
    let bytes = std::fs::read(path).map_err(|cause| TranscriptError::Io {
        path: path.to_path_buf(),
        cause,
    })?;
    Ok(replay(path, &bytes)?.conversation)
}

/// Replays the records in `bytes` (`path` labels errors). Every complete record (a line that
/// parses and ends with a newline) is taken; a torn end, and lines torn by a crash in an older
/// version that appended after a torn line, are skipped and counted. A first line that is not a
/// record means the file is not a transcript at all.
pub fn replay(path: &Path, bytes: &[u8]) -> Result<Replay, TranscriptError> {
    let mut out = Replay::default();
    let mut at = 0usize;
    let mut seen_record = false;
    for (i, line) in bytes.split_inclusive(|&b| b == b'\n').enumerate() {
        let start = at;
        at += line.len();
        let Some(body) = line.strip_suffix(b"\n") else {
            // No newline: the write of this record never finished.
            out.skipped_bytes += line.len() as u64;
            break;
        };
        if body.iter().all(u8::is_ascii_whitespace) {
            out.complete_len = at as u64;
            continue;
        }
        match serde_json::from_slice::<Record>(body) {
            Ok(r) => {
                out.conversation.apply(&r);
                seen_record = true;
                out.complete_len = at as u64;
            }
            Err(e) if !seen_record => {
                return Err(TranscriptError::Malformed {
                    path: path.to_path_buf(),
                    line: i + 1,
                    message: e.to_string(),
                });
            }
            Err(_) => {
                tracing::warn!(
                    "{}: skipping line {} (byte {start}): not a whole record",
                    path.display(),
                    i + 1
                );
                out.skipped_bytes += line.len() as u64;
                out.complete_len = at as u64;
            }
        }
    }
    if out.skipped_bytes > 0 {
        tracing::warn!(
            "{}: skipped {} bytes that were not whole records",
            path.display(),
            out.skipped_bytes
        );
    }
    Ok(out)
}

/// Takes the exclusive advisory lock on a conversation file, or says who holds it.
fn lock(file: &File, path: &Path) -> Result<(), TranscriptError> {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor this `File` owns; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(TranscriptError::Locked {
                    path: path.to_path_buf(),
                    holder: lock_holder(file),
                });
            }
            return Err(TranscriptError::Io {
                path: path.to_path_buf(),
                cause: e,
            });
        }
    }
    #[cfg(not(unix))]
    let _ = (file, path);
    Ok(())
}

/// The process holding a `flock` on `file`, from `/proc/locks` (Linux: `1: FLOCK  ADVISORY
/// WRITE 1234 08:01:56789 0 EOF`, the device as hex major:minor, then the inode).
fn lock_holder(file: &File) -> Option<u32> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata().ok()?;
        let (major, minor) = (libc::major(m.dev()), libc::minor(m.dev()));
        let locks = std::fs::read_to_string("/proc/locks").ok()?;
        locks.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 6 || f[1] != "FLOCK" {
                return None;
            }
            let id: Vec<&str> = f[5].split(':').collect();
            let same = id.len() == 3
                && u32::from_str_radix(id[0], 16).ok() == Some(major)
                && u32::from_str_radix(id[1], 16).ok() == Some(minor)
                && id[2].parse::<u64>().ok() == Some(m.ino());
            same.then(|| f[4].parse().ok()).flatten()
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file;
        None
    }
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
mod tests;
