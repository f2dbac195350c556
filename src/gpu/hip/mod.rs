//! (Over 700 lines on purpose: the HIP runtime's loading and probing, then its one `Device`
//! implementation, each method a thin checked call into libamdhip64; rocBLAS, hiprtc and the FFI
//! table live in the files beside it.)
//!
//! The HIP runtime: libamdhip64 (+ hiprtc, rocBLAS) loaded at run time.

pub mod ffi;
pub use crate::gpu::telemetry::kfd;
pub mod rocblas;
pub mod rtc;

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::Path;
use std::sync::Arc;
use std::thread::ThreadId;

use crate::gpu::device::{
    BlasAvailability, Device, DeviceInfo, DevicePtr, EventProbe, GemmF32, GpuError, MemInfo, Op,
    PinnedRaw, RawBlas, RawEvent, RawFunction, RawGraph, RawModule, RuntimeError, RuntimeKind,
};
use ffi::{HIP_SUCCESS, HipApi, HipError, HipStream, hip_error_text};
use rocblas::{RocblasApi, RocblasHandle, rocblas_status_text};

fn err(call: &'static str, code: HipError) -> GpuError {
    GpuError::Runtime(RuntimeError {
        backend: RuntimeKind::Hip,
        call,
        code: code as i64,
        message: hip_error_text(code).to_string(),
    })
}

fn check(call: &'static str, code: HipError) -> Result<(), GpuError> {
    if code == HIP_SUCCESS {
        Ok(())
    } else {
        Err(err(call, code))
    }
}

/// The loaded HIP runtime, before a device is opened.
pub struct HipRuntime {
    api: Arc<HipApi>,
    library: String,
    runtime_version: c_int,
    driver_version: c_int,
}

impl HipRuntime {
    /// Loads libamdhip64; fails with the names tried when it is absent.
    pub fn load() -> Result<HipRuntime, GpuError> {
        let (api, library) = ffi::load_hip()?;
        let mut rv: c_int = 0;
        let mut dv: c_int = 0;
        // SAFETY: each writes one int and needs no device.
        unsafe {
            (api.hipRuntimeGetVersion)(&mut rv);
            (api.hipDriverGetVersion)(&mut dv);
        }
        Ok(HipRuntime {
            api: Arc::new(api),
            library,
            runtime_version: rv,
            driver_version: dv,
        })
    }

    pub fn library(&self) -> &str {
        &self.library
    }

    pub fn runtime_version(&self) -> String {
        ffi::decode_hip_version(self.runtime_version)
    }

    /// The number of devices, or `NoDevice` saying why there are none. With no GPU, Debian's 5.2
    /// answers `hipErrorNoDevice` in well under a millisecond.
    pub fn device_count(&self) -> Result<u32, GpuError> {
        // SAFETY: plain calls without pointers (hipInit) or writing one int.
        let init = unsafe { (self.api.hipInit)(0) };
        let mut n: c_int = 0;
        let rc = unsafe { (self.api.hipGetDeviceCount)(&mut n) };
        if rc == HIP_SUCCESS && n > 0 {
            return Ok(n as u32);
        }
        let mut detail = format!(
            "{} {}: hipInit returned {init} ({}), hipGetDeviceCount returned {rc} ({}) with \
             count {n}",
            self.library,
            self.runtime_version(),
            hip_error_text(init),
            hip_error_text(rc)
        );
        if !Path::new("/dev/kfd").exists() {
            detail.push_str("; /dev/kfd is missing (amdgpu driver not loaded, or no AMD GPU)");
        } else if std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kfd")
            .is_err()
        {
            detail.push_str(
                "; /dev/kfd exists but cannot be opened (add your user to the render and video \
                 groups)",
            );
        }
        Err(GpuError::NoDevice {
            backend: RuntimeKind::Hip,
            detail,
        })
    }

