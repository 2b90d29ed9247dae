//! mxswitch: compile-time-checked low-precision training.
//!
//! This facade re-exports the runtime (formats, quantizers, tensors), the
//! `#[precision]` macros and the models, and hosts the `mxswitch` command line.

pub use mxswitch_models as models;
pub use mxswitch_runtime as runtime;

#[doc(inline)]
pub use mxswitch_macros::precision;

pub mod files;
pub mod st_file;
pub mod train;
