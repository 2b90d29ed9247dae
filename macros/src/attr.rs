//! Parsing of `#[precision(...)]` arguments and of the field marks
//! (`#[quantize]`, `#[layers]`, ...) into the plain structs of `ast.rs`.
//!
//! Keys are custom keywords peeked with `lookahead1`, so a stray token gets
//! "expected one of ...". A duplicate or unknown key is recorded and parsing
//! goes on, so one build reports every mistake.

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::{bracketed, parenthesized, Expr, Ident, LitStr, Token, Type};

use crate::ast::{Keyed, Mark, OptionSpec, PhaseSpec, PrecisionAttr, RecipeSpec};
use crate::symbol::{self, kw};
use crate::valid::{suggest, Ctxt};

/// Parse the attribute's arguments; `None` when they cannot be parsed at all
/// (the error is recorded in `cx`).
pub fn parse_precision(args: TokenStream, cx: &Ctxt) -> Option<PrecisionAttr> {
    if args.is_empty() {
        cx.error(
            Span::call_site(),
            "#[precision] needs arguments: the recipe to start with, e.g. \
             #[precision(mxfp4)] or #[precision(mxfp4, switch_to = fp8, at = 12000)], \
             or `layer` for a plan layer: #[precision(layer)]",
        );
        return None;
    }
    let parser = |input: ParseStream| parse_args(input, cx);
    match parser.parse2(args) {
        Ok(attr) => Some(attr),
        Err(err) => {
            cx.syn_error(err);
            None
        }
    }
}

