//! hipBLASLt as the [`BlasLib`] of a HIP context: the entry points of
//! [`super::hipblaslt`] with the values of [`super::consts`]. The plan
//! cache, validation and column-major view are `cuda/gemm.rs`'s. What each
//! architecture takes follows [`super::gemm_path`]: BF16 and f32 anywhere,
//! FNUZ FP8 on gfx942, OCP FP8 and MX codes with `VEC32_UE8M0` block scales
//! on gfx950. hipBLASLt has no alignment preferences, so the alignment in
//! the plan key only keeps plans apart. Nothing here has run on AMD hardware.

use std::ffi::{c_int, c_void};

use super::consts::{self, data_type, heuristic, layout_attr, matmul_desc, scale_mode};
use super::gemm_path::{gemm_path, Arch, GemmPath};
use super::hipblaslt::HipBlasLt;
use crate::backend::Format;
use crate::cuda::blas_lib::{BatchAttr, BlasLib, LtLayout, LtShape, MatmulArgs, Plan, Pointers};
use crate::cuda::driver::Handle;
use crate::cuda::gemm::{GemmDType, PlanKey};
use crate::cuda::{CudaError, Result};
use crate::formats::ElemFormat;

/// A hipBLASLt handle of one device, and what its architecture takes.
pub(crate) struct HipBlasLtLib {
    lt: HipBlasLt<'static>,
    handle: Handle,
    arch: Arch,
}

// SAFETY: the handle is only used under the context's `blas` mutex.
unsafe impl Send for HipBlasLtLib {}

fn check(op: &str, rc: c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(CudaError::Blas(format!("{op}: hipblasStatus_t {rc}")))
    }
}

impl HipBlasLtLib {
    /// A handle for the current device, whose `hipblasLtCreate` only a
    /// context that found the device reaches (it exits the process when
    /// there is no GPU). `arch` is the offload architecture (`gfx942`).
    pub(crate) fn new(arch: &str) -> Result<HipBlasLtLib> {
        let libs = super::libraries().map_err(CudaError::RocmUnavailable)?;
        let lt = HipBlasLt::new(&libs.hipblaslt, &libs.paths[2])
            .map_err(|e| CudaError::RocmUnavailable(format!("ROCm backend unavailable: {e}")))?;
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: an out-parameter; destroyed in drop.
        check("hipblasLtCreate", unsafe { (lt.create)(&mut handle) })?;
        Ok(HipBlasLtLib {
            lt,
            handle,
            arch: Arch::from_gcn_name(arch),
        })
    }

    fn set_desc<T>(&self, desc: Handle, attr: u32, v: &T) -> Result<()> {
        // SAFETY: `v` is a plain value of the type the attribute expects.
        check(
            &format!("hipblasLtMatmulDescSetAttribute({attr})"),
            unsafe {
                (self.lt.matmul_desc_set_attribute)(
                    desc,
                    attr as c_int,
                    v as *const T as *const c_void,
                    std::mem::size_of::<T>(),
                )
            },
        )
    }

    fn layout(&self, l: &LtLayout, batch: usize) -> Result<Handle> {
        let t = hip_type(self.arch, l.dtype).expect("checked by takes");
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: an out-parameter; destroyed with the plan.
        check("hipblasLtMatrixLayoutCreate", unsafe {
            (self.lt.matrix_layout_create)(&mut h, t, l.rows, l.cols, l.ld)
        })?;
        if batch > 1 {
            let r = l.set_batch(batch, |attr, v, size| {
                let attr = match attr {
                    BatchAttr::Count => layout_attr::BATCH_COUNT,
                    BatchAttr::Stride => layout_attr::STRIDED_BATCH_OFFSET,
                };
                // SAFETY: `v` points to a value of the attribute's type.
                check("hipblasLtMatrixLayoutSetAttribute(batch)", unsafe {
                    (self.lt.matrix_layout_set_attribute)(h, attr, v, size)
                })
            });
            if let Err(e) = r {
                // SAFETY: created above, not stored anywhere.
                unsafe { (self.lt.matrix_layout_destroy)(h) };
                return Err(e);
            }
        }
        Ok(h)
    }

