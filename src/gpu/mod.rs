//! The device layer: quant block formats, the CPU reference backend, and (at run time) the HIP and
//! CUDA backends with their stream, arena and watchdog. Imports nothing from `model/`, `ui/` or
//! `app/`.

pub mod arena;
pub mod backend;
pub mod compute;
pub mod context;
pub mod cpu;
pub mod cuda;
pub mod device;
pub mod dirs;
pub mod fake;
pub mod fatal_signal;
pub mod hip;
pub mod kernels;
pub mod quant;
pub mod select;
pub mod stats;
pub mod stream;
pub mod upload;
pub mod watchdog;
