//! nvrtc: compiles hipscope's `kernels/*.hip` sources (through the prelude) for an `sm_XX`.

use std::ffi::{CString, c_char, c_int};

use cudarc::nvrtc::sys as nvrtc;

use crate::gpu::device::{GpuError, RuntimeKind};
use crate::gpu::kernels::KernelCompiler;

use super::ffi::{CUDA_HINT, guarded};

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
                tried: super::ffi::library_names("nvrtc"),
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
    fn backend(&self) -> RuntimeKind {
        RuntimeKind::Cuda
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
