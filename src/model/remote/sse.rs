//! A server-sent-events parser (the WHATWG `text/event-stream` format) for the blocking reads of
//! a streamed chat answer. Bytes go in as they arrive; whole events come out.
//!
//! Own code rather than a crate: the Rust SSE crates (`eventsource-stream`, `sse-stream`) parse
//! an async `Stream` of `Bytes`, while the answer is read here from `ureq`'s blocking reader on a
//! thread of its own; the part of the format these servers use is ~80 lines. Fuzzed by
//! `fuzz/fuzz_targets/sse_parser.rs` and property-tested below.
//!
//! Lines end with LF or CRLF (every OpenAI-compatible server sends one of the two; a lone CR as
//! a line end is not recognised). A line longer than [`MAX_LINE`] or one that is not UTF-8 is
//! refused with an error saying so, never buffered without bound.

/// The longest line accepted: one event of a chat answer is a few hundred bytes.
pub const MAX_LINE: usize = 1 << 20;

/// One dispatched event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; empty for the default type (`message`).
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("a line of the event stream is longer than {MAX_LINE} bytes")]
    LineTooLong,
    #[error("a line of the event stream is not UTF-8 (at byte {0} of the line)")]
    NotUtf8(usize),
    #[error("the event stream ended in the middle of an event")]
    Truncated,
}

#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    event: String,
    data: Option<String>,
}

impl SseParser {
    pub fn new() -> SseParser {
        SseParser::default()
    }

    /// Feeds bytes; returns the events they complete. After an error the parser is reset.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        let mut out = Vec::new();
        let mut rest = bytes;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            if self.line.len() + i > MAX_LINE {
                *self = SseParser::default();
                return Err(SseError::LineTooLong);
            }
            self.line.extend_from_slice(&rest[..i]);
            rest = &rest[i + 1..];
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            match String::from_utf8(line) {
                Ok(l) => {
                    if let Some(e) = self.line_done(&l) {
                        out.push(e);
                    }
                }
                Err(e) => {
                    let at = e.utf8_error().valid_up_to();
                    *self = SseParser::default();
                    return Err(SseError::NotUtf8(at));
                }
            }
        }
        if self.line.len() + rest.len() > MAX_LINE {
            *self = SseParser::default();
            return Err(SseError::LineTooLong);
        }
        self.line.extend_from_slice(rest);
        Ok(out)
    }

    /// The stream ended: an error if an event was left half-read.
    pub fn finish(&mut self) -> Result<(), SseError> {
        let pending = !self.line.is_empty() || self.data.is_some();
        *self = SseParser::default();
        if pending {
            Err(SseError::Truncated)
        } else {
            Ok(())
        }
    }

    fn line_done(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            // Dispatch; an event without data is dropped, as the standard says.
            let event = std::mem::take(&mut self.event);
            return self.data.take().map(|data| SseEvent { event, data });
        }
        if line.starts_with(':') {
            return None; // a comment (keep-alive)
        }
        let (field, value) = match line.find(':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (line, ""),
        };
        match field {
            "data" => match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            "event" => self.event = value.to_string(),
            _ => {} // id, retry and unknown fields mean nothing to a chat answer
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn all(bytes: &[u8]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let v = p.feed(bytes).unwrap();
        p.finish().unwrap();
        v
    }

    #[test]
    fn openai_style_chunks_with_crlf_comments_and_done() {
        // The shape llama-server, vLLM and ollama send (see tests/data/remote/*.sse).
        let s = b": keep-alive\r\ndata: {\"a\":1}\r\n\r\ndata: [DONE]\n\n";
        let v = all(s);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].data, "{\"a\":1}");
        assert_eq!(v[1].data, "[DONE]");
    }

    #[test]
    fn multi_line_data_and_event_names() {
        let v = all(b"event: error\ndata: one\ndata:two\n\n");
        assert_eq!(
            v,
            vec![SseEvent {
                event: "error".into(),
                data: "one\ntwo".into()
            }]
        );
    }

    #[test]
    fn bad_input_is_refused_with_a_reason() {
        let mut p = SseParser::new();
        assert_eq!(p.feed(b"data: \xff\xfe\n"), Err(SseError::NotUtf8(6)));
        let mut p = SseParser::new();
        let big = vec![b'x'; MAX_LINE + 1];
        assert_eq!(p.feed(&big), Err(SseError::LineTooLong));
        let mut p = SseParser::new();
        p.feed(b"data: {\"half\"").unwrap();
        assert_eq!(p.finish(), Err(SseError::Truncated));
    }

    proptest! {
        /// However the bytes are cut into reads, the same events come out.
        #[test]
        fn split_points_do_not_matter(texts in proptest::collection::vec("[a-z{}\":, ]{0,20}", 0..6),
                                      cuts in proptest::collection::vec(0usize..200, 0..8),
                                      crlf in any::<bool>()) {
            let nl = if crlf { "\r\n" } else { "\n" };
            let mut s = String::new();
            for t in &texts {
                s.push_str(&format!("data: {t}{nl}{nl}"));
            }
            let bytes = s.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.sort();
            let mut p = SseParser::new();
            let mut got = Vec::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([bytes.len()]) {
                got.extend(p.feed(&bytes[at..c]).unwrap());
                at = c;
            }
            prop_assert!(p.finish().is_ok());
            let want: Vec<String> = texts.clone();
            prop_assert_eq!(got.into_iter().map(|e| e.data).collect::<Vec<_>>(), want);
        }

        /// Any bytes: an error or events, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut p = SseParser::new();
            let _ = p.feed(&bytes);
            let _ = p.finish();
        }
    }
}
