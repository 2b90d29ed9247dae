//! The recipes added with SPEC sections 2b and 3b train Flux on the CPU:
//! flux-tiny through `[nvfp4 @ 0, fp8_block @ 40]` for 80 iterations, read
//! from `tests/configs/flux-tiny-nvfp4.ron`, with the bounds of
//! `tests/train.rs`'s mxfp4 -> fp8 run.

use std::path::Path;

use mxswitch::models::flux::{Flux, RunConfig};
use mxswitch::runtime::plan::PrecisionModel;
use mxswitch::runtime::recipe::RecipeKind;
use mxswitch::train::{train, StepMetrics, TrainOptions, TrainSummary};

const CONFIG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/configs/flux-tiny-nvfp4.ron"
);
const ITERS: u64 = 80;
const SWITCH: u64 = 40;

fn run(config: RunConfig, out: &Path) -> TrainSummary {
    train(&TrainOptions {
        iters: Some(ITERS),
        ..TrainOptions::new(config, out)
    })
    .unwrap()
}

fn mean(m: &[StepMetrics]) -> f64 {
    m.iter().map(|s| s.loss as f64).sum::<f64>() / m.len() as f64
}

/// Flux's attribute keeps its production schedule and allows the new rows.
#[test]
fn flux_allows_the_new_recipes() {
    assert_eq!(
        Flux::RECIPES,
        [
            RecipeKind::Mxfp4,
            RecipeKind::Fp8,
            RecipeKind::Nvfp4,
            RecipeKind::Fp8Rowwise,
            RecipeKind::Fp8Block
        ]
    );
    assert_eq!(
        Flux::SCHEDULE_TEXT,
        "[mxfp4 @ 0, fp8 @ 12000], layers_per_iter = 0, order = deep_to_shallow"
    );
}

#[test]
fn flux_tiny_trains_through_nvfp4_then_fp8_block() {
    let config = RunConfig::load(CONFIG).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let a = run(config, dir.path());
    let m = &a.metrics;
    assert_eq!(m.len(), ITERS as usize);
    let (first, last) = (mean(&m[..5]), mean(&m[75..]));
    eprintln!(
        "nvfp4 -> fp8_block loss: first 5 {first:.4}, last 5 {last:.4} ({:.2}x)",
        last / first
    );
    assert!(last <= 0.5 * first, "loss fell from {first} to only {last}");
    // The bound of tests/train.rs: the ten steps after the switch average
    // at most 1.25 times the ten before it.
    let (before, after) = (mean(&m[30..40]), mean(&m[40..50]));
    eprintln!(
        "loss around the switch: 30-39 {before:.4}, 40-49 {after:.4} ({:.2}x)",
        after / before
    );
    assert!(
        after <= 1.25 * before,
        "loss spike at the switch: {before} -> {after}"
    );
    for s in m {
        let want = if s.iter < SWITCH {
            "nvfp4"
        } else {
            "fp8_block"
        };
        assert_eq!(
            (s.recipe.as_str(), s.layers_converted, s.linears_converted),
            (want, 4, 24),
            "iteration {}",
            s.iter
        );
        assert!(s.loss.is_finite(), "iteration {}: loss {}", s.iter, s.loss);
    }
    // Saved for backward, as the runtime counts it for flux-tiny's linears:
    // nvfp4 0.5625 plus the f32 tensor scales; fp8_block a byte per element
    // plus two f32 per block, where flux-tiny's short axes (M = 96 rows, N
    // of 64 to 256) make many blocks shorter than 128, so the scales' share
    // is above the 1/16 of whole blocks.
    let (nv, fb) = (m[0].saved_bytes_per_element, m[79].saved_bytes_per_element);
    eprintln!("saved bytes per element: nvfp4 {nv:.5}, fp8_block {fb:.5}");
    assert!((0.5625..0.57).contains(&nv), "nvfp4 {nv}");
    assert!((1.0625..1.125).contains(&fb), "fp8_block {fb}");
    assert_eq!(
        a.switches,
        [
            "4/4 layers (24/24 linears) now nvfp4 at iteration 0",
            "4/4 layers (24/24 linears) now fp8_block at iteration 40"
        ]
    );
}

/// The H200 run of the README: flux-small's model, data and learning rate,
/// with the schedule of the flux-tiny run above.
#[test]
fn flux_small_nvfp4_config_is_flux_small_with_the_new_schedule() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/configs/flux-small-nvfp4.ron"
    );
    let (c, small, tiny) = (
        RunConfig::load(path).unwrap(),
        RunConfig::load("flux-small").unwrap(),
        RunConfig::load(CONFIG).unwrap(),
    );
    assert_eq!((&c.model, &c.data), (&small.model, &small.data));
    assert_eq!(
        (c.train.lr, &c.train.activations),
        (small.train.lr, &small.train.activations)
    );
    assert_eq!((c.train.iters, &c.schedule), (ITERS, &tiny.schedule));
}
