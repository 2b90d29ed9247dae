//! Per-GEMM precision end to end (SPEC section 4a): flux-tiny trains with a
//! schedule whose second phase keeps the MXFP4 forward and runs the backward
//! in FP8, read from RON as a run config would carry it.

use std::path::Path;

use mxswitch::models::flux::RunConfig;
use mxswitch::runtime::schedule_config::ScheduleConfig;
use mxswitch::train::{train, StepMetrics, TrainOptions, TrainSummary};

const ITERS: u64 = 30;
const SWITCH: u64 = 15;

fn run(schedule: &str, out: &Path) -> TrainSummary {
    let mut config = RunConfig::load("flux-tiny").unwrap();
    config.schedule = ScheduleConfig::from_ron(schedule).unwrap();
    train(&TrainOptions {
        iters: Some(ITERS),
        ..TrainOptions::new(config, out)
    })
    .unwrap()
}

fn losses(m: &[StepMetrics]) -> Vec<f32> {
    m.iter().map(|s| s.loss).collect()
}

#[test]
fn an_fp8_backward_phase_trains_and_changes_only_the_backward() {
    let dir = tempfile::tempdir().unwrap();
    let per_gemm = run(
        &format!(
            r#"(phases: [(start: 0, recipe: "mxfp4"), (start: {SWITCH}, recipe: "mxfp4", options: (dgrad: "fp8", wgrad: "fp8"))])"#
        ),
        &dir.path().join("per_gemm"),
    );
    let m = &per_gemm.metrics;
    assert_eq!(m.len(), ITERS as usize);
    for s in m {
        let (name, saved) = if s.iter < SWITCH {
            ("mxfp4", 0.53125)
        } else {
            ("mxfp4(dgrad = fp8, wgrad = fp8)", 1.0)
        };
        assert_eq!(s.recipe, name, "iteration {}", s.iter);
        assert_eq!((s.layers_converted, s.linears_converted), (4, 24));
        // Saved for backward: x and W as the FP8 GEMMs read them (plus scalars).
        assert!(
            (saved..=saved + 0.01).contains(&s.saved_bytes_per_element),
            "iteration {}: {} saved bytes per element, want {saved}",
            s.iter,
            s.saved_bytes_per_element
        );
        assert!(s.loss.is_finite(), "iteration {}: loss {}", s.iter, s.loss);
    }
    assert_eq!(
        per_gemm.switches,
        [
            "4/4 layers (24/24 linears) now mxfp4 at iteration 0",
            format!("4/4 layers (24/24 linears) now mxfp4(dgrad = fp8, wgrad = fp8) at iteration {SWITCH}").as_str(),
        ]
    );
    let first: f32 = m[..5].iter().map(|s| s.loss).sum();
    let last: f32 = m[m.len() - 5..].iter().map(|s| s.loss).sum();
    assert!(
        last < first,
        "loss did not fall: {first} -> {last} (sums of 5)"
    );

    // Against MXFP4 throughout: the same steps until the switch (the forward
    // of the switch step is MXFP4 in both), different ones after it.
    let mxfp4 = run(
        r#"(phases: [(start: 0, recipe: "mxfp4")])"#,
        &dir.path().join("mxfp4"),
    );
    let (a, b) = (losses(m), losses(&mxfp4.metrics));
    let switch = SWITCH as usize;
    assert_eq!(
        a[..=switch],
        b[..=switch],
        "identical up to the switch step"
    );
    assert_ne!(
        a[switch + 1..],
        b[switch + 1..],
        "the FP8 backward changed the updates"
    );
}
