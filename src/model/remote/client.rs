//! The HTTP side of a remote engine: the endpoint, its key, `ureq` agents (the crate the
//! model download already uses), and errors worded so that the user knows what to do.
//!
//! The key is a [`Secret`]: it is read from an environment variable or from a file only its
//! owner can read, goes into the `Authorization` header and nowhere else. Nothing here formats
//! it; its `Debug` and `Display` print `[redacted]`, so a log line, a panic message or a JSON
//! dump that holds it by mistake still does not show it.

use std::io::Read;
use std::time::Duration;

pub use crate::model::protocol::{Budgets, KeySource, RemoteSpec};

/// An API key. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Reads the key from `source`. A key file that its group or others can read is refused.
pub fn read_key(source: &KeySource) -> Result<Option<Secret>, String> {
    match source {
        KeySource::None => Ok(None),
        KeySource::Env(name) => match std::env::var(name) {
            Ok(v) if !v.trim().is_empty() => Ok(Some(Secret(v.trim().to_string()))),
            Ok(_) => Err(format!("the API key variable {name} is empty")),
            Err(_) => Err(format!(
                "the API key variable {name} is not set (export {name}=... before starting)"
            )),
        },
        KeySource::File(p) => {
            let meta = std::fs::metadata(p)
                .map_err(|e| format!("the API key file {}: {e}", p.display()))?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = meta.permissions().mode() & 0o777;
                if mode & 0o077 != 0 {
                    return Err(format!(
                        "the API key file {} can be read by others (mode {mode:04o}): refused; \
                         `chmod 600 {}` and try again",
                        p.display(),
                        p.display()
                    ));
                }
            }
            let _ = meta;
            let text = std::fs::read_to_string(p)
                .map_err(|e| format!("the API key file {}: {e}", p.display()))?;
            let key = text.trim();
            if key.is_empty() {
                return Err(format!("the API key file {} is empty", p.display()));
            }
            Ok(Some(Secret(key.to_string())))
        }
    }
}

/// A failed call, worded for the user.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RemoteError {
    #[error("{0}")]
    Connect(String),
    #[error("{0}")]
    Tls(String),
    #[error("{0}")]
    Auth(String),
    #[error("{what} answered HTTP {status}: {body}")]
    Status {
        what: String,
        status: u16,
        body: String,
        /// Seconds the server asked to wait (`Retry-After`), for 429 and 503.
        retry_after: Option<u64>,
    },
    #[error("{0}")]
    Protocol(String),
    #[error("{0}")]
    Other(String),
}

/// The most a short call (a panel's page, the model list) may take, connecting included: well
/// inside the quit's deadline, so that a server that stopped answering cannot hold up a quit.
pub const QUICK: Duration = Duration::from_secs(3);

/// The most of an error body quoted in a message.
const BODY_QUOTE: usize = 300;

/// An agent and the key for one endpoint.
#[derive(Clone)]
pub struct Client {
    pub spec: RemoteSpec,
    key: Option<Secret>,
    /// For short calls (panels, model list): a read that takes longer fails.
    quick: ureq::Agent,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("spec", &self.spec)
            .field("key", &self.key)
            .finish()
    }
}

/// `global`: the most one call may take in all (the short calls), `None` for the stream.
fn agent(spec: &RemoteSpec, per_read: Option<Duration>, global: Option<Duration>) -> ureq::Agent {
    // The system's roots, as the model download uses; `--insecure` only when asked.
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .disable_verification(spec.insecure)
        .build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .timeout_connect(Some(spec.budgets.connect))
        .timeout_per_read(per_read)
        .timeout_recv_response(per_read)
        .timeout_global(global)
        .http_status_as_error(false)
        .build()
        .new_agent()
}

impl Client {
    pub fn new(spec: RemoteSpec) -> Result<Client, String> {
        let key = read_key(&spec.key)?;
        Ok(Client {
            quick: agent(&spec, Some(QUICK), Some(QUICK)),
            key,
            spec,
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.spec.url)
    }

    fn auth(
        &self,
        r: ureq::RequestBuilder<ureq::typestate::WithoutBody>,
    ) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        match &self.key {
            Some(k) => r.header("Authorization", format!("Bearer {}", k.expose())),
            None => r,
        }
    }

    fn auth_body(
        &self,
        r: ureq::RequestBuilder<ureq::typestate::WithBody>,
    ) -> ureq::RequestBuilder<ureq::typestate::WithBody> {
        match &self.key {
            Some(k) => r.header("Authorization", format!("Bearer {}", k.expose())),
            None => r,
        }
    }

    /// GET `path`: the status and the body as text (at most 4 MiB), with the short timeout.
    pub fn get(&self, path: &str) -> Result<(u16, String), RemoteError> {
        let url = self.url(path);
        let mut resp = self
            .auth(self.quick.get(&url))
            .call()
            .map_err(|e| self.transport(&url, e))?;
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .with_config()
            .limit(4 << 20)
            .read_to_string()
            .map_err(|e| self.transport(&url, e))?;
        Ok((status, body))
    }

    /// GET `path`, which must answer 200.
    pub fn get_ok(&self, path: &str) -> Result<String, RemoteError> {
        let (status, body) = self.get(path)?;
        if status == 200 {
            Ok(body)
        } else {
            Err(self.status_error(path, status, &body, None))
        }
    }

    /// An agent for one streamed request, with no read timeout (the request's watchdog judges
    /// the waits): its own, so that [`ureq::Agent::shutdown`] on it closes that connection at
    /// once, interrupting a read blocked on it, and nothing else.
    pub fn stream_agent(&self) -> ureq::Agent {
        agent(&self.spec, None, None)
    }

