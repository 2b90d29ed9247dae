//! The one `match` from a user-facing quantization format to its quantizer.
//! The block and row formats are named and configured as the recipes of the
//! same name: MX (`mxfp4`, `mxfp8`), NVFP4 (`nvfp4`) and FP8 rowwise and
//! 128-block (`fp8-rowwise`, `fp8-block`, the `fp8_rowwise` and `fp8_block`
//! recipes' operands); `fp8-<elem>` is tensorwise FP8.

use std::fmt;
use std::str::FromStr;

use super::fp8::{quantize_tensorwise, Fp8Tensor};
use super::fp8_group::{quantize_fp8_groups, Fp8GroupConfig, Fp8GroupTensor, Grouping};
use super::mx::{quantize_mx, MxConfig, MxTensor};
use super::nvfp4::{quantize_nvfp4, Nvfp4Config, Nvfp4Tensor};
use super::philox::SrKey;
use super::scale::ScaleMode;
use crate::formats::ElemFormat;
use crate::recipe::{Recipe, RecipeKind};
use crate::{Error, Result};

/// A quantization format as the command line names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantFormat {
    /// MX blocks of 32 E2M1 elements (`mxfp4`).
    Mxfp4,
    /// MX blocks of 32 E4M3FN elements (`mxfp8`).
    Mxfp8,
    /// Tensorwise FP8 with the given 8-bit element.
    Fp8(ElemFormat),
    /// NVFP4: blocks of 16 E2M1 elements with E4M3FN scales under an f32
    /// tensor scale (`nvfp4`, SPEC section 2b).
    Nvfp4,
    /// E4M3FN with one f32 scale per row along the axis (`fp8-rowwise`,
    /// SPEC section 3b).
    Fp8Rowwise,
    /// E4M3FN with one f32 scale per 1x128 block along the axis, or per
    /// 128x128 tile (`fp8-block`, SPEC section 3b).
    Fp8Block,
}

/// An option of [`QuantOptions`], by its command-line flag, for the rule
/// of which formats take it ([`QuantFormat::takes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantFlag {
    /// `--scale-mode`: the MX block-scale rule.
    ScaleMode,
    /// `--axis`: the quantization axis of block and row scales.
    Axis,
    /// `--tile2d`: one scale per 2-D tile of a matrix.
    Tile2d,
    /// `--hadamard`: the Hadamard-16 rotation first.
    Hadamard,
    /// `--pow2`: FP8 scales rounded down to powers of two.
    Pow2,
    /// `--sr`: stochastic rounding of the elements under a Philox key.
    Sr,
}

impl QuantFlag {
    /// Every flag, in the order errors check them.
    pub const ALL: [QuantFlag; 6] = [
        QuantFlag::ScaleMode,
        QuantFlag::Axis,
        QuantFlag::Tile2d,
        QuantFlag::Hadamard,
        QuantFlag::Pow2,
        QuantFlag::Sr,
    ];

    /// The flag as the command line spells it.
    pub const fn name(self) -> &'static str {
        match self {
            QuantFlag::ScaleMode => "--scale-mode",
            QuantFlag::Axis => "--axis",
            QuantFlag::Tile2d => "--tile2d",
            QuantFlag::Hadamard => "--hadamard",
            QuantFlag::Pow2 => "--pow2",
            QuantFlag::Sr => "--sr",
        }
    }
}

impl QuantFormat {
    /// Every valid format, in the order error messages list them.
    pub const ALL: [QuantFormat; 9] = [
        QuantFormat::Mxfp4,
        QuantFormat::Mxfp8,
        QuantFormat::Fp8(ElemFormat::E4M3FN),
        QuantFormat::Fp8(ElemFormat::E5M2),
        QuantFormat::Fp8(ElemFormat::E4M3FNUZ),
        QuantFormat::Fp8(ElemFormat::E5M2FNUZ),
        QuantFormat::Nvfp4,
        QuantFormat::Fp8Rowwise,
        QuantFormat::Fp8Block,
    ];

