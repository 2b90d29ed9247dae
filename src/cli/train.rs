//! `mxswitch train`: train Flux through its precision schedule.

use std::path::PathBuf;

use mxswitch::models::flux::RunConfig;
use mxswitch::runtime::{Device, Result};
use mxswitch::train::{train, TrainOptions};

/// Arguments of `mxswitch train`.
#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// A RON run config file, or a built-in name: flux-tiny, flux-small, flux-schnell.
    #[arg(long, value_name = "FILE.ron|NAME")]
    pub config: String,
    /// Number of optimizer steps [default: the config's train.iters].
    #[arg(long, value_name = "N")]
    pub iters: Option<u64>,
    /// Iteration of the first switch (moves the config's second phase).
    #[arg(long, value_name = "N")]
    pub switch_at: Option<u64>,
    /// Where to train.
    #[arg(long, value_name = "DEVICE", default_value = "cpu", value_parser = ["cpu", "cuda", "rocm"])]
    pub device: String,
    /// Output folder for metrics.jsonl, loss.png and checkpoint.safetensors.
    #[arg(long, value_name = "DIR", default_value = "runs/flux")]
    pub out: PathBuf,
    /// Seed of the weights, the data and stochastic rounding.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Continue from a checkpoint written by an earlier run.
    #[arg(long, value_name = "CKPT")]
    pub resume: Option<PathBuf>,
}

pub fn run(args: &TrainArgs) -> Result<()> {
    let device = match args.device.as_str() {
        "cuda" => Device::Cuda(0),
        "rocm" => Device::Rocm(0),
        _ => Device::Cpu,
    };
    mxswitch::train::check_device(device)?;
    let config = RunConfig::load(&args.config)?;
    let summary = train(&TrainOptions {
        config,
        iters: args.iters,
        switch_at: args.switch_at,
        device,
        out: args.out.clone(),
        seed: args.seed,
        resume: args.resume.clone(),
        progress: true,
    })?;
    if let (Some(first), Some(last)) = (summary.metrics.first(), summary.metrics.last()) {
        println!(
            "trained iterations {}..={}: loss {:.4} -> {:.4}; wrote {}, {} and {}",
            first.iter,
            last.iter,
            first.loss,
            last.loss,
            args.out.join("metrics.jsonl").display(),
            summary.plot.display(),
            summary.checkpoint.display()
        );
    }
    if let Some(report) = mxswitch::runtime::profile::report() {
        eprint!("{report}");
    }
    Ok(())
}
