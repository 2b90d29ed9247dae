//! Quantizers: MX block scaling (`mx`) and FP8 tensorwise scaling (`fp8`),
//! with the Hadamard rotation and the Philox generator they share.
//! `dispatch` is the one place that maps a user-facing format name to them.

pub mod dispatch;
pub mod fp8;
pub mod fp8_group;
pub mod hadamard;
pub mod mx;
pub mod nvfp4;
pub mod philox;
pub mod scale;

pub use dispatch::{QuantFormat, Quantized};
pub use fp8::{amax, amax_to_scale, quantize_tensorwise, Fp8Tensor};
pub use fp8_group::{
    quantize_fp8_group_rows, quantize_fp8_groups, Fp8GroupConfig, Fp8GroupTensor, Grouping,
    FP8_BLOCK,
};
pub use mx::{quantize_mx, quantize_rows, MxConfig, MxTensor, BLOCK};
pub use nvfp4::{quantize_nvfp4, quantize_nvfp4_rows, Nvfp4Config, Nvfp4Tensor, NVFP4_BLOCK};
pub use philox::SrKey;
pub use scale::{scale_byte, ScaleMode};
