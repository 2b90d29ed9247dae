//! Precision schedules (SPEC section 5): which recipe each plan layer runs
//! at an iteration. Everything here is a pure function of (iteration,
//! schedule), so every rank decides alike and a resumed run needs no state.

use std::borrow::Cow;
use std::fmt;

use crate::recipe::Recipe;
use crate::{Error, Result};

/// The ramp order and the phase are the recipe table's, so the macro and
/// the runtime name and check them alike.
pub use mxswitch_recipes::{Order, Phase};

/// A validated schedule: phases with strictly increasing starts, the first at 0.
///
/// The phases are borrowed for a schedule `#[precision]` emits as a `static`
/// (so cloning it copies a pointer) and owned for one built at run time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Schedule {
    phases: Cow<'static, [Phase]>,
    /// Plan layers converted per iteration after a switch; 0 converts all at once.
    pub layers_per_iter: u64,
    /// Which end of the layer stack a ramp converts first.
    pub order: Order,
}

impl Schedule {
    /// Check and build a schedule.
    pub fn new(phases: Vec<Phase>, layers_per_iter: u64, order: Order) -> Result<Self> {
        // The attribute's rules (`mxswitch_recipes::check_phases`): at least
        // one phase, the first at 0, increasing starts, each phase a change.
        if let Some(e) = mxswitch_recipes::check_phases(&phases).into_iter().next() {
            return Err(Error::InvalidOption(e.message));
        }
        Ok(Schedule {
            phases: Cow::Owned(phases),
            layers_per_iter,
            order,
        })
    }

    /// The schedule of a `#[precision]` attribute, as the `static` its
    /// generated code holds. Not checked here: the macro validated these
    /// phases at compile time with the rules of [`Schedule::new`].
    #[doc(hidden)]
    pub const fn from_attribute(
        phases: &'static [Phase],
        layers_per_iter: u64,
        order: Order,
    ) -> Self {
        Schedule {
            phases: Cow::Borrowed(phases),
            layers_per_iter,
            order,
        }
    }

    /// A single recipe for the whole run.
    pub fn constant(recipe: Recipe) -> Self {
        Schedule {
            phases: Cow::Owned(vec![Phase { start: 0, recipe }]),
            layers_per_iter: 0,
            order: Order::default(),
        }
    }

    /// The phases, first (start 0) to last, starts strictly increasing.
    pub fn phases(&self) -> &[Phase] {
        &self.phases
    }

    /// Index of the phase in force at `iteration` (the last whose start is <= it).
    fn phase_index(&self, iteration: u64) -> usize {
        self.phases
            .iter()
            .rposition(|p| p.start <= iteration)
            .unwrap_or(0)
    }

    /// Number of plan layers converted to phase `p` at `iteration`, out of
    /// `plan_len`: 0 before its start, then min(plan_len, (i - N + 1) * r).
    fn converted(&self, p: &Phase, iteration: u64, plan_len: usize) -> usize {
        if iteration < p.start {
            0
        } else if self.layers_per_iter == 0 {
            plan_len
        } else {
            let steps = iteration - p.start + 1;
            steps
                .saturating_mul(self.layers_per_iter)
                .min(plan_len as u64) as usize
        }
    }

    /// Which recipe every plan layer and the extras (linears outside the
    /// layer stack, which flip with the first conversion of a phase) run at
    /// `iteration`, for a plan of `plan_len` layers. Assigned absolutely: a
    /// pure function, and a closed form, so it allocates nothing.
    pub fn assign(&self, iteration: u64, plan_len: usize) -> Assignment {
        let idx = self.phase_index(iteration);
        let current = self.phases[idx];
        let previous = if idx == 0 {
            current
        } else {
            self.phases[idx - 1]
        };
        // During a ramp the layers not yet converted keep the previous phase's
        // recipe; a ramp that is still running when the next phase starts is
        // cut short (the earlier phase is complete by then, by definition).
        let converted = if idx == 0 {
            0
        } else {
            self.converted(&current, iteration, plan_len)
        };
        Assignment {
            iteration,
            phase: idx,
            recipe: current.recipe,
            previous: previous.recipe,
            converted,
            plan_len,
            order: self.order,
        }
    }
}

/// The outcome of [`Schedule::assign`]: the first `converted` layers in
/// `order` run `recipe`, the rest `previous`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// The iteration this assignment is for.
    pub iteration: u64,
    /// Index of the phase in force.
    pub phase: usize,
    /// The recipe of the phase in force.
    pub recipe: Recipe,
    /// The recipe of the layers not yet converted: the previous phase's
    /// (in the first phase, `recipe` itself).
    pub previous: Recipe,
    /// Plan layers converted to the current phase (0 in the first phase).
    pub converted: usize,
    /// Number of plan layers (L).
    pub plan_len: usize,
    /// The schedule's ramp order, which decides which layers count as converted.
    pub order: Order,
}

impl Assignment {
    /// The recipe of plan layer `layer` (shallow to deep); panics past the plan.
    pub fn layer(&self, layer: usize) -> Recipe {
        assert!(
            layer < self.plan_len,
            "plan layer {layer} of a plan of {}",
            self.plan_len
        );
        let pos = match self.order {
            Order::DeepToShallow => self.plan_len - 1 - layer,
            Order::ShallowToDeep => layer,
        };
        if pos < self.converted {
            self.recipe
        } else {
            self.previous
        }
    }

