//! FP8 rowwise and 128-block scaling (SPEC section 3b): section 3's
//! tensorwise rule, scale = fl32(448 / max(amax, 1e-12)) (optionally rounded
//! down to a power of two) and q = satfinite(RNE(fl32(x * scale))), applied
//! per group instead of per tensor. The element is always E4M3FN.
//!
//! The layout is the MX quantizer's axis-last view (`mx.rs`): `rows` rows of
//! `len` elements along the quantization axis.
//! - Rowwise: one group per row, so `[rows, 1]` scales and `[rows, len]`
//!   codes (no padding).
//! - 128-block: each row zero-padded to `padded_len` = ceil(len / 128) * 128,
//!   `[rows, padded_len]` codes (padding codes 0) and `[rows, padded_len /
//!   128]` scales; with `tile2d` (2-D tensors, weights) one scale per
//!   128 x 128 tile, stored for each of its 1 x 128 row-chunks. Zero padding
//!   never raises an amax.
//!
//! The steps, each one pass a kernel can mirror: the amax of every group
//! (`group_amaxes`), the tile reduction (`tile_amaxes`), the scale of each
//! group ([`amax_to_scale`], shared with the tensorwise quantizer) and its
//! inverse, then the elements. A group whose amax is NaN or Inf is an
//! [`Error::NonFiniteAmax`] naming the first such group.

use rayon::prelude::*;

use super::fp8::amax_to_scale;
use super::mx::{axis_last, block_amax, resolve_axis, split_shape, swap_last_two};
use crate::formats::{encode_rne, ElemFormat, MiniFloat};
use crate::simd::with_avx2;
use crate::{Error, Result};

/// Elements per group of the 128-block grouping, and the side of its
/// tiles: the recipe table's FP8 block.
pub const FP8_BLOCK: usize = mxswitch_recipes::FP8_BLOCK as usize;

/// The element format of every group-scaled FP8 tensor.
pub const FP8_GROUP_ELEM: ElemFormat = ElemFormat::E4M3FN;

const E4M3: MiniFloat = FP8_GROUP_ELEM.spec();

/// Which elements share a scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grouping {
    /// One scale per row of the axis-last view (all `len` elements along
    /// the quantization axis).
    Rowwise,
    /// One scale per 128 consecutive elements along the axis; with `tile2d`
    /// (2-D tensors only) one per 128 x 128 tile.
    Block128 {
        /// 128 x 128 tiles instead of 1 x 128 blocks.
        tile2d: bool,
    },
}

/// Everything that decides a group-scaled FP8 quantization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8GroupConfig {
    /// Which elements share a scale.
    pub grouping: Grouping,
    /// Round every scale down to a power of two.
    pub pow2: bool,
}

impl Fp8GroupConfig {
    /// `grouping` with its SPEC default: power-of-two scales for rowwise
    /// (torchao's `rowwise` recipe), exact scales for 128-blocks.
    pub const fn new(grouping: Grouping) -> Self {
        Fp8GroupConfig {
            grouping,
            pow2: matches!(grouping, Grouping::Rowwise),
        }
    }

    /// Rowwise scales, rounded down to powers of two.
    pub const fn rowwise() -> Self {
        Self::new(Grouping::Rowwise)
    }

    /// 1 x 128 blocks (activations and gradients), exact scales.
    pub const fn block128() -> Self {
        Self::new(Grouping::Block128 { tile2d: false })
    }

    /// 128 x 128 tiles (weights), exact scales.
    pub const fn block128_tiles() -> Self {
        Self::new(Grouping::Block128 { tile2d: true })
    }

    fn tile2d(&self) -> bool {
        matches!(self.grouping, Grouping::Block128 { tile2d: true })
    }

    /// The padded axis length and the elements per group for an axis of `len`.
    pub const fn layout(&self, len: usize) -> (usize, usize) {
        match self.grouping {
            Grouping::Rowwise => (len, len),
            Grouping::Block128 { .. } => (len.div_ceil(FP8_BLOCK) * FP8_BLOCK, FP8_BLOCK),
        }
    }
}

