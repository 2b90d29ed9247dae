//! Training Flux through a precision switch: the job behind `mxswitch train`.
//!
//! Rectified flow on seeded synthetic data, AdamW with clipping, the
//! schedule applied at every step, warm-up before step 0, a progress bar,
//! `metrics.jsonl`, a loss-curve PNG and a safetensors checkpoint that
//! `--resume` continues from bit-identically.

mod checkpoint;
mod memory;
mod plot;
mod record;
mod run_dir;

use std::path::PathBuf;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use mxswitch_models::flux::{Batch, Flux, FluxInput, RunConfig, SyntheticData};
use mxswitch_runtime::module::{allocate, optimizer_step, try_visit_params};
use mxswitch_runtime::ops::mse_loss;
use mxswitch_runtime::optim::{clip_grad_norm, AdamW, AdamWConfig};
use mxswitch_runtime::schedule::{Phase, Schedule, SwitchReport};
use mxswitch_runtime::schedule_config::ToSchedule;
use mxswitch_runtime::warmup::warmup;
use mxswitch_runtime::{DType, Device, Error, Result, Tensor};

use crate::files::interrupt;
pub use checkpoint::{parse_checkpoint, read_checkpoint, save_checkpoint, Checkpoint};
pub use record::{RunFlags, RunRecord};
use run_dir::RunDir;

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
    pub device: Device,
    pub out: PathBuf,
    /// Seed of the weights, the data and stochastic rounding [default 0].
    pub seed: Option<u64>,
    pub resume: Option<PathBuf>,
    /// Replace a previous run in `out`.
    pub overwrite: bool,
    /// Show a progress bar (off in tests).
    pub progress: bool,
}

/// One line of `metrics.jsonl`: exactly these keys.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StepMetrics {
    pub iter: u64,
    pub loss: f32,
    pub recipe: String,
    pub layers_converted: usize,
    pub linears_converted: usize,
    pub step_time_ms: f64,
    pub saved_bytes_per_element: f64,
    /// Peak bytes of the device's tensors so far; null on the CPU.
    pub device_peak_bytes: Option<u64>,
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct TrainSummary {
    /// The steps this run trained (not the earlier part of a resumed run).
    pub metrics: Vec<StepMetrics>,
    /// Every switch line printed, in order.
    pub switches: Vec<String>,
    /// Warnings printed before training (phases that never start).
    pub warnings: Vec<String>,
    pub checkpoint: PathBuf,
    pub plot: PathBuf,
    pub metrics_file: PathBuf,
    /// Set when a signal stopped the run: the next iteration to run, which
    /// the checkpoint resumes from.
    pub interrupted_at: Option<u64>,
}

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
/// machine cannot run it.
pub fn check_device(device: Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        Device::Rocm(_) => Err(Error::InvalidOption(
            "--device rocm: the ROCm backend is not available in this build yet; use --device cpu".into(),
        )),
        Device::Cuda(_) if !cfg!(feature = "cuda") => Err(Error::InvalidOption(
            "--device cuda: the CUDA backend is not available in this build: rebuild with `--features cuda` or use --device cpu".into(),
        )),
        Device::Cuda(_) => Tensor::zeros([1], DType::F32, &device)
            .map(|_| ())
            .map_err(|e| Error::Backend(format!("--device cuda: {e}"))),
    }
}

/// Move every parameter to `device`, keeping its id.
fn params_to_device(model: &mut Flux, device: &Device) -> Result<()> {
    try_visit_params(model, |slot| match slot.param.as_mut() {
        Some(p) => p.to_device(device).and_then(|t| p.set(t)),
        None => Ok(()),
    })
}

