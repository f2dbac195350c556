//! The CPU backend: the numerical reference for the GPU backends, multi-threaded.

mod attention;
mod backend;
pub mod bandwidth;
mod exp;
mod host;
pub mod matmul;
pub mod pool;

pub use backend::CpuBackend;
pub use host::{HostSampler, cpu_name, host_memory, simd_features};
