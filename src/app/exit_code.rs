//! The process's exit codes, defined once (the README's "Exit codes" lists the same). Layers below
//! the app report outcomes (`DeviceRelease`, errors); only the app turns them into codes.

use crate::gpu::snapshot::DeviceRelease;
use crate::ui::quit_screen::WorkerEnd;

/// Everything finished and the device was released cleanly.
pub const OK: i32 = 0;
/// A command failed (its message says why), or `doctor` found a failing check; also a model
/// file truncated or overwritten while mapped (SIGBUS: `app/signals.rs` says which file).
pub const FAILED: i32 = 1;
/// A configuration or command-line error: nothing was started.
pub const USAGE: i32 = 2;
/// hipscope left without waiting for the GPU (`_exit`, no atexit handlers), because the device
/// did not answer within the quit's deadline or a second interrupt asked it to.
pub const HARD: i32 = 3;
/// An internal error (a panic); the terminal was restored first and the message printed.
pub const PANIC: i32 = 101;

/// The code for a quit that ended with the device released this way.
pub fn after(release: DeviceRelease) -> i32 {
    match release {
        DeviceRelease::Clean => OK,
        DeviceRelease::Abandoned => HARD,
    }
}

/// The code for a chat whose worker ended so: a worker that vanished without finishing its quit
/// counts as a failure (and the quit coordinator leaves without GPU cleanup).
pub fn after_worker(end: WorkerEnd) -> i32 {
    match end {
        WorkerEnd::Released(release) => after(release),
        WorkerEnd::Vanished => FAILED,
    }
}