    /// The recipe of each plan layer, shallow to deep.
    pub fn layers(&self) -> impl ExactSizeIterator<Item = Recipe> + '_ {
        (0..self.plan_len).map(|l| self.layer(l))
    }

    /// The recipe of the extras: the phase's once its first layers convert
    /// (at once when the plan has no layer stack).
    pub fn extras(&self) -> Recipe {
        if self.converted > 0 || self.plan_len == 0 {
            self.recipe
        } else {
            self.previous
        }
    }
}

/// What an `apply(iteration)` did, in the words of SPEC section 6.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwitchReport {
    /// The iteration `apply` was called with.
    pub iteration: u64,
    /// The recipe of the phase in force.
    pub recipe: Recipe,
    /// Plan layers (k of L) running the phase's recipe.
    pub layers_converted: usize,
    /// Plan layers in the model (L).
    pub layers_total: usize,
    /// Quantized linears (m of M) running the phase's recipe.
    pub linears_converted: usize,
    /// Quantized linears in the model (M), extras included.
    pub linears_total: usize,
    /// Linears whose recipe this apply changed (0 when it was a no-op).
    pub changed: usize,
}

impl fmt::Display for SwitchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} layers ({}/{} linears) now {} at iteration {}",
            self.layers_converted,
            self.layers_total,
            self.linears_converted,
            self.linears_total,
            self.recipe,
            self.iteration
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::RecipeKind;

    fn mx_to_fp8(at: u64, rate: u64) -> Schedule {
        Schedule::new(
            vec![
                Phase {
                    start: 0,
                    recipe: Recipe::new(RecipeKind::Mxfp4),
                },
                Phase {
                    start: at,
                    recipe: Recipe::new(RecipeKind::Fp8),
                },
            ],
            rate,
            Order::DeepToShallow,
        )
        .unwrap()
    }

    fn count(a: &Assignment, kind: RecipeKind) -> usize {
        a.layers().filter(|r| r.kind == kind).count()
    }

    #[test]
    fn nothing_before_n_everything_at_n() {
        let s = mx_to_fp8(12000, 0);
        assert_eq!(count(&s.assign(11999, 57), RecipeKind::Fp8), 0);
        assert_eq!(s.assign(11999, 57).extras().kind, RecipeKind::Mxfp4);
        assert_eq!(count(&s.assign(12000, 57), RecipeKind::Fp8), 57);
        assert_eq!(s.assign(12000, 57).extras().kind, RecipeKind::Fp8);
    }

    #[test]
    fn ramp_of_four_over_57_layers() {
        let s = mx_to_fp8(600, 4);
        for (it, want) in [
            (599, 0),
            (600, 4),
            (601, 8),
            (613, 56),
            (614, 57),
            (10_000, 57),
        ] {
            assert_eq!(
                count(&s.assign(it, 57), RecipeKind::Fp8),
                want,
                "iteration {it}"
            );
        }
        // Deep to shallow: the last four layers go first.
        let a = s.assign(600, 57);
        let kinds: Vec<RecipeKind> = a.layers().map(|r| r.kind).collect();
        assert!(kinds[53..].iter().all(|k| *k == RecipeKind::Fp8));
        assert!(kinds[..53].iter().all(|k| *k == RecipeKind::Mxfp4));
    }

    #[test]
    fn out_of_order_phases_are_rejected() {
        let r = Recipe::new(RecipeKind::Bf16);
        assert!(Schedule::new(
            vec![
                Phase {
                    start: 0,
                    recipe: r
                },
                Phase {
                    start: 0,
                    recipe: r
                }
            ],
            0,
            Order::default()
        )
        .is_err());
        assert!(Schedule::new(
            vec![Phase {
                start: 5,
                recipe: r
            }],
            0,
            Order::default()
        )
        .is_err());
        assert!(Schedule::new(vec![], 0, Order::default()).is_err());
    }

    #[test]
    fn a_ramp_cut_short_by_the_next_phase_leaves_the_rest_on_the_phase_before() {
        let r = |kind| Recipe::new(kind);
        let s = Schedule::new(
            vec![
                Phase {
                    start: 0,
                    recipe: r(RecipeKind::Mxfp4),
                },
                Phase {
                    start: 10,
                    recipe: r(RecipeKind::Fp8),
                },
                Phase {
                    start: 12,
                    recipe: r(RecipeKind::Bf16),
                },
            ],
            1,
            Order::DeepToShallow,
        )
        .unwrap();
        let kinds = |it| -> Vec<RecipeKind> { s.assign(it, 5).layers().map(|r| r.kind).collect() };
        use RecipeKind::{Bf16, Fp8, Mxfp4};
        assert_eq!(kinds(9), [Mxfp4; 5]);
        assert_eq!(kinds(11), [Mxfp4, Mxfp4, Mxfp4, Fp8, Fp8]);
        assert_eq!(kinds(12), [Fp8, Fp8, Fp8, Fp8, Bf16]);
        assert_eq!(s.assign(12, 5).extras().kind, Bf16);
        assert_eq!(s.assign(9, 5).converted, 0);
        assert_eq!(s.assign(100, 5).converted, 5);
    }

    #[test]
    fn extras_of_a_plan_without_layers_follow_the_phase_at_once() {
        let s = mx_to_fp8(600, 4);
        assert_eq!(s.assign(599, 0).extras().kind, RecipeKind::Mxfp4);
        assert_eq!(s.assign(600, 0).extras().kind, RecipeKind::Fp8);
        assert_eq!(s.assign(600, 0).layers().len(), 0);
    }

    #[test]
    #[should_panic(expected = "plan layer 57 of a plan of 57")]
    fn a_layer_past_the_plan_panics() {
        mx_to_fp8(600, 4).assign(600, 57).layer(57);
    }
}
