//! What the training loop does differently on the ranks of a data-parallel
//! run (SPEC section 9): average the loss and the gradients, and check that
//! every rank runs the same per-linear recipes.

use mxswitch_runtime::dist::{all_gather_bytes, all_reduce_f32, Collective, BUCKET_BYTES};
use mxswitch_runtime::plan::{Planned, RecipeReport};
use mxswitch_runtime::{Error, Gradients, Result, Tensor};

/// Compare the ranks' recipes every this many iterations unless told otherwise.
pub const RECIPE_CHECK_EVERY: u64 = 50;

/// Backward of this rank's `loss`, the gradients replaced by their means
/// over the ranks (summed in buckets as backward makes them final): every
/// rank then takes the same optimizer step.
pub fn backward_averaged(c: &mut dyn Collective, loss: &Tensor) -> Result<Gradients> {
    mxswitch_runtime::dist::backward_averaged(c, loss, BUCKET_BYTES)
}

/// The mean over the ranks of each rank's loss.
pub fn mean_loss(c: &mut dyn Collective, loss: f32) -> Result<f32> {
    Ok(all_reduce_f32(c, &[loss])?[0] / c.world_size() as f32)
}

/// FNV-1a over every quantized linear's path and recipe, in plan order.
pub fn recipe_hash<M: Planned + ?Sized>(model: &M) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for l in RecipeReport::of(model).linears {
        for b in format!("{}={:?};", l.path, l.recipe).bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Every rank's recipe hash at `iter`; a rank that differs from rank 0
/// stops the run on every rank with one error naming the ranks.
pub fn check_recipes(c: &mut dyn Collective, hash: u64, iter: u64) -> Result<()> {
    let all = all_gather_bytes(c, &hash.to_le_bytes())?;
    let hashes: Vec<u64> = all
        .iter()
        .map(|b| u64::from_le_bytes(b[..8].try_into().expect("8 bytes per rank")))
        .collect();
    let differ: Vec<String> = hashes
        .iter()
        .enumerate()
        .filter(|(_, h)| **h != hashes[0])
        .map(|(r, h)| format!("rank {r} ({h:016x})"))
        .collect();
    if differ.is_empty() {
        return Ok(());
    }
    Err(Error::Training(format!(
        "recipe check at iteration {iter}: {} run other per-linear recipes than rank 0 ({:016x}); the switch must follow from the iteration alone on every rank",
        differ.join(", "),
        hashes[0]
    )))
}
