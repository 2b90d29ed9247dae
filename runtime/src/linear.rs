//! `QuantLinear`: a linear layer whose three GEMMs follow its current recipe.
//!
//! SPEC section 6's switch is a field write: `forward` hands the recipe the
//! plan assigned to the one quantized linear ([`crate::qlinear`]), which
//! runs it on the backend holding the input. Switching, done by
//! `apply(iteration)`, touches no parameter and no optimizer state. The
//! master weight stays f32 and is quantized inside every forward.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::module::{LinearParams, ParamSlot, Parameters};
use crate::ops::{apply_custom, CustomOp};
use crate::plan::{LinearSite, PlanLinear};
use crate::qlinear::{reads_master_weight, LinearCall, LinearCtx, LinearShape};
use crate::recipe::Recipe;
use crate::storage::{SavedLinear, Storage};
use crate::{Error, Result, Tensor};

/// A quantized linear of the precision plan (a `#[quantize]` field).
///
/// Built shape-first with [`QuantLinear::new`], so a model's plan can be
/// known without allocating its weights; [`crate::module::allocate`] gives it
/// weights and, for a `#[precision]` root, puts it in the schedule's first
/// phase. Until a plan places it, it has no recipe and its forward is an
/// error ([`Error::Unplanned`]): a linear the plan missed never trains in a
/// precision nobody asked for.
pub struct QuantLinear {
    /// The shape, the f32 master weight `[out_features, in_features]` and
    /// the f32 bias `[out_features]`.
    pub params: LinearParams,
    recipe: Option<Recipe>,
    /// Forward calls under a recipe, for warm-up's check that the model's
    /// forward reaches every linear.
    runs: AtomicU64,
    /// Plan path, e.g. `double_blocks.3.img_qkv`: names errors and labels
    /// saved bytes. Shared, so a forward call copies a pointer, not the text.
    path: Arc<str>,
    /// Position in the plan: keys the stochastic rounding of its gradients.
    index: u64,
    iteration: u64,
    /// Seed of stochastic rounding.
    pub seed: u64,
}

impl QuantLinear {
    /// A linear of the given shape, without weights or a recipe: the
    /// precision plan of its model gives it one.
    pub fn new(in_features: usize, out_features: usize, has_bias: bool) -> Self {
        QuantLinear {
            params: LinearParams::new(in_features, out_features, has_bias),
            recipe: None,
            runs: AtomicU64::new(0),
            path: Arc::from(""),
            index: 0,
            iteration: 0,
            seed: 0,
        }
    }

    /// This linear running `recipe`, for use outside a model's plan (a
    /// benchmark, a test, a layer of one's own).
    pub fn with_recipe(mut self, recipe: Recipe) -> Self {
        self.recipe = Some(recipe);
        self
    }

    /// Plan path of this linear (empty until a parameter or plan walk has
    /// named it).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The linear in messages: its path once a walk named it, else its shape.
    fn describe(&self) -> String {
        self.params.describe("quantized linear")
    }

    /// y = x W^T + b for x [.., in_features], under the current recipe.
    /// y has x's dtype (f32 or BF16 activations).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let Some(weight) = &self.params.weight else {
            return Err(Error::NotAllocated {
                what: self.describe(),
            });
        };
        check_input(&self.params, &self.path, x)?;
        let Some(recipe) = self.recipe else {
            return Err(Error::Unplanned {
                what: self.describe(),
            });
        };
        let op = LinearOp::new(recipe, &self.params, x, self.path.clone(), true);
        self.runs.fetch_add(1, Ordering::Relaxed);
        LinearOp {
            iteration: self.iteration,
            seed: self.seed,
            index: self.index,
            ..op
        }
        .apply(x, weight, self.params.bias.as_deref())
    }
}

/// The error for an `x` that does not end in the layer's `in_features`.
fn check_input(params: &LinearParams, path: &str, x: &Tensor) -> Result<()> {
    let (k, n) = (params.in_features, params.out_features);
    if x.dims().last() == Some(&k) {
        return Ok(());
    }
    let what = match path {
        "" => params.describe("linear"),
        p => format!("linear `{p}`"),
    };
    Err(Error::Shape(format!(
        "{what}: input {:?} must end in {k} features (W is [{n}, {k}])",
        x.shape(),
    )))
}

