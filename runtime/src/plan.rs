//! The layer plan (SPEC section 6): every quantized linear of a model, in
//! order, grouped by plan layer, plus the extras outside the layer stack.
//!
//! `#[precision]` implements [`Planned`] for annotated structs (a visitor
//! over their `#[quantize]` and `#[layers]` fields) and [`PrecisionModel`]
//! for the root (its schedule as a `static`, and the recipes it names); the
//! functions here do the rest, so generated code stays small.
//!
//! Every recipe's code is compiled into the runtime, whatever a model's
//! attribute says: [`PrecisionModel::RECIPES`] is an allow-list, checked by
//! [`check_schedule`] whenever a schedule other than the attribute's own is
//! applied or loaded. A walk allocates nothing (a site's path is spelled out
//! only when asked), so `apply` between switches allocates nothing either.

use std::fmt::{self, Write as _};

use crate::module::Parameters;
use crate::recipe::{Gemm, Recipe, RecipeKind};
use crate::schedule::{Schedule, SwitchReport};
use crate::{Error, Result};

/// What the plan needs of a quantized linear: its current recipe, its place
/// in the plan, and how often it ran.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a quantized linear, so the precision plan cannot switch it",
    label = "`#[quantize]` and `#[high_precision]` mark a `QuantLinear` field",
    note = "a linear that always stays in high precision, such as `Dense`, takes no mark"
)]
pub trait PlanLinear: Parameters {
    /// The recipe it runs now; `None` until a plan placed it.
    fn recipe(&self) -> Option<Recipe>;
    /// Run `recipe` from the next forward on.
    fn set_recipe(&mut self, recipe: Recipe);
    /// Told on every apply where the linear sits (its path and index in the
    /// plan) and the iteration: a linear uses them to name errors and to key
    /// stochastic rounding. The default ignores them.
    fn set_position(&mut self, _site: &LinearSite<'_>, _index: usize, _iteration: u64) {}
    /// How many forward calls it has run under a recipe, so warm-up can name
    /// a linear the model's forward never reaches.
    fn runs(&self) -> u64;
    /// The run's seed, for stochastic rounding (SPEC section 2). The default
    /// ignores it.
    fn set_seed(&mut self, _seed: u64) {}
}

/// A `#[precision(layer)]` struct: the only kind of element `#[layers]` and
/// `#[layer]` accept. A root model is not one (its schedule would be lost
/// under another root), and neither is a `Vec` or an `Option`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a `#[precision(layer)]` struct, so it cannot be a plan layer",
    label = "`#[layers]` and `#[layer]` hold structs marked `#[precision(layer)]`",
    note = "mark the block struct `#[precision(layer)]` (a generic block type `T` needs the bound `T: PlanLayer`, from `mxswitch::prelude`); a root `#[precision(...)]` model cannot nest inside another; nested collections are one flat `Vec`; a layer that may be absent is left out of the `Vec`, not held as an `Option`"
)]
pub trait PlanLayer: Planned + Parameters {}

/// One step of a walk's path: a field, or an element of a `#[layers]` field.
#[derive(Clone, Copy)]
struct Segment<'a> {
    parent: Option<&'a Segment<'a>>,
    name: &'a str,
    index: Option<usize>,
}

impl Segment<'_> {
    fn write(&self, w: &mut dyn fmt::Write) -> fmt::Result {
        if let Some(parent) = self.parent {
            parent.write(w)?;
            w.write_char('.')?;
        }
        w.write_str(self.name)?;
        match self.index {
            Some(i) => write!(w, ".{i}"),
            None => Ok(()),
        }
    }
}

/// Where a linear sits in the plan. It borrows the walk's path instead of
/// owning a copy, so visiting a plan allocates nothing; [`Display`]
/// (`double_blocks.3.img_qkv`), [`LinearSite::path`] and
/// [`LinearSite::path_is`] spell it out.
///
/// [`Display`]: fmt::Display
#[derive(Clone, Copy)]
pub struct LinearSite<'a> {
    prefix: Option<&'a Segment<'a>>,
    name: &'a str,
    /// Plan layer index (shallow to deep), or `None` for an extra.
    pub layer: Option<usize>,
}

