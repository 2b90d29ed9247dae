//! cuBLASLt GEMMs: `y[M, N] = a[M, K] · b[N, K]^T` with f32 accumulation,
//! for BF16 operands and for FP8 operands with per-tensor scales.
//!
//! Row-major `y = a · b^T` with both operands K-contiguous is, in cuBLAS's
//! column-major terms, `y^T[N, M] = op(A) · op(B)` with A = b stored K x N
//! (`transa = T`), B = a stored K x M (`transb = N`) and D = y^T stored N x M
//! (ld = N): the "TN" layout, the only one Hopper supports for FP8.
//!
//! Settings that work for FP8 on Hopper (sm_90):
//! - compute type `CUBLAS_COMPUTE_32F`, scale type `CUDA_R_32F`;
//! - `TRANSA = T`, `TRANSB = N`; A and B `CUDA_R_8F_E4M3` or `CUDA_R_8F_E5M2`
//!   (E5M2 x E5M2 is not supported), ld = K;
//! - C and D of the output type (`CUDA_R_16BF` or `CUDA_R_32F`), beta = 0;
//! - `A_SCALE_POINTER` / `B_SCALE_POINTER`: device pointers to f32 scale_inv
//!   of each operand, so D = alpha · scale_a · scale_b · (A · B);
//! - M, N, K multiples of 16 and 16-byte aligned pointers;
//! - a workspace (32 MiB, NVIDIA's recommendation for Hopper) announced via
//!   `CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES`;
//! - `FAST_ACCUM` left at its default 0: the partial sums of the FP8 tensor
//!   cores are promoted to f32 regularly (slower than fast accumulation, but
//!   the accuracy the SPEC's "f32 accumulation" asks for).
//!
//! A plan (descriptors + heuristic algorithm) is cached per shape and dtypes,
//! so the heuristic runs once per shape.

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
    F32,
    Bf16,
    Fp8E4M3,
    Fp8E5M2,
}

impl GemmDType {
    pub fn size_in_bytes(self) -> usize {
        match self {
            GemmDType::F32 => 4,
            GemmDType::Bf16 => 2,
            GemmDType::Fp8E4M3 | GemmDType::Fp8E5M2 => 1,
        }
    }

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

/// One operand: `rows x K` elements, K contiguous.
#[derive(Clone, Copy, Debug)]
pub struct GemmOperand<'a> {
    pub buf: &'a DevBuf,
    pub dtype: GemmDType,
    /// FP8 only: device address of the f32 the decoded codes are multiplied
    /// by (the tensor's scale_inv, see [`super::Fp8Device::scale_inv_ptr`]).
    pub scale_inv: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    m: usize,
    n: usize,
    k: usize,
    a: GemmDType,
    b: GemmDType,
    out: GemmDType,
}

/// Descriptors and the chosen algorithm of one GEMM shape.
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
        self.gemm_nt_into(a, b, m, n, k, &y, out)?;
        Ok(y)
    }

    /// As [`CudaContext::gemm_nt`], writing into `y`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_nt_into(
        &self,
        a: &GemmOperand,
        b: &GemmOperand,
        m: usize,
        n: usize,
        k: usize,
        y: &DevBuf,
        out: GemmDType,
    ) -> Result<()> {
        let what = format!(
            "{} x {} -> {} GEMM (M={m}, N={n}, K={k})",
            a.dtype.name(),
            b.dtype.name(),
            out.name()
        );
        validate(a, b, m, n, k, y, out).map_err(|e| CudaError::Invalid(format!("{what}: {e}")))?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        let key = PlanKey {
            m,
            n,
            k,
            a: a.dtype,
            b: b.dtype,
            out,
        };
        let mut guard = self.inner.blas.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(Blas::new(self)?);
        }
        let blas = guard.as_mut().expect("created above");
        self.bind()?;
        let fp8 = a.dtype.is_fp8();
        if !blas.plans.contains_key(&key) {
            let plan = make_plan(blas, &key, a, b).map_err(|e| match e {
                CudaError::Blas(s) => CudaError::Blas(format!("{what}: {s}")),
                other => other,
            })?;
            blas.plans.insert(key, plan);
        }
        let plan = &blas.plans[&key];
        if fp8 {
            // cuBLAS's A is our b and its B is our a (see the module docs).
            set_scale_pointers(plan.desc, b.scale_inv, a.scale_inv)?;
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the layouts describe buffers checked by `validate`; the
        // workspace outlives the call (it is freed only with the handle).
        unsafe {
            lt::matmul(
                blas.handle,
                plan.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                b.buf.ptr() as *const c_void,
                plan.a_layout,
                a.buf.ptr() as *const c_void,
                plan.b_layout,
                y.ptr() as *const c_void,
                plan.d_layout,
                y.ptr() as *mut c_void,
                plan.d_layout,
                &plan.algo,
                blas.workspace.ptr() as *mut c_void,
                WORKSPACE_BYTES,
                self.inner.stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| CudaError::Blas(format!("{what}: cublasLtMatmul: {}", status_name(e))))
    }
}

