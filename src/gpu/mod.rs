//! The device layer: quant block formats, the CPU reference backend, and (at run time) the HIP and
//! CUDA backends with their stream, arena and watchdog. Imports nothing from `model/`, `ui/` or
//! `app/`.

pub mod backend;
pub mod cpu;
pub mod quant;
pub mod stats;
