//! `mxswitch plan`: the precision plan and schedule of a config, built
//! without allocating a single weight.

use mxswitch::models::flux::{estimate_training_bytes, format_bytes, Flux, RunConfig};
use mxswitch::runtime::module::try_count_params;
use mxswitch::runtime::{Error, Result};
use mxswitch::train::sharded_memory;
use serde_json::json;

/// Arguments of `mxswitch plan`.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// A RON run config file, or a built-in name: flux-tiny, flux-small, flux-schnell.
    #[arg(long, value_name = "FILE.ron|NAME")]
    pub config: String,
    /// Print JSON: {"layers", "linears", "parameters", "training_bytes_estimate", "phases": [{"start", "recipe"}], ...}.
    #[arg(long)]
    pub json: bool,
    /// Also show the memory per GPU of a data-parallel run on N ranks
    /// (JSON: "per_gpu", one entry per ZeRO stage shown).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub world_size: Option<u64>,
    /// The ZeRO stage to show with --world-size: 0 (DDP), 1, 2 or 3 (FSDP)
    /// [default: all four].
    #[arg(long, value_name = "S", requires = "world_size", value_parser = clap::value_parser!(u8).range(0..=3))]
    pub zero: Option<u8>,
    /// Replace the config's data.batch, the global batch (split evenly over
    /// the ranks of --world-size).
    #[arg(long, value_name = "B", value_parser = clap::value_parser!(u64).range(1..))]
    pub batch: Option<u64>,
}

pub fn run(args: &PlanArgs) -> Result<()> {
    let mut config = RunConfig::load(&args.config)?;
    if let Some(b) = args.batch {
        config.data.batch = usize::try_from(b)
            .map_err(|_| Error::InvalidOption(format!("--batch {b} is too large")))?;
    }
    let schedule = mxswitch::train::schedule_of(&config, None)?;
    let mut model = Flux::new(&config.model);
    let plan = model.plan();
    let params = try_count_params(&mut model)?;
    let memory = estimate_training_bytes(&config)?;
    let per_gpu = match args.world_size {
        Some(n) => {
            let stages = args.zero.map_or(0..=3, |z| z..=z);
            stages
                .map(|z| sharded_memory(&config, n, z))
                .collect::<Result<Vec<_>>>()?
        }
        None => Vec::new(),
    };
    if args.json {
        let phases: Vec<_> = schedule
            .phases()
            .iter()
            .map(|p| json!({"start": p.start, "recipe": p.recipe.to_string()}))
            .collect();
        let mut out = json!({
            "layers": plan.len(),
            "linears": plan.linears(),
            "extras": plan.extras.len(),
            "parameters": params,
            "training_bytes_estimate": memory.total,
            "training_bytes": {
                "parameters": memory.parameters,
                "gradients": memory.gradients,
                "adamw": memory.adamw,
                "activations": memory.activations,
                "warmup_copy": memory.warmup_copy,
            },
            "phases": phases,
            "layers_per_iter": schedule.layers_per_iter,
            "order": schedule.order.name(),
        });
        if args.world_size.is_some() {
            out["per_gpu"] = json!(per_gpu);
        }
        let text =
            serde_json::to_string_pretty(&out).map_err(|e| Error::InvalidOption(e.to_string()))?;
        println!("{text}");
        return Ok(());
    }
    println!(
        "{}: {} plan layers, {} quantized linears, {} parameters (not allocated)",
        args.config,
        plan.len(),
        plan.linears(),
        params
    );
    println!(
        "  training needs about {} ({})",
        format_bytes(memory.total),
        memory.breakdown()
    );
    for p in schedule.phases() {
        println!("  from iteration {:>6}: {}", p.start, p.recipe);
    }
    for m in &per_gpu {
        let stage = match m.zero {
            0 => "DDP".to_string(),
            z => format!("ZeRO-{z}"),
        };
        println!(
            "  {stage} on {} ranks: {} per GPU (weights {}, warm-up copy {}, gradients {}, AdamW {}, activations {}, buckets {}, gathered layers {})",
            m.world_size,
            format_bytes(m.total),
            format_bytes(m.parameters),
            format_bytes(m.warmup_copy),
            format_bytes(m.gradients),
            format_bytes(m.adamw),
            format_bytes(m.activations),
            format_bytes(m.buckets),
            format_bytes(m.gathered)
        );
    }
    if schedule.layers_per_iter > 0 {
        println!(
            "  ramp: {} layers per iteration, {}",
            schedule.layers_per_iter,
            schedule.order.name()
        );
    }
    Ok(())
}
