//! Every attribute key, recipe name, option and order of the DSL, spelled once.
//!
//! The tables mirror `mxswitch_runtime::recipe` (SPEC section 4) and
//! `mxswitch_runtime::schedule` (SPEC section 5): a proc-macro crate cannot
//! depend on the runtime, so the names the macro accepts and the runtime
//! variants it emits are listed here side by side.

/// Keys of `#[precision(...)]`, as custom keywords for `lookahead1`.
pub mod kw {
    syn::custom_keyword!(layer);
    syn::custom_keyword!(switch_to);
    syn::custom_keyword!(at);
    syn::custom_keyword!(layers_per_iter);
    syn::custom_keyword!(order);
    syn::custom_keyword!(schedule);
    syn::custom_keyword!(config);
}

pub const LAYER: &str = "layer";
pub const SWITCH_TO: &str = "switch_to";
pub const AT: &str = "at";
pub const LAYERS_PER_ITER: &str = "layers_per_iter";
pub const ORDER: &str = "order";
pub const SCHEDULE: &str = "schedule";
pub const CONFIG: &str = "config";

/// The keys of a root attribute, in the order the docs list them.
pub const KEYS: [&str; 6] = [SWITCH_TO, AT, LAYERS_PER_ITER, ORDER, SCHEDULE, CONFIG];

/// Field marks, inert helper attributes that `#[precision]` strips.
pub const QUANTIZE: &str = "quantize";
pub const LAYERS: &str = "layers";

/// Which option keys a recipe takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Bf16,
    Fp8,
    Mx,
}

impl Family {
    /// How the docs name the recipes of a family.
    pub const fn describe(self) -> &'static str {
        match self {
            Family::Bf16 => "bf16",
            Family::Fp8 => "FP8 recipes (fp8, fp8_fnuz)",
            Family::Mx => "MX recipes (mxfp4, mxfp8)",
        }
    }
}

/// A named recipe and its `mxswitch_runtime::recipe::RecipeKind` variant.
#[derive(Debug, PartialEq, Eq)]
pub struct RecipeName {
    pub name: &'static str,
    pub variant: &'static str,
    pub family: Family,
}

pub const RECIPES: [RecipeName; 5] = [
    RecipeName {
        name: "bf16",
        variant: "Bf16",
        family: Family::Bf16,
    },
    RecipeName {
        name: "fp8",
        variant: "Fp8",
        family: Family::Fp8,
    },
    RecipeName {
        name: "fp8_fnuz",
        variant: "Fp8Fnuz",
        family: Family::Fp8,
    },
    RecipeName {
        name: "mxfp4",
        variant: "Mxfp4",
        family: Family::Mx,
    },
    RecipeName {
        name: "mxfp8",
        variant: "Mxfp8",
        family: Family::Mx,
    },
];

/// What an option's value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Takes {
    Bool,
    /// One of [`SCALE_MODES`].
    Scale,
}

/// A recipe option key; `name` is also the field of the runtime `Recipe` it sets.
#[derive(Debug, PartialEq, Eq)]
pub struct OptionKey {
    pub name: &'static str,
    pub family: Family,
    pub takes: Takes,
}

pub const OPTIONS: [OptionKey; 5] = [
    OptionKey {
        name: "scale",
        family: Family::Mx,
        takes: Takes::Scale,
    },
    OptionKey {
        name: "sr",
        family: Family::Mx,
        takes: Takes::Bool,
    },
    OptionKey {
        name: "hadamard",
        family: Family::Mx,
        takes: Takes::Bool,
    },
    OptionKey {
        name: "tile2d",
        family: Family::Mx,
        takes: Takes::Bool,
    },
    OptionKey {
        name: "pow2",
        family: Family::Fp8,
        takes: Takes::Bool,
    },
];

/// A spelling and the runtime variant it names (`ScaleMode`, `Order`).
#[derive(Debug, PartialEq, Eq)]
pub struct Named {
    pub name: &'static str,
    pub variant: &'static str,
}

pub const SCALE_MODES: [Named; 4] = [
    Named {
        name: "floor",
        variant: "Floor",
    },
    Named {
        name: "ceil",
        variant: "Ceil",
    },
    Named {
        name: "even",
        variant: "Even",
    },
    Named {
        name: "rceil",
        variant: "Rceil",
    },
];

/// The ramp orders; the first is the default.
pub const ORDERS: [Named; 2] = [
    Named {
        name: "deep_to_shallow",
        variant: "DeepToShallow",
    },
    Named {
        name: "shallow_to_deep",
        variant: "ShallowToDeep",
    },
];

/// Environment variable that, when set, replaces `CARGO_MANIFEST_DIR` as the
/// directory `config = "..."` paths are relative to. trybuild compiles UI
/// tests in a generated crate under `target/`, so the compile-fail tests set
/// it to the real crate root.
pub const CONFIG_ROOT_ENV: &str = "MXSWITCH_CONFIG_ROOT";
