//! Running work on the device: loading kernels, launching them (every launch labelled and
//! tracked), the GEMM path (BLAS or hipscope's own `hs_sgemm`), fills and device-to-device copies.

use std::ffi::c_void;

use super::{Arg, GemmPath, Gpu, KernelFn, SpinOnFlag};
use crate::gpu::arena::{DeviceBuffer, Region};
use crate::gpu::device::{BlasAvailability, Device, DevicePtr, GemmF32, GpuError, Op, RawFunction};
use crate::gpu::kernels::{
    self, CompileMode, CompileProgress, KernelBuild, KernelCache, KernelUnit,
};
use crate::gpu::stream::{Budget, LabelId, OpKind};
use crate::gpu::trace::{self, device::TraceEvents};

const MAX_ARGS: usize = 32;

impl Gpu {
    /// Loads compiled modules and finds each one's kernels.
    pub fn load_modules(&mut self, modules: &[kernels::CompiledModule]) -> Result<(), GpuError> {
        self.check_alive()?;
        for m in modules {
            let r = self.backend.load_module(&m.image);
            let raw = self.guard(r)?;
            self.modules.push((m.name.clone(), raw));
            for k in &m.kernels {
                let r = self.backend.get_function(raw, k);
                let f = self.guard(r)?;
                let id = KernelFn(self.functions.len() as u32);
                self.functions.push((k.clone(), f));
                self.stamped_fns.push(false);
                self.by_name.insert(k.clone(), id);
            }
        }
        Ok(())
    }

    /// Compiles (or loads from the cache) `units` for this device and loads them, telling
    /// `progress` how a compile goes. The units come from `compute::units` (what a model, or the
    /// doctor, launches).
    pub fn prepare_kernels(
        &mut self,
        cache: &KernelCache,
        mode: &CompileMode,
        units: &[KernelUnit],
        progress: &mut dyn FnMut(&CompileProgress),
    ) -> Result<Vec<KernelBuild>, GpuError> {
        let compiler = crate::gpu::select::compiler_for(self.kind())?;
        let arch = self.info().arch.clone();
        if arch.is_empty() {
            return Err(GpuError::UnsupportedTarget {
                compiler: compiler.id(),
                arch: "(unknown)".into(),
                reason: self.info().arch_source.clone(),
            });
        }
        // Units already loaded (a first need after the open) are not loaded twice.
        let todo: Vec<KernelUnit> = units
            .iter()
            .filter(|u| !self.modules.iter().any(|m| m.0 == u.name))
            .cloned()
            .collect();
        // The stamped build (kernels/prelude.h, `HS_STAMPS`) when a trace or a profile is on or
        // asked for: its own cache entries (the text differs), its kernels marked as able to
        // time themselves.
        let stamped =
            self.cfg.trace_events == TraceEvents::Stamps && trace::stamped_kernels_wanted();
        let todo: Vec<KernelUnit> = if stamped {
            todo.into_iter().map(KernelUnit::stamped).collect()
        } else {
            todo
        };
        let builds = kernels::build_all(compiler.as_ref(), &arch, &todo, cache, mode, progress);
        let modules = kernels::into_modules(builds.clone(), &todo)?;
        let first = self.functions.len();
        self.load_modules(&modules)?;
        if stamped {
            self.stamped_fns[first..].fill(true);
            self.any_stamped = true;
        }
        Ok(builds)
    }

