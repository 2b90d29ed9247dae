//! Training: a generic loop for any `#[precision]` model ([`fit`]), and the
//! Flux job behind `mxswitch train` built on it ([`train`]).
//!
//! # The generic loop
//!
//! [`fit`] trains an allocated root `#[precision(...)]` model (any
//! [`PrecisionModel`](mxswitch_runtime::plan::PrecisionModel) with
//! [`Parameters`](mxswitch_runtime::module::Parameters)), with an [`AdamW`]
//! the caller built, for the iterations `0..iters` of [`FitOptions`]. The
//! caller writes only the forward: a closure that gets the model and a
//! [`Step`] (the iteration, and whether the call is one of warm-up's) and
//! returns the scalar f32 loss. The loop does the rest, in this order:
//!
//! 1. it checks the output folder: a previous run there is refused unless
//!    this one resumes from that folder's checkpoint or `overwrite` is set;
//! 2. it restores a [`Resume`] checkpoint into the model and optimizer, and
//!    warns about phases that start after the run's end;
//! 3. warm-up runs one step under every recipe of the schedule and puts
//!    everything back, proving that each recipe's kernels run;
//! 4. every iteration it applies the schedule (printing a line at each
//!    switch), calls the closure, checks the loss is finite (an
//!    [`Error::Training`] naming the iteration otherwise), runs backward,
//!    clips to `clip_norm` if set and takes the optimizer step, then writes
//!    a [`StepMetrics`] row to `metrics.jsonl` and advances the progress
//!    bar;
//! 5. at the end, or after Ctrl-C stopped it after a step, it draws
//!    `loss.png` and writes `checkpoint.safetensors`, which stores the
//!    caller's JSON [`FitOptions::run`] beside the weights and AdamW state.
//!    (The caller installs the signal handler: [`crate::files::interrupt`]'s
//!    `install` and `set_graceful(true)`, as `mxswitch train` does.)
//!
//! For example, to train a small MLP `Mlp` whose attribute switches from
//! MXFP4 to FP8 at iteration 30: build it, `allocate` it, make an `AdamW`,
//! and call `fit(&mut model, &mut opt, FitOptions::new(60, "runs/mlp"),
//! |m, step| mse_loss(&m.forward(&x_of(step.iteration))?, &y_of(step.iteration)))`.
//! The summary lists the metrics rows (recipe `mxfp4` before 30, `fp8`
//! after) and the switch lines. To continue later, read the checkpoint with
//! [`Resume::read`], put it in [`FitOptions::resume`] and raise `iters`:
//! the continuation is bit-identical to an uninterrupted run, as long as
//! the closure's batches depend only on the iteration. [`Fit::prepare`] and
//! [`Fit::run`] split the call in two, so that a caller can check the
//! folder before it allocates a large model.
//!
//! With a [`FitOptions::collective`] the loop is one rank of a data-parallel
//! run (SPEC section 9): the loss and the gradients are averaged over the
//! ranks after backward, the ranks' recipes are compared every
//! [`FitOptions::recipe_check_every`] iterations, and only rank 0 writes.
//!
//! # Flux
//!
//! [`train`] is rectified flow on seeded synthetic data, AdamW with
//! clipping, through [`fit`]: it reconciles the [`RunRecord`] a checkpoint
//! holds with the flags of a resumed run, checks the device and the memory,
//! and builds each step's batch one step ahead on a helper thread for a
//! GPU.

mod bfl_file;
mod checkpoint;
mod dist;
mod fit;
mod flux_data;
mod memory;
mod metrics;
mod plot;
mod progress;
mod record;
mod run_dir;
mod sharding;
pub mod shards;

use std::path::{Path, PathBuf};

