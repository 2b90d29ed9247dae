//! The `#[precision]` DSL end to end: plans, switches, ramps, schedules from
//! the attribute and from RON files, recipe options and run-time overrides,
//! on a tiny model whose linears hold nothing but their recipe.

use mxswitch::precision;
use mxswitch::runtime::module::{ParamSlot, Parameters};
use mxswitch::runtime::plan::{Plan, PlanLinear, PrecisionModel};
use mxswitch::runtime::quant::ScaleMode;
use mxswitch::runtime::recipe::{Recipe, RecipeKind};
use mxswitch::runtime::schedule::{Order, Phase, Schedule};

/// A stand-in for a quantized linear: only the recipe the plan assigns.
struct FakeLinear {
    recipe: Recipe,
}

impl FakeLinear {
    fn new() -> Self {
        FakeLinear {
            recipe: Recipe::new(RecipeKind::Bf16),
        }
    }
}

impl PlanLinear for FakeLinear {
    fn recipe(&self) -> Option<Recipe> {
        Some(self.recipe)
    }
    fn set_recipe(&mut self, recipe: Recipe) {
        self.recipe = recipe;
    }
    fn runs(&self) -> u64 {
        0
    }
}

/// It holds no parameters.
impl Parameters for FakeLinear {
    fn visit_params(&mut self, _: &str, _: &mut dyn FnMut(ParamSlot<'_>)) {}
}

#[precision(layer)]
struct Block {
    #[quantize]
    qkv: FakeLinear,
    #[quantize]
    proj: FakeLinear,
    /// Unmarked: stays in high precision and is not visited.
    #[allow(dead_code)]
    #[skip]
    norm_scale: f32,
}

impl Block {
    fn new() -> Self {
        Block {
            qkv: FakeLinear::new(),
            proj: FakeLinear::new(),
            norm_scale: 1.0,
        }
    }
}

/// The body every test model shares: extras around a `Vec` and an array of blocks.
macro_rules! model {
    ($(#[$attr:meta])* $name:ident) => {
        $(#[$attr])*
        struct $name {
            #[quantize]
            img_in: FakeLinear,
            #[layers]
            blocks: Vec<Block>,
            #[layers]
            tail: [Block; 2],
            #[quantize]
            final_layer: FakeLinear,
            /// Unmarked: stays in high precision and is not visited.
            #[allow(dead_code)]
            #[skip]
            guidance: f32,
        }

        impl $name {
            /// `depth` blocks plus the two of the tail.
            fn new(depth: usize) -> Self {
                $name {
                    img_in: FakeLinear::new(),
                    blocks: (0..depth).map(|_| Block::new()).collect(),
                    tail: [Block::new(), Block::new()],
                    final_layer: FakeLinear::new(),
                    guidance: 0.0,
                }
            }
        }
    };
}

model!(
    #[precision(mxfp4, switch_to = fp8, at = 12000)]
    Switch
);
model!(
    #[precision(mxfp4, switch_to = fp8, at = 600, layers_per_iter = 4)]
    Ramped
);
model!(
    #[precision(mxfp4, switch_to = fp8, at = 600, layers_per_iter = 64)]
    FastRamp
);
model!(
    #[precision(mxfp4, switch_to = fp8, at = 600, layers_per_iter = 4, order = shallow_to_deep)]
    Shallow
);
model!(
    #[precision(schedule = [mxfp4 @ 0, fp8 @ 12000, bf16 @ 15000])]
    ThreePhase
);
model!(
    #[precision(config = "tests/configs/three_phase.ron")]
    FromConfig
);
model!(
    #[precision(
        mxfp4(scale = rceil, sr = true, hadamard = false),
        switch_to = fp8(pow2 = true),
        at = 10
    )]
    WithOptions
);

/// Flux.1-schnell's plan depth: 55 blocks plus the tail of 2 is 57 layers.
const DEPTH: usize = 55;

/// The recipe of every linear of each plan layer, shallow to deep, and of the extras.
fn layer_kinds(model: &Ramped) -> Vec<RecipeKind> {
    let mut kinds = Vec::new();
    for b in model.blocks.iter().chain(&model.tail) {
        assert_eq!(b.qkv.recipe, b.proj.recipe, "a layer converts as a whole");
        kinds.push(b.qkv.recipe.kind);
    }
    kinds
}

fn count(kinds: &[RecipeKind], kind: RecipeKind) -> usize {
    kinds.iter().filter(|k| **k == kind).count()
}

#[test]
fn plan_paths_follow_fields_and_group_by_layer() {
    let model = Switch::new(4);
    let plan = model.plan();
    assert_eq!(plan.len(), 6);
    assert_eq!(plan.linears(), 14);
    assert_eq!(plan.layers[3], ["blocks.3.qkv", "blocks.3.proj"]);
    assert_eq!(plan.layers[4], ["tail.0.qkv", "tail.0.proj"]);
    assert_eq!(plan.layers[5], ["tail.1.qkv", "tail.1.proj"]);
    assert_eq!(plan.extras, ["img_in", "final_layer"]);
    assert_eq!(plan, Plan::of(&model));
}

#[test]
fn nothing_converts_before_the_switch_and_everything_at_it() {
    let mut model = Switch::new(DEPTH);
    let report = model.apply(0);
    assert_eq!(
        report.to_string(),
        "57/57 layers (116/116 linears) now mxfp4 at iteration 0"
    );
    model.apply(11_999);
    assert!(model
        .blocks
        .iter()
        .all(|b| b.qkv.recipe.kind == RecipeKind::Mxfp4));
    assert_eq!(model.img_in.recipe.kind, RecipeKind::Mxfp4);
    let report = model.apply(12_000);
    assert_eq!(
        report.to_string(),
        "57/57 layers (116/116 linears) now fp8 at iteration 12000"
    );
    assert_eq!(report.changed, 116);
    assert!(model
        .tail
        .iter()
        .all(|b| b.proj.recipe.kind == RecipeKind::Fp8));
    assert_eq!(model.final_layer.recipe, Recipe::new(RecipeKind::Fp8));
}

#[test]
fn a_ramp_of_four_converts_four_layers_per_iteration_deepest_first() {
    let mut model = Ramped::new(DEPTH);
    for (iteration, want) in [
        (0, 0),
        (599, 0),
        (600, 4),
        (601, 8),
        (613, 56),
        (614, 57),
        (10_000, 57),
    ] {
        let report = model.apply(iteration);
        let kinds = layer_kinds(&model);
        assert_eq!(
            count(&kinds, RecipeKind::Fp8),
            want,
            "iteration {iteration}"
        );
        if iteration >= 600 {
            assert_eq!(report.layers_converted, want);
            assert_eq!(report.linears_converted, 2 * want + 2, "extras flip too");
        }
    }
    model.apply(600);
    let kinds = layer_kinds(&model);
    assert!(kinds[53..].iter().all(|k| *k == RecipeKind::Fp8));
    assert!(kinds[..53].iter().all(|k| *k == RecipeKind::Mxfp4));
    assert_eq!(
        model.apply(601).to_string(),
        "8/57 layers (18/116 linears) now fp8 at iteration 601"
    );
}

#[test]
fn extras_flip_with_the_first_conversion() {
    let mut model = Ramped::new(DEPTH);
    model.apply(599);
    assert_eq!(model.img_in.recipe.kind, RecipeKind::Mxfp4);
    assert_eq!(model.final_layer.recipe.kind, RecipeKind::Mxfp4);
    model.apply(600);
    assert_eq!(model.img_in.recipe.kind, RecipeKind::Fp8);
    assert_eq!(model.final_layer.recipe.kind, RecipeKind::Fp8);
}

#[test]
fn a_rate_at_least_the_plan_length_converts_everything_at_the_switch() {
    let mut model = FastRamp::new(DEPTH);
    assert_eq!(model.apply(599).layers_converted, 57, "all still on mxfp4");
    let report = model.apply(600);
    assert_eq!(report.recipe.kind, RecipeKind::Fp8);
    assert_eq!(
        (report.layers_converted, report.linears_converted),
        (57, 116)
    );
}

#[test]
fn shallow_to_deep_converts_the_first_layers_first() {
    let mut model = Shallow::new(DEPTH);
    model.apply(600);
    assert!(model.blocks[..4]
        .iter()
        .all(|b| b.qkv.recipe.kind == RecipeKind::Fp8));
    assert!(model.blocks[4..]
        .iter()
        .all(|b| b.qkv.recipe.kind == RecipeKind::Mxfp4));
    assert_eq!(Shallow::schedule().order, Order::ShallowToDeep);
}

#[test]
fn applying_an_iteration_twice_is_a_no_op() {
    let mut model = Ramped::new(DEPTH);
    let first = model.apply(605);
    let before = layer_kinds(&model);
    let again = model.apply(605);
    assert_eq!(again.changed, 0);
    assert_eq!(layer_kinds(&model), before);
    assert_eq!(
        (first.layers_converted, first.linears_converted),
        (again.layers_converted, again.linears_converted)
    );
}

#[test]
fn forward_and_reversed_sweeps_agree() {
    let mut model = Ramped::new(DEPTH);
    let iterations: Vec<u64> = (590..=620).collect();
    let forward: Vec<Vec<RecipeKind>> = iterations
        .iter()
        .map(|&i| {
            model.apply(i);
            layer_kinds(&model)
        })
        .collect();
    for (i, want) in iterations.iter().zip(&forward).rev() {
        model.apply(*i);
        assert_eq!(&layer_kinds(&model), want, "iteration {i}");
    }
}

#[test]
fn applying_iteration_zero_restores_the_first_recipe() {
    let mut model = Ramped::new(DEPTH);
    model.apply(10_000);
    let report = model.apply(0);
    assert_eq!(report.changed, 116);
    assert_eq!(count(&layer_kinds(&model), RecipeKind::Mxfp4), 57);
    assert_eq!(model.img_in.recipe.kind, RecipeKind::Mxfp4);
}

#[test]
fn a_schedule_of_three_phases() {
    assert_eq!(
        ThreePhase::RECIPES,
        [RecipeKind::Mxfp4, RecipeKind::Fp8, RecipeKind::Bf16]
    );
    assert_eq!(
        ThreePhase::SCHEDULE_TEXT,
        "[mxfp4 @ 0, fp8 @ 12000, bf16 @ 15000], layers_per_iter = 0, order = deep_to_shallow"
    );
    let mut model = ThreePhase::new(3);
    for (iteration, kind) in [
        (0, RecipeKind::Mxfp4),
        (11_999, RecipeKind::Mxfp4),
        (12_000, RecipeKind::Fp8),
        (14_999, RecipeKind::Fp8),
        (15_000, RecipeKind::Bf16),
        (1_000_000, RecipeKind::Bf16),
    ] {
        let report = model.apply(iteration);
        assert_eq!(report.recipe.kind, kind, "iteration {iteration}");
        assert_eq!(model.blocks[2].proj.recipe.kind, kind);
        assert_eq!(model.img_in.recipe.kind, kind);
    }
}

#[test]
fn a_schedule_from_a_ron_file() {
    let mxfp4 = Recipe::new(RecipeKind::Mxfp4)
        .with_option("scale", "rceil")
        .unwrap();
    let fp8 = Recipe::new(RecipeKind::Fp8)
        .with_option("pow2", "true")
        .unwrap();
    let want = Schedule::new(
        vec![
            Phase {
                start: 0,
                recipe: mxfp4,
            },
            Phase {
                start: 100,
                recipe: fp8,
            },
            Phase {
                start: 200,
                recipe: Recipe::new(RecipeKind::Bf16),
            },
        ],
        2,
        Order::ShallowToDeep,
    )
    .unwrap();
    assert_eq!(*FromConfig::schedule(), want);
    assert_eq!(
        FromConfig::RECIPES,
        [RecipeKind::Mxfp4, RecipeKind::Fp8, RecipeKind::Bf16]
    );
    let mut model = FromConfig::new(4);
    model.apply(0);
    assert_eq!(model.blocks[0].qkv.recipe.scale, ScaleMode::Rceil);
    let report = model.apply(100);
    assert_eq!(
        report.to_string(),
        "2/6 layers (6/14 linears) now fp8(pow2 = true) at iteration 100"
    );
    assert!(model.blocks[1].qkv.recipe.pow2, "shallow layers first");
    assert_eq!(model.blocks[2].qkv.recipe, mxfp4);
}

#[test]
fn recipe_options_reach_the_recipes() {
    let mut model = WithOptions::new(1);
    model.apply(9);
    let r = model.blocks[0].qkv.recipe;
    assert_eq!(r.kind, RecipeKind::Mxfp4);
    assert_eq!(
        (r.scale, r.sr, r.hadamard, r.tile2d),
        (ScaleMode::Rceil, true, false, true)
    );
    model.apply(10);
    let r = model.tail[1].proj.recipe;
    assert_eq!(r.kind, RecipeKind::Fp8);
    assert!(r.pow2);
    assert_eq!(
        WithOptions::SCHEDULE_TEXT,
        "[mxfp4(scale = rceil, sr = true, hadamard = false) @ 0, fp8(pow2 = true) @ 10], \
         layers_per_iter = 0, order = deep_to_shallow"
    );
}

#[test]
fn a_run_time_schedule_may_move_the_switch() {
    let schedule = Switch::schedule_from_ron(
        r#"(phases: [(start: 0, recipe: "mxfp4"), (start: 50, recipe: "fp8", options: (pow2: true))], layers_per_iter: 1)"#,
    )
    .unwrap();
    let mut model = Switch::new(DEPTH);
    let report = model.apply_with(&schedule, 51).unwrap();
    assert_eq!(
        report.to_string(),
        "2/57 layers (6/116 linears) now fp8(pow2 = true) at iteration 51"
    );
}

#[test]
fn a_run_time_schedule_cannot_name_a_recipe_the_attribute_does_not_name() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/configs/override_bf16.ron"
    ))
    .unwrap();
    let err = Switch::schedule_from_ron(&text).unwrap_err().to_string();
    assert!(
        err.contains("recipe `bf16` is not allowed for this model") && err.contains("mxfp4, fp8"),
        "{err}"
    );
    let bf16 = Schedule::constant(Recipe::new(RecipeKind::Bf16));
    let mut model = Switch::new(2);
    let err = model.apply_with(&bf16, 0).unwrap_err().to_string();
    assert!(err.contains("names only mxfp4, fp8"), "{err}");
    assert!(
        model
            .blocks
            .iter()
            .all(|b| b.qkv.recipe.kind == RecipeKind::Bf16),
        "untouched"
    );
}

