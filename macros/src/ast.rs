//! Plain structs for what the user wrote: the `#[precision(...)]` arguments
//! and the annotated struct with its field marks. Every piece keeps its
//! tokens so an error can point at them.

use std::fmt;

use proc_macro2::TokenTree;
use quote::quote;
use syn::{Expr, Generics, Ident, LitStr, Type};

use crate::attr;
use crate::valid::Ctxt;

/// `#[precision(...)]` as written; which keys may go together is `valid.rs`'s job.
#[derive(Default)]
pub struct PrecisionAttr {
    /// `layer`: the struct is one plan layer.
    pub layer: Option<Ident>,
    /// The recipe the model starts with, the first argument.
    pub recipe: Option<RecipeSpec>,
    pub switch_to: Option<Keyed<RecipeSpec>>,
    pub at: Option<Keyed<Expr>>,
    pub layers_per_iter: Option<Keyed<Expr>>,
    pub order: Option<Keyed<TokenTree>>,
    pub schedule: Option<Keyed<Vec<PhaseSpec>>>,
    pub config: Option<Keyed<LitStr>>,
    /// `allow = [nvfp4, fp8_block]`: recipes a run-time schedule may use
    /// besides those the schedule names.
    pub allow: Option<Keyed<Vec<RecipeSpec>>>,
}

/// A `key = value` argument; `key` is the span errors about the key point at.
pub struct Keyed<T> {
    pub key: Ident,
    pub value: T,
}

/// `mxfp4` or `mxfp4(scale = rceil, sr = true)`.
pub struct RecipeSpec {
    pub name: Ident,
    pub options: Vec<OptionSpec>,
}

impl fmt::Display for RecipeSpec {
    /// The recipe as written, `mxfp4(scale = even)`, for messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name)?;
        if self.options.is_empty() {
            return Ok(());
        }
        let opts: Vec<String> = self
            .options
            .iter()
            .map(|o| format!("{} = {}", o.key, o.value))
            .collect();
        write!(f, "({})", opts.join(", "))
    }
}

/// `scale = rceil` inside a recipe's parentheses.
pub struct OptionSpec {
    pub key: Ident,
    /// One token: an identifier (`rceil`, `true`) or whatever the user wrote
    /// instead, so the error can quote it.
    pub value: TokenTree,
}

/// `fp8 @ 12000` in `schedule = [...]`.
pub struct PhaseSpec {
    pub recipe: RecipeSpec,
    pub start: Expr,
}

/// The annotated struct.
pub struct Input<'a> {
    pub ident: &'a Ident,
    pub generics: &'a Generics,
    pub fields: Vec<Field<'a>>,
}

/// A named field, its type and its mark, if any.
pub struct Field<'a> {
    pub ident: &'a Ident,
    pub ty: &'a Type,
    pub mark: Option<Mark<'a>>,
}

pub enum Mark<'a> {
    /// `#[quantize]`: a quantized linear (its type implements `PlanLinear`).
    Quantize,
    /// `#[high_precision]`: a quantized linear kept in BF16 on purpose,
    /// outside the plan.
    HighPrecision,
    /// `#[layers]`: a `Vec<T>` or `[T; N]`, each element one plan layer.
    Layers { elem: &'a Type },
    /// `#[layer]`: one nested layer struct, one plan layer.
    Layer,
    /// `#[skip]`: holds no parameters (a count, a config).
    Skip,
    /// A mark whose error is already recorded; it generates nothing.
    Invalid,
}

impl Field<'_> {
    /// Whether the field puts linears in the plan.
    pub fn plans(&self) -> bool {
        matches!(
            self.mark,
            Some(Mark::Quantize | Mark::Layers { .. } | Mark::Layer)
        )
    }

    /// The layer struct type of a `#[layers]` or `#[layer]` field.
    pub fn layer_type(&self) -> Option<&Type> {
        match &self.mark {
            Some(Mark::Layers { elem }) => Some(elem),
            Some(Mark::Layer) => Some(self.ty),
            _ => None,
        }
    }

    /// Whether the parameter walk visits the field.
    pub fn has_params(&self) -> bool {
        !matches!(self.mark, Some(Mark::Skip | Mark::Invalid))
    }
}

impl<'a> Input<'a> {
    /// The struct and its field marks, or `None` (with the error recorded)
    /// when the item is not a struct with named fields.
    pub fn from_syn(item: &'a syn::Item, cx: &Ctxt) -> Option<Self> {
        match item {
            syn::Item::Struct(s) => return Self::from_struct(s, cx),
            syn::Item::Enum(e) => {
                let (token, ident) = (&e.enum_token, &e.ident);
                cx.error_spanned_by(
                    quote!(#token #ident),
                    format!(
                        "#[precision] goes on a struct with named fields, not on enum `{ident}`: \
                         write `struct {ident} {{ #[quantize] qkv: QuantLinear, .. }}`"
                    ),
                );
            }
            syn::Item::Union(u) => {
                let (token, ident) = (&u.union_token, &u.ident);
                cx.error_spanned_by(
                    quote!(#token #ident),
                    format!(
                        "#[precision] goes on a struct with named fields, not on union `{ident}`: \
                         write `struct {ident} {{ #[quantize] qkv: QuantLinear, .. }}`"
                    ),
                );
            }
            other => cx.error_spanned_by(
                other,
                "#[precision] goes on a struct with named fields: the model or one of its layers",
            ),
        }
        None
    }

    fn from_struct(s: &'a syn::ItemStruct, cx: &Ctxt) -> Option<Self> {
        let fields = match &s.fields {
            syn::Fields::Named(named) => named
                .named
                .iter()
                .filter_map(|f| {
                    Some(Field {
                        ident: f.ident.as_ref()?,
                        ty: &f.ty,
                        mark: attr::field_mark(f, cx),
                    })
                })
                .collect(),
            syn::Fields::Unit => Vec::new(),
            syn::Fields::Unnamed(_) => {
                let (token, ident, fields) = (&s.struct_token, &s.ident, &s.fields);
                cx.error_spanned_by(
                    quote!(#token #ident #fields),
                    format!(
                        "#[precision] needs named fields: plan paths such as `blocks.3.qkv` are \
                         made of field names; write `struct {} {{ #[quantize] qkv: QuantLinear, .. }}`",
                        s.ident
                    ),
                );
                return None;
            }
        };
        Some(Input {
            ident: &s.ident,
            generics: &s.generics,
            fields,
        })
    }
}

impl Input<'_> {
    /// Whether any field is `#[quantize]`; if not, the plan rests on the
    /// `#[layers]` element types, checked by const evaluation.
    pub fn has_quantize(&self) -> bool {
        self.fields
            .iter()
            .any(|f| matches!(f.mark, Some(Mark::Quantize)))
    }

    /// The layer struct types of the `#[layers]` and `#[layer]` fields.
    pub fn layer_elems(&self) -> Vec<&Type> {
        self.fields.iter().filter_map(Field::layer_type).collect()
    }
}
