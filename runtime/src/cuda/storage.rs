//! The CUDA backend of the tensor runtime: [`CudaStorage`] and [`CudaDevice`]
//! implement [`BackendStorage`] / [`BackendDevice`] with NVRTC kernels
//! (`runtime/kernels/ops_elementwise.cu` and `ops_rowwise.cu`, one module)
//! and, for matmuls, one strided-batched cuBLASLt call through
//! [`CudaContext::gemm`] (the tiled `ops_matmul_*` kernels when it refuses).
//!
//! Numerics follow the CPU reference (`cpu/`): floats compute in f32, BF16 is
//! widened exactly and rounded back RNE. Element-wise ops built from `+ - * /`
//! and `sqrt` give the CPU's bits (the kernels are compiled with
//! `--fmad=false --prec-div=true --prec-sqrt=true`); `exp`, `log` and `tanh`
//! are CUDA's (within 2 ulp of libm). Reductions and matmuls add in another
//! order than the CPU; softmax and norm statistics accumulate in f64 like it.
//!
//! Strided views are passed to the kernels as a `Strided` of at most
//! [`OPS_MAX_RANK`] dims after merging contiguous neighbours.
//!
//! Files: this one holds the types, the view and launch helpers and the
//! trait impls; `storage/elementwise.rs` (casts, unary, affine, binary,
//! concat), `storage/rowwise.rs` (reductions, softmax, norms, RoPE) and
//! `storage/matmul.rs` (cuBLASLt matmuls and the tiled fallback) the ops.
//!
//! One context per GPU (`cuda:N`, or `rocm:N` over the HIP driver) is
//! opened for the whole process on first use ([`CudaDevice::open`]); a
//! failure to open it (no GPU, no library) is remembered and reported as
//! one line.

use crate::shape::coalesce;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::nvrtc::KernelSource;
use super::{CudaContext, CudaError, DevBuf};
use crate::backend::{BackendDevice, BackendStorage};
use crate::cpu::CpuStorage;
use crate::{DType, Device, Error, Layout, Result, Shape};

/// The tensor-op kernels: both files compiled as one module.
pub const OPS: KernelSource = KernelSource {
    name: "ops_elementwise.cu",
    body: concat!(
        include_str!("../../kernels/ops_elementwise.cu"),
        "\n#line 1 \"ops_rowwise.cu\"\n",
        include_str!("../../kernels/ops_rowwise.cu"),
        "\n#line 1 \"ops_fused.cu\"\n",
        include_str!("../../kernels/ops_fused.cu")
    ),
};

/// Most dims of a strided view after coalescing (OPS_MAX_RANK in the kernels).
pub const OPS_MAX_RANK: usize = 6;

/// Threads per CTA (OPS_THREADS in the kernels).
const THREADS: u32 = 256;
/// Most CTAs of a grid-stride launch.
const MAX_CTAS: u64 = 1 << 20;

/// A strided view as the kernels take it (struct Strided in ops_elementwise.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Strided {
    dims: [u64; OPS_MAX_RANK],
    strides: [u64; OPS_MAX_RANK],
    offset: u64,
    rank: u64,
    /// The innermost dim and stride (1 and 0 for rank 0), kept apart so that
    /// kernels never index `dims` and `strides` by a run-time value: that
    /// made the compiler copy the struct to local memory in every thread.
    inner: u64,
    inner_stride: u64,
}

// SAFETY: plain old data with the C layout of the kernels' struct.
unsafe impl DeviceRepr for Strided {}

impl Strided {
    fn new(dims: &[usize], strides: &[usize], offset: usize) -> Result<Strided> {
        if dims.len() > OPS_MAX_RANK {
            return Err(Error::NotImplemented(format!(
                "CUDA kernels take strided views of at most {OPS_MAX_RANK} non-mergeable dims, got {dims:?} with strides {strides:?}"
            )));
        }
        let mut s = Strided {
            offset: offset as u64,
            rank: dims.len() as u64,
            ..Default::default()
        };
        for (i, (&d, &st)) in dims.iter().zip(strides).enumerate() {
            s.dims[i] = d as u64;
            s.strides[i] = st as u64;
        }
        (s.inner, s.inner_stride) = match (dims.last(), strides.last()) {
            (Some(&d), Some(&st)) => (d as u64, st as u64),
            _ => (1, 0),
        };
        Ok(s)
    }

