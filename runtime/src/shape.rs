//! Shapes and strided layouts: how a tensor's elements sit in its storage.

use crate::{Error, Result};

/// The dimensions of a tensor, outermost first. A rank-0 shape is a scalar.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(Vec<usize>);

impl Shape {
    /// A shape with these dims, outermost first; an empty vec is a scalar.
    pub fn new(dims: Vec<usize>) -> Shape {
        Shape(dims)
    }

    /// The dims, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of dims (0 for a scalar).
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Product of the dims: 1 for a scalar, 0 if any dim is 0.
    pub fn elem_count(&self) -> usize {
        self.0.iter().product()
    }

    /// Row-major strides, in elements.
    pub fn contiguous_strides(&self) -> Vec<usize> {
        let mut strides = vec![1; self.rank()];
        for i in (0..self.rank().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * self.0[i + 1];
        }
        strides
    }

    /// Resolves a possibly negative axis (-1 is the last) to an index.
    pub fn axis(&self, axis: isize) -> Result<usize> {
        let rank = self.rank() as isize;
        let resolved = if axis < 0 { axis + rank } else { axis };
        if (0..rank).contains(&resolved) {
            Ok(resolved as usize)
        } else {
            Err(Error::AxisOutOfRange {
                axis,
                rank: self.rank(),
            })
        }
    }

    /// Resolves a list of axes, sorted and without duplicates.
    pub fn axes(&self, axes: &[isize]) -> Result<Vec<usize>> {
        let mut out = axes
            .iter()
            .map(|&a| self.axis(a))
            .collect::<Result<Vec<_>>>()?;
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// The NumPy broadcast of two shapes: dims are aligned from the right and
    /// each pair must be equal or contain a 1.
    pub fn broadcast_with(&self, other: &Shape, op: &str) -> Result<Shape> {
        let rank = self.rank().max(other.rank());
        let mut dims = vec![0; rank];
        for (i, d) in dims.iter_mut().enumerate() {
            let a = self.dim_from_right(rank - 1 - i);
            let b = other.dim_from_right(rank - 1 - i);
            *d = match (a, b) {
                (a, b) if a == b => a,
                (1, b) => b,
                (a, 1) => a,
                _ => {
                    return Err(Error::Shape(format!(
                        "{op}: shapes {self:?} and {other:?} do not broadcast"
                    )))
                }
            };
        }
        Ok(Shape(dims))
    }

    /// The dim `i` places from the right, 1 past the rank.
    fn dim_from_right(&self, i: usize) -> usize {
        if i < self.rank() {
            self.0[self.rank() - 1 - i]
        } else {
            1
        }
    }

    /// The same shape with the given (resolved) axes set to 1.
    pub(crate) fn keepdim(&self, axes: &[usize]) -> Shape {
        let mut dims = self.0.clone();
        for &a in axes {
            dims[a] = 1;
        }
        Shape(dims)
    }
}

impl std::fmt::Debug for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Shape {
        Shape(dims)
    }
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Shape {
        Shape(dims.to_vec())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Shape {
        Shape(dims.to_vec())
    }
}

impl From<&Shape> for Shape {
    fn from(shape: &Shape) -> Shape {
        shape.clone()
    }
}

impl From<usize> for Shape {
    fn from(d: usize) -> Shape {
        Shape(vec![d])
    }
}

impl From<()> for Shape {
    fn from(_: ()) -> Shape {
        Shape(vec![])
    }
}

/// Where a tensor's elements sit in a flat buffer: element `idx` is at
/// `offset + sum(idx[i] * strides[i])`.
///
/// Views (reshape of contiguous data, permute, narrow, broadcast) only change
/// the layout, so they share the buffer; a broadcast dim has stride 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    shape: Shape,
    strides: Vec<usize>,
    offset: usize,
}

impl Layout {
    /// The row-major packed layout of `shape`, starting at buffer element 0.
    pub fn contiguous(shape: Shape) -> Layout {
        Layout::contiguous_at(shape, 0)
    }

    /// The row-major packed layout of `shape`, starting at buffer element `offset`.
    pub fn contiguous_at(shape: Shape, offset: usize) -> Layout {
        let strides = shape.contiguous_strides();
        Layout {
            shape,
            strides,
            offset,
        }
    }

