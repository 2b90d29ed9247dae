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
//! Each GEMM quantizes its operands along its own reduction axis. An operand
//! whose reduction axis is M or N (x and dy for wgrad, W for dgrad) is first
//! transposed by `lin_copy2d` (exact), so that the quantizer sees the rows
//! the CPU's `quantize_mx(.., axis 0, ..)` sees and writes the same codes.
//! FP8 GEMMs need M, N and K to be multiples of 16: their operands are
//! zero-padded and the results cropped; BF16 GEMMs pad K to 16 (the `bf16`
//! recipe) or to 32 (MX). Bias is added in f32 after the GEMM, and db is the
//! f32 column sum of dy.
//!
//! Activations (x, y, dy, dx) are f32 or BF16, as `act` says; W, b, dW and db
//! are f32. A non-finite amax under the FP8 recipes is the CPU's error (it
//! names layer, role and iteration); it is found after the work is queued,
//! with one read-back per quantized tensor.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::nvrtc::KernelSource;
use super::{
    driver_err, CudaContext, CudaError, DevBuf, Fp8Device, GemmDType, GemmOperand, Result,
};
use super::{DequantLayout, MxDevice};
use crate::formats::ElemFormat;
use crate::quant::{Fp8Tensor, MxConfig, MxTensor};
use crate::recipe::linear::{LinearCtx, LinearShape, Saved};
use crate::recipe::{Recipe, RecipeKind};
use crate::DType;

