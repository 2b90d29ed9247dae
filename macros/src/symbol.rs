//! Every key and field mark of the `#[precision]` attribute, spelled once.
//! Recipe names, option keys, scale modes and ramp orders are the recipe
//! table's (`mxswitch_recipes`), which the runtime reads too.

/// Keys of `#[precision(...)]`, as custom keywords for `lookahead1`.
pub mod kw {
    syn::custom_keyword!(layer);
    syn::custom_keyword!(switch_to);
    syn::custom_keyword!(at);
    syn::custom_keyword!(layers_per_iter);
    syn::custom_keyword!(order);
    syn::custom_keyword!(schedule);
    syn::custom_keyword!(config);
    syn::custom_keyword!(allow);
}

pub const LAYER: &str = "layer";
pub const SWITCH_TO: &str = "switch_to";
pub const AT: &str = "at";
pub const LAYERS_PER_ITER: &str = "layers_per_iter";
pub const ORDER: &str = "order";
pub const SCHEDULE: &str = "schedule";
pub const CONFIG: &str = "config";
pub const ALLOW: &str = "allow";

/// The keys of a root attribute, in the order the docs list them.
pub const KEYS: [&str; 7] = [
    SWITCH_TO,
    AT,
    LAYERS_PER_ITER,
    ORDER,
    SCHEDULE,
    CONFIG,
    ALLOW,
];

/// Field marks, inert helper attributes that `#[precision]` strips.
pub const QUANTIZE: &str = "quantize";
pub const LAYERS: &str = "layers";
pub const LAYER_MARK: &str = "layer";
pub const HIGH_PRECISION: &str = "high_precision";
pub const SKIP: &str = "skip";

/// Every field mark.
pub const MARKS: [&str; 5] = [QUANTIZE, LAYERS, LAYER_MARK, HIGH_PRECISION, SKIP];

/// The attribute's own name, to find it written twice.
pub const PRECISION: &str = "precision";

/// Environment variable that, when set, replaces `CARGO_MANIFEST_DIR` as the
/// directory `config = "..."` paths are relative to. trybuild compiles UI
/// tests in a generated crate under `target/`, so the compile-fail tests set
/// it to the real crate root.
pub const CONFIG_ROOT_ENV: &str = "MXSWITCH_CONFIG_ROOT";