use mxswitch_models::flux::{Batch, Flux, FluxInput, RunConfig};
use mxswitch_runtime::dist::Membership;
use mxswitch_runtime::module::{allocate, try_visit_params};
use mxswitch_runtime::ops::mse_loss;
use mxswitch_runtime::optim::{AdamW, AdamWConfig};
use mxswitch_runtime::schedule::{Phase, Schedule};
use mxswitch_runtime::schedule_config::ToSchedule;
use mxswitch_runtime::{DType, Device, Error, Result, Tensor};

pub use bfl_file::{export, ExportDType, FluxWeights};
pub use checkpoint::{parse_checkpoint, read_checkpoint, save_checkpoint, Checkpoint};
pub use dist::{recipe_hash, RECIPE_CHECK_EVERY};
pub use fit::{fit, Eval, Fit, FitOptions, FitSummary, Hints, Resume, Step};
pub use metrics::{EvalMetrics, MetricsRow, StepMetrics};
pub use plot::Scale;
pub use record::{DataRecord, RunFlags, RunRecord};
pub use sharding::{sharded_memory, ShardedMemory};

use flux_data::{with_batches, TrainData};

/// Gradient clipping threshold (SPEC section 8).
const CLIP_NORM: f32 = 1.0;

/// Everything `mxswitch train` takes. With `resume`, the run is the one the
/// checkpoint records, and the other fields may only repeat it (`iters`
/// may grow it).
#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// The run config; optional only when resuming.
    pub config: Option<RunConfig>,
    /// Overrides `train.iters` of the config.
    pub iters: Option<u64>,
    /// Moves the first switch of the schedule.
    pub switch_at: Option<u64>,
    /// Where to train.
    pub device: Device,
    /// The output folder.
    pub out: PathBuf,
    /// Seed of the weights, the data and stochastic rounding [default 0].
    pub seed: Option<u64>,
    /// Continue the run this checkpoint records.
    pub resume: Option<PathBuf>,
    /// Start a new run from these Flux weights (Black Forest Labs' naming)
    /// instead of seeded ones.
    pub init_from: Option<PathBuf>,
    /// Train on the safetensors shards in this folder instead of synthetic
    /// data (a resume reads the recorded ones; given again, they must be
    /// the same).
    pub data: Option<PathBuf>,
    /// Evaluate on the validation shards in this folder.
    pub val_data: Option<PathBuf>,
    /// Evaluate after every this many samples (and after the last step);
    /// needs `val_data`. Without it, only after the last step.
    pub eval_every: Option<u64>,
    /// Stop once the eval loss is at most this; needs `val_data`.
    pub target_loss: Option<f32>,
    /// The loss plot's loss axis.
    pub plot_scale: Scale,
    /// Replace a previous run in `out`.
    pub overwrite: bool,
    /// Show a progress bar (off in tests; only rank 0 shows one).
    pub progress: bool,
    /// This process's place in a data-parallel run (`mxswitch launch`
    /// sets it); `None` trains alone.
    pub dist: Option<Membership>,
    /// Compare the ranks' per-linear recipes every this many iterations.
    pub recipe_check_every: u64,
}

impl TrainOptions {
    /// A new run of `config` into `out` on the CPU, synthetic data, no
    /// evaluation, no progress bar: the other fields at their defaults.
    pub fn new(config: RunConfig, out: impl Into<PathBuf>) -> TrainOptions {
        TrainOptions {
            config: Some(config),
            iters: None,
            switch_at: None,
            device: Device::Cpu,
            out: out.into(),
            seed: None,
            resume: None,
            init_from: None,
            data: None,
            val_data: None,
            eval_every: None,
            target_loss: None,
            plot_scale: Scale::Linear,
            overwrite: false,
            progress: false,
            dist: None,
            recipe_check_every: dist::RECIPE_CHECK_EVERY,
        }
    }
}

/// What a Flux run produced: the generic loop's summary.
pub type TrainSummary = FitSummary;

/// The AdamW settings of SPEC section 8 at the config's learning rate.
fn adamw_config(cfg: &RunConfig) -> AdamWConfig {
    AdamWConfig {
        lr: cfg.train.lr,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    }
}