impl<'a> LinearSite<'a> {
    /// A site from its whole dotted path, for linears placed by hand.
    pub fn new(path: &'a str, layer: Option<usize>) -> Self {
        LinearSite {
            prefix: None,
            name: path,
            layer,
        }
    }

    /// The dotted path, e.g. `double_blocks.3.img_qkv` (allocates).
    pub fn path(&self) -> String {
        self.to_string()
    }

    /// Whether the dotted path is `path`, compared piece by piece without
    /// allocating.
    pub fn path_is(&self, path: &str) -> bool {
        /// Consumes `rest` while what is written matches it.
        struct Match<'s> {
            rest: &'s str,
        }
        impl fmt::Write for Match<'_> {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                self.rest = self.rest.strip_prefix(s).ok_or(fmt::Error)?;
                Ok(())
            }
        }
        let mut m = Match { rest: path };
        write!(m, "{self}").is_ok() && m.rest.is_empty()
    }
}

impl fmt::Display for LinearSite<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(prefix) = self.prefix {
            prefix.write(f)?;
            f.write_char('.')?;
        }
        f.write_str(self.name)
    }
}

impl fmt::Debug for LinearSite<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinearSite")
            .field("path", &format_args!("{self}"))
            .field("layer", &self.layer)
            .finish()
    }
}

/// The walk state of a plan visitor: the path so far (a chain of segments
/// on the stack) and the layer numbering.
pub struct PlanCx<'a> {
    prefix: Option<&'a Segment<'a>>,
    layer: Option<usize>,
    next_layer: &'a mut usize,
}

