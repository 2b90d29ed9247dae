//! A model of one's own, a tiny MLP-Mixer, trained through an MXFP4 -> FP8
//! switch by the generic loop: the model is the page below, with nothing
//! but the prelude.
//!
//! `cargo run --release --example custom_model` writes `runs/custom_model`
//! (metrics.jsonl, loss.png, checkpoint.safetensors); `cargo test` runs it
//! too, into a temporary folder.
//!
//! The task: each sample is 8 patches of 16 values; the target is a fixed
//! random "teacher" mixing of them, so both the token-mixing and the
//! channel-mixing MLPs have something to learn.

use mxswitch::prelude::*;

const PATCHES: usize = 8;
const CHANNELS: usize = 16;
const WIDTH: usize = 32;
const DEPTH: usize = 3;
const BATCH: usize = 32;
const OUTPUTS: usize = 4;

/// x + mlp(norm(x)) over the last axis: in -> hidden -> in.
#[derive(Parameters)]
struct Mixing {
    norm: Scale,
    fc1: Dense,
    fc2: Dense,
}

/// One Mixer block: a token-mixing MLP across the patches, then a
/// channel-mixing MLP across the features. Its four big linears are MXFP4
/// until the switch; the norms stay in f32.
#[precision(layer)]
struct MixerBlock {
    token_norm: Scale,
    #[quantize]
    token_fc1: QuantLinear,
    #[quantize]
    token_fc2: QuantLinear,
    channel_norm: Scale,
    #[quantize]
    channel_fc1: QuantLinear,
    #[quantize]
    channel_fc2: QuantLinear,
}

/// Patch embedding, the Mixer blocks, a pooled head. The blocks switch to
/// FP8 at iteration 20, one plan layer per iteration.
#[precision(mxfp4, switch_to = fp8, at = 20, layers_per_iter = 1)]
struct Mixer {
    embed: Dense,
    #[layers]
    blocks: Vec<MixerBlock>,
    head: Mixing,
    out: Dense,
}

impl MixerBlock {
    fn new() -> Self {
        MixerBlock {
            token_norm: Scale::new(WIDTH),
            token_fc1: QuantLinear::new(PATCHES, 4 * PATCHES, true),
            token_fc2: QuantLinear::new(4 * PATCHES, PATCHES, true),
            channel_norm: Scale::new(WIDTH),
            channel_fc1: QuantLinear::new(WIDTH, 4 * WIDTH, true),
            channel_fc2: QuantLinear::new(4 * WIDTH, WIDTH, true),
        }
    }

    /// x [B, P, D] -> [B, P, D].
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let t = x.rms_norm(self.token_norm.get()?, 1e-6)?.transpose(1, 2)?; // [B, D, P]
        let t = self
            .token_fc2
            .forward(&self.token_fc1.forward(&t)?.gelu_tanh()?)?;
        let x = x.add(&t.transpose(1, 2)?)?;
        let c = x.rms_norm(self.channel_norm.get()?, 1e-6)?;
        let c = self
            .channel_fc2
            .forward(&self.channel_fc1.forward(&c)?.gelu_tanh()?)?;
        x.add(&c)
    }
}

impl Mixer {
    fn new() -> Self {
        Mixer {
            embed: Dense::new(CHANNELS, WIDTH, true),
            blocks: (0..DEPTH).map(|_| MixerBlock::new()).collect(),
            head: Mixing {
                norm: Scale::new(WIDTH),
                fc1: Dense::new(WIDTH, WIDTH, true),
                fc2: Dense::new(WIDTH, WIDTH, true),
            },
            out: Dense::new(WIDTH, OUTPUTS, true),
        }
    }

    /// x [B, P, C] -> [B, OUTPUTS].
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self.embed.forward(x)?;
        for block in &self.blocks {
            h = block.forward(&h)?;
        }
        let pooled = h.mean(&[1], false)?; // [B, D]
        let n = pooled.rms_norm(self.head.norm.get()?, 1e-6)?;
        let mixed = self
            .head
            .fc2
            .forward(&self.head.fc1.forward(&n)?.gelu_tanh()?)?;
        self.out.forward(&pooled.add(&mixed)?)
    }
}

/// The seeded batch of `iteration`: x and the teacher's target.
fn batch(iteration: u64, teacher: &[f32]) -> Result<(Tensor, Tensor)> {
    let mut rng = SplitMix64::new(1 + iteration);
    let x: Vec<f32> = (0..BATCH * PATCHES * CHANNELS)
        .map(|_| rng.normal())
        .collect();
    let mut y = Vec::with_capacity(BATCH * OUTPUTS);
    for sample in x.chunks(PATCHES * CHANNELS) {
        for weights in teacher.chunks(PATCHES * CHANNELS) {
            let dot: f32 = weights.iter().zip(sample).map(|(w, v)| w * v).sum();
            y.push(dot.tanh());
        }
    }
    Ok((
        Tensor::from_vec(x, [BATCH, PATCHES, CHANNELS], &Device::Cpu)?,
        Tensor::from_vec(y, [BATCH, OUTPUTS], &Device::Cpu)?,
    ))
}

/// Build, allocate and train the Mixer for `iters` steps into `out`.
fn train(iters: u64, out: &std::path::Path) -> Result<FitSummary> {
    let mut model = Mixer::new();
    model.checked_plan()?;
    allocate(&mut model, 0)?;
    println!("{}", model.recipes());
    let mut rng = SplitMix64::new(99);
    let teacher: Vec<f32> = (0..OUTPUTS * PATCHES * CHANNELS)
        .map(|_| rng.normal() * 0.1)
        .collect();
    let mut opt = AdamW::new(AdamWConfig {
        lr: 2e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.0,
    })?;
    let mut opts = FitOptions::new(iters, out);
    opts.clip_norm = Some(1.0);
    opts.overwrite = true;
    fit(&mut model, &mut opt, opts, |model, step| {
        let (x, y) = batch(step.iteration, &teacher)?;
        mse_loss(&model.forward(&x)?, &y)
    })
}

fn main() -> Result<()> {
    let summary = train(40, std::path::Path::new("runs/custom_model"))?;
    let first = &summary.metrics[0];
    let last = summary.metrics.last().expect("40 steps");
    println!(
        "loss {:.4} ({}) -> {:.4} ({}); files in {}",
        first.loss,
        first.recipe,
        last.loss,
        last.recipe,
        summary
            .checkpoint
            .parent()
            .map_or(String::new(), |p| p.display().to_string())
    );
    Ok(())
}

/// `cargo test` trains it through the switch and checks what it promises.
#[test]
fn the_mixer_trains_through_the_switch() {
    let dir = std::env::temp_dir().join(format!("mxswitch-custom-{}", std::process::id()));
    let summary = train(30, &dir).unwrap();
    let recipes: Vec<&str> = summary.metrics.iter().map(|m| m.recipe.as_str()).collect();
    assert_eq!(recipes[0], "mxfp4");
    assert_eq!(recipes[29], "fp8");
    // Layers on the recipe in force: all 3 on MXFP4 at iteration 19, then
    // one plan layer per iteration moves to FP8 from 20 on.
    let converted: Vec<usize> = summary.metrics.iter().map(|m| m.layers_converted).collect();
    assert_eq!(&converted[19..23], &[3, 1, 2, 3]);
    let (first, last) = (summary.metrics[0].loss, summary.metrics[29].loss);
    assert!(last < first, "the loss falls: {first} -> {last}");
    assert!(summary.checkpoint.is_file() && summary.plot.is_file());
    std::fs::remove_dir_all(&dir).unwrap();
}
