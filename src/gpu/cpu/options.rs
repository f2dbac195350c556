//! How the CPU backend computes, decided once at the app edge (flags, config file, environment:
//! `app/settings.rs`) and passed down, so that nothing below reads the environment.

use crate::gpu::quant::dot::Isa;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuOptions {
    /// Threads (0: one per available core).
    pub threads: usize,
    /// The kernels' instruction set: the fastest this CPU runs ([`Isa::detect`]) unless a lower
    /// one was asked for (`HIPSCOPE_CPU_ISA`, for comparing kernels in `bench`).
    pub isa: Isa,
    /// Weights repacked for the packed GEMM at their first product (`HIPSCOPE_CPU_REPACK=0`
    /// turns it off, for comparisons; its accuracy against llama.cpp's own logits equals the
    /// portable kernels', docs/PERFORMANCE.md, "Repacked weights").
    pub repack: bool,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            threads: 0,
            isa: Isa::detect(),
            repack: true,
        }
    }
}
