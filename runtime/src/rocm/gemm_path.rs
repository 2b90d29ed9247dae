//! Which GEMM a ROCm device runs for a pair of operand formats: a pure
//! function of the architecture and the formats, so the choice is tested
//! without hardware. Every path gives SPEC section 4's result (dequantized
//! operands, f32 accumulation) up to the order of accumulation; a path the
//! hardware lacks falls back to an exact decode to BF16 and a BF16 GEMM,
//! as Hopper does for MXFP4.

use super::consts::data_type;
use crate::backend::Format;
use crate::formats::ElemFormat;
use crate::quant::Grouping;

/// The AMD architectures the backend knows by what their matrix cores take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// MI300X / MI325X: FP8 in the FNUZ formats, no MX block scales.
    Gfx942,
    /// MI350X / MI355X: OCP FP8 and native MXFP4 / MXFP8 block-scaled GEMMs.
    Gfx950,
    /// Anything else: BF16 GEMMs only.
    Other,
}

impl Arch {
    /// From HIP's `gcnArchName` (`gfx942:sramecc+:xnack-`): the part
    /// before the first `:`.
    pub fn from_gcn_name(name: &str) -> Arch {
        match name.split(':').next().unwrap_or("") {
            "gfx942" => Arch::Gfx942,
            "gfx950" => Arch::Gfx950,
            _ => Arch::Other,
        }
    }
}

/// The GEMM behind one product of two quantized operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmPath {
    /// hipBLASLt BF16 x BF16, f32 accumulation.
    Bf16,
    /// hipBLASLt FP8 with one f32 scale per operand (`SCALAR_32F`); the
    /// `hipDataType` of A and B.
    Fp8Tensorwise(i32, i32),
    /// hipBLASLt's block-scaled GEMM: an E8M0 scale per 32 elements along
    /// K on both operands (`VEC32_UE8M0`); the `hipDataType` of A and B.
    MxBlockScaled(i32, i32),
    /// hipBLASLt FP8 with an f32 scale per row of each operand
    /// (`OUTER_VEC_32F`, SPEC 3b rowwise); the `hipDataType` of A and B.
    Fp8Rowwise(i32, i32),
    /// Both operands decoded exactly to BF16, a BF16 GEMM, the tensor
    /// scales applied to the f32 result. FP8 group operands (SPEC 3b),
    /// whose scales vary along K, go as their dequantized f32 values in an
    /// f32 GEMM instead.
    DequantBf16,
}

/// The `hipDataType` of an FP8 element format the architecture's FP8
/// GEMMs take (OCP on gfx950, FNUZ on gfx942).
fn fp8_type(arch: Arch, elem: ElemFormat) -> Option<i32> {
    match (arch, elem) {
        (Arch::Gfx950, ElemFormat::E4M3FN) => Some(data_type::R_8F_E4M3),
        (Arch::Gfx950, ElemFormat::E5M2) => Some(data_type::R_8F_E5M2),
        (Arch::Gfx942, ElemFormat::E4M3FNUZ) => Some(data_type::R_8F_E4M3_FNUZ),
        (Arch::Gfx942, ElemFormat::E5M2FNUZ) => Some(data_type::R_8F_E5M2_FNUZ),
        _ => None,
    }
}

/// The element type of an MX operand in gfx950's block-scaled GEMMs.
fn mx_type(elem: ElemFormat) -> Option<i32> {
    match elem {
        ElemFormat::E2M1 => Some(data_type::R_4F_E2M1_EXT),
        ElemFormat::E4M3FN => Some(data_type::R_8F_E4M3),
        ElemFormat::E5M2 => Some(data_type::R_8F_E5M2),
        _ => None,
    }
}

/// Whether an FP8 pair is one the matrix cores multiply: at least one
/// operand E4M3 (E5M2 x E5M2 has no FP8 GEMM on either architecture).
fn fp8_pair(a: ElemFormat, b: ElemFormat) -> bool {
    let e5 = |f| matches!(f, ElemFormat::E5M2 | ElemFormat::E5M2FNUZ);
    !(e5(a) && e5(b))
}