/// One optimizer step on the host `batch` of iteration `iter`: returns
/// (loss, saved bytes per element).
fn train_step(
    model: &mut Flux,
    opt: &mut AdamW,
    batch: Batch,
    device: &Device,
    iter: u64,
) -> Result<(f32, f64)> {
    let batch = batch.to_device(device)?;
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
    let loss = mse_loss(&pred.to_dtype(DType::F32)?, &batch.target)?;
    let saved = loss.saved_bytes();
    let loss_value = loss.to_scalar_f32()?;
    if !loss_value.is_finite() {
        return Err(Error::Training(format!(
            "loss is {loss_value} at iteration {iter}: training diverged; lower train.lr or resume from an earlier checkpoint"
        )));
    }
    let mut grads = loss.backward()?;
    drop(loss);
    clip_grad_norm(&mut grads, CLIP_NORM)?;
    optimizer_step(model, opt, &grads)?;
    Ok((loss_value, saved.per_element()))
}

/// Runs `body` with a source of the host batches of `iters`, in order. For a
/// GPU they are built one step ahead on a helper thread, so the device does
/// not wait for the host to make each step's data; the CPU builds them in
/// line, since its cores run the step.
fn with_batches<R>(
    data: &SyntheticData,
    act: DType,
    device: Device,
    iters: std::ops::Range<u64>,
    body: impl FnOnce(&mut dyn FnMut() -> Result<Batch>) -> Result<R>,
) -> Result<R> {
    if device == Device::Cpu {
        let mut it = iters;
        return body(&mut || {
            let iter = it
                .next()
                .ok_or_else(|| Error::Backend("no batch left to train on".into()))?;
            data.batch(iter, act)
        });
    }
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        s.spawn(move || {
            for iter in iters {
                // A closed channel means training stopped early.
                if tx.send(data.batch(iter, act)).is_err() {
                    break;
                }
            }
        });
        body(&mut || {
            rx.recv()
                .map_err(|_| Error::Backend("the data thread stopped".into()))?
        })
    })
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
fn resolve_run(opts: &TrainOptions) -> Result<(RunRecord, Option<Checkpoint>, u64)> {
    let flags = RunFlags {
        config: opts.config.as_ref(),
        iters: opts.iters,
        switch_at: opts.switch_at,
        seed: opts.seed,
    };
    let Some(path) = &opts.resume else {
        let adamw = flags.config.map(adamw_config).unwrap_or_default();
        return Ok((RunRecord::new(&flags, adamw, CLIP_NORM)?, None, 0));
    };
    let ckpt = read_checkpoint(path, u64::MAX)?;
    let adamw = adamw_config(&ckpt.run.config);
    let run = ckpt.run.resumed(ckpt.iteration, &flags, adamw, CLIP_NORM)?;
    let start = ckpt.iteration;
    Ok((run, Some(ckpt), start))
}

/// Warning lines for phases that cannot start within `0..iters`.
fn late_phases(schedule: &Schedule, iters: u64) -> Vec<String> {
    schedule
        .phases()
        .iter()
        .filter(|p| p.start >= iters)
        .map(|p| {
            format!(
                "warning: the {} phase starts at iteration {}, but the run ends after iteration {}: it will not run (raise --iters or move the switch)",
                p.recipe,
                p.start,
                iters - 1
            )
        })
        .collect()
}

