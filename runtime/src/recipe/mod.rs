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
use crate::quant::{MxConfig, BLOCK};
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
    fn recipe_errors_become_invalid_options() {
        let e: Error = "mxfp4(pow2 = true)".parse::<Recipe>().unwrap_err().into();
        assert!(
            e.to_string()
                .starts_with("invalid option: option `pow2` does not apply to recipe `mxfp4`"),
            "{e}"
        );
    }
}
