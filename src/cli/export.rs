//! `mxswitch export`: a training checkpoint's weights in Black Forest Labs'
//! Flux safetensors naming, for the Flux tools (and `train --init-from`).

use std::path::PathBuf;

use mxswitch::runtime::Result;
use mxswitch::train::{export, ExportDType};

/// Arguments of `mxswitch export`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
The names are those of black-forest-labs/flux (img_in, double_blocks.N.img_attn.qkv, \
single_blocks.N.linear1, final_layer.adaLN_modulation.1, ...): each single block's split \
q, k, v and MLP linears are fused again into linear1 and linear2. With --dtype f32 (the \
default) `train --init-from` reads the weights back bit for bit. The output appears whole \
or not at all.")]
pub struct ExportArgs {
    /// A checkpoint written by `mxswitch train`.
    #[arg(long, value_name = "CKPT")]
    pub checkpoint: PathBuf,
    /// The Flux weights file to write.
    #[arg(long, value_name = "FILE.safetensors")]
    pub output: PathBuf,
    /// Element type of the written weights (bf16 rounds to nearest even).
    #[arg(long, value_name = "DTYPE", default_value = "f32", value_parser = ["f32", "bf16"])]
    pub dtype: String,
}

pub fn run(args: &ExportArgs) -> Result<()> {
    let dtype = if args.dtype == "bf16" {
        ExportDType::BF16
    } else {
        ExportDType::F32
    };
    export(&args.checkpoint, &args.output, dtype)?;
    println!(
        "wrote {} ({}, Black Forest Labs' Flux naming) from {}",
        args.output.display(),
        args.dtype,
        args.checkpoint.display()
    );
    Ok(())
}
