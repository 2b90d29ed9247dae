//! cuBLASLt GEMMs: `y[M, N] = a[M, K] · b[N, K]^T` with f32 accumulation,
//! for f32, BF16 and FP8 operands (FP8 with per-tensor scales), optionally
//! strided-batched and with a bias added in the epilogue.
//!
//! Row-major `y = a · b^T` is, in cuBLAS's column-major terms,
//! `y^T[N, M] = op(A) · op(B)` with A = b, B = a and D = y^T (ld = y's row
//! stride). An operand stored K-contiguous (a as `[M, K]`, b as `[N, K]`) is
//! a column-major K x rows matrix, so `transa = T`, `transb = N`: the "TN"
//! layout, the only one Hopper supports for FP8. An operand stored the other
//! way ([`MatLayout::transposed`]: a as `[K, M]`, b as `[K, N]`) flips its
//! `trans` flag instead of being copied; f32 and BF16 take every combination.
//!
//! A batch is one call: `CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT` and
//! `CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET` on every layout (stride 0
//! reuses one matrix for the whole batch). The bias (`CUBLASLT_EPILOGUE_BIAS`)
//! is a vector of N values added to every row of y: cuBLASLt adds it to the
//! f32 accumulator and rounds once to y's type.
//!
//! Settings that work for FP8 on Hopper (sm_90):
//! - compute type `CUBLAS_COMPUTE_32F`, scale type `CUDA_R_32F`;
//! - `TRANSA = T`, `TRANSB = N`; A and B `CUDA_R_8F_E4M3` or `CUDA_R_8F_E5M2`
//!   (E5M2 x E5M2 is not supported), ld = K;
//! - C and D of the output type (`CUDA_R_16BF` or `CUDA_R_32F`), beta = 0;
//! - `A_SCALE_POINTER` / `B_SCALE_POINTER`: device pointers to f32 scale_inv
//!   of each operand, so D = alpha · scale_a · scale_b · (A · B);
//! - M, N, K multiples of 16 and 16-byte aligned pointers, leading dims and
//!   batch strides;
//! - a workspace (32 MiB, NVIDIA's recommendation for Hopper) announced via
//!   `CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES`;
//! - `FAST_ACCUM` left at its default 0: the partial sums of the FP8 tensor
//!   cores are promoted to f32 regularly (slower than fast accumulation, but
//!   the accuracy the SPEC's "f32 accumulation" asks for).
//!
//! cuBLASLt's heuristic assumes 256-byte aligned matrices unless told
//! otherwise, so the actual alignment of every matrix start (pointer, element
//! offset and batch stride) is announced with
//! `CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES` and is part of the plan key.
//!
//! A plan (descriptors + heuristic algorithm) is cached per shape, batch,
//! dtypes, layouts, alignments and bias type, so the heuristic runs once per
//! kind of call; the scale and bias pointers are set on every call.

use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::cublaslt::result::{self as lt, CublasError};
use cudarc::cublaslt::sys;

use super::{CudaContext, CudaError, DevBuf, Result};

/// cuBLASLt workspace: 32 MiB, NVIDIA's recommendation for Hopper and later.
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// Element type of a GEMM operand or output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmDType {
    /// IEEE f32, 4 bytes.
    F32,
    /// bfloat16, 2 bytes.
    Bf16,
    /// OCP FP8 E4M3FN codes, 1 byte.
    Fp8E4M3,
    /// OCP FP8 E5M2 codes, 1 byte.
    Fp8E5M2,
}

