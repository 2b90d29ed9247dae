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

use mxswitch_runtime::dist::Collective;
use mxswitch_runtime::lr_schedule::LrSchedule;
use mxswitch_runtime::module::Parameters;
use mxswitch_runtime::optim::{clip_grad_factor, optimizer_step_scaled, AdamW};
use mxswitch_runtime::plan::{apply_schedule, check_schedule, Plan, PrecisionModel};
use mxswitch_runtime::profile::timed;
use mxswitch_runtime::schedule::Schedule;
use mxswitch_runtime::warmup::warmup;
use mxswitch_runtime::{no_grad, Device, Error, Result, Tensor};

use super::checkpoint::{read_checkpoint, save_checkpoint, Checkpoint};
use super::dist;
use super::metrics::{EvalMetrics, MetricsRow, StepMetrics};
use super::plot::{self, LossPlot, Scale, Switch};
use super::progress::Progress;
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
    /// The learning rate of each iteration; `None` keeps the optimizer's.
    pub lr: Option<LrSchedule>,
    /// Samples one step trains on: counts the samples in the metrics, the
    /// checkpoint (the data position) and [`Eval::every_samples`].
    pub samples_per_step: u64,
    /// The loss plot's title.
    pub title: String,
    /// The loss plot's loss axis.
    pub plot_scale: Scale,
    /// The ranks of a data-parallel run (SPEC section 9): the loss and the
    /// gradients are averaged over them, and only rank 0 writes files.
    /// `None` trains alone.
    pub collective: Option<Box<dyn Collective>>,
    /// With a collective: compare the ranks' per-linear recipes at every
    /// iteration that is a multiple of this (0: never).
    pub recipe_check_every: u64,
}

