//! The `[remote]` table of config.toml (watchdog budgets of a remote request, and named
//! endpoints `[remote.NAME]`), and the flags that pick or give an endpoint (`--remote`,
//! `--remote-model`, `--api-key-env`, `--api-key-file`, `--insecure`). Parsed here, beside
//! `config.rs` (which calls [`parse`]), so that the one config module stays under its size.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use toml::Value;

use crate::model::protocol::{Budgets, KeySource, RemoteSpec};

/// A mistake in `[remote]`: `config.rs` turns it into its `ConfigError` with the file's path.
#[derive(Clone, Debug, PartialEq)]
pub enum Bad {
    Unknown {
        key: String,
        allowed: String,
    },
    Invalid {
        key: String,
        got: String,
        allowed: String,
    },
}

/// Remote endpoints and their budgets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RemoteConfig {
    pub budgets: Budgets,
    /// `[remote.NAME]` tables, in file order.
    pub endpoints: Vec<RemoteSpec>,
    /// The endpoint `--remote` chose for this run (not read from the file).
    pub selected: Option<RemoteSpec>,
}

const BUDGET_KEYS: &[&str] = &[
    "first_token_timeout_ms",
    "between_tokens_timeout_ms",
    "connect_timeout_ms",
];
pub const ENDPOINT_KEYS: &[&str] = &["url", "model", "api_key_env", "api_key_file", "insecure"];

fn invalid(key: String, got: &Value, allowed: &str) -> Bad {
    Bad::Invalid {
        key,
        got: got.to_string(),
        allowed: allowed.into(),
    }
}

