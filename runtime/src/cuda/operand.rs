//! The CUDA linear primitives ([`LinearBackend`]) on device buffers.
//!
//! | format | quantize (`operand_quantize.rs`) | GEMM |
//! |---|---|---|
//! | BF16 | a zero-padded BF16 copy, or the input read in place when it is BF16 with both sides multiples of 16; a kept copy is unpadded | cuBLASLt BF16 (an operand whose reduction axis is its first is read transposed, in place), cropped |
//! | tensorwise FP8 | `fp8_cast_2d`: the codes and/or their transpose from one read, padded to 16; the amax check deferred | cuBLASLt FP8 with per-tensor scale pointers; the FNUZ formats, which NVIDIA lacks, decoded exactly to BF16, a BF16 GEMM and both scales after it |
//! | FP8 rowwise / 128-block | `fp8_group`: E4M3 codes K-contiguous, padded to 16 (rows) and 16 or 128 (K), scales in the CPU's and the GEMM's layouts; the amax check deferred | cuBLASLt FP8 with `OUTER_VEC_32F` or `VEC128_32F` / `BLK128x128_32F` scales (hipBLASLt: rowwise on gfx950); else the dequantized f32 values in an f32 GEMM |
//! | MX | `mx_tile`: one pass along rows and columns, writing codes (kept, or where the device multiplies them: gfx950) or the dequantized BF16 operand | the block-scaled GEMM of the codes where the device has one (gfx950, hipBLASLt `VEC32_UE8M0`); else BF16 GEMM of the dequantized blocks (Hopper has no FP4 MMA), codes dequantized first |
//! | NVFP4 | `quantize_nvfp4_2d` (`nvfp4.rs`): both directions from one read after one amax pass, writing codes (kept) or the BF16 decode(code) * s_q; the amax checks deferred | BF16 GEMM of decode(code) * s_q, both tensor scales t applied after it |
//!
//! The bias goes into the GEMM's epilogue where cuBLASLt fuses an f32 bias,
//! else into `lin_epilogue`. Column sums (db) come with the first FP8
//! 128-block, MX or NVFP4 pass over dy, else from `lin_colsum`. A non-finite FP8
//! amax is recorded on the device and raised by the next read-back or
//! [`super::CudaContext::check_deferred`], so the step never waits for it.

use std::sync::Arc;

use super::lin_kernels::{act_in, act_out, native_types, r16, GemmShape, In, Operand, Out, Post};
use super::storage::backend_err;
use super::{CudaContext, CudaDevice, CudaError, CudaStorage, DequantLayout, DevBuf, GemmDType};
use super::{MxDevice, Nvfp4Device};
use crate::backend::{Along, BackendStorage, Format, LinearBackend, Quantized, Request};
use crate::cpu::CpuOperand;
use crate::formats::ElemFormat;
use crate::quant::{Fp8Tensor, MxTensor};
use crate::{DType, Result};

/// A buffer one operand reads: shared with the other operands of the same
/// quantization, or the quantized input itself, read in place.
#[derive(Clone)]
pub enum Buf<'a> {
    /// A buffer written by a quantization, shared by the operands it serves.
    Shared(Arc<DevBuf>),
    /// The quantized input itself, read in place (no copy).
    Input(&'a DevBuf),
}

impl std::ops::Deref for Buf<'_> {
    type Target = DevBuf;
    fn deref(&self) -> &DevBuf {
        match self {
            Buf::Shared(b) => b,
            Buf::Input(b) => b,
        }
    }
}

/// BF16 values of a `[rows, cols]` matrix: `[r16(rows), r16(cols)]`
/// zero-padded when `padded`, else `[rows, cols]` (a kept copy, padded when
/// a GEMM reads it).
#[derive(Clone)]
pub struct Bf16Matrix<'a> {
    /// The BF16 values.
    pub buf: Buf<'a>,
    /// Rows of the matrix, before padding.
    pub rows: usize,
    /// Columns of the matrix, before padding.
    pub cols: usize,
    /// Whether `buf` is zero-padded to `[r16(rows), r16(cols)]`.
    pub padded: bool,
    /// The GEMM's reduction axis.
    pub along: Along,
}

