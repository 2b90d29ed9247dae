//! What an operation is: the kernel names every backend implements, and the
//! `Op` record of how a tensor was made, which is the autograd graph.

use crate::autograd::ParamId;
use crate::ops::custom::DynCustomOp;
use crate::{DType, Shape, Tensor};

/// `sqrt(2 / pi)`, the scale inside the tanh approximation of GELU.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic coefficient of the tanh approximation of GELU.
const GELU_CUBIC: f32 = 0.044_715;

/// Element-wise functions of one input.
///
/// Each has one name shared by every backend (a GPU kernel is `u<name>`) and
/// one scalar definition, [`UnaryOp::f32`], which is the CPU kernel and the
/// reference the other backends are checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    /// e^x.
    Exp,
    /// Natural logarithm; NaN below 0, -inf at 0.
    Log,
    /// Square root; NaN below 0.
    Sqrt,
    /// 1 / sqrt(x); +inf at 0.
    Rsqrt,
    /// x * x.
    Sqr,
    /// Hyperbolic tangent.
    Tanh,
    /// x * sigmoid(x).
    Silu,
    /// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
    GeluTanh,
}

impl UnaryOp {
    /// The kernel name shared by every backend (a GPU kernel is `u<name>`), also
    /// used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Sqr => "sqr",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Silu => "silu",
            UnaryOp::GeluTanh => "gelu_tanh",
        }
    }

    /// The scalar definition: the CPU kernel and the reference for other backends.
    #[inline]
    pub fn f32(self, x: f32) -> f32 {
        match self {
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => 1.0 / x.sqrt(),
            UnaryOp::Sqr => x * x,
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Silu => x / (1.0 + (-x).exp()),
            // 0.5 (1 + tanh(u)) = sigmoid(2u): the same function through one
            // exp, several times cheaper than libm's tanhf.
            UnaryOp::GeluTanh => x * gelu_gate(x),
        }
    }

    /// Whether the backward pass needs the op's output (else its input).
    pub(crate) fn backward_uses_output(self) -> bool {
        matches!(
            self,
            UnaryOp::Exp | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Tanh
        )
    }
}

/// Element-wise functions of two same-shape inputs (broadcasting is done by
/// the tensor layer with stride-0 views).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    /// a + b.
    Add,
    /// a - b.
    Sub,
    /// a * b.
    Mul,
    /// a / b (IEEE: division by zero gives inf or NaN, no error).
    Div,
    /// 1.0 where equal, else 0.0; a mask, never differentiated.
    Eq,
    /// a * silu'(b): the backward of silu, g at x, in one pass.
    SiluBackward,
    /// a * gelu_tanh'(b): the backward of gelu_tanh, g at x, in one pass
    /// (one rounding to the activation dtype, where a slope tensor and a
    /// product took two).
    GeluTanhBackward,
}

impl BinaryOp {
    /// The kernel name shared by every backend, also used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Eq => "eq",
            BinaryOp::SiluBackward => "silu_backward",
            BinaryOp::GeluTanhBackward => "gelu_tanh_backward",
        }
    }

    /// The scalar definition: the CPU kernel and the reference for other backends.
    #[inline]
    pub fn f32(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Eq => f32::from(u8::from(a == b)),
            BinaryOp::SiluBackward => a * silu_slope(b),
            BinaryOp::GeluTanhBackward => a * gelu_tanh_slope(b),
        }
    }
}

/// Reductions over one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum of the elements along the axis.
    Sum,
    /// Maximum; NaN wins, so a NaN is never hidden.
    Max,
}

impl ReduceOp {
    /// The kernel name shared by every backend, also used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
        }
    }
}