/// `runtime/kernels/linear_ops.cu`.
pub const LINEAR_OPS: KernelSource = KernelSource {
    name: "linear_ops.cu",
    body: include_str!("../../kernels/linear_ops.cu"),
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

/// Tensor label of the non-finite-amax error, as the CPU writes it.
/// What the forward keeps for the backward (SPEC section 4), on the device.
pub enum SavedDevice {
    /// x in BF16, `[m, k]`.
    Bf16 { x: DevBuf, m: usize, k: usize },
    /// x `[m, k]` and W `[n, k]` in E4M3 with their scales.
    Fp8 {
        x: Fp8Device,
        w: Fp8Device,
        m: usize,
        k: usize,
        n: usize,
    },
    /// x quantized along M (Hadamard per recipe) and W along N: the CPU's
    /// axis-last rows, `[k, m]` and `[k, n]`.
    Mx { x_m: MxDevice, w_n: MxDevice },
}

impl SavedDevice {
    /// Bytes held, counted as the CPU's [`Saved::nbytes`].
    pub fn nbytes(&self) -> usize {
        match self {
            SavedDevice::Bf16 { m, k, .. } => 2 * m * k,
            SavedDevice::Fp8 { x, w, .. } => x.numel + 8 + w.numel + 8,
            SavedDevice::Mx { x_m, w_n } => {
                x_m.code_bytes() + x_m.nblocks() + w_n.code_bytes() + w_n.nblocks()
            }
        }
    }

    /// Elements of the saved tensors, before any padding.
    pub fn elements(&self) -> usize {
        match self {
            SavedDevice::Bf16 { m, k, .. } => m * k,
            SavedDevice::Fp8 { x, w, .. } => x.numel + w.numel,
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
                let get = |q: &Fp8Device, shape: Vec<usize>| -> Result<Fp8Tensor> {
                    let (_, scale, scale_inv) = q.read_scales(ctx)?;
                    Ok(Fp8Tensor {
                        shape,
                        elem: q.elem,
                        codes: ctx.download(&q.codes, q.numel)?,
                        scale,
                        scale_inv,
                    })
                };
                Saved::Fp8 {
                    x: get(x, vec![*m, *k])?,
                    w: get(w, vec![*n, *k])?,
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

    /// `y[m, n] = a[m, k] b[n, k]^T` (BF16 operands, f32 accumulation), then
    /// scales and bias; written in `out` directly when nothing follows the GEMM.
    #[allow(clippy::too_many_arguments)]
    fn lin_bf16_gemm(
        &self,
        a: &DevBuf,
        b: &DevBuf,
        m: usize,
        n: usize,
        k: usize,
        scales: Option<(u64, u64)>,
        bias: Option<&DevBuf>,
        out: Out,
    ) -> Result<DevBuf> {
        let op = |buf| GemmOperand {
            buf,
            dtype: GemmDType::Bf16,
            scale_inv: None,
        };
        if scales.is_none() && bias.is_none() {
            return self.gemm_nt(&op(a), &op(b), m, n, k, gemm_out(out));
        }
        let acc = self.gemm_nt(&op(a), &op(b), m, n, k, GemmDType::F32)?;
        self.lin_epilogue(&acc, n, m, n, scales, bias, out)
    }

    /// FP8 GEMM of padded operands `a[mp, kp]`, `b[np, kp]` (multiples of
    /// 16), cropped to `[m, n]`, plus bias.
    #[allow(clippy::too_many_arguments)]
    fn lin_fp8_gemm(
        &self,
        a: (&DevBuf, GemmDType, u64),
        b: (&DevBuf, GemmDType, u64),
        m: usize,
        n: usize,
        k: usize,
        bias: Option<&DevBuf>,
        out: Out,
    ) -> Result<DevBuf> {
        let (mp, np, kp) = (r16(m), r16(n), r16(k));
        let oa = GemmOperand {
            buf: a.0,
            dtype: a.1,
            scale_inv: Some(a.2),
        };
        let ob = GemmOperand {
            buf: b.0,
            dtype: b.1,
            scale_inv: Some(b.2),
        };
        if mp == m && np == n && bias.is_none() {
            return self.gemm_nt(&oa, &ob, m, n, kp, gemm_out(out));
        }
        let acc = self.gemm_nt(&oa, &ob, mp, np, kp, GemmDType::F32)?;
        self.lin_epilogue(&acc, np, m, n, None, bias, out)
    }

    /// f32 view of an activation: itself, or a widened copy in `tmp`.
    fn lin_f32<'a>(
        &self,
        x: &'a DevBuf,
        act: DType,
        rows: usize,
        cols: usize,
        tmp: &'a mut Option<DevBuf>,
    ) -> Result<&'a DevBuf> {
        if act == DType::F32 {
            return Ok(x);
        }
        *tmp = Some(self.lin_copy2d(x, act_in(act)?, rows, cols, rows, cols, false, Out::F32)?);
        Ok(tmp.as_ref().expect("set above"))
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
    match recipe.kind {
        RecipeKind::Bf16 => {
            let kp = r16(k);
            let xb = ctx.lin_copy2d(x, ain, m, k, m, k, false, Out::Bf16)?;
            let xa = if kp == k {
                None
            } else {
                Some(ctx.lin_copy2d(&xb, In::Bf16, m, k, m, kp, false, Out::Bf16)?)
            };
            let wb = ctx.lin_copy2d(w, In::F32, n, k, n, kp, false, Out::Bf16)?;
            let y = ctx.lin_bf16_gemm(xa.as_ref().unwrap_or(&xb), &wb, m, n, kp, None, b, aout)?;
            Ok((y, SavedDevice::Bf16 { x: xb, m, k }))
        }
        RecipeKind::Fp8 | RecipeKind::Fp8Fnuz => {
            let (fwd, _) = recipe.fp8_formats();
            let mut tmp = None;
            let xf = ctx.lin_f32(x, act, m, k, &mut tmp)?;
            let xq = ctx.quantize_fp8_tensorwise(xf, m * k, fwd, recipe.pow2)?;
            let wq = ctx.quantize_fp8_tensorwise(w, n * k, fwd, recipe.pow2)?;
            let y = if recipe.kind == RecipeKind::Fp8 {
                let (mp, np, kp) = (r16(m), r16(n), r16(k));
                let pad = |q: &Fp8Device, rows, rp| -> Result<Option<DevBuf>> {
                    if rp == rows && kp == k {
                        Ok(None)
                    } else {
                        ctx.lin_copy2d(&q.codes, In::U8, rows, k, rp, kp, false, Out::U8)
                            .map(Some)
                    }
                };
                let (xa, wa) = (pad(&xq, m, mp)?, pad(&wq, n, np)?);
                let dt = fp8_dtype(fwd);
                ctx.lin_fp8_gemm(
                    (xa.as_ref().unwrap_or(&xq.codes), dt, xq.scale_inv_ptr()),
                    (wa.as_ref().unwrap_or(&wq.codes), dt, wq.scale_inv_ptr()),
                    m,
                    n,
                    k,
                    b,
                    aout,
                )?
            } else {
                let kp = r16(k);
                let xa = ctx.lin_copy2d(&xq.codes, decoded(fwd), m, k, m, kp, false, Out::Bf16)?;
                let wa = ctx.lin_copy2d(&wq.codes, decoded(fwd), n, k, n, kp, false, Out::Bf16)?;
                let sc = Some((xq.scale_inv_ptr(), wq.scale_inv_ptr()));
                ctx.lin_bf16_gemm(&xa, &wa, m, n, kp, sc, b, aout)?
            };
            xq.check_finite(ctx, &lctx.label("activation"))?;
            wq.check_finite(ctx, &lctx.label("weight"))?;
            Ok((
                y,
                SavedDevice::Fp8 {
                    x: xq,
                    w: wq,
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
            let mut tmp = None;
            let xf = ctx.lin_f32(x, act, m, k, &mut tmp)?;
            // fprop: x and W along K.
            let x_k = ctx.quantize_mx_rows(xf, m, k, &cfg)?;
            let w_k = ctx.quantize_mx_rows(w, n, k, &tiles)?;
            let xd = ctx.dequantize_mx(&x_k, DequantLayout::Rows, DType::BF16)?;
            let wd = ctx.dequantize_mx(&w_k, DequantLayout::Rows, DType::BF16)?;
            let y = ctx.lin_bf16_gemm(&xd, &wd, m, n, x_k.padded_len, None, b, aout)?;
            drop((xd, wd, x_k, w_k));
            // Saved: x along M (Hadamard per recipe), W along N.
            let xt = ctx.lin_copy2d(xf, In::F32, m, k, k, m, true, Out::F32)?;
            let x_m = ctx.quantize_mx_rows(
                &xt,
                k,
                m,
                &MxConfig {
                    hadamard: recipe.hadamard,
                    ..cfg
                },
            )?;
            drop(xt);
            let wt = ctx.lin_copy2d(w, In::F32, n, k, k, n, true, Out::F32)?;
            let w_n = ctx.quantize_mx_rows(&wt, k, n, &tiles)?;
            Ok((y, SavedDevice::Mx { x_m, w_n }))
        }
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
    let (dx, dw) = match (recipe.kind, saved) {
        (RecipeKind::Bf16, SavedDevice::Bf16 { x, .. }) => {
            check_bytes("W", w, n * k, 4, s)?;
            let (mp, np) = (r16(m), r16(n));
            // dgrad: reduction over N.
            let dya = ctx.lin_copy2d(dy, ain, m, n, m, np, false, Out::Bf16)?;
            let wt = ctx.lin_copy2d(w, In::F32, n, k, k, np, true, Out::Bf16)?;
            let dx = ctx.lin_bf16_gemm(&dya, &wt, m, k, np, None, None, aout)?;
            drop((dya, wt));
            // wgrad: reduction over M.
            let dyt = ctx.lin_copy2d(dy, ain, m, n, n, mp, true, Out::Bf16)?;
            let xt = ctx.lin_copy2d(x, In::Bf16, m, k, k, mp, true, Out::Bf16)?;
            let dw = ctx.lin_bf16_gemm(&dyt, &xt, n, k, mp, None, None, Out::F32)?;
            (dx, dw)
        }
        (RecipeKind::Fp8 | RecipeKind::Fp8Fnuz, SavedDevice::Fp8 { x, w: wq, .. }) => {
            let (fwd, grad) = recipe.fp8_formats();
            let mut tmp = None;
            let dyf = ctx.lin_f32(dy, act, m, n, &mut tmp)?;
            let dyq = ctx.quantize_fp8_tensorwise(dyf, m * n, grad, recipe.pow2)?;
            let (sdy, sw, sx) = (dyq.scale_inv_ptr(), wq.scale_inv_ptr(), x.scale_inv_ptr());
            let r = if recipe.kind == RecipeKind::Fp8 {
                let (mp, np, kp) = (r16(m), r16(n), r16(k));
                let (gd, fd) = (fp8_dtype(grad), fp8_dtype(fwd));
                let u8c = |src: &DevBuf, rows, cols, orr, oc, t| {
                    ctx.lin_copy2d(src, In::U8, rows, cols, orr, oc, t, Out::U8)
                };
                // dgrad: dy [mp, np] x (W^T) [kp, np].
                let dya = if mp == m && np == n {
                    None
                } else {
                    Some(u8c(&dyq.codes, m, n, mp, np, false)?)
                };
                let wt = u8c(&wq.codes, n, k, kp, np, true)?;
                let dx = ctx.lin_fp8_gemm(
                    (dya.as_ref().unwrap_or(&dyq.codes), gd, sdy),
                    (&wt, fd, sw),
                    m,
                    k,
                    n,
                    None,
                    aout,
                )?;
                drop((dya, wt));
                // wgrad: (dy^T) [np, mp] x (x^T) [kp, mp].
                let dyt = u8c(&dyq.codes, m, n, np, mp, true)?;
                let xt = u8c(&x.codes, m, k, kp, mp, true)?;
                let dw = ctx.lin_fp8_gemm((&dyt, gd, sdy), (&xt, fd, sx), n, k, m, None, Out::F32)?;
                (dx, dw)
            } else {
                let (mp, np) = (r16(m), r16(n));
                let (gi, fi) = (decoded(grad), decoded(fwd));
                let dya = ctx.lin_copy2d(&dyq.codes, gi, m, n, m, np, false, Out::Bf16)?;
                let wt = ctx.lin_copy2d(&wq.codes, fi, n, k, k, np, true, Out::Bf16)?;
                let dx = ctx.lin_bf16_gemm(&dya, &wt, m, k, np, Some((sdy, sw)), None, aout)?;
                drop((dya, wt));
                let dyt = ctx.lin_copy2d(&dyq.codes, gi, m, n, n, mp, true, Out::Bf16)?;
                let xt = ctx.lin_copy2d(&x.codes, fi, m, k, k, mp, true, Out::Bf16)?;
                let dw = ctx.lin_bf16_gemm(&dyt, &xt, n, k, mp, Some((sdy, sx)), None, Out::F32)?;
                (dx, dw)
            };
            dyq.check_finite(ctx, &lctx.label("gradient"))?;
            r
        }
        (RecipeKind::Mxfp4 | RecipeKind::Mxfp8, SavedDevice::Mx { x_m, w_n }) => {
            let cfg = recipe.mx_config();
            let sr = |id: u64| lctx.sr_key(recipe, id);
            let mut tmp = None;
            let dyf = ctx.lin_f32(dy, act, m, n, &mut tmp)?;
            // dgrad: reduction over N.
            let dy_n = ctx.quantize_mx_rows(dyf, m, n, &MxConfig { sr: sr(0), ..cfg })?;
            let a = ctx.dequantize_mx(&dy_n, DequantLayout::Rows, DType::BF16)?;
            let bw = ctx.dequantize_mx(w_n, DequantLayout::Rows, DType::BF16)?;
            let dx = ctx.lin_bf16_gemm(&a, &bw, m, k, dy_n.padded_len, None, None, aout)?;
            drop((a, bw, dy_n));
            // wgrad: reduction over M, both operands rotated alike.
            let dyt = ctx.lin_copy2d(dyf, In::F32, m, n, n, m, true, Out::F32)?;
            let dy_m = ctx.quantize_mx_rows(
                &dyt,
                n,
                m,
                &MxConfig {
                    sr: sr(1),
                    hadamard: recipe.hadamard,
                    ..cfg
                },
            )?;
            drop(dyt);
            let a = ctx.dequantize_mx(&dy_m, DequantLayout::Rows, DType::BF16)?;
            let bx = ctx.dequantize_mx(x_m, DequantLayout::Rows, DType::BF16)?;
            let dw = ctx.lin_bf16_gemm(&a, &bx, n, k, dy_m.padded_len, None, None, Out::F32)?;
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
