//! Models written against the mxswitch runtime.

#![deny(missing_docs)]
pub mod flux;
