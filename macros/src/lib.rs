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
mod recipe_tokens;
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
///   `bf16` takes none of these. An option that does not apply is an error.
///   ```ignore
///   #[precision(mxfp4(scale = rceil, sr = true), switch_to = fp8(pow2 = true), at = 12000)]
///   ```
/// - Per-GEMM precision (SPEC section 4a): every recipe takes `fprop`, `dgrad`
///   and `wgrad`, each naming a recipe whose operand specs that GEMM uses;
///   the other GEMMs keep the base recipe. An override that changes nothing
///   (`mxfp4(fprop = mxfp4)`) is an error.
///   ```ignore
///   #[precision(schedule = [mxfp4 @ 0, mxfp4(fprop = bf16) @ 12000, mxfp4(dgrad = fp8, wgrad = fp8) @ 15000])]
///   ```
/// - `switch_to = <recipe>, at = <iteration>`: one switch; each needs the
///   other, and `switch_to` must resolve to a recipe other than the first.
/// - `schedule = [<recipe> @ <start>, ...]`: several switches; the first
///   phase starts at 0, starts increase strictly, and each phase resolves to
///   a recipe other than the one before it. It replaces the leading
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
///           (start: 12000, recipe: "mxfp4", options: (fprop: "bf16")),
///           (start: 15000, recipe: "fp8"),
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
/// # What the attribute fixes
///
/// Every recipe's code is compiled into the runtime whatever the attribute
/// says (a linear dispatches on its current recipe at run time). The
/// attribute fixes the model's schedule, and its recipes are an allow-list:
/// a schedule from a RON config or the command line may move switches,
/// change the ramp and set options, but naming a recipe the attribute does
/// not name is an error when the schedule is loaded
/// (`schedule_from_ron`) or applied (`apply_with`), and the error lists the
/// recipes the attribute names.
///
/// # Generated items
///
/// Paths below are `mxswitch::runtime::{plan, schedule, recipe}`. For every
/// annotated struct `S`, the plan visitor, which walks `#[quantize]` fields
/// as sites and each element of a `#[layers]` field as the next plan layer,
/// in field order, and allocates nothing:
///
/// ```ignore
/// impl Planned for S {
///     const CAN_HOLD_LINEARS: bool;   // true with a #[quantize] field, else any #[layers] element type's
///     fn visit_linears(&self, cx: &mut PlanCx<'_>, f: &mut dyn FnMut(LinearSite<'_>, &dyn PlanLinear));
///     fn visit_linears_mut(&mut self, cx: &mut PlanCx<'_>, f: &mut dyn FnMut(LinearSite<'_>, &mut dyn PlanLinear));
/// }
/// ```
///
/// When `S` has no `#[quantize]` field, a `const _: () = ...;` that fails to
/// compile if `CAN_HOLD_LINEARS` is false (for a generic `S`, the same check
/// as an inline `const` block in the visitor, evaluated when it is
/// instantiated). With `config = "..."`, a `const _: &[u8] =
/// include_bytes!(...)` so the crate rebuilds when the file changes.
///
/// For the root `R`, also:
///
/// ```ignore
/// impl PrecisionModel for R {
///     // The allow-list: every recipe the schedule's GEMMs use (per-GEMM
///     // overrides included), in phase order, without repeats.
///     const RECIPES: &'static [RecipeKind] = &[RecipeKind::Mxfp4, RecipeKind::Fp8];
///     // A `static` whose phases are constant data the macro validated at
///     // compile time (a RON file is read and checked then, too): nothing is
///     // built or checked at run time, and every call returns the same value.
///     fn schedule() -> &'static Schedule {
///         static SCHEDULE: Schedule = Schedule::from_attribute(&[/* Phase { start, recipe } */], 0, Order::DeepToShallow);
///         &SCHEDULE
///     }
/// }
///
/// impl R {
///     pub const SCHEDULE_TEXT: &'static str;                     // "[mxfp4 @ 0, fp8 @ 12000], layers_per_iter = 0, order = deep_to_shallow"
///     pub fn schedule() -> &'static Schedule;                    // <R as PrecisionModel>::schedule()
///     pub fn plan(&self) -> Plan;                                // paths per plan layer, and the extras
///     pub fn checked_plan(&self) -> Result<Plan, Error>;         // error when the plan is empty
///     pub fn apply(&mut self, iteration: u64) -> SwitchReport;   // under the static schedule; no check, no allocation
///     pub fn apply_with(&mut self, schedule: &Schedule, iteration: u64) -> Result<SwitchReport, Error>; // checked against RECIPES
///     pub fn schedule_from_ron(text: &str) -> Result<Schedule, Error>;                                  // parsed, checked against RECIPES
/// }
/// ```
///
/// `apply` walks the plan twice (once to count its layers, once to set
/// recipes) and assigns absolutely, so it is a pure function of the
/// iteration: applying an iteration twice is a no-op and iterations may come
/// in any order. It writes only recipes and positions and allocates nothing;
/// `SwitchReport` holds counts and a `Copy` recipe, and text is made only
/// when it is formatted.
///
/// ```ignore
/// let mut model = Flux::new(&cfg);
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
/// A run-time schedule, held to the allow-list:
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

/// The parameter walk (`Parameters`) of a struct outside the precision plan,
/// such as an embedder or a norm: every field under its name, except those
/// marked `#[skip]`. `#[precision]` structs get the same walk generated and
/// must not derive it. See `mxswitch::prelude`.
#[proc_macro_derive(Parameters, attributes(skip))]
pub fn derive_parameters(item: TokenStream) -> TokenStream {
    expand::derive_parameters(item.into()).into()
}
