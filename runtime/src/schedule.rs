//! Precision schedules (SPEC section 5): which recipe each plan layer runs
//! at an iteration. Everything here is a pure function of (iteration,
//! schedule), so every rank decides alike and a resumed run needs no state.

use std::fmt;

use crate::recipe::{Recipe, RecipeKind};
use crate::{Error, Result};

/// Which end of the layer stack a ramp converts first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Order {
    /// The deepest layer first (the default).
    #[default]
    DeepToShallow,
    ShallowToDeep,
}

impl Order {
    pub const fn name(self) -> &'static str {
        match self {
            Order::DeepToShallow => "deep_to_shallow",
            Order::ShallowToDeep => "shallow_to_deep",
        }
    }

    pub fn from_name(s: &str) -> Result<Self> {
        match s {
            "deep_to_shallow" => Ok(Order::DeepToShallow),
            "shallow_to_deep" => Ok(Order::ShallowToDeep),
            _ => Err(Error::InvalidOption(format!(
                "unknown order `{s}`; expected deep_to_shallow or shallow_to_deep"
            ))),
        }
    }
}

/// One phase: from iteration `start` on, `recipe` is the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Phase {
    pub start: u64,
    pub recipe: Recipe,
}

/// A validated schedule: phases with strictly increasing starts, the first at 0.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Schedule {
    phases: Vec<Phase>,
    /// Plan layers converted per iteration after a switch; 0 converts all at once.
    pub layers_per_iter: u64,
    pub order: Order,
}

impl Schedule {
    /// Check and build a schedule.
    pub fn new(phases: Vec<Phase>, layers_per_iter: u64, order: Order) -> Result<Self> {
        let Some(first) = phases.first() else {
            return Err(Error::InvalidOption(
                "a schedule needs at least one phase".into(),
            ));
        };
        if first.start != 0 {
            return Err(Error::InvalidOption(format!(
                "the first phase must start at iteration 0, not {}",
                first.start
            )));
        }
        for w in phases.windows(2) {
            if w[1].start <= w[0].start {
                return Err(Error::InvalidOption(format!(
                    "schedule phases out of order: `{} @ {}` must start after `{} @ {}`",
                    w[1].recipe, w[1].start, w[0].recipe, w[0].start
                )));
            }
        }
        Ok(Schedule {
            phases,
            layers_per_iter,
            order,
        })
    }

    /// A single recipe for the whole run.
    pub fn constant(recipe: Recipe) -> Self {
        Schedule {
            phases: vec![Phase { start: 0, recipe }],
            layers_per_iter: 0,
            order: Order::default(),
        }
    }

    pub fn phases(&self) -> &[Phase] {
        &self.phases
    }

    /// Every recipe kind the schedule can run, in phase order, without repeats.
    pub fn recipe_kinds(&self) -> Vec<RecipeKind> {
        let mut v: Vec<RecipeKind> = Vec::new();
        for p in &self.phases {
            if !v.contains(&p.recipe.kind) {
                v.push(p.recipe.kind);
            }
        }
        v
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

    /// The recipe of every plan layer at `iteration`, plus the recipe of the
    /// extras (linears outside the layer stack, which flip with the first
    /// conversion of a phase). Assigned absolutely: a pure function.
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
        let k = if idx == 0 {
            plan_len
        } else {
            self.converted(&current, iteration, plan_len)
        };
        let mut layers = vec![previous.recipe; plan_len];
        for pos in 0..k {
            let layer = match self.order {
                Order::DeepToShallow => plan_len - 1 - pos,
                Order::ShallowToDeep => pos,
            };
            layers[layer] = current.recipe;
        }
        let extras = if k > 0 || plan_len == 0 {
            current.recipe
        } else {
            previous.recipe
        };
        Assignment {
            iteration,
            phase: idx,
            layers,
            extras,
            converted: if idx == 0 { 0 } else { k },
        }
    }
}

/// The outcome of [`Schedule::assign`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    pub iteration: u64,
    /// Index of the phase in force.
    pub phase: usize,
    /// Recipe of each plan layer, shallow to deep.
    pub layers: Vec<Recipe>,
    /// Recipe of the extras.
    pub extras: Recipe,
    /// Plan layers converted to the current phase (0 in the first phase).
    pub converted: usize,
}

/// What an `apply(iteration)` did, in the words of SPEC section 6.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwitchReport {
    pub iteration: u64,
    /// The recipe of the phase in force.
    pub recipe: Recipe,
    /// Plan layers (k of L) running the phase's recipe.
    pub layers_converted: usize,
    pub layers_total: usize,
    /// Quantized linears (m of M) running the phase's recipe.
    pub linears_converted: usize,
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
        a.layers.iter().filter(|r| r.kind == kind).count()
    }

    #[test]
    fn nothing_before_n_everything_at_n() {
        let s = mx_to_fp8(12000, 0);
        assert_eq!(count(&s.assign(11999, 57), RecipeKind::Fp8), 0);
        assert_eq!(s.assign(11999, 57).extras.kind, RecipeKind::Mxfp4);
        assert_eq!(count(&s.assign(12000, 57), RecipeKind::Fp8), 57);
        assert_eq!(s.assign(12000, 57).extras.kind, RecipeKind::Fp8);
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
        assert!(a.layers[53..].iter().all(|r| r.kind == RecipeKind::Fp8));
        assert!(a.layers[..53].iter().all(|r| r.kind == RecipeKind::Mxfp4));
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
}
