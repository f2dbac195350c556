//! The runtime interface: what every GPU runtime (HIP, CUDA, the scripted fake) provides for one
//! device, in raw handles, and the errors they report.
//!
//! A [`Device`] is one opened device with exactly one non-blocking stream, created when the
//! device is opened. Every asynchronous method enqueues on that stream; there is no way to name
//! another stream, so the null (legacy, blocking) stream is unreachable through this interface.
//! There is no synchronous copy, memset or device/stream synchronize either: completion is
//! observed through events only (`record_event` + `query_event`). The safe, tracked layer above
//! it is [`crate::gpu::handle::Gpu`].

use std::ffi::c_void;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Which runtime drives a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuntimeKind {
    Hip,
    Cuda,
    /// The scripted fake device of unit tests.
    Fake,
}

impl RuntimeKind {
    pub fn name(self) -> &'static str {
        match self {
            RuntimeKind::Hip => "hip",
            RuntimeKind::Cuda => "cuda",
            RuntimeKind::Fake => "fake",
        }
    }
}

impl fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A device address. Plain data: valid only while the allocation it points into lives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    pub const NULL: DevicePtr = DevicePtr(0);

    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0.wrapping_add(bytes))
    }

    pub fn is_null(self) -> bool {
        self.0 == 0
    }
}

/// Opaque runtime handles, as integers (the backend casts them back to its pointer types).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawEvent(pub u64);
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawModule(pub u64);
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawFunction(pub u64);
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawBlas(pub u64);
/// An instantiated graph (`CUgraphExec` / `hipGraphExec_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawGraph(pub u64);

/// Page-locked host memory from the runtime; `device` is its device-side address when mapped.
#[derive(Debug)]
pub struct PinnedRaw {
    pub host: *mut u8,
    pub device: Option<DevicePtr>,
    pub bytes: usize,
}

// SAFETY: the pointer is to process memory owned by whoever holds this value; it is only
// dereferenced by its owner (or read-only by the watchdog through atomics).
unsafe impl Send for PinnedRaw {}

/// What a device is, read once at open.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceInfo {
    pub backend: Option<RuntimeKind>,
    /// Index as the runtime numbers devices (after `HIP_VISIBLE_DEVICES`/`CUDA_VISIBLE_DEVICES`).
    pub ordinal: u32,
    pub name: String,
    /// `gfx1100`, `gfx90a`, `sm_90`: what kernels are compiled for.
    pub arch: String,
    /// Where `arch` came from (`KFD topology node 1`, `compute capability`).
    pub arch_source: String,
    pub total_memory: u64,
    pub compute_units: u32,
    pub warp_size: u32,
    /// An integrated GPU (APU) shares memory with the CPU.
    pub integrated: bool,
    pub pci_bus_id: Option<String>,
    pub driver_version: String,
    pub runtime_version: String,
    /// Things worth telling the user (`HSA_OVERRIDE_GFX_VERSION=11.0.0 is set: …`).
    pub notes: Vec<String>,
}

/// Free and total device memory as the runtime reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    pub free: u64,
    pub total: u64,
}

/// BLAS transpose flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    N,
    T,
}

/// Column-major `C = op(A)·op(B) + beta·C` on the host, accumulated in f64: the plain loop the
/// device GEMMs (our kernel, BLAS, the fake device) are checked against.
#[allow(clippy::too_many_arguments)]
pub fn reference_sgemm(
    ta: Op,
    tb: Op,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) {
    for j in 0..n {
        for i in 0..m {
            let mut acc = 0.0f64;
            for p in 0..k {
                let av = match ta {
                    Op::N => a[i + p * lda],
                    Op::T => a[p + i * lda],
                };
                let bv = match tb {
                    Op::N => b[p + j * ldb],
                    Op::T => b[j + p * ldb],
                };
                acc += f64::from(av) * f64::from(bv);
            }
            let ci = i + j * ldc;
            c[ci] = (acc + f64::from(beta) * f64::from(c[ci])) as f32;
        }
    }
}

/// One single-precision GEMM, column-major, scalars in device memory (device pointer mode):
/// `C = alpha * op(A) * op(B) + beta * C`, with op(A) m×k and op(B) k×n.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmF32 {
    pub transa: Op,
    pub transb: Op,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub alpha: DevicePtr,
    pub a: DevicePtr,
    pub lda: i32,
    pub b: DevicePtr,
    pub ldb: i32,
    pub beta: DevicePtr,
    pub c: DevicePtr,
    pub ldc: i32,
}

