//! Operand specs: how one operand of one GEMM is quantized (SPEC sections
//! 1-4a). A recipe resolves to a [`LinearSpec`], the only thing a quantized
//! linear needs to know about it.

use std::fmt;
use std::str::FromStr;

use crate::error::{lookup, named, RecipeError};

/// Element formats, by their SPEC section 1 names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    /// Not quantized: BF16 (round to nearest even from f32).
    Bf16,
    /// FP8 E4M3FN, max 448.
    E4M3,
    /// FP8 E5M2, max 57344.
    E5M2,
    /// gfx942 FP8 E4M3FNUZ, max 240.
    E4M3Fnuz,
    /// gfx942 FP8 E5M2FNUZ, max 57344.
    E5M2Fnuz,
    /// FP4 E2M1, max 6.
    E2M1,
}

impl Elem {
    /// Bits of one element: 16, 8, or 4 for E2M1.
    pub const fn bits(self) -> u32 {
        match self {
            Elem::Bf16 => 16,
            Elem::E2M1 => 4,
            Elem::E4M3 | Elem::E5M2 | Elem::E4M3Fnuz | Elem::E5M2Fnuz => 8,
        }
    }

    /// The SPEC name, as recipes and errors spell it (e.g. `e4m3fn`).
    pub const fn name(self) -> &'static str {
        match self {
            Elem::Bf16 => "bf16",
            Elem::E4M3 => "e4m3fn",
            Elem::E5M2 => "e5m2",
            Elem::E4M3Fnuz => "e4m3fnuz",
            Elem::E5M2Fnuz => "e5m2fnuz",
            Elem::E2M1 => "e2m1",
        }
    }
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Elements per MX block, and the side of an MX weight tile (SPEC section 2).
pub const MX_BLOCK: u32 = 32;

/// Elements per NVFP4 block, and the side of an NVFP4 weight tile (SPEC section 2b).
pub const NVFP4_BLOCK: u32 = 16;

/// Elements per FP8 128-block, and the side of its weight tile (SPEC section 3b).
pub const FP8_BLOCK: u32 = 128;

/// How an MX block's E8M0 power-of-two scale is chosen from its amax (SPEC section 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleMode {
    /// OCP MX v1.0: floor(log2 amax) - emax_elem. Large values may saturate.
    Floor,
    /// As FLOOR, plus one when amax is not a power of two: never saturates.
    Ceil,
    /// Primus-Turbo's production rule: round the amax significand to the
    /// element's mantissa width first, then FLOOR (E2M1: amax / scale in [3.5, 7)).
    Even,
    /// NVIDIA hardware / torchao: amax / max_elem rounded up to a power of two.
    Rceil,
}

impl ScaleMode {
    /// Every mode, in the order error messages list them.
    pub const ALL: [ScaleMode; 4] = [
        ScaleMode::Floor,
        ScaleMode::Ceil,
        ScaleMode::Even,
        ScaleMode::Rceil,
    ];

    /// The SPEC name, as the `scale` option takes it.
    pub const fn name(self) -> &'static str {
        match self {
            ScaleMode::Floor => "floor",
            ScaleMode::Ceil => "ceil",
            ScaleMode::Even => "even",
            ScaleMode::Rceil => "rceil",
        }
    }

    /// Look a mode up by its SPEC name.
    pub fn from_name(name: &str) -> Result<Self, RecipeError> {
        lookup(name)
    }
}

named!(ScaleMode, "scale mode");

impl fmt::Display for ScaleMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ScaleMode {
    type Err = RecipeError;
    fn from_str(s: &str) -> Result<Self, RecipeError> {
        ScaleMode::from_name(s)
    }
}