fn parse_args(input: ParseStream, cx: &Ctxt) -> syn::Result<PrecisionAttr> {
    let mut attr = PrecisionAttr::default();
    let mut first = true;
    while !input.is_empty() {
        if input.peek(Ident::peek_any) && !input.peek2(Token![=]) {
            parse_positional(input, &mut attr, first, cx)?;
        } else {
            parse_key(input, &mut attr, cx)?;
        }
        first = false;
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    Ok(attr)
}

/// `layer` or the starting recipe, both without a key.
fn parse_positional(
    input: ParseStream,
    attr: &mut PrecisionAttr,
    first: bool,
    cx: &Ctxt,
) -> syn::Result<()> {
    if input.peek(kw::layer) && !input.peek2(syn::token::Paren) {
        let layer: kw::layer = input.parse()?;
        let ident = Ident::new(symbol::LAYER, layer.span);
        if attr.layer.is_some() {
            cx.error_spanned_by(&ident, "duplicate `layer`; write it once");
        } else {
            attr.layer = Some(ident);
        }
        return Ok(());
    }
    let recipe: RecipeSpec = parse_recipe(input)?;
    // After `layer` the recipe is kept, for `valid.rs` to say it has no place there.
    if attr.recipe.is_some() || (!first && attr.layer.is_none()) {
        cx.error_spanned_by(
            &recipe.name,
            format!(
                "a recipe without a key must come first, as the recipe the model starts with: \
                 #[precision({}, ..)]; a later recipe needs a key, such as `switch_to = {}`",
                recipe.name, recipe.name
            ),
        );
    } else {
        attr.recipe = Some(recipe);
    }
    Ok(())
}

/// One `key = value`.
fn parse_key(input: ParseStream, attr: &mut PrecisionAttr, cx: &Ctxt) -> syn::Result<()> {
    let la = input.lookahead1();
    if la.peek(kw::switch_to) {
        let key = keyword(
            input.parse::<kw::switch_to>()?.span,
            symbol::SWITCH_TO,
            input,
        )?;
        set(&mut attr.switch_to, key, parse_recipe(input)?, cx);
    } else if la.peek(kw::at) {
        let key = keyword(input.parse::<kw::at>()?.span, symbol::AT, input)?;
        set(&mut attr.at, key, input.parse::<Expr>()?, cx);
    } else if la.peek(kw::layers_per_iter) {
        let span = input.parse::<kw::layers_per_iter>()?.span;
        let key = keyword(span, symbol::LAYERS_PER_ITER, input)?;
        set(&mut attr.layers_per_iter, key, input.parse::<Expr>()?, cx);
    } else if la.peek(kw::order) {
        let key = keyword(input.parse::<kw::order>()?.span, symbol::ORDER, input)?;
        set(&mut attr.order, key, input.parse::<TokenTree>()?, cx);
    } else if la.peek(kw::schedule) {
        let key = keyword(input.parse::<kw::schedule>()?.span, symbol::SCHEDULE, input)?;
        set(&mut attr.schedule, key, parse_phases(input)?, cx);
    } else if la.peek(kw::config) {
        let key = keyword(input.parse::<kw::config>()?.span, symbol::CONFIG, input)?;
        set(&mut attr.config, key, input.parse::<LitStr>()?, cx);
    } else if la.peek(kw::allow) {
        let key = keyword(input.parse::<kw::allow>()?.span, symbol::ALLOW, input)?;
        set(&mut attr.allow, key, parse_names(input)?, cx);
    } else if input.peek(Ident::peek_any) {
        let key = input.call(Ident::parse_any)?;
        skip_value(input)?;
        let name = key.to_string();
        let hint = match suggest(&name, symbol::KEYS) {
            Some(near) => format!("; did you mean `{near}`?"),
            None => String::new(),
        };
        cx.error_spanned_by(
            &key,
            format!(
                "unknown key `{name}`{hint} #[precision] takes {}",
                symbol::KEYS.map(|k| format!("`{k}`")).join(", ")
            ),
        );
    } else {
        return Err(la.error());
    }
    Ok(())
}

/// The key as an `Ident` (for spans), after consuming its `=`.
fn keyword(span: Span, name: &str, input: ParseStream) -> syn::Result<Ident> {
    input.parse::<Token![=]>()?;
    Ok(Ident::new(name, span))
}

/// Record `key = value` unless the key was already given.
fn set<T>(slot: &mut Option<Keyed<T>>, key: Ident, value: T, cx: &Ctxt) {
    if slot.is_some() {
        cx.error_spanned_by(
            &key,
            format!("duplicate key `{key}`: it is already set; remove one of them"),
        );
    } else {
        *slot = Some(Keyed { key, value });
    }
}

/// Skip `= value` of an unknown key, up to the next top-level comma.
fn skip_value(input: ParseStream) -> syn::Result<()> {
    input.step(|cursor| {
        let mut rest = *cursor;
        while let Some((tt, next)) = rest.token_tree() {
            if matches!(&tt, TokenTree::Punct(p) if p.as_char() == ',') {
                break;
            }
            rest = next;
        }
        Ok(((), rest))
    })
}

/// `mxfp4` or `mxfp4(scale = rceil, sr = true)`.
fn parse_recipe(input: ParseStream) -> syn::Result<RecipeSpec> {
    let name = input.call(Ident::parse_any)?;
    let mut options = Vec::new();
    if input.peek(syn::token::Paren) {
        let content;
        parenthesized!(content in input);
        let parsed = Punctuated::<OptionSpec, Token![,]>::parse_terminated_with(&content, |i| {
            let key = i.call(Ident::parse_any)?;
            i.parse::<Token![=]>()?;
            Ok(OptionSpec {
                key,
                value: i.parse()?,
            })
        })?;
        options.extend(parsed);
    }
    Ok(RecipeSpec { name, options })
}

/// `[nvfp4, fp8_block]`: recipe names (`valid.rs` looks them up and
/// refuses options, which belong to a schedule).
fn parse_names(input: ParseStream) -> syn::Result<Vec<RecipeSpec>> {
    let content;
    bracketed!(content in input);
    let names = Punctuated::<RecipeSpec, Token![,]>::parse_terminated_with(&content, parse_recipe)?;
    Ok(names.into_iter().collect())
}

/// `[mxfp4 @ 0, fp8 @ 12000, bf16 @ 15000]`.
fn parse_phases(input: ParseStream) -> syn::Result<Vec<PhaseSpec>> {
    let content;
    bracketed!(content in input);
    let phases = Punctuated::<PhaseSpec, Token![,]>::parse_terminated_with(&content, |i| {
        let recipe = parse_recipe(i)?;
        i.parse::<Token![@]>()?;
        Ok(PhaseSpec {
            recipe,
            start: i.parse()?,
        })
    })?;
    Ok(phases.into_iter().collect())
}

/// The mark of one field: `#[quantize]`, `#[high_precision]`, `#[layers]`,
/// `#[layer]`, `#[skip]` or none.
pub fn field_mark<'a>(field: &'a syn::Field, cx: &Ctxt) -> Option<Mark<'a>> {
    let mut mark = None;
    for attr in &field.attrs {
        let path = attr.path();
        let this = if path.is_ident(symbol::QUANTIZE) {
            Mark::Quantize
        } else if path.is_ident(symbol::HIGH_PRECISION) {
            Mark::HighPrecision
        } else if path.is_ident(symbol::LAYER_MARK) {
            Mark::Layer
        } else if path.is_ident(symbol::SKIP) {
            Mark::Skip
        } else if path.is_ident(symbol::LAYERS) {
            match layer_elem(&field.ty) {
                Some(elem) => Mark::Layers { elem },
                None => {
                    cx.error_spanned_by(
                        &field.ty,
                        "#[layers] goes on a `Vec<T>` or an array `[T; N]` of layer structs \
                         (each marked #[precision(layer)]); each element is one plan layer; \
                         a single layer struct takes #[layer]",
                    );
                    Mark::Invalid
                }
            }
        } else {
            continue;
        };
        if !matches!(attr.meta, syn::Meta::Path(_)) {
            cx.error_spanned_by(
                &attr.meta,
                "a field mark takes no arguments; write it alone",
            );
        }
        if mark.is_some() {
            cx.error_spanned_by(
                attr,
                "a field takes one mark, once: #[quantize] for a quantized linear, \
                 #[high_precision] for one kept in BF16, #[layers] for a Vec or array of \
                 layer structs, #[layer] for one layer struct, #[skip] for a field without \
                 parameters",
            );
        } else {
            mark = Some(this);
        }
    }
    mark
}

