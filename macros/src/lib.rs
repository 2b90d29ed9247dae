//! Procedural macros of mxswitch: the `#[precision]` attribute, which turns
//! a model struct into a checked precision plan and schedule.
//!
//! Parsing lives in `attr.rs` (into the plain structs of `ast.rs`), the
//! rules across keys and fields in `valid.rs`, RON schedule files in
//! `config.rs`, and code generation in `expand.rs`; `symbol.rs` spells every
//! key and name once.

#![deny(missing_docs)]

mod ast;
mod attr;
mod config;
mod expand;
mod recipe_tokens;
mod symbol;
mod valid;

use proc_macro::TokenStream;

/// Mark a model struct with its precision schedule, or a block struct as one
/// plan layer. The guide, with every key and mark and runnable examples, is
/// the documentation of `mxswitch::precision` (this crate is used through the
/// `mxswitch` facade, whose doctests run those examples).
#[proc_macro_attribute]
pub fn precision(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::precision(args.into(), item.into()).into()
}

/// The parameter walk (`Parameters`) of a struct outside the precision plan,
/// such as an embedder or a norm: every field under its name, except those
/// marked `#[skip]`. `#[precision]` structs get the same walk generated and
/// must not derive it. Used through `mxswitch::prelude`.
#[proc_macro_derive(Parameters, attributes(skip))]
pub fn derive_parameters(item: TokenStream) -> TokenStream {
    expand::derive_parameters(item.into()).into()
}
