//! [`Gpu`]: one opened device with its tracked stream, arena, staging buffers, loaded kernels and
//! GEMM path, owned by the inference worker. Every op is labelled and tracked; no call waits
//! without a deadline; after a runtime error the device is poisoned and no further GPU call is
//! made. [`Gpu::teardown`] is the device half of the quit protocol.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::gpu::arena::{Arena, ArenaPlan, DeviceBuffer, Region};
use crate::gpu::device::{
    BackendKind, BlasAvailability, Device, DeviceInfo, DevicePtr, EventProbe, GemmF32, GpuError,
    MemInfo, Op, PinnedRaw, RawBlas, RawEvent, RawFunction, RawModule,
};
use crate::gpu::kernels::{self, CompileMode, KernelBuild, KernelCache, KernelSource};
use crate::gpu::stats::{ArenaSnapshot, DeviceSummary, QuitStep, QuitStepStatus, StreamSnapshot};
use crate::gpu::stream::{Backoff, Budget, LabelId, OpKind, RING, StreamShared, TrackedStream};

/// Settings of an opened device.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuConfig {
    /// Labels, in-flight table, breadcrumbs and periodic events (on by default; off only to
    /// measure what they cost).
    pub tracking: bool,
    /// Kernels write breadcrumbs (with tracking on). Off only to measure what they cost.
    pub breadcrumbs: bool,
    /// Checksum every uploaded tensor on the device against the host (on by default).
    pub verify_uploads: bool,
    pub staging_buffers: usize,
    pub staging_bytes: usize,
    pub default_budget: Budget,
    /// Device memory left free beyond the arena for the runtime itself.
    pub runtime_reserve: u64,
    /// BLAS workspace carved from the arena's workspace region.
    pub blas_workspace: u64,
    /// Longest wait for a staging buffer, a download or a free event.
    pub wait_timeout: Duration,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            tracking: true,
            breadcrumbs: true,
            verify_uploads: true,
            staging_buffers: 4,
            staging_bytes: 8 << 20,
            default_budget: Budget::DEFAULT,
            runtime_reserve: 256 << 20,
            blas_workspace: 32 << 20,
            wait_timeout: Duration::from_secs(30),
        }
    }
}

/// A loaded kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelFn(u32);

/// One kernel argument (after the two tracking parameters every kernel takes first).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    Ptr(DevicePtr),
    U32(u32),
    I32(i32),
    U64(u64),
    F32(f32),
}

impl From<DeviceBuffer> for Arg {
    fn from(b: DeviceBuffer) -> Arg {
        Arg::Ptr(b.ptr)
    }
}

impl From<DevicePtr> for Arg {
    fn from(p: DevicePtr) -> Arg {
        Arg::Ptr(p)
    }
}

const MAX_ARGS: usize = 32;

/// How GEMMs run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GemmPath {
    /// rocBLAS / cuBLAS, bound to our stream, device pointer mode, workspace from the arena.
    Blas { library: String },
    /// hipscope's own `hs_sgemm` kernel, and why.
    Fallback { reason: String },
    /// Not set up yet (no arena).
    NotReady,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Alive,
    Poisoned(String),
    TornDown,
}

struct StagingBuf {
    mem: PinnedRaw,
    /// Last op that reads or writes this buffer.
    last_seq: u64,
}

