//! Incremental decoding for streaming generated text.

use super::Tokenizer;

/// Turns tokens into text as they are generated, never emitting part of a multi-byte character:
/// bytes that may still become a character wait for the next token, bytes that never can become
/// U+FFFD at once.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        StreamDecoder::default()
    }

    /// Adds token `id` and returns the text it completes (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32, special: bool) -> String {
        self.pending.extend_from_slice(tok.piece_bytes(id, special));
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // The first `valid_up_to` bytes are valid UTF-8 by definition.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // Invalid whatever follows: replace it and go on.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                        // A character cut off at the end: wait for more bytes.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let start = self.pending.len() - keep;
        self.pending.drain(..start);
        out
    }

    /// Whatever is left at the end of the stream; an unfinished character becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}
