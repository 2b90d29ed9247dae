//! The rules that span keys and fields, and the resolved plan they produce.
//!
//! Every check records its error in a [`Ctxt`] and carries on, so one build
//! reports every mistake (serde_derive's `Ctxt` pattern); `expand.rs` emits
//! code only when none was recorded.

use std::cell::RefCell;
use std::fmt;
use std::path::PathBuf;

use proc_macro2::{Span, TokenTree};
use quote::ToTokens;
use syn::{Expr, Lit, UnOp};

pub use mxswitch_recipes::suggest;
use mxswitch_recipes::{check_phases, At, Order, Phase, PhaseAt, Recipe, RecipeKind};

use crate::ast::{Input, Keyed, PhaseSpec, PrecisionAttr, RecipeSpec};
use crate::config;
use crate::symbol;

/// Collects every error of one expansion.
#[derive(Default)]
pub struct Ctxt {
    errors: RefCell<Vec<syn::Error>>,
}

impl Ctxt {
    /// An error covering `tokens` (from their first to their last token).
    pub fn error_spanned_by<T: ToTokens>(&self, tokens: T, msg: impl fmt::Display) {
        self.syn_error(syn::Error::new_spanned(tokens, msg));
    }

    pub fn error(&self, span: Span, msg: impl fmt::Display) {
        self.syn_error(syn::Error::new(span, msg));
    }

    pub fn syn_error(&self, err: syn::Error) {
        self.errors.borrow_mut().push(err);
    }

    /// All recorded errors combined into one, or `Ok` when there were none.
    pub fn check(self) -> syn::Result<()> {
        let mut errors = self.errors.into_inner().into_iter();
        let Some(mut combined) = errors.next() else {
            return Ok(());
        };
        errors.for_each(|e| combined.combine(e));
        Err(combined)
    }
}

/// What an annotated struct is, once checked.
pub enum Role {
    /// `#[precision(layer)]`: one plan layer.
    Layer,
    /// The root model and its schedule.
    Root(Schedule),
}

/// A checked schedule (SPEC section 5): the rules of
/// `mxswitch_recipes::check_phases` hold.
pub struct Schedule {
    pub phases: Vec<Phase>,
    pub layers_per_iter: u64,
    pub order: Order,
    /// The RON file the schedule came from, to rebuild when it changes.
    pub config: Option<PathBuf>,
    /// `allow = [...]`: recipes a run-time schedule may use besides those
    /// the phases name (none are in the phases).
    pub allow: Vec<RecipeKind>,
}

impl fmt::Display for Schedule {
    /// The schedule in the attribute's `schedule = [...]` spelling, plus the ramp.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let phases: Vec<String> = self
            .phases
            .iter()
            .map(|p| format!("{} @ {}", p.recipe, p.start))
            .collect();
        write!(
            f,
            "[{}], layers_per_iter = {}, order = {}",
            phases.join(", "),
            self.layers_per_iter,
            self.order
        )
    }
}

