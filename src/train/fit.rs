//! The generic training loop: any `#[precision]` model through its schedule.
//!
//! [`fit`] (or [`Fit::prepare`] then [`Fit::run`]) owns everything around
//! the forward pass: the output folder's checks, warm-up, the schedule
//! applied at every iteration, backward, clipping and the AdamW step, the
//! progress bar, `metrics.jsonl`, the loss plot, the checkpoint, resume and
//! a clean stop on Ctrl-C. The caller's step closure runs one iteration's
//! forward and returns its scalar loss.

use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use mxswitch_runtime::module::Parameters;
use mxswitch_runtime::optim::{clip_grad_factor, optimizer_step_scaled, AdamW};
use mxswitch_runtime::plan::{apply_schedule, check_schedule, Plan, PrecisionModel};
use mxswitch_runtime::profile::timed;
use mxswitch_runtime::schedule::Schedule;
use mxswitch_runtime::warmup::warmup;
use mxswitch_runtime::{Device, Error, Result, Tensor};

use super::checkpoint::{read_checkpoint, save_checkpoint, Checkpoint};
use super::plot;
use super::run_dir::{self, RunDir};
use crate::files::interrupt;

/// What the step closure is told about the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// The iteration the step trains (during warm-up: the first iteration
    /// of the run, whose batch warm-up steps on).
    pub iteration: u64,
    /// A warm-up call: its update is undone afterwards, and it is not one of
    /// the run's iterations (a caller with a queue of prefetched batches
    /// builds this batch separately instead of taking it from the queue).
    pub warmup: bool,
}

/// A run to resume: a checkpoint already read, and the file it came from.
#[derive(Debug)]
pub struct Resume {
    /// The checkpoint file (named in errors; a resume in its own folder
    /// keeps the earlier metrics rows).
    pub path: PathBuf,
    /// Its checked contents, restored into the model by the loop.
    pub checkpoint: Checkpoint,
}

impl Resume {
    /// Read and check the checkpoint at `path`.
    pub fn read(path: &Path) -> Result<Resume> {
        Ok(Resume {
            path: path.to_path_buf(),
            checkpoint: read_checkpoint(path, u64::MAX)?,
        })
    }

    /// The iteration the resumed run starts at.
    pub fn iteration(&self) -> u64 {
        self.checkpoint.iteration
    }
}

/// The advice that ends the loop's messages, in the caller's words (a
/// command line names its own flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hints {
    /// Ends the error for a loss that is not finite.
    pub diverged: String,
    /// Ends the warning for a phase that starts after the run's end.
    pub late_phase: String,
}

impl Default for Hints {
    fn default() -> Self {
        Hints {
            diverged: "lower the learning rate or resume from an earlier checkpoint".into(),
            late_phase: "raise iters or move the switch".into(),
        }
    }
}

/// How [`fit`] trains. [`FitOptions::new`] gives the defaults.
#[derive(Debug)]
pub struct FitOptions {
    /// The run trains iterations `0..iters` (a resumed one from the
    /// checkpoint's iteration on).
    pub iters: u64,
    /// The schedule; `None` is the model's own [`PrecisionModel::schedule`].
    pub schedule: Option<Schedule>,
    /// Output folder for `metrics.jsonl`, `loss.png` and
    /// `checkpoint.safetensors`.
    pub out: PathBuf,
    /// Continue from a checkpoint.
    pub resume: Option<Resume>,
    /// Replace a previous run in `out`.
    pub overwrite: bool,
    /// Show a progress bar.
    pub progress: bool,
    /// Clip the gradients to this global norm before each update.
    pub clip_norm: Option<f32>,
    /// Where the model's parameters live (the caller puts them there): the
    /// device's peak memory goes into the metrics.
    pub device: Device,
    /// The caller's record of the run, JSON text, stored verbatim in the
    /// checkpoint's metadata `run` ([`Checkpoint::run`] on resume).
    pub run: String,
    /// The advice in the loop's messages.
    pub hints: Hints,
}

impl FitOptions {
    /// `iters` iterations into `out`, under the model's schedule, on the
    /// CPU, without clipping, progress bar or resume; `run` is `null`.
    pub fn new(iters: u64, out: impl Into<PathBuf>) -> FitOptions {
        FitOptions {
            iters,
            schedule: None,
            out: out.into(),
            resume: None,
            overwrite: false,
            progress: false,
            clip_norm: None,
            device: Device::Cpu,
            run: "null".into(),
            hints: Hints::default(),
        }
    }
}

