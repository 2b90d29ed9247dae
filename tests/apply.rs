//! What `#[precision]` generates for a root model: its schedule is one
//! `static` value, the one `Schedule::new` builds from the same phases; the
//! allow-list is the attribute's recipes; `apply` is a pure function of the
//! iteration and names each linear by its plan path.

use std::ptr;

use mxswitch::precision;
use mxswitch::runtime::linear::QuantLinear;
use mxswitch::runtime::module::{ParamSlot, Parameters};
use mxswitch::runtime::plan::{PlanCx, PlanLinear, Planned, PrecisionModel};
use mxswitch::runtime::recipe::{Recipe, RecipeKind};
use mxswitch::runtime::schedule::{Order, Phase, Schedule};

#[precision(layer)]
struct Block {
    #[quantize]
    qkv: QuantLinear,
    #[quantize]
    proj: QuantLinear,
}

/// Two switches, the second cutting the first's ramp short.
#[precision(
    schedule = [mxfp4 @ 0, fp8(pow2 = true) @ 20, bf16 @ 23],
    layers_per_iter = 2
)]
struct Ramped {
    #[quantize]
    img_in: QuantLinear,
    #[layers]
    blocks: Vec<Block>,
    #[quantize]
    final_layer: QuantLinear,
}

impl Ramped {
    fn new(depth: usize) -> Self {
        let lin = || QuantLinear::new(4, 4, false);
        Ramped {
            img_in: lin(),
            blocks: (0..depth)
                .map(|_| Block {
                    qkv: lin(),
                    proj: lin(),
                })
                .collect(),
            final_layer: lin(),
        }
    }
}

#[precision(config = "tests/configs/three_phase.ron")]
struct FromConfig {
    #[layers]
    blocks: Vec<Block>,
}

/// A linear of another type, to instantiate a generic root twice.
struct Pinned(Recipe);

impl PlanLinear for Pinned {
    fn recipe(&self) -> Option<Recipe> {
        Some(self.0)
    }
    fn set_recipe(&mut self, recipe: Recipe) {
        self.0 = recipe;
    }
    fn runs(&self) -> u64 {
        0
    }
}

