//! [`LinearBackend::quantize`](crate::backend::LinearBackend::quantize) on
//! the GPU: the requests for one matrix are grouped so that each input is
//! read as few times as the kernels allow. All BF16 copies share one buffer
//! (or the input itself); the FP8 copies of one format come from one
//! `fp8_cast_2d` (codes and transpose); the MX copies of one element format,
//! scale mode and tiling from one `mx_tile` pass per pair of rows/columns
//! settings (Hadamard, stochastic rounding); the NVFP4 copies likewise from
//! one `quantize_nvfp4_2d` pass per pair of directions (each direction with
//! its own tensor amax, which the Hadamard makes depend on the axis),
//! identical `now` requests sharing one copy.

use std::sync::Arc;

use super::lin_kernels::{act_in, r16, Out};
use super::mx_tile::{MxOut, MxWant};
use super::nvfp4::{along_index, Nvfp4Outputs};
use super::operand::{aligned, mx_codes_native, Bf16Matrix, Buf, CudaOperand, Fp8Matrix};
use super::quantize::Fp8Outputs;
use super::{CudaError, CudaStorage, DevBuf};
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

/// One direction of an NVFP4 pass: its settings, outputs, axis and the
/// slots it serves.
struct Nvfp4Dir {
    cfg: Nvfp4Config,
    outputs: Nvfp4Outputs,
    along: Along,
    slots: Vec<usize>,
}

/// One `quantize_nvfp4_2d` pass, indexed by [`along_index`].
type Nvfp4Pass = [Option<Nvfp4Dir>; 2];

