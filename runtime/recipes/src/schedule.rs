//! Schedules (SPEC section 5): phases, the ramp order, the phase rules, and
//! the RON schedule format. The macro checks `#[precision(...)]` and
//! `config = "..."` files with these functions and the runtime checks RON
//! configs and `Schedule::new` with them, so both apply the same rules.
//!
//! ```text
//! (
//!     phases: [
//!         (start: 0, recipe: "mxfp4", options: (scale: "rceil", sr: true)),
//!         (start: 12000, recipe: "mxfp4", options: (fprop: "bf16")),
//!         (start: 15000, recipe: "fp8"),
//!     ],
//!     layers_per_iter: 0,            // optional, default 0
//!     order: "deep_to_shallow",      // optional, default deep_to_shallow
//! )
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{lookup, named, At, RecipeError, ScheduleError};
use crate::recipe::Recipe;
use crate::table::Opt;

/// Which end of the layer stack a ramp converts first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Order {
    /// The deepest layer first (the default).
    #[default]
    DeepToShallow,
    /// The shallowest layer first.
    ShallowToDeep,
}

impl Order {
    /// Every order; the first is the default.
    pub const ALL: [Order; 2] = [Order::DeepToShallow, Order::ShallowToDeep];

    /// The name schedule files and the attribute use: `deep_to_shallow` or
    /// `shallow_to_deep`.
    pub const fn name(self) -> &'static str {
        match self {
            Order::DeepToShallow => "deep_to_shallow",
            Order::ShallowToDeep => "shallow_to_deep",
        }
    }

    /// Look an order up by [`Order::name`]; an unknown name is an error that
    /// suggests the closest name or lists both.
    pub fn from_name(name: &str) -> Result<Order, RecipeError> {
        lookup(name)
    }
}

named!(Order, "order");

impl fmt::Display for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One phase: from iteration `start` on, `recipe` is the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Phase {
    /// First iteration of the phase.
    pub start: u64,
    /// The recipe the layers convert to from `start` on.
    pub recipe: Recipe,
}

/// Which part of a phase list breaks a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhaseAt {
    /// The list itself (it is empty).
    List,
    /// The start of phase `i`.
    Start(usize),
    /// The recipe of phase `i`.
    Recipe(usize),
}

/// A broken phase rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseError {
    /// Where in the list the rule is broken.
    pub at: PhaseAt,
    /// One line saying which rule is broken and how to fix it.
    pub message: String,
}

/// The rules of a phase list: at least one phase, the first at 0, starts
/// strictly increasing, and each phase's resolved recipe differs from the
/// one before it (SPEC section 4a: a phase that changes nothing is an
/// error). Every broken rule is returned.
pub fn check_phases(phases: &[Phase]) -> Vec<PhaseError> {
    let Some(first) = phases.first() else {
        return vec![PhaseError {
            at: PhaseAt::List,
            message: "a schedule needs at least one phase, the first starting at iteration 0"
                .into(),
        }];
    };
    let mut errors = Vec::new();
    if first.start != 0 {
        errors.push(PhaseError {
            at: PhaseAt::Start(0),
            message: format!(
                "the first phase must start at iteration 0, not {}: start `{}` at 0",
                first.start, first.recipe
            ),
        });
    }
    for (i, w) in phases.windows(2).enumerate() {
        let (prev, next) = (&w[0], &w[1]);
        if next.start <= prev.start {
            errors.push(PhaseError {
                at: PhaseAt::Start(i + 1),
                message: format!(
                    "schedule phases out of order: `{} @ {}` must start after `{} @ {}`; \
                     list phases by increasing iteration",
                    next.recipe, next.start, prev.recipe, prev.start
                ),
            });
        } else if next.recipe == prev.recipe {
            errors.push(PhaseError {
                at: PhaseAt::Recipe(i + 1),
                message: format!(
                    "phase `{} @ {}` resolves to `{}`, the recipe already running; \
                     name a recipe that changes a GEMM, or remove the phase",
                    next.recipe, next.start, prev.recipe
                ),
            });
        }
    }
    errors
}

/// A schedule file, field for field.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// The phases in the order written; [`ScheduleConfig::check`] applies the
    /// phase rules.
    pub phases: Vec<PhaseConfig>,
    /// Plan layers converted per iteration after a switch; 0 converts all at once.
    #[serde(default)]
    pub layers_per_iter: u64,
    /// `deep_to_shallow` or `shallow_to_deep`; `None` is the default order.
    #[serde(default)]
    pub order: Option<String>,
}

/// One phase: from iteration `start` on, `recipe` (a SPEC name) is the target.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseConfig {
    /// First iteration of the phase.
    pub start: u64,
    /// The recipe's SPEC name, e.g. `"mxfp4"`.
    pub recipe: String,
    /// Option values written for the recipe; empty when `options` is left out.
    #[serde(default)]
    pub options: RecipeOptions,
}

