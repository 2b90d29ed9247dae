//! Models written against the mxswitch runtime.
pub mod flux;
