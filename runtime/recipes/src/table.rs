//! The recipe table (SPEC section 4): one row per named recipe, giving the
//! operand specs of its three GEMMs under its default options and the
//! option keys it takes. Names, defaults, which options apply and
//! [`crate::Recipe::spec`] all derive from these rows; a new recipe is a new
//! row (and a [`RecipeKind`] variant to name it).

use std::fmt;

use crate::error::{did_you_mean, find, lookup, named, RecipeError};
use crate::spec::{
    Elem, GemmSpec, LinearSpec, OperandSpec, ScaleMode, Scaling, FP8_BLOCK, MX_BLOCK, NVFP4_BLOCK,
};

/// The named recipes; each is one row of [`TABLE`], in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecipeKind {
    /// `bf16`: BF16 operands everywhere.
    Bf16,
    /// `fp8`: tensorwise FP8, E4M3 forward operands, E5M2 gradients.
    Fp8,
    /// `fp8_fnuz`: as `fp8` with the gfx942 FNUZ formats.
    Fp8Fnuz,
    /// `mxfp4`: MX E2M1 blocks, EVEN scales, weight tiles, Hadamard on wgrad.
    Mxfp4,
    /// `mxfp8`: MX E4M3 blocks, RCEIL scales.
    Mxfp8,
    /// `nvfp4`: the `mxfp4` table with NVFP4 operands (1x16 blocks, E4M3
    /// block scales under an f32 tensor scale), gradients stochastically rounded.
    Nvfp4,
    /// `fp8_rowwise`: E4M3 everywhere, one power-of-two scale per row along
    /// each GEMM's reduction axis.
    Fp8Rowwise,
    /// `fp8_block`: E4M3 everywhere, 1x128 blocks for x and dy, 128x128
    /// tiles for W.
    Fp8Block,
}

/// A recipe option key of SPEC sections 4 and 4a.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Opt {
    /// `scale = floor|ceil|even|rceil`: the scale mode of every MX operand.
    Scale,
    /// `sr = bool`: stochastic rounding of the gradient operands (dy of
    /// dgrad and of wgrad).
    Sr,
    /// `hadamard = bool`: Hadamard-16 on both wgrad operands.
    Hadamard,
    /// `tile2d = bool`: block x block tiles for the weight operands (W of
    /// fprop and of dgrad).
    Tile2d,
    /// `pow2 = bool`: power-of-two FP8 scales (tensorwise, rowwise or per block).
    Pow2,
    /// `fprop = <recipe>`: the forward GEMM quantized as that recipe's row.
    Fprop,
    /// `dgrad = <recipe>`: the input-gradient GEMM as that recipe's row.
    Dgrad,
    /// `wgrad = <recipe>`: the weight-gradient GEMM as that recipe's row.
    Wgrad,
}

/// What an option's value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Takes {
    /// `true` or `false`.
    Bool,
    /// One of [`ScaleMode::ALL`], by name.
    Scale,
    /// A bare recipe name (that recipe's default options).
    Recipe,
}

impl Opt {
    /// Every key, in the order the docs, `Display` and error messages list them.
    pub const ALL: [Opt; 8] = [
        Opt::Scale,
        Opt::Sr,
        Opt::Hadamard,
        Opt::Tile2d,
        Opt::Pow2,
        Opt::Fprop,
        Opt::Dgrad,
        Opt::Wgrad,
    ];

    /// The per-GEMM keys, which every recipe takes (SPEC section 4a).
    pub const GEMMS: [Opt; 3] = [Opt::Fprop, Opt::Dgrad, Opt::Wgrad];

    /// The key as it is written (`scale`, `sr`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Opt::Scale => "scale",
            Opt::Sr => "sr",
            Opt::Hadamard => "hadamard",
            Opt::Tile2d => "tile2d",
            Opt::Pow2 => "pow2",
            Opt::Fprop => "fprop",
            Opt::Dgrad => "dgrad",
            Opt::Wgrad => "wgrad",
        }
    }

    /// What kind of value the key takes.
    pub const fn takes(self) -> Takes {
        match self {
            Opt::Scale => Takes::Scale,
            Opt::Sr | Opt::Hadamard | Opt::Tile2d | Opt::Pow2 => Takes::Bool,
            Opt::Fprop | Opt::Dgrad | Opt::Wgrad => Takes::Recipe,
        }
    }

    /// Look a key up by name, suggesting the closest on a typo.
    pub fn from_name(name: &str) -> Result<Opt, RecipeError> {
        find(name).ok_or_else(|| {
            RecipeError::new(format!(
                "unknown recipe option `{name}`{}",
                did_you_mean(name, Opt::ALL.map(Opt::name))
            ))
        })
    }

    /// Whether recipe `kind` takes this key.
    pub fn applies_to(self, kind: RecipeKind) -> bool {
        Opt::GEMMS.contains(&self) || kind.row().options.contains(&self)
    }
}