/// Check the attribute against the struct; `None` when something is wrong
/// (every error is recorded in `cx`).
pub fn check(attr: &PrecisionAttr, input: &Input, cx: &Ctxt) -> Option<Role> {
    check_marks(input, cx);
    if let Some(layer) = &attr.layer {
        reject_schedule_on_layer(attr, layer, cx);
        reject_layers_in_layer(input, cx);
        return Some(Role::Layer);
    }
    if let Some(config) = &attr.config {
        reject_besides_config(attr, cx);
        let mut schedule = config::load(&config.value, cx)?;
        schedule.allow = allowed(attr, &schedule.phases, cx)?;
        return Some(Role::Root(schedule));
    }
    let phases = match &attr.schedule {
        Some(list) => schedule_phases(attr, list, cx),
        None => switch_phases(attr, cx),
    };
    let layers_per_iter = match &attr.layers_per_iter {
        Some(k) => layers_per_iter(&k.value, cx),
        None => Some(0),
    };
    let order = match &attr.order {
        Some(k) => resolve_order(&k.value, cx),
        None => Some(Order::default()),
    };
    let phases = phases?;
    if let (Some(order), None) = (&attr.order, &attr.layers_per_iter) {
        if phases.len() > 1 {
            cx.error_spanned_by(
                &order.key,
                "`order` sets which end of the layer stack a ramp converts first, but without \
                 `layers_per_iter` a switch converts every layer at once, so it does nothing; \
                 add `layers_per_iter = <count>` or remove `order`",
            );
        }
    }
    if phases.len() == 1 {
        for key in [
            attr.layers_per_iter.as_ref().map(|k| &k.key),
            attr.order.as_ref().map(|k| &k.key),
        ]
        .into_iter()
        .flatten()
        {
            cx.error_spanned_by(
                key,
                format!(
                    "`{key}` sets how a switch ramps through the plan layers, but this schedule \
                     has no switch; add `switch_to = <recipe>, at = <iteration>` or remove `{key}`"
                ),
            );
        }
    }
    let allow = allowed(attr, &phases, cx);
    Some(Role::Root(Schedule {
        phases,
        layers_per_iter: layers_per_iter?,
        order: order?,
        config: None,
        allow: allow?,
    }))
}

/// `allow = [nvfp4, fp8_block]`: recipe names, each once, without options,
/// and none that the schedule already names (listing it would change nothing).
fn allowed(attr: &PrecisionAttr, phases: &[Phase], cx: &Ctxt) -> Option<Vec<RecipeKind>> {
    let Some(list) = &attr.allow else {
        return Some(Vec::new());
    };
    if list.value.is_empty() {
        cx.error_spanned_by(
            &list.key,
            "`allow = []` allows nothing: list the recipes a run-time schedule may use besides \
             the attribute's, e.g. `allow = [nvfp4, fp8_block]`, or remove `allow`",
        );
        return None;
    }
    let named: Vec<RecipeKind> = phases.iter().flat_map(|p| p.recipe.kinds()).collect();
    let mut kinds = Vec::new();
    let mut ok = true;
    for spec in &list.value {
        let kind = match RecipeKind::from_name(&spec.name.to_string()) {
            Ok(kind) => kind,
            Err(e) => {
                cx.error_spanned_by(&spec.name, e);
                ok = false;
                continue;
            }
        };
        let message = if let Some(first) = spec.options.first() {
            Some(format!(
                "`allow` lists recipe names without options: write `{kind}`; a schedule sets \
                 the options of an allowed recipe (`{} = ...` here)",
                first.key
            ))
        } else if kinds.contains(&kind) {
            Some(format!("`{kind}` is listed twice in `allow`; remove one"))
        } else if named.contains(&kind) {
            Some(format!(
                "`{kind}` is already allowed: the schedule names it; remove it from `allow`"
            ))
        } else {
            None
        };
        match message {
            Some(m) => {
                cx.error_spanned_by(&spec.name, m);
                ok = false;
            }
            None => kinds.push(kind),
        }
    }
    ok.then_some(kinds)
}

/// Every mark is well formed (done in `attr.rs`) and at least one field
/// puts linears in the plan.
fn check_marks(input: &Input, cx: &Ctxt) {
    let invalid = |f: &crate::ast::Field| matches!(f.mark, Some(crate::ast::Mark::Invalid));
    if !input.fields.iter().any(|f| f.plans() || invalid(f)) {
        let name = input.ident;
        cx.error_spanned_by(
            name,
            format!(
                "`{name}` has no quantized linear: mark a linear field #[quantize], \
                 a Vec of layer structs #[layers] or one layer struct #[layer]"
            ),
        );
    }
}

