//! The CPU's fused modulation ops ([`FusedBackend`]), the reference the CUDA
//! kernels (`kernels/ops_fused.cu`) are checked against.
//!
//! Element math is f32, in the order of the unfused composition it replaces
//! (so an f32 result has the composition's bits); row statistics and the
//! sums over tokens accumulate in f64, in token order.

use std::borrow::Cow;

use super::{for_each_row, for_each_row_weighted, CpuStorage};
use crate::backend::{
    BackendStorage, FusedBackend, ModNormSaved, ModShape, RmsRopeSaved, RopeShape,
};
use crate::formats::bf16;
use crate::{DType, Error, Layout, Result, Shape};

/// Columns of `[batch, hidden]` one task of a sum over tokens owns.
const SUM_COLS: usize = 64;

/// The whole packed buffer as f32 (BF16 widened exactly).
fn values<'a>(s: &'a CpuStorage, op: &str) -> Result<Cow<'a, [f32]>> {
    s.packed_f32(&Layout::contiguous(Shape::from([s.len()])), op)
}

/// Checks that a packed operand holds `n` elements.
fn expect_len(v: &[f32], n: usize, what: &str, op: &str) -> Result<()> {
    if v.len() != n {
        return Err(Error::Shape(format!(
            "{op}: {what} holds {} elements, expected {n}",
            v.len()
        )));
    }
    Ok(())
}

/// (fl32(mean), fl32(1 / sqrt(var + eps))) of each row of length `d`, in
/// f64 as `rowwise::norm` computes them.
fn row_stats(x: &[f32], d: usize, eps: f32) -> Vec<(f32, f32)> {
    let rows = x.len().checked_div(d).unwrap_or(0);
    let mut stats = vec![(0f32, 0f32); rows];
    for_each_row_weighted(&mut stats, 1, d, |r, dst| {
        let row = &x[r * d..(r + 1) * d];
        let n = d as f64;
        let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = row
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        dst[0] = (mean as f32, (1.0 / (var + f64::from(eps)).sqrt()) as f32);
    });
    stats
}

/// fl32(1 / sqrt(mean(x^2) + eps)) of each row of length `d`, in f64 as
/// `rowwise::norm` computes it for RMSNorm.
fn rms_stats(x: &[f32], d: usize, eps: f32) -> Vec<f32> {
    let rows = x.len().checked_div(d).unwrap_or(0);
    let mut rstd = vec![0f32; rows];
    for_each_row_weighted(&mut rstd, 1, d, |r, dst| {
        let row = &x[r * d..(r + 1) * d];
        let var = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / d as f64;
        dst[0] = (1.0 / (var + f64::from(eps)).sqrt()) as f32;
    });
    rstd
}

/// `v` rounded to `dtype` and widened back (what a cast to it keeps).
fn round_to(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::BF16 => bf16::round(v),
        _ => v,
    }
}

/// For each (batch b, column j) of `[batch, hidden]`: the f64 sums over the
/// tokens t of b of `term(row, j)`, row = b * tokens + t, in token order.
fn sum_over_tokens<const K: usize>(
    shape: ModShape,
    term: impl Fn(usize, usize) -> [f64; K] + Sync,
) -> Vec<[f64; K]> {
    let ModShape {
        batch,
        tokens,
        hidden,
    } = shape;
    let mut out = vec![[0f64; K]; batch * hidden];
    for_each_row_weighted(&mut out, SUM_COLS, tokens, |c, dst| {
        let cols: Vec<(usize, usize)> = (c * SUM_COLS..)
            .take(dst.len())
            .map(|e| ((e / hidden) * tokens, e % hidden))
            .collect();
        for t in 0..tokens {
            for (acc, &(row0, j)) in dst.iter_mut().zip(&cols) {
                let v = term(row0 + t, j);
                for (a, v) in acc.iter_mut().zip(v) {
                    *a += v;
                }
            }
        }
    });
    out
}

/// f64 sums rounded once to f32, then packed as `dtype`.
fn round_sums(sums: impl Iterator<Item = f64>, dtype: DType) -> CpuStorage {
    CpuStorage::from_f32(sums.map(|s| s as f32).collect(), dtype)
}