    /// The command-line name: `mxfp4`, `mxfp8`, `nvfp4`, `fp8-rowwise`,
    /// `fp8-block` or `fp8-<elem>` (e.g. `fp8-e4m3`), which [`FromStr`]
    /// parses back.
    pub const fn name(self) -> &'static str {
        match self {
            QuantFormat::Mxfp4 => RecipeKind::Mxfp4.name(),
            QuantFormat::Mxfp8 => RecipeKind::Mxfp8.name(),
            QuantFormat::Nvfp4 => RecipeKind::Nvfp4.name(),
            QuantFormat::Fp8Rowwise => "fp8-rowwise",
            QuantFormat::Fp8Block => "fp8-block",
            QuantFormat::Fp8(ElemFormat::E4M3FN) => "fp8-e4m3",
            QuantFormat::Fp8(ElemFormat::E5M2) => "fp8-e5m2",
            QuantFormat::Fp8(ElemFormat::E4M3FNUZ) => "fp8-e4m3fnuz",
            QuantFormat::Fp8(ElemFormat::E5M2FNUZ) => "fp8-e5m2fnuz",
            QuantFormat::Fp8(ElemFormat::E2M1) => "fp8-e2m1 (invalid)",
        }
    }

    /// True for the MX block formats, the only ones with scale modes.
    pub const fn is_mx(self) -> bool {
        matches!(self, QuantFormat::Mxfp4 | QuantFormat::Mxfp8)
    }

    /// Whether the format takes `flag`: scale modes are MX's; every block
    /// or row format has an axis; tiles are MX's, NVFP4's and the 128-block
    /// format's; the Hadamard option and stochastic rounding are MX's and
    /// NVFP4's (the quantizers with an SR key, SPEC sections 2 and 2b);
    /// power-of-two scales are every FP8 format's.
    pub const fn takes(self, flag: QuantFlag) -> bool {
        use QuantFormat as F;
        match flag {
            QuantFlag::ScaleMode => self.is_mx(),
            QuantFlag::Axis => !matches!(self, F::Fp8(_)),
            QuantFlag::Tile2d => matches!(self, F::Mxfp4 | F::Mxfp8 | F::Nvfp4 | F::Fp8Block),
            QuantFlag::Hadamard => matches!(self, F::Mxfp4 | F::Mxfp8 | F::Nvfp4),
            QuantFlag::Pow2 => matches!(self, F::Fp8(_) | F::Fp8Rowwise | F::Fp8Block),
            QuantFlag::Sr => matches!(self, F::Mxfp4 | F::Mxfp8 | F::Nvfp4),
        }
    }

    /// The config of the recipe of the same name, as it quantizes
    /// activations: the recipe table's default scale mode (SPEC section 4);
    /// `None` for the formats without scale modes.
    pub fn default_config(self) -> Option<MxConfig> {
        match self {
            QuantFormat::Mxfp4 => Some(MxConfig::mxfp4()),
            QuantFormat::Mxfp8 => Some(MxConfig::mxfp8()),
            _ => None,
        }
    }

    /// The `pow2` default of an FP8 format: its recipe's (`fp8`,
    /// `fp8_fnuz`: off; `fp8_rowwise`: on; `fp8_block`: off); `None` for
    /// the formats without it.
    pub fn default_pow2(self) -> Option<bool> {
        let kind = match self {
            QuantFormat::Fp8(ElemFormat::E4M3FNUZ | ElemFormat::E5M2FNUZ) => RecipeKind::Fp8Fnuz,
            QuantFormat::Fp8(_) => RecipeKind::Fp8,
            QuantFormat::Fp8Rowwise => RecipeKind::Fp8Rowwise,
            QuantFormat::Fp8Block => RecipeKind::Fp8Block,
            _ => return None,
        };
        Some(Recipe::new(kind).pow2)
    }
}

impl fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for QuantFormat {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        QuantFormat::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = QuantFormat::ALL.iter().map(|f| f.name()).collect();
                Error::InvalidOption(format!(
                    "unknown format `{s}`; expected one of {}",
                    names.join(", ")
                ))
            })
    }
}

/// Options of one quantization; each applies to the formats that
/// [`QuantFormat::takes`] it, and is an error for the others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuantOptions {
    /// Block-scale rule for MX formats; `None` keeps the recipe's default.
    pub scale_mode: Option<ScaleMode>,
    /// Quantization axis of block and row scales; negative counts from the end.
    pub axis: Option<isize>,
    /// One scale per 32x32 (MX), 16x16 (NVFP4) or 128x128 (FP8 block) tile
    /// of a 2-D tensor instead of per 1-D block.
    pub tile2d: bool,
    /// MX and NVFP4: rotate each group of 16 along the axis by (1/4) H16 first.
    pub hadamard: bool,
    /// FP8 formats: scales rounded down to powers of two; `None` keeps the
    /// recipe's default ([`QuantFormat::default_pow2`]).
    pub pow2: Option<bool>,
    /// MX and NVFP4: round the elements stochastically under this key
    /// (SPEC section 2) instead of to nearest even.
    pub sr: Option<SrKey>,
}

impl QuantOptions {
    /// Whether `flag` was given.
    const fn is_set(&self, flag: QuantFlag) -> bool {
        match flag {
            QuantFlag::ScaleMode => self.scale_mode.is_some(),
            QuantFlag::Axis => self.axis.is_some(),
            QuantFlag::Tile2d => self.tile2d,
            QuantFlag::Hadamard => self.hadamard,
            QuantFlag::Pow2 => self.pow2.is_some(),
            QuantFlag::Sr => self.sr.is_some(),
        }
    }