impl GemmDType {
    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            GemmDType::F32 => 4,
            GemmDType::Bf16 => 2,
            GemmDType::Fp8E4M3 | GemmDType::Fp8E5M2 => 1,
        }
    }

    /// Whether the type is one of the FP8 codes, which need a scale pointer.
    pub fn is_fp8(self) -> bool {
        matches!(self, GemmDType::Fp8E4M3 | GemmDType::Fp8E5M2)
    }

    fn cuda(self) -> sys::cudaDataType {
        match self {
            GemmDType::F32 => sys::cudaDataType::CUDA_R_32F,
            GemmDType::Bf16 => sys::cudaDataType::CUDA_R_16BF,
            GemmDType::Fp8E4M3 => sys::cudaDataType::CUDA_R_8F_E4M3,
            GemmDType::Fp8E5M2 => sys::cudaDataType::CUDA_R_8F_E5M2,
        }
    }

    fn name(self) -> &'static str {
        match self {
            GemmDType::F32 => "f32",
            GemmDType::Bf16 => "bf16",
            GemmDType::Fp8E4M3 => "e4m3",
            GemmDType::Fp8E5M2 => "e5m2",
        }
    }
}

/// One operand: its buffer and element type; where its matrices sit is the
/// [`MatLayout`] of the [`GemmSpec`] (packed `rows x K` for [`CudaContext::gemm_nt`]).
#[derive(Clone, Copy, Debug)]
pub struct GemmOperand<'a> {
    /// The device buffer holding the operand's matrices.
    pub buf: &'a DevBuf,
    /// The element type of `buf`.
    pub dtype: GemmDType,
    /// FP8 only: device address of the f32 the decoded codes are multiplied
    /// by (the tensor's scale_inv, see [`super::Fp8Device::scale_inv_ptr`]).
    pub scale_inv: Option<u64>,
}

/// Where the matrices of an operand or of the output sit in their buffer,
/// in elements of its type. Row-major: a is `[M, K]`, b is `[N, K]`, y is
/// `[M, N]`, or, when `transposed`, a is stored `[K, M]` and b `[K, N]`
/// (y cannot be transposed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatLayout {
    /// Start of the first matrix.
    pub offset_elems: usize,
    /// Distance between stored rows, at least the stored row length.
    pub ld: usize,
    /// Distance between the matrices of a batch; 0 reuses one matrix.
    pub batch_stride: usize,
    /// Whether the matrix is stored transposed (a as `[K, M]`, b as `[K, N]`).
    pub transposed: bool,
}

impl MatLayout {
    /// Packed row-major `rows x cols` matrices, one after the other.
    pub fn packed(rows: usize, cols: usize) -> MatLayout {
        MatLayout {
            offset_elems: 0,
            ld: cols,
            batch_stride: rows * cols,
            transposed: false,
        }
    }
}

/// Whether cuBLASLt fuses an f32 bias into a GEMM of `operands` writing
/// `out`. On the H200 (cuBLASLt 13.x, sm_90) its heuristic found no
/// algorithm for an f32 bias with FP8 operands or with a BF16 output; BF16
/// operands with an f32 output work.
pub fn fuses_f32_bias(operands: GemmDType, out: GemmDType) -> bool {
    !operands.is_fp8() && out == GemmDType::F32
}

/// A bias of N values (f32 in our models: the master weights), added to
/// every row of y in the epilogue.
#[derive(Clone, Copy, Debug)]
pub struct GemmBias<'a> {
    /// The device buffer holding at least N values.
    pub buf: &'a DevBuf,
    /// The bias's element type: F32 or BF16 (an f32 bias only where
    /// [`fuses_f32_bias`]).
    pub dtype: GemmDType,
}

/// Shape and layouts of one [`CudaContext::gemm`] call: `batch` products
/// `y[M, N] = a[M, K] · b[N, K]^T (+ bias)`.
#[derive(Clone, Copy, Debug)]
pub struct GemmSpec<'a> {
    /// Rows of a and y.
    pub m: usize,
    /// Rows of b, columns of y.
    pub n: usize,
    /// The reduction length: columns of a and b.
    pub k: usize,
    /// Number of products; 1 is a single GEMM.
    pub batch: usize,
    /// Where a's `[M, K]` matrices sit in their buffer.
    pub a: MatLayout,
    /// Where b's `[N, K]` matrices sit in their buffer.
    pub b: MatLayout,
    /// Where y's `[M, N]` matrices go in the output buffer (never transposed).
    pub y: MatLayout,
    /// A bias added to every row of y in the epilogue, if any.
    pub bias: Option<GemmBias<'a>>,
}