    /// The view's shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The view's dims, outermost first.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// Per-dim strides in elements (0 for a broadcast dim).
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Buffer index, in elements, of the view's first element.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Whether the elements are row-major and packed (an offset is allowed).
    /// Dims of size 1 may have any stride.
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&d, &s) in self.dims().iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// The buffer range of a contiguous layout.
    pub fn contiguous_range(&self) -> Option<std::ops::Range<usize>> {
        self.is_contiguous()
            .then(|| self.offset..self.offset + self.shape.elem_count())
    }

    /// One past the largest buffer index the layout reaches (0 when empty);
    /// kernels check it against the buffer before unchecked access.
    pub fn max_extent(&self) -> usize {
        if self.shape.elem_count() == 0 {
            return 0;
        }
        let last: usize = self
            .dims()
            .iter()
            .zip(&self.strides)
            .map(|(&d, &s)| (d - 1) * s)
            .sum();
        self.offset + last + 1
    }

    /// Reorders the dims: output dim `i` is input dim `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Layout> {
        let rank = self.shape.rank();
        let mut seen = vec![false; rank];
        if perm.len() != rank
            || perm
                .iter()
                .any(|&p| p >= rank || std::mem::replace(&mut seen[p], true))
        {
            return Err(Error::Shape(format!(
                "permute: {perm:?} is not a permutation of the {rank} dims of {:?}",
                self.shape
            )));
        }
        Ok(Layout {
            shape: Shape(perm.iter().map(|&p| self.dims()[p]).collect()),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        })
    }

    /// Keeps `len` entries of `axis` starting at `start`.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Layout> {
        let dim = self.dims()[axis];
        if start.checked_add(len).is_none_or(|end| end > dim) {
            return Err(Error::Shape(format!(
                "narrow: range {start}..{} is outside axis {axis} of size {dim} (shape {:?})",
                start.saturating_add(len),
                self.shape
            )));
        }
        let mut dims = self.dims().to_vec();
        dims[axis] = len;
        Ok(Layout {
            shape: Shape(dims),
            strides: self.strides.clone(),
            offset: self.offset + start * self.strides[axis],
        })
    }

    /// A view with the target shape, using stride 0 for broadcast dims.
    pub fn broadcast_as(&self, target: &Shape) -> Result<Layout> {
        let err = || {
            Error::Shape(format!(
                "cannot broadcast shape {:?} to {target:?}",
                self.shape
            ))
        };
        let extra = target
            .rank()
            .checked_sub(self.shape.rank())
            .ok_or_else(err)?;
        let mut strides = vec![0; target.rank()];
        for (i, (&d, &s)) in self.dims().iter().zip(&self.strides).enumerate() {
            let t = target.dims()[extra + i];
            if d == t {
                strides[extra + i] = s;
            } else if d != 1 {
                return Err(err());
            }
        }
        Ok(Layout {
            shape: target.clone(),
            strides,
            offset: self.offset,
        })
    }
}

/// The dims and per-layout strides with size-1 dims dropped and neighbours
/// merged where every layout is contiguous across them; at least rank 1.
pub(crate) fn coalesce<const K: usize>(
    dims: &[usize],
    strides: [&[usize]; K],
) -> (Vec<usize>, [Vec<usize>; K]) {
    let mut out_dims: Vec<usize> = Vec::with_capacity(dims.len());
    let mut out_strides: [Vec<usize>; K] = std::array::from_fn(|_| Vec::with_capacity(dims.len()));
    for (i, &d) in dims.iter().enumerate() {
        if d == 1 {
            continue;
        }
        let mergeable = out_dims.last().is_some()
            && (0..K).all(|k| *out_strides[k].last().unwrap_or(&0) == strides[k][i] * d);
        if mergeable {
            *out_dims.last_mut().expect("checked above") *= d;
            for k in 0..K {
                *out_strides[k].last_mut().expect("same length as dims") = strides[k][i];
            }
        } else {
            out_dims.push(d);
            for k in 0..K {
                out_strides[k].push(strides[k][i]);
            }
        }
    }
    if out_dims.is_empty() {
        out_dims.push(1);
        for s in &mut out_strides {
            s.push(1);
        }
    }
    (out_dims, out_strides)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_keeps_strides_and_moves_the_offset() {
        let l = Layout::contiguous(Shape::from([3, 4]))
            .narrow(1, 1, 2)
            .unwrap();
        assert_eq!(
            (l.strides(), l.offset(), l.max_extent()),
            (&[4, 1][..], 1, 11)
        );
        assert!(!l.is_contiguous());
        let rows = Layout::contiguous(Shape::from([3, 4]))
            .narrow(0, 1, 2)
            .unwrap();
        assert_eq!(rows.contiguous_range(), Some(4..12));
    }

    #[test]
    fn broadcast_uses_zero_strides() {
        let l = Layout::contiguous(Shape::from([3, 1]))
            .broadcast_as(&Shape::from([2, 3, 4]))
            .unwrap();
        assert_eq!(l.strides(), &[0, 1, 0]);
        assert!(Layout::contiguous(Shape::from([3]))
            .broadcast_as(&Shape::from([4]))
            .is_err());
    }
}
