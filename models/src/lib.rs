//! Models written against the mxswitch runtime.
