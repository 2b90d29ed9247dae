//! The CUDA linear primitives ([`LinearBackend`]) on device buffers.
//!
//! | format | quantize | GEMM |
//! |---|---|---|
//! | BF16 | a zero-padded BF16 copy, or the input read in place when it is BF16 with both sides multiples of 16; a kept copy is unpadded | cuBLASLt BF16 (an operand whose reduction axis is its first is read transposed, in place), cropped |
//! | tensorwise FP8 | `fp8_cast_2d`: the codes and/or their transpose from one read, padded to 16; the amax check deferred | cuBLASLt FP8 with per-tensor scale pointers; the FNUZ formats, which NVIDIA lacks, decoded exactly to BF16, a BF16 GEMM and both scales after it |
//! | MX | `mx_tile`: one pass along rows and columns, writing codes (kept) or the dequantized BF16 operand | BF16 GEMM of the dequantized blocks (Hopper has no FP4 MMA); kept codes dequantized first |
//!
//! The bias goes into the GEMM's epilogue where cuBLASLt fuses an f32 bias,
//! else into `lin_epilogue`; column sums are `lin_colsum`. A non-finite FP8
//! amax is recorded on the device and raised by the next read-back or
//! [`super::CudaContext::check_deferred`], so the step never waits for it.

use std::sync::Arc;

use super::lin_kernels::{act_in, act_out, r16, GemmShape, In, Operand, Out, Post};
use super::mx_tile::{MxOut, MxWant};
use super::quantize::{state_scale_inv_ptr, Fp8Outputs};
use super::storage::backend_err;
use super::MxDevice;
use super::{CudaContext, CudaDevice, CudaError, CudaStorage, DequantLayout, DevBuf, GemmDType};
use crate::backend::{Along, BackendStorage, Format, LinearBackend, Want};
use crate::cpu::CpuOperand;
use crate::formats::ElemFormat;
use crate::quant::{Fp8Tensor, MxConfig, MxTensor};
use crate::{DType, Result};

/// A buffer one operand reads: shared with the other operands of the same
/// quantization, or the quantized input itself, read in place.
#[derive(Clone)]
pub enum Buf<'a> {
    Shared(Arc<DevBuf>),
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

/// A GEMM operand or a kept copy of a `[rows, cols]` matrix, on the device.
pub enum CudaOperand<'a> {
    /// BF16 values: `[r16(rows), r16(cols)]` zero-padded when `padded`,
    /// else `[rows, cols]` (a kept copy, padded when a GEMM reads it).
    Bf16 {
        buf: Buf<'a>,
        rows: usize,
        cols: usize,
        padded: bool,
        along: Along,
    },
    /// Tensorwise FP8 codes with the reduction axis contiguous: `[r16(rows),
    /// r16(cols)]` along the columns, the transpose `[r16(cols), r16(rows)]`
    /// along the rows; `state` holds amax, scale and scale_inv.
    Fp8 {
        codes: Arc<DevBuf>,
        state: Arc<DevBuf>,
        elem: ElemFormat,
        rows: usize,
        cols: usize,
        along: Along,
    },
    /// MX blocks dequantized to BF16, `[rows, padded_len]` (operand rows,
    /// reduction axis padded to 32).
    MxDeq {
        deq: Arc<DevBuf>,
        rows: usize,
        padded_len: usize,
    },
    /// MX codes and scales along the reduction axis (kept).
    Mx { q: MxDevice, along: Along },
}

impl CudaOperand<'_> {
    fn kind(&self) -> &'static str {
        match self {
            CudaOperand::Bf16 { .. } => "BF16",
            CudaOperand::Fp8 { .. } => "FP8",
            CudaOperand::MxDeq { .. } | CudaOperand::Mx { .. } => "MX",
        }
    }
}