impl fmt::Display for Opt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One row of the table.
#[derive(Debug)]
pub struct Row {
    /// The recipe this row defines; rows are in `RecipeKind` order.
    pub kind: RecipeKind,
    /// The SPEC name, as the attribute, RON files and the command line spell it.
    pub name: &'static str,
    /// One line for docs and `--help`.
    pub doc: &'static str,
    /// The three GEMMs under the default options.
    pub spec: LinearSpec,
    /// The options it takes besides the per-GEMM keys; their defaults are
    /// read off `spec`.
    pub options: &'static [Opt],
}

/// MX operand with 1 x [`MX_BLOCK`] blocks along the reduction axis.
const fn mx(elem: Elem, mode: ScaleMode) -> OperandSpec {
    OperandSpec {
        elem,
        scaling: Scaling::Mx {
            block: MX_BLOCK,
            mode,
            tile: false,
        },
        hadamard: false,
        sr: false,
    }
}

/// A weight operand in block x block tiles (MX, NVFP4 or FP8 blocks).
const fn tiled(op: OperandSpec) -> OperandSpec {
    let scaling = match op.scaling {
        Scaling::Mx { block, mode, .. } => Scaling::Mx {
            block,
            mode,
            tile: true,
        },
        Scaling::Nvfp4 { block, .. } => Scaling::Nvfp4 { block, tile: true },
        Scaling::Block { block, pow2, .. } => Scaling::Block {
            block,
            tile: true,
            pow2,
        },
        // These scalings have no tiles to share.
        other @ (Scaling::None | Scaling::Tensorwise { .. } | Scaling::Rowwise { .. }) => other,
    };
    OperandSpec { scaling, ..op }
}

/// An operand rotated by Hadamard-16 first.
const fn rotated(op: OperandSpec) -> OperandSpec {
    OperandSpec {
        hadamard: true,
        ..op
    }
}

/// NVFP4 operand (E2M1) with 1 x [`NVFP4_BLOCK`] blocks along the reduction axis.
const fn nvfp4() -> OperandSpec {
    OperandSpec {
        elem: Elem::E2M1,
        scaling: Scaling::Nvfp4 {
            block: NVFP4_BLOCK,
            tile: false,
        },
        hadamard: false,
        sr: false,
    }
}

/// A gradient operand, stochastically rounded.
const fn rounded(op: OperandSpec) -> OperandSpec {
    OperandSpec { sr: true, ..op }
}

/// An E4M3 operand with one f32 scale per row along the reduction axis,
/// rounded to a power of two.
const fn rowwise() -> OperandSpec {
    OperandSpec {
        elem: Elem::E4M3,
        scaling: Scaling::Rowwise { pow2: true },
        hadamard: false,
        sr: false,
    }
}

/// An E4M3 operand with one f32 scale per 1 x [`FP8_BLOCK`] block along the
/// reduction axis, not rounded to a power of two.
const fn block() -> OperandSpec {
    OperandSpec {
        elem: Elem::E4M3,
        scaling: Scaling::Block {
            block: FP8_BLOCK,
            tile: false,
            pow2: false,
        },
        hadamard: false,
        sr: false,
    }
}

/// An FP8 operand with one f32 scale per tensor, not rounded to a power of two.
const fn tensorwise(elem: Elem) -> OperandSpec {
    OperandSpec {
        elem,
        scaling: Scaling::Tensorwise { pow2: false },
        hadamard: false,
        sr: false,
    }
}

/// A row from its GEMMs, each `[a, b]`: fprop `[x, W]`, dgrad `[dy, W]`, wgrad `[dy, x]`.
const fn row(
    kind: RecipeKind,
    name: &'static str,
    [fx, fw]: [OperandSpec; 2],
    [ddy, dw]: [OperandSpec; 2],
    [wdy, wx]: [OperandSpec; 2],
    options: &'static [Opt],
    doc: &'static str,
) -> Row {
    Row {
        kind,
        name,
        doc,
        spec: LinearSpec {
            fprop: GemmSpec { a: fx, b: fw },
            dgrad: GemmSpec { a: ddy, b: dw },
            wgrad: GemmSpec { a: wdy, b: wx },
        },
        options,
    }
}

const BF16: OperandSpec = OperandSpec::BF16;
const MX4: OperandSpec = mx(Elem::E2M1, ScaleMode::Even);
const MX8: OperandSpec = mx(Elem::E4M3, ScaleMode::Rceil);
const MX_OPTIONS: &[Opt] = &[Opt::Scale, Opt::Sr, Opt::Hadamard, Opt::Tile2d];
const FP8_OPTIONS: &[Opt] = &[Opt::Pow2];
const NV4: OperandSpec = nvfp4();
const NVFP4_OPTIONS: &[Opt] = &[Opt::Sr, Opt::Hadamard, Opt::Tile2d];
const ROW8: OperandSpec = rowwise();
const BLOCK8: OperandSpec = block();
const FP8_BLOCK_OPTIONS: &[Opt] = &[Opt::Tile2d, Opt::Pow2];

