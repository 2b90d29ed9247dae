//! Flux.1 (black-forest-labs/flux) for mxswitch: the model, its RON run
//! configurations and seeded synthetic data.

pub mod bfl;
pub mod config;
pub mod data;
pub mod memory;
pub mod model;

pub use config::{DataConfig, FluxConfig, RunConfig, TrainConfig, PRESETS};
pub use data::{patchify, rectified_flow, Batch, BatchBuilder, SyntheticData, TextTokens};
pub use memory::{estimate_training_bytes, format_bytes, MemoryEstimate};
pub use model::{DoubleBlock, Flux, FluxInput, SingleBlock};
