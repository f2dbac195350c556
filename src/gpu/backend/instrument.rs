//! What the app watches and controls around the forward pass ([`Instrument`]): the device's
//! name, the streams and the watchdog, the hang fault, the quit; and what other threads read
//! while the worker computes ([`BackendMonitor`]).

use std::sync::Arc;
use std::time::Duration;

use super::{BackendError, OpLabel, Result};
use crate::gpu::device::DeviceInfo;
use crate::gpu::snapshot::{
    DeviceRelease, DeviceSummary, QuitStep, StreamSnapshot, WatchdogSnapshot,
};
use crate::gpu::stream::{Budget, StreamShared};
use crate::gpu::watchdog::Watchdog;

/// The instrumentation side of a backend. Where a default body is given, it is what a backend
/// without that capability does (no streams, nothing to watch, no hang to inject, nothing to
/// release); nothing here computes.
pub trait Instrument {
    /// What this backend runs on.
    fn device(&self) -> DeviceSummary;

    /// Device memory read bandwidth, measured now by a kernel that only reads
    /// (`Gpu::measure_read_bandwidth`; `None` where the backend has no device memory to measure,
    /// or the measurement failed).
    fn read_bandwidth(&mut self) -> Option<crate::gpu::snapshot::ReadBandwidth> {
        None
    }

    /// The streams this backend owns, for the UI (the CPU has none).
    fn streams(&self) -> Vec<StreamSnapshot> {
        Vec::new()
    }

    /// A handle other threads can read snapshots from during a generation (GPU backends).
    fn monitor(&self) -> Option<Arc<dyn BackendMonitor>> {
        None
    }

    /// The stream the process's watchdog watches on this backend, with the device facts for its
    /// hang reports (`gpu::open` starts the watchdog); `None`: nothing to watch.
    fn watch_target(&self) -> Option<(Arc<StreamShared>, DeviceInfo)> {
        None
    }

    /// Keeps the watchdog `gpu::open` started on [`Instrument::watch_target`]'s stream: it runs
    /// as long as the backend — load, prompts, answers, idle, the quit's drain — and stops when
    /// the backend is dropped. A backend without a watch target is never given one.
    fn keep_watchdog(&mut self, dog: Watchdog) {
        drop(dog);
    }

    /// Enqueues an op that does not finish for tens of seconds, judged against its own `budget`:
    /// the hang `HIPSCOPE_FAULT=hang:PHASE` injects (`gpu/fault.rs`). On a GPU the
    /// `hs_spin_on_flag` kernel; on the CPU the calling thread held inside the op.
    fn stuck_op(&mut self, _label: OpLabel, _budget: Budget) -> Result<()> {
        Err(BackendError::Unsupported(
            "this backend cannot hold an op (HIPSCOPE_FAULT=hang)".into(),
        ))
    }

    /// The concrete backend, for a caller that owns a `Model` and needs the backend's own API
    /// (the selftest flips tracking on the `GpuCompute` under a model). `None` unless overridden.
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }

    /// The device half of the quit protocol: a bounded drain, then every device resource in
    /// order, each step reported through `on_step`. `Abandoned` when the process must leave with
    /// `_exit` because the GPU could not be shut down cleanly. Later calls do nothing and return
    /// `Clean`.
    fn shutdown(
        &mut self,
        _drain_deadline: Duration,
        _on_step: &mut dyn FnMut(QuitStep),
    ) -> DeviceRelease {
        DeviceRelease::Clean
    }
}

/// A view of a backend's device that other threads may read while the worker is inside a
/// forward pass (the session borrows the backend mutably for a whole answer): atomics only, no
/// lock shared with the worker, no runtime call.
pub trait BackendMonitor: Send + Sync {
    /// The backend's streams as they are now.
    fn streams(&self) -> Vec<StreamSnapshot>;
    /// The oldest op in flight judged against its budget (OK / SLOW / HUNG), if there is a stream.
    fn watchdog(&self) -> Option<WatchdogSnapshot>;
}
