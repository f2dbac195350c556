//! Plain-data snapshots of the GPU mechanisms (streams, arena, watchdog, telemetry), produced by
//! `gpu/` and carried up to the UI in worker events. No handles, no locks: copies only.

use std::time::Duration;

/// One stream the app owns, as seen at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StreamSnapshot {
    /// e.g. `cuda:0 stream 0`, `hip:0 stream 0`, `cpu`.
    pub name: String,
    /// Ops enqueued and not yet observed complete.
    pub queue_depth: u32,
    /// Total ops enqueued since the stream was created.
    pub enqueued: u64,
    /// Total ops observed complete.
    pub completed: u64,
    /// The oldest op not yet complete: its label and how long ago it was enqueued.
    pub in_flight: Option<(String, Duration)>,
    /// The most recent op observed complete.
    pub last_completed: Option<String>,
}

/// A named part of the arena (weights, KV cache, activations, workspace, staging).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RegionSnapshot {
    pub name: String,
    pub capacity: u64,
    pub used: u64,
}

/// The device-memory arena, as seen at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArenaSnapshot {
    /// `device`, or `host` on the CPU backend.
    pub kind: String,
    pub capacity: u64,
    pub used: u64,
    pub high_water: u64,
    pub regions: Vec<RegionSnapshot>,
    pub largest_free: u64,
    /// Device allocations (hipMalloc/cuMemAlloc) made since the device was opened.
    pub device_allocations: u64,
    /// Memory the runtime itself took beyond the arena (free-memory delta), if known.
    pub runtime_overhead: Option<u64>,
    /// Total and free memory of the device, if known.
    pub device_total: Option<u64>,
    pub device_free: Option<u64>,
    /// Page-locked host memory held for staging and breadcrumbs (not part of `capacity`).
    pub pinned_host_bytes: u64,
    /// A model split between the GPU and the CPU (`-ngl`): which part is where.
    pub split: Option<SplitSnapshot>,
}

/// How a split model's layers and weights are divided (llama.cpp's count: the output layer is
/// one of the layers).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SplitSnapshot {
    pub gpu_layers: usize,
    pub cpu_layers: usize,
    pub gpu_weight_bytes: u64,
    pub cpu_weight_bytes: u64,
    /// Activations copied from one side to the other so far, and their bytes.
    pub handovers: u64,
    pub handover_bytes: u64,
    /// Ops of the CPU's layers run on GPU 0 under op offload, and the weight bytes streamed up
    /// for them.
    pub streamed_ops: u64,
    pub streamed_bytes: u64,
    /// KV rows op offload's attention moved: a CPU layer's rows lent to GPU 0's stage before
    /// its batch, the batch's rows back after.
    pub kv_rows_bytes: u64,
    /// Bytes of the model's files GPU 0 streams weights from in place (registered with its
    /// runtime); 0: through its pinned staging.
    pub pinned_bytes: u64,
    /// `16/33 layers on the GPU (layers 17–31 and the output), …`
    pub summary: String,
    /// Each GPU of the split, in order (one with `-ngl` alone; several with `--split-mode
    /// layer`): the Arena panel's block per GPU.
    pub gpus: Vec<SplitGpu>,
}

/// One GPU of a split model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SplitGpu {
    pub name: String,
    /// Layers it holds, the output counted as one (llama.cpp's count).
    pub layers: usize,
    pub weight_bytes: u64,
    /// Its own arena (the split's `ArenaSnapshot` is the first GPU's).
    pub arena: ArenaSnapshot,
}

/// How an [`ArenaSnapshot`]'s `kind` starts when it is a remote server's KV cache: its amounts
/// are then tokens (region `KV cache, tokens`) or thousandths of the cache (`KV cache, ‰`),
/// not bytes.
pub const REMOTE_ARENA: &str = "server KV cache";

/// What the watchdog concluded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WatchState {
    #[default]
    Ok,
    Slow,
    Hung,
}

/// How a [`WatchdogSnapshot`]'s `stream` starts when it watches a remote server's request
/// (`remote host:port`) rather than a GPU stream.
pub const REMOTE_STREAM: &str = "remote ";

/// The watchdog's view at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WatchdogSnapshot {
    pub state: WatchState,
    pub stream: String,
    /// The op the state is about (the oldest in flight), if any.
    pub op: Option<String>,
    pub age: Duration,
    pub budget: Duration,
    pub last_completed: Option<String>,
    pub queue_depth: u32,
    /// Where the hang report was written, once HUNG.
    pub report: Option<std::path::PathBuf>,
    /// Why the report could not be written, when it could not.
    pub report_error: Option<String>,
    /// The op is known to have started (its kernel wrote its breadcrumb).
    pub op_started: bool,
    /// Event queries stopped returning: the state rests on breadcrumbs alone.
    pub event_queries_stuck: bool,
}

impl WatchdogSnapshot {
    /// It watches a remote server's request, not the GPU.
    pub fn is_remote(&self) -> bool {
        self.stream.starts_with(REMOTE_STREAM)
    }
}

/// The device in use, for the GPU panel.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceSummary {
    /// `hip`, `cuda` or `cpu`.
    pub backend: String,
    pub name: String,
    /// `gfx1100`, `sm_90`, or the CPU's feature level.
    pub arch: String,
    pub total_memory: Option<u64>,
    pub free_memory: Option<u64>,
    pub compute_units: Option<u32>,
    pub warp_size: Option<u32>,
    /// Why this backend was chosen (`auto: no HIP runtime found (libamdhip64.so.*), CUDA device 0`).
    pub reason: String,
    /// Graph replay of the decode step: `on`, or `off (why)`; `None` where it does not apply
    /// (the CPU backend, a remote engine).
    pub graphs: Option<String>,
    /// Launch overlap (CUDA's programmatic dependent launch): `on`, or `off (why)`; `None` where
    /// it does not apply (the CPU backend, a remote engine).
    pub launch_overlap: Option<String>,
}

/// Telemetry samples live with their sampler; re-exported here beside the other snapshots.
pub use crate::gpu::telemetry::{GpuReading, HostSample, TelemetrySample};

/// One step of the quit protocol, as it happens.
#[derive(Clone, Debug, PartialEq)]
pub struct QuitStep {
    pub name: String,
    pub status: QuitStepStatus,
    pub elapsed: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuitStepStatus {
    Running,
    Done,
    Skipped(String),
    Failed(String),
}

/// How the device half of the quit ended. The app turns it into the process's exit code
/// (`app/exit_code.rs`); nothing below the app layer defines exit codes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceRelease {
    /// Every step ran and succeeded (or there was no device): returning from `main` is safe.
    #[default]
    Clean,
    /// The GPU did not answer or failed: the process must leave with `_exit`, so that no atexit
    /// handler can wait on it.
    Abandoned,
}

/// The device's read bandwidth as measured by `Gpu::measure_read_bandwidth` (`gpu/handle/transfer.rs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReadBandwidth {
    /// Bytes per second.
    pub bytes_per_s: f64,
    /// The buffer read by each launch.
    pub buffer_bytes: u64,
    /// Timed runs, the fastest of which gave the figure.
    pub runs: usize,
}
