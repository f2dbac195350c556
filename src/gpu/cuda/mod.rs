//! The CUDA backend: the same device interface over the CUDA driver API, nvrtc and cuBLAS,
//! through cudarc's dynamically loaded bindings. cudarc panics when a library is missing, so each
//! entry point first checks that the library loads (and, as a last resort, catches a panic).

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread::ThreadId;

use cudarc::cublas::sys as cublas;
use cudarc::driver::sys as cu;
use cudarc::nvrtc::sys as nvrtc;

use crate::gpu::device::{
    BackendKind, BlasAvailability, Device, DeviceInfo, DevicePtr, EventProbe, GemmF32, GpuError,
    MemInfo, Op, PinnedRaw, RawBlas, RawEvent, RawFunction, RawModule, RuntimeError,
};
use crate::gpu::kernels::KernelCompiler;

const CUDA_HINT: &str = "install the NVIDIA driver (libcuda.so.1) and the CUDA toolkit's nvrtc \
                         and cuBLAS libraries, or put them on LD_LIBRARY_PATH";

fn cu_err(call: &'static str, r: cu::CUresult) -> GpuError {
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: writes one pointer to a static string owned by the driver.
    let msg = if unsafe { cu::cuGetErrorString(r, &mut p) } == cu::CUresult::CUDA_SUCCESS
        && !p.is_null()
    {
        // SAFETY: the driver's static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().to_string()
    } else {
        "unrecognised CUDA status".to_string()
    };
    GpuError::Runtime(RuntimeError {
        backend: BackendKind::Cuda,
        call,
        code: r as u32 as i64,
        message: msg,
    })
}

fn check(call: &'static str, r: cu::CUresult) -> Result<(), GpuError> {
    if r == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(cu_err(call, r))
    }
}

fn cublas_check(call: &'static str, s: cublas::cublasStatus_t) -> Result<(), GpuError> {
    if s == cublas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(GpuError::Runtime(RuntimeError {
            backend: BackendKind::Cuda,
            call,
            code: s as u32 as i64,
            message: format!("{s:?}"),
        }))
    }
}

/// Runs `f`, turning a cudarc panic (a library or symbol it could not load) into an error.
fn guarded<T>(what: &'static str, f: impl FnOnce() -> Result<T, GpuError>) -> Result<T, GpuError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".to_string());
            Err(GpuError::LibraryMissing {
                what,
                tried: vec![msg],
                hint: CUDA_HINT.to_string(),
            })
        }
    }
}

/// The file names cudarc tries for `lib`, each once, as this platform names libraries: cudarc's
/// list repeats names and, on Linux too, includes the Windows forms (`libcuda64_130_0.so`).
fn library_names(lib: &str) -> Vec<String> {
    let windows_form = format!("lib{lib}64");
    let mut out: Vec<String> = Vec::new();
    for n in cudarc::get_lib_name_candidates(lib) {
        if cfg!(unix) && n.starts_with(&windows_form) {
            continue;
        }
        if !out.contains(&n) {
            out.push(n);
        }
    }
    out
}

/// Whether the CUDA driver library loads. Must hold before any `cu::` call (cudarc panics).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen candidate names.
    unsafe { cu::is_culib_present() }
}

fn require_driver() -> Result<(), GpuError> {
    if driver_present() {
        Ok(())
    } else {
        Err(GpuError::LibraryMissing {
            what: "CUDA driver (libcuda)",
            tried: library_names("cuda"),
            hint: CUDA_HINT.to_string(),
        })
    }
}

/// Number of CUDA devices, or `NoDevice` saying why there are none.
pub fn device_count() -> Result<u32, GpuError> {
    require_driver()?;
    guarded("CUDA driver (libcuda)", || {
        // SAFETY: plain driver calls writing one int.
        let r = unsafe { cu::cuInit(0) };
        if r != cu::CUresult::CUDA_SUCCESS {
            return Err(GpuError::NoDevice {
                backend: BackendKind::Cuda,
                detail: format!("cuInit: {}", cu_err("cuInit", r)),
            });
        }
        let mut n: c_int = 0;
        check("cuDeviceGetCount", unsafe { cu::cuDeviceGetCount(&mut n) })?;
        if n <= 0 {
            return Err(GpuError::NoDevice {
                backend: BackendKind::Cuda,
                detail: "cuDeviceGetCount returned 0".into(),
            });
        }
        Ok(n as u32)
    })
}