impl PlanCx<'_> {
    /// Run `f` with the state of a walk from a model's root.
    pub fn root<R>(f: impl FnOnce(&mut PlanCx<'_>) -> R) -> R {
        let mut next_layer = 0;
        f(&mut PlanCx {
            prefix: None,
            layer: None,
            next_layer: &mut next_layer,
        })
    }

    /// The site of field `name` under the current prefix.
    pub fn site<'s>(&'s self, name: &'s str) -> LinearSite<'s> {
        LinearSite {
            prefix: self.prefix,
            name,
            layer: self.layer,
        }
    }

    fn enter<R>(
        &mut self,
        segment: Segment<'_>,
        layer: Option<usize>,
        f: impl FnOnce(&mut PlanCx<'_>) -> R,
    ) -> R {
        f(&mut PlanCx {
            prefix: Some(&segment),
            layer,
            next_layer: &mut *self.next_layer,
        })
    }

    /// Run `f` inside field `name` (a nested annotated struct).
    pub fn field<R>(&mut self, name: &str, f: impl FnOnce(&mut PlanCx<'_>) -> R) -> R {
        let segment = Segment {
            parent: self.prefix,
            name,
            index: None,
        };
        let layer = self.layer;
        self.enter(segment, layer, f)
    }

    /// Run `f` inside the `#[layer]` field `name`: the struct it holds
    /// becomes the next plan layer.
    pub fn single_layer<R>(&mut self, name: &str, f: impl FnOnce(&mut PlanCx<'_>) -> R) -> R {
        let segment = Segment {
            parent: self.prefix,
            name,
            index: None,
        };
        let layer = *self.next_layer;
        *self.next_layer += 1;
        self.enter(segment, Some(layer), f)
    }

    /// Run `f` inside element `index` of the `#[layers]` field `name`: the
    /// element becomes the next plan layer.
    pub fn layer<R>(
        &mut self,
        name: &str,
        index: usize,
        f: impl FnOnce(&mut PlanCx<'_>) -> R,
    ) -> R {
        let segment = Segment {
            parent: self.prefix,
            name,
            index: Some(index),
        };
        let layer = *self.next_layer;
        *self.next_layer += 1;
        self.enter(segment, Some(layer), f)
    }
}

/// Implemented by `#[precision]` and `#[precision(layer)]` structs.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a `#[precision]` or `#[precision(layer)]` struct",
    note = "mark the struct `#[precision(layer)]` for a plan layer, or `#[precision(<recipe>, ..)]` for the root model"
)]
pub trait Planned {
    /// Whether the type can hold a quantized linear at all; the root's
    /// compile-time check of an empty plan reads this.
    const CAN_HOLD_LINEARS: bool;
    /// Calls `f` for every quantized linear, in plan order, with its site.
    fn visit_linears(
        &self,
        cx: &mut PlanCx<'_>,
        f: &mut dyn FnMut(LinearSite<'_>, &dyn PlanLinear),
    );
    /// As [`Planned::visit_linears`], mutably: how `apply` sets recipes.
    fn visit_linears_mut(
        &mut self,
        cx: &mut PlanCx<'_>,
        f: &mut dyn FnMut(LinearSite<'_>, &mut dyn PlanLinear),
    );
    /// Calls `f` for every `#[high_precision]` linear: outside the plan,
    /// they run BF16 whatever the schedule says.
    fn visit_high_precision_mut(&mut self, _f: &mut dyn FnMut(&mut dyn PlanLinear)) {}
}

/// Implemented by the root `#[precision(...)]` struct.
pub trait PrecisionModel: Planned {
    /// The recipe kinds the attribute names: the allow-list of every
    /// schedule this model may run. All recipes' code is compiled in; this
    /// list is what [`check_schedule`] holds a run-time schedule to.
    const RECIPES: &'static [RecipeKind];
    /// The schedule written in the attribute (or its RON file), validated
    /// at compile time and held in a `static`: every call returns the same
    /// value, built once.
    fn schedule() -> &'static Schedule;
}

/// The plan of a model instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Linear paths of each plan layer, shallow to deep.
    pub layers: Vec<Vec<String>>,
    /// Linears outside the layer stack.
    pub extras: Vec<String>,
}

impl Plan {
    /// Walk a model and collect its plan.
    pub fn of<M: Planned + ?Sized>(model: &M) -> Plan {
        let mut plan = Plan::default();
        PlanCx::root(|cx| {
            model.visit_linears(cx, &mut |site, _| match site.layer {
                Some(l) => {
                    if plan.layers.len() <= l {
                        plan.layers.resize(l + 1, Vec::new());
                    }
                    plan.layers[l].push(site.path());
                }
                None => plan.extras.push(site.path()),
            })
        });
        plan
    }

    /// Number of plan layers (L).
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether the plan holds no quantized linear at all.
    pub fn is_empty(&self) -> bool {
        self.linears() == 0
    }

    /// Number of quantized linears (M).
    pub fn linears(&self) -> usize {
        self.layers.iter().map(Vec::len).sum::<usize>() + self.extras.len()
    }

    /// The error for an instantiated plan without a single quantized linear.
    pub fn check_not_empty(&self, model: &str) -> Result<()> {
        if self.is_empty() {
            return Err(Error::Plan(format!(
                "the precision plan of `{model}` has no quantized linear (for example a depth of 0); \
                 give the model at least one layer instead of training it silently in high precision"
            )));
        }
        Ok(())
    }
}

/// Give every quantized linear of `model` the run's seed, which keys its
/// stochastic rounding with its plan index and the iteration.
pub fn seed_linears<M: Planned + ?Sized>(model: &mut M, seed: u64) {
    PlanCx::root(|cx| model.visit_linears_mut(cx, &mut |_, lin| lin.set_seed(seed)));
}

/// The plan's size (L layers, M linears) without collecting its paths.
fn plan_size<M: Planned + ?Sized>(model: &M) -> (usize, usize) {
    let (mut layers, mut linears) = (0, 0);
    PlanCx::root(|cx| {
        model.visit_linears(cx, &mut |site, _| {
            linears += 1;
            if let Some(l) = site.layer {
                layers = layers.max(l + 1);
            }
        })
    });
    (layers, linears)
}

/// Check that a schedule names only recipes of model `M`'s attribute (the
/// allow-list [`PrecisionModel::RECIPES`]), per-GEMM overrides included;
/// allocates only for the error.
pub fn check_schedule<M: PrecisionModel + ?Sized>(schedule: &Schedule) -> Result<()> {
    // The base recipe and every GEMM's (a per-GEMM override names another).
    let named = |r: Recipe| {
        let gemms = Gemm::ALL.into_iter().map(move |g| r.gemm_kind(g));
        std::iter::once(r.kind).chain(gemms)
    };
    let Some(kind) = schedule
        .phases()
        .iter()
        .flat_map(|p| named(p.recipe))
        .find(|k| !M::RECIPES.contains(k))
    else {
        return Ok(());
    };
    let allowed: Vec<&str> = M::RECIPES.iter().map(|r| r.name()).collect();
    Err(Error::Plan(format!(
        "recipe `{kind}` is not allowed for this model: its #[precision] attribute names only {} \
         (every recipe is compiled in; the attribute lists those a schedule may use); \
         add `{kind}` to the attribute's schedule to use it",
        allowed.join(", ")
    )))
}

/// Assign every linear its recipe at `iteration` under `schedule`, after
/// checking the schedule against `M`'s allow-list (SPEC section 5).
/// Touches nothing but the recipes.
pub fn apply_schedule<M: PrecisionModel + ?Sized>(
    model: &mut M,
    schedule: &Schedule,
    iteration: u64,
) -> Result<SwitchReport> {
    check_schedule::<M>(schedule)?;
    Ok(assign_recipes(model, schedule, iteration))
}

/// [`apply_schedule`] under the model's own [`PrecisionModel::schedule`],
/// which needs no check: its recipes are the allow-list.
pub fn apply_attribute_schedule<M: PrecisionModel + ?Sized>(
    model: &mut M,
    iteration: u64,
) -> SwitchReport {
    debug_assert!(check_schedule::<M>(M::schedule()).is_ok());
    assign_recipes(model, M::schedule(), iteration)
}

/// The walk of an apply: absolute, so a pure function of the iteration, and
/// without an allocation (the report holds only counts and a `Copy` recipe).
fn assign_recipes<M: Planned + ?Sized>(
    model: &mut M,
    schedule: &Schedule,
    iteration: u64,
) -> SwitchReport {
    let (layers_total, linears_total) = plan_size(model);
    let a = schedule.assign(iteration, layers_total);
    let (mut changed, mut on_current, mut index) = (0, 0, 0);
    let bf16 = Recipe::new(RecipeKind::Bf16);
    model.visit_high_precision_mut(&mut |lin| {
        if lin.recipe() != Some(bf16) {
            lin.set_recipe(bf16);
        }
    });
    PlanCx::root(|cx| {
        model.visit_linears_mut(cx, &mut |site, lin| {
            lin.set_position(&site, index, iteration);
            index += 1;
            let r = match site.layer {
                Some(l) => a.layer(l),
                None => a.extras(),
            };
            if lin.recipe() != Some(r) {
                lin.set_recipe(r);
                changed += 1;
            }
            on_current += (r == a.recipe) as usize;
        })
    });
    SwitchReport {
        iteration,
        recipe: a.recipe,
        layers_converted: a.layers().filter(|r| *r == a.recipe).count(),
        layers_total,
        linears_converted: on_current,
        linears_total,
        changed,
    }
}

/// The recipe one quantized linear runs now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinearRecipe {
    /// Plan path, e.g. `blocks.3.fc1`.
    pub path: String,
    /// Plan layer, or `None` for an extra.
    pub layer: Option<usize>,
    /// `None` for a linear no schedule has placed yet.
    pub recipe: Option<Recipe>,
}

/// Which recipe every quantized linear of a model runs now, in plan order
/// (the root's `recipes()`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecipeReport {
    /// One entry per quantized linear.
    pub linears: Vec<LinearRecipe>,
}

impl RecipeReport {
    /// Walk a model and read each linear's recipe.
    pub fn of<M: Planned + ?Sized>(model: &M) -> RecipeReport {
        let mut linears = Vec::new();
        PlanCx::root(|cx| {
            model.visit_linears(cx, &mut |site, lin| {
                linears.push(LinearRecipe {
                    path: site.path(),
                    layer: site.layer,
                    recipe: lin.recipe(),
                })
            })
        });
        RecipeReport { linears }
    }

    /// The recipe of the linear at `path`, if the plan has one there.
    pub fn linear(&self, path: &str) -> Option<Option<Recipe>> {
        self.linears
            .iter()
            .find(|l| l.path == path)
            .map(|l| l.recipe)
    }

    /// The recipe plan layer `layer` runs, when all its linears agree.
    pub fn layer(&self, layer: usize) -> Option<Recipe> {
        let mut of_layer = self.linears.iter().filter(|l| l.layer == Some(layer));
        let first = of_layer.next()?.recipe?;
        of_layer.all(|l| l.recipe == Some(first)).then_some(first)
    }
}

impl fmt::Display for RecipeReport {
    /// One line per linear: `blocks.3.fc1 (layer 3): mxfp4`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, l) in self.linears.iter().enumerate() {
            if i > 0 {
                f.write_char('\n')?;
            }
            match l.layer {
                Some(layer) => write!(f, "{} (layer {layer}): ", l.path)?,
                None => write!(f, "{} (extra): ", l.path)?,
            }
            match l.recipe {
                Some(r) => write!(f, "{r}")?,
                None => f.write_str("no recipe yet")?,
            }
        }
        Ok(())
    }
}