/// A group-scaled FP8 tensor, stored axis-last (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Fp8GroupTensor {
    /// Shape of the input tensor.
    pub shape: Vec<usize>,
    /// The quantization axis (non-negative).
    pub axis: usize,
    /// The settings it was quantized with.
    pub config: Fp8GroupConfig,
    /// Number of rows of the axis-last view (product of the other axes).
    pub rows: usize,
    /// Axis length before padding.
    pub len: usize,
    /// Axis length after padding: `len` for rowwise, a multiple of 128 for blocks.
    pub padded_len: usize,
    /// Elements per group: `len` for rowwise, 128 for blocks.
    pub group_len: usize,
    /// `[rows, padded_len]` E4M3FN codes; padding codes are 0.
    pub codes: Vec<u8>,
    /// `[rows, groups_per_row]` scales that multiplied the inputs (a tile's
    /// scale repeated for each of its row-chunks).
    pub scales: Vec<f32>,
    /// fl32(1 / scale) for each entry of `scales`: what decoded codes (or a
    /// GEMM's partial sums) are multiplied by.
    pub scale_inv: Vec<f32>,
}

/// Quantize `x` (row-major, `shape`) along `axis` (negative counts from the end).
pub fn quantize_fp8_groups(
    x: &[f32],
    shape: &[usize],
    axis: isize,
    cfg: &Fp8GroupConfig,
) -> Result<Fp8GroupTensor> {
    let axis = resolve_axis(axis, shape.len())?;
    let numel: usize = shape.iter().product();
    if numel != x.len() {
        return Err(Error::Shape(format!(
            "{} values do not fill shape {shape:?}",
            x.len()
        )));
    }
    if cfg.tile2d() && shape.len() != 2 {
        return Err(Error::InvalidOption(format!(
            "128x128 FP8 tiles need a 2-D tensor, got shape {shape:?}"
        )));
    }
    let (outer, len, inner) = split_shape(shape, axis);
    let rows = axis_last(x, shape, axis);
    quantize_view(&rows, outer * inner, len, shape, axis, cfg)
}

/// Quantize `rows` contiguous rows of `len` elements each (the axis-last view).
pub fn quantize_fp8_group_rows(
    x: &[f32],
    rows: usize,
    len: usize,
    cfg: &Fp8GroupConfig,
) -> Result<Fp8GroupTensor> {
    if x.len() != rows * len {
        return Err(Error::Shape(format!(
            "{} values do not fill {rows} rows of {len}",
            x.len()
        )));
    }
    quantize_view(x, rows, len, &[rows, len], 1, cfg)
}

/// The quantizer proper on the axis-last view; `shape` and `axis` are the
/// input's, for the result and for error messages.
fn quantize_view(
    x: &[f32],
    rows: usize,
    len: usize,
    shape: &[usize],
    axis: usize,
    cfg: &Fp8GroupConfig,
) -> Result<Fp8GroupTensor> {
    let (padded_len, group_len) = cfg.layout(len);
    let gpr = groups_per_row(cfg, padded_len);
    let amax = group_amaxes(x, rows, len, gpr, group_len);
    if let Some(g) = amax.iter().position(|a| !a.is_finite()) {
        let (row, col) = (g / gpr, (g % gpr) * group_len);
        let (what, tile) = match cfg.grouping {
            Grouping::Rowwise => ("rowwise", String::new()),
            Grouping::Block128 { tile2d: false } => ("1x128-block", String::new()),
            Grouping::Block128 { tile2d: true } => (
                "128x128-tile",
                format!(", in tile ({}, {})", row / FP8_BLOCK, g % gpr),
            ),
        };
        return Err(Error::NonFiniteAmax {
            tensor: format!(
                "FP8 {what} input of shape {shape:?} along axis {axis}, first in the group of \
                 row {row} of the axis-last view, elements {col}..{} of the axis{tile}",
                (col + group_len).min(len)
            ),
            amax: amax[g],
        });
    }
    let amax = if cfg.tile2d() {
        tile_amaxes(&amax, rows, gpr)
    } else {
        amax
    };
    let scales: Vec<f32> = amax
        .iter()
        .map(|&a| amax_to_scale(a, FP8_GROUP_ELEM, cfg.pow2))
        .collect();
    let scale_inv: Vec<f32> = scales.iter().map(|&s| 1.0 / s).collect();
    let mut codes = vec![0u8; rows * padded_len];
    encode_rows(x, len, padded_len, group_len, gpr, &scales, &mut codes);
    Ok(Fp8GroupTensor {
        shape: shape.to_vec(),
        axis,
        config: *cfg,
        rows,
        len,
        padded_len,
        group_len,
        codes,
        scales,
        scale_inv,
    })
}