    /// Reads one device's facts without opening it.
    pub fn describe(&self, ordinal: u32) -> Result<DeviceInfo, GpuError> {
        let dev = ordinal as c_int;
        let api = &self.api;
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 bytes as passed.
        check("hipDeviceGetName", unsafe {
            (api.hipDeviceGetName)(name.as_mut_ptr(), name.len() as c_int, dev)
        })?;
        // SAFETY: hipDeviceGetName NUL-terminates within the buffer.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .trim()
            .to_string();
        let attr = |a: c_int, call: &'static str| -> Result<i32, GpuError> {
            let mut v: c_int = 0;
            // SAFETY: writes one int.
            check(call, unsafe { (api.hipDeviceGetAttribute)(&mut v, a, dev) })?;
            Ok(v)
        };
        let cus = attr(
            ffi::attr::MULTIPROCESSOR_COUNT,
            "hipDeviceGetAttribute(MultiprocessorCount)",
        )?;
        let warp = attr(ffi::attr::WARP_SIZE, "hipDeviceGetAttribute(WarpSize)")?;
        let integrated = attr(ffi::attr::INTEGRATED, "hipDeviceGetAttribute(Integrated)")?;
        let mut total: usize = 0;
        // SAFETY: writes one size_t.
        check("hipDeviceTotalMem", unsafe {
            (api.hipDeviceTotalMem)(&mut total, dev)
        })?;
        let mut bus = [0 as c_char; 64];
        // SAFETY: the buffer holds 64 bytes as passed.
        let pci = if unsafe { (api.hipDeviceGetPCIBusId)(bus.as_mut_ptr(), 64, dev) } == 0 {
            // SAFETY: NUL-terminated by the runtime within the buffer.
            Some(
                unsafe { CStr::from_ptr(bus.as_ptr()) }
                    .to_string_lossy()
                    .to_string(),
            )
        } else {
            None
        };
        let mut notes = Vec::new();
        let nodes = kfd::read_nodes(&crate::gpu::telemetry::Roots::from_env().kfd_nodes());
        let node = pci
            .as_deref()
            .and_then(kfd::PciAddress::parse)
            .and_then(|p| kfd::node_for(&nodes, &p).cloned());
        let (mut arch, mut arch_source) = match &node {
            Some(n) => (n.arch(), format!("KFD topology node {}", n.node)),
            None => (
                String::new(),
                format!(
                    "unknown: no KFD node at PCI {} in /sys/class/kfd/kfd/topology/nodes",
                    pci.as_deref().unwrap_or("?")
                ),
            ),
        };
        if let Ok(v) = std::env::var("HSA_OVERRIDE_GFX_VERSION")
            && !v.is_empty()
        {
            match kfd::override_arch(&v) {
                Some(o) => {
                    notes.push(format!(
                        "HSA_OVERRIDE_GFX_VERSION={v} is set: the GPU ({}) runs code built for \
                         {o}, which may not be what it is",
                        if arch.is_empty() {
                            "unknown arch"
                        } else {
                            &arch
                        }
                    ));
                    arch = o;
                    arch_source = "HSA_OVERRIDE_GFX_VERSION".to_string();
                }
                None => notes.push(format!(
                    "HSA_OVERRIDE_GFX_VERSION={v} is set but is not MAJOR.MINOR.STEPPING"
                )),
            }
        }
        Ok(DeviceInfo {
            backend: Some(RuntimeKind::Hip),
            ordinal,
            name,
            arch,
            arch_source,
            total_memory: total as u64,
            compute_units: cus.max(0) as u32,
            warp_size: warp.max(0) as u32,
            integrated: integrated != 0,
            pci_bus_id: pci,
            driver_version: ffi::decode_hip_version(self.driver_version),
            runtime_version: format!("HIP {} ({})", self.runtime_version(), self.library),
            notes,
        })
    }

    /// Every device, described.
    pub fn devices(&self) -> Result<Vec<DeviceInfo>, GpuError> {
        let n = self.device_count()?;
        (0..n).map(|i| self.describe(i)).collect()
    }

    /// Opens a device: makes it current and creates its one non-blocking stream.
    pub fn open(&self, ordinal: u32) -> Result<HipDevice, GpuError> {
        let info = self.describe(ordinal)?;
        // SAFETY: plain call.
        check("hipSetDevice", unsafe {
            (self.api.hipSetDevice)(ordinal as c_int)
        })?;
        CURRENT_DEVICE.with(|c| c.set(ordinal as c_int));
        let mut stream: HipStream = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("hipStreamCreateWithFlags", unsafe {
            (self.api.hipStreamCreateWithFlags)(&mut stream, ffi::HIP_STREAM_NON_BLOCKING)
        })?;
        let (rocblas, blas_absent) = match RocblasApi::load() {
            Ok(r) => match r.supports_arch(&info.arch) {
                Ok(()) => (Some(r), None),
                Err(why) => (None, Some(why)),
            },
            Err(why) => (None, Some(why)),
        };
        Ok(HipDevice {
            api: self.api.clone(),
            info,
            ordinal: ordinal as c_int,
            stream,
            current_on: Some(std::thread::current().id()),
            allocations: 0,
            rocblas,
            blas_absent,
            graphs: ffi::load_hip_graphs(&self.library).map(Arc::new),
        })
    }
}

