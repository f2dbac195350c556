//! The CPU backend: the numerical reference for the GPU backends, multi-threaded.

mod activation;
mod attention;
mod backend;
pub mod bandwidth;
mod exp;
pub mod kv_shift;
pub mod matmul;
mod options;
pub mod pool;
mod track;

pub use crate::gpu::telemetry::host::{cpu_name, host_memory, simd_features};
pub use backend::CpuBackend;
pub use options::CpuOptions;
pub use track::CPU_STREAM;
