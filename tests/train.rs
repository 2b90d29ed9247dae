//! Evidence that training through the switch works (issue: Flux models and
//! the training job): flux-tiny, 80 iterations, switch at 40.

use std::path::Path;

use mxswitch::models::flux::{Flux, RunConfig};
use mxswitch::runtime::ops::scaled_dot_product_attention;
use mxswitch::runtime::{DType, Device, Tensor};
use mxswitch::train::{train, StepMetrics, TrainOptions, TrainSummary};

fn tiny() -> RunConfig {
    RunConfig::load("flux-tiny").unwrap()
}

fn run(config: RunConfig, out: &Path, iters: u64, resume: Option<&Path>) -> TrainSummary {
    train(&TrainOptions {
        iters: Some(iters),
        switch_at: Some(40),
        resume: resume.map(Path::to_path_buf),
        ..TrainOptions::new(config, out)
    })
    .unwrap()
}

fn mean(m: &[StepMetrics]) -> f64 {
    m.iter().map(|s| s.loss as f64).sum::<f64>() / m.len() as f64
}

/// Metrics without the wall-clock field.
fn timeless(m: &[StepMetrics]) -> Vec<StepMetrics> {
    m.iter()
        .map(|s| StepMetrics {
            step_time_ms: 0.0,
            ..s.clone()
        })
        .collect()
}

#[test]
fn flux_tiny_trains_through_the_switch() {
    let dir = tempfile::tempdir().unwrap();
    let a = run(tiny(), &dir.path().join("a"), 80, None);
    let m = &a.metrics;
    assert_eq!(m.len(), 80);
    let (first, last) = (mean(&m[..5]), mean(&m[75..]));
    eprintln!(
        "loss: first 5 {first:.4}, last 5 {last:.4} ({:.2}x)",
        last / first
    );
    assert!(last <= 0.5 * first, "loss fell from {first} to only {last}");
    let (before, after) = (mean(&m[30..40]), mean(&m[40..50]));
    eprintln!(
        "loss around the switch: 30-39 {before:.4}, 40-49 {after:.4} ({:.2}x)",
        after / before
    );
    assert!(
        after <= 1.25 * before,
        "loss spike at the switch: {before} -> {after}"
    );

    // The schedule: mxfp4 before 40, fp8 from 40 on, all 4 layers and 24 linears.
    for s in m {
        let want = if s.iter < 40 { "mxfp4" } else { "fp8" };
        assert_eq!(
            (s.recipe.as_str(), s.layers_converted, s.linears_converted),
            (want, 4, 24),
            "iteration {}",
            s.iter
        );
        // Saved bytes per element of the model's linears (SPEC section 4).
        if s.iter < 40 {
            assert!(
                (s.saved_bytes_per_element - 0.53125).abs() <= 0.001,
                "{}",
                s.saved_bytes_per_element
            );
        } else {
            assert!(
                (1.0..=1.01).contains(&s.saved_bytes_per_element),
                "{}",
                s.saved_bytes_per_element
            );
        }
    }
    assert_eq!(
        a.switches,
        [
            "4/4 layers (24/24 linears) now mxfp4 at iteration 0",
            "4/4 layers (24/24 linears) now fp8 at iteration 40"
        ]
    );

    // metrics.jsonl: one object per step with exactly these keys.
    let text = std::fs::read_to_string(dir.path().join("a/metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 80);
    let mut keys: Vec<&str> = lines[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "device_peak_bytes",
            "iter",
            "layers_converted",
            "linears_converted",
            "loss",
            "lr",
            "recipe",
            "samples",
            "saved_bytes_per_element",
            "step_time_ms"
        ]
    );
    assert_eq!(&std::fs::read(&a.plot).unwrap()[1..4], b"PNG");

    // Same seed, same metrics (wall clock aside).
    let b = run(tiny(), &dir.path().join("b"), 80, None);
    assert_eq!(timeless(&a.metrics), timeless(&b.metrics));

    // Resume from a checkpoint at 50 (past the switch): bit-identical continuation, switched.
    let half = run(tiny(), &dir.path().join("c"), 50, None);
    assert_eq!(timeless(&half.metrics), timeless(&a.metrics[..50]));
    let rest = run(tiny(), &dir.path().join("d"), 80, Some(&half.checkpoint));
    assert_eq!(rest.metrics.first().map(|s| s.iter), Some(50));
    assert_eq!(rest.metrics[0].recipe, "fp8");
    assert_eq!(timeless(&rest.metrics), timeless(&a.metrics[50..]));
}

/// With BF16 activations q, k and v reach attention in one dtype (attention
/// rejects mixed dtypes, so a step that completes shows it) and the loss is finite.
#[test]
fn bf16_activations_train() {
    let q = Tensor::from_vec(vec![0.5; 8], [1, 1, 2, 4], &Device::Cpu).unwrap();
    let k = q.to_dtype(DType::BF16).unwrap();
    assert!(
        scaled_dot_product_attention(&q, &k, &k).is_err(),
        "attention must reject mixed dtypes"
    );
    let mut cfg = tiny();
    cfg.train.activations = "bf16".into();
    let dir = tempfile::tempdir().unwrap();
    let s = run(cfg, dir.path(), 3, None);
    assert!(s.metrics.iter().all(|m| m.loss.is_finite()));
}

/// A guidance-distilled config trains its guidance embedder too.
#[test]
fn guidance_embed_trains() {
    let mut cfg = tiny();
    cfg.model.guidance_embed = true;
    let dir = tempfile::tempdir().unwrap();
    let s = run(cfg, dir.path(), 2, None);
    assert!(s.metrics.iter().all(|m| m.loss.is_finite()));
    let ckpt = std::fs::read(&s.checkpoint).unwrap();
    let st = safetensors::SafeTensors::deserialize(&ckpt).unwrap();
    assert!(
        st.names()
            .iter()
            .any(|n| n.starts_with("adamw.m.guidance_in.")),
        "guidance_in got no optimizer step"
    );
}

/// Flux.1-schnell's plan without allocating its 12B parameters.
#[test]
fn schnell_plan_without_weights() {
    let cfg = RunConfig::load("flux-schnell").unwrap();
    let model = Flux::new(&cfg.model);
    let plan = model.plan();
    assert_eq!(
        (plan.len(), plan.linears(), plan.extras.len()),
        (57, 304, 0)
    );
    assert_eq!(plan.layers[0].len(), 8);
    assert_eq!(
        plan.layers[56],
        [
            "single_blocks.37.qkv",
            "single_blocks.37.proj",
            "single_blocks.37.mlp_fc1",
            "single_blocks.37.mlp_fc2"
        ]
    );
    assert!(model.double_blocks[0].img_qkv.params.weight.is_none());
}

#[test]
fn a_depth_zero_model_is_an_error_when_built() {
    let mut cfg = tiny();
    cfg.model.depth = 0;
    cfg.model.depth_single_blocks = 0;
    let dir = tempfile::tempdir().unwrap();
    let err = train(&TrainOptions {
        iters: Some(2),
        ..TrainOptions::new(cfg, dir.path())
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("no quantized linear"), "{err}");
}
