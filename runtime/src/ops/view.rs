//! Ops that change how elements are indexed: reshape, permute, narrow,
//! split, concat and broadcast. All but concat are views of the same buffer
//! when the layout allows it.

use crate::op::Op;
use crate::storage::Storage;
use crate::{Error, Layout, Result, Shape, Tensor};

impl Tensor {
    /// The same elements in another shape; a view when the tensor is
    /// contiguous, a copy otherwise.
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if shape.elem_count() != self.elem_count() {
            return Err(Error::Shape(format!(
                "reshape: cannot view {:?} ({} elements) as {shape:?} ({} elements)",
                self.shape(),
                self.elem_count(),
                shape.elem_count()
            )));
        }
        if &shape == self.shape() {
            return Ok(self.clone());
        }
        let x = self.contiguous()?;
        let from = self.shape().clone();
        Ok(
            x.view(Layout::contiguous_at(shape, x.layout().offset()), || {
                Op::Reshape { from }
            }),
        )
    }

    /// Inserts a dim of size 1 before `axis` (`axis` may equal the rank).
    pub fn unsqueeze(&self, axis: isize) -> Result<Tensor> {
        let rank = self.rank() as isize;
        let at = if axis < 0 { axis + rank + 1 } else { axis };
        if !(0..=rank).contains(&at) {
            return Err(Error::AxisOutOfRange {
                axis,
                rank: self.rank(),
            });
        }
        let mut dims = self.dims().to_vec();
        dims.insert(at as usize, 1);
        self.reshape(dims)
    }

    /// Removes `axis`, which must have size 1.
    pub fn squeeze(&self, axis: isize) -> Result<Tensor> {
        let a = self.shape().axis(axis)?;
        if self.dims()[a] != 1 {
            return Err(Error::Shape(format!(
                "squeeze: axis {axis} of {:?} has size {}, not 1",
                self.shape(),
                self.dims()[a]
            )));
        }
        let mut dims = self.dims().to_vec();
        dims.remove(a);
        self.reshape(dims)
    }

    /// Reorders the dims (a view): output dim `i` is input dim `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        let layout = self.layout().permute(perm)?;
        Ok(self.view(layout, || Op::Permute {
            perm: perm.to_vec(),
        }))
    }

    /// Swaps two dims (a view).
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let (a, b) = (self.shape().axis(a)?, self.shape().axis(b)?);
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// Swaps the last two dims (a view): `W.t()` is W^T of a linear.
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(Error::Shape(format!(
                "t: needs rank >= 2, got {:?}",
                self.shape()
            )));
        }
        self.transpose(-2, -1)
    }

    /// Entries `start..start + len` of `axis` (a view).
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Tensor> {
        let axis = self.shape().axis(axis)?;
        let layout = self.layout().narrow(axis, start, len)?;
        if layout.dims() == self.dims() {
            return Ok(self.clone());
        }
        let from = self.shape().clone();
        Ok(self.view(layout, || Op::Narrow { from, axis, start }))
    }

    /// Consecutive pieces of `axis` with the given sizes, which must add up
    /// to the axis length (views).
    pub fn split(&self, axis: isize, sizes: &[usize]) -> Result<Vec<Tensor>> {
        let a = self.shape().axis(axis)?;
        if sizes.iter().sum::<usize>() != self.dims()[a] {
            return Err(Error::Shape(format!(
                "split: sizes {sizes:?} do not add up to axis {axis} of {:?}",
                self.shape()
            )));
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&len| {
                let piece = self.narrow(a as isize, start, len);
                start += len;
                piece
            })
            .collect()
    }

    /// Joins tensors along `axis`; their other dims must agree.
    pub fn cat(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::Shape("cat: no tensors given".into()))?;
        let a = first.shape().axis(axis)?;
        for t in tensors {
            let same_rank = t.rank() == first.rank();
            if !same_rank
                || t.dims()
                    .iter()
                    .zip(first.dims())
                    .enumerate()
                    .any(|(i, (x, y))| i != a && x != y)
            {
                return Err(Error::Shape(format!(
                    "cat along axis {axis}: shape {:?} does not match {:?} off that axis",
                    t.shape(),
                    first.shape()
                )));
            }
        }
        if tensors.len() == 1 {
            return Ok((*first).clone());
        }
        let parts: Vec<(&Storage, &Layout)> =
            tensors.iter().map(|t| (t.storage(), t.layout())).collect();
        let storage = Storage::concat(&parts, a)?;
        let sizes: Vec<usize> = tensors.iter().map(|t| t.dims()[a]).collect();
        let mut dims = first.dims().to_vec();
        dims[a] = sizes.iter().sum();
        Ok(Tensor::from_op(storage, Shape::new(dims), tensors, |_| {
            Op::Concat { axis: a, sizes }
        }))
    }

    /// A stride-0 view with the target shape (NumPy broadcasting rules).
    pub fn broadcast_as(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if &shape == self.shape() {
            return Ok(self.clone());
        }
        let layout = self.layout().broadcast_as(&shape)?;
        let from = self.shape().clone();
        Ok(self.view(layout, || Op::Broadcast { from }))
    }

    /// Sums a broadcast result back to `shape` (the reverse of
    /// [`Tensor::broadcast_as`]).
    pub(crate) fn sum_to(&self, shape: &Shape) -> Result<Tensor> {
        let extra = self.rank() - shape.rank();
        let axes: Vec<isize> = (0..self.rank())
            .filter(|&i| i < extra || (shape.dims()[i - extra] == 1 && self.dims()[i] != 1))
            .map(|i| i as isize)
            .collect();
        let summed = if axes.is_empty() {
            self.clone()
        } else {
            self.sum(&axes, true)?
        };
        summed.reshape(shape)
    }
}