/// The thread that queries the event pool for the watchdog, off the worker and off the watchdog
/// itself (a query can block inside a wedged runtime).
struct Prober {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

/// How the device half of the quit protocol ended.
#[derive(Clone, Debug, PartialEq)]
pub struct TeardownOutcome {
    /// Every step ran and succeeded: returning from `main` is safe.
    pub clean: bool,
    /// Why not, when not clean (the app then leaves with `_exit`).
    pub reason: Option<String>,
    pub steps: Vec<QuitStep>,
}

/// The exit code of a process that had to leave without GPU cleanup (`_exit`, no atexit handlers).
pub const HARD_EXIT_CODE: i32 = 3;

impl TeardownOutcome {
    /// 0 when clean, else [`HARD_EXIT_CODE`]: what the worker reports in `Event::Exited`.
    pub fn exit_code(&self) -> i32 {
        if self.clean { 0 } else { HARD_EXIT_CODE }
    }
}

/// A 32-bit word of pinned host memory mapped into the device (a flag a kernel polls).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostWord(usize);

/// A launched [`Gpu::launch_spin_on_flag`].
#[derive(Clone, Copy, Debug)]
pub struct SpinOnFlag {
    /// Setting it to non-zero releases the kernel.
    pub flag: HostWord,
    /// Where the kernel writes its u32 result.
    pub result: DeviceBuffer,
    pub label: LabelId,
}

/// One opened device, owned by the worker thread.
pub struct Gpu {
    backend: Box<dyn Device>,
    stream: TrackedStream,
    cfg: GpuConfig,
    arena: Option<Arena>,
    modules: Vec<(String, RawModule)>,
    functions: Vec<(String, RawFunction)>,
    by_name: HashMap<String, KernelFn>,
    blas: Option<RawBlas>,
    gemm_path: GemmPath,
    staging: Vec<StagingBuf>,
    staging_next: usize,
    crumb: Option<PinnedRaw>,
    /// Host words mapped into the device (flags the host sets for a kernel to see).
    host_words: Vec<PinnedRaw>,
    /// Device constants 0.0 and 1.0 (scalars for device pointer mode).
    scalars: Option<DeviceBuffer>,
    verify_scratch: Option<DeviceBuffer>,
    prober: Option<Prober>,
    state: State,
    mem_at_open: Option<MemInfo>,
}

/// Partials the checksum kernel writes: one (sum, nonzero) pair per block.
pub(crate) const CHECKSUM_BLOCKS: u32 = 256;

impl Gpu {
    /// Sets up the tracked stream (event pool, breadcrumb word) and the staging buffers.
    pub fn open(mut backend: Box<dyn Device>, cfg: GpuConfig) -> Result<Gpu, GpuError> {
        let mem_at_open = backend.mem_info().ok();
        let name = format!("{}:{} stream 0", backend.kind(), backend.info().ordinal);
        let mut stream = TrackedStream::new(&name, backend.as_mut())?;
        stream.default_budget = cfg.default_budget;
        stream.set_tracking(cfg.tracking);
        stream.set_breadcrumbs(cfg.breadcrumbs);
        let mut gpu = Gpu {
            backend,
            stream,
            cfg,
            arena: None,
            modules: Vec::new(),
            functions: Vec::new(),
            by_name: HashMap::new(),
            blas: None,
            gemm_path: GemmPath::NotReady,
            staging: Vec::new(),
            staging_next: 0,
            crumb: None,
            host_words: Vec::new(),
            scalars: None,
            verify_scratch: None,
            prober: None,
            state: State::Alive,
            mem_at_open,
        };
        match gpu.alloc_host_side() {
            Ok(()) => Ok(gpu),
            Err(e) => {
                // Give back what was made (nothing is in flight yet).
                let _ = gpu.teardown(Duration::from_secs(1), &mut |_| {});
                Err(e)
            }
        }
    }

    /// The breadcrumb word and the staging buffers.
    fn alloc_host_side(&mut self) -> Result<(), GpuError> {
        let crumb = self.backend.alloc_pinned(64, true)?;
        let Some(dev) = crumb.device else {
            self.host_words.push(crumb);
            return Err(GpuError::InvalidArgument(
                "mapped pinned memory without a device address".into(),
            ));
        };
        // SAFETY: 64 fresh bytes of pinned memory, 8-byte aligned (page-aligned by the runtime).
        unsafe {
            std::ptr::write_bytes(crumb.host, 0, 64);
            self.stream
                .shared()
                .attach_breadcrumb(crumb.host as *mut u64);
        }
        self.stream.set_breadcrumb(dev);
        self.crumb = Some(crumb);
        for _ in 0..self.cfg.staging_buffers.max(1) {
            let mem = self
                .backend
                .alloc_pinned(self.cfg.staging_bytes.max(4096), false)?;
            self.staging.push(StagingBuf { mem, last_seq: 0 });
        }
        Ok(())
    }

    pub fn info(&self) -> &DeviceInfo {
        self.backend.info()
    }

    pub fn kind(&self) -> BackendKind {
        self.backend.kind()
    }

    pub fn config(&self) -> &GpuConfig {
        &self.cfg
    }

