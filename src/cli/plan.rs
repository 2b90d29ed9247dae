//! `mxswitch plan`: the precision plan and schedule of a config, built
//! without allocating a single weight.

use mxswitch::models::flux::{estimate_training_bytes, format_bytes, Flux, RunConfig};
use mxswitch::runtime::module::try_count_params;
use mxswitch::runtime::{Error, Result};
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
}

pub fn run(args: &PlanArgs) -> Result<()> {
    let config = RunConfig::load(&args.config)?;
    let schedule = mxswitch::train::schedule_of(&config, None)?;
    let mut model = Flux::new(&config.model);
    let plan = model.plan();
    let params = try_count_params(&mut model)?;
    let memory = estimate_training_bytes(&config)?;
    if args.json {
        let phases: Vec<_> = schedule
            .phases()
            .iter()
            .map(|p| json!({"start": p.start, "recipe": p.recipe.to_string()}))
            .collect();
        let out = json!({
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
    if schedule.layers_per_iter > 0 {
        println!(
            "  ramp: {} layers per iteration, {}",
            schedule.layers_per_iter,
            schedule.order.name()
        );
    }
    Ok(())
}
