//! Memory per GPU of a data-parallel run, plain (DDP) or sharded as ZeRO
//! stages 1 to 3 (FSDP is stage 3), computed from a config's plan: what
//! `mxswitch plan --world-size N --zero S` prints. Only stage 0 is built
//! (SPEC section 9); the other stages are the plan for a model whose
//! optimizer state does not fit one device.

use std::collections::BTreeMap;

use mxswitch_models::flux::{estimate_training_bytes, Flux, RunConfig};
use mxswitch_runtime::dist::BUCKET_BYTES;
use mxswitch_runtime::module::try_visit_params;
use mxswitch_runtime::{Error, Result};
use serde::Serialize;

/// Bytes per GPU of one rank, by what they hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ShardedMemory {
    /// Number of ranks (GPUs).
    pub world_size: u64,
    /// 0: every rank holds everything (DDP, what `launch` runs); 1: AdamW's
    /// moments sharded; 2: and the gradients; 3: and the weights (FSDP).
    pub zero: u8,
    /// f32 weights, the only copy (the GEMMs quantize them on the fly, so
    /// they are the master weights too).
    pub parameters: u64,
    /// Warm-up's copy of the weights (sharded like them).
    pub warmup_copy: u64,
    /// f32 gradients.
    pub gradients: u64,
    /// AdamW's m and v.
    pub adamw: u64,
    /// What the forward of the rank's slice (batch / N) keeps for backward.
    pub activations: u64,
    /// A gradient bucket and its sum (stage 0 and 1) or its reduce-scatter
    /// input (stage 2 and 3).
    pub buckets: u64,
    /// Stage 3: the largest layer's weights gathered whole, twice (the layer
    /// in use and the next one prefetched).
    pub gathered: u64,
    /// The sum of the parts.
    pub total: u64,
}

/// The memory per GPU of training `cfg` on `world` ranks at ZeRO stage `zero`.
pub fn sharded_memory(cfg: &RunConfig, world: u64, zero: u8) -> Result<ShardedMemory> {
    if world == 0 || cfg.data.batch as u64 % world != 0 {
        return Err(Error::InvalidOption(format!(
            "--world-size {world}: data.batch {} is the global batch and must split evenly over the ranks",
            cfg.data.batch
        )));
    }
    if zero > 3 {
        return Err(Error::InvalidOption(format!(
            "--zero {zero}: the stages are 0 (DDP), 1, 2 and 3"
        )));
    }
    let full = estimate_training_bytes(cfg)?;
    let mut slice = cfg.clone();
    slice.data.batch = cfg.data.batch / world as usize;
    let activations = estimate_training_bytes(&slice)?.activations;
    let shard = |bytes: u64, from: u8| match zero >= from {
        true => bytes.div_ceil(world),
        false => bytes,
    };
    let mut m = ShardedMemory {
        world_size: world,
        zero,
        parameters: shard(full.parameters, 3),
        warmup_copy: shard(full.warmup_copy, 3),
        gradients: shard(full.gradients, 2),
        adamw: shard(full.adamw, 1),
        activations,
        buckets: 2 * BUCKET_BYTES as u64,
        gathered: match zero {
            3 => 2 * 4 * largest_layer(cfg)?,
            _ => 0,
        },
        total: 0,
    };
    m.total = m
        .parts()
        .iter()
        .try_fold(0u64, |t, &b| t.checked_add(b))
        .ok_or_else(|| Error::InvalidOption("the memory per GPU overflows 64 bits".into()))?;
    Ok(m)
}

impl ShardedMemory {
    /// Every part that `total` sums.
    fn parts(&self) -> [u64; 7] {
        [
            self.parameters,
            self.warmup_copy,
            self.gradients,
            self.adamw,
            self.activations,
            self.buckets,
            self.gathered,
        ]
    }
}

/// Parameters of the largest unit ZeRO-3 gathers: a double or single block
/// (`double_blocks.3.`), or a top-level module outside the blocks.
fn largest_layer(cfg: &RunConfig) -> Result<u64> {
    let mut model = Flux::new(&cfg.model);
    let mut units: BTreeMap<String, u64> = BTreeMap::new();
    try_visit_params(&mut model, |slot| {
        let mut parts = slot.path.split('.');
        let first = parts.next().unwrap_or_default();
        let unit = match first {
            "double_blocks" | "single_blocks" => format!("{first}.{}", parts.next().unwrap_or("")),
            other => other.to_string(),
        };
        let n: u64 = slot.shape.iter().map(|&d| d as u64).product();
        *units.entry(unit).or_default() += n;
        Ok(())
    })?;
    Ok(units.values().copied().max().unwrap_or(0))
}
