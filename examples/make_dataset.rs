//! Writes a folder of precomputed Flux data, the shards `mxswitch train
//! --data DIR` and `--val-data DIR` read, for trying that path without a
//! VAE, a text encoder or a GPU.
//!
//! Each shard is a safetensors file with `latent` [N, C, H, W], `txt`
//! [N, Lt, context] and `vec` [N, vec] in the config's shapes (and, with
//! `--val`, `timestep_id` [N] = i % 8). The samples have learnable
//! structure, the synthetic data's classes: a latent is its class pattern
//! plus a little noise, the text and pooled vector are the class's, so the
//! loss can fall. A training and a validation set written with the same
//! `--seed` share the classes and differ in their samples.
//!
//! ```text
//! cargo run --release --example make_dataset -- --config flux-tiny \
//!     --out data/flux-tiny/train --samples 512 --shards 4
//! cargo run --release --example make_dataset -- --config flux-tiny \
//!     --out data/flux-tiny/val --samples 64 --val
//! ```
//!
//! `--config` is a built-in name or a `.ron` file; `--dtype f32|bf16`
//! [f32]; `--seed N` [0]; `--overwrite` replaces the shards a folder holds
//! (and removes those the new set does not replace). It prints one line per
//! file written, then the set as `train` would open it. An error is one
//! line on stderr and a non-zero exit status.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};

use mxswitch::models::flux::RunConfig;
use mxswitch::runtime::Result;
use mxswitch::train::shards::{
    write_synthetic_shards, Role, ShardDType, ShardSet, SyntheticShards,
};

/// Write safetensors shards of synthetic Flux latents, text and vectors.
#[derive(Debug, Parser)]
#[command(name = "make_dataset")]
struct Args {
    /// Run config whose model and data shapes the shards take: a built-in
    /// name (flux-tiny, ...) or a .ron file.
    #[arg(long)]
    config: String,
    /// Folder to write the shards into (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// Samples in all shards.
    #[arg(long, default_value_t = 512)]
    samples: u64,
    /// Files to spread the samples over.
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// A validation set: adds `timestep_id` = i % 8.
    #[arg(long)]
    val: bool,
    /// Element type of latent, txt and vec.
    #[arg(long, value_enum, default_value_t = Dtype::F32)]
    dtype: Dtype,
    /// Seed of the classes and the samples.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Replace the shards the folder already holds.
    #[arg(long)]
    overwrite: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Dtype {
    F32,
    Bf16,
}

fn run(args: &Args) -> Result<()> {
    let cfg = RunConfig::load(&args.config)?;
    let opts = SyntheticShards {
        samples: args.samples,
        shards: args.shards,
        seed: args.seed,
        val: args.val,
        dtype: match args.dtype {
            Dtype::F32 => ShardDType::F32,
            Dtype::Bf16 => ShardDType::BF16,
        },
        overwrite: args.overwrite,
    };
    let done = write_synthetic_shards(&args.out, &cfg.model, &cfg.data, &opts)?;
    for (path, n) in &done.written {
        println!("wrote {}: {n} samples", path.display());
    }
    for path in &done.removed {
        println!("removed the old shard {}", path.display());
    }
    let role = if args.val { Role::Val } else { Role::Train };
    let set = ShardSet::open(&args.out, &cfg.model, &cfg.data, role)?;
    println!(
        "{} holds a {} set of {} samples in {} shard{} for {} (fingerprint {})",
        set.dir().display(),
        if args.val { "validation" } else { "training" },
        set.len(),
        set.shards(),
        if set.shards() == 1 { "" } else { "s" },
        cfg.origin,
        set.fingerprint()
    );
    Ok(())
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let text = e.render().to_string();
            let line = text.lines().next().unwrap_or("error: bad arguments");
            eprintln!("{line}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.to_string().replace(['\r', '\n'], " "));
            ExitCode::FAILURE
        }
    }
}