/// Evaluation during a run ([`Fit::run_with_eval`]).
pub struct Eval<'a, M> {
    /// Evaluate after each step that reaches a multiple of this many
    /// samples, and after the last step.
    pub every_samples: u64,
    /// Stop once the eval loss is at most this (MLPerf's target).
    pub target_loss: Option<f32>,
    /// The mean loss over the evaluation set, of the model as it is; the
    /// loop runs it without recording a tape.
    pub loss: &'a mut dyn FnMut(&mut M) -> Result<f32>,
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
            lr: None,
            samples_per_step: 1,
            title: "training loss".into(),
            plot_scale: Scale::Linear,
            collective: None,
            recipe_check_every: dist::RECIPE_CHECK_EVERY,
        }
    }
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct FitSummary {
    /// The steps this run trained (not the earlier part of a resumed run).
    pub metrics: Vec<StepMetrics>,
    /// The evaluations this run made.
    pub evals: Vec<EvalMetrics>,
    /// Set when an evaluation reached [`Eval::target_loss`]: the iteration
    /// after which it did (the run stopped there).
    pub target_reached: Option<u64>,
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
    /// The checked output folder; `None` on a rank other than 0, which
    /// writes nothing.
    out: Option<RunDir>,
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
        if opts.samples_per_step == 0 {
            return Err(Error::InvalidOption(
                "samples_per_step is 0: a step trains on at least one sample".into(),
            ));
        }
        let start = opts.resume.as_ref().map_or(0, Resume::iteration);
        if start >= opts.iters {
            return Err(Error::InvalidOption(format!(
                "the checkpoint is at iteration {start}, but the run ends after iteration {}: raise iters past {start} to train further",
                opts.iters - 1
            )));
        }
        let resume = opts.resume.as_ref().map(|r| r.path.as_path());
        let writes = opts.collective.as_ref().is_none_or(|c| c.rank() == 0);
        let out = match writes {
            true => Some(RunDir::check(&opts.out, resume, start, opts.overwrite)?),
            false => None,
        };
        Ok(Fit { opts, out, start })
    }

    /// The first iteration this run trains (the checkpoint's, on resume).
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Train an allocated `model` (and a fresh `opt`, which a resume fills):
    /// restore the checkpoint, warm up, then every iteration apply the
    /// schedule and the learning rate, call `step`, run backward, clip and
    /// update, and write a metrics row. Ends with the loss plot (also after
    /// a failed step) and the checkpoint; a Ctrl-C stops after the current
    /// step with a checkpoint of it.
    pub fn run<M, S>(self, model: &mut M, opt: &mut AdamW, step: S) -> Result<FitSummary>
    where
        M: PrecisionModel + Parameters,
        S: FnMut(&mut M, Step) -> Result<Tensor>,
    {
        self.run_with_eval(model, opt, step, None)
    }

    /// [`Fit::run`], evaluating as `eval` says: an eval row in the metrics
    /// after each step that reaches a multiple of `every_samples` and after
    /// the last one, and a stop (with a checkpoint) once the eval loss
    /// reaches the target.
    pub fn run_with_eval<M, S>(
        self,
        model: &mut M,
        opt: &mut AdamW,
        mut step: S,
        mut eval: Option<Eval<'_, M>>,
    ) -> Result<FitSummary>
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
        let per_step = opts.samples_per_step;
        let schedule = opts
            .schedule
            .take()
            .unwrap_or_else(|| M::schedule().clone());
        Plan::of(model).check_not_empty(short_type_name::<M>())?;
        check_schedule::<M>(&schedule)?;
        if let Some(resume) = opts.resume.take() {
            resume.checkpoint.check_samples(&resume.path, per_step)?;
            resume.checkpoint.restore(&resume.path, model, opt)?;
        }
        if eval.as_ref().is_some_and(|e| e.every_samples == 0) {
            return Err(Error::InvalidOption(
                "evaluating every 0 samples: give at least 1".into(),
            ));
        }
        let warnings = late_phases(&schedule, iters, &opts.hints.late_phase);
        for w in &warnings {
            eprintln!("{w}");
        }
        let lr_at = |iter: u64| opts.lr.map(|s| s.at(iter));
        if let Some(lr) = lr_at(start) {
            opt.set_lr(lr);
        }

        let clip = opts.clip_norm;
        let hint = &opts.hints.diverged;
        let mut coll = opts.collective.take();
        let report = warmup(model, opt, &schedule, start, |m, o| {
            let at = Step {
                iteration: start,
                warmup: true,
            };
            train_step(m, o, &mut step, at, clip, hint, coll.as_deref_mut()).map(drop)
        })?;
        let path_of = |f: &str| opts.out.join(f);
        let mut summary = FitSummary {
            metrics: Vec::new(),
            evals: Vec::new(),
            target_reached: None,
            switches: Vec::new(),
            warnings,
            checkpoint: path_of(run_dir::CHECKPOINT),
            plot: path_of(run_dir::PLOT),
            metrics_file: path_of(run_dir::METRICS),
            interrupted_at: None,
        };
        if interrupt::requested() {
            // Nothing trained yet: nothing to write.
            summary.interrupted_at = Some(start);
            return Ok(summary);
        }
        let mut progress = Progress::new(opts.progress, start, iters);
        progress.say(&report.to_string());

        let mut metrics_out = out.as_ref().map(RunDir::open_metrics).transpose()?;
        let check_every = opts.recipe_check_every;
        let mut next = start;
        let mut trained = || -> Result<()> {
            for iter in start..iters {
                let sw = apply_schedule(model, &schedule, iter)?;
                if sw.changed > 0 || iter == start {
                    let line = sw.to_string();
                    progress.say(&line);
                    summary.switches.push(line);
                }
                if let Some(c) = coll.as_deref_mut() {
                    if check_every > 0 && (iter % check_every == 0 || iter == start) {
                        dist::check_recipes(c, dist::recipe_hash(model), iter)?;
                    }
                }
                if let Some(lr) = lr_at(iter) {
                    opt.set_lr(lr);
                }
                let t0 = Instant::now();
                let at = Step {
                    iteration: iter,
                    warmup: false,
                };
                let (loss, per_element) = timed("step (all of it)", || {
                    train_step(model, opt, &mut step, at, clip, hint, coll.as_deref_mut())
                })?;
                let step_time_ms = t0.elapsed().as_secs_f64() * 1e3;
                if iter == start {
                    mxswitch_runtime::profile::reset();
                }
                let samples = (iter + 1).saturating_mul(per_step);
                let m = StepMetrics {
                    iter,
                    loss,
                    recipe: sw.recipe.to_string(),
                    layers_converted: sw.layers_converted,
                    linears_converted: sw.linears_converted,
                    lr: opt.config().lr,
                    samples,
                    step_time_ms,
                    saved_bytes_per_element: per_element,
                    device_peak_bytes: opts.device.peak_memory_bytes(),
                };
                if let Some(w) = metrics_out.as_mut() {
                    w.write(&MetricsRow::Step(m.clone()))?;
                }
                progress.step(&m);
                summary.metrics.push(m);
                next = iter + 1;
                if let Some(ev) = eval.as_mut() {
                    let due = samples / ev.every_samples > (samples - per_step) / ev.every_samples;
                    if due || next == iters {
                        let t0 = Instant::now();
                        let eval_loss = timed("evaluation", || no_grad(|| (ev.loss)(model)))?;
                        let e = EvalMetrics {
                            iter,
                            samples,
                            eval_loss,
                            recipe: sw.recipe.to_string(),
                            eval_time_ms: t0.elapsed().as_secs_f64() * 1e3,
                        };
                        if let Some(w) = metrics_out.as_mut() {
                            w.write(&MetricsRow::Eval(e.clone()))?;
                        }
                        progress.eval(&e);
                        summary.evals.push(e);
                        if ev.target_loss.is_some_and(|t| eval_loss <= t) {
                            summary.target_reached = Some(iter);
                            break;
                        }
                    }
                }
                if interrupt::requested() && next < iters {
                    summary.interrupted_at = Some(next);
                    break;
                }
            }
            Ok(())
        };
        let trained = trained();
        progress.finish();
        let Some(out) = out else {
            // A rank other than 0: rank 0 writes the run's files.
            return trained.map(|()| summary);
        };
        let all: Vec<&MetricsRow> = out.earlier.iter().collect();
        let (mut steps, mut evals) = (Vec::new(), Vec::new());
        for row in all {
            match row {
                MetricsRow::Step(m) => steps.push((m.iter, m.loss)),
                MetricsRow::Eval(e) => evals.push((e.iter, e.eval_loss)),
            }
        }
        steps.extend(summary.metrics.iter().map(|m| (m.iter, m.loss)));
        evals.extend(summary.evals.iter().map(|e| (e.iter, e.eval_loss)));
        let switches: Vec<Switch> = schedule
            .phases()
            .iter()
            .skip(1)
            .map(|p| Switch {
                iter: p.start,
                recipe: p.recipe.to_string(),
            })
            .collect();
        // A failed step still leaves the plot of the steps before it.
        let plotted = plot::loss_curve(
            &summary.plot,
            &LossPlot {
                title: &opts.title,
                steps: &steps,
                evals: &evals,
                switches: &switches,
                scale: opts.plot_scale,
            },
        );
        trained?;
        plotted?;
        save_checkpoint(
            &summary.checkpoint,
            model,
            opt,
            next,
            next.saturating_mul(per_step),
            &opts.run,
        )?;
        Ok(summary)
    }
}