    /// A loaded kernel by name (`hs_sgemm`).
    pub fn function(&self, name: &str) -> Result<KernelFn, GpuError> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| GpuError::UnknownKernel {
                kernel: name.to_string(),
                loaded: self
                    .modules
                    .iter()
                    .map(|m| m.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    pub(super) fn setup_gemm(&mut self, workspace: Option<DeviceBuffer>) -> Result<(), GpuError> {
        let path = match (self.backend.blas_availability(), workspace) {
            (BlasAvailability::Present { library }, Some(ws)) => {
                let r = self.backend.create_blas();
                let h = self.guard(r)?;
                self.blas = Some(h);
                // SAFETY: the workspace lives in the arena, which outlives the handle (teardown
                // destroys BLAS handles before it frees the arena).
                let r = unsafe { self.backend.blas_set_workspace(h, ws.ptr, ws.bytes) };
                self.guard(r)?;
                let r = self.backend.blas_stream_is_ours(h);
                if !self.guard(r)? {
                    return Err(GpuError::InvalidArgument(
                        "the BLAS handle is not bound to our stream after set_stream".into(),
                    ));
                }
                GemmPath::Blas { library }
            }
            (BlasAvailability::Absent { reason }, _) => {
                // Said once, here; the UI shows it from `gemm_path()`.
                tracing::info!("GEMM: {reason}; using hipscope's own hs_sgemm kernel");
                GemmPath::Fallback { reason }
            }
            (BlasAvailability::Present { library }, None) => GemmPath::Fallback {
                reason: format!("{library} has no workspace"),
            },
        };
        self.gemm_path = path;
        Ok(())
    }

    pub fn gemm_path(&self) -> &GemmPath {
        &self.gemm_path
    }

    /// Launches a kernel with the default budget. Every hipscope kernel takes the breadcrumb
    /// pointer and its op seq first; `args` are the rest.
    pub fn launch(
        &mut self,
        label: LabelId,
        f: KernelFn,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        args: &[Arg],
    ) -> Result<u64, GpuError> {
        self.launch_budgeted(label, f, grid, block, shared_bytes, args, None)
    }

    /// Launches `hs_spin_on_flag` (one block, compiled with the other kernels) labelled `label`:
    /// it spins until the host sets the returned [`SpinOnFlag::flag`] or `max_polls` polls pass
    /// (a guard for a shared GPU), then writes 1 (released) or 2 (gave up) to
    /// [`SpinOnFlag::result`]. The stand-in for an op that runs long or never finishes, for the
    /// watchdog and quit checks.
    pub fn launch_spin_on_flag(
        &mut self,
        label: &str,
        budget: Option<Budget>,
        max_polls: u64,
    ) -> Result<SpinOnFlag, GpuError> {
        let f = self.function("hs_spin_on_flag")?;
        let flag = self.alloc_host_word()?;
        let result = self.alloc(Region::Activations, 4)?;
        let label = self.label(label);
        let dev = self.host_word_device(flag)?;
        self.launch_budgeted(
            label,
            f,
            [1, 1, 1],
            [32, 1, 1],
            0,
            &[Arg::Ptr(dev), Arg::U64(max_polls), result.into()],
            budget,
        )?;
        Ok(SpinOnFlag {
            flag,
            result,
            label,
        })
    }

    /// As [`Gpu::launch`], with this op's own watchdog budget.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_budgeted(
        &mut self,
        label: LabelId,
        f: KernelFn,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        args: &[Arg],
        budget: Option<Budget>,
    ) -> Result<u64, GpuError> {
        // Inside a step being recorded for graph replay, the launch is deferred (graph.rs).
        if self.graph_record_kernel(label, f, grid, block, shared_bytes, args, budget)? {
            return Ok(self.stream.last_seq());
        }
        self.launch_now(label, f, grid, block, shared_bytes, args, budget)
    }

    pub(super) fn raw_function(&self, f: KernelFn) -> Result<RawFunction, GpuError> {
        self.functions
            .get(f.0 as usize)
            .map(|x| x.1)
            .ok_or_else(|| GpuError::InvalidArgument(format!("kernel handle {}", f.0)))
    }

    /// Enqueues a launch now, tracked (never deferred into a graph).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_now(
        &mut self,
        label: LabelId,
        f: KernelFn,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        args: &[Arg],
        budget: Option<Budget>,
    ) -> Result<u64, GpuError> {
        let raw = self.raw_function(f)?;
        if args.len() + 2 > MAX_ARGS {
            return Err(GpuError::InvalidArgument(format!(
                "{} kernel arguments (at most {})",
                args.len(),
                MAX_ARGS - 2
            )));
        }
        if grid.contains(&0) || block.contains(&0) {
            return Err(GpuError::InvalidArgument(format!(
                "empty launch grid {grid:?} block {block:?}"
            )));
        }
        // Only a kernel of the stamped build may be launched stamped (its plain build would
        // take the stamp block for the breadcrumb).
        let stampable = self.stamped_fns.get(f.0 as usize).copied().unwrap_or(false);
        self.enqueue_traced(
            OpKind::Kernel,
            label,
            budget,
            0,
            stampable,
            |be, op, crumb| launch_raw(be, raw, grid, block, shared_bytes, crumb, op, args),
        )
    }

