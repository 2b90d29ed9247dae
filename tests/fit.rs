//! The generic training loop on a `#[precision]` model of this test's own:
//! metrics through the switch, a bit-identical resume, a diverged loss and
//! a refused output folder.

use std::path::Path;

use mxswitch::precision;
use mxswitch::runtime::is_grad_enabled;
use mxswitch::runtime::linear::QuantLinear;
use mxswitch::runtime::lr_schedule::{Decay, LrSchedule};
use mxswitch::runtime::module::{allocate, named_params, Dense, SplitMix64};
use mxswitch::runtime::ops::mse_loss;
use mxswitch::runtime::optim::{AdamW, AdamWConfig};
use mxswitch::runtime::{Device, Error, Result, Tensor};
use mxswitch::train::{
    fit, read_checkpoint, Eval, Fit, FitOptions, FitSummary, MetricsRow, Resume, Step, StepMetrics,
};

const IN: usize = 16;
const WIDTH: usize = 64;
const OUT: usize = 8;
const BATCH: usize = 32;
/// The attribute's switch.
const SWITCH: u64 = 3;

/// One residual block: x + fc2(gelu(fc1(norm(x)))).
#[precision(layer)]
struct Block {
    #[quantize]
    fc1: QuantLinear,
    #[quantize]
    fc2: QuantLinear,
}

/// Two blocks; MXFP4 until iteration 3, then FP8.
#[precision(mxfp4, switch_to = fp8, at = 3)]
struct Net {
    input: Dense,
    #[layers]
    blocks: Vec<Block>,
    output: Dense,
}

