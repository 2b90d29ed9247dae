//! The hipBLASLt entry points the GEMMs call (`blas.rs`), resolved from the
//! loaded `libhipblaslt` with their C signatures (hipBLASLt 7.1). Each mirrors the
//! cuBLASLt call of `cuda/cublaslt.rs`: a handle, a matmul descriptor with the
//! scale pointers and modes of [`super::consts`], a layout per matrix, a
//! preference with the workspace size, the heuristic, then the matmul.
//! `hipblasLtCreate` exits the whole process when there is no GPU, so only
//! a context that found a device may call it (the probe never does).

use std::ffi::{c_int, c_void};

/// `hipblasLtHandle_t`, `hipblasLtMatmulDesc_t`, `hipblasLtMatrixLayout_t`,
/// `hipblasLtMatmulPreference_t`, `hipStream_t`.
pub type Handle = *mut c_void;

super::entry_points! {
    HipBlasLt,
    create = "hipblasLtCreate": fn(*mut Handle);
    destroy = "hipblasLtDestroy": fn(Handle);
    // (desc out, hipblasComputeType_t, scale hipDataType)
    matmul_desc_create = "hipblasLtMatmulDescCreate": fn(*mut Handle, c_int, c_int);
    matmul_desc_destroy = "hipblasLtMatmulDescDestroy": fn(Handle);
    matmul_desc_set_attribute = "hipblasLtMatmulDescSetAttribute": fn(Handle, c_int, *const c_void, usize);
    // (layout out, hipDataType, rows, cols, leading dimension)
    matrix_layout_create = "hipblasLtMatrixLayoutCreate": fn(*mut Handle, c_int, u64, u64, i64);
    matrix_layout_destroy = "hipblasLtMatrixLayoutDestroy": fn(Handle);
    matrix_layout_set_attribute = "hipblasLtMatrixLayoutSetAttribute": fn(Handle, c_int, *const c_void, usize);
    preference_create = "hipblasLtMatmulPreferenceCreate": fn(*mut Handle);
    preference_destroy = "hipblasLtMatmulPreferenceDestroy": fn(Handle);
    preference_set_attribute = "hipblasLtMatmulPreferenceSetAttribute": fn(Handle, c_int, *const c_void, usize);
    // (handle, desc, A, B, C, D layouts, preference, requested, results out, returned out)
    algo_get_heuristic = "hipblasLtMatmulAlgoGetHeuristic": fn(
        Handle, Handle, Handle, Handle, Handle, Handle, Handle, c_int, *mut c_void, *mut c_int
    );
    // (handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc,
    //  algo, workspace, workspace bytes, stream)
    matmul = "hipblasLtMatmul": fn(
        Handle, Handle, *const c_void, *const c_void, Handle, *const c_void, Handle,
        *const c_void, *const c_void, Handle, *mut c_void, Handle, *const c_void,
        *mut c_void, usize, Handle
    );
}
