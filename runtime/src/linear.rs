//! `QuantLinear`: a linear layer whose three GEMMs follow its current recipe.
//!
//! This is the dual dispatch of SPEC section 6: `forward` matches on the
//! recipe the plan assigned and runs that recipe's autograd function. Every
//! arm is compiled ahead of time; switching is a field write done by
//! `apply(iteration)`, which touches no parameter and no optimizer state.
//! The master weight stays f32 and is quantized inside every forward.

use std::sync::Arc;

use crate::module::{linear_slots, Init, ParamSlot, Parameters};
use crate::ops::{apply_custom, CustomOp};
use crate::plan::{LinearSite, PlanLinear};
use crate::recipe::linear::{backward, forward, LinearCtx, LinearShape, Saved};
use crate::recipe::{Recipe, RecipeKind};
use crate::{DType, Error, Param, Result, Tensor};

/// A quantized linear of the precision plan (a `#[quantize]` field).
///
/// Built shape-first with [`QuantLinear::new`], so a model's plan can be
/// known without allocating its weights; [`crate::module::allocate`] gives it weights.
pub struct QuantLinear {
    pub in_features: usize,
    pub out_features: usize,
    pub has_bias: bool,
    recipe: Recipe,
    /// Plan path, e.g. `double_blocks.3.img_qkv`: names errors and labels
    /// saved bytes. Shared, so a forward call copies a pointer, not the text.
    path: Arc<str>,
    /// Position in the plan: keys the stochastic rounding of its gradients.
    index: u64,
    iteration: u64,
    /// Seed of stochastic rounding.
    pub seed: u64,
    /// [out_features, in_features], f32 master weight.
    pub weight: Option<Param>,
    /// `[out_features]`, f32.
    pub bias: Option<Param>,
}

impl QuantLinear {
    /// A linear of the given shape, without weights, running `bf16` until a
    /// schedule is applied.
    pub fn new(in_features: usize, out_features: usize, has_bias: bool) -> Self {
        QuantLinear {
            in_features,
            out_features,
            has_bias,
            recipe: Recipe::new(RecipeKind::Bf16),
            path: Arc::from(""),
            index: 0,
            iteration: 0,
            seed: 0,
            weight: None,
            bias: None,
        }
    }

    /// Plan path of this linear (empty until a plan visitor has named it).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Number of weight and bias values.
    pub fn num_params(&self) -> usize {
        self.in_features * self.out_features + if self.has_bias { self.out_features } else { 0 }
    }

    /// y = x W^T + b for x [.., in_features], under the current recipe.
    /// y has x's dtype (f32 or BF16 activations).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let Some(weight) = &self.weight else {
            return Err(Error::InvalidOption(format!(
                "linear `{}` has no weights: allocate the model before running it",
                self.path
            )));
        };
        let k = self.in_features;
        if x.dims().last() != Some(&k) {
            return Err(Error::Shape(format!(
                "linear `{}`: input {:?} must end in {k} features (W is [{}, {k}])",
                self.path,
                x.shape(),
                self.out_features
            )));
        }
        let m = x.elem_count() / k;
        let op = LinearOp {
            recipe: self.recipe,
            shape: LinearShape {
                m,
                k,
                n: self.out_features,
            },
            out_dims: x.dims()[..x.rank() - 1]
                .iter()
                .copied()
                .chain([self.out_features])
                .collect(),
            act_dtype: x.dtype(),
            path: self.path.clone(),
            iteration: self.iteration,
            seed: self.seed,
            index: self.index,
        };
        let mut inputs = vec![x, &**weight];
        if let Some(b) = &self.bias {
            inputs.push(b);
        }
        Ok(apply_custom(op, &inputs)?.remove(0))
    }
}

impl Parameters for QuantLinear {
    fn visit_params(&mut self, prefix: &str, f: &mut dyn FnMut(ParamSlot<'_>)) {
        let init = Init::Uniform(1.0 / (self.in_features as f32).sqrt());
        let shape = [self.out_features, self.in_features];
        let bias = self.has_bias.then_some(&mut self.bias);
        linear_slots(prefix, shape, init, &mut self.weight, bias, f);
    }
}

impl PlanLinear for QuantLinear {
    fn recipe(&self) -> Recipe {
        self.recipe
    }

