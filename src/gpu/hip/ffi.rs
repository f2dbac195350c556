//! The HIP runtime and hiprtc, loaded at run time with `libloading`: only the symbols hipscope
//! uses, with the exact C signatures of `hip_runtime_api.h` / `hiprtc.h` (checked against Debian's
//! ROCm 5.2.3 headers and ROCm 7's). No `hipDeviceProp_t` (its layout changed in ROCm 6); device
//! facts come from `hipDeviceGetAttribute`, `hipDeviceGetName` and KFD topology.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::Path;

use libloading::Library;

use crate::gpu::device::GpuError;

pub type HipError = c_int;
pub type HipStream = *mut c_void;
pub type HipEvent = *mut c_void;
pub type HipModule = *mut c_void;
pub type HipFunction = *mut c_void;
pub type HiprtcProgram = *mut c_void;
pub type HiprtcResult = c_int;

pub const HIP_SUCCESS: HipError = 0;
pub const HIP_ERROR_NOT_READY: HipError = 600;
pub const HIP_ERROR_NO_DEVICE: HipError = 100;
pub const HIP_ERROR_INVALID_DEVICE: HipError = 101;
/// `hipDeviceEnablePeerAccess` on a pair already enabled.
pub const HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED: HipError = 704;

pub const HIP_STREAM_NON_BLOCKING: c_uint = 0x01;
pub const HIP_EVENT_DISABLE_TIMING: c_uint = 0x02;
pub const HIP_HOST_MALLOC_DEFAULT: c_uint = 0x0;
/// `hipHostRegisterPortable`, `hipHostRegisterReadOnly` (hip_runtime_api.h).
pub const HIP_HOST_REGISTER_PORTABLE: c_uint = 0x1;
pub const HIP_HOST_REGISTER_READ_ONLY: c_uint = 0x8;
pub const HIP_HOST_MALLOC_PORTABLE: c_uint = 0x1;
pub const HIP_HOST_MALLOC_MAPPED: c_uint = 0x2;
/// Coherent host memory: device writes (breadcrumbs) and host writes (flags) are visible to the
/// other side without a kernel boundary.
pub const HIP_HOST_MALLOC_COHERENT: c_uint = 0x4000_0000;

/// `hipDeviceAttribute_t` values: identical in ROCm 5.2 and ROCm 7 (the CUDA-compatible block
/// was renumbered before 5.0 and has only grown at its end since).
pub mod attr {
    use std::ffi::c_int;
    pub const INTEGRATED: c_int = 16;
    pub const MULTIPROCESSOR_COUNT: c_int = 63;
    pub const PCI_BUS_ID: c_int = 67;
    pub const PCI_DEVICE_ID: c_int = 68;
    pub const PCI_DOMAIN_ID: c_int = 69;
    pub const WARP_SIZE: c_int = 87;
}

/// Library file names to try, newest first.
#[cfg(target_os = "linux")]
pub const HIP_LIBRARY_NAMES: &[&str] = &[
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "libamdhip64.so",
];
#[cfg(windows)]
pub const HIP_LIBRARY_NAMES: &[&str] = &["amdhip64_7.dll", "amdhip64_6.dll", "amdhip64.dll"];
#[cfg(not(any(target_os = "linux", windows)))]
pub const HIP_LIBRARY_NAMES: &[&str] = &[];

/// hiprtc is its own library on ROCm ≥ 6 and part of libamdhip64 on 5.x.
#[cfg(target_os = "linux")]
pub const HIPRTC_LIBRARY_NAMES: &[&str] = &["libhiprtc.so.7", "libhiprtc.so.6"];
#[cfg(windows)]
pub const HIPRTC_LIBRARY_NAMES: &[&str] = &["hiprtc0701.dll", "hiprtc0605.dll"];
#[cfg(not(any(target_os = "linux", windows)))]
pub const HIPRTC_LIBRARY_NAMES: &[&str] = &[];

/// What to tell a user whose system lacks the runtime.
pub const HIP_INSTALL_HINT: &str = "install the HIP runtime (Debian/Ubuntu: `apt install \
     libamdhip64-5` or libamdhip64-dev; ROCm: the rocm-hip-runtime package) or set \
     HIPSCOPE_HIP_LIBRARY to the full path of libamdhip64";

