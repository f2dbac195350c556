//! The tuning knobs: switches for measuring one code path against another, which only the
//! environment sets. The resolver (`settings.rs`) reads them once ([`Tuning::from_env`], beside
//! the config errors it reports) and every command passes them down as options; this file is
//! the type and its options, below `config.rs` (which carries them) and `settings.rs`.

use crate::gpu::compute::{ComputeOptions, KvType, PrefillGemm};
use crate::gpu::cpu::CpuOptions;
use crate::gpu::quant::dot::Isa;
use crate::gpu::trace::device::TraceEvents;

/// Switches for measuring one code path against another, set only by the environment (they
/// are for benchmarks and studies, not for use): resolved here once and passed down as options
/// (`CpuOptions`, `ComputeOptions`), so that nothing below the app reads the environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// `HIPSCOPE_CPU_ISA` (scalar, avx2, avx512): the CPU kernels' instruction set, lower than
    /// the best this CPU runs, for comparing kernels in `bench`.
    pub cpu_isa: Isa,
    /// `HIPSCOPE_CPU_REPACK=0`: the CPU backend does not repack weights (for comparisons).
    pub cpu_repack: bool,
    /// `HIPSCOPE_PREFILL_GEMM` (auto, blas, own, f32): which GEMM multiplies prompt batches.
    pub prefill: PrefillGemm,
    /// `HIPSCOPE_GEMM_MIN_TOKENS`: the batch size from which matrix products take the GEMM path.
    pub gemm_min_tokens: Option<usize>,
    /// `HIPSCOPE_MV_ACT=f32`: the one-token products take f32 activations where they can.
    pub mv_act_f32: bool,
    /// `HIPSCOPE_TRACE_EVENTS=stamps|pairs|ends`: how the tracer times a GPU op — kernels by
    /// their own stamps and other ops by two timed events (the default), every op by two events,
    /// or every op by one (what each costs: `scripts/device/trace-check.sh`).
    pub trace_events: TraceEvents,
    /// Launch overlap (CUDA's programmatic dependent launch, sm_90 and later): on by default
    /// since an H100 measured it right (`selftest --compute`) and faster (docs/PERFORMANCE.md,
    /// 2026-12-07); `HIPSCOPE_PDL=0` turns it off.
    pub launch_overlap: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            cpu_isa: Isa::detect(),
            cpu_repack: true,
            prefill: PrefillGemm::Auto,
            gemm_min_tokens: None,
            mv_act_f32: false,
            trace_events: TraceEvents::Stamps,
            launch_overlap: true,
        }
    }
}

impl Tuning {
    /// The CPU backend's options with `threads` threads (0: every core).
    pub fn cpu(&self, threads: usize) -> CpuOptions {
        CpuOptions {
            threads,
            isa: self.cpu_isa,
            repack: self.cpu_repack,
        }
    }

    /// The GPU backend's options with a KV cache of `kv` and graph replay as `graphs` says.
    pub fn compute(&self, kv: KvType, graphs: bool) -> ComputeOptions {
        let d = ComputeOptions::default();
        ComputeOptions {
            kv,
            graphs,
            prefill: self.prefill,
            gemm_min_tokens: self.gemm_min_tokens.unwrap_or(d.gemm_min_tokens),
            mv_act_f32: self.mv_act_f32,
            trace_events: self.trace_events,
            launch_overlap: self.launch_overlap,
            ..d
        }
    }
}