/// The schedule of the config, with the first switch moved to `switch_at`.
pub fn schedule_of(config: &RunConfig, switch_at: Option<u64>) -> Result<Schedule> {
    let schedule = config.schedule.to_schedule()?;
    let Some(at) = switch_at else {
        return Ok(schedule);
    };
    let mut phases: Vec<Phase> = schedule.phases().to_vec();
    if phases.len() < 2 {
        return Err(Error::InvalidOption(format!(
            "--switch-at {at}: the schedule has a single phase ({}), so there is no switch to move",
            phases[0].recipe
        )));
    }
    phases[1].start = at;
    Schedule::new(phases, schedule.layers_per_iter, schedule.order)
}

/// Check the device before any work: one clear line when this build or this
/// machine cannot run it. A GPU is opened by placing one element on it.
pub fn check_device(device: Device) -> Result<()> {
    let (flag, name, built) = match device {
        Device::Cpu => return Ok(()),
        Device::Cuda(_) => ("cuda", "CUDA", cfg!(feature = "cuda")),
        Device::Rocm(_) => ("rocm", "ROCm", cfg!(feature = "rocm")),
    };
    if !built {
        return Err(Error::InvalidOption(format!(
            "--device {flag}: the {name} backend is not available in this build: rebuild with `--features {flag}` or use --device cpu"
        )));
    }
    Tensor::zeros([1], DType::F32, &device)
        .map(|_| ())
        .map_err(|e| Error::Backend(format!("--device {flag}: {e}")))
}

/// Move every parameter to `device`, keeping its id.
fn params_to_device(model: &mut Flux, device: &Device) -> Result<()> {
    try_visit_params(model, |slot| match slot.param.as_mut() {
        Some(p) => p.to_device(device).and_then(|t| p.set(t)),
        None => Ok(()),
    })
}

/// The loss of one Flux step on the host `batch`: rectified flow's MSE in
/// f32, on `device`.
fn flux_loss(model: &mut Flux, batch: Batch, device: &Device) -> Result<Tensor> {
    let batch =
        mxswitch_runtime::profile::timed("step: batch to device", || batch.to_device(device))?;
    // Guidance-distilled configs (Flux.1-dev) get a constant strength of 1.
    let guidance = vec![1.0; batch.timesteps.len()];
    let pred = model.forward(&FluxInput {
        img: &batch.img,
        txt: &batch.txt,
        timesteps: &batch.timesteps,
        y: &batch.y,
        guidance: model.guidance_in.is_some().then_some(&guidance[..]),
        patches_hw: batch.patches_hw,
    })?;
    mse_loss(&pred.to_dtype(DType::F32)?, &batch.target)
}

/// Train as `opts` says.
///
/// The run executes inside a rayon pool so that the ops' parallel loops are
/// scheduled from a worker thread: from outside a pool every parallel call
/// would block on a latch, which costs more than a tiny op itself.
pub fn train(opts: &TrainOptions) -> Result<TrainSummary> {
    let pool = rayon::ThreadPoolBuilder::new()
        .build()
        .map_err(|e| Error::Backend(format!("cannot start the worker threads: {e}")))?;
    pool.install(|| train_in_pool(opts))
}

/// The run `opts` asks for, the checkpoint it resumes from, and the first
/// iteration to train.
fn resolve_run(opts: &TrainOptions) -> Result<(RunRecord, Option<Resume>)> {
    let flags = RunFlags {
        config: opts.config.as_ref(),
        iters: opts.iters,
        switch_at: opts.switch_at,
        seed: opts.seed,
    };
    let Some(path) = &opts.resume else {
        let adamw = flags.config.map(adamw_config).unwrap_or_default();
        let mut run = RunRecord::new(&flags, adamw, CLIP_NORM)?;
        if let Some(dir) = &opts.data {
            run.data = Some(flux_data::record_shards(dir, &run.config)?);
        }
        return Ok((run, None));
    };
    let resume = Resume::read(path)?;
    let recorded =
        RunRecord::from_checkpoint(&resume.checkpoint).map_err(|e| checkpoint::err(path, e))?;
    let adamw = adamw_config(&recorded.config);
    let mut run = recorded.resumed(resume.iteration(), &flags, adamw, CLIP_NORM)?;
    run.data = flux_data::resumed_data(&run, opts.data.as_deref())?;
    Ok((run, Some(resume)))
}

