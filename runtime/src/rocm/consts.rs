//! The HIP and hipBLASLt values the ROCm backend passes, by name. They are
//! the numbers of ROCm 7.1's headers (`hip_runtime_api.h`,
//! `library_types.h`, `hipblaslt.h`), copied here because the libraries are
//! loaded at run time and no header is read at build time; the tests pin
//! each one so a typo cannot slip through, and `.ci/rocm-sid-chroot`
//! compares [`HEADER_VALUES`] with what `.ci/rocm-header-values.cpp`
//! prints when compiled against the sid chroot's ROCm 6.4 / hipBLASLt 7.1
//! headers.

/// `hipSuccess`.
pub const HIP_SUCCESS: i32 = 0;
/// `hipErrorNoDevice`: what `hipInit` and `hipGetDeviceCount` return on a
/// machine without an AMD GPU.
pub const HIP_ERROR_NO_DEVICE: i32 = 100;
/// `hipErrorNotReady`: `hipEventQuery` on an event whose work is queued.
pub const HIP_ERROR_NOT_READY: i32 = 600;
/// `hipEventDefault` (a timing event).
pub const HIP_EVENT_DEFAULT: u32 = 0;
/// `hipEventDisableTiming`.
pub const HIP_EVENT_DISABLE_TIMING: u32 = 2;

/// `hipDeviceProp_t` (`hipDeviceProp_tR0600`, what
/// `hipGetDevicePropertiesR0600` fills): its size and the byte offsets of
/// the fields the context reads. The struct is read as bytes because its
/// layout is only in the header.
pub mod device_prop {
    /// `sizeof(hipDeviceProp_t)`.
    pub const SIZE: usize = 1472;
    /// `char name[256]`.
    pub const NAME: usize = 0;
    /// `size_t totalGlobalMem`.
    pub const TOTAL_GLOBAL_MEM: usize = 288;
    /// `size_t sharedMemPerBlock`.
    pub const SHARED_MEM_PER_BLOCK: usize = 296;
    /// `int multiProcessorCount`.
    pub const MULTI_PROCESSOR_COUNT: usize = 388;
    /// `char gcnArchName[256]`.
    pub const GCN_ARCH_NAME: usize = 1160;
}

/// `hipDataType` values of the GEMM operands.
pub mod data_type {
    /// `HIP_R_32F`.
    pub const R_32F: i32 = 0;
    /// `HIP_R_16BF`.
    pub const R_16BF: i32 = 14;
    /// `HIP_R_8F_E4M3` (OCP E4M3FN, gfx950).
    pub const R_8F_E4M3: i32 = 28;
    /// `HIP_R_8F_E5M2` (OCP E5M2, gfx950).
    pub const R_8F_E5M2: i32 = 29;
    /// `HIP_R_4F_E2M1_EXT` (packed FP4 of the MX formats, gfx950).
    pub const R_4F_E2M1_EXT: i32 = 33;
    /// `HIP_R_8F_E4M3_FNUZ` (gfx942's E4M3).
    pub const R_8F_E4M3_FNUZ: i32 = 1000;
    /// `HIP_R_8F_E5M2_FNUZ` (gfx942's E5M2).
    pub const R_8F_E5M2_FNUZ: i32 = 1001;
}

/// `hipblasLtMatmulMatrixScale_t`: how A's and B's scales are laid out.
pub mod scale_mode {
    /// `HIPBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F`: one f32 per tensor.
    pub const SCALAR_32F: u32 = 0;
    /// `HIPBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0`: an E8M0 scale per 32
    /// elements along K (the MX formats).
    pub const VEC32_UE8M0: u32 = 2;
    /// `HIPBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F`: an f32 per row.
    pub const OUTER_VEC_32F: u32 = 3;
}

