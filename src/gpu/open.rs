//! Opening the backend a user asked for — the CPU, or a GPU (chosen by `select.rs`) with the
//! compute backend on it — shared by the headless commands and the chat's worker. `auto` tries
//! HIP, then CUDA, then the CPU, and falls back to the CPU when a GPU is found but cannot be prepared (its kernels fail to
//! compile, say); an explicit GPU choice that fails is an error naming why.
//!
//! The process's one watchdog starts here, with the device: on the opened backend's stream (a
//! GPU's, or the CPU backend's own ops), owned by the backend, so that it watches everything the
//! device does — load, prompts, answers, idle, the quit's drain — until the backend is dropped.

use std::io::Write;
use std::sync::Arc;

use crate::gpu::backend::Backend;
use crate::gpu::compute::{ComputeOptions, GpuCompute};
use crate::gpu::cpu::{CpuBackend, CpuOptions};
use crate::gpu::device::{DeviceInfo, RuntimeKind};
use crate::gpu::kernels::{CompileProgress, KernelCache};
use crate::gpu::select::{BackendChoice, Selected, select};
use crate::gpu::snapshot::WatchState;
use crate::gpu::watchdog::{WatchConfig, WatchEvent, WatchSink, Watchdog};

/// What to open.
#[derive(Clone, Debug)]
pub struct BackendRequest {
    pub choice: BackendChoice,
    /// GPU number as the runtime counts them; `None`: the largest discrete GPU.
    pub device: Option<u32>,
    /// How the CPU backend computes (threads, kernels), where the CPU runs the model.
    pub cpu: CpuOptions,
    pub compute: ComputeOptions,
}

/// Opens the backend and starts the watchdog on it, reporting to `sink`; the sentence that comes
/// with it says which one and why (it is also the `reason` of the backend's `DeviceSummary`).
/// A GPU's kernels are compiled (or taken from the cache) meanwhile, `progress` hearing how far a
/// first start's compile has got.
pub fn open(
    req: &BackendRequest,
    sink: WatchSink,
    progress: &mut dyn FnMut(&CompileProgress),
) -> Result<(Box<dyn Backend>, String), String> {
    let (mut backend, said) = open_backend(req, progress)?;
    if let Some((shared, info)) = backend.watch_target() {
        match Watchdog::spawn(shared, &info, WatchConfig::default(), sink) {
            Ok(dog) => backend.keep_watchdog(dog),
            // Not fatal: everything works, only unwatched; the log says so.
            Err(e) => tracing::error!("cannot start the watchdog thread: {e}"),
        }
    }
    Ok((backend, said))
}

/// A sink for the headless commands: a hang is said on stderr, with the report's path.
pub fn hangs_to_stderr() -> WatchSink {
    Box::new(|ev| {
        if let WatchEvent::Hung { snapshot: s, .. } = ev
            && s.state == WatchState::Hung
        {
            let report = match (&s.report, &s.report_error) {
                (Some(p), _) => format!("report written to {}", p.display()),
                (None, Some(e)) => format!("no report: {e}"),
                (None, None) => "no report".into(),
            };
            // Not `eprintln!`: on a closed stderr that panics, here on the watchdog's thread.
            let _ = writeln!(
                std::io::stderr(),
                "hipscope: HUNG: {} has not finished after {:.1} s (budget {:.1} s) on {}; {report}",
                s.op.as_deref().unwrap_or("an op"),
                s.age.as_secs_f64(),
                s.budget.as_secs_f64(),
                s.stream
            );
        }
    })
}

