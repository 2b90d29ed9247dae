//! AdamW with decoupled weight decay, and gradient clipping by global norm.
//! State is keyed by [`ParamId`], so replacing a parameter's value (or
//! switching the recipe that computes its gradient) keeps it.

use std::borrow::Cow;
use std::collections::HashMap;

use rayon::prelude::*;

use crate::cpu::PAR_MIN_ELEMS;
use crate::{Error, Gradients, Param, ParamId, Result, Tensor};

/// AdamW hyper-parameters. SPEC section 8 trains Flux with beta1 0.9,
/// beta2 0.95, eps 1e-8, weight decay 0.1.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
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

/// A moment buffer: on the host, or (feature `cuda`) on the GPU that holds
/// the parameter, so a GPU parameter's update never leaves the device.
enum Buf {
    Host(Vec<f32>),
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::CudaStorage),
}

impl Buf {
    /// A deep copy (a device copy for a GPU buffer).
    fn try_clone(&self) -> Result<Buf> {
        match self {
            Buf::Host(v) => Ok(Buf::Host(v.clone())),
            #[cfg(feature = "cuda")]
            Buf::Cuda(s) => Ok(Buf::Cuda(crate::cuda::adamw::deep_copy(s)?)),
        }
    }

    /// The values on the host (downloaded from a GPU buffer).
    fn host(&self) -> Result<Cow<'_, [f32]>> {
        match self {
            Buf::Host(v) => Ok(Cow::Borrowed(&v[..])),
            #[cfg(feature = "cuda")]
            Buf::Cuda(s) => Ok(Cow::Owned(crate::cuda::adamw::download_f32(s)?)),
        }
    }

    /// The host vector, moving a GPU buffer to the host first.
    fn host_mut(&mut self) -> Result<&mut Vec<f32>> {
        #[cfg(feature = "cuda")]
        if let Buf::Cuda(s) = self {
            let v = crate::cuda::adamw::download_f32(s)?;
            *self = Buf::Host(v);
        }
        match self {
            Buf::Host(v) => Ok(v),
            #[cfg(feature = "cuda")]
            Buf::Cuda(_) => unreachable!("moved to the host above"),
        }
    }

    /// The buffer on `dev`, uploading (or moving from another GPU) first.
    #[cfg(feature = "cuda")]
    fn cuda_mut(&mut self, dev: &crate::cuda::CudaDevice) -> Result<&mut crate::cuda::CudaStorage> {
        use crate::backend::BackendStorage;
        let here = matches!(self, Buf::Cuda(s) if s.device().ordinal() == dev.ordinal());
        if !here {
            let host = self.host()?.into_owned();
            *self = Buf::Cuda(crate::cuda::adamw::upload_f32(dev, &host)?);
        }
        match self {
            Buf::Cuda(s) => Ok(s),
            Buf::Host(_) => unreachable!("moved to the device above"),
        }
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
/// With feature `cuda`, a parameter on a GPU whose gradient is on the same
/// GPU is updated there (`runtime/kernels/adamw.cu`, the same f32 operations
/// in the same order as the CPU, so the same bits), and its moments stay on
/// that GPU; [`AdamW::state`] downloads them and [`AdamW::set_state`]'s host
/// values are uploaded at the parameter's next GPU step.
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

    /// (steps, m, v) of a parameter, for checkpoints: borrowed when the
    /// moments are on the host, downloaded when they are on a GPU.
    #[allow(clippy::type_complexity)]
    pub fn state(&self, id: ParamId) -> Result<Option<(u64, Cow<'_, [f32]>, Cow<'_, [f32]>)>> {
        match self.state.get(&id) {
            None => Ok(None),
            Some(s) => Ok(Some((s.step, s.m.host()?, s.v.host()?))),
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
                m: Buf::Host(m),
                v: Buf::Host(v),
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
            #[cfg(feature = "cuda")]
            if let Some(value) = self.step_cuda(param, grad)? {
                param.set(value)?;
                continue;
            }
            let mut w = param.to_vec_f32()?;
            let g = grad.to_vec_f32()?;
            let n = w.len();
            let state = self.state.entry(param.id()).or_insert_with(|| Moments {
                step: 0,
                m: Buf::Host(vec![0.0; n]),
                v: Buf::Host(vec![0.0; n]),
            });
            let (m, v) = (state.m.host_mut()?, state.v.host_mut()?);
            state.step += 1;
            update(&self.config, state.step, &mut w, &g, m, v);
            let value = Tensor::from_vec(w, param.shape().clone(), &param.device())?
                .to_dtype(param.dtype())?;
            param.set(value)?;
        }
        Ok(())
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

#[cfg(feature = "cuda")]
impl AdamW {
    /// The GPU update of a parameter whose gradient is on the same GPU: the
    /// new value (the moments are updated in place on the device); `None`
    /// when either is elsewhere, for the host path.
    fn step_cuda(&mut self, param: &Param, grad: &Tensor) -> Result<Option<Tensor>> {
        use crate::backend::BackendStorage;
        use crate::cuda::adamw;
        use crate::storage::Storage;
        use crate::Device;
        let _p = crate::profile::scope("adamw", param.device());
        match (param.device(), grad.device()) {
            (Device::Cuda(a), Device::Cuda(b)) if a == b => {}
            _ => return Ok(None),
        }
        let (w, g) = crate::autograd::no_grad(|| -> Result<(Tensor, Tensor)> {
            Ok((param.tensor().contiguous()?, grad.contiguous()?))
        })?;
        let (Storage::Cuda(ws), Storage::Cuda(gs)) = (w.storage(), g.storage()) else {
            return Ok(None);
        };
        let start = |t: &Tensor| t.layout().contiguous_range().map_or(0, |r| r.start);
        let n = w.elem_count();
        let dev = ws.device().clone();
        let id = param.id();
        let state = match self.state.entry(id) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(Moments {
                step: 0,
                m: Buf::Cuda(adamw::zeros_f32(&dev, n)?),
                v: Buf::Cuda(adamw::zeros_f32(&dev, n)?),
            }),
        };
        let step = state.step + 1;
        let (step_size, bias2_sqrt, decay) = factors(&self.config, step);
        let cfg = &self.config;
        let scalars = adamw::AdamWScalars {
            decay,
            b1: cfg.beta1,
            one_minus_b1: 1.0 - cfg.beta1,
            b2: cfg.beta2,
            one_minus_b2: 1.0 - cfg.beta2,
            step_size,
            bias2_sqrt,
            eps: cfg.eps,
        };
        let (m, v) = (state.m.cuda_mut(&dev)?, state.v.cuda_mut(&dev)?);
        let out = adamw::step(ws, start(&w), gs, start(&g), m, v, n, scalars)?;
        state.step = step;
        Ok(Some(Tensor::untracked(
            Storage::Cuda(out),
            param.shape().clone(),
        )))
    }
}

/// The scalar factors of step `step`: (step_size, bias2_sqrt, decay), in f64
/// as torch computes them in Python floats (decay in f32).
fn factors(cfg: &AdamWConfig, step: u64) -> (f32, f32, f32) {
    let t = step as i32;
    let step_size = (f64::from(cfg.lr) / (1.0 - f64::from(cfg.beta1).powi(t))) as f32;
    let bias2_sqrt = (1.0 - f64::from(cfg.beta2).powi(t)).sqrt() as f32;
    let decay = 1.0 - cfg.lr * cfg.weight_decay;
    (step_size, bias2_sqrt, decay)
}

/// One AdamW step over flat slices, split across threads when large.
fn update(cfg: &AdamWConfig, step: u64, w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
    // Scalar factors in f64, as torch computes them in Python floats.
    let (step_size, bias2_sqrt, decay) = factors(cfg, step);
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
    // On a GPU, every gradient's sum of squares stays there and all come to
    // the host in one transfer (one synchronization, not one per gradient);
    // the same f32 sums are then added in f64 in the same order.
    let first_device = ids
        .first()
        .and_then(|&id| grads.get(id))
        .map(|g| g.device());
    let on_one_gpu = matches!(first_device, Some(d) if d != crate::Device::Cpu)
        && ids
            .iter()
            .all(|&id| grads.get(id).map(|g| g.device()) == first_device);
    if on_one_gpu && ids.len() > 1 {
        let mut sums = Vec::with_capacity(ids.len());
        for &id in &ids {
            let g = grads.get(id).expect("id taken from the map");
            sums.push(
                g.sqr()?
                    .sum_all()?
                    .to_dtype(crate::DType::F32)?
                    .reshape(1)?,
            );
        }
        let parts: Vec<&Tensor> = sums.iter().collect();
        for s in Tensor::cat(&parts, 0)?.to_vec_f32()? {
            sum_sq += f64::from(s);
        }
    } else {
        for &id in &ids {
            let g = grads.get(id).expect("id taken from the map");
            sum_sq += f64::from(
                g.sqr()?
                    .sum_all()?
                    .to_dtype(crate::DType::F32)?
                    .to_scalar_f32()?,
            );
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
