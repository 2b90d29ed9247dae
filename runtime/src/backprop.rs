//! The backward formula of every built-in op, written with tensor ops only,
//! so any backend that runs the forward ops gets gradients for free.
//! `g` is the gradient of the op's output; `d<name>` that of an input.

use crate::op::{BinaryOp, Op, UnaryOp};
use crate::{Result, Tensor};

/// Gradients of an op's inputs (in input order) from those of its outputs.
pub(crate) fn backward(op: &Op, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
    if let Op::Custom(c) = op {
        return c.backward(grads);
    }
    let g = grads
        .first()
        .and_then(Option::as_ref)
        .expect("the tape visits a built-in op only after its output got a gradient");
    let single = |d: Tensor| Ok(vec![Some(d)]);
    match op {
        Op::Param(_) | Op::Custom(_) => {
            unreachable!("leaves and custom ops are handled by the caller")
        }
        Op::Copy => single(g.clone()),
        Op::ToDType { from } => single(g.to_dtype(*from)?),
        Op::Unary { op, saved } => single(unary(*op, saved, g)?),
        Op::Affine { mul } => single(g.mul_scalar(*mul)?),
        Op::Add => Ok(vec![Some(g.clone()), Some(g.clone())]),
        Op::Sub => Ok(vec![Some(g.clone()), Some(g.neg()?)]),
        // d(a b) = g b, g a
        Op::Mul { lhs, rhs } => Ok(vec![Some(g.mul(rhs)?), Some(g.mul(lhs)?)]),
        // d(a / b) = g / b, -g a / b^2
        Op::Div { lhs, rhs } => {
            let dlhs = g.div(rhs)?;
            let drhs = dlhs.mul(lhs)?.div(rhs)?.neg()?;
            Ok(vec![Some(dlhs), Some(drhs)])
        }
        Op::Sum { from } => single(g.broadcast_as(from)?),
        // The gradient goes to the maxima, split equally between ties.
        Op::Max { x, max, axes } => {
            let mask = x.eq_mask(max)?;
            let axes: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
            let count = mask.sum(&axes, true)?;
            single(g.div(&count)?.mul(&mask)?)
        }
        // C = A B: dA = g B^T, dB = A^T g.
        Op::Matmul { lhs, rhs } => {
            let dlhs = g.matmul(&rhs.t()?)?;
            // When B is a transposed view (W^T in a linear), compute (g^T A)^T
            // instead: the same values, laid out so that dW comes out packed.
            let drhs = if is_transposed_matrix(rhs) {
                g.t()?.matmul(lhs)?.t()?
            } else {
                lhs.t()?.matmul(g)?
            };
            Ok(vec![Some(dlhs), Some(drhs)])
        }
        Op::Reshape { from } => single(g.reshape(from)?),
        Op::Permute { perm } => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            single(g.permute(&inverse)?)
        }
        // Zeros around the narrowed range.
        Op::Narrow { from, axis, start } => {
            let zeros = |len: usize| {
                let mut dims = from.dims().to_vec();
                dims[*axis] = len;
                (len > 0)
                    .then(|| Tensor::zeros(dims, g.dtype(), &g.device()))
                    .transpose()
            };
            let before = zeros(*start)?;
            let after = zeros(from.dims()[*axis] - start - g.dims()[*axis])?;
            let pieces: Vec<&Tensor> = before.iter().chain([g]).chain(after.iter()).collect();
            single(Tensor::cat(&pieces, *axis as isize)?)
        }
        Op::Concat { axis, sizes } => Ok(g
            .split(*axis as isize, sizes)?
            .into_iter()
            .map(Some)
            .collect()),
        Op::Broadcast { from } => single(g.sum_to(from)?),
        // dx = y (g - sum(g y))
        Op::SoftmaxLastDim { y } => {
            let gy = g.mul(y)?;
            single(gy.sub(&y.mul(&gy.sum(&[-1], true)?)?)?)
        }
        // dx = rstd (g - mean(g) - y mean(g y))
        Op::LayerNorm { y, rstd } => {
            let centered = g.sub(&g.mean(&[-1], true)?)?;
            single(
                centered
                    .sub(&y.mul(&g.mul(y)?.mean(&[-1], true)?)?)?
                    .mul(rstd)?,
            )
        }
        // dx = rstd (g - y mean(g y))
        Op::RmsNorm { y, rstd } => {
            single(g.sub(&y.mul(&g.mul(y)?.mean(&[-1], true)?)?)?.mul(rstd)?)
        }
        // A rotation's gradient is the inverse rotation: sin -> -sin.
        Op::RopeInterleaved { cos, sin } => single(g.rope_interleaved(cos, &sin.neg()?)?),
    }
}

/// d f(x) for element-wise f; `saved` is x or y = f(x) as
/// [`UnaryOp::backward_uses_output`] says.
fn unary(op: UnaryOp, saved: &Tensor, g: &Tensor) -> Result<Tensor> {
    match op {
        // d exp = y
        UnaryOp::Exp => g.mul(saved),
        // d ln = 1 / x
        UnaryOp::Log => g.div(saved),
        // d sqrt = 0.5 / y
        UnaryOp::Sqrt => g.div(saved)?.mul_scalar(0.5),
        // d x^-1/2 = -0.5 x^-3/2 = -0.5 y^3
        UnaryOp::Rsqrt => g.mul(&saved.sqr()?.mul(saved)?)?.mul_scalar(-0.5),
        // d x^2 = 2 x
        UnaryOp::Sqr => g.mul(saved)?.mul_scalar(2.0),
        // d tanh = 1 - y^2
        UnaryOp::Tanh => g.mul(&saved.sqr()?.affine(-1.0, 1.0)?),
        UnaryOp::Silu => g.activation_backward(saved, BinaryOp::SiluBackward),
        UnaryOp::GeluTanh => g.activation_backward(saved, BinaryOp::GeluTanhBackward),
    }
}

/// Whether the last two dims are a column-major matrix (a `.t()` of packed data).
fn is_transposed_matrix(t: &Tensor) -> bool {
    let (d, s, r) = (t.dims(), t.layout().strides(), t.rank());
    r >= 2 && d[r - 2] > 1 && d[r - 1] > 1 && s[r - 2] == 1 && s[r - 1] == d[r - 2]
}
