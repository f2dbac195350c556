//! The timeline file: Chrome's trace-event format, JSON Array form (`[` then one event object a
//! line), which Perfetto's UI and `chrome://tracing` open. Each event after the first starts its
//! line with the comma, and the file only ever grows by whole lines, so a file cut off at any
//! flush — a killed process, a full disk — is still read by both: Chrome's importer
//! (catapult's `trace_event_importer`) appends the missing `]` (and drops a trailing comma), and
//! Perfetto's JSON tokenizer reads event by event and stops at the end of the data. A write
//! that fails part-way is cut back to the last whole line.
//!
//! Every op is a complete event (`"ph":"X"`, `ts` and `dur` in µs) on its track (`tid`), named by
//! its label, with layer, op, kernel, bytes and GB/s in `args`; tracks are named by `"M"`
//! (metadata) events the first time they appear.

use std::collections::HashSet;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::TrackId;

/// Flushed to the file at least this often while events arrive.
pub const FLUSH_EVERY_MS: u64 = 100;
/// And whenever this much text is waiting.
pub const FLUSH_BYTES: usize = 1 << 20;

/// One event's `args`, as the writer formats them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Args {
    pub pairs: Vec<(&'static str, ArgValue)>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ArgValue {
    U(u64),
    F(f64),
    S(String),
}

impl Args {
    pub fn u(mut self, k: &'static str, v: u64) -> Args {
        self.pairs.push((k, ArgValue::U(v)));
        self
    }
    pub fn f(mut self, k: &'static str, v: f64) -> Args {
        if v.is_finite() {
            self.pairs.push((k, ArgValue::F(v)));
        }
        self
    }
    pub fn s(mut self, k: &'static str, v: impl Into<String>) -> Args {
        self.pairs.push((k, ArgValue::S(v.into())));
        self
    }
}

/// A trace file being written.
pub struct TraceFile {
    path: PathBuf,
    file: File,
    /// Bytes known to be in the file (whole lines only).
    good: u64,
    buf: String,
    events: u64,
    named: HashSet<TrackId>,
    pid: u32,
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"?\"".into())
}

/// Microseconds with nanosecond precision, as the format's `ts` and `dur` take them.
fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