/// Describes every HIP device, or says why there are none.
pub fn probe() -> Result<Vec<DeviceInfo>, GpuError> {
    HipRuntime::load()?.devices()
}

impl HipDevice {
    fn graph_api(&self) -> Result<Arc<ffi::HipGraphApi>, GpuError> {
        self.graphs
            .clone()
            .map_err(|why| GpuError::InvalidArgument(format!("no HIP graphs: {why}")))
    }
}

thread_local! {
    /// The device this thread last made current through a [`HipDevice`] (-1: none).
    static CURRENT_DEVICE: std::cell::Cell<c_int> = const { std::cell::Cell::new(-1) };
}

/// One opened HIP device.
pub struct HipDevice {
    api: Arc<HipApi>,
    info: DeviceInfo,
    ordinal: c_int,
    stream: HipStream,
    /// The thread on which `hipSetDevice` was last called (the current device is per thread).
    current_on: Option<ThreadId>,
    allocations: u64,
    rocblas: Option<RocblasApi>,
    blas_absent: Option<String>,
    /// The graph entry points, or why this runtime has none.
    graphs: Result<Arc<ffi::HipGraphApi>, String>,
}

// SAFETY: the HIP runtime is thread-safe; the stream handle is used by one owner at a time
// (`&mut self`), and `ensure_current` makes the device current on whichever thread that is.
unsafe impl Send for HipDevice {}

impl HipDevice {
    /// Makes this device current on the calling thread, unless it already is: with several
    /// GPUs in one process (a model split over them) the worker thread alternates between them,
    /// so "current on this thread" is per thread and per device.
    fn ensure_current(&mut self) -> Result<(), GpuError> {
        let me = std::thread::current().id();
        if self.current_on != Some(me) || CURRENT_DEVICE.with(|c| c.get()) != self.ordinal {
            // SAFETY: plain call.
            check("hipSetDevice", unsafe {
                (self.api.hipSetDevice)(self.ordinal)
            })?;
            CURRENT_DEVICE.with(|c| c.set(self.ordinal));
            self.current_on = Some(me);
        }
        Ok(())
    }

    fn live_stream(&self) -> Result<HipStream, GpuError> {
        if self.stream.is_null() {
            Err(GpuError::TornDown)
        } else {
            Ok(self.stream)
        }
    }

    fn rocblas(&self) -> Result<&RocblasApi, GpuError> {
        self.rocblas.as_ref().ok_or_else(|| {
            GpuError::InvalidArgument(format!(
                "rocBLAS is not in use: {}",
                self.blas_absent.as_deref().unwrap_or("absent")
            ))
        })
    }
}

fn rocblas_check(call: &'static str, s: rocblas::RocblasStatus) -> Result<(), GpuError> {
    if s == rocblas::ROCBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(GpuError::Runtime(RuntimeError {
            backend: RuntimeKind::Hip,
            call,
            code: s as i64,
            message: rocblas_status_text(s).to_string(),
        }))
    }
}

