//! RON schedule files read at run time (SPEC section 5): a config or the
//! command line may move switches, change the ramp and set recipe options,
//! per-GEMM ones included.
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
//!
//! The format and its rules are `mxswitch_recipes`', which
//! `#[precision(config = "...")]` reads at compile time too, so both accept
//! the same files. Whether a schedule names only the recipes a model's
//! attribute allows is checked by [`crate::plan::check_schedule`].

pub use mxswitch_recipes::{PhaseConfig, RecipeOptions, ScheduleConfig};

use crate::ron_span::{Position, RonSource};
use crate::schedule::Schedule;
use crate::{Error, Result};

/// A [`ScheduleConfig`] checked into a [`Schedule`].
pub trait ToSchedule {
    /// The checked schedule: known recipes, options that apply to them, and
    /// the phase rules. Errors name the field (`phases[1].recipe`) but no
    /// position: see [`Self::to_schedule_in`].
    fn to_schedule(&self) -> Result<Schedule>;

    /// As [`Self::to_schedule`], for a schedule parsed from `src` at key path
    /// `at` (`schedule` inside a run config, `""` for a schedule file):
    /// errors start with the bad value's `origin:line:column`.
    fn to_schedule_in(&self, src: &RonSource, at: &str) -> Result<Schedule>;
}

impl ToSchedule for ScheduleConfig {
    fn to_schedule(&self) -> Result<Schedule> {
        resolve(self, None)
    }

    fn to_schedule_in(&self, src: &RonSource, at: &str) -> Result<Schedule> {
        resolve(self, Some((src, at)))
    }
}

/// The first error of the config, placed in its text when there is one.
fn resolve(cfg: &ScheduleConfig, src: Option<(&RonSource, &str)>) -> Result<Schedule> {
    let checked = cfg.check().map_err(|errors| {
        let Some(e) = errors.into_iter().next() else {
            return Error::Config(format!("{SCHEDULE_CONFIG}: rejected"));
        };
        Error::Config(match src {
            Some((src, at)) => {
                let path = join_path(at, &e.path);
                format!("{}: {path}: {}", src.place(&path), e.message)
            }
            None => format!("{SCHEDULE_CONFIG}: {e}"),
        })
    })?;
    Schedule::new(checked.phases, checked.layers_per_iter, checked.order)
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

/// Parse and check a RON schedule file's text; errors name their line and column.
pub fn schedule_from_ron(text: &str) -> Result<Schedule> {
    let src = RonSource::unnamed(SCHEDULE_CONFIG, text);
    ScheduleConfig::from_ron(text)
        .map_err(|e| syntax_error(&src, &e))?
        .to_schedule_in(&src, "")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::ScaleMode;
    use crate::recipe::{Gemm, Recipe, RecipeKind};
    use crate::schedule::Order;

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

    /// SPEC section 4a in a schedule file: per-GEMM options, and the phase
    /// rules the attribute applies (a phase that changes nothing is refused).
    #[test]
    fn per_gemm_options_and_the_attribute_rules() {
        let s = schedule_from_ron(
            r#"(phases: [(start: 0, recipe: "mxfp4"), (start: 40, recipe: "mxfp4", options: (fprop: "bf16")), (start: 80, recipe: "mxfp4", options: (dgrad: "fp8", wgrad: "fp8"))])"#,
        )
        .unwrap();
        let late = s.phases()[1].recipe;
        assert_eq!(late.to_string(), "mxfp4(fprop = bf16)");
        assert_eq!(late.gemm_kind(Gemm::Fprop), RecipeKind::Bf16);
        assert_eq!(late.saved_bytes_per_element(), 0.53125);
        assert_eq!(
            s.phases()[2].recipe.to_string(),
            "mxfp4(dgrad = fp8, wgrad = fp8)"
        );
        assert_eq!(s.phases()[2].recipe.saved_bytes_per_element(), 1.0);

        let cases = [
            (
                "(phases: [(start: 0, recipe: \"mxfp4\"),\n (start: 100, recipe: \"mxfp4\", options: (scale: \"even\"))])",
                "schedule config, line 2, column 15: phases[1].recipe: phase `mxfp4 @ 100` resolves to `mxfp4`, the recipe already running",
            ),
            (
                "(phases: [(start: 0, recipe: \"mxfp4\",\n options: (fprop: \"mxfp4\"))])",
                "schedule config, line 2, column 12: phases[0].options.fprop: `fprop = mxfp4` changes nothing",
            ),
            (
                "(phases: [(start: 0, recipe: \"fp8\",\n options: (wgrad: \"mxfp9\"))])",
                "schedule config, line 2, column 12: phases[0].options.wgrad: option `wgrad` takes a recipe name: unknown recipe `mxfp9`",
            ),
        ];
        for (text, want) in cases {
            let e = schedule_from_ron(text).unwrap_err().to_string();
            assert!(e.starts_with(want), "{text}: {e}");
        }
        // The same schedule built in code is refused alike.
        let mx = Recipe::new(RecipeKind::Mxfp4);
        let even = mx.with_option("scale", "even").unwrap();
        let phases = vec![
            crate::schedule::Phase {
                start: 0,
                recipe: mx,
            },
            crate::schedule::Phase {
                start: 100,
                recipe: even,
            },
        ];
        let e = Schedule::new(phases, 0, Order::default()).unwrap_err();
        assert!(e.to_string().contains("the recipe already running"), "{e}");
    }
}
