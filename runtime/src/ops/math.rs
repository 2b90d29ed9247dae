//! Element-wise ops (with broadcasting), scalar ops, reductions and matmul.

use crate::op::{BinaryOp, Op, ReduceOp, UnaryOp};
use crate::storage::Storage;
use crate::{Error, Layout, Result, Shape, Tensor};

/// One-line element-wise methods, each `self.unary(UnaryOp::$op)`, with
/// their doc strings.
macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident,)*) => {
        $(
            $(#[$doc])*
            pub fn $name(&self) -> Result<Tensor> {
                self.unary(UnaryOp::$op)
            }
        )*
    };
}

impl Tensor {
    pub(crate) fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        let storage = self.storage().unary(self.layout(), op)?;
        Ok(Tensor::from_op(
            storage,
            self.shape().clone(),
            &[self],
            |y| Op::Unary {
                op,
                saved: if op.backward_uses_output() {
                    y.clone()
                } else {
                    self.detach()
                },
            },
        ))
    }

    unary_methods! {
        /// e^x.
        exp => Exp,
        /// Natural logarithm.
        log => Log,
        /// Square root.
        sqrt => Sqrt,
        /// 1 / sqrt(x).
        rsqrt => Rsqrt,
        /// x^2.
        sqr => Sqr,
        /// Hyperbolic tangent.
        tanh => Tanh,
        /// x * sigmoid(x).
        silu => Silu,
        /// GELU with the tanh approximation (Flux's MLP activation).
        gelu_tanh => GeluTanh,
    }

    /// x * mul + add.
    pub fn affine(&self, mul: f32, add: f32) -> Result<Tensor> {
        let storage = self.storage().affine(self.layout(), mul, add)?;
        Ok(Tensor::from_op(
            storage,
            self.shape().clone(),
            &[self],
            |_| Op::Affine { mul },
        ))
    }

    /// -x (as `affine(-1, 0)`).
    pub fn neg(&self) -> Result<Tensor> {
        self.affine(-1.0, 0.0)
    }

    /// x + c (as `affine(1, c)`).
    pub fn add_scalar(&self, c: f32) -> Result<Tensor> {
        self.affine(1.0, c)
    }

    /// x - c (as `affine(1, -c)`).
    pub fn sub_scalar(&self, c: f32) -> Result<Tensor> {
        self.affine(1.0, -c)
    }

    /// x * c (as `affine(c, 0)`).
    pub fn mul_scalar(&self, c: f32) -> Result<Tensor> {
        self.affine(c, 0.0)
    }

    /// x * (1 / c), so it rounds like a multiply, not a divide.
    pub fn div_scalar(&self, c: f32) -> Result<Tensor> {
        self.affine(1.0 / c, 0.0)
    }

    /// Both operands as views of their broadcast shape, and the kernel's result.
    fn broadcast_binary(&self, rhs: &Tensor, op: BinaryOp) -> Result<(Tensor, Tensor, Storage)> {
        let shape = self.shape().broadcast_with(rhs.shape(), op.name())?;
        let (lhs, rhs) = (self.broadcast_as(&shape)?, rhs.broadcast_as(&shape)?);
        let storage = lhs
            .storage()
            .binary(lhs.layout(), rhs.storage(), rhs.layout(), op)?;
        Ok((lhs, rhs, storage))
    }

    fn binary(&self, rhs: &Tensor, op: BinaryOp) -> Result<Tensor> {
        let (lhs, rhs, storage) = self.broadcast_binary(rhs, op)?;
        let shape = lhs.shape().clone();
        Ok(Tensor::from_op(
            storage,
            shape,
            &[&lhs, &rhs],
            |_| match op {
                BinaryOp::Add => Op::Add,
                BinaryOp::Sub => Op::Sub,
                BinaryOp::Mul => Op::Mul {
                    lhs: lhs.detach(),
                    rhs: rhs.detach(),
                },
                BinaryOp::Div => Op::Div {
                    lhs: lhs.detach(),
                    rhs: rhs.detach(),
                },
                BinaryOp::Eq | BinaryOp::SiluBackward | BinaryOp::GeluTanhBackward => {
                    unreachable!("masks and activation backwards do not record")
                }
            },
        ))
    }

    /// Element-wise sum with NumPy broadcasting.
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Add)
    }

    /// Element-wise difference with NumPy broadcasting.
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Sub)
    }

    /// Element-wise product with NumPy broadcasting.
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Mul)
    }

    /// Element-wise quotient with NumPy broadcasting (IEEE: x / 0 is inf or NaN).
    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Div)
    }

    /// 1.0 where the broadcast operands are equal, else 0.0; not differentiable.
    pub fn eq_mask(&self, rhs: &Tensor) -> Result<Tensor> {
        let (lhs, _, storage) = self.broadcast_binary(rhs, BinaryOp::Eq)?;
        Ok(Tensor::untracked(storage, lhs.shape().clone()))
    }

    /// The gradient of an activation's input, `self` (its output's
    /// gradient) times the activation's slope at `x`, in one pass
    /// (`BinaryOp::SiluBackward` or `GeluTanhBackward`); not differentiable.
    pub(crate) fn activation_backward(&self, x: &Tensor, op: BinaryOp) -> Result<Tensor> {
        let (g, _, storage) = self.broadcast_binary(x, op)?;
        Ok(Tensor::untracked(storage, g.shape().clone()))
    }

    /// Reduces the resolved `axes` (sorted, non-empty), keeping them as size 1.
    fn reduce_keepdim(&self, axes: &[usize], op: ReduceOp) -> Result<Tensor> {
        let mut layout = self.layout().clone();
        let mut storage = self.storage().reduce(&layout, op, axes[0])?;
        layout = Layout::contiguous(layout.shape().keepdim(&axes[..1]));
        for &a in &axes[1..] {
            storage = storage.reduce(&layout, op, a)?;
            layout = Layout::contiguous(layout.shape().keepdim(&[a]));
        }
        Ok(Tensor::from_op(
            storage,
            layout.shape().clone(),
            &[self],
            |y| match op {
                ReduceOp::Sum => Op::Sum {
                    from: self.shape().clone(),
                },
                ReduceOp::Max => Op::Max {
                    x: self.detach(),
                    max: y.clone(),
                    axes: axes.to_vec(),
                },
            },
        ))
    }

    fn reduce(&self, axes: &[isize], keepdim: bool, op: ReduceOp) -> Result<Tensor> {
        if axes.is_empty() {
            return Err(Error::Shape(format!(
                "{}: no axes given; use {}_all to reduce everything",
                op.name(),
                op.name()
            )));
        }
        let axes = self.shape().axes(axes)?;
        let kept = self.reduce_keepdim(&axes, op)?;
        if keepdim {
            return Ok(kept);
        }
        let dims: Vec<usize> = self
            .dims()
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect();
        kept.reshape(dims)
    }

    /// Sum over `axes` (negative counts from the end).
    pub fn sum(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(axes, keepdim, ReduceOp::Sum)
    }

    /// Maximum over `axes`; tied maxima share the gradient equally.
    pub fn max(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(axes, keepdim, ReduceOp::Max)
    }

    /// Mean over `axes` (negative counts from the end): the sum times 1 / count.
    /// Errors when `axes` is empty or an axis is out of range.
    pub fn mean(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let resolved = self.shape().axes(axes)?;
        let n: usize = resolved.iter().map(|&a| self.dims()[a]).product();
        self.sum(axes, keepdim)?.mul_scalar(1.0 / n as f32)
    }

    /// Sum of every element, as a rank-0 tensor. Reduces one flat row, which
    /// the kernel splits across threads and sums in several lanes.
    pub fn sum_all(&self) -> Result<Tensor> {
        self.reshape([self.elem_count()])?.sum(&[0], false)
    }

    /// Mean of every element, as a rank-0 tensor.
    pub fn mean_all(&self) -> Result<Tensor> {
        self.sum_all()?.mul_scalar(1.0 / self.elem_count() as f32)
    }

    /// Maximum of every element, as a rank-0 tensor; NaN if any element is NaN.
    pub fn max_all(&self) -> Result<Tensor> {
        self.reshape([self.elem_count()])?.max(&[0], false)
    }

    /// Batched matrix product `[.., M, K] x [.., K, N] -> [.., M, N]`; batch
    /// dims broadcast. Transposed views (`w.t()`) are multiplied without a copy.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        let (ra, rb) = (self.rank(), rhs.rank());
        if ra < 2 || rb < 2 || self.dims()[ra - 1] != rhs.dims()[rb - 2] {
            return Err(Error::Shape(format!(
                "matmul: cannot multiply {:?} by {:?}; expected [.., M, K] and [.., K, N]",
                self.shape(),
                rhs.shape()
            )));
        }
        let batch_a = Shape::from(&self.dims()[..ra - 2]);
        let batch =
            batch_a.broadcast_with(&Shape::from(&rhs.dims()[..rb - 2]), "matmul batch dims")?;
        let with = |tail: &[usize]| Shape::new(batch.dims().iter().chain(tail).copied().collect());
        let (m, k, n) = (self.dims()[ra - 2], self.dims()[ra - 1], rhs.dims()[rb - 1]);
        let lhs = self.broadcast_as(with(&[m, k]))?;
        let rhs = rhs.broadcast_as(with(&[k, n]))?;
        let storage = lhs
            .storage()
            .matmul(lhs.layout(), rhs.storage(), rhs.layout())?;
        Ok(Tensor::from_op(
            storage,
            with(&[m, n]),
            &[&lhs, &rhs],
            |_| Op::Matmul {
                lhs: lhs.detach(),
                rhs: rhs.detach(),
            },
        ))
    }
}
