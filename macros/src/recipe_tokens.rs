//! Recipe-table values as tokens of the runtime's types, for the schedule
//! the generated code holds as a `static`: every value is a constant
//! expression, resolved and checked at compile time.

use std::fmt::Debug;

use mxswitch_recipes::{Order, Recipe, RecipeKind};
use proc_macro2::{Ident, Span, TokenStream};
use quote::quote;

use crate::valid::Schedule;

/// The variant of a field-less enum by its `Debug` name, which for such an
/// enum is the variant's identifier.
fn variant(value: impl Debug) -> Ident {
    Ident::new(&format!("{value:?}"), Span::call_site())
}

fn kind(k: RecipeKind, p: &TokenStream) -> TokenStream {
    let k = variant(k);
    quote!(#p::RecipeKind::#k)
}

fn gemm_override(k: Option<RecipeKind>, p: &TokenStream) -> TokenStream {
    match k {
        Some(k) => {
            let k = kind(k, p);
            quote!(::core::option::Option::Some(#k))
        }
        None => quote!(::core::option::Option::None),
    }
}

/// A `Recipe` struct literal. Destructured field by field, so a field added
/// to `Recipe` fails to compile here rather than being left out.
pub fn recipe(r: &Recipe, p: &TokenStream) -> TokenStream {
    let Recipe {
        kind: k,
        scale,
        sr,
        hadamard,
        tile2d,
        pow2,
        fprop,
        dgrad,
        wgrad,
    } = *r;
    let k = kind(k, p);
    let scale = variant(scale);
    let (fprop, dgrad, wgrad) = (
        gemm_override(fprop, p),
        gemm_override(dgrad, p),
        gemm_override(wgrad, p),
    );
    quote!(#p::Recipe {
        kind: #k,
        scale: #p::ScaleMode::#scale,
        sr: #sr,
        hadamard: #hadamard,
        tile2d: #tile2d,
        pow2: #pow2,
        fprop: #fprop,
        dgrad: #dgrad,
        wgrad: #wgrad,
    })
}

pub fn order(o: Order, p: &TokenStream) -> TokenStream {
    let o = variant(o);
    quote!(#p::Order::#o)
}

/// Every recipe the schedule's GEMMs use, per-GEMM overrides included, in
/// phase order without repeats, then those of `allow = [...]`: the model's
/// allow-list.
pub fn kinds(schedule: &Schedule, p: &TokenStream) -> Vec<TokenStream> {
    let mut kinds: Vec<RecipeKind> = Vec::new();
    let named = schedule.phases.iter().flat_map(|ph| ph.recipe.kinds());
    for k in named.chain(schedule.allow.iter().copied()) {
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    kinds.into_iter().map(|k| kind(k, p)).collect()
}
