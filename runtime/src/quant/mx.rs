//! MX block quantization (SPEC section 2): 32 elements along the quantization
//! axis share one E8M0 power-of-two scale; elements are E2M1 (MXFP4, packed
//! two per byte, element 2i in the low nibble) or E4M3FN (MXFP8).
//!
//! The quantizer works on an axis-last view: the tensor is seen as `rows`
//! rows of `len` elements along the quantization axis, each zero-padded to
//! `padded_len` (a multiple of 32). In that layout the blocks are simply the
//! consecutive 32-element chunks of one flat buffer, which is also the
//! K-major operand layout a GEMM wants.

use std::borrow::Cow;

use rayon::prelude::*;

use super::hadamard::hadamard16_inplace;
use super::philox::SrKey;
use super::scale::{scale_byte, ScaleMode};
use crate::formats::{e8m0, encode_rne, encode_sr, ElemFormat, MiniFloat};
use crate::recipe::{mx_config, RecipeKind};
use crate::simd::with_avx2;
use crate::{Error, Result};

/// Elements per block, and the side of a 2-D tile: the recipe table's MX block.
pub const BLOCK: usize = mxswitch_recipes::MX_BLOCK as usize;

/// Blocks handled by one rayon task: large enough to amortise scheduling.
const BLOCKS_PER_TASK: usize = 2048;

/// Everything that decides an MX quantization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MxConfig {
    /// E2M1 (MXFP4) or E4M3FN (MXFP8).
    pub elem: ElemFormat,
    /// The rule choosing each block's E8M0 scale from its amax (SPEC section 2).
    pub scale_mode: ScaleMode,
    /// One scale per 32x32 tile of a 2-D tensor instead of per 1x32 block.
    pub tile2d: bool,
    /// Rotate each group of 16 along the axis by (1/4) H16 before quantizing.
    pub hadamard: bool,
    /// Stochastic rounding of the elements, keyed for reproducibility.
    pub sr: Option<SrKey>,
}

impl MxConfig {
    /// MXFP4 as the `mxfp4` recipe quantizes activations (its fprop x):
    /// 1x32 blocks with the table's default scale mode (EVEN).
    pub const fn mxfp4() -> Self {
        const X: MxConfig = activation_config(RecipeKind::Mxfp4);
        X
    }

    /// MXFP8 as the `mxfp8` recipe quantizes activations: E4M3 elements,
    /// 1x32 blocks, the table's default scale mode (RCEIL).
    pub const fn mxfp8() -> Self {
        const X: MxConfig = activation_config(RecipeKind::Mxfp8);
        X
    }

    fn validate(&self) -> Result<()> {
        match self.elem {
            ElemFormat::E2M1 | ElemFormat::E4M3FN => Ok(()),
            other => Err(Error::InvalidOption(format!(
                "MX blocks hold e2m1 or e4m3fn elements, not {other}"
            ))),
        }
    }

    /// Bytes of storage per element: codes plus one scale byte per block.
    pub fn bytes_per_element(&self) -> f64 {
        self.elem.bits() as f64 / 8.0 + 1.0 / BLOCK as f64
    }
}

/// The config of `kind`'s fprop x operand, read off the recipe table at
/// compile time (a row whose x is not MX fails the build).
const fn activation_config(kind: RecipeKind) -> MxConfig {
    match mx_config(&kind.row().spec.fprop.a) {
        Some(cfg) => cfg,
        None => panic!("the recipe's fprop x is not MX-quantized"),
    }
}

/// An MX-quantized tensor, stored axis-last (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct MxTensor {
    /// Shape of the input tensor.
    pub shape: Vec<usize>,
    /// The quantization axis (non-negative).
    pub axis: usize,
    /// The settings it was quantized with.
    pub config: MxConfig,
    /// Number of rows of the axis-last view (product of the other axes).
    pub rows: usize,
    /// Axis length before padding.
    pub len: usize,
    /// Axis length after padding to a multiple of 32.
    pub padded_len: usize,
    /// `[rows, padded_len]` codes; for E2M1 `[rows, padded_len / 2]` packed bytes.
    pub codes: Vec<u8>,
    /// `[rows, padded_len / 32]` E8M0 scale bytes.
    pub scales: Vec<u8>,
}

/// Resolve a possibly negative axis against a rank.
pub fn resolve_axis(axis: isize, rank: usize) -> Result<usize> {
    let r = rank as isize;
    if rank == 0 || axis >= r || axis < -r {
        return Err(Error::AxisOutOfRange { axis, rank });
    }
    Ok(if axis < 0 { axis + r } else { axis } as usize)
}

/// `len` rounded up to a multiple of 32.
pub fn padded(len: usize) -> usize {
    len.div_ceil(BLOCK) * BLOCK
}

