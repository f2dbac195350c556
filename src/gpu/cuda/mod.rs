//! The CUDA runtime: the same device interface over the CUDA driver API, nvrtc and cuBLAS,
//! through cudarc's dynamically loaded bindings. cudarc panics when a library is missing, so each
//! entry point first checks that the library loads (and, as a last resort, catches a panic).
//! `ffi.rs`: driver errors and device probing; `rtc.rs`: nvrtc; `blas.rs`: cuBLAS; this file:
//! the opened [`CudaDevice`] and its `Device` impl.

mod blas;
pub mod ffi;
pub mod rtc;

use std::ffi::{CString, c_int, c_uint, c_void};
use std::sync::Arc;
use std::thread::ThreadId;

use cudarc::cublas::sys as cublas;
use cudarc::driver::sys as cu;

use crate::gpu::device::{
    BlasAvailability, Device, DeviceInfo, DevicePtr, EventProbe, GemmF32, GpuError, MemInfo,
    PinnedRaw, RawBlas, RawEvent, RawFunction, RawGraph, RawModule, RuntimeKind,
};

use ffi::{check, cu_err, guarded};
pub use ffi::{describe, device_count, driver_present, probe};
pub use rtc::Nvrtc;

/// `Err` naming the first of `syms` the loaded CUDA driver lacks (an older driver than the
/// feature needs: graphs, launch overlap).
fn driver_has(syms: &[&str]) -> Result<(), String> {
    let missing = guarded("CUDA driver (libcuda)", || {
        Ok(syms.iter().copied().find(|sym| {
            // SAFETY: looks a symbol up in the already loaded driver library; nothing is called
            // through it.
            unsafe {
                cu::culib()
                    .get::<*const c_void>(format!("{sym}\0").as_bytes())
                    .is_err()
            }
        }))
    })
    .map_err(|e| e.to_string())?;
    match missing {
        Some(sym) => Err(format!("the CUDA driver lacks {sym}")),
        None => Ok(()),
    }
}

/// The driver entry points graph replay needs (checked at open: a driver without them runs
/// without graphs, saying so).
const GRAPH_SYMBOLS: [&str; 6] = [
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
];