/// Tensorwise FP8 codes of a `[rows, cols]` matrix with the reduction axis
/// contiguous: `[r16(rows), r16(cols)]` along the columns, the transpose
/// `[r16(cols), r16(rows)]` along the rows; `state` holds amax, scale and
/// scale_inv (shared by both orientations).
pub struct Fp8Matrix {
    /// The padded codes, in the orientation `along` asks for.
    pub codes: Arc<DevBuf>,
    /// amax bits, scale and scale_inv, one 16-byte slot each.
    pub state: Arc<DevBuf>,
    /// The 8-bit element format of the codes.
    pub elem: ElemFormat,
    /// Rows of the matrix, before padding.
    pub rows: usize,
    /// Columns of the matrix, before padding.
    pub cols: usize,
    /// The GEMM's reduction axis, which decides the orientation of `codes`.
    pub along: Along,
}

/// A GEMM operand or a kept copy, on the device.
pub enum CudaOperand<'a> {
    /// BF16 values, no scale.
    Bf16(Bf16Matrix<'a>),
    /// Tensorwise FP8 codes with their scale state.
    Fp8(Fp8Matrix),
    /// MX blocks dequantized to BF16, `[rows, padded_len]` (operand rows,
    /// reduction axis padded to 32).
    MxDeq {
        /// The BF16 dequantized values.
        deq: Arc<DevBuf>,
        /// Operand rows.
        rows: usize,
        /// Reduction length, padded to a multiple of 32.
        padded_len: usize,
    },
    /// MX codes and scales along the reduction axis (kept, or for a
    /// device that multiplies them).
    Mx {
        /// The codes and E8M0 scales, axis-last, shared by the operands of
        /// one quantization.
        q: Arc<MxDevice>,
        /// The GEMM's reduction axis, the axis the blocks run along.
        along: Along,
    },
    /// NVFP4 blocks along the reduction axis: the kept codes and/or the
    /// BF16 GEMM operand, with the tensor scale in the state.
    Nvfp4 {
        /// Codes, E4M3 bytes, BF16 operand and state, axis-last, shared by
        /// the operands of one quantization.
        q: Arc<Nvfp4Device>,
        /// The GEMM's reduction axis, the axis the blocks run along.
        along: Along,
    },
    /// E4M3 codes with rowwise or 128-block scales along the reduction axis.
    Fp8Group {
        /// Codes and scales, axis-last.
        q: Arc<super::Fp8GroupDevice>,
        /// The GEMM's reduction axis, the axis the groups run along.
        along: Along,
    },
}

impl CudaOperand<'_> {
    fn kind(&self) -> &'static str {
        match self {
            CudaOperand::Bf16(_) => "BF16",
            CudaOperand::Fp8(_) => "FP8",
            CudaOperand::MxDeq { .. } | CudaOperand::Mx { .. } => "MX",
            CudaOperand::Nvfp4 { .. } => "NVFP4",
            CudaOperand::Fp8Group { .. } => "FP8 group",
        }
    }
}

pub(super) fn aligned(rows: usize, cols: usize) -> bool {
    rows % 16 == 0 && cols % 16 == 0
}

/// An operand as cuBLASLt reads it.
struct Ready<'b> {
    op: Operand<'b>,
    /// GEMM rows, padded and true.
    rows: usize,
    true_rows: usize,
    /// Reduction length, padded.
    k: usize,
}

impl<'b> Ready<'b> {
    /// A `[rows, cols]` matrix padded to 16, K-contiguous or read transposed.
    fn padded16(
        buf: &'b DevBuf,
        dtype: GemmDType,
        (rows, cols): (usize, usize),
        along: Along,
    ) -> Self {
        let (op, r, true_rows, k) = match along {
            Along::Cols => (
                Operand::rows(buf, dtype, r16(cols)),
                r16(rows),
                rows,
                r16(cols),
            ),
            Along::Rows => (
                Operand::cols(buf, dtype, r16(cols)),
                r16(cols),
                cols,
                r16(rows),
            ),
        };
        Ready {
            op,
            rows: r,
            true_rows,
            k,
        }
    }
}

/// The GEMM's shape and its crop back to the true rows of both operands.
fn shape_of<'b>(
    a: &Ready,
    b: &Ready,
    bias: Option<&'b DevBuf>,
) -> super::Result<(GemmShape, Post<'b>)> {
    if a.k != b.k {
        return Err(CudaError::Invalid(format!(
            "GEMM operands reduce over {} and {} elements",
            a.k, b.k
        )));
    }
    let (m, n) = (a.true_rows, b.true_rows);
    let g = GemmShape {
        m: a.rows,
        n: b.rows,
        k: a.k,
    };
    let post = Post {
        bias,
        crop: ((m, n) != (g.m, g.n)).then_some((m, n)),
        ..Post::default()
    };
    Ok((g, post))
}

