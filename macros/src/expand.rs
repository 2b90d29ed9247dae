//! Code generation, once `valid.rs` found nothing wrong: `impl Planned` for
//! every annotated struct (the plan visitor), a compile-time check that the
//! plan can hold a quantized linear, and for the root `impl PrecisionModel`
//! (the recipe allow-list and the schedule as a `static`) plus the inherent
//! `schedule`/`plan`/`apply` methods. `lib.rs` lists every item with its
//! signature; keep the two in step.

use proc_macro2::{Ident, Literal, Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;

use crate::ast::{Input, Mark, PrecisionAttr};
use crate::attr;
use crate::recipe_tokens;
use crate::valid::{self, Ctxt, Role, Schedule};

/// The whole expansion of `#[precision(args)] item`.
pub fn precision(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut parsed: syn::Item = match syn::parse2(item.clone()) {
        Ok(parsed) => parsed,
        Err(err) => {
            let err = err.to_compile_error();
            return quote!(#err #item);
        }
    };
    let cx = Ctxt::default();
    let attr = attr::parse_precision(args, &cx);
    let generated = check_and_generate(&parsed, attr.as_ref(), &cx);
    attr::strip_field_marks(&mut parsed);
    match cx.check() {
        Ok(()) => quote!(#parsed #generated),
        // The item goes out unchanged (less its inert field marks) beside the
        // errors, so code using the struct does not cascade into more errors.
        Err(err) => {
            let errors = err.to_compile_error();
            quote!(#errors #parsed)
        }
    }
}

fn check_and_generate(
    item: &syn::Item,
    attr: Option<&PrecisionAttr>,
    cx: &Ctxt,
) -> Option<TokenStream> {
    let input = Input::from_syn(item, cx)?;
    let role = valid::check(attr?, &input, cx)?;
    Some(generate(&input, &role))
}

fn generate(input: &Input, role: &Role) -> TokenStream {
    let p = runtime_path();
    let planned = impl_planned(input, &p);
    let check = plan_check(input, &p);
    let root = match role {
        Role::Layer => TokenStream::new(),
        Role::Root(schedule) => impl_root(input, schedule, &p),
    };
    quote!(#planned #check #root)
}

/// The runtime's `__private` module, through whichever crate the user has:
/// `mxswitch-runtime` directly (as `models` does) or the `mxswitch` facade.
fn runtime_path() -> TokenStream {
    use proc_macro_crate::{crate_name, FoundCrate};
    let extern_crate = |name: &str| Ident::new(name, Span::call_site());
    match crate_name("mxswitch-runtime") {
        Ok(FoundCrate::Itself) => quote!(crate::__private),
        Ok(FoundCrate::Name(name)) => {
            let name = extern_crate(&name);
            quote!(::#name::__private)
        }
        Err(_) => match crate_name("mxswitch") {
            Ok(FoundCrate::Name(name)) => {
                let name = extern_crate(&name);
                quote!(::#name::runtime::__private)
            }
            Ok(FoundCrate::Itself) => quote!(crate::runtime::__private),
            Err(_) => quote!(::mxswitch::runtime::__private),
        },
    }
}

/// Locals of generated code, hygienic so they cannot meet the user's names.
fn local(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

/// `impl Planned`: visit `#[quantize]` fields as sites and each element of a
/// `#[layers]` field as the next plan layer, in field order.
fn impl_planned(input: &Input, p: &TokenStream) -> TokenStream {
    let ident = input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let (cx, f, index, layer) = (local("cx"), local("f"), local("index"), local("layer"));
    let mut visits = Vec::new();
    let mut visits_mut = Vec::new();
    for field in &input.fields {
        let name = field.ident;
        let path = name.unraw().to_string();
        match &field.mark {
            Some(Mark::Quantize) => {
                let span = name.span();
                visits.push(quote_spanned!(span=> #f(#cx.site(#path), &self.#name);));
                visits_mut.push(quote_spanned!(span=> #f(#cx.site(#path), &mut self.#name);));
            }
            Some(Mark::Layers { elem }) => {
                let visit = quote_spanned!(elem.span()=> <#elem as #p::Planned>::visit_linears);
                let visit_mut =
                    quote_spanned!(elem.span()=> <#elem as #p::Planned>::visit_linears_mut);
                visits.push(quote! {
                    for (#index, #layer) in self.#name.iter().enumerate() {
                        #cx.layer(#path, #index, |#cx| #visit(#layer, #cx, #f));
                    }
                });
                visits_mut.push(quote! {
                    for (#index, #layer) in self.#name.iter_mut().enumerate() {
                        #cx.layer(#path, #index, |#cx| #visit_mut(#layer, #cx, #f));
                    }
                });
            }
            Some(Mark::Invalid) | None => {}
        }
    }
    let can_hold = if input.has_quantize() {
        quote!(true)
    } else {
        let elems = input.layer_elems();
        quote!(false #(|| <#elems as #p::Planned>::CAN_HOLD_LINEARS)*)
    };
    // A generic struct cannot name itself in a free `const _`; its check runs
    // when the visitor is instantiated (see `plan_check`).
    let generic_check = if input.generics.params.is_empty() || input.has_quantize() {
        TokenStream::new()
    } else {
        let msg = empty_message(input);
        quote!(const { if !<Self as #p::Planned>::CAN_HOLD_LINEARS { ::core::panic!(#msg) } };)
    };
    quote! {
        #[automatically_derived]
        impl #impl_generics #p::Planned for #ident #ty_generics #where_clause {
            const CAN_HOLD_LINEARS: bool = #can_hold;

            fn visit_linears(
                &self,
                #cx: &mut #p::PlanCx<'_>,
                #f: &mut dyn ::core::ops::FnMut(#p::LinearSite<'_>, &dyn #p::PlanLinear),
            ) {
                #generic_check
                #(#visits)*
            }

            fn visit_linears_mut(
                &mut self,
                #cx: &mut #p::PlanCx<'_>,
                #f: &mut dyn ::core::ops::FnMut(#p::LinearSite<'_>, &mut dyn #p::PlanLinear),
            ) {
                #generic_check
                #(#visits_mut)*
            }
        }
    }
}

/// The compile error for a struct whose `#[layers]` element types hold no
/// quantized linear (a struct without any mark is rejected in `valid.rs`).
fn empty_message(input: &Input) -> String {
    let elems: Vec<String> = input
        .layer_elems()
        .iter()
        .map(|t| format!("`{}`", t.to_token_stream()).replace(' ', ""))
        .collect();
    format!(
        "`{}` has no quantized linear: mark a linear field #[quantize] or a Vec of layer \
         structs #[layers] (its #[layers] element types {} hold none)",
        input.ident,
        elems.join(", ")
    )
    .replace('{', "{{")
    .replace('}', "}}")
}

/// Const evaluation of `CAN_HOLD_LINEARS` for a struct whose plan rests on
/// its `#[layers]` element types, so an empty plan is still a compile error.
fn plan_check(input: &Input, p: &TokenStream) -> TokenStream {
    if input.has_quantize() || !input.generics.params.is_empty() {
        return TokenStream::new();
    }
    let ident = input.ident;
    let msg = empty_message(input);
    quote_spanned! {ident.span()=>
        const _: () = {
            if !<#ident as #p::Planned>::CAN_HOLD_LINEARS {
                ::core::panic!(#msg)
            }
        };
    }
}

/// `impl PrecisionModel` and the inherent methods of the root. The schedule
/// is a `static` inside `PrecisionModel::schedule` (one for all
/// instantiations of a generic root): its phases are constant data, checked
/// by `valid.rs`, so nothing is built or validated at run time.
fn impl_root(input: &Input, schedule: &Schedule, p: &TokenStream) -> TokenStream {
    let ident = input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let kinds = recipe_tokens::kinds(schedule, p);
    let phases = schedule.phases.iter().map(|phase| {
        let start = Literal::u64_suffixed(phase.start);
        let recipe = recipe_tokens::recipe(&phase.recipe, p);
        quote!(#p::Phase { start: #start, recipe: #recipe })
    });
    let layers_per_iter = Literal::u64_suffixed(schedule.layers_per_iter);
    let order = recipe_tokens::order(schedule.order, p);
    // `include_bytes!` makes cargo rebuild the crate when the RON file changes.
    let rebuild = schedule.config.as_ref().map(|path| {
        let path = path.to_string_lossy();
        quote!(
            const _: &[u8] = ::core::include_bytes!(#path);
        )
    });
    let text = schedule.to_string();
    let name = ident.to_string();
    let (iteration, sched, text_arg) = (local("iteration"), local("schedule"), local("text"));
    let schedule_static = local("SCHEDULE");
    let doc_text = format!(
        "The attribute's schedule of `{name}`, in the `schedule = [...]` spelling: `{text}`."
    );
    quote! {
        #rebuild

        #[automatically_derived]
        impl #impl_generics #p::PrecisionModel for #ident #ty_generics #where_clause {
            const RECIPES: &'static [#p::RecipeKind] = &[#(#kinds),*];

            fn schedule() -> &'static #p::Schedule {
                static #schedule_static: #p::Schedule = #p::Schedule::from_attribute(
                    &[#(#phases),*],
                    #layers_per_iter,
                    #order,
                );
                &#schedule_static
            }
        }

        impl #impl_generics #ident #ty_generics #where_clause {
            #[doc = #doc_text]
            pub const SCHEDULE_TEXT: &'static str = #text;

            /// The schedule written in the `#[precision]` attribute (or read
            /// from its RON file at compile time): a `static`, checked at
            /// compile time, the same value on every call.
            pub fn schedule() -> &'static #p::Schedule {
                <Self as #p::PrecisionModel>::schedule()
            }

            /// The layer plan of this instance: its quantized linears grouped
            /// by plan layer (shallow to deep), and the extras outside the
            /// layer stack.
            pub fn plan(&self) -> #p::Plan {
                #p::Plan::of(self)
            }

            /// The plan, or an error naming the model when the instance holds
            /// no quantized linear (for example a depth of 0); call it when
            /// the model is built instead of training silently in high precision.
            pub fn checked_plan(&self) -> ::core::result::Result<#p::Plan, #p::Error> {
                let plan = #p::Plan::of(self);
                plan.check_not_empty(#name)?;
                ::core::result::Result::Ok(plan)
            }

            /// Give every quantized linear its recipe at `iteration` (the
            /// number of completed optimizer steps) under the attribute's
            /// schedule. Assigned absolutely: applying an iteration twice is a
            /// no-op, and iterations may come in any order. Touches nothing
            /// but the recipes, and allocates nothing.
            pub fn apply(&mut self, #iteration: u64) -> #p::SwitchReport {
                #p::apply_attribute_schedule(self, #iteration)
            }

            /// As [`Self::apply`], under a schedule from a RON config or the
            /// command line. It may move switches, change the ramp and set
            /// recipe options; naming a recipe the attribute does not name is
            /// an error that lists the recipes it names.
            pub fn apply_with(
                &mut self,
                #sched: &#p::Schedule,
                #iteration: u64,
            ) -> ::core::result::Result<#p::SwitchReport, #p::Error> {
                #p::apply_schedule(self, #sched, #iteration)
            }

            /// Parse a RON schedule, `(phases: [(start: 0, recipe: "mxfp4"),
            /// (start: 12000, recipe: "fp8")], layers_per_iter: 0, order:
            /// "deep_to_shallow")`, and check that it names only recipes the
            /// attribute names.
            pub fn schedule_from_ron(
                #text_arg: &str,
            ) -> ::core::result::Result<#p::Schedule, #p::Error> {
                let #sched = #p::schedule_from_ron(#text_arg)?;
                #p::check_schedule::<Self>(&#sched)?;
                ::core::result::Result::Ok(#sched)
            }
        }
    }
}
