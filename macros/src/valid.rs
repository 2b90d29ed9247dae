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

use crate::ast::{Input, Keyed, PhaseSpec, PrecisionAttr, RecipeSpec};
use crate::config;
use crate::symbol::{self, Family, Named, OptionKey, RecipeName, Takes};

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

/// The closest candidate to a misspelt `word`, if one is close enough to be
/// what was meant (Levenshtein distance at most 2 and less than the word).
pub fn suggest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::levenshtein(word, c), c))
        .filter(|&(d, _)| d <= 2 && d < word.len())
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// What an annotated struct is, once checked.
pub enum Role {
    /// `#[precision(layer)]`: one plan layer.
    Layer,
    /// The root model and its schedule.
    Root(Schedule),
}

/// A checked schedule (SPEC section 5): phases with strictly increasing
/// starts, the first at 0.
pub struct Schedule {
    pub phases: Vec<Phase>,
    pub layers_per_iter: u64,
    pub order: &'static Named,
    /// The RON file the schedule came from, to rebuild when it changes.
    pub config: Option<PathBuf>,
}

pub struct Phase {
    pub start: u64,
    pub recipe: Recipe,
}

/// A recipe with the options written for it, in the order of
/// [`symbol::OPTIONS`]; options left out keep the runtime's defaults.
#[derive(PartialEq, Eq)]
pub struct Recipe {
    pub name: &'static RecipeName,
    pub options: Vec<(&'static OptionKey, OptionValue)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum OptionValue {
    Bool(bool),
    Scale(&'static Named),
}

impl fmt::Display for Recipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name.name)?;
        if self.options.is_empty() {
            return Ok(());
        }
        let opts: Vec<String> = self
            .options
            .iter()
            .map(|(k, v)| match v {
                OptionValue::Bool(b) => format!("{} = {b}", k.name),
                OptionValue::Scale(s) => format!("{} = {}", k.name, s.name),
            })
            .collect();
        write!(f, "({})", opts.join(", "))
    }
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
            self.order.name
        )
    }
}

/// Look a recipe up by name, suggesting the closest on a typo.
pub fn recipe_name(name: &str) -> Result<&'static RecipeName, String> {
    if let Some(r) = symbol::RECIPES.iter().find(|r| r.name == name) {
        return Ok(r);
    }
    let names = symbol::RECIPES.map(|r| r.name);
    Err(match suggest(name, names) {
        Some(near) => format!("unknown recipe `{name}`; did you mean `{near}`?"),
        None => format!(
            "unknown recipe `{name}`; expected one of {}",
            names.join(", ")
        ),
    })
}

/// Whether an option error is about its key or its value (where the caret goes).
pub enum OptionError {
    Key(String),
    Value(String),
}

/// Check `key = value` against the recipe it is written on (SPEC section 4).
pub fn recipe_option(
    recipe: &RecipeName,
    key: &str,
    value: &str,
) -> Result<(&'static OptionKey, OptionValue), OptionError> {
    let Some(opt) = symbol::OPTIONS.iter().find(|o| o.name == key) else {
        let own: Vec<&str> = symbol::OPTIONS
            .iter()
            .filter(|o| o.family == recipe.family)
            .map(|o| o.name)
            .collect();
        let hint = match suggest(key, symbol::OPTIONS.iter().map(|o| o.name)) {
            Some(near) => format!("; did you mean `{near}`?"),
            None => String::new(),
        };
        let takes = if own.is_empty() {
            format!("recipe `{}` takes no options", recipe.name)
        } else {
            format!("recipe `{}` takes {}", recipe.name, own.join(", "))
        };
        return Err(OptionError::Key(format!(
            "unknown recipe option `{key}`{hint} {takes}"
        )));
    };
    if opt.family != recipe.family {
        let takes = match recipe.family {
            Family::Bf16 => "; bf16 takes no options".to_string(),
            _ => String::new(),
        };
        return Err(OptionError::Key(format!(
            "option `{key}` does not apply to recipe `{}`: it applies to {}{takes}",
            recipe.name,
            opt.family.describe()
        )));
    }
    let parsed = match opt.takes {
        Takes::Bool => match value {
            "true" => Some(OptionValue::Bool(true)),
            "false" => Some(OptionValue::Bool(false)),
            _ => None,
        },
        Takes::Scale => symbol::SCALE_MODES
            .iter()
            .find(|s| s.name == value)
            .map(OptionValue::Scale),
    };
    parsed.map(|v| (opt, v)).ok_or_else(|| {
        OptionError::Value(match opt.takes {
            Takes::Bool => format!("option `{key}` takes true or false, not `{value}`"),
            Takes::Scale => format!(
                "option `{key}` takes {}, not `{value}`",
                symbol::SCALE_MODES.map(|s| s.name).join(", ")
            ),
        })
    })
}

/// Look a ramp order up by name.
pub fn order_name(name: &str) -> Result<&'static Named, String> {
    symbol::ORDERS
        .iter()
        .find(|o| o.name == name)
        .ok_or_else(|| {
            format!(
                "unknown order `{name}`; expected {}",
                symbol::ORDERS.map(|o| o.name).join(" or ")
            )
        })
}

/// A rule broken by phase `index` of a schedule.
pub struct PhaseError {
    pub index: usize,
    /// Whether the start (else the recipe) is at fault.
    pub start: bool,
    pub message: String,
}