    /// The shared, lock-free view of the stream, for the watchdog and the UI.
    pub fn stream_shared(&self) -> Arc<StreamShared> {
        self.stream.shared().clone()
    }

    pub fn set_tracking(&mut self, on: bool) {
        self.cfg.tracking = on;
        self.stream.set_tracking(on);
    }

    pub fn set_breadcrumbs(&mut self, on: bool) {
        self.cfg.breadcrumbs = on;
        self.stream.set_breadcrumbs(on);
    }

    pub fn set_verify_uploads(&mut self, on: bool) {
        self.cfg.verify_uploads = on;
    }

    pub fn label(&mut self, text: &str) -> LabelId {
        self.stream.label(text)
    }

    pub fn is_poisoned(&self) -> Option<&str> {
        match &self.state {
            State::Poisoned(r) => Some(r),
            _ => None,
        }
    }

    /// Device allocations made through the backend since open (independent of the arena).
    pub fn device_allocations(&self) -> u64 {
        self.backend.device_allocations()
    }

    pub fn mem_info(&mut self) -> Result<MemInfo, GpuError> {
        self.check_alive()?;
        let r = self.backend.mem_info();
        self.guard(r)
    }

    fn check_alive(&self) -> Result<(), GpuError> {
        match &self.state {
            State::Alive => Ok(()),
            State::Poisoned(r) => Err(GpuError::Poisoned { reason: r.clone() }),
            State::TornDown => Err(GpuError::TornDown),
        }
    }

    /// Passes a result through, poisoning the device on a runtime error.
    fn guard<T>(&mut self, r: Result<T, GpuError>) -> Result<T, GpuError> {
        if let Err(GpuError::Runtime(e)) = &r {
            let reason = e.to_string();
            self.stream.shared().poison(reason.clone());
            self.state = State::Poisoned(reason);
        }
        r
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.cfg.wait_timeout
    }

    /// Enqueues one op through `f`, tracking it. `f` gets the backend, the op's seq and the
    /// breadcrumb address to pass to a kernel.
    fn enqueue(
        &mut self,
        kind: OpKind,
        label: LabelId,
        budget: Option<Budget>,
        f: impl FnOnce(&mut dyn Device, u64, DevicePtr) -> Result<(), GpuError>,
    ) -> Result<u64, GpuError> {
        self.check_alive()?;
        if !self.stream.has_room() {
            let target = self.stream.last_seq().saturating_sub(RING as u64 / 2);
            let d = self.deadline();
            let r = self.stream.wait_for(self.backend.as_mut(), target, d);
            self.guard(r)?;
        }
        let seq = self.stream.begin(kind, label, budget);
        let crumb = self.stream.crumb_arg();
        let r = f(self.backend.as_mut(), seq, crumb);
        self.guard(r)?;
        self.stream.commit(seq);
        if self.stream.wants_event() {
            let d = self.deadline();
            let r = self.stream.record_event(self.backend.as_mut(), d);
            self.guard(r)?;
        }
        Ok(seq)
    }

    /// Loads compiled modules; `sources` gives each module's kernel names.
    pub fn load_modules(
        &mut self,
        modules: &[kernels::CompiledModule],
        sources: &[KernelSource],
    ) -> Result<(), GpuError> {
        self.check_alive()?;
        for m in modules {
            let r = self.backend.load_module(&m.image);
            let raw = self.guard(r)?;
            self.modules.push((m.name.clone(), raw));
            let names = sources
                .iter()
                .find(|s| s.name == m.name)
                .map(|s| kernels::kernel_names(&s.text))
                .unwrap_or_default();
            for k in names {
                let r = self.backend.get_function(raw, &k);
                let f = self.guard(r)?;
                let id = KernelFn(self.functions.len() as u32);
                self.functions.push((k.clone(), f));
                self.by_name.insert(k, id);
            }
        }
        Ok(())
    }

