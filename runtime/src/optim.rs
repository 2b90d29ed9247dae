//! AdamW with decoupled weight decay, and gradient clipping by global norm.
//! State is keyed by [`ParamId`], so replacing a parameter's value (or
//! switching the recipe that computes its gradient) keeps it.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::backend::AdamWScalars;
use crate::cpu::CpuStorage;
use crate::storage::Storage;
use crate::{DType, Device, Error, Gradients, Param, ParamId, Result, Shape, Tensor};

/// AdamW hyper-parameters. SPEC section 8 trains Flux with beta1 0.9,
/// beta2 0.95, eps 1e-8, weight decay 0.1.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamWConfig {
    /// Learning rate (>= 0).
    pub lr: f32,
    /// First-moment decay, in [0, 1).
    pub beta1: f32,
    /// Second-moment decay, in [0, 1).
    pub beta2: f32,
    /// Added to the denominator for stability (>= 0).
    pub eps: f32,
    /// Decoupled weight decay: each step scales w by `1 - lr * weight_decay` (>= 0).
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

/// A moment buffer: f32, packed, on the device of the parameter's last
/// step (a checkpoint's moments start on the host and move at that step),
/// so a GPU parameter's update never leaves the device.
struct Buf(Storage);

impl Buf {
    /// Host values (a checkpoint's), moved at the parameter's next step.
    fn host(v: Vec<f32>) -> Result<Buf> {
        Ok(Buf(Storage::from_cpu(CpuStorage::F32(v), &Device::Cpu)?))
    }

    fn zeros(n: usize, device: &Device) -> Result<Buf> {
        Ok(Buf(Storage::zeros(
            &Shape::new(vec![n]),
            DType::F32,
            device,
        )?))
    }

    /// A deep copy (a device copy for a GPU buffer).
    fn try_clone(&self) -> Result<Buf> {
        let n = self.0.buffer_bytes() / 4;
        Ok(Buf(self.0.copy_strided(&crate::Layout::contiguous(
            Shape::new(vec![n]),
        ))?))
    }

    /// The values on the host (downloaded from a GPU buffer).
    fn values(&self) -> Result<Cow<'_, [f32]>> {
        self.0.host_f32()
    }

    /// The storage on `device`, moved there first if it is elsewhere.
    fn on(&mut self, device: &Device) -> Result<&mut Storage> {
        if self.0.device() != *device {
            let host = CpuStorage::F32(self.values()?.into_owned());
            self.0 = Storage::from_cpu(host, device)?;
        }
        Ok(&mut self.0)
    }
}

/// Moments of one parameter and the number of steps it has taken.
struct Moments {
    step: u64,
    m: Buf,
    v: Buf,
}

impl Moments {
    fn try_clone(&self) -> Result<Moments> {
        Ok(Moments {
            step: self.step,
            m: self.m.try_clone()?,
            v: self.v.try_clone()?,
        })
    }
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
///
/// A parameter is updated on its own device by that backend's
/// [`OptimBackend`](crate::backend::OptimBackend) (on a GPU,
/// `runtime/kernels/adamw.cu`: the same f32 operations in the same order as
/// the CPU, so the same bits), a gradient elsewhere being moved there first;
/// its moments stay on that device. [`AdamW::state`] downloads them and
/// [`AdamW::set_state`]'s host values move at the parameter's next step.
pub struct AdamW {
    config: AdamWConfig,
    state: HashMap<ParamId, Moments>,
}

impl AdamW {
    /// An optimizer with no state yet. Errors with `InvalidOption` unless lr,
    /// eps and weight_decay are >= 0 and both betas are in [0, 1).
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

    /// The hyper-parameters in use.
    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }

    /// Sets the learning rate for the next steps (for a schedule); not validated.
    pub fn set_lr(&mut self, lr: f32) {
        self.config.lr = lr;
    }

    /// Steps taken by a parameter (0 if it never had a gradient).
    pub fn steps(&self, id: ParamId) -> u64 {
        self.state.get(&id).map_or(0, |s| s.step)
    }

