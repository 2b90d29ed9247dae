//! mxswitch runtime: the numbers (element formats and quantizers, bit-exact to
//! SPEC.md), tensors with a tape-based autograd, CPU ops, the quantized-linear
//! recipes and the optimizer.

pub mod error;
pub mod formats;
pub mod quant;
mod simd;

pub use error::{Error, Result};