/// It holds no parameters.
impl Parameters for Pinned {
    fn visit_params(&mut self, _: &str, _: &mut dyn FnMut(ParamSlot<'_>)) {}
}

#[precision(layer)]
struct GenericBlock<L: PlanLinear> {
    #[quantize]
    lin: L,
}

#[precision(mxfp8, switch_to = fp8, at = 5)]
struct Generic<L: PlanLinear> {
    #[layers]
    blocks: Vec<GenericBlock<L>>,
}

/// Every linear's recipe, in plan order.
fn recipes<M: Planned>(model: &M) -> Vec<Recipe> {
    let mut out = Vec::new();
    PlanCx::root(|cx| {
        model.visit_linears(cx, &mut |site, lin| {
            out.push(
                lin.recipe()
                    .unwrap_or_else(|| panic!("{site} has no recipe")),
            )
        })
    });
    out
}

/// The run-time constructor accepts what the macro emitted, unchanged.
fn rebuilt(s: &Schedule) -> Schedule {
    Schedule::new(s.phases().to_vec(), s.layers_per_iter, s.order).unwrap()
}

#[test]
fn the_schedule_is_one_static_value() {
    let s = Ramped::schedule();
    assert!(
        ptr::eq(s, Ramped::schedule()),
        "the same value on every call"
    );
    assert!(ptr::eq(s, <Ramped as PrecisionModel>::schedule()));
    assert!(
        ptr::eq(
            Generic::<QuantLinear>::schedule(),
            Generic::<Pinned>::schedule()
        ),
        "one static for every instantiation of a generic root"
    );
    assert!(!ptr::eq(s, FromConfig::schedule()));
}

#[test]
fn the_emitted_schedules_are_those_schedule_new_builds() {
    let fp8_pow2 = Recipe::new(RecipeKind::Fp8)
        .with_option("pow2", "true")
        .unwrap();
    let want = Schedule::new(
        vec![
            Phase {
                start: 0,
                recipe: Recipe::new(RecipeKind::Mxfp4),
            },
            Phase {
                start: 20,
                recipe: fp8_pow2,
            },
            Phase {
                start: 23,
                recipe: Recipe::new(RecipeKind::Bf16),
            },
        ],
        2,
        Order::DeepToShallow,
    )
    .unwrap();
    assert_eq!(*Ramped::schedule(), want);
    for s in [
        Ramped::schedule(),
        FromConfig::schedule(),
        Generic::<Pinned>::schedule(),
    ] {
        assert_eq!(rebuilt(s), *s);
    }
}

#[test]
fn the_allow_list_is_the_attributes_recipes_in_phase_order() {
    assert_eq!(
        Ramped::RECIPES,
        [RecipeKind::Mxfp4, RecipeKind::Fp8, RecipeKind::Bf16]
    );
    assert_eq!(
        Generic::<Pinned>::RECIPES,
        [RecipeKind::Mxfp8, RecipeKind::Fp8]
    );
}

#[test]
fn apply_is_a_pure_function_of_the_iteration() {
    const DEPTH: usize = 5;
    let mut model = Ramped::new(DEPTH);
    // 0..=40 in a scrambled order (7 is a unit mod 41), crossing both
    // switches and the cut-short ramp in both directions.
    for iteration in (0..41u64).map(|i| i * 7 % 41) {
        let report = model.apply(iteration);
        let mut fresh = Ramped::new(DEPTH);
        let want = fresh.apply(iteration);
        assert_eq!(recipes(&model), recipes(&fresh), "iteration {iteration}");
        assert_eq!(
            (
                report.recipe,
                report.layers_converted,
                report.linears_converted
            ),
            (want.recipe, want.layers_converted, want.linears_converted),
            "iteration {iteration}"
        );
        let again = model.apply(iteration);
        assert_eq!(again.changed, 0, "iteration {iteration} applied twice");
        assert_eq!(recipes(&model), recipes(&fresh));
    }
}

#[test]
fn the_switch_and_its_cut_short_ramp() {
    let mut model = Ramped::new(5);
    model.apply(19);
    let report = model.apply(21);
    assert_eq!(
        report.to_string(),
        "4/5 layers (10/12 linears) now fp8(pow2 = true) at iteration 21"
    );
    assert_eq!(report.changed, 10);
    // At 23 bf16 takes over from the deep end; the layer fp8 had not reached
    // yet runs fp8, the phase before, not mxfp4.
    let report = model.apply(23);
    assert_eq!(
        report.to_string(),
        "2/5 layers (6/12 linears) now bf16 at iteration 23"
    );
    let kinds: Vec<RecipeKind> = model
        .blocks
        .iter()
        .map(|b| b.qkv.recipe().expect("placed").kind)
        .collect();
    use RecipeKind::{Bf16, Fp8};
    assert_eq!(kinds, [Fp8, Fp8, Fp8, Bf16, Bf16]);
}

#[test]
fn apply_with_the_attribute_schedule_is_apply() {
    let (mut a, mut b) = (Ramped::new(4), Ramped::new(4));
    for iteration in [0, 20, 21, 22, 23, 24, 30, 3] {
        let ra = a.apply(iteration);
        let rb = b.apply_with(Ramped::schedule(), iteration).unwrap();
        assert_eq!(ra, rb);
        assert_eq!(recipes(&a), recipes(&b));
    }
}

#[test]
fn apply_names_every_linear_by_its_plan_path() {
    let mut model = Ramped::new(3);
    model.apply(0);
    assert_eq!(model.blocks[2].proj.path(), "blocks.2.proj");
    assert_eq!(model.final_layer.path(), "final_layer");
    let plan = model.plan();
    assert_eq!(plan.layers[1], ["blocks.1.qkv", "blocks.1.proj"]);
    assert_eq!(plan.extras, ["img_in", "final_layer"]);
}

#[test]
fn a_recipe_outside_the_allow_list_is_refused_and_nothing_changes() {
    let mut model = Generic {
        blocks: vec![GenericBlock {
            lin: Pinned(Recipe::new(RecipeKind::Bf16)),
        }],
    };
    let mxfp4 = Schedule::constant(Recipe::new(RecipeKind::Mxfp4));
    let err = model.apply_with(&mxfp4, 0).unwrap_err().to_string();
    assert!(
        err.ends_with(
            "recipe `mxfp4` is not allowed for this model: its #[precision] attribute names only \
             mxfp8, fp8 (every recipe is compiled in; the attribute lists those a schedule may \
             use); add `mxfp4` to the attribute's schedule to use it"
        ),
        "{err}"
    );
    assert_eq!(model.blocks[0].lin.0.kind, RecipeKind::Bf16, "untouched");
    let text = r#"(phases: [(start: 0, recipe: "fp8"), (start: 9, recipe: "mxfp4")])"#;
    let err = Generic::<Pinned>::schedule_from_ron(text)
        .unwrap_err()
        .to_string();
    assert!(err.contains("recipe `mxfp4` is not allowed"), "{err}");
}
