//! Multi-tensor optimizer dispatch: AdamW over many parameters and the
//! gradient norm's sum of squares and scaling over many gradients, each a
//! few launches per device ([`crate::backend::MultiOptimBackend`]).

use crate::backend::{AdamWScalars, AdamWStep, ScaledAdamWBackend};

use super::{same, CpuStorage, CudaStorage, Storage, Variant, View};
use crate::{Error, Layout, Result};
/// One parameter of a multi-tensor AdamW step.
pub(crate) struct AdamWEntry<'a> {
    /// The parameter's storage and view.
    pub(crate) w: View<'a>,
    /// The gradient's storage and view, on the parameter's device.
    pub(crate) grad: View<'a>,
    /// The f32 first moment, packed, updated in place.
    pub(crate) m: &'a mut Storage,
    /// The f32 second moment, packed, updated in place.
    pub(crate) v: &'a mut Storage,
    /// This parameter's step scalars.
    pub(crate) scalars: &'a AdamWScalars,
}

impl Storage {
    /// AdamW steps of many parameters of one device (the backend's
    /// `adamw_multi`): the new parameters in order, each with the bits of
    /// [`Storage::adamw_step`]; an empty list is no work. With `grad_mul`,
    /// every gradient element is multiplied by it as the update reads it
    /// (`adamw_multi_scaled`): the bits of scaling the gradients with
    /// [`Storage::scale_all`] first, without the scaling pass.
    pub(crate) fn adamw_multi(
        entries: Vec<AdamWEntry<'_>>,
        grad_mul: Option<f32>,
    ) -> Result<Vec<Storage>> {
        let Some(first) = entries.first().map(|e| e.w.0) else {
            return Ok(Vec::new());
        };
        let _p = crate::profile::scope("adamw multi", first.device());
        match first {
            Storage::Cpu(_) => adamw_multi_on::<CpuStorage>(first, entries, grad_mul),
            Storage::Cuda(_) => adamw_multi_on::<CudaStorage>(first, entries, grad_mul),
        }
    }

    /// The f64 sum of the squares of every element of `grads`, all on one
    /// device (the backend's `sum_squares`); 0 for none.
    pub(crate) fn sum_squares(grads: &[View<'_>]) -> Result<f64> {
        let Some(&(first, _)) = grads.first() else {
            return Ok(0.0);
        };
        let _p = crate::profile::scope("grad sum of squares", first.device());
        match first {
            Storage::Cpu(_) => grads_on::<CpuStorage, _>(first, grads, |g| {
                <CpuStorage as crate::backend::MultiOptimBackend>::sum_squares(g)
            }),
            Storage::Cuda(_) => grads_on::<CudaStorage, _>(first, grads, |g| {
                <CudaStorage as crate::backend::MultiOptimBackend>::sum_squares(g)
            }),
        }
    }

    /// Every gradient of `grads` (one device) times `mul`, with the bits of
    /// `affine(mul, 0)`, packed, in order.
    pub(crate) fn scale_all(grads: &[View<'_>], mul: f32) -> Result<Vec<Storage>> {
        let Some(&(first, _)) = grads.first() else {
            return Ok(Vec::new());
        };
        let _p = crate::profile::scope("grad scale", first.device());
        match first {
            Storage::Cpu(_) => grads_on::<CpuStorage, _>(first, grads, |g| {
                let v = <CpuStorage as crate::backend::MultiOptimBackend>::scale_all(g, mul)?;
                Ok(v.into_iter().map(Variant::wrap).collect())
            }),
            Storage::Cuda(_) => grads_on::<CudaStorage, _>(first, grads, |g| {
                let v = <CudaStorage as crate::backend::MultiOptimBackend>::scale_all(g, mul)?;
                Ok(v.into_iter().map(Variant::wrap).collect())
            }),
        }
    }
}

/// `f` on the views of `grads` as storages of backend `B` on `first`'s device.
fn grads_on<B: Variant, T>(
    first: &Storage,
    grads: &[View<'_>],
    f: impl FnOnce(&[(&B, &Layout)]) -> Result<T>,
) -> Result<T> {
    let views = grads
        .iter()
        .map(|&(s, l)| Ok((same::<B>("gradient norm", first, s)?, l)))
        .collect::<Result<Vec<(&B, &Layout)>>>()?;
    f(&views)
}

fn adamw_multi_on<'a, B: ScaledAdamWBackend + Variant>(
    first: &Storage,
    entries: Vec<AdamWEntry<'a>>,
    grad_mul: Option<f32>,
) -> Result<Vec<Storage>> {
    let mut steps = Vec::with_capacity(entries.len());
    for e in entries {
        let w = same::<B>("AdamW", first, e.w.0)?;
        let g = same::<B>("AdamW", first, e.grad.0)?;
        let (m_dev, v_dev) = (e.m.device(), e.v.device());
        let on_device = m_dev == first.device() && v_dev == first.device();
        let (Some(m), Some(v), true) = (B::of_mut(e.m), B::of_mut(e.v), on_device) else {
            return Err(Error::InvalidOption(format!(
                "AdamW: moments on {m_dev} and {v_dev} for a parameter on {}",
                first.device()
            )));
        };
        let step = AdamWStep {
            layout: e.w.1,
            grad: g,
            grad_layout: e.grad.1,
            m,
            v,
            scalars: e.scalars,
        };
        steps.push((w, step));
    }
    let new = match grad_mul {
        None => B::adamw_multi(steps)?,
        Some(mul) => B::adamw_multi_scaled(steps, mul)?,
    };
    Ok(new.into_iter().map(B::wrap).collect())
}
