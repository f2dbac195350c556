//! The app side of the synchronized quit (DESIGN.md, "Shutdown"): the worker performs the device
//! steps and answers `Exited`; the app waits for that with a deadline. If the deadline passes or
//! the user presses Ctrl-C again, the app restores the terminal, flushes the transcript and the
//! log, and leaves with `_exit`, so that no atexit handler runs: rocBLAS's fat-binary
//! unregistration (`__hipUnregisterFatBinary`) waits on every stream with no time limit and never
//! returns once the GPU is wedged (pytorch#160759, ROCm/TheRock#999).
//!
//! This is the coordinator for the app side only; it will fold into `src/app/quit.rs` when the
//! GPU runtime's quit protocol lands there.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Exit code of a forced exit (deadline passed, or a second Ctrl-C).
pub const FORCED_EXIT_CODE: i32 = 3;
/// Exit code after a panic on the UI thread (Rust's own code for a panic).
pub const PANIC_EXIT_CODE: i32 = 101;

/// How the event loop ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The worker finished its quit and reported this exit code.
    Exited(i32),
    /// The app is leaving without the worker; the reason is logged.
    Forced(String),
    /// The UI thread panicked.
    Panicked,
}

/// Waits up to `limit` for the worker thread to end after it reported `Exited`. The worker has
/// already released the device by then; this only keeps a thread from being cut off while it
/// unwinds. Returns whether it ended.
pub fn join_worker(thread: JoinHandle<()>, limit: Duration) -> bool {
    let start = Instant::now();
    while !thread.is_finished() {
        if start.elapsed() >= limit {
            tracing::warn!("the worker thread had not ended {limit:?} after it exited; leaving it");
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if thread.join().is_err() {
        tracing::warn!("the worker thread panicked while ending");
    }
    true
}

/// Leaves the process at once: no atexit handlers, no destructors. The caller restores the
/// terminal and flushes the transcript and log first.
pub fn hard_exit(code: i32) -> ! {
    #[cfg(unix)]
    {
        // SAFETY: `_exit` ends the process without running atexit handlers or flushing stdio
        // buffers; it has no preconditions.
        unsafe { libc::_exit(code) }
    }
    #[cfg(not(unix))]
    {
        // Windows: TerminateProcess on the current process is the equivalent; std's abort is
        // the portable stand-in until that module exists.
        let _ = code;
        std::process::abort()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_is_bounded_for_a_stuck_thread() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let stuck = std::thread::spawn(move || {
            let _ = rx.recv();
        });
        assert!(!join_worker(stuck, Duration::from_millis(50)));
        drop(tx);
        let done = std::thread::spawn(|| {});
        assert!(join_worker(done, Duration::from_secs(5)));
    }
}