/// `[outer, a, b]` -> `[outer, b, a]`: moves an axis to the end (or back).
pub fn swap_last_two<T: Copy + Default + Send + Sync>(
    x: &[T],
    outer: usize,
    a: usize,
    b: usize,
) -> Vec<T> {
    let mut out = vec![T::default(); x.len()];
    if x.is_empty() {
        return out;
    }
    out.par_chunks_mut(a * b)
        .zip(x.par_chunks(a * b))
        .for_each(|(o, src)| {
            for i in 0..a {
                for j in 0..b {
                    o[j * a + i] = src[i * b + j];
                }
            }
        });
    debug_assert_eq!(out.len(), outer * a * b);
    out
}

/// Split a shape around `axis` into (outer, len, inner).
pub(super) fn split_shape(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

/// `x` of `shape` with `axis` moved last: borrowed when it already is.
pub(super) fn axis_last<'a>(x: &'a [f32], shape: &[usize], axis: usize) -> Cow<'a, [f32]> {
    match split_shape(shape, axis) {
        (_, _, 1) => Cow::Borrowed(x),
        (outer, len, inner) => Cow::Owned(swap_last_two(x, outer, len, inner)),
    }
}

/// Quantize `x` (row-major, `shape`) along `axis` (negative counts from the end).
pub fn quantize_mx(x: &[f32], shape: &[usize], axis: isize, cfg: &MxConfig) -> Result<MxTensor> {
    cfg.validate()?;
    let axis = resolve_axis(axis, shape.len())?;
    let numel: usize = shape.iter().product();
    if numel != x.len() {
        return Err(Error::Shape(format!(
            "{} values do not fill shape {shape:?}",
            x.len()
        )));
    }
    if cfg.tile2d && shape.len() != 2 {
        return Err(Error::InvalidOption(format!(
            "32x32 tiles need a 2-D tensor, got shape {shape:?}"
        )));
    }
    let (outer, len, inner) = split_shape(shape, axis);
    let mut q = quantize_rows(&axis_last(x, shape, axis), outer * inner, len, cfg)?;
    q.shape = shape.to_vec();
    q.axis = axis;
    Ok(q)
}

/// Quantize `rows` contiguous rows of `len` elements each (the axis-last view).
pub fn quantize_rows(x: &[f32], rows: usize, len: usize, cfg: &MxConfig) -> Result<MxTensor> {
    cfg.validate()?;
    if x.len() != rows * len {
        return Err(Error::Shape(format!(
            "{} values do not fill {rows} rows of {len}",
            x.len()
        )));
    }
    let padded_len = padded(len);
    let data = prepare_rows(x, rows, len, padded_len, cfg.hadamard);
    let nblocks = rows * padded_len / BLOCK;
    let tile_bytes = cfg
        .tile2d
        .then(|| tile_scales(&data, rows, padded_len, cfg));
    let code_bytes_per_block = BLOCK * cfg.elem.bits() as usize / 8;
    let mut codes = vec![0u8; nblocks * code_bytes_per_block];
    let mut scales = vec![0u8; nblocks];
    encode_blocks(&data, tile_bytes.as_deref(), cfg, &mut codes, &mut scales);
    Ok(MxTensor {
        shape: vec![rows, len],
        axis: 1,
        config: *cfg,
        rows,
        len,
        padded_len,
        codes,
        scales,
    })
}

/// Zero-pad each row to `padded_len` and apply the Hadamard rotation if asked.
/// Borrows the input when there is nothing to do.
pub(super) fn prepare_rows(
    x: &[f32],
    rows: usize,
    len: usize,
    padded_len: usize,
    hadamard: bool,
) -> Cow<'_, [f32]> {
    if len == padded_len && !hadamard {
        return Cow::Borrowed(x);
    }
    let mut out = vec![0.0f32; rows * padded_len];
    if padded_len == 0 {
        return Cow::Owned(out);
    }
    out.par_chunks_mut(padded_len)
        .zip(x.par_chunks(len.max(1)))
        .for_each(|(o, src)| {
            o[..len].copy_from_slice(&src[..len]);
            if hadamard {
                hadamard16_inplace(o);
            }
        });
    Cow::Owned(out)
}

/// Block amax as f32: NaN if any element is NaN, Inf if any is Inf.
///
/// Works on the absolute-value bits as integers: every NaN sorts above Inf,
/// which sorts above every finite value, so one integer max does it all.
#[inline(always)]
pub(super) fn block_amax(block: &[f32]) -> f32 {
    let mut m = 0i32;
    for &v in block {
        m = m.max((v.to_bits() & 0x7FFF_FFFF) as i32);
    }
    f32::from_bits(m as u32)
}