/// `T` of `Vec<T>` or `[T; N]`.
fn layer_elem(ty: &Type) -> Option<&Type> {
    match ty {
        Type::Array(a) => Some(&a.elem),
        Type::Path(p) if p.qself.is_none() => {
            let last = p.path.segments.last()?;
            if last.ident != "Vec" {
                return None;
            }
            match &last.arguments {
                syn::PathArguments::AngleBracketed(args) if args.args.len() == 1 => {
                    match args.args.first()? {
                        syn::GenericArgument::Type(t) => Some(t),
                        _ => None,
                    }
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// Find a second `#[precision]` on the item (the first expansion sees the
/// rest of the item's attributes): record the error and remove it, so it
/// does not expand into errors of its own. Returns whether one was found.
pub fn take_repeated_precision(item: &mut syn::Item, cx: &Ctxt) -> bool {
    let attrs = match item {
        syn::Item::Struct(s) => &mut s.attrs,
        syn::Item::Enum(e) => &mut e.attrs,
        syn::Item::Union(u) => &mut u.attrs,
        _ => return false,
    };
    let is_precision = |a: &syn::Attribute| {
        a.path()
            .segments
            .last()
            .is_some_and(|s| s.ident == symbol::PRECISION)
    };
    let mut found = false;
    for a in attrs.iter().filter(|a| is_precision(a)) {
        found = true;
        cx.error_spanned_by(
            a,
            "#[precision] is written twice on this struct: one attribute holds the whole \
             schedule; keep one",
        );
    }
    attrs.retain(|a| !is_precision(a));
    found
}

/// Remove the inert field marks from the struct's fields.
pub fn strip_field_marks(item: &mut syn::Item) {
    if let syn::Item::Struct(s) = item {
        for field in s.fields.iter_mut() {
            field
                .attrs
                .retain(|a| !symbol::MARKS.iter().any(|m| a.path().is_ident(m)));
        }
    }
}