impl GemmF32 {
    /// Checks the shape arguments the way BLAS does (so that our kernel and the library refuse
    /// the same calls); returns what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.m < 0 || self.n < 0 || self.k < 0 {
            return Err(format!(
                "negative size m={} n={} k={}",
                self.m, self.n, self.k
            ));
        }
        let rows_a = if self.transa == Op::N { self.m } else { self.k };
        let rows_b = if self.transb == Op::N { self.k } else { self.n };
        if self.lda < rows_a.max(1) {
            return Err(format!("lda {} < {}", self.lda, rows_a.max(1)));
        }
        if self.ldb < rows_b.max(1) {
            return Err(format!("ldb {} < {}", self.ldb, rows_b.max(1)));
        }
        if self.ldc < self.m.max(1) {
            return Err(format!("ldc {} < {}", self.ldc, self.m.max(1)));
        }
        Ok(())
    }
}

/// Whether a vendor BLAS serves this device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlasAvailability {
    Present {
        library: String,
    },
    /// Absent or unusable for this device; GEMM falls back to our own kernel.
    Absent {
        reason: String,
    },
}

/// Queries events from any thread. The watchdog's helper thread holds one; the runtime call may
/// block when the runtime itself is wedged, which is why it runs off the watchdog thread.
pub trait EventProbe: Send + Sync {
    /// `Ok(true)`: every op before the event's record has finished. `Ok(false)`: not yet.
    fn query(&self, event: RawEvent) -> Result<bool, GpuError>;
}

/// One opened device with its one non-blocking stream.
///
/// Methods marked `unsafe` take raw addresses: the caller guarantees that device pointers lie in
/// live allocations of this device with room for the bytes named, that host pointers are valid
/// for the whole asynchronous operation (pinned staging buffers, kept until the op's event
/// completes), and that handles came from this backend and were not destroyed.
pub trait Device: Send {
    fn info(&self) -> &DeviceInfo;
    fn kind(&self) -> RuntimeKind;
    fn mem_info(&mut self) -> Result<MemInfo, GpuError>;
    /// Device allocations this backend has made since it was opened, counted where the runtime
    /// call is made (independent of the arena's own bookkeeping).
    fn device_allocations(&self) -> u64;

    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, GpuError>;
    /// # Safety
    /// `ptr` came from `malloc` on this backend and no enqueued op still uses it.
    unsafe fn free(&mut self, ptr: DevicePtr) -> Result<(), GpuError>;
    /// Page-locked host memory; `mapped` also maps it into the device's address space.
    fn alloc_pinned(&mut self, bytes: usize, mapped: bool) -> Result<PinnedRaw, GpuError>;
    /// # Safety
    /// `p` came from `alloc_pinned` on this backend and no enqueued op still uses it.
    unsafe fn free_pinned(&mut self, p: &PinnedRaw) -> Result<(), GpuError>;

    /// Page-locks `bytes` of existing host memory at `ptr` (page-aligned) that the device only
    /// reads (`cuMemHostRegister` / `hipHostRegister` with the read-only flag, which a
    /// read-only file mapping needs), so that `copy_h2d` takes it as it takes pinned memory: the
    /// engine reads it in place. `Ok(false)`: this runtime cannot, and nothing was locked.
    ///
    /// # Safety
    /// The memory stays mapped until [`Device::host_unregister`].
    unsafe fn host_register(&mut self, _ptr: *const u8, _bytes: usize) -> Result<bool, GpuError> {
        Ok(false)
    }
    /// # Safety
    /// `ptr` was registered by [`Device::host_register`] and no enqueued op still reads it.
    unsafe fn host_unregister(&mut self, _ptr: *const u8) -> Result<(), GpuError> {
        Ok(())
    }

    /// An event without timing (`hipEventDisableTiming` / `CU_EVENT_DISABLE_TIMING`).
    fn create_event(&mut self) -> Result<RawEvent, GpuError>;
    /// # Safety
    /// `e` came from `create_event` and is not used afterwards.
    unsafe fn destroy_event(&mut self, e: RawEvent) -> Result<(), GpuError>;
    /// An event that records when the device reached it (`hipEventCreateWithFlags(0)`,
    /// `cuEventCreate(0)`), for the tracer only: the in-flight table's events stay without
    /// timing. Destroyed with [`Device::destroy_event`].
    fn create_timed_event(&mut self) -> Result<RawEvent, GpuError> {
        Err(GpuError::InvalidArgument(format!(
            "the {} runtime has no timed events",
            self.kind()
        )))
    }
    /// Milliseconds from timed event `start` to timed event `end`, both recorded and reached
    /// (`hipEventElapsedTime`, `cuEventElapsedTime`; about half a microsecond's resolution).
    fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32, GpuError> {
        let _ = (start, end);
        Err(GpuError::InvalidArgument(format!(
            "the {} runtime has no timed events",
            self.kind()
        )))
    }