/// A `#[precision(layer)]` struct is one plan layer, so it holds no layers.
fn reject_layers_in_layer(input: &Input, cx: &Ctxt) {
    for f in input.fields.iter().filter(|f| f.layer_type().is_some()) {
        cx.error_spanned_by(
            f.ident,
            format!(
                "`{}` is one plan layer (#[precision(layer)]), so it cannot hold plan layers: \
                 move the field `{}` to the root model, or mark the inner linears #[quantize] \
                 in this struct",
                input.ident, f.ident
            ),
        );
    }
}

/// A `#[precision(layer)]` struct is one plan layer; schedules belong to the root.
fn reject_schedule_on_layer(attr: &PrecisionAttr, layer: &syn::Ident, cx: &Ctxt) {
    let mut extra: Vec<&dyn ToTokens> = Vec::new();
    if let Some(r) = &attr.recipe {
        extra.push(&r.name);
    }
    extra.extend(keys_of(attr));
    for tokens in extra {
        cx.error_spanned_by(
            tokens,
            format!(
                "#[precision({layer})] marks one plan layer and takes no schedule: \
                 move `{}` to the #[precision(...)] of the root model struct",
                tokens.to_token_stream()
            ),
        );
    }
}

/// With `config`, the file holds the whole schedule.
fn reject_besides_config(attr: &PrecisionAttr, cx: &Ctxt) {
    let mut extra: Vec<&dyn ToTokens> = Vec::new();
    if let Some(r) = &attr.recipe {
        extra.push(&r.name);
    }
    // `allow` is not part of the schedule: it goes with a file too.
    extra.extend(keys_of(attr).into_iter().filter(|k| {
        let k = k.to_token_stream().to_string();
        k != symbol::CONFIG && k != symbol::ALLOW
    }));
    for tokens in extra {
        cx.error_spanned_by(
            tokens,
            format!(
                "`config = \"...\"` reads the whole schedule from its RON file: \
                 remove `{}` here and set it in the file",
                tokens.to_token_stream()
            ),
        );
    }
}

