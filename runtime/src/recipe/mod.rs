//! Quantized-linear recipes (SPEC section 4): the policy of which operand
//! of which GEMM is quantized how. The kernels live in `quant`; the three
//! GEMMs of a linear live in `linear`.

pub mod linear;

use std::fmt;

use crate::formats::ElemFormat;
use crate::quant::{MxConfig, ScaleMode};
use crate::{Error, Result};

/// The named recipes of SPEC section 4.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecipeKind {
    /// BF16 operands, f32 accumulation.
    Bf16,
    /// Tensorwise FP8: E4M3 forward operands, E5M2 gradients.
    Fp8,
    /// As `Fp8` with the gfx942 FNUZ variants.
    Fp8Fnuz,
    /// MXFP4: E2M1 1x32 blocks, EVEN scales, 32x32 weight tiles, Hadamard on wgrad.
    Mxfp4,
    /// MXFP8: E4M3 1x32 blocks, RCEIL scales, no tiles, no Hadamard.
    Mxfp8,
}

impl RecipeKind {
    pub const ALL: [RecipeKind; 5] = [
        RecipeKind::Bf16,
        RecipeKind::Fp8,
        RecipeKind::Fp8Fnuz,
        RecipeKind::Mxfp4,
        RecipeKind::Mxfp8,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            RecipeKind::Bf16 => "bf16",
            RecipeKind::Fp8 => "fp8",
            RecipeKind::Fp8Fnuz => "fp8_fnuz",
            RecipeKind::Mxfp4 => "mxfp4",
            RecipeKind::Mxfp8 => "mxfp8",
        }
    }

    /// Look a recipe up by its SPEC name.
    pub fn from_name(name: &str) -> Result<Self> {
        RecipeKind::ALL
            .into_iter()
            .find(|r| r.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = RecipeKind::ALL.iter().map(|r| r.name()).collect();
                Error::InvalidOption(format!(
                    "unknown recipe `{name}`; expected one of {}",
                    names.join(", ")
                ))
            })
    }

    pub const fn is_mx(self) -> bool {
        matches!(self, RecipeKind::Mxfp4 | RecipeKind::Mxfp8)
    }

    pub const fn is_fp8(self) -> bool {
        matches!(self, RecipeKind::Fp8 | RecipeKind::Fp8Fnuz)
    }
}

impl fmt::Display for RecipeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A recipe with its options. Build one with [`Recipe::new`] and
/// [`Recipe::with_option`], which reject options that do not apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Recipe {
    pub kind: RecipeKind,
    /// MX recipes: how block scales are chosen.
    pub scale: ScaleMode,
    /// MX recipes: stochastic rounding of the gradient operands.
    pub sr: bool,
    /// MX recipes: Hadamard-16 on both wgrad operands.
    pub hadamard: bool,
    /// MX recipes: 32x32 weight tiles.
    pub tile2d: bool,
    /// FP8 recipes: power-of-two tensorwise scales.
    pub pow2: bool,
}

/// The option keys of SPEC section 4, and the recipes each applies to.
pub const OPTION_KEYS: [(&str, &str); 5] = [
    ("scale", "MX recipes (mxfp4, mxfp8)"),
    ("sr", "MX recipes (mxfp4, mxfp8)"),
    ("hadamard", "MX recipes (mxfp4, mxfp8)"),
    ("tile2d", "MX recipes (mxfp4, mxfp8)"),
    ("pow2", "FP8 recipes (fp8, fp8_fnuz)"),
];

impl Recipe {
    /// The recipe with its SPEC defaults.
    pub const fn new(kind: RecipeKind) -> Self {
        let mx4 = matches!(kind, RecipeKind::Mxfp4);
        Recipe {
            kind,
            scale: if mx4 {
                ScaleMode::Even
            } else {
                ScaleMode::Rceil
            },
            sr: false,
            hadamard: mx4,
            tile2d: mx4,
            pow2: false,
        }
    }

