//! GEMMs through cuBLASLt or hipBLASLt (`BlasLib` of `blas_lib.rs`:
//! `cublaslt.rs`, `rocm/blas.rs`): `y[M, N] = a[M, K] · b[N, K]^T` with
//! f32 accumulation, for f32, BF16 and FP8 operands (FP8 with per-tensor
//! scales; on HIP also the FNUZ formats and MX codes with E8M0 block
//! scales), optionally strided-batched and with a bias added in the
//! epilogue. The validation, the column-major view (`LtShape`) and the
//! plan cache are shared; the cuBLAS wording below holds for hipBLASLt,
//! whose API mirrors it.
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

use super::blas_lib::{BlasLib, LtLayout, LtShape, MatmulArgs, Plan, Pointers};
use super::nvrtc::Platform;
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
    /// FP8 E4M3FNUZ codes, 1 byte (hipBLASLt on gfx942 only).
    Fp8E4M3Fnuz,
    /// FP8 E5M2FNUZ codes, 1 byte (hipBLASLt on gfx942 only).
    Fp8E5M2Fnuz,
    /// MX E2M1 codes, two per byte (element 2i in the low nibble), with an
    /// E8M0 scale per 32 along K (hipBLASLt on gfx950 only).
    MxE2M1,
    /// MX E4M3FN codes, 1 byte, with E8M0 block scales (gfx950 only).
    MxE4M3,
    /// MX E5M2 codes, 1 byte, with E8M0 block scales (gfx950 only).
    MxE5M2,
    /// E4M3FN codes with one f32 scale_inv per row (`OUTER_VEC_32F`,
    /// SPEC 3b rowwise); paired with itself.
    Fp8E4M3Rowwise,
    /// E4M3FN codes with one f32 scale_inv per 1 x 128 block along K
    /// (`VEC128_32F`), stored block column by block column:
    /// `[K / 128, rows]`.
    Fp8E4M3Vec128,
    /// E4M3FN codes with one f32 scale_inv per 128 x 128 tile
    /// (`BLK128x128_32F`), stored tile row by tile row:
    /// `[ceil(rows / 128), K / 128]`; paired with [`GemmDType::Fp8E4M3Vec128`].
    Fp8E4M3Blk128,
}

impl GemmDType {
    /// Bits per element.
    pub fn bits(self) -> usize {
        match self {
            GemmDType::F32 => 32,
            GemmDType::Bf16 => 16,
            GemmDType::MxE2M1 => 4,
            _ => 8,
        }
    }

    /// Bytes of `elems` elements (whole bytes: E2M1 offsets are even).
    pub fn bytes(self, elems: usize) -> usize {
        elems * self.bits() / 8
    }

    /// Whether the type is one of the FP8 codes with a per-tensor scale,
    /// which need a scale pointer.
    pub fn is_fp8(self) -> bool {
        matches!(
            self,
            GemmDType::Fp8E4M3
                | GemmDType::Fp8E5M2
                | GemmDType::Fp8E4M3Fnuz
                | GemmDType::Fp8E5M2Fnuz
        )
    }

    /// Whether the type is MX codes, whose scale pointer is the E8M0 block
    /// scales (`[rows, K / 32]`, K-contiguous).
    pub fn is_mx(self) -> bool {
        matches!(
            self,
            GemmDType::MxE2M1 | GemmDType::MxE4M3 | GemmDType::MxE5M2
        )
    }

    /// Whether the type is E4M3 codes with a vector of f32 scales (rows or
    /// 128-blocks, SPEC 3b) rather than one per tensor.
    pub fn is_fp8_group(self) -> bool {
        matches!(
            self,
            GemmDType::Fp8E4M3Rowwise | GemmDType::Fp8E4M3Vec128 | GemmDType::Fp8E4M3Blk128
        )
    }