/// `hipblasComputeType_t` `HIPBLAS_COMPUTE_32F`.
pub const HIPBLAS_COMPUTE_32F: i32 = 2;
/// `hipblasOperation_t` `HIPBLAS_OP_N` and `HIPBLAS_OP_T` (not 0 and 1).
pub const HIPBLAS_OP_N: i32 = 111;
/// See [`HIPBLAS_OP_N`].
pub const HIPBLAS_OP_T: i32 = 112;
/// `hipblasLtEpilogue_t` `HIPBLASLT_EPILOGUE_BIAS`.
pub const HIPBLASLT_EPILOGUE_BIAS: i32 = 4;
/// `hipblasLtPointerMode_t` `HIPBLASLT_POINTER_MODE_DEVICE`: alpha and beta
/// are device pointers.
pub const HIPBLASLT_POINTER_MODE_DEVICE: i32 = 1;

/// `hipblasLtMatmulHeuristicResult_t`: its size, with the algorithm
/// (`hipblasLtMatmulAlgo_t`, 24 bytes) first and the status at `STATE`.
pub mod heuristic {
    /// `sizeof(hipblasLtMatmulHeuristicResult_t)`.
    pub const SIZE: usize = 56;
    /// `sizeof(hipblasLtMatmulAlgo_t)`, at offset 0.
    pub const ALGO_SIZE: usize = 24;
    /// Offset of `hipblasStatus_t state`.
    pub const STATE: usize = 32;
}

/// `hipblasLtMatrixLayoutAttribute_t` keys.
pub mod layout_attr {
    /// `HIPBLASLT_MATRIX_LAYOUT_BATCH_COUNT` (int32).
    pub const BATCH_COUNT: i32 = 0;
    /// `HIPBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET` (int64).
    pub const STRIDED_BATCH_OFFSET: i32 = 1;
}

/// `hipblasLtMatmulPreferenceAttributes_t`
/// `HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES` (uint64).
pub const PREF_MAX_WORKSPACE_BYTES: i32 = 1;

/// `hipblasLtMatmulDescAttributes_t` keys the backend sets.
pub mod matmul_desc {
    /// `HIPBLASLT_MATMUL_DESC_TRANSA`.
    pub const TRANSA: u32 = 0;
    /// `HIPBLASLT_MATMUL_DESC_TRANSB`.
    pub const TRANSB: u32 = 1;
    /// `HIPBLASLT_MATMUL_DESC_EPILOGUE`.
    pub const EPILOGUE: u32 = 2;
    /// `HIPBLASLT_MATMUL_DESC_BIAS_POINTER`.
    pub const BIAS_POINTER: u32 = 3;
    /// `HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE`.
    pub const BIAS_DATA_TYPE: u32 = 4;
    /// `HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER`.
    pub const A_SCALE_POINTER: u32 = 5;
    /// `HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER`.
    pub const B_SCALE_POINTER: u32 = 6;
    /// `HIPBLASLT_MATMUL_DESC_A_SCALE_MODE`.
    pub const A_SCALE_MODE: u32 = 31;
    /// `HIPBLASLT_MATMUL_DESC_B_SCALE_MODE`.
    pub const B_SCALE_MODE: u32 = 32;
    /// `HIPBLASLT_MATMUL_DESC_POINTER_MODE` (`hipblasLtPointerMode_t`).
    pub const POINTER_MODE: u32 = 13;
}

