//! rocBLAS, loaded at run time. Absent on Debian bookworm, and without kernels for some archs on
//! others (no Debian rocBLAS ships gfx1151); rocBLAS aborts the process when it finds no Tensile
//! library for the GPU, so hipscope looks for the arch's files before creating a handle and falls
//! back to its own GEMM kernel otherwise.

use std::ffi::{c_float, c_int, c_void};
use std::path::{Path, PathBuf};

use libloading::Library;

use crate::gpu::device::{GemmF32, GpuError, Op};
use crate::gpu::hip::ffi::{HipStream, library_path_of, open_first};

pub type RocblasHandle = *mut c_void;
pub type RocblasStatus = c_int;

pub const ROCBLAS_STATUS_SUCCESS: RocblasStatus = 0;
pub const ROCBLAS_OPERATION_NONE: c_int = 111;
pub const ROCBLAS_OPERATION_TRANSPOSE: c_int = 112;
pub const ROCBLAS_POINTER_MODE_DEVICE: c_int = 1;
/// rocblas_datatype_f16_r, rocblas_datatype_f32_r; rocblas_gemm_algo_standard.
pub const ROCBLAS_DATATYPE_F16_R: c_int = 150;
pub const ROCBLAS_DATATYPE_F32_R: c_int = 151;
pub const ROCBLAS_GEMM_ALGO_STANDARD: c_int = 0;

/// rocblas_gemm_ex (rocblas-functions.h): handle, transA, transB, m, n, k, alpha, a, a_type,
/// lda, b, b_type, ldb, beta, c, c_type, ldc, d, d_type, ldd, compute_type, algo,
/// solution_index, flags.
pub type RocblasGemmEx = unsafe extern "C" fn(
    RocblasHandle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    *mut c_void,
    c_int,
    c_int,
    c_int,
    c_int,
    i32,
    u32,
) -> RocblasStatus;

/// `g` with A and B f16, C (and D, the same buffer) f32, f32 accumulation.
///
/// # Safety
/// `h` is a live handle in device pointer mode; `g`'s pointers are device memory large enough
/// for its shapes.
pub unsafe fn gemm_ex_f16(f: RocblasGemmEx, h: RocblasHandle, g: &GemmF32) -> RocblasStatus {
    let op = |o: Op| match o {
        Op::N => ROCBLAS_OPERATION_NONE,
        Op::T => ROCBLAS_OPERATION_TRANSPOSE,
    };
    // SAFETY: the caller's guarantee.
    unsafe {
        f(
            h,
            op(g.transa),
            op(g.transb),
            g.m,
            g.n,
            g.k,
            g.alpha.0 as *const c_void,
            g.a.0 as *const c_void,
            ROCBLAS_DATATYPE_F16_R,
            g.lda,
            g.b.0 as *const c_void,
            ROCBLAS_DATATYPE_F16_R,
            g.ldb,
            g.beta.0 as *const c_void,
            g.c.0 as *const c_void,
            ROCBLAS_DATATYPE_F32_R,
            g.ldc,
            g.c.0 as *mut c_void,
            ROCBLAS_DATATYPE_F32_R,
            g.ldc,
            ROCBLAS_DATATYPE_F32_R,
            ROCBLAS_GEMM_ALGO_STANDARD,
            0,
            0,
        )
    }
}

#[cfg(target_os = "linux")]
pub const ROCBLAS_LIBRARY_NAMES: &[&str] =
    &["librocblas.so.5", "librocblas.so.4", "librocblas.so.0"];
#[cfg(windows)]
pub const ROCBLAS_LIBRARY_NAMES: &[&str] = &["rocblas.dll"];
#[cfg(not(any(target_os = "linux", windows)))]
pub const ROCBLAS_LIBRARY_NAMES: &[&str] = &[];

