//! Settings: built-in defaults, then the user's `config.toml` (found by `app/settings.rs`: the
//! config folder, `HIPSCOPE_CONFIG` or `--config FILE`), then command-line flags. `config.toml`
//! at the repository root documents every key with its default; a test checks that it parses to
//! exactly [`Config::default`].
//!
//! The file is read key by key rather than through serde so that every mistake names the key,
//! the value found and what is allowed there: one home for every setting's reading and range
//! check (the remote endpoints' tables live in `app/remote_config.rs`); writing the file back
//! (the first start's copy, `/set save`) is in `config/write.rs`; the tests in `config/tests.rs`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::Value;

use super::remote_config;
use super::tuning::Tuning;
use crate::model::protocol::{QuitConfig, SamplerConfig};
use crate::model::split::{GpuLayers, SplitMode, SplitOptions};
use crate::ui::sampler;
use crate::ui::settings::Panels;
use crate::ui::theme::ThemeName;

/// The documented defaults, as shipped (also written as the user's first copy).
pub const DEFAULT_CONFIG_TOML: &str = include_str!("../../config.toml");

pub use crate::gpu::select::BackendChoice;

/// Log verbosity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Off,
    Error,
    Warn,
    #[default]
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub const ALLOWED: &'static str =
        "\"off\", \"error\", \"warn\", \"info\", \"debug\" or \"trace\"";

    pub fn parse(s: &str) -> Option<LogLevel> {
        match s.to_ascii_lowercase().as_str() {
            "off" => Some(LogLevel::Off),
            "error" => Some(LogLevel::Error),
            "warn" | "warning" => Some(LogLevel::Warn),
            "info" => Some(LogLevel::Info),
            "debug" => Some(LogLevel::Debug),
            "trace" => Some(LogLevel::Trace),
            _ => None,
        }
    }

    /// `-v` raises the level one step per use, starting from the configured one.
    pub fn raised(self, steps: u8) -> LogLevel {
        let all = [
            LogLevel::Off,
            LogLevel::Error,
            LogLevel::Warn,
            LogLevel::Info,
            LogLevel::Debug,
            LogLevel::Trace,
        ];
        let i = all.iter().position(|l| *l == self).unwrap_or(3);
        all[(i + usize::from(steps)).min(all.len() - 1)]
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct UiConfig {
    pub theme: ThemeName,
    /// `None`: shown when the terminal is wide enough.
    pub diagnostics: Option<bool>,
    pub diagnostics_width: u16,
    pub panels: Panels,
    pub mouse: bool,
    pub fps: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelsConfig {
    pub search_paths: Vec<PathBuf>,
    pub scan_default_locations: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TranscriptConfig {
    pub enabled: bool,
    /// `None`: `conversations/` in the data directory.
    pub dir: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LogConfig {
    pub level: LogLevel,
    /// `None`: `hipscope.log` in the state directory.
    pub file: Option<PathBuf>,
}

/// How patient a download of the default model is (`hipscope fetch`, the chat's first start).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FetchConfig {
    /// Time limit for opening a connection.
    pub connect_timeout: Duration,
    /// A server that sends nothing for this long is given up on (that try).
    pub read_timeout: Duration,
    /// Tries of the download, each going on from what the last one got.
    pub tries: u32,
}

impl Default for FetchConfig {
    fn default() -> Self {
        FetchConfig {
            connect_timeout: Duration::from_secs(20),
            read_timeout: Duration::from_secs(30),
            tries: 4,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct TelemetryConfig {
    /// Time between telemetry samples (GPU panel, `hipscope top`), ms.
    pub interval_ms: u64,
}

/// Every setting.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `None`: the default model.
    pub model: Option<PathBuf>,
    pub backend: BackendChoice,
    /// Context length in tokens; `None`: the model's trained context, at most 4096; `Some(0)`:
    /// the whole trained context, as far as memory allows (llama.cpp's `-c 0`; the one meaning
    /// of 0 for `-c`, `ctx_size` and `/set ctx`, carried out by `model::loader`).
    pub ctx_size: Option<u32>,
    /// Percent of the conversation after the system prompt dropped when the context fills.
    pub ctx_discard: u8,
    /// 0: all cores.
    pub threads: u32,
    /// Layers on the GPU (`-ngl`): `auto` fits as many as the device's memory holds.
    pub n_gpu_layers: GpuLayers,
    /// GPU number as the runtime counts them; `None`: the largest discrete GPU.
    pub device: Option<u32>,
    /// A model over several GPUs (`split_mode`, `tensor_split`, `main_gpu`; llama.cpp's
    /// `--split-mode`, `--tensor-split`, `--main-gpu`).
    pub split: SplitOptions,
    /// Replay the GPU decode step as a graph where the runtime can (`--no-graphs` overrides).
    pub graphs: bool,
    pub system_prompt: String,
    pub sampler: SamplerConfig,
    pub ui: UiConfig,
    pub models: ModelsConfig,
    pub transcript: TranscriptConfig,
    pub log: LogConfig,
    pub quit: QuitConfig,
    pub telemetry: TelemetryConfig,
    pub fetch: FetchConfig,
    /// Remote engines (`[remote]`, `[remote.NAME]`).
    pub remote: remote_config::RemoteConfig,
    /// Switches for measuring one code path against another, from the environment only (never
    /// the file): see `app/tuning.rs`.
    pub tuning: Tuning,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            model: None,
            backend: BackendChoice::Auto,
            ctx_size: None,
            ctx_discard: 50,
            graphs: true,
            threads: 0,
            n_gpu_layers: GpuLayers::Auto,
            device: None,
            split: SplitOptions::default(),
            system_prompt: String::new(),
            sampler: SamplerConfig::default(),
            ui: UiConfig {
                theme: ThemeName::Dark,
                diagnostics: None,
                diagnostics_width: 44,
                panels: Panels::default(),
                mouse: true,
                fps: 30,
            },
            models: ModelsConfig {
                search_paths: Vec::new(),
                scan_default_locations: true,
            },
            transcript: TranscriptConfig {
                enabled: true,
                dir: None,
            },
            log: LogConfig {
                level: LogLevel::Info,
                file: None,
            },
            quit: QuitConfig::default(),
            telemetry: TelemetryConfig { interval_ms: 500 },
            fetch: FetchConfig::default(),
            remote: Default::default(),
            tuning: Tuning::default(),
        }
    }
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("{path}: cannot read it: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{path}: not valid TOML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{path}: unknown key `{key}`; the keys here are {allowed}")]
    UnknownKey {
        path: PathBuf,
        key: String,
        allowed: String,
    },
    #[error("{path}: `{key}` = {got} is not allowed: {allowed}")]
    Invalid {
        path: PathBuf,
        key: String,
        got: String,
        allowed: String,
    },
    #[error("{key}={got} is not allowed: {allowed} (an environment variable)")]
    Env {
        key: String,
        got: String,
        allowed: String,
    },
}

/// Reads values out of one TOML table, naming keys by their full path in errors.
struct Reader<'a> {
    path: &'a Path,
    prefix: &'a str,
    table: &'a toml::Table,
    known: &'static [&'static str],
}

