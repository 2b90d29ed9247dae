//! Sum and max over one axis of a packed buffer viewed as `[outer, n, inner]`.

use rayon::prelude::*;

use super::{for_each_row, for_each_row_weighted, PAR_MIN_ELEMS};
use crate::op::ReduceOp;

/// Reduces the middle axis of `x` viewed as `[outer, n, inner]` into `[outer, inner]`.
pub(super) fn reduce(x: &[f32], outer: usize, n: usize, inner: usize, op: ReduceOp) -> Vec<f32> {
    let mut out = vec![0f32; outer * inner];
    if inner == 1 {
        // Each output is a reduction of a packed row.
        for_each_row_weighted(&mut out, 1, n, |o, dst| {
            dst[0] = reduce_row(&x[o * n..(o + 1) * n], op)
        });
        return out;
    }
    // Reduces columns c0.. of outer row `o` into `dst`.
    let reduce_cols = |o: usize, c0: usize, dst: &mut [f32]| {
        let block = &x[o * n * inner..(o + 1) * n * inner];
        let width = dst.len();
        let rows = block.chunks_exact(inner).map(|row| &row[c0..c0 + width]);
        match op {
            ReduceOp::Sum => {
                dst.fill(0.0);
                for row in rows {
                    for (d, &v) in dst.iter_mut().zip(row) {
                        *d += v;
                    }
                }
            }
            ReduceOp::Max => {
                dst.fill(f32::NEG_INFINITY);
                for row in rows {
                    for (d, &v) in dst.iter_mut().zip(row) {
                        *d = max_nan(*d, v);
                    }
                }
            }
        }
    };
    if outer >= rayon::current_num_threads() || x.len() < PAR_MIN_ELEMS {
        for_each_row(&mut out, inner, |o, dst| reduce_cols(o, 0, dst));
    } else {
        // Few outer rows (a bias gradient sums [M, N] over M): split the columns.
        for (o, dst) in out.chunks_mut(inner).enumerate() {
            dst.par_chunks_mut(COLUMN_CHUNK)
                .enumerate()
                .for_each(|(c, d)| reduce_cols(o, c * COLUMN_CHUNK, d));
        }
    }
    out
}

/// Columns per task when the columns are split across threads.
const COLUMN_CHUNK: usize = 256;

/// Lanes of the packed-row sum: independent partial sums vectorize and add
/// less rounding error than one running sum.
const LANES: usize = 8;

/// Reduces one packed row, splitting long rows across threads.
pub(super) fn reduce_row(row: &[f32], op: ReduceOp) -> f32 {
    if row.len() >= 4 * PAR_MIN_ELEMS {
        let parts: Vec<f32> = row
            .par_chunks(PAR_MIN_ELEMS)
            .map(|c| reduce_row_seq(c, op))
            .collect();
        return reduce_row_seq(&parts, op);
    }
    reduce_row_seq(row, op)
}

fn reduce_row_seq(row: &[f32], op: ReduceOp) -> f32 {
    match op {
        ReduceOp::Sum => {
            let mut acc = [0f32; LANES];
            let chunks = row.chunks_exact(LANES);
            let tail: f32 = chunks.remainder().iter().sum();
            for c in chunks {
                for (a, &v) in acc.iter_mut().zip(c) {
                    *a += v;
                }
            }
            acc.iter().sum::<f32>() + tail
        }
        ReduceOp::Max => row.iter().fold(f32::NEG_INFINITY, |m, &v| max_nan(m, v)),
    }
}

/// Max that lets NaN through, so a NaN upstream is never hidden.
#[inline]
pub(super) fn max_nan(m: f32, v: f32) -> f32 {
    if v > m || v.is_nan() {
        v
    } else {
        m
    }
}