thread_local! {
    /// The context this thread last made current through a [`CudaDevice`] (0: none).
    static CURRENT_CTX: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// One opened CUDA device: its primary context and one non-blocking stream.
pub struct CudaDevice {
    info: DeviceInfo,
    dev: cu::CUdevice,
    ctx: cu::CUcontext,
    stream: cu::CUstream,
    current_on: Option<ThreadId>,
    allocations: u64,
    cublas: Result<(), String>,
    /// Launch overlap (programmatic dependent launch) is on: see [`Device::set_launch_overlap`].
    overlap: bool,
}

// SAFETY: the driver API is thread-safe; handles are used by one owner at a time (`&mut self`),
// and `ensure_current` binds the context on whichever thread that is.
unsafe impl Send for CudaDevice {}

impl CudaDevice {
    pub fn open(ordinal: u32) -> Result<CudaDevice, GpuError> {
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
            CURRENT_CTX.with(|c| c.set(ctx as usize));
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
                    ffi::library_names("cublas").join(", ")
                ))
            };
            Ok(CudaDevice {
                info,
                dev,
                ctx,
                stream,
                current_on: Some(std::thread::current().id()),
                allocations: 0,
                cublas,
                overlap: false,
            })
        })
    }

    /// Makes this device's context current on the calling thread, unless it already is: with
    /// several GPUs in one process (a model split over them) the worker thread alternates
    /// between their contexts, so "current on this thread" is per thread and per context.
    fn ensure_current(&mut self) -> Result<(), GpuError> {
        let me = std::thread::current().id();
        let mine = self.ctx as usize;
        if self.current_on != Some(me) || CURRENT_CTX.with(|c| c.get()) != mine {
            // SAFETY: ctx is our retained primary context.
            check("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(self.ctx) })?;
            CURRENT_CTX.with(|c| c.set(mine));
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

impl Device for CudaDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Cuda
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

    unsafe fn host_register(&mut self, ptr: *const u8, bytes: usize) -> Result<bool, GpuError> {
        self.ensure_current()?;
        let flags = cu::CU_MEMHOSTREGISTER_PORTABLE | cu::CU_MEMHOSTREGISTER_READ_ONLY;
        // SAFETY: the caller keeps the range mapped until it is unregistered.
        let r = unsafe { cu::cuMemHostRegister_v2(ptr as *mut c_void, bytes, flags) };
        Ok(r == cu::CUresult::CUDA_SUCCESS)
    }

    unsafe fn host_unregister(&mut self, ptr: *const u8) -> Result<(), GpuError> {
        self.ensure_current()?;
        // SAFETY: registered by host_register; the caller waited for its readers.
        check("cuMemHostUnregister", unsafe {
            cu::cuMemHostUnregister(ptr as *mut c_void)
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

    fn create_timed_event(&mut self) -> Result<RawEvent, GpuError> {
        self.ensure_current()?;
        let mut e: cu::CUevent = std::ptr::null_mut();
        // SAFETY: writes one handle; flags 0 is a default (timing) event.
        check("cuEventCreate", unsafe { cu::cuEventCreate(&mut e, 0) })?;
        Ok(RawEvent(e as u64))
    }

    fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32, GpuError> {
        // cudarc resolves the entry point on first use and panics where the driver lacks it
        // (before CUDA 12.8): `guarded` makes that an error.
        guarded("CUDA driver (libcuda)", || {
            let mut ms = 0f32;
            // SAFETY: both events are ours, timed and recorded; writes one float.
            check("cuEventElapsedTime_v2", unsafe {
                cu::cuEventElapsedTime_v2(&mut ms, start.0 as cu::CUevent, end.0 as cu::CUevent)
            })?;
            Ok(ms)
        })
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

    fn peer_id(&self) -> Option<u64> {
        Some(self.ctx as u64)
    }

    fn enable_peer(&mut self, peer: u64, ordinal: u32) -> Result<bool, GpuError> {
        self.ensure_current()?;
        let mut peer_dev: cu::CUdevice = 0;
        // SAFETY: each call writes into the local it is given.
        check("cuDeviceGet", unsafe {
            cu::cuDeviceGet(&mut peer_dev, ordinal as c_int)
        })?;
        let mut can: c_int = 0;
        check("cuDeviceCanAccessPeer", unsafe {
            cu::cuDeviceCanAccessPeer(&mut can, self.dev, peer_dev)
        })?;
        if can == 0 {
            return Ok(false);
        }
        // SAFETY: the peer context is retained by its device, which outlives the split's use.
        match unsafe { cu::cuCtxEnablePeerAccess(peer as cu::CUcontext, 0) } {
            cu::CUresult::CUDA_SUCCESS | cu::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                Ok(true)
            }
            r => Err(cu_err("cuCtxEnablePeerAccess", r)),
        }
    }

    unsafe fn copy_from_peer(
        &mut self,
        dst: DevicePtr,
        peer: u64,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.ensure_current()?;
        let s = self.live_stream()?;
        // SAFETY: see the trait contract.
        check("cuMemcpyPeerAsync", unsafe {
            cu::cuMemcpyPeerAsync(dst.0, self.ctx, src.0, peer as cu::CUcontext, bytes, s)
        })
    }

    unsafe fn wait_event(&mut self, e: RawEvent) -> Result<(), GpuError> {
        self.ensure_current()?;
        let s = self.live_stream()?;
        // SAFETY: see the trait contract.
        check("cuStreamWaitEvent", unsafe {
            cu::cuStreamWaitEvent(s, e.0 as cu::CUevent, 0)
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
        if self.overlap {
            // Every hipscope kernel waits for its predecessor's end before it touches memory
            // (HS_LAUNCH_ORDER in kernels/prelude.h), so it may be scheduled before that end.
            let mut attr = cu::CUlaunchAttribute {
                id: cu::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value: cu::CUlaunchAttributeValue {
                    programmaticStreamSerializationAllowed: 1,
                },
            };
            let config = cu::CUlaunchConfig {
                gridDimX: grid[0],
                gridDimY: grid[1],
                gridDimZ: grid[2],
                blockDimX: block[0],
                blockDimY: block[1],
                blockDimZ: block[2],
                sharedMemBytes: shared_bytes,
                hStream: s,
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: caller guarantees params match the kernel; config and attr outlive the
            // call, which copies them.
            return check("cuLaunchKernelEx", unsafe {
                cu::cuLaunchKernelEx(
                    &config,
                    f.0 as cu::CUfunction,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            });
        }
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
        self.cublas_availability()
    }

    fn create_blas(&mut self) -> Result<RawBlas, GpuError> {
        self.cublas_create()
    }

    fn blas_stream_is_ours(&self, h: RawBlas) -> Result<bool, GpuError> {
        self.cublas_stream_is_ours(h)
    }

    unsafe fn blas_set_workspace(
        &mut self,
        h: RawBlas,
        ptr: DevicePtr,
        bytes: u64,
    ) -> Result<(), GpuError> {
        // SAFETY: the caller's guarantee, passed on.
        unsafe { self.cublas_set_workspace(h, ptr, bytes) }
    }

    unsafe fn sgemm(&mut self, h: RawBlas, g: &GemmF32) -> Result<(), GpuError> {
        // SAFETY: the caller's guarantee, passed on.
        unsafe { self.cublas_sgemm(h, g) }
    }

    fn blas_has_f16(&self) -> bool {
        self.cublas.is_ok()
    }

    unsafe fn gemm_f16(&mut self, h: RawBlas, g: &GemmF32) -> Result<(), GpuError> {
        // SAFETY: the caller's guarantee, passed on.
        unsafe { self.cublas_gemm_f16(h, g) }
    }

    unsafe fn destroy_blas(&mut self, h: RawBlas) -> Result<(), GpuError> {
        // SAFETY: the caller's guarantee, passed on.
        unsafe { self.cublas_destroy(h) }
    }

    fn set_launch_overlap(&mut self, on: bool) -> Result<(), String> {
        if !on {
            self.overlap = false;
            return Ok(());
        }
        let cc: u32 = self
            .info
            .arch
            .strip_prefix("sm_")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if cc < 90 {
            return Err(format!(
                "{} has no programmatic dependent launch (sm_90 and later)",
                self.info.arch
            ));
        }
        driver_has(&["cuLaunchKernelEx"])?;
        self.overlap = true;
        Ok(())
    }

    fn graph_support(&self) -> Result<(), String> {
        driver_has(&GRAPH_SYMBOLS)
    }

    fn begin_capture(&mut self) -> Result<(), GpuError> {
        self.ensure_current()?;
        let s = self.live_stream()?;
        // Thread-local mode: another thread's unrelated CUDA calls do not invalidate the capture.
        // SAFETY: plain call on our live stream.
        guarded("CUDA driver (libcuda)", || {
            check("cuStreamBeginCapture", unsafe {
                cu::cuStreamBeginCapture_v2(
                    s,
                    cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )
            })
        })
    }

    fn end_capture(&mut self) -> Result<RawGraph, GpuError> {
        self.ensure_current()?;
        let s = self.live_stream()?;
        guarded("CUDA driver (libcuda)", || {
            let mut graph: cu::CUgraph = std::ptr::null_mut();
            // SAFETY: ends the capture begun on our stream; writes one handle.
            check("cuStreamEndCapture", unsafe {
                cu::cuStreamEndCapture(s, &mut graph)
            })?;
            let mut exec: cu::CUgraphExec = std::ptr::null_mut();
            // SAFETY: `graph` is the template just captured; writes one handle.
            let r = check("cuGraphInstantiateWithFlags", unsafe {
                cu::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
            });
            // The executable graph keeps what it needs; the template is not used again.
            // SAFETY: `graph` came from the capture above and is not used afterwards.
            let _ = unsafe { cu::cuGraphDestroy(graph) };
            r.map(|()| RawGraph(exec as u64))
        })
    }

    unsafe fn launch_graph(&mut self, g: RawGraph) -> Result<(), GpuError> {
        self.ensure_current()?;
        let s = self.live_stream()?;
        // SAFETY: the caller's contract: an executable graph of this backend.
        check("cuGraphLaunch", unsafe {
            cu::cuGraphLaunch(g.0 as cu::CUgraphExec, s)
        })
    }

    unsafe fn destroy_graph(&mut self, g: RawGraph) -> Result<(), GpuError> {
        self.ensure_current()?;
        // SAFETY: the caller's contract: no replay of it still runs.
        check("cuGraphExecDestroy", unsafe {
            cu::cuGraphExecDestroy(g.0 as cu::CUgraphExec)
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
