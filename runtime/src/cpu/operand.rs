//! The CPU's linear primitives ([`LinearBackend`]): the reference quantizers
//! of [`crate::quant`], then f32 GEMMs of the exact decoded values.
//!
//! A GEMM multiplies dequantized operands with f32 accumulation (exact for
//! the MX and FP8 codes, whose products are f32 values), applies the
//! product of the tensorwise scales to the result, then adds the bias in
//! f32. An operand stored `[rows, cols]` whose reduction axis is its first
//! is read through a transposed view, never copied. Operands whose scales
//! follow the reduction axis (MX, NVFP4, FP8 rowwise and 128-block) are
//! quantized axis-last and multiplied as their dequantized values
//! (`dequantize_rows`: the codes times their block's or row's scale).

use std::borrow::Cow;
use std::sync::Arc;

use rayon::prelude::*;

use super::matmul::matmul;
use super::{bf16_to_f32, f32_to_bf16, CpuDevice, CpuStorage};
use crate::backend::{Along, BackendStorage, Format, LinearBackend, Quantized, Request, Want};
use crate::formats::bf16;
use crate::quant::{
    quantize_fp8_group_rows, quantize_fp8_groups, quantize_mx, quantize_nvfp4, quantize_nvfp4_rows,
    quantize_rows, quantize_tensorwise, Fp8GroupConfig, Fp8GroupTensor, Fp8Tensor, MxTensor,
    Nvfp4Config, Nvfp4Tensor,
};
use crate::{DType, Error, Layout, Result, Shape};

/// Exact f32 values of a row-major `[rows, cols]` matrix, ready for a GEMM:
/// decoded codes (times `scale_inv` after the GEMM) or dequantized blocks.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    /// Shared between the operands one quantization serves.
    pub values: Arc<Vec<f32>>,
    /// Rows as stored, row-major (for MX, NVFP4 and FP8 group values, the
    /// rows of the axis-last copy).
    pub rows: usize,
    /// Columns as stored (for MX, NVFP4 and FP8 group values, the reduction
    /// length padded to whole blocks: of 32, 16 and 128; rowwise: unpadded).
    pub cols: usize,
    /// The GEMM's reduction axis.
    pub along: Along,
    /// Multiplies the GEMM's result: the FP8 tensorwise `scale_inv`, else 1.0.
    pub scale_inv: f32,
}

impl Matrix {
    /// (operand rows, reduction length) of the GEMM that reads it.
    fn gemm_dims(&self) -> (usize, usize) {
        match self.along {
            Along::Cols => (self.rows, self.cols),
            Along::Rows => (self.cols, self.rows),
        }
    }

    /// This matrix as the left `[M, K]` or the right `[K, N]` GEMM operand.
    fn view(&self, left: bool) -> Layout {
        let l = Layout::contiguous(Shape::new(vec![self.rows, self.cols]));
        if left == (self.along == Along::Cols) {
            l
        } else {
            l.permute(&[1, 0]).expect("a 2-D layout permutes")
        }
    }
}

/// A GEMM operand, or the compact copy the backward keeps, in host memory.
#[derive(Clone, Debug, PartialEq)]
pub enum CpuOperand {
    /// Decoded values ready for a GEMM (what [`LinearBackend::quantize`] returns
    /// for `now`).
    Values(Matrix),
    /// BF16 bits of `[rows, cols]`.
    Bf16 {
        /// The bf16 bits, row-major.
        bits: Vec<u16>,
        /// Rows of the matrix.
        rows: usize,
        /// Columns of the matrix.
        cols: usize,
        /// The GEMM's reduction axis.
        along: Along,
    },
    /// FP8 codes of `[rows, cols]` with their tensorwise scale.
    Fp8 {
        /// The codes (shape `[rows, cols]`) and their scale.
        q: Fp8Tensor,
        /// The GEMM's reduction axis.
        along: Along,
    },
    /// MX blocks along the reduction axis, axis-last (`quant::mx`).
    Mx(MxTensor),
    /// NVFP4 blocks along the reduction axis, axis-last (`quant::nvfp4`).
    Nvfp4(Nvfp4Tensor),
    /// E4M3 codes with rowwise or 128-block scales along the reduction
    /// axis, axis-last (`quant::fp8_group`).
    Fp8Group(Fp8GroupTensor),
}

impl CpuOperand {
    /// The GEMM-ready values (decoded or dequantized for a kept copy).
    pub fn matrix(&self) -> Cow<'_, Matrix> {
        let m = |values: Vec<f32>, rows, cols, along, scale_inv| {
            Cow::Owned(Matrix {
                values: Arc::new(values),
                rows,
                cols,
                along,
                scale_inv,
            })
        };
        match self {
            CpuOperand::Values(v) => Cow::Borrowed(v),
            CpuOperand::Bf16 {
                bits,
                rows,
                cols,
                along,
            } => m(bf16_to_f32(bits), *rows, *cols, *along, 1.0),
            CpuOperand::Fp8 { q, along } => {
                m(decode(q), q.shape[0], q.shape[1], *along, q.scale_inv)
            }
            CpuOperand::Mx(q) => m(q.dequantize_rows(), q.rows, q.padded_len, Along::Cols, 1.0),
            CpuOperand::Nvfp4(q) => m(q.dequantize_rows(), q.rows, q.padded_len, Along::Cols, 1.0),
            CpuOperand::Fp8Group(q) => {
                m(q.dequantize_rows(), q.rows, q.padded_len, Along::Cols, 1.0)
            }
        }
    }
}