impl GemmSpec<'_> {
    /// One GEMM of packed K-contiguous operands into a packed y, no bias
    /// (what [`CudaContext::gemm_nt`] runs).
    pub fn nt(m: usize, n: usize, k: usize) -> GemmSpec<'static> {
        GemmSpec {
            m,
            n,
            k,
            batch: 1,
            a: MatLayout::packed(m, k),
            b: MatLayout::packed(n, k),
            y: MatLayout::packed(m, n),
            bias: None,
        }
    }

    /// `(rows, cols)` as stored of a, b and y.
    fn stored(&self) -> [(usize, usize, &MatLayout); 3] {
        let (m, n, k) = (self.m, self.n, self.k);
        let rc = |l: &MatLayout, rows, cols| {
            if l.transposed {
                (cols, rows)
            } else {
                (rows, cols)
            }
        };
        let (ar, ac) = rc(&self.a, m, k);
        let (br, bc) = rc(&self.b, n, k);
        [(ar, ac, &self.a), (br, bc, &self.b), (m, n, &self.y)]
    }
}

/// Everything the descriptors and the chosen algorithm depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    dtypes: [GemmDType; 3],
    /// a, b and y with `offset_elems` zeroed (and batch strides when batch = 1).
    layouts: [MatLayout; 3],
    /// Byte alignment of every matrix start of a, b and y.
    align: [u32; 3],
    bias: Option<GemmDType>,
}

/// Descriptors and the chosen algorithm of one [`PlanKey`].
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a_layout: sys::cublasLtMatrixLayout_t,
    b_layout: sys::cublasLtMatrixLayout_t,
    d_layout: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each handle was created once by this plan and is destroyed once.
        unsafe {
            for l in [self.d_layout, self.b_layout, self.a_layout] {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// The cuBLASLt handle, workspace and plan cache of a context.
pub(crate) struct Blas {
    handle: sys::cublasLtHandle_t,
    workspace: DevBuf,
    plans: HashMap<PlanKey, Plan>,
    /// Keys cuBLASLt had no algorithm for, with the error: a caller that
    /// falls back on every call does not rerun the heuristic each time.
    refused: HashMap<PlanKey, String>,
}

// SAFETY: the raw handles are only used under the context's `blas` mutex.
unsafe impl Send for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: created once in `Blas::new`.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

impl Blas {
    fn new(ctx: &CudaContext) -> Result<Blas> {
        ctx.bind()?;
        let handle = lt::create_handle().map_err(|e| blas_err("cublasLtCreate", e))?;
        let workspace = ctx.alloc(WORKSPACE_BYTES)?;
        Ok(Blas {
            handle,
            workspace,
            plans: HashMap::new(),
            refused: HashMap::new(),
        })
    }
}

fn status_name(e: CublasError) -> String {
    // SAFETY: cublasLtGetStatusName returns a static C string.
    let name = unsafe { sys::cublasLtGetStatusName(e.0) };
    if name.is_null() {
        format!("{:?}", e.0)
    } else {
        unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }
}

fn blas_err(op: &str, e: CublasError) -> CudaError {
    CudaError::Blas(format!("{op}: {}", status_name(e)))
}

fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<()> {
    // SAFETY: `v` is a plain value of the type the attribute expects.
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            attr,
            v as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )
    }
    .map_err(|e| blas_err(&format!("cublasLtMatmulDescSetAttribute({attr:?})"), e))
}

/// Device pointers set on the descriptor at every call (cuBLAS's A is our b).
#[derive(Clone, Copy)]
struct Pointers {
    a_scale: u64,
    b_scale: u64,
    bias: u64,
}

impl Pointers {
    fn set(&self, desc: sys::cublasLtMatmulDesc_t, key: &PlanKey) -> Result<()> {
        use sys::cublasLtMatmulDescAttributes_t as D;
        if key.dtypes[0].is_fp8() {
            set_desc(desc, D::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &self.b_scale)?;
            set_desc(desc, D::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &self.a_scale)?;
        }
        if key.bias.is_some() {
            set_desc(desc, D::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &self.bias)?;
        }
        Ok(())
    }
}

