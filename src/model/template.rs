//! Chat templates: the model's `tokenizer.chat_template` (Jinja), rendered with minijinja the way
//! Hugging Face's `apply_chat_template` and llama.cpp do: blocks trim their newline and strip
//! their indentation, `raise_exception` and `strftime_now` exist, `tools` is none, and a model
//! whose template ignores or refuses a system message gets it merged into the first user message
//! (llama.cpp's workaround). A model without a template is chatted in its architecture's format
//! where its vocabulary has the markers, else in plain continuation ([`builtin`]).
//!
//! The rendered prompt is meant for `Tokenizer::encode(prompt, true, true)`: add the model's BOS
//! and parse its special tokens. As in llama.cpp, `render` removes a BOS text the template itself
//! writes at the start when the tokenizer adds BOS anyway (and likewise a final EOS), so that a
//! prompt never starts with two BOS tokens.

#[cfg(unix)]
use std::ffi::{CString, c_char};

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, ErrorKind, State, context};

use crate::model::gguf::{GgufFile, Value as GgufValue};
use crate::model::tokenizer::Tokenizer;

mod builtin;

pub use builtin::Format;

const KEY: &str = "tokenizer.chat_template";
const NAME: &str = "chat_template";
/// Context variable through which `strftime_now` sees the render's clock.
const NOW_VAR: &str = "__hipscope_now";

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// An assistant message's reasoning, apart from its content: templates see it as
    /// `reasoning_content`, and a harmony template also as `thinking` (as llama.cpp passes it).
    pub reasoning: Option<String>,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
            reasoning: None,
        }
    }

    /// The message with its reasoning (none if `reasoning` is empty).
    pub fn with_reasoning(mut self, reasoning: &str) -> Message {
        self.reasoning = (!reasoning.is_empty()).then(|| reasoning.to_string());
        self
    }
}

/// Whether a template is gpt-oss's harmony format: llama.cpp's test (`common/chat.cpp`), the
/// source writes `<|channel|>`.
pub fn is_harmony(source: &str) -> bool {
    source.contains("<|channel|>")
}

/// A chat template that cannot be used: which template (the model file, or the built-in one),
/// at which line, and why.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("{origin}: `{KEY}` should be a string, is {found}")]
    NotAString { origin: String, found: String },
    #[error("{origin}: the chat template does not parse{}: {detail}", at_line(*.line))]
    Parse {
        origin: String,
        line: Option<usize>,
        detail: String,
    },
    #[error("{origin}: the chat template failed{}: {detail}", at_line(*.line))]
    Render {
        origin: String,
        line: Option<usize>,
        detail: String,
    },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" at template line {l}"))
        .unwrap_or_default()
}

/// A compiled chat template with the model's BOS/EOS texts.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    origin: String,
    bos: String,
    eos: String,
    add_bos: bool,
    add_eos: bool,
    /// The built-in format used in place of the model's own template (which it lacks, names,
    /// or cannot be rendered).
    builtin: Option<Format>,
    system_role: bool,
    /// The Jinja source, as given.
    source: String,
}

impl ChatTemplate {
    /// The model's template; if the file has none, the built-in format that fits it
    /// ([`ChatTemplate::without_template`]). A template that does not parse is an error (naming
    /// the file and line): the caller may fall back to [`ChatTemplate::without_template`].
    pub fn from_gguf(file: &GgufFile, tok: &Tokenizer) -> Result<ChatTemplate, TemplateError> {
        let origin = format!("{} ({KEY})", file.path().display());
        match file.get(KEY) {
            None => Ok(ChatTemplate::without_template(file, tok)),
            Some(GgufValue::String(s)) if s.trim() == "chatml" => Ok(ChatTemplate::chatml(tok)),
            Some(GgufValue::String(s)) => {
                let (bos, eos) = special_texts(tok);
                ChatTemplate::from_source(origin, s.clone(), bos, eos, tok.add_bos(), tok.add_eos())
            }
            Some(v) => Err(TemplateError::NotAString {
                origin,
                found: format!("{:?}", v.ty()),
            }),
        }
    }

