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
    let generated = if attr::take_repeated_precision(&mut parsed, &cx) {
        None
    } else {
        check_and_generate(&parsed, attr.as_ref(), &cx)
    };
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
    let planned = impl_planned(input, role, &p);
    let check = plan_check(input, &p);
    let unmarked = unmarked_checks(input, &p);
    // Plan fields' parameter walks follow from their plan bounds.
    let fields: Vec<(&Ident, &syn::Type)> = input
        .fields
        .iter()
        .filter(|f| f.has_params())
        .map(|f| (f.ident, f.ty))
        .collect();
    let unplanned: Vec<(&Ident, &syn::Type)> = input
        .fields
        .iter()
        .filter(|f| f.has_params() && !f.plans() && !matches!(f.mark, Some(Mark::HighPrecision)))
        .map(|f| (f.ident, f.ty))
        .collect();
    let (root, after_allocate) = match role {
        Role::Layer => (TokenStream::new(), TokenStream::new()),
        Role::Root(schedule) => (
            impl_root(input, schedule, &p),
            quote! {
                fn after_allocate(&mut self, seed: u64) {
                    #p::seed_linears(self, seed);
                    #p::apply_attribute_schedule(self, 0);
                }
            },
        ),
    };
    let generics = with_bounds(input, plan_bounds(input, &p));
    let params = impl_parameters(
        input.ident,
        &generics,
        &fields,
        &unplanned,
        after_allocate,
        &p,
    );
    quote!(#planned #check #unmarked #params #root)
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

/// `#[derive(Parameters)]`: the parameter walk of a struct that is not part
/// of the precision plan (an embedder, a norm), with `#[skip]` fields left out.
pub fn derive_parameters(item: TokenStream) -> TokenStream {
    let parsed: syn::DeriveInput = match syn::parse2(item) {
        Ok(parsed) => parsed,
        Err(err) => return err.to_compile_error(),
    };
    let syn::Data::Struct(syn::DataStruct {
        fields: syn::Fields::Named(named),
        ..
    }) = &parsed.data
    else {
        return syn::Error::new_spanned(
            &parsed.ident,
            "#[derive(Parameters)] needs a struct with named fields: parameter paths such as \
             `blocks.3.fc1.weight` are made of field names",
        )
        .to_compile_error();
    };
    let skip = |f: &&syn::Field| {
        f.attrs
            .iter()
            .any(|a| a.path().is_ident(crate::symbol::SKIP))
    };
    let fields: Vec<(&Ident, &syn::Type)> = named
        .named
        .iter()
        .filter(|f| !skip(f))
        .filter_map(|f| Some((f.ident.as_ref()?, &f.ty)))
        .collect();
    impl_parameters(
        &parsed.ident,
        &parsed.generics,
        &fields,
        &fields,
        TokenStream::new(),
        &runtime_path(),
    )
}

/// Locals of generated code, hygienic so they cannot meet the user's names.
fn local(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

/// The struct's generics with `bounds` added to its where clause. Every
/// generated impl states what its fields must be (`T: PlanLayer` for a
/// `#[layers] Vec<T>`), so a generic model needs no bound of its own, and a
/// field of the wrong type is one error at that field, with the trait's
/// `on_unimplemented` message.
fn with_bounds(input: &Input, bounds: Vec<TokenStream>) -> syn::Generics {
    let mut generics = input.generics.clone();
    let clause = generics.make_where_clause();
    for bound in bounds {
        clause
            .predicates
            .push(syn::parse2(bound).expect("a generated where predicate parses"));
    }
    generics
}

/// What the plan needs of each marked field's type. Every generated impl of
/// a struct states the same bounds at the same spans, so a field of the
/// wrong type is reported once, at the field, with the trait's message (and
/// the traits' `Parameters` supertrait covers the parameter walk).
fn plan_bounds(input: &Input, p: &TokenStream) -> Vec<TokenStream> {
    input
        .fields
        .iter()
        .filter_map(|f| {
            let (ty, bound) = match &f.mark {
                Some(Mark::Quantize | Mark::HighPrecision) => (f.ty, quote!(PlanLinear)),
                Some(Mark::Layers { elem }) => (*elem, quote!(PlanLayer)),
                Some(Mark::Layer) => (f.ty, quote!(PlanLayer)),
                _ => return None,
            };
            Some(respan(quote!(#ty: #p::#bound), ty.span()))
        })
        .collect()
}

/// `tokens` with every span set to `span`, so an error about them points
/// at the user's code instead of the attribute.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tt| {
            if let proc_macro2::TokenTree::Group(g) = &tt {
                let mut group = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), span));
                group.set_span(span);
                tt = proc_macro2::TokenTree::Group(group);
            } else {
                tt.set_span(span);
            }
            tt
        })
        .collect()
}

