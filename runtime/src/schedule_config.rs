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
use crate::ron_span::{Position, RonSource};
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
            .map_err(|e| syntax_error(&RonSource::unnamed(SCHEDULE_CONFIG, text), &e))
    }

    /// The checked schedule: known recipes, options that apply to them, and
    /// phases in order with the first at 0. Errors name the field
    /// (`phases[1].recipe`) but no position: see [`Self::to_schedule_in`].
    pub fn to_schedule(&self) -> Result<Schedule> {
        self.resolve(None)
    }

    /// As [`Self::to_schedule`], for a schedule parsed from `src` at key path
    /// `at` (`schedule` inside a run config, `""` for a schedule file):
    /// errors start with the bad value's `origin:line:column`.
    pub fn to_schedule_in(&self, src: &RonSource, at: &str) -> Result<Schedule> {
        self.resolve(Some((src, at)))
    }

    fn resolve(&self, src: Option<(&RonSource, &str)>) -> Result<Schedule> {
        let fail = |field: String, e: Error| {
            let reason = reason(e);
            Error::Config(match src {
                Some((src, at)) => {
                    let path = join_path(at, &field);
                    format!("{}: {path}: {reason}", src.place(&path))
                }
                None => format!("{SCHEDULE_CONFIG}: {field}: {reason}"),
            })
        };
        let mut phases = Vec::with_capacity(self.phases.len());
        for (i, p) in self.phases.iter().enumerate() {
            let phase = p
                .recipe()
                .map_err(|(key, e)| fail(format!("phases[{i}].{key}"), e))?;
            phases.push(phase);
        }
        let order = match &self.order {
            Some(name) => Order::from_name(name).map_err(|e| fail("order".into(), e))?,
            None => Order::default(),
        };
        let misplaced = misplaced_phase(&phases);
        Schedule::new(phases, self.layers_per_iter, order).map_err(|e| fail(misplaced, e))
    }
}

/// How errors name a schedule text that came without a file name.
const SCHEDULE_CONFIG: &str = "schedule config";

/// A RON parse error in the text of `src`, at the parser's position.
pub fn syntax_error(src: &RonSource, e: &ron::error::SpannedError) -> Error {
    let pos = Position {
        line: e.position.line,
        column: e.position.col,
    };
    Error::Config(format!("{}: {}", src.place_of(pos), e.code))
}

/// `at.field`, or `field` at the root.
fn join_path(at: &str, field: &str) -> String {
    if at.is_empty() {
        field.to_string()
    } else {
        format!("{at}.{field}")
    }
}

/// The start that [`Schedule::new`] rejects in `phases`, as a key path, so
/// that its error can point there.
fn misplaced_phase(phases: &[Phase]) -> String {
    match phases.first() {
        None => "phases".into(),
        Some(first) if first.start != 0 => "phases[0].start".into(),
        Some(_) => phases
            .windows(2)
            .position(|w| w[1].start <= w[0].start)
            .map_or("phases".into(), |i| format!("phases[{}].start", i + 1)),
    }
}

impl PhaseConfig {
    /// The phase, or the key (`recipe`, `options.sr`) whose value is wrong.
    fn recipe(&self) -> std::result::Result<Phase, (&'static str, Error)> {
        let kind = RecipeKind::from_name(&self.recipe).map_err(|e| ("recipe", e))?;
        let mut recipe = Recipe::new(kind);
        let o = &self.options;
        if let Some(scale) = &o.scale {
            recipe = recipe
                .with_option("scale", scale)
                .map_err(|e| ("options.scale", e))?;
        }
        for (key, path, value) in [
            ("sr", "options.sr", o.sr),
            ("hadamard", "options.hadamard", o.hadamard),
            ("tile2d", "options.tile2d", o.tile2d),
            ("pow2", "options.pow2", o.pow2),
        ] {
            if let Some(value) = value {
                recipe = recipe
                    .with_option(key, if value { "true" } else { "false" })
                    .map_err(|e| (path, e))?;
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
        Error::InvalidOption(msg) | Error::Config(msg) => msg,
        other => other.to_string(),
    }
}

/// Parse and check a RON schedule file's text; errors name their line and column.
pub fn schedule_from_ron(text: &str) -> Result<Schedule> {
    ScheduleConfig::from_ron(text)?.to_schedule_in(&RonSource::unnamed(SCHEDULE_CONFIG, text), "")
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
    fn errors_name_the_position_and_the_field() {
        let e = schedule_from_ron("(phases: [(start: 0, recipe: \"mxfp4\")],\n bogus: 1)")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("schedule config, line 2, column"), "{e}");
        let e =
            schedule_from_ron("(phases: [(start: 0, recipe: \"mxfp4\",\n options: (pow2: true))])")
                .unwrap_err()
                .to_string();
        assert!(
            e.starts_with("schedule config, line 2, column 12: phases[0].options.pow2: ")
                && e.contains("does not apply"),
            "{e}"
        );
        let e = schedule_from_ron(r#"(phases: [(start: 0, recipe: "mxfp5")])"#)
            .unwrap_err()
            .to_string();
        let want = "schedule config, line 1, column 22: phases[0].recipe: unknown recipe `mxfp5`";
        assert!(e.starts_with(want), "{e}");
        // Without the text there is no position, but still the field.
        let e = ScheduleConfig::from_ron(
            r#"(phases: [(start: 0, recipe: "fp8"), (start: 0, recipe: "bf16")])"#,
        )
        .unwrap()
        .to_schedule()
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("schedule config: phases[1].start: ") && e.contains("out of order"),
            "{e}"
        );
    }

    /// Each kind of schedule error in a run config points at its value.
    #[test]
    fn errors_in_a_run_config_name_file_line_and_column() {
        let run = |schedule: &str| {
            let text = format!("(\n  model: (),\n  schedule: {schedule},\n)");
            let cfg = ScheduleConfig::from_ron(schedule).unwrap();
            cfg.to_schedule_in(&RonSource::named("run.ron", &text), "schedule")
                .unwrap_err()
                .to_string()
        };
        let cases = [
            (
                r#"(phases: [(start: 0, recipe: "mxfp4"), (start: 5, recipe: "fp9")])"#,
                "run.ron:3:63: schedule.phases[1].recipe: unknown recipe `fp9`",
            ),
            (
                r#"(phases: [(start: 0, recipe: "fp8", options: (sr: true))])"#,
                "run.ron:3:59: schedule.phases[0].options.sr: option `sr` does not apply",
            ),
            (
                r#"(phases: [(start: 0, recipe: "fp8"), (start: 0, recipe: "bf16")])"#,
                "run.ron:3:51: schedule.phases[1].start: schedule phases out of order",
            ),
            (
                r#"(phases: [(start: 3, recipe: "fp8")])"#,
                "run.ron:3:24: schedule.phases[0].start: the first phase must start at iteration 0",
            ),
            (
                r#"(phases: [(start: 0, recipe: "fp8")], order: "deep")"#,
                "run.ron:3:51: schedule.order: unknown order `deep`",
            ),
            (
                r#"(phases: [])"#,
                "run.ron:3:14: schedule.phases: a schedule needs at least one phase",
            ),
        ];
        for (schedule, want) in cases {
            let e = run(schedule);
            assert!(e.starts_with(want), "{schedule}: {e}");
        }
    }
}