impl Bf16Matrix<'_> {
    /// The GEMM operand, padded into `tmp` if this is an unpadded kept copy.
    fn ready<'b>(
        &'b self,
        ctx: &CudaContext,
        tmp: &'b mut Option<DevBuf>,
    ) -> super::Result<Ready<'b>> {
        let dims = (self.rows, self.cols);
        let buf: &DevBuf = if self.padded || aligned(self.rows, self.cols) {
            &self.buf
        } else {
            let padded = (r16(self.rows), r16(self.cols));
            tmp.insert(ctx.lin_copy2d((&self.buf, In::Bf16), dims, padded, false, Out::Bf16)?)
        };
        Ok(Ready::padded16(buf, GemmDType::Bf16, dims, self.along))
    }

    fn to_cpu(&self, ctx: &CudaContext) -> super::Result<CpuOperand> {
        let dims = (self.rows, self.cols);
        let n = self.rows * self.cols;
        let bits = if self.padded && !aligned(self.rows, self.cols) {
            let stored = (r16(self.rows), r16(self.cols));
            let packed = ctx.lin_copy2d((&self.buf, In::Bf16), stored, dims, false, Out::Bf16)?;
            ctx.download(&packed, n)?
        } else {
            ctx.download(&self.buf, n)?
        };
        Ok(CpuOperand::Bf16 {
            bits,
            rows: self.rows,
            cols: self.cols,
            along: self.along,
        })
    }
}

impl Fp8Matrix {
    /// The codes as the GEMM reads them (the dtype is chosen by
    /// `lin_fp8_gemm`), with the scale_inv pointer.
    fn ready(&self) -> (Ready<'_>, u64) {
        // Stored K-contiguous: the transpose is [r16(cols), r16(rows)].
        let stored = match self.along {
            Along::Cols => (self.rows, self.cols),
            Along::Rows => (self.cols, self.rows),
        };
        let ready = Ready::padded16(&self.codes, GemmDType::Bf16, stored, Along::Cols);
        (ready, super::quantize::state_scale_inv_ptr(&self.state))
    }

    fn to_cpu(&self, ctx: &CudaContext) -> super::Result<CpuOperand> {
        let (_, scale, scale_inv) = super::quantize::read_state(ctx, &self.state)?;
        let (rows, cols) = (self.rows, self.cols);
        let (stored, transposed) = match self.along {
            Along::Cols => ((r16(rows), r16(cols)), false),
            Along::Rows => ((r16(cols), r16(rows)), true),
        };
        let packed = ctx.lin_copy2d(
            (&self.codes, In::U8),
            stored,
            (rows, cols),
            transposed,
            Out::U8,
        )?;
        let q = Fp8Tensor {
            shape: vec![rows, cols],
            elem: self.elem,
            codes: ctx.download(&packed, rows * cols)?,
            scale,
            scale_inv,
        };
        Ok(CpuOperand::Fp8 {
            q,
            along: self.along,
        })
    }
}

/// The BF16 operand of MX or NVFP4 blocks, dequantizing kept codes into
/// `tmp`, and the per-tensor scale to apply after the GEMM (NVFP4's t).
fn deq_ready<'b>(
    ctx: &CudaContext,
    op: &'b CudaOperand<'_>,
    tmp: &'b mut Option<DevBuf>,
) -> super::Result<Option<(Ready<'b>, Option<u64>)>> {
    let (buf, rows, k, scale): (&DevBuf, usize, usize, _) = match op {
        CudaOperand::MxDeq {
            deq,
            rows,
            padded_len,
        } => (deq, *rows, *padded_len, None),
        CudaOperand::Mx { q, .. } => {
            let d = ctx.dequantize_mx(q, DequantLayout::Rows, DType::BF16)?;
            (tmp.insert(d), q.rows, q.padded_len, None)
        }
        CudaOperand::Nvfp4 { q, .. } => {
            let d = match &q.deq {
                Some(d) => d,
                None => tmp.insert(ctx.dequantize_nvfp4(q)?),
            };
            (d, q.rows, q.padded_len, Some(q.tensor_scale_ptr()))
        }
        _ => return Ok(None),
    };
    let ready = Ready {
        op: Operand::rows(buf, GemmDType::Bf16, k),
        rows,
        true_rows: rows,
        k,
    };
    Ok(Some((ready, scale)))
}

/// Whether the device multiplies MX codes of `cfg` natively, so that the
/// quantizer writes codes instead of decoded BF16.
pub(super) fn mx_codes_native(ctx: &CudaContext, cfg: &crate::quant::MxConfig) -> bool {
    native_types(ctx, &Format::Mx(*cfg), &Format::Mx(*cfg)).is_some()
}

