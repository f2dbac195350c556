//! Opening the backend a user asked for — the CPU, or a GPU (chosen by `select.rs`) with the
//! compute backend on it — shared by the headless commands and the chat's worker. `auto` tries
//! HIP, then CUDA, then the CPU, and falls back to the CPU when a GPU is found but cannot be prepared (its kernels fail to
//! compile, say); an explicit GPU choice that fails is an error naming why.
//!
//! The process's one watchdog starts here, with the device: on the opened backend's stream (a
//! GPU's, or the CPU backend's own ops), owned by the backend, so that it watches everything the
//! device does — load, prompts, answers, idle, the quit's drain — until the backend is dropped.

use crate::gpu::backend::Backend;
use crate::gpu::compute::{ComputeOptions, GpuCompute};
use crate::gpu::cpu::CpuBackend;
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
    /// CPU threads (0: every core).
    pub threads: usize,
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
            eprintln!(
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
        let b = CpuBackend::with_reason(req.threads, &reason).with_kv_type(req.compute.kv);
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