    /// One layout, its dims merged where contiguous.
    fn of(layout: &Layout) -> Result<Strided> {
        let (dims, [s]) = coalesce(layout.dims(), [layout.strides()]);
        Strided::new(&dims, &s, layout.offset())
    }
}

/// A CUDA error as a runtime error (one line).
pub(crate) fn backend_err(e: CudaError) -> Error {
    match e {
        CudaError::Runtime(r) => r,
        other => Error::Backend(other.to_string()),
    }
}

fn grid(n: u64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            n.div_ceil(u64::from(THREADS)).clamp(1, MAX_CTAS) as u32,
            1,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One CTA per row (row kernels loop when there are more rows than CTAs).
fn row_grid(rows: u64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.clamp(1, MAX_CTAS) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches kernel `$name` of [`OPS`] on `$ctx`'s stream with the arguments
/// given by reference; the error is the runtime's.
macro_rules! launch {
    ($ctx:expr, $name:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {
        $crate::cuda::nvrtc::launch_kernel!($ctx, &OPS, $name, $cfg, $($arg),+)
            .map_err(backend_err)
    };
}

mod fused;
mod matmul;
mod ops;

pub use matmul::matmul_fallbacks;

/// A GPU as a backend device: where it is and the process-wide context.
#[derive(Clone)]
pub struct CudaDevice {
    location: Device,
    ctx: CudaContext,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaDevice({})", self.location)
    }
}

type ContextCache = Mutex<HashMap<Device, std::result::Result<CudaContext, String>>>;

impl CudaDevice {
    /// The device of CUDA GPU `ordinal` (see [`CudaDevice::open`]).
    pub fn get(ordinal: usize) -> Result<CudaDevice> {
        CudaDevice::open(Device::Cuda(ordinal))
    }

    /// The GPU `device` (`cuda:N`, or `rocm:N` with the `rocm` feature),
    /// opening its context on first use. A failure is remembered, so a
    /// missing GPU is looked for once.
    pub fn open(device: Device) -> Result<CudaDevice> {
        static CONTEXTS: OnceLock<ContextCache> = OnceLock::new();
        let mut map = CONTEXTS
            .get_or_init(|| Mutex::new(HashMap::new()))
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let entry = map.entry(device).or_insert_with(|| {
            let ctx = match device {
                Device::Cuda(i) => CudaContext::new(i),
                #[cfg(feature = "rocm")]
                Device::Rocm(i) => CudaContext::new_rocm(i),
                _ => {
                    return Err(Error::DeviceUnavailable {
                        device: device.to_string(),
                    }
                    .to_string())
                }
            };
            ctx.map_err(|e| e.to_string())
        });
        match entry {
            Ok(ctx) => Ok(CudaDevice {
                location: device,
                ctx: ctx.clone(),
            }),
            Err(msg) => Err(Error::Backend(msg.clone())),
        }
    }

    /// The GPU's ordinal (CUDA's or HIP's).
    pub fn ordinal(&self) -> usize {
        match self.location {
            Device::Cuda(i) | Device::Rocm(i) => i,
            Device::Cpu => unreachable!("a CudaDevice is a GPU"),
        }
    }

    /// The process-wide context of this GPU (stream, pool, kernels, cuBLASLt).
    pub fn context(&self) -> &CudaContext {
        &self.ctx
    }

    fn alloc(&self, n: usize, dtype: DType) -> Result<CudaStorage> {
        let buf = self
            .ctx
            .alloc(n * dtype.size_in_bytes())
            .map_err(backend_err)?;
        Ok(CudaStorage::from_buffer(buf, dtype, n, self.clone()))
    }
}

/// A buffer of one dtype on a GPU.
pub struct CudaStorage {
    buf: DevBuf,
    dtype: DType,
    len: usize,
    device: CudaDevice,
}

impl std::fmt::Debug for CudaStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaStorage({}, {}, {} elements)",
            self.device.location, self.dtype, self.len
        )
    }
}

/// Picks the kernel of a float dtype.
pub(crate) fn by_dtype(
    dtype: DType,
    f32_name: &'static str,
    bf16_name: &'static str,
) -> &'static str {
    if dtype == DType::BF16 {
        bf16_name
    } else {
        f32_name
    }
}

