//! The HIP and hipBLASLt values the ROCm backend passes, by name. They are
//! the numbers of ROCm 7.1's headers (`hip_runtime_api.h`,
//! `library_types.h`, `hipblaslt.h`), copied here because the libraries are
//! loaded at run time and no header is read at build time; the tests pin
//! each one so a typo cannot slip through.

/// `hipSuccess`.
pub const HIP_SUCCESS: i32 = 0;
/// `hipErrorNoDevice`: what `hipInit` and `hipGetDeviceCount` return on a
/// machine without an AMD GPU.
pub const HIP_ERROR_NO_DEVICE: i32 = 100;

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

/// `hipblasLtMatmulDescAttributes_t` keys the backend sets.
pub mod matmul_desc {
    /// `HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER`.
    pub const A_SCALE_POINTER: u32 = 5;
    /// `HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER`.
    pub const B_SCALE_POINTER: u32 = 6;
    /// `HIPBLASLT_MATMUL_DESC_A_SCALE_MODE`.
    pub const A_SCALE_MODE: u32 = 31;
    /// `HIPBLASLT_MATMUL_DESC_B_SCALE_MODE`.
    pub const B_SCALE_MODE: u32 = 32;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value against the headers of ROCm 7.1 (hipBLASLt 7.1.1).
    #[test]
    fn constants_are_the_headers_values() {
        assert_eq!((HIP_SUCCESS, HIP_ERROR_NO_DEVICE), (0, 100));
        use data_type::*;
        assert_eq!(
            [R_32F, R_16BF, R_8F_E4M3, R_8F_E5M2, R_4F_E2M1_EXT],
            [0, 14, 28, 29, 33]
        );
        assert_eq!([R_8F_E4M3_FNUZ, R_8F_E5M2_FNUZ], [1000, 1001]);
        use scale_mode::*;
        assert_eq!([SCALAR_32F, VEC32_UE8M0, OUTER_VEC_32F], [0, 2, 3]);
        use matmul_desc::*;
        assert_eq!(
            [A_SCALE_POINTER, B_SCALE_POINTER, A_SCALE_MODE, B_SCALE_MODE],
            [5, 6, 31, 32]
        );
    }
}
