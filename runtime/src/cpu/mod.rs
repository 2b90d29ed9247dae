//! The CPU backend: plain Rust kernels, GEMMs through the `gemm` crate and
//! threads through rayon. It is the reference every other backend is checked
//! against.
//!
//! Float kernels compute in f32. A BF16 operand is widened to packed f32 first
//! and the result is rounded back to BF16 (RNE), so every op accepts BF16 with
//! f32 accumulation.

mod adamw;
mod attention;
mod fused;
pub(crate) mod matmul;
mod operand;
mod reduce;
mod rowwise;
mod strided;

use std::borrow::Cow;

pub use operand::{CpuOperand, Matrix};

use rayon::prelude::*;

use crate::backend::{BackendDevice, BackendStorage};
use crate::formats::bf16;
use crate::op::{BinaryOp, ReduceOp, UnaryOp};
use crate::{DType, Device, Error, Layout, Result, Shape};

/// Below this many elements of work a kernel runs on the calling thread:
/// spreading less across rayon costs more than it saves.
pub(crate) const PAR_MIN_ELEMS: usize = 1 << 15;

/// Work per rayon task once a kernel is split, in elements.
const TASK_ELEMS: usize = 1 << 12;

/// Runs `f(row_index, row)` over the rows of `out` (chunks of `row_len`; the
/// last may be shorter), on all cores when the buffer is large.
pub(crate) fn for_each_row<T: Send>(
    out: &mut [T],
    row_len: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    for_each_row_weighted(out, row_len, 1, f)
}

/// [`for_each_row`] where producing one output element reads `cost` inputs
/// (a row reduction), so the split is sized by the work, not the output.
pub(crate) fn for_each_row_weighted<T: Send>(
    out: &mut [T],
    row_len: usize,
    cost: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    if row_len == 0 || out.is_empty() {
        return;
    }
    let work = out.len().saturating_mul(cost.max(1));
    if work >= PAR_MIN_ELEMS {
        let min_rows = (TASK_ELEMS / (row_len * cost.max(1))).max(1);
        out.par_chunks_mut(row_len)
            .with_min_len(min_rows)
            .enumerate()
            .for_each(|(r, c)| f(r, c));
    } else {
        out.chunks_mut(row_len)
            .enumerate()
            .for_each(|(r, c)| f(r, c));
    }
}

/// `f` over every element.
fn map(x: &[f32], f: impl Fn(f32) -> f32 + Sync) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for_each_row(&mut out, TASK_ELEMS, |r, dst| {
        for (o, &v) in dst.iter_mut().zip(&x[r * TASK_ELEMS..]) {
            *o = f(v);
        }
    });
    out
}

/// Widens BF16 bits to f32.
fn bf16_to_f32(x: &[u16]) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for_each_row(&mut out, TASK_ELEMS, |r, dst| {
        for (o, &b) in dst.iter_mut().zip(&x[r * TASK_ELEMS..]) {
            *o = bf16::to_f32(b);
        }
    });
    out
}

/// Rounds f32 to BF16 bits, nearest even.
fn f32_to_bf16(x: &[f32]) -> Vec<u16> {
    let mut out = vec![0u16; x.len()];
    for_each_row(&mut out, TASK_ELEMS, |r, dst| {
        for (o, &v) in dst.iter_mut().zip(&x[r * TASK_ELEMS..]) {
            *o = bf16::from_f32(v);
        }
    });
    out
}

/// The CPU as a backend device (there is one; it has no state).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuDevice;

/// Host memory holding one dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum CpuStorage {
    /// f32 values.
    F32(Vec<f32>),
    /// bfloat16 values as their raw u16 bits.
    BF16(Vec<u16>),
    /// Raw bytes: quantized codes, packed FP4 pairs or E8M0 scales.
    U8(Vec<u8>),
}