/// How an operand's scales are laid out. A new scaling (NVFP4's two-level
/// scales, FP8 rowwise or 128-blocks) is a new variant here, and the
/// compiler then lists every place that must handle it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scaling {
    /// Not quantized: a BF16 operand (f32 accumulation).
    None,
    /// One f32 scale for the tensor (SPEC section 3); `pow2` rounds it down
    /// to a power of two.
    Tensorwise {
        /// Round the scale down to a power of two.
        pow2: bool,
    },
    /// One E8M0 scale per `block` consecutive elements along the GEMM's
    /// reduction axis (SPEC section 2); with `tile`, a weight shares one
    /// scale per `block` x `block` tile, stored replicated per 1 x `block`.
    Mx {
        /// Elements per block along the reduction axis ([`MX_BLOCK`] in every row).
        block: u32,
        /// How each block's scale is chosen from its amax.
        mode: ScaleMode,
        /// Share one scale per `block` x `block` tile (weights only).
        tile: bool,
    },
    /// NVFP4's two levels (SPEC section 2b): one E4M3FN scale per `block`
    /// consecutive elements along the reduction axis, relative to one f32
    /// scale for the tensor; with `tile`, a weight shares one block scale
    /// per `block` x `block` tile, stored replicated per 1 x `block`.
    Nvfp4 {
        /// Elements per block along the reduction axis ([`NVFP4_BLOCK`]).
        block: u32,
        /// Share one scale per `block` x `block` tile (weights only).
        tile: bool,
    },
    /// FP8 rowwise (SPEC section 3b): one f32 scale per row of the operand,
    /// over its whole reduction axis; `pow2` rounds each down to a power of two.
    Rowwise {
        /// Round every scale down to a power of two.
        pow2: bool,
    },
    /// FP8 blocks (SPEC section 3b): one f32 scale per `block` consecutive
    /// elements along the reduction axis; with `tile`, a weight shares one
    /// scale per `block` x `block` tile, stored replicated per 1 x `block`.
    Block {
        /// Elements per block along the reduction axis ([`FP8_BLOCK`]).
        block: u32,
        /// Share one scale per `block` x `block` tile (weights only).
        tile: bool,
        /// Round every scale down to a power of two.
        pow2: bool,
    },
}

impl Scaling {
    /// Bytes of scale per element (SPEC section 4a): an E8M0 byte per MX
    /// block, an E4M3FN byte per NVFP4 block, and two f32 (the scale and
    /// its inverse, as section 3b's `nbytes` counts them) per FP8 block.
    /// Scales whose number does not grow with the elements are counted as
    /// nothing per element: a tensorwise scale, NVFP4's tensor scale, and
    /// the two f32 of each row of a rowwise operand (one pair per
    /// reduction-axis length of elements, so its share depends on the shape).
    pub fn scale_bytes_per_element(&self) -> f64 {
        match self {
            Scaling::None | Scaling::Tensorwise { .. } | Scaling::Rowwise { .. } => 0.0,
            Scaling::Mx { block, .. } | Scaling::Nvfp4 { block, .. } => 1.0 / *block as f64,
            Scaling::Block { block, .. } => 8.0 / *block as f64,
        }
    }

    /// Whether the scales share one per tile of a weight.
    pub const fn tiled(&self) -> bool {
        matches!(self.tile(), Some(true))
    }

    /// The tile flag, where the scaling has tiles (the `tile2d` option).
    /// Exhaustive, so a new scaling must say whether it has one.
    pub const fn tile(&self) -> Option<bool> {
        match *self {
            Scaling::Mx { tile, .. }
            | Scaling::Nvfp4 { tile, .. }
            | Scaling::Block { tile, .. } => Some(tile),
            Scaling::None | Scaling::Tensorwise { .. } | Scaling::Rowwise { .. } => None,
        }
    }

    /// The tile flag to set, where the scaling has tiles.
    pub fn tile_mut(&mut self) -> Option<&mut bool> {
        match self {
            Scaling::Mx { tile, .. }
            | Scaling::Nvfp4 { tile, .. }
            | Scaling::Block { tile, .. } => Some(tile),
            Scaling::None | Scaling::Tensorwise { .. } | Scaling::Rowwise { .. } => None,
        }
    }

