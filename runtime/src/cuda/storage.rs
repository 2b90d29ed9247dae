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
//! One context per GPU ordinal is opened for the whole process on first use
//! ([`CudaDevice::get`]); a failure to open it (no GPU, no library) is
//! remembered and reported as one line.

use crate::shape::coalesce;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::gemm::{GemmDType, GemmOperand, GemmSpec, MatLayout};
use super::nvrtc::KernelSource;
use super::{driver_err, CudaContext, CudaError, DevBuf};
use crate::backend::{BackendDevice, BackendStorage};
use crate::cpu::CpuStorage;
use crate::op::{BinaryOp, ReduceOp, UnaryOp};
use crate::{DType, Device, Error, Layout, Result, Shape};

/// The tensor-op kernels: both files compiled as one module.
pub const OPS: KernelSource = KernelSource {
    name: "ops_elementwise.cu",
    body: concat!(
        include_str!("../../kernels/ops_elementwise.cu"),
        "\n#line 1 \"ops_rowwise.cu\"\n",
        include_str!("../../kernels/ops_rowwise.cu")
    ),
};

/// Most dims of a strided view after coalescing (OPS_MAX_RANK in the kernels).
pub const OPS_MAX_RANK: usize = 6;

/// Reductions over the last axis with fewer rows than this and rows longer
/// than [`REDUCE_CHUNK`] are split into chunks (`ops_reduce_rows_partial`).
const REDUCE_SPLIT_ROWS: u64 = 264;
/// Elements per CTA of a split row reduction.
const REDUCE_CHUNK: u64 = 16384;

/// Rows of threads per CTA of `ops_reduce_cols` (COL_GROUPS in ops_rowwise.cu).
const REDUCE_COL_GROUPS: u32 = 16;
/// Threads per CTA (OPS_THREADS in the kernels).
const THREADS: u32 = 256;
/// Most CTAs of a grid-stride launch.
const MAX_CTAS: u64 = 1 << 20;
/// Side of the matmul tile (MM_TILE).
const MM_TILE: u32 = 16;

/// Matmuls that missed the fast path since the process started: index 0
/// counts first cuBLASLt attempts that failed (then retried from packed
/// copies), index 1 retries that failed too (the tiled kernel ran).
static MATMUL_FALLBACKS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// The fallback counts: `[packed retries, tiled kernel runs]`, for
/// checks and benchmarks that must know which path ran.
pub fn matmul_fallbacks() -> [usize; 2] {
    MATMUL_FALLBACKS
        .each_ref()
        .map(|c| c.load(Ordering::Relaxed))
}

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

/// Launches kernel `$name` of [`OPS`] on `$ctx`'s stream with the arguments given by reference.
macro_rules! launch {
    ($ctx:expr, $name:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        let ctx: &CudaContext = $ctx;
        let name: &'static str = $name;
        let f = ctx.function(&OPS, name).map_err(backend_err)?;
        ctx.bind().map_err(backend_err)?;
        let mut b = ctx.stream().launch_builder(&f);
        $( b.arg($arg); )+
        // SAFETY: every call site passes the argument types of the kernel's
        // signature in ops_*.cu and buffers large enough for the launch.
        unsafe { b.launch($cfg) }
            .map(|_| ())
            .map_err(|e| backend_err(driver_err(format!("launch {name}"))(e)))
    }};
}

/// A GPU as a backend device: its ordinal and the process-wide context.
#[derive(Clone)]
pub struct CudaDevice {
    ordinal: usize,
    ctx: CudaContext,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaDevice({})", self.ordinal)
    }
}

type ContextCache = Mutex<HashMap<usize, std::result::Result<CudaContext, String>>>;

impl CudaDevice {
    /// The device of GPU `ordinal`, opening its context on first use. A
    /// failure is remembered, so a missing GPU is looked for once.
    pub fn get(ordinal: usize) -> Result<CudaDevice> {
        static CONTEXTS: OnceLock<ContextCache> = OnceLock::new();
        let mut map = CONTEXTS
            .get_or_init(|| Mutex::new(HashMap::new()))
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let entry = map
            .entry(ordinal)
            .or_insert_with(|| CudaContext::new(ordinal).map_err(|e| e.to_string()));
        match entry {
            Ok(ctx) => Ok(CudaDevice {
                ordinal,
                ctx: ctx.clone(),
            }),
            Err(msg) => Err(Error::Backend(msg.clone())),
        }
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub fn context(&self) -> &CudaContext {
        &self.ctx
    }

    fn alloc(&self, n: usize, dtype: DType) -> Result<CudaStorage> {
        let buf = self
            .ctx
            .alloc(n * dtype.size_in_bytes())
            .map_err(backend_err)?;
        Ok(CudaStorage {
            buf,
            dtype,
            len: n,
            device: self.clone(),
        })
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
            "CudaStorage(cuda:{}, {}, {} elements)",
            self.device.ordinal, self.dtype, self.len
        )
    }
}