/// Decoded FP8 codes (exact values, scale not applied).
fn decode(q: &Fp8Tensor) -> Vec<f32> {
    let t = q.elem.decode_table();
    q.codes.par_iter().map(|&c| t[c as usize]).collect()
}

/// Whether one quantization serves both wants: tensorwise and BF16 copies do
/// not depend on the axis, MX, NVFP4 and FP8 group scales do.
fn shared(a: &Want, b: &Want) -> bool {
    a.format == b.format && (a.along == b.along || !a.format.follows_axis())
}

/// A non-finite-amax error of a quantizer that names the tensor by its
/// place in the axis-last view, relabelled with the linear's `label` (its
/// layer, role and iteration) in front, as SPEC section 3 names tensors.
fn relabel(e: Error, label: &dyn Fn() -> String) -> Error {
    match e {
        Error::NonFiniteAmax { tensor, amax } => Error::NonFiniteAmax {
            tensor: format!("{}: {tensor}", label()),
            amax,
        },
        other => other,
    }
}

/// The quantizer's input, `[rows, cols]` row-major.
struct Input<'a> {
    x: &'a [f32],
    rows: usize,
    cols: usize,
    label: &'a dyn Fn() -> String,
}

impl Input<'_> {
    fn tensorwise(&self, elem: crate::formats::ElemFormat, pow2: bool) -> Result<Fp8Tensor> {
        quantize_tensorwise(self.x, &[self.rows, self.cols], elem, pow2, &(self.label)())
    }

    fn mx(&self, want: &Want, cfg: &crate::quant::MxConfig) -> Result<MxTensor> {
        match want.along {
            Along::Cols => quantize_rows(self.x, self.rows, self.cols, cfg),
            Along::Rows => quantize_mx(self.x, &[self.rows, self.cols], 0, cfg),
        }
    }

    fn nvfp4(&self, want: &Want, cfg: &Nvfp4Config) -> Result<Nvfp4Tensor> {
        match want.along {
            Along::Cols => quantize_nvfp4_rows(self.x, self.rows, self.cols, cfg),
            Along::Rows => quantize_nvfp4(self.x, &[self.rows, self.cols], 0, cfg),
        }
        .map_err(|e| relabel(e, self.label))
    }

    fn fp8_group(&self, want: &Want, cfg: &Fp8GroupConfig) -> Result<Fp8GroupTensor> {
        match want.along {
            Along::Cols => quantize_fp8_group_rows(self.x, self.rows, self.cols, cfg),
            Along::Rows => quantize_fp8_groups(self.x, &[self.rows, self.cols], 0, cfg),
        }
        .map_err(|e| relabel(e, self.label))
    }

    /// The compact copy of `want`, kept for the backward.
    fn kept(&self, want: &Want) -> Result<CpuOperand> {
        let (rows, cols, along) = (self.rows, self.cols, want.along);
        Ok(match want.format {
            Format::Bf16 => CpuOperand::Bf16 {
                bits: f32_to_bf16(self.x),
                rows,
                cols,
                along,
            },
            Format::Tensorwise { elem, pow2 } => CpuOperand::Fp8 {
                q: self.tensorwise(elem, pow2)?,
                along,
            },
            Format::Mx(cfg) => CpuOperand::Mx(self.mx(want, &cfg)?),
            Format::Nvfp4(cfg) => CpuOperand::Nvfp4(self.nvfp4(want, &cfg)?),
            Format::Fp8Group(cfg) => CpuOperand::Fp8Group(self.fp8_group(want, &cfg)?),
        })
    }

    /// The GEMM operand of `want`.
    fn values(&self, want: &Want) -> Result<Matrix> {
        let (rows, cols, along) = (self.rows, self.cols, want.along);
        let (values, scale_inv) = match want.format {
            Format::Bf16 => (self.x.par_iter().map(|&v| bf16::round(v)).collect(), 1.0),
            Format::Tensorwise { elem, pow2 } => {
                let q = self.tensorwise(elem, pow2)?;
                (decode(&q), q.scale_inv)
            }
            Format::Mx(_) | Format::Nvfp4(_) | Format::Fp8Group(_) => {
                // Axis-last values: the kept form's GEMM operand.
                return Ok(self.kept(want)?.matrix().into_owned());
            }
        };
        Ok(Matrix {
            values: Arc::new(values),
            rows,
            cols,
            along,
            scale_inv,
        })
    }
}