    /// Compiles (or loads from the cache) every kernel for this device and loads them.
    pub fn prepare_kernels(
        &mut self,
        cache: &KernelCache,
        mode: &CompileMode,
    ) -> Result<Vec<KernelBuild>, GpuError> {
        let sources = kernels::sources()?;
        let compiler = kernels::compiler_for(self.kind())?;
        let arch = self.info().arch.clone();
        if arch.is_empty() {
            return Err(GpuError::UnsupportedTarget {
                compiler: compiler.id(),
                arch: "(unknown)".into(),
                reason: self.info().arch_source.clone(),
            });
        }
        let builds = kernels::build_all(compiler.as_ref(), &arch, &sources, cache, mode);
        let modules = kernels::into_modules(builds.clone())?;
        self.load_modules(&modules, &sources)?;
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

    /// Makes the arena for `plan` (plus the workspace hipscope itself needs), refusing up front
    /// if the device lacks the memory, then sets up the GEMM path.
    pub fn create_arena(&mut self, plan: &ArenaPlan) -> Result<(), GpuError> {
        self.check_alive()?;
        if self.arena.is_some() {
            return Err(GpuError::InvalidArgument("the arena already exists".into()));
        }
        let blas = matches!(
            self.backend.blas_availability(),
            BlasAvailability::Present { .. }
        );
        let mut plan = *plan;
        plan.add(Region::Workspace, 256); // scalars
        plan.add(Region::Workspace, CHECKSUM_BLOCKS as u64 * 16);
        if blas {
            plan.add(Region::Workspace, self.cfg.blas_workspace);
        }
        let r = Arena::create(self.backend.as_mut(), &plan, self.cfg.runtime_reserve);
        let mut arena = self.guard(r)?;
        let pinned: u64 = self.staging.iter().map(|s| s.mem.bytes as u64).sum::<u64>()
            + self.crumb.as_ref().map_or(0, |c| c.bytes as u64);
        arena.set_pinned_host_bytes(pinned);
        let scalars = arena.alloc(Region::Workspace, 8)?;
        let scratch = arena.alloc(Region::Workspace, CHECKSUM_BLOCKS as u64 * 16)?;
        let workspace = if blas {
            Some(arena.alloc(Region::Workspace, self.cfg.blas_workspace)?)
        } else {
            None
        };
        self.arena = Some(arena);
        self.scalars = Some(scalars);
        self.verify_scratch = Some(scratch);
        let l = self.label("init · scalars 0.0, 1.0");
        let mut bytes = [0u8; 8];
        bytes[4..].copy_from_slice(&1.0f32.to_le_bytes());
        self.upload(l, scalars, &bytes)?;
        self.setup_gemm(workspace)?;
        Ok(())
    }

    fn setup_gemm(&mut self, workspace: Option<DeviceBuffer>) -> Result<(), GpuError> {
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

    pub(crate) fn verify_scratch(&self) -> Option<DeviceBuffer> {
        self.verify_scratch
    }

    pub fn gemm_path(&self) -> &GemmPath {
        &self.gemm_path
    }

    pub fn alloc(&mut self, region: Region, bytes: u64) -> Result<DeviceBuffer, GpuError> {
        self.check_alive()?;
        self.arena
            .as_mut()
            .ok_or_else(|| GpuError::InvalidArgument("no arena: call create_arena first".into()))?
            .alloc(region, bytes)
    }

    pub fn free(&mut self, buf: DeviceBuffer) {
        if let Some(a) = self.arena.as_mut() {
            a.free(buf);
        }
    }

    pub fn reset_region(&mut self, region: Region) {
        if let Some(a) = self.arena.as_mut() {
            a.reset(region);
        }
    }

    /// A host word the device can read and write (zeroed). Freed at teardown.
    pub fn alloc_host_word(&mut self) -> Result<HostWord, GpuError> {
        self.check_alive()?;
        let r = self.backend.alloc_pinned(64, true);
        let p = self.guard(r)?;
        if p.device.is_none() {
            return Err(GpuError::InvalidArgument(
                "mapped memory without a device address".into(),
            ));
        }
        // SAFETY: 64 fresh bytes.
        unsafe { std::ptr::write_bytes(p.host, 0, 64) };
        self.host_words.push(p);
        Ok(HostWord(self.host_words.len() - 1))
    }

    /// The device address of a host word.
    pub fn host_word_device(&self, w: HostWord) -> Result<DevicePtr, GpuError> {
        self.host_words
            .get(w.0)
            .and_then(|p| p.device)
            .ok_or(GpuError::TornDown)
    }

    pub fn set_host_word(&self, w: HostWord, v: u32) -> Result<(), GpuError> {
        let p = self.host_words.get(w.0).ok_or(GpuError::TornDown)?;
        // SAFETY: live pinned memory (freed only by teardown, which consumes self); volatile
        // because the device reads it concurrently.
        unsafe { std::ptr::write_volatile(p.host as *mut u32, v) };
        Ok(())
    }

    pub fn host_word(&self, w: HostWord) -> Result<u32, GpuError> {
        let p = self.host_words.get(w.0).ok_or(GpuError::TornDown)?;
        // SAFETY: as in `set_host_word`.
        Ok(unsafe { std::ptr::read_volatile(p.host as *const u32) })
    }

    /// Device-side 0.0 (`[0]`) and 1.0 (`[1]`) for BLAS scalars in device pointer mode.
    pub fn scalar(&self, value: f32) -> Result<DevicePtr, GpuError> {
        let s = self
            .scalars
            .ok_or_else(|| GpuError::InvalidArgument("no arena yet".into()))?;
        if value == 0.0 {
            Ok(s.ptr)
        } else if value == 1.0 {
            Ok(s.ptr.offset(4))
        } else {
            Err(GpuError::InvalidArgument(format!(
                "no device constant {value}: upload it into the workspace region"
            )))
        }
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
        let raw = self
            .functions
            .get(f.0 as usize)
            .map(|x| x.1)
            .ok_or_else(|| GpuError::InvalidArgument(format!("kernel handle {}", f.0)))?;
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
        self.enqueue(OpKind::Kernel, label, budget, |be, seq, crumb| {
            launch_raw(be, raw, grid, block, shared_bytes, crumb, seq, args)
        })
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
        self.enqueue(OpKind::CopyD2D, label, None, |be, _, _| {
            // SAFETY: both ranges lie in arena buffers (checked sizes above).
            unsafe { be.copy_d2d(dst.ptr, src.ptr, bytes as usize) }
        })
    }

    /// Takes the next staging buffer once its last op has finished.
    fn staging_buffer(&mut self) -> Result<usize, GpuError> {
        let i = self.staging_next;
        self.staging_next = (i + 1) % self.staging.len();
        let last = self.staging[i].last_seq;
        let d = self.deadline();
        let r = self.stream.wait_for(self.backend.as_mut(), last, d);
        self.guard(r)?;
        Ok(i)
    }

    /// Copies host bytes into `dst` through pinned staging buffers, asynchronously; returns the
    /// seq of the last copy. The host slice may be dropped as soon as this returns.
    pub fn upload(
        &mut self,
        label: LabelId,
        dst: DeviceBuffer,
        data: &[u8],
    ) -> Result<u64, GpuError> {
        self.check_alive()?;
        if data.len() as u64 > dst.bytes {
            return Err(GpuError::InvalidArgument(format!(
                "upload of {} bytes into a buffer of {}",
                data.len(),
                dst.bytes
            )));
        }
        let chunk = self.cfg.staging_bytes.max(4096);
        let mut last = self.stream.last_seq();
        for (i, piece) in data.chunks(chunk).enumerate() {
            let b = self.staging_buffer()?;
            let host = self.staging[b].mem.host;
            // SAFETY: the staging buffer holds `chunk` bytes and no op uses it (waited above).
            unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), host, piece.len()) };
            let off = (i * chunk) as u64;
            let len = piece.len();
            let seq = self.enqueue(OpKind::CopyH2D, label, None, |be, _, _| {
                // SAFETY: pinned source kept until this op's event completes; dst range checked.
                unsafe { be.copy_h2d(dst.ptr.offset(off), host, len) }
            })?;
            self.staging[b].last_seq = seq;
            let d = self.deadline();
            let r = self.stream.record_event(self.backend.as_mut(), d);
            self.guard(r)?;
            last = seq;
        }
        Ok(last)
    }