/// Groups per row: 1 for rowwise (even when the axis is empty).
fn groups_per_row(cfg: &Fp8GroupConfig, padded_len: usize) -> usize {
    match cfg.grouping {
        Grouping::Rowwise => 1,
        Grouping::Block128 { .. } => padded_len / FP8_BLOCK,
    }
}

/// max |x| of every group, `[rows, gpr]`, over the real elements only (the
/// zero padding cannot raise a max of magnitudes). NaN if the group holds a
/// NaN, else Inf if it holds an Inf.
fn group_amaxes(x: &[f32], rows: usize, len: usize, gpr: usize, group_len: usize) -> Vec<f32> {
    (0..rows * gpr)
        .into_par_iter()
        .map(|g| {
            let (r, k) = (g / gpr, g % gpr);
            let c0 = k * group_len;
            let c1 = (c0 + group_len).min(len);
            block_amax(&x[r * len + c0..r * len + c1])
        })
        .collect()
}

/// The amax of each 128 x 128 tile (the largest of its blocks'), repeated
/// over the tile's rows so it lines up with the 1 x 128 layout. The grid
/// starts at (0, 0); the last tile may have fewer rows.
fn tile_amaxes(amax: &[f32], rows: usize, gpr: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; amax.len()];
    for row0 in (0..rows).step_by(FP8_BLOCK) {
        let row1 = (row0 + FP8_BLOCK).min(rows);
        for k in 0..gpr {
            let m = (row0..row1)
                .map(|r| amax[r * gpr + k].to_bits())
                .max()
                .unwrap_or(0);
            for r in row0..row1 {
                out[r * gpr + k] = f32::from_bits(m);
            }
        }
    }
    out
}

/// codes[r, c] = satfinite(RNE(fl32(x[r, c] * scale of its group))) for the
/// real elements; the padding keeps code 0.
fn encode_rows(
    x: &[f32],
    len: usize,
    padded_len: usize,
    group_len: usize,
    gpr: usize,
    scales: &[f32],
    codes: &mut [u8],
) {
    if len == 0 {
        return;
    }
    codes
        .par_chunks_mut(padded_len)
        .zip(x.par_chunks(len))
        .zip(scales.par_chunks(gpr))
        .for_each(|((out, src), sc)| {
            with_avx2(
                #[inline(always)]
                || {
                    for ((out, src), &s) in
                        out.chunks_mut(group_len).zip(src.chunks(group_len)).zip(sc)
                    {
                        for (c, &v) in out.iter_mut().zip(src) {
                            *c = encode_rne(E4M3, v * s);
                        }
                    }
                },
            )
        });
}

impl Fp8GroupTensor {
    /// Scales per row of the axis-last view: 1 (rowwise) or padded_len / 128.
    pub fn groups_per_row(&self) -> usize {
        groups_per_row(&self.config, self.padded_len)
    }

    /// The dequantized values as stored, decode(code) * scale_inv of its
    /// group: `[rows, padded_len]` (padding dequantizes to 0).
    pub fn dequantize_rows(&self) -> Vec<f32> {
        let table = FP8_GROUP_ELEM.decode_table();
        let mut out = vec![0.0f32; self.rows * self.padded_len];
        if self.padded_len == 0 {
            return out;
        }
        let gpr = self.groups_per_row();
        out.par_chunks_mut(self.padded_len)
            .zip(self.codes.par_chunks(self.padded_len))
            .zip(self.scale_inv.par_chunks(gpr))
            .for_each(|((o, c), inv)| {
                for ((o, c), &inv) in o
                    .chunks_mut(self.group_len)
                    .zip(c.chunks(self.group_len))
                    .zip(inv)
                {
                    for (o, &c) in o.iter_mut().zip(c) {
                        *o = table[c as usize] * inv;
                    }
                }
            });
        out
    }

