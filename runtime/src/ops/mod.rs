//! Tensor operations, each recording itself on the autograd tape.
//!
//! `view` changes layouts (mostly without copying), `math` holds element-wise
//! ops, reductions and matmul, `nn` the fused and composed network ops
//! (softmax, norms, RoPE, linear, MSE), `attention` the fused attention,
//! and `custom` lets code
//! outside this module define ops with their own forward and backward.
//! Backward formulas are all in `crate::backprop`.

mod attention;
pub mod custom;
mod fused;
mod math;
mod nn;
mod view;

pub use attention::scaled_dot_product_attention;
pub use custom::{apply_custom, CustomOp};
pub use fused::{gated_residual, modulated_layer_norm, rms_norm_rope, split_fused, split_heads};
pub use nn::{attention_unfused, linear, mse_loss};
