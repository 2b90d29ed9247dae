//! The recipe linears on the GPU: y = x W^T + b and its backward, on device
//! buffers, following the CPU reference [`crate::recipe::linear`] (SPEC
//! section 4) operand for operand.
//!
//! | recipe | GEMMs |
//! |---|---|
//! | `bf16` | BF16 operands, cuBLASLt BF16 GEMM, f32 accumulation |
//! | `fp8` | tensorwise E4M3 (x, W) and E5M2 (dy), cuBLASLt FP8 GEMMs with per-tensor scale pointers |
//! | `fp8_fnuz` | as `fp8` with the FNUZ formats, which cuBLASLt lacks on NVIDIA: codes decoded exactly to BF16, BF16 GEMM, both scales applied after it |
//! | `mxfp4`, `mxfp8` | MX codes dequantized exactly to BF16, BF16 GEMM (Hopper has no FP4 MMA) |
//!
//! Each GEMM quantizes its operands along its own reduction axis, and one
//! pass over a tensor writes every copy the GEMMs need: the FP8 cast writes
//! the codes and their transpose, `mx_tile` quantizes along rows and columns
//! at once and writes the dequantized BF16 operand directly. The saved
//! operands are the column-wise copies, so the backward reads them as they
//! are. BF16 operands are read in place, transposed where need be, when the
//! shape is aligned to 16; otherwise they are zero-padded copies and the
//! results are cropped. Bias goes into the GEMM's epilogue; db is the f32
//! column sum of dy.
//!
//! Activations (x, y, dy, dx) are f32 or BF16, as `act` says; W, b, dW and db
//! are f32. A non-finite amax under the FP8 recipes is the CPU's error (it
//! names layer, role and iteration); it is recorded on the device and raised
//! by the next read-back or [`CudaContext::check_deferred`], so the step
//! never waits for it.

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::gemm::{fuses_f32_bias, GemmBias, GemmSpec, MatLayout};
use super::nvrtc::KernelSource;
use super::quantize::{mode_arg, Fp8Device2d, Fp8Outputs};
use super::{driver_err, CudaContext, CudaError, DevBuf, GemmDType, GemmOperand, Result};
use super::{DequantLayout, MxDevice};
use crate::formats::ElemFormat;
use crate::quant::{Fp8Tensor, MxConfig, MxTensor, SrKey};
use crate::recipe::linear::{LinearCtx, LinearShape, Saved};
use crate::recipe::{Recipe, RecipeKind};
use crate::DType;

/// `runtime/kernels/linear_ops.cu`.
pub const LINEAR_OPS: KernelSource = KernelSource {
    name: "linear_ops.cu",
    body: include_str!("../../kernels/linear_ops.cu"),
};

/// `runtime/kernels/mx_tile.cu`.
pub const MX_TILE: KernelSource = KernelSource {
    name: "mx_tile.cu",
    body: include_str!("../../kernels/mx_tile.cu"),
};

/// Input element kinds of `lin_copy2d` (IN_* in linear_ops.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum In {
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
enum Out {
    F32 = 0,
    Bf16 = 1,
    U8 = 2,
}

impl Out {
    fn size(self) -> usize {
        match self {
            Out::F32 => 4,
            Out::Bf16 => 2,
            Out::U8 => 1,
        }
    }
}

fn act_in(act: DType) -> Result<In> {
    match act {
        DType::F32 => Ok(In::F32),
        DType::BF16 => Ok(In::Bf16),
        other => Err(CudaError::Invalid(format!(
            "linear activations are f32 or bf16, not {other:?}"
        ))),
    }
}

fn act_out(act: DType) -> Out {
    if act == DType::BF16 {
        Out::Bf16
    } else {
        Out::F32
    }
}

fn gemm_out(o: Out) -> GemmDType {
    if o == Out::Bf16 {
        GemmDType::Bf16
    } else {
        GemmDType::F32
    }
}

fn decoded(elem: ElemFormat) -> In {
    match elem {
        ElemFormat::E4M3FN => In::E4M3FN,
        ElemFormat::E5M2 => In::E5M2,
        ElemFormat::E4M3FNUZ => In::E4M3FNUZ,
        _ => In::E5M2FNUZ,
    }
}

fn fp8_dtype(elem: ElemFormat) -> GemmDType {
    if elem == ElemFormat::E5M2 {
        GemmDType::Fp8E5M2
    } else {
        GemmDType::Fp8E4M3
    }
}

fn r16(v: usize) -> usize {
    v.div_ceil(16) * 16
}

fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| CudaError::Invalid(format!("{what} = {v} does not fit in 32 bits")))
}

/// What the forward keeps for the backward (SPEC section 4), on the device.
pub enum SavedDevice {
    /// x in BF16, `[m, k]`.
    Bf16 { x: DevBuf, m: usize, k: usize },
    /// x and W in E4M3 with their scales, kept as the wgrad and dgrad GEMMs
    /// read them: x^T `[r16(k), r16(m)]` and W^T `[r16(k), r16(n)]`,
    /// zero-padded.
    Fp8 {
        x: Fp8Device2d,
        w: Fp8Device2d,
        m: usize,
        k: usize,
        n: usize,
    },
    /// x quantized along M (Hadamard per recipe) and W along N: the CPU's
    /// axis-last rows, `[k, m]` and `[k, n]`.
    Mx { x_m: MxDevice, w_n: MxDevice },
}

impl SavedDevice {
    /// Bytes held, counted as the CPU's [`Saved::nbytes`] (padding excluded).
    pub fn nbytes(&self) -> usize {
        match self {
            SavedDevice::Bf16 { m, k, .. } => 2 * m * k,
            SavedDevice::Fp8 { m, k, n, .. } => m * k + 8 + n * k + 8,
            SavedDevice::Mx { x_m, w_n } => {
                x_m.code_bytes() + x_m.nblocks() + w_n.code_bytes() + w_n.nblocks()
            }
        }
    }

    /// Elements of the saved tensors, before any padding.
    pub fn elements(&self) -> usize {
        match self {
            SavedDevice::Bf16 { m, k, .. } => m * k,
            SavedDevice::Fp8 { m, k, n, .. } => m * k + n * k,
            SavedDevice::Mx { x_m, w_n } => x_m.rows * x_m.len + w_n.rows * w_n.len,
        }
    }

    /// The saved tensors read back as the CPU's [`Saved`] (waits for the stream).
    pub fn download(&self, ctx: &CudaContext) -> Result<Saved> {
        Ok(match self {
            SavedDevice::Bf16 { x, m, k } => Saved::Bf16 {
                x: ctx.download(x, m * k)?,
            },
            SavedDevice::Fp8 { x, w, m, k, n } => {
                // Stored transposed and padded: [r16(k), r16(rows)] back to [rows, k].
                let get = |q: &Fp8Device2d, rows: usize| -> Result<Fp8Tensor> {
                    let (_, scale, scale_inv) = q.read_scales(ctx)?;
                    let t = q.codes_t.as_ref().ok_or_else(|| {
                        CudaError::Invalid("saved FP8 operand without its transposed codes".into())
                    })?;
                    let codes =
                        ctx.lin_copy2d(t, In::U8, r16(*k), r16(rows), rows, *k, true, Out::U8)?;
                    Ok(Fp8Tensor {
                        shape: vec![rows, *k],
                        elem: q.elem,
                        codes: ctx.download(&codes, rows * k)?,
                        scale,
                        scale_inv,
                    })
                };
                Saved::Fp8 {
                    x: get(x, *m)?,
                    w: get(w, *n)?,
                }
            }
            SavedDevice::Mx { x_m, w_n } => {
                // quantize_mx(.., [len, rows], axis 0): rows = the other axis.
                let get = |q: &MxDevice| -> Result<MxTensor> {
                    Ok(MxTensor {
                        shape: vec![q.len, q.rows],
                        axis: 0,
                        config: q.config,
                        rows: q.rows,
                        len: q.len,
                        padded_len: q.padded_len,
                        codes: ctx.download(&q.codes, q.code_bytes())?,
                        scales: ctx.download(&q.scales, q.nblocks())?,
                    })
                };
                Saved::Mx {
                    x_m: get(x_m)?,
                    w_n: get(w_n)?,
                }
            }
        })
    }
}

/// Gradients of one linear on the device: dx `[m, k]` in the activation
/// dtype, dW `[n, k]` and db `[n]` in f32.
pub struct DeviceGrads {
    pub dx: DevBuf,
    pub dw: DevBuf,
    pub db: Option<DevBuf>,
}

// ---------------------------------------------------------------------------
// Launch helpers