    /// The template a chat with `file` uses, and what to tell the user about it: that the file
    /// has no template and which format is used instead, or that its template failed and which
    /// format replaces it. `None` when the file's own template is used.
    pub fn for_chat(file: &GgufFile, tok: &Tokenizer) -> (ChatTemplate, Option<String>) {
        let name = file.path().file_name().map_or_else(
            || file.path().display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        match ChatTemplate::from_gguf(file, tok) {
            Ok(t) if file.get(KEY).is_none() => {
                let note = t.builtin.map(|f| f.note(&name));
                (t, note)
            }
            Ok(t) => (t, None),
            Err(e) => {
                let t = ChatTemplate::without_template(file, tok);
                let used = t.builtin.map_or("", Format::name);
                (t, Some(format!("{e}; chatting in {used} instead")))
            }
        }
    }

    /// The format for `file` when its own template is missing or unusable: its architecture's,
    /// if the vocabulary has that format's markers, else plain continuation ([`Format`]).
    pub fn without_template(file: &GgufFile, tok: &Tokenizer) -> ChatTemplate {
        ChatTemplate::builtin(
            Format::for_model(file.architecture().unwrap_or(""), tok),
            tok,
        )
    }

    /// The built-in ChatML template.
    pub fn chatml(tok: &Tokenizer) -> ChatTemplate {
        ChatTemplate::builtin(Format::ChatMl, tok)
    }

    /// A built-in format, with the model's BOS/EOS.
    pub fn builtin(format: Format, tok: &Tokenizer) -> ChatTemplate {
        let (bos, eos) = special_texts(tok);
        let mut t = ChatTemplate::from_source(
            format!("built-in {} template", format.name()),
            format.source().into(),
            bos,
            eos,
            tok.add_bos(),
            tok.add_eos(),
        )
        .unwrap_or_else(|e| unreachable!("the built-in templates are tested to parse: {e}"));
        t.builtin = Some(format);
        t
    }

    /// A template from its source. `origin` names it in errors; `bos`/`eos` are the texts the
    /// template sees as `bos_token`/`eos_token`; `add_bos`/`add_eos` say whether the tokenizer
    /// adds them itself (then a leading BOS / trailing EOS text is removed from the output).
    pub fn from_source(
        origin: String,
        source: String,
        bos: String,
        eos: String,
        add_bos: bool,
        add_eos: bool,
    ) -> Result<ChatTemplate, TemplateError> {
        let mut env = environment();
        env.add_template_owned(NAME, source.clone())
            .map_err(|e| TemplateError::Parse {
                origin: origin.clone(),
                line: e.line(),
                detail: describe(&e),
            })?;
        let mut t = ChatTemplate {
            env,
            origin,
            bos,
            eos,
            add_bos,
            add_eos,
            builtin: None,
            system_role: true,
            source,
        };
        t.system_role = t.probe_system_role();
        Ok(t)
    }

    /// Whether this is a built-in format, used because the model has no usable template.
    pub fn is_fallback(&self) -> bool {
        self.builtin.is_some()
    }

    /// The built-in format in use, if the model's own template is not.
    pub fn builtin_format(&self) -> Option<Format> {
        self.builtin
    }

    /// Tokens that end an answer besides the model's end-of-generation ones: a built-in
    /// format's turn opener (see [`Format::turn_opener`]). Empty for the model's own template.
    pub fn stop_tokens(&self, tok: &Tokenizer) -> Vec<u32> {
        self.builtin
            .and_then(Format::turn_opener)
            .and_then(|t| tok.token_id(t))
            .into_iter()
            .collect()
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The text the template writes to open the assistant's turn (after a user message): the
    /// rendering with the generation prompt less the one without; empty if it cannot render.
    pub fn generation_prompt(&self) -> String {
        let probe = [Message::new("user", "Hipscope probe")];
        match (
            self.raw_render(&probe, true, 0),
            self.raw_render(&probe, false, 0),
        ) {
            (Ok(with), Ok(without)) => with
                .strip_prefix(without.as_str())
                .unwrap_or_default()
                .to_string(),
            _ => String::new(),
        }
    }

    /// Whether the template renders a system message (if not, `render` merges it into the
    /// first user message).
    pub fn supports_system_role(&self) -> bool {
        self.system_role
    }

    /// Renders the conversation; with `add_generation_prompt`, ends with the opening of the
    /// assistant's turn. Tokenize the result with `encode(prompt, true, true)`.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.render_at(messages, add_generation_prompt, now)
    }

    /// `render` with the clock fixed at `now_unix` (seconds since the epoch; templates that
    /// print today's date see this one, in local time).
    pub fn render_at(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        now_unix: i64,
    ) -> Result<String, TemplateError> {
        let merged;
        let messages = if self.system_role {
            messages
        } else {
            merged = merge_system_message(messages);
            &merged
        };
        let mut out = self.raw_render(messages, add_generation_prompt, now_unix)?;
        if self.add_bos && !self.bos.is_empty() && out.starts_with(&self.bos) {
            out.drain(..self.bos.len());
        }
        if self.add_eos && !self.eos.is_empty() && out.ends_with(&self.eos) {
            out.truncate(out.len() - self.eos.len());
        }
        Ok(out)
    }

    /// Renders and tokenizes a prompt, ready for the model.
    pub fn prompt_tokens(
        &self,
        tok: &Tokenizer,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, TemplateError> {
        let prompt = self.render(messages, add_generation_prompt)?;
        Ok(tok.encode(&prompt, true, true))
    }

    fn raw_render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        now: i64,
    ) -> Result<String, TemplateError> {
        let render_err = |e: minijinja::Error| TemplateError::Render {
            origin: self.origin.clone(),
            line: e.line(),
            detail: describe(&e),
        };
        let tmpl = self.env.get_template(NAME).map_err(render_err)?;
        let harmony = is_harmony(&self.source);
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| match &m.reasoning {
                // As llama.cpp: `reasoning_content`, and `thinking` for gpt-oss's template.
                Some(r) if harmony => {
                    context! { role => m.role.clone(), content => m.content.clone(),
                    reasoning_content => r.clone(), thinking => r.clone() }
                }
                Some(r) => context! { role => m.role.clone(), content => m.content.clone(),
                reasoning_content => r.clone() },
                None => context! { role => m.role.clone(), content => m.content.clone() },
            })
            .collect();
        let ctx = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos.clone(),
            eos_token => self.eos.clone(),
            tools => Value::from(()),
            enable_thinking => true,
            // llama.cpp passes today's date under these names as well.
            date_string => strftime("%d %b %Y", now).unwrap_or_default(),
            datetime => strftime("%b %d %Y", now).unwrap_or_default(),
            __hipscope_now => now,
        };
        tmpl.render(ctx).map_err(render_err)
    }

    /// llama.cpp's test: render a system and a user message; the template supports the system
    /// role if the system text shows in the output.
    fn probe_system_role(&self) -> bool {
        const MARK: &str = "Hipscope system probe";
        let probe = [
            Message::new("system", MARK),
            Message::new("user", "User probe"),
        ];
        matches!(self.raw_render(&probe, true, 0), Ok(s) if s.contains(MARK))
    }
}