/// Groups NVFP4 requests `(slot, config, along)` into passes, the kept
/// copy's (`keep(request)`) first: a pass shares `tile2d`; each direction
/// serves the requests of one configuration, the kept copy (codes) or
/// `now` copies (the BF16 operand), never both, so a kept copy owns only
/// its codes.
fn nvfp4_passes<K>(reqs: &[(usize, Nvfp4Config, Along)], keep: K) -> Vec<Nvfp4Pass>
where
    K: Fn(&(usize, Nvfp4Config, Along)) -> bool,
{
    let (kept, now): (Vec<_>, Vec<_>) = reqs.iter().partition(|r| keep(r));
    let mut passes: Vec<Nvfp4Pass> = Vec::new();
    for (is_keep, &(slot, cfg, along)) in kept
        .into_iter()
        .map(|r| (true, r))
        .chain(now.into_iter().map(|r| (false, r)))
    {
        let d = along_index(along);
        let outputs = Nvfp4Outputs {
            codes: is_keep,
            deq: !is_keep,
        };
        let fits = |p: &Nvfp4Pass| {
            p.iter().flatten().all(|o| o.cfg.tile2d == cfg.tile2d)
                && p[d]
                    .as_ref()
                    .is_none_or(|o| !is_keep && o.cfg == cfg && o.outputs == outputs)
        };
        let i = passes.iter().position(fits).unwrap_or_else(|| {
            passes.push([None, None]);
            passes.len() - 1
        });
        let dir = passes[i][d].get_or_insert_with(|| Nvfp4Dir {
            cfg,
            outputs,
            along,
            slots: Vec::new(),
        });
        dir.slots.push(slot);
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
    /// check deferred. With `column_sums`, the column sums when its pass
    /// could take them (128-blocks).
    fn quantize_fp8_group(
        &self,
        ((rows, cols), wants): Group,
        (cfg, column_sums): (&Fp8GroupConfig, bool),
        label: &dyn Fn() -> String,
        out: &mut Slots<'_>,
    ) -> super::Result<Option<DevBuf>> {
        let ctx = self.device().context();
        let dirs = [Along::Cols, Along::Rows].map(|a| wants.iter().any(|w| w.1 == a));
        let x = self.buffer();
        let (qs, sums) =
            ctx.quantize_fp8_group_2d(x, self.dtype(), (rows, cols), cfg, dirs, column_sums)?;
        let qs = qs.map(|q| q.map(Arc::new));
        if let Some(q) = qs.iter().flatten().next() {
            ctx.defer_finite_check(q.amax_ptr(), label())?;
        }
        for &(slot, along) in wants {
            let q = qs[(along == Along::Rows) as usize].clone();
            let q = q.ok_or_else(|| CudaError::Invalid("FP8 group codes not written".into()))?;
            out.put(slot, CudaOperand::Fp8Group { q, along });
        }
        Ok(sums)
    }

    /// One `mx_tile` pass.
    fn quantize_mx(
        &self,
        (rows, cols): (usize, usize),
        (pass, column_sums): (MxPass, bool),
        out: &mut Slots<'_>,
    ) -> super::Result<Option<DevBuf>> {
        let ctx = self.device().context();
        // Codes for every operand where the device multiplies them.
        let native = mx_codes_native(ctx, &pass.cfg);
        let [by_row, by_col] = pass.dirs;
        let want = |d: &Option<(MxWant, Vec<usize>)>| d.as_ref().map(|(w, _)| *w);
        let (x, dtype) = (self.buffer(), self.dtype());
        let (ro, co, sums) = ctx.mx_tile(
            x,
            dtype,
            (rows, cols),
            &pass.cfg,
            want(&by_row),
            want(&by_col),
            column_sums,
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
        Ok(sums)
    }

    /// One `quantize_nvfp4_2d` pass: both directions from one read, each
    /// copy's amax check deferred, named as the CPU names it (without the
    /// block); with `column_sums`, the column sums when its amax pass could
    /// take them.
    fn quantize_nvfp4(
        &self,
        (rows, cols): (usize, usize),
        (pass, column_sums): (Nvfp4Pass, bool),
        label: &dyn Fn() -> String,
        out: &mut Slots<'_>,
    ) -> super::Result<Option<DevBuf>> {
        let ctx = self.device().context();
        let x = (self.buffer(), self.dtype());
        let want = |d: &Option<Nvfp4Dir>| d.as_ref().map(|d| (d.cfg, d.outputs));
        let dirs = [want(&pass[0]), want(&pass[1])];
        let (qs, sums) = ctx.quantize_nvfp4_2d(x, (rows, cols), dirs, column_sums)?;
        let mut done: Vec<_> = pass.into_iter().zip(qs).collect();
        // The kept copy's check first, as the CPU quantizes it first.
        done.sort_by_key(|(d, _)| !d.as_ref().is_some_and(|d| d.outputs.codes));
        for (d, q) in done {
            let (Some(d), Some(q)) = (d, q) else { continue };
            let along = d.along;
            let axis = usize::from(along == Along::Cols);
            let name = format!(
                "{}: NVFP4 input of shape [{rows}, {cols}] along axis {axis}{}",
                label(),
                if d.cfg.hadamard {
                    " (after the Hadamard)"
                } else {
                    ""
                }
            );
            ctx.defer_finite_check(q.amax_ptr(), name)?;
            let q = Arc::new(q);
            for slot in d.slots {
                out.put(
                    slot,
                    CudaOperand::Nvfp4 {
                        q: q.clone(),
                        along,
                    },
                );
            }
        }
        Ok(sums)
    }

    /// The f32 column sums of the packed `[rows, cols]` matrix in `self`, a
    /// pass of their own (`lin_colsum`).
    pub(super) fn lin_column_sums(&self, rows: usize, cols: usize) -> super::Result<DevBuf> {
        let ctx = self.device().context();
        ctx.lin_colsum(self.buffer(), act_in(self.dtype())?, rows, cols)
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
        // The column sums come with the first FP8 128-block, MX or NVFP4
        // pass that can take them on its read, else from a pass of their own.
        let mut column_sums = None;
        for cfg in fp8g {
            let group = of(&|f| *f == Format::Fp8Group(cfg));
            let want_sums = req.column_sums && column_sums.is_none();
            let sums =
                self.quantize_fp8_group((dims, &group), (&cfg, want_sums), req.label, &mut out)?;
            column_sums = column_sums.or(sums);
        }
        for pass in mx_passes(&mx) {
            let want_sums = req.column_sums && column_sums.is_none();
            let sums = self.quantize_mx(dims, (pass, want_sums), &mut out)?;
            column_sums = column_sums.or(sums);
        }
        // The kept copy's pass first, as the CPU quantizes it first, so that
        // a non-finite input is reported for the same copy.
        let keep = |r: &(usize, Nvfp4Config, Along)| out.is_keep(r.0);
        for pass in nvfp4_passes(&nvfp4, keep) {
            let want_sums = req.column_sums && column_sums.is_none();
            let sums = self.quantize_nvfp4(dims, (pass, want_sums), req.label, &mut out)?;
            column_sums = column_sums.or(sums);
        }
        if req.column_sums && column_sums.is_none() {
            column_sums = Some(self.lin_column_sums(req.rows, req.cols)?);
        }
        let device = self.device();
        let column_sums =
            column_sums.map(|s| CudaStorage::from_buffer(s, DType::F32, req.cols, device.clone()));
        let now: Vec<CudaOperand<'a>> = out.now.into_iter().flatten().collect();
        if now.len() != req.now.len() || out.keep.is_some() != req.keep.is_some() {
            return Err(CudaError::Invalid(
                "quantize did not serve every request".into(),
            ));
        }
        Ok(Quantized {
            now,
            keep: out.keep,
            column_sums,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(p: &Nvfp4Pass) -> [Option<(Vec<usize>, bool)>; 2] {
        p.each_ref()
            .map(|d| d.as_ref().map(|d| (d.slots.clone(), d.outputs.codes)))
    }

    /// The linear's requests: x (its operand along the columns, its kept
    /// Hadamard copy along the rows) and dy (two SR operands) take one pass
    /// each; identical `now` copies share a direction; a kept copy never
    /// shares one with `now` copies, and tilings never share a pass.
    #[test]
    fn nvfp4_requests_group_into_two_direction_passes() {
        let plain = Nvfp4Config::default();
        let had = Nvfp4Config {
            hadamard: true,
            ..plain
        };
        let tiles = Nvfp4Config {
            tile2d: true,
            ..plain
        };
        let x = [(0, plain, Along::Cols), (1, had, Along::Rows)];
        let p = nvfp4_passes(&x, |r| r.0 == 1);
        assert_eq!(p.len(), 1);
        assert_eq!(
            slots(&p[0]),
            [Some((vec![0], false)), Some((vec![1], true))]
        );

        let same = [
            (0, plain, Along::Cols),
            (1, plain, Along::Cols),
            (2, plain, Along::Cols),
        ];
        let p = nvfp4_passes(&same, |r| r.0 == 2);
        assert_eq!(p.len(), 2);
        assert_eq!(slots(&p[0]), [Some((vec![2], true)), None]);
        assert_eq!(slots(&p[1]), [Some((vec![0, 1], false)), None]);

        let mixed = [(0, plain, Along::Cols), (1, tiles, Along::Rows)];
        assert_eq!(nvfp4_passes(&mixed, |_| false).len(), 2);
    }
}
