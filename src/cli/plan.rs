//! `mxswitch plan`: the precision plan and schedule of a config, built
//! without allocating a single weight.

use mxswitch::models::flux::{Flux, RunConfig};
use mxswitch::runtime::module::count_params;
use mxswitch::runtime::{Error, Result};
use serde_json::json;

/// Arguments of `mxswitch plan`.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// A RON run config file, or a built-in name: flux-tiny, flux-small, flux-schnell.
    #[arg(long, value_name = "FILE.ron|NAME")]
    pub config: String,
    /// Print JSON: {"layers", "linears", "phases": [{"start", "recipe"}], ...}.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &PlanArgs) -> Result<()> {
    let config = RunConfig::load(&args.config)?;
    let schedule = mxswitch::train::schedule_of(&config, None)?;
    let mut model = Flux::new(&config.model);
    let plan = model.plan();
    let params = count_params(&mut model);
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