impl<'a> Reader<'a> {
    fn new(
        path: &'a Path,
        prefix: &'a str,
        table: &'a toml::Table,
        known: &'static [&'static str],
    ) -> Result<Reader<'a>, ConfigError> {
        for key in table.keys() {
            if !known.contains(&key.as_str()) {
                return Err(ConfigError::UnknownKey {
                    path: path.to_path_buf(),
                    key: format!("{prefix}{key}"),
                    allowed: known
                        .iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        }
        Ok(Reader {
            path,
            prefix,
            table,
            known,
        })
    }

    fn invalid(&self, key: &str, got: &Value, allowed: &str) -> ConfigError {
        debug_assert!(self.known.contains(&key));
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            key: format!("{}{key}", self.prefix),
            got: got.to_string(),
            allowed: allowed.to_string(),
        }
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.table.get(key)
    }

    fn string(&self, key: &str, out: &mut String) -> Result<(), ConfigError> {
        match self.get(key) {
            None => Ok(()),
            Some(Value::String(s)) => {
                *out = s.clone();
                Ok(())
            }
            Some(v) => Err(self.invalid(key, v, "a string")),
        }
    }

    fn boolean(&self, key: &str, out: &mut bool) -> Result<(), ConfigError> {
        match self.get(key) {
            None => Ok(()),
            Some(Value::Boolean(b)) => {
                *out = *b;
                Ok(())
            }
            Some(v) => Err(self.invalid(key, v, "true or false")),
        }
    }

    fn integer(
        &self,
        key: &str,
        min: i64,
        max: i64,
        allowed: &str,
    ) -> Result<Option<i64>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Integer(i)) if (min..=max).contains(i) => Ok(Some(*i)),
            Some(v) => Err(self.invalid(key, v, allowed)),
        }
    }

    /// An optional path: the empty string means "not set".
    fn path(&self, key: &str, out: &mut Option<PathBuf>) -> Result<(), ConfigError> {
        match self.get(key) {
            None => Ok(()),
            Some(Value::String(s)) if s.is_empty() => {
                *out = None;
                Ok(())
            }
            Some(Value::String(s)) => {
                *out = Some(expand_home(s));
                Ok(())
            }
            Some(v) => Err(self.invalid(key, v, "a path (a string; \"\" for the default)")),
        }
    }

    fn table(&self, key: &str) -> Result<Option<&'a toml::Table>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Table(t)) => Ok(Some(t)),
            Some(v) => Err(self.invalid(key, v, "a table ([section])")),
        }
    }
}

