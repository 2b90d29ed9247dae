//! Procedural macros of mxswitch. The `#[precision]` attribute lands here.