fn open_backend(
    req: &BackendRequest,
    progress: &mut dyn FnMut(&CompileProgress),
) -> Result<(Box<dyn Backend>, String), String> {
    let cpu = |reason: String| -> (Box<dyn Backend>, String) {
        let b = CpuBackend::with_options(&req.cpu, &reason).with_kv_type(req.compute.kv);
        let said = format!("cpu, {} threads ({reason})", b.n_threads());
        (Box::new(b), said)
    };
    if req.choice == BackendChoice::Fake {
        return Err("--backend fake is a test device that cannot run a model".into());
    }
    let sel =
        select(req.choice, req.device).map_err(|e| format!("--backend {}: {e}", req.choice))?;
    match sel {
        Selected::Cpu { reason } => Ok(cpu(reason)),
        Selected::Gpu { backend, reason } => {
            match GpuCompute::open_with(
                backend,
                &reason,
                req.compute,
                &KernelCache::default_location(),
                progress,
            ) {
                Ok(g) => {
                    let prefill = g
                        .prefill_path()
                        .map_or_else(|e| e.to_string(), |p| p.to_string());
                    let said = format!(
                        "{reason}; KV cache {}; prefill {prefill}",
                        g.options().kv.name()
                    );
                    Ok((Box::new(g), said))
                }
                Err(e) if req.choice == BackendChoice::Auto => Ok(cpu(format!(
                    "{reason}, but the GPU could not be prepared: {e}; using the CPU"
                ))),
                Err(e) => Err(format!("{reason}: {e}")),
            }
        }
    }
}

/// A watchdog sink for each GPU opened beside the first (each GPU has its own watchdog).
pub type SinkMaker = Arc<dyn Fn() -> WatchSink + Send + Sync>;

type ListFn = dyn Fn(&DeviceInfo) -> Vec<DeviceInfo> + Send + Sync;
type OpenFn = dyn Fn(&DeviceInfo, WatchSink) -> Result<Box<dyn Backend>, String> + Send + Sync;

/// The other GPUs of an opened backend's runtime, for a model split over several
/// (`--split-mode layer`, `model/split/`): listed when asked, each opened — its kernels compiled
/// or taken from the cache, its own watchdog started — only when the split takes it.
#[derive(Clone)]
pub struct MoreGpus {
    list: Arc<ListFn>,
    open: Arc<OpenFn>,
    sink: SinkMaker,
}

impl std::fmt::Debug for MoreGpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MoreGpus")
    }
}

impl MoreGpus {
    /// From a lister (the devices beside the one given) and an opener (tests: CPU backends in
    /// the GPUs' place).
    pub fn new(
        list: impl Fn(&DeviceInfo) -> Vec<DeviceInfo> + Send + Sync + 'static,
        open: impl Fn(&DeviceInfo, WatchSink) -> Result<Box<dyn Backend>, String>
        + Send
        + Sync
        + 'static,
    ) -> MoreGpus {
        MoreGpus {
            list: Arc::new(list),
            open: Arc::new(open),
            sink: Arc::new(hangs_to_stderr),
        }
    }

    /// The runtime's other devices, each opened as `req` says (the same options, the device's
    /// runtime named).
    pub fn for_request(req: &BackendRequest) -> MoreGpus {
        let req = req.clone();
        MoreGpus::new(
            |main| {
                let all = match main.backend {
                    Some(RuntimeKind::Hip) => crate::gpu::hip::probe(),
                    Some(RuntimeKind::Cuda) => crate::gpu::cuda::probe(),
                    _ => Ok(Vec::new()),
                };
                let mut v: Vec<DeviceInfo> = all
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|d| d.ordinal != main.ordinal && !d.integrated)
                    .collect();
                v.sort_by_key(|d| d.ordinal);
                v
            },
            move |d, sink| {
                let mut r = req.clone();
                r.choice = match d.backend {
                    Some(RuntimeKind::Hip) => BackendChoice::Hip,
                    Some(RuntimeKind::Cuda) => BackendChoice::Cuda,
                    _ => return Err("not a GPU of a known runtime".into()),
                };
                r.device = Some(d.ordinal);
                open(&r, sink, &mut |_| {}).map(|(b, _)| b)
            },
        )
    }

    /// Each GPU opened from now on reports its watchdog's events to a sink made by `sink`.
    pub fn with_sink(mut self, sink: SinkMaker) -> MoreGpus {
        self.sink = sink;
        self
    }

    /// The devices beside `main`, in the runtime's order.
    pub fn others(&self, main: &DeviceInfo) -> Vec<DeviceInfo> {
        (self.list)(main)
    }

    /// Opens `device`, its watchdog started.
    pub fn open(&self, device: &DeviceInfo) -> Result<Box<dyn Backend>, String> {
        (self.open)(device, (self.sink)())
    }
}