    /// Copies `out.len()` bytes from `src` to the host, waiting (with the configured deadline)
    /// for the copy: the one synchronisation point of a decode step.
    pub fn download(
        &mut self,
        label: LabelId,
        src: DeviceBuffer,
        out: &mut [u8],
    ) -> Result<(), GpuError> {
        self.check_alive()?;
        if out.len() as u64 > src.bytes {
            return Err(GpuError::InvalidArgument(format!(
                "download of {} bytes from a buffer of {}",
                out.len(),
                src.bytes
            )));
        }
        let chunk = self.cfg.staging_bytes.max(4096);
        for (i, piece) in out.chunks_mut(chunk).enumerate() {
            let b = self.staging_buffer()?;
            let host = self.staging[b].mem.host;
            let len = piece.len();
            let off = (i * chunk) as u64;
            let seq = self.enqueue(OpKind::CopyD2H, label, None, |be, _, _| {
                // SAFETY: pinned destination, idle (waited above); src range checked.
                unsafe { be.copy_d2h(host, src.ptr.offset(off), len) }
            })?;
            self.staging[b].last_seq = seq;
            let d = self.deadline();
            let r = self.stream.wait_for(self.backend.as_mut(), seq, d);
            self.guard(r)?;
            // SAFETY: the copy into the staging buffer has completed.
            unsafe { std::ptr::copy_nonoverlapping(host, piece.as_mut_ptr(), len) };
        }
        Ok(())
    }