/// `~/x` → `$HOME/x`.
pub fn expand_home(p: &str) -> PathBuf {
    if let Some(rest) = p.strip_prefix("~/")
        && let Some(home) = std::env::var_os("HOME")
    {
        return PathBuf::from(home).join(rest);
    }
    PathBuf::from(p)
}

const TOP_KEYS: &[&str] = &[
    "model",
    "backend",
    "ctx_size",
    "ctx_discard",
    "threads",
    "n_gpu_layers",
    "device",
    "split_mode",
    "tensor_split",
    "main_gpu",
    "op_offload",
    "graphs",
    "system_prompt",
    "sampler",
    "ui",
    "models",
    "transcript",
    "log",
    "quit",
    "telemetry",
    "fetch",
    "remote",
];
const SAMPLER_KEYS: &[&str] = &[
    "temp",
    "top_k",
    "top_p",
    "min_p",
    "repeat_penalty",
    "repeat_last_n",
    "n_predict",
    "seed",
    "stop",
];
const UI_KEYS: &[&str] = &[
    "theme",
    "diagnostics",
    "diagnostics_width",
    "panels",
    "mouse",
    "fps",
];
const MODELS_KEYS: &[&str] = &["search_paths", "scan_default_locations"];
const TRANSCRIPT_KEYS: &[&str] = &["enabled", "dir"];
const LOG_KEYS: &[&str] = &["level", "file"];
const QUIT_KEYS: &[&str] = &["drain_timeout_ms", "grace_ms"];
const TELEMETRY_KEYS: &[&str] = &["interval_ms"];
const FETCH_KEYS: &[&str] = &["connect_timeout_s", "read_timeout_s", "tries"];
/// `ctx_size` as the config.toml of older versions documented it (0 was the default).
const OLD_CTX_0: &str =
    "# Context length in tokens. 0 uses the model's own, at most 4096.\nctx_size = 0\n";
const PANEL_NAMES: &str = "\"streams\", \"arena\", \"watchdog\", \"gpu\"";