/// One line of `metrics.jsonl`: exactly these keys.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StepMetrics {
    /// The iteration trained.
    pub iter: u64,
    /// Its loss.
    pub loss: f32,
    /// The recipe the schedule is switching to (or in) at this iteration.
    pub recipe: String,
    /// Plan layers on that recipe.
    pub layers_converted: usize,
    /// Quantized linears on that recipe.
    pub linears_converted: usize,
    /// Wall-clock time of the step (forward, backward, update).
    pub step_time_ms: f64,
    /// Bytes the loss's tape saved for backward, per element.
    pub saved_bytes_per_element: f64,
    /// Peak bytes of the device's tensors so far; null on the CPU.
    pub device_peak_bytes: Option<u64>,
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct FitSummary {
    /// The steps this run trained (not the earlier part of a resumed run).
    pub metrics: Vec<StepMetrics>,
    /// Every switch line printed, in order.
    pub switches: Vec<String>,
    /// Warnings printed before training (phases that never start).
    pub warnings: Vec<String>,
    /// `checkpoint.safetensors` in the output folder.
    pub checkpoint: PathBuf,
    /// `loss.png` in the output folder.
    pub plot: PathBuf,
    /// `metrics.jsonl` in the output folder.
    pub metrics_file: PathBuf,
    /// Set when a signal stopped the run: the next iteration to run, which
    /// the checkpoint resumes from.
    pub interrupted_at: Option<u64>,
}

/// A run whose output folder has been checked, ready to train a model.
#[derive(Debug)]
pub struct Fit {
    opts: FitOptions,
    out: RunDir,
    start: u64,
}

/// Train `model` with `opt` as `opts` says: [`Fit::prepare`], then
/// [`Fit::run`]. `step` runs one iteration's forward and returns the scalar
/// f32 loss.
pub fn fit<M, S>(model: &mut M, opt: &mut AdamW, opts: FitOptions, step: S) -> Result<FitSummary>
where
    M: PrecisionModel + Parameters,
    S: FnMut(&mut M, Step) -> Result<Tensor>,
{
    Fit::prepare(opts)?.run(model, opt, step)
}

impl Fit {
    /// Check the options and the output folder (created here, nothing
    /// written in it) before any model exists, so that a refused run costs
    /// no allocation.
    pub fn prepare(opts: FitOptions) -> Result<Fit> {
        if opts.iters == 0 {
            return Err(Error::InvalidOption(
                "iters is 0: the run trains nothing; give at least 1".into(),
            ));
        }
        serde_json::from_str::<serde::de::IgnoredAny>(&opts.run).map_err(|e| {
            Error::InvalidOption(format!("the run record to checkpoint is not JSON: {e}"))
        })?;
        let start = opts.resume.as_ref().map_or(0, Resume::iteration);
        if start >= opts.iters {
            return Err(Error::InvalidOption(format!(
                "the checkpoint is at iteration {start}, but the run ends after iteration {}: raise iters past {start} to train further",
                opts.iters - 1
            )));
        }
        let resume = opts.resume.as_ref().map(|r| r.path.as_path());
        let out = RunDir::check(&opts.out, resume, start, opts.overwrite)?;
        Ok(Fit { opts, out, start })
    }