fn validate(
    a: &GemmOperand,
    b: &GemmOperand,
    m: usize,
    n: usize,
    k: usize,
    y: &DevBuf,
    out: GemmDType,
) -> std::result::Result<(), String> {
    if !matches!(out, GemmDType::F32 | GemmDType::Bf16) {
        return Err("the output must be f32 or bf16".into());
    }
    if a.dtype.is_fp8() != b.dtype.is_fp8() {
        return Err("both operands must be FP8, or neither".into());
    }
    if !a.dtype.is_fp8() && (a.dtype != GemmDType::Bf16 || b.dtype != GemmDType::Bf16) {
        return Err("non-FP8 operands must both be bf16".into());
    }
    if a.dtype == GemmDType::Fp8E5M2 && b.dtype == GemmDType::Fp8E5M2 {
        return Err("cuBLASLt has no e5m2 x e5m2 GEMM; one operand must be e4m3".into());
    }
    if a.dtype.is_fp8() {
        if m % 16 != 0 || n % 16 != 0 || k % 16 != 0 {
            return Err(
                "FP8 GEMMs need M, N and K to be multiples of 16 (pad the operands)".into(),
            );
        }
        if a.scale_inv.is_none() || b.scale_inv.is_none() {
            return Err("FP8 operands need their scale_inv pointers".into());
        }
    }
    for (name, op, rows) in [("a", a, m), ("b", b, n)] {
        let need = rows * k * op.dtype.size_in_bytes();
        if op.buf.len_bytes() < need {
            return Err(format!(
                "operand {name} holds {} bytes, needs {need}",
                op.buf.len_bytes()
            ));
        }
    }
    let need = m * n * out.size_in_bytes();
    if y.len_bytes() < need {
        return Err(format!(
            "output holds {} bytes, needs {need}",
            y.len_bytes()
        ));
    }
    Ok(())
}

fn set_scale_pointers(
    desc: sys::cublasLtMatmulDesc_t,
    a_scale: Option<u64>,
    b_scale: Option<u64>,
) -> Result<()> {
    use sys::cublasLtMatmulDescAttributes_t as D;
    let (a_scale, b_scale) = (a_scale.unwrap_or(0), b_scale.unwrap_or(0));
    set_desc(desc, D::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale)?;
    set_desc(desc, D::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale)
}

fn make_plan(blas: &Blas, key: &PlanKey, a: &GemmOperand, b: &GemmOperand) -> Result<Plan> {
    use sys::cublasLtMatmulDescAttributes_t as D;
    let desc = lt::create_matmul_desc(
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        sys::cudaDataType::CUDA_R_32F,
    )
    .map_err(|e| blas_err("cublasLtMatmulDescCreate", e))?;
    let layout = |t: GemmDType, rows: usize, cols: usize, ld: usize| {
        lt::create_matrix_layout(t.cuda(), rows as u64, cols as u64, ld as i64)
            .map_err(|e| blas_err("cublasLtMatrixLayoutCreate", e))
    };
    // Build the plan as we go so that a failure drops what was created.
    let mut plan = Plan {
        desc,
        a_layout: std::ptr::null_mut(),
        b_layout: std::ptr::null_mut(),
        d_layout: std::ptr::null_mut(),
        algo: unsafe { std::mem::zeroed() },
    };
    // cublasOperation_t: 0 = N, 1 = T.
    set_desc(plan.desc, D::CUBLASLT_MATMUL_DESC_TRANSA, &1i32)?;
    set_desc(plan.desc, D::CUBLASLT_MATMUL_DESC_TRANSB, &0i32)?;
    if key.a.is_fp8() {
        set_scale_pointers(plan.desc, b.scale_inv, a.scale_inv)?;
    }
    plan.a_layout = layout(key.b, key.k, key.n, key.k)?;
    plan.b_layout = layout(key.a, key.k, key.m, key.k)?;
    plan.d_layout = layout(key.out, key.n, key.m, key.n)?;

    let pref =
        lt::create_matmul_pref().map_err(|e| blas_err("cublasLtMatmulPreferenceCreate", e))?;
    let ws = WORKSPACE_BYTES as u64;
    // SAFETY: the attribute takes a u64.
    let set = unsafe {
        lt::set_matmul_pref_attribute(
            pref,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &ws as *const u64 as *const c_void,
            std::mem::size_of::<u64>(),
        )
    };
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
            "cublasLtMatmulAlgoGetHeuristic (no algorithm for this layout)",
            e,
        )
    })?;
    plan.algo = heur.algo;
    Ok(plan)
}