/// y = x W^T + b of a high-precision layer's `params` in BF16 (the `bf16`
/// recipe: BF16 operands, f32 accumulation, the f32 bias added before the
/// one rounding), on the tape: [`crate::module::Dense`] with BF16
/// activations. Its saved input is not one of the plan's saved bytes.
pub(crate) fn bf16_linear(params: &LinearParams, x: &Tensor) -> Result<Tensor> {
    let (recipe, path) = (Recipe::new(crate::recipe::RecipeKind::Bf16), params.path());
    let weight = params.weight.as_ref().ok_or_else(|| Error::NotAllocated {
        what: params.describe("linear"),
    })?;
    check_input(params, path, x)?;
    LinearOp::new(recipe, params, x, Arc::from(path), false).apply(
        x,
        weight,
        params.bias.as_deref(),
    )
}

impl Parameters for QuantLinear {
    /// Its weight and bias; `prefix` is its path, which it keeps for errors.
    fn visit_params(&mut self, prefix: &str, f: &mut dyn FnMut(ParamSlot<'_>)) {
        if *self.path != *prefix {
            self.path = Arc::from(prefix);
        }
        let init = self.params.uniform_init();
        self.params.visit_slots(prefix, init, f);
    }
}

impl PlanLinear for QuantLinear {
    fn recipe(&self) -> Option<Recipe> {
        self.recipe
    }

    fn set_recipe(&mut self, recipe: Recipe) {
        self.recipe = Some(recipe);
    }

    fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    fn set_seed(&mut self, seed: u64) {
        self.seed = seed;
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
    path: Arc<str>,
    iteration: u64,
    seed: u64,
    index: u64,
    /// A plan linear: its saved bytes count in SPEC section 4's measure.
    planned: bool,
}

/// What the tape keeps: the recipe's saved tensors (in the memory of the
/// backend that ran the forward), and the master weight handle when the
/// backward reads it (a shared reference to the parameter, not a copy).
struct LinearSaved {
    saved: SavedLinear,
    weight: Option<Tensor>,
    has_bias: bool,
}

impl LinearOp {
    /// The call of `params` on `x` (checked by [`check_input`]) at
    /// iteration 0, seed 0 and plan index 0.
    fn new(
        recipe: Recipe,
        params: &LinearParams,
        x: &Tensor,
        path: Arc<str>,
        planned: bool,
    ) -> LinearOp {
        let (k, n) = (params.in_features, params.out_features);
        LinearOp {
            recipe,
            shape: LinearShape {
                m: x.elem_count() / k,
                k,
                n,
            },
            out_dims: x.dims()[..x.rank() - 1]
                .iter()
                .copied()
                .chain([n])
                .collect(),
            path,
            iteration: 0,
            seed: 0,
            index: 0,
            planned,
        }
    }

    /// The op on the tape over x, the master weight and the bias.
    fn apply(self, x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let mut inputs = vec![x, weight];
        inputs.extend(bias);
        Ok(apply_custom(self, &inputs)?.remove(0))
    }

    fn call(&self) -> LinearCall<'_> {
        LinearCall {
            recipe: &self.recipe,
            shape: self.shape,
            ctx: LinearCtx {
                layer: &self.path,
                iteration: self.iteration,
                seed: self.seed,
                layer_id: self.index,
            },
        }
    }

    /// dx's shape: the input's.
    fn x_dims(&self) -> Vec<usize> {
        let mut d = self.out_dims.clone();
        *d.last_mut().expect("rank >= 1") = self.shape.k;
        d
    }
}

fn view(t: &Tensor) -> (&Storage, &crate::Layout) {
    (t.storage(), t.layout())
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
        let (y, saved) = Storage::linear_forward(
            &self.call(),
            view(&inputs[0]),
            view(&inputs[1]),
            inputs.get(2).map(view),
        )?;
        let weight = reads_master_weight(&self.recipe).then(|| inputs[1].clone());
        Ok((
            vec![Tensor::untracked(y, self.out_dims.clone().into())],
            LinearSaved {
                saved,
                weight,
                has_bias: inputs.len() > 2,
            },
        ))
    }

    fn saved_bytes(&self, saved: &LinearSaved) -> usize {
        saved.saved.nbytes()
    }

    fn saved_elements(&self, saved: &LinearSaved) -> usize {
        if self.planned {
            saved.saved.elements()
        } else {
            0
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
        let g = Storage::linear_backward(
            &self.call(),
            &saved.saved,
            saved.weight.as_ref().map(view),
            view(dy),
        )?;
        let (n, k) = (self.shape.n, self.shape.k);
        let mut out = vec![
            Some(Tensor::untracked(g.dx, self.x_dims().into())),
            Some(Tensor::untracked(g.dw, vec![n, k].into())),
        ];
        if let Some(db) = g.db {
            out.push(Some(Tensor::untracked(db, vec![n].into())));
        }
        Ok(out)
    }
}