/// MX codes `[rows, padded_len]` as the block-scaled GEMM reads them, the
/// E8M0 scales `[rows, padded_len / 32]` as their scale pointer.
fn mx_codes_ready(q: &MxDevice, t: GemmDType) -> Ready<'_> {
    Ready {
        op: Operand::fp8(&q.codes, t, q.padded_len, q.scales.ptr()),
        rows: q.rows,
        true_rows: q.rows,
        k: q.padded_len,
    }
}

/// `a · b^T` of MX codes in the device's block-scaled GEMM, with its true
/// `(rows, cols)`; `None` where there is none for the pair (every device
/// but gfx950), the rows are not multiples of 16, or the library refuses
/// the shape: the caller then decodes both to BF16.
fn mx_native(
    ctx: &CudaContext,
    (qa, qb): (&MxDevice, &MxDevice),
    (bias, out): (Option<&DevBuf>, Out),
) -> super::Result<Option<(DevBuf, usize, usize)>> {
    let Some((ta, tb)) = native_types(ctx, &Format::Mx(qa.config), &Format::Mx(qb.config)) else {
        return Ok(None);
    };
    if !aligned(qa.rows, qb.rows) {
        return Ok(None);
    }
    let (ra, rb) = (mx_codes_ready(qa, ta), mx_codes_ready(qb, tb));
    let (g, post) = shape_of(&ra, &rb, bias)?;
    match ctx.lin_gemm(&ra.op, &rb.op, g, post, out) {
        Ok(y) => Ok(Some((y, qa.rows, qb.rows))),
        Err(CudaError::Blas(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `a · b^T` as `out`, with its true `(rows, cols)`.
fn gemm_on(
    ctx: &CudaContext,
    (a, b): (&CudaOperand<'_>, &CudaOperand<'_>),
    (bias, out): (Option<&DevBuf>, Out),
) -> super::Result<(DevBuf, usize, usize)> {
    if let (CudaOperand::Fp8Group { q: qa, .. }, CudaOperand::Fp8Group { q: qb, .. }) = (a, b) {
        return super::fp8_group::fp8_group_gemm(ctx, (qa, qb), (bias, out));
    }
    if let (CudaOperand::Mx { q: qa, .. }, CudaOperand::Mx { q: qb, .. }) = (a, b) {
        if let Some(y) = mx_native(ctx, (qa, qb), (bias, out))? {
            return Ok(y);
        }
    }
    let (mut ta, mut tb) = (None, None);
    let mut scales = None;
    let (ra, rb) = match (a, b) {
        (CudaOperand::Fp8(fa), CudaOperand::Fp8(fb)) => {
            let ((ra, sa), (rb, sb)) = (fa.ready(), fb.ready());
            let (g, post) = shape_of(&ra, &rb, bias)?;
            let (ca, cb) = ((ra.op.buf(), sa), (rb.op.buf(), sb));
            let y = ctx.lin_fp8_gemm(fa.elem, ca, fb.elem, cb, g, post, out)?;
            return Ok((y, ra.true_rows, rb.true_rows));
        }
        (CudaOperand::Bf16(ma), CudaOperand::Bf16(mb)) => {
            (ma.ready(ctx, &mut ta)?, mb.ready(ctx, &mut tb)?)
        }
        _ => match (deq_ready(ctx, a, &mut ta)?, deq_ready(ctx, b, &mut tb)?) {
            (Some((ra, None)), Some((rb, None))) => (ra, rb),
            (Some((ra, Some(sa))), Some((rb, Some(sb)))) => {
                scales = Some((sa, sb));
                (ra, rb)
            }
            _ => {
                return Err(CudaError::Invalid(format!(
                    "a GEMM of {} and {} operands is not supported",
                    a.kind(),
                    b.kind()
                )))
            }
        },
    };
    let (g, post) = shape_of(&ra, &rb, bias)?;
    let y = ctx.lin_gemm(&ra.op, &rb.op, g, Post { scales, ..post }, out)?;
    Ok((y, ra.true_rows, rb.true_rows))
}

/// The shape and axis of the input an axis-last operand of `rows` rows of
/// `len` was quantized from: along the first axis the input was `[len, rows]`.
fn input_shape(along: Along, rows: usize, len: usize) -> (Vec<usize>, usize) {
    match along {
        Along::Rows => (vec![len, rows], 0),
        Along::Cols => (vec![rows, len], 1),
    }
}

/// The operand downloaded in the CPU's form (codes in `[rows, cols]` order).
fn to_cpu(ctx: &CudaContext, op: &CudaOperand<'_>) -> super::Result<CpuOperand> {
    match op {
        CudaOperand::Bf16(m) => m.to_cpu(ctx),
        CudaOperand::Fp8(m) => m.to_cpu(ctx),
        CudaOperand::MxDeq { .. } => Err(CudaError::Invalid(
            "a dequantized MX operand is not kept; download its codes".into(),
        )),
        CudaOperand::Fp8Group { q, along } => {
            let (shape, axis) = input_shape(*along, q.rows, q.len);
            Ok(CpuOperand::Fp8Group(q.to_cpu(ctx, shape, axis)?))
        }
        CudaOperand::Mx { q, along } => {
            let (shape, axis) = input_shape(*along, q.rows, q.len);
            Ok(CpuOperand::Mx(MxTensor {
                shape,
                axis,
                config: q.config,
                rows: q.rows,
                len: q.len,
                padded_len: q.padded_len,
                codes: ctx.download(&q.codes, q.code_bytes())?,
                scales: ctx.download(&q.scales, q.nblocks())?,
            }))
        }
        CudaOperand::Nvfp4 { q, along } => Ok(CpuOperand::Nvfp4(q.to_tensor(ctx, *along)?)),
    }
}

impl LinearBackend for CudaStorage {
    type Operand<'a> = CudaOperand<'a>;

    fn quantize<'a>(&'a self, req: &Request) -> Result<Quantized<'a, CudaStorage>> {
        self.quantize_request(req).map_err(backend_err)
    }

    fn gemm(
        device: &CudaDevice,
        a: &CudaOperand<'_>,
        b: &CudaOperand<'_>,
        bias: Option<&CudaStorage>,
        out: DType,
    ) -> Result<CudaStorage> {
        if let Some(b) = bias.filter(|b| b.dtype() != DType::F32) {
            return Err(crate::Error::DType(format!(
                "a linear's bias is f32, not {}",
                b.dtype()
            )));
        }
        act_in(out).map_err(backend_err)?;
        let ctx = device.context();
        let post = (bias.map(|b| b.buffer()), act_out(out));
        let (y, m, n) = gemm_on(ctx, (a, b), post).map_err(backend_err)?;
        Ok(CudaStorage::from_buffer(y, out, m * n, device.clone()))
    }

    fn column_sums(&self, rows: usize, cols: usize) -> Result<CudaStorage> {
        let s = self.lin_column_sums(rows, cols).map_err(backend_err)?;
        Ok(CudaStorage::from_buffer(
            s,
            DType::F32,
            cols,
            self.device().clone(),
        ))
    }

    fn operand_bytes(op: &CudaOperand<'_>) -> usize {
        match op {
            CudaOperand::Bf16(m) => 2 * m.rows * m.cols,
            CudaOperand::Fp8(m) => m.rows * m.cols + 8,
            CudaOperand::MxDeq {
                rows, padded_len, ..
            } => 2 * rows * padded_len,
            CudaOperand::Mx { q, .. } => q.code_bytes() + q.nblocks(),
            // Kept: codes, E4M3 bytes and t, as the CPU's `nbytes`.
            CudaOperand::Nvfp4 { q, .. } => {
                let kept = q
                    .codes
                    .as_ref()
                    .map_or(0, |_| q.code_bytes() + q.nblocks() + 4);
                kept + q.deq.as_ref().map_or(0, |_| 2 * q.rows * q.padded_len)
            }
            CudaOperand::Fp8Group { q, .. } => q.nbytes(),
        }
    }

    fn operand_elements(op: &CudaOperand<'_>) -> usize {
        match op {
            CudaOperand::Bf16(m) => m.rows * m.cols,
            CudaOperand::Fp8(m) => m.rows * m.cols,
            CudaOperand::MxDeq {
                rows, padded_len, ..
            } => rows * padded_len,
            CudaOperand::Mx { q, .. } => q.rows * q.len,
            CudaOperand::Nvfp4 { q, .. } if q.codes.is_some() => q.rows * q.len,
            CudaOperand::Nvfp4 { q, .. } => q.rows * q.padded_len,
            CudaOperand::Fp8Group { q, .. } => q.rows * q.len,
        }
    }

    fn operand_to_cpu(device: &CudaDevice, op: &CudaOperand<'_>) -> Result<CpuOperand> {
        to_cpu(device.context(), op).map_err(backend_err)
    }
}