impl FusedBackend for CpuStorage {
    fn modulated_norm(
        x: &CpuStorage,
        shift: &CpuStorage,
        scale: &CpuStorage,
        shape: ModShape,
        eps: f32,
    ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
        let op = "modulated_layer_norm";
        let d = shape.hidden;
        let xv = values(x, op)?;
        let (sh, sc) = (values(shift, op)?, values(scale, op)?);
        expect_len(&xv, shape.batch * shape.tokens * d, "x", op)?;
        expect_len(&sh, shape.batch * d, "shift", op)?;
        expect_len(&sc, shape.batch * d, "scale", op)?;
        let stats = row_stats(&xv, d, eps);
        let mut y = vec![0f32; xv.len()];
        for_each_row(&mut y, d, |r, dst| {
            let (mean, rstd) = stats[r];
            let b = r / shape.tokens;
            let (sh, sc) = (&sh[b * d..(b + 1) * d], &sc[b * d..(b + 1) * d]);
            for (j, (o, &v)) in dst.iter_mut().zip(&xv[r * d..(r + 1) * d]).enumerate() {
                // The unfused order: LN, times (scale * 1 + 1), plus shift.
                *o = ((v - mean) * rstd) * (1.0 + sc[j]) + sh[j];
            }
        });
        let (mean, rstd): (Vec<f32>, Vec<f32>) = stats.into_iter().unzip();
        Ok((
            CpuStorage::from_f32(y, x.dtype()),
            CpuStorage::F32(mean),
            CpuStorage::F32(rstd),
        ))
    }

    fn modulated_norm_backward(
        saved: ModNormSaved<'_, CpuStorage>,
        g: &CpuStorage,
        shape: ModShape,
    ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
        let op = "modulated_layer_norm backward";
        let d = shape.hidden;
        let rows = shape.batch * shape.tokens;
        let (xv, gv) = (values(saved.x, op)?, values(g, op)?);
        let sc = values(saved.scale, op)?;
        let (mean, rstd) = (values(saved.mean, op)?, values(saved.rstd, op)?);
        expect_len(&xv, rows * d, "x", op)?;
        expect_len(&gv, rows * d, "the gradient", op)?;
        expect_len(&sc, shape.batch * d, "scale", op)?;
        expect_len(&mean, rows, "mean", op)?;
        expect_len(&rstd, rows, "rstd", op)?;
        let y_at = |r: usize, j: usize| (xv[r * d + j] - mean[r]) * rstd[r];
        let mut dx = vec![0f32; xv.len()];
        for_each_row(&mut dx, d, |r, dst| {
            let sc = &sc[(r / shape.tokens) * d..][..d];
            let dy = |j: usize| gv[r * d + j] * (1.0 + sc[j]);
            let (mut s_dy, mut s_dyy) = (0f64, 0f64);
            for j in 0..d {
                s_dy += f64::from(dy(j));
                s_dyy += f64::from(dy(j)) * f64::from(y_at(r, j));
            }
            let (m_dy, m_dyy) = ((s_dy / d as f64) as f32, (s_dyy / d as f64) as f32);
            for (j, o) in dst.iter_mut().enumerate() {
                *o = ((dy(j) - m_dy) - y_at(r, j) * m_dyy) * rstd[r];
            }
        });
        let sums = sum_over_tokens(shape, |r, j| {
            let gj = f64::from(gv[r * d + j]);
            [gj, gj * f64::from(y_at(r, j))]
        });
        let dtype = g.dtype();
        Ok((
            CpuStorage::from_f32(dx, saved.x.dtype()),
            round_sums(sums.iter().map(|s| s[0]), dtype),
            round_sums(sums.iter().map(|s| s[1]), dtype),
        ))
    }

    fn gated_add(
        x: &CpuStorage,
        gate: &CpuStorage,
        y: &CpuStorage,
        shape: ModShape,
    ) -> Result<CpuStorage> {
        let op = "gated_residual";
        let d = shape.hidden;
        let (xv, gt, yv) = (values(x, op)?, values(gate, op)?, values(y, op)?);
        expect_len(&xv, shape.batch * shape.tokens * d, "x", op)?;
        expect_len(&yv, xv.len(), "y", op)?;
        expect_len(&gt, shape.batch * d, "gate", op)?;
        let mut out = vec![0f32; xv.len()];
        for_each_row(&mut out, d, |r, dst| {
            let gt = &gt[(r / shape.tokens) * d..][..d];
            let (xr, yr) = (&xv[r * d..(r + 1) * d], &yv[r * d..(r + 1) * d]);
            for (j, o) in dst.iter_mut().enumerate() {
                // The unfused order: x + (gate * y).
                *o = xr[j] + gt[j] * yr[j];
            }
        });
        Ok(CpuStorage::from_f32(out, x.dtype()))
    }