    /// The dequantized tensor in the input's shape (padding dropped).
    pub fn dequantize(&self) -> Vec<f32> {
        let rows = self.dequantize_rows();
        let unpadded = if self.len == self.padded_len {
            rows
        } else {
            let mut u = Vec::with_capacity(self.rows * self.len);
            for r in rows.chunks(self.padded_len).take(self.rows) {
                u.extend_from_slice(&r[..self.len]);
            }
            u
        };
        let (outer, len, inner) = split_shape(&self.shape, self.axis);
        if inner == 1 {
            unpadded
        } else {
            swap_last_two(&unpadded, outer, inner, len)
        }
    }

    /// Shape of [`Fp8GroupTensor::codes_in_input_layout`]: the input shape
    /// with the axis padded (128-blocks only).
    pub fn codes_shape(&self) -> Vec<usize> {
        let mut s = self.shape.clone();
        s[self.axis] = self.padded_len;
        s
    }

    /// Shape of [`Fp8GroupTensor::scales_in_input_layout`]: the axis length
    /// becomes 1 (rowwise) or ceil(L / 128).
    pub fn scales_shape(&self) -> Vec<usize> {
        let mut s = self.shape.clone();
        s[self.axis] = self.groups_per_row();
        s
    }

    /// The codes laid out like the input (the axis back in its place).
    pub fn codes_in_input_layout(&self) -> Vec<u8> {
        self.to_input_layout(&self.codes, self.padded_len)
    }

    /// The scales laid out like the input.
    pub fn scales_in_input_layout(&self) -> Vec<f32> {
        self.to_input_layout(&self.scales, self.groups_per_row())
    }

    /// The inverse scales laid out like the input.
    pub fn scale_inv_in_input_layout(&self) -> Vec<f32> {
        self.to_input_layout(&self.scale_inv, self.groups_per_row())
    }

    fn to_input_layout<T: Copy + Default + Send + Sync>(&self, v: &[T], axis_len: usize) -> Vec<T> {
        let (outer, _, inner) = split_shape(&self.shape, self.axis);
        if inner == 1 {
            v.to_vec()
        } else {
            swap_last_two(v, outer, inner, axis_len)
        }
    }

    /// Bytes held: one per code plus, per group, the two f32 (scale and
    /// inverse), as [`super::Fp8Tensor::nbytes`] counts its two scalars.
    pub fn nbytes(&self) -> usize {
        self.codes.len() + 8 * self.scales.len()
    }