/// Largest power of two, at most 256, dividing `addr` and `stride` (bytes).
fn alignment(addr: u64, stride: u64) -> u32 {
    let x = addr | stride | 256;
    (x & x.wrapping_neg()) as u32
}

impl CudaContext {
    /// `y[M, N] = a[M, K] · b[N, K]^T` into a new buffer of `out` elements.
    pub fn gemm_nt(
        &self,
        a: &GemmOperand,
        b: &GemmOperand,
        m: usize,
        n: usize,
        k: usize,
        out: GemmDType,
    ) -> Result<DevBuf> {
        let y = self.alloc(m * n * out.size_in_bytes())?;
        self.gemm(a, b, &GemmSpec::nt(m, n, k), &y, out)?;
        Ok(y)
    }

    /// The general GEMM: `spec.batch` products `y = a · b^T (+ bias)` with
    /// the operands read in place as `spec` lays them out, in one cuBLASLt
    /// call. Unsupported arguments give [`CudaError::Invalid`]; a combination
    /// cuBLASLt has no algorithm for gives [`CudaError::Blas`] naming it.
    pub fn gemm(
        &self,
        a: &GemmOperand,
        b: &GemmOperand,
        spec: &GemmSpec,
        y: &DevBuf,
        out: GemmDType,
    ) -> Result<()> {
        // Formatted only on failure: this runs on every matmul.
        let what = || describe(a, b, spec, out);
        validate(a, b, spec, y, out).map_err(|e| CudaError::Invalid(format!("{}: {e}", what())))?;
        if spec.m == 0 || spec.n == 0 || spec.batch == 0 {
            return Ok(());
        }
        if self.platform() == crate::cuda::nvrtc::Platform::Hip {
            return Err(CudaError::Blas(format!(
                "{}: the hipBLASLt GEMMs are not wired yet",
                what()
            )));
        }
        let key = plan_key(a, b, spec, y, out);
        let ptrs = Pointers {
            a_scale: a.scale_inv.unwrap_or(0),
            b_scale: b.scale_inv.unwrap_or(0),
            bias: spec.bias.map_or(0, |bias| bias.buf.ptr()),
        };
        let mut guard = self.inner.blas.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(Blas::new(self)?);
        }
        let blas = guard.as_mut().expect("created above");
        self.bind()?;
        if !blas.plans.contains_key(&key) {
            if let Some(msg) = blas.refused.get(&key) {
                return Err(CudaError::Blas(msg.clone()));
            }
            match make_plan(blas, &key, &ptrs) {
                Ok(plan) => {
                    blas.plans.insert(key, plan);
                }
                Err(CudaError::Blas(s)) => {
                    let msg = format!("{}: {s}", what());
                    blas.refused.insert(key, msg.clone());
                    return Err(CudaError::Blas(msg));
                }
                Err(other) => return Err(other),
            }
        }
        let plan = &blas.plans[&key];
        ptrs.set(plan.desc, &key)?;
        let at = |buf: &DevBuf, l: &MatLayout, t: GemmDType| {
            (buf.ptr() + (l.offset_elems * t.size_in_bytes()) as u64) as *const c_void
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let d = at(y, &spec.y, out);
        // SAFETY: the layouts describe ranges of the buffers checked by
        // `validate`; the workspace outlives the call (it is freed only with
        // the handle).
        unsafe {
            lt::matmul(
                blas.handle,
                plan.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                at(b.buf, &spec.b, b.dtype),
                plan.a_layout,
                at(a.buf, &spec.a, a.dtype),
                plan.b_layout,
                d,
                plan.d_layout,
                d as *mut c_void,
                plan.d_layout,
                &plan.algo,
                blas.workspace.ptr() as *mut c_void,
                WORKSPACE_BYTES,
                self.stream_handle() as sys::cudaStream_t,
            )
        }
        .map_err(|e| CudaError::Blas(format!("{}: cublasLtMatmul: {}", what(), status_name(e))))
    }
}