    /// # Safety
    /// `e` came from `create_event` on this backend.
    unsafe fn record_event(&mut self, e: RawEvent) -> Result<(), GpuError>;
    /// Never blocks on the stream: an event query, not a stream query or sync.
    fn query_event(&self, e: RawEvent) -> Result<bool, GpuError>;
    fn event_probe(&self) -> Arc<dyn EventProbe>;

    /// # Safety
    /// See the trait: `src` is pinned and outlives the copy.
    unsafe fn copy_h2d(
        &mut self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), GpuError>;
    /// # Safety
    /// See the trait: `dst` is pinned and outlives the copy.
    unsafe fn copy_d2h(
        &mut self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError>;
    /// Host → device from ordinary (pageable) memory: the runtimes take a pageable pointer in
    /// the same async call and stage it themselves. hipscope's own copies never do this (they go
    /// through pinned staging buffers); `doctor` does, because the silent-zero reports come from
    /// programs that do (llama.cpp #28211, #25863).
    ///
    /// # Safety
    /// `src` outlives the copy: the caller waits for it to finish before touching `src`.
    unsafe fn copy_h2d_pageable(
        &mut self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), GpuError> {
        // SAFETY: the caller's contract is stronger than the pinned path needs of the runtime.
        unsafe { self.copy_h2d(dst, src, bytes) }
    }
    /// Device → host into ordinary (pageable) memory; see [`Device::copy_h2d_pageable`].
    ///
    /// # Safety
    /// `dst` outlives the copy and is not read until it has finished.
    unsafe fn copy_d2h_pageable(
        &mut self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        // SAFETY: as above.
        unsafe { self.copy_d2h(dst, src, bytes) }
    }
    /// # Safety
    /// See the trait.
    unsafe fn copy_d2d(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError>;

    /// What another device of the same runtime names this one by in a peer copy
    /// ([`Device::copy_from_peer`]): the CUDA context, the HIP device number. `None`: this
    /// runtime makes no peer copies.
    fn peer_id(&self) -> Option<u64> {
        None
    }

    /// Lets this device read the memory of device `peer` (its [`Device::peer_id`], runtime
    /// number `ordinal`) directly: `cuCtxEnablePeerAccess` / `hipDeviceEnablePeerAccess`, once
    /// per pair. `Ok(false)`: the runtime or the link does not allow it (copies then go through
    /// pinned host memory).
    fn enable_peer(&mut self, _peer: u64, _ordinal: u32) -> Result<bool, GpuError> {
        Ok(false)
    }

    /// Enqueues on this device's stream a copy of `bytes` from `src` on device `peer` into `dst`
    /// (`cuMemcpyPeerAsync` / `hipMemcpyPeerAsync`), after [`Device::enable_peer`] said yes.
    ///
    /// # Safety
    /// Both ranges lie in live allocations of their devices, and `src` is not written until the
    /// copy has completed.
    unsafe fn copy_from_peer(
        &mut self,
        _dst: DevicePtr,
        _peer: u64,
        _src: DevicePtr,
        _bytes: usize,
    ) -> Result<(), GpuError> {
        Err(GpuError::InvalidArgument(
            "this runtime makes no peer copies".into(),
        ))
    }

    /// Makes this device's stream wait until `e` (recorded on another device's stream) has
    /// completed, without blocking the host (`cuStreamWaitEvent` / `hipStreamWaitEvent`).
    ///
    /// # Safety
    /// `e` is a live event, recorded before this call.
    unsafe fn wait_event(&mut self, _e: RawEvent) -> Result<(), GpuError> {
        Err(GpuError::InvalidArgument(
            "this runtime cannot wait on another stream's event".into(),
        ))
    }

    /// Loads a code object (HSACO / CUBIN / PTX) from memory: no fat-binary registration.
    fn load_module(&mut self, image: &[u8]) -> Result<RawModule, GpuError>;
    fn get_function(&mut self, m: RawModule, name: &str) -> Result<RawFunction, GpuError>;
    /// # Safety
    /// No enqueued op still runs a function of this module.
    unsafe fn unload_module(&mut self, m: RawModule) -> Result<(), GpuError>;
    /// `params[i]` points at the value of the kernel's i-th parameter.
    ///
    /// # Safety
    /// `params` matches the kernel's parameter list in count and sizes.
    unsafe fn launch(
        &mut self,
        f: RawFunction,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), GpuError>;

    fn blas_availability(&self) -> BlasAvailability;
    /// A BLAS handle bound to our stream, in device pointer mode.
    fn create_blas(&mut self) -> Result<RawBlas, GpuError>;
    /// Whether the handle's stream is still ours (checked before every call in debug builds).
    fn blas_stream_is_ours(&self, h: RawBlas) -> Result<bool, GpuError>;
    /// # Safety
    /// `ptr..ptr+bytes` is device memory that outlives the handle.
    unsafe fn blas_set_workspace(
        &mut self,
        h: RawBlas,
        ptr: DevicePtr,
        bytes: u64,
    ) -> Result<(), GpuError>;
    /// # Safety
    /// All pointers in `g` are device memory large enough for the shapes.
    unsafe fn sgemm(&mut self, h: RawBlas, g: &GemmF32) -> Result<(), GpuError>;
    /// Whether [`Device::gemm_f16`] works (cublasGemmEx; rocblas_gemm_ex where the library has
    /// it).
    fn blas_has_f16(&self) -> bool {
        false
    }
    /// As [`Device::sgemm`] with A and B holding f16 (C, alpha and beta f32, f32 accumulation).
    ///
    /// # Safety
    /// All pointers in `g` are device memory large enough for the shapes.
    unsafe fn gemm_f16(&mut self, _h: RawBlas, _g: &GemmF32) -> Result<(), GpuError> {
        Err(GpuError::InvalidArgument(
            "this BLAS has no f16 GEMM".into(),
        ))
    }
    /// # Safety
    /// `h` is not used afterwards.
    unsafe fn destroy_blas(&mut self, h: RawBlas) -> Result<(), GpuError>;

    /// Launch overlap: each of hipscope's kernels may be scheduled while the one before it on
    /// the stream is still running, hiding its launch latency (CUDA's programmatic dependent
    /// launch, sm_90 and later); every kernel still waits for its predecessor's end before it
    /// touches memory (HS_LAUNCH_ORDER, kernels/prelude.h). `Err` says why it cannot be on.
    fn set_launch_overlap(&mut self, on: bool) -> Result<(), String> {
        if on {
            Err(format!("the {} runtime has no launch overlap", self.kind()))
        } else {
            Ok(())
        }
    }

    /// Whether this runtime can capture the stream into a graph and replay it; `Err` says why
    /// not (a runtime without the symbols, the fake device). Graphs are then off, with that reason.
    fn graph_support(&self) -> Result<(), String> {
        Err(format!("the {} runtime has no graph capture", self.kind()))
    }
    /// Starts capturing the stream: what is enqueued until [`Device::end_capture`] becomes a
    /// graph's nodes instead of running.
    fn begin_capture(&mut self) -> Result<(), GpuError> {
        Err(GpuError::InvalidArgument(
            self.graph_support().err().unwrap_or_default(),
        ))
    }
    /// Ends the capture and instantiates what was captured (the graph template is destroyed at
    /// once; the executable graph lives until [`Device::destroy_graph`]).
    fn end_capture(&mut self) -> Result<RawGraph, GpuError> {
        Err(GpuError::InvalidArgument(
            self.graph_support().err().unwrap_or_default(),
        ))
    }
    /// Enqueues one replay of `g` on the stream.
    ///
    /// # Safety
    /// `g` came from `end_capture` on this backend, and every buffer its nodes use still lives.
    unsafe fn launch_graph(&mut self, g: RawGraph) -> Result<(), GpuError> {
        let _ = g;
        Err(GpuError::InvalidArgument(
            self.graph_support().err().unwrap_or_default(),
        ))
    }
    /// # Safety
    /// `g` came from `end_capture` and no enqueued replay of it is still running.
    unsafe fn destroy_graph(&mut self, g: RawGraph) -> Result<(), GpuError> {
        let _ = g;
        Ok(())
    }

    /// Destroys the stream; every enqueueing call fails afterwards.
    ///
    /// # Safety
    /// Nothing is in flight and nothing enqueues afterwards.
    unsafe fn destroy_stream(&mut self) -> Result<(), GpuError>;
}

/// A runtime error code with the call that returned it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeError {
    pub backend: RuntimeKind,
    pub call: &'static str,
    pub code: i64,
    /// Our own text for the code (HIP 5.2's `hipGetErrorString` returns the enum name only).
    pub message: String,
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} returned {} ({})", self.call, self.code, self.message)
    }
}

