//! What every selftest check shares: its options, the result row, and opening the device with
//! its kernels.

use std::time::{Duration, Instant};

use crate::app::cmd::usage::outln;
use crate::gpu::device::human_bytes;
use crate::gpu::handle::{Gpu, GpuConfig};
use crate::gpu::kernels::{BuildStatus, CompileMode, KernelCache};
use crate::gpu::select::{BackendChoice, Selected, select};

/// How often the event prober asks about events (the app's setting; breadcrumbs give finer
/// progress without any runtime call).
pub(super) const PROBE_INTERVAL: Duration = Duration::from_millis(5);

/// Selftest settings (from the CLI).
#[derive(Clone, Debug)]
pub struct SelftestOptions {
    pub backend: BackendChoice,
    pub device: Option<u32>,
    /// Decode steps per overhead round.
    pub steps: usize,
    pub no_cache: bool,
    /// A hidden child scenario (`hang`, `quit`).
    pub child: Option<String>,
}

/// One line of the result table.
pub(super) struct Row {
    pub(super) check: &'static str,
    pub(super) pass: bool,
    pub(super) detail: String,
}

pub(super) fn row<E: std::fmt::Display>(check: &'static str, r: Result<(bool, String), E>) -> Row {
    match r {
        Ok((pass, detail)) => Row {
            check,
            pass,
            detail,
        },
        Err(e) => Row {
            check,
            pass: false,
            detail: format!("error: {e}"),
        },
    }
}

/// Kernel compilation: hiprtc in a child process (it can abort), nvrtc in process.
pub(super) fn compile_mode(gpu: &Gpu) -> CompileMode {
    match gpu.kind() {
        crate::gpu::device::RuntimeKind::Hip => CompileMode::isolated(),
        _ => CompileMode::InProcess,
    }
}

pub(super) fn cache(opts: &SelftestOptions) -> KernelCache {
    if opts.no_cache {
        KernelCache::disabled()
    } else {
        KernelCache::default_location()
    }
}

/// Opens the device and loads the kernels; prints what it found unless `quiet`.
pub(super) fn open(opts: &SelftestOptions, quiet: bool) -> Result<(Gpu, String), String> {
    let sel = select(opts.backend, opts.device).map_err(|e| e.to_string())?;
    let (backend, reason) = match sel {
        Selected::Gpu { backend, reason } => (backend, reason),
        Selected::Cpu { reason } => {
            return Err(format!("no GPU to test ({reason})"));
        }
    };
    let mut gpu = Gpu::open(backend, GpuConfig::default()).map_err(|e| e.to_string())?;
    if !quiet {
        let i = gpu.info().clone();
        outln!("device    {} [{}] ({})", i.name, i.arch, i.arch_source);
        outln!(
            "          {} memory, {} compute units, warp {}, {}",
            human_bytes(i.total_memory),
            i.compute_units,
            i.warp_size,
            if i.integrated {
                "integrated"
            } else {
                "discrete"
            }
        );
        outln!(
            "          driver {}; runtime {}",
            i.driver_version,
            i.runtime_version
        );
        outln!("chosen    {reason}");
        for n in &i.notes {
            outln!("note      {n}");
        }
    }
    let t = Instant::now();
    let mode = compile_mode(&gpu);
    let units = crate::gpu::compute::scope_units(crate::gpu::compute::KernelScope::All)
        .map_err(|e| e.to_string())?;
    let builds = gpu
        .prepare_kernels(&cache(opts), &mode, &units, &mut |_| {})
        .map_err(|e| e.to_string())?;
    if !quiet {
        let compiled = builds
            .iter()
            .filter(|b| matches!(b.status, BuildStatus::Compiled { .. }))
            .count();
        outln!(
            "kernels   {} modules for {} ({} compiled, {} from cache) in {:.0} ms",
            builds.len(),
            gpu.info().arch,
            compiled,
            builds.len() - compiled,
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok((gpu, reason))
}

/// A line for the parent to read as soon as it is written (children's `@event | key=value` lines).
pub(super) fn print_flush(s: &str) {
    // `write_out` flushes each write.
    outln!("{s}");
}
