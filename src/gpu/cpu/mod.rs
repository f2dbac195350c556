//! The CPU backend: the numerical reference for the GPU backends.

pub mod matmul;
pub mod pool;
