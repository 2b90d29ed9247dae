//! Warm-up (SPEC section 7): before the first step, run one grad-enabled
//! step under every recipe the schedule will use, on scratch state, then put
//! parameters and optimizer state back bit for bit.
//!
//! It is also the proof that a switch is not a silent no-op: during each
//! recipe's warm-up step, that recipe's linear kernels must have run and
//! every `#[quantize]` linear must have been called, or warm-up fails and
//! names the linears the model's forward never reaches.

use crate::module::{try_visit_params, Parameters};
use crate::optim::AdamW;
use crate::plan::{apply_schedule, PlanCx, Planned, PrecisionModel};
use crate::qlinear::kernel_runs;
use crate::recipe::RecipeKind;
use crate::schedule::Schedule;
use crate::{Error, Result, Tensor};

/// What warm-up ran: kernel invocations per scheduled recipe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarmupReport {
    /// Each scheduled recipe, with the linear kernel calls its step made.
    pub runs: Vec<(RecipeKind, u64)>,
}

impl std::fmt::Display for WarmupReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .runs
            .iter()
            .map(|(k, n)| format!("{k}: {n} linear kernel calls"))
            .collect();
        write!(f, "warm-up ran {}", parts.join(", "))
    }
}

/// Every parameter value, by visit order (buffers are immutable, so this is
/// a list of shared handles, not a copy).
fn snapshot<M: Parameters>(model: &mut M) -> Vec<Option<Tensor>> {
    let mut v = Vec::new();
    model.visit_params("", &mut |slot| {
        v.push(slot.param.as_ref().map(|p| p.tensor().clone()))
    });
    v
}

/// Every plan linear's forward-call count, in plan order.
fn linear_runs<M: Planned>(model: &M) -> Vec<u64> {
    let mut runs = Vec::new();
    PlanCx::root(|cx| model.visit_linears(cx, &mut |_, lin| runs.push(lin.runs())));
    runs
}

/// The paths of the linears whose count is still the one in `before`.
fn not_reached<M: Planned>(model: &M, before: &[u64]) -> Vec<String> {
    let mut idle = Vec::new();
    let mut i = 0;
    PlanCx::root(|cx| {
        model.visit_linears(cx, &mut |site, lin| {
            if before.get(i) == Some(&lin.runs()) {
                idle.push(site.path());
            }
            i += 1;
        })
    });
    idle
}

fn restore<M: Parameters>(model: &mut M, snap: &[Option<Tensor>]) -> Result<()> {
    let mut values = snap.iter();
    try_visit_params(model, |slot| match (slot.param.as_mut(), values.next()) {
        (Some(p), Some(Some(t))) => p.set(t.clone()),
        _ => Ok(()),
    })
}

/// Run `step` once per recipe of `schedule` with every linear on that
/// recipe, each from the parameters and optimizer state of the start (put
/// back after every step), then apply the recipes of `iteration`. `step` is one full training step (forward, backward,
/// optimizer update) at the production batch shape.
pub fn warmup<M, F>(
    model: &mut M,
    opt: &mut AdamW,
    schedule: &Schedule,
    iteration: u64,
    mut step: F,
) -> Result<WarmupReport>
where
    M: PrecisionModel + Parameters,
    F: FnMut(&mut M, &mut AdamW) -> Result<()>,
{
    let params = snapshot(model);
    let mut opt_state = Some(opt.try_clone()?);
    let mut recipes = Vec::new();
    for phase in schedule.phases() {
        if !recipes.contains(&phase.recipe) {
            recipes.push(phase.recipe);
        }
    }
    let mut runs = Vec::new();
    for (i, &recipe) in recipes.iter().enumerate() {
        apply_schedule(model, &Schedule::constant(recipe), 0)?;
        let before = kernel_runs(recipe.kind);
        let linears_before = linear_runs(model);
        let result = step(model, opt);
        let ran = kernel_runs(recipe.kind) - before;
        result?;
        if ran == 0 {
            return Err(Error::Plan(format!(
                "warm-up: no `{recipe}` linear kernel ran during its step; the model's forward does not reach its quantized linears"
            )));
        }
        let idle = not_reached(model, &linears_before);
        if !idle.is_empty() {
            return Err(Error::Plan(format!(
                "warm-up: the model's forward never called {} of its {} #[quantize] linears during the `{recipe}` step: {}; call each one in the forward, or remove its mark",
                idle.len(),
                linears_before.len(),
                idle.join(", ")
            )));
        }
        runs.push((recipe.kind, ran));
        // Back to the start before the next recipe's step: the updated
        // parameters and moments are dropped here, so the device never holds
        // them beside the snapshot during another forward and backward.
        restore(model, &params)?;
        // The copy itself goes back after the last step (no second copy).
        let saved = "the copy is taken only after the last step";
        *opt = if i + 1 < recipes.len() {
            opt_state.as_ref().expect(saved).try_clone()?
        } else {
            opt_state.take().expect(saved)
        };
    }
    apply_schedule(model, schedule, iteration)?;
    Ok(WarmupReport { runs })
}
