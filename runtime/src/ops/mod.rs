//! Tensor operations, each recording itself on the autograd tape.
//!
//! `view` changes layouts (mostly without copying), `math` holds element-wise
//! ops, reductions and matmul, `nn` the fused and composed network ops
//! (softmax, norms, RoPE, linear, attention, MSE), and `custom` lets code
//! outside this module define ops with their own forward and backward.
//! Backward formulas are all in `crate::backprop`.

pub mod custom;
mod math;
mod nn;
mod view;

pub use custom::{apply_custom, CustomOp};
pub use nn::{linear, mse_loss, scaled_dot_product_attention};
