//! `mxswitch train`: train Flux through its precision schedule.

use std::path::PathBuf;
use std::process::ExitCode;

use mxswitch::files::interrupt;
use mxswitch::models::flux::RunConfig;
use mxswitch::runtime::dist::Membership;
use mxswitch::runtime::{Device, Result};
use mxswitch::train::{train, Scale, TrainOptions};

/// Arguments of `mxswitch train`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
A folder that holds a previous run is refused unless the run resumes from its checkpoint \
or --overwrite is given. Ctrl-C stops after the current step: the metrics are flushed, a \
checkpoint of the last finished step is written, and the command prints how to resume \
(exit status 130).")]
pub struct TrainArgs {
    /// A RON run config file, or a built-in name: flux-tiny, flux-small,
    /// flux-schnell. Optional with --resume (the checkpoint records it).
    #[arg(long, value_name = "FILE.ron|NAME", required_unless_present = "resume")]
    pub config: Option<String>,
    /// Number of optimizer steps [default: the config's train.iters, or the
    /// resumed run's].
    #[arg(long, value_name = "N", value_parser = whole_number, allow_negative_numbers = true)]
    pub iters: Option<u64>,
    /// Iteration of the first switch (moves the config's second phase).
    #[arg(long, value_name = "N", value_parser = whole_number, allow_negative_numbers = true)]
    pub switch_at: Option<u64>,
    /// Where to train.
    #[arg(long, value_name = "DEVICE", default_value = "cpu", value_parser = ["cpu", "cuda", "rocm"])]
    pub device: String,
    /// Output folder for metrics.jsonl, loss.png and checkpoint.safetensors.
    #[arg(long, value_name = "DIR", default_value = "runs/flux")]
    pub out: PathBuf,
    /// Seed of the weights, the data and stochastic rounding [default: 0, or
    /// the resumed run's].
    #[arg(long, value_name = "S", value_parser = whole_number, allow_negative_numbers = true)]
    pub seed: Option<u64>,
    /// Continue the run a checkpoint records.
    #[arg(long, value_name = "CKPT", conflicts_with = "init_from")]
    pub resume: Option<PathBuf>,
    /// Start from Flux weights in Black Forest Labs' safetensors naming (F32
    /// or BF16; `mxswitch export` writes them) instead of seeded ones.
    #[arg(long, value_name = "FILE.safetensors")]
    pub init_from: Option<PathBuf>,
    /// Train on precomputed data: a folder of safetensors shards with
    /// `latent` (N, C, H, W), `txt` (N, L, context) and `vec` (N, vec), as
    /// `cargo run --example make_dataset` writes [default: seeded synthetic
    /// data; a resume reads the run's recorded shards].
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Evaluate on validation shards (as --data, plus `timestep_id` (N,)
    /// in 0..=7): the mean MSE at t = timestep_id / 8 with fixed noise.
    #[arg(long, value_name = "DIR")]
    pub val_data: Option<PathBuf>,
    /// Evaluate after every SAMPLES training samples [default: only after
    /// the last step].
    #[arg(long, value_name = "SAMPLES", value_parser = whole_number, allow_negative_numbers = true)]
    pub eval_every: Option<u64>,
    /// Stop once the eval loss is at most X (MLPerf's Flux.1 target: 0.586).
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub target_loss: Option<f32>,
    /// The loss axis of loss.png.
    #[arg(long, value_name = "SCALE", value_enum, default_value_t = Scale::Linear)]
    pub plot_scale: Scale,
    /// Replace a previous run in the output folder.
    #[arg(long)]
    pub overwrite: bool,
    /// Under `mxswitch launch`: compare the ranks' per-linear recipes every
    /// N iterations and stop on a mismatch (0: never).
    #[arg(long, value_name = "N", default_value_t = mxswitch::train::RECIPE_CHECK_EVERY, value_parser = whole_number, allow_negative_numbers = true)]
    pub recipe_check_every: u64,
}

/// A whole number for an iteration count or a seed, with a message that
/// says so (clap would call `-1` an unexpected argument).
fn whole_number(s: &str) -> std::result::Result<u64, String> {
    s.parse()
        .map_err(|_| format!("expected a whole number 0 or more, got `{s}`"))
}

/// The files a run wrote, or, on a rank other than 0, who writes them.
fn wrote(summary: &mxswitch::train::TrainSummary, writer: bool) -> String {
    if !writer {
        return "rank 0 writes the run's files".into();
    }
    format!(
        "wrote {}, {} and {}",
        summary.metrics_file.display(),
        summary.plot.display(),
        summary.checkpoint.display()
    )
}

/// Exit status of a run stopped by Ctrl-C or SIGTERM (128 + SIGINT).
const EXIT_INTERRUPTED: u8 = 130;

pub fn run(args: &TrainArgs) -> Result<ExitCode> {
    let device = match args.device.as_str() {
        "cuda" => Device::Cuda(0),
        "rocm" => Device::Rocm(0),
        _ => Device::Cpu,
    };
    let dist = Membership::from_env()?;
    let writer = dist.as_ref().is_none_or(|m| m.rank == 0);
    mxswitch::train::check_device(dist.as_ref().map_or(device, |m| m.device(device)))?;
    let config = args.config.as_deref().map(RunConfig::load).transpose()?;
    interrupt::install();
    interrupt::set_graceful(true);
    let summary = train(&TrainOptions {
        config,
        iters: args.iters,
        switch_at: args.switch_at,
        device,
        out: args.out.clone(),
        seed: args.seed,
        resume: args.resume.clone(),
        init_from: args.init_from.clone(),
        data: args.data.clone(),
        val_data: args.val_data.clone(),
        eval_every: args.eval_every,
        target_loss: args.target_loss,
        plot_scale: args.plot_scale,
        overwrite: args.overwrite,
        progress: true,
        dist,
        recipe_check_every: args.recipe_check_every,
    })?;
    interrupt::set_graceful(false);
    if let Some(next) = summary.interrupted_at {
        match summary.metrics.last() {
            Some(last) => println!(
                "interrupted after iteration {}: {}; resume with: mxswitch train --resume {} --out {}",
                last.iter,
                wrote(&summary, writer),
                summary.checkpoint.display(),
                args.out.display()
            ),
            None => println!("interrupted before iteration {next}: nothing was trained or written"),
        }
        return Ok(ExitCode::from(EXIT_INTERRUPTED));
    }
    if let (Some(at), Some(e)) = (summary.target_reached, summary.evals.last()) {
        println!(
            "reached the target eval loss: {:.4} after iteration {at} ({} samples)",
            e.eval_loss, e.samples
        );
    }
    if let (Some(first), Some(last)) = (summary.metrics.first(), summary.metrics.last()) {
        println!(
            "trained iterations {}..={}: loss {:.4} -> {:.4}; {}",
            first.iter,
            last.iter,
            first.loss,
            last.loss,
            wrote(&summary, writer)
        );
    }
    if let Some(report) = mxswitch::runtime::profile::report() {
        eprint!("{report}");
    }
    Ok(ExitCode::SUCCESS)
}