/// The evaluation flags, checked before any work: they need `--val-data`,
/// and the target is a loss (finite, >= 0).
fn check_eval_flags(opts: &TrainOptions) -> Result<()> {
    if opts.val_data.is_none() {
        for (flag, given) in [
            ("--eval-every", opts.eval_every.is_some()),
            ("--target-loss", opts.target_loss.is_some()),
        ] {
            if given {
                return Err(Error::InvalidOption(format!(
                    "{flag} needs --val-data DIR: the validation shards to evaluate on"
                )));
            }
        }
    }
    if opts.eval_every == Some(0) {
        return Err(Error::InvalidOption(
            "--eval-every 0: give a number of samples, at least 1".into(),
        ));
    }
    if let Some(t) = opts.target_loss.filter(|t| !(t.is_finite() && *t >= 0.0)) {
        return Err(Error::InvalidOption(format!(
            "--target-loss {t}: give a finite loss >= 0 (MLPerf's Flux target is 0.586)"
        )));
    }
    Ok(())
}

/// The plot's title: the config and its schedule, `flux-tiny: mxfp4 @ 0, fp8 @ 40`.
fn title_of(cfg: &RunConfig, schedule: &Schedule) -> String {
    let name = Path::new(cfg.origin_name())
        .file_stem()
        .map_or_else(|| cfg.origin_name().into(), |s| s.to_string_lossy());
    let phases: Vec<String> = schedule
        .phases()
        .iter()
        .map(|p| format!("{} @ {}", p.recipe, p.start))
        .collect();
    format!("{name}: {}", phases.join(", "))
}

