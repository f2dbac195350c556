//! The platform's directories for hipscope (XDG on Linux), overridable for tests and portable
//! installs with `HIPSCOPE_HOME` (then `cache/`, `config/`, `data/`, `state/` under it).
//!
//! Here, in the lowest layer, because the GPU runtime is the first to need them (the kernel cache,
//! hang reports); the app re-exports it as `app::dirs`.

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