/// rocBLAS entry points (rocblas-auxiliary.h, rocblas-functions.h; rocblas_int is 32-bit).
#[allow(non_snake_case)]
pub struct RocblasApi {
    // Never unloaded (see ffi.rs): rocBLAS's destructors unregister fat binaries, which waits on
    // every stream.
    _lib: std::mem::ManuallyDrop<Library>,
    pub path: String,
    pub rocblas_create_handle: unsafe extern "C" fn(*mut RocblasHandle) -> RocblasStatus,
    pub rocblas_destroy_handle: unsafe extern "C" fn(RocblasHandle) -> RocblasStatus,
    pub rocblas_set_stream: unsafe extern "C" fn(RocblasHandle, HipStream) -> RocblasStatus,
    pub rocblas_get_stream: unsafe extern "C" fn(RocblasHandle, *mut HipStream) -> RocblasStatus,
    pub rocblas_set_pointer_mode: unsafe extern "C" fn(RocblasHandle, c_int) -> RocblasStatus,
    pub rocblas_set_workspace:
        unsafe extern "C" fn(RocblasHandle, *mut c_void, usize) -> RocblasStatus,
    #[allow(clippy::type_complexity)]
    pub rocblas_sgemm: unsafe extern "C" fn(
        RocblasHandle,
        c_int,
        c_int,
        c_int,
        c_int,
        c_int,
        *const c_float,
        *const c_float,
        c_int,
        *const c_float,
        c_int,
        *const c_float,
        *mut c_float,
        c_int,
    ) -> RocblasStatus,
    /// Absent from old rocBLAS builds: the prefill then uses hipscope's own f16 kernel.
    pub rocblas_gemm_ex: Option<RocblasGemmEx>,
}

pub const ROCBLAS_SYMBOLS: &[&str] = &[
    "rocblas_create_handle",
    "rocblas_destroy_handle",
    "rocblas_set_stream",
    "rocblas_get_stream",
    "rocblas_set_pointer_mode",
    "rocblas_set_workspace",
    "rocblas_sgemm",
];