/// How a tracked tensor was made: the op and exactly what its backward pass
/// needs. Saved tensors are detached (they carry no graph node), so an op that
/// saves its own output does not form a cycle, and an op that needs no values
/// (add, reshape) keeps nothing alive.
pub(crate) enum Op {
    /// A leaf: a trainable parameter.
    Param(ParamId),
    /// `contiguous()`: a copy, identity gradient.
    Copy,
    ToDType {
        from: DType,
    },
    /// Saves the input, or the output where [`UnaryOp::backward_uses_output`].
    Unary {
        op: UnaryOp,
        saved: Tensor,
    },
    /// x * mul + add.
    Affine {
        mul: f32,
    },
    Add,
    Sub,
    Mul {
        lhs: Tensor,
        rhs: Tensor,
    },
    Div {
        lhs: Tensor,
        rhs: Tensor,
    },
    /// Sum with kept dims; the gradient broadcasts back to `from`.
    Sum {
        from: Shape,
    },
    /// Max over `axes` with kept dims; ties share the gradient equally.
    Max {
        x: Tensor,
        max: Tensor,
        axes: Vec<usize>,
    },
    Matmul {
        lhs: Tensor,
        rhs: Tensor,
    },
    Reshape {
        from: Shape,
    },
    Permute {
        perm: Vec<usize>,
    },
    Narrow {
        from: Shape,
        axis: usize,
        start: usize,
    },
    Concat {
        axis: usize,
        sizes: Vec<usize>,
    },
    Broadcast {
        from: Shape,
    },
    SoftmaxLastDim {
        y: Tensor,
    },
    /// Layer norm without affine weights: y = (x - mean) * rstd.
    LayerNorm {
        y: Tensor,
        rstd: Tensor,
    },
    /// RMS normalization without the scale: y = x * rstd.
    RmsNorm {
        y: Tensor,
        rstd: Tensor,
    },
    /// Interleaved-pair rotation; the tables are constants.
    RopeInterleaved {
        cos: Tensor,
        sin: Tensor,
    },
    Custom(Box<dyn DynCustomOp>),
}

impl Op {
    /// The name used in errors and as the saved-bytes label of built-in ops.
    pub(crate) fn name(&self) -> &str {
        match self {
            Op::Param(_) => "param",
            Op::Copy => "contiguous",
            Op::ToDType { .. } => "to_dtype",
            Op::Unary { op, .. } => op.name(),
            Op::Affine { .. } => "affine",
            Op::Add => "add",
            Op::Sub => "sub",
            Op::Mul { .. } => "mul",
            Op::Div { .. } => "div",
            Op::Sum { .. } => "sum",
            Op::Max { .. } => "max",
            Op::Matmul { .. } => "matmul",
            Op::Reshape { .. } => "reshape",
            Op::Permute { .. } => "permute",
            Op::Narrow { .. } => "narrow",
            Op::Concat { .. } => "concat",
            Op::Broadcast { .. } => "broadcast",
            Op::SoftmaxLastDim { .. } => "softmax",
            Op::LayerNorm { .. } => "layer_norm",
            Op::RmsNorm { .. } => "rms_norm",
            Op::RopeInterleaved { .. } => "rope_interleaved",
            Op::Custom(c) => c.name(),
        }
    }

    /// The tensors a built-in op keeps for its backward pass.
    fn saved_tensors(&self) -> Vec<&Tensor> {
        match self {
            Op::Unary { saved, .. } => vec![saved],
            Op::Mul { lhs, rhs } | Op::Div { lhs, rhs } | Op::Matmul { lhs, rhs } => vec![lhs, rhs],
            Op::Max { x, max, .. } => vec![x, max],
            Op::SoftmaxLastDim { y } => vec![y],
            Op::LayerNorm { y, rstd } | Op::RmsNorm { y, rstd } => vec![y, rstd],
            Op::RopeInterleaved { cos, sin } => vec![cos, sin],
            _ => vec![],
        }
    }

    /// The label and byte count this op keeps for backward. Built-in ops count
    /// the whole buffers their saved tensors hold alive (shared or not);
    /// custom ops report their own count.
    /// (label, bytes, elements): elements are those of the tensors the
    /// saved bytes stand for, reported by custom ops only (0 otherwise).
    pub(crate) fn saved_bytes(&self) -> (String, usize, usize) {
        match self {
            Op::Custom(c) => (c.label(), c.saved_bytes(), c.saved_elements()),
            _ => {
                let bytes = self.saved_tensors().iter().map(|t| t.buffer_bytes()).sum();
                (self.name().to_string(), bytes, 0)
            }
        }
    }
}

/// sigmoid(2u) with u = sqrt(2/pi) (x + 0.044715 x^3): GELU's gate,
/// equal to 0.5 (1 + tanh(u)).
#[inline]
fn gelu_gate(x: f32) -> f32 {
    let u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
    1.0 / (1.0 + (-2.0 * u).exp())
}

/// d silu / dx = s (1 + x (1 - s)), s = sigmoid(x).
#[inline]
fn silu_slope(x: f32) -> f32 {
    let s = 1.0 / (1.0 + (-x).exp());
    s * (1.0 + x * (1.0 - s))
}

/// d gelu_tanh / dx = s + 2 x s (1 - s) du/dx, s = GELU's gate.
#[inline]
fn gelu_tanh_slope(x: f32) -> f32 {
    let s = gelu_gate(x);
    let dinner = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x);
    s + x * 2.0 * s * (1.0 - s) * dinner
}