impl Net {
    /// An allocated model.
    fn new() -> Net {
        let mut net = Net {
            input: Dense::new(IN, WIDTH, true),
            blocks: (0..2)
                .map(|_| Block {
                    fc1: QuantLinear::new(WIDTH, 2 * WIDTH, true),
                    fc2: QuantLinear::new(2 * WIDTH, WIDTH, true),
                })
                .collect(),
            output: Dense::new(WIDTH, OUT, true),
        };
        allocate(&mut net, 0).unwrap();
        net
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

fn adamw() -> AdamW {
    AdamW::new(AdamWConfig {
        lr: 3e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    })
    .unwrap()
}

/// The loss of iteration `iter`: a seeded batch of (x, sin(sum of x)).
fn loss(net: &mut Net, iter: u64) -> Result<Tensor> {
    let mut rng = SplitMix64::new(1000 + iter);
    let x: Vec<f32> = (0..BATCH * IN).map(|_| rng.normal()).collect();
    let y: Vec<f32> = x
        .chunks(IN)
        .flat_map(|row| {
            let s: f32 = row.iter().sum();
            (0..OUT).map(move |j| (s * (j + 1) as f32 * 0.1).sin())
        })
        .collect();
    let x = Tensor::from_vec(x, [BATCH, IN], &Device::Cpu)?;
    let y = Tensor::from_vec(y, [BATCH, OUT], &Device::Cpu)?;
    mse_loss(&net.forward(&x)?, &y)
}

fn options(iters: u64, out: &Path) -> FitOptions {
    FitOptions {
        clip_norm: Some(1.0),
        run: r#"{"test":"fit"}"#.into(),
        ..FitOptions::new(iters, out)
    }
}

/// Train a fresh model as `opts` says; returns the summary and the model.
fn train(opts: FitOptions) -> Result<(FitSummary, Net)> {
    let mut net = Net::new();
    let mut opt = adamw();
    let summary = fit(&mut net, &mut opt, opts, |m, s| loss(m, s.iteration))?;
    Ok((summary, net))
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

/// Every parameter's value bits, by path.
fn bits(net: &mut Net) -> Vec<(String, Vec<u32>)> {
    named_params(net)
        .unwrap()
        .into_iter()
        .map(|(path, t)| {
            let v = t.to_vec_f32().unwrap();
            (path, v.iter().map(|x| x.to_bits()).collect())
        })
        .collect()
}

#[test]
fn fit_trains_through_the_switch() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let mut net = Net::new();
    let mut opt = adamw();
    let mut calls: Vec<Step> = Vec::new();
    let summary = fit(&mut net, &mut opt, options(6, &out), |m, s| {
        calls.push(s);
        loss(m, s.iteration)
    })
    .unwrap();

    // Warm-up: one call per recipe on the first iteration, then 0..6 in order.
    let warm = |iteration, warmup| Step { iteration, warmup };
    let mut want = vec![warm(0, true), warm(0, true)];
    want.extend((0..6).map(|i| warm(i, false)));
    assert_eq!(calls, want);

    let m = &summary.metrics;
    assert_eq!(
        m.iter().map(|s| s.iter).collect::<Vec<_>>(),
        (0..6).collect::<Vec<_>>()
    );
    for s in m {
        let recipe = if s.iter < SWITCH { "mxfp4" } else { "fp8" };
        assert_eq!(
            (s.recipe.as_str(), s.layers_converted, s.linears_converted),
            (recipe, 2, 4),
            "iteration {}",
            s.iter
        );
        assert!(s.loss.is_finite() && s.loss > 0.0, "{s:?}");
        assert!(s.saved_bytes_per_element > 0.0, "{s:?}");
        assert_eq!(s.device_peak_bytes, None);
    }
    assert_eq!(
        summary.switches,
        [
            "2/2 layers (4/4 linears) now mxfp4 at iteration 0",
            "2/2 layers (4/4 linears) now fp8 at iteration 3"
        ]
    );
    assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
    assert_eq!(summary.interrupted_at, None);

    // The files: the rows as returned, the plot, and the checkpoint with the
    // caller's run record and the next iteration.
    assert_eq!(summary.metrics_file, out.join("metrics.jsonl"));
    let rows: Vec<StepMetrics> = std::fs::read_to_string(&summary.metrics_file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // (The wall clock aside: a float does not always read back bit for bit.)
    assert_eq!(timeless(&rows), timeless(m));
    assert_eq!(&std::fs::read(&summary.plot).unwrap()[1..4], b"PNG");
    let ckpt = read_checkpoint(&summary.checkpoint, u64::MAX).unwrap();
    assert_eq!(
        (ckpt.iteration, ckpt.run.as_str()),
        (6, r#"{"test":"fit"}"#)
    );
}

/// A run stopped at 4 (past the switch) and resumed to 6 ends where an
/// uninterrupted run ends, bit for bit: losses and parameters.
#[test]
fn a_resumed_fit_continues_bit_identically() {
    let dir = tempfile::tempdir().unwrap();
    let (full, mut full_net) = train(options(6, &dir.path().join("full"))).unwrap();

    let part_dir = dir.path().join("part");
    let (part, _) = train(options(4, &part_dir)).unwrap();
    assert_eq!(timeless(&part.metrics), timeless(&full.metrics[..4]));

    // Resumed in its own folder: the earlier rows are kept.
    let resume = Resume::read(&part.checkpoint).unwrap();
    assert_eq!(resume.iteration(), 4);
    let (rest, mut rest_net) = train(FitOptions {
        resume: Some(resume),
        ..options(6, &part_dir)
    })
    .unwrap();
    assert_eq!(rest.metrics.first().map(|s| s.iter), Some(4));
    assert_eq!(rest.metrics[0].recipe, "fp8");
    assert_eq!(timeless(&rest.metrics), timeless(&full.metrics[4..]));
    assert_eq!(
        rest.switches,
        ["2/2 layers (4/4 linears) now fp8 at iteration 4"]
    );
    assert_eq!(bits(&mut rest_net), bits(&mut full_net));
    let rows = std::fs::read_to_string(&rest.metrics_file).unwrap();
    assert_eq!(rows.lines().count(), 6);

    // Nothing is left to train at the checkpoint's own iteration.
    let e = train(FitOptions {
        resume: Some(Resume::read(&rest.checkpoint).unwrap()),
        ..options(6, &part_dir)
    })
    .err()
    .unwrap();
    assert!(
        matches!(&e, Error::InvalidOption(m) if m.contains("iteration 6")),
        "{e}"
    );
}

/// A loss that is not finite stops the run with an error naming the
/// iteration; the rows before it and the plot are written, no checkpoint.
#[test]
fn a_non_finite_loss_is_a_training_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let mut net = Net::new();
    let mut opt = adamw();
    let e = fit(&mut net, &mut opt, options(6, &out), |m, s| {
        let l = loss(m, s.iteration)?;
        if s.iteration == 2 && !s.warmup {
            l.mul_scalar(f32::NAN)
        } else {
            Ok(l)
        }
    })
    .err()
    .unwrap();
    assert!(
        matches!(&e, Error::Training(m) if m.contains("loss is NaN at iteration 2")),
        "{e}"
    );
    let rows = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    assert_eq!(rows.lines().count(), 2);
    assert!(out.join("loss.png").exists());
    assert!(!out.join("checkpoint.safetensors").exists());

    // During warm-up too, before any row is written.
    let out = dir.path().join("warm");
    let e = fit(&mut Net::new(), &mut adamw(), options(6, &out), |m, s| {
        loss(m, s.iteration)?.mul_scalar(f32::INFINITY)
    })
    .err()
    .unwrap();
    assert!(
        matches!(&e, Error::Training(m) if m.contains("at iteration 0")),
        "{e}"
    );
    assert!(!out.join("metrics.jsonl").exists());
}

/// A folder that holds a previous run is refused before any step, unless
/// `overwrite` is set.
#[test]
fn a_previous_run_is_refused_without_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    train(options(1, &out)).unwrap();
    let before = std::fs::read(out.join("checkpoint.safetensors")).unwrap();
    let mut calls = 0;
    let e = fit(&mut Net::new(), &mut adamw(), options(2, &out), |m, s| {
        calls += 1;
        loss(m, s.iteration)
    })
    .err()
    .unwrap();
    assert!(
        matches!(&e, Error::Io(m) if m.contains("holds a previous run")),
        "{e}"
    );
    assert_eq!(calls, 0);
    assert_eq!(
        std::fs::read(out.join("checkpoint.safetensors")).unwrap(),
        before
    );
    let (again, _) = train(FitOptions {
        overwrite: true,
        ..options(2, &out)
    })
    .unwrap();
    assert_eq!(again.metrics.len(), 2);
    let ckpt = read_checkpoint(&again.checkpoint, u64::MAX).unwrap();
    assert_eq!(ckpt.iteration, 2);
}

/// The learning rate follows the schedule: each row's `lr` is the
/// schedule's rate of its iteration, and `samples` counts the samples.
#[test]
fn the_learning_rate_follows_its_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let lr = LrSchedule::new(3e-3, 3, Decay::Cosine, 8).unwrap();
    let (summary, _) = train(FitOptions {
        lr: Some(lr),
        samples_per_step: BATCH as u64,
        ..options(8, &dir.path().join("run"))
    })
    .unwrap();
    for m in &summary.metrics {
        assert_eq!(m.lr, lr.at(m.iter), "iteration {}", m.iter);
        assert_eq!(m.samples, (m.iter + 1) * BATCH as u64);
    }
    assert!(summary.metrics[0].lr < summary.metrics[2].lr);
    assert!(summary.metrics[7].lr < summary.metrics[3].lr);
    let ckpt = read_checkpoint(&summary.checkpoint, u64::MAX).unwrap();
    assert_eq!((ckpt.iteration, ckpt.samples), (8, 8 * BATCH as u64));
}

/// The same evaluation at every call: the loss of iteration 1000's batch.
fn eval_loss(m: &mut Net) -> Result<f32> {
    assert!(!is_grad_enabled(), "evaluation records a tape");
    loss(m, 1000)?.to_scalar_f32()
}

/// Train with evaluation every `every` samples (4 a step).
fn train_with_eval(opts: FitOptions, every: u64, target: Option<f32>) -> Result<(FitSummary, Net)> {
    let mut net = Net::new();
    let mut opt = adamw();
    let mut f = eval_loss;
    let eval = Eval {
        every_samples: every,
        target_loss: target,
        loss: &mut f,
    };
    let summary = Fit::prepare(FitOptions {
        samples_per_step: 4,
        ..opts
    })?
    .run_with_eval(&mut net, &mut opt, |m, s| loss(m, s.iteration), Some(eval))?;
    Ok((summary, net))
}

/// Evaluations come after each step that reaches a multiple of the
/// samples, and after the last; their rows are in metrics.jsonl beside the
/// steps; and evaluating changes nothing of the training.
#[test]
fn evaluation_rows_come_at_their_samples_and_change_no_training() {
    let dir = tempfile::tempdir().unwrap();
    // 4 samples a step, every 10: after iterations 2 (12), 4 (20), 7 (32),
    // and the last, 8.
    let (with, mut net_with) =
        train_with_eval(options(9, &dir.path().join("a")), 10, None).unwrap();
    let iters: Vec<u64> = with.evals.iter().map(|e| e.iter).collect();
    assert_eq!(iters, vec![2, 4, 7, 8]);
    for e in &with.evals {
        assert_eq!(e.samples, (e.iter + 1) * 4);
        let recipe = if e.iter < SWITCH { "mxfp4" } else { "fp8" };
        assert_eq!(e.recipe, recipe);
        assert!(e.eval_loss.is_finite() && e.eval_loss > 0.0);
    }
    let rows: Vec<MetricsRow> = std::fs::read_to_string(&with.metrics_file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: String = rows
        .iter()
        .map(|r| match r {
            MetricsRow::Step(_) => 's',
            MetricsRow::Eval(_) => 'e',
        })
        .collect();
    assert_eq!(kinds, "sssessesssese");

    let (without, mut net_without) = train(FitOptions {
        samples_per_step: 4,
        ..options(9, &dir.path().join("b"))
    })
    .unwrap();
    assert_eq!(timeless(&with.metrics), timeless(&without.metrics));
    assert_eq!(bits(&mut net_with), bits(&mut net_without));
}

/// A run stops after the first evaluation at or below the target, with a
/// checkpoint of that step, and resumes from it.
#[test]
fn a_reached_target_stops_the_run_with_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let (first, _) = train_with_eval(options(40, &out), 4, None).unwrap();
    let target = first.evals[5].eval_loss;
    let hit = first
        .evals
        .iter()
        .position(|e| e.eval_loss <= target)
        .unwrap();
    let stop_at = first.evals[hit].iter;

    let out2 = dir.path().join("target");
    let (stopped, _) = train_with_eval(options(40, &out2), 4, Some(target)).unwrap();
    assert_eq!(stopped.target_reached, Some(stop_at));
    assert_eq!(stopped.metrics.last().unwrap().iter, stop_at);
    assert_eq!(stopped.evals.len(), hit + 1);
    let ckpt = read_checkpoint(&stopped.checkpoint, u64::MAX).unwrap();
    assert_eq!(
        (ckpt.iteration, ckpt.samples),
        (stop_at + 1, (stop_at + 1) * 4)
    );

    // Resumed without the target, it trains on to the end.
    let resume = Resume::read(&stopped.checkpoint).unwrap();
    let (rest, _) = train_with_eval(
        FitOptions {
            resume: Some(resume),
            ..options(40, &out2)
        },
        4,
        None,
    )
    .unwrap();
    assert_eq!(rest.metrics.first().unwrap().iter, stop_at + 1);
    assert_eq!(rest.target_reached, None);
}

/// A checkpoint taken at another number of samples a step is refused.
#[test]
fn a_resume_at_another_batch_size_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let (summary, _) = train(FitOptions {
        samples_per_step: 4,
        ..options(2, &out)
    })
    .unwrap();
    let resume = Resume::read(&summary.checkpoint).unwrap();
    let err = train(FitOptions {
        resume: Some(resume),
        samples_per_step: 8,
        ..options(4, &out)
    })
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("metadata `samples` is 8"), "{err}");
    assert!(err.contains("another number of samples a step"), "{err}");
}