/// Everything the device layer can report.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("{what} not found (tried {tried}); {hint}", tried = .tried.join(", "))]
    LibraryMissing {
        what: &'static str,
        tried: Vec<String>,
        hint: String,
    },
    #[error("{library} lacks the symbol {symbol}: {hint}")]
    SymbolMissing {
        library: String,
        symbol: &'static str,
        hint: String,
    },
    #[error("no {backend} device: {detail}")]
    NoDevice {
        backend: RuntimeKind,
        detail: String,
    },
    #[error("{0}")]
    Runtime(RuntimeError),
    #[error(
        "the model needs {need} of device memory ({breakdown}) but {device} has {free} free of {total}",
        need = human_bytes(*.needed),
        free = human_bytes(*.free),
        total = human_bytes(*.total)
    )]
    InsufficientMemory {
        device: String,
        needed: u64,
        free: u64,
        total: u64,
        breakdown: String,
    },
    #[error(
        "arena region {region} cannot fit {want} (largest free block {largest}, capacity {cap})",
        want = human_bytes(*.requested),
        largest = human_bytes(*.largest_free),
        cap = human_bytes(*.capacity)
    )]
    ArenaFull {
        region: &'static str,
        requested: u64,
        largest_free: u64,
        capacity: u64,
    },
    #[error("kernel {kernel} failed to compile for {arch}:\n{log}")]
    Compile {
        kernel: String,
        arch: String,
        log: String,
    },
    #[error("the kernel compiler crashed compiling for {arch} ({status}); {hint}")]
    CompilerCrashed {
        arch: String,
        status: String,
        hint: String,
    },
    #[error("{compiler} cannot compile for {arch}: {reason}")]
    UnsupportedTarget {
        compiler: String,
        arch: String,
        reason: String,
    },
    #[error("kernel {kernel} not loaded (loaded modules: {loaded})")]
    UnknownKernel { kernel: String, loaded: String },
    #[error("{what} did not finish within {waited:?}")]
    Timeout { what: String, waited: Duration },
    #[error(
        "the device is unusable after an earlier error ({reason}); no further GPU calls are made"
    )]
    Poisoned { reason: String },
    #[error("the device was already shut down")]
    TornDown,
    #[error("upload verification: {0}")]
    Verify(#[from] crate::gpu::checksum::VerifyError),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl GpuError {
    /// Whether the device must not be used after this error: any runtime status other than
    /// success/not-ready is fatal (after a fault every call returns the same sticky error).
    pub fn is_fatal_to_device(&self) -> bool {
        matches!(
            self,
            GpuError::Runtime(_) | GpuError::Timeout { .. } | GpuError::Poisoned { .. }
        )
    }
}