fn attr(dev: cu::CUdevice, a: cu::CUdevice_attribute) -> Result<i32, GpuError> {
    let mut v: c_int = 0;
    // SAFETY: writes one int.
    check("cuDeviceGetAttribute", unsafe {
        cu::cuDeviceGetAttribute(&mut v, a, dev)
    })?;
    Ok(v)
}

/// Reads one device's facts.
pub fn describe(ordinal: u32) -> Result<DeviceInfo, GpuError> {
    require_driver()?;
    guarded("CUDA driver (libcuda)", || {
        let mut dev: cu::CUdevice = 0;
        // SAFETY: each call writes into the local it is given.
        check("cuDeviceGet", unsafe {
            cu::cuDeviceGet(&mut dev, ordinal as c_int)
        })?;
        let mut name = [0 as c_char; 256];
        check("cuDeviceGetName", unsafe {
            cu::cuDeviceGetName(name.as_mut_ptr(), 256, dev)
        })?;
        // SAFETY: NUL-terminated by the driver within the buffer.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .to_string();
        use cu::CUdevice_attribute as A;
        let major = attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sms = attr(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let warp = attr(dev, A::CU_DEVICE_ATTRIBUTE_WARP_SIZE)?;
        let integrated = attr(dev, A::CU_DEVICE_ATTRIBUTE_INTEGRATED)?;
        let mut total: usize = 0;
        check("cuDeviceTotalMem", unsafe {
            cu::cuDeviceTotalMem_v2(&mut total, dev)
        })?;
        let mut bus = [0 as c_char; 64];
        let pci = if unsafe { cu::cuDeviceGetPCIBusId(bus.as_mut_ptr(), 64, dev) }
            == cu::CUresult::CUDA_SUCCESS
        {
            // SAFETY: NUL-terminated by the driver.
            Some(
                unsafe { CStr::from_ptr(bus.as_ptr()) }
                    .to_string_lossy()
                    .to_string(),
            )
        } else {
            None
        };
        let mut dv: c_int = 0;
        check("cuDriverGetVersion", unsafe {
            cu::cuDriverGetVersion(&mut dv)
        })?;
        Ok(DeviceInfo {
            backend: Some(BackendKind::Cuda),
            ordinal,
            name,
            arch: format!("sm_{major}{minor}"),
            arch_source: "compute capability".into(),
            total_memory: total as u64,
            compute_units: sms.max(0) as u32,
            warp_size: warp.max(0) as u32,
            integrated: integrated != 0,
            pci_bus_id: pci,
            driver_version: format!("CUDA driver API {}.{}", dv / 1000, (dv % 1000) / 10),
            runtime_version: "cudarc (driver API, nvrtc)".into(),
            notes: Vec::new(),
        })
    })
}

/// Describes every CUDA device, or says why there are none.
pub fn probe() -> Result<Vec<DeviceInfo>, GpuError> {
    let n = device_count()?;
    (0..n).map(describe).collect()
}

/// One opened CUDA device: its primary context and one non-blocking stream.
pub struct CudaBackend {
    info: DeviceInfo,
    dev: cu::CUdevice,
    ctx: cu::CUcontext,
    stream: cu::CUstream,
    current_on: Option<ThreadId>,
    allocations: u64,
    cublas: Result<(), String>,
}

// SAFETY: the driver API is thread-safe; handles are used by one owner at a time (`&mut self`),
// and `ensure_current` binds the context on whichever thread that is.
unsafe impl Send for CudaBackend {}

impl CudaBackend {
    pub fn open(ordinal: u32) -> Result<CudaBackend, GpuError> {
        let info = describe(ordinal)?;
        guarded("CUDA driver (libcuda)", || {
            let mut dev: cu::CUdevice = 0;
            // SAFETY: each call writes into the local it is given.
            check("cuDeviceGet", unsafe {
                cu::cuDeviceGet(&mut dev, ordinal as c_int)
            })?;
            let mut ctx: cu::CUcontext = std::ptr::null_mut();
            check("cuDevicePrimaryCtxRetain", unsafe {
                cu::cuDevicePrimaryCtxRetain(&mut ctx, dev)
            })?;
            check("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(ctx) })?;
            let mut stream: cu::CUstream = std::ptr::null_mut();
            check("cuStreamCreate", unsafe {
                cu::cuStreamCreate(
                    &mut stream,
                    cu::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint,
                )
            })?;
            // SAFETY: only tries to dlopen candidate names.
            let cublas = if unsafe { cublas::is_culib_present() } {
                Ok(())
            } else {
                Err(format!(
                    "cuBLAS not found (tried {})",
                    library_names("cublas").join(", ")
                ))
            };
            Ok(CudaBackend {
                info,
                dev,
                ctx,
                stream,
                current_on: Some(std::thread::current().id()),
                allocations: 0,
                cublas,
            })
        })
    }

    fn ensure_current(&mut self) -> Result<(), GpuError> {
        let me = std::thread::current().id();
        if self.current_on != Some(me) {
            // SAFETY: ctx is our retained primary context.
            check("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(self.ctx) })?;
            self.current_on = Some(me);
        }
        Ok(())
    }

    fn live_stream(&self) -> Result<cu::CUstream, GpuError> {
        if self.stream.is_null() {
            Err(GpuError::TornDown)
        } else {
            Ok(self.stream)
        }
    }

    fn require_cublas(&self) -> Result<(), GpuError> {
        self.cublas.clone().map_err(GpuError::InvalidArgument)
    }
}

struct CudaProbe {
    ctx: cu::CUcontext,
}

// SAFETY: a context handle may be made current on any thread.
unsafe impl Send for CudaProbe {}
unsafe impl Sync for CudaProbe {}

impl EventProbe for CudaProbe {
    fn query(&self, event: RawEvent) -> Result<bool, GpuError> {
        // SAFETY: ctx is retained until teardown, which stops the prober before releasing it.
        check("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(self.ctx) })?;
        // SAFETY: the event stays valid until teardown stops the prober.
        match unsafe { cu::cuEventQuery(event.0 as cu::CUevent) } {
            cu::CUresult::CUDA_SUCCESS => Ok(true),
            cu::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => Err(cu_err("cuEventQuery", r)),
        }
    }
}

impl Device for CudaBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn mem_info(&mut self) -> Result<MemInfo, GpuError> {
        self.ensure_current()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t.
        check("cuMemGetInfo", unsafe {
            cu::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok(MemInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    fn device_allocations(&self) -> u64 {
        self.allocations
    }

    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, GpuError> {
        self.ensure_current()?;
        let mut p: cu::CUdeviceptr = 0;
        // SAFETY: writes one device pointer.
        check("cuMemAlloc", unsafe {
            cu::cuMemAlloc_v2(&mut p, bytes as usize)
        })?;
        self.allocations += 1;
        Ok(DevicePtr(p))
    }

    unsafe fn free(&mut self, ptr: DevicePtr) -> Result<(), GpuError> {
        self.ensure_current()?;
        // SAFETY: caller guarantees ptr is ours and idle.
        check("cuMemFree", unsafe { cu::cuMemFree_v2(ptr.0) })
    }

    fn alloc_pinned(&mut self, bytes: usize, mapped: bool) -> Result<PinnedRaw, GpuError> {
        self.ensure_current()?;
        let flags = if mapped {
            cu::CU_MEMHOSTALLOC_DEVICEMAP | cu::CU_MEMHOSTALLOC_PORTABLE
        } else {
            0
        };
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        check("cuMemHostAlloc", unsafe {
            cu::cuMemHostAlloc(&mut p, bytes, flags)
        })?;
        let device = if mapped {
            let mut d: cu::CUdeviceptr = 0;
            // SAFETY: p is mapped pinned memory.
            let r = unsafe { cu::cuMemHostGetDevicePointer_v2(&mut d, p, 0) };
            if r != cu::CUresult::CUDA_SUCCESS {
                // SAFETY: p is unused.
                unsafe { cu::cuMemFreeHost(p) };
                return Err(cu_err("cuMemHostGetDevicePointer", r));
            }
            Some(DevicePtr(d))
        } else {
            None
        };
        Ok(PinnedRaw {
            host: p as *mut u8,
            device,
            bytes,
        })
    }

    unsafe fn free_pinned(&mut self, p: &PinnedRaw) -> Result<(), GpuError> {
        self.ensure_current()?;
        // SAFETY: caller guarantees p is ours and idle.
        check("cuMemFreeHost", unsafe {
            cu::cuMemFreeHost(p.host as *mut c_void)
        })
    }

    fn create_event(&mut self) -> Result<RawEvent, GpuError> {
        self.ensure_current()?;
        let mut e: cu::CUevent = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("cuEventCreate", unsafe {
            cu::cuEventCreate(&mut e, cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint)
        })?;
        Ok(RawEvent(e as u64))
    }

    unsafe fn destroy_event(&mut self, e: RawEvent) -> Result<(), GpuError> {
        self.ensure_current()?;
        // SAFETY: caller guarantees e is unused afterwards.
        check("cuEventDestroy", unsafe {
            cu::cuEventDestroy_v2(e.0 as cu::CUevent)
        })
    }

    unsafe fn record_event(&mut self, e: RawEvent) -> Result<(), GpuError> {
        self.ensure_current()?;
        let s = self.live_stream()?;
        // SAFETY: e ours, s our live stream.
        check("cuEventRecord", unsafe {
            cu::cuEventRecord(e.0 as cu::CUevent, s)
        })
    }

    fn query_event(&self, e: RawEvent) -> Result<bool, GpuError> {
        CudaProbe { ctx: self.ctx }.query(e)
    }

    fn event_probe(&self) -> Arc<dyn EventProbe> {
        Arc::new(CudaProbe { ctx: self.ctx })
    }

    unsafe fn copy_h2d(
        &mut self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.ensure_current()?;
        let s = self.live_stream()?;
        // SAFETY: see the trait contract.
        check("cuMemcpyHtoDAsync", unsafe {
            cu::cuMemcpyHtoDAsync_v2(dst.0, src as *const c_void, bytes, s)
        })
    }

    unsafe fn copy_d2h(
        &mut self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.ensure_current()?;
        let s = self.live_stream()?;
        // SAFETY: see the trait contract.
        check("cuMemcpyDtoHAsync", unsafe {
            cu::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src.0, bytes, s)
        })
    }

    unsafe fn copy_d2d(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.ensure_current()?;
        let s = self.live_stream()?;
        // SAFETY: see the trait contract.
        check("cuMemcpyDtoDAsync", unsafe {
            cu::cuMemcpyDtoDAsync_v2(dst.0, src.0, bytes, s)
        })
    }

    fn load_module(&mut self, image: &[u8]) -> Result<RawModule, GpuError> {
        self.ensure_current()?;
        let mut m: cu::CUmodule = std::ptr::null_mut();
        // SAFETY: image is a complete CUBIN, or PTX that nvrtc NUL-terminated.
        check("cuModuleLoadData", unsafe {
            cu::cuModuleLoadData(&mut m, image.as_ptr() as *const c_void)
        })?;
        Ok(RawModule(m as u64))
    }

    fn get_function(&mut self, m: RawModule, name: &str) -> Result<RawFunction, GpuError> {
        self.ensure_current()?;
        let c = CString::new(name)
            .map_err(|_| GpuError::InvalidArgument(format!("kernel name {name:?}")))?;
        let mut f: cu::CUfunction = std::ptr::null_mut();
        // SAFETY: m is loaded; c is NUL-terminated.
        check("cuModuleGetFunction", unsafe {
            cu::cuModuleGetFunction(&mut f, m.0 as cu::CUmodule, c.as_ptr())
        })?;
        Ok(RawFunction(f as u64))
    }

    unsafe fn unload_module(&mut self, m: RawModule) -> Result<(), GpuError> {
        self.ensure_current()?;
        // SAFETY: caller guarantees nothing runs from m.
        check("cuModuleUnload", unsafe {
            cu::cuModuleUnload(m.0 as cu::CUmodule)
        })
    }

    unsafe fn launch(
        &mut self,
        f: RawFunction,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), GpuError> {
        self.ensure_current()?;
        let s = self.live_stream()?;
        // SAFETY: caller guarantees params match the kernel.
        check("cuLaunchKernel", unsafe {
            cu::cuLaunchKernel(
                f.0 as cu::CUfunction,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_bytes,
                s,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    fn blas_availability(&self) -> BlasAvailability {
        match &self.cublas {
            Ok(()) => BlasAvailability::Present {
                library: "cuBLAS".into(),
            },
            Err(why) => BlasAvailability::Absent {
                reason: why.clone(),
            },
        }
    }

    fn create_blas(&mut self) -> Result<RawBlas, GpuError> {
        self.require_cublas()?;
        self.ensure_current()?;
        let s = self.live_stream()?;
        guarded("cuBLAS", || {
            let mut h: cublas::cublasHandle_t = std::ptr::null_mut();
            // SAFETY: writes one handle.
            cublas_check("cublasCreate", unsafe { cublas::cublasCreate_v2(&mut h) })?;
            // SAFETY: h live; s our stream (the cuBLAS stream type is the same CUstream_st*).
            let bound = cublas_check("cublasSetStream", unsafe {
                cublas::cublasSetStream_v2(h, s as cublas::cudaStream_t)
            })
            .and_then(|()| {
                // SAFETY: h live.
                cublas_check("cublasSetPointerMode", unsafe {
                    cublas::cublasSetPointerMode_v2(
                        h,
                        cublas::cublasPointerMode_t::CUBLAS_POINTER_MODE_DEVICE,
                    )
                })
            });
            if let Err(e) = bound {
                // SAFETY: h is dropped here.
                unsafe { cublas::cublasDestroy_v2(h) };
                return Err(e);
            }
            Ok(RawBlas(h as u64))
        })
    }

    fn blas_stream_is_ours(&self, h: RawBlas) -> Result<bool, GpuError> {
        self.require_cublas()?;
        let mut s: cublas::cudaStream_t = std::ptr::null_mut();
        // SAFETY: h is live; writes one stream handle.
        cublas_check("cublasGetStream", unsafe {
            cublas::cublasGetStream_v2(h.0 as cublas::cublasHandle_t, &mut s)
        })?;
        Ok(s as u64 == self.stream as u64 && !s.is_null())
    }

    unsafe fn blas_set_workspace(
        &mut self,
        h: RawBlas,
        ptr: DevicePtr,
        bytes: u64,
    ) -> Result<(), GpuError> {
        self.require_cublas()?;
        // SAFETY: caller guarantees the range is device memory outliving the handle.
        cublas_check("cublasSetWorkspace", unsafe {
            cublas::cublasSetWorkspace_v2(
                h.0 as cublas::cublasHandle_t,
                ptr.0 as *mut c_void,
                bytes as usize,
            )
        })
    }

    unsafe fn sgemm(&mut self, h: RawBlas, g: &GemmF32) -> Result<(), GpuError> {
        self.ensure_current()?;
        let op = |o: Op| match o {
            Op::N => cublas::cublasOperation_t::CUBLAS_OP_N,
            Op::T => cublas::cublasOperation_t::CUBLAS_OP_T,
        };
        // SAFETY: caller guarantees pointers and shapes; device pointer mode is set.
        cublas_check("cublasSgemm", unsafe {
            cublas::cublasSgemm_v2(
                h.0 as cublas::cublasHandle_t,
                op(g.transa),
                op(g.transb),
                g.m,
                g.n,
                g.k,
                g.alpha.0 as *const f32,
                g.a.0 as *const f32,
                g.lda,
                g.b.0 as *const f32,
                g.ldb,
                g.beta.0 as *const f32,
                g.c.0 as *mut f32,
                g.ldc,
            )
        })
    }

    unsafe fn destroy_blas(&mut self, h: RawBlas) -> Result<(), GpuError> {
        self.ensure_current()?;
        // SAFETY: caller guarantees h unused afterwards.
        cublas_check("cublasDestroy", unsafe {
            cublas::cublasDestroy_v2(h.0 as cublas::cublasHandle_t)
        })
    }

    unsafe fn destroy_stream(&mut self) -> Result<(), GpuError> {
        self.ensure_current()?;
        let s = self.live_stream()?;
        self.stream = std::ptr::null_mut();
        // SAFETY: caller guarantees nothing in flight.
        check("cuStreamDestroy", unsafe { cu::cuStreamDestroy_v2(s) })?;
        // The primary context was retained at open; this is its last user in the process.
        // SAFETY: plain call; nothing uses the context afterwards.
        check("cuDevicePrimaryCtxRelease", unsafe {
            cu::cuDevicePrimaryCtxRelease_v2(self.dev)
        })
    }
}

/// nvrtc, compiling the same kernels/*.hip sources (through the prelude) for an `sm_XX`.
pub struct Nvrtc {
    version: (i32, i32),
    supported: Vec<i32>,
}

impl Nvrtc {
    pub fn load() -> Result<Nvrtc, GpuError> {
        // SAFETY: only tries to dlopen candidate names.
        if !unsafe { nvrtc::is_culib_present() } {
            return Err(GpuError::LibraryMissing {
                what: "nvrtc (the CUDA runtime compiler)",
                tried: library_names("nvrtc"),
                hint: CUDA_HINT.to_string(),
            });
        }
        guarded("nvrtc", || {
            let (mut a, mut b) = (0, 0);
            // SAFETY: writes two ints.
            unsafe { nvrtc::nvrtcVersion(&mut a, &mut b) };
            let mut n: c_int = 0;
            // SAFETY: writes one int, then n ints.
            let mut supported = Vec::new();
            if unsafe { nvrtc::nvrtcGetNumSupportedArchs(&mut n) }
                == nvrtc::nvrtcResult::NVRTC_SUCCESS
                && n > 0
            {
                supported = vec![0; n as usize];
                unsafe { nvrtc::nvrtcGetSupportedArchs(supported.as_mut_ptr()) };
            }
            Ok(Nvrtc {
                version: (a, b),
                supported,
            })
        })
    }

    /// `sm_90` → 90.
    fn arch_number(arch: &str) -> Option<i32> {
        arch.strip_prefix("sm_")?.parse().ok()
    }

    /// A CUBIN for archs nvrtc knows; PTX for its newest arch otherwise (the driver JITs it).
    fn target(&self, arch: &str) -> (String, bool) {
        let n = Self::arch_number(arch).unwrap_or(0);
        let max = self.supported.iter().copied().max().unwrap_or(n);
        if self.supported.is_empty() || self.supported.contains(&n) {
            (format!("--gpu-architecture=sm_{n}"), true)
        } else {
            (format!("--gpu-architecture=compute_{}", max.min(n)), false)
        }
    }

    fn log(prog: nvrtc::nvrtcProgram) -> String {
        let mut n: usize = 0;
        // SAFETY: prog live; writes one size.
        if unsafe { nvrtc::nvrtcGetProgramLogSize(prog, &mut n) }
            != nvrtc::nvrtcResult::NVRTC_SUCCESS
            || n == 0
        {
            return String::new();
        }
        let mut buf = vec![0u8; n];
        // SAFETY: buf holds n bytes as promised.
        unsafe { nvrtc::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut c_char) };
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).trim_end().to_string()
    }
}

impl KernelCompiler for Nvrtc {
    fn backend(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn id(&self) -> String {
        format!("nvrtc {}.{}", self.version.0, self.version.1)
    }

    fn options(&self, arch: &str) -> Vec<String> {
        vec![
            self.target(arch).0,
            "-DHS_BACKEND_CUDA=1".to_string(),
            "--use_fast_math".to_string(),
        ]
    }

    fn check_target(&self, arch: &str) -> Result<(), GpuError> {
        match Self::arch_number(arch) {
            Some(n) if n >= 50 => Ok(()),
            _ => Err(GpuError::UnsupportedTarget {
                compiler: self.id(),
                arch: arch.to_string(),
                reason: "expected sm_NN with NN ≥ 50".into(),
            }),
        }
    }

    fn compile(&self, name: &str, source: &str, arch: &str) -> Result<Vec<u8>, GpuError> {
        let fail = |log: String| GpuError::Compile {
            kernel: name.to_string(),
            arch: arch.to_string(),
            log,
        };
        let src = CString::new(source).map_err(|_| fail("source contains a NUL byte".into()))?;
        let cname =
            CString::new(format!("{name}.hip")).map_err(|_| fail("bad kernel name".into()))?;
        let opts: Vec<CString> = self
            .options(arch)
            .into_iter()
            .map(CString::new)
            .collect::<Result<_, _>>()
            .map_err(|_| fail("bad option".into()))?;
        let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let cubin = self.target(arch).1;
        guarded("nvrtc", || {
            let mut prog: nvrtc::nvrtcProgram = std::ptr::null_mut();
            // SAFETY: strings live across the calls; no headers.
            let r = unsafe {
                nvrtc::nvrtcCreateProgram(
                    &mut prog,
                    src.as_ptr(),
                    cname.as_ptr(),
                    0,
                    std::ptr::null(),
                    std::ptr::null(),
                )
            };
            if r != nvrtc::nvrtcResult::NVRTC_SUCCESS {
                return Err(fail(format!("nvrtcCreateProgram: {r:?}")));
            }
            let result = (|| {
                // SAFETY: prog live; ptrs valid strings.
                let r =
                    unsafe { nvrtc::nvrtcCompileProgram(prog, ptrs.len() as c_int, ptrs.as_ptr()) };
                if r != nvrtc::nvrtcResult::NVRTC_SUCCESS {
                    let log = Self::log(prog);
                    return Err(fail(if log.is_empty() {
                        format!("{r:?}")
                    } else {
                        log
                    }));
                }
                let mut n: usize = 0;
                // SAFETY: prog compiled; writes one size, then n bytes.
                let r = unsafe {
                    if cubin {
                        nvrtc::nvrtcGetCUBINSize(prog, &mut n)
                    } else {
                        nvrtc::nvrtcGetPTXSize(prog, &mut n)
                    }
                };
                if r != nvrtc::nvrtcResult::NVRTC_SUCCESS || n == 0 {
                    return Err(fail(format!("getting the code size: {r:?}")));
                }
                let mut code = vec![0u8; n];
                let r = unsafe {
                    if cubin {
                        nvrtc::nvrtcGetCUBIN(prog, code.as_mut_ptr() as *mut c_char)
                    } else {
                        nvrtc::nvrtcGetPTX(prog, code.as_mut_ptr() as *mut c_char)
                    }
                };
                if r != nvrtc::nvrtcResult::NVRTC_SUCCESS {
                    return Err(fail(format!("getting the code: {r:?}")));
                }
                Ok(code)
            })();
            // SAFETY: prog live, destroyed once.
            unsafe { nvrtc::nvrtcDestroyProgram(&mut prog) };
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::library_names;

    #[test]
    fn each_library_name_is_listed_once_in_this_platforms_form() {
        for lib in ["cuda", "nvrtc", "cublas"] {
            let names = library_names(lib);
            let mut unique = names.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), names.len(), "{names:?}");
            assert!(!names.is_empty());
            #[cfg(target_os = "linux")]
            assert!(
                names.iter().all(|n| n.starts_with(&format!("lib{lib}.so"))),
                "{names:?}"
            );
        }
    }
}