    /// `C = alpha·op(A)·op(B) + beta·C` through BLAS, or hipscope's kernel when BLAS is absent.
    pub fn gemm_f32(&mut self, label: LabelId, g: &GemmF32) -> Result<u64, GpuError> {
        g.validate().map_err(GpuError::InvalidArgument)?;
        match (&self.gemm_path, self.blas) {
            (GemmPath::Blas { .. }, Some(h)) => {
                if cfg!(debug_assertions) {
                    let r = self.backend.blas_stream_is_ours(h);
                    let ours = self.guard(r)?;
                    debug_assert!(ours, "the BLAS handle's stream is no longer ours");
                }
                self.enqueue(OpKind::Blas, label, None, |be, _, _| {
                    // SAFETY: the caller's buffers come from the arena; shapes were validated.
                    unsafe { be.sgemm(h, g) }
                })
            }
            (GemmPath::NotReady, _) => Err(GpuError::InvalidArgument(
                "GEMM is not set up: create the arena first".into(),
            )),
            _ => self.gemm_f32_fallback(label, g),
        }
    }

    /// The BLAS library that multiplies f16 inputs into f32 (cublasGemmEx, rocblas_gemm_ex), if
    /// the GEMM path is (or, before the arena exists, will be) that BLAS and it has one.
    pub fn blas_f16(&self) -> Option<String> {
        let library = match (&self.gemm_path, self.backend.blas_availability()) {
            (GemmPath::Blas { library }, _) => library.clone(),
            (GemmPath::NotReady, BlasAvailability::Present { library }) => library,
            _ => return None,
        };
        self.backend.blas_has_f16().then_some(library)
    }

    /// `gemm_f32`'s contract with A and B holding f16 (f32 C, f32 accumulation), through the
    /// BLAS; an error where [`Gpu::blas_f16`] is `None`.
    pub fn gemm_f16_blas(&mut self, label: LabelId, g: &GemmF32) -> Result<u64, GpuError> {
        g.validate().map_err(GpuError::InvalidArgument)?;
        match (&self.gemm_path, self.blas) {
            (GemmPath::Blas { .. }, Some(h)) if self.backend.blas_has_f16() => {
                self.enqueue(OpKind::Blas, label, None, |be, _, _| {
                    // SAFETY: the caller's buffers come from the arena; shapes were validated.
                    unsafe { be.gemm_f16(h, g) }
                })
            }
            _ => Err(GpuError::InvalidArgument(
                "no BLAS with an f16 GEMM is set up on this device".into(),
            )),
        }
    }

    /// hipscope's own f16 matrix kernel (`hs_gemm_f16`, kernels/gemm.hip): `C = op(A)·op(B)` with
    /// A and B f16, C f32, for transa = T and transb = N only (both operands k-contiguous), k a
    /// multiple of 32, lda and ldb multiples of 8 and A and B 16-byte aligned; alpha and beta
    /// are not read (1 and 0).
    pub fn gemm_f16_own(&mut self, label: LabelId, g: &GemmF32) -> Result<u64, GpuError> {
        g.validate().map_err(GpuError::InvalidArgument)?;
        if g.transa != Op::T || g.transb != Op::N {
            return Err(GpuError::InvalidArgument(format!(
                "hs_gemm_f16 takes transa T and transb N, not {:?}{:?}",
                g.transa, g.transb
            )));
        }
        if g.k % 32 != 0
            || g.lda % 8 != 0
            || g.ldb % 8 != 0
            || !g.a.0.is_multiple_of(16)
            || !g.b.0.is_multiple_of(16)
        {
            return Err(GpuError::InvalidArgument(format!(
                "hs_gemm_f16 needs k a multiple of 32 (got {}), lda and ldb multiples of 8 (got \
                 {} and {}) and 16-byte aligned operands",
                g.k, g.lda, g.ldb
            )));
        }
        if g.m == 0 || g.n == 0 {
            return Ok(self.stream.last_seq());
        }
        let f = self.function("hs_gemm_f16")?;
        // A 64 × 64 block of C per 128 threads (HS_MM_BM, HS_MM_BN, HS_MM_THREADS).
        let grid = [(g.m as u32).div_ceil(64), (g.n as u32).div_ceil(64), 1];
        self.launch(
            label,
            f,
            grid,
            [128, 1, 1],
            0,
            &[
                Arg::I32(g.m),
                Arg::I32(g.n),
                Arg::I32(g.k),
                Arg::Ptr(g.a),
                Arg::I32(g.lda),
                Arg::Ptr(g.b),
                Arg::I32(g.ldb),
                Arg::Ptr(g.c),
                Arg::I32(g.ldc),
            ],
        )
    }

