//! The one `match` from a user-facing quantization format to its quantizer.
//! The MX formats are named and configured as the recipes of the same name.

use std::fmt;
use std::str::FromStr;

use super::fp8::{quantize_tensorwise, Fp8Tensor};
use super::mx::{quantize_mx, MxConfig, MxTensor};
use super::scale::ScaleMode;
use crate::formats::ElemFormat;
use crate::recipe::RecipeKind;
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
}

impl QuantFormat {
    /// Every valid format, in the order error messages list them.
    pub const ALL: [QuantFormat; 6] = [
        QuantFormat::Mxfp4,
        QuantFormat::Mxfp8,
        QuantFormat::Fp8(ElemFormat::E4M3FN),
        QuantFormat::Fp8(ElemFormat::E5M2),
        QuantFormat::Fp8(ElemFormat::E4M3FNUZ),
        QuantFormat::Fp8(ElemFormat::E5M2FNUZ),
    ];

    /// The command-line name: `mxfp4`, `mxfp8` or `fp8-<elem>` (e.g. `fp8-e4m3`),
    /// which [`FromStr`] parses back.
    pub const fn name(self) -> &'static str {
        match self {
            QuantFormat::Mxfp4 => RecipeKind::Mxfp4.name(),
            QuantFormat::Mxfp8 => RecipeKind::Mxfp8.name(),
            QuantFormat::Fp8(ElemFormat::E4M3FN) => "fp8-e4m3",
            QuantFormat::Fp8(ElemFormat::E5M2) => "fp8-e5m2",
            QuantFormat::Fp8(ElemFormat::E4M3FNUZ) => "fp8-e4m3fnuz",
            QuantFormat::Fp8(ElemFormat::E5M2FNUZ) => "fp8-e5m2fnuz",
            QuantFormat::Fp8(ElemFormat::E2M1) => "fp8-e2m1 (invalid)",
        }
    }

    /// True for the block-scaled formats, the only ones with scale modes,
    /// tiles and the Hadamard option.
    pub const fn is_mx(self) -> bool {
        matches!(self, QuantFormat::Mxfp4 | QuantFormat::Mxfp8)
    }

    /// The config of the recipe of the same name, as it quantizes
    /// activations: the recipe table's default scale mode (SPEC section 4).
    pub fn default_config(self) -> Option<MxConfig> {
        match self {
            QuantFormat::Mxfp4 => Some(MxConfig::mxfp4()),
            QuantFormat::Mxfp8 => Some(MxConfig::mxfp8()),
            QuantFormat::Fp8(_) => None,
        }
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

/// Options of one quantization; the MX-only ones are errors for FP8.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuantOptions {
    /// Block-scale rule for MX formats; `None` keeps the recipe's default.
    pub scale_mode: Option<ScaleMode>,
    /// Quantization axis for MX formats; negative counts from the end.
    pub axis: Option<isize>,
    /// MX only: one scale per 32x32 tile of a 2-D tensor instead of per 1x32 block.
    pub tile2d: bool,
    /// MX only: rotate each group of 16 along the axis by (1/4) H16 first.
    pub hadamard: bool,
}

/// The result of [`quantize`].
#[derive(Clone, Debug, PartialEq)]
pub enum Quantized {
    /// An MX format's blocks and scales.
    Mx(MxTensor),
    /// A tensorwise FP8 format's codes and scale.
    Fp8(Fp8Tensor),
}

/// Quantize `x` of `shape` to `format`; `name` labels errors.
pub fn quantize(
    x: &[f32],
    shape: &[usize],
    format: QuantFormat,
    opts: &QuantOptions,
    name: &str,
) -> Result<Quantized> {
    match format.default_config() {
        Some(mut cfg) => {
            if let Some(m) = opts.scale_mode {
                cfg.scale_mode = m;
            }
            cfg.tile2d = opts.tile2d;
            cfg.hadamard = opts.hadamard;
            quantize_mx(x, shape, opts.axis.unwrap_or(-1), &cfg).map(Quantized::Mx)
        }
        None => {
            let mx_only = [
                (opts.scale_mode.is_some(), "--scale-mode"),
                (opts.axis.is_some(), "--axis"),
                (opts.tile2d, "--tile2d"),
                (opts.hadamard, "--hadamard"),
            ];
            if let Some((_, flag)) = mx_only.iter().find(|(set, _)| *set) {
                return Err(Error::InvalidOption(format!(
                    "{flag} applies only to the MX formats (mxfp4, mxfp8), not to {format}"
                )));
            }
            let QuantFormat::Fp8(elem) = format else {
                return Err(Error::NotImplemented(format!("quantization to {format}")));
            };
            quantize_tensorwise(x, shape, elem, false, name).map(Quantized::Fp8)
        }
    }
}

impl Quantized {
    /// Dequantized values in the input's shape.
    pub fn dequantize(&self) -> Vec<f32> {
        match self {
            Quantized::Mx(q) => q.dequantize(),
            Quantized::Fp8(q) => q.dequantize(),
        }
    }

    /// Number of blocks given the NaN scale (see
    /// [`MxTensor::count_nan_scales`]) out of all blocks; FP8 has one
    /// scale, finite for any finite input, so it reports `(0, 1)`.
    pub fn nan_scales(&self) -> (usize, usize) {
        match self {
            Quantized::Mx(q) => (q.count_nan_scales(), q.scales.len()),
            Quantized::Fp8(_) => (0, 1),
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
        }
    }
}