/// One scale byte per 32x32 tile of a `[rows, padded_len]` matrix, repeated
/// over the tile's rows so it lines up with the 1x32 scale layout.
fn tile_scales(data: &[f32], rows: usize, padded_len: usize, cfg: &MxConfig) -> Vec<u8> {
    let nb = padded_len / BLOCK;
    let amax: Vec<f32> = data.par_chunks(BLOCK).map(block_amax).collect();
    let mut bytes = vec![0u8; rows * nb];
    for row0 in (0..rows).step_by(BLOCK) {
        let row1 = (row0 + BLOCK).min(rows);
        for b in 0..nb {
            let mut m = 0i32;
            for r in row0..row1 {
                m = m.max(amax[r * nb + b].to_bits() as i32);
            }
            let byte = scale_byte(cfg.scale_mode, f32::from_bits(m as u32), cfg.elem);
            for r in row0..row1 {
                bytes[r * nb + b] = byte;
            }
        }
    }
    bytes
}

/// Encode every block of `data`; `fixed` gives precomputed scale bytes (tiles).
fn encode_blocks(
    data: &[f32],
    fixed: Option<&[u8]>,
    cfg: &MxConfig,
    codes: &mut [u8],
    scales: &mut [u8],
) {
    // Monomorphise the element encoder so its constants fold into the loop.
    const E2M1: MiniFloat = ElemFormat::E2M1.spec();
    const E4M3: MiniFloat = ElemFormat::E4M3FN.spec();
    match (cfg.elem, cfg.sr) {
        (ElemFormat::E2M1, None) => {
            encode_blocks_with(data, fixed, cfg, codes, scales, |q, _| encode_rne(E2M1, q))
        }
        (ElemFormat::E2M1, Some(k)) => {
            encode_blocks_with(data, fixed, cfg, codes, scales, move |q, i| {
                encode_sr(E2M1, q, k.word(i))
            })
        }
        (_, None) => {
            encode_blocks_with(data, fixed, cfg, codes, scales, |q, _| encode_rne(E4M3, q))
        }
        (_, Some(k)) => encode_blocks_with(data, fixed, cfg, codes, scales, move |q, i| {
            encode_sr(E4M3, q, k.word(i))
        }),
    }
}

/// The block loop: amax, scale byte, then `q = x * 2^(127 - byte)` encoded
/// by `enc(q, element_index)`. Blocks with the NaN scale get zero codes.
fn encode_blocks_with<F>(
    data: &[f32],
    fixed: Option<&[u8]>,
    cfg: &MxConfig,
    codes: &mut [u8],
    scales: &mut [u8],
    enc: F,
) where
    F: Fn(f32, u64) -> u8 + Sync,
{
    let packed = cfg.elem == ElemFormat::E2M1;
    let cpb = if packed { BLOCK / 2 } else { BLOCK };
    let (mode, elem) = (cfg.scale_mode, cfg.elem);
    // One task: (task index, ((input blocks, code bytes), scale bytes)).
    type Task<'a> = (usize, ((&'a [f32], &'a mut [u8]), &'a mut [u8]));
    let task = |(t, ((src, out), sc)): Task| {
        with_avx2(
            #[inline(always)]
            || {
                for (i, (block, (out, s))) in src
                    .chunks_exact(BLOCK)
                    .zip(out.chunks_exact_mut(cpb).zip(sc.iter_mut()))
                    .enumerate()
                {
                    let b = t * BLOCKS_PER_TASK + i;
                    let byte = match fixed {
                        Some(f) => f[b],
                        None => scale_byte(mode, block_amax(block), elem),
                    };
                    *s = byte;
                    if byte == e8m0::NAN {
                        out.fill(0);
                        continue;
                    }
                    let recip = e8m0::reciprocal(byte);
                    let base = (b * BLOCK) as u64;
                    let mut c = [0u8; BLOCK];
                    for (j, (c, &x)) in c.iter_mut().zip(block).enumerate() {
                        *c = enc(x * recip, base + j as u64);
                    }
                    if packed {
                        for (o, pair) in out.iter_mut().zip(c.chunks_exact(2)) {
                            *o = pair[0] | (pair[1] << 4);
                        }
                    } else {
                        out.copy_from_slice(&c);
                    }
                }
            },
        )
    };
    data.par_chunks(BLOCKS_PER_TASK * BLOCK)
        .zip(codes.par_chunks_mut(BLOCKS_PER_TASK * cpb))
        .zip(scales.par_chunks_mut(BLOCKS_PER_TASK))
        .enumerate()
        .for_each(task);
}