    /// The heuristic's best algorithm for a plan's descriptors.
    fn algorithm(&self, plan: &Plan, workspace: usize) -> Result<[u64; 8]> {
        let mut pref: Handle = std::ptr::null_mut();
        // SAFETY: an out-parameter; destroyed below.
        check("hipblasLtMatmulPreferenceCreate", unsafe {
            (self.lt.preference_create)(&mut pref)
        })?;
        let ws = workspace as u64;
        // hipblasLtMatmulHeuristicResult_t, as u64s for its alignment.
        let mut result = [0u64; heuristic::SIZE / 8];
        let mut returned: c_int = 0;
        let [a, b, d] = plan.layouts;
        // SAFETY: live handles, a value of the attribute's type, and a
        // result buffer of sizeof(hipblasLtMatmulHeuristicResult_t).
        let rc = unsafe {
            let rc = (self.lt.preference_set_attribute)(
                pref,
                consts::PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                8,
            );
            let rc = if rc == 0 {
                (self.lt.algo_get_heuristic)(
                    self.handle,
                    plan.desc,
                    a,
                    b,
                    d,
                    d,
                    pref,
                    1,
                    result.as_mut_ptr() as *mut c_void,
                    &mut returned,
                )
            } else {
                rc
            };
            (self.lt.preference_destroy)(pref);
            rc
        };
        check(
            "hipblasLtMatmulAlgoGetHeuristic (no algorithm for this combination)",
            rc,
        )?;
        heuristic_algo(&result, returned)
    }
}

/// The algorithm bytes of a heuristic result, or why there is none.
fn heuristic_algo(result: &[u64; heuristic::SIZE / 8], returned: c_int) -> Result<[u64; 8]> {
    let state = (result[heuristic::STATE / 8] & 0xFFFF_FFFF) as c_int;
    if returned < 1 || state != 0 {
        return Err(CudaError::Blas(format!(
            "hipblasLtMatmulAlgoGetHeuristic: no algorithm for this combination ({returned} returned, state {state})"
        )));
    }
    let mut algo = [0u64; 8];
    algo[..heuristic::ALGO_SIZE / 8].copy_from_slice(&result[..heuristic::ALGO_SIZE / 8]);
    Ok(algo)
}

/// The GEMM dtype of an operand of `elem` codes: tensorwise FP8, or MX
/// codes with block scales when `mx`.
pub(crate) fn gemm_dtype(elem: ElemFormat, mx: bool) -> Option<GemmDType> {
    use ElemFormat as E;
    match (elem, mx) {
        (E::E4M3FN, false) => Some(GemmDType::Fp8E4M3),
        (E::E5M2, false) => Some(GemmDType::Fp8E5M2),
        (E::E4M3FNUZ, false) => Some(GemmDType::Fp8E4M3Fnuz),
        (E::E5M2FNUZ, false) => Some(GemmDType::Fp8E5M2Fnuz),
        (E::E2M1, true) => Some(GemmDType::MxE2M1),
        (E::E4M3FN, true) => Some(GemmDType::MxE4M3),
        (E::E5M2, true) => Some(GemmDType::MxE5M2),
        _ => None,
    }
}

/// The operand types of the native GEMM that [`gemm_path`] picks for
/// `a` x `b` on the device named `gcn_arch_name`; `None` where it decodes
/// to BF16 (or for BF16 operands, which need no choice).
pub(crate) fn native_types(
    gcn_arch_name: &str,
    a: &Format,
    b: &Format,
) -> Option<(GemmDType, GemmDType)> {
    let (ea, eb, mx) = match (a, b) {
        (Format::Tensorwise { elem: ea, .. }, Format::Tensorwise { elem: eb, .. }) => {
            (*ea, *eb, false)
        }
        (Format::Mx(ca), Format::Mx(cb)) => (ca.elem, cb.elem, true),
        (Format::Fp8Group(_), Format::Fp8Group(_)) => {
            return match gemm_path(Arch::from_gcn_name(gcn_arch_name), a, b) {
                GemmPath::Fp8Rowwise(..) => {
                    Some((GemmDType::Fp8E4M3Rowwise, GemmDType::Fp8E4M3Rowwise))
                }
                _ => None,
            };
        }
        _ => return None,
    };
    match gemm_path(Arch::from_gcn_name(gcn_arch_name), a, b) {
        GemmPath::Fp8Tensorwise(..) | GemmPath::MxBlockScaled(..) => {
            Some((gemm_dtype(ea, mx)?, gemm_dtype(eb, mx)?))
        }
        GemmPath::Bf16 | GemmPath::DequantBf16 | GemmPath::Fp8Rowwise(..) => None,
    }
}