    fn set_recipe(&mut self, recipe: Recipe) {
        self.recipe = recipe;
    }

    fn set_position(&mut self, site: &LinearSite<'_>, index: usize, iteration: u64) {
        if !site.path_is(&self.path) {
            self.path = Arc::from(site.path());
        }
        self.index = index as u64;
        self.iteration = iteration;
    }
}

/// One call of a quantized linear on the tape.
struct LinearOp {
    recipe: Recipe,
    shape: LinearShape,
    out_dims: Vec<usize>,
    act_dtype: DType,
    path: Arc<str>,
    iteration: u64,
    seed: u64,
    index: u64,
}

/// What the tape keeps: the recipe's saved tensors (in host or device
/// memory), and the master weight handle for the `bf16` recipe (a shared
/// reference to the parameter, not a copy).
struct LinearSaved {
    saved: SavedOn,
    weight: Option<Tensor>,
    has_bias: bool,
}

enum SavedOn {
    Cpu(Saved),
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::linear::SavedDevice),
}

impl LinearOp {
    fn ctx(&self) -> LinearCtx<'_> {
        LinearCtx {
            layer: &self.path,
            iteration: self.iteration,
            seed: self.seed,
            layer_id: self.index,
        }
    }

    /// An output tensor in the activation dtype.
    fn activation(&self, values: Vec<f32>, dims: &[usize]) -> Result<Tensor> {
        let t = Tensor::from_vec(values, dims.to_vec(), &crate::Device::Cpu)?;
        if self.act_dtype == DType::F32 {
            Ok(t)
        } else {
            t.to_dtype(self.act_dtype)
        }
    }

    /// dx's shape: the input's.
    fn x_dims(&self) -> Vec<usize> {
        let mut d = self.out_dims.clone();
        *d.last_mut().expect("rank >= 1") = self.shape.k;
        d
    }

    fn forward_cpu(&self, inputs: &[Tensor]) -> Result<(Tensor, SavedOn)> {
        let x = inputs[0].to_vec_f32()?;
        let w = inputs[1].to_vec_f32()?;
        let b = inputs.get(2).map(|b| b.to_vec_f32()).transpose()?;
        let (y, saved) = forward(&self.recipe, &x, &w, b.as_deref(), self.shape, &self.ctx())?;
        Ok((self.activation(y, &self.out_dims)?, SavedOn::Cpu(saved)))
    }

    fn backward_cpu(
        &self,
        saved: &Saved,
        weight: Option<&Tensor>,
        dy: &Tensor,
        has_bias: bool,
    ) -> Result<Vec<Option<Tensor>>> {
        let w = weight
            .map(|w| w.to_vec_f32())
            .transpose()?
            .unwrap_or_default();
        let g = backward(
            &self.recipe,
            saved,
            &w,
            &dy.to_vec_f32()?,
            has_bias,
            self.shape,
            &self.ctx(),
        )?;
        let cpu = crate::Device::Cpu;
        let mut out = vec![
            Some(self.activation(g.dx, &self.x_dims())?),
            Some(Tensor::from_vec(g.dw, [self.shape.n, self.shape.k], &cpu)?),
        ];
        if let Some(db) = g.db {
            out.push(Some(Tensor::from_vec(db, [self.shape.n], &cpu)?));
        }
        Ok(out)
    }

    /// The same three GEMMs on the GPU that holds the inputs.
    #[cfg(feature = "cuda")]
    fn forward_cuda(&self, inputs: &[Tensor]) -> Result<(Tensor, SavedOn)> {
        use crate::cuda::bridge::{packed, tensor_from_buffer};
        let x = packed(&inputs[0])?;
        let w = packed(&inputs[1])?;
        let b = inputs.get(2).map(packed).transpose()?;
        let dev = x.device().clone();
        let _p = crate::profile::scope("linear forward", inputs[0].device());
        crate::recipe::linear::count_run(self.recipe.kind);
        let (y, saved) = crate::cuda::linear::forward(
            dev.context(),
            &self.recipe,
            x.buf(),
            self.act_dtype,
            w.buf(),
            b.as_ref().map(|b| b.buf()),
            self.shape,
            &self.ctx(),
        )
        .map_err(crate::cuda::storage::backend_err)?;
        Ok((
            tensor_from_buffer(&dev, y, self.act_dtype, &self.out_dims)?,
            SavedOn::Cuda(saved),
        ))
    }

    #[cfg(feature = "cuda")]
    fn backward_cuda(
        &self,
        saved: &crate::cuda::linear::SavedDevice,
        weight: Option<&Tensor>,
        dy: &Tensor,
        has_bias: bool,
    ) -> Result<Vec<Option<Tensor>>> {
        use crate::cuda::bridge::{packed, tensor_from_buffer};
        let dy = packed(dy)?;
        let dev = dy.device().clone();
        let _p = crate::profile::scope("linear backward", crate::Device::Cuda(dev.ordinal()));
        let w = weight.map(packed).transpose()?;
        // Only the bf16 recipe reads W; the others get an empty buffer they ignore.
        let empty;
        let w_buf = match &w {
            Some(w) => w.buf(),
            None => {
                empty = dev
                    .context()
                    .alloc(16)
                    .map_err(crate::cuda::storage::backend_err)?;
                &empty
            }
        };
        crate::recipe::linear::count_run(self.recipe.kind);
        let g = crate::cuda::linear::backward(
            dev.context(),
            &self.recipe,
            saved,
            w_buf,
            dy.buf(),
            self.act_dtype,
            has_bias,
            self.shape,
            &self.ctx(),
        )
        .map_err(crate::cuda::storage::backend_err)?;
        let (n, k) = (self.shape.n, self.shape.k);
        let mut out = vec![
            Some(tensor_from_buffer(
                &dev,
                g.dx,
                self.act_dtype,
                &self.x_dims(),
            )?),
            Some(tensor_from_buffer(&dev, g.dw, DType::F32, &[n, k])?),
        ];
        if let Some(db) = g.db {
            out.push(Some(tensor_from_buffer(&dev, db, DType::F32, &[n])?));
        }
        Ok(out)
    }
}