mod common;

/// `n` ranks over TCP on this host, each training its own `Net` with the
/// options `opts` gives for its rank; their results in rank order.
fn ranks<R: Send>(
    n: usize,
    opts: impl Fn(usize) -> FitOptions + Sync,
    done: impl Fn(Result<(FitSummary, Net)>) -> R + Sync,
) -> Vec<R> {
    use mxswitch::runtime::dist::tcp::TcpCollective;
    common::on_ranks(n, |m| {
        let c = TcpCollective::connect(&m).unwrap();
        done(train(FitOptions {
            collective: Some(Box::new(c)),
            recipe_check_every: 1,
            ..opts(m.rank)
        }))
    })
}

/// Two ranks on the same batches average equal gradients, so they train
/// bit for bit like one process; only rank 0 writes files.
#[test]
fn two_ranks_on_the_same_batches_train_like_one() {
    let dir = tempfile::tempdir().unwrap();
    let (alone, _) = train(options(6, &dir.path().join("alone"))).unwrap();
    let out = |rank: usize| dir.path().join(format!("rank{rank}"));
    let got = ranks(2, |rank| options(6, &out(rank)), |r| r.unwrap().0.metrics);
    for metrics in &got {
        assert_eq!(timeless(metrics), timeless(&alone.metrics));
    }
    assert!(out(0).join("checkpoint.safetensors").exists());
    assert!(!out(1).exists(), "rank 1 wrote files");
}

/// A rank whose schedule switches later than the others' is caught by the
/// recipe check at the first iteration they differ, on every rank.
#[test]
fn ranks_whose_recipes_differ_stop_naming_them() {
    use mxswitch::runtime::schedule::Schedule;
    let dir = tempfile::tempdir().unwrap();
    let opts = |rank: usize| {
        let base = Net::schedule();
        let mut phases = base.phases().to_vec();
        if rank == 1 {
            phases[1].start = SWITCH + 2;
        }
        FitOptions {
            schedule: Some(Schedule::new(phases, base.layers_per_iter, base.order).unwrap()),
            ..options(8, &dir.path().join(format!("rank{rank}")))
        }
    };
    let errs = ranks(2, opts, |r| r.err().map(|e| e.to_string()));
    for e in errs {
        let e = e.expect("the run must stop");
        assert!(
            e.contains("recipe check at iteration 3: rank 1 (") && e.contains("than rank 0"),
            "{e}"
        );
    }
}