/// The `hipDataType` of `t` on `arch`, if its GEMMs take it.
pub(crate) fn hip_type(arch: Arch, t: GemmDType) -> Option<i32> {
    use GemmDType as G;
    match (arch, t) {
        (_, G::F32) => Some(data_type::R_32F),
        (_, G::Bf16) => Some(data_type::R_16BF),
        (Arch::Gfx942, G::Fp8E4M3Fnuz) => Some(data_type::R_8F_E4M3_FNUZ),
        (Arch::Gfx942, G::Fp8E5M2Fnuz) => Some(data_type::R_8F_E5M2_FNUZ),
        (Arch::Gfx950, G::Fp8E4M3 | G::MxE4M3 | G::Fp8E4M3Rowwise) => Some(data_type::R_8F_E4M3),
        (Arch::Gfx950, G::Fp8E5M2 | G::MxE5M2) => Some(data_type::R_8F_E5M2),
        (Arch::Gfx950, G::MxE2M1) => Some(data_type::R_4F_E2M1_EXT),
        _ => None,
    }
}

impl Drop for HipBlasLtLib {
    fn drop(&mut self) {
        // SAFETY: created once in `new`.
        unsafe { (self.lt.destroy)(self.handle) };
    }
}

impl BlasLib for HipBlasLtLib {
    fn name(&self) -> &'static str {
        "hipBLASLt"
    }

    fn takes(&self, t: GemmDType) -> bool {
        hip_type(self.arch, t).is_some()
    }

    fn set_pointers(&self, plan: &Plan, key: &PlanKey, ptrs: &Pointers) -> Result<()> {
        if key.dtypes[0].is_scaled() {
            self.set_desc(plan.desc, matmul_desc::A_SCALE_POINTER, &ptrs.b_scale)?;
            self.set_desc(plan.desc, matmul_desc::B_SCALE_POINTER, &ptrs.a_scale)?;
        }
        if key.bias.is_some() {
            self.set_desc(plan.desc, matmul_desc::BIAS_POINTER, &ptrs.bias)?;
        }
        Ok(())
    }

    fn plan(&self, key: &PlanKey, shape: &LtShape, ptrs: &Pointers) -> Result<Plan> {
        let mut desc: Handle = std::ptr::null_mut();
        // SAFETY: an out-parameter; destroyed with the plan.
        check("hipblasLtMatmulDescCreate", unsafe {
            (self.lt.matmul_desc_create)(&mut desc, consts::HIPBLAS_COMPUTE_32F, data_type::R_32F)
        })?;
        let mut plan = Plan::new(desc);
        let r = (|| {
            let op = |t| {
                if t {
                    consts::HIPBLAS_OP_T
                } else {
                    consts::HIPBLAS_OP_N
                }
            };
            self.set_desc(desc, matmul_desc::TRANSA, &op(shape.trans_a))?;
            self.set_desc(desc, matmul_desc::TRANSB, &op(shape.trans_b))?;
            if key.device_alpha {
                self.set_desc(
                    desc,
                    matmul_desc::POINTER_MODE,
                    &consts::HIPBLASLT_POINTER_MODE_DEVICE,
                )?;
            }
            if let Some(bias) = shape.bias {
                let t = hip_type(self.arch, bias).expect("validated bias type");
                self.set_desc(
                    desc,
                    matmul_desc::EPILOGUE,
                    &consts::HIPBLASLT_EPILOGUE_BIAS,
                )?;
                self.set_desc(desc, matmul_desc::BIAS_DATA_TYPE, &t)?;
            }
            let mode = match key.dtypes[0] {
                t if t.is_mx() => Some(scale_mode::VEC32_UE8M0),
                GemmDType::Fp8E4M3Rowwise => Some(scale_mode::OUTER_VEC_32F),
                _ => None,
            };
            if let Some(mode) = mode {
                self.set_desc(desc, matmul_desc::A_SCALE_MODE, &mode)?;
                self.set_desc(desc, matmul_desc::B_SCALE_MODE, &mode)?;
            }
            self.set_pointers(&plan, key, ptrs)?;
            for (i, l) in shape.layouts.iter().enumerate() {
                plan.layouts[i] = self.layout(l, shape.batch)?;
            }
            plan.algo = self.algorithm(&plan, shape.workspace)?;
            Ok(())
        })();
        match r {
            Ok(()) => Ok(plan),
            Err(e) => {
                // SAFETY: the handles created so far, destroyed once.
                unsafe { self.destroy(&plan) };
                Err(e)
            }
        }
    }

    unsafe fn matmul(&self, plan: &Plan, args: &MatmulArgs) -> Result<()> {
        let (alpha, beta) = args.alpha_beta();
        let [a, b, d] = plan.layouts;
        // SAFETY: as the caller promised; C and D share a layout (beta = 0).
        check("hipblasLtMatmul", unsafe {
            (self.lt.matmul)(
                self.handle,
                plan.desc,
                alpha,
                args.a,
                a,
                args.b,
                b,
                beta,
                args.d,
                d,
                args.d as *mut c_void,
                d,
                plan.algo.as_ptr() as *const c_void,
                args.workspace as *mut c_void,
                args.workspace_bytes,
                args.stream,
            )
        })
    }

    unsafe fn destroy(&self, plan: &Plan) {
        // SAFETY: each handle was created once by this plan and is destroyed once.
        unsafe {
            for l in plan.layouts.iter().rev() {
                if !l.is_null() {
                    (self.lt.matrix_layout_destroy)(*l);
                }
            }
            (self.lt.matmul_desc_destroy)(plan.desc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::MxConfig;

    /// Wherever gemm_path picks a native GEMM, `native_types` gives the
    /// operands' dtypes, this library passes the `hipDataType`s gemm_path
    /// names, and the architecture takes them; elsewhere it gives `None`.
    #[test]
    fn the_types_agree_with_gemm_path() {
        use ElemFormat as E;
        let elems = [E::E4M3FN, E::E5M2, E::E4M3FNUZ, E::E5M2FNUZ, E::E2M1];
        let fp8 = |elem| Format::Tensorwise { elem, pow2: false };
        let mx = |elem| {
            Format::Mx(MxConfig {
                elem,
                ..MxConfig::mxfp4()
            })
        };
        let mut count = 0;
        for (arch, name) in [
            (Arch::Gfx942, "gfx942:sramecc+:xnack-"),
            (Arch::Gfx950, "gfx950"),
            (Arch::Other, "gfx90a"),
        ] {
            for (ea, eb) in elems.iter().flat_map(|&a| elems.map(|b| (a, b))) {
                for (fa, fb, is_mx) in [(fp8(ea), fp8(eb), false), (mx(ea), mx(eb), true)] {
                    let native = native_types(name, &fa, &fb);
                    match gemm_path(arch, &fa, &fb) {
                        GemmPath::Fp8Tensorwise(ta, tb) | GemmPath::MxBlockScaled(ta, tb) => {
                            count += 1;
                            let (da, db) = native.expect("a native pair");
                            assert_eq!(Some(da), gemm_dtype(ea, is_mx));
                            assert_eq!(Some(db), gemm_dtype(eb, is_mx));
                            assert_eq!(hip_type(arch, da), Some(ta), "{arch:?} {ea:?}");
                            assert_eq!(hip_type(arch, db), Some(tb), "{arch:?} {eb:?}");
                        }
                        _ => assert_eq!(native, None, "{arch:?} {ea:?} {eb:?} {is_mx}"),
                    }
                }
            }
        }
        assert!(count >= 12, "only {count} native pairs");
        let row = Format::Fp8Group(crate::quant::Fp8GroupConfig::rowwise());
        let rowwise = GemmDType::Fp8E4M3Rowwise;
        assert_eq!(native_types("gfx950", &row, &row), Some((rowwise, rowwise)));
        assert_eq!(hip_type(Arch::Gfx950, rowwise), Some(data_type::R_8F_E4M3));
        assert_eq!(native_types("gfx942", &row, &row), None);
        let blk = Format::Fp8Group(crate::quant::Fp8GroupConfig::block128());
        assert_eq!(native_types("gfx950", &blk, &blk), None);
        assert_eq!(hip_type(Arch::Gfx942, GemmDType::Fp8E4M3), None);
        assert_eq!(hip_type(Arch::Gfx942, GemmDType::MxE2M1), None);
        assert_eq!(hip_type(Arch::Other, GemmDType::Fp8E4M3Fnuz), None);
        assert_eq!(
            hip_type(Arch::Other, GemmDType::Bf16),
            Some(data_type::R_16BF)
        );
    }

    #[test]
    fn a_heuristic_result_gives_its_algorithm_or_an_error() {
        let mut r = [0u64; heuristic::SIZE / 8];
        r[0] = 0x1122;
        r[2] = 0x3344;
        r[3] = 0xFFFF; // workspaceSize: not part of the algorithm
        let algo = heuristic_algo(&r, 1).unwrap();
        assert_eq!(algo, [0x1122, 0, 0x3344, 0, 0, 0, 0, 0]);
        assert!(heuristic_algo(&r, 0).is_err());
        r[heuristic::STATE / 8] = 7; // HIPBLAS_STATUS_NOT_SUPPORTED
        let e = heuristic_algo(&r, 1).unwrap_err();
        assert!(e.to_string().contains("state 7"), "{e}");
    }
}
