//! `config = "path.ron"`: the schedule read from a RON file at compile time
//! (SPEC section 5). The format, its parser and its rules are
//! `mxswitch_recipes`', which the runtime reads configs with too, so a file
//! this accepts is one the runtime accepts, and the other way round.

use std::path::PathBuf;

use mxswitch_recipes::ScheduleConfig;
use syn::LitStr;

use crate::symbol;
use crate::valid::{Ctxt, Schedule};

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
    let file = match ScheduleConfig::from_ron(&text) {
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
    match file.check() {
        Ok(checked) => Some(Schedule {
            phases: checked.phases,
            layers_per_iter: checked.layers_per_iter,
            order: checked.order,
            config: Some(path),
            allow: Vec::new(),
        }),
        Err(errors) => {
            for e in errors {
                cx.error_spanned_by(lit, format!("schedule config `{rel}`: {e}"));
            }
            None
        }
    }
}