    /// An error naming the first option `format` does not take and the
    /// formats that take it. Checks only the format: what depends on a
    /// tensor (its rank, the axis' range) is checked when it is quantized.
    pub fn check(&self, format: QuantFormat) -> Result<()> {
        let Some(flag) = QuantFlag::ALL
            .into_iter()
            .find(|&f| self.is_set(f) && !format.takes(f))
        else {
            return Ok(());
        };
        let takers: Vec<&str> = QuantFormat::ALL
            .into_iter()
            .filter(|f| f.takes(flag))
            .map(QuantFormat::name)
            .collect();
        Err(Error::InvalidOption(format!(
            "{} applies only to {}, not to {format}",
            flag.name(),
            takers.join(", ")
        )))
    }
}

/// The result of [`quantize`].
#[derive(Clone, Debug, PartialEq)]
pub enum Quantized {
    /// An MX format's blocks and scales.
    Mx(MxTensor),
    /// A tensorwise FP8 format's codes and scale.
    Fp8(Fp8Tensor),
    /// NVFP4's blocks, block scales and tensor scale.
    Nvfp4(Nvfp4Tensor),
    /// FP8 rowwise or 128-block codes and scales.
    Fp8Group(Fp8GroupTensor),
}

/// Quantize `x` of `shape` to `format`; `name` labels errors.
pub fn quantize(
    x: &[f32],
    shape: &[usize],
    format: QuantFormat,
    opts: &QuantOptions,
    name: &str,
) -> Result<Quantized> {
    opts.check(format)?;
    let axis = opts.axis.unwrap_or(-1);
    let pow2 = opts.pow2.or(format.default_pow2()).unwrap_or(false);
    match format {
        QuantFormat::Mxfp4 | QuantFormat::Mxfp8 => {
            let mut cfg = format
                .default_config()
                .ok_or_else(|| Error::NotImplemented(format!("quantization to {format}")))?;
            if let Some(m) = opts.scale_mode {
                cfg.scale_mode = m;
            }
            cfg.tile2d = opts.tile2d;
            cfg.hadamard = opts.hadamard;
            cfg.sr = opts.sr;
            quantize_mx(x, shape, axis, &cfg).map(Quantized::Mx)
        }
        QuantFormat::Fp8(elem) => {
            quantize_tensorwise(x, shape, elem, pow2, name).map(Quantized::Fp8)
        }
        QuantFormat::Nvfp4 => {
            let cfg = Nvfp4Config {
                tile2d: opts.tile2d,
                hadamard: opts.hadamard,
                sr: opts.sr,
            };
            quantize_nvfp4(x, shape, axis, &cfg).map(Quantized::Nvfp4)
        }
        QuantFormat::Fp8Rowwise | QuantFormat::Fp8Block => {
            let grouping = if format == QuantFormat::Fp8Rowwise {
                Grouping::Rowwise
            } else {
                Grouping::Block128 {
                    tile2d: opts.tile2d,
                }
            };
            let cfg = Fp8GroupConfig { grouping, pow2 };
            quantize_fp8_groups(x, shape, axis, &cfg).map(Quantized::Fp8Group)
        }
    }
}

impl Quantized {
    /// Dequantized values in the input's shape.
    pub fn dequantize(&self) -> Vec<f32> {
        match self {
            Quantized::Mx(q) => q.dequantize(),
            Quantized::Fp8(q) => q.dequantize(),
            Quantized::Nvfp4(q) => q.dequantize(),
            Quantized::Fp8Group(q) => q.dequantize(),
        }
    }

    /// Number of blocks given the NaN scale (see
    /// [`MxTensor::count_nan_scales`]) out of all blocks; the other formats
    /// have no NaN scale (they refuse non-finite input), so they report 0
    /// of their scales (1 for tensorwise FP8).
    pub fn nan_scales(&self) -> (usize, usize) {
        match self {
            Quantized::Mx(q) => (q.count_nan_scales(), q.scales.len()),
            Quantized::Fp8(_) => (0, 1),
            Quantized::Nvfp4(q) => (0, q.scales.len()),
            Quantized::Fp8Group(q) => (0, q.scales.len()),
        }
    }

    /// Number of elements that were clipped: their scaled magnitude exceeded
    /// the format's largest finite value. `x` is the input that was quantized.
    pub fn saturated(&self, x: &[f32]) -> usize {
        match self {
            Quantized::Mx(q) => q.count_saturated(x),
            Quantized::Fp8(q) => {
                let max = q.elem.max_value();
                x.iter().filter(|&&v| (v * q.scale).abs() > max).count()
            }
            Quantized::Nvfp4(q) => q.count_saturated(x),
            Quantized::Fp8Group(q) => q.count_saturated(x),
        }
    }
}
