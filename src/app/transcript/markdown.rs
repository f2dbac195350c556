//! The conversation as Markdown (`/save`): the document, and the export that writes it whole
//! without ever writing through a link or onto the conversation's own file.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::calendar::{file_stamp, format_utc, unix_secs};
use super::{Conversation, Transcript};
use crate::gpu::atomic_file::{self, Replace};

impl Conversation {
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
        // The model's words (and the user's) never carry a terminal's escape sequences into the
        // file, as they never reach the screen: `cat` of an export runs nothing.
        crate::ui::wrap::strip_controls(&md).into_owned()
    }
}

impl Transcript {
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
            crate::gpu::dirs::create_private_dir(&dir)
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
        if let Some(live) = self.path()
            && atomic_file::same_file(&path, live)
        {
            // `/save!` onto the journal (by its name or a hard link) would replace the
            // conversation's own file with Markdown: the next turn would go to an unlinked file.
            return Err(format!(
                "{} is this conversation's own file ({}); /save writes Markdown to another path",
                path.display(),
                live.display()
            ));
        }
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
            crate::gpu::dirs::create_private_dir(d)
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
