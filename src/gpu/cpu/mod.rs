//! The CPU backend: the numerical reference for the GPU backends, multi-threaded.

mod backend;
mod host;
pub mod kv_shift;
pub mod matmul;
pub mod pool;

pub use backend::CpuBackend;
pub use host::{HostSampler, cpu_name, host_memory, simd_features};
