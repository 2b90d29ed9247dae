//! [`LinearBackend::quantize`](crate::backend::LinearBackend::quantize) on
//! the GPU: the requests for one matrix are grouped so that each input is
//! read as few times as the kernels allow. All BF16 copies share one buffer
//! (or the input itself); the FP8 copies of one format come from one
//! `fp8_cast_2d` (codes and transpose); the MX copies of one element format,
//! scale mode and tiling from one `mx_tile` pass per pair of rows/columns
//! settings (Hadamard, stochastic rounding); each NVFP4 copy from its own
//! `quantize_nvfp4` (its tensor scale depends on the axis under the
//! Hadamard), shared by identical `now` requests.

use std::sync::Arc;

use super::lin_kernels::{act_in, r16, Out};
use super::mx_tile::{MxOut, MxWant};
use super::nvfp4::{Nvfp4Device, Nvfp4Outputs};
use super::operand::{aligned, mx_codes_native, Bf16Matrix, Buf, CudaOperand, Fp8Matrix};
use super::quantize::Fp8Outputs;
use super::{CudaError, CudaStorage};
use crate::backend::{Along, BackendStorage, Format, Quantized, Request, Want};
use crate::formats::ElemFormat;
use crate::quant::{Fp8GroupConfig, MxConfig, Nvfp4Config};
use crate::DType;

/// The MX settings one `mx_tile` pass shares between its two directions.
fn mx_key(c: &MxConfig) -> (ElemFormat, crate::quant::ScaleMode, bool) {
    (c.elem, c.scale_mode, c.tile2d)
}

/// One `mx_tile` pass: its shared settings and, per direction (along the
/// columns, then along the rows), what it writes and which slots take it.
struct MxPass {
    cfg: MxConfig,
    dirs: [Option<(MxWant, Vec<usize>)>; 2],
}

/// Groups MX requests `(slot, config, along, codes)` into passes: one per
/// shared setting, each direction serving every request with the same
/// Hadamard and SR options.
fn mx_passes(reqs: &[(usize, MxConfig, Along, bool)]) -> Vec<MxPass> {
    let mut passes: Vec<MxPass> = Vec::new();
    for &(slot, cfg, along, codes) in reqs {
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
                let cfg = MxConfig {
                    hadamard: false,
                    sr: None,
                    ..cfg
                };
                passes.push(MxPass {
                    cfg,
                    dirs: [None, None],
                });
                passes.len() - 1
            }
        };
        let (w, slots) = passes[i].dirs[d].get_or_insert_with(|| {
            let w = MxWant {
                hadamard: cfg.hadamard,
                sr: cfg.sr,
                ..MxWant::default()
            };
            (w, Vec::new())
        });
        w.codes |= codes;
        w.deq |= !codes;
        slots.push(slot);
    }
    passes
}

/// The operands of one request as they are made: a slot per `now` entry,
/// then the kept copy (slot `now.len()`), which owns its buffers.
struct Slots<'a> {
    now: Vec<Option<CudaOperand<'a>>>,
    keep: Option<CudaOperand<'static>>,
}

impl Slots<'_> {
    fn put(&mut self, slot: usize, op: CudaOperand<'static>) {
        match self.now.get_mut(slot) {
            Some(s) => *s = Some(op),
            None => self.keep = Some(op),
        }
    }

    fn is_keep(&self, slot: usize) -> bool {
        slot == self.now.len()
    }
}

fn bf16(buf: Buf<'_>, (rows, cols): (usize, usize), padded: bool, along: Along) -> CudaOperand<'_> {
    CudaOperand::Bf16(Bf16Matrix {
        buf,
        rows,
        cols,
        padded,
        along,
    })
}

/// A matrix and its requests `(slot, along)` of one format.
type Group<'g> = ((usize, usize), &'g [(usize, Along)]);