    /// Records an event after the last op (end of a layer or phase), so that "K finished" is
    /// observable even when no kernel follows.
    pub fn mark_phase(&mut self) -> Result<(), GpuError> {
        self.check_alive()?;
        let d = self.deadline();
        let r = self.stream.record_event(self.backend.as_mut(), d);
        self.guard(r)
    }

    /// Device memory bandwidth in bytes/s (read plus write) of a device-to-device copy: two
    /// buffers of up to 256 MiB (a quarter of the free memory at most) outside the arena, timed
    /// over 10 and then 40 tracked copies so that the fixed cost of the waits cancels out; the
    /// buffers are freed before it returns.
    pub fn measure_copy_bandwidth(&mut self) -> Result<f64, GpuError> {
        self.check_alive()?;
        let free = self.mem_info()?.free;
        let bytes = (256u64 << 20).min(free / 4) & !0xFFFF;
        if bytes < (16 << 20) {
            return Err(GpuError::InvalidArgument(format!(
                "{free} bytes free: too little to measure bandwidth"
            )));
        }
        let r = self.backend.malloc(bytes);
        let src = self.guard(r)?;
        let dst = match self.backend.malloc(bytes) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: just allocated, no op uses it.
                let _ = unsafe { self.backend.free(src) };
                return Err(e);
            }
        };
        let label = self.label("bandwidth · copy");
        let timed = |g: &mut Gpu, n: u32| -> Result<f64, GpuError> {
            let t = Instant::now();
            for _ in 0..n {
                g.enqueue(OpKind::CopyD2D, label, None, |be, _, _| {
                    // SAFETY: both buffers were allocated above with `bytes` bytes.
                    unsafe { be.copy_d2d(dst, src, bytes as usize) }
                })?;
            }
            g.wait_idle(Duration::from_secs(30))?;
            Ok(t.elapsed().as_secs_f64())
        };
        let r = timed(self, 2)
            .and_then(|_| timed(self, 10))
            .and_then(|short| timed(self, 40).map(|long| (short, long)));
        if self.wait_idle(Duration::from_secs(30)).is_ok() {
            // SAFETY: every op that used them has finished.
            unsafe {
                let _ = self.backend.free(dst);
                let _ = self.backend.free(src);
            }
        }
        let (short, long) = r?;
        let secs = (long - short).max(1e-9);
        Ok(30.0 * 2.0 * bytes as f64 / secs)
    }

    /// Waits, polling events with backoff, until everything enqueued has finished.
    pub fn wait_idle(&mut self, timeout: Duration) -> Result<(), GpuError> {
        self.check_alive()?;
        let last = self.stream.last_seq();
        let r = self
            .stream
            .wait_for(self.backend.as_mut(), last, Instant::now() + timeout);
        self.guard(r)
    }

    /// Polls events without waiting; returns the number of ops known complete.
    pub fn poll(&mut self) -> Result<u64, GpuError> {
        self.check_alive()?;
        let r = self.stream.poll(self.backend.as_mut());
        self.guard(r)
    }

    pub fn stream_snapshot(&self) -> StreamSnapshot {
        self.stream.shared().snapshot()
    }

    pub fn arena_snapshot(&mut self) -> Option<ArenaSnapshot> {
        let mem = if self.state == State::Alive {
            self.backend.mem_info().ok()
        } else {
            None
        };
        self.arena.as_ref().map(|a| a.snapshot(mem))
    }

    pub fn summary(&mut self, reason: &str) -> DeviceSummary {
        let free = if self.state == State::Alive {
            self.backend.mem_info().ok().map(|m| m.free)
        } else {
            None
        };
        let i = self.info();
        DeviceSummary {
            backend: self.kind().name().into(),
            name: i.name.clone(),
            arch: i.arch.clone(),
            total_memory: Some(i.total_memory),
            free_memory: free,
            compute_units: Some(i.compute_units),
            warp_size: Some(i.warp_size),
            reason: reason.to_string(),
        }
    }

    /// Free device memory when the device was opened.
    pub fn mem_at_open(&self) -> Option<MemInfo> {
        self.mem_at_open
    }

    /// Starts the event-prober thread that lets the watchdog see event completions even while
    /// the worker is busy or stuck. Queries run there, never on the watchdog thread.
    pub fn start_event_prober(&mut self, interval: Duration) {
        if self.prober.is_some() {
            return;
        }
        let shared = self.stream.shared().clone();
        let probe: Arc<dyn EventProbe> = self.backend.event_probe();
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let (s2, d2) = (stop.clone(), done.clone());
        let handle = std::thread::Builder::new()
            .name("hipscope-event-prober".into())
            .spawn(move || {
                prober_loop(&shared, probe.as_ref(), &s2, interval);
                d2.store(true, Ordering::Release);
            })
            .ok();
        self.prober = Some(Prober { stop, done, handle });
    }

    /// The device half of the quit protocol: bounded drain, then destroy BLAS handles, events,
    /// modules, arena and pinned memory, stream — each reported through `on_step` with its
    /// duration. If the drain times out or any step fails, every further GPU call is skipped and
    /// the outcome is not clean: the app must then leave with `_exit`.
    pub fn teardown(
        mut self,
        drain_deadline: Duration,
        on_step: &mut dyn FnMut(QuitStep),
    ) -> TeardownOutcome {
        let mut steps = Vec::new();
        let mut failed: Option<String> = match &self.state {
            State::Poisoned(r) => Some(format!("the device failed earlier: {r}")),
            State::TornDown => Some("already torn down".into()),
            State::Alive => None,
        };
        let mut step =
            |name: &str, failed: &mut Option<String>, f: &mut dyn FnMut() -> Result<(), String>| {
                on_step(QuitStep {
                    name: name.into(),
                    status: QuitStepStatus::Running,
                    elapsed: Duration::ZERO,
                });
                let t = Instant::now();
                let status = match failed {
                    Some(why) => QuitStepStatus::Skipped(format!("no GPU calls after: {why}")),
                    None => match f() {
                        Ok(()) => QuitStepStatus::Done,
                        Err(e) => {
                            *failed = Some(format!("{name}: {e}"));
                            QuitStepStatus::Failed(e)
                        }
                    },
                };
                let s = QuitStep {
                    name: name.into(),
                    status,
                    elapsed: t.elapsed(),
                };
                on_step(s.clone());
                steps.push(s);
            };

        step("drain stream", &mut failed, &mut || {
            let deadline = Instant::now() + drain_deadline;
            let last = self.stream.last_seq();
            self.stream
                .wait_for(self.backend.as_mut(), last, deadline)
                .map_err(|e| match e {
                    GpuError::Timeout { what, waited } => format!(
                        "timed out after {waited:.1?} with {} op(s) in flight: {what}",
                        self.stream.shared().queue_depth()
                    ),
                    other => other.to_string(),
                })
        });
        step("destroy BLAS handles", &mut failed, &mut || {
            if let Some(h) = self.blas.take() {
                // SAFETY: drained; the handle is not used again.
                unsafe { self.backend.destroy_blas(h) }.map_err(|e| e.to_string())?;
            }
            Ok(())
        });
        step("destroy events", &mut failed, &mut || {
            if let Some(mut p) = self.prober.take() {
                p.stop.store(true, Ordering::Release);
                let t = Instant::now();
                while !p.done.load(Ordering::Acquire) {
                    if t.elapsed() > Duration::from_secs(1) {
                        return Err(
                            "the event prober is stuck inside an event query (runtime wedged)"
                                .into(),
                        );
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                if let Some(h) = p.handle.take() {
                    let _ = h.join();
                }
            }
            for e in self.stream.event_handles() {
                // SAFETY: drained and the prober has stopped; no one queries these again.
                unsafe { self.backend.destroy_event(e) }.map_err(|e| e.to_string())?;
            }
            self.stream.clear_events();
            Ok(())
        });
        step("unload modules", &mut failed, &mut || {
            for (_, m) in self.modules.drain(..) {
                // SAFETY: drained; nothing runs from these modules.
                unsafe { self.backend.unload_module(m) }.map_err(|e| e.to_string())?;
            }
            self.functions.clear();
            self.by_name.clear();
            Ok(())
        });
        step("free arena and pinned memory", &mut failed, &mut || {
            if let Some(a) = self.arena.take() {
                // SAFETY: drained; no buffer is used after teardown.
                unsafe { a.release(self.backend.as_mut()) }.map_err(|e| e.to_string())?;
            }
            for s in self.staging.drain(..) {
                // SAFETY: drained; staging buffers are idle.
                unsafe { self.backend.free_pinned(&s.mem) }.map_err(|e| e.to_string())?;
            }
            for w in self.host_words.drain(..) {
                // SAFETY: drained; no kernel reads the word any more.
                unsafe { self.backend.free_pinned(&w) }.map_err(|e| e.to_string())?;
            }
            if let Some(c) = self.crumb.take() {
                self.stream.shared().detach_breadcrumb();
                // SAFETY: no reader holds the word any more; no kernel is in flight.
                unsafe { self.backend.free_pinned(&c) }.map_err(|e| e.to_string())?;
            }
            Ok(())
        });
        step("destroy stream", &mut failed, &mut || {
            // SAFETY: drained, and everything else on the device is gone.
            unsafe { self.backend.destroy_stream() }.map_err(|e| e.to_string())
        });
        self.state = State::TornDown;
        TeardownOutcome {
            clean: failed.is_none(),
            reason: failed,
            steps,
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn launch_raw(
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

fn prober_loop(
    shared: &StreamShared,
    probe: &dyn EventProbe,
    stop: &AtomicBool,
    interval: Duration,
) {
    // Each query takes the runtime's lock that the worker's launches also take, so the prober
    // asks about as few events as it can: the oldest pending first, stopping at the first one
    // not reached (on one stream, a later event cannot be reached before an earlier one).
    let mut pending: Vec<(u64, u64, usize)> = Vec::with_capacity(shared.events.len());
    while !stop.load(Ordering::Acquire) {
        shared.fold_breadcrumb();
        let done = shared.completed();
        pending.clear();
        for (i, slot) in shared.events.iter().enumerate() {
            let c = slot.covers.load(Ordering::Acquire);
            let h = slot.handle.load(Ordering::Acquire);
            if c != 0 && c != u64::MAX && c > done && h != 0 {
                pending.push((c, h, i));
            }
        }
        pending.sort_unstable();
        for &(c1, h, i) in &pending {
            shared
                .probe_busy_since_ns
                .store(shared.now_ns().max(1), Ordering::Release);
            let r = probe.query(RawEvent(h));
            shared.probe_busy_since_ns.store(0, Ordering::Release);
            match r {
                // Only if the event was not re-recorded meanwhile (then c1 is stale but true).
                Ok(true) if shared.events[i].covers.load(Ordering::Acquire) == c1 => {
                    shared.advance_completed(c1)
                }
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    let _ = shared.probe_error.set(e.to_string());
                    break;
                }
            }
        }
        std::thread::sleep(interval);
    }
}

/// Waits with backoff until `cond` holds or `timeout` passes (host-side helper for tests and the
/// selftest; no GPU call).
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let mut b = Backoff::new();
    while b.waited() < timeout {
        if cond() {
            return true;
        }
        b.wait();
    }
    cond()
}
