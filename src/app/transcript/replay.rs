//! Reading a conversation file back: every complete record, a torn end skipped and counted.

use std::path::Path;

use super::{Conversation, Record, TranscriptError};

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