    /// Whether the operand needs a scale pointer (FP8, MX or FP8 groups).
    pub fn is_scaled(self) -> bool {
        self.is_fp8() || self.is_mx() || self.is_fp8_group()
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            GemmDType::F32 => "f32",
            GemmDType::Bf16 => "bf16",
            GemmDType::Fp8E4M3 => "e4m3",
            GemmDType::Fp8E5M2 => "e5m2",
            GemmDType::Fp8E4M3Fnuz => "e4m3fnuz",
            GemmDType::Fp8E5M2Fnuz => "e5m2fnuz",
            GemmDType::MxE2M1 => "mx-e2m1",
            GemmDType::MxE4M3 => "mx-e4m3",
            GemmDType::MxE5M2 => "mx-e5m2",
            GemmDType::Fp8E4M3Rowwise => "e4m3-rowwise",
            GemmDType::Fp8E4M3Vec128 => "e4m3-1x128",
            GemmDType::Fp8E4M3Blk128 => "e4m3-128x128",
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
    !operands.is_scaled() && out == GemmDType::F32
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
    /// Device f32 `[alpha, 0]`: y = alpha · (a · b^T) (+ bias), alpha read
    /// on the device (the library's device pointer mode), for a scale known
    /// only there, as NVFP4's fl32(t_a · t_b). `None`: alpha = 1.
    pub alpha: Option<&'a DevBuf>,
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
            alpha: None,
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
pub(crate) struct PlanKey {
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    /// a, b and y.
    pub(crate) dtypes: [GemmDType; 3],
    /// a, b and y with `offset_elems` zeroed (and batch strides when batch = 1).
    layouts: [MatLayout; 3],
    /// Byte alignment of every matrix start of a, b and y.
    align: [u32; 3],
    pub(crate) bias: Option<GemmDType>,
    /// Alpha and beta are device pointers ([`GemmSpec::alpha`]).
    pub(crate) device_alpha: bool,
}

impl PlanKey {
    /// The column-major view of the call: an untransposed operand is K x rows.
    pub(crate) fn lt_shape(&self) -> LtShape {
        let key = self;
        let [ta, tb, tout] = key.dtypes;
        let [la, lb, ly] = key.layouts;
        let (m, n, k) = (key.m, key.n, key.k);
        let view = |t, rows: usize, cols: usize, l: &MatLayout| LtLayout {
            dtype: t,
            rows: rows as u64,
            cols: cols as u64,
            ld: l.ld as i64,
            batch_stride: l.batch_stride as i64,
        };
        let [align_a, align_b, align_y] = key.align;
        LtShape {
            trans_a: !lb.transposed,
            trans_b: la.transposed,
            layouts: [
                if lb.transposed {
                    view(tb, n, k, &lb)
                } else {
                    view(tb, k, n, &lb)
                },
                if la.transposed {
                    view(ta, m, k, &la)
                } else {
                    view(ta, k, m, &la)
                },
                view(tout, n, m, &ly),
            ],
            batch: key.batch,
            bias: key.bias,
            align: [align_b, align_a, align_y, align_y],
            workspace: WORKSPACE_BYTES,
        }
    }
}

/// The BLAS handle, workspace and plan cache of a context.
pub(crate) struct Blas {
    lib: Box<dyn BlasLib>,
    workspace: DevBuf,
    plans: HashMap<PlanKey, Plan>,
    /// Keys the library had no algorithm for, with the error: a caller that
    /// falls back on every call does not rerun the heuristic each time.
    refused: HashMap<PlanKey, String>,
}

// SAFETY: the plans' raw handles are only used under the context's `blas` mutex.
unsafe impl Send for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        for (_, plan) in self.plans.drain() {
            // SAFETY: each plan is destroyed once, before the library's handle.
            unsafe { self.lib.destroy(&plan) };
        }
    }
}

impl Blas {
    fn new(ctx: &CudaContext) -> Result<Blas> {
        ctx.bind()?;
        let lib: Box<dyn BlasLib> = match ctx.platform() {
            Platform::Cuda => Box::new(super::cublaslt::CuBlasLt::new()?),
            #[cfg(feature = "rocm")]
            Platform::Hip => Box::new(crate::rocm::blas::HipBlasLtLib::new(&ctx.arch())?),
            #[cfg(not(feature = "rocm"))]
            Platform::Hip => {
                return Err(CudaError::Invalid(
                    "hipBLASLt needs a build with the rocm feature".into(),
                ))
            }
        };
        let workspace = ctx.alloc(WORKSPACE_BYTES)?;
        Ok(Blas {
            lib,
            workspace,
            plans: HashMap::new(),
            refused: HashMap::new(),
        })
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
        let y = self.alloc(out.bytes(m * n))?;
        self.gemm(a, b, &GemmSpec::nt(m, n, k), &y, out)?;
        Ok(y)
    }

