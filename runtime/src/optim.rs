//! AdamW with decoupled weight decay, and gradient clipping by global norm.
//! State is keyed by [`ParamId`], so replacing a parameter's value (or
//! switching the recipe that computes its gradient) keeps it.
//!
//! Both run multi-tensor (issue 14): [`AdamW::step`] updates the parameters
//! of one device in one backend call ([`MultiOptimBackend`]; on a GPU one
//! launch per [`GROUP_BYTES`] of new parameter values), and
//! [`clip_grad_norm`] sums the squares of one device's gradients in one
//! call (two launches and one read-back on a GPU) and scales them in one
//! call per [`GROUP_BYTES`]. [`AdamW::step_each`] is the per-parameter
//! path, kept as the reference the multi-tensor one matches bit for bit.
//!
//! [`MultiOptimBackend`]: crate::backend::MultiOptimBackend

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use crate::backend::AdamWScalars;
use crate::cpu::CpuStorage;
use crate::storage::{AdamWEntry, Storage};
use crate::{DType, Device, Error, Gradients, Param, ParamId, Result, Shape, Tensor};

mod clip;
mod walk;
pub use clip::{clip_grad_factor, clip_grad_norm, clip_grad_norm_in_groups};
pub use walk::optimizer_step_scaled;

/// The most bytes of new values one multi-tensor call writes: the new
/// parameters of one AdamW call, the scaled gradients of one clipping call.
/// Buffers are never written in place, so a call holds its new values
/// beside the old ones until they are swapped in; this bounds that extra
/// memory (the per-parameter path held one parameter's worth). A single
/// larger tensor still goes in one call of its own.
pub const GROUP_BYTES: usize = 1 << 30;

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
/// A parameter is updated on its own device by that backend (on a GPU,
/// `runtime/kernels/adamw.cu`: the same f32 operations in the same order as
/// the CPU, so the same bits), a gradient elsewhere being moved there first;
/// its moments stay on that device. [`AdamW::step`] updates all the
/// parameters of a device together
/// ([`MultiOptimBackend`](crate::backend::MultiOptimBackend)),
/// [`AdamW::step_each`] one at a time
/// ([`OptimBackend`](crate::backend::OptimBackend)), with the same bits.
/// [`AdamW::state`] downloads the moments and [`AdamW::set_state`]'s host
/// values move at the parameter's next step.
pub struct AdamW {
    config: AdamWConfig,
    state: HashMap<ParamId, Moments>,
    /// Most bytes of new values per multi-tensor call ([`GROUP_BYTES`]).
    group_bytes: usize,
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
            group_bytes: GROUP_BYTES,
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

    /// Sets the most bytes of new parameter values one multi-tensor call of
    /// [`AdamW::step`] writes (default [`GROUP_BYTES`]; at least one
    /// parameter per call): lower it where memory is tight, at one more
    /// launch per group. The values do not depend on it.
    pub fn set_group_bytes(&mut self, bytes: usize) {
        self.group_bytes = bytes;
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
            group_bytes: self.group_bytes,
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
    /// like torch's parameters whose grad is None, are left untouched. The
    /// parameters of one device are updated together: one backend call (on
    /// a GPU one launch) per [`AdamW::set_group_bytes`] of new values, with
    /// the bits of [`AdamW::step_each`]. A gradient of the wrong shape is an
    /// error after the parameters listed before it are updated.
    pub fn step<'a>(
        &mut self,
        params: impl IntoIterator<Item = &'a mut Param>,
        grads: &Gradients,
    ) -> Result<()> {
        self.step_scaled(params, grads, None)
    }