struct HipProbe {
    api: Arc<HipApi>,
}

impl EventProbe for HipProbe {
    fn query(&self, event: RawEvent) -> Result<bool, GpuError> {
        // SAFETY: the event handle stays valid until the device's teardown stops the prober.
        match unsafe { (self.api.hipEventQuery)(event.0 as *mut c_void) } {
            HIP_SUCCESS => Ok(true),
            ffi::HIP_ERROR_NOT_READY => Ok(false),
            code => Err(err("hipEventQuery", code)),
        }
    }
}

impl Device for HipDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Hip
    }

    fn mem_info(&mut self) -> Result<MemInfo, GpuError> {
        self.ensure_current()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t.
        check("hipMemGetInfo", unsafe {
            (self.api.hipMemGetInfo)(&mut free, &mut total)
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
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        check("hipMalloc", unsafe {
            (self.api.hipMalloc)(&mut p, bytes as usize)
        })?;
        self.allocations += 1;
        Ok(DevicePtr(p as u64))
    }

    unsafe fn free(&mut self, ptr: DevicePtr) -> Result<(), GpuError> {
        self.ensure_current()?;
        // SAFETY: the caller guarantees ptr came from hipMalloc and is idle.
        check("hipFree", unsafe {
            (self.api.hipFree)(ptr.0 as *mut c_void)
        })
    }

    fn alloc_pinned(&mut self, bytes: usize, mapped: bool) -> Result<PinnedRaw, GpuError> {
        self.ensure_current()?;
        let flags = if mapped {
            ffi::HIP_HOST_MALLOC_MAPPED
                | ffi::HIP_HOST_MALLOC_PORTABLE
                | ffi::HIP_HOST_MALLOC_COHERENT
        } else {
            ffi::HIP_HOST_MALLOC_DEFAULT
        };
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        check("hipHostMalloc", unsafe {
            (self.api.hipHostMalloc)(&mut p, bytes, flags)
        })?;
        let device = if mapped {
            let mut d: *mut c_void = std::ptr::null_mut();
            // SAFETY: p is mapped pinned memory from hipHostMalloc.
            let rc = unsafe { (self.api.hipHostGetDevicePointer)(&mut d, p, 0) };
            if rc != HIP_SUCCESS {
                // SAFETY: p came from hipHostMalloc above and is unused.
                unsafe { (self.api.hipHostFree)(p) };
                return Err(err("hipHostGetDevicePointer", rc));
            }
            Some(DevicePtr(d as u64))
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
        // SAFETY: the caller guarantees p came from alloc_pinned and is idle.
        check("hipHostFree", unsafe {
            (self.api.hipHostFree)(p.host as *mut c_void)
        })
    }

    unsafe fn host_register(&mut self, ptr: *const u8, bytes: usize) -> Result<bool, GpuError> {
        self.ensure_current()?;
        let flags = ffi::HIP_HOST_REGISTER_PORTABLE | ffi::HIP_HOST_REGISTER_READ_ONLY;
        // SAFETY: the caller keeps the range mapped until it is unregistered.
        let rc = unsafe { (self.api.hipHostRegister)(ptr as *mut c_void, bytes, flags) };
        Ok(rc == HIP_SUCCESS)
    }

    unsafe fn host_unregister(&mut self, ptr: *const u8) -> Result<(), GpuError> {
        self.ensure_current()?;
        // SAFETY: registered by host_register; the caller waited for its readers.
        check("hipHostUnregister", unsafe {
            (self.api.hipHostUnregister)(ptr as *mut c_void)
        })
    }

    fn create_event(&mut self) -> Result<RawEvent, GpuError> {
        self.ensure_current()?;
        let mut e: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("hipEventCreateWithFlags", unsafe {
            (self.api.hipEventCreateWithFlags)(&mut e, ffi::HIP_EVENT_DISABLE_TIMING)
        })?;
        Ok(RawEvent(e as u64))
    }

    fn create_timed_event(&mut self) -> Result<RawEvent, GpuError> {
        self.ensure_current()?;
        let mut e: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one handle; flags 0 is a default (timing) event.
        check("hipEventCreateWithFlags", unsafe {
            (self.api.hipEventCreateWithFlags)(&mut e, 0)
        })?;
        Ok(RawEvent(e as u64))
    }

    fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32, GpuError> {
        let mut ms = 0f32;
        // SAFETY: both events are ours, timed and recorded; writes one float.
        check("hipEventElapsedTime", unsafe {
            (self.api.hipEventElapsedTime)(&mut ms, start.0 as *mut c_void, end.0 as *mut c_void)
        })?;
        Ok(ms)
    }

    unsafe fn destroy_event(&mut self, e: RawEvent) -> Result<(), GpuError> {
        // SAFETY: caller guarantees e is ours and unused afterwards.
        check("hipEventDestroy", unsafe {
            (self.api.hipEventDestroy)(e.0 as *mut c_void)
        })
    }

    unsafe fn record_event(&mut self, e: RawEvent) -> Result<(), GpuError> {
        let s = self.live_stream()?;
        // SAFETY: e is ours; s is our live stream.
        check("hipEventRecord", unsafe {
            (self.api.hipEventRecord)(e.0 as *mut c_void, s)
        })
    }

    fn query_event(&self, e: RawEvent) -> Result<bool, GpuError> {
        HipProbe {
            api: self.api.clone(),
        }
        .query(e)
    }

    fn event_probe(&self) -> Arc<dyn EventProbe> {
        Arc::new(HipProbe {
            api: self.api.clone(),
        })
    }

    unsafe fn copy_h2d(
        &mut self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), GpuError> {
        let s = self.live_stream()?;
        // SAFETY: see the trait contract.
        check("hipMemcpyHtoDAsync", unsafe {
            (self.api.hipMemcpyHtoDAsync)(dst.0 as *mut c_void, src as *mut c_void, bytes, s)
        })
    }

    unsafe fn copy_d2h(
        &mut self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        let s = self.live_stream()?;
        // SAFETY: see the trait contract.
        check("hipMemcpyDtoHAsync", unsafe {
            (self.api.hipMemcpyDtoHAsync)(dst as *mut c_void, src.0 as *mut c_void, bytes, s)
        })
    }

    unsafe fn copy_d2d(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        let s = self.live_stream()?;
        // SAFETY: see the trait contract.
        check("hipMemcpyDtoDAsync", unsafe {
            (self.api.hipMemcpyDtoDAsync)(dst.0 as *mut c_void, src.0 as *mut c_void, bytes, s)
        })
    }

    fn peer_id(&self) -> Option<u64> {
        Some(self.ordinal as u64)
    }

    fn enable_peer(&mut self, peer: u64, _ordinal: u32) -> Result<bool, GpuError> {
        self.ensure_current()?;
        let mut can: c_int = 0;
        // SAFETY: writes one int.
        check("hipDeviceCanAccessPeer", unsafe {
            (self.api.hipDeviceCanAccessPeer)(&mut can, self.ordinal, peer as c_int)
        })?;
        if can == 0 {
            return Ok(false);
        }
        // SAFETY: plain call; access is enabled for the current device (this one).
        match unsafe { (self.api.hipDeviceEnablePeerAccess)(peer as c_int, 0) } {
            ffi::HIP_SUCCESS | ffi::HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(true),
            r => check("hipDeviceEnablePeerAccess", r).map(|_| false),
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
        check("hipMemcpyPeerAsync", unsafe {
            (self.api.hipMemcpyPeerAsync)(
                dst.0 as *mut c_void,
                self.ordinal,
                src.0 as *const c_void,
                peer as c_int,
                bytes,
                s,
            )
        })
    }

    unsafe fn wait_event(&mut self, e: RawEvent) -> Result<(), GpuError> {
        self.ensure_current()?;
        let s = self.live_stream()?;
        // SAFETY: see the trait contract.
        check("hipStreamWaitEvent", unsafe {
            (self.api.hipStreamWaitEvent)(s, e.0 as ffi::HipEvent, 0)
        })
    }

    fn load_module(&mut self, image: &[u8]) -> Result<RawModule, GpuError> {
        self.ensure_current()?;
        let mut m: *mut c_void = std::ptr::null_mut();
        // SAFETY: image is a complete code object in memory; the runtime copies it.
        check("hipModuleLoadData", unsafe {
            (self.api.hipModuleLoadData)(&mut m, image.as_ptr() as *const c_void)
        })?;
        Ok(RawModule(m as u64))
    }

    fn get_function(&mut self, m: RawModule, name: &str) -> Result<RawFunction, GpuError> {
        let c = CString::new(name)
            .map_err(|_| GpuError::InvalidArgument(format!("kernel name {name:?}")))?;
        let mut f: *mut c_void = std::ptr::null_mut();
        // SAFETY: m is a loaded module; c is NUL-terminated.
        check("hipModuleGetFunction", unsafe {
            (self.api.hipModuleGetFunction)(&mut f, m.0 as *mut c_void, c.as_ptr())
        })?;
        Ok(RawFunction(f as u64))
    }

    unsafe fn unload_module(&mut self, m: RawModule) -> Result<(), GpuError> {
        // SAFETY: caller guarantees nothing runs from m.
        check("hipModuleUnload", unsafe {
            (self.api.hipModuleUnload)(m.0 as *mut c_void)
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
        let s = self.live_stream()?;
        // SAFETY: caller guarantees params match the kernel.
        check("hipModuleLaunchKernel", unsafe {
            (self.api.hipModuleLaunchKernel)(
                f.0 as *mut c_void,
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
        match (&self.rocblas, &self.blas_absent) {
            (Some(r), _) => BlasAvailability::Present {
                library: r.path.clone(),
            },
            (None, why) => BlasAvailability::Absent {
                reason: why.clone().unwrap_or_else(|| "rocBLAS not loaded".into()),
            },
        }
    }

    fn create_blas(&mut self) -> Result<RawBlas, GpuError> {
        self.ensure_current()?;
        let s = self.live_stream()?;
        let r = self.rocblas()?;
        let mut h: RocblasHandle = std::ptr::null_mut();
        // SAFETY: writes one handle.
        rocblas_check("rocblas_create_handle", unsafe {
            (r.rocblas_create_handle)(&mut h)
        })?;
        // SAFETY: h is live; s is our stream.
        let bound = rocblas_check("rocblas_set_stream", unsafe {
            (r.rocblas_set_stream)(h, s)
        })
        .and_then(|()| {
            // SAFETY: h is live.
            rocblas_check("rocblas_set_pointer_mode", unsafe {
                (r.rocblas_set_pointer_mode)(h, rocblas::ROCBLAS_POINTER_MODE_DEVICE)
            })
        });
        if let Err(e) = bound {
            // SAFETY: h is live and dropped here.
            unsafe { (r.rocblas_destroy_handle)(h) };
            return Err(e);
        }
        Ok(RawBlas(h as u64))
    }

    fn blas_stream_is_ours(&self, h: RawBlas) -> Result<bool, GpuError> {
        let r = self.rocblas()?;
        let mut s: HipStream = std::ptr::null_mut();
        // SAFETY: h is a live handle; writes one stream handle.
        rocblas_check("rocblas_get_stream", unsafe {
            (r.rocblas_get_stream)(h.0 as RocblasHandle, &mut s)
        })?;
        Ok(s == self.stream && !s.is_null())
    }

    unsafe fn blas_set_workspace(
        &mut self,
        h: RawBlas,
        ptr: DevicePtr,
        bytes: u64,
    ) -> Result<(), GpuError> {
        let r = self.rocblas()?;
        // SAFETY: caller guarantees the range is device memory that outlives the handle.
        rocblas_check("rocblas_set_workspace", unsafe {
            (r.rocblas_set_workspace)(h.0 as RocblasHandle, ptr.0 as *mut c_void, bytes as usize)
        })
    }

    unsafe fn sgemm(&mut self, h: RawBlas, g: &GemmF32) -> Result<(), GpuError> {
        let r = self.rocblas()?;
        let op = |o: Op| match o {
            Op::N => rocblas::ROCBLAS_OPERATION_NONE,
            Op::T => rocblas::ROCBLAS_OPERATION_TRANSPOSE,
        };
        // SAFETY: caller guarantees the pointers and shapes; device pointer mode is set.
        rocblas_check("rocblas_sgemm", unsafe {
            (r.rocblas_sgemm)(
                h.0 as RocblasHandle,
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

    fn blas_has_f16(&self) -> bool {
        self.rocblas().is_ok_and(|r| r.rocblas_gemm_ex.is_some())
    }

    unsafe fn gemm_f16(&mut self, h: RawBlas, g: &GemmF32) -> Result<(), GpuError> {
        let r = self.rocblas()?;
        let f = r.rocblas_gemm_ex.ok_or_else(|| {
            GpuError::InvalidArgument(format!("{} has no rocblas_gemm_ex", r.path))
        })?;
        // SAFETY: the caller's guarantee, passed on.
        rocblas_check("rocblas_gemm_ex", unsafe {
            rocblas::gemm_ex_f16(f, h.0 as RocblasHandle, g)
        })
    }

    unsafe fn destroy_blas(&mut self, h: RawBlas) -> Result<(), GpuError> {
        let r = self.rocblas()?;
        // SAFETY: caller guarantees h is unused afterwards.
        rocblas_check("rocblas_destroy_handle", unsafe {
            (r.rocblas_destroy_handle)(h.0 as RocblasHandle)
        })
    }

    fn graph_support(&self) -> Result<(), String> {
        self.graphs.as_ref().map(|_| ()).map_err(Clone::clone)
    }

    fn begin_capture(&mut self) -> Result<(), GpuError> {
        let g = self.graph_api()?;
        let s = self.live_stream()?;
        // SAFETY: plain call on our live stream.
        check("hipStreamBeginCapture", unsafe {
            (g.hipStreamBeginCapture)(s, ffi::HIP_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        })
    }

    fn end_capture(&mut self) -> Result<RawGraph, GpuError> {
        let g = self.graph_api()?;
        let s = self.live_stream()?;
        let mut graph: ffi::HipGraph = std::ptr::null_mut();
        // SAFETY: ends the capture begun on our stream; writes one handle.
        check("hipStreamEndCapture", unsafe {
            (g.hipStreamEndCapture)(s, &mut graph)
        })?;
        let mut exec: ffi::HipGraphExec = std::ptr::null_mut();
        // SAFETY: `graph` is the template just captured; no error node or log is asked for.
        let r = check("hipGraphInstantiate", unsafe {
            (g.hipGraphInstantiate)(
                &mut exec,
                graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        });
        // SAFETY: the template is not used again (the executable graph keeps what it needs).
        let _ = unsafe { (g.hipGraphDestroy)(graph) };
        r.map(|()| RawGraph(exec as u64))
    }

    unsafe fn launch_graph(&mut self, graph: RawGraph) -> Result<(), GpuError> {
        let g = self.graph_api()?;
        let s = self.live_stream()?;
        // SAFETY: the caller's contract: an executable graph of this backend.
        check("hipGraphLaunch", unsafe {
            (g.hipGraphLaunch)(graph.0 as ffi::HipGraphExec, s)
        })
    }

    unsafe fn destroy_graph(&mut self, graph: RawGraph) -> Result<(), GpuError> {
        let g = self.graph_api()?;
        // SAFETY: the caller's contract: no replay of it still runs.
        check("hipGraphExecDestroy", unsafe {
            (g.hipGraphExecDestroy)(graph.0 as ffi::HipGraphExec)
        })
    }

    unsafe fn destroy_stream(&mut self) -> Result<(), GpuError> {
        let s = self.live_stream()?;
        self.stream = std::ptr::null_mut();
        // SAFETY: caller guarantees nothing is in flight.
        check("hipStreamDestroy", unsafe {
            (self.api.hipStreamDestroy)(s)
        })
    }
}
