//! Procedural macros of mxswitch: the `#[precision]` attribute, which turns
//! a model struct into a checked precision plan and schedule.
//!
//! Parsing lives in `attr.rs` (into the plain structs of `ast.rs`), the
//! rules across keys and fields in `valid.rs`, RON schedule files in
//! `config.rs`, and code generation in `expand.rs`; `symbol.rs` spells every
//! key and name once.

mod ast;
mod attr;
mod config;
mod expand;
mod symbol;
mod valid;

use proc_macro::TokenStream;

/// Mark a model struct with its precision schedule, or a block struct as one
/// plan layer (SPEC sections 4 to 6).
///
/// # The root model
///
/// ```ignore
/// use mxswitch::precision;
/// use mxswitch::runtime::linear::QuantLinear;
///
/// #[precision(mxfp4, switch_to = fp8, at = 12000)]
/// pub struct Flux {
///     #[quantize]
///     img_in: QuantLinear,        // an extra: outside the layer stack
///     #[layers]
///     double_blocks: Vec<DoubleBlock>,
///     #[layers]
///     single_blocks: [SingleBlock; 38],
///     time_in: Mlp,               // unmarked: stays in high precision
/// }
///
/// #[precision(layer)]
/// pub struct SingleBlock {
///     #[quantize]
///     qkv: QuantLinear,
///     #[quantize]
///     proj: QuantLinear,
///     norm: QkNorm,
/// }
/// ```
///
/// Iterations below `at` run `mxfp4`, iterations from `at` on run `fp8`
/// (`at` is the number of completed optimizer steps; it must be >= 1).
///
/// # Arguments
///
/// - `<recipe>`: the recipe the model starts with, first and without a key:
///   `#[precision(mxfp4)]` trains in MXFP4 throughout. Recipes are `bf16`,
///   `fp8`, `fp8_fnuz`, `mxfp4` and `mxfp8`.
/// - Recipe options, in parentheses after any recipe (SPEC section 4):
///   `scale = floor | ceil | even | rceil`, `sr = bool`, `hadamard = bool` and
///   `tile2d = bool` for the MX recipes, `pow2 = bool` for the FP8 recipes;
///   `bf16` takes none. An option that does not apply is an error.
///   ```ignore
///   #[precision(mxfp4(scale = rceil, sr = true), switch_to = fp8(pow2 = true), at = 12000)]
///   ```
/// - `switch_to = <recipe>, at = <iteration>`: one switch; each needs the
///   other, and `switch_to` must differ from the first recipe.
/// - `schedule = [<recipe> @ <start>, ...]`: several switches; the first
///   phase starts at 0, starts increase strictly. It replaces the leading
///   recipe and `switch_to`/`at`, which cannot be written with it.
///   ```ignore
///   #[precision(schedule = [mxfp4 @ 0, fp8 @ 12000, bf16 @ 15000])]
///   ```
/// - `layers_per_iter = <count>`: ramp each switch over the plan layers, this
///   many per iteration (0, the default, converts every layer at once):
///   at iteration i >= N, min(L, (i - N + 1) * count) layers are converted.
/// - `order = deep_to_shallow | shallow_to_deep`: which end of the layer
///   stack a ramp converts first (default `deep_to_shallow`).
///   ```ignore
///   #[precision(mxfp4, switch_to = fp8, at = 600, layers_per_iter = 4, order = shallow_to_deep)]
///   ```
/// - `config = "<path>.ron"`: read the whole schedule from a RON file at
///   compile time, relative to the crate's `Cargo.toml` directory; the crate
///   rebuilds when the file changes. It cannot be combined with other keys.
///   ```ignore
///   #[precision(config = "configs/flux_schedule.ron")]
///   ```
///   The file (SPEC section 5; `options` and the last two keys are optional):
///   ```text
///   (
///       phases: [
///           (start: 0, recipe: "mxfp4", options: (scale: "rceil")),
///           (start: 12000, recipe: "fp8"),
///       ],
///       layers_per_iter: 0,
///       order: "deep_to_shallow",
///   )
///   ```
///
/// # Marks
///
/// - `#[precision(layer)]` marks a block struct as one plan layer, the unit a
///   ramp converts; it takes no schedule.
/// - Inside either kind of struct, `#[quantize]` marks a quantized linear
///   (its type implements `PlanLinear`) and `#[layers]` a `Vec<T>` or
///   `[T; N]` of layer structs, each element one plan layer. Unmarked fields
///   stay in high precision and are not visited. Quantized linears outside
///   any layer struct are the plan's extras: they convert with the first
///   conversion of each switch.
/// - A struct whose plan cannot hold a quantized linear is a compile error.
///
/// # Generated items
///
/// For every annotated struct, `impl Planned` (the plan visitor). For the
/// root, also `impl PrecisionModel` (`RECIPES`, the recipe kinds the schedule
/// names and whose code is compiled in, and `compiled_schedule()`) and these
/// inherent items:
///
/// ```ignore
/// pub const SCHEDULE_TEXT: &'static str;
/// pub fn schedule() -> Schedule;
/// pub fn plan(&self) -> Plan;
/// pub fn checked_plan(&self) -> Result<Plan>;        // error when the plan is empty
/// pub fn apply(&mut self, iteration: u64) -> SwitchReport;
/// pub fn apply_with(&mut self, schedule: &Schedule, iteration: u64) -> Result<SwitchReport>;
/// pub fn schedule_from_ron(text: &str) -> Result<Schedule>;
/// ```
///
/// ```ignore
/// let mut model = Flux::new(&cfg)?;
/// model.checked_plan()?;
/// for step in 0..steps {
///     let report = model.apply(step);                 // no-op unless a switch happens
///     if report.changed > 0 {
///         println!("{report}");                       // 57/57 layers (304/304 linears) now fp8 at iteration 12000
///     }
///     // forward, backward, optimizer step
/// }
/// ```
///
/// A schedule from a RON config or the command line may move switches,
/// change the ramp and set options, but only among the compiled-in recipes:
///
/// ```ignore
/// let schedule = Flux::schedule_from_ron(&std::fs::read_to_string("run.ron")?)?;
/// model.apply_with(&schedule, step)?;
/// ```
///
/// # Errors
///
/// Every mistake is reported at the offending tokens, all at once: unknown,
/// duplicate or misplaced keys, unknown recipes (with the closest name),
/// options that do not apply, `at` that is not an integer >= 1, `switch_to`
/// without `at` and the reverse, `switch_to` equal to the first recipe,
/// `schedule` beside `switch_to`/`at`, phases out of order, a negative
/// `layers_per_iter`, a missing or malformed RON file (with its line and
/// column), a schedule on a `#[precision(layer)]` struct, an enum, union or
/// tuple struct, and an empty plan.
#[proc_macro_attribute]
pub fn precision(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::precision(args.into(), item.into()).into()
}
