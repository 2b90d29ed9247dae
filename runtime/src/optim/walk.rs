//! A model's AdamW step through its parameter walk
//! ([`crate::module::optimizer_step`] and [`optimizer_step_scaled`]).

use super::AdamW;
use crate::module::Parameters;
use crate::{Error, Gradients, Param, Result};

/// [`crate::module::optimizer_step`] with the gradients multiplied by
/// `grad_mul` (when given) as the update reads them
/// ([`AdamW::step_scaled`]): with the factor of
/// [`super::clip_grad_factor`], the bits of [`super::clip_grad_norm`] then
/// [`crate::module::optimizer_step`], without the scaling pass.
pub fn optimizer_step_scaled<M: Parameters + ?Sized>(
    model: &mut M,
    opt: &mut AdamW,
    grads: &Gradients,
    grad_mul: Option<f32>,
) -> Result<()> {
    // The walk lends one slot at a time, so the parameters are taken out of
    // their slots for the step and put back, in walk order, by path.
    let mut taken: Vec<(String, Param)> = Vec::new();
    model.visit_params("", &mut |slot| {
        if let Some(p) = slot.param.take() {
            taken.push((slot.path, p));
        }
    });
    let result = opt.step_scaled(taken.iter_mut().map(|(_, p)| p), grads, grad_mul);
    let mut back = taken.into_iter().peekable();
    model.visit_params("", &mut |slot| {
        if slot.param.is_none() && back.peek().is_some_and(|(path, _)| *path == slot.path) {
            *slot.param = back.next().map(|(_, p)| p);
        }
    });
    match back.next() {
        Some((path, _)) => Err(Error::Training(format!(
            "parameter `{path}` has no slot to go back to: the model's parameter walk changed during the optimizer step"
        ))),
        None => result,
    }
}
