//! Logging to a file (never to the screen, which belongs to the UI): `tracing` events go through
//! a background writer to `hipscope.log` in the state directory, or the configured file, 0600 in
//! a 0700 folder.

use std::path::{Path, PathBuf};

use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::filter::LevelFilter;

use super::config::LogLevel;

/// Keeps the log writer alive; dropping it flushes what is buffered. The hard exit drops it
/// explicitly before `_exit`, which runs no destructors.
pub struct LogGuard {
    _guard: Option<WorkerGuard>,
    pub path: Option<PathBuf>,
    /// The log file made private (0600) at this start, said once.
    pub tightened: Option<String>,
}

impl LogGuard {
    pub fn none() -> LogGuard {
        LogGuard {
            _guard: None,
            path: None,
            tightened: None,
        }
    }
}

fn filter(level: LogLevel) -> LevelFilter {
    match level {
        LogLevel::Off => LevelFilter::OFF,
        LogLevel::Error => LevelFilter::ERROR,
        LogLevel::Warn => LevelFilter::WARN,
        LogLevel::Info => LevelFilter::INFO,
        LogLevel::Debug => LevelFilter::DEBUG,
        LogLevel::Trace => LevelFilter::TRACE,
    }
}

/// Starts logging to `file` at `level`. Returns why not if the file cannot be opened; the app
/// runs on without a log then.
pub fn init(file: &Path, level: LogLevel) -> Result<LogGuard, String> {
    if level == LogLevel::Off {
        return Ok(LogGuard::none());
    }
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::gpu::dirs::create_private_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    // The log may quote the user's words (errors, a model's path): 0600 whatever the umask, and
    // an older, wider one made so.
    let mut open = std::fs::OpenOptions::new();
    open.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, crate::gpu::dirs::FILE_MODE);
    let f = open
        .open(file)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    let tightened = crate::gpu::dirs::tighten(file)
        .ok()
        .flatten()
        .map(|t| t.to_string());
    let (writer, guard) = tracing_appender::non_blocking(f);
    let subscriber = tracing_subscriber::fmt()
        .with_writer(writer)
        .with_ansi(false)
        .with_thread_names(true)
        .with_max_level(filter(level))
        .finish();
    // A second init in one process (tests) keeps the first subscriber.
    if tracing::subscriber::set_global_default(subscriber).is_err() {
        return Ok(LogGuard::none());
    }
    tracing::info!(
        "hipscope {} started (pid {})",
        env!("CARGO_PKG_VERSION"),
        std::process::id()
    );
    Ok(LogGuard {
        _guard: Some(guard),
        path: Some(file.to_path_buf()),
        tightened,
    })
}
