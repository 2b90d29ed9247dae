//! `config = "path.ron"`: the schedule read from a RON file at compile time
//! (SPEC section 5). The runtime reads the same format at run time
//! (`mxswitch_runtime::schedule_config`); a proc-macro crate cannot share
//! that code, so the file's shape is mirrored here, as small as it can be.

use std::path::PathBuf;

use serde::Deserialize;
use syn::LitStr;

use crate::symbol;
use crate::valid::{self, Ctxt, OptionError, Phase, Recipe, Schedule};

/// `(phases: [...], layers_per_iter: 0, order: "deep_to_shallow")`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleConfig {
    phases: Vec<PhaseConfig>,
    #[serde(default)]
    layers_per_iter: u64,
    #[serde(default)]
    order: Option<String>,
}

/// `(start: 12000, recipe: "fp8", options: (pow2: true))`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PhaseConfig {
    start: u64,
    recipe: String,
    #[serde(default)]
    options: RecipeOptions,
}

/// The option keys of SPEC section 4; which apply is checked per recipe.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecipeOptions {
    scale: Option<String>,
    sr: Option<bool>,
    hadamard: Option<bool>,
    tile2d: Option<bool>,
    pow2: Option<bool>,
}

impl RecipeOptions {
    /// The options that are set, as `(key, value)` text.
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let flags = [
            ("sr", self.sr),
            ("hadamard", self.hadamard),
            ("tile2d", self.tile2d),
            ("pow2", self.pow2),
        ];
        self.scale
            .iter()
            .map(|s| ("scale", s.clone()))
            .chain(
                flags
                    .into_iter()
                    .filter_map(|(k, v)| v.map(|v| (k, v.to_string()))),
            )
            .collect()
    }
}

/// The directory `config` paths are relative to: the crate's manifest directory.
fn config_root() -> PathBuf {
    std::env::var_os(symbol::CONFIG_ROOT_ENV)
        .or_else(|| std::env::var_os("CARGO_MANIFEST_DIR"))
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// Read and check the schedule file; errors point at the path literal.
pub fn load(lit: &LitStr, cx: &Ctxt) -> Option<Schedule> {
    let rel = lit.value();
    let path = config_root().join(&rel);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) => {
            cx.error_spanned_by(
                lit,
                format!(
                    "cannot read schedule config `{rel}`: {err}; the path is relative to the \
                     directory of the crate's Cargo.toml"
                ),
            );
            return None;
        }
    };
    let options =
        ron::Options::default().with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME);
    let file: ScheduleConfig = match options.from_str(&text) {
        Ok(file) => file,
        Err(err) => {
            cx.error_spanned_by(
                lit,
                format!(
                    "malformed schedule config `{rel}` at line {}, column {}: {}; expected \
                     (phases: [(start: 0, recipe: \"mxfp4\"), (start: 12000, recipe: \"fp8\")], \
                     layers_per_iter: 0, order: \"deep_to_shallow\")",
                    err.position.line, err.position.col, err.code
                ),
            );
            return None;
        }
    };
    match resolve(&file) {
        Ok(mut schedule) => {
            schedule.config = Some(path);
            Some(schedule)
        }
        Err(errors) => {
            for msg in errors {
                cx.error_spanned_by(lit, format!("schedule config `{rel}`: {msg}"));
            }
            None
        }
    }
}

/// The file's meaning, checked with the attribute's own rules.
fn resolve(file: &ScheduleConfig) -> Result<Schedule, Vec<String>> {
    let mut errors = Vec::new();
    let mut phases = Vec::new();
    if file.phases.is_empty() {
        errors.push("`phases` needs at least one phase".to_string());
    }
    for (i, p) in file.phases.iter().enumerate() {
        let at = format!("phase {i} (start {})", p.start);
        match recipe(p) {
            Ok(recipe) => phases.push(Phase {
                start: p.start,
                recipe,
            }),
            Err(msgs) => errors.extend(msgs.into_iter().map(|m| format!("{at}: {m}"))),
        }
    }
    if errors.is_empty() {
        errors.extend(
            valid::phase_errors(&phases)
                .into_iter()
                .map(|e| format!("phase {}: {}", e.index, e.message)),
        );
    }
    let order = match file.order.as_deref() {
        None => Some(&symbol::ORDERS[0]),
        Some(name) => valid::order_name(name).map_err(|m| errors.push(m)).ok(),
    };
    match order {
        Some(order) if errors.is_empty() => Ok(Schedule {
            phases,
            layers_per_iter: file.layers_per_iter,
            order,
            config: None,
        }),
        _ => Err(errors),
    }
}

fn recipe(p: &PhaseConfig) -> Result<Recipe, Vec<String>> {
    let name = valid::recipe_name(&p.recipe).map_err(|m| vec![m])?;
    let mut errors = Vec::new();
    let mut options = Vec::new();
    for (key, value) in p.options.pairs() {
        match valid::recipe_option(name, key, &value) {
            Ok(kv) => options.push(kv),
            Err(OptionError::Key(m) | OptionError::Value(m)) => errors.push(m),
        }
    }
    if errors.is_empty() {
        Ok(Recipe { name, options })
    } else {
        Err(errors)
    }
}
