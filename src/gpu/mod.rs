//! The device layer, bottom to top:
//! - plain types: `snapshot` (what the UI is shown), `device` (the runtime interface, its ids and
//!   errors), `checksum`, `dirs` and `atomic_file` (hipscope's folders, and how every file it
//!   writes is written: whole or not at all, private), `quant` (block formats and their CPU
//!   reference);
//! - runtimes, one folder or file each: `hip/`, `cuda/`, `fake` (the scripted test device), with
//!   `kernels` (the `.hip` sources, run-time compilation and its cache);
//! - mechanisms on one opened device: `stream`, `arena`, `watchdog`, and `handle/` ([`Gpu`], the
//!   handle that owns them);
//! - backends, what the forward pass runs on (`backend::Backend`): `cpu/` and `compute/` (the
//!   GPU one, over [`Gpu`]);
//! - choosing and opening: `select` (which runtime and device), `open` (the backend a user asked
//!   for);
//! - readings of the machine: `telemetry/` (sysfs, hwmon, `gpu_metrics`, KFD, fdinfo, `/proc`,
//!   NVML: one file per source, a sampler thread), `doctor/` (facts, known-issue rules, report).
//!
//! Imports nothing from `model/`, `ui/` or `app/`; no file here imports one above it.

pub mod arena;
pub mod atomic_file;
pub mod backend;
pub mod budget;
pub mod checksum;
pub mod compute;
pub mod cpu;
pub mod cuda;
pub mod device;
pub mod dirs;
pub mod doctor;
pub mod fake;
pub mod fault;
pub mod handle;
pub mod hip;
pub mod kernels;
pub mod open;
pub mod quant;
pub mod rope;
pub mod select;
pub mod snapshot;
pub mod stream;
pub mod telemetry;
#[cfg(test)]
mod test_rng;
pub mod trace;
pub mod watchdog;

pub use handle::{Gpu, GpuConfig};