/// Picks the kernel of a float dtype.
fn by_dtype(dtype: DType, f32_name: &'static str, bf16_name: &'static str) -> &'static str {
    if dtype == DType::BF16 {
        bf16_name
    } else {
        f32_name
    }
}

fn unary_code(op: UnaryOp) -> i32 {
    match op {
        UnaryOp::Exp => 0,
        UnaryOp::Log => 1,
        UnaryOp::Sqrt => 2,
        UnaryOp::Rsqrt => 3,
        UnaryOp::Sqr => 4,
        UnaryOp::Tanh => 5,
        UnaryOp::Silu => 6,
        UnaryOp::GeluTanh => 7,
        UnaryOp::SiluGrad => 8,
        UnaryOp::GeluTanhGrad => 9,
    }
}

fn binary_code(op: BinaryOp) -> i32 {
    match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
        BinaryOp::Eq => 4,
    }
}

impl CudaStorage {
    pub fn len(&self) -> usize {
        self.len
    }

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

    /// `[.., M, K] x [.., K, N]` into the packed `out` with one cuBLASLt call
    /// (f32 or BF16, f32 accumulation). Each operand is read in place when
    /// cuBLASLt can address it (see [`gemm_layout`]), else from a copy made
    /// by one kernel for the whole batch; `pack` forces the copies.
    fn matmul_blas(
        &self,
        (ll, rhs, rl): (&Layout, &CudaStorage, &Layout),
        out: &CudaStorage,
        (batch, m, n, k): (usize, usize, usize, usize),
        pack: bool,
    ) -> Result<()> {
        let (a, a_copy) = self.gemm_operand(ll, false, pack)?;
        let (b, b_copy) = rhs.gemm_operand(rl, true, pack)?;
        let dtype = if self.dtype == DType::BF16 {
            GemmDType::Bf16
        } else {
            GemmDType::F32
        };
        let op = |buf| GemmOperand {
            buf,
            dtype,
            scale_inv: None,
        };
        let spec = GemmSpec {
            m,
            n,
            k,
            batch,
            a,
            b,
            y: MatLayout::packed(m, n),
            bias: None,
        };
        self.ctx()
            .gemm(
                &op(&a_copy.as_ref().unwrap_or(self).buf),
                &op(&b_copy.as_ref().unwrap_or(rhs).buf),
                &spec,
                &out.buf,
                dtype,
            )
            .map_err(backend_err)
    }

    /// How cuBLASLt reads the matrices of `layout`: in place, or from a
    /// packed copy (returned). The copy keeps the view's unit-stride dim
    /// innermost, so it reads along it.
    fn gemm_operand(
        &self,
        layout: &Layout,
        rhs: bool,
        pack: bool,
    ) -> Result<(MatLayout, Option<CudaStorage>)> {
        if !pack {
            if let Some(ml) = gemm_layout(layout, rhs) {
                return Ok((ml, None));
            }
        }
        let r = layout.dims().len();
        let mut perm: Vec<usize> = (0..r).collect();
        if layout.strides()[r - 1] > layout.strides()[r - 2] {
            perm.swap(r - 2, r - 1);
        }
        let view = layout.permute(&perm)?;
        let copy = self.copy_strided(&view)?;
        let packed = Layout::contiguous(view.shape().clone()).permute(&perm)?;
        let ml = gemm_layout(&packed, rhs).ok_or_else(|| {
            Error::Backend(format!(
                "matmul: packed layout {:?} / {:?} is not a cuBLASLt layout",
                packed.dims(),
                packed.strides()
            ))
        })?;
        Ok((ml, Some(copy)))
    }
}