/// Every value above by its name in the headers, as
/// `.ci/rocm-header-values.cpp` prints them (`NAME VALUE` lines).
pub const HEADER_VALUES: &[(&str, i64)] = &[
    ("hipSuccess", HIP_SUCCESS as i64),
    ("hipErrorNoDevice", HIP_ERROR_NO_DEVICE as i64),
    ("hipErrorNotReady", HIP_ERROR_NOT_READY as i64),
    ("hipEventDefault", HIP_EVENT_DEFAULT as i64),
    ("hipEventDisableTiming", HIP_EVENT_DISABLE_TIMING as i64),
    ("sizeof(hipDeviceProp_t)", device_prop::SIZE as i64),
    ("hipDeviceProp_t.name", device_prop::NAME as i64),
    (
        "hipDeviceProp_t.totalGlobalMem",
        device_prop::TOTAL_GLOBAL_MEM as i64,
    ),
    (
        "hipDeviceProp_t.sharedMemPerBlock",
        device_prop::SHARED_MEM_PER_BLOCK as i64,
    ),
    (
        "hipDeviceProp_t.multiProcessorCount",
        device_prop::MULTI_PROCESSOR_COUNT as i64,
    ),
    (
        "hipDeviceProp_t.gcnArchName",
        device_prop::GCN_ARCH_NAME as i64,
    ),
    ("HIP_R_32F", data_type::R_32F as i64),
    ("HIP_R_16BF", data_type::R_16BF as i64),
    ("HIP_R_8F_E4M3", data_type::R_8F_E4M3 as i64),
    ("HIP_R_8F_E5M2", data_type::R_8F_E5M2 as i64),
    ("HIP_R_4F_E2M1_EXT", data_type::R_4F_E2M1_EXT as i64),
    ("HIP_R_8F_E4M3_FNUZ", data_type::R_8F_E4M3_FNUZ as i64),
    ("HIP_R_8F_E5M2_FNUZ", data_type::R_8F_E5M2_FNUZ as i64),
    (
        "HIPBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F",
        scale_mode::SCALAR_32F as i64,
    ),
    (
        "HIPBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0",
        scale_mode::VEC32_UE8M0 as i64,
    ),
    (
        "HIPBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F",
        scale_mode::OUTER_VEC_32F as i64,
    ),
    ("HIPBLAS_COMPUTE_32F", HIPBLAS_COMPUTE_32F as i64),
    ("HIPBLAS_OP_N", HIPBLAS_OP_N as i64),
    ("HIPBLAS_OP_T", HIPBLAS_OP_T as i64),
    ("HIPBLASLT_EPILOGUE_BIAS", HIPBLASLT_EPILOGUE_BIAS as i64),
    (
        "HIPBLASLT_POINTER_MODE_DEVICE",
        HIPBLASLT_POINTER_MODE_DEVICE as i64,
    ),
    (
        "sizeof(hipblasLtMatmulHeuristicResult_t)",
        heuristic::SIZE as i64,
    ),
    ("sizeof(hipblasLtMatmulAlgo_t)", heuristic::ALGO_SIZE as i64),
    (
        "hipblasLtMatmulHeuristicResult_t.state",
        heuristic::STATE as i64,
    ),
    (
        "HIPBLASLT_MATRIX_LAYOUT_BATCH_COUNT",
        layout_attr::BATCH_COUNT as i64,
    ),
    (
        "HIPBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET",
        layout_attr::STRIDED_BATCH_OFFSET as i64,
    ),
    (
        "HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES",
        PREF_MAX_WORKSPACE_BYTES as i64,
    ),
    ("HIPBLASLT_MATMUL_DESC_TRANSA", matmul_desc::TRANSA as i64),
    ("HIPBLASLT_MATMUL_DESC_TRANSB", matmul_desc::TRANSB as i64),
    (
        "HIPBLASLT_MATMUL_DESC_EPILOGUE",
        matmul_desc::EPILOGUE as i64,
    ),
    (
        "HIPBLASLT_MATMUL_DESC_BIAS_POINTER",
        matmul_desc::BIAS_POINTER as i64,
    ),
    (
        "HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE",
        matmul_desc::BIAS_DATA_TYPE as i64,
    ),
    (
        "HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER",
        matmul_desc::A_SCALE_POINTER as i64,
    ),
    (
        "HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER",
        matmul_desc::B_SCALE_POINTER as i64,
    ),
    (
        "HIPBLASLT_MATMUL_DESC_A_SCALE_MODE",
        matmul_desc::A_SCALE_MODE as i64,
    ),
    (
        "HIPBLASLT_MATMUL_DESC_B_SCALE_MODE",
        matmul_desc::B_SCALE_MODE as i64,
    ),
    (
        "HIPBLASLT_MATMUL_DESC_POINTER_MODE",
        matmul_desc::POINTER_MODE as i64,
    ),
];

/// The environment variable naming a file of `NAME VALUE` lines printed by
/// `.ci/rocm-header-values.cpp`; when set, a test compares them with
/// [`HEADER_VALUES`].
pub const HEADER_VALUES_ENV: &str = "MXSWITCH_ROCM_HEADER_VALUES";

