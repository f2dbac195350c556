//! The CUDA driver API as hipscope uses it (through cudarc's dynamically loaded bindings): error
//! conversion, the panic guard for a library cudarc cannot load, and probing devices.

use std::ffi::{CStr, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::sys as cu;

use crate::gpu::device::{DeviceInfo, GpuError, RuntimeError, RuntimeKind};

pub(super) const CUDA_HINT: &str = "install the NVIDIA driver (libcuda.so.1) and the CUDA toolkit's nvrtc \
                         and cuBLAS libraries, or put them on LD_LIBRARY_PATH";

pub(super) fn cu_err(call: &'static str, r: cu::CUresult) -> GpuError {
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
        backend: RuntimeKind::Cuda,
        call,
        code: r as u32 as i64,
        message: msg,
    })
}

pub(super) fn check(call: &'static str, r: cu::CUresult) -> Result<(), GpuError> {
    if r == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(cu_err(call, r))
    }
}

/// Runs `f`, turning a cudarc panic (a library or symbol it could not load) into an error.
pub(super) fn guarded<T>(
    what: &'static str,
    f: impl FnOnce() -> Result<T, GpuError>,
) -> Result<T, GpuError> {
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
pub(super) fn library_names(lib: &str) -> Vec<String> {
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

pub(super) fn require_driver() -> Result<(), GpuError> {
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
                backend: RuntimeKind::Cuda,
                detail: format!("cuInit: {}", cu_err("cuInit", r)),
            });
        }
        let mut n: c_int = 0;
        check("cuDeviceGetCount", unsafe { cu::cuDeviceGetCount(&mut n) })?;
        if n <= 0 {
            return Err(GpuError::NoDevice {
                backend: RuntimeKind::Cuda,
                detail: "cuDeviceGetCount returned 0".into(),
            });
        }
        Ok(n as u32)
    })
}

pub(super) fn attr(dev: cu::CUdevice, a: cu::CUdevice_attribute) -> Result<i32, GpuError> {
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
            backend: Some(RuntimeKind::Cuda),
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