impl CudaContext {
    /// `[out_rows, out_cols]` from `[rows, cols]` (transposed when asked),
    /// zero-padded, converted from `inp` to `out`.
    #[allow(clippy::too_many_arguments)]
    fn lin_copy2d(
        &self,
        src: &DevBuf,
        inp: In,
        rows: usize,
        cols: usize,
        out_rows: usize,
        out_cols: usize,
        transpose: bool,
        out: Out,
    ) -> Result<DevBuf> {
        let dst = self.alloc(out_rows * out_cols * out.size())?;
        if out_rows == 0 || out_cols == 0 {
            return Ok(dst);
        }
        let f = self.function(&LINEAR_OPS, "lin_copy2d")?;
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
        self.bind()?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&sp)
            .arg(&dp)
            .arg(&r)
            .arg(&c)
            .arg(&or)
            .arg(&oc)
            .arg(&t)
            .arg(&ik)
            .arg(&ok);
        // SAFETY: matches lin_copy2d in linear_ops.cu; `dst` holds out_rows *
        // out_cols elements and the kernel reads `src` only inside rows x cols.
        unsafe { b.launch(cfg) }.map_err(driver_err("launch lin_copy2d"))?;
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
        let f = self.function(&LINEAR_OPS, "lin_epilogue")?;
        let (sa, sb) = scales.unwrap_or((0, 0));
        let bp = bias.map_or(0, |b| b.ptr());
        let (of, ob) = match out {
            Out::Bf16 => (0u64, dst.ptr()),
            _ => (dst.ptr(), 0u64),
        };
        let ap = acc.ptr();
        let (ld, r, c) = (
            u32_of(ld, "ld")?,
            u32_of(rows, "rows")?,
            u32_of(cols, "cols")?,
        );
        let cfg = LaunchConfig {
            grid_dim: (u32_of(n.div_ceil(256) as usize, "CTAs")?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        self.bind()?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&ap)
            .arg(&ld)
            .arg(&sa)
            .arg(&sb)
            .arg(&bp)
            .arg(&of)
            .arg(&ob)
            .arg(&r)
            .arg(&c);
        // SAFETY: matches lin_epilogue in linear_ops.cu; `acc` holds rows x ld f32.
        unsafe { b.launch(cfg) }.map_err(driver_err("launch lin_epilogue"))?;
        Ok(dst)
    }