/// The GEMM `arch` runs for operands `a` and `b`, each quantized along K.
pub fn gemm_path(arch: Arch, a: &Format, b: &Format) -> GemmPath {
    match (a, b) {
        (Format::Bf16, Format::Bf16) => GemmPath::Bf16,
        (Format::Tensorwise { elem: ea, .. }, Format::Tensorwise { elem: eb, .. }) => {
            match (fp8_type(arch, *ea), fp8_type(arch, *eb)) {
                (Some(ta), Some(tb)) if fp8_pair(*ea, *eb) => GemmPath::Fp8Tensorwise(ta, tb),
                _ => GemmPath::DequantBf16,
            }
        }
        (Format::Mx(ca), Format::Mx(cb)) if arch == Arch::Gfx950 => {
            match (mx_type(ca.elem), mx_type(cb.elem)) {
                (Some(ta), Some(tb)) => GemmPath::MxBlockScaled(ta, tb),
                _ => GemmPath::DequantBf16,
            }
        }
        // E4M3FN codes: OCP FP8, so gfx950 only. hipBLASLt's header
        // declares VEC128_32F and BLK128x128_32F but comments both "Not
        // supported yet": 128-blocks decode.
        (Format::Fp8Group(ca), Format::Fp8Group(cb))
            if ca.grouping == Grouping::Rowwise && cb.grouping == Grouping::Rowwise =>
        {
            match fp8_type(arch, ElemFormat::E4M3FN) {
                Some(t) => GemmPath::Fp8Rowwise(t, t),
                None => GemmPath::DequantBf16,
            }
        }
        _ => GemmPath::DequantBf16,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::MxConfig;

    fn fp8(elem: ElemFormat) -> Format {
        Format::Tensorwise { elem, pow2: false }
    }

    fn mx(elem: ElemFormat) -> Format {
        Format::Mx(MxConfig {
            elem,
            ..MxConfig::mxfp4()
        })
    }

    #[test]
    fn architectures_come_from_the_gcn_name() {
        assert_eq!(Arch::from_gcn_name("gfx942:sramecc+:xnack-"), Arch::Gfx942);
        assert_eq!(Arch::from_gcn_name("gfx950"), Arch::Gfx950);
        assert_eq!(Arch::from_gcn_name("gfx90a:xnack-"), Arch::Other);
        assert_eq!(Arch::from_gcn_name(""), Arch::Other);
    }

    #[test]
    fn bf16_runs_bf16_everywhere() {
        for arch in [Arch::Gfx942, Arch::Gfx950, Arch::Other] {
            assert_eq!(
                gemm_path(arch, &Format::Bf16, &Format::Bf16),
                GemmPath::Bf16
            );
        }
    }

    #[test]
    fn fp8_runs_in_each_architectures_own_formats() {
        use data_type::*;
        use ElemFormat::*;
        let p = |arch, a, b| gemm_path(arch, &fp8(a), &fp8(b));
        assert_eq!(
            p(Arch::Gfx950, E4M3FN, E4M3FN),
            GemmPath::Fp8Tensorwise(R_8F_E4M3, R_8F_E4M3)
        );
        assert_eq!(
            p(Arch::Gfx950, E5M2, E4M3FN),
            GemmPath::Fp8Tensorwise(R_8F_E5M2, R_8F_E4M3)
        );
        assert_eq!(
            p(Arch::Gfx942, E4M3FNUZ, E5M2FNUZ),
            GemmPath::Fp8Tensorwise(R_8F_E4M3_FNUZ, R_8F_E5M2_FNUZ)
        );
        // The other family's codes, E5M2 x E5M2 and a mixed pair decode to BF16.
        assert_eq!(p(Arch::Gfx942, E4M3FN, E4M3FN), GemmPath::DequantBf16);
        assert_eq!(p(Arch::Gfx950, E4M3FNUZ, E4M3FNUZ), GemmPath::DequantBf16);
        assert_eq!(p(Arch::Gfx950, E5M2, E5M2), GemmPath::DequantBf16);
        assert_eq!(p(Arch::Gfx942, E4M3FNUZ, E4M3FN), GemmPath::DequantBf16);
        assert_eq!(p(Arch::Other, E4M3FN, E4M3FN), GemmPath::DequantBf16);
    }

    #[test]
    fn fp8_rowwise_is_native_on_gfx950_and_blocks_decode() {
        use crate::quant::Fp8GroupConfig;
        let g = Format::Fp8Group;
        let (row, blk, tile) = (
            Fp8GroupConfig::rowwise(),
            Fp8GroupConfig::block128(),
            Fp8GroupConfig::block128_tiles(),
        );
        let e4m3 = data_type::R_8F_E4M3;
        assert_eq!(
            gemm_path(Arch::Gfx950, &g(row), &g(row)),
            GemmPath::Fp8Rowwise(e4m3, e4m3)
        );
        for arch in [Arch::Gfx942, Arch::Other] {
            assert_eq!(gemm_path(arch, &g(row), &g(row)), GemmPath::DequantBf16);
        }
        for arch in [Arch::Gfx942, Arch::Gfx950, Arch::Other] {
            assert_eq!(gemm_path(arch, &g(blk), &g(tile)), GemmPath::DequantBf16);
            assert_eq!(gemm_path(arch, &g(row), &g(blk)), GemmPath::DequantBf16);
        }
    }

    #[test]
    fn mx_is_native_on_gfx950_only() {
        use data_type::*;
        use ElemFormat::*;
        assert_eq!(
            gemm_path(Arch::Gfx950, &mx(E2M1), &mx(E2M1)),
            GemmPath::MxBlockScaled(R_4F_E2M1_EXT, R_4F_E2M1_EXT)
        );
        assert_eq!(
            gemm_path(Arch::Gfx950, &mx(E4M3FN), &mx(E2M1)),
            GemmPath::MxBlockScaled(R_8F_E4M3, R_4F_E2M1_EXT)
        );
        assert_eq!(
            gemm_path(Arch::Gfx942, &mx(E2M1), &mx(E2M1)),
            GemmPath::DequantBf16
        );
        // A BF16 operand beside an MX one (a per-GEMM override) decodes the MX one.
        assert_eq!(
            gemm_path(Arch::Gfx950, &Format::Bf16, &mx(E2M1)),
            GemmPath::DequantBf16
        );
    }
}