impl TraceFile {
    /// Creates `path` and writes the opening bracket and the process's name. An existing file is
    /// replaced only when it is empty or an earlier trace of ours (so `--trace` can run again
    /// into the same file), never anything else.
    pub fn create(path: &Path) -> std::io::Result<TraceFile> {
        if let Ok(mut old) = File::open(path) {
            use std::io::Read;
            let mut head = [0u8; 64];
            let n = old.read(&mut head).unwrap_or(0);
            let ours = head[..n].starts_with(b"[\n{\"name\":\"process_name\"");
            if n > 0 && !ours {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "the file exists and is not a hipscope trace; not overwritten",
                ));
            }
        }
        let file = File::create(path)?;
        let mut t = TraceFile {
            path: path.to_path_buf(),
            file,
            good: 0,
            buf: String::from("[\n"),
            events: 0,
            named: HashSet::new(),
            pid: std::process::id(),
        };
        t.meta_process("hipscope");
        t.flush()?;
        Ok(t)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn events(&self) -> u64 {
        self.events
    }

    pub fn pending_bytes(&self) -> usize {
        self.buf.len()
    }

    fn line(&mut self, obj: &str) {
        if self.events > 0 {
            self.buf.push(',');
        }
        self.buf.push_str(obj);
        self.buf.push('\n');
        self.events += 1;
    }

    fn meta_process(&mut self, name: &str) {
        let obj = format!(
            r#"{{"name":"process_name","ph":"M","pid":{},"tid":0,"args":{{"name":{}}}}}"#,
            self.pid,
            json_str(name)
        );
        self.line(&obj);
    }

    /// Names track `id` (once): `thread_name`, and a sort index that keeps the tracks in id order.
    pub fn name_track(&mut self, id: TrackId, name: &str) {
        if !self.named.insert(id) {
            return;
        }
        let obj = format!(
            r#"{{"name":"thread_name","ph":"M","pid":{pid},"tid":{tid},"args":{{"name":{n}}}}}"#,
            pid = self.pid,
            tid = id.0,
            n = json_str(name)
        );
        self.line(&obj);
        let obj = format!(
            r#"{{"name":"thread_sort_index","ph":"M","pid":{pid},"tid":{tid},"args":{{"sort_index":{tid}}}}}"#,
            pid = self.pid,
            tid = id.0,
        );
        self.line(&obj);
    }

    pub fn is_named(&self, id: TrackId) -> bool {
        self.named.contains(&id)
    }

    /// A complete event.
    pub fn complete(
        &mut self,
        track: TrackId,
        cat: &str,
        name: &str,
        start_ns: u64,
        dur_ns: u64,
        args: &Args,
    ) {
        let mut obj = format!(
            r#"{{"name":{},"cat":{},"ph":"X","pid":{},"tid":{},"ts":{},"dur":{}"#,
            json_str(name),
            json_str(cat),
            self.pid,
            track.0,
            us(start_ns),
            us(dur_ns)
        );
        push_args(&mut obj, args);
        obj.push('}');
        self.line(&obj);
    }

    /// An instant event on a track (`"ph":"i"`, thread scope): a note in the timeline.
    pub fn instant(&mut self, track: TrackId, name: &str, ts_ns: u64, args: &Args) {
        let mut obj = format!(
            r#"{{"name":{},"cat":"note","ph":"i","s":"t","pid":{},"tid":{},"ts":{}"#,
            json_str(name),
            self.pid,
            track.0,
            us(ts_ns)
        );
        push_args(&mut obj, args);
        obj.push('}');
        self.line(&obj);
    }

    /// Writes what is waiting, whole lines only; a failed write is cut back to the last whole
    /// line, so the file stays readable.
    pub fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let r = self
            .file
            .write_all(self.buf.as_bytes())
            .and_then(|_| self.file.flush());
        match r {
            Ok(()) => {
                self.good += self.buf.len() as u64;
                self.buf.clear();
                Ok(())
            }
            Err(e) => {
                let _ = self.file.set_len(self.good);
                let _ = self.file.seek(SeekFrom::Start(self.good));
                self.buf.clear();
                Err(e)
            }
        }
    }

    /// Writes the rest and the closing bracket; returns the events written.
    pub fn finish(mut self) -> std::io::Result<u64> {
        self.buf.push_str("]\n");
        self.flush()?;
        self.file.sync_data()?;
        Ok(self.events)
    }
}

