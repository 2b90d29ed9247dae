//! Kernels that walk strided layouts: gathering a view into a packed buffer,
//! element-wise maps of two (possibly broadcast) views, and concatenation.
//!
//! A layout is walked as rows of its last (coalesced) dim: the row start is
//! found by unravelling the row index, and the inner loop runs with a fixed
//! stride, which the compiler vectorizes for strides 1 and 0.

use super::for_each_row;
use crate::shape::coalesce;
use crate::Layout;

/// Buffer offset of the first element of row `row` (a row is one run of the
/// last dim).
#[inline]
pub(super) fn row_start(dims: &[usize], strides: &[usize], offset: usize, mut row: usize) -> usize {
    let mut pos = offset;
    for d in (0..dims.len() - 1).rev() {
        pos += (row % dims[d]) * strides[d];
        row /= dims[d];
    }
    pos
}

/// The elements of `layout` packed row-major.
pub(super) fn gather<T: Copy + Default + Send + Sync>(src: &[T], layout: &Layout) -> Vec<T> {
    assert!(
        layout.max_extent() <= src.len(),
        "layout reaches past its buffer"
    );
    if let Some(range) = layout.contiguous_range() {
        return src[range].to_vec();
    }
    let (dims, [strides]) = coalesce(layout.dims(), [layout.strides()]);
    let inner = dims[dims.len() - 1];
    let step = strides[strides.len() - 1];
    let mut out = vec![T::default(); layout.shape().elem_count()];
    for_each_row(&mut out, inner, |row, dst| {
        let start = row_start(&dims, &strides, layout.offset(), row);
        if step == 1 {
            dst.copy_from_slice(&src[start..start + inner]);
        } else {
            for (j, d) in dst.iter_mut().enumerate() {
                *d = src[start + j * step];
            }
        }
    });
    out
}

/// `f` applied element by element to two views of the same shape.
pub(super) fn binary_map(
    lhs: &[f32],
    ll: &Layout,
    rhs: &[f32],
    rl: &Layout,
    f: impl Fn(f32, f32) -> f32 + Sync,
) -> Vec<f32> {
    assert!(
        ll.max_extent() <= lhs.len() && rl.max_extent() <= rhs.len(),
        "layout reaches past its buffer"
    );
    assert_eq!(ll.dims(), rl.dims(), "binary_map takes views of one shape");
    let (dims, [ls, rs]) = coalesce(ll.dims(), [ll.strides(), rl.strides()]);
    let inner = dims[dims.len() - 1];
    let (sl, sr) = (ls[ls.len() - 1], rs[rs.len() - 1]);
    let mut out = vec![0f32; ll.shape().elem_count()];
    for_each_row(&mut out, inner, |row, dst| {
        let a0 = row_start(&dims, &ls, ll.offset(), row);
        let b0 = row_start(&dims, &rs, rl.offset(), row);
        // Separate loops for the common stride patterns so each vectorizes.
        match (sl, sr) {
            (1, 1) => {
                let (a, b) = (&lhs[a0..a0 + inner], &rhs[b0..b0 + inner]);
                for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
                    *d = f(x, y);
                }
            }
            (1, 0) => {
                let y = rhs[b0];
                for (d, &x) in dst.iter_mut().zip(&lhs[a0..a0 + inner]) {
                    *d = f(x, y);
                }
            }
            (0, 1) => {
                let x = lhs[a0];
                for (d, &y) in dst.iter_mut().zip(&rhs[b0..b0 + inner]) {
                    *d = f(x, y);
                }
            }
            _ => {
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = f(lhs[a0 + j * sl], rhs[b0 + j * sr]);
                }
            }
        }
    });
    out
}

/// Concatenation of packed parts along `axis`: for each index of the dims
/// before `axis`, the parts' blocks follow one another.
pub(super) fn concat<T: Copy + Default + Send + Sync>(
    parts: &[(Vec<T>, &[usize])],
    axis: usize,
) -> Vec<T> {
    let outer: usize = parts[0].1[..axis].iter().product();
    let blocks: Vec<usize> = parts
        .iter()
        .map(|(_, dims)| dims[axis..].iter().product())
        .collect();
    let row: usize = blocks.iter().sum();
    let mut out = vec![T::default(); outer * row];
    for_each_row(&mut out, row, |o, dst| {
        let mut at = 0;
        for ((data, _), &block) in parts.iter().zip(&blocks) {
            dst[at..at + block].copy_from_slice(&data[o * block..(o + 1) * block]);
            at += block;
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Shape;

    #[test]
    fn coalesce_merges_contiguous_dims() {
        let (dims, [s]) = coalesce(&[2, 3, 4], [&[12, 4, 1]]);
        assert_eq!((dims, s), (vec![24], vec![1]));
        let (dims, [a, b]) = coalesce(&[2, 3, 4], [&[12, 4, 1], &[0, 0, 1]]);
        assert_eq!((dims, a, b), (vec![6, 4], vec![4, 1], vec![0, 1]));
    }

    #[test]
    fn gather_transposes() {
        let l = Layout::contiguous(Shape::from([2, 3]))
            .permute(&[1, 0])
            .unwrap();
        assert_eq!(gather(&[0, 1, 2, 3, 4, 5], &l), vec![0, 3, 1, 4, 2, 5]);
    }
}