impl CustomOp for LinearOp {
    type Saved = LinearSaved;

    fn name(&self) -> &str {
        self.recipe.kind.name()
    }

    fn label(&self) -> String {
        self.path.to_string()
    }

    fn forward(
        &self,
        inputs: &[Tensor],
        _needs_backward: bool,
    ) -> Result<(Vec<Tensor>, LinearSaved)> {
        let (y, saved) = match inputs[0].device() {
            crate::Device::Cpu => self.forward_cpu(inputs)?,
            #[cfg(feature = "cuda")]
            crate::Device::Cuda(_) => self.forward_cuda(inputs)?,
            other => {
                return Err(Error::DeviceUnavailable {
                    device: other.to_string(),
                })
            }
        };
        let weight = (self.recipe.kind == RecipeKind::Bf16).then(|| inputs[1].clone());
        Ok((
            vec![y],
            LinearSaved {
                saved,
                weight,
                has_bias: inputs.len() > 2,
            },
        ))
    }

    fn saved_bytes(&self, saved: &LinearSaved) -> usize {
        match &saved.saved {
            SavedOn::Cpu(s) => s.nbytes(),
            #[cfg(feature = "cuda")]
            SavedOn::Cuda(s) => s.nbytes(),
        }
    }

    fn saved_elements(&self, saved: &LinearSaved) -> usize {
        match &saved.saved {
            SavedOn::Cpu(s) => s.elements(),
            #[cfg(feature = "cuda")]
            SavedOn::Cuda(s) => s.elements(),
        }
    }

    fn backward(
        &self,
        saved: &LinearSaved,
        grads: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        let Some(dy) = &grads[0] else {
            return Ok(vec![None; if saved.has_bias { 3 } else { 2 }]);
        };
        match &saved.saved {
            SavedOn::Cpu(s) => self.backward_cpu(s, saved.weight.as_ref(), dy, saved.has_bias),
            #[cfg(feature = "cuda")]
            SavedOn::Cuda(s) => self.backward_cuda(s, saved.weight.as_ref(), dy, saved.has_bias),
        }
    }
}