fn train_in_pool(opts: &TrainOptions) -> Result<TrainSummary> {
    check_device(opts.device)?;
    let (run, ckpt, start) = resolve_run(opts)?;
    let cfg = &run.config;
    let iters = run.iters;
    let schedule = run.schedule()?;
    let act = if cfg.train.activations == "bf16" {
        DType::BF16
    } else {
        DType::F32
    };
    // Refused before the output folder is created.
    memory::check_memory(cfg, opts.device, opts.resume.is_some())?;
    let out = RunDir::check(&opts.out, opts.resume.as_deref(), start, opts.overwrite)?;

    let mut model = Flux::new(&cfg.model);
    model.plan().check_not_empty("Flux")?;
    mxswitch_runtime::plan::check_schedule::<Flux>(&schedule)?;
    allocate(&mut model, run.seed)?;
    if opts.device != Device::Cpu {
        params_to_device(&mut model, &opts.device)?;
    }
    let mut opt = AdamW::new(run.adamw)?;
    if let (Some(ckpt), Some(path)) = (ckpt, &opts.resume) {
        ckpt.restore(path, &mut model, &mut opt)?;
    }
    let warnings = late_phases(&schedule, iters);
    for w in &warnings {
        eprintln!("{w}");
    }

    let data = SyntheticData::new(&cfg.model, &cfg.data, run.seed);
    let device = opts.device;
    let report = warmup(&mut model, &mut opt, &schedule, start, |m, o| {
        train_step(m, o, data.batch(start, act)?, &device, start).map(|_| ())
    })?;
    let mut summary = TrainSummary {
        metrics: Vec::new(),
        switches: Vec::new(),
        warnings,
        checkpoint: out.path(run_dir::CHECKPOINT),
        plot: out.path(run_dir::PLOT),
        metrics_file: out.path(run_dir::METRICS),
        interrupted_at: None,
    };
    if interrupt::requested() {
        // Nothing trained yet: nothing to write.
        summary.interrupted_at = Some(start);
        return Ok(summary);
    }
    let bar = progress_bar(opts.progress, start, iters);
    say(&bar, &report.to_string());

    let mut metrics_out = out.open_metrics()?;
    let mut next = start;
    let trained = with_batches(&data, act, device, start..iters, |next_batch| {
        for iter in start..iters {
            let sw: SwitchReport = model.apply_with(&schedule, iter)?;
            if sw.changed > 0 || iter == start {
                let line = sw.to_string();
                say(&bar, &line);
                summary.switches.push(line);
            }
            let t0 = Instant::now();
            let (loss, per_element) =
                train_step(&mut model, &mut opt, next_batch()?, &device, iter)?;
            let step_time_ms = t0.elapsed().as_secs_f64() * 1e3;
            if iter == start {
                mxswitch_runtime::profile::reset();
            }
            let m = StepMetrics {
                iter,
                loss,
                recipe: sw.recipe.to_string(),
                layers_converted: sw.layers_converted,
                linears_converted: sw.linears_converted,
                step_time_ms,
                saved_bytes_per_element: per_element,
                device_peak_bytes: opts.device.peak_memory_bytes(),
            };
            metrics_out.write(&m)?;
            bar.set_message(format!("loss {loss:.4}  {}", m.recipe));
            bar.inc(1);
            summary.metrics.push(m);
            next = iter + 1;
            if interrupt::requested() && next < iters {
                summary.interrupted_at = Some(next);
                break;
            }
        }
        Ok(())
    });
    bar.abandon();
    let all: Vec<StepMetrics> = out
        .earlier
        .iter()
        .chain(&summary.metrics)
        .cloned()
        .collect();
    let switch_iters: Vec<u64> = schedule.phases().iter().skip(1).map(|p| p.start).collect();
    // A failed step still leaves the plot of the steps before it.
    let plotted = plot::loss_curve(&summary.plot, &all, &switch_iters);
    trained?;
    plotted?;
    save_checkpoint(&summary.checkpoint, &mut model, &opt, next, &run)?;
    Ok(summary)
}

/// Print a line above the progress bar, or plainly when the bar is hidden
/// (not a terminal, or progress off).
fn say(bar: &ProgressBar, line: &str) {
    if bar.is_hidden() {
        println!("{line}");
    } else {
        bar.println(line);
    }
}

fn progress_bar(show: bool, start: u64, iters: u64) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(iters);
    bar.set_position(start);
    if let Ok(style) =
        ProgressStyle::with_template("{bar:40} {pos}/{len} [{elapsed_precise} < {eta}] {msg}")
    {
        bar.set_style(style);
    }
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_data() -> (SyntheticData, RunConfig) {
        let cfg = RunConfig::load("flux-tiny").expect("built-in config");
        (SyntheticData::new(&cfg.model, &cfg.data, 7), cfg)
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