/// One line naming a call, for errors.
fn describe(a: &GemmOperand, b: &GemmOperand, spec: &GemmSpec, out: GemmDType) -> String {
    let t = |l: &MatLayout| if l.transposed { "T" } else { "N" };
    format!(
        "{} x {} -> {} GEMM (M={}, N={}, K={}, batch={}, a {} ld={} stride={}, b {} ld={} stride={}, y ld={} stride={}, bias {})",
        a.dtype.name(),
        b.dtype.name(),
        out.name(),
        spec.m,
        spec.n,
        spec.k,
        spec.batch,
        t(&spec.a),
        spec.a.ld,
        spec.a.batch_stride,
        t(&spec.b),
        spec.b.ld,
        spec.b.batch_stride,
        spec.y.ld,
        spec.y.batch_stride,
        spec.bias.map_or("none", |b| b.dtype.name())
    )
}

fn validate(
    a: &GemmOperand,
    b: &GemmOperand,
    spec: &GemmSpec,
    y: &DevBuf,
    out: GemmDType,
) -> std::result::Result<(), String> {
    let (m, n, k) = (spec.m, spec.n, spec.k);
    if !matches!(out, GemmDType::F32 | GemmDType::Bf16) {
        return Err("the output must be f32 or bf16".into());
    }
    let fp8 = a.dtype.is_fp8();
    if fp8 != b.dtype.is_fp8() {
        return Err("both operands must be FP8, or neither".into());
    }
    if !fp8 && a.dtype != b.dtype {
        return Err("non-FP8 operands must both be bf16 or both f32".into());
    }
    if a.dtype == GemmDType::F32 && out != GemmDType::F32 {
        return Err("f32 operands need an f32 output".into());
    }
    if a.dtype == GemmDType::Fp8E5M2 && b.dtype == GemmDType::Fp8E5M2 {
        return Err("cuBLASLt has no e5m2 x e5m2 GEMM; one operand must be e4m3".into());
    }
    if spec.y.transposed {
        return Err("y cannot be transposed (swap a and b instead)".into());
    }
    if fp8 {
        if m % 16 != 0 || n % 16 != 0 || k % 16 != 0 {
            return Err(
                "FP8 GEMMs need M, N and K to be multiples of 16 (pad the operands)".into(),
            );
        }
        if a.scale_inv.is_none() || b.scale_inv.is_none() {
            return Err("FP8 operands need their scale_inv pointers".into());
        }
        // cuBLASLt answered NOT_SUPPORTED for scale pointers 4 bytes apart
        // (seen on the H200); the quantizers keep each in a 16-byte slot.
        if [a.scale_inv, b.scale_inv]
            .iter()
            .flatten()
            .any(|p| p % 16 != 0)
        {
            return Err("FP8 scale_inv pointers must be 16-byte aligned".into());
        }
        if spec.a.transposed || spec.b.transposed {
            return Err("FP8 GEMMs on Hopper take only the TN layout: a and b must both be K-contiguous (not transposed)".into());
        }
    }
    if let Some(bias) = spec.bias {
        if !matches!(bias.dtype, GemmDType::F32 | GemmDType::Bf16) {
            return Err("the bias must be f32 or bf16".into());
        }
        if bias.dtype == GemmDType::F32 && !fuses_f32_bias(a.dtype, out) {
            return Err(format!(
                "cuBLASLt has no f32 bias epilogue for {} operands with a {} output (write f32 and add the bias after)",
                a.dtype.name(),
                out.name()
            ));
        }
        let need = n * bias.dtype.size_in_bytes();
        if bias.buf.len_bytes() < need {
            return Err(format!(
                "the bias holds {} bytes, needs {need}",
                bias.buf.len_bytes()
            ));
        }
    }
    let bufs = [(a.buf, a.dtype), (b.buf, b.dtype), (y, out)];
    for (name, (&(rows, cols, l), (buf, t))) in
        ["a", "b", "y"].iter().zip(spec.stored().iter().zip(bufs))
    {
        if l.ld < cols.max(1) {
            return Err(format!(
                "{name}: ld {} is below its row length {cols}",
                l.ld
            ));
        }
        if rows == 0 || cols == 0 || spec.batch == 0 {
            continue;
        }
        let es = t.size_in_bytes();
        let extent = l.offset_elems + (spec.batch - 1) * l.batch_stride + (rows - 1) * l.ld + cols;
        if buf.len_bytes() < extent * es {
            return Err(format!(
                "{name} holds {} bytes, its layout reaches {}",
                buf.len_bytes(),
                extent * es
            ));
        }
        if fp8 {
            let start = buf.ptr() + (l.offset_elems * es) as u64;
            let batch_stride = if spec.batch > 1 { l.batch_stride } else { 0 };
            let strides = ((l.ld | batch_stride) * es) as u64;
            if alignment(start, strides) < 16 {
                return Err(format!(
                    "{name}: FP8 GEMMs need 16-byte aligned matrix starts and leading dims (offset {}, ld {}, batch stride {})",
                    l.offset_elems, l.ld, l.batch_stride
                ));
            }
        }
    }
    if spec.batch > 1 && m > 0 && n > 0 && spec.y.batch_stride < (m - 1) * spec.y.ld + n {
        return Err(format!(
            "the matrices of y overlap (batch stride {} < {})",
            spec.y.batch_stride,
            (m - 1) * spec.y.ld + n
        ));
    }
    Ok(())
}