    /// hipscope's own GEMM kernel, whatever BLAS is available (also used to test it).
    pub fn gemm_f32_fallback(&mut self, label: LabelId, g: &GemmF32) -> Result<u64, GpuError> {
        g.validate().map_err(GpuError::InvalidArgument)?;
        if g.m == 0 || g.n == 0 {
            return Ok(self.stream.last_seq());
        }
        let f = self.function("hs_sgemm")?;
        let op = |o: Op| if o == Op::T { 1 } else { 0 };
        let grid = [(g.m as u32).div_ceil(16), (g.n as u32).div_ceil(16), 1];
        self.launch(
            label,
            f,
            grid,
            [16, 16, 1],
            0,
            &[
                Arg::I32(op(g.transa)),
                Arg::I32(op(g.transb)),
                Arg::I32(g.m),
                Arg::I32(g.n),
                Arg::I32(g.k),
                Arg::Ptr(g.alpha),
                Arg::Ptr(g.a),
                Arg::I32(g.lda),
                Arg::Ptr(g.b),
                Arg::I32(g.ldb),
                Arg::Ptr(g.beta),
                Arg::Ptr(g.c),
                Arg::I32(g.ldc),
            ],
        )
    }

    /// Fills a buffer with a 32-bit pattern (our kernel: hipMemset would use the null stream).
    pub fn fill_u32(
        &mut self,
        label: LabelId,
        dst: DeviceBuffer,
        value: u32,
    ) -> Result<u64, GpuError> {
        let f = self.function("hs_fill_u32")?;
        let words = dst.bytes / 4;
        let blocks = words.div_ceil(256).clamp(1, 4096) as u32;
        self.launch(
            label,
            f,
            [blocks, 1, 1],
            [256, 1, 1],
            0,
            &[dst.into(), Arg::U64(words), Arg::U32(value)],
        )
    }

    pub fn copy_d2d(
        &mut self,
        label: LabelId,
        dst: DeviceBuffer,
        src: DeviceBuffer,
        bytes: u64,
    ) -> Result<u64, GpuError> {
        if bytes > dst.bytes || bytes > src.bytes {
            return Err(GpuError::InvalidArgument(format!(
                "copy of {bytes} bytes between buffers of {} and {}",
                src.bytes, dst.bytes
            )));
        }
        if self.graph_record_copy(label, dst, src, bytes)? {
            return Ok(self.stream.last_seq());
        }
        self.copy_d2d_now(label, dst, src, bytes)
    }

    pub(super) fn copy_d2d_now(
        &mut self,
        label: LabelId,
        dst: DeviceBuffer,
        src: DeviceBuffer,
        bytes: u64,
    ) -> Result<u64, GpuError> {
        self.enqueue_traced(OpKind::CopyD2D, label, None, bytes, false, |be, _, _| {
            // SAFETY: both ranges lie in arena buffers (checked sizes above).
            unsafe { be.copy_d2d(dst.ptr, src.ptr, bytes as usize) }
        })
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn launch_raw(
    be: &mut dyn Device,
    f: RawFunction,
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
    crumb: DevicePtr,
    seq: u64,
    args: &[Arg],
) -> Result<(), GpuError> {
    // Each argument lives in its own 8-byte slot; the runtime copies as many bytes from each as
    // the kernel's parameter takes, which on little-endian targets are the low bytes.
    const _: () = assert!(cfg!(target_endian = "little"));
    let mut vals = [0u64; MAX_ARGS];
    vals[0] = crumb.0;
    vals[1] = seq;
    for (i, a) in args.iter().enumerate() {
        vals[i + 2] = match *a {
            Arg::Ptr(p) => p.0,
            Arg::U32(v) => v as u64,
            Arg::I32(v) => v as u32 as u64,
            Arg::U64(v) => v,
            Arg::F32(v) => v.to_bits() as u64,
        };
    }
    let n = args.len() + 2;
    let mut ptrs = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
    for i in 0..n {
        ptrs[i] = (&mut vals[i]) as *mut u64 as *mut c_void;
    }
    // SAFETY: every hipscope kernel takes (crumb pointer, u64 op) and then `args` in order
    // (HS_TRACK_PARAMS); the values outlive the call, which copies them.
    unsafe { be.launch(f, grid, block, shared_bytes, &mut ptrs[..n]) }
}