macro_rules! symbol_table {
    ($table:ident, $names:ident, $what:literal; $( $name:ident : fn( $($arg:ty),* ) -> $ret:ty ; )* ) => {
        /// Resolved entry points; the library stays loaded as long as this value lives.
        #[allow(non_snake_case)]
        pub struct $table {
            // Never unloaded: dlclose of the HIP runtime runs its destructors, which can wait on
            // streams forever (pytorch#160759, ROCm/TheRock#999).
            _lib: std::mem::ManuallyDrop<Library>,
            $( pub $name: unsafe extern "C" fn($($arg),*) -> $ret, )*
        }

        /// Every symbol this table resolves, for tests and `doctor`.
        pub const $names: &[&str] = &[ $( stringify!($name) ),* ];

        impl $table {
            /// Resolves every symbol from `lib` (named `path` in messages).
            #[allow(non_snake_case)]
            pub fn resolve(lib: Library, path: &str) -> Result<Self, GpuError> {
                $(
                    // SAFETY: the type is the symbol's exact C signature from the HIP headers.
                    let $name = unsafe {
                        lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(
                            concat!(stringify!($name), "\0").as_bytes(),
                        )
                    }
                    .map(|s| *s)
                    .map_err(|e| GpuError::SymbolMissing {
                        library: path.to_string(),
                        symbol: stringify!($name),
                        hint: format!("{e}; this {} is too old or not a HIP runtime", $what),
                    })?;
                )*
                Ok($table { _lib: std::mem::ManuallyDrop::new(lib), $( $name, )* })
            }
        }
    };
}

symbol_table! {
    HipApi, HIP_SYMBOLS, "libamdhip64";
    hipInit: fn(c_uint) -> HipError;
    hipGetDeviceCount: fn(*mut c_int) -> HipError;
    hipSetDevice: fn(c_int) -> HipError;
    hipDeviceGetAttribute: fn(*mut c_int, c_int, c_int) -> HipError;
    hipDeviceGetName: fn(*mut c_char, c_int, c_int) -> HipError;
    hipDeviceTotalMem: fn(*mut usize, c_int) -> HipError;
    hipDeviceGetPCIBusId: fn(*mut c_char, c_int, c_int) -> HipError;
    hipMemGetInfo: fn(*mut usize, *mut usize) -> HipError;
    hipDriverGetVersion: fn(*mut c_int) -> HipError;
    hipRuntimeGetVersion: fn(*mut c_int) -> HipError;
    hipMalloc: fn(*mut *mut c_void, usize) -> HipError;
    hipFree: fn(*mut c_void) -> HipError;
    hipHostMalloc: fn(*mut *mut c_void, usize, c_uint) -> HipError;
    hipHostFree: fn(*mut c_void) -> HipError;
    hipHostGetDevicePointer: fn(*mut *mut c_void, *mut c_void, c_uint) -> HipError;
    hipHostRegister: fn(*mut c_void, usize, c_uint) -> HipError;
    hipHostUnregister: fn(*mut c_void) -> HipError;
    hipStreamCreateWithFlags: fn(*mut HipStream, c_uint) -> HipError;
    hipStreamDestroy: fn(HipStream) -> HipError;
    hipEventCreateWithFlags: fn(*mut HipEvent, c_uint) -> HipError;
    hipEventDestroy: fn(HipEvent) -> HipError;
    hipEventRecord: fn(HipEvent, HipStream) -> HipError;
    hipEventQuery: fn(HipEvent) -> HipError;
    hipEventElapsedTime: fn(*mut f32, HipEvent, HipEvent) -> HipError;
    hipMemcpyHtoDAsync: fn(*mut c_void, *mut c_void, usize, HipStream) -> HipError;
    hipMemcpyDtoHAsync: fn(*mut c_void, *mut c_void, usize, HipStream) -> HipError;
    hipMemcpyDtoDAsync: fn(*mut c_void, *mut c_void, usize, HipStream) -> HipError;
    hipDeviceCanAccessPeer: fn(*mut c_int, c_int, c_int) -> HipError;
    hipDeviceEnablePeerAccess: fn(c_int, c_uint) -> HipError;
    hipMemcpyPeerAsync: fn(*mut c_void, c_int, *const c_void, c_int, usize, HipStream) -> HipError;
    hipStreamWaitEvent: fn(HipStream, HipEvent, c_uint) -> HipError;
    hipModuleLoadData: fn(*mut HipModule, *const c_void) -> HipError;
    hipModuleGetFunction: fn(*mut HipFunction, HipModule, *const c_char) -> HipError;
    hipModuleUnload: fn(HipModule) -> HipError;
    hipModuleLaunchKernel: fn(
        HipFunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, HipStream,
        *mut *mut c_void, *mut *mut c_void
    ) -> HipError;
}

pub type HipGraph = *mut c_void;
pub type HipGraphExec = *mut c_void;
/// `hipStreamCaptureModeThreadLocal`: other threads' HIP calls do not invalidate the capture.
pub const HIP_STREAM_CAPTURE_MODE_THREAD_LOCAL: c_int = 1;