/// The option keys of SPEC sections 4 and 4a, one field per [`Opt`]; unset
/// keys keep the recipe's defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RecipeOptions {
    /// `scale`: an MX scale-mode name (`floor`, `ceil`, `even`, `rceil`).
    pub scale: Option<String>,
    /// `sr`: stochastic rounding of the gradient operands (MX and NVFP4 recipes).
    pub sr: Option<bool>,
    /// `hadamard`: Hadamard-16 on both wgrad operands (MX and NVFP4 recipes).
    pub hadamard: Option<bool>,
    /// `tile2d`: block x block weight tiles (MX, NVFP4 and FP8 block recipes).
    pub tile2d: Option<bool>,
    /// `pow2`: power-of-two scales (FP8 recipes: tensorwise, rowwise, block).
    pub pow2: Option<bool>,
    /// `fprop`: the recipe name whose row the forward GEMM uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fprop: Option<String>,
    /// `dgrad`: the recipe name whose row the input-gradient GEMM uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dgrad: Option<String>,
    /// `wgrad`: the recipe name whose row the weight-gradient GEMM uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wgrad: Option<String>,
}

impl RecipeOptions {
    /// The value written for `opt`, as text.
    pub fn get(&self, opt: Opt) -> Option<String> {
        let flag = |b: Option<bool>| b.map(|b| b.to_string());
        match opt {
            Opt::Scale => self.scale.clone(),
            Opt::Sr => flag(self.sr),
            Opt::Hadamard => flag(self.hadamard),
            Opt::Tile2d => flag(self.tile2d),
            Opt::Pow2 => flag(self.pow2),
            Opt::Fprop => self.fprop.clone(),
            Opt::Dgrad => self.dgrad.clone(),
            Opt::Wgrad => self.wgrad.clone(),
        }
    }

    /// The options that are set, as `(key, value)` text in [`Opt::ALL`] order.
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        Opt::ALL
            .into_iter()
            .filter_map(|opt| self.get(opt).map(|v| (opt.name(), v)))
            .collect()
    }
}

impl PhaseConfig {
    /// The phase's recipe; errors carry the key path under this phase
    /// (`recipe`, `options.sr`) as their `path`.
    pub fn recipe(&self) -> Result<Recipe, Vec<ScheduleError>> {
        let pairs = self.options.pairs();
        let options: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Recipe::from_parts(&self.recipe, &options).map_err(|errors| {
            errors
                .into_iter()
                .map(|e| ScheduleError {
                    path: match e.at {
                        At::Whole | At::Name => "recipe".to_string(),
                        At::Key(i) | At::Value(i) => format!("options.{}", pairs[i].0),
                    },
                    message: e.message,
                })
                .collect()
        })
    }
}

/// A schedule that passed every rule: what `Schedule::new` of the runtime
/// and the macro's generated code are built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedSchedule {
    /// The phases, resolved; they pass [`check_phases`].
    pub phases: Vec<Phase>,
    /// Plan layers converted per iteration after a switch; 0 converts all at once.
    pub layers_per_iter: u64,
    /// The ramp order (the default when the file gave none).
    pub order: Order,
}

impl ScheduleConfig {
    /// Parse RON text (see [`ron_options`]).
    pub fn from_ron(text: &str) -> Result<ScheduleConfig, ron::error::SpannedError> {
        ron_options().from_str(text)
    }

    /// Resolve every phase's recipe and check the phase rules and the
    /// order. Every error is returned, each with the key path of its value
    /// (`phases[1].options.fprop`, `phases[2].start`, `order`); phase rules
    /// are checked once every recipe resolved.
    pub fn check(&self) -> Result<CheckedSchedule, Vec<ScheduleError>> {
        let mut errors = Vec::new();
        let mut phases = Vec::with_capacity(self.phases.len());
        for (i, p) in self.phases.iter().enumerate() {
            match p.recipe() {
                Ok(recipe) => phases.push(Phase {
                    start: p.start,
                    recipe,
                }),
                Err(errs) => errors.extend(errs.into_iter().map(|e| ScheduleError {
                    path: format!("phases[{i}].{}", e.path),
                    message: e.message,
                })),
            }
        }
        if errors.is_empty() {
            errors.extend(check_phases(&phases).into_iter().map(|e| ScheduleError {
                path: match e.at {
                    PhaseAt::List => "phases".to_string(),
                    PhaseAt::Start(i) => format!("phases[{i}].start"),
                    PhaseAt::Recipe(i) => format!("phases[{i}].recipe"),
                },
                message: e.message,
            }));
        }
        let order = match self.order.as_deref() {
            None => Order::default(),
            Some(name) => Order::from_name(name).unwrap_or_else(|e| {
                errors.push(ScheduleError {
                    path: "order".into(),
                    message: e.message,
                });
                Order::default()
            }),
        };
        if errors.is_empty() {
            Ok(CheckedSchedule {
                phases,
                layers_per_iter: self.layers_per_iter,
                order,
            })
        } else {
            Err(errors)
        }
    }
}

/// How schedule files are read: `implicit_some` lets optional keys be
/// written `sr: true`, not `sr: Some(true)`.
pub fn ron_options() -> ron::Options {
    ron::Options::default().with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME)
}
