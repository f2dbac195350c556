//! The one polling wait of the device's host side ([`Backoff`]): the stream's waits for its
//! events and the handle's waits for the device use it.

use std::time::{Duration, Instant};

/// Polling backoff: spin (yielding the core to any other runnable thread) for the first 4 ms,
/// sleep 50 µs at a time up to 20 ms, then sleep, doubling to 2 ms, for the long waits.
///
/// A decode step is one wait of 1–4 ms on a fast GPU (the logits download), so it ends while the
/// thread spins, when the work ends. With the earlier 200 µs of yielding, a step ended in a 50 µs
/// sleep that the kernel's default timer slack stretches to ~100 µs: `selftest`'s tracking
/// overhead without graphs then measured that quantum, not the tracking (+5.08% on the H100 with
/// breadcrumbs, −0.06% without; +1.15% and +0.90% with this backoff, same binary and call,
/// docs/runs/h100-2026-11-27.txt). CUDA's own synchronize spins the same way by default. The waiting
/// thread's timer slack is set to 1 µs once (Linux), so that the 50 µs sleeps of longer waits (a
/// prompt) end within a few µs of the work.
pub struct Backoff {
    start: Instant,
    sleep: Duration,
}

impl Backoff {
    pub fn new() -> Backoff {
        tight_timer_slack();
        Backoff {
            start: Instant::now(),
            sleep: Duration::from_micros(50),
        }
    }

    pub fn wait(&mut self) {
        let waited = self.start.elapsed();
        if waited < Duration::from_millis(4) {
            std::thread::yield_now();
        } else if waited < Duration::from_millis(20) {
            std::thread::sleep(Duration::from_micros(50));
        } else {
            std::thread::sleep(self.sleep);
            self.sleep = (self.sleep * 2).min(Duration::from_millis(2));
        }
    }

    pub fn waited(&self) -> Duration {
        self.start.elapsed()
    }
}

/// Sets this thread's timer slack to 1 µs, once per thread (Linux; elsewhere nothing).
fn tight_timer_slack() {
    #[cfg(target_os = "linux")]
    {
        thread_local!(static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
        DONE.with(|d| {
            if !d.replace(true) {
                // SAFETY: PR_SET_TIMERSLACK takes an integer and changes only this thread's
                // timer slack; a failure leaves the default (then sleeps are merely later).
                unsafe {
                    libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong);
                }
            }
        });
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}
