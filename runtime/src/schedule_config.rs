//! RON schedule files read at run time (SPEC section 5): a config or the
//! command line may move switches, change the ramp and set recipe options.
//!
//! ```text
//! (
//!     phases: [
//!         (start: 0, recipe: "mxfp4", options: (scale: "rceil", sr: true)),
//!         (start: 12000, recipe: "fp8"),
//!     ],
//!     layers_per_iter: 0,            // optional, default 0
//!     order: "deep_to_shallow",      // optional, default deep_to_shallow
//! )
//! ```
//!
//! `#[precision(config = "...")]` reads the same format at compile time with
//! its own copy of these structs (a proc-macro crate cannot share code with
//! the runtime). Whether a schedule names only a model's compiled-in recipes
//! is checked by [`crate::plan::check_schedule`].

use serde::{Deserialize, Serialize};

use crate::recipe::{Recipe, RecipeKind};
use crate::schedule::{Order, Phase, Schedule};
use crate::{Error, Result};

/// A schedule file, field for field.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
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
    pub start: u64,
    pub recipe: String,
    #[serde(default)]
    pub options: RecipeOptions,
}

/// The recipe options of SPEC section 4; unset keys keep the recipe's defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RecipeOptions {
    pub scale: Option<String>,
    pub sr: Option<bool>,
    pub hadamard: Option<bool>,
    pub tile2d: Option<bool>,
    pub pow2: Option<bool>,
}

impl ScheduleConfig {
    /// Parse RON text. A syntax error, an unknown key or a value of the wrong
    /// type names its line and column.
    pub fn from_ron(text: &str) -> Result<Self> {
        // `implicit_some` lets optional keys be written `sr: true`, not `sr: Some(true)`.
        ron::Options::default()
            .with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME)
            .from_str(text)
            .map_err(|e| {
                Error::InvalidOption(format!(
                    "schedule config, line {}, column {}: {}",
                    e.position.line, e.position.col, e.code
                ))
            })
    }

    /// The checked schedule: known recipes, options that apply to them, and
    /// phases in order with the first at 0.
    pub fn to_schedule(&self) -> Result<Schedule> {
        let phases = self
            .phases
            .iter()
            .enumerate()
            .map(|(i, p)| {
                p.recipe().map_err(|e| {
                    Error::InvalidOption(format!(
                        "schedule config, phase {i} (start {}): {}",
                        p.start,
                        reason(e)
                    ))
                })
            })
            .collect::<Result<Vec<Phase>>>()?;
        let order = match &self.order {
            Some(name) => Order::from_name(name)?,
            None => Order::default(),
        };
        Schedule::new(phases, self.layers_per_iter, order)
    }
}

impl PhaseConfig {
    fn recipe(&self) -> Result<Phase> {
        let mut recipe = Recipe::new(RecipeKind::from_name(&self.recipe)?);
        let o = &self.options;
        if let Some(scale) = &o.scale {
            recipe = recipe.with_option("scale", scale)?;
        }
        for (key, value) in [
            ("sr", o.sr),
            ("hadamard", o.hadamard),
            ("tile2d", o.tile2d),
            ("pow2", o.pow2),
        ] {
            if let Some(value) = value {
                recipe = recipe.with_option(key, if value { "true" } else { "false" })?;
            }
        }
        Ok(Phase {
            start: self.start,
            recipe,
        })
    }
}

/// The message of an error, without the variant's own prefix.
fn reason(e: Error) -> String {
    match e {
        Error::InvalidOption(msg) => msg,
        other => other.to_string(),
    }
}

/// Parse and check a RON schedule file's text.
pub fn schedule_from_ron(text: &str) -> Result<Schedule> {
    ScheduleConfig::from_ron(text)?.to_schedule()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::ScaleMode;

    #[test]
    fn parses_the_spec_example() {
        let s = schedule_from_ron(
            r#"(phases: [(start: 0, recipe: "mxfp4"), (start: 12000, recipe: "fp8")], layers_per_iter: 0, order: "deep_to_shallow")"#,
        )
        .unwrap();
        assert_eq!(s.phases().len(), 2);
        assert_eq!(s.phases()[1].start, 12000);
        assert_eq!(s.phases()[1].recipe, Recipe::new(RecipeKind::Fp8));
        assert_eq!(s.order, Order::DeepToShallow);
    }

    #[test]
    fn options_and_defaults() {
        let s = schedule_from_ron(
            r#"(phases: [(start: 0, recipe: "mxfp4", options: (scale: "rceil", sr: true)), (start: 5, recipe: "fp8", options: (pow2: true))], layers_per_iter: 4, order: "shallow_to_deep")"#,
        )
        .unwrap();
        let mx = s.phases()[0].recipe;
        assert_eq!(
            (mx.scale, mx.sr, mx.hadamard),
            (ScaleMode::Rceil, true, true)
        );
        assert!(s.phases()[1].recipe.pow2);
        assert_eq!((s.layers_per_iter, s.order), (4, Order::ShallowToDeep));
    }

    #[test]
    fn errors_name_the_position_or_the_phase() {
        let e = schedule_from_ron("(phases: [(start: 0, recipe: \"mxfp4\")],\n bogus: 1)")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2, column"), "{e}");
        let e =
            schedule_from_ron(r#"(phases: [(start: 0, recipe: "mxfp4", options: (pow2: true))])"#)
                .unwrap_err()
                .to_string();
        assert!(e.contains("phase 0") && e.contains("does not apply"), "{e}");
        let e = schedule_from_ron(r#"(phases: [(start: 0, recipe: "mxfp5")])"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown recipe `mxfp5`"), "{e}");
        let e = schedule_from_ron(
            r#"(phases: [(start: 0, recipe: "fp8"), (start: 0, recipe: "bf16")])"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("out of order"), "{e}");
    }
}
