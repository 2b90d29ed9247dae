//! Launches of `runtime/kernels/linear_ops.cu` and the GEMM with its post
//! operations that the CUDA linear primitives ([`super::operand`]) run:
//! padded and converted copies, decoded FP8 codes, the scale-and-bias
//! epilogue, column sums, and a cuBLASLt GEMM whose bias goes into its
//! epilogue where cuBLASLt fuses it.

use cudarc::driver::LaunchConfig;

use super::gemm::{fuses_f32_bias, GemmBias, GemmSpec, MatLayout};
use super::nvrtc::{launch_kernel, KernelSource, Platform};
use super::{CudaContext, CudaError, DevBuf, GemmDType, GemmOperand, Result};
use crate::backend::Format;
use crate::formats::ElemFormat;
use crate::DType;

/// `runtime/kernels/linear_ops.cu`.
pub const LINEAR_OPS: KernelSource = KernelSource {
    name: "linear_ops.cu",
    body: include_str!("../../kernels/linear_ops.cu"),
};

/// Input element kinds of `lin_copy2d` (IN_* in linear_ops.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum In {
    F32 = 0,
    Bf16 = 1,
    U8 = 2,
    E4M3FN = 3,
    E5M2 = 4,
    E4M3FNUZ = 5,
    E5M2FNUZ = 6,
}

/// Output element kinds of `lin_copy2d` (OUT_* in linear_ops.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Out {
    F32 = 0,
    Bf16 = 1,
    U8 = 2,
}

impl Out {
    pub(super) fn size(self) -> usize {
        match self {
            Out::F32 => 4,
            Out::Bf16 => 2,
            Out::U8 => 1,
        }
    }
}

pub(super) fn act_in(act: DType) -> Result<In> {
    match act {
        DType::F32 => Ok(In::F32),
        DType::BF16 => Ok(In::Bf16),
        other => Err(CudaError::Invalid(format!(
            "linear activations are f32 or bf16, not {other:?}"
        ))),
    }
}

pub(super) fn act_out(act: DType) -> Out {
    match act {
        DType::BF16 => Out::Bf16,
        _ => Out::F32,
    }
}

fn gemm_out(o: Out) -> GemmDType {
    match o {
        Out::Bf16 => GemmDType::Bf16,
        _ => GemmDType::F32,
    }
}

pub(super) fn decoded(elem: ElemFormat) -> In {
    match elem {
        ElemFormat::E4M3FN => In::E4M3FN,
        ElemFormat::E5M2 => In::E5M2,
        ElemFormat::E4M3FNUZ => In::E4M3FNUZ,
        _ => In::E5M2FNUZ,
    }
}

/// Whether cuBLASLt multiplies these FP8 formats on NVIDIA: E4M3FN and
/// E5M2, at least one of them E4M3FN.
fn cublas_fp8(fa: ElemFormat, fb: ElemFormat) -> bool {
    let ocp = |e| matches!(e, ElemFormat::E4M3FN | ElemFormat::E5M2);
    ocp(fa) && ocp(fb) && (fa == ElemFormat::E4M3FN || fb == ElemFormat::E4M3FN)
}

fn fp8_dtype(elem: ElemFormat) -> GemmDType {
    if elem == ElemFormat::E5M2 {
        GemmDType::Fp8E5M2
    } else {
        GemmDType::Fp8E4M3
    }
}

/// The operand types of the platform's native GEMM for the quantized
/// formats `a` x `b`: cuBLASLt FP8 where [`cublas_fp8`] takes the pair on
/// CUDA, `rocm::gemm_path`'s choice on HIP; `None` decodes to BF16.
pub(super) fn native_types(
    ctx: &CudaContext,
    a: &Format,
    b: &Format,
) -> Option<(GemmDType, GemmDType)> {
    match ctx.platform() {
        Platform::Cuda => match (a, b) {
            (Format::Tensorwise { elem: fa, .. }, Format::Tensorwise { elem: fb, .. })
                if cublas_fp8(*fa, *fb) =>
            {
                Some((fp8_dtype(*fa), fp8_dtype(*fb)))
            }
            (Format::Fp8Group(ca), Format::Fp8Group(cb)) => super::fp8_group::cuda_types(ca, cb),
            _ => None,
        },
        #[cfg(feature = "rocm")]
        Platform::Hip => crate::rocm::blas::native_types(&ctx.info().arch, a, b),
        #[cfg(not(feature = "rocm"))]
        Platform::Hip => None,
    }
}

pub(super) fn r16(v: usize) -> usize {
    v.div_ceil(16) * 16
}

pub(super) fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| CudaError::Invalid(format!("{what} = {v} does not fit in 32 bits")))
}

