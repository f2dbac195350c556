//! cuBLAS on hipscope's stream: the handle bound to our stream in device pointer mode, its
//! workspace from the arena, and SGEMM. The `Device` impl in `mod.rs` forwards its BLAS methods
//! here.

use std::ffi::c_void;

use cudarc::cublas::sys as cublas;

use crate::gpu::device::{
    BlasAvailability, DevicePtr, GemmF32, GpuError, Op, RawBlas, RuntimeError, RuntimeKind,
};

use super::CudaDevice;
use super::ffi::guarded;

fn cublas_check(call: &'static str, s: cublas::cublasStatus_t) -> Result<(), GpuError> {
    if s == cublas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(GpuError::Runtime(RuntimeError {
            backend: RuntimeKind::Cuda,
            call,
            code: s as u32 as i64,
            message: format!("{s:?}"),
        }))
    }
}

impl CudaDevice {
    pub(super) fn cublas_availability(&self) -> BlasAvailability {
        match &self.cublas {
            Ok(()) => BlasAvailability::Present {
                library: "cuBLAS".into(),
            },
            Err(why) => BlasAvailability::Absent {
                reason: why.clone(),
            },
        }
    }

    pub(super) fn cublas_create(&mut self) -> Result<RawBlas, GpuError> {
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

    pub(super) fn cublas_stream_is_ours(&self, h: RawBlas) -> Result<bool, GpuError> {
        self.require_cublas()?;
        let mut s: cublas::cudaStream_t = std::ptr::null_mut();
        // SAFETY: h is live; writes one stream handle.
        cublas_check("cublasGetStream", unsafe {
            cublas::cublasGetStream_v2(h.0 as cublas::cublasHandle_t, &mut s)
        })?;
        Ok(s as u64 == self.stream as u64 && !s.is_null())
    }

    pub(super) unsafe fn cublas_set_workspace(
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

    pub(super) unsafe fn cublas_sgemm(&mut self, h: RawBlas, g: &GemmF32) -> Result<(), GpuError> {
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

    /// cublasGemmEx: A and B f16, C f32, f32 accumulation (tensor cores where the device has
    /// them); alpha and beta f32 in device memory.
    pub(super) unsafe fn cublas_gemm_f16(
        &mut self,
        h: RawBlas,
        g: &GemmF32,
    ) -> Result<(), GpuError> {
        self.ensure_current()?;
        let op = |o: Op| match o {
            Op::N => cublas::cublasOperation_t::CUBLAS_OP_N,
            Op::T => cublas::cublasOperation_t::CUBLAS_OP_T,
        };
        let f16 = cublas::cudaDataType::CUDA_R_16F;
        let f32 = cublas::cudaDataType::CUDA_R_32F;
        // SAFETY: caller guarantees pointers and shapes; device pointer mode is set.
        cublas_check("cublasGemmEx", unsafe {
            cublas::cublasGemmEx(
                h.0 as cublas::cublasHandle_t,
                op(g.transa),
                op(g.transb),
                g.m,
                g.n,
                g.k,
                g.alpha.0 as *const c_void,
                g.a.0 as *const c_void,
                f16,
                g.lda,
                g.b.0 as *const c_void,
                f16,
                g.ldb,
                g.beta.0 as *const c_void,
                g.c.0 as *mut c_void,
                f32,
                g.ldc,
                cublas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        })
    }

    pub(super) unsafe fn cublas_destroy(&mut self, h: RawBlas) -> Result<(), GpuError> {
        self.ensure_current()?;
        // SAFETY: caller guarantees h unused afterwards.
        cublas_check("cublasDestroy", unsafe {
            cublas::cublasDestroy_v2(h.0 as cublas::cublasHandle_t)
        })
    }
}