/// The [`MatLayout`] of the matrices of `l` read in place, if cuBLASLt can:
/// the batch dims merge into one stride, and each matrix has a unit stride
/// with the other stride covering a whole row. The lhs `[.., M, K]` is a;
/// the rhs `[.., K, N]` is read as b = its transpose `[.., N, K]`.
fn gemm_layout(l: &Layout, rhs: bool) -> Option<MatLayout> {
    let r = l.dims().len();
    let (bdims, [bs]) = coalesce(&l.dims()[..r - 2], [&l.strides()[..r - 2]]);
    if bdims.len() != 1 {
        return None;
    }
    let (mut rows, mut cols) = (l.dims()[r - 2], l.dims()[r - 1]);
    let (mut rs, mut cs) = (l.strides()[r - 2], l.strides()[r - 1]);
    if rhs {
        (rows, cols, rs, cs) = (cols, rows, cs, rs);
    }
    // A dim of size 1 has no stride that matters.
    let (transposed, ld) = if (cols == 1 || cs == 1) && (rows == 1 || rs >= cols) {
        (false, if rows == 1 { cols } else { rs })
    } else if (rows == 1 || rs == 1) && (cols == 1 || cs >= rows) {
        (true, if cols == 1 { rows } else { cs })
    } else {
        return None;
    };
    Some(MatLayout {
        offset_elems: l.offset(),
        ld,
        batch_stride: bs[0],
        transposed,
    })
}

impl BackendStorage for CudaStorage {
    type Device = CudaDevice;