    fn rms_norm_rope(
        x: &CpuStorage,
        weight: &CpuStorage,
        [cos, sin]: [&CpuStorage; 2],
        shape: RopeShape,
        eps: f32,
    ) -> Result<(CpuStorage, CpuStorage)> {
        let op = "rms_norm_rope";
        let RopeShape { rows, d, seq } = shape;
        let half = d / 2;
        let (xv, w) = (values(x, op)?, values(weight, op)?);
        let (c, s) = (values(cos, op)?, values(sin, op)?);
        expect_len(&xv, rows * d, "x", op)?;
        expect_len(&w, d, "the weight", op)?;
        expect_len(&c, seq * half, "cos", op)?;
        expect_len(&s, seq * half, "sin", op)?;
        let dt = x.dtype();
        let rstd = rms_stats(&xv, d, eps);
        let mut out = vec![0f32; xv.len()];
        for_each_row(&mut out, d, |r, dst| {
            // The composition: RMSNorm (x - 0) * rstd, times the weight, cast
            // to x's dtype, then rope_interleaved's rotation.
            let z = |j: usize| round_to(dt, (xv[r * d + j] * rstd[r]) * w[j]);
            let p = (r % seq) * half;
            for (i, o) in dst.chunks_exact_mut(2).enumerate() {
                let (z0, z1, ci, si) = (z(2 * i), z(2 * i + 1), c[p + i], s[p + i]);
                o[0] = z0 * ci - z1 * si;
                o[1] = z0 * si + z1 * ci;
            }
        });
        Ok((CpuStorage::from_f32(out, dt), CpuStorage::F32(rstd)))
    }

    fn rms_norm_rope_backward(
        saved: RmsRopeSaved<'_, CpuStorage>,
        g: &CpuStorage,
        shape: RopeShape,
    ) -> Result<(CpuStorage, CpuStorage)> {
        let op = "rms_norm_rope backward";
        let RopeShape { rows, d, seq } = shape;
        let half = d / 2;
        let (xv, w, gv) = (
            values(saved.x, op)?,
            values(saved.weight, op)?,
            values(g, op)?,
        );
        let (c, s) = (values(saved.tables[0], op)?, values(saved.tables[1], op)?);
        let rstd = values(saved.rstd, op)?;
        expect_len(&xv, rows * d, "x", op)?;
        expect_len(&gv, rows * d, "the gradient", op)?;
        expect_len(&w, d, "the weight", op)?;
        expect_len(&c, seq * half, "cos", op)?;
        expect_len(&s, seq * half, "sin", op)?;
        expect_len(&rstd, rows, "rstd", op)?;
        let dt = saved.x.dtype();
        // g rotated back (rope_interleaved with -sin) in x's dtype.
        let mut back = vec![0f32; gv.len()];
        for_each_row(&mut back, d, |r, dst| {
            let p = (r % seq) * half;
            let row = &gv[r * d..(r + 1) * d];
            for (i, (o, v)) in dst.chunks_exact_mut(2).zip(row.chunks_exact(2)).enumerate() {
                let (ci, sn) = (c[p + i], -s[p + i]);
                o[0] = round_to(dt, v[0] * ci - v[1] * sn);
                o[1] = round_to(dt, v[0] * sn + v[1] * ci);
            }
        });
        let y = |r: usize, j: usize| xv[r * d + j] * rstd[r];
        let mut dx = vec![0f32; xv.len()];
        for_each_row(&mut dx, d, |r, dst| {
            let dy = |j: usize| back[r * d + j] * w[j];
            let s_dyy: f64 = (0..d).map(|j| f64::from(dy(j)) * f64::from(y(r, j))).sum();
            let m = (s_dyy / d as f64) as f32;
            for (j, o) in dst.iter_mut().enumerate() {
                *o = (dy(j) - y(r, j) * m) * rstd[r];
            }
        });
        let rows_shape = ModShape {
            batch: 1,
            tokens: rows,
            hidden: d,
        };
        let dw = sum_over_tokens(rows_shape, |r, j| {
            [f64::from(back[r * d + j]) * f64::from(y(r, j))]
        });
        Ok((
            CpuStorage::from_f32(dx, dt),
            round_sums(dw.iter().map(|s| s[0]), DType::F32),
        ))
    }

    fn gated_add_dgate(g: &CpuStorage, y: &CpuStorage, shape: ModShape) -> Result<CpuStorage> {
        let op = "gated_residual backward";
        let d = shape.hidden;
        let (gv, yv) = (values(g, op)?, values(y, op)?);
        expect_len(&gv, shape.batch * shape.tokens * d, "the gradient", op)?;
        expect_len(&yv, gv.len(), "y", op)?;
        let sums = sum_over_tokens(shape, |r, j| {
            [f64::from(gv[r * d + j]) * f64::from(yv[r * d + j])]
        });
        Ok(round_sums(sums.iter().map(|s| s[0]), g.dtype()))
    }
}