/// The plan key of a validated call. A batch that reuses one b over packed
/// a and y matrices (`x[B, M, K] · w^T`) becomes one GEMM of B·M rows, and a
/// single product forgets its batch strides, so equal work shares a plan.
fn plan_key(
    a: &GemmOperand,
    b: &GemmOperand,
    spec: &GemmSpec,
    y: &DevBuf,
    out: GemmDType,
) -> PlanKey {
    let (mut m, mut batch) = (spec.m, spec.batch);
    let [mut la, mut lb, mut ly] = [spec.a, spec.b, spec.y];
    if batch > 1
        && lb.batch_stride == 0
        && !la.transposed
        && la.batch_stride == m * la.ld
        && ly.batch_stride == m * ly.ld
    {
        m *= batch;
        batch = 1;
    }
    let bufs = [(a.buf, a.dtype), (b.buf, b.dtype), (y, out)];
    let mut align = [0u32; 3];
    for (i, (l, (buf, t))) in [&mut la, &mut lb, &mut ly]
        .into_iter()
        .zip(bufs)
        .enumerate()
    {
        if batch == 1 {
            l.batch_stride = 0;
        }
        let es = t.size_in_bytes();
        align[i] = alignment(
            buf.ptr() + (l.offset_elems * es) as u64,
            (l.batch_stride * es) as u64,
        );
        l.offset_elems = 0;
    }
    PlanKey {
        m,
        n: spec.n,
        k: spec.k,
        batch,
        dtypes: [a.dtype, b.dtype, out],
        layouts: [la, lb, ly],
        align,
        bias: spec.bias.map(|b| b.dtype),
    }
}