/// The eight recipes of SPEC section 4. Columns: fprop `[x, W]`, dgrad
/// `[dy, W]`, wgrad `[dy, x]`, the options taken.
#[rustfmt::skip]
pub const TABLE: [Row; 8] = [
    row(RecipeKind::Bf16, "bf16",
        [BF16, BF16], [BF16, BF16], [BF16, BF16], &[],
        "BF16 operands, f32 accumulation"),
    row(RecipeKind::Fp8, "fp8",
        [tensorwise(Elem::E4M3), tensorwise(Elem::E4M3)],
        [tensorwise(Elem::E5M2), tensorwise(Elem::E4M3)],
        [tensorwise(Elem::E5M2), tensorwise(Elem::E4M3)], FP8_OPTIONS,
        "tensorwise FP8: E4M3 forward operands, E5M2 gradients"),
    row(RecipeKind::Fp8Fnuz, "fp8_fnuz",
        [tensorwise(Elem::E4M3Fnuz), tensorwise(Elem::E4M3Fnuz)],
        [tensorwise(Elem::E5M2Fnuz), tensorwise(Elem::E4M3Fnuz)],
        [tensorwise(Elem::E5M2Fnuz), tensorwise(Elem::E4M3Fnuz)], FP8_OPTIONS,
        "as fp8 with the gfx942 FNUZ variants"),
    row(RecipeKind::Mxfp4, "mxfp4",
        [MX4, tiled(MX4)], [MX4, tiled(MX4)], [rotated(MX4), rotated(MX4)], MX_OPTIONS,
        "MXFP4: E2M1 in 1x32 blocks, EVEN scales, 32x32 weight tiles, Hadamard on wgrad"),
    row(RecipeKind::Mxfp8, "mxfp8",
        [MX8, MX8], [MX8, MX8], [MX8, MX8], MX_OPTIONS,
        "MXFP8: E4M3 in 1x32 blocks, RCEIL scales, no tiles, no Hadamard"),
    row(RecipeKind::Nvfp4, "nvfp4",
        [NV4, tiled(NV4)], [rounded(NV4), tiled(NV4)],
        [rounded(rotated(NV4)), rotated(NV4)], NVFP4_OPTIONS,
        "NVFP4: E2M1 in 1x16 blocks under E4M3 and f32 scales, 16x16 weight tiles, \
         Hadamard on wgrad, stochastic rounding of gradients"),
    row(RecipeKind::Fp8Rowwise, "fp8_rowwise",
        [ROW8, ROW8], [ROW8, ROW8], [ROW8, ROW8], FP8_OPTIONS,
        "FP8 rowwise: E4M3 with one power-of-two scale per row along the reduction axis"),
    row(RecipeKind::Fp8Block, "fp8_block",
        [BLOCK8, tiled(BLOCK8)], [BLOCK8, tiled(BLOCK8)], [BLOCK8, BLOCK8], FP8_BLOCK_OPTIONS,
        "FP8 128-block: E4M3 in 1x128 blocks for x and dy, 128x128 weight tiles"),
];

impl RecipeKind {
    /// Every recipe, in table order.
    pub const ALL: [RecipeKind; TABLE.len()] = {
        let mut all = [RecipeKind::Bf16; TABLE.len()];
        let mut i = 0;
        while i < TABLE.len() {
            all[i] = TABLE[i].kind;
            i += 1;
        }
        all
    };

    /// This recipe's row of [`TABLE`].
    pub const fn row(self) -> &'static Row {
        &TABLE[self as usize]
    }

    /// The SPEC name (`bf16`, `fp8`, `fp8_fnuz`, `mxfp4`, `mxfp8`, `nvfp4`,
    /// `fp8_rowwise`, `fp8_block`).
    pub const fn name(self) -> &'static str {
        self.row().name
    }

    /// Look a recipe up by its SPEC name, suggesting the closest on a typo.
    pub fn from_name(name: &str) -> Result<Self, RecipeError> {
        lookup(name)
    }

    /// The keys this recipe takes, in [`Opt::ALL`] order.
    pub fn options(self) -> impl Iterator<Item = Opt> {
        Opt::ALL.into_iter().filter(move |o| o.applies_to(self))
    }
}

named!(RecipeKind, "recipe");

named!(Opt, "recipe option");

impl fmt::Display for RecipeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_in_kind_order_with_distinct_names() {
        for (i, row) in TABLE.iter().enumerate() {
            assert_eq!(row.kind as usize, i, "row {}", row.name);
            assert_eq!(RecipeKind::from_name(row.name).unwrap(), row.kind);
        }
        let mut names: Vec<&str> = TABLE.iter().map(|r| r.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TABLE.len());
    }

    #[test]
    fn unknown_names_suggest_the_closest() {
        let e = RecipeKind::from_name("mxfp5").unwrap_err().message;
        assert_eq!(e, "unknown recipe `mxfp5`; did you mean `mxfp4`?");
        let e = RecipeKind::from_name("int8").unwrap_err().message;
        let names: Vec<&str> = TABLE.iter().map(|r| r.name).collect();
        assert!(names.starts_with(&["bf16", "fp8", "fp8_fnuz", "mxfp4", "mxfp8"]));
        assert_eq!(
            e,
            format!(
                "unknown recipe `int8`; expected one of {}",
                names.join(", ")
            )
        );
        let e = Opt::from_name("sclae").unwrap_err().message;
        assert_eq!(e, "unknown recipe option `sclae`; did you mean `scale`?");
    }
}