    /// [`AdamW::step`] with every gradient element first multiplied by
    /// `grad_mul` (when given) as the update reads it: `g * grad_mul + 0`
    /// rounded to the gradient's dtype, the bits of `g.mul_scalar(grad_mul)`,
    /// so the step is bit-identical to scaling the gradients first and then
    /// calling [`AdamW::step`] (the clip factor of [`clip_grad_factor`]
    /// fused into the update, saving the scaling pass). `grads` is not
    /// changed.
    pub fn step_scaled<'a>(
        &mut self,
        params: impl IntoIterator<Item = &'a mut Param>,
        grads: &Gradients,
        grad_mul: Option<f32>,
    ) -> Result<()> {
        // `&mut` items are distinct parameters, so ids do not repeat.
        let mut batch: Vec<&'a mut Param> = Vec::new();
        for param in params {
            let Some(grad) = grads.get(param.id()) else {
                continue;
            };
            if grad.shape() != param.shape() {
                let e = shape_error(grad, param);
                self.step_batch(batch, grads, grad_mul)?;
                return Err(e);
            }
            batch.push(param);
        }
        self.step_batch(batch, grads, grad_mul)
    }

    /// The per-parameter path: [`AdamW::step`] with one backend update per
    /// parameter (on a GPU one launch each), the reference the multi-tensor
    /// path is checked against.
    pub fn step_each<'a>(
        &mut self,
        params: impl IntoIterator<Item = &'a mut Param>,
        grads: &Gradients,
    ) -> Result<()> {
        for param in params {
            let Some(grad) = grads.get(param.id()) else {
                continue;
            };
            if grad.shape() != param.shape() {
                return Err(shape_error(grad, param));
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
        let config = self.config;
        let state = self.moments(param)?;
        let step = state.step + 1;
        let scalars = scalars(&config, step);
        let w = param.tensor();
        let m = state.m.on(&device)?;
        let v = state.v.on(&device)?;
        let out =
            w.storage()
                .adamw_step(w.layout(), (grad.storage(), grad.layout()), m, v, &scalars)?;
        state.step = step;
        Ok(Tensor::untracked(out, param.shape().clone()))
    }

    /// The moments of `param`, zeros on its device if it has none yet.
    fn moments(&mut self, param: &Param) -> Result<&mut Moments> {
        Ok(match self.state.entry(param.id()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let (n, device) = (param.elem_count(), param.device());
                e.insert(Moments {
                    step: 0,
                    m: Buf::zeros(n, &device)?,
                    v: Buf::zeros(n, &device)?,
                })
            }
        })
    }

    /// Steps `params` (distinct ids, each with a gradient of its shape):
    /// per device, in groups of at most `group_bytes` of new values.
    fn step_batch(
        &mut self,
        params: Vec<&mut Param>,
        grads: &Gradients,
        grad_mul: Option<f32>,
    ) -> Result<()> {
        let mut devices: Vec<(Device, Vec<&mut Param>)> = Vec::new();
        for p in params {
            let d = p.device();
            match devices.iter_mut().find(|(dev, _)| *dev == d) {
                Some((_, list)) => list.push(p),
                None => devices.push((d, vec![p])),
            }
        }
        for (device, list) in devices {
            let mut group: Vec<&mut Param> = Vec::new();
            let mut bytes = 0usize;
            for p in list {
                let b = p.elem_count() * p.dtype().size_in_bytes();
                if !group.is_empty() && bytes + b > self.group_bytes {
                    self.step_group(std::mem::take(&mut group), grads, &device, grad_mul)?;
                    bytes = 0;
                }
                bytes += b;
                group.push(p);
            }
            self.step_group(group, grads, &device, grad_mul)?;
        }
        Ok(())
    }

    /// One multi-tensor update of `params`, all on `device`.
    fn step_group(
        &mut self,
        mut params: Vec<&mut Param>,
        grads: &Gradients,
        device: &Device,
        grad_mul: Option<f32>,
    ) -> Result<()> {
        if params.is_empty() {
            return Ok(());
        }
        let gs = params
            .iter()
            .map(|p| {
                let g = grads
                    .get(p.id())
                    .expect("step lists parameters with a gradient");
                if g.device() == *device {
                    Ok(g.clone())
                } else {
                    g.to_device(device)
                }
            })
            .collect::<Result<Vec<Tensor>>>()?;
        for p in &params {
            self.moments(p)?;
        }
        // Every parameter's moments at once (distinct ids, so distinct entries).
        let ids: HashSet<ParamId> = params.iter().map(|p| p.id()).collect();
        let mut by_id: HashMap<ParamId, &mut Moments> = self
            .state
            .iter_mut()
            .filter(|(id, _)| ids.contains(id))
            .map(|(&id, m)| (id, m))
            .collect();
        let mut moments: Vec<&mut Moments> = params
            .iter()
            .map(|p| by_id.remove(&p.id()).expect("inserted above"))
            .collect();
        let config = self.config;
        let steps: Vec<AdamWScalars> = moments
            .iter()
            .map(|m| scalars(&config, m.step + 1))
            .collect();
        let mut entries = Vec::with_capacity(params.len());
        for (((p, g), mo), s) in params.iter().zip(&gs).zip(moments.iter_mut()).zip(&steps) {
            let Moments { m, v, .. } = &mut **mo;
            let w = p.tensor();
            entries.push(AdamWEntry {
                w: (w.storage(), w.layout()),
                grad: (g.storage(), g.layout()),
                m: m.on(device)?,
                v: v.on(device)?,
                scalars: s,
            });
        }
        let outs = Storage::adamw_multi(entries, grad_mul)?;
        for ((p, mo), out) in params.iter_mut().zip(moments).zip(outs) {
            mo.step += 1;
            let shape = p.shape().clone();
            p.set(Tensor::untracked(out, shape))?;
        }
        Ok(())
    }
}

