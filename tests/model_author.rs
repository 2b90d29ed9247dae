//! What a model author relies on, on a model of this test's own: no linear
//! ever runs in a precision nobody asked for, the parameter walk is the
//! plan's, `#[layer]`, `#[high_precision]` and `#[skip]` mean what they say,
//! and a model reports which recipe each linear runs.

use mxswitch::prelude::*;
use mxswitch::runtime::plan::PlanLinear;
use mxswitch::runtime::Param;

const W: usize = 32;

#[precision(layer)]
struct Block {
    norm: Scale,
    #[quantize]
    fc1: QuantLinear,
    #[quantize]
    fc2: QuantLinear,
}

/// Not part of the plan: derives its walk, with a field left out.
#[derive(Parameters)]
struct Embed {
    proj: Dense,
    #[skip]
    #[allow(dead_code)]
    name: &'static str,
}

#[precision(mxfp4, switch_to = fp8, at = 5)]
struct Net {
    embed: Embed,
    #[layers]
    blocks: Vec<Block>,
    #[layer]
    refiner: Block,
    #[high_precision]
    head: QuantLinear,
    #[skip]
    width: usize,
}

fn block() -> Block {
    Block {
        norm: Scale::new(W),
        fc1: QuantLinear::new(W, 2 * W, true),
        fc2: QuantLinear::new(2 * W, W, true),
    }
}

fn net() -> Net {
    Net {
        embed: Embed {
            proj: Dense::new(8, W, true),
            name: "embed",
        },
        blocks: (0..2).map(|_| block()).collect(),
        refiner: block(),
        head: QuantLinear::new(W, 4, false),
        width: W,
    }
}

impl Block {
    fn forward(&self, x: &Tensor, skip_fc2: bool) -> Result<Tensor> {
        let h = self
            .fc1
            .forward(&x.rms_norm(self.norm.get()?, 1e-6)?)?
            .gelu_tanh()?;
        if skip_fc2 {
            return x.add(&h.narrow(1, 0, W)?);
        }
        x.add(&self.fc2.forward(&h)?)
    }
}

impl Net {
    /// With `lazy`, the refiner's fc2 is never called.
    fn forward(&self, x: &Tensor, lazy: bool) -> Result<Tensor> {
        let mut h = self.embed.proj.forward(x)?;
        for b in &self.blocks {
            h = b.forward(&h, false)?;
        }
        h = self.refiner.forward(&h, lazy)?;
        self.head.forward(&h)
    }
}

fn input() -> Tensor {
    let mut rng = SplitMix64::new(3);
    let v: Vec<f32> = (0..4 * 8).map(|_| rng.normal()).collect();
    Tensor::from_vec(v, [4, 8], &Device::Cpu).unwrap()
}

#[test]
fn a_linear_no_plan_placed_is_an_error_that_names_it() {
    // A linear of its own: allocate gives it weights, but no plan placed it.
    let mut lin = QuantLinear::new(W, 4, false);
    allocate(&mut lin, 0).unwrap();
    let e = lin.forward(&Tensor::zeros([2, W], DType::F32, &Device::Cpu).unwrap());
    let msg = e.unwrap_err().to_string();
    assert!(
        msg.starts_with("a quantized linear (32 -> 4 features) has no recipe"),
        "{msg}"
    );
    // Once a walk has named it, the error says where it is.
    let mut model = net();
    let x = Tensor::zeros([2, 8], DType::F32, &Device::Cpu).unwrap();
    assert!(matches!(
        model.forward(&x, false),
        Err(Error::NotAllocated { .. })
    ));
    // Weights put in by hand (as a loader would), without `allocate`.
    model.visit_params("", &mut |slot| {
        let zeros = Tensor::zeros(slot.shape.clone(), DType::F32, &Device::Cpu).unwrap();
        *slot.param = Some(Param::new(zeros).unwrap());
    });
    let x = Tensor::zeros([2, 2 * W], DType::F32, &Device::Cpu).unwrap();
    let e = model.blocks[1].fc2.forward(&x).unwrap_err();
    assert!(matches!(e, Error::Unplanned { .. }));
    assert!(
        e.to_string()
            .starts_with("quantized linear `blocks.1.fc2` has no recipe"),
        "{e}"
    );
}

