//! The API key: read from a file (never from the command line, where `ps` would show it), never
//! logged, compared in constant time; and the rule that only a loopback address may be served
//! without one.

use std::net::IpAddr;
use std::path::Path;

use subtle::ConstantTimeEq;

/// A key that is never printed (`Debug` shows its length only).
#[derive(Clone)]
pub struct ApiKey(Vec<u8>);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKey({} bytes)", self.0.len())
    }
}

/// Keys shorter than this are refused: a guessable key on a network address is no key.
pub const MIN_KEY_BYTES: usize = 16;

impl ApiKey {
    /// The first line of `path`, trimmed; an error saying what is wrong (never the key).
    pub fn read(path: &Path) -> Result<ApiKey, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--api-key-file {}: {e}", path.display()))?;
        let key = text.lines().next().unwrap_or("").trim();
        if key.len() < MIN_KEY_BYTES {
            return Err(format!(
                "--api-key-file {}: the key must be at least {MIN_KEY_BYTES} characters on its first line",
                path.display()
            ));
        }
        Ok(ApiKey(key.as_bytes().to_vec()))
    }

    /// Whether an `Authorization` header carries this key (`Bearer KEY`), in time that does not
    /// depend on where the two differ.
    pub fn admits(&self, header: Option<&[u8]>) -> bool {
        let Some(h) = header else {
            return false;
        };
        let given = h.strip_prefix(b"Bearer ").unwrap_or(b"");
        // `ct_eq` on slices of different lengths is false without looking at the bytes; the
        // length of the key is not the secret.
        given.ct_eq(&self.0).into()
    }
}

/// Whether `host` names only this machine (127.0.0.0/8, ::1, localhost).
pub fn is_loopback(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    host.trim_matches(|c| c == '[' || c == ']')
        .parse::<IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names() {
        for h in ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"] {
            assert!(is_loopback(h), "{h}");
        }
        for h in ["0.0.0.0", "::", "192.168.1.2", "example.com"] {
            assert!(!is_loopback(h), "{h}");
        }
    }

    #[test]
    fn keys_admit_only_the_exact_bearer_and_never_print() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("key");
        std::fs::write(&p, "short\n").unwrap();
        assert!(ApiKey::read(&p).is_err());
        std::fs::write(&p, "0123456789abcdef-secret\nignored\n").unwrap();
        let k = ApiKey::read(&p).unwrap();
        assert!(k.admits(Some(b"Bearer 0123456789abcdef-secret")));
        assert!(!k.admits(Some(b"Bearer 0123456789abcdef-secreT")));
        assert!(!k.admits(Some(b"Bearer 0123456789abcdef-secret ")));
        assert!(!k.admits(Some(b"0123456789abcdef-secret")));
        assert!(!k.admits(None));
        assert!(!format!("{k:?}").contains("secret"));
    }
}