/// The first phase starts at 0, starts increase strictly, and each phase
/// changes the recipe.
pub fn phase_errors(phases: &[Phase]) -> Vec<PhaseError> {
    let mut errors = Vec::new();
    if let Some(first) = phases.first() {
        if first.start != 0 {
            errors.push(PhaseError {
                index: 0,
                start: true,
                message: format!(
                    "the first phase must start at iteration 0: write `{} @ 0`",
                    first.recipe
                ),
            });
        }
    }
    for (i, w) in phases.windows(2).enumerate() {
        let (prev, next) = (&w[0], &w[1]);
        if next.start <= prev.start {
            errors.push(PhaseError {
                index: i + 1,
                start: true,
                message: format!(
                    "schedule phases out of order: `{} @ {}` must start after `{} @ {}`; \
                     list phases by increasing iteration",
                    next.recipe, next.start, prev.recipe, prev.start
                ),
            });
        } else if next.recipe == prev.recipe {
            errors.push(PhaseError {
                index: i + 1,
                start: false,
                message: format!(
                    "phase `{} @ {}` switches to `{}`, the recipe already running; \
                     name a different recipe or remove the phase",
                    next.recipe, next.start, prev.recipe
                ),
            });
        }
    }
    errors
}

/// Check the attribute against the struct; `None` when something is wrong
/// (every error is recorded in `cx`).
pub fn check(attr: &PrecisionAttr, input: &Input, cx: &Ctxt) -> Option<Role> {
    check_marks(input, cx);
    if let Some(layer) = &attr.layer {
        reject_schedule_on_layer(attr, layer, cx);
        return Some(Role::Layer);
    }
    if let Some(config) = &attr.config {
        reject_besides_config(attr, cx);
        return config::load(&config.value, cx).map(Role::Root);
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
        None => Some(&symbol::ORDERS[0]),
    };
    let phases = phases?;
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
    Some(Role::Root(Schedule {
        phases,
        layers_per_iter: layers_per_iter?,
        order: order?,
        config: None,
    }))
}

/// Every mark is well formed (done in `attr.rs`) and at least one field is marked.
fn check_marks(input: &Input, cx: &Ctxt) {
    if input.fields.iter().all(|f| f.mark.is_none()) {
        let name = input.ident;
        cx.error_spanned_by(
            name,
            format!(
                "`{name}` has no quantized linear: mark a linear field #[quantize] \
                 or a Vec of layer structs #[layers]"
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
    extra.extend(
        keys_of(attr)
            .into_iter()
            .filter(|k| k.to_token_stream().to_string() != symbol::CONFIG),
    );
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
                    cx.error_spanned_by(
                        &to.value.name,
                        format!(
                            "`switch_to = {target}` switches to the recipe the model starts \
                             with; name a different recipe (for example `fp8`) or remove \
                             `switch_to` and `at`"
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
    let errors = phase_errors(&phases);
    for e in &errors {
        let spec = &list.value[e.index];
        if e.start {
            cx.error_spanned_by(&spec.start, &e.message);
        } else {
            cx.error_spanned_by(&spec.recipe.name, &e.message);
        }
    }
    errors.is_empty().then_some(phases)
}

/// A recipe and its options.
fn recipe(spec: &RecipeSpec, cx: &Ctxt) -> Option<Recipe> {
    let name = match recipe_name(&spec.name.to_string()) {
        Ok(name) => name,
        Err(msg) => {
            cx.error_spanned_by(&spec.name, msg);
            return None;
        }
    };
    let mut options: Vec<(&'static OptionKey, OptionValue)> = Vec::new();
    let mut ok = true;
    for opt in &spec.options {
        let key = opt.key.to_string();
        match recipe_option(name, &key, &opt.value.to_string()) {
            Ok((k, _)) if options.iter().any(|(seen, _)| *seen == k) => {
                cx.error_spanned_by(
                    &opt.key,
                    format!("duplicate option `{key}`: it is already set; remove one of them"),
                );
                ok = false;
            }
            Ok(kv) => options.push(kv),
            Err(OptionError::Key(msg)) => {
                cx.error_spanned_by(&opt.key, msg);
                ok = false;
            }
            Err(OptionError::Value(msg)) => {
                cx.error_spanned_by(&opt.value, msg);
                ok = false;
            }
        }
    }
    options.sort_by_key(|(k, _)| symbol::OPTIONS.iter().position(|o| o == *k));
    ok.then_some(Recipe { name, options })
}

/// An integer literal, as the keys that take iterations and counts need.
enum Int {
    Value(u64),
    Negative,
    TooLarge,
    NotInteger,
}

fn int_literal(expr: &Expr) -> Int {
    match expr {
        Expr::Lit(lit) => match &lit.lit {
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
        Int::Negative | Int::NotInteger => {
            cx.error_spanned_by(
                expr,
                "a phase starts at an integer iteration >= 0, e.g. `fp8 @ 12000`",
            );
            None
        }
    }
}

fn resolve_order(value: &TokenTree, cx: &Ctxt) -> Option<&'static Named> {
    match order_name(&value.to_string()) {
        Ok(order) => Some(order),
        Err(msg) => {
            cx.error_spanned_by(value, msg);
            None
        }
    }
}