/// Compile-time questions about a field's type, for the checks the macro
/// generates on unmarked fields: `<Probe<T>>::PLAN_LINEAR` is `true` when
/// `T` is a quantized linear (an inherent constant, found first), and the
/// [`NotPlanned`] default `false` otherwise. For a type that depends on a
/// generic parameter the answer is always `false`, so those fields are left
/// to the run-time error of a linear without a recipe.
#[doc(hidden)]
pub struct Probe<T: ?Sized>(std::marker::PhantomData<T>);

/// The `false` answers of [`Probe`].
#[doc(hidden)]
pub trait NotPlanned {
    /// Not a quantized linear.
    const PLAN_LINEAR: bool = false;
    /// Not a `#[precision(layer)]` struct.
    const PLAN_LAYER: bool = false;
    /// Not a `Vec` of `#[precision(layer)]` structs.
    const PLAN_LAYERS: bool = false;
}

impl<T: ?Sized> NotPlanned for Probe<T> {}

impl<T: PlanLinear + ?Sized> Probe<T> {
    /// A quantized linear.
    pub const PLAN_LINEAR: bool = true;
}

impl<T: PlanLayer> Probe<T> {
    /// A `#[precision(layer)]` struct.
    pub const PLAN_LAYER: bool = true;
}

impl<T: PlanLayer> Probe<Vec<T>> {
    /// A `Vec` of `#[precision(layer)]` structs.
    pub const PLAN_LAYERS: bool = true;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sites_spell_their_path_from_the_walk() {
        let (mut seen, mut layers) = (Vec::new(), Vec::new());
        PlanCx::root(|cx| {
            let extra = cx.site("img_in");
            seen.push(extra.path());
            layers.push(extra.layer);
            cx.layer("blocks", 3, |cx| {
                cx.field("attn", |cx| {
                    let s = cx.site("qkv");
                    assert!(s.path_is("blocks.3.attn.qkv"));
                    assert!(!s.path_is("blocks.3.attn.qk"));
                    assert!(!s.path_is("blocks.3.attn.qkvx"));
                    assert!(!s.path_is("blocks.30.attn.qkv"));
                    seen.push(s.path());
                    layers.push(s.layer);
                })
            });
            cx.layer("blocks", 4, |cx| {
                seen.push(cx.site("proj").to_string());
                layers.push(cx.site("proj").layer);
            });
        });
        assert_eq!(seen, ["img_in", "blocks.3.attn.qkv", "blocks.4.proj"]);
        assert_eq!(layers, [None, Some(0), Some(1)]);
    }

    #[test]
    fn a_site_by_hand_is_its_whole_path() {
        let s = LinearSite::new("double_blocks.3.img_qkv", Some(3));
        assert!(s.path_is("double_blocks.3.img_qkv"));
        assert_eq!(
            format!("{s:?}"),
            "LinearSite { path: double_blocks.3.img_qkv, layer: Some(3) }"
        );
    }
}
