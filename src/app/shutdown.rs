//! The chat's side of the synchronized quit (docs/ARCHITECTURE.md, "The quit protocol"). The
//! worker performs the device steps and answers `Exited`; the event loop waits for that, and a
//! second Ctrl-C (or signal) ends the wait at once. The deadline is the quit coordinator's one
//! timer ([`crate::app::quit::QuitCoordinator::begin`]), which runs whatever the UI thread is
//! doing. Leaving without the worker goes through the coordinator: its exit hooks restore the
//! terminal and flush the log, then `_exit` skips the atexit handlers — the HIP runtime's
//! fat-binary unregistration waits on every stream without a limit and never returns once the
//! GPU is wedged (pytorch#160759, ROCm/TheRock#999).

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the event loop ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The worker finished its quit and reported this exit code.
    Exited(i32),
    /// The app is leaving without the worker; the reason is logged and printed.
    Forced(String),
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