/// (GEMM rows, true GEMM rows, padded reduction length) of a `[rows, cols]`
/// operand padded to 16.
fn dims16(rows: usize, cols: usize, along: Along) -> (usize, usize, usize) {
    match along {
        Along::Cols => (r16(rows), rows, r16(cols)),
        Along::Rows => (r16(cols), cols, r16(rows)),
    }
}

fn aligned(rows: usize, cols: usize) -> bool {
    rows % 16 == 0 && cols % 16 == 0
}

/// The MX settings one `mx_tile` pass shares between its two directions.
fn mx_key(c: &MxConfig) -> (ElemFormat, crate::quant::ScaleMode, bool) {
    (c.elem, c.scale_mode, c.tile2d)
}

/// One `mx_tile` pass: its shared settings and, per direction (rows, then
/// columns), what it writes and which requests take it.
struct MxPass {
    cfg: MxConfig,
    dirs: [Option<(MxWant, Vec<usize>)>; 2],
}

/// Groups MX requests `(slot, config, along, kept)` into passes: one per
/// shared setting, each direction serving every request with the same
/// Hadamard and SR options.
fn mx_passes(reqs: &[(usize, MxConfig, Along, bool)]) -> Vec<MxPass> {
    let mut passes: Vec<MxPass> = Vec::new();
    for &(slot, cfg, along, keep) in reqs {
        let d = (along == Along::Rows) as usize;
        let fits = |p: &MxPass| {
            mx_key(&p.cfg) == mx_key(&cfg)
                && p.dirs[d]
                    .as_ref()
                    .is_none_or(|(w, _)| w.hadamard == cfg.hadamard && w.sr == cfg.sr)
        };
        let i = match passes.iter().position(fits) {
            Some(i) => i,
            None => {
                passes.push(MxPass {
                    cfg: MxConfig {
                        hadamard: false,
                        sr: None,
                        ..cfg
                    },
                    dirs: [None, None],
                });
                passes.len() - 1
            }
        };
        let (w, slots) = passes[i].dirs[d].get_or_insert_with(|| {
            (
                MxWant {
                    hadamard: cfg.hadamard,
                    sr: cfg.sr,
                    ..MxWant::default()
                },
                Vec::new(),
            )
        });
        w.codes |= keep;
        w.deq |= !keep;
        slots.push(slot);
    }
    passes
}

/// What [`LinearBackend::quantize`] hands back, slot by slot (the kept copy last).
type Slots<'a> = Vec<Option<CudaOperand<'a>>>;

