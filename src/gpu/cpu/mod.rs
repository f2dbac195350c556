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
/// The MoE routing of one token, the reference the GPU's routing kernel is held to
/// (tests/it/kernel_emulation.rs).
pub use backend::moe::{route as moe_route, route_softmax_weight as moe_route_softmax_weight};
pub use options::CpuOptions;
pub use track::CPU_STREAM;