#[test]
fn run_time_ron_errors_name_line_and_column() {
    let err = Switch::schedule_from_ron(
        "(phases: [(start: 0, recipe: \"mxfp4\")],\n  layer_per_iter: 2)",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("line 2, column"), "{err}");
    assert!(err.contains("layer_per_iter"), "{err}");
}

/// A model whose whole plan is its layer stack.
#[precision(mxfp4, switch_to = fp8, at = 100)]
struct Stack {
    #[layers]
    blocks: Vec<Block>,
}

#[test]
fn an_instance_without_a_quantized_linear_is_an_error() {
    let empty = Stack { blocks: Vec::new() };
    let plan = empty.plan();
    assert!(plan.is_empty());
    let err = plan.check_not_empty("Stack").unwrap_err().to_string();
    assert!(err.contains("has no quantized linear"), "{err}");
    let err = empty.checked_plan().unwrap_err().to_string();
    assert!(
        err.contains("`Stack`") && err.contains("depth of 0"),
        "{err}"
    );
    let one = Stack {
        blocks: vec![Block::new()],
    };
    assert_eq!(one.checked_plan().unwrap().linears(), 2);
}

/// Generic structs work too; a root whose plan rests on generic layers is
/// checked when its visitor is instantiated.
#[precision(layer)]
struct GenericBlock<L: PlanLinear> {
    #[quantize]
    r#mlp: L,
}