impl CudaStorage {
    /// The BF16 requests among `wants` (the kept one at `keep_slot`).
    fn quantize_bf16<'a>(
        &'a self,
        rows: usize,
        cols: usize,
        wants: &[(usize, Along)],
        keep_slot: usize,
        out: &mut Slots<'a>,
    ) -> super::Result<()> {
        let ctx = self.device().context();
        let inp = act_in(self.dtype())?;
        let keeps = wants.iter().any(|&(s, _)| s == keep_slot);
        // A kept copy is unpadded and every GEMM operand shares it; else one
        // padded copy serves them all, or the input itself.
        let (buf, padded) = if keeps {
            let b = ctx.lin_copy2d(self.buffer(), inp, rows, cols, rows, cols, false, Out::Bf16)?;
            (Buf::Shared(Arc::new(b)), aligned(rows, cols))
        } else if self.dtype() == DType::BF16 && aligned(rows, cols) {
            (Buf::Input(self.buffer()), true)
        } else {
            let (rp, cp) = (r16(rows), r16(cols));
            let b = ctx.lin_copy2d(self.buffer(), inp, rows, cols, rp, cp, false, Out::Bf16)?;
            (Buf::Shared(Arc::new(b)), true)
        };
        for &(slot, along) in wants {
            out[slot] = Some(CudaOperand::Bf16 {
                buf: buf.clone(),
                rows,
                cols,
                padded,
                along,
            });
        }
        Ok(())
    }

    /// The tensorwise FP8 requests of one format among `wants`.
    #[allow(clippy::too_many_arguments)]
    fn quantize_fp8(
        &self,
        rows: usize,
        cols: usize,
        (elem, pow2): (ElemFormat, bool),
        wants: &[(usize, Along)],
        label: &dyn Fn() -> String,
        out: &mut Slots<'_>,
    ) -> super::Result<()> {
        let ctx = self.device().context();
        let outputs = Fp8Outputs {
            rows: wants.iter().any(|w| w.1 == Along::Cols),
            cols: wants.iter().any(|w| w.1 == Along::Rows),
        };
        let q = ctx.quantize_fp8_2d(
            self.buffer(),
            self.dtype(),
            rows,
            cols,
            elem,
            pow2,
            16,
            outputs,
        )?;
        ctx.defer_finite_check(q.amax_ptr(), label())?;
        let state = Arc::new(q.state);
        let (codes, codes_t) = (q.codes.map(Arc::new), q.codes_t.map(Arc::new));
        for &(slot, along) in wants {
            let codes = match along {
                Along::Cols => codes.clone(),
                Along::Rows => codes_t.clone(),
            };
            out[slot] = Some(CudaOperand::Fp8 {
                codes: codes.ok_or_else(|| CudaError::Invalid("FP8 codes not written".into()))?,
                state: state.clone(),
                elem,
                rows,
                cols,
                along,
            });
        }
        Ok(())
    }

    /// One `mx_tile` pass.
    fn quantize_mx(
        &self,
        rows: usize,
        cols: usize,
        pass: MxPass,
        keep_slot: usize,
        out: &mut Slots<'_>,
    ) -> super::Result<()> {
        let ctx = self.device().context();
        let [by_row, by_col] = pass.dirs;
        let want = |d: &Option<(MxWant, Vec<usize>)>| d.as_ref().map(|(w, _)| *w);
        let (ro, co) = ctx.mx_tile(
            self.buffer(),
            self.dtype(),
            rows,
            cols,
            &pass.cfg,
            want(&by_row),
            want(&by_col),
        )?;
        let dirs = [
            (by_row, ro, Along::Cols, rows, cols),
            (by_col, co, Along::Rows, cols, rows),
        ];
        for (dir, res, along, qrows, len) in dirs {
            let Some((_, slots)) = dir else { continue };
            let MxOut { mut q, deq, .. } = res;
            let deq = deq.map(Arc::new);
            for slot in slots {
                let missing = || CudaError::Invalid("mx_tile did not write an output".into());
                out[slot] = Some(if slot == keep_slot {
                    CudaOperand::Mx {
                        q: q.take().ok_or_else(missing)?,
                        along,
                    }
                } else {
                    CudaOperand::MxDeq {
                        deq: deq.clone().ok_or_else(missing)?,
                        rows: qrows,
                        padded_len: len.div_ceil(32) * 32,
                    }
                });
            }
        }
        Ok(())
    }

    /// Every request, the kept one (if `keeps`) last.
    fn quantize_all<'a>(
        &'a self,
        rows: usize,
        cols: usize,
        wants: &[Want],
        keeps: bool,
        label: &dyn Fn() -> String,
    ) -> super::Result<Slots<'a>> {
        let mut out: Slots<'a> = (0..wants.len()).map(|_| None).collect();
        let keep_slot = if keeps { wants.len() - 1 } else { usize::MAX };
        let slots = |f: &dyn Fn(&Format) -> bool| -> Vec<(usize, Along)> {
            (0..wants.len())
                .filter(|&i| f(&wants[i].format))
                .map(|i| (i, wants[i].along))
                .collect()
        };
        let bf16 = slots(&|f| *f == Format::Bf16);
        if !bf16.is_empty() {
            self.quantize_bf16(rows, cols, &bf16, keep_slot, &mut out)?;
        }
        let mut fp8: Vec<(ElemFormat, bool)> = Vec::new();
        let mut mx = Vec::new();
        for (i, w) in wants.iter().enumerate() {
            match w.format {
                Format::Tensorwise { elem, pow2 } if !fp8.contains(&(elem, pow2)) => {
                    fp8.push((elem, pow2))
                }
                Format::Mx(cfg) => mx.push((i, cfg, w.along, i == keep_slot)),
                _ => {}
            }
        }
        for f in fp8 {
            let group = slots(&|w| {
                *w == Format::Tensorwise {
                    elem: f.0,
                    pow2: f.1,
                }
            });
            self.quantize_fp8(rows, cols, f, &group, label, &mut out)?;
        }
        for pass in mx_passes(&mx) {
            self.quantize_mx(rows, cols, pass, keep_slot, &mut out)?;
        }
        Ok(out)
    }
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