/// BOS/EOS as the template sees them: their text, as printed with special tokens shown.
fn special_texts(tok: &Tokenizer) -> (String, String) {
    let text = |id: Option<u32>| {
        id.map(|id| String::from_utf8_lossy(&tok.piece(id, true)).into_owned())
            .unwrap_or_default()
    };
    (text(tok.bos()), text(tok.eos()))
}

/// llama.cpp's workaround for templates without a system role: the system text goes in front of
/// the next message, separated by a newline (or is dropped if it is alone).
fn merge_system_message(messages: &[Message]) -> Vec<Message> {
    match messages {
        [sys, next, rest @ ..] if sys.role == "system" => {
            let mut out = Vec::with_capacity(messages.len() - 1);
            out.push(Message::new(
                next.role.clone(),
                format!("{}\n{}", sys.content, next.content),
            ));
            out.extend_from_slice(rest);
            out
        }
        [sys] if sys.role == "system" => Vec::new(),
        _ => messages.to_vec(),
    }
}

fn describe(e: &minijinja::Error) -> String {
    match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.kind().to_string(),
    }
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build();
    if let Ok(syntax) = syntax {
        env.set_syntax(syntax);
    }
    // Python string and dict methods (`.strip()`, `.startswith()`, `.items()`, ...).
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env
}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("raise_exception: {message}"),
    ))
}