    /// The general GEMM: `spec.batch` products `y = a · b^T (+ bias)` with
    /// the operands read in place as `spec` lays them out, in one cuBLASLt
    /// (hipBLASLt) call. Unsupported arguments give [`CudaError::Invalid`];
    /// a combination the library has no algorithm for gives
    /// [`CudaError::Blas`] naming it.
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
        if let Some(t) = [a.dtype, b.dtype, out]
            .into_iter()
            .find(|&t| !blas.lib.takes(t))
        {
            return Err(CudaError::Invalid(format!(
                "{}: {} on this device has no {} operands",
                what(),
                blas.lib.name(),
                t.name()
            )));
        }
        self.bind()?;
        if !blas.plans.contains_key(&key) {
            if let Some(msg) = blas.refused.get(&key) {
                return Err(CudaError::Blas(msg.clone()));
            }
            match blas.lib.plan(&key, &key.lt_shape(), &ptrs) {
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
        blas.lib.set_pointers(plan, &key, &ptrs)?;
        let at = |buf: &DevBuf, l: &MatLayout, t: GemmDType| {
            (buf.ptr() + t.bytes(l.offset_elems) as u64) as *const c_void
        };
        let args = MatmulArgs {
            a: at(b.buf, &spec.b, b.dtype),
            b: at(a.buf, &spec.a, a.dtype),
            d: at(y, &spec.y, out),
            workspace: blas.workspace.ptr(),
            workspace_bytes: WORKSPACE_BYTES,
            stream: self.stream_handle(),
            alpha: spec.alpha.map(DevBuf::ptr),
        };
        // SAFETY: the layouts describe ranges of the buffers checked by
        // `validate`; the workspace outlives the call (it is freed only with
        // the handle).
        unsafe { blas.lib.matmul(plan, &args) }.map_err(|e| match e {
            CudaError::Blas(s) => CudaError::Blas(format!("{}: {s}", what())),
            other => other,
        })
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
    // FP8 and MX operands share the FP8 rules (scale pointers, TN only).
    let fp8 = a.dtype.is_scaled();
    if fp8 != b.dtype.is_scaled() {
        return Err("both operands must be FP8, or neither".into());
    }
    if a.dtype.is_mx() != b.dtype.is_mx() {
        return Err("both operands must be MX block-scaled codes, or neither".into());
    }
    if a.dtype.is_mx() && k % 32 != 0 {
        return Err("MX GEMMs need K to be a multiple of 32 (the block size)".into());
    }
    fp8_group_pair(a.dtype, b.dtype, k)?;
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
    if spec.alpha.is_some_and(|a| a.len_bytes() < 8) {
        return Err("alpha must point at two f32 values, alpha and 0".into());
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
        let need = bias.dtype.bytes(n);
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
        if t.bits() < 8 && (l.offset_elems | l.ld | l.batch_stride | cols) % 2 != 0 {
            return Err(format!(
                "{name}: packed 4-bit codes need even offsets, row lengths, leading dims and batch strides"
            ));
        }
        let extent = l.offset_elems + (spec.batch - 1) * l.batch_stride + (rows - 1) * l.ld + cols;
        if buf.len_bytes() < t.bytes(extent) {
            return Err(format!(
                "{name} holds {} bytes, its layout reaches {}",
                buf.len_bytes(),
                t.bytes(extent)
            ));
        }
        if fp8 {
            let start = buf.ptr() + t.bytes(l.offset_elems) as u64;
            let batch_stride = if spec.batch > 1 { l.batch_stride } else { 0 };
            let strides = t.bytes(l.ld | batch_stride) as u64;
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

/// The pairings of FP8 group scales the libraries take: rowwise with
/// rowwise, and 128-blocks with 128-blocks or one side's 128 x 128 tiles
/// (cuBLASLt has no tile x tile GEMM), with K a multiple of 128.
fn fp8_group_pair(a: GemmDType, b: GemmDType, k: usize) -> std::result::Result<(), String> {
    use GemmDType::{Fp8E4M3Blk128 as Blk, Fp8E4M3Rowwise as Row, Fp8E4M3Vec128 as Vec};
    match (a, b) {
        _ if !a.is_fp8_group() && !b.is_fp8_group() => Ok(()),
        (Row, Row) => Ok(()),
        (Vec | Blk, Vec | Blk) if (a, b) == (Blk, Blk) => {
            Err("FP8 128x128 tiles pair with 1x128 blocks, not with tiles".into())
        }
        (Vec | Blk, Vec | Blk) if k % 128 != 0 => {
            Err("FP8 128-block GEMMs need K to be a multiple of 128".into())
        }
        (Vec | Blk, Vec | Blk) => Ok(()),
        _ => Err("FP8 rowwise operands pair with rowwise, 128-blocks with 128-blocks".into()),
    }
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
        align[i] = alignment(
            buf.ptr() + t.bytes(l.offset_elems) as u64,
            t.bytes(l.batch_stride) as u64,
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
        device_alpha: spec.alpha.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(a_t: bool, b_t: bool) -> PlanKey {
        let l = |ld, transposed| MatLayout {
            offset_elems: 0,
            ld,
            batch_stride: 0,
            transposed,
        };
        PlanKey {
            m: 32,
            n: 48,
            k: 64,
            batch: 1,
            dtypes: [GemmDType::Bf16, GemmDType::Bf16, GemmDType::F32],
            layouts: [
                l(if a_t { 32 } else { 64 }, a_t),
                l(if b_t { 48 } else { 64 }, b_t),
                l(48, false),
            ],
            align: [16, 32, 256],
            bias: None,
            device_alpha: false,
        }
    }

    /// The library's A is our b, its B our a, its D our y transposed; the
    /// "TN" layout of two K-contiguous operands; alignments follow the swap.
    #[test]
    fn the_column_major_view_swaps_the_operands() {
        let s = key(false, false).lt_shape();
        assert!(s.trans_a && !s.trans_b, "TN");
        let dims = s.layouts.map(|l| (l.rows, l.cols, l.ld));
        assert_eq!(dims, [(64, 48, 64), (64, 32, 64), (48, 32, 48)]);
        assert_eq!(s.align, [32, 16, 256, 256]);
        let t = key(true, true).lt_shape();
        assert!(!t.trans_a && t.trans_b);
        let dims = t.layouts.map(|l| (l.rows, l.cols, l.ld));
        assert_eq!(dims, [(48, 64, 48), (32, 64, 32), (48, 32, 48)]);
    }

    #[test]
    fn fp8_group_pairs_follow_the_scale_modes() {
        use GemmDType::*;
        assert!(fp8_group_pair(Fp8E4M3Rowwise, Fp8E4M3Rowwise, 16).is_ok());
        assert!(fp8_group_pair(Fp8E4M3Vec128, Fp8E4M3Blk128, 256).is_ok());
        assert!(fp8_group_pair(Fp8E4M3Blk128, Fp8E4M3Vec128, 128).is_ok());
        assert!(fp8_group_pair(Fp8E4M3Vec128, Fp8E4M3Vec128, 128).is_ok());
        assert!(fp8_group_pair(Fp8E4M3Blk128, Fp8E4M3Blk128, 128).is_err());
        assert!(fp8_group_pair(Fp8E4M3Vec128, Fp8E4M3Vec128, 144).is_err());
        assert!(fp8_group_pair(Fp8E4M3Rowwise, Fp8E4M3Vec128, 128).is_err());
        assert!(fp8_group_pair(Fp8E4M3Rowwise, Fp8E4M3, 128).is_err());
        assert!(fp8_group_pair(Fp8E4M3, Fp8E4M3, 16).is_ok());
        assert!(Fp8E4M3Blk128.is_scaled() && !Fp8E4M3Blk128.is_fp8());
    }

    #[test]
    fn packed_fp4_counts_half_bytes() {
        assert_eq!(GemmDType::MxE2M1.bytes(64), 32);
        assert_eq!(GemmDType::Fp8E4M3Fnuz.bytes(64), 64);
        assert_eq!(GemmDType::Bf16.bytes(3), 6);
        assert!(GemmDType::MxE2M1.is_scaled() && !GemmDType::MxE2M1.is_fp8());
        assert!(GemmDType::Fp8E5M2Fnuz.is_fp8());
    }
}