    /// The power-of-two flag, where the scaling has f32 scales that may be
    /// rounded (the `pow2` option). Exhaustive, as [`Scaling::tile`].
    pub const fn pow2(&self) -> Option<bool> {
        match *self {
            Scaling::Tensorwise { pow2 }
            | Scaling::Rowwise { pow2 }
            | Scaling::Block { pow2, .. } => Some(pow2),
            Scaling::None | Scaling::Mx { .. } | Scaling::Nvfp4 { .. } => None,
        }
    }

    /// The power-of-two flag to set, where the scaling has one.
    pub fn pow2_mut(&mut self) -> Option<&mut bool> {
        match self {
            Scaling::Tensorwise { pow2 }
            | Scaling::Rowwise { pow2 }
            | Scaling::Block { pow2, .. } => Some(pow2),
            Scaling::None | Scaling::Mx { .. } | Scaling::Nvfp4 { .. } => None,
        }
    }

    /// The MX scale mode to set, where the scaling has one (the `scale` option).
    pub fn mode_mut(&mut self) -> Option<&mut ScaleMode> {
        match self {
            Scaling::Mx { mode, .. } => Some(mode),
            Scaling::None
            | Scaling::Tensorwise { .. }
            | Scaling::Nvfp4 { .. }
            | Scaling::Rowwise { .. }
            | Scaling::Block { .. } => None,
        }
    }
}

/// How one GEMM operand is quantized, along that GEMM's reduction axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OperandSpec {
    /// The element format of the codes (`Bf16` when not quantized).
    pub elem: Elem,
    /// How the scales are laid out.
    pub scaling: Scaling,
    /// Hadamard-16 rotation before the amax (SPEC section 2); set on both
    /// operands of a GEMM or on neither, so that it cancels.
    pub hadamard: bool,
    /// Stochastic rounding of the elements (gradients only, SPEC sections
    /// 2 and 2b: MX and NVFP4 operands).
    pub sr: bool,
}

impl OperandSpec {
    /// An unquantized BF16 operand.
    pub const BF16: OperandSpec = OperandSpec {
        elem: Elem::Bf16,
        scaling: Scaling::None,
        hadamard: false,
        sr: false,
    };

    /// Whether the operand is quantized at all (else it is BF16).
    pub const fn is_quantized(&self) -> bool {
        !matches!(self.scaling, Scaling::None)
    }

    /// Bytes per element in this form: the codes plus their share of the scales.
    pub fn bytes_per_element(&self) -> f64 {
        self.elem.bits() as f64 / 8.0 + self.scaling.scale_bytes_per_element()
    }
}

/// The three GEMMs of a linear y = x W^T + b, x `[M, K]`, W `[N, K]`, dy `[M, N]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Gemm {
    /// y = x W^T, reduction over K.
    Fprop,
    /// dx = dy W, reduction over N.
    Dgrad,
    /// dW = dy^T x, reduction over M.
    Wgrad,
}

/// The tensors a linear's GEMMs read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operand {
    /// The activation x `[M, K]`.
    X,
    /// The weight W `[N, K]`.
    W,
    /// The output gradient dy `[M, N]`.
    Dy,
}

impl Gemm {
    /// The three GEMMs in the order fprop, dgrad, wgrad.
    pub const ALL: [Gemm; 3] = [Gemm::Fprop, Gemm::Dgrad, Gemm::Wgrad];

    /// The option key that overrides this GEMM's recipe (SPEC section 4a).
    pub const fn name(self) -> &'static str {
        match self {
            Gemm::Fprop => "fprop",
            Gemm::Dgrad => "dgrad",
            Gemm::Wgrad => "wgrad",
        }
    }

    /// Operands `a` and `b` of [`GemmSpec`].
    pub const fn operands(self) -> [Operand; 2] {
        match self {
            Gemm::Fprop => [Operand::X, Operand::W],
            Gemm::Dgrad => [Operand::Dy, Operand::W],
            Gemm::Wgrad => [Operand::Dy, Operand::X],
        }
    }
}

