//! The `[remote]` table through the whole config file reader: endpoints with their budgets and
//! a key file under `~/`, and a mistake named with the file and the key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hipscope::app::config::{Config, ConfigError};
use hipscope::model::protocol::KeySource;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("/cfg/config.toml"))
}

#[test]
fn remote_tables_are_read_and_their_mistakes_named() {
    let c = parse(
        "[remote]\nbetween_tokens_timeout_ms = 2500\n[remote.box]\nurl = \"http://b:8080/v1\"\n\
         api_key_file = \"~/k\"\n",
    )
    .unwrap();
    assert_eq!(c.remote.endpoints[0].url, "http://b:8080");
    assert_eq!(
        c.remote.endpoints[0].budgets.between_tokens,
        Duration::from_millis(2500)
    );
    if let Some(home) = std::env::var_os("HOME") {
        assert_eq!(
            c.remote.endpoints[0].key,
            KeySource::File(PathBuf::from(home).join("k"))
        );
    }
    let e = parse("[remote.box]\nurl = 1\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "/cfg/config.toml: `remote.box.url` = 1 is not allowed: a string"
    );
}