/// The entries of [`HEADER_VALUES`] that `printed` (`NAME VALUE` lines)
/// contradicts or lacks, one line each.
pub fn header_mismatches(printed: &str) -> Vec<String> {
    let got: std::collections::HashMap<&str, &str> =
        printed.lines().filter_map(|l| l.rsplit_once(' ')).collect();
    HEADER_VALUES
        .iter()
        .filter_map(|(name, want)| match got.get(name) {
            Some(v) if v.trim().parse::<i64>() == Ok(*want) => None,
            Some(v) => Some(format!("{name}: the header says {v}, the code {want}")),
            None => Some(format!("{name}: not printed")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value against the headers of ROCm 6.4 / hipBLASLt 7.1.1 (sid),
    /// as `.ci/rocm-header-values.cpp` printed them.
    #[test]
    fn constants_are_the_headers_values() {
        assert_eq!(
            (HIP_SUCCESS, HIP_ERROR_NO_DEVICE, HIP_ERROR_NOT_READY),
            (0, 100, 600)
        );
        assert_eq!((HIP_EVENT_DEFAULT, HIP_EVENT_DISABLE_TIMING), (0, 2));
        use device_prop::*;
        assert_eq!(
            [
                SIZE,
                NAME,
                TOTAL_GLOBAL_MEM,
                SHARED_MEM_PER_BLOCK,
                MULTI_PROCESSOR_COUNT,
                GCN_ARCH_NAME
            ],
            [1472, 0, 288, 296, 388, 1160]
        );
        use data_type::*;
        assert_eq!(
            [R_32F, R_16BF, R_8F_E4M3, R_8F_E5M2, R_4F_E2M1_EXT],
            [0, 14, 28, 29, 33]
        );
        assert_eq!([R_8F_E4M3_FNUZ, R_8F_E5M2_FNUZ], [1000, 1001]);
        use scale_mode::*;
        assert_eq!([SCALAR_32F, VEC32_UE8M0, OUTER_VEC_32F], [0, 2, 3]);
        assert_eq!(
            [
                HIPBLAS_COMPUTE_32F,
                HIPBLAS_OP_N,
                HIPBLAS_OP_T,
                HIPBLASLT_EPILOGUE_BIAS
            ],
            [2, 111, 112, 4]
        );
        assert_eq!(
            [heuristic::SIZE, heuristic::ALGO_SIZE, heuristic::STATE],
            [56, 24, 32]
        );
        assert_eq!(
            [layout_attr::BATCH_COUNT, layout_attr::STRIDED_BATCH_OFFSET],
            [0, 1]
        );
        assert_eq!(PREF_MAX_WORKSPACE_BYTES, 1);
        use matmul_desc::*;
        assert_eq!(
            [TRANSA, TRANSB, EPILOGUE, BIAS_POINTER, BIAS_DATA_TYPE],
            [0, 1, 2, 3, 4]
        );
        assert_eq!(
            [A_SCALE_POINTER, B_SCALE_POINTER, A_SCALE_MODE, B_SCALE_MODE],
            [5, 6, 31, 32]
        );
    }

    #[test]
    fn a_printed_header_value_that_differs_is_named() {
        let all: String = HEADER_VALUES
            .iter()
            .map(|(n, v)| format!("{n} {v}\n"))
            .collect();
        assert!(header_mismatches(&all).is_empty());
        let wrong = all.replace("HIPBLAS_OP_T 112", "HIPBLAS_OP_T 1");
        assert_eq!(
            header_mismatches(&wrong),
            ["HIPBLAS_OP_T: the header says 1, the code 112"]
        );
        let short = all.replace("hipErrorNotReady 600\n", "");
        assert_eq!(header_mismatches(&short), ["hipErrorNotReady: not printed"]);
    }

    /// With `MXSWITCH_ROCM_HEADER_VALUES` set (`.ci/rocm-sid-chroot`), the
    /// values the real headers print.
    #[test]
    fn constants_match_the_printed_header_values_when_given() {
        let Ok(path) = std::env::var(HEADER_VALUES_ENV) else {
            eprintln!("SKIPPED: {HEADER_VALUES_ENV} is not set");
            return;
        };
        let printed = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let bad = header_mismatches(&printed);
        assert!(bad.is_empty(), "{}", bad.join("; "));
        eprintln!("{} header values match {path}", HEADER_VALUES.len());
    }
}