/// A BF16 operand padded to 16 (a kept unpadded one is copied into `tmp`),
/// read transposed in place when its reduction axis is its first.
fn bf16_ready<'b>(
    ctx: &CudaContext,
    op: &'b CudaOperand<'_>,
    tmp: &'b mut Option<DevBuf>,
) -> super::Result<Option<Ready<'b>>> {
    let CudaOperand::Bf16 {
        buf,
        rows,
        cols,
        padded,
        along,
    } = op
    else {
        return Ok(None);
    };
    let (rows, cols) = (*rows, *cols);
    let buf: &DevBuf = if *padded || aligned(rows, cols) {
        buf
    } else {
        tmp.insert(ctx.lin_copy2d(
            buf,
            In::Bf16,
            rows,
            cols,
            r16(rows),
            r16(cols),
            false,
            Out::Bf16,
        )?)
    };
    let (r, true_rows, k) = dims16(rows, cols, *along);
    let op = match along {
        Along::Cols => Operand::rows(buf, GemmDType::Bf16, r16(cols)),
        Along::Rows => Operand::cols(buf, GemmDType::Bf16, r16(cols)),
    };
    Ok(Some(Ready {
        op,
        rows: r,
        true_rows,
        k,
    }))
}

/// The BF16 operand of MX blocks, dequantizing kept codes into `tmp`.
fn mx_ready<'b>(
    ctx: &CudaContext,
    op: &'b CudaOperand<'_>,
    tmp: &'b mut Option<DevBuf>,
) -> super::Result<Option<Ready<'b>>> {
    let (buf, rows, k): (&DevBuf, usize, usize) = match op {
        CudaOperand::MxDeq {
            deq,
            rows,
            padded_len,
        } => (deq, *rows, *padded_len),
        CudaOperand::Mx { q, .. } => {
            let d = ctx.dequantize_mx(q, DequantLayout::Rows, DType::BF16)?;
            (tmp.insert(d), q.rows, q.padded_len)
        }
        _ => return Ok(None),
    };
    Ok(Some(Ready {
        op: Operand::rows(buf, GemmDType::Bf16, k),
        rows,
        true_rows: rows,
        k,
    }))
}

/// FP8 codes as `lin_fp8_gemm` takes them: (format, codes, scale_inv pointer).
fn fp8_ready<'b>(op: &'b CudaOperand<'_>) -> Option<(Ready<'b>, ElemFormat, u64)> {
    let CudaOperand::Fp8 {
        codes,
        state,
        elem,
        rows,
        cols,
        along,
    } = op
    else {
        return None;
    };
    let (r, true_rows, k) = dims16(*rows, *cols, *along);
    let ready = Ready {
        op: Operand::rows(codes, GemmDType::Bf16, k),
        rows: r,
        true_rows,
        k,
    };
    Some((ready, *elem, state_scale_inv_ptr(state)))
}