impl CudaContext {
    /// `[out_rows, out_cols]` from `[rows, cols]` (transposed when asked),
    /// zero-padded or cropped, converted from `inp` to `out`.
    pub(super) fn lin_copy2d(
        &self,
        (src, inp): (&DevBuf, In),
        (rows, cols): (usize, usize),
        (out_rows, out_cols): (usize, usize),
        transpose: bool,
        out: Out,
    ) -> Result<DevBuf> {
        let dst = self.alloc(out_rows * out_cols * out.size())?;
        if out_rows == 0 || out_cols == 0 {
            return Ok(dst);
        }
        let (sp, dp) = (src.ptr(), dst.ptr());
        let (r, c) = (u32_of(rows, "rows")?, u32_of(cols, "cols")?);
        let (or, oc) = (u32_of(out_rows, "rows")?, u32_of(out_cols, "cols")?);
        let (t, ik, ok) = (transpose as i32, inp as i32, out as i32);
        let gy = out_rows.div_ceil(32);
        if gy > 65535 {
            return Err(CudaError::Invalid(format!(
                "lin_copy2d: {out_rows} rows exceed the grid limit"
            )));
        }
        let cfg = LaunchConfig {
            grid_dim: (u32_of(out_cols.div_ceil(32), "column tiles")?, gy as u32, 1),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        // `dst` holds out_rows * out_cols elements; the kernel reads `src`
        // only inside rows x cols.
        launch_kernel!(
            self,
            &LINEAR_OPS,
            "lin_copy2d",
            cfg,
            &sp,
            &dp,
            &r,
            &c,
            &or,
            &oc,
            &t,
            &ik,
            &ok
        )?;
        Ok(dst)
    }

    /// `[rows, cols]` of `acc` (row stride `ld`, f32) times `scale_a * scale_b`
    /// (device f32 pointers) plus `bias`, as f32 or BF16.
    #[allow(clippy::too_many_arguments)]
    fn lin_epilogue(
        &self,
        acc: &DevBuf,
        ld: usize,
        rows: usize,
        cols: usize,
        scales: Option<(u64, u64)>,
        bias: Option<&DevBuf>,
        out: Out,
    ) -> Result<DevBuf> {
        let dst = self.alloc(rows * cols * out.size())?;
        let n = (rows * cols) as u64;
        if n == 0 {
            return Ok(dst);
        }
        let (sa, sb) = scales.unwrap_or((0, 0));
        let bp = bias.map_or(0, |b| b.ptr());
        let (of, ob) = match out {
            Out::Bf16 => (0u64, dst.ptr()),
            _ => (dst.ptr(), 0u64),
        };
        let ap = acc.ptr();
        // Four columns a thread; 16-byte accesses when every row start is aligned.
        let vec = u32::from(ld % 4 == 0 && cols % 4 == 0);
        let (ld, r, c) = (
            u32_of(ld, "ld")?,
            u32_of(rows, "rows")?,
            u32_of(cols, "cols")?,
        );
        let groups = u32_of(cols.div_ceil(4 * 256), "column groups")?;
        if groups > 65535 {
            return Err(CudaError::Invalid(format!(
                "lin_epilogue: {cols} columns exceed the grid limit"
            )));
        }
        let cfg = LaunchConfig {
            grid_dim: (r, groups, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // `acc` holds rows x ld f32.
        launch_kernel!(
            self,
            &LINEAR_OPS,
            "lin_epilogue",
            cfg,
            &ap,
            &ld,
            &sa,
            &sb,
            &bp,
            &of,
            &ob,
            &r,
            &c,
            &vec
        )?;
        Ok(dst)
    }

    /// `[fl32(scale_a * scale_b), 0]` on the device (f32 pointers): the
    /// alpha and beta of a GEMM that applies the scales itself.
    fn lin_scale_pair(&self, (sa, sb): (u64, u64)) -> Result<DevBuf> {
        let out = self.alloc(8)?;
        let op = out.ptr();
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        // `sa` and `sb` point at one f32 each, `out` holds two.
        launch_kernel!(self, &LINEAR_OPS, "lin_scale_pair", cfg, &sa, &sb, &op)?;
        Ok(out)
    }

    /// Column sums of `[rows, cols]` in f32.
    pub(super) fn lin_colsum(
        &self,
        x: &DevBuf,
        inp: In,
        rows: usize,
        cols: usize,
    ) -> Result<DevBuf> {
        const CHUNK_ROWS: usize = 64;
        /// Columns per thread of `lin_colsum_partial` (COLSUM_VEC).
        const VEC: usize = 8;
        if rows == 0 || cols == 0 {
            return self.alloc_zeroed(cols * 4);
        }
        let chunks = rows.div_ceil(CHUNK_ROWS);
        let partial = self.alloc(chunks * cols * 4)?;
        let (xp, pp) = (x.ptr(), partial.ptr());
        let (r, c, ch, cr) = (
            u32_of(rows, "rows")?,
            u32_of(cols, "cols")?,
            u32_of(chunks, "chunks")?,
            CHUNK_ROWS as u32,
        );
        let ik = inp as i32;
        let vec = u32::from(matches!(inp, In::F32 | In::Bf16) && cols % VEC == 0);
        if chunks > 65535 {
            return Err(CudaError::Invalid(format!(
                "lin_colsum: {rows} rows exceed the grid limit"
            )));
        }
        let cfg = LaunchConfig {
            grid_dim: (u32_of(cols.div_ceil(256 * VEC), "CTAs")?, ch, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // `partial` holds chunks x cols f32.
        launch_kernel!(
            self,
            &LINEAR_OPS,
            "lin_colsum_partial",
            cfg,
            &xp,
            &ik,
            &pp,
            &r,
            &c,
            &cr,
            &vec
        )?;
        self.lin_colsum_final(&partial, chunks, cols)
    }

    /// `[cols]` f32: the sum over `chunks` of `partial[chunk][c]`, in chunk
    /// order. The second pass of [`Self::lin_colsum`] and of the column
    /// sums that the NVFP4 amax pass takes.
    pub(super) fn lin_colsum_final(
        &self,
        partial: &DevBuf,
        chunks: usize,
        cols: usize,
    ) -> Result<DevBuf> {
        let out = self.alloc(cols * 4)?;
        let (pp, op) = (partial.ptr(), out.ptr());
        let (ch, c) = (u32_of(chunks, "chunks")?, u32_of(cols, "cols")?);
        let cfg = LaunchConfig {
            grid_dim: (u32_of(cols.div_ceil(256), "CTAs")?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // `partial` holds chunks x cols f32, `out` cols f32.
        launch_kernel!(
            self,
            &LINEAR_OPS,
            "lin_colsum_final",
            cfg,
            &pp,
            &op,
            &ch,
            &c
        )?;
        Ok(out)
    }

    /// `y = a · b^T` per [`GemmShape`], then scales (f32 pointers), bias and
    /// a crop to `[rows, cols]`, written as `out`. The bias goes into the
    /// GEMM's epilogue (f32 accumulator + f32 bias, rounded once) when the
    /// result needs nothing else and cuBLASLt fuses an f32 bias for the
    /// types ([`fuses_f32_bias`]: BF16 operands, f32 output); the scales of
    /// BF16 operands become the GEMM's alpha, read on the device
    /// (`lin_scale_pair`), where nothing else is left to do. Otherwise an
    /// f32 result goes through `lin_epilogue`, which scales, adds the bias
    /// and rounds once, as the CPU does.
    pub(super) fn lin_gemm<'a>(
        &self,
        a: &Operand,
        b: &Operand,
        g: GemmShape,
        post: Post<'a>,
        out: Out,
    ) -> Result<DevBuf> {
        let GemmShape { m, n, k } = g;
        let spec = |bias: Option<&'a DevBuf>| GemmSpec {
            m,
            n,
            k,
            batch: 1,
            a: a.layout(),
            b: b.layout(),
            y: MatLayout::packed(m, n),
            bias: bias.map(|buf| GemmBias {
                buf,
                dtype: GemmDType::F32,
            }),
            alpha: None,
        };
        let (rows, cols) = post.crop.unwrap_or((m, n));
        // f32 operands write f32: a BF16 result goes through the epilogue.
        let direct = a.op.dtype != GemmDType::F32 || out == Out::F32;
        let fused_bias = post.bias.is_none() || fuses_f32_bias(a.op.dtype, gemm_out(out));
        let whole = (rows, cols) == (m, n);
        if direct && whole && post.scales.is_none() && !fused_bias {
            // No fused f32 bias for these types: it is added below.
            BIAS_FALLBACKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // One GEMM when nothing is left after it; the scales of BF16
        // operands become its alpha, read on the device.
        let alpha_ok = post.scales.is_none() || a.op.dtype == GemmDType::Bf16;
        if direct && whole && fused_bias && alpha_ok {
            let alpha = post.scales.map(|s| self.lin_scale_pair(s)).transpose()?;
            let y = self.alloc(m * n * out.size())?;
            let spec = GemmSpec {
                alpha: alpha.as_ref(),
                ..spec(post.bias)
            };
            match self.gemm(&a.op, &b.op, &spec, &y, gemm_out(out)) {
                Ok(()) => return Ok(y),
                // No algorithm reads alpha on the device: scaled below.
                Err(CudaError::Blas(_)) if alpha.is_some() => {
                    SCALE_FALLBACKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        let acc = self.alloc(m * n * 4)?;
        self.gemm(&a.op, &b.op, &spec(None), &acc, GemmDType::F32)?;
        self.lin_epilogue(&acc, n, rows, cols, post.scales, post.bias, out)
    }
}

/// Forward GEMMs whose bias cuBLASLt could not fuse (see [`bias_fallbacks`]).
static BIAS_FALLBACKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// GEMMs of scaled BF16 operands whose scales the library could not take as
/// a device alpha (see [`scale_fallbacks`]).
static SCALE_FALLBACKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many GEMMs since the process started applied their tensor scales in
/// `lin_epilogue` because the BLAS library had no algorithm with a device
/// alpha for them.
pub fn scale_fallbacks() -> usize {
    SCALE_FALLBACKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// How many forward GEMMs since the process started added their bias in a
/// second pass because cuBLASLt has no fused f32 bias for their types.
pub fn bias_fallbacks() -> usize {
    BIAS_FALLBACKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// M, N, K of one GEMM (after any padding).
#[derive(Clone, Copy, Debug)]
pub(super) struct GemmShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// What follows a GEMM: per-tensor scales, a bias, a crop of padding.
#[derive(Clone, Copy, Default)]
pub(super) struct Post<'a> {
    pub scales: Option<(u64, u64)>,
    pub bias: Option<&'a DevBuf>,
    pub crop: Option<(usize, usize)>,
}

/// A GEMM operand: `[rows, K]` with K contiguous (`ld` = K), or stored
/// transposed as `[K, ld]` so that it is read in place.
pub(super) struct Operand<'a> {
    op: GemmOperand<'a>,
    ld: usize,
    transposed: bool,
}

impl<'a> Operand<'a> {
    /// K-contiguous rows of length `ld`.
    pub(super) fn rows(buf: &'a DevBuf, dtype: GemmDType, ld: usize) -> Self {
        Operand {
            op: GemmOperand {
                buf,
                dtype,
                scale_inv: None,
            },
            ld,
            transposed: false,
        }
    }

    /// Stored `[K, ld]`: the operand's rows are the columns.
    pub(super) fn cols(buf: &'a DevBuf, dtype: GemmDType, ld: usize) -> Self {
        Operand {
            transposed: true,
            ..Operand::rows(buf, dtype, ld)
        }
    }

    /// The buffer read.
    pub(super) fn buf(&self) -> &'a DevBuf {
        self.op.buf
    }

    /// FP8 codes `[rows, ld]` with their scale_inv pointer.
    pub(super) fn fp8(buf: &'a DevBuf, dtype: GemmDType, ld: usize, scale_inv: u64) -> Self {
        let mut o = Operand::rows(buf, dtype, ld);
        o.op.scale_inv = Some(scale_inv);
        o
    }

    fn layout(&self) -> MatLayout {
        MatLayout {
            offset_elems: 0,
            ld: self.ld,
            batch_stride: 0,
            transposed: self.transposed,
        }
    }
}

impl CudaContext {
    /// A GEMM of tensorwise FP8 codes `a[m, k]`, `b[n, k]`, zero-padded to
    /// multiples of 16, with their scale_inv pointers: the BLAS library's FP8
    /// GEMM where it takes the formats ([`native_types`]: on CUDA the OCP
    /// formats, on gfx942 the FNUZ ones, on gfx950 the OCP ones); otherwise
    /// the codes decoded exactly to BF16, a BF16 GEMM and both scales
    /// applied after it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn lin_fp8_gemm(
        &self,
        fa: ElemFormat,
        a: (&DevBuf, u64),
        fb: ElemFormat,
        b: (&DevBuf, u64),
        g: GemmShape,
        post: Post,
        out: Out,
    ) -> Result<DevBuf> {
        let GemmShape { m, n, k } = g;
        let tensorwise = |elem| Format::Tensorwise { elem, pow2: false };
        if let Some((ta, tb)) = native_types(self, &tensorwise(fa), &tensorwise(fb)) {
            return self.lin_gemm(
                &Operand::fp8(a.0, ta, k, a.1),
                &Operand::fp8(b.0, tb, k, b.1),
                g,
                post,
                out,
            );
        }
        let ad = self.lin_copy2d((a.0, decoded(fa)), (m, k), (m, k), false, Out::Bf16)?;
        let bd = self.lin_copy2d((b.0, decoded(fb)), (n, k), (n, k), false, Out::Bf16)?;
        self.lin_gemm(
            &Operand::rows(&ad, GemmDType::Bf16, k),
            &Operand::rows(&bd, GemmDType::Bf16, k),
            g,
            Post {
                scales: Some((a.1, b.1)),
                ..post
            },
            out,
        )
    }
}