/// The error for a gradient whose shape is not its parameter's.
fn shape_error(grad: &Tensor, param: &Param) -> Error {
    Error::Shape(format!(
        "AdamW: gradient {:?} does not match parameter {:?}",
        grad.shape(),
        param.shape()
    ))
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

#[cfg(test)]
mod tests {
    use super::clip::byte_groups;
    use super::*;
    use crate::module::SplitMix64;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut r = SplitMix64::new(seed);
        (0..n)
            .map(|i| if i % 17 == 5 { 0.0 } else { r.normal() })
            .collect()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.to_vec_f32()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    /// (dims, parameter dtype, gradient dtype, transposed gradient)
    type Case = (Vec<usize>, DType, DType, bool);

    fn cases() -> Vec<Case> {
        vec![
            (vec![37, 29], DType::F32, DType::F32, false),
            (vec![300, 257], DType::F32, DType::F32, false), // parallel CPU update
            (vec![333], DType::BF16, DType::BF16, false),
            (vec![123, 45], DType::F32, DType::BF16, false),
            (vec![4097], DType::BF16, DType::F32, false),
            (vec![64, 48], DType::F32, DType::F32, true),
            (vec![], DType::F32, DType::F32, false),
            (vec![0, 4], DType::F32, DType::F32, false),
        ]
    }

    fn params(cases: &[Case]) -> Vec<Param> {
        cases
            .iter()
            .enumerate()
            .map(|(i, (dims, wdt, _, _))| {
                let n = dims.iter().product();
                let t = Tensor::from_vec(values(n, i as u64), dims.clone(), &Device::Cpu).unwrap();
                Param::new(t.to_dtype(*wdt).unwrap()).unwrap()
            })
            .collect()
    }

    /// Gradients of step `s` for the parameters listed in `which`.
    fn grads(cases: &[Case], ps: &[Param], s: u64, which: &[usize]) -> Gradients {
        let mut g = Gradients::default();
        for &i in which {
            let (dims, _, gdt, tr) = &cases[i];
            let n = dims.iter().product();
            let v = values(n, 1000 * s + i as u64);
            let t = if *tr {
                let (r, c) = (dims[0], dims[1]);
                let mut vt = vec![0.0; n];
                for a in 0..r {
                    for b in 0..c {
                        vt[b * r + a] = v[a * c + b];
                    }
                }
                let t = Tensor::from_vec(vt, vec![c, r], &Device::Cpu).unwrap();
                t.transpose(0, 1).unwrap()
            } else {
                Tensor::from_vec(v, dims.clone(), &Device::Cpu).unwrap()
            };
            g.insert(ps[i].id(), t.to_dtype(*gdt).unwrap());
        }
        g
    }

    /// The multi-tensor step (in groups of every size from one parameter to
    /// all) has the bits of the per-parameter one: values, moments and step
    /// counts, with parameters that start late, skip a step or restart from
    /// `set_state` (so one group mixes step counts).
    #[test]
    fn multi_tensor_step_has_the_per_parameter_bits() {
        let cases = cases();
        let cfg = AdamWConfig {
            lr: 3e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        };
        for group_bytes in [0, 4096, 200_000, GROUP_BYTES] {
            let (mut a, mut b) = (params(&cases), params(&cases));
            let mut multi = AdamW::new(cfg).unwrap();
            multi.set_group_bytes(group_bytes);
            let mut each = AdamW::new(cfg).unwrap();
            let all: Vec<usize> = (0..cases.len()).collect();
            let schedule: [Vec<usize>; 4] =
                [vec![0, 2, 4, 6], all.clone(), vec![1, 3, 5, 7], all.clone()];
            for (s, which) in schedule.iter().enumerate() {
                if s == 2 {
                    // A checkpoint's state for parameter 2, restored on both.
                    let (n, m, v) = each.state(b[2].id()).unwrap().unwrap();
                    let (m, v) = (m.into_owned(), v.into_owned());
                    multi
                        .set_state(a[2].id(), n + 3, m.clone(), v.clone())
                        .unwrap();
                    each.set_state(b[2].id(), n + 3, m, v).unwrap();
                }
                let ga = grads(&cases, &a, s as u64, which);
                let gb = grads(&cases, &b, s as u64, which);
                multi.step(a.iter_mut(), &ga).unwrap();
                each.step_each(b.iter_mut(), &gb).unwrap();
                for i in 0..cases.len() {
                    let what = format!("group_bytes {group_bytes}, step {s}, parameter {i}");
                    assert_eq!(bits(a[i].tensor()), bits(b[i].tensor()), "{what}");
                    assert_eq!(a[i].dtype(), b[i].dtype(), "{what}");
                    let (sa, sb) = (
                        multi.state(a[i].id()).unwrap(),
                        each.state(b[i].id()).unwrap(),
                    );
                    match (sa, sb) {
                        (Some((na, ma, va)), Some((nb, mb, vb))) => {
                            assert_eq!(na, nb, "{what}: steps");
                            assert_eq!(
                                ma.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                                mb.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                                "{what}: m"
                            );
                            assert_eq!(
                                va.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                                vb.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                                "{what}: v"
                            );
                        }
                        (None, None) => {}
                        _ => panic!("{what}: one optimizer has state, the other none"),
                    }
                }
            }
            assert_eq!(multi.steps(a[0].id()), 3);
            assert_eq!(multi.steps(a[2].id()), 2 + 3 + 1);
            assert_ne!(bits(a[1].tensor()), bits(params(&cases)[1].tensor()));
        }
    }

    /// A shape mismatch fails after the parameters listed before it moved,
    /// and leaves the ones after it (and itself) untouched, as before.
    #[test]
    fn shape_error_after_the_earlier_parameters() {
        let cases = cases();
        let mut ps = params(&cases);
        let before: Vec<Vec<u32>> = ps.iter().map(|p| bits(p.tensor())).collect();
        let mut g = grads(&cases, &ps, 0, &[0, 2, 4]);
        g.insert(
            ps[3].id(),
            Tensor::zeros(vec![2], DType::F32, &Device::Cpu).unwrap(),
        );
        let mut opt = AdamW::new(AdamWConfig::default()).unwrap();
        let e = opt.step(ps.iter_mut(), &g).unwrap_err().to_string();
        assert!(e.contains("does not match parameter"), "{e}");
        assert_ne!(bits(ps[0].tensor()), before[0]);
        assert_ne!(bits(ps[2].tensor()), before[2]);
        assert_eq!(bits(ps[3].tensor()), before[3]);
        assert_eq!(bits(ps[4].tensor()), before[4]);
        assert_eq!((opt.steps(ps[2].id()), opt.steps(ps[4].id())), (1, 0));
    }

    /// The norm as `clip_grad_norm` computed it before issue 14: each
    /// gradient's `sqr().sum_all()` in its dtype, read as f32, added in f64
    /// in id order; then `mul_scalar` of every gradient.
    fn per_gradient_clip(grads: &mut Gradients, max_norm: f32) -> f32 {
        let mut ids: Vec<ParamId> = grads.iter().map(|(id, _)| id).collect();
        ids.sort_unstable();
        let mut sum_sq = 0f64;
        for id in ids {
            let g = grads.get(id).unwrap();
            let s = g
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap();
            sum_sq += f64::from(s.to_scalar_f32().unwrap());
        }
        let norm = sum_sq.sqrt() as f32;
        let coef = max_norm / (norm + 1e-6);
        if norm.is_finite() && coef < 1.0 {
            for (_, g) in grads.iter_mut() {
                *g = g.mul_scalar(coef).unwrap();
            }
        }
        norm
    }

    /// On the CPU the multi-tensor norm and the scaled gradients have the
    /// bits of the per-gradient path, in groups of any size, clipped or not.
    #[test]
    fn clip_on_the_cpu_has_the_per_gradient_bits() {
        let cases = cases();
        let ps = params(&cases);
        let all: Vec<usize> = (0..cases.len()).collect();
        for (max_norm, group_bytes) in [(1.0, GROUP_BYTES), (1.0, 0), (0.5, 5000), (1e6, 0)] {
            let mut a = grads(&cases, &ps, 7, &all);
            let mut b = a.clone();
            let na = clip_grad_norm_in_groups(&mut a, max_norm, group_bytes).unwrap();
            let nb = per_gradient_clip(&mut b, max_norm);
            assert_eq!(na.to_bits(), nb.to_bits(), "norm {na} vs {nb}");
            assert!(na > 1.0 && na.is_finite());
            for p in &ps {
                let (ga, gb) = (a.get(p.id()).unwrap(), b.get(p.id()).unwrap());
                assert_eq!(ga.dtype(), gb.dtype());
                assert_eq!(ga.shape(), gb.shape());
                assert_eq!(
                    bits(ga),
                    bits(gb),
                    "max_norm {max_norm}, group_bytes {group_bytes}"
                );
            }
        }
    }

    #[test]
    fn a_non_finite_norm_leaves_the_gradients() {
        let p = Param::new(Tensor::zeros(vec![3], DType::F32, &Device::Cpu).unwrap()).unwrap();
        let mut g = Gradients::default();
        let bad = Tensor::from_vec(vec![1.0, f32::NAN, 2.0], vec![3], &Device::Cpu).unwrap();
        g.insert(p.id(), bad);
        assert!(clip_grad_norm(&mut g, 1.0).unwrap().is_nan());
        assert_eq!(g.get(p.id()).unwrap().to_vec_f32().unwrap()[2], 2.0);
    }

    #[test]
    fn byte_groups_cut_at_the_budget() {
        let mut g = Gradients::default();
        let mut ids = Vec::new();
        for n in [10usize, 10, 30, 5, 5, 0] {
            let p = Param::new(Tensor::zeros(vec![n], DType::F32, &Device::Cpu).unwrap()).unwrap();
            g.insert(
                p.id(),
                Tensor::zeros(vec![n], DType::F32, &Device::Cpu).unwrap(),
            );
            ids.push(p.id());
        }
        let sizes = |budget| -> Vec<usize> {
            byte_groups(&ids, &g, budget)
                .iter()
                .map(|r| r.len())
                .collect()
        };
        assert_eq!(
            sizes(80),
            vec![2, 1, 3],
            "40 + 40 | 120 alone | 20 + 20 + 0"
        );
        assert_eq!(sizes(0), vec![1, 1, 1, 1, 1, 1]);
        assert_eq!(sizes(1 << 20), vec![6]);
        assert!(byte_groups(&[], &g, 80).is_empty());
    }
}