/// `a · b^T` as `out`, with its true `(rows, cols)`.
fn gemm_on(
    ctx: &CudaContext,
    a: &CudaOperand<'_>,
    b: &CudaOperand<'_>,
    bias: Option<&DevBuf>,
    out: Out,
) -> super::Result<(DevBuf, usize, usize)> {
    if let (Some((ra, ea, sa)), Some((rb, eb, sb))) = (fp8_ready(a), fp8_ready(b)) {
        let (g, post) = shape_of(&ra, &rb, bias)?;
        let (m, n) = (ra.true_rows, rb.true_rows);
        let (ca, cb) = (ra.op.buf(), rb.op.buf());
        return Ok((
            ctx.lin_fp8_gemm(ea, (ca, sa), eb, (cb, sb), g, post, out)?,
            m,
            n,
        ));
    }
    let (mut ta, mut tb) = (None, None);
    let pair = match (a, b) {
        (CudaOperand::Bf16 { .. }, CudaOperand::Bf16 { .. }) => {
            (bf16_ready(ctx, a, &mut ta)?, bf16_ready(ctx, b, &mut tb)?)
        }
        _ => (mx_ready(ctx, a, &mut ta)?, mx_ready(ctx, b, &mut tb)?),
    };
    let (Some(ra), Some(rb)) = pair else {
        return Err(CudaError::Invalid(format!(
            "a GEMM of {} and {} operands is not supported",
            a.kind(),
            b.kind()
        )));
    };
    let (g, post) = shape_of(&ra, &rb, bias)?;
    let y = ctx.lin_gemm(&ra.op, &rb.op, g, post, out)?;
    Ok((y, ra.true_rows, rb.true_rows))
}

impl LinearBackend for CudaStorage {
    type Operand<'a> = CudaOperand<'a>;

    fn quantize<'a>(
        &'a self,
        rows: usize,
        cols: usize,
        now: &[Want],
        keep: Option<Want>,
        label: &dyn Fn() -> String,
    ) -> Result<(Vec<CudaOperand<'a>>, Option<CudaOperand<'static>>)> {
        let mut wants = now.to_vec();
        wants.extend(keep);
        let mut slots = self
            .quantize_all(rows, cols, &wants, keep.is_some(), label)
            .map_err(backend_err)?;
        let kept = if keep.is_some() {
            match slots.pop().flatten() {
                Some(k) => Some(into_owned(k)?),
                None => None,
            }
        } else {
            None
        };
        let ops = slots.into_iter().flatten().collect::<Vec<_>>();
        if ops.len() != now.len() || kept.is_some() != keep.is_some() {
            return Err(crate::Error::Backend(
                "CUDA quantize did not serve every request".into(),
            ));
        }
        Ok((ops, kept))
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
        let (y, m, n) =
            gemm_on(ctx, a, b, bias.map(|b| b.buffer()), act_out(out)).map_err(backend_err)?;
        Ok(CudaStorage::from_buffer(y, out, m * n, device.clone()))
    }

    fn column_sums(&self, rows: usize, cols: usize) -> Result<CudaStorage> {
        let ctx = self.device().context();
        let inp = act_in(self.dtype()).map_err(backend_err)?;
        let s = ctx
            .lin_colsum(self.buffer(), inp, rows, cols)
            .map_err(backend_err)?;
        Ok(CudaStorage::from_buffer(
            s,
            DType::F32,
            cols,
            self.device().clone(),
        ))
    }

    fn operand_bytes(op: &CudaOperand<'_>) -> usize {
        match op {
            CudaOperand::Bf16 { rows, cols, .. } => 2 * rows * cols,
            CudaOperand::Fp8 { rows, cols, .. } => rows * cols + 8,
            CudaOperand::MxDeq {
                rows, padded_len, ..
            } => 2 * rows * padded_len,
            CudaOperand::Mx { q, .. } => q.code_bytes() + q.nblocks(),
        }
    }

    fn operand_elements(op: &CudaOperand<'_>) -> usize {
        match op {
            CudaOperand::Bf16 { rows, cols, .. } | CudaOperand::Fp8 { rows, cols, .. } => {
                rows * cols
            }
            CudaOperand::MxDeq {
                rows, padded_len, ..
            } => rows * padded_len,
            CudaOperand::Mx { q, .. } => q.rows * q.len,
        }
    }

    fn operand_to_cpu(device: &CudaDevice, op: &CudaOperand<'_>) -> Result<CpuOperand> {
        to_cpu(device.context(), op).map_err(backend_err)
    }
}