/// `m` read along `along` (MX, NVFP4 and FP8 group values keep the axis
/// they were quantized along).
fn reoriented(m: &Matrix, want: &Want) -> Matrix {
    let mut m = m.clone();
    if !want.format.follows_axis() {
        m.along = want.along;
    }
    m
}

impl LinearBackend for CpuStorage {
    type Operand<'a> = CpuOperand;

    fn quantize(&self, req: &Request) -> Result<Quantized<'_, CpuStorage>> {
        let Request {
            rows,
            cols,
            now,
            keep,
            column_sums,
            label,
        } = *req;
        let layout = Layout::contiguous(Shape::new(vec![rows, cols]));
        let x = self.packed_f32(&layout, "quantize")?;
        let input = Input {
            x: &x,
            rows,
            cols,
            label,
        };
        let kept = keep.map(|w| input.kept(&w)).transpose()?;
        let mut ops: Vec<Matrix> = Vec::with_capacity(now.len());
        for (i, want) in now.iter().enumerate() {
            let m = if let Some(j) = now[..i].iter().position(|p| shared(p, want)) {
                reoriented(&ops[j], want)
            } else if let Some(k) = kept
                .as_ref()
                .filter(|_| keep.is_some_and(|k| shared(&k, want)))
            {
                reoriented(&k.matrix(), want)
            } else {
                input.values(want)?
            };
            ops.push(m);
        }
        Ok(Quantized {
            now: ops.into_iter().map(CpuOperand::Values).collect(),
            keep: kept,
            column_sums: column_sums
                .then(|| self.column_sums(rows, cols))
                .transpose()?,
        })
    }

    fn gemm(
        _: &CpuDevice,
        a: &CpuOperand,
        b: &CpuOperand,
        bias: Option<&CpuStorage>,
        out: DType,
    ) -> Result<CpuStorage> {
        let (a, b) = (a.matrix(), b.matrix());
        let ((m, ka), (n, kb)) = (a.gemm_dims(), b.gemm_dims());
        if ka != kb {
            return Err(Error::Shape(format!(
                "GEMM operands reduce over {ka} and {kb} elements"
            )));
        }
        let mut c = matmul(&a.values, &a.view(true), &b.values, &b.view(false));
        let alpha = a.scale_inv * b.scale_inv;
        if alpha != 1.0 {
            c.par_iter_mut().for_each(|v| *v *= alpha);
        }
        if let Some(bias) = bias {
            let b = bias.packed_f32(&Layout::contiguous(Shape::new(vec![n])), "bias")?;
            c.par_chunks_mut(n)
                .for_each(|row| row.iter_mut().zip(b.iter()).for_each(|(v, b)| *v += b));
        }
        let c = CpuStorage::F32(c);
        if out == DType::F32 {
            Ok(c)
        } else {
            c.to_dtype(&Layout::contiguous(Shape::new(vec![m, n])), out)
        }
    }

    fn column_sums(&self, rows: usize, cols: usize) -> Result<CpuStorage> {
        let x = self.packed_f32(
            &Layout::contiguous(Shape::new(vec![rows, cols])),
            "column sums",
        )?;
        let mut s = vec![0.0f32; cols];
        for row in x.chunks(cols.max(1)).take(rows) {
            s.iter_mut().zip(row).for_each(|(s, v)| *s += v);
        }
        Ok(CpuStorage::F32(s))
    }

    fn operand_bytes(op: &CpuOperand) -> usize {
        match op {
            CpuOperand::Values(m) => 4 * m.values.len(),
            CpuOperand::Bf16 { bits, .. } => 2 * bits.len(),
            CpuOperand::Fp8 { q, .. } => q.nbytes(),
            CpuOperand::Mx(q) => q.nbytes(),
            // Padded as stored: under the Hadamard the padding of a row's
            // last group of 16 holds rotated values the GEMM reads.
            CpuOperand::Nvfp4(q) => q.nbytes(),
            // A byte per real element and the two f32 of every group (SPEC
            // 3b's `nbytes` without the zero padding of a last 128-block,
            // which no GEMM needs: "1.0 plus its scales", SPEC 4a).
            CpuOperand::Fp8Group(q) => q.rows * q.len + 8 * q.scales.len(),
        }
    }

    fn operand_elements(op: &CpuOperand) -> usize {
        match op {
            CpuOperand::Values(m) => m.rows * m.cols,
            CpuOperand::Bf16 { bits, .. } => bits.len(),
            CpuOperand::Fp8 { q, .. } => q.codes.len(),
            CpuOperand::Mx(q) => q.rows * q.len,
            CpuOperand::Nvfp4(q) => q.rows * q.len,
            CpuOperand::Fp8Group(q) => q.rows * q.len,
        }
    }

    fn operand_to_cpu(_: &CpuDevice, op: &CpuOperand) -> Result<CpuOperand> {
        Ok(op.clone())
    }
}
