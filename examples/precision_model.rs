//! A small model annotated with `#[precision]`, trained through an
//! MXFP4 -> FP8 switch with a ramp: the DSL end to end in one file.
//!
//! `cargo run --release --example precision_model`
//!
//! The task: regress y = sin(A x) from x with a stack of residual MLP blocks.
//! Each block is one plan layer with two quantized linears; the input and
//! output projections stay in f32.

use mxswitch::precision;
use mxswitch::runtime::linear::QuantLinear;
use mxswitch::runtime::module::{allocate, optimizer_step, Dense, SplitMix64};
use mxswitch::runtime::ops::mse_loss;
use mxswitch::runtime::optim::{clip_grad_norm, AdamW, AdamWConfig};
use mxswitch::runtime::warmup::warmup;
use mxswitch::runtime::{Device, Result, Tensor};

const WIDTH: usize = 64;
const DEPTH: usize = 4;
const BATCH: usize = 128;
const STEPS: u64 = 60;

/// One residual block: x + fc2(gelu(fc1(norm(x)))).
#[precision(layer)]
struct Block {
    #[quantize]
    fc1: QuantLinear,
    #[quantize]
    fc2: QuantLinear,
}

/// Four blocks; MXFP4 until iteration 30, then FP8, two blocks per iteration.
#[precision(mxfp4, switch_to = fp8, at = 30, layers_per_iter = 2)]
struct Mlp {
    input: Dense,
    #[layers]
    blocks: Vec<Block>,
    output: Dense,
}

impl Mlp {
    fn new() -> Self {
        Mlp {
            input: Dense::new(16, WIDTH, true),
            blocks: (0..DEPTH)
                .map(|_| Block {
                    fc1: QuantLinear::new(WIDTH, 4 * WIDTH, true),
                    fc2: QuantLinear::new(4 * WIDTH, WIDTH, true),
                })
                .collect(),
            output: Dense::new(WIDTH, 8, true),
        }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self.input.forward(x)?;
        for b in &self.blocks {
            h = h.add(
                &b.fc2
                    .forward(&b.fc1.forward(&h.layer_norm(1e-6)?)?.gelu_tanh()?)?,
            )?;
        }
        self.output.forward(&h)
    }
}

/// A seeded batch of (x, sin(A x)).
fn batch(step: u64, a: &[f32]) -> Result<(Tensor, Tensor)> {
    let mut rng = SplitMix64::new(1000 + step);
    let x: Vec<f32> = (0..BATCH * 16).map(|_| rng.normal()).collect();
    let mut y = Vec::with_capacity(BATCH * 8);
    for row in x.chunks(16) {
        for coeffs in a.chunks(16) {
            y.push(
                coeffs
                    .iter()
                    .zip(row)
                    .map(|(c, v)| c * v)
                    .sum::<f32>()
                    .sin(),
            );
        }
    }
    Ok((
        Tensor::from_vec(x, [BATCH, 16], &Device::Cpu)?,
        Tensor::from_vec(y, [BATCH, 8], &Device::Cpu)?,
    ))
}

fn step(model: &mut Mlp, opt: &mut AdamW, it: u64, a: &[f32]) -> Result<f32> {
    let (x, y) = batch(it, a)?;
    let loss = mse_loss(&model.forward(&x)?, &y)?;
    let value = loss.to_scalar_f32()?;
    let mut grads = loss.backward()?;
    clip_grad_norm(&mut grads, 1.0)?;
    optimizer_step(model, opt, &grads)?;
    Ok(value)
}

fn main() -> Result<()> {
    let mut model = Mlp::new();
    let plan = model.plan();
    let phases: Vec<String> = Mlp::schedule()
        .phases()
        .iter()
        .map(|p| format!("{} @ {}", p.recipe, p.start))
        .collect();
    println!(
        "plan: {} layers, {} quantized linears; schedule [{}]",
        plan.len(),
        plan.linears(),
        phases.join(", ")
    );
    allocate(&mut model, 0)?;
    let mut rng = SplitMix64::new(7);
    let a: Vec<f32> = (0..8 * 16).map(|_| rng.normal() * 0.3).collect();
    let mut opt = AdamW::new(AdamWConfig {
        lr: 3e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    })?;
    let report = warmup(&mut model, &mut opt, Mlp::schedule(), 0, |m, o| {
        step(m, o, 0, &a).map(|_| ())
    })?;
    println!("{report}");
    for it in 0..STEPS {
        let sw = model.apply(it);
        if sw.changed > 0 {
            println!("{sw}");
        }
        let loss = step(&mut model, &mut opt, it, &a)?;
        if it % 10 == 0 || it == STEPS - 1 {
            println!("iteration {it:>3}: loss {loss:.4} ({})", sw.recipe);
        }
    }
    Ok(())
}

/// CI runs the whole example (`[[example]] test = true` in Cargo.toml).
#[test]
fn example_trains_through_the_switch() {
    main().unwrap();
}