/// A kept operand, which never reads the input in place.
fn into_owned(op: CudaOperand<'_>) -> Result<CudaOperand<'static>> {
    Ok(match op {
        CudaOperand::Bf16 {
            buf: Buf::Shared(b),
            rows,
            cols,
            padded,
            along,
        } => CudaOperand::Bf16 {
            buf: Buf::Shared(b),
            rows,
            cols,
            padded,
            along,
        },
        CudaOperand::Bf16 { .. } => {
            return Err(crate::Error::Backend(
                "a kept operand must not read the input in place".into(),
            ))
        }
        CudaOperand::Fp8 {
            codes,
            state,
            elem,
            rows,
            cols,
            along,
        } => CudaOperand::Fp8 {
            codes,
            state,
            elem,
            rows,
            cols,
            along,
        },
        CudaOperand::MxDeq {
            deq,
            rows,
            padded_len,
        } => CudaOperand::MxDeq {
            deq,
            rows,
            padded_len,
        },
        CudaOperand::Mx { q, along } => CudaOperand::Mx { q, along },
    })
}

/// The operand downloaded in the CPU's form (codes in `[rows, cols]` order).
fn to_cpu(ctx: &CudaContext, op: &CudaOperand<'_>) -> super::Result<CpuOperand> {
    Ok(match op {
        CudaOperand::Bf16 {
            buf,
            rows,
            cols,
            padded,
            along,
        } => {
            let (r, c) = if *padded {
                (r16(*rows), r16(*cols))
            } else {
                (*rows, *cols)
            };
            let bits = if (r, c) == (*rows, *cols) {
                ctx.download(buf, rows * cols)?
            } else {
                let packed = ctx.lin_copy2d(buf, In::Bf16, r, c, *rows, *cols, false, Out::Bf16)?;
                ctx.download(&packed, rows * cols)?
            };
            CpuOperand::Bf16 {
                bits,
                rows: *rows,
                cols: *cols,
                along: *along,
            }
        }
        CudaOperand::Fp8 {
            codes,
            state,
            elem,
            rows,
            cols,
            along,
        } => {
            let (_, scale, scale_inv) = super::quantize::read_state(ctx, state)?;
            let (rp, cp) = (r16(*rows), r16(*cols));
            let packed = match along {
                Along::Cols => {
                    ctx.lin_copy2d(codes, In::U8, rp, cp, *rows, *cols, false, Out::U8)?
                }
                Along::Rows => {
                    ctx.lin_copy2d(codes, In::U8, cp, rp, *rows, *cols, true, Out::U8)?
                }
            };
            CpuOperand::Fp8 {
                q: Fp8Tensor {
                    shape: vec![*rows, *cols],
                    elem: *elem,
                    codes: ctx.download(&packed, rows * cols)?,
                    scale,
                    scale_inv,
                },
                along: *along,
            }
        }
        CudaOperand::MxDeq { .. } => {
            return Err(CudaError::Invalid(
                "a dequantized MX operand is not kept; download its codes".into(),
            ))
        }
        CudaOperand::Mx { q, along } => {
            // Quantized along the first axis: the input was [len, rows].
            let (shape, axis) = match along {
                Along::Rows => (vec![q.len, q.rows], 0),
                Along::Cols => (vec![q.rows, q.len], 1),
            };
            CpuOperand::Mx(MxTensor {
                shape,
                axis,
                config: q.config,
                rows: q.rows,
                len: q.len,
                padded_len: q.padded_len,
                codes: ctx.download(&q.codes, q.code_bytes())?,
                scales: ctx.download(&q.scales, q.nblocks())?,
            })
        }
    })
}
