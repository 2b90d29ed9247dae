//! The layer plan (SPEC section 6): every quantized linear of a model, in
//! order, grouped by plan layer, plus the extras outside the layer stack.
//!
//! `#[precision]` implements [`Planned`] for annotated structs (a visitor
//! over their `#[quantize]` and `#[layers]` fields) and [`PrecisionModel`]
//! for the root; the functions here do the rest, so generated code stays small.

use crate::recipe::{Recipe, RecipeKind};
use crate::schedule::{Schedule, SwitchReport};
use crate::{Error, Result};

/// What the plan needs of a quantized linear: its current recipe.
pub trait PlanLinear {
    fn recipe(&self) -> Recipe;
    fn set_recipe(&mut self, recipe: Recipe);
    /// Told on every apply where the linear sits (its path and index in the
    /// plan) and the iteration: a linear uses them to name errors and to key
    /// stochastic rounding. The default ignores them.
    fn set_position(&mut self, _site: &LinearSite, _index: usize, _iteration: u64) {}
}

/// Where a linear sits in the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinearSite {
    /// Dotted path, e.g. `double_blocks.3.img_qkv`.
    pub path: String,
    /// Plan layer index (shallow to deep), or `None` for an extra.
    pub layer: Option<usize>,
}

/// The walk state of a plan visitor: the path so far and the layer numbering.
#[derive(Clone, Debug, Default)]
pub struct PlanCx {
    prefix: String,
    layer: Option<usize>,
    next_layer: usize,
}

impl PlanCx {
    /// The site of field `name` under the current prefix.
    pub fn site(&self, name: &str) -> LinearSite {
        LinearSite {
            path: self.join(name),
            layer: self.layer,
        }
    }

    fn join(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// Run `f` inside field `name` (a nested annotated struct).
    pub fn field<R>(&mut self, name: &str, f: impl FnOnce(&mut PlanCx) -> R) -> R {
        let inner = self.join(name);
        let saved = std::mem::replace(&mut self.prefix, inner);
        let r = f(self);
        self.prefix = saved;
        r
    }

    /// Run `f` inside element `index` of the `#[layers]` field `name`: the
    /// element becomes the next plan layer.
    pub fn layer<R>(&mut self, name: &str, index: usize, f: impl FnOnce(&mut PlanCx) -> R) -> R {
        let inner = format!("{}.{index}", self.join(name));
        let saved_prefix = std::mem::replace(&mut self.prefix, inner);
        let saved_layer = self.layer.replace(self.next_layer);
        self.next_layer += 1;
        let r = f(self);
        self.prefix = saved_prefix;
        self.layer = saved_layer;
        r
    }
}

/// Implemented by `#[precision]` and `#[precision(layer)]` structs.
pub trait Planned {
    /// Whether the type can hold a quantized linear at all; the root's
    /// compile-time check of an empty plan reads this.
    const CAN_HOLD_LINEARS: bool;
    fn visit_linears(&self, cx: &mut PlanCx, f: &mut dyn FnMut(LinearSite, &dyn PlanLinear));
    fn visit_linears_mut(
        &mut self,
        cx: &mut PlanCx,
        f: &mut dyn FnMut(LinearSite, &mut dyn PlanLinear),
    );
}

/// Implemented by the root `#[precision(...)]` struct.
pub trait PrecisionModel: Planned {
    /// The recipes the attribute names, whose code is compiled in.
    const RECIPES: &'static [RecipeKind];
    /// The schedule written in the attribute (or its RON file).
    fn compiled_schedule() -> Schedule;
}

impl<T: Planned> Planned for Vec<T> {
    const CAN_HOLD_LINEARS: bool = T::CAN_HOLD_LINEARS;
    fn visit_linears(&self, cx: &mut PlanCx, f: &mut dyn FnMut(LinearSite, &dyn PlanLinear)) {
        self.iter().for_each(|t| t.visit_linears(cx, f));
    }
    fn visit_linears_mut(
        &mut self,
        cx: &mut PlanCx,
        f: &mut dyn FnMut(LinearSite, &mut dyn PlanLinear),
    ) {
        self.iter_mut().for_each(|t| t.visit_linears_mut(cx, f));
    }
}

impl<T: Planned> Planned for Option<T> {
    const CAN_HOLD_LINEARS: bool = T::CAN_HOLD_LINEARS;
    fn visit_linears(&self, cx: &mut PlanCx, f: &mut dyn FnMut(LinearSite, &dyn PlanLinear)) {
        if let Some(t) = self {
            t.visit_linears(cx, f)
        }
    }
    fn visit_linears_mut(
        &mut self,
        cx: &mut PlanCx,
        f: &mut dyn FnMut(LinearSite, &mut dyn PlanLinear),
    ) {
        if let Some(t) = self {
            t.visit_linears_mut(cx, f)
        }
    }
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
        model.visit_linears(&mut PlanCx::default(), &mut |site, _| match site.layer {
            Some(l) => {
                if plan.layers.len() <= l {
                    plan.layers.resize(l + 1, Vec::new());
                }
                plan.layers[l].push(site.path);
            }
            None => plan.extras.push(site.path),
        });
        plan
    }

    /// Number of plan layers (L).
    pub fn len(&self) -> usize {
        self.layers.len()
    }

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
            return Err(Error::InvalidOption(format!(
                "the precision plan of `{model}` has no quantized linear (for example a depth of 0); \
                 give the model at least one layer instead of training it silently in high precision"
            )));
        }
        Ok(())
    }
}

/// Check that a schedule only names recipes compiled into model `M`.
pub fn check_schedule<M: PrecisionModel>(schedule: &Schedule) -> Result<()> {
    for kind in schedule.recipe_kinds() {
        if !M::RECIPES.contains(&kind) {
            let compiled: Vec<&str> = M::RECIPES.iter().map(|r| r.name()).collect();
            return Err(Error::InvalidOption(format!(
                "recipe `{kind}` is not compiled into this model: its #[precision] attribute names only {}; \
                 add `{kind}` to the attribute's schedule to use it",
                compiled.join(", ")
            )));
        }
    }
    Ok(())
}

/// Assign every linear its recipe at `iteration`, absolutely (SPEC section 5).
/// Touches nothing but the recipes.
pub fn apply_schedule<M: PrecisionModel>(
    model: &mut M,
    schedule: &Schedule,
    iteration: u64,
) -> Result<SwitchReport> {
    check_schedule::<M>(schedule)?;
    let plan = Plan::of(model);
    let a = schedule.assign(iteration, plan.len());
    let current = schedule.phases()[a.phase].recipe;
    let (mut changed, mut on_current, mut index) = (0, 0, 0);
    model.visit_linears_mut(&mut PlanCx::default(), &mut |site, lin| {
        lin.set_position(&site, index, iteration);
        index += 1;
        let r = match site.layer {
            Some(l) => a.layers[l],
            None => a.extras,
        };
        if lin.recipe() != r {
            lin.set_recipe(r);
            changed += 1;
        }
        on_current += (r == current) as usize;
    });
    Ok(SwitchReport {
        iteration,
        recipe: current,
        layers_converted: a.layers.iter().filter(|r| **r == current).count(),
        layers_total: plan.len(),
        linears_converted: on_current,
        linears_total: plan.linears(),
        changed,
    })
}