symbol_table! {
    HipGraphApi, HIP_GRAPH_SYMBOLS, "libamdhip64 (graph entry points, ROCm >= 5.3)";
    hipStreamBeginCapture: fn(HipStream, c_int) -> HipError;
    hipStreamEndCapture: fn(HipStream, *mut HipGraph) -> HipError;
    hipGraphInstantiate: fn(*mut HipGraphExec, HipGraph, *mut c_void, *mut c_char, usize) -> HipError;
    hipGraphLaunch: fn(HipGraphExec, HipStream) -> HipError;
    hipGraphExecDestroy: fn(HipGraphExec) -> HipError;
    hipGraphDestroy: fn(HipGraph) -> HipError;
}

/// The graph entry points from the HIP library `name` (already loaded by [`load_hip`]), or why
/// not: an older runtime lacks them, and graphs are then off with this reason.
pub fn load_hip_graphs(name: &str) -> Result<HipGraphApi, String> {
    // SAFETY: the library is already loaded in this process (a reference count); no symbol is
    // used before its signature is checked by name.
    let lib = unsafe { Library::new(name) }.map_err(|e| format!("{name}: {e}"))?;
    HipGraphApi::resolve(lib, name).map_err(|e| e.to_string())
}

symbol_table! {
    HiprtcApi, HIPRTC_SYMBOLS, "hiprtc library";
    hiprtcVersion: fn(*mut c_int, *mut c_int) -> HiprtcResult;
    hiprtcCreateProgram: fn(
        *mut HiprtcProgram, *const c_char, *const c_char, c_int, *const *const c_char,
        *const *const c_char
    ) -> HiprtcResult;
    hiprtcCompileProgram: fn(HiprtcProgram, c_int, *const *const c_char) -> HiprtcResult;
    hiprtcGetProgramLogSize: fn(HiprtcProgram, *mut usize) -> HiprtcResult;
    hiprtcGetProgramLog: fn(HiprtcProgram, *mut c_char) -> HiprtcResult;
    hiprtcGetCodeSize: fn(HiprtcProgram, *mut usize) -> HiprtcResult;
    hiprtcGetCode: fn(HiprtcProgram, *mut c_char) -> HiprtcResult;
    hiprtcDestroyProgram: fn(*mut HiprtcProgram) -> HiprtcResult;
}

/// Opens the first library of `names` that loads, or the file named by `env_override`.
/// Returns the library and the name it was found under.
pub fn open_first(env_override: &str, names: &[&str]) -> Result<(Library, String), Vec<String>> {
    let mut tried = Vec::new();
    let mut candidates: Vec<String> = Vec::new();
    if let Ok(p) = std::env::var(env_override)
        && !p.is_empty()
    {
        candidates.push(p);
    }
    candidates.extend(names.iter().map(|s| s.to_string()));
    for name in candidates {
        // SAFETY: loading a shared library runs its initialisers; the HIP runtime's are what
        // every HIP program runs. No symbol is used before its signature is checked by name.
        match unsafe { Library::new(&name) } {
            Ok(lib) => return Ok((lib, name)),
            Err(e) => tried.push(format!("{name} ({})", short_dl_error(&e.to_string()))),
        }
    }
    Err(tried)
}

fn short_dl_error(e: &str) -> String {
    if e.contains("No such file") || e.contains("cannot open shared object") {
        "not found".to_string()
    } else {
        e.to_string()
    }
}

/// Loads the HIP runtime. The name it was found under tells the ROCm major version.
pub fn load_hip() -> Result<(HipApi, String), GpuError> {
    let (lib, name) = open_first("HIPSCOPE_HIP_LIBRARY", HIP_LIBRARY_NAMES).map_err(|tried| {
        GpuError::LibraryMissing {
            what: "HIP runtime (libamdhip64)",
            tried,
            hint: HIP_INSTALL_HINT.to_string(),
        }
    })?;
    let api = HipApi::resolve(lib, &name)?;
    Ok((api, name))
}