/// One optimizer step: `step`'s loss, checked finite, then backward,
/// clipping and the update. Returns (loss, saved bytes per element). With a
/// collective the loss and the gradients are the means over the ranks.
fn train_step<M, S>(
    model: &mut M,
    opt: &mut AdamW,
    step: &mut S,
    at: Step,
    clip_norm: Option<f32>,
    hint: &str,
    mut coll: Option<&mut (dyn Collective + 'static)>,
) -> Result<(f32, f64)>
where
    M: Parameters,
    S: FnMut(&mut M, Step) -> Result<Tensor>,
{
    let loss = timed("step: forward", || step(model, at))?;
    let saved = loss.saved_bytes();
    let mut loss_value = timed("step: loss read back", || loss.to_scalar_f32())?;
    if let Some(c) = coll.as_deref_mut() {
        // Every rank sees the same mean, so a divergence stops them all.
        loss_value = timed("step: loss all-reduce", || dist::mean_loss(c, loss_value))?;
    }
    if !loss_value.is_finite() {
        return Err(Error::Training(format!(
            "loss is {loss_value} at iteration {}: training diverged; {hint}",
            at.iteration
        )));
    }
    let grads = match coll {
        Some(c) => timed("step: backward and gradient all-reduce", || {
            dist::backward_averaged(c, &loss)
        })?,
        None => timed("step: backward", || loss.backward())?,
    };
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