impl CudaStorage {
    /// The BF16 requests.
    fn quantize_bf16<'a>(
        &'a self,
        ((rows, cols), wants): Group,
        out: &mut Slots<'a>,
    ) -> super::Result<()> {
        let ctx = self.device().context();
        let src = (self.buffer(), act_in(self.dtype())?);
        let dims = (rows, cols);
        if wants.iter().any(|&(s, _)| out.is_keep(s)) {
            // The kept copy is unpadded; the GEMM operands share it.
            let b = Arc::new(ctx.lin_copy2d(src, dims, dims, false, Out::Bf16)?);
            for &(slot, along) in wants {
                let padded = aligned(rows, cols);
                out.put(slot, bf16(Buf::Shared(b.clone()), dims, padded, along));
            }
            return Ok(());
        }
        // One padded copy serves every operand, or the input itself.
        let buf = if self.dtype() == DType::BF16 && aligned(rows, cols) {
            Buf::Input(self.buffer())
        } else {
            let padded = (r16(rows), r16(cols));
            Buf::Shared(Arc::new(ctx.lin_copy2d(
                src,
                dims,
                padded,
                false,
                Out::Bf16,
            )?))
        };
        for &(slot, along) in wants {
            out.now[slot] = Some(bf16(buf.clone(), dims, true, along));
        }
        Ok(())
    }

    /// The tensorwise FP8 requests of one format.
    fn quantize_fp8(
        &self,
        ((rows, cols), wants): Group,
        (elem, pow2): (ElemFormat, bool),
        label: &dyn Fn() -> String,
        out: &mut Slots<'_>,
    ) -> super::Result<()> {
        let ctx = self.device().context();
        let outputs = Fp8Outputs {
            rows: wants.iter().any(|w| w.1 == Along::Cols),
            cols: wants.iter().any(|w| w.1 == Along::Rows),
        };
        let x = self.buffer();
        let q = ctx.quantize_fp8_2d(x, self.dtype(), rows, cols, elem, pow2, 16, outputs)?;
        ctx.defer_finite_check(q.amax_ptr(), label())?;
        let state = Arc::new(q.state);
        let (codes, codes_t) = (q.codes.map(Arc::new), q.codes_t.map(Arc::new));
        for &(slot, along) in wants {
            let codes = match along {
                Along::Cols => codes.clone(),
                Along::Rows => codes_t.clone(),
            };
            let codes = codes.ok_or_else(|| CudaError::Invalid("FP8 codes not written".into()))?;
            let m = Fp8Matrix {
                codes,
                state: state.clone(),
                elem,
                rows,
                cols,
                along,
            };
            out.put(slot, CudaOperand::Fp8(m));
        }
        Ok(())
    }

    /// The FP8 rowwise / 128-block requests of one configuration: one
    /// quantization per direction asked, shared by its operands; the amax
    /// check deferred.
    fn quantize_fp8_group(
        &self,
        ((rows, cols), wants): Group,
        cfg: &Fp8GroupConfig,
        label: &dyn Fn() -> String,
        out: &mut Slots<'_>,
    ) -> super::Result<()> {
        let ctx = self.device().context();
        let dirs = [Along::Cols, Along::Rows].map(|a| wants.iter().any(|w| w.1 == a));
        let qs = ctx.quantize_fp8_group_2d(self.buffer(), self.dtype(), (rows, cols), cfg, dirs)?;
        let qs = qs.map(|q| q.map(Arc::new));
        if let Some(q) = qs.iter().flatten().next() {
            ctx.defer_finite_check(q.amax_ptr(), label())?;
        }
        for &(slot, along) in wants {
            let q = qs[(along == Along::Rows) as usize].clone();
            let q = q.ok_or_else(|| CudaError::Invalid("FP8 group codes not written".into()))?;
            out.put(slot, CudaOperand::Fp8Group { q, along });
        }
        Ok(())
    }

    /// One `mx_tile` pass.
    fn quantize_mx(
        &self,
        (rows, cols): (usize, usize),
        pass: MxPass,
        out: &mut Slots<'_>,
    ) -> super::Result<()> {
        let ctx = self.device().context();
        // Codes for every operand where the device multiplies them.
        let native = mx_codes_native(ctx, &pass.cfg);
        let [by_row, by_col] = pass.dirs;
        let want = |d: &Option<(MxWant, Vec<usize>)>| d.as_ref().map(|(w, _)| *w);
        let (x, dtype) = (self.buffer(), self.dtype());
        let (ro, co) = ctx.mx_tile(
            x,
            dtype,
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
            let MxOut { q, deq, .. } = res;
            let (q, deq) = (q.map(Arc::new), deq.map(Arc::new));
            for slot in slots {
                let missing = || CudaError::Invalid("mx_tile did not write an output".into());
                let op = if out.is_keep(slot) || native {
                    let q = q.clone().ok_or_else(missing)?;
                    CudaOperand::Mx { q, along }
                } else {
                    CudaOperand::MxDeq {
                        deq: deq.clone().ok_or_else(missing)?,
                        rows: qrows,
                        padded_len: len.div_ceil(32) * 32,
                    }
                };
                out.put(slot, op);
            }
        }
        Ok(())
    }

    /// The NVFP4 requests `(slot, config, along)`: one quantization per
    /// distinct `now` copy, writing the BF16 GEMM operand, and one for the
    /// kept copy, writing codes. Its amax check is deferred, named as the
    /// CPU names it (without the block).
    fn quantize_nvfp4(
        &self,
        (rows, cols): (usize, usize),
        reqs: &[(usize, Nvfp4Config, Along)],
        label: &dyn Fn() -> String,
        out: &mut Slots<'_>,
    ) -> super::Result<()> {
        let ctx = self.device().context();
        let mut done: Vec<(Nvfp4Config, Along, Arc<Nvfp4Device>)> = Vec::new();
        // The kept copy first, as the CPU quantizes it, so that a
        // non-finite input is reported for the same copy.
        let (kept, now): (Vec<_>, Vec<_>) = reqs.iter().partition(|r| out.is_keep(r.0));
        for &(slot, cfg, along) in kept.into_iter().chain(now) {
            let keep = out.is_keep(slot);
            let same = |d: &&(Nvfp4Config, Along, _)| !keep && d.0 == cfg && d.1 == along;
            if let Some((.., q)) = done.iter().find(same) {
                let q = q.clone();
                out.put(slot, CudaOperand::Nvfp4 { q, along });
                continue;
            }
            let outputs = Nvfp4Outputs {
                codes: keep,
                deq: !keep,
            };
            let x = (self.buffer(), self.dtype());
            let q = Arc::new(ctx.quantize_nvfp4(x, (rows, cols), along, &cfg, outputs)?);
            let axis = usize::from(along == Along::Cols);
            let name = format!(
                "{}: NVFP4 input of shape [{rows}, {cols}] along axis {axis}{}",
                label(),
                if cfg.hadamard {
                    " (after the Hadamard)"
                } else {
                    ""
                }
            );
            ctx.defer_finite_check(q.amax_ptr(), name)?;
            if !keep {
                done.push((cfg, along, q.clone()));
            }
            out.put(slot, CudaOperand::Nvfp4 { q, along });
        }
        Ok(())
    }

    /// Serves every entry of `req`.
    pub(super) fn quantize_request<'a>(
        &'a self,
        req: &Request,
    ) -> super::Result<Quantized<'a, CudaStorage>> {
        let mut wants: Vec<Want> = req.now.to_vec();
        wants.extend(req.keep);
        let dims = (req.rows, req.cols);
        let mut out = Slots {
            now: (0..req.now.len()).map(|_| None).collect(),
            keep: None,
        };
        let of = |f: &dyn Fn(&Format) -> bool| -> Vec<(usize, Along)> {
            (0..wants.len())
                .filter(|&i| f(&wants[i].format))
                .map(|i| (i, wants[i].along))
                .collect()
        };
        let bf16 = of(&|f| *f == Format::Bf16);
        if !bf16.is_empty() {
            self.quantize_bf16((dims, &bf16), &mut out)?;
        }
        let mut fp8: Vec<(ElemFormat, bool)> = Vec::new();
        let mut mx = Vec::new();
        let mut nvfp4 = Vec::new();
        for (i, w) in wants.iter().enumerate() {
            match w.format {
                Format::Tensorwise { elem, pow2 } if !fp8.contains(&(elem, pow2)) => {
                    fp8.push((elem, pow2))
                }
                Format::Mx(cfg) => {
                    let codes = out.is_keep(i) || mx_codes_native(self.device().context(), &cfg);
                    mx.push((i, cfg, w.along, codes))
                }
                Format::Nvfp4(cfg) => nvfp4.push((i, cfg, w.along)),
                _ => {}
            }
        }
        for (elem, pow2) in fp8 {
            let group = of(&|f| *f == Format::Tensorwise { elem, pow2 });
            self.quantize_fp8((dims, &group), (elem, pow2), req.label, &mut out)?;
        }
        let mut fp8g: Vec<Fp8GroupConfig> = Vec::new();
        for w in &wants {
            match w.format {
                Format::Fp8Group(cfg) if !fp8g.contains(&cfg) => fp8g.push(cfg),
                _ => {}
            }
        }
        for cfg in fp8g {
            let group = of(&|f| *f == Format::Fp8Group(cfg));
            self.quantize_fp8_group((dims, &group), &cfg, req.label, &mut out)?;
        }
        for pass in mx_passes(&mx) {
            self.quantize_mx(dims, pass, &mut out)?;
        }
        if !nvfp4.is_empty() {
            self.quantize_nvfp4(dims, &nvfp4, req.label, &mut out)?;
        }
        let now: Vec<CudaOperand<'a>> = out.now.into_iter().flatten().collect();
        if now.len() != req.now.len() || out.keep.is_some() != req.keep.is_some() {
            return Err(CudaError::Invalid(
                "quantize did not serve every request".into(),
            ));
        }
        Ok(Quantized {
            now,
            keep: out.keep,
        })
    }
}