impl fmt::Display for Gemm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Both operands of one GEMM, each quantized along that GEMM's reduction
/// axis: fprop (a = x, b = W) along K; dgrad (a = dy, b = W) along N; wgrad
/// (a = dy, b = x) along M.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmSpec {
    /// The left operand (x in fprop, dy in dgrad and wgrad).
    pub a: OperandSpec,
    /// The right operand (W in fprop and dgrad, x in wgrad).
    pub b: OperandSpec,
}

impl GemmSpec {
    /// Whether neither operand is quantized (a BF16 GEMM).
    pub const fn is_bf16(&self) -> bool {
        !self.a.is_quantized() && !self.b.is_quantized()
    }
}

/// A recipe resolved to its three GEMMs (SPEC section 4a): two recipes are
/// equal when these are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LinearSpec {
    /// The forward GEMM y = x W^T.
    pub fprop: GemmSpec,
    /// The input-gradient GEMM dx = dy W.
    pub dgrad: GemmSpec,
    /// The weight-gradient GEMM dW = dy^T x.
    pub wgrad: GemmSpec,
}

/// What a linear's forward keeps for its backward (SPEC section 4a).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SavedSpec {
    /// x in the form wgrad reads it (BF16 when wgrad is a BF16 GEMM).
    pub x: OperandSpec,
    /// W in the form dgrad reads it; `None` when dgrad reads the master
    /// weight again (a BF16 dgrad).
    pub w: Option<OperandSpec>,
}

impl SavedSpec {
    /// Bytes per saved element of x and of W (W: 0 when nothing is saved).
    pub fn bytes_per_element(&self) -> (f64, f64) {
        (
            self.x.bytes_per_element(),
            self.w.map_or(0.0, |w| w.bytes_per_element()),
        )
    }
}

impl LinearSpec {
    /// The spec of GEMM `g`.
    pub const fn gemm(&self, g: Gemm) -> &GemmSpec {
        match g {
            Gemm::Fprop => &self.fprop,
            Gemm::Dgrad => &self.dgrad,
            Gemm::Wgrad => &self.wgrad,
        }
    }

    /// The spec of GEMM `g`, to change (e.g. to apply an override).
    pub fn gemm_mut(&mut self, g: Gemm) -> &mut GemmSpec {
        match g {
            Gemm::Fprop => &mut self.fprop,
            Gemm::Dgrad => &mut self.dgrad,
            Gemm::Wgrad => &mut self.wgrad,
        }
    }

    /// Saved for backward: wgrad's x (`wgrad.b`) and dgrad's W (`dgrad.b`),
    /// each as its own GEMM quantizes it; a BF16 dgrad saves nothing for W.
    pub fn saved(&self) -> SavedSpec {
        SavedSpec {
            x: self.wgrad.b,
            w: self.dgrad.b.is_quantized().then_some(self.dgrad.b),
        }
    }

    /// Bytes per saved element, SPEC section 4's figure (`mxfp4` 0.53125,
    /// `fp8` 1.0, `mxfp8` 1.03125, `bf16` 2.0, `nvfp4` 0.5625, `fp8_rowwise`
    /// 1.0 and `fp8_block` 1.0625; see [`Scaling::scale_bytes_per_element`]
    /// for which scales count). Where x and W are saved in
    /// forms of different sizes (`mxfp4(wgrad = bf16)`) the true average
    /// depends on their shapes, so this is the larger of the two, an upper
    /// bound; [`Self::saved`] gives each.
    pub fn saved_bytes_per_element(&self) -> f64 {
        let (x, w) = self.saved().bytes_per_element();
        x.max(w)
    }
}
