//! hiprtc: compiles kernels/*.hip for an explicit `--offload-arch` into code objects that
//! `hipModuleLoadData` loads. The compiler can abort the whole process for targets its LLVM does
//! not know (Debian's ROCm 5.2 on gfx11, 5.7 on gfx12), so the app compiles in a child process
//! (see `gpu::kernels`) and refuses pairings known to be bad up front.

use std::ffi::{CString, c_char, c_int};

use crate::gpu::device::{GpuError, RuntimeKind};
use crate::gpu::hip::ffi::{
    self, HIP_SUCCESS, HiprtcApi, HiprtcProgram, decode_hip_version, hip_version_pair,
    hiprtc_error_text,
};
use crate::gpu::kernels::KernelCompiler;

pub struct Hiprtc {
    api: HiprtcApi,
    library: String,
    runtime_version: c_int,
}

impl Hiprtc {
    /// Loads the HIP runtime (for its version) and hiprtc.
    pub fn load() -> Result<Hiprtc, GpuError> {
        let (hip, hip_name) = ffi::load_hip()?;
        let mut v: c_int = 0;
        // SAFETY: writes one int; needs no device (works on machines without a GPU).
        let rc = unsafe { (hip.hipRuntimeGetVersion)(&mut v) };
        if rc != HIP_SUCCESS {
            v = 0;
        }
        let (api, library) = ffi::load_hiprtc(&hip_name)?;
        Ok(Hiprtc {
            api,
            library,
            runtime_version: v,
        })
    }

    pub fn library(&self) -> &str {
        &self.library
    }

    /// The HIP runtime version this hiprtc belongs to, `(major, minor)`.
    pub fn hip_version(&self) -> (u32, u32) {
        hip_version_pair(self.runtime_version)
    }

    fn log(&self, prog: HiprtcProgram) -> String {
        let mut n: usize = 0;
        // SAFETY: prog is a live program; the call writes one size_t.
        if unsafe { (self.api.hiprtcGetProgramLogSize)(prog, &mut n) } != 0 || n == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; n + 1];
        // SAFETY: buf holds the n bytes the log size call promised, plus a NUL.
        if unsafe { (self.api.hiprtcGetProgramLog)(prog, buf.as_mut_ptr() as *mut c_char) } != 0 {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).trim_end().to_string()
    }
}

/// Whether this ROCm's compiler is known to handle `arch`. `Err` names the reason: these
/// pairings abort inside comgr rather than failing cleanly (measured with Debian bookworm's
/// ROCm 5.2 and trixie's 5.7.1; `tests/hip_gfx11.rs` checks the refusal in a trixie chroot).
pub fn known_bad_pairing(hip: (u32, u32), arch: &str) -> Result<(), String> {
    let gfx11 = arch.starts_with("gfx11");
    let gfx115 = arch.starts_with("gfx115");
    let gfx12 = arch.starts_with("gfx12");
    if hip < (5, 5) && (gfx11 || gfx12) {
        return Err(format!(
            "ROCm {}.{}'s compiler aborts on gfx11/gfx12 targets (Debian bookworm ships 5.2); \
             ROCm 5.7 (Debian trixie) or newer compiles {arch}",
            hip.0, hip.1
        ));
    }
    if hip < (5, 7) && gfx115 {
        return Err(format!(
            "ROCm {}.{}'s LLVM predates {arch} (added in LLVM 17, ROCm 5.7)",
            hip.0, hip.1
        ));
    }
    if hip < (6, 2) && gfx12 {
        return Err(format!(
            "ROCm {}.{}'s LLVM does not know {arch} and aborts (gfx12 needs ROCm 6.2 or newer)",
            hip.0, hip.1
        ));
    }
    Ok(())
}

impl KernelCompiler for Hiprtc {
    fn backend(&self) -> RuntimeKind {
        RuntimeKind::Hip
    }

    fn id(&self) -> String {
        format!(
            "hiprtc {} ({})",
            decode_hip_version(self.runtime_version),
            self.library
        )
    }

    fn options(&self, arch: &str) -> Vec<String> {
        vec![
            format!("--offload-arch={arch}"),
            "-O3".to_string(),
            "-DHS_BACKEND_HIP=1".to_string(),
        ]
    }