    fn device(&self) -> &CudaDevice {
        &self.device
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn buffer_bytes(&self) -> usize {
        self.len * self.esize()
    }

    fn to_cpu_storage(&self) -> Result<CpuStorage> {
        let ctx = self.ctx();
        Ok(match self.dtype {
            DType::F32 => CpuStorage::F32(ctx.download(&self.buf, self.len).map_err(backend_err)?),
            DType::BF16 => {
                CpuStorage::BF16(ctx.download(&self.buf, self.len).map_err(backend_err)?)
            }
            DType::U8 => CpuStorage::U8(ctx.download(&self.buf, self.len).map_err(backend_err)?),
        })
    }

    fn copy_strided(&self, layout: &Layout) -> Result<CudaStorage> {
        self.check_layout(layout, "copy_strided")?;
        let n = layout.shape().elem_count();
        let out = self.device.alloc(n, self.dtype)?;
        self.place(layout, out.buf.ptr(), n.max(1), n.max(1), 0)?;
        Ok(out)
    }

    fn to_dtype(&self, layout: &Layout, dtype: DType) -> Result<CudaStorage> {
        if dtype == self.dtype {
            return self.copy_strided(layout);
        }
        let name = match (self.dtype, dtype) {
            (DType::F32, DType::BF16) => "ops_cast_f32_bf16",
            (DType::BF16, DType::F32) => "ops_cast_bf16_f32",
            _ => {
                return Err(Error::DType(format!(
                    "to_dtype: no conversion from {} to {dtype}; u8 codes are made and read by the quantizers",
                    self.dtype
                )))
            }
        };
        self.check_layout(layout, "to_dtype")?;
        let n = layout.shape().elem_count();
        let out = self.device.alloc(n, dtype)?;
        if n > 0 {
            let s = Strided::of(layout)?;
            let (src, dst, n) = (self.buf.ptr(), out.buf.ptr(), n as u64);
            launch!(self.ctx(), name, grid(n), &src, &dst, &s, &n)?;
        }
        Ok(out)
    }

    fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<CudaStorage> {
        self.float(op.name())?;
        self.check_layout(layout, op.name())?;
        let n = layout.shape().elem_count();
        let out = self.device.alloc(n, self.dtype)?;
        if n > 0 {
            let s = Strided::of(layout)?;
            let (src, dst, n, code) = (self.buf.ptr(), out.buf.ptr(), n as u64, unary_code(op));
            let name = by_dtype(self.dtype, "ops_unary_f32", "ops_unary_bf16");
            launch!(self.ctx(), name, grid(n), &src, &dst, &s, &n, &code)?;
        }
        Ok(out)
    }

    fn affine(&self, layout: &Layout, mul: f32, add: f32) -> Result<CudaStorage> {
        self.float("affine")?;
        self.check_layout(layout, "affine")?;
        let n = layout.shape().elem_count();
        let out = self.device.alloc(n, self.dtype)?;
        if n > 0 {
            let s = Strided::of(layout)?;
            let (src, dst, n) = (self.buf.ptr(), out.buf.ptr(), n as u64);
            let name = by_dtype(self.dtype, "ops_affine_f32", "ops_affine_bf16");
            launch!(self.ctx(), name, grid(n), &src, &dst, &s, &n, &mul, &add)?;
        }
        Ok(out)
    }

    fn binary(
        &self,
        layout: &Layout,
        rhs: &CudaStorage,
        rhs_layout: &Layout,
        op: BinaryOp,
    ) -> Result<CudaStorage> {
        self.float(op.name())?;
        rhs.float(op.name())?;
        if self.dtype != rhs.dtype {
            return Err(Error::DType(format!(
                "{}: operands have different dtypes ({} and {})",
                op.name(),
                self.dtype,
                rhs.dtype
            )));
        }
        if layout.dims() != rhs_layout.dims() {
            return Err(Error::Shape(format!(
                "{}: views of shapes {:?} and {:?} (broadcast first)",
                op.name(),
                layout.dims(),
                rhs_layout.dims()
            )));
        }
        self.check_layout(layout, op.name())?;
        rhs.check_layout(rhs_layout, op.name())?;
        let n = layout.shape().elem_count();
        let out = self.device.alloc(n, self.dtype)?;
        if n > 0 {
            let (dims, [ls, rs]) =
                coalesce(layout.dims(), [layout.strides(), rhs_layout.strides()]);
            let sa = Strided::new(&dims, &ls, layout.offset())?;
            let sb = Strided::new(&dims, &rs, rhs_layout.offset())?;
            let (a, b, y, n, code) = (
                self.buf.ptr(),
                rhs.buf.ptr(),
                out.buf.ptr(),
                n as u64,
                binary_code(op),
            );
            let name = by_dtype(self.dtype, "ops_binary_f32", "ops_binary_bf16");
            launch!(self.ctx(), name, grid(n), &a, &b, &y, &sa, &sb, &n, &code)?;
        }
        Ok(out)
    }

    fn reduce(&self, layout: &Layout, op: ReduceOp, axis: usize) -> Result<CudaStorage> {
        self.float(op.name())?;
        let dims = layout.dims();
        if axis >= dims.len() {
            return Err(Error::AxisOutOfRange {
                axis: axis as isize,
                rank: dims.len(),
            });
        }
        let outer: usize = dims[..axis].iter().product();
        let inner: usize = dims[axis + 1..].iter().product();
        let n = dims[axis];
        let out = self.device.alloc(outer * inner, self.dtype)?;
        if outer * inner == 0 {
            return Ok(out);
        }
        let (x, _keep) = self.packed(layout, op.name())?;
        let y = out.buf.ptr();
        let code: i32 = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 1,
        };
        let (outer, n64, inner) = (outer as u64, n as u64, inner as u64);
        if inner == 1 && outer < REDUCE_SPLIT_ROWS && n64 > REDUCE_CHUNK {
            let chunks = n64.div_ceil(REDUCE_CHUNK);
            let partial = self
                .ctx()
                .alloc((outer * chunks) as usize * 4)
                .map_err(backend_err)?;
            let pp = partial.ptr();
            let name = by_dtype(
                self.dtype,
                "ops_reduce_rows_partial_f32",
                "ops_reduce_rows_partial_bf16",
            );
            let cfg = LaunchConfig {
                grid_dim: ((outer * chunks) as u32, 1, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let chunk = REDUCE_CHUNK;
            launch!(self.ctx(), name, cfg, &x, &pp, &n64, &chunk, &chunks, &code)?;
            let name = by_dtype(
                self.dtype,
                "ops_reduce_rows_final_f32",
                "ops_reduce_rows_final_bf16",
            );
            launch!(
                self.ctx(),
                name,
                grid(outer),
                &pp,
                &y,
                &outer,
                &chunks,
                &code
            )?;
        } else if inner == 1 {
            let name = by_dtype(self.dtype, "ops_reduce_rows_f32", "ops_reduce_rows_bf16");
            launch!(
                self.ctx(),
                name,
                row_grid(outer),
                &x,
                &y,
                &outer,
                &n64,
                &code
            )?;
        } else {
            let name = by_dtype(self.dtype, "ops_reduce_cols_f32", "ops_reduce_cols_bf16");
            // One CTA per (outer, 32 inner positions), COL_GROUPS rows of threads.
            let ctas = outer * inner.div_ceil(32);
            let cfg = LaunchConfig {
                grid_dim: (
                    u32::try_from(ctas).map_err(|_| {
                        Error::NotImplemented(format!(
                            "CUDA reduce over {outer} x {inner} outputs (grid too large)"
                        ))
                    })?,
                    1,
                    1,
                ),
                block_dim: (32, REDUCE_COL_GROUPS, 1),
                shared_mem_bytes: 0,
            };
            launch!(self.ctx(), name, cfg, &x, &y, &outer, &n64, &inner, &code)?;
        }
        Ok(out)
    }

    fn matmul(
        &self,
        layout: &Layout,
        rhs: &CudaStorage,
        rhs_layout: &Layout,
    ) -> Result<CudaStorage> {
        self.float("matmul")?;
        rhs.float("matmul")?;
        if self.dtype != rhs.dtype {
            return Err(Error::DType(format!(
                "matmul: operands have different dtypes ({} and {})",
                self.dtype, rhs.dtype
            )));
        }
        let (ll, rl) = (layout, rhs_layout);
        let rank = ll.dims().len();
        if rank < 2 || rl.dims().len() != rank || ll.dims()[..rank - 2] != rl.dims()[..rank - 2] {
            return Err(Error::Shape(format!(
                "matmul takes two views of equal rank >= 2 with equal batch dims, got {:?} and {:?}",
                ll.dims(),
                rl.dims()
            )));
        }
        let (m, k, n) = (
            ll.dims()[rank - 2],
            ll.dims()[rank - 1],
            rl.dims()[rank - 1],
        );
        if rl.dims()[rank - 2] != k {
            return Err(Error::Shape(format!(
                "matmul: inner dims differ ({:?} x {:?})",
                ll.dims(),
                rl.dims()
            )));
        }
        self.check_layout(ll, "matmul")?;
        rhs.check_layout(rl, "matmul")?;
        let batch: usize = ll.dims()[..rank - 2].iter().product();
        if batch * m * n == 0 {
            return self.device.alloc(0, self.dtype);
        }
        if k == 0 {
            return self
                .device
                .zeros(&Shape::from(vec![batch, m, n]), self.dtype);
        }
        let out = self.device.alloc(batch * m * n, self.dtype)?;
        // cuBLASLt first, reading the operands in place, then from packed
        // copies; if it refuses both (an unsupported combination), the tiled
        // kernel below.
        let args = (ll, rhs, rl);
        let dims = (batch, m, n, k);
        if self.matmul_blas(args, &out, dims, false).is_ok() {
            return Ok(out);
        }
        MATMUL_FALLBACKS[0].fetch_add(1, Ordering::Relaxed);
        if self.matmul_blas(args, &out, dims, true).is_ok() {
            return Ok(out);
        }
        MATMUL_FALLBACKS[1].fetch_add(1, Ordering::Relaxed);
        let bdims = &ll.dims()[..rank - 2];
        let (bd, [bs_l, bs_r]) = coalesce(
            bdims,
            [&ll.strides()[..rank - 2], &rl.strides()[..rank - 2]],
        );
        let ba = Strided::new(&bd, &bs_l, ll.offset())?;
        let bb = Strided::new(&bd, &bs_r, rl.offset())?;
        let st = |l: &Layout, i: usize| l.strides()[i] as u64;
        let (a_rs, a_cs, b_rs, b_cs) = (
            st(ll, rank - 2),
            st(ll, rank - 1),
            st(rl, rank - 2),
            st(rl, rank - 1),
        );
        let cfg = LaunchConfig {
            grid_dim: (
                (n as u64).div_ceil(MM_TILE.into()).min(u64::from(u32::MAX)) as u32,
                (m as u64).div_ceil(MM_TILE.into()).min(65_535) as u32,
                (batch as u64).min(65_535) as u32,
            ),
            block_dim: (MM_TILE, MM_TILE, 1),
            shared_mem_bytes: 0,
        };
        if m.div_ceil(MM_TILE as usize) > 65_535 {
            return Err(Error::NotImplemented(format!(
                "CUDA matmul with M = {m} rows (at most {} without cuBLASLt)",
                65_535 * MM_TILE as usize
            )));
        }
        let (a, b, y) = (self.buf.ptr(), rhs.buf.ptr(), out.buf.ptr());
        let (batch, m, n, k) = (batch as u64, m as u64, n as u64, k as u64);
        let name = by_dtype(self.dtype, "ops_matmul_f32", "ops_matmul_bf16");
        launch!(
            self.ctx(),
            name,
            cfg,
            &a,
            &b,
            &y,
            &ba,
            &bb,
            &batch,
            &m,
            &n,
            &k,
            &a_rs,
            &a_cs,
            &b_rs,
            &b_cs
        )?;
        Ok(out)
    }

    fn concat(parts: &[(&CudaStorage, &Layout)], axis: usize) -> Result<CudaStorage> {
        let Some(&(first, first_layout)) = parts.first() else {
            return Err(Error::Shape("concat of no tensors".into()));
        };
        let rank = first_layout.dims().len();
        if axis >= rank {
            return Err(Error::AxisOutOfRange {
                axis: axis as isize,
                rank,
            });
        }
        for (s, l) in parts {
            if s.dtype != first.dtype {
                return Err(Error::DType("concat: parts have different dtypes".into()));
            }
            s.check_layout(l, "concat")?;
        }
        let outer: usize = first_layout.dims()[..axis].iter().product();
        let blocks: Vec<usize> = parts
            .iter()
            .map(|(_, l)| l.dims()[axis..].iter().product())
            .collect();
        let row: usize = blocks.iter().sum();
        let out = first.device.alloc(outer * row, first.dtype)?;
        let mut at = 0;
        for ((s, l), &block) in parts.iter().zip(&blocks) {
            if block > 0 {
                s.place(l, out.buf.ptr(), block, row, at)?;
            }
            at += block;
        }
        Ok(out)
    }

    fn softmax_last_dim(&self, layout: &Layout) -> Result<CudaStorage> {
        self.float("softmax")?;
        let n = layout.shape().elem_count();
        let d = layout.dims().last().copied().unwrap_or(1);
        let out = self.device.alloc(n, self.dtype)?;
        if n == 0 || d == 0 {
            return Ok(out);
        }
        let (x, _keep) = self.packed(layout, "softmax")?;
        let (y, rows, d) = (out.buf.ptr(), (n / d) as u64, d as u64);
        let name = by_dtype(self.dtype, "ops_softmax_f32", "ops_softmax_bf16");
        launch!(self.ctx(), name, row_grid(rows), &x, &y, &rows, &d)?;
        Ok(out)
    }

    fn norm_last_dim(
        &self,
        layout: &Layout,
        eps: f32,
        rms: bool,
    ) -> Result<(CudaStorage, CudaStorage)> {
        let op = if rms { "rms_norm" } else { "layer_norm" };
        self.float(op)?;
        let n = layout.shape().elem_count();
        let d = layout.dims().last().copied().unwrap_or(1);
        let rows = n.checked_div(d).unwrap_or(0);
        let y = self.device.alloc(n, self.dtype)?;
        let rstd = self.device.alloc(rows, self.dtype)?;
        if rows == 0 {
            return Ok((y, rstd));
        }
        let (x, _keep) = self.packed(layout, op)?;
        let (yp, rp, rows64, d64, rms) = (
            y.buf.ptr(),
            rstd.buf.ptr(),
            rows as u64,
            d as u64,
            i32::from(rms),
        );
        let name = by_dtype(self.dtype, "ops_norm_f32", "ops_norm_bf16");
        launch!(
            self.ctx(),
            name,
            row_grid(rows64),
            &x,
            &yp,
            &rp,
            &rows64,
            &d64,
            &eps,
            &rms
        )?;
        Ok((y, rstd))
    }

    fn rope_interleaved(
        &self,
        layout: &Layout,
        cos: &CudaStorage,
        cos_layout: &Layout,
        sin: &CudaStorage,
        sin_layout: &Layout,
    ) -> Result<CudaStorage> {
        let op = "rope_interleaved";
        self.float(op)?;
        if cos.dtype != self.dtype || sin.dtype != self.dtype {
            return Err(Error::DType(format!(
                "{op}: x, cos and sin must share a dtype"
            )));
        }
        let dims = layout.dims();
        if dims.len() < 2 || dims[dims.len() - 1] % 2 != 0 {
            return Err(Error::Shape(format!(
                "{op}: x must be [.., L, D] with D even, got {dims:?}"
            )));
        }
        let (seq, d) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        let half = d / 2;
        for (l, what) in [(cos_layout, "cos"), (sin_layout, "sin")] {
            if l.shape().elem_count() != seq * half {
                return Err(Error::Shape(format!(
                    "{op}: {what} must hold [{seq}, {half}] values, got {:?}",
                    l.dims()
                )));
            }
        }
        let n = layout.shape().elem_count();
        let out = self.device.alloc(n, self.dtype)?;
        if n == 0 {
            return Ok(out);
        }
        let (x, _kx) = self.packed(layout, op)?;
        let (c, _kc) = cos.packed(cos_layout, op)?;
        let (s, _ks) = sin.packed(sin_layout, op)?;
        let (y, pairs, seq, half) = (out.buf.ptr(), (n / 2) as u64, seq as u64, half as u64);
        let name = by_dtype(self.dtype, "ops_rope_f32", "ops_rope_bf16");
        launch!(
            self.ctx(),
            name,
            grid(pairs),
            &x,
            &c,
            &s,
            &y,
            &pairs,
            &seq,
            &half
        )?;
        Ok(out)
    }
}

impl BackendDevice for CudaDevice {
    type Storage = CudaStorage;

    fn location(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    fn zeros(&self, shape: &Shape, dtype: DType) -> Result<CudaStorage> {
        let n = shape.elem_count();
        let buf = self
            .ctx
            .alloc_zeroed(n * dtype.size_in_bytes())
            .map_err(backend_err)?;
        Ok(CudaStorage {
            buf,
            dtype,
            len: n,
            device: self.clone(),
        })
    }

    fn storage_from_cpu(&self, data: CpuStorage) -> Result<CudaStorage> {
        let (buf, dtype, len) = match &data {
            CpuStorage::F32(v) => (self.ctx.upload(v), DType::F32, v.len()),
            CpuStorage::BF16(v) => (self.ctx.upload(v), DType::BF16, v.len()),
            CpuStorage::U8(v) => (self.ctx.upload(v), DType::U8, v.len()),
        };
        Ok(CudaStorage {
            buf: buf.map_err(backend_err)?,
            dtype,
            len,
            device: self.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mat(offset_elems: usize, ld: usize, batch_stride: usize, transposed: bool) -> MatLayout {
        MatLayout {
            offset_elems,
            ld,
            batch_stride,
            transposed,
        }
    }

    #[test]
    fn attention_views_are_read_in_place() {
        let q = Layout::contiguous(Shape::from([8, 6, 256, 64]));
        assert_eq!(gemm_layout(&q, false), Some(mat(0, 64, 256 * 64, false)));
        // k^T as the rhs is b = k: K-contiguous, the "TN" case.
        let kt = q.permute(&[0, 1, 3, 2]).unwrap();
        assert_eq!(gemm_layout(&kt, true), Some(mat(0, 64, 256 * 64, false)));
        // v as the rhs [K, N] is b stored the other way.
        assert_eq!(gemm_layout(&q, true), Some(mat(0, 64, 256 * 64, true)));
        // A narrowed view: offset and padded rows.
        let x = Layout::contiguous(Shape::from([2, 5, 9, 16]))
            .narrow(3, 3, 11)
            .unwrap();
        assert_eq!(gemm_layout(&x, false), Some(mat(3, 16, 9 * 16, false)));
        // A narrowed transposed matrix (no batch dims) is read as stored.
        let s = Layout::contiguous(Shape::from([6, 8]))
            .permute(&[1, 0])
            .unwrap()
            .narrow(0, 0, 4)
            .unwrap();
        assert_eq!(gemm_layout(&s, false), Some(mat(0, 8, 1, true)));
        // One shared matrix for the whole batch (stride 0).
        let w = Layout::contiguous(Shape::from([48, 24]))
            .broadcast_as(&Shape::from([4, 48, 24]))
            .unwrap();
        assert_eq!(gemm_layout(&w, true), Some(mat(0, 24, 0, true)));
    }

    #[test]
    fn unaddressable_views_are_packed() {
        // q of a fused [B, L, 3, H, D] projection as [B, H, L, D]: the batch
        // dims (B, H) do not merge into one stride.
        let q = Layout::contiguous(Shape::from([2, 32, 3, 4, 16]))
            .narrow(2, 0, 1)
            .unwrap()
            .permute(&[0, 2, 3, 1, 4])
            .unwrap();
        assert_eq!(gemm_layout(&q, false), None);
        // No unit stride in the matrix.
        let every_other = Layout::contiguous(Shape::from([4, 6, 2]))
            .narrow(2, 0, 1)
            .unwrap()
            .permute(&[2, 0, 1])
            .unwrap();
        assert_eq!(gemm_layout(&every_other, false), None);
    }
}
