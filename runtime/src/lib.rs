//! mxswitch runtime: the numbers (element formats and quantizers, bit-exact to
//! SPEC.md), tensors with a tape-based autograd, CPU ops, the quantized-linear
//! recipes and the optimizer.

#![deny(missing_docs)]

pub mod error;
pub mod formats;
pub mod linear;
pub mod lr_schedule;
pub mod module;
pub mod plan;
pub mod profile;
pub mod qlinear;
pub mod quant;
pub mod recipe;
pub mod ron_span;
pub mod schedule;
pub mod schedule_config;
mod simd;
pub mod warmup;

pub mod autograd;
pub mod backend;
mod backprop;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
/// Without the `cuda` feature: the same names, and no GPU can be opened.
#[cfg(not(feature = "cuda"))]
#[path = "no_cuda.rs"]
pub mod cuda;
pub mod device;
pub mod dist;
pub mod dtype;
pub mod op;
pub mod ops;
pub mod optim;
#[cfg(feature = "rocm")]
pub mod rocm;
pub mod shape;
pub mod storage;
pub mod tensor;

pub use autograd::{is_grad_enabled, no_grad, Gradients, Param, ParamId, SavedBytes};
pub use device::Device;
pub use dtype::DType;
pub use error::{Error, Result};
pub use shape::{Layout, Shape};
pub use tensor::Tensor;

/// Items the `#[precision]` macro's generated code names. Not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use crate::module::{join, ParamSlot, Parameters};
    pub use crate::plan::{
        apply_attribute_schedule, apply_schedule, check_schedule, seed_linears, LinearSite,
        NotPlanned, Plan, PlanCx, PlanLayer, PlanLinear, Planned, PrecisionModel, Probe,
        RecipeReport,
    };
    pub use crate::quant::ScaleMode;
    pub use crate::recipe::{Recipe, RecipeKind};
    pub use crate::schedule::{Order, Phase, Schedule, SwitchReport};
    pub use crate::schedule_config::schedule_from_ron;
    pub use crate::Error;
}