#[test]
fn allocate_puts_every_linear_in_the_first_phase() {
    let mut model = net();
    assert!(model.recipes().linears.iter().all(|l| l.recipe.is_none()));
    allocate(&mut model, 7).unwrap();
    assert_eq!(
        model.blocks[1].fc2.seed, 7,
        "stochastic rounding takes the run's seed"
    );
    let report = model.recipes();
    assert_eq!(report.linears.len(), 6);
    for l in &report.linears {
        assert_eq!(
            l.recipe.map(|r| r.kind),
            Some(RecipeKind::Mxfp4),
            "{}",
            l.path
        );
    }
    // The high-precision head runs BF16 from the start and is not in the plan.
    assert_eq!(model.head.recipe().map(|r| r.kind), Some(RecipeKind::Bf16));
    assert_eq!(report.linear("head"), None);
    model.forward(&input(), false).unwrap();
}

#[test]
fn the_plan_holds_layers_a_single_layer_and_no_high_precision_linear() {
    let model = net();
    let plan = model.plan();
    assert_eq!(
        plan.layers,
        [
            vec!["blocks.0.fc1", "blocks.0.fc2"],
            vec!["blocks.1.fc1", "blocks.1.fc2"],
            vec!["refiner.fc1", "refiner.fc2"],
        ]
    );
    assert!(plan.extras.is_empty());
    assert_eq!(model.width, W);
}

#[test]
fn high_precision_linears_stay_bf16_through_the_switch() {
    let mut model = net();
    allocate(&mut model, 0).unwrap();
    let sw = model.apply(5);
    assert_eq!(
        sw.to_string(),
        "3/3 layers (6/6 linears) now fp8 at iteration 5"
    );
    assert_eq!(
        model.recipes().layer(2).map(|r| r.kind),
        Some(RecipeKind::Fp8)
    );
    assert_eq!(model.head.recipe().map(|r| r.kind), Some(RecipeKind::Bf16));
    let text = model.recipes().to_string();
    assert!(text.contains("refiner.fc2 (layer 2): fp8"), "{text}");
}

#[test]
fn parameter_paths_are_the_plan_paths() {
    let mut model = net();
    allocate(&mut model, 0).unwrap();
    let names: Vec<String> = named_params(&mut model)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            "embed.proj.weight",
            "embed.proj.bias",
            "blocks.0.norm.scale",
            "blocks.0.fc1.weight",
            "blocks.0.fc1.bias",
            "blocks.0.fc2.weight",
            "blocks.0.fc2.bias",
            "blocks.1.norm.scale",
            "blocks.1.fc1.weight",
            "blocks.1.fc1.bias",
            "blocks.1.fc2.weight",
            "blocks.1.fc2.bias",
            "refiner.norm.scale",
            "refiner.fc1.weight",
            "refiner.fc1.bias",
            "refiner.fc2.weight",
            "refiner.fc2.bias",
            "head.weight",
        ]
    );
    for linear in model.plan().layers.concat() {
        assert!(names.contains(&format!("{linear}.weight")), "{linear}");
    }
}

#[test]
fn flux_checkpoint_paths_are_its_plan_paths() {
    use mxswitch::models::flux::{Flux, RunConfig};
    let cfg = RunConfig::load("flux-tiny").unwrap();
    let mut model = Flux::new(&cfg.model);
    let mut names = Vec::new();
    model.visit_params("", &mut |slot| names.push(slot.path));
    let plan = model.plan();
    for linear in plan.layers.concat().iter().chain(&plan.extras) {
        assert!(names.contains(&format!("{linear}.weight")), "{linear}");
    }
    assert!(names.contains(&"double_blocks.0.img_norm.query_norm.scale".to_string()));
    assert!(names.contains(&"final_layer.ada_ln_modulation.weight".to_string()));
}

#[test]
fn warmup_names_the_linears_the_forward_never_calls() {
    let mut model = net();
    allocate(&mut model, 0).unwrap();
    let mut opt = AdamW::new(AdamWConfig::default()).unwrap();
    let x = input();
    let target = Tensor::zeros([4, 4], DType::F32, &Device::Cpu).unwrap();
    let step = |lazy: bool| {
        let (x, target) = (x.clone(), target.clone());
        move |m: &mut Net, o: &mut AdamW| {
            let loss = mse_loss(&m.forward(&x, lazy)?, &target)?;
            let grads = loss.backward()?;
            optimizer_step(m, o, &grads)
        }
    };
    let e = warmup(&mut model, &mut opt, Net::schedule(), 0, step(true)).unwrap_err();
    assert!(matches!(e, Error::Plan(_)));
    assert_eq!(
        e.to_string(),
        "warm-up: the model's forward never called 1 of its 6 #[quantize] linears during the `mxfp4` step: refiner.fc2; call each one in the forward, or remove its mark"
    );
    let report = warmup(&mut model, &mut opt, Net::schedule(), 0, step(false)).unwrap();
    assert_eq!(report.runs.len(), 2);
}
