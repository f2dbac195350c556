//! The platform's directories for hipscope (XDG on Linux), overridable for tests and portable
//! installs with `HIPSCOPE_HOME` (then `cache/`, `config/`, `data/`, `state/` under it).
//!
//! Here, in the lowest layer, because the GPU runtime is the first to need them (the kernel cache,
//! hang reports); the app takes its folders from here too ([`Dirs`]).

use std::path::PathBuf;

fn project() -> Option<directories::ProjectDirs> {
    directories::ProjectDirs::from("", "", "hipscope")
}

fn home(sub: &str) -> Option<PathBuf> {
    std::env::var_os("HIPSCOPE_HOME").map(|h| PathBuf::from(h).join(sub))
}

/// Downloaded models and compiled kernels.
pub fn cache_dir() -> Option<PathBuf> {
    home("cache").or_else(|| project().map(|p| p.cache_dir().to_path_buf()))
}

/// The user's `config.toml`.
pub fn config_dir() -> Option<PathBuf> {
    home("config").or_else(|| project().map(|p| p.config_dir().to_path_buf()))
}

/// Conversations and hang reports.
pub fn data_dir() -> Option<PathBuf> {
    home("data").or_else(|| project().map(|p| p.data_dir().to_path_buf()))
}

/// Logs.
pub fn state_dir() -> Option<PathBuf> {
    home("state").or_else(|| {
        project().map(|p| {
            p.state_dir()
                .map_or_else(|| p.data_local_dir().join("state"), |s| s.to_path_buf())
        })
    })
}

/// hipscope's folders (the platform's, or under `HIPSCOPE_HOME`), as values so that
/// tests can point them elsewhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirs {
    pub config: PathBuf,
    pub data: PathBuf,
    pub cache: PathBuf,
    pub state: PathBuf,
}

impl Dirs {
    pub fn from_env() -> Dirs {
        // No home directory at all: keep everything beside the working directory.
        let fallback = Dirs::under(&PathBuf::from(".hipscope"));
        Dirs {
            config: config_dir().unwrap_or(fallback.config),
            data: data_dir().unwrap_or(fallback.data),
            cache: cache_dir().unwrap_or(fallback.cache),
            state: state_dir().unwrap_or(fallback.state),
        }
    }

    pub fn under(root: &std::path::Path) -> Dirs {
        Dirs {
            config: root.join("config"),
            data: root.join("data"),
            cache: root.join("cache"),
            state: root.join("state"),
        }
    }
}