fn push_args(obj: &mut String, args: &Args) {
    if args.pairs.is_empty() {
        return;
    }
    obj.push_str(r#","args":{"#);
    for (i, (k, v)) in args.pairs.iter().enumerate() {
        if i > 0 {
            obj.push(',');
        }
        obj.push_str(&json_str(k));
        obj.push(':');
        match v {
            ArgValue::U(u) => obj.push_str(&u.to_string()),
            ArgValue::F(f) => obj.push_str(&format!("{f:.3}")),
            ArgValue::S(s) => obj.push_str(&json_str(s)),
        }
    }
    obj.push('}');
}

/// Reads a trace as Chrome's importer does: a file starting with `[` has a trailing comma
/// dropped and a missing `]` added, then it is parsed as JSON. For tests and `selftest`.
pub fn parse_like_chrome(text: &str) -> Result<Vec<serde_json::Value>, String> {
    let mut t = text.trim().to_string();
    if t.starts_with('[') {
        while t.ends_with(',') || t.ends_with(char::is_whitespace) {
            t.pop();
        }
        if !t.ends_with(']') {
            t.push(']');
        }
    }
    let v: serde_json::Value = serde_json::from_str(&t).map_err(|e| e.to_string())?;
    match v {
        serde_json::Value::Array(a) => Ok(a),
        serde_json::Value::Object(mut o) => match o.remove("traceEvents") {
            Some(serde_json::Value::Array(a)) => Ok(a),
            _ => Err("an object without traceEvents".into()),
        },
        _ => Err("neither an array nor an object".into()),
    }
}

/// Reads a trace as Perfetto's JSON tokenizer does: after the `[`, one object at a time (commas
/// and whitespace between them skipped), stopping at `]` or at the end of the data, where an
/// object cut short is left out.
pub fn parse_like_perfetto(text: &str) -> Result<Vec<serde_json::Value>, String> {
    let t = text.trim_start();
    let Some(mut rest) = t.strip_prefix('[') else {
        return Err("not a JSON array trace".into());
    };
    let mut out = Vec::new();
    loop {
        rest = rest.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
        if rest.is_empty() || rest.starts_with(']') {
            return Ok(out);
        }
        if !rest.starts_with('{') {
            return Err(format!("unexpected {:?}", &rest[..rest.len().min(20)]));
        }
        let mut de = serde_json::Deserializer::from_str(rest).into_iter::<serde_json::Value>();
        match de.next() {
            Some(Ok(v)) => {
                out.push(v);
                rest = &rest[de.byte_offset()..];
            }
            // Cut off inside the last object: the tokenizer waits for more data, which never comes.
            Some(Err(e)) if e.is_eof() => return Ok(out),
            Some(Err(e)) => return Err(e.to_string()),
            None => return Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dir: &Path) -> (PathBuf, String) {
        let path = dir.join("t.json");
        let mut f = TraceFile::create(&path).expect("create");
        f.name_track(TrackId(10), "cuda:0 stream 0");
        for i in 0..5u64 {
            f.complete(
                TrackId(10),
                "kernel",
                &format!("layer {i} · attn_q · \"mv\""),
                i * 10_000,
                9_500,
                &Args::default()
                    .u("layer", i)
                    .s("op", "attn_q")
                    .f("GB/s", 812.25),
            );
            f.flush().expect("flush");
        }
        f.finish().expect("finish");
        let text = std::fs::read_to_string(&path).expect("read");
        (path, text)
    }

    #[test]
    fn a_finished_file_is_plain_json_with_complete_events() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, text) = sample(dir.path());
        let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        let a = v.as_array().expect("array");
        // process name, thread name and sort index, five ops.
        assert_eq!(a.len(), 8);
        let op = &a[3];
        assert_eq!(op["ph"], "X");
        assert_eq!(op["tid"], 10);
        assert_eq!(op["ts"].as_f64(), Some(0.0));
        assert_eq!(op["dur"].as_f64(), Some(9.5));
        assert_eq!(op["name"], "layer 0 · attn_q · \"mv\"");
        assert_eq!(op["args"]["GB/s"].as_f64(), Some(812.25));
        assert_eq!(a[4]["ts"].as_f64(), Some(10.0));
    }

    #[test]
    fn a_file_cut_anywhere_still_opens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, text) = sample(dir.path());
        let full = parse_like_chrome(&text).expect("whole").len();
        // At every line boundary (what a killed process leaves: the writer only appends whole
        // lines) both importers read every event before the cut.
        let ends: Vec<usize> = text.match_indices('\n').map(|(i, _)| i + 1).collect();
        for (k, &end) in ends.iter().enumerate() {
            let cut = &text[..end];
            let c = parse_like_chrome(cut).unwrap_or_else(|e| panic!("chrome at {end}: {e}"));
            let p = parse_like_perfetto(cut).unwrap_or_else(|e| panic!("perfetto at {end}: {e}"));
            assert_eq!(c.len(), k.min(full), "{cut}");
            assert_eq!(p.len(), c.len());
        }
        // Cut inside a line (a torn write on a full disk the writer could not undo): Perfetto
        // still reads every whole event before it.
        for end in 2..text.len() {
            if !text.is_char_boundary(end) {
                continue;
            }
            let whole_lines = text[..end].matches('\n').count().saturating_sub(1);
            let p = parse_like_perfetto(&text[..end]).expect("perfetto");
            assert!(p.len() >= whole_lines.min(full), "at {end}");
        }
    }

    #[test]
    fn only_an_earlier_trace_is_overwritten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, _) = sample(dir.path());
        // An earlier trace: replaced.
        TraceFile::create(&path)
            .expect("over a trace")
            .finish()
            .expect("finish");
        let notes = dir.path().join("notes.md");
        std::fs::write(&notes, "# my notes\n").expect("write");
        let e = TraceFile::create(&notes).err().expect("refused");
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(
            std::fs::read_to_string(&notes).expect("read"),
            "# my notes\n"
        );
    }

    #[test]
    fn a_failed_write_leaves_whole_lines() {
        // /dev/full fails every write: nothing half-written can remain, and the error is returned.
        let Ok(file) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
            return;
        };
        let mut t = TraceFile {
            path: "/dev/full".into(),
            file,
            good: 0,
            buf: "[\n".into(),
            events: 0,
            named: HashSet::new(),
            pid: 1,
        };
        t.complete(TrackId(1), "x", "y", 0, 1, &Args::default());
        assert!(t.flush().is_err());
        assert_eq!(t.pending_bytes(), 0);
    }
}