    fn check_target(&self, arch: &str) -> Result<(), GpuError> {
        if !is_plausible_gfx(arch) {
            return Err(GpuError::UnsupportedTarget {
                compiler: self.id(),
                arch: arch.to_string(),
                reason: "not an AMD GPU target name (expected gfxNNNN, e.g. gfx1100)".to_string(),
            });
        }
        if std::env::var("HIPSCOPE_FORCE_COMPILE").is_ok_and(|v| v == "1") {
            return Ok(());
        }
        known_bad_pairing(self.hip_version(), arch).map_err(|reason| GpuError::UnsupportedTarget {
            compiler: self.id(),
            arch: arch.to_string(),
            reason: format!("{reason} (HIPSCOPE_FORCE_COMPILE=1 tries anyway)"),
        })
    }

    fn compile(&self, name: &str, source: &str, arch: &str) -> Result<Vec<u8>, GpuError> {
        let bad = |what: &str| GpuError::Compile {
            kernel: name.to_string(),
            arch: arch.to_string(),
            log: format!("{what} contains a NUL byte"),
        };
        let src = CString::new(source).map_err(|_| bad("source"))?;
        let cname = CString::new(format!("{name}.hip")).map_err(|_| bad("name"))?;
        let opts: Vec<CString> = self
            .options(arch)
            .into_iter()
            .map(CString::new)
            .collect::<Result<_, _>>()
            .map_err(|_| bad("an option"))?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: HiprtcProgram = std::ptr::null_mut();
        // SAFETY: all strings are NUL-terminated and outlive the call; no headers are passed.
        let rc = unsafe {
            (self.api.hiprtcCreateProgram)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(GpuError::Compile {
                kernel: name.to_string(),
                arch: arch.to_string(),
                log: format!("hiprtcCreateProgram: {}", hiprtc_error_text(rc)),
            });
        }
        let result = (|| {
            // SAFETY: prog is live; the option array holds opt_ptrs.len() valid strings.
            let rc = unsafe {
                (self.api.hiprtcCompileProgram)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr())
            };
            if rc != 0 {
                let log = self.log(prog);
                return Err(GpuError::Compile {
                    kernel: name.to_string(),
                    arch: arch.to_string(),
                    log: if log.is_empty() {
                        format!("hiprtcCompileProgram: {}", hiprtc_error_text(rc))
                    } else {
                        log
                    },
                });
            }
            let mut n: usize = 0;
            // SAFETY: prog compiled; writes one size_t.
            let rc = unsafe { (self.api.hiprtcGetCodeSize)(prog, &mut n) };
            if rc != 0 || n == 0 {
                return Err(GpuError::Compile {
                    kernel: name.to_string(),
                    arch: arch.to_string(),
                    log: format!("hiprtcGetCodeSize: {} (size {n})", hiprtc_error_text(rc)),
                });
            }
            let mut code = vec![0u8; n];
            // SAFETY: code has the n bytes hiprtcGetCodeSize reported.
            let rc = unsafe { (self.api.hiprtcGetCode)(prog, code.as_mut_ptr() as *mut c_char) };
            if rc != 0 {
                return Err(GpuError::Compile {
                    kernel: name.to_string(),
                    arch: arch.to_string(),
                    log: format!("hiprtcGetCode: {}", hiprtc_error_text(rc)),
                });
            }
            Ok(code)
        })();
        // SAFETY: prog is live and destroyed once.
        unsafe { (self.api.hiprtcDestroyProgram)(&mut prog) };
        result
    }
}

/// `gfx` followed by 3–4 hex digits and nothing else (feature suffixes are not targets here).
pub fn is_plausible_gfx(arch: &str) -> bool {
    arch.strip_prefix("gfx").is_some_and(|rest| {
        (3..=4).contains(&rest.len()) && rest.chars().all(|c| c.is_ascii_hexdigit())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_bad_pairings_follow_the_measured_compilers() {
        // Debian bookworm (5.2) aborts on gfx11; gfx10/gfx9 compile there.
        assert!(known_bad_pairing((5, 2), "gfx1100").is_err());
        assert!(known_bad_pairing((5, 2), "gfx1030").is_ok());
        assert!(known_bad_pairing((5, 2), "gfx90a").is_ok());
        // Debian trixie (5.7, LLVM 17) compiles gfx1100 and gfx1151 but aborts on gfx12.
        assert!(known_bad_pairing((5, 7), "gfx1151").is_ok());
        assert!(known_bad_pairing((5, 7), "gfx1200").is_err());
        assert!(known_bad_pairing((6, 4), "gfx1201").is_ok());
    }

    #[test]
    fn target_names_are_checked() {
        assert!(is_plausible_gfx("gfx1100"));
        assert!(is_plausible_gfx("gfx90a"));
        assert!(!is_plausible_gfx("gfx90a:xnack-"));
        assert!(!is_plausible_gfx("sm_90"));
        assert!(!is_plausible_gfx("gfx"));
    }
}
