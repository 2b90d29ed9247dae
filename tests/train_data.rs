//! `mxswitch train` on precomputed shards with MLPerf-style evaluation:
//! the loss falls on shards, a resume continues the data bit for bit,
//! other shards are refused on resume, and the target loss stops a run.

use std::path::{Path, PathBuf};

use mxswitch::models::flux::RunConfig;
use mxswitch::train::shards::{write_synthetic_shards, ShardDType, SyntheticShards};
use mxswitch::train::{read_checkpoint, train, StepMetrics, TrainOptions, TrainSummary};

mod common;

fn tiny() -> RunConfig {
    RunConfig::load("flux-tiny").unwrap()
}

/// A synthetic dataset of `samples` in `shards` files at `dir`.
fn dataset(dir: &Path, samples: u64, shards: usize, val: bool, seed: u64) -> PathBuf {
    let cfg = tiny();
    write_synthetic_shards(
        dir,
        &cfg.model,
        &cfg.data,
        &SyntheticShards {
            samples,
            shards,
            seed,
            val,
            dtype: ShardDType::BF16,
            overwrite: false,
        },
    )
    .unwrap();
    dir.to_path_buf()
}

/// Train and validation sets under `root`: 96 training samples (24 steps an
/// epoch) and 32 validation samples.
fn sets(root: &Path) -> (PathBuf, PathBuf) {
    (
        dataset(&root.join("train"), 96, 3, false, 1),
        dataset(&root.join("val"), 32, 1, true, 1),
    )
}

fn options(out: &Path, iters: u64, data: &Path, val: &Path) -> TrainOptions {
    TrainOptions {
        iters: Some(iters),
        data: Some(data.to_path_buf()),
        val_data: Some(val.to_path_buf()),
        eval_every: Some(32),
        ..TrainOptions::new(tiny(), out)
    }
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

fn eval_losses(s: &TrainSummary) -> Vec<(u64, u32)> {
    s.evals
        .iter()
        .map(|e| (e.iter, e.eval_loss.to_bits()))
        .collect()
}

/// On shards, over several epochs and through the switch, the training and
/// the eval loss both fall; the evaluations come every 32 samples (8
/// steps) and after the last step.
#[test]
fn flux_tiny_learns_from_shards_and_the_eval_loss_falls() {
    let dir = tempfile::tempdir().unwrap();
    let (data, val) = sets(dir.path());
    let s = train(&options(&dir.path().join("run"), 80, &data, &val)).unwrap();
    let (first, last) = (mean(&s.metrics[..5]), mean(&s.metrics[75..]));
    let evals: Vec<f32> = s.evals.iter().map(|e| e.eval_loss).collect();
    eprintln!("train loss {first:.4} -> {last:.4}; eval losses {evals:?}");
    assert!(last <= 0.5 * first, "training loss fell only to {last}");
    let iters: Vec<u64> = s.evals.iter().map(|e| e.iter).collect();
    assert_eq!(iters, (0..10).map(|k| 8 * k + 7).collect::<Vec<_>>());
    assert!(evals[9] < 0.6 * evals[0], "eval loss {evals:?}");
    assert_eq!(s.evals[9].samples, 320);
    assert_eq!(s.evals[9].recipe, "fp8");
    // 80 steps of 4 over 96 samples: the checkpoint is past three epochs.
    let ckpt = read_checkpoint(&s.checkpoint, u64::MAX).unwrap();
    assert_eq!((ckpt.iteration, ckpt.samples), (80, 320));
}

/// A run stopped mid-epoch (iteration 30, samples 120) and resumed ends
/// where an uninterrupted run ends, bit for bit: steps, evaluations and
/// the data. The resume finds the shards through the record, or through
/// `--data` naming a copy of them in another folder.
#[test]
fn a_resumed_run_continues_the_data_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let (data, val) = sets(dir.path());
    let whole = train(&options(&dir.path().join("whole"), 50, &data, &val)).unwrap();

    let out = dir.path().join("parts");
    let first = train(&options(&out, 30, &data, &val)).unwrap();
    // Kept aside: the resume below replaces the folder's checkpoint.
    let at_30 = dir.path().join("at-30.safetensors");
    std::fs::copy(&first.checkpoint, &at_30).unwrap();
    let resumed = train(&TrainOptions {
        resume: Some(first.checkpoint.clone()),
        data: None,
        ..options(&out, 50, &data, &val)
    })
    .unwrap();
    let mut parts = timeless(&first.metrics);
    parts.extend(timeless(&resumed.metrics));
    assert_eq!(parts, timeless(&whole.metrics));
    // The evaluation after the last step of the first part (29) is extra;
    // every other is the uninterrupted run's.
    let mut evals = eval_losses(&first);
    evals.retain(|&(i, _)| i != 29);
    evals.extend(eval_losses(&resumed));
    assert_eq!(evals, eval_losses(&whole));

    // The same shards in another folder are the same data.
    let moved = dir.path().join("moved");
    std::fs::create_dir(&moved).unwrap();
    for f in std::fs::read_dir(&data).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, moved.join(f.file_name().unwrap())).unwrap();
    }
    let again = train(&TrainOptions {
        resume: Some(at_30),
        data: Some(moved),
        ..options(&dir.path().join("again"), 50, &data, &val)
    })
    .unwrap();
    assert_eq!(timeless(&again.metrics), timeless(&resumed.metrics));
}

