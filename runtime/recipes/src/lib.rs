//! The recipe table of mxswitch: recipe names, option keys, SPEC defaults,
//! the per-GEMM operand specs of every recipe (SPEC sections 4 and 4a) and
//! the schedule format with its rules (SPEC section 5).
//!
//! `mxswitch-macros` checks `#[precision(...)]` with this crate at compile
//! time and `mxswitch-runtime` checks RON configs and schedules with it at
//! run time, so the two checks are the same code. It holds data and rules
//! only: no quantizer, no backend.
//!
//! - [`TABLE`]: one [`Row`] per recipe, the operand specs of its three GEMMs.
//! - [`Recipe`]: a row plus options; [`Recipe::spec`] resolves it to a
//!   [`LinearSpec`], which is all a quantized linear reads.
//! - [`ScheduleConfig`] and [`check_phases`]: the schedule file and the rules
//!   every schedule obeys.

#![deny(missing_docs)]

mod error;
mod recipe;
mod schedule;
mod spec;
mod table;

pub use error::{suggest, At, RecipeError, ScheduleError};
pub use recipe::Recipe;
pub use schedule::{
    check_phases, ron_options, CheckedSchedule, Order, Phase, PhaseAt, PhaseConfig, PhaseError,
    RecipeOptions, ScheduleConfig,
};
pub use spec::{
    Elem, Gemm, GemmSpec, LinearSpec, Operand, OperandSpec, SavedSpec, ScaleMode, Scaling,
    FP8_BLOCK, MX_BLOCK, NVFP4_BLOCK,
};
pub use table::{Opt, RecipeKind, Row, Takes, TABLE};