macro_rules! sym {
    ($lib:expr, $path:expr, $name:literal) => {
        // SAFETY: the field type is the symbol's C signature from the rocBLAS headers.
        unsafe { $lib.get(concat!($name, "\0").as_bytes()) }
            .map(|s: libloading::Symbol<'_, _>| *s)
            .map_err(|e| GpuError::SymbolMissing {
                library: $path.to_string(),
                symbol: $name,
                hint: format!("{e}; rocBLAS too old"),
            })?
    };
}

impl RocblasApi {
    /// Loads rocBLAS, or says why not (absent is normal on Debian bookworm).
    pub fn load() -> Result<RocblasApi, String> {
        let (lib, path) = open_first("HIPSCOPE_ROCBLAS_LIBRARY", ROCBLAS_LIBRARY_NAMES)
            .map_err(|tried| format!("rocBLAS not found (tried {})", tried.join(", ")))?;
        Self::resolve(lib, path).map_err(|e| e.to_string())
    }

    fn resolve(lib: Library, path: String) -> Result<RocblasApi, GpuError> {
        Ok(RocblasApi {
            rocblas_create_handle: sym!(lib, path, "rocblas_create_handle"),
            rocblas_destroy_handle: sym!(lib, path, "rocblas_destroy_handle"),
            rocblas_set_stream: sym!(lib, path, "rocblas_set_stream"),
            rocblas_get_stream: sym!(lib, path, "rocblas_get_stream"),
            rocblas_set_pointer_mode: sym!(lib, path, "rocblas_set_pointer_mode"),
            rocblas_set_workspace: sym!(lib, path, "rocblas_set_workspace"),
            rocblas_sgemm: sym!(lib, path, "rocblas_sgemm"),
            // SAFETY: the type is the symbol's C signature (rocblas-functions.h).
            rocblas_gemm_ex: unsafe { lib.get::<RocblasGemmEx>(b"rocblas_gemm_ex\0") }
                .ok()
                .map(|s| *s),
            _lib: std::mem::ManuallyDrop::new(lib),
            path,
        })
    }

    /// Where rocBLAS keeps its Tensile kernel files.
    pub fn tensile_dirs(&self) -> Vec<PathBuf> {
        if let Ok(p) = std::env::var("ROCBLAS_TENSILE_LIBPATH")
            && !p.is_empty()
        {
            return vec![PathBuf::from(p)];
        }
        let Some(lib) = library_path_of(self.rocblas_create_handle as usize) else {
            return Vec::new();
        };
        let Some(dir) = lib.parent() else {
            return Vec::new();
        };
        // ROCm: <lib>/rocblas/library; Debian: <lib>/rocblas/<version>/library.
        let mut out = Vec::new();
        let base = dir.join("rocblas");
        if base.join("library").is_dir() {
            out.push(base.join("library"));
        }
        if let Ok(rd) = std::fs::read_dir(&base) {
            for e in rd.flatten() {
                let p = e.path().join("library");
                if p.is_dir() {
                    out.push(p);
                }
            }
        }
        out
    }

    /// Whether rocBLAS ships kernels for `arch`; `Err` says why not.
    pub fn supports_arch(&self, arch: &str) -> Result<(), String> {
        if std::env::var("HIPSCOPE_ROCBLAS_TRUST_ARCH").is_ok_and(|v| v == "1") {
            return Ok(());
        }
        let dirs = self.tensile_dirs();
        if dirs.is_empty() {
            return Err(format!(
                "cannot find rocBLAS's kernel library next to {} to check for {arch} \
                 (set ROCBLAS_TENSILE_LIBPATH, or HIPSCOPE_ROCBLAS_TRUST_ARCH=1)",
                self.path
            ));
        }
        if dirs.iter().any(|d| dir_mentions_arch(d, arch)) {
            Ok(())
        } else {
            Err(format!(
                "{} has no kernels for {arch} in {}",
                self.path,
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
    }
}

/// Whether a file under `dir` is named for `arch` (`TensileLibrary_lazy_gfx1100.dat`,
/// `Kernels.so-000-gfx90a-xnack-.hsaco`), matched as a whole target name.
pub fn dir_mentions_arch(dir: &Path, arch: &str) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    rd.flatten().any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name_mentions_arch(&name, arch)
    })
}

fn name_mentions_arch(name: &str, arch: &str) -> bool {
    let mut start = 0;
    while let Some(i) = name[start..].find(arch) {
        let end = start + i + arch.len();
        // gfx110 must not match gfx1100: the next character may not continue the target name.
        match name[end..].chars().next() {
            Some(c) if c.is_ascii_alphanumeric() => start = end,
            _ => return true,
        }
    }
    false
}

pub fn rocblas_status_text(s: RocblasStatus) -> &'static str {
    match s {
        0 => "success",
        1 => "invalid handle",
        2 => "not implemented",
        3 => "invalid pointer",
        4 => "invalid size",
        5 => "memory error",
        6 => "internal error",
        7 => "performance degraded",
        8 => "size query mismatch",
        9 => "size increased",
        10 => "size unchanged",
        11 => "invalid value",
        12 => "continue",
        13 => "check numerics failed",
        14 => "excluded from build",
        15 => "arch mismatch (no kernels for this GPU)",
        _ => "unrecognised rocBLAS status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names_match_whole_targets_only() {
        assert!(name_mentions_arch(
            "TensileLibrary_lazy_gfx1100.dat",
            "gfx1100"
        ));
        assert!(name_mentions_arch(
            "Kernels.so-000-gfx90a-xnack-.hsaco",
            "gfx90a"
        ));
        assert!(!name_mentions_arch(
            "TensileLibrary_lazy_gfx1100.dat",
            "gfx110"
        ));
        assert!(!name_mentions_arch(
            "TensileLibrary_lazy_gfx1100.dat",
            "gfx1151"
        ));
        assert!(name_mentions_arch("x_gfx1151_gfx1151.co", "gfx1151"));
    }
}
