//! mxswitch: compile-time-checked low-precision training. Every planned
//! linear of a model trains in MXFP4, then flips to FP8 (or any schedule of
//! recipes) at a preset iteration, with no checkpoint, no weight conversion
//! and no optimizer-state change.
//!
//! # A tour
//!
//! A model is a struct. `#[precision(...)]` on the root names its schedule;
//! `#[precision(layer)]` marks a block struct as one *plan layer*, the unit a
//! ramp converts. Inside, field marks say what each field is:
//!
//! | mark | field | meaning |
//! |---|---|---|
//! | `#[quantize]` | a [`QuantLinear`](runtime::linear::QuantLinear) | follows the schedule |
//! | `#[layers]` | `Vec<Block>` or `[Block; N]` | each element is the next plan layer |
//! | `#[layer]` | one `Block` | the next plan layer |
//! | `#[high_precision]` | a `QuantLinear` | kept in BF16 on purpose, outside the plan |
//! | `#[skip]` | anything without parameters | not walked for parameters |
//! | none | a [`Dense`](runtime::module::Dense), a norm, an embedder | high precision, walked for parameters |
//!
//! The macro checks the plan and the schedule at compile time (an empty plan,
//! an unknown recipe, a switch that changes nothing, a `QuantLinear` field
//! without a mark are all compile errors that say what to write), and
//! generates the plan walk and the parameter walk from the same fields, so a
//! checkpoint's tensor names are the plan's paths.
//!
//! ```
//! use mxswitch::prelude::*;
//!
//! #[precision(layer)]
//! struct Block {
//!     #[quantize]
//!     fc1: QuantLinear,
//!     #[quantize]
//!     fc2: QuantLinear,
//! }
//!
//! #[precision(mxfp4, switch_to = fp8, at = 100)]
//! struct Mlp {
//!     input: Dense,
//!     #[layers]
//!     blocks: Vec<Block>,
//! }
//!
//! # fn main() -> Result<()> {
//! let mut model = Mlp {
//!     input: Dense::new(8, 32, true),
//!     blocks: (0..2)
//!         .map(|_| Block {
//!             fc1: QuantLinear::new(32, 64, true),
//!             fc2: QuantLinear::new(64, 32, true),
//!         })
//!         .collect(),
//! };
//! assert_eq!(model.plan().len(), 2); // two plan layers, four linears
//! allocate(&mut model, 0)?; // weights, and every linear in the first phase
//! assert_eq!(model.recipes().layer(0).map(|r| r.to_string()), Some("mxfp4".into()));
//! let report = model.apply(100); // the switch: a field write per linear
//! assert_eq!(report.to_string(), "2/2 layers (4/4 linears) now fp8 at iteration 100");
//! # Ok(())
//! # }
//! ```
//!
//! Training it is a step closure that returns the loss; [`train::fit`]
//! runs the loop around it: the schedule at every iteration, warm-up,
//! clipping, AdamW, `metrics.jsonl`, the loss plot, checkpoints and resume.
//! `examples/custom_model.rs` is a whole model of one's own trained that
//! way, and `mxswitch train` trains Flux ([`models::flux`]) with the same loop.
//!
//! # Where things are
//!
//! - [`prelude`]: all a model file needs.
//! - [`precision`]: the attribute, every key and mark.
//! - [`runtime`]: element formats and quantizers (bit-exact to `docs/SPEC.md`),
//!   tensors and autograd, the quantized linear and its recipes, schedules,
//!   the plan, warm-up, AdamW, and the CPU and CUDA backends.
//! - [`models`]: Flux.1 and its run configs.
//! - [`train`]: the training loop and its files; [`files`] and [`st_file`]:
//!   atomic writes, checked reads and safetensors.

#![deny(missing_docs)]

#[doc(inline)]
pub use mxswitch_models as models;
#[doc(inline)]
pub use mxswitch_runtime as runtime;

#[doc = include_str!("../docs/precision.md")]
#[doc(inline)]
pub use mxswitch_macros::precision;

pub mod files;
pub mod st_file;
pub mod train;

/// Everything a model file needs: `use mxswitch::prelude::*;`.
pub mod prelude {
    pub use mxswitch_macros::{precision, Parameters};
    pub use mxswitch_runtime::linear::QuantLinear;
    pub use mxswitch_runtime::module::{
        allocate, named_params, optimizer_step, Dense, Parameters, Scale, SplitMix64,
    };
    pub use mxswitch_runtime::ops::mse_loss;
    pub use mxswitch_runtime::optim::{clip_grad_norm, AdamW, AdamWConfig};
    pub use mxswitch_runtime::plan::{Plan, PlanLayer, PrecisionModel, RecipeReport};
    pub use mxswitch_runtime::recipe::{Recipe, RecipeKind};
    pub use mxswitch_runtime::schedule::{Schedule, SwitchReport};
    pub use mxswitch_runtime::warmup::warmup;
    pub use mxswitch_runtime::{DType, Device, Error, Result, Tensor};

    pub use crate::train::{fit, FitOptions, FitSummary, Step};
}