fn train_in_pool(opts: &TrainOptions) -> Result<TrainSummary> {
    // A rank trains on its own device of the kind asked for.
    let device = match &opts.dist {
        Some(m) => m.device(opts.device),
        None => opts.device,
    };
    let opts = &TrainOptions {
        device,
        progress: opts.progress && opts.dist.as_ref().is_none_or(|m| m.rank == 0),
        ..opts.clone()
    };
    check_device(opts.device)?;
    check_eval_flags(opts)?;
    let (run, resume) = resolve_run(opts)?;
    let cfg = &run.config;
    let iters = run.iters;
    let schedule = run.schedule()?;
    let lr = cfg.train.lr_schedule(iters)?;
    let act = if cfg.train.activations == "bf16" {
        DType::BF16
    } else {
        DType::F32
    };
    let val = opts
        .val_data
        .as_deref()
        .map(|dir| flux_data::open_val(dir, cfg))
        .transpose()?;
    // Refused before the output folder is created.
    memory::check_memory(cfg, opts.device, resume.is_some())?;
    let init = match (&opts.init_from, &resume) {
        (Some(_), Some(_)) => {
            return Err(Error::InvalidOption(
                "--init-from starts a new run from weights and --resume continues one: give one of them".into(),
            ))
        }
        (Some(path), None) => Some(FluxWeights::read(path, &cfg.model)?),
        (None, _) => None,
    };
    let (rank, world) = opts
        .dist
        .as_ref()
        .map_or((0, 1), |m| (m.rank, m.world_size));
    let data = TrainData::of(&run, rank, world)?;
    let collective = opts
        .dist
        .as_ref()
        .map(|m| m.join(opts.device))
        .transpose()?;
    let record = serde_json::to_string(&run)
        .map_err(|e| Error::InvalidOption(format!("the run record: {e}")))?;
    let fit = Fit::prepare(FitOptions {
        iters,
        schedule: Some(schedule.clone()),
        out: opts.out.clone(),
        resume,
        overwrite: opts.overwrite,
        progress: opts.progress,
        clip_norm: Some(run.clip_norm),
        device: opts.device,
        run: record,
        hints: Hints {
            diverged: "lower train.lr or resume from an earlier checkpoint".into(),
            late_phase: "raise --iters or move the switch".into(),
        },
        lr: Some(lr),
        samples_per_step: cfg.data.batch as u64,
        title: title_of(cfg, &schedule),
        plot_scale: opts.plot_scale,
        collective,
        recipe_check_every: opts.recipe_check_every,
    })?;
    let start = fit.start();

    // Built once the output folder is known to take the run.
    let mut model = Flux::new(&cfg.model);
    model.plan().check_not_empty("Flux")?;
    mxswitch_runtime::plan::check_schedule::<Flux>(&schedule)?;
    allocate(&mut model, run.seed)?;
    if let Some(weights) = init {
        weights.put_into(&mut model)?;
    }
    if opts.device != Device::Cpu {
        params_to_device(&mut model, &opts.device)?;
    }
    let mut opt = AdamW::new(run.adamw)?;

    let device = opts.device;
    let batch = cfg.data.batch;
    let mut val_loss = val
        .as_ref()
        .map(|v| move |m: &mut Flux| flux_data::eval_loss(m, v, batch, act, &device));
    let eval = val_loss.as_mut().map(|loss| Eval {
        every_samples: opts.eval_every.unwrap_or(u64::MAX),
        target_loss: opts.target_loss,
        loss,
    });
    with_batches(&data, act, device, start..iters, |next_batch| {
        fit.run_with_eval(
            &mut model,
            &mut opt,
            |m, step| {
                // Warm-up steps on the first iteration's batch, built apart
                // from the queue of the run's batches.
                let batch = if step.warmup {
                    data.batch(step.iteration, act)?
                } else {
                    next_batch()?
                };
                flux_loss(m, batch, &device)
            },
            eval,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_data() -> (TrainData, RunConfig) {
        let cfg = RunConfig::load("flux-tiny").expect("built-in config");
        let data = mxswitch_models::flux::SyntheticData::new(&cfg.model, &cfg.data, 7);
        let part = 0..cfg.data.batch;
        let source = flux_data::Source::Synthetic(data);
        (TrainData { source, part }, cfg)
    }

    fn same(a: &Batch, b: &Batch) -> bool {
        a.timesteps == b.timesteps
            && a.img.to_vec_f32().unwrap() == b.img.to_vec_f32().unwrap()
            && a.target.to_vec_f32().unwrap() == b.target.to_vec_f32().unwrap()
    }

    /// The helper thread a GPU run uses hands over the batches of the
    /// iterations in order, equal to the ones built in line; it needs no GPU.
    #[test]
    fn prefetched_batches_come_in_order() {
        let (data, _) = tiny_data();
        for device in [Device::Cpu, Device::Cuda(0)] {
            let got = with_batches(&data, DType::F32, device, 3..7, |next| {
                (0..4).map(|_| next()).collect::<Result<Vec<Batch>>>()
            })
            .unwrap();
            for (i, b) in (3..7).zip(&got) {
                assert!(
                    same(b, &data.batch(i, DType::F32).unwrap()),
                    "{device} iteration {i}"
                );
            }
        }
    }

    /// A step that fails early stops the helper thread instead of hanging,
    /// and the step's error comes out.
    #[test]
    fn an_early_error_stops_the_data_thread() {
        let (data, _) = tiny_data();
        let r: Result<()> = with_batches(&data, DType::F32, Device::Cuda(0), 0..1000, |next| {
            next()?;
            Err(Error::InvalidOption("step failed".into()))
        });
        assert!(matches!(r, Err(Error::InvalidOption(m)) if m == "step failed"));
    }
}
