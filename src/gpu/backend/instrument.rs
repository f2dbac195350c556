//! What other threads read of a backend while its worker computes ([`BackendMonitor`]).

use crate::gpu::snapshot::{StreamSnapshot, WatchdogSnapshot};

/// A view of a backend's device that other threads may read while the worker is inside a
/// forward pass (the session borrows the backend mutably for a whole answer): atomics only, no
/// lock shared with the worker, no runtime call.
pub trait BackendMonitor: Send + Sync {
    /// The backend's streams as they are now.
    fn streams(&self) -> Vec<StreamSnapshot>;
    /// The oldest op in flight judged against its budget (OK / SLOW / HUNG), if there is a stream.
    fn watchdog(&self) -> Option<WatchdogSnapshot>;
}
