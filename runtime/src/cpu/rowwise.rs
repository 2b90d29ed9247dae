//! Kernels over rows of the last axis of a packed buffer: softmax, layer and
//! RMS normalization, interleaved RoPE. Statistics accumulate in f64 so they
//! do not depend on row length or thread split.

use super::{for_each_row, for_each_row_weighted};

/// Numerically stable softmax of each row of length `d`.
pub(super) fn softmax(x: &[f32], d: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for_each_row(&mut out, d, |r, dst| {
        let row = &x[r * d..(r + 1) * d];
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut sum = 0f64;
        for (o, &v) in dst.iter_mut().zip(row) {
            *o = (v - max).exp();
            sum += f64::from(*o);
        }
        let inv = (1.0 / sum) as f32;
        dst.iter_mut().for_each(|o| *o *= inv);
    });
    out
}

/// Normalizes each row of length `d`: y = (x - mean) * rstd with
/// rstd = 1 / sqrt(var + eps), or y = x * rstd with rstd = 1 / sqrt(mean(x^2) + eps)
/// when `rms`. Returns y and one rstd per row.
pub(super) fn norm(x: &[f32], d: usize, eps: f32, rms: bool) -> (Vec<f32>, Vec<f32>) {
    let rows = x.len().checked_div(d).unwrap_or(0);
    // (mean, rstd) per row.
    let mut stats = vec![(0f32, 0f32); rows];
    for_each_row_weighted(&mut stats, 1, d, |r, dst| {
        let row = &x[r * d..(r + 1) * d];
        let n = d as f64;
        let mean = if rms {
            0.0
        } else {
            row.iter().map(|&v| f64::from(v)).sum::<f64>() / n
        };
        let var = row
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        dst[0] = (mean as f32, (1.0 / (var + f64::from(eps)).sqrt()) as f32);
    });
    let mut y = vec![0f32; x.len()];
    for_each_row(&mut y, d, |r, dst| {
        let (mean, rstd) = stats[r];
        for (o, &v) in dst.iter_mut().zip(&x[r * d..(r + 1) * d]) {
            *o = (v - mean) * rstd;
        }
    });
    (y, stats.into_iter().map(|(_, rstd)| rstd).collect())
}

/// Rotates pairs (2i, 2i+1) of each row of x `[.., L, D]`: row r is position
/// r % L, and `cos`, `sin` are packed `[L, D/2]`.
pub(super) fn rope_interleaved(
    x: &[f32],
    seq: usize,
    d: usize,
    cos: &[f32],
    sin: &[f32],
) -> Vec<f32> {
    let half = d / 2;
    let mut out = vec![0f32; x.len()];
    for_each_row(&mut out, d, |r, dst| {
        let p = r % seq;
        let (c, s) = (
            &cos[p * half..(p + 1) * half],
            &sin[p * half..(p + 1) * half],
        );
        let row = &x[r * d..(r + 1) * d];
        for (i, (o, v)) in dst.chunks_exact_mut(2).zip(row.chunks_exact(2)).enumerate() {
            o[0] = v[0] * c[i] - v[1] * s[i];
            o[1] = v[0] * s[i] + v[1] * c[i];
        }
    });
    out
}