    /// (steps, m, v) of a parameter, for checkpoints: borrowed when the
    /// moments are on the host, downloaded when they are on a GPU.
    #[allow(clippy::type_complexity)]
    pub fn state(&self, id: ParamId) -> Result<Option<(u64, Cow<'_, [f32]>, Cow<'_, [f32]>)>> {
        match self.state.get(&id) {
            None => Ok(None),
            Some(s) => Ok(Some((s.step, s.m.values()?, s.v.values()?))),
        }
    }

    /// A deep copy of the optimizer (GPU moments copied on the device).
    pub fn try_clone(&self) -> Result<AdamW> {
        let mut state = HashMap::with_capacity(self.state.len());
        for (&id, s) in &self.state {
            state.insert(id, s.try_clone()?);
        }
        Ok(AdamW {
            config: self.config,
            state,
        })
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
        self.state.insert(
            id,
            Moments {
                step,
                m: Buf::host(m)?,
                v: Buf::host(v)?,
            },
        );
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
            let value = self.step_one(param, grad)?;
            param.set(value)?;
        }
        Ok(())
    }

    /// One parameter's update on its own device (its gradient is moved
    /// there if it is elsewhere); returns the new value.
    fn step_one(&mut self, param: &Param, grad: &Tensor) -> Result<Tensor> {
        let device = param.device();
        let grad = if grad.device() == device {
            grad.clone()
        } else {
            grad.to_device(&device)?
        };
        let n = param.elem_count();
        let state = match self.state.entry(param.id()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(Moments {
                step: 0,
                m: Buf::zeros(n, &device)?,
                v: Buf::zeros(n, &device)?,
            }),
        };
        let step = state.step + 1;
        let scalars = scalars(&self.config, step);
        let w = param.tensor();
        let m = state.m.on(&device)?;
        let v = state.v.on(&device)?;
        let out =
            w.storage()
                .adamw_step(w.layout(), (grad.storage(), grad.layout()), m, v, &scalars)?;
        state.step = step;
        Ok(Tensor::untracked(out, param.shape().clone()))
    }
}

impl Clone for AdamW {
    /// A deep copy; panics only if a GPU copy of the moments fails (out of
    /// device memory), see [`AdamW::try_clone`].
    fn clone(&self) -> AdamW {
        self.try_clone()
            .unwrap_or_else(|e| panic!("AdamW::clone: {e}"))
    }
}

/// The scalars of step `step`, each computed as torch computes it: the
/// step size and bias correction in f64 (Python floats), the rest in f32.
fn scalars(cfg: &AdamWConfig, step: u64) -> AdamWScalars {
    let t = step as i32;
    AdamWScalars {
        decay: 1.0 - cfg.lr * cfg.weight_decay,
        b1: cfg.beta1,
        one_minus_b1: 1.0 - cfg.beta1,
        b2: cfg.beta2,
        one_minus_b2: 1.0 - cfg.beta2,
        step_size: (f64::from(cfg.lr) / (1.0 - f64::from(cfg.beta1).powi(t))) as f32,
        bias2_sqrt: (1.0 - f64::from(cfg.beta2).powi(t)).sqrt() as f32,
        eps: cfg.eps,
    }
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
    // Every gradient's sum of squares stays on its device and all come to
    // the host in one transfer (one synchronization on a GPU, not one per
    // gradient); the f32 sums are then added in f64 in id order.
    let sums = ids
        .iter()
        .map(|&id| {
            let g = grads.get(id).expect("id taken from the map");
            g.sqr()?.sum_all()?.to_dtype(DType::F32)?.reshape(1)
        })
        .collect::<Result<Vec<Tensor>>>()?;
    let one_device = sums.windows(2).all(|p| p[0].device() == p[1].device());
    if one_device && !sums.is_empty() {
        let parts: Vec<&Tensor> = sums.iter().collect();
        for s in Tensor::cat(&parts, 0)?.to_vec_f32()? {
            sum_sq += f64::from(s);
        }
    } else {
        for s in &sums {
            sum_sq += f64::from(s.to_scalar_f32()?);
        }
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
