//! Batched GEMM through the `gemm` crate, which takes arbitrary row and column
//! strides, so transposed views (k^T in attention, W^T in a linear) are
//! multiplied in place without a copy.

use gemm::{gemm, Parallelism};
use rayon::prelude::*;

use crate::Layout;

/// Below this many multiply-adds per matrix, `gemm` runs single-threaded
/// (its own threading threshold, 48 * 48 * 256), so a batch of such matrices
/// is better split across threads one matrix each.
const SMALL_GEMM_MACS: usize = 48 * 48 * 256;

/// `[.., M, K] x [.., K, N] -> [.., M, N]` with equal batch dims (stride 0
/// where broadcast); the output is packed.
pub(crate) fn matmul(lhs: &[f32], ll: &Layout, rhs: &[f32], rl: &Layout) -> Vec<f32> {
    assert!(
        ll.max_extent() <= lhs.len() && rl.max_extent() <= rhs.len(),
        "layout reaches past its buffer"
    );
    let rank = ll.dims().len();
    assert!(
        rank >= 2 && rl.dims().len() == rank,
        "matmul takes two views of equal rank >= 2"
    );
    assert_eq!(
        ll.dims()[..rank - 2],
        rl.dims()[..rank - 2],
        "batch dims are broadcast by the caller"
    );
    let (m, k, n) = (
        ll.dims()[rank - 2],
        ll.dims()[rank - 1],
        rl.dims()[rank - 1],
    );
    assert_eq!(rl.dims()[rank - 2], k, "inner dims agree");
    let batch: usize = ll.dims()[..rank - 2].iter().product();
    let mut out = vec![0f32; batch * m * n];
    if m * n == 0 || k == 0 {
        return out;
    }
    let stride = |l: &Layout, i: usize| l.strides()[i] as isize;
    let (l_rs, l_cs) = (stride(ll, rank - 2), stride(ll, rank - 1));
    let (r_rs, r_cs) = (stride(rl, rank - 2), stride(rl, rank - 1));
    let run = |b: usize, dst: &mut [f32], parallelism: Parallelism| {
        let lo = batch_offset(ll, b);
        let ro = batch_offset(rl, b);
        // SAFETY: both layouts were checked to stay inside their buffers
        // (max_extent), `dst` holds exactly m * n packed elements, and with
        // read_dst = false gemm only writes dst.
        unsafe {
            gemm(
                m,
                n,
                k,
                dst.as_mut_ptr(),
                1,
                n as isize,
                false,
                lhs.as_ptr().add(lo),
                l_cs,
                l_rs,
                rhs.as_ptr().add(ro),
                r_cs,
                r_rs,
                0.0,
                1.0,
                false,
                false,
                false,
                parallelism,
            )
        }
    };
    let small = m * n * k < SMALL_GEMM_MACS;
    if batch > 1 && (small || batch >= rayon::current_num_threads()) {
        out.par_chunks_mut(m * n)
            .enumerate()
            .for_each(|(b, dst)| run(b, dst, Parallelism::None));
    } else {
        for (b, dst) in out.chunks_mut(m * n).enumerate() {
            run(b, dst, Parallelism::Rayon(0));
        }
    }
    out
}

/// Buffer offset of matrix `b` of a batched layout.
fn batch_offset(l: &Layout, mut b: usize) -> usize {
    let rank = l.dims().len();
    let mut pos = l.offset();
    for d in (0..rank - 2).rev() {
        pos += (b % l.dims()[d]) * l.strides()[d];
        b /= l.dims()[d];
    }
    pos
}