fn strftime_now(state: &State, format: String) -> Result<Value, minijinja::Error> {
    let now = state
        .lookup(NOW_VAR)
        .and_then(|v| i64::try_from(v).ok())
        .unwrap_or(0);
    strftime(&format, now).map(Value::from).map_err(|why| {
        minijinja::Error::new(ErrorKind::InvalidOperation, format!("strftime_now: {why}"))
    })
}

/// Formats `unix` in local time with C's `strftime` (what llama.cpp calls, and what Python's
/// `datetime.strftime` calls on Linux).
#[cfg(unix)]
fn strftime(format: &str, unix: i64) -> Result<String, &'static str> {
    let fmt = CString::new(format).map_err(|_| "format contains a NUL byte")?;
    let t = unix as libc::time_t;
    // SAFETY: `tm` is plain data that localtime_r fills in; the pointers outlive the calls;
    // strftime writes at most `buf.len()` bytes into `buf`.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return Err("time out of range");
        }
        let mut buf = [0u8; 512];
        let n = libc::strftime(
            buf.as_mut_ptr() as *mut c_char,
            buf.len(),
            fmt.as_ptr(),
            &tm,
        );
        if n == 0 && !format.is_empty() {
            return Err("the formatted time is empty or too long");
        }
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    }
}

/// Elsewhere: UTC, with the common `strftime` conversions.
#[cfg(not(unix))]
fn strftime(format: &str, unix: i64) -> Result<String, &'static str> {
    Ok(utc_strftime(format, unix))
}

/// A small `strftime` over UTC for platforms without a C one to call.
#[cfg_attr(unix, allow(dead_code))]
fn utc_strftime(format: &str, unix: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 4).rem_euclid(7) as usize;
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('B') => out.push_str(MONTHS[(month - 1) as usize]),
            Some('b') | Some('h') => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('M') => out.push_str(&format!("{m:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// `tojson` as in Hugging Face's templates (Python's `json.dumps` with `ensure_ascii=False`):
/// `", "` and `": "` separators, or `indent` with newlines; no HTML escaping.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<Value> = match kwargs.get::<Option<Value>>("indent")? {
        Some(v) => Some(v),
        None => indent,
    };
    let indent = match indent {
        Some(v) if v.kind() == ValueKind::Number => usize::try_from(v).ok(),
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().map_or(0, str::len)),
        _ => None,
    };
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let (item_sep, key_sep) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    kwargs.assert_all_used()?;
    let mut j = JsonWriter {
        out: String::new(),
        indent,
        item_sep,
        key_sep,
        ensure_ascii,
        sort_keys,
    };
    j.value(value, 0)?;
    Ok(Value::from(j.out))
}

struct JsonWriter {
    out: String,
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl JsonWriter {
    fn newline(&mut self, level: usize) {
        if let Some(n) = self.indent {
            self.out.push('\n');
            self.out.push_str(&" ".repeat(n * level));
        }
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{08}' => self.out.push_str("\\b"),
                '\u{0C}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        self.out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }

    fn value(&mut self, v: &Value, level: usize) -> Result<(), minijinja::Error> {
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => match i64::try_from(v.clone()) {
                Ok(i) => self.out.push_str(&i.to_string()),
                Err(_) => {
                    let f = f64::try_from(v.clone())?;
                    if f.is_finite() {
                        self.out.push_str(&format!("{f:?}"));
                    } else {
                        self.out.push_str(if f.is_nan() {
                            "NaN"
                        } else if f > 0.0 {
                            "Infinity"
                        } else {
                            "-Infinity"
                        });
                    }
                }
            },
            ValueKind::String => self.string(v.as_str().unwrap_or_default()),
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                self.out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(&self.item_sep.clone());
                    }
                    self.newline(level + 1);
                    self.string(&k.to_string());
                    self.out.push_str(&self.key_sep.clone());
                    self.value(&v.get_item(k)?, level + 1)?;
                }
                if !keys.is_empty() {
                    self.newline(level);
                }
                self.out.push('}');
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(&self.item_sep.clone());
                    }
                    self.newline(level + 1);
                    self.value(item, level + 1)?;
                }
                if !items.is_empty() {
                    self.newline(level);
                }
                self.out.push(']');
            }
            _ => self.string(&v.to_string()),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