fn make_plan(blas: &Blas, key: &PlanKey, ptrs: &Pointers) -> Result<Plan> {
    use sys::cublasLtMatmulDescAttributes_t as D;
    use sys::cublasLtMatmulPreferenceAttributes_t as P;
    use sys::cublasLtMatrixLayoutAttribute_t as L;
    let desc = lt::create_matmul_desc(
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        sys::cudaDataType::CUDA_R_32F,
    )
    .map_err(|e| blas_err("cublasLtMatmulDescCreate", e))?;
    // Build the plan as we go so that a failure drops what was created.
    let mut plan = Plan {
        desc,
        a_layout: std::ptr::null_mut(),
        b_layout: std::ptr::null_mut(),
        d_layout: std::ptr::null_mut(),
        algo: unsafe { std::mem::zeroed() },
    };
    let [ta, tb, tout] = key.dtypes;
    let [la, lb, ly] = key.layouts;
    // cublasOperation_t: 0 = N, 1 = T. cuBLAS's A is our b, its B our a.
    set_desc(
        plan.desc,
        D::CUBLASLT_MATMUL_DESC_TRANSA,
        &i32::from(!lb.transposed),
    )?;
    set_desc(
        plan.desc,
        D::CUBLASLT_MATMUL_DESC_TRANSB,
        &i32::from(la.transposed),
    )?;
    if let Some(bias) = key.bias {
        let epilogue = sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS as u32;
        set_desc(plan.desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue)?;
        set_desc(
            plan.desc,
            D::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
            &(bias.cuda() as i32),
        )?;
    }
    ptrs.set(plan.desc, key)?;
    let layout = |t: GemmDType,
                  rows: usize,
                  cols: usize,
                  l: &MatLayout|
     -> Result<sys::cublasLtMatrixLayout_t> {
        let h = lt::create_matrix_layout(t.cuda(), rows as u64, cols as u64, l.ld as i64)
            .map_err(|e| blas_err("cublasLtMatrixLayoutCreate", e))?;
        if key.batch > 1 {
            let set = |attr, v: *const c_void, size| {
                // SAFETY: `v` points to a value of the attribute's type.
                unsafe { lt::set_matrix_layout_attribute(h, attr, v, size) }
            };
            let count = key.batch as i32;
            let stride = l.batch_stride as i64;
            let r = set(
                L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                &count as *const i32 as *const c_void,
                4,
            )
            .and_then(|_| {
                set(
                    L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    &stride as *const i64 as *const c_void,
                    8,
                )
            });
            if let Err(e) = r {
                // SAFETY: created above, not stored anywhere.
                let _ = unsafe { lt::destroy_matrix_layout(h) };
                return Err(blas_err("cublasLtMatrixLayoutSetAttribute(batch)", e));
            }
        }
        Ok(h)
    };
    // Column-major views: an untransposed operand is K x rows.
    let (m, n, k) = (key.m, key.n, key.k);
    plan.a_layout = if lb.transposed {
        layout(tb, n, k, &lb)?
    } else {
        layout(tb, k, n, &lb)?
    };
    plan.b_layout = if la.transposed {
        layout(ta, m, k, &la)?
    } else {
        layout(ta, k, m, &la)?
    };
    plan.d_layout = layout(tout, n, m, &ly)?;

    let pref =
        lt::create_matmul_pref().map_err(|e| blas_err("cublasLtMatmulPreferenceCreate", e))?;
    let ws = WORKSPACE_BYTES as u64;
    let set_pref = |attr, v: *const c_void, size| {
        // SAFETY: `v` points to a value of the attribute's type.
        unsafe { lt::set_matmul_pref_attribute(pref, attr, v, size) }
    };
    let mut set = set_pref(
        P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
        &ws as *const u64 as *const c_void,
        8,
    );
    let [align_a, align_b, align_y] = key.align;
    for (attr, v) in [
        (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b),
        (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a),
        (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_y),
        (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_y),
    ] {
        set = set.and_then(|_| set_pref(attr, &v as *const u32 as *const c_void, 4));
    }
    // SAFETY: every handle is live; C and D share a layout (beta = 0).
    let heur = set.and_then(|_| unsafe {
        lt::get_matmul_algo_heuristic(
            blas.handle,
            plan.desc,
            plan.a_layout,
            plan.b_layout,
            plan.d_layout,
            plan.d_layout,
            pref,
        )
    });
    // SAFETY: created above, destroyed once.
    let _ = unsafe { lt::destroy_matmul_pref(pref) };
    let heur = heur.map_err(|e| {
        blas_err(
            "cublasLtMatmulAlgoGetHeuristic (no algorithm for this combination)",
            e,
        )
    })?;
    plan.algo = heur.algo;
    Ok(plan)
}