impl Config {
    /// Parses `text` (the contents of `path`) on top of the defaults.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let table: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| ConfigError::Syntax {
                    path: path.to_path_buf(),
                    message: e.to_string().trim_end().to_string(),
                })?;
        let mut c = Config::default();
        let top = Reader::new(path, "", &table, TOP_KEYS)?;
        top.path("model", &mut c.model)?;
        if let Some(v) = top.get("backend") {
            c.backend = v
                .as_str()
                .and_then(BackendChoice::parse)
                .ok_or_else(|| top.invalid("backend", v, BackendChoice::ALLOWED))?;
        }
        if let Some(n) = top.integer(
            "ctx_size",
            0,
            crate::model::loader::MAX_CTX as i64,
            "0 (the model's whole trained context) or a whole number of tokens up to 16777216",
        )? {
            c.ctx_size = Some(n as u32);
        }
        // The copy older versions wrote at the first start says, beside `ctx_size = 0`, that 0
        // is the model's own context at most 4096: what that file says it means, it keeps.
        if c.ctx_size == Some(0) && text.contains(OLD_CTX_0) {
            c.ctx_size = None;
        }
        if let Some(n) = top.integer("ctx_discard", 1, 95, "a percent from 1 to 95")? {
            c.ctx_discard = n as u8;
        }
        if let Some(n) = top.integer(
            "threads",
            0,
            4096,
            "0 (all cores) or a whole number up to 4096",
        )? {
            c.threads = n as u32;
        }
        if let Some(v) = top.get("n_gpu_layers") {
            let text = match v {
                Value::Integer(i) => i.to_string(),
                Value::String(s) => s.clone(),
                _ => String::new(),
            };
            c.n_gpu_layers = text.parse().map_err(|_| {
                top.invalid(
                    "n_gpu_layers",
                    v,
                    "\"auto\" or a whole number of layers from 0 (llama.cpp's -ngl)",
                )
            })?;
        }
        if let Some(n) = top.integer(
            "device",
            -1,
            1023,
            "-1 (the largest discrete GPU) or a GPU number from 0",
        )? {
            c.device = u32::try_from(n).ok();
        }
        if let Some(v) = top.get("split_mode") {
            c.split.mode = v
                .as_str()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| top.invalid("split_mode", v, SplitMode::ALLOWED))?;
        }
        if let Some(v) = top.get("tensor_split") {
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Array(a) => a
                    .iter()
                    .map(|x| match x {
                        Value::Integer(i) => i.to_string(),
                        Value::Float(f) => f.to_string(),
                        _ => "?".into(),
                    })
                    .collect::<Vec<_>>()
                    .join(","),
                _ => String::new(),
            };
            c.split.tensor_split = Some(text.parse().map_err(|_| {
                top.invalid(
                    "tensor_split",
                    v,
                    "proportions per GPU, such as \"3,1\" or [3, 1]",
                )
            })?);
        }
        if let Some(n) = top.integer("main_gpu", 0, 1023, "a GPU number from 0")? {
            c.split.main_gpu = Some(n as u32);
        }
        let mut op_offload = !c.split.no_op_offload;
        top.boolean("op_offload", &mut op_offload)?;
        c.split.no_op_offload = !op_offload;
        top.boolean("graphs", &mut c.graphs)?;
        top.string("system_prompt", &mut c.system_prompt)?;

        if let Some(t) = top.table("sampler")? {
            let r = Reader::new(path, "sampler.", t, SAMPLER_KEYS)?;
            for f in sampler::FIELDS {
                let Some(v) = r.get(f.name) else { continue };
                let text = match v {
                    Value::Integer(i) => i.to_string(),
                    Value::Float(x) => x.to_string(),
                    // Words a field takes as a value (`seed = "random"`).
                    Value::String(w) => w.clone(),
                    _ => return Err(r.invalid(f.name, v, f.allowed)),
                };
                (f.set)(&mut c.sampler, &text).map_err(|_| r.invalid(f.name, v, f.allowed))?;
            }
            if let Some(v) = r.get("stop") {
                let list = v.as_array().and_then(|a| {
                    a.iter()
                        .map(|s| s.as_str().filter(|s| !s.is_empty()).map(str::to_string))
                        .collect::<Option<Vec<String>>>()
                });
                c.sampler.stop = list.ok_or_else(|| {
                    r.invalid("stop", v, "a list of non-empty strings, e.g. [\"</s>\"]")
                })?;
            }
        }

        if let Some(t) = top.table("ui")? {
            let r = Reader::new(path, "ui.", t, UI_KEYS)?;
            if let Some(v) = r.get("theme") {
                c.ui.theme = v
                    .as_str()
                    .and_then(ThemeName::parse)
                    .ok_or_else(|| r.invalid("theme", v, "\"dark\", \"light\" or \"mono\""))?;
            }
            if let Some(v) = r.get("diagnostics") {
                c.ui.diagnostics = match v.as_str() {
                    Some("auto") => None,
                    Some("show") => Some(true),
                    Some("hide") => Some(false),
                    _ => return Err(r.invalid("diagnostics", v, "\"auto\", \"show\" or \"hide\"")),
                };
            }
            if let Some(n) = r.integer(
                "diagnostics_width",
                i64::from(crate::ui::settings::SIDEBAR_MIN),
                i64::from(crate::ui::settings::SIDEBAR_MAX),
                "a whole number of columns from 28 to 100",
            )? {
                c.ui.diagnostics_width = n as u16;
            }
            if let Some(v) = r.get("panels") {
                let allowed = format!("a list of panel names from {PANEL_NAMES}");
                let names = v
                    .as_array()
                    .ok_or_else(|| r.invalid("panels", v, &allowed))?;
                let mut p = Panels {
                    streams: false,
                    arena: false,
                    watchdog: false,
                    gpu: false,
                };
                for n in names {
                    match n.as_str() {
                        Some("streams") => p.streams = true,
                        Some("arena") => p.arena = true,
                        Some("watchdog") => p.watchdog = true,
                        Some("gpu") => p.gpu = true,
                        _ => return Err(r.invalid("panels", n, &allowed)),
                    }
                }
                c.ui.panels = p;
            }
            r.boolean("mouse", &mut c.ui.mouse)?;
            if let Some(n) = r.integer("fps", 1, 120, "a whole number from 1 to 120")? {
                c.ui.fps = n as u32;
            }
        }

        if let Some(t) = top.table("models")? {
            let r = Reader::new(path, "models.", t, MODELS_KEYS)?;
            if let Some(v) = r.get("search_paths") {
                let list = v.as_array().and_then(|a| {
                    a.iter()
                        .map(|s| s.as_str().filter(|s| !s.is_empty()).map(expand_home))
                        .collect::<Option<Vec<PathBuf>>>()
                });
                c.models.search_paths = list.ok_or_else(|| {
                    r.invalid(
                        "search_paths",
                        v,
                        "a list of folder paths, e.g. [\"~/models\"]",
                    )
                })?;
            }
            r.boolean(
                "scan_default_locations",
                &mut c.models.scan_default_locations,
            )?;
        }

        if let Some(t) = top.table("transcript")? {
            let r = Reader::new(path, "transcript.", t, TRANSCRIPT_KEYS)?;
            r.boolean("enabled", &mut c.transcript.enabled)?;
            r.path("dir", &mut c.transcript.dir)?;
        }

        if let Some(t) = top.table("log")? {
            let r = Reader::new(path, "log.", t, LOG_KEYS)?;
            if let Some(v) = r.get("level") {
                c.log.level = v
                    .as_str()
                    .and_then(LogLevel::parse)
                    .ok_or_else(|| r.invalid("level", v, LogLevel::ALLOWED))?;
            }
            r.path("file", &mut c.log.file)?;
        }

        if let Some(t) = top.table("quit")? {
            let r = Reader::new(path, "quit.", t, QUIT_KEYS)?;
            if let Some(ms) = r.integer(
                "drain_timeout_ms",
                100,
                600_000,
                "milliseconds from 100 to 600000",
            )? {
                c.quit.drain_deadline = Duration::from_millis(ms as u64);
            }
            if let Some(ms) = r.integer("grace_ms", 0, 600_000, "milliseconds from 0 to 600000")? {
                c.quit.grace = Duration::from_millis(ms as u64);
            }
        }
        if let Some(t) = top.table("telemetry")? {
            let r = Reader::new(path, "telemetry.", t, TELEMETRY_KEYS)?;
            if let Some(ms) =
                r.integer("interval_ms", 50, 60_000, "milliseconds from 50 to 60000")?
            {
                c.telemetry.interval_ms = ms as u64;
            }
        }
        if let Some(t) = top.table("fetch")? {
            let r = Reader::new(path, "fetch.", t, FETCH_KEYS)?;
            let secs = "seconds from 1 to 3600";
            if let Some(s) = r.integer("connect_timeout_s", 1, 3600, secs)? {
                c.fetch.connect_timeout = Duration::from_secs(s as u64);
            }
            if let Some(s) = r.integer("read_timeout_s", 1, 3600, secs)? {
                c.fetch.read_timeout = Duration::from_secs(s as u64);
            }
            if let Some(n) = r.integer("tries", 1, 20, "a whole number from 1 to 20")? {
                c.fetch.tries = n as u32;
            }
        }
        if let Some(t) = top.table("remote")? {
            use remote_config::Bad;
            let path = path.to_path_buf();
            c.remote = remote_config::parse(t, &|p| expand_home(p)).map_err(|b| match b {
                Bad::Unknown { key, allowed } => ConfigError::UnknownKey { path, key, allowed },
                Bad::Invalid { key, got, allowed } => ConfigError::Invalid {
                    path,
                    key,
                    got,
                    allowed,
                },
            })?;
        }
        Ok(c)
    }

    /// Reads `path`; a file that does not exist gives the defaults.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Config::parse(&text, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
            Err(e) => Err(ConfigError::Read {
                path: path.to_path_buf(),
                message: e.to_string(),
            }),
        }
    }
}

mod write;
pub use write::{keep_sampler_defaults, write_default_if_missing};

#[cfg(test)]
mod tests;
