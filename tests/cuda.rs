//! The CUDA backend from the training job's side.
//!
//! On a machine without a GPU (CI), `--device cuda` must fail with one line
//! that says what was looked for and where. With a GPU, the ignored test
//! trains flux-tiny on the CPU and on the GPU and compares the losses:
//! `cargo test --release --test cuda -- --ignored` (or build it with
//! `--no-run` and run the test binary on the GPU machine).

use std::process::Command;

use mxswitch::models::flux::RunConfig;
use mxswitch::runtime::Device;
use mxswitch::train::{train, TrainOptions, TrainSummary};

#[test]
fn cuda_device_fails_with_one_line_without_a_gpu() {
    if Device::Cuda(0).is_available() {
        eprintln!("skipped: this machine has a GPU, so there is no failure to check");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mxswitch"))
        .args([
            "train",
            "--config",
            "flux-tiny",
            "--device",
            "cuda",
            "--out",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected: {err}");
    assert!(lines[0].starts_with("error: --device cuda: "), "{err}");
    assert!(
        lines[0].contains("libcuda") && lines[0].contains("LD_LIBRARY_PATH"),
        "must say what was looked for and where: {err}"
    );
}

fn run(device: Device, out: &std::path::Path) -> TrainSummary {
    train(&TrainOptions {
        iters: Some(20),
        switch_at: Some(10),
        device,
        ..TrainOptions::new(RunConfig::load("flux-tiny").unwrap(), out)
    })
    .unwrap()
}

/// Over the first 20 steps (MXFP4 for 10, then FP8) the GPU loss follows the
/// CPU loss within 1e-3 relative per step: the quantizers are bit-exact and
/// the GEMMs differ only in accumulation order and Hopper's FP8 accumulator.
/// Measured on an H200: at most 1.6e-5 (2026-11-29).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn flux_tiny_on_cuda_follows_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let cpu = run(Device::Cpu, &dir.path().join("cpu"));
    let gpu = run(Device::Cuda(0), &dir.path().join("cuda"));
    let mut worst = 0.0f64;
    for (c, g) in cpu.metrics.iter().zip(&gpu.metrics) {
        let rel = ((g.loss - c.loss) / c.loss).abs() as f64;
        eprintln!(
            "iter {:>2} {:>6}: cpu {:.5}  cuda {:.5}  rel {:.2e}",
            c.iter, c.recipe, c.loss, g.loss, rel
        );
        worst = worst.max(rel);
        assert_eq!(
            (c.recipe.as_str(), c.linears_converted),
            (g.recipe.as_str(), g.linears_converted)
        );
        assert!(
            (c.saved_bytes_per_element - g.saved_bytes_per_element).abs() < 1e-9,
            "saved bytes per element differ"
        );
    }
    eprintln!("worst relative loss difference {worst:.2e}");
    assert!(worst <= 1e-3, "the GPU loss left the CPU's by {worst:.2e}");
    assert_eq!(gpu.switches, cpu.switches);
}
