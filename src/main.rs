//! The `mxswitch` command line: parses the arguments and hands each
//! subcommand to its module under `cli/`.
//!
//! Adding a subcommand takes three lines here: a variant of [`Command`]
//! holding the command's `clap::Args` struct, and one arm in `main` that calls
//! `cli::finish(cli::<name>::run(&args))`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

/// Compile-time-checked low-precision training: MXFP4 that switches to FP8.
#[derive(Debug, Parser)]
#[command(name = "mxswitch", version, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Quantize the float tensors of a safetensors file to an MX or FP8
    /// format and report the error of each.
    Quantize(cli::quantize::QuantizeArgs),
    /// Train Flux on seeded synthetic data through its precision schedule.
    Train(cli::train::TrainArgs),
    /// Show the precision plan and schedule of a config (no weights allocated).
    Plan(cli::plan::PlanArgs),
    /// Write a checkpoint's weights in Black Forest Labs' Flux naming.
    Export(cli::export::ExportArgs),
    /// Run a command on N ranks, one process per device, every rank's
    /// output shown with a `[rank k]` prefix.
    Launch(cli::launch::LaunchArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return cli::report_parse_error(err),
    };
    match cli.command {
        Command::Quantize(args) => cli::finish(cli::quantize::run(&args)),
        Command::Train(args) => cli::finish(cli::train::run(&args)),
        Command::Plan(args) => cli::finish(cli::plan::run(&args)),
        Command::Export(args) => cli::finish(cli::export::run(&args)),
        Command::Launch(args) => cli::finish(cli::launch::run(&args)),
    }
}