/// `impl Planned` (and `PlanLayer` for a layer struct): visit `#[quantize]`
/// fields as sites and each element of a `#[layers]` field, or the struct
/// of a `#[layer]` field, as the next plan layer, in field order.
fn impl_planned(input: &Input, role: &Role, p: &TokenStream) -> TokenStream {
    let ident = input.ident;
    let generics = with_bounds(input, plan_bounds(input, p));
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    let (cx, f, index, layer) = (local("cx"), local("f"), local("index"), local("layer"));
    let mut visits = Vec::new();
    let mut visits_mut = Vec::new();
    let mut high = Vec::new();
    for field in &input.fields {
        let name = field.ident;
        let path = name.unraw().to_string();
        match &field.mark {
            Some(Mark::Quantize) => {
                let span = name.span();
                visits.push(quote_spanned!(span=> #f(#cx.site(#path), &self.#name);));
                visits_mut.push(quote_spanned!(span=> #f(#cx.site(#path), &mut self.#name);));
            }
            Some(Mark::HighPrecision) => {
                high.push(quote_spanned!(name.span()=> #f(&mut self.#name);));
            }
            Some(Mark::Layers { elem }) => {
                let visit = quote_spanned!(elem.span()=> <#elem as #p::Planned>::visit_linears);
                let visit_mut =
                    quote_spanned!(elem.span()=> <#elem as #p::Planned>::visit_linears_mut);
                let visit_high =
                    quote_spanned!(elem.span()=> <#elem as #p::Planned>::visit_high_precision_mut);
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
                high.push(quote! {
                    for #layer in self.#name.iter_mut() {
                        #visit_high(#layer, #f);
                    }
                });
            }
            Some(Mark::Layer) => {
                let ty = field.ty;
                let visit = quote_spanned!(ty.span()=> <#ty as #p::Planned>::visit_linears);
                let visit_mut = quote_spanned!(ty.span()=> <#ty as #p::Planned>::visit_linears_mut);
                let visit_high =
                    quote_spanned!(ty.span()=> <#ty as #p::Planned>::visit_high_precision_mut);
                visits.push(quote! {
                    #cx.single_layer(#path, |#cx| #visit(&self.#name, #cx, #f));
                });
                visits_mut.push(quote! {
                    #cx.single_layer(#path, |#cx| #visit_mut(&mut self.#name, #cx, #f));
                });
                high.push(quote!(#visit_high(&mut self.#name, #f);));
            }
            Some(Mark::Skip | Mark::Invalid) | None => {}
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
    let plan_layer = match role {
        Role::Layer => quote! {
            #[automatically_derived]
            impl #impl_generics #p::PlanLayer for #ident #ty_generics #where_clause {}
        },
        Role::Root(_) => TokenStream::new(),
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

            fn visit_high_precision_mut(
                &mut self,
                #f: &mut dyn ::core::ops::FnMut(&mut dyn #p::PlanLinear),
            ) {
                #(#high)*
            }
        }

        #plan_layer
    }
}

/// `impl Parameters`: every field but the `#[skip]` ones, under its name,
/// so parameter paths (checkpoint names) are the plan's paths. `extra` goes
/// inside the impl (a root's `after_allocate`). The `bounded` fields get a
/// `Parameters` bound (the others' follows from their plan bounds). Shared
/// with `#[derive(Parameters)]`.
pub fn impl_parameters(
    ident: &Ident,
    input_generics: &syn::Generics,
    fields: &[(&Ident, &syn::Type)],
    bounded: &[(&Ident, &syn::Type)],
    extra: TokenStream,
    p: &TokenStream,
) -> TokenStream {
    let mut generics = input_generics.clone();
    let clause = generics.make_where_clause();
    for (_, ty) in bounded {
        let bound = respan(quote!(#ty: #p::Parameters), ty.span());
        clause
            .predicates
            .push(syn::parse2(bound).expect("a generated where predicate parses"));
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    let (prefix, f) = (local("prefix"), local("f"));
    let visits = fields.iter().map(|(name, ty)| {
        let path = name.unraw().to_string();
        quote_spanned! {ty.span()=>
            <#ty as #p::Parameters>::visit_params(&mut self.#name, &#p::join(#prefix, #path), #f);
        }
    });
    quote! {
        #[automatically_derived]
        impl #impl_generics #p::Parameters for #ident #ty_generics #where_clause {
            fn visit_params(
                &mut self,
                #prefix: &str,
                #f: &mut dyn ::core::ops::FnMut(#p::ParamSlot<'_>),
            ) {
                #(#visits)*
            }

            #extra
        }
    }
}

/// Compile-time checks of the fields without a plan mark: a quantized
/// linear or a layer struct there would never follow the schedule. Only for
/// a struct without generics (a field type that depends on a parameter
/// cannot be asked about before it is known; a linear missed that way is
/// the run-time error of a linear without a recipe).
fn unmarked_checks(input: &Input, p: &TokenStream) -> TokenStream {
    if !input.generics.params.is_empty() {
        return TokenStream::new();
    }
    let owner = input.ident;
    let checks = input
        .fields
        .iter()
        .filter(|f| matches!(f.mark, None | Some(Mark::Skip)))
        .map(|f| {
            let (ty, name) = (f.ty, f.ident);
            let linear = format!(
                "field `{name}` of `{owner}` is a quantized linear without a mark, so no \
                 schedule would give it a recipe: mark it #[quantize] to follow the schedule, \
                 or #[high_precision] to keep it in BF16 on purpose"
            );
            let layer = format!(
                "field `{name}` of `{owner}` holds a #[precision(layer)] struct without a \
                 mark, so its linears would be outside the plan: mark it #[layer]"
            );
            let layers = format!(
                "field `{name}` of `{owner}` holds #[precision(layer)] structs without a \
                 mark, so their linears would be outside the plan: mark it #[layers]"
            );
            quote_spanned! {name.span()=>
                const _: () = {
                    use #p::NotPlanned as _;
                    if <#p::Probe<#ty>>::PLAN_LINEAR {
                        ::core::panic!(#linear)
                    }
                    if <#p::Probe<#ty>>::PLAN_LAYER {
                        ::core::panic!(#layer)
                    }
                    if <#p::Probe<#ty>>::PLAN_LAYERS {
                        ::core::panic!(#layers)
                    }
                };
            }
        });
    quote!(#(#checks)*)
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
    let generics = with_bounds(input, plan_bounds(input, p));
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
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

            /// Which recipe every quantized linear runs now, in plan order.
            pub fn recipes(&self) -> #p::RecipeReport {
                #p::RecipeReport::of(self)
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