/// `1.5 GiB`, `512 MiB`, `300 B`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_rounds_to_binary_units() {
        assert_eq!(human_bytes(300), "300 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }

    #[test]
    fn gemm_validation_follows_blas_leading_dimension_rules() {
        let g = GemmF32 {
            transa: Op::N,
            transb: Op::T,
            m: 4,
            n: 3,
            k: 5,
            alpha: DevicePtr(8),
            a: DevicePtr(16),
            lda: 4,
            b: DevicePtr(32),
            ldb: 3,
            beta: DevicePtr(8),
            c: DevicePtr(64),
            ldc: 4,
        };
        assert_eq!(g.validate(), Ok(()));
        // op(B) = B^T is k×n, so B is stored n×k and needs ldb ≥ n.
        assert!(GemmF32 { ldb: 2, ..g }.validate().is_err());
        assert!(GemmF32 { lda: 3, ..g }.validate().is_err());
        assert!(GemmF32 { m: -1, ..g }.validate().is_err());
        // op(A) = A^T is m×k, so A is stored k×m and needs lda ≥ k.
        assert!(
            GemmF32 {
                transa: Op::T,
                lda: 4,
                ..g
            }
            .validate()
            .is_err()
        );
        assert_eq!(
            GemmF32 {
                transa: Op::T,
                lda: 5,
                ..g
            }
            .validate(),
            Ok(())
        );
    }
}