/// A resume refuses other shards, and shards for a run that trained on
/// synthetic data, each in one line.
#[test]
fn a_resume_on_other_data_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (data, val) = sets(dir.path());
    let out = dir.path().join("run");
    let first = train(&options(&out, 4, &data, &val)).unwrap();
    let other = dataset(&dir.path().join("other"), 64, 2, false, 2);
    let err = train(&TrainOptions {
        resume: Some(first.checkpoint.clone()),
        data: Some(other),
        ..options(&out, 8, &data, &val)
    })
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("not the ones the run trained on") && !err.contains('\n'),
        "{err}"
    );

    let synth_out = dir.path().join("synthetic");
    let synth = train(&TrainOptions {
        iters: Some(2),
        ..TrainOptions::new(tiny(), &synth_out)
    })
    .unwrap();
    let err = train(&TrainOptions {
        iters: Some(4),
        resume: Some(synth.checkpoint),
        data: Some(data),
        ..TrainOptions::new(tiny(), &synth_out)
    })
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("trained on synthetic data"), "{err}");
}

/// `--target-loss` stops the run after the first evaluation at or below it,
/// with a checkpoint of that step.
#[test]
fn the_target_loss_stops_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let (data, val) = sets(dir.path());
    let full = train(&options(&dir.path().join("full"), 48, &data, &val)).unwrap();
    // A target the third evaluation reaches.
    let target = full.evals[2].eval_loss;
    let hit = full.evals.iter().find(|e| e.eval_loss <= target).unwrap();
    let stopped = train(&TrainOptions {
        target_loss: Some(target),
        ..options(&dir.path().join("stopped"), 48, &data, &val)
    })
    .unwrap();
    assert_eq!(stopped.target_reached, Some(hit.iter));
    assert_eq!(stopped.metrics.len() as u64, hit.iter + 1);
    let ckpt = read_checkpoint(&stopped.checkpoint, u64::MAX).unwrap();
    assert_eq!(ckpt.iteration, hit.iter + 1);
}

/// Two ranks read disjoint halves of each step's batch of shards (and both
/// evaluate the whole validation set): the losses and eval losses match one
/// process's at the same global batch within tests/data_parallel.rs's bound.
#[test]
fn two_ranks_share_the_shards_like_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let (data, val) = sets(dir.path());
    let alone = train(&options(&dir.path().join("alone"), 8, &data, &val)).unwrap();
    let runs = common::on_ranks(2, |m| {
        let out = dir.path().join(format!("rank{}", m.rank));
        train(&TrainOptions {
            dist: Some(m),
            ..options(&out, 8, &data, &val)
        })
        .unwrap()
    });
    let close = |a: f32, b: f32| (a - b).abs() <= 1e-4 * a.abs();
    for run in &runs {
        assert_eq!(run.metrics.len(), alone.metrics.len());
        for (a, b) in alone.metrics.iter().zip(&run.metrics) {
            assert!(
                close(a.loss, b.loss) && a.samples == b.samples,
                "{a:?} vs {b:?}"
            );
        }
        let evals = |s: &TrainSummary| s.evals.iter().map(|e| e.eval_loss).collect::<Vec<_>>();
        assert!(evals(&alone)
            .iter()
            .zip(evals(run))
            .all(|(a, b)| close(*a, b)));
        assert_eq!(run.evals.len(), alone.evals.len());
    }
    assert!(!dir.path().join("rank1").exists());
}
