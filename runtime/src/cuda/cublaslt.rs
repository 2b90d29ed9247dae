//! cuBLASLt as the [`BlasLib`] of a CUDA context: the calls `gemm.rs` made
//! before the GEMM served HIP too, one for one (see `gemm.rs` for the
//! settings that work for FP8 on Hopper).

use std::ffi::c_void;

use cudarc::cublaslt::result::{self as lt, CublasError};
use cudarc::cublaslt::sys;

use super::blas_lib::{BatchAttr, BlasLib, LtLayout, LtShape, MatmulArgs, Plan, Pointers};
use super::driver::Handle;
use super::gemm::{GemmDType, PlanKey};
use super::{CudaError, Result};

/// A cuBLASLt handle.
pub(crate) struct CuBlasLt {
    handle: sys::cublasLtHandle_t,
}

// SAFETY: the handle is only used under the context's `blas` mutex.
unsafe impl Send for CuBlasLt {}

impl CuBlasLt {
    /// A new handle (the context must be current on this thread).
    pub(crate) fn new() -> Result<CuBlasLt> {
        let handle = lt::create_handle().map_err(|e| blas_err("cublasLtCreate", e))?;
        Ok(CuBlasLt { handle })
    }
}

impl Drop for CuBlasLt {
    fn drop(&mut self) {
        // SAFETY: created once in `new`.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// cuBLASLt's type of a GEMM operand, if it has one (Hopper has no FNUZ
/// and no block-scaled MX types).
fn cuda_type(t: GemmDType) -> Option<sys::cudaDataType> {
    match t {
        GemmDType::F32 => Some(sys::cudaDataType::CUDA_R_32F),
        GemmDType::Bf16 => Some(sys::cudaDataType::CUDA_R_16BF),
        GemmDType::Fp8E4M3 => Some(sys::cudaDataType::CUDA_R_8F_E4M3),
        GemmDType::Fp8E5M2 => Some(sys::cudaDataType::CUDA_R_8F_E5M2),
        t if t.is_fp8_group() => Some(sys::cudaDataType::CUDA_R_8F_E4M3),
        _ => None,
    }
}

/// cuBLASLt's scale mode of an FP8 group operand (SPEC 3b).
fn group_scale_mode(t: GemmDType) -> Option<sys::cublasLtMatmulMatrixScale_t> {
    use sys::cublasLtMatmulMatrixScale_t as S;
    match t {
        GemmDType::Fp8E4M3Rowwise => Some(S::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F),
        GemmDType::Fp8E4M3Vec128 => Some(S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F),
        GemmDType::Fp8E4M3Blk128 => Some(S::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F),
        _ => None,
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

fn set_desc<T>(desc: Handle, attr: sys::cublasLtMatmulDescAttributes_t, v: &T) -> Result<()> {
    // SAFETY: `v` is a plain value of the type the attribute expects.
    unsafe {
        lt::set_matmul_desc_attribute(
            desc as sys::cublasLtMatmulDesc_t,
            attr,
            v as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )
    }
    .map_err(|e| blas_err(&format!("cublasLtMatmulDescSetAttribute({attr:?})"), e))
}

impl BlasLib for CuBlasLt {
    fn name(&self) -> &'static str {
        "cuBLASLt"
    }

    fn takes(&self, t: GemmDType) -> bool {
        cuda_type(t).is_some()
    }

    fn set_pointers(&self, plan: &Plan, key: &PlanKey, ptrs: &Pointers) -> Result<()> {
        use sys::cublasLtMatmulDescAttributes_t as D;
        if key.dtypes[0].is_scaled() {
            set_desc(
                plan.desc,
                D::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                &ptrs.b_scale,
            )?;
            set_desc(
                plan.desc,
                D::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                &ptrs.a_scale,
            )?;
        }
        if key.bias.is_some() {
            set_desc(plan.desc, D::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptrs.bias)?;
        }
        Ok(())
    }

    fn plan(&self, key: &PlanKey, shape: &LtShape, ptrs: &Pointers) -> Result<Plan> {
        use sys::cublasLtMatmulDescAttributes_t as D;
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(|e| blas_err("cublasLtMatmulDescCreate", e))?;
        // Build the plan as we go so that a failure drops what was created.
        let mut plan = Plan::new(desc as Handle);
        // cublasOperation_t: 0 = N, 1 = T.
        set_desc(
            plan.desc,
            D::CUBLASLT_MATMUL_DESC_TRANSA,
            &i32::from(shape.trans_a),
        )?;
        set_desc(
            plan.desc,
            D::CUBLASLT_MATMUL_DESC_TRANSB,
            &i32::from(shape.trans_b),
        )?;
        if let Some(b_mode) = group_scale_mode(key.dtypes[0]) {
            // The library's A is our b: its mode is b's.
            let a_mode = group_scale_mode(key.dtypes[1]).expect("validated pairing");
            set_desc(
                plan.desc,
                D::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                &(a_mode as u32),
            )?;
            set_desc(
                plan.desc,
                D::CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                &(b_mode as u32),
            )?;
        }
        if key.device_alpha {
            let mode = sys::cublasLtPointerMode_t::CUBLASLT_POINTER_MODE_DEVICE as i32;
            set_desc(plan.desc, D::CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode)?;
        }
        if let Some(bias) = shape.bias {
            let epilogue = sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS as u32;
            set_desc(plan.desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue)?;
            let t = cuda_type(bias).expect("validated bias type");
            set_desc(
                plan.desc,
                D::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                &(t as i32),
            )?;
        }
        self.set_pointers(&plan, key, ptrs)?;
        for (i, l) in shape.layouts.iter().enumerate() {
            plan.layouts[i] = layout(l, shape.batch)?;
        }

        let pref =
            lt::create_matmul_pref().map_err(|e| blas_err("cublasLtMatmulPreferenceCreate", e))?;
        let ws = shape.workspace as u64;
        let set_pref = |attr, v: *const c_void, size| {
            // SAFETY: `v` points to a value of the attribute's type.
            unsafe { lt::set_matmul_pref_attribute(pref, attr, v, size) }
        };
        let mut set = set_pref(
            P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &ws as *const u64 as *const c_void,
            8,
        );
        let [align_a, align_b, align_c, align_d] = shape.align;
        for (attr, v) in [
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d),
        ] {
            set = set.and_then(|_| set_pref(attr, &v as *const u32 as *const c_void, 4));
        }
        let [a, b, d] = plan.layouts.map(|h| h as sys::cublasLtMatrixLayout_t);
        // SAFETY: every handle is live; C and D share a layout (beta = 0).
        let heur = set.and_then(|_| unsafe {
            lt::get_matmul_algo_heuristic(
                self.handle,
                plan.desc as sys::cublasLtMatmulDesc_t,
                a,
                b,
                d,
                d,
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
        plan.algo = heur.algo.data;
        Ok(plan)
    }

    unsafe fn matmul(&self, plan: &Plan, args: &MatmulArgs) -> Result<()> {
        let (alpha, beta) = args.alpha_beta();
        let [a, b, d] = plan.layouts.map(|h| h as sys::cublasLtMatrixLayout_t);
        let algo = sys::cublasLtMatmulAlgo_t { data: plan.algo };
        // SAFETY: as the caller promised.
        unsafe {
            lt::matmul(
                self.handle,
                plan.desc as sys::cublasLtMatmulDesc_t,
                alpha,
                beta,
                args.a,
                a,
                args.b,
                b,
                args.d,
                d,
                args.d as *mut c_void,
                d,
                &algo,
                args.workspace as *mut c_void,
                args.workspace_bytes,
                args.stream as sys::cudaStream_t,
            )
        }
        .map_err(|e| CudaError::Blas(format!("cublasLtMatmul: {}", status_name(e))))
    }

    unsafe fn destroy(&self, plan: &Plan) {
        // SAFETY: each handle was created once by this plan and is destroyed once.
        unsafe {
            for l in plan.layouts.iter().rev() {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(*l as sys::cublasLtMatrixLayout_t);
                }
            }
            let _ = lt::destroy_matmul_desc(plan.desc as sys::cublasLtMatmulDesc_t);
        }
    }
}

/// One matrix layout, with the batch attributes when `batch > 1`.
fn layout(l: &LtLayout, batch: usize) -> Result<Handle> {
    use sys::cublasLtMatrixLayoutAttribute_t as L;
    let t = cuda_type(l.dtype).expect("validated operand type");
    let h = lt::create_matrix_layout(t, l.rows, l.cols, l.ld)
        .map_err(|e| blas_err("cublasLtMatrixLayoutCreate", e))?;
    if batch > 1 {
        let r = l.set_batch(batch, |attr, v, size| {
            let attr = match attr {
                BatchAttr::Count => L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                BatchAttr::Stride => L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
            };
            // SAFETY: `v` points to a value of the attribute's type.
            unsafe { lt::set_matrix_layout_attribute(h, attr, v, size) }
        });
        if let Err(e) = r {
            // SAFETY: created above, not stored anywhere.
            let _ = unsafe { lt::destroy_matrix_layout(h) };
            return Err(blas_err("cublasLtMatrixLayoutSetAttribute(batch)", e));
        }
    }
    Ok(h as Handle)
}