#[precision(fp8)]
struct GenericStack<L: PlanLinear> {
    #[layers]
    blocks: Vec<GenericBlock<L>>,
}

#[test]
fn generic_structs_get_a_plan() {
    let mut model = GenericStack {
        blocks: vec![GenericBlock {
            mlp: FakeLinear::new(),
        }],
    };
    assert_eq!(model.plan().layers, [["blocks.0.mlp"]]);
    let report = model.apply(0);
    assert_eq!(
        report.to_string(),
        "1/1 layers (1/1 linears) now fp8 at iteration 0"
    );
    assert_eq!(
        <GenericStack<FakeLinear> as PrecisionModel>::RECIPES,
        [RecipeKind::Fp8]
    );
}

// Per-GEMM precision (SPEC section 4a): the forward in BF16 late in
// training, then the backward in FP8, each a phase of its own.
model!(
    #[precision(schedule = [
        mxfp4 @ 0,
        mxfp4(fprop = bf16) @ 12000,
        mxfp4(dgrad = fp8, wgrad = fp8) @ 15000,
    ])]
    PerGemm
);
model!(
    #[precision(config = "tests/configs/per_gemm.ron")]
    PerGemmFromConfig
);

#[test]
fn per_gemm_phases_in_the_attribute_are_switches() {
    assert_eq!(
        PerGemm::SCHEDULE_TEXT,
        "[mxfp4 @ 0, mxfp4(fprop = bf16) @ 12000, mxfp4(dgrad = fp8, wgrad = fp8) @ 15000], \
         layers_per_iter = 0, order = deep_to_shallow"
    );
    // The recipes the GEMMs use are the ones the attribute names.
    assert_eq!(
        PerGemm::RECIPES,
        [RecipeKind::Mxfp4, RecipeKind::Bf16, RecipeKind::Fp8]
    );
    let mut model = PerGemm::new(DEPTH);
    model.apply(11999);
    let mxfp4 = Recipe::new(RecipeKind::Mxfp4);
    assert_eq!(model.blocks[0].qkv.recipe, mxfp4);
    // A phase that changes only the forward GEMM is a switch like any other.
    let report = model.apply(12000);
    assert_eq!(
        report.to_string(),
        "57/57 layers (116/116 linears) now mxfp4(fprop = bf16) at iteration 12000"
    );
    assert_eq!(report.changed, 116);
    let r = model.tail[1].proj.recipe;
    assert_eq!(
        (r.kind, r.fprop),
        (RecipeKind::Mxfp4, Some(RecipeKind::Bf16))
    );
    assert!(r.spec().fprop.is_bf16() && !r.spec().dgrad.is_bf16());
    assert_eq!(r.saved_bytes_per_element(), 0.53125);
    model.apply(15000);
    let r = model.img_in.recipe;
    assert_eq!(r.to_string(), "mxfp4(dgrad = fp8, wgrad = fp8)");
    assert_eq!(r.saved_bytes_per_element(), 1.0);
}