/// Reads `[remote]`: budget keys, and one sub-table per endpoint; `expand` turns a key file's
/// `~/` into the home folder (`config::expand_home`).
pub fn parse(t: &toml::Table, expand: &dyn Fn(&str) -> PathBuf) -> Result<RemoteConfig, Bad> {
    let mut c = RemoteConfig::default();
    for (key, v) in t {
        if let Value::Table(e) = v {
            c.endpoints.push(endpoint(key, e, expand)?);
            continue;
        }
        let ms = v
            .as_integer()
            .filter(|n| (1..=3_600_000).contains(n))
            .ok_or_else(|| {
                if BUDGET_KEYS.contains(&key.as_str()) {
                    invalid(format!("remote.{key}"), v, "milliseconds from 1 to 3600000")
                } else {
                    Bad::Unknown {
                        key: format!("remote.{key}"),
                        allowed: format!(
                            "{}, or a table [remote.NAME] for an endpoint",
                            BUDGET_KEYS
                                .iter()
                                .map(|k| format!("`{k}`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    }
                }
            })?;
        let d = Duration::from_millis(ms as u64);
        match key.as_str() {
            "first_token_timeout_ms" => c.budgets.first_token = d,
            "between_tokens_timeout_ms" => c.budgets.between_tokens = d,
            "connect_timeout_ms" => c.budgets.connect = d,
            _ => {
                return Err(Bad::Unknown {
                    key: format!("remote.{key}"),
                    allowed: BUDGET_KEYS.join(", "),
                });
            }
        }
    }
    for e in &mut c.endpoints {
        e.budgets = c.budgets;
    }
    Ok(c)
}

fn endpoint(
    name: &str,
    t: &toml::Table,
    expand: &dyn Fn(&str) -> PathBuf,
) -> Result<RemoteSpec, Bad> {
    let key = |k: &str| format!("remote.{name}.{k}");
    for k in t.keys() {
        if !ENDPOINT_KEYS.contains(&k.as_str()) {
            return Err(Bad::Unknown {
                key: key(k),
                allowed: ENDPOINT_KEYS
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    let string = |k: &str| -> Result<Option<String>, Bad> {
        match t.get(k) {
            None => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(invalid(key(k), v, "a string")),
        }
    };
    let url_v = t
        .get("url")
        .cloned()
        .unwrap_or(Value::String(String::new()));
    let url = string("url")?.ok_or_else(|| {
        invalid(
            key("url"),
            &url_v,
            "the server's address, e.g. \"http://gpu-box:8080\"",
        )
    })?;
    let url = RemoteSpec::normalize_url(&url).map_err(|why| invalid(key("url"), &url_v, &why))?;
    let key_src = match (string("api_key_env")?, string("api_key_file")?) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                key("api_key_file"),
                &t["api_key_file"],
                "only one of `api_key_env` and `api_key_file`",
            ));
        }
        (Some(e), None) => KeySource::Env(e),
        (None, Some(f)) => KeySource::File(expand(&f)),
        (None, None) => KeySource::None,
    };
    let insecure = match t.get("insecure") {
        None => false,
        Some(Value::Boolean(b)) => *b,
        Some(v) => return Err(invalid(key("insecure"), v, "true or false")),
    };
    Ok(RemoteSpec {
        name: name.to_string(),
        url,
        model: string("model")?,
        key: key_src,
        insecure,
        budgets: Budgets::default(),
    })
}

/// The flags that pick a remote engine (shared by `chat`, `generate` and `top`).
#[derive(Args, Clone, Debug, Default, PartialEq)]
pub struct RemoteArgs {
    /// Chat with an OpenAI-compatible server instead of a local model: its address
    /// (http://host:8080) or the NAME of a [remote.NAME] table in config.toml.
    #[arg(long, value_name = "URL|NAME")]
    pub remote: Option<String>,
    /// The model to ask the server for (default: the endpoint's `model`, else the first the
    /// server lists).
    #[arg(long = "remote-model", value_name = "ID", requires = "remote")]
    pub remote_model: Option<String>,
    /// Read the server's API key from this environment variable.
    #[arg(long = "api-key-env", value_name = "VAR", requires = "remote")]
    pub api_key_env: Option<String>,
    /// Read the server's API key from this file (it must be readable by you alone).
    #[arg(
        long = "api-key-file",
        value_name = "FILE",
        requires = "remote",
        conflicts_with = "api_key_env"
    )]
    pub api_key_file: Option<PathBuf>,
    /// Do not verify the server's TLS certificate (shown in the status bar).
    #[arg(long, requires = "remote")]
    pub insecure: bool,
}

impl RemoteArgs {
    /// The endpoint the flags ask for, from `config`'s tables or the URL given; `None` without
    /// `--remote`.
    pub fn resolve(&self, config: &RemoteConfig) -> Result<Option<RemoteSpec>, String> {
        let Some(r) = &self.remote else {
            return Ok(None);
        };
        let mut spec = match config.endpoints.iter().find(|e| &e.name == r) {
            Some(e) => e.clone(),
            None if r.contains("://") => {
                let url = RemoteSpec::normalize_url(r).map_err(|e| format!("--remote: {e}"))?;
                let mut spec = RemoteSpec {
                    name: String::new(),
                    url,
                    model: None,
                    key: KeySource::None,
                    insecure: false,
                    budgets: config.budgets,
                };
                spec.name = spec.host().to_string();
                spec
            }
            None => {
                let names: Vec<&str> = config.endpoints.iter().map(|e| e.name.as_str()).collect();
                return Err(format!(
                    "--remote {r}: not an address (http://host:port) and not a [remote.NAME] \
                     table of config.toml ({})",
                    if names.is_empty() {
                        "it has none".to_string()
                    } else {
                        format!("it has {}", names.join(", "))
                    }
                ));
            }
        };
        if let Some(m) = &self.remote_model {
            spec.model = Some(m.clone());
        }
        if let Some(e) = &self.api_key_env {
            spec.key = KeySource::Env(e.clone());
        }
        if let Some(f) = &self.api_key_file {
            spec.key = KeySource::File(f.clone());
        }
        spec.insecure |= self.insecure;
        Ok(Some(spec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_text(s: &str) -> Result<RemoteConfig, Bad> {
        let t: toml::Table = s.parse().unwrap();
        parse(t["remote"].as_table().unwrap(), &|p| PathBuf::from(p))
    }

    fn text(b: &Bad) -> String {
        format!("{b:?}")
    }

    #[test]
    fn endpoints_and_budgets() {
        let c = parse_text(
            "[remote]\nfirst_token_timeout_ms = 1500\n[remote.big]\nurl = \"https://gpu:8000/v1\"\n\
             model = \"Qwen\"\napi_key_env = \"BIG_KEY\"\n",
        )
        .unwrap();
        assert_eq!(c.budgets.first_token, Duration::from_millis(1500));
        let e = &c.endpoints[0];
        assert_eq!(
            (e.name.as_str(), e.url.as_str()),
            ("big", "https://gpu:8000")
        );
        assert_eq!(e.key, KeySource::Env("BIG_KEY".into()));
        assert_eq!(e.budgets.first_token, Duration::from_millis(1500));
        let a = RemoteArgs {
            remote: Some("big".into()),
            insecure: true,
            ..RemoteArgs::default()
        };
        let s = a.resolve(&c).unwrap().unwrap();
        assert!(s.insecure && s.model.as_deref() == Some("Qwen"));
        let a = RemoteArgs {
            remote: Some("small".into()),
            ..RemoteArgs::default()
        };
        assert!(a.resolve(&c).unwrap_err().contains("it has big"));
    }

    #[test]
    fn mistakes_name_the_key() {
        let e = text(&parse_text("[remote.x]\nurl = \"ftp://h\"\n").unwrap_err());
        assert!(e.contains("\"remote.x.url\""), "{e}");
        let e =
            text(&parse_text("[remote.x]\nurl = \"http://h\"\napi_key = \"sk\"\n").unwrap_err());
        assert!(
            e.contains("remote.x.api_key") && !e.contains("\\\"sk\\\""),
            "{e}"
        );
        let e = text(&parse_text("[remote]\nfirst_token_timeout_ms = 0\n").unwrap_err());
        assert!(e.contains("milliseconds"), "{e}");
    }
}