    /// The first iteration this run trains (the checkpoint's, on resume).
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Train an allocated `model` (and a fresh `opt`, which a resume fills):
    /// restore the checkpoint, warm up, then every iteration apply the
    /// schedule, call `step`, run backward, clip and update, and write a
    /// metrics row. Ends with the loss plot (also after a failed step) and
    /// the checkpoint; a Ctrl-C stops after the current step with a
    /// checkpoint of it.
    pub fn run<M, S>(self, model: &mut M, opt: &mut AdamW, mut step: S) -> Result<FitSummary>
    where
        M: PrecisionModel + Parameters,
        S: FnMut(&mut M, Step) -> Result<Tensor>,
    {
        let Fit {
            mut opts,
            out,
            start,
        } = self;
        let iters = opts.iters;
        let schedule = opts
            .schedule
            .take()
            .unwrap_or_else(|| M::schedule().clone());
        Plan::of(model).check_not_empty(short_type_name::<M>())?;
        check_schedule::<M>(&schedule)?;
        if let Some(resume) = opts.resume.take() {
            resume.checkpoint.restore(&resume.path, model, opt)?;
        }
        let warnings = late_phases(&schedule, iters, &opts.hints.late_phase);
        for w in &warnings {
            eprintln!("{w}");
        }

        let clip = opts.clip_norm;
        let hint = &opts.hints.diverged;
        let report = warmup(model, opt, &schedule, start, |m, o| {
            let at = Step {
                iteration: start,
                warmup: true,
            };
            train_step(m, o, &mut step, at, clip, hint).map(drop)
        })?;
        let mut summary = FitSummary {
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
        let mut trained = || -> Result<()> {
            for iter in start..iters {
                let sw = apply_schedule(model, &schedule, iter)?;
                if sw.changed > 0 || iter == start {
                    let line = sw.to_string();
                    say(&bar, &line);
                    summary.switches.push(line);
                }
                let t0 = Instant::now();
                let at = Step {
                    iteration: iter,
                    warmup: false,
                };
                let (loss, per_element) = timed("step (all of it)", || {
                    train_step(model, opt, &mut step, at, clip, hint)
                })?;
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
        };
        let trained = trained();
        bar.abandon();
        let all: Vec<StepMetrics> = out
            .earlier
            .iter()
            .chain(&summary.metrics)
            .cloned()
            .collect();
        let steps: Vec<(u64, f32)> = all.iter().map(|m| (m.iter, m.loss)).collect();
        let switches: Vec<plot::Switch> = (schedule.phases().iter().skip(1))
            .map(|p| plot::Switch {
                iter: p.start,
                recipe: p.recipe.to_string(),
            })
            .collect();
        let loss_plot = plot::LossPlot {
            title: "training loss",
            steps: &steps,
            evals: &[],
            switches: &switches,
            scale: plot::Scale::Linear,
        };
        // A failed step still leaves the plot of the steps before it.
        let plotted = plot::loss_curve(&summary.plot, &loss_plot);
        trained?;
        plotted?;
        save_checkpoint(&summary.checkpoint, model, opt, next, &opts.run)?;
        Ok(summary)
    }
}

/// One optimizer step: `step`'s loss, checked finite, then backward,
/// clipping and the update. Returns (loss, saved bytes per element).
fn train_step<M, S>(
    model: &mut M,
    opt: &mut AdamW,
    step: &mut S,
    at: Step,
    clip_norm: Option<f32>,
    hint: &str,
) -> Result<(f32, f64)>
where
    M: Parameters,
    S: FnMut(&mut M, Step) -> Result<Tensor>,
{
    let loss = timed("step: forward", || step(model, at))?;
    let saved = loss.saved_bytes();
    let loss_value = timed("step: loss read back", || loss.to_scalar_f32())?;
    if !loss_value.is_finite() {
        return Err(Error::Training(format!(
            "loss is {loss_value} at iteration {}: training diverged; {hint}",
            at.iteration
        )));
    }
    let grads = timed("step: backward", || loss.backward())?;
    drop(loss);
    timed("step: clip and AdamW", || {
        // The clip factor goes into the AdamW step, which scales each
        // gradient element as it reads it: the bits of clip_grad_norm then
        // optimizer_step, without a pass that rewrites every gradient.
        let grad_mul = match clip_norm {
            Some(max_norm) => clip_grad_factor(&grads, max_norm)?.1,
            None => None,
        };
        optimizer_step_scaled(model, opt, &grads, grad_mul)
    })?;
    Ok((loss_value, saved.per_element()))
}

/// The model's type name without its module path (`Flux`), for errors.
fn short_type_name<M>() -> &'static str {
    let full = std::any::type_name::<M>();
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base)
}

/// Warning lines for phases that cannot start within `0..iters`.
fn late_phases(schedule: &Schedule, iters: u64, hint: &str) -> Vec<String> {
    schedule
        .phases()
        .iter()
        .filter(|p| p.start >= iters)
        .map(|p| {
            format!(
                "warning: the {} phase starts at iteration {}, but the run ends after iteration {}: it will not run ({hint})",
                p.recipe,
                p.start,
                iters - 1
            )
        })
        .collect()
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

    #[test]
    fn type_names_lose_their_path() {
        struct Local;
        assert_eq!(short_type_name::<Local>(), "Local");
        assert_eq!(short_type_name::<Vec<u8>>(), "Vec");
    }
}