/// The keys present, in source-independent order.
fn keys_of(attr: &PrecisionAttr) -> Vec<&dyn ToTokens> {
    fn key<T>(k: &Option<Keyed<T>>) -> Option<&dyn ToTokens> {
        k.as_ref().map(|k| &k.key as &dyn ToTokens)
    }
    [
        key(&attr.switch_to),
        key(&attr.at),
        key(&attr.layers_per_iter),
        key(&attr.order),
        key(&attr.schedule),
        key(&attr.config),
        key(&attr.allow),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// `mxfp4[, switch_to = fp8, at = N]`.
fn switch_phases(attr: &PrecisionAttr, cx: &Ctxt) -> Option<Vec<Phase>> {
    let Some(first) = &attr.recipe else {
        cx.error(
            Span::call_site(),
            "#[precision(...)] needs the recipe the model starts with as its first argument, \
             e.g. #[precision(mxfp4)] or #[precision(mxfp4, switch_to = fp8, at = 12000)]",
        );
        return None;
    };
    let first = recipe(first, cx);
    let switch = match (&attr.switch_to, &attr.at) {
        (None, None) => None,
        (Some(to), None) => {
            cx.error_spanned_by(
                &to.key,
                format!(
                    "`switch_to` needs `at`, the iteration of the switch: \
                     write `switch_to = {}, at = 12000`",
                    to.value.name
                ),
            );
            None
        }
        (None, Some(at)) => {
            cx.error_spanned_by(
                &at.key,
                "`at` needs `switch_to`, the recipe to switch to: \
                 write `switch_to = fp8, at = ...`",
            );
            None
        }
        (Some(to), Some(at)) => {
            let target = recipe(&to.value, cx);
            let start = switch_at(&at.value, target.as_ref(), cx);
            if let (Some(first), Some(target)) = (&first, &target) {
                if first == target {
                    // Recipes compare by what they resolve to; say so when
                    // the spelling hides it (`mxfp4(scale = even)` is `mxfp4`).
                    let written = to.value.to_string();
                    let resolved = if written == target.to_string() {
                        String::new()
                    } else {
                        format!(" once resolved (`{target}`)")
                    };
                    cx.error_spanned_by(
                        &to.value.name,
                        format!(
                            "`switch_to = {written}` switches to the recipe the model starts \
                             with{resolved}; name a different recipe (for example `fp8`) or \
                             remove `switch_to` and `at`"
                        ),
                    );
                }
            }
            Some((target?, start?))
        }
    };
    let mut phases = vec![Phase {
        start: 0,
        recipe: first?,
    }];
    if attr.switch_to.is_some() || attr.at.is_some() {
        let (recipe, start) = switch?;
        phases.push(Phase { start, recipe });
    }
    Some(phases)
}

/// `schedule = [mxfp4 @ 0, fp8 @ 12000, ...]`.
fn schedule_phases(
    attr: &PrecisionAttr,
    list: &Keyed<Vec<PhaseSpec>>,
    cx: &Ctxt,
) -> Option<Vec<Phase>> {
    if let Some(r) = &attr.recipe {
        cx.error_spanned_by(
            &r.name,
            format!(
                "`schedule = [...]` names the first recipe itself (`{} @ 0`): \
                 remove the leading `{}`",
                r.name, r.name
            ),
        );
    }
    for key in [
        attr.switch_to.as_ref().map(|k| &k.key),
        attr.at.as_ref().map(|k| &k.key),
    ]
    .into_iter()
    .flatten()
    {
        cx.error_spanned_by(
            key,
            format!(
                "`{key}` and `schedule` are two spellings of a schedule; use one: \
                 `schedule = [mxfp4 @ 0, fp8 @ 12000]` or `mxfp4, switch_to = fp8, at = 12000`"
            ),
        );
    }
    if list.value.is_empty() {
        cx.error_spanned_by(
            &list.key,
            "`schedule` needs at least one phase: `schedule = [mxfp4 @ 0, fp8 @ 12000]`",
        );
        return None;
    }
    let mut phases = Vec::new();
    let mut complete = true;
    for spec in &list.value {
        let recipe = recipe(&spec.recipe, cx);
        let start = phase_start(&spec.start, cx);
        match (recipe, start) {
            (Some(recipe), Some(start)) => phases.push(Phase { start, recipe }),
            _ => complete = false,
        }
    }
    if !complete {
        return None;
    }
    let errors = check_phases(&phases);
    for e in &errors {
        match e.at {
            PhaseAt::List => cx.error_spanned_by(&list.key, &e.message),
            PhaseAt::Start(i) => cx.error_spanned_by(&list.value[i].start, &e.message),
            PhaseAt::Recipe(i) => cx.error_spanned_by(&list.value[i].recipe.name, &e.message),
        }
    }
    errors.is_empty().then_some(phases)
}

/// A recipe and its options, checked against the recipe table; each error
/// points at the name, key or value it is about.
fn recipe(spec: &RecipeSpec, cx: &Ctxt) -> Option<Recipe> {
    let text: Vec<(String, String)> = spec
        .options
        .iter()
        .map(|o| (o.key.to_string(), o.value.to_string()))
        .collect();
    let pairs: Vec<(&str, &str)> = text.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    match Recipe::from_parts(&spec.name.to_string(), &pairs) {
        Ok(recipe) => Some(recipe),
        Err(errors) => {
            for e in errors {
                match e.at {
                    At::Whole | At::Name => cx.error_spanned_by(&spec.name, e),
                    At::Key(i) => cx.error_spanned_by(&spec.options[i].key, e),
                    At::Value(i) => cx.error_spanned_by(&spec.options[i].value, e),
                }
            }
            None
        }
    }
}

/// An integer literal, as the keys that take iterations and counts need.
enum Int {
    Value(u64),
    Negative,
    TooLarge,
    NotInteger,
    /// `300u8`: its digits. A type suffix has no place in an iteration or a
    /// count, and `300u8` does not even fit its type.
    Suffixed(String),
}

fn int_literal(expr: &Expr) -> Int {
    match expr {
        Expr::Lit(lit) => match &lit.lit {
            Lit::Int(i) if !i.suffix().is_empty() => Int::Suffixed(i.base10_digits().to_string()),
            Lit::Int(i) => i.base10_parse::<u64>().map_or(Int::TooLarge, Int::Value),
            _ => Int::NotInteger,
        },
        Expr::Unary(u) if matches!(u.op, UnOp::Neg(_)) && matches!(*u.expr, Expr::Lit(_)) => {
            Int::Negative
        }
        Expr::Group(g) => int_literal(&g.expr),
        _ => Int::NotInteger,
    }
}

/// The error for an integer with a type suffix.
fn suffix_message(what: &str, digits: &str) -> String {
    format!("{what} takes a plain integer without a type suffix: write `{digits}`")
}

/// `at = N`: N >= 1.
fn switch_at(expr: &Expr, target: Option<&Recipe>, cx: &Ctxt) -> Option<u64> {
    let msg = match int_literal(expr) {
        Int::Value(n) if n >= 1 => return Some(n),
        Int::Value(_) => {
            let to = target.map_or("the new recipe".to_string(), |t| format!("`{t}`"));
            format!(
                "`at = 0` would switch before the first step: `at` is the first iteration \
                 that runs {to} and must be >= 1; to run {to} from the start, make it the \
                 first recipe"
            )
        }
        Int::Negative => "`at` is the iteration of the switch, an integer >= 1, \
                          not a negative number"
            .to_string(),
        Int::TooLarge => "`at` does not fit in a u64 iteration count".to_string(),
        Int::Suffixed(digits) => suffix_message("`at`", &digits),
        Int::NotInteger => "`at` takes an integer literal, the first iteration of the new \
                            recipe: `at = 12000`"
            .to_string(),
    };
    cx.error_spanned_by(expr, msg);
    None
}

/// `layers_per_iter = r`: r >= 0.
fn layers_per_iter(expr: &Expr, cx: &Ctxt) -> Option<u64> {
    let msg = match int_literal(expr) {
        Int::Value(n) => return Some(n),
        Int::Negative => {
            "`layers_per_iter` is a number of plan layers converted per \
                          iteration, >= 0 (0 converts every layer at once), not a negative \
                          number"
        }
        Int::TooLarge => "`layers_per_iter` does not fit in a u64",
        Int::Suffixed(digits) => {
            cx.error_spanned_by(expr, suffix_message("`layers_per_iter`", &digits));
            return None;
        }
        Int::NotInteger => {
            "`layers_per_iter` takes an integer literal, e.g. \
                            `layers_per_iter = 4` (0 converts every layer at once)"
        }
    };
    cx.error_spanned_by(expr, msg);
    None
}

/// `recipe @ start`: start >= 0 (the first must be 0, checked with the order).
fn phase_start(expr: &Expr, cx: &Ctxt) -> Option<u64> {
    match int_literal(expr) {
        Int::Value(n) => Some(n),
        Int::TooLarge => {
            cx.error_spanned_by(expr, "a phase start does not fit in a u64 iteration count");
            None
        }
        Int::Suffixed(digits) => {
            cx.error_spanned_by(expr, suffix_message("a phase start", &digits));
            None
        }
        Int::Negative | Int::NotInteger => {
            cx.error_spanned_by(
                expr,
                "a phase starts at an integer iteration >= 0, e.g. `fp8 @ 12000`",
            );
            None
        }
    }
}

fn resolve_order(value: &TokenTree, cx: &Ctxt) -> Option<Order> {
    match Order::from_name(&value.to_string()) {
        Ok(order) => Some(order),
        Err(msg) => {
            cx.error_spanned_by(value, msg);
            None
        }
    }
}
