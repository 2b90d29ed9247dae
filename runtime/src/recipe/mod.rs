//! Quantized-linear recipes (SPEC sections 4 and 4a). The table, names,
//! options and rules live in `mxswitch-recipes`, shared with the macro;
//! this module re-exports them and maps their operand specs onto the
//! runtime's formats and quantizer configs.

use mxswitch_recipes::RecipeError;
pub use mxswitch_recipes::{
    Elem, Gemm, GemmSpec, LinearSpec, Operand, OperandSpec, Opt, Recipe, RecipeKind, Row,
    SavedSpec, Scaling, TABLE,
};

use crate::formats::ElemFormat;
use crate::quant::{
    Fp8GroupConfig, Grouping, MxConfig, Nvfp4Config, BLOCK, FP8_BLOCK, NVFP4_BLOCK,
};
use crate::Error;

/// The runtime's format of a quantized element; `None` for BF16, which is
/// not a quantized format.
pub const fn elem_format(elem: Elem) -> Option<ElemFormat> {
    match elem {
        Elem::Bf16 => None,
        Elem::E4M3 => Some(ElemFormat::E4M3FN),
        Elem::E5M2 => Some(ElemFormat::E5M2),
        Elem::E4M3Fnuz => Some(ElemFormat::E4M3FNUZ),
        Elem::E5M2Fnuz => Some(ElemFormat::E5M2FNUZ),
        Elem::E2M1 => Some(ElemFormat::E2M1),
    }
}

/// The MX quantizer config of an operand, or `None` when the operand is not
/// MX-scaled in blocks of [`BLOCK`] (the only block the MX quantizer has).
/// Stochastic rounding needs a key per call, so `sr` is left unset here.
pub const fn mx_config(op: &OperandSpec) -> Option<MxConfig> {
    let Scaling::Mx { block, mode, tile } = op.scaling else {
        return None;
    };
    let Some(elem) = elem_format(op.elem) else {
        return None;
    };
    if block as usize != BLOCK {
        return None;
    }
    Some(MxConfig {
        elem,
        scale_mode: mode,
        tile2d: tile,
        hadamard: op.hadamard,
        sr: None,
    })
}

/// The NVFP4 quantizer config of an operand, or `None` when the operand is
/// not NVFP4 (E2M1 in blocks of [`NVFP4_BLOCK`]). As for [`mx_config`],
/// `sr` is left unset: the key comes with each call.
pub const fn nvfp4_config(op: &OperandSpec) -> Option<Nvfp4Config> {
    let Scaling::Nvfp4 { block, tile } = op.scaling else {
        return None;
    };
    if block as usize != NVFP4_BLOCK || !matches!(op.elem, Elem::E2M1) {
        return None;
    }
    Some(Nvfp4Config {
        tile2d: tile,
        hadamard: op.hadamard,
        sr: None,
    })
}

/// The FP8 group quantizer config of an operand (SPEC section 3b), or
/// `None` when the operand is not E4M3 with rowwise or [`FP8_BLOCK`] scales
/// (the group quantizer has no Hadamard and no stochastic rounding).
pub const fn fp8_group_config(op: &OperandSpec) -> Option<Fp8GroupConfig> {
    let (grouping, pow2) = match op.scaling {
        Scaling::Rowwise { pow2 } => (Grouping::Rowwise, pow2),
        Scaling::Block { block, tile, pow2 } if block as usize == FP8_BLOCK => {
            (Grouping::Block128 { tile2d: tile }, pow2)
        }
        _ => return None,
    };
    // The group quantizer's element is E4M3FN (`quant::FP8_GROUP_ELEM`).
    if !matches!(op.elem, Elem::E4M3) || op.hadamard || op.sr {
        return None;
    }
    Some(Fp8GroupConfig { grouping, pow2 })
}

impl From<RecipeError> for Error {
    fn from(e: RecipeError) -> Error {
        Error::InvalidOption(e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::ScaleMode;

    #[test]
    fn every_quantized_table_operand_maps_to_a_runtime_format() {
        for row in &TABLE {
            let s = row.spec;
            for g in Gemm::ALL {
                let GemmSpec { a, b } = *s.gemm(g);
                for op in [a, b] {
                    match op.scaling {
                        Scaling::None => assert_eq!(elem_format(op.elem), None),
                        Scaling::Tensorwise { .. } => assert!(elem_format(op.elem).is_some()),
                        Scaling::Mx { .. } => assert!(mx_config(&op).is_some(), "{}", row.name),
                        Scaling::Nvfp4 { .. } => {
                            assert!(nvfp4_config(&op).is_some(), "{}", row.name)
                        }
                        Scaling::Rowwise { .. } | Scaling::Block { .. } => {
                            assert!(fp8_group_config(&op).is_some(), "{}", row.name)
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn mx_configs_follow_the_operand() {
        let s = Recipe::new(RecipeKind::Mxfp4).spec();
        let w = mx_config(&s.fprop.b).unwrap();
        assert_eq!(
            (w.elem, w.scale_mode, w.tile2d, w.hadamard),
            (ElemFormat::E2M1, ScaleMode::Even, true, false)
        );
        let x_m = mx_config(&s.wgrad.b).unwrap();
        assert_eq!((x_m.tile2d, x_m.hadamard), (false, true));
        assert_eq!(MxConfig::mxfp4(), mx_config(&s.fprop.a).unwrap());
        assert_eq!(MxConfig::mxfp8().scale_mode, ScaleMode::Rceil);
        let bf16 = Recipe::new(RecipeKind::Bf16).spec();
        assert_eq!(mx_config(&bf16.fprop.a), None);
        let fnuz = Recipe::new(RecipeKind::Fp8Fnuz).spec();
        assert_eq!(
            (
                elem_format(fnuz.fprop.a.elem),
                elem_format(fnuz.dgrad.a.elem)
            ),
            (Some(ElemFormat::E4M3FNUZ), Some(ElemFormat::E5M2FNUZ))
        );
    }

    #[test]
    fn nvfp4_and_fp8_group_configs_follow_the_operand() {
        let s = Recipe::new(RecipeKind::Nvfp4).spec();
        let w = nvfp4_config(&s.fprop.b).unwrap();
        assert_eq!((w.tile2d, w.hadamard, w.sr), (true, false, None));
        let dy_m = nvfp4_config(&s.wgrad.a).unwrap();
        assert_eq!((dy_m.tile2d, dy_m.hadamard), (false, true));
        assert_eq!(mx_config(&s.fprop.a), None);
        assert_eq!(fp8_group_config(&s.fprop.a), None);
        let rows = Recipe::new(RecipeKind::Fp8Rowwise).spec();
        assert_eq!(
            fp8_group_config(&rows.dgrad.a),
            Some(Fp8GroupConfig::rowwise())
        );
        let blocks = Recipe::new(RecipeKind::Fp8Block).spec();
        assert_eq!(
            fp8_group_config(&blocks.fprop.a),
            Some(Fp8GroupConfig::block128())
        );
        assert_eq!(
            fp8_group_config(&blocks.dgrad.b),
            Some(Fp8GroupConfig::block128_tiles())
        );
        assert_eq!(nvfp4_config(&blocks.fprop.a), None);
    }

    #[test]
    fn recipe_errors_become_invalid_options() {
        let e: Error = "mxfp4(pow2 = true)".parse::<Recipe>().unwrap_err().into();
        assert!(
            e.to_string()
                .starts_with("invalid option: option `pow2` does not apply to recipe `mxfp4`"),
            "{e}"
        );
    }
}
