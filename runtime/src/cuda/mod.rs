//! The CUDA backend's foundation (feature `cuda`): a device context with a
//! caching allocator, NVRTC-compiled quantizer kernels that are bit-exact with
//! the CPU quantizers of [`crate::quant`], and cuBLASLt GEMMs (BF16 and FP8).
//!
//! Everything is loaded at run time through `cudarc` (`dynamic-loading`), so
//! a build with this feature needs no CUDA installed; on a machine without a
//! GPU or without `libcuda`, `libnvrtc` or `libcublasLt`, [`CudaContext::new`]
//! returns [`CudaError::Unavailable`] with one line saying what was looked
//! for and where (DESIGN.md, "Backends"). It never panics.
//!
//! Layout conventions, shared with the CPU quantizers: a quantized operand is
//! "axis-last" (the quantization axis, which is the GEMM's reduction axis K,
//! is contiguous), so every quantized GEMM here is `y[M, N] = a[M, K] ·
//! b[N, K]^T` with both operands K-major: cuBLASLt's "TN" layout, the only
//! one Hopper runs FP8 in. BF16 GEMMs may also read an operand transposed,
//! in place, and run strided batches ([`gemm::GemmSpec`]).
//!
//! - [`context`]: [`CudaContext`] (device, stream, kernel cache, versions).
//! - [`alloc`]: the size-class caching allocator behind [`DevBuf`].
//! - [`nvrtc`]: kernel sources (`runtime/kernels/*.cu`) and the per-process
//!   compile cache.
//! - [`quantize`]: MX quantize / dequantize and FP8 tensorwise launches.
//! - [`nvfp4`]: NVFP4 quantize (two-level scales) and its BF16 operand.
//! - [`gemm`]: cuBLASLt matmuls: BF16 and FP8 (per-tensor scale pointers),
//!   batched, with a fused bias where cuBLASLt has one.
//! - [`storage`]: the tensor backend ([`CudaStorage`], [`CudaDevice`]).
//! - [`operand`]: the quantized linear's primitives on device buffers
//!   ([`crate::backend::LinearBackend`]), over [`lin_kernels`] (copies,
//!   epilogue, column sums, the GEMM with its post operations) and
//!   [`mx_tile`] (one-pass MX quantization along rows and columns).
//! - `adamw`: the AdamW update ([`crate::backend::OptimBackend`]).

pub(crate) mod adamw;
pub mod alloc;
mod attention;
pub(crate) mod blas_lib;
pub mod context;
mod cublaslt;
mod cuda_driver;
pub(crate) mod driver;
pub mod fp8_group;
pub mod gemm;
pub mod lin_kernels;
pub mod mx_tile;
pub mod nvfp4;
pub mod nvrtc;
pub mod operand;
mod operand_quantize;
pub mod quantize;
mod staging;
pub mod storage;

pub use alloc::{DevBuf, PoolStats};
pub use context::{CudaContext, DeviceInfo, GpuFunction, GpuTimer, StoppedTimer};
pub use fp8_group::{fp8_group_fallbacks, Fp8GroupDevice};
pub use gemm::{GemmDType, GemmOperand};
pub use lin_kernels::{bias_fallbacks, scale_fallbacks};
pub use nvfp4::{Nvfp4Device, Nvfp4Outputs};
pub use operand::CudaOperand;
pub use quantize::{DequantLayout, Fp8Device, Fp8Device2d, Fp8Outputs, MxDevice};
pub use storage::{CudaDevice, CudaStorage};

impl crate::backend::DeviceStatus for CudaDevice {
    fn synchronize(&self) -> crate::Result<()> {
        self.context().synchronize().map_err(storage::backend_err)
    }

    fn memory_info(&self) -> crate::Result<(u64, u64)> {
        let (free, total) = self.context().memory_info().map_err(storage::backend_err)?;
        Ok((free as u64, total as u64))
    }

    fn memory_stats(&self) -> crate::backend::MemoryStats {
        let st = self.context().pool_stats();
        crate::backend::MemoryStats {
            device_allocs: st.device_allocs,
            reuses: st.reuses,
            peak_bytes: st.peak_bytes_in_use as u64,
        }
    }
}

/// Failures of the CUDA backend. Every message is one line.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No usable GPU, driver or library: what was looked for and where.
    #[error("CUDA backend unavailable: {0}")]
    Unavailable(String),
    /// No usable ROCm library or AMD GPU: the rocm module's one line.
    #[error("{0}")]
    RocmUnavailable(String),
    /// A CUDA driver (or HIP runtime) call failed.
    #[error("CUDA driver error in {op}: {err}")]
    Driver {
        /// The driver call that failed, e.g. `cuMemAlloc`.
        op: String,
        /// The driver's error, as cudarc prints it.
        err: String,
    },
    /// NVRTC rejected a kernel source; `log` is the compiler's output.
    #[error("NVRTC failed to compile {source_name} ({options}): {log}")]
    Compile {
        /// The kernel file, e.g. `quantize_mx.cu`.
        source_name: String,
        /// The NVRTC options it was compiled with (empty if compilation never started).
        options: String,
        /// NVRTC's compile log, joined onto one line.
        log: String,
    },
    /// A cuBLASLt call failed or found no algorithm.
    #[error("cuBLASLt: {0}")]
    Blas(String),
    /// Arguments a kernel or GEMM cannot take (shape, dtype, alignment).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// An error of the runtime proper (for example a non-finite amax).
    #[error(transparent)]
    Runtime(#[from] crate::Error),
}

/// Result with [`CudaError`].
pub type Result<T> = std::result::Result<T, CudaError>;

/// Wraps a driver error with the name of the failing operation.
pub(crate) fn driver_err(
    op: impl Into<String>,
) -> impl FnOnce(cudarc::driver::DriverError) -> CudaError {
    let op = op.into();
    move |e| CudaError::Driver {
        op,
        err: format!("{e:?}"),
    }
}