    /// Set one option, `key = value` as written in `mxfp4(scale = rceil, sr = true)`.
    pub fn with_option(mut self, key: &str, value: &str) -> Result<Self> {
        let applies = match key {
            "scale" | "sr" | "hadamard" | "tile2d" => self.kind.is_mx(),
            "pow2" => self.kind.is_fp8(),
            _ => {
                let keys: Vec<&str> = OPTION_KEYS.iter().map(|(k, _)| *k).collect();
                return Err(Error::InvalidOption(format!(
                    "unknown recipe option `{key}`; expected one of {}",
                    keys.join(", ")
                )));
            }
        };
        if !applies {
            let who = OPTION_KEYS
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, w)| *w)
                .unwrap_or("");
            return Err(Error::InvalidOption(format!(
                "option `{key}` does not apply to recipe `{}`; it applies to {who}",
                self.kind
            )));
        }
        let flag = || match value {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(Error::InvalidOption(format!(
                "option `{key}` takes true or false, not `{value}`"
            ))),
        };
        match key {
            "scale" => self.scale = value.parse()?,
            "sr" => self.sr = flag()?,
            "hadamard" => self.hadamard = flag()?,
            "tile2d" => self.tile2d = flag()?,
            _ => self.pow2 = flag()?,
        }
        Ok(self)
    }

    /// MX block configuration of this recipe's elements.
    pub(crate) fn mx_config(&self) -> MxConfig {
        let elem = match self.kind {
            RecipeKind::Mxfp4 => ElemFormat::E2M1,
            _ => ElemFormat::E4M3FN,
        };
        MxConfig {
            elem,
            scale_mode: self.scale,
            tile2d: false,
            hadamard: false,
            sr: None,
        }
    }

    /// The FP8 element formats of the forward operands and of the gradients.
    pub(crate) fn fp8_formats(&self) -> (ElemFormat, ElemFormat) {
        match self.kind {
            RecipeKind::Fp8Fnuz => (ElemFormat::E4M3FNUZ, ElemFormat::E5M2FNUZ),
            _ => (ElemFormat::E4M3FN, ElemFormat::E5M2),
        }
    }

    /// Bytes saved for backward per element of x and W (SPEC section 4).
    pub fn saved_bytes_per_element(&self) -> f64 {
        match self.kind {
            RecipeKind::Bf16 => 2.0,
            RecipeKind::Fp8 | RecipeKind::Fp8Fnuz => 1.0,
            RecipeKind::Mxfp4 | RecipeKind::Mxfp8 => self.mx_config().bytes_per_element(),
        }
    }
}

impl fmt::Display for Recipe {
    /// The recipe name, with the options that differ from its defaults.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = Recipe::new(self.kind);
        let mut opts = Vec::new();
        if self.kind.is_mx() {
            if self.scale != d.scale {
                opts.push(format!("scale = {}", self.scale));
            }
            for (name, v, dv) in [
                ("sr", self.sr, d.sr),
                ("hadamard", self.hadamard, d.hadamard),
                ("tile2d", self.tile2d, d.tile2d),
            ] {
                if v != dv {
                    opts.push(format!("{name} = {v}"));
                }
            }
        }
        if self.kind.is_fp8() && self.pow2 {
            opts.push("pow2 = true".into());
        }
        if opts.is_empty() {
            write!(f, "{}", self.kind)
        } else {
            write!(f, "{}({})", self.kind, opts.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_spec() {
        let m4 = Recipe::new(RecipeKind::Mxfp4);
        assert_eq!(
            (m4.scale, m4.sr, m4.hadamard, m4.tile2d),
            (ScaleMode::Even, false, true, true)
        );
        let m8 = Recipe::new(RecipeKind::Mxfp8);
        assert_eq!(
            (m8.scale, m8.sr, m8.hadamard, m8.tile2d),
            (ScaleMode::Rceil, false, false, false)
        );
        assert_eq!(
            Recipe::new(RecipeKind::Mxfp4).saved_bytes_per_element(),
            0.53125
        );
        assert_eq!(
            Recipe::new(RecipeKind::Mxfp8).saved_bytes_per_element(),
            1.03125
        );
    }

    #[test]
    fn options_are_checked_against_the_recipe() {
        let r = Recipe::new(RecipeKind::Mxfp4)
            .with_option("scale", "rceil")
            .unwrap()
            .with_option("sr", "true")
            .unwrap();
        assert_eq!(r.to_string(), "mxfp4(scale = rceil, sr = true)");
        let e = Recipe::new(RecipeKind::Fp8)
            .with_option("scale", "even")
            .unwrap_err();
        assert!(
            e.to_string().contains("does not apply to recipe `fp8`"),
            "{e}"
        );
        let e = Recipe::new(RecipeKind::Mxfp4)
            .with_option("pow2", "true")
            .unwrap_err();
        assert!(e.to_string().contains("FP8 recipes"), "{e}");
        assert!(Recipe::new(RecipeKind::Mxfp4)
            .with_option("sr", "yes")
            .is_err());
        assert!(Recipe::new(RecipeKind::Mxfp4)
            .with_option("bogus", "1")
            .is_err());
        assert!(RecipeKind::from_name("mxfp5").is_err());
        assert_eq!(
            RecipeKind::from_name("fp8_fnuz").unwrap(),
            RecipeKind::Fp8Fnuz
        );
    }
}