#[test]
fn per_gemm_phases_in_a_ron_file_match_the_attribute() {
    assert_eq!(*PerGemmFromConfig::schedule(), *PerGemm::schedule());
    assert_eq!(PerGemmFromConfig::RECIPES, PerGemm::RECIPES);
    assert_eq!(PerGemmFromConfig::SCHEDULE_TEXT, PerGemm::SCHEDULE_TEXT);
    let (mut from_file, mut from_attr) = (PerGemmFromConfig::new(1), PerGemm::new(1));
    for it in [0, 12000, 15000] {
        let (a, b) = (from_file.apply(it), from_attr.apply(it));
        assert_eq!(a, b, "iteration {it}");
        assert_eq!(from_file.tail[0].qkv.recipe, from_attr.tail[0].qkv.recipe);
    }
}

/// A schedule that starts in `mxfp4` and from iteration 40 runs `mxfp4`
/// with `options` (RON text).
fn late_mxfp4(options: &str) -> String {
    format!(
        "(phases: [(start: 0, recipe: \"mxfp4\"), (start: 40, recipe: \"mxfp4\", options: {options})])"
    )
}

#[test]
fn a_run_time_schedule_may_set_per_gemm_options_among_the_named_recipes() {
    // `Switch` names mxfp4 and fp8: an FP8 backward is allowed, a BF16 forward is not.
    let schedule =
        Switch::schedule_from_ron(&late_mxfp4(r#"(dgrad: "fp8", wgrad: "fp8")"#)).unwrap();
    let mut model = Switch::new(2);
    let report = model.apply_with(&schedule, 40).unwrap();
    assert_eq!(
        report.to_string(),
        "4/4 layers (10/10 linears) now mxfp4(dgrad = fp8, wgrad = fp8) at iteration 40"
    );
    let err = Switch::schedule_from_ron(&late_mxfp4(r#"(fprop: "bf16")"#)).unwrap_err();
    assert!(
        err.to_string()
            .contains("recipe `bf16` is not allowed for this model"),
        "{err}"
    );
    // A phase that changes nothing is refused at run time as in the attribute.
    let err = PerGemm::schedule_from_ron(&late_mxfp4(r#"(scale: "even")"#)).unwrap_err();
    assert!(
        err.to_string().contains(
            "phases[1].recipe: phase `mxfp4 @ 40` resolves to `mxfp4`, the recipe already running"
        ),
        "{err}"
    );
}

model!(
    #[precision(mxfp4, switch_to = fp8, at = 12000, allow = [nvfp4, fp8_rowwise, fp8_block])]
    Allowing
);
model!(
    #[precision(config = "tests/configs/per_gemm.ron", allow = [fp8_block])]
    AllowingFromConfig
);

/// `allow = [...]` adds recipes to the allow-list without scheduling them:
/// the attribute's schedule is unchanged, and a run-time schedule may name
/// them, as base recipes or in per-GEMM overrides.
#[test]
fn allow_lists_recipes_a_run_time_schedule_may_use() {
    assert_eq!(
        Allowing::RECIPES,
        [
            RecipeKind::Mxfp4,
            RecipeKind::Fp8,
            RecipeKind::Nvfp4,
            RecipeKind::Fp8Rowwise,
            RecipeKind::Fp8Block
        ]
    );
    assert_eq!(Allowing::SCHEDULE_TEXT, Switch::SCHEDULE_TEXT);
    assert_eq!(*Allowing::schedule(), *Switch::schedule());
    let s = Allowing::schedule_from_ron(
        r#"(phases: [(start: 0, recipe: "nvfp4"), (start: 40, recipe: "fp8_block"),
                     (start: 60, recipe: "mxfp4", options: (wgrad: "fp8_rowwise"))])"#,
    )
    .unwrap();
    let mut model = Allowing::new(2);
    let report = model.apply_with(&s, 40).unwrap();
    assert_eq!(
        report.to_string(),
        "4/4 layers (10/10 linears) now fp8_block at iteration 40"
    );
    assert_eq!(model.img_in.recipe, Recipe::new(RecipeKind::Fp8Block));
    // Still an allow-list: bf16 is named nowhere.
    let err = Allowing::schedule_from_ron(r#"(phases: [(start: 0, recipe: "bf16")])"#)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("names only mxfp4, fp8, nvfp4, fp8_rowwise, fp8_block"),
        "{err}"
    );
    // With `config`, `allow` adds to the file's recipes.
    assert_eq!(
        AllowingFromConfig::RECIPES,
        [
            RecipeKind::Mxfp4,
            RecipeKind::Bf16,
            RecipeKind::Fp8,
            RecipeKind::Fp8Block
        ]
    );
    assert_eq!(*AllowingFromConfig::schedule(), *PerGemm::schedule());
    let s = AllowingFromConfig::schedule_from_ron(
        r#"(phases: [(start: 0, recipe: "mxfp4", options: (dgrad: "fp8_block"))])"#,
    )
    .unwrap();
    let mut model = AllowingFromConfig::new(1);
    model.apply_with(&s, 0).unwrap();
    assert_eq!(model.img_in.recipe.to_string(), "mxfp4(dgrad = fp8_block)");
}