impl MxTensor {
    /// The dequantized values as stored: `[rows, padded_len]`, in the rotated
    /// domain when the Hadamard option is on. This is the GEMM operand.
    pub fn dequantize_rows(&self) -> Vec<f32> {
        let table = self.config.elem.decode_table();
        let packed = self.config.elem == ElemFormat::E2M1;
        let cpb = if packed { BLOCK / 2 } else { BLOCK };
        let mut out = vec![0.0f32; self.rows * self.padded_len];
        out.par_chunks_mut(BLOCK)
            .zip(self.codes.par_chunks(cpb))
            .zip(self.scales.par_iter())
            .for_each(|((o, c), &byte)| {
                let s = e8m0::decode(byte);
                for (j, v) in o.iter_mut().enumerate() {
                    let code = if packed {
                        (c[j / 2] >> (4 * (j % 2))) & 0xF
                    } else {
                        c[j]
                    };
                    // A NaN scale dequantizes the whole block to NaN.
                    *v = table[code as usize] * s;
                }
            });
        out
    }

    /// The dequantized tensor in the input's shape: padding dropped and, with
    /// the Hadamard option, rotated back (the rotation is its own inverse).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut rows = self.dequantize_rows();
        if self.config.hadamard && self.padded_len > 0 {
            rows.par_chunks_mut(self.padded_len)
                .for_each(hadamard16_inplace);
        }
        let mut unpadded = Vec::with_capacity(self.rows * self.len);
        for r in rows.chunks(self.padded_len.max(1)).take(self.rows) {
            unpadded.extend_from_slice(&r[..self.len]);
        }
        let (outer, len, inner) = split_shape(&self.shape, self.axis);
        if inner == 1 {
            unpadded
        } else {
            swap_last_two(&unpadded, outer, inner, len)
        }
    }

    /// Shape of [`MxTensor::codes_in_input_layout`]: the input shape with the
    /// axis padded to a multiple of 32 (and halved for packed E2M1).
    pub fn codes_shape(&self) -> Vec<usize> {
        let mut s = self.shape.clone();
        s[self.axis] = self.padded_len * self.config.elem.bits() as usize / 8;
        s
    }

    /// Shape of [`MxTensor::scales_in_input_layout`]: the axis length L becomes ceil(L/32).
    pub fn scales_shape(&self) -> Vec<usize> {
        let mut s = self.shape.clone();
        s[self.axis] = self.padded_len / BLOCK;
        s
    }

    /// The codes laid out like the input (the axis back in its place).
    pub fn codes_in_input_layout(&self) -> Vec<u8> {
        self.to_input_layout(&self.codes, self.codes_shape()[self.axis])
    }

    /// The scale bytes laid out like the input.
    pub fn scales_in_input_layout(&self) -> Vec<u8> {
        self.to_input_layout(&self.scales, self.padded_len / BLOCK)
    }

    fn to_input_layout(&self, v: &[u8], axis_len: usize) -> Vec<u8> {
        let (outer, _, inner) = split_shape(&self.shape, self.axis);
        if inner == 1 {
            v.to_vec()
        } else {
            swap_last_two(v, outer, inner, axis_len)
        }
    }

    /// Number of elements of `x` (the quantized input, in its own layout)
    /// whose scaled magnitude exceeded the element format's largest value.
    /// Blocks with the NaN scale are not counted.
    pub fn count_saturated(&self, x: &[f32]) -> usize {
        let rows = axis_last(x, &self.shape, self.axis);
        let data = prepare_rows(
            &rows,
            self.rows,
            self.len,
            self.padded_len,
            self.config.hadamard,
        );
        let max = self.config.elem.max_value();
        data.par_chunks(BLOCK)
            .zip(self.scales.par_iter())
            .filter(|(_, &b)| b != e8m0::NAN)
            .map(|(block, &b)| {
                let r = e8m0::reciprocal(b);
                block.iter().filter(|&&v| (v * r).abs() > max).count()
            })
            .sum()
    }

    /// Number of blocks given the NaN scale 0xFF, which dequantize to NaN:
    /// blocks holding NaN or Inf, and blocks whose scale overflowed (EVEN
    /// with an amax near f32's largest value, SPEC section 2). A tile's
    /// scale counts once per 1x32 block it covers.
    pub fn count_nan_scales(&self) -> usize {
        self.scales.iter().filter(|&&b| b == e8m0::NAN).count()
    }

    /// Bytes held: codes plus scales.
    pub fn nbytes(&self) -> usize {
        self.codes.len() + self.scales.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_scales_count_non_finite_blocks_and_even_overflow() {
        let mut x = vec![1.0f32; 4 * BLOCK];
        x[3] = f32::NAN;
        // Finite, but EVEN rounds its amax up to 2^128: the NaN scale.
        x[BLOCK + 7] = 3e38;
        let q = quantize_mx(&x, &[4 * BLOCK], -1, &MxConfig::mxfp4()).unwrap();
        assert_eq!(q.count_nan_scales(), 2);
        let floor = MxConfig {
            scale_mode: ScaleMode::Floor,
            ..MxConfig::mxfp4()
        };
        let q = quantize_mx(&x, &[4 * BLOCK], -1, &floor).unwrap();
        assert_eq!(q.count_nan_scales(), 1);
    }
}