impl CpuStorage {
    /// Number of elements (not bytes).
    pub fn len(&self) -> usize {
        match self {
            CpuStorage::F32(v) => v.len(),
            CpuStorage::BF16(v) => v.len(),
            CpuStorage::U8(v) => v.len(),
        }
    }

    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Packs f32 results as `dtype` (the input's float dtype).
    fn from_f32(v: Vec<f32>, dtype: DType) -> CpuStorage {
        match dtype {
            DType::BF16 => CpuStorage::BF16(f32_to_bf16(&v)),
            _ => CpuStorage::F32(v),
        }
    }

    fn not_float(&self, op: &str) -> Error {
        Error::DType(format!(
            "{op} needs a float tensor (f32 or bf16), got {}; u8 holds quantized codes, decode them first",
            self.dtype()
        ))
    }

    /// The elements of `layout` as packed f32, borrowed when they already are.
    fn packed_f32(&self, layout: &Layout, op: &str) -> Result<Cow<'_, [f32]>> {
        match self {
            CpuStorage::F32(v) => Ok(match layout.contiguous_range() {
                Some(range) => Cow::Borrowed(&v[range]),
                None => Cow::Owned(strided::gather(v, layout)),
            }),
            CpuStorage::BF16(v) => Ok(Cow::Owned(bf16_to_f32(&strided::gather(v, layout)))),
            CpuStorage::U8(_) => Err(self.not_float(op)),
        }
    }

    /// An f32 buffer with a layout over it: F32 as it is (strides kept, no
    /// copy), BF16 widened to a packed copy.
    fn f32_view<'a>(
        &'a self,
        layout: &'a Layout,
        op: &str,
    ) -> Result<(Cow<'a, [f32]>, Cow<'a, Layout>)> {
        match self {
            CpuStorage::F32(v) => Ok((Cow::Borrowed(v), Cow::Borrowed(layout))),
            _ => Ok((
                self.packed_f32(layout, op)?,
                Cow::Owned(Layout::contiguous(layout.shape().clone())),
            )),
        }
    }
}

impl BackendStorage for CpuStorage {
    type Device = CpuDevice;

    fn device(&self) -> &CpuDevice {
        &CpuDevice
    }

    fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::BF16(_) => DType::BF16,
            CpuStorage::U8(_) => DType::U8,
        }
    }

    fn buffer_bytes(&self) -> usize {
        self.len() * self.dtype().size_in_bytes()
    }

    fn to_cpu_storage(&self) -> Result<CpuStorage> {
        Ok(self.clone())
    }

    fn copy_strided(&self, layout: &Layout) -> Result<CpuStorage> {
        Ok(match self {
            CpuStorage::F32(v) => CpuStorage::F32(strided::gather(v, layout)),
            CpuStorage::BF16(v) => CpuStorage::BF16(strided::gather(v, layout)),
            CpuStorage::U8(v) => CpuStorage::U8(strided::gather(v, layout)),
        })
    }

    fn to_dtype(&self, layout: &Layout, dtype: DType) -> Result<CpuStorage> {
        match (self, dtype) {
            (_, d) if d == self.dtype() => self.copy_strided(layout),
            (CpuStorage::F32(v), DType::BF16) => Ok(CpuStorage::BF16(f32_to_bf16(&strided::gather(v, layout)))),
            (CpuStorage::BF16(_), DType::F32) => Ok(CpuStorage::F32(self.packed_f32(layout, "to_dtype")?.into_owned())),
            _ => Err(Error::DType(format!(
                "to_dtype: no conversion from {} to {dtype}; u8 codes are made and read by the quantizers",
                self.dtype()
            ))),
        }
    }

    fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<CpuStorage> {
        let x = self.packed_f32(layout, op.name())?;
        // One monomorphized loop per op, so the match is not in the loop.
        macro_rules! arms {
            ($($v:ident),*) => {
                match op { $(UnaryOp::$v => map(&x, |v| UnaryOp::$v.f32(v)),)* }
            };
        }
        let y = arms! { Exp, Log, Sqrt, Rsqrt, Sqr, Tanh, Silu, GeluTanh };
        Ok(CpuStorage::from_f32(y, self.dtype()))
    }

    fn affine(&self, layout: &Layout, mul: f32, add: f32) -> Result<CpuStorage> {
        let x = self.packed_f32(layout, "affine")?;
        Ok(CpuStorage::from_f32(
            map(&x, |v| v * mul + add),
            self.dtype(),
        ))
    }

    fn binary(
        &self,
        layout: &Layout,
        rhs: &CpuStorage,
        rhs_layout: &Layout,
        op: BinaryOp,
    ) -> Result<CpuStorage> {
        let (a, al) = self.f32_view(layout, op.name())?;
        let (b, bl) = rhs.f32_view(rhs_layout, op.name())?;
        macro_rules! arms {
            ($($v:ident),*) => {
                match op { $(BinaryOp::$v => strided::binary_map(&a, &al, &b, &bl, |x, y| BinaryOp::$v.f32(x, y)),)* }
            };
        }
        let y = arms!(Add, Sub, Mul, Div, Eq, SiluBackward, GeluTanhBackward);
        Ok(CpuStorage::from_f32(y, self.dtype()))
    }

    fn reduce(&self, layout: &Layout, op: ReduceOp, axis: usize) -> Result<CpuStorage> {
        let x = self.packed_f32(layout, op.name())?;
        let dims = layout.dims();
        let outer = dims[..axis].iter().product();
        let inner = dims[axis + 1..].iter().product();
        Ok(CpuStorage::from_f32(
            reduce::reduce(&x, outer, dims[axis], inner, op),
            self.dtype(),
        ))
    }

    fn matmul(&self, layout: &Layout, rhs: &CpuStorage, rhs_layout: &Layout) -> Result<CpuStorage> {
        let (a, al) = self.f32_view(layout, "matmul")?;
        let (b, bl) = rhs.f32_view(rhs_layout, "matmul")?;
        Ok(CpuStorage::from_f32(
            matmul::matmul(&a, &al, &b, &bl),
            self.dtype(),
        ))
    }

    fn concat(parts: &[(&CpuStorage, &Layout)], axis: usize) -> Result<CpuStorage> {
        macro_rules! cat {
            ($variant:ident) => {{
                let packed = parts
                    .iter()
                    .map(|&(s, l)| match s {
                        CpuStorage::$variant(v) => Ok((strided::gather(v, l), l.dims())),
                        _ => Err(Error::DType("concat: parts have different dtypes".into())),
                    })
                    .collect::<Result<Vec<_>>>()?;
                CpuStorage::$variant(strided::concat(&packed, axis))
            }};
        }
        Ok(match parts[0].0 {
            CpuStorage::F32(_) => cat!(F32),
            CpuStorage::BF16(_) => cat!(BF16),
            CpuStorage::U8(_) => cat!(U8),
        })
    }

    fn softmax_last_dim(&self, layout: &Layout) -> Result<CpuStorage> {
        let x = self.packed_f32(layout, "softmax")?;
        let d = layout.dims().last().copied().unwrap_or(1);
        Ok(CpuStorage::from_f32(rowwise::softmax(&x, d), self.dtype()))
    }

    fn norm_last_dim(
        &self,
        layout: &Layout,
        eps: f32,
        rms: bool,
    ) -> Result<(CpuStorage, CpuStorage)> {
        let x = self.packed_f32(layout, if rms { "rms_norm" } else { "layer_norm" })?;
        let d = layout.dims().last().copied().unwrap_or(1);
        let (y, rstd) = rowwise::norm(&x, d, eps, rms);
        Ok((
            CpuStorage::from_f32(y, self.dtype()),
            CpuStorage::from_f32(rstd, self.dtype()),
        ))
    }

    fn rope_interleaved(
        &self,
        layout: &Layout,
        cos: &CpuStorage,
        cos_layout: &Layout,
        sin: &CpuStorage,
        sin_layout: &Layout,
    ) -> Result<CpuStorage> {
        let x = self.packed_f32(layout, "rope_interleaved")?;
        let cos = cos.packed_f32(cos_layout, "rope_interleaved")?;
        let sin = sin.packed_f32(sin_layout, "rope_interleaved")?;
        let dims = layout.dims();
        let (seq, d) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        Ok(CpuStorage::from_f32(
            rowwise::rope_interleaved(&x, seq, d, &cos, &sin),
            self.dtype(),
        ))
    }
}

impl BackendDevice for CpuDevice {
    type Storage = CpuStorage;

    fn location(&self) -> Device {
        Device::Cpu
    }

    fn zeros(&self, shape: &Shape, dtype: DType) -> Result<CpuStorage> {
        let n = shape.elem_count();
        Ok(match dtype {
            DType::F32 => CpuStorage::F32(vec![0.0; n]),
            DType::BF16 => CpuStorage::BF16(vec![0; n]),
            DType::U8 => CpuStorage::U8(vec![0; n]),
        })
    }

    fn storage_from_cpu(&self, data: CpuStorage) -> Result<CpuStorage> {
        Ok(data)
    }
}
