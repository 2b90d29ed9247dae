//! What a BLAS library is told about a GEMM, and what it must do with
//! it: the [`BlasLib`] trait that cuBLASLt (`cublaslt.rs`) and hipBLASLt
//! (`rocm/blas.rs`) implement under the shared plan cache of `gemm.rs`,
//! and the plain data passed across it, in the library's column-major
//! terms (its A is our b, its B our a, its D our y transposed).

use std::ffi::c_void;

use super::driver::Handle;
use super::gemm::{GemmDType, PlanKey};
use super::Result;

/// One matrix as the BLAS library sees it: column-major `rows x cols`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LtLayout {
    pub(crate) dtype: GemmDType,
    pub(crate) rows: u64,
    pub(crate) cols: u64,
    pub(crate) ld: i64,
    pub(crate) batch_stride: i64,
}

/// A batch attribute of a matrix layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BatchAttr {
    /// The batch count, an `int32`.
    Count,
    /// The strided batch offset in elements, an `int64`.
    Stride,
}

impl LtLayout {
    /// Sets the batch count and stride of a layout through `set`
    /// (attribute, pointer to its value, size): once per library.
    pub(crate) fn set_batch<E>(
        &self,
        batch: usize,
        set: impl Fn(BatchAttr, *const c_void, usize) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let count = batch as i32;
        set(BatchAttr::Count, &count as *const i32 as *const c_void, 4)?;
        set(
            BatchAttr::Stride,
            &self.batch_stride as *const i64 as *const c_void,
            8,
        )
    }
}

/// A plan in the library's column-major terms, where its A is our b, its
/// B our a and its D our y (transposed): what both libraries are told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LtShape {
    /// Whether the library's A (our b) and B (our a) are read transposed.
    pub(crate) trans_a: bool,
    pub(crate) trans_b: bool,
    /// The library's A, B and D (C shares D's: beta = 0).
    pub(crate) layouts: [LtLayout; 3],
    pub(crate) batch: usize,
    pub(crate) bias: Option<GemmDType>,
    /// Least byte alignment of the library's A, B, C and D.
    pub(crate) align: [u32; 4],
    pub(crate) workspace: usize,
}

/// Descriptors and the chosen algorithm of one `PlanKey`, as the
/// library's opaque handles (its A, B and D layouts) and algorithm bytes.
pub(crate) struct Plan {
    pub(crate) desc: Handle,
    pub(crate) layouts: [Handle; 3],
    /// `cublasLtMatmulAlgo_t` (64 bytes) or `hipblasLtMatmulAlgo_t` (24).
    pub(crate) algo: [u64; 8],
}

impl Plan {
    /// A plan with a descriptor and nothing else yet.
    pub(crate) fn new(desc: Handle) -> Plan {
        Plan {
            desc,
            layouts: [std::ptr::null_mut(); 3],
            algo: [0; 8],
        }
    }
}

/// Device pointers set on the descriptor at every call (cuBLAS's A is our b).
#[derive(Clone, Copy)]
pub(crate) struct Pointers {
    pub(crate) a_scale: u64,
    pub(crate) b_scale: u64,
    pub(crate) bias: u64,
}

/// The pointers of one matmul call: the library's A (our b), B (our a),
/// D (y), the workspace and the stream.
pub(crate) struct MatmulArgs {
    pub(crate) a: *const c_void,
    pub(crate) b: *const c_void,
    pub(crate) d: *const c_void,
    pub(crate) workspace: u64,
    pub(crate) workspace_bytes: usize,
    pub(crate) stream: Handle,
    /// Device f32 `[alpha, 0]` where the plan reads alpha and beta on the
    /// device; `None`: alpha = 1 and beta = 0 from the host.
    pub(crate) alpha: Option<u64>,
}

/// Alpha = 1 and beta = 0 on the host.
static HOST_ALPHA_BETA: [f32; 2] = [1.0, 0.0];

impl MatmulArgs {
    /// The alpha and beta pointers of the call: the device pair of
    /// [`MatmulArgs::alpha`], else 1 and 0 on the host.
    pub(crate) fn alpha_beta(&self) -> (*const c_void, *const c_void) {
        let (a, b) = match self.alpha {
            Some(p) => (p as *const c_void, (p + 4) as *const c_void),
            None => (
                &HOST_ALPHA_BETA[0] as *const f32 as *const c_void,
                &HOST_ALPHA_BETA[1] as *const f32 as *const c_void,
            ),
        };
        (a, b)
    }
}

/// The BLAS library of a platform: cuBLASLt or hipBLASLt.
pub(crate) trait BlasLib: Send {
    /// For messages.
    fn name(&self) -> &'static str;
    /// Whether the library has operands of type `t` on this device.
    fn takes(&self, t: GemmDType) -> bool;
    /// Descriptors and the heuristic's algorithm.
    fn plan(&self, key: &PlanKey, shape: &LtShape, ptrs: &Pointers) -> Result<Plan>;
    /// Sets the scale and bias pointers of a call on the plan's descriptor.
    fn set_pointers(&self, plan: &Plan, key: &PlanKey, ptrs: &Pointers) -> Result<()>;
    /// Queues the matmul on the stream.
    ///
    /// # Safety
    /// The pointers must be live device ranges the plan's layouts describe.
    unsafe fn matmul(&self, plan: &Plan, args: &MatmulArgs) -> Result<()>;
    /// Destroys the plan's handles.
    ///
    /// # Safety
    /// Once per plan, after its last matmul.
    unsafe fn destroy(&self, plan: &Plan);
}