impl CudaStorage {
    /// Number of elements (not bytes).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Wrap a packed buffer holding `len` values of `dtype`.
    pub(crate) fn from_buffer(
        buf: DevBuf,
        dtype: DType,
        len: usize,
        device: CudaDevice,
    ) -> CudaStorage {
        CudaStorage {
            buf,
            dtype,
            len,
            device,
        }
    }

    /// The device buffer (for kernels outside this module).
    pub fn buffer(&self) -> &DevBuf {
        &self.buf
    }

    fn ctx(&self) -> &CudaContext {
        &self.device.ctx
    }

    fn esize(&self) -> usize {
        self.dtype.size_in_bytes()
    }

    fn check_layout(&self, layout: &Layout, op: &str) -> Result<()> {
        if layout.shape().elem_count() > 0 && layout.max_extent() > self.len {
            return Err(Error::Shape(format!(
                "{op}: layout {:?} (strides {:?}, offset {}) reaches past a buffer of {} elements",
                layout.dims(),
                layout.strides(),
                layout.offset(),
                self.len
            )));
        }
        Ok(())
    }

    fn float(&self, op: &str) -> Result<()> {
        if self.dtype.is_float() {
            Ok(())
        } else {
            Err(Error::DType(format!(
                "{op} needs a float tensor (f32 or bf16), got {}; u8 holds quantized codes, decode them first",
                self.dtype
            )))
        }
    }

    /// Device address of the packed elements of `layout`: the buffer itself
    /// when the view is contiguous, else a packed copy (returned to keep it
    /// alive until the launch is queued; the pool reuses it stream-ordered).
    fn packed(&self, layout: &Layout, op: &str) -> Result<(u64, Option<CudaStorage>)> {
        self.check_layout(layout, op)?;
        match layout.contiguous_range() {
            Some(r) => Ok((self.buf.ptr() + (r.start * self.esize()) as u64, None)),
            None => {
                let t = self.copy_strided(layout)?;
                Ok((t.buf.ptr(), Some(t)))
            }
        }
    }

    /// Places the elements of `layout` into `dst` (see ops_place_* in the kernels).
    fn place(&self, layout: &Layout, dst: u64, block: usize, row: usize, at: usize) -> Result<()> {
        let n = layout.shape().elem_count();
        if n == 0 {
            return Ok(());
        }
        self.place_raw(&Strided::of(layout)?, n, dst, block, row, at)
    }

    /// [`CudaStorage::place`] of `n` elements of a [`Strided`] view.
    fn place_raw(
        &self,
        s: &Strided,
        n: usize,
        dst: u64,
        block: usize,
        row: usize,
        at: usize,
    ) -> Result<()> {
        let name = match self.esize() {
            4 => "ops_place_b4",
            2 => "ops_place_b2",
            _ => "ops_place_b1",
        };
        let (src, n, block, row, at) = (
            self.buf.ptr(),
            n as u64,
            block as u64,
            row as u64,
            at as u64,
        );
        launch!(
            self.ctx(),
            name,
            grid(n),
            &src,
            &dst,
            s,
            &n,
            &block,
            &row,
            &at
        )
    }
}

impl BackendDevice for CudaDevice {
    type Storage = CudaStorage;

    fn location(&self) -> Device {
        self.location
    }

    fn zeros(&self, shape: &Shape, dtype: DType) -> Result<CudaStorage> {
        let n = shape.elem_count();
        let buf = self
            .ctx
            .alloc_zeroed(n * dtype.size_in_bytes())
            .map_err(backend_err)?;
        Ok(CudaStorage::from_buffer(buf, dtype, n, self.clone()))
    }

    fn storage_from_cpu(&self, data: CpuStorage) -> Result<CudaStorage> {
        self.storage_from_host(&data)
    }

    fn storage_from_host(&self, data: &CpuStorage) -> Result<CudaStorage> {
        let (buf, dtype, len) = match data {
            CpuStorage::F32(v) => (self.ctx.upload(v), DType::F32, v.len()),
            CpuStorage::BF16(v) => (self.ctx.upload(v), DType::BF16, v.len()),
            CpuStorage::U8(v) => (self.ctx.upload(v), DType::U8, v.len()),
        };
        Ok(CudaStorage::from_buffer(
            buf.map_err(backend_err)?,
            dtype,
            len,
            self.clone(),
        ))
    }
}