    /// Number of elements of `x` (the quantized input, in its own layout)
    /// whose scaled magnitude |fl32(v * scale)| exceeded 448 and was clipped.
    pub fn count_saturated(&self, x: &[f32]) -> usize {
        let rows = axis_last(x, &self.shape, self.axis);
        let (len, gpr, group_len) = (self.len, self.groups_per_row(), self.group_len);
        let max = FP8_GROUP_ELEM.max_value();
        if len == 0 {
            return 0;
        }
        rows.par_chunks(len)
            .zip(self.scales.par_chunks(gpr))
            .map(|(row, sc)| {
                row.chunks(group_len.max(1))
                    .zip(sc)
                    .map(|(g, &s)| g.iter().filter(|&&v| (v * s).abs() > max).count())
                    .sum::<usize>()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::module::SplitMix64;
    use crate::quant::fp8::quantize_tensorwise;

    fn gaussian(n: usize, seed: u64) -> Vec<f32> {
        let mut r = SplitMix64::new(seed);
        (0..n).map(|_| r.normal()).collect()
    }

    /// Values with a spread of magnitudes per row, a few outliers and zeros.
    fn data(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let u = ((i as u32).wrapping_mul(2_654_435_761) >> 8) as f32 / 16_777_216.0;
                let v = (u - 0.5) * (1 + i % 7) as f32 * (1 + (i / 50) % 5) as f32;
                match i % 31 {
                    0 => 30.0 * v,
                    3 => 0.0,
                    _ => v,
                }
            })
            .collect()
    }

    fn sqnr_db(x: &[f32], y: &[f32]) -> f64 {
        let s: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum();
        let n: f64 = x
            .iter()
            .zip(y)
            .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
            .sum();
        10.0 * (s / n).log10()
    }

    const CONFIGS: [Fp8GroupConfig; 5] = [
        Fp8GroupConfig::rowwise(),
        Fp8GroupConfig {
            pow2: false,
            ..Fp8GroupConfig::rowwise()
        },
        Fp8GroupConfig::block128(),
        Fp8GroupConfig {
            pow2: true,
            ..Fp8GroupConfig::block128()
        },
        Fp8GroupConfig::block128_tiles(),
    ];

    /// Every group equals section 3's tensorwise quantizer run on that group alone.
    #[test]
    fn each_group_is_the_tensorwise_quantizer_on_that_group() {
        for (rows, len) in [
            (1, 1),
            (3, 17),
            (2, 127),
            (2, 128),
            (3, 129),
            (4, 300),
            (2, 0),
        ] {
            let x = data(rows * len);
            for cfg in &CONFIGS[..4] {
                let q = quantize_fp8_group_rows(&x, rows, len, cfg).unwrap();
                let gpr = q.groups_per_row();
                assert_eq!(q.scales.len(), rows * gpr);
                for r in 0..rows {
                    for k in 0..gpr {
                        let c0 = k * q.group_len;
                        let c1 = (c0 + q.group_len).min(len);
                        let g = &x[r * len + c0..r * len + c1];
                        let want = quantize_tensorwise(
                            g,
                            &[g.len()],
                            ElemFormat::E4M3FN,
                            cfg.pow2,
                            "group",
                        )
                        .unwrap();
                        let ctx = format!("{cfg:?} {rows}x{len} row {r} group {k}");
                        assert_eq!(
                            q.scales[r * gpr + k].to_bits(),
                            want.scale.to_bits(),
                            "{ctx}"
                        );
                        assert_eq!(q.scale_inv[r * gpr + k].to_bits(), want.scale_inv.to_bits());
                        let p = r * q.padded_len;
                        assert_eq!(&q.codes[p + c0..p + c1], &want.codes[..], "{ctx}");
                    }
                    assert!(q.codes[r * q.padded_len + len..(r + 1) * q.padded_len]
                        .iter()
                        .all(|&c| c == 0));
                }
                assert_eq!(q.nbytes(), rows * q.padded_len + 8 * rows * gpr);
            }
        }
    }

    #[test]
    fn round_trip_on_awkward_shapes() {
        for (shape, axis) in [
            (vec![300], 0isize),
            (vec![3, 129], -1),
            (vec![129, 3], 0),
            (vec![2, 5, 130], 2),
            (vec![2, 130, 3], 1),
            (vec![4, 3, 2], 0),
        ] {
            let n: usize = shape.iter().product();
            let x = data(n);
            for cfg in &CONFIGS[..4] {
                let q = quantize_fp8_groups(&x, &shape, axis, cfg).unwrap();
                let d = q.dequantize();
                assert_eq!(d.len(), n);
                for (i, (&a, &b)) in x.iter().zip(&d).enumerate() {
                    // Half an E4M3 ulp relative, or half a subnormal step of the
                    // smallest group scale, with slack for fl32(1 / scale).
                    let inv = q.scale_inv.iter().fold(0.0f32, |m, &v| m.max(v));
                    let tol = (a.abs() * 0.0625).max(inv * 2f32.powi(-10)) * 1.0001;
                    assert!(
                        (a - b).abs() <= tol,
                        "{cfg:?} {shape:?} axis {axis} [{i}]: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn axis_0_equals_the_transpose_along_the_last_axis() {
        let (r, c) = (200, 3);
        let x = data(r * c);
        for cfg in &CONFIGS {
            let q = quantize_fp8_groups(&x, &[r, c], 0, cfg).unwrap();
            let xt = swap_last_two(&x, 1, r, c);
            let qt = quantize_fp8_groups(&xt, &[c, r], -1, cfg).unwrap();
            if !cfg.tile2d() {
                // Tiles run over the axis-last rows, which are the other
                // operand's columns: only the 1-D groupings coincide.
                assert_eq!(q.codes, qt.codes);
                assert_eq!(q.scales, qt.scales);
                assert_eq!(q.dequantize(), swap_last_two(&qt.dequantize(), 1, c, r));
            }
            let gpr = q.groups_per_row();
            assert_eq!(q.codes_shape(), vec![q.padded_len, c]);
            assert_eq!(q.scales_shape(), vec![gpr, c]);
            assert_eq!(
                q.codes_in_input_layout(),
                swap_last_two(&q.codes, 1, c, q.padded_len)
            );
            assert_eq!(
                q.scales_in_input_layout(),
                swap_last_two(&q.scales, 1, c, gpr)
            );
            assert_eq!(
                q.scale_inv_in_input_layout(),
                swap_last_two(&q.scale_inv, 1, c, gpr)
            );
        }
        // 3-D, the middle axis.
        let x = data(2 * 130 * 3);
        for cfg in &CONFIGS[..4] {
            let q = quantize_fp8_groups(&x, &[2, 130, 3], -2, cfg).unwrap();
            let xt = swap_last_two(&x, 2, 130, 3);
            let qt = quantize_fp8_groups(&xt, &[2, 3, 130], 2, cfg).unwrap();
            assert_eq!(q.codes, qt.codes);
            assert_eq!(q.scales, qt.scales);
            assert_eq!(q.dequantize(), swap_last_two(&qt.dequantize(), 2, 3, 130));
        }
        assert!(matches!(
            quantize_fp8_groups(&x, &[2, 130, 3], -4, &CONFIGS[0]),
            Err(Error::AxisOutOfRange { .. })
        ));
    }

    #[test]
    fn tiles_replicate_the_tile_scale() {
        let (rows, len) = (300, 260); // tile rows 128, 128, 44; block columns 3
        let mut x = data(rows * len);
        x[140 * len + 200] = 5000.0; // tile (1, 1) only
        let cfg = Fp8GroupConfig::block128_tiles();
        let q = quantize_fp8_groups(&x, &[rows, len], -1, &cfg).unwrap();
        let gpr = 3;
        assert_eq!(q.scales.len(), rows * gpr);
        for tr in 0..3 {
            let (r0, r1) = (tr * 128, (tr * 128 + 128).min(rows));
            for k in 0..gpr {
                let mut m = 0.0f32;
                for r in r0..r1 {
                    for c in k * 128..(k * 128 + 128).min(len) {
                        m = m.max(x[r * len + c].abs());
                    }
                }
                let want = amax_to_scale(m, ElemFormat::E4M3FN, false);
                for r in r0..r1 {
                    assert_eq!(q.scales[r * gpr + k], want, "tile {tr},{k} row {r}");
                }
            }
        }
        assert_eq!(q.scales[140 * gpr + 1], 448.0 / 5000.0);
        assert_eq!(q.scales[139 * gpr], q.scales[129 * gpr]);
        let err = quantize_fp8_groups(&x, &[1, rows, len], -1, &cfg).unwrap_err();
        assert!(err.to_string().contains("2-D"), "{err}");
        // Along axis 0 the tiles are the same 128 x 128 squares of the matrix.
        let q0 = quantize_fp8_groups(&x, &[rows, len], 0, &cfg).unwrap();
        let s0 = q0.scales_in_input_layout(); // [3, len]
        for r in 0..rows {
            for c in 0..len {
                assert_eq!(s0[(r / 128) * len + c], q.scales[r * gpr + c / 128]);
            }
        }
    }

    #[test]
    fn zero_padding_never_raises_an_amax() {
        // The last 1x128 block of a 129-row holds one tiny negative value.
        let mut x = vec![1.0f32; 129];
        x[128] = -1e-5;
        let q = quantize_fp8_group_rows(&x, 1, 129, &Fp8GroupConfig::block128()).unwrap();
        assert_eq!(q.scales[1], amax_to_scale(1e-5, ElemFormat::E4M3FN, false));
        assert_eq!(q.codes[128], 0xFE); // -448
                                        // All-zero rows: amax 0, scale 448 / 1e-12, codes keep the sign of zero.
        let z = [0.0f32, -0.0, 0.0];
        let q = quantize_fp8_group_rows(&z, 1, 3, &Fp8GroupConfig::rowwise()).unwrap();
        assert_eq!(q.scales[0], amax_to_scale(0.0, ElemFormat::E4M3FN, true));
        assert_eq!(q.codes, vec![0x00, 0x80, 0x00]);
    }

    #[test]
    fn non_finite_amax_is_refused_naming_the_group() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let (rows, len) = (3, 300);
            let mut x = data(rows * len);
            x[2 * len + 140] = bad;
            for (cfg, what) in [
                (Fp8GroupConfig::rowwise(), "elements 0..300"),
                (Fp8GroupConfig::block128(), "elements 128..256"),
                (Fp8GroupConfig::block128_tiles(), "tile (0, 1)"),
            ] {
                let err = quantize_fp8_groups(&x, &[rows, len], -1, &cfg).unwrap_err();
                let msg = err.to_string();
                assert!(matches!(err, Error::NonFiniteAmax { .. }), "{msg}");
                assert!(msg.contains("non-finite amax"), "{msg}");
                assert!(msg.contains("row 2") && msg.contains(what), "{msg}");
                assert!(!msg.contains('\n'), "{msg}");
            }
        }
    }

    /// Mean over rows of each row's SQNR in dB: what a row of small values
    /// loses under a scale set by another row's outlier.
    fn mean_row_sqnr_db(x: &[f32], y: &[f32], len: usize) -> f64 {
        let rows = x.len() / len;
        (0..rows)
            .map(|r| sqnr_db(&x[r * len..(r + 1) * len], &y[r * len..(r + 1) * len]))
            .sum::<f64>()
            / rows as f64
    }

    #[test]
    fn sqnr_on_gaussian_data_is_at_least_tensorwise() {
        let (rows, len) = (64, 1024);
        // i.i.d. N(0, 1): E4M3's precision is relative, so every grouping
        // ties with tensorwise, up to where the scale falls in its binade
        // (a few hundredths of a dB).
        let iid = gaussian(rows * len, 8);
        // Rows of magnitudes 2^-16 .. 2^14 and one outlier, as activations
        // have: one tensor scale pushes the small rows into E4M3's
        // subnormals (or to zero); a scale per group keeps each at 3 bits.
        let mut spread = gaussian(rows * len, 7);
        for (r, row) in spread.chunks_mut(len).enumerate() {
            let s = 2f32.powi(2 * (r % 16) as i32 - 16);
            row.iter_mut().for_each(|v| *v *= s);
        }
        spread[5 * len + 17] = 3e5;
        for (name, data) in [
            ("N(0,1)", &iid),
            ("N(0,1) rows scaled 2^-16..2^14 + outlier", &spread),
        ] {
            let mut line = format!("SQNR on {name} [{rows}, {len}], E4M3 (total / mean per row):");
            for pow2 in [false, true] {
                let tw = quantize_tensorwise(data, &[rows, len], ElemFormat::E4M3FN, pow2, "x")
                    .unwrap()
                    .dequantize();
                let (tw_db, tw_rows) = (sqnr_db(data, &tw), mean_row_sqnr_db(data, &tw, len));
                let p = if pow2 { " pow2" } else { "" };
                line += &format!(" tensorwise{p} {tw_db:.2}/{tw_rows:.2} dB");
                for (label, grouping) in [
                    ("rowwise", Grouping::Rowwise),
                    ("1x128", Grouping::Block128 { tile2d: false }),
                    ("128x128", Grouping::Block128 { tile2d: true }),
                ] {
                    let cfg = Fp8GroupConfig { grouping, pow2 };
                    let d = quantize_fp8_groups(data, &[rows, len], -1, &cfg)
                        .unwrap()
                        .dequantize();
                    let (db, db_rows) = (sqnr_db(data, &d), mean_row_sqnr_db(data, &d, len));
                    line += &format!(", {label}{p} {db:.2}/{db_rows:.2} dB");
                    let ctx = format!("{name} {label}{p}: {db} dB vs tensorwise {tw_db} dB");
                    assert!(db >= tw_db - 0.1, "{ctx}");
                    assert!(db_rows >= tw_rows - 0.1, "{ctx}");
                    if data == &spread && !cfg.tile2d() {
                        assert!(
                            db_rows > tw_rows + 10.0,
                            "{ctx}: per row {db_rows} vs {tw_rows}"
                        );
                    }
                }
                line += ";";
            }
            eprintln!("{line}");
        }
    }
}