    /// Column sums of `[rows, cols]` in f32.
    fn lin_colsum(&self, x: &DevBuf, inp: In, rows: usize, cols: usize) -> Result<DevBuf> {
        const CHUNK_ROWS: usize = 64;
        let out = self.alloc_zeroed(cols * 4)?;
        if rows == 0 || cols == 0 {
            return Ok(out);
        }
        let chunks = rows.div_ceil(CHUNK_ROWS);
        let partial = self.alloc(chunks * cols * 4)?;
        let p1 = self.function(&LINEAR_OPS, "lin_colsum_partial")?;
        let p2 = self.function(&LINEAR_OPS, "lin_colsum_final")?;
        let (xp, pp, op) = (x.ptr(), partial.ptr(), out.ptr());
        let (r, c, ch, cr) = (
            u32_of(rows, "rows")?,
            u32_of(cols, "cols")?,
            u32_of(chunks, "chunks")?,
            CHUNK_ROWS as u32,
        );
        let ik = inp as i32;
        let gx = u32_of(cols.div_ceil(256), "CTAs")?;
        if chunks > 65535 {
            return Err(CudaError::Invalid(format!(
                "lin_colsum: {rows} rows exceed the grid limit"
            )));
        }
        self.bind()?;
        let mut b = self.stream().launch_builder(&p1);
        b.arg(&xp).arg(&ik).arg(&pp).arg(&r).arg(&c).arg(&cr);
        let cfg = LaunchConfig {
            grid_dim: (gx, ch, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches lin_colsum_partial; `partial` holds chunks x cols f32.
        unsafe { b.launch(cfg) }.map_err(driver_err("launch lin_colsum_partial"))?;
        let mut b = self.stream().launch_builder(&p2);
        b.arg(&pp).arg(&op).arg(&ch).arg(&c);
        let cfg = LaunchConfig {
            grid_dim: (gx, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches lin_colsum_final; `out` holds cols f32.
        unsafe { b.launch(cfg) }.map_err(driver_err("launch lin_colsum_final"))?;
        Ok(out)
    }

    /// `y = a · b^T` per [`GemmShape`], then scales (f32 pointers), bias and
    /// a crop to `[rows, cols]`, written as `out`. The bias goes into the
    /// GEMM's epilogue (f32 accumulator + f32 bias, rounded once) when the
    /// result needs nothing else and cuBLASLt fuses an f32 bias for the
    /// types ([`fuses_f32_bias`]: BF16 operands, f32 output); otherwise an
    /// f32 result goes through `lin_epilogue`, which adds the bias and
    /// rounds once, as the CPU does.
    fn lin_gemm<'a>(
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
        };
        let (rows, cols) = post.crop.unwrap_or((m, n));
        if post.scales.is_none() && (rows, cols) == (m, n) {
            if post.bias.is_none() || fuses_f32_bias(a.op.dtype, gemm_out(out)) {
                let y = self.alloc(m * n * out.size())?;
                self.gemm(&a.op, &b.op, &spec(post.bias), &y, gemm_out(out))?;
                return Ok(y);
            }
            // No fused f32 bias for these types: it is added below.
            BIAS_FALLBACKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let acc = self.alloc(m * n * 4)?;
        self.gemm(&a.op, &b.op, &spec(None), &acc, GemmDType::F32)?;
        self.lin_epilogue(&acc, n, rows, cols, post.scales, post.bias, out)
    }

    /// MX quantization of `x` (`[rows, cols]`, f32 or BF16) along its rows
    /// and/or its columns in one pass (`mx_tile.cu`).
    #[allow(clippy::too_many_arguments)]
    fn mx_tile(
        &self,
        x: &DevBuf,
        dtype: DType,
        rows: usize,
        cols: usize,
        cfg: &MxConfig,
        by_row: Option<MxWant>,
        by_col: Option<MxWant>,
    ) -> Result<(MxOut, MxOut)> {
        if cfg.tile2d && [by_row, by_col].iter().flatten().any(|w| w.hadamard) {
            return Err(CudaError::Invalid(
                "32x32 tile scales with the Hadamard option are not supported".into(),
            ));
        }
        let suffix = match (cfg.elem, dtype) {
            (ElemFormat::E2M1, DType::F32) => "mx_tile_e2m1_f32",
            (ElemFormat::E2M1, DType::BF16) => "mx_tile_e2m1_bf16",
            (ElemFormat::E4M3FN, DType::F32) => "mx_tile_e4m3fn_f32",
            (ElemFormat::E4M3FN, DType::BF16) => "mx_tile_e4m3fn_bf16",
            (elem, dt) => {
                return Err(CudaError::Invalid(format!(
                    "MX quantization of {dt:?} input to {elem:?}"
                )))
            }
        };
        let (pr, pc) = (rows.div_ceil(32) * 32, cols.div_ceil(32) * 32);
        // Direction outputs: (quantized rows, padded length) = (rows, pc) or (cols, pr).
        let make = |want: Option<MxWant>, r: usize, len: usize, plen: usize| -> Result<MxOut> {
            let Some(w) = want else {
                return Ok(MxOut {
                    q: None,
                    deq: None,
                    config: *cfg,
                });
            };
            let config = MxConfig {
                hadamard: w.hadamard,
                sr: w.sr,
                ..*cfg
            };
            let q = if w.codes {
                Some(MxDevice {
                    rows: r,
                    len,
                    padded_len: plen,
                    config,
                    codes: self.alloc(r * plen * cfg.elem.bits() as usize / 8)?,
                    scales: self.alloc(r * plen / 32)?,
                })
            } else {
                None
            };
            let deq = if w.deq {
                Some(self.alloc(r * plen * 2)?)
            } else {
                None
            };
            Ok(MxOut { q, deq, config })
        };
        let ro = make(by_row, rows, cols, pc)?;
        let co = make(by_col, cols, rows, pr)?;
        if rows == 0 || cols == 0 {
            return Ok((ro, co));
        }
        let dir = |o: &MxOut| MxDir {
            codes: o.q.as_ref().map_or(0, |q| q.codes.ptr()),
            scales: o.q.as_ref().map_or(0, |q| q.scales.ptr()),
            deq: o.deq.as_ref().map_or(0, |d| d.ptr()),
            hadamard: o.config.hadamard as i32,
            sr: o.config.sr.is_some() as i32,
            seed_lo: o.config.sr.map_or(0, |k| k.seed as u32),
            seed_hi: o.config.sr.map_or(0, |k| (k.seed >> 32) as u32),
            step: o.config.sr.map_or(0, |k| k.step as u32),
            tensor_id: o.config.sr.map_or(0, |k| k.tensor_id as u32),
        };
        let (rd, cd) = (dir(&ro), dir(&co));
        let f = self.function(&MX_TILE, suffix)?;
        let (xp, r, c) = (x.ptr(), u32_of(rows, "rows")?, u32_of(cols, "cols")?);
        let (mode, tile2d) = (mode_arg(cfg.scale_mode), cfg.tile2d as i32);
        let gy = rows.div_ceil(32);
        if gy > 65535 {
            return Err(CudaError::Invalid(format!(
                "mx_tile: {rows} rows exceed the grid limit"
            )));
        }
        let cfg = LaunchConfig {
            grid_dim: (
                u32_of(cols.div_ceil(32 * MX_TILES), "column slabs")?,
                gy as u32,
                1,
            ),
            block_dim: (64 * MX_TILES as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        self.bind()?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&xp)
            .arg(&r)
            .arg(&c)
            .arg(&rd)
            .arg(&cd)
            .arg(&mode)
            .arg(&tile2d);
        // SAFETY: matches mx_tile_* in mx_tile.cu; every output was allocated
        // above for its direction's [rows, padded length].
        unsafe { b.launch(cfg) }.map_err(driver_err("launch mx_tile"))?;
        Ok((ro, co))
    }
}

/// Forward GEMMs whose bias cuBLASLt could not fuse (see [`bias_fallbacks`]).
static BIAS_FALLBACKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many forward GEMMs since the process started added their bias in a
/// second pass because cuBLASLt has no fused f32 bias for their types.
pub fn bias_fallbacks() -> usize {
    BIAS_FALLBACKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Slabs of 32x32 tiles per CTA of `mx_tile` (TILES in mx_tile.cu).
const MX_TILES: usize = 4;

/// One direction's options and outputs (struct MxDir in mx_tile.cu, whose
/// last four words are its MxSrKey); null pointers are outputs not wanted.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct MxDir {
    codes: u64,
    scales: u64,
    deq: u64,
    hadamard: i32,
    sr: i32,
    seed_lo: u32,
    seed_hi: u32,
    step: u32,
    tensor_id: u32,
}

// SAFETY: a plain #[repr(C)] struct of integers, laid out as MxDir in mx_tile.cu.
unsafe impl DeviceRepr for MxDir {}

/// What one direction of [`CudaContext::mx_tile`] computes.
#[derive(Clone, Copy, Debug, Default)]
struct MxWant {
    /// Codes and scales (kept for the backward).
    codes: bool,
    /// The dequantized BF16 GEMM operand.
    deq: bool,
    hadamard: bool,
    sr: Option<SrKey>,
}

/// One direction's results of [`CudaContext::mx_tile`].
struct MxOut {
    q: Option<MxDevice>,
    deq: Option<DevBuf>,
    config: MxConfig,
}

impl MxOut {
    fn deq(&self) -> Result<&DevBuf> {
        self.deq
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("mx_tile: dequantized output not computed".into()))
    }

    fn take_q(&mut self) -> Result<MxDevice> {
        self.q
            .take()
            .ok_or_else(|| CudaError::Invalid("mx_tile: codes not computed".into()))
    }
}

/// M, N, K of one GEMM (after any padding).
#[derive(Clone, Copy, Debug)]
struct GemmShape {
    m: usize,
    n: usize,
    k: usize,
}

/// What follows a GEMM: per-tensor scales, a bias, a crop of padding.
#[derive(Clone, Copy, Default)]
struct Post<'a> {
    scales: Option<(u64, u64)>,
    bias: Option<&'a DevBuf>,
    crop: Option<(usize, usize)>,
}

/// A GEMM operand: `[rows, K]` with K contiguous (`ld` = K), or stored
/// transposed as `[K, ld]` so that it is read in place.
struct Operand<'a> {
    op: GemmOperand<'a>,
    ld: usize,
    transposed: bool,
}

impl<'a> Operand<'a> {
    /// K-contiguous rows of length `ld`.
    fn rows(buf: &'a DevBuf, dtype: GemmDType, ld: usize) -> Self {
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
    fn cols(buf: &'a DevBuf, dtype: GemmDType, ld: usize) -> Self {
        Operand {
            transposed: true,
            ..Operand::rows(buf, dtype, ld)
        }
    }

    /// FP8 codes `[rows, ld]` with their scale_inv pointer.
    fn fp8(buf: &'a DevBuf, dtype: GemmDType, ld: usize, scale_inv: u64) -> Self {
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

fn check_bytes(what: &str, buf: &DevBuf, elems: usize, size: usize, s: LinearShape) -> Result<()> {
    if buf.len_bytes() < elems * size {
        return Err(CudaError::Invalid(format!(
            "linear {}x{} -> {}: {what} holds {} bytes, needs {}",
            s.m,
            s.k,
            s.n,
            buf.len_bytes(),
            elems * size
        )));
    }
    Ok(())
}

/// True when every GEMM dimension is a multiple of 16, so that BF16
/// activations are used in place (no padded copies, no crop).
fn aligned(s: LinearShape) -> bool {
    s.m % 16 == 0 && s.n % 16 == 0 && s.k % 16 == 0
}

/// The crop of a GEMM padded to `(mp, np)` back to `(m, n)`, if any.
fn crop(m: usize, n: usize, mp: usize, np: usize) -> Option<(usize, usize)> {
    ((m, n) != (mp, np)).then_some((m, n))
}

// ---------------------------------------------------------------------------
// Forward and backward

/// Forward y = x W^T + b under `recipe` on the GPU: x `[m, k]` in `act`
/// (f32 or BF16), W `[n, k]` and b `[n]` in f32; returns y `[m, n]` in `act`
/// and what backward needs.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    ctx: &CudaContext,
    recipe: &Recipe,
    x: &DevBuf,
    act: DType,
    w: &DevBuf,
    b: Option<&DevBuf>,
    s: LinearShape,
    lctx: &LinearCtx,
) -> Result<(DevBuf, SavedDevice)> {
    let LinearShape { m, k, n } = s;
    let ain = act_in(act)?;
    let aout = act_out(act);
    check_bytes("x", x, m * k, act.size_in_bytes(), s)?;
    check_bytes("W", w, n * k, 4, s)?;
    if let Some(b) = b {
        check_bytes("b", b, n, 4, s)?;
    }
    let (mp, np, kp) = (r16(m), r16(n), r16(k));
    match recipe.kind {
        RecipeKind::Bf16 => {
            // Saved: x in BF16 (a copy: the caller owns x).
            let xb = ctx.lin_copy2d(x, ain, m, k, m, k, false, Out::Bf16)?;
            let xa = if aligned(s) {
                None
            } else {
                Some(ctx.lin_copy2d(&xb, In::Bf16, m, k, mp, kp, false, Out::Bf16)?)
            };
            let wb = ctx.lin_copy2d(w, In::F32, n, k, np, kp, false, Out::Bf16)?;
            let y = ctx.lin_gemm(
                &Operand::rows(xa.as_ref().unwrap_or(&xb), GemmDType::Bf16, kp),
                &Operand::rows(&wb, GemmDType::Bf16, kp),
                GemmShape {
                    m: mp,
                    n: np,
                    k: kp,
                },
                Post {
                    bias: b,
                    crop: crop(m, n, mp, np),
                    ..Post::default()
                },
                aout,
            )?;
            Ok((y, SavedDevice::Bf16 { x: xb, m, k }))
        }
        RecipeKind::Fp8 | RecipeKind::Fp8Fnuz => {
            let (fwd, _) = recipe.fp8_formats();
            // Both orientations at once: the rows feed fprop, the transposed
            // copies are saved for wgrad (x) and dgrad (W).
            let both = Fp8Outputs {
                rows: true,
                cols: true,
            };
            let xq = ctx.quantize_fp8_2d(x, act, m, k, fwd, recipe.pow2, 16, both)?;
            let wq = ctx.quantize_fp8_2d(w, DType::F32, n, k, fwd, recipe.pow2, 16, both)?;
            ctx.defer_finite_check(xq.amax_ptr(), lctx.label("activation"))?;
            ctx.defer_finite_check(wq.amax_ptr(), lctx.label("weight"))?;
            let y = ctx.lin_fp8_gemm(
                recipe.kind,
                fwd,
                (rows_of(&xq)?, xq.scale_inv_ptr()),
                fwd,
                (rows_of(&wq)?, wq.scale_inv_ptr()),
                GemmShape {
                    m: mp,
                    n: np,
                    k: kp,
                },
                Post {
                    bias: b,
                    crop: crop(m, n, mp, np),
                    ..Post::default()
                },
                aout,
            )?;
            let keep = |mut q: Fp8Device2d| {
                q.codes = None;
                q
            };
            Ok((
                y,
                SavedDevice::Fp8 {
                    x: keep(xq),
                    w: keep(wq),
                    m,
                    k,
                    n,
                },
            ))
        }
        RecipeKind::Mxfp4 | RecipeKind::Mxfp8 => {
            let cfg = recipe.mx_config();
            let tiles = MxConfig {
                tile2d: recipe.tile2d,
                ..cfg
            };
            // fprop reads x and W along K (dequantized); the backward keeps
            // x along M (Hadamard per recipe) and W along N (codes).
            let fprop = MxWant {
                deq: true,
                ..MxWant::default()
            };
            let (xr, mut xc) = ctx.mx_tile(
                x,
                act,
                m,
                k,
                &cfg,
                Some(fprop),
                Some(MxWant {
                    codes: true,
                    hadamard: recipe.hadamard,
                    ..MxWant::default()
                }),
            )?;
            let (wr, mut wc) = ctx.mx_tile(
                w,
                DType::F32,
                n,
                k,
                &tiles,
                Some(fprop),
                Some(MxWant {
                    codes: true,
                    ..MxWant::default()
                }),
            )?;
            let kp = k.div_ceil(32) * 32;
            let y = ctx.lin_gemm(
                &Operand::rows(xr.deq()?, GemmDType::Bf16, kp),
                &Operand::rows(wr.deq()?, GemmDType::Bf16, kp),
                GemmShape { m, n, k: kp },
                Post {
                    bias: b,
                    ..Post::default()
                },
                aout,
            )?;
            let saved = SavedDevice::Mx {
                x_m: xc.take_q()?,
                w_n: wc.take_q()?,
            };
            Ok((y, saved))
        }
    }
}

/// The row-major codes of a 2-D FP8 quantization.
fn rows_of(q: &Fp8Device2d) -> Result<&DevBuf> {
    q.codes
        .as_ref()
        .ok_or_else(|| CudaError::Invalid("FP8 operand without its row-major codes".into()))
}

/// The transposed codes of a 2-D FP8 quantization.
fn cols_of(q: &Fp8Device2d) -> Result<&DevBuf> {
    q.codes_t
        .as_ref()
        .ok_or_else(|| CudaError::Invalid("FP8 operand without its transposed codes".into()))
}

impl CudaContext {
    /// An FP8-recipe GEMM of zero-padded codes `a[m, k]`, `b[n, k]` (multiples
    /// of 16) with their scale_inv pointers: cuBLASLt FP8 for `fp8`; for
    /// `fp8_fnuz` (no FNUZ GEMM on NVIDIA) the codes decoded exactly to BF16,
    /// a BF16 GEMM and both scales applied after it.
    #[allow(clippy::too_many_arguments)]
    fn lin_fp8_gemm(
        &self,
        kind: RecipeKind,
        fa: ElemFormat,
        a: (&DevBuf, u64),
        fb: ElemFormat,
        b: (&DevBuf, u64),
        g: GemmShape,
        post: Post,
        out: Out,
    ) -> Result<DevBuf> {
        let GemmShape { m, n, k } = g;
        if kind == RecipeKind::Fp8 {
            return self.lin_gemm(
                &Operand::fp8(a.0, fp8_dtype(fa), k, a.1),
                &Operand::fp8(b.0, fp8_dtype(fb), k, b.1),
                g,
                post,
                out,
            );
        }
        let ad = self.lin_copy2d(a.0, decoded(fa), m, k, m, k, false, Out::Bf16)?;
        let bd = self.lin_copy2d(b.0, decoded(fb), n, k, n, k, false, Out::Bf16)?;
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

/// Backward of [`forward`]: dx `[m, k]` in `act`, dW `[n, k]` and, with a
/// bias, db `[n]` in f32. `dy` is `[m, n]` in `act`; `w` is the f32 master
/// weight (read only by the `bf16` recipe).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    ctx: &CudaContext,
    recipe: &Recipe,
    saved: &SavedDevice,
    w: &DevBuf,
    dy: &DevBuf,
    act: DType,
    has_bias: bool,
    s: LinearShape,
    lctx: &LinearCtx,
) -> Result<DeviceGrads> {
    let LinearShape { m, k, n } = s;
    let ain = act_in(act)?;
    let aout = act_out(act);
    check_bytes("dy", dy, m * n, act.size_in_bytes(), s)?;
    let (mp, np, kp) = (r16(m), r16(n), r16(k));
    let (dx, dw) = match (recipe.kind, saved) {
        (RecipeKind::Bf16, SavedDevice::Bf16 { x, .. }) => {
            check_bytes("W", w, n * k, 4, s)?;
            let wb = ctx.lin_copy2d(w, In::F32, n, k, np, kp, false, Out::Bf16)?;
            // BF16 activations with aligned shapes are read in place; other
            // inputs become zero-padded BF16 copies.
            let (dya, xa);
            let (dy_op, x_op) = if aligned(s) && act == DType::BF16 {
                (dy, x)
            } else {
                dya = ctx.lin_copy2d(dy, ain, m, n, mp, np, false, Out::Bf16)?;
                xa = ctx.lin_copy2d(x, In::Bf16, m, k, mp, kp, false, Out::Bf16)?;
                (&dya, &xa)
            };
            // dgrad dx = dy W: reduction over N; W [n, k] is read as its columns.
            let dx = ctx.lin_gemm(
                &Operand::rows(dy_op, GemmDType::Bf16, np),
                &Operand::cols(&wb, GemmDType::Bf16, kp),
                GemmShape { m: mp, n: kp, k: np },
                Post {
                    crop: crop(m, k, mp, kp),
                    ..Post::default()
                },
                aout,
            )?;
            // wgrad dW = dy^T x: reduction over M; both read as columns.
            let dw = ctx.lin_gemm(
                &Operand::cols(dy_op, GemmDType::Bf16, np),
                &Operand::cols(x_op, GemmDType::Bf16, kp),
                GemmShape { m: np, n: kp, k: mp },
                Post {
                    crop: crop(n, k, np, kp),
                    ..Post::default()
                },
                Out::F32,
            )?;
            (dx, dw)
        }
        (RecipeKind::Fp8 | RecipeKind::Fp8Fnuz, SavedDevice::Fp8 { x, w: wq, .. }) => {
            let (fwd, grad) = recipe.fp8_formats();
            let dyq = ctx.quantize_fp8_2d(
                dy,
                act,
                m,
                n,
                grad,
                recipe.pow2,
                16,
                Fp8Outputs {
                    rows: true,
                    cols: true,
                },
            )?;
            ctx.defer_finite_check(dyq.amax_ptr(), lctx.label("gradient"))?;
            let sdy = dyq.scale_inv_ptr();
            // dgrad: dy [mp, np] x (W^T) [kp, np].
            let dx = ctx.lin_fp8_gemm(
                recipe.kind,
                grad,
                (rows_of(&dyq)?, sdy),
                fwd,
                (cols_of(wq)?, wq.scale_inv_ptr()),
                GemmShape { m: mp, n: kp, k: np },
                Post {
                    crop: crop(m, k, mp, kp),
                    ..Post::default()
                },
                aout,
            )?;
            // wgrad: (dy^T) [np, mp] x (x^T) [kp, mp].
            let dw = ctx.lin_fp8_gemm(
                recipe.kind,
                grad,
                (cols_of(&dyq)?, sdy),
                fwd,
                (cols_of(x)?, x.scale_inv_ptr()),
                GemmShape { m: np, n: kp, k: mp },
                Post {
                    crop: crop(n, k, np, kp),
                    ..Post::default()
                },
                Out::F32,
            )?;
            (dx, dw)
        }
        (RecipeKind::Mxfp4 | RecipeKind::Mxfp8, SavedDevice::Mx { x_m, w_n }) => {
            let cfg = recipe.mx_config();
            let sr = |id: u64| lctx.sr_key(recipe, id);
            // dy along N for dgrad and along M (rotated alike with x) for wgrad.
            let (dy_n, dy_m) = ctx.mx_tile(
                dy,
                act,
                m,
                n,
                &cfg,
                Some(MxWant {
                    deq: true,
                    sr: sr(0),
                    ..MxWant::default()
                }),
                Some(MxWant {
                    deq: true,
                    sr: sr(1),
                    hadamard: recipe.hadamard,
                    ..MxWant::default()
                }),
            )?;
            let (pn, pm) = (w_n.padded_len, x_m.padded_len);
            let bw = ctx.dequantize_mx(w_n, DequantLayout::Rows, DType::BF16)?;
            let dx = ctx.lin_gemm(
                &Operand::rows(dy_n.deq()?, GemmDType::Bf16, pn),
                &Operand::rows(&bw, GemmDType::Bf16, pn),
                GemmShape { m, n: k, k: pn },
                Post::default(),
                aout,
            )?;
            drop((bw, dy_n));
            let bx = ctx.dequantize_mx(x_m, DequantLayout::Rows, DType::BF16)?;
            let dw = ctx.lin_gemm(
                &Operand::rows(dy_m.deq()?, GemmDType::Bf16, pm),
                &Operand::rows(&bx, GemmDType::Bf16, pm),
                GemmShape { m: n, n: k, k: pm },
                Post::default(),
                Out::F32,
            )?;
            (dx, dw)
        }
        (kind, _) => {
            return Err(crate::Error::InvalidOption(format!(
                "the saved tensors do not belong to recipe `{kind}`: a linear switched recipe between its forward and backward"
            ))
            .into())
        }
    };
    let db = if has_bias {
        Some(ctx.lin_colsum(dy, ain, m, n)?)
    } else {
        None
    };
    Ok(DeviceGrads { dx, dw, db })
}