/// Loads hiprtc: its own library on ROCm ≥ 6, else the HIP runtime library itself (5.x).
pub fn load_hiprtc(hip_library_name: &str) -> Result<(HiprtcApi, String), GpuError> {
    let mut tried = Vec::new();
    match open_first("HIPSCOPE_HIPRTC_LIBRARY", HIPRTC_LIBRARY_NAMES) {
        Ok((lib, name)) => return Ok((HiprtcApi::resolve(lib, &name)?, name)),
        Err(t) => tried.extend(t),
    }
    // SAFETY: as in `open_first`; this library is already loaded by `load_hip`, so this only
    // takes another reference to it.
    match unsafe { Library::new(hip_library_name) } {
        Ok(lib) => HiprtcApi::resolve(lib, hip_library_name)
            .map(|api| (api, hip_library_name.to_string()))
            .map_err(|e| match e {
                GpuError::SymbolMissing { symbol, .. } => GpuError::LibraryMissing {
                    what: "hiprtc (the HIP runtime compiler)",
                    tried: {
                        tried.push(format!("{hip_library_name} (no {symbol})"));
                        tried.clone()
                    },
                    hint: "install hiprtc (Debian: libamdhip64-5 carries it in ROCm 5.x; ROCm 6+: \
                           the hiprtc package)"
                        .to_string(),
                },
                other => other,
            }),
        Err(e) => {
            tried.push(format!("{hip_library_name} ({e})"));
            Err(GpuError::LibraryMissing {
                what: "hiprtc (the HIP runtime compiler)",
                tried,
                hint: HIP_INSTALL_HINT.to_string(),
            })
        }
    }
}

/// Our own text for HIP status codes (ROCm 5.2's `hipGetErrorString` returns only the name).
pub fn hip_error_text(code: HipError) -> &'static str {
    match code {
        0 => "success",
        1 => "invalid value",
        2 => "out of device memory",
        3 => "runtime not initialised (no usable GPU or driver)",
        4 => "runtime already shut down",
        17 => "invalid device pointer",
        35 => "installed driver is older than the runtime",
        98 => "invalid device function (code object built for another arch?)",
        100 => "no HIP-capable device",
        101 => "invalid device ordinal",
        200 => "invalid code object image",
        209 => "no code object for this GPU's arch",
        218 => "invalid kernel file",
        301 => "file not found",
        400 => "invalid handle",
        500 => "named symbol not found",
        600 => "not ready",
        700 => "illegal memory access on the device (memory fault)",
        701 => "launch out of resources",
        702 => "launch timed out",
        709 => "context destroyed",
        719 => "kernel failed on the device",
        801 => "not supported",
        999 => "unknown error",
        1052 => "HSA runtime memory error",
        1053 => "HSA runtime error",
        _ => "unrecognised HIP status",
    }
}

pub fn hiprtc_error_text(code: HiprtcResult) -> &'static str {
    match code {
        0 => "success",
        1 => "out of memory",
        2 => "program creation failed",
        3 => "invalid input",
        4 => "invalid program",
        5 => "invalid option",
        6 => "compilation failed",
        7 => "builtin operation failed",
        11 => "internal error",
        _ => "unrecognised hiprtc status",
    }
}

/// `50221153` → `5.2.21153` (HIP_VERSION = major·10⁷ + minor·10⁵ + patch).
pub fn decode_hip_version(v: c_int) -> String {
    if v <= 0 {
        return format!("{v}");
    }
    let v = v as i64;
    format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
}

/// `(major, minor)` of a HIP version number.
pub fn hip_version_pair(v: c_int) -> (u32, u32) {
    let v = v.max(0) as u32;
    (v / 10_000_000, (v / 100_000) % 100)
}

/// Where the runtime library lives on disk, from the address of one of its functions.
#[cfg(unix)]
pub fn library_path_of(symbol_addr: usize) -> Option<std::path::PathBuf> {
    let symbol = symbol_addr as *const c_void;
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads its first argument as an address and fills `info`.
    let ok = unsafe { libc::dladdr(symbol, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the dynamic loader.
    let s = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let p = Path::new(std::ffi::OsStr::new(&*s.to_string_lossy())).to_path_buf();
    std::fs::canonicalize(&p).ok().or(Some(p))
}

#[cfg(not(unix))]
pub fn library_path_of(_symbol_addr: usize) -> Option<std::path::PathBuf> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hip_versions_decode_like_hip_version_h() {
        // Debian bookworm's libamdhip64 5.2.3 reports 50221153.
        assert_eq!(decode_hip_version(50221153), "5.2.21153");
        assert_eq!(hip_version_pair(50221153), (5, 2));
        assert_eq!(hip_version_pair(60443483), (6, 4));
        assert_eq!(decode_hip_version(-1), "-1");
    }

    #[test]
    fn every_symbol_is_listed_once() {
        let mut all: Vec<&str> = HIP_SYMBOLS.iter().chain(HIPRTC_SYMBOLS).copied().collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
        assert!(HIP_SYMBOLS.contains(&"hipModuleLoadData"));
        // The null-stream APIs are deliberately not bound.
        for forbidden in [
            "hipMemcpy",
            "hipMemset",
            "hipDeviceSynchronize",
            "hipStreamQuery",
        ] {
            assert!(
                !HIP_SYMBOLS.contains(&forbidden),
                "{forbidden} must not be bound"
            );
        }
    }
}
