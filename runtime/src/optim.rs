//! AdamW with decoupled weight decay, and gradient clipping by global norm.
//! State is keyed by [`ParamId`], so replacing a parameter's value (or
//! switching the recipe that computes its gradient) keeps it.

use std::collections::HashMap;

use rayon::prelude::*;

use crate::cpu::PAR_MIN_ELEMS;
use crate::{Error, Gradients, Param, ParamId, Result, Tensor};

/// AdamW hyper-parameters. SPEC section 8 trains Flux with beta1 0.9,
/// beta2 0.95, eps 1e-8, weight decay 0.1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
}

impl Default for AdamWConfig {
    /// The defaults of `torch.optim.AdamW`.
    fn default() -> AdamWConfig {
        AdamWConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 1e-2,
        }
    }
}

/// Moments of one parameter and the number of steps it has taken.
#[derive(Clone)]
struct Moments {
    step: u64,
    m: Vec<f32>,
    v: Vec<f32>,
}

/// AdamW as `torch.optim.AdamW` computes it, per parameter with step t:
///
/// ```text
/// w <- w (1 - lr wd)                       decoupled weight decay
/// m <- b1 m + (1 - b1) g
/// v <- b2 v + (1 - b2) g^2
/// w <- w - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
/// ```
///
/// Moments are f32; a BF16 parameter is updated in f32 and rounded back.
/// Cloning copies the whole state (warm-up restores it bit for bit).
#[derive(Clone)]
pub struct AdamW {
    config: AdamWConfig,
    state: HashMap<ParamId, Moments>,
}

impl AdamW {
    pub fn new(config: AdamWConfig) -> Result<AdamW> {
        let AdamWConfig {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } = config;
        let valid = lr >= 0.0
            && (0.0..1.0).contains(&beta1)
            && (0.0..1.0).contains(&beta2)
            && eps >= 0.0
            && weight_decay >= 0.0;
        if !valid {
            return Err(Error::InvalidOption(format!(
                "AdamW needs lr, eps, weight_decay >= 0 and betas in [0, 1), got {config:?}"
            )));
        }
        Ok(AdamW {
            config,
            state: HashMap::new(),
        })
    }

    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }

    pub fn set_lr(&mut self, lr: f32) {
        self.config.lr = lr;
    }

    /// Steps taken by a parameter (0 if it never had a gradient).
    pub fn steps(&self, id: ParamId) -> u64 {
        self.state.get(&id).map_or(0, |s| s.step)
    }

    /// (steps, m, v) of a parameter, for checkpoints.
    pub fn state(&self, id: ParamId) -> Option<(u64, &[f32], &[f32])> {
        self.state.get(&id).map(|s| (s.step, &s.m[..], &s.v[..]))
    }

    /// Restore a parameter's state from a checkpoint.
    pub fn set_state(&mut self, id: ParamId, step: u64, m: Vec<f32>, v: Vec<f32>) -> Result<()> {
        if m.len() != v.len() {
            return Err(Error::Shape(format!(
                "AdamW state: m has {} values, v has {}",
                m.len(),
                v.len()
            )));
        }
        self.state.insert(id, Moments { step, m, v });
        Ok(())
    }

    /// Updates every parameter that has a gradient in `grads`; the others,
    /// like torch's parameters whose grad is None, are left untouched.
    pub fn step<'a>(
        &mut self,
        params: impl IntoIterator<Item = &'a mut Param>,
        grads: &Gradients,
    ) -> Result<()> {
        for param in params {
            let Some(grad) = grads.get(param.id()) else {
                continue;
            };
            if grad.shape() != param.shape() {
                return Err(Error::Shape(format!(
                    "AdamW: gradient {:?} does not match parameter {:?}",
                    grad.shape(),
                    param.shape()
                )));
            }
            let mut w = param.to_vec_f32()?;
            let g = grad.to_vec_f32()?;
            let n = w.len();
            let state = self.state.entry(param.id()).or_insert_with(|| Moments {
                step: 0,
                m: vec![0.0; n],
                v: vec![0.0; n],
            });
            state.step += 1;
            update(
                &self.config,
                state.step,
                &mut w,
                &g,
                &mut state.m,
                &mut state.v,
            );
            let value = Tensor::from_vec(w, param.shape().clone(), &param.device())?
                .to_dtype(param.dtype())?;
            param.set(value)?;
        }
        Ok(())
    }
}

/// One AdamW step over flat slices, split across threads when large.
fn update(cfg: &AdamWConfig, step: u64, w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
    // Scalar factors in f64, as torch computes them in Python floats.
    let t = step as i32;
    let step_size = (f64::from(cfg.lr) / (1.0 - f64::from(cfg.beta1).powi(t))) as f32;
    let bias2_sqrt = (1.0 - f64::from(cfg.beta2).powi(t)).sqrt() as f32;
    let decay = 1.0 - cfg.lr * cfg.weight_decay;
    let (b1, b2, eps) = (cfg.beta1, cfg.beta2, cfg.eps);
    let kernel = |w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]| {
        for (((w, &g), m), v) in w.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            *w *= decay;
            *m = b1 * *m + (1.0 - b1) * g;
            *v = b2 * *v + (1.0 - b2) * g * g;
            *w -= step_size * *m / (v.sqrt() / bias2_sqrt + eps);
        }
    };
    if w.len() < PAR_MIN_ELEMS {
        kernel(w, g, m, v);
        return;
    }
    const CHUNK: usize = 1 << 14;
    w.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK))
        .zip(v.par_chunks_mut(CHUNK))
        .for_each(|(((w, g), m), v)| kernel(w, g, m, v));
}

/// Scales all gradients by `max_norm / (norm + 1e-6)` when their global L2
/// norm exceeds `max_norm` (as `torch.nn.utils.clip_grad_norm_`) and returns
/// the norm before clipping. A non-finite norm leaves the gradients as they
/// are, so the caller can see it and skip the step instead of writing NaN
/// into every weight.
pub fn clip_grad_norm(grads: &mut Gradients, max_norm: f32) -> Result<f32> {
    let mut ids: Vec<ParamId> = grads.iter().map(|(id, _)| id).collect();
    ids.sort_unstable();
    let mut sum_sq = 0f64;
    for &id in &ids {
        let g = grads.get(id).expect("id taken from the map");
        sum_sq += f64::from(
            g.sqr()?
                .sum_all()?
                .to_dtype(crate::DType::F32)?
                .to_scalar_f32()?,
        );
    }
    let norm = sum_sq.sqrt() as f32;
    let coef = max_norm / (norm + 1e-6);
    if norm.is_finite() && coef < 1.0 {
        for (_, g) in grads.iter_mut() {
            *g = g.mul_scalar(coef)?;
        }
    }
    Ok(norm)
}
