//! mxswitch runtime: the numbers (element formats and quantizers, bit-exact to
//! SPEC.md), tensors with a tape-based autograd, CPU ops, the quantized-linear
//! recipes and the optimizer.

pub mod error;
pub mod formats;
pub mod quant;
pub mod recipe;
mod simd;

pub mod autograd;
pub mod backend;
mod backprop;
pub mod cpu;
pub mod device;
pub mod dtype;
pub mod op;
pub mod ops;
pub mod optim;
pub mod shape;
pub mod storage;
pub mod tensor;

pub use autograd::{is_grad_enabled, no_grad, Gradients, Param, ParamId, SavedBytes};
pub use device::Device;
pub use dtype::DType;
pub use error::{Error, Result};
pub use shape::{Layout, Shape};
pub use tensor::Tensor;