    /// POST a JSON body to `path` through `agent` and hand back the response's reader if it
    /// answered 200.
    pub fn post_stream(
        &self,
        agent: &ureq::Agent,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<Box<dyn Read + Send>, RemoteError> {
        let url = self.url(path);
        let resp = self
            .auth_body(agent.post(&url))
            .header("Content-Type", "application/json")
            .header("Accept", "text/event-stream")
            .send(body.to_string())
            .map_err(|e| self.transport(&url, e))?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if status != 200 {
            let text = resp
                .into_body()
                .with_config()
                .limit(64 << 10)
                .read_to_string()
                .unwrap_or_default();
            return Err(self.status_error(path, status, &text, retry_after));
        }
        Ok(Box::new(resp.into_body().into_reader()))
    }

    /// A status other than 200, worded: 401/403 name where the key came from, 429/503 carry
    /// `Retry-After`.
    pub fn status_error(
        &self,
        path: &str,
        status: u16,
        body: &str,
        retry_after: Option<u64>,
    ) -> RemoteError {
        let what = format!("{} {path}", self.spec.host());
        if status == 401 || status == 403 {
            let from = match (&self.spec.key, &self.key) {
                (_, None) => "no key was sent: set `api_key_env` for this endpoint in \
                              config.toml, or --api-key-env NAME"
                    .to_string(),
                (src, Some(_)) => format!("the key was read from {src}; check it"),
            };
            return RemoteError::Auth(format!(
                "{what}: the server refused the request (HTTP {status}): {from}"
            ));
        }
        RemoteError::Status {
            what,
            status,
            body: short_body(body),
            retry_after,
        }
    }

    /// A transport failure, worded: which host, what failed, what to try.
    pub fn transport(&self, url: &str, e: ureq::Error) -> RemoteError {
        let host = self.spec.host().to_string();
        match e {
            ureq::Error::HostNotFound => RemoteError::Connect(format!(
                "cannot resolve the host of {url} (DNS): check the address"
            )),
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                RemoteError::Connect(format!(
                    "connection refused by {host}: nothing listens there; is the server running?"
                ))
            }
            ureq::Error::ConnectionFailed => RemoteError::Connect(format!(
                "cannot connect to {host}: is the server running and reachable?"
            )),
            ureq::Error::Timeout(t) => {
                RemoteError::Connect(format!("{host} did not answer in time ({t}) for {url}"))
            }
            ureq::Error::Tls(m) => RemoteError::Tls(format!(
                "TLS failure with {host}: {m}; a self-signed server needs its CA in the \
                 system's store (or --insecure, shown in the status bar)"
            )),
            ureq::Error::Rustls(r) => RemoteError::Tls(format!(
                "TLS failure with {host}: {r}; a self-signed server needs its CA in the \
                 system's store (or --insecure, shown in the status bar)"
            )),
            ureq::Error::TlsRequired => {
                RemoteError::Tls(format!("{host} requires TLS: use https:// in the address"))
            }
            ureq::Error::Io(io) => RemoteError::Connect(format!("{url}: {io}")),
            other => RemoteError::Other(format!("{url}: {other}")),
        }
    }
}

/// An error body, shortened: JSON `{"error": {"message": ...}}` gives its message.
pub fn short_body(body: &str) -> String {
    let msg = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            let e = v.get("error").cloned().unwrap_or(v.clone());
            e.get("message")
                .and_then(|m| m.as_str())
                .map(str::to_string)
                .or_else(|| e.as_str().map(str::to_string))
                .or_else(|| v.get("detail").and_then(|d| d.as_str()).map(str::to_string))
        })
        .unwrap_or_else(|| body.trim().to_string());
    let mut s: String = msg
        .chars()
        .filter(|c| !c.is_control())
        .take(BODY_QUOTE)
        .collect();
    if msg.chars().count() > BODY_QUOTE {
        s.push('…');
    }
    if s.is_empty() { "(no body)".into() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_normalised() {
        assert_eq!(
            RemoteSpec::normalize_url("http://h:8080/v1/").unwrap(),
            "http://h:8080"
        );
        assert_eq!(
            RemoteSpec::normalize_url("https://h/prefix").unwrap(),
            "https://h/prefix"
        );
        assert!(
            RemoteSpec::normalize_url("h:8080")
                .unwrap_err()
                .contains("http://")
        );
        let e = RemoteSpec::normalize_url("http://u:sekrit@h").unwrap_err();
        assert!(!e.contains("sekrit"), "{e}");
    }

    #[test]
    fn a_key_file_others_can_read_is_refused_and_the_key_never_prints() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("key");
        std::fs::write(&p, "sk-test-123\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_key(&KeySource::File(p.clone())).unwrap_err();
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let k = read_key(&KeySource::File(p)).unwrap().unwrap();
        assert_eq!(k.expose(), "sk-test-123");
        assert_eq!(format!("{k} {k:?}"), "[redacted] [redacted]");
        let e = read_key(&KeySource::Env("HIPSCOPE_SURELY_UNSET_KEY".into())).unwrap_err();
        assert!(e.contains("HIPSCOPE_SURELY_UNSET_KEY is not set"), "{e}");
    }

    #[test]
    fn error_bodies_are_shortened_to_their_message() {
        assert_eq!(
            short_body(r#"{"error":{"code":404,"message":"model not found","type":"x"}}"#),
            "model not found"
        );
        assert_eq!(short_body(r#"{"detail":"Not Found"}"#), "Not Found");
        assert_eq!(short_body(&"x".repeat(400)).chars().count(), 301);
    }
}
