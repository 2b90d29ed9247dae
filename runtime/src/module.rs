//! Parameters of a model, visited by path: allocation, optimizer updates and
//! checkpoints all walk the same [`Parameters::visit_params`].
//!
//! Layers are built shape-first (no weights), so a 12B model's shape and plan
//! cost nothing; [`allocate`] then creates every parameter, each from its own
//! seeded stream keyed by its path, so the values do not depend on the order
//! of the walk.

use crate::{Device, Error, Param, Result, Tensor};

/// How a parameter starts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// All zeros.
    Zeros,
    /// All ones (norm scales).
    Ones,
    /// U(-bound, bound), PyTorch's default for linear layers (bound 1/sqrt(in)).
    Uniform(f32),
}

/// One parameter place: its path, shape, initialization and storage.
pub struct ParamSlot<'a> {
    /// Dotted path, e.g. `blocks.3.fc1.weight`: checkpoint names and seeds.
    pub path: String,
    /// The parameter's shape, known before it is allocated.
    pub shape: Vec<usize>,
    /// How [`allocate`] fills it.
    pub init: Init,
    /// The parameter, `None` until allocated.
    pub param: &'a mut Option<Param>,
}

impl<'a> ParamSlot<'a> {
    /// The slot `prefix.name` (or `name` at the root).
    pub fn new(
        prefix: &str,
        name: &str,
        shape: Vec<usize>,
        init: Init,
        param: &'a mut Option<Param>,
    ) -> Self {
        let path = if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}.{name}")
        };
        ParamSlot {
            path,
            shape,
            init,
            param,
        }
    }
}

/// Anything holding parameters. `#[precision]` structs get it generated
/// (every field but the `#[skip]` ones, paths from the field names, so a
/// checkpoint's names are the plan's), other structs `#[derive(Parameters)]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no parameter walk (`Parameters`)",
    label = "every field of a `#[precision]` or `#[derive(Parameters)]` struct is walked for its parameters",
    note = "mark a field without parameters (a count, a config) `#[skip]`; give a struct of layers `#[derive(Parameters)]`"
)]
pub trait Parameters {
    /// Calls `f` for every parameter slot, with paths under `prefix`.
    fn visit_params(&mut self, prefix: &str, f: &mut dyn FnMut(ParamSlot<'_>));

    /// Called by [`allocate`] with its seed once every parameter exists. A
    /// `#[precision]` root puts each quantized linear in its schedule's first
    /// phase here and seeds its stochastic rounding, so a model is ready to
    /// train in the precision it asked for as soon as it has weights. The
    /// default does nothing.
    fn after_allocate(&mut self, _seed: u64) {}
}

impl<T: Parameters> Parameters for Vec<T> {
    fn visit_params(&mut self, prefix: &str, f: &mut dyn FnMut(ParamSlot<'_>)) {
        for (i, t) in self.iter_mut().enumerate() {
            t.visit_params(&join(prefix, &i.to_string()), f);
        }
    }
}

impl<T: Parameters, const N: usize> Parameters for [T; N] {
    fn visit_params(&mut self, prefix: &str, f: &mut dyn FnMut(ParamSlot<'_>)) {
        for (i, t) in self.iter_mut().enumerate() {
            t.visit_params(&join(prefix, &i.to_string()), f);
        }
    }
}

impl<T: Parameters> Parameters for Option<T> {
    fn visit_params(&mut self, prefix: &str, f: &mut dyn FnMut(ParamSlot<'_>)) {
        if let Some(t) = self {
            t.visit_params(prefix, f);
        }
    }
}

/// `prefix.name`, or `name` at the root.
pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// Visit every parameter slot with a fallible `f`; after the first error no
/// further slot is visited and that error is returned.
pub fn try_visit_params<M: Parameters + ?Sized>(
    model: &mut M,
    mut f: impl FnMut(ParamSlot<'_>) -> Result<()>,
) -> Result<()> {
    let mut result = Ok(());
    model.visit_params("", &mut |slot| {
        if result.is_ok() {
            result = f(slot);
        }
    });
    result
}

/// Create every parameter of `model` from `seed`, then let the model get
/// ready to run ([`Parameters::after_allocate`]: a `#[precision]` root
/// places its linears in its schedule's first phase).
pub fn allocate<M: Parameters + ?Sized>(model: &mut M, seed: u64) -> Result<()> {
    try_visit_params(model, |slot| {
        let n: usize = slot.shape.iter().product();
        let mut rng = SplitMix64::new(seed ^ fnv1a(&slot.path));
        let values: Vec<f32> = match slot.init {
            Init::Zeros => vec![0.0; n],
            Init::Ones => vec![1.0; n],
            Init::Uniform(b) => (0..n)
                .map(|_| (rng.next_f64() * 2.0 - 1.0) as f32 * b)
                .collect(),
        };
        *slot.param = Some(Param::new(Tensor::from_vec(
            values,
            slot.shape,
            &Device::Cpu,
        )?)?);
        Ok(())
    })?;
    model.after_allocate(seed);
    Ok(())
}

/// Every parameter with its path, in visit order (errors if not allocated).
pub fn named_params<M: Parameters + ?Sized>(model: &mut M) -> Result<Vec<(String, Tensor)>> {
    let mut out = Vec::new();
    try_visit_params(model, |slot| {
        let p = allocated(&slot)?;
        out.push((slot.path.clone(), p.tensor().clone()));
        Ok(())
    })?;
    Ok(out)
}

/// The parameter of a slot, or the error for one that was never allocated.
pub fn allocated<'s>(slot: &'s ParamSlot<'_>) -> Result<&'s Param> {
    slot.param.as_ref().ok_or_else(|| Error::NotAllocated {
        what: format!("parameter `{}`", slot.path),
    })
}

/// One optimizer step over every allocated parameter of `model` that has a
/// gradient in `grads`, all in one [`AdamW::step`](crate::optim::AdamW::step)
/// (multi-tensor: a few backend calls per device, not one per parameter).
pub fn optimizer_step<M: Parameters + ?Sized>(
    model: &mut M,
    opt: &mut crate::optim::AdamW,
    grads: &crate::Gradients,
) -> Result<()> {
    crate::optim::optimizer_step_scaled(model, opt, grads, None)
}

/// Number of parameter values, allocated or not; saturates at `usize::MAX`
/// rather than wrap (see [`try_count_params`] for a checked count).
pub fn count_params<M: Parameters + ?Sized>(model: &mut M) -> usize {
    try_count_params(model).map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// Number of parameter values, allocated or not, in checked arithmetic: a
/// shape or a total past `u64::MAX` is an error naming the parameter.
pub fn try_count_params<M: Parameters + ?Sized>(model: &mut M) -> Result<u64> {
    let mut total = 0u64;
    try_visit_params(model, |slot| {
        let n = slot
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
            .and_then(|n| total.checked_add(n));
        total = n.ok_or_else(|| {
            Error::Shape(format!(
                "the parameter count overflows 64 bits at `{}` {:?}; use smaller model sizes",
                slot.path, slot.shape
            ))
        })?;
        Ok(())
    })?;
    Ok(total)
}

/// FNV-1a of a path: separates the streams of different parameters.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01B3)
    })
}

/// SplitMix64: small, fast and good enough for initialization and data.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A stream starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    pub fn next_f64(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let (u, v) = (self.next_f64(), self.next_f64());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}

/// The shape and parameters of a linear layer, y = x W^T + b: `weight`
/// `[out_features, in_features]` and, if `has_bias`, `bias`
/// `[out_features]`, both f32 and `None` until [`allocate`] fills them.
/// Held by [`Dense`] and [`crate::linear::QuantLinear`].
pub struct LinearParams {
    /// K: features of each input row.
    pub in_features: usize,
    /// N: features of each output row.
    pub out_features: usize,
    /// Whether the layer adds a bias.
    pub has_bias: bool,
    /// W `[out_features, in_features]`, `None` until allocated.
    pub weight: Option<Param>,
    /// b `[out_features]`, `None` until allocated or without a bias.
    pub bias: Option<Param>,
    /// The layer's path, once a parameter walk has named it (for errors).
    path: String,
}

impl LinearParams {
    /// The shape, without weights.
    pub fn new(in_features: usize, out_features: usize, has_bias: bool) -> Self {
        LinearParams {
            in_features,
            out_features,
            has_bias,
            weight: None,
            bias: None,
            path: String::new(),
        }
    }

    /// Number of weight and bias values.
    pub fn num_params(&self) -> usize {
        self.in_features * self.out_features + if self.has_bias { self.out_features } else { 0 }
    }

    /// The default init: uniform in +-1/sqrt(in_features).
    pub fn uniform_init(&self) -> Init {
        Init::Uniform(1.0 / (self.in_features as f32).sqrt())
    }

    /// The layer's path (empty until a parameter walk has named it).
    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    /// The layer in messages, as a `kind` ("linear"): ``linear `img_in` ``
    /// once a walk named it, else `a linear (16 -> 64 features)`.
    pub fn describe(&self, kind: &str) -> String {
        if self.path.is_empty() {
            format!(
                "a {kind} ({} -> {} features)",
                self.in_features, self.out_features
            )
        } else {
            format!("{kind} `{}`", self.path)
        }
    }

    /// The slots `weight` and, if `has_bias`, `bias`, both drawn from `init`;
    /// `prefix` is the layer's path, which it keeps for errors.
    pub fn visit_slots(&mut self, prefix: &str, init: Init, f: &mut dyn FnMut(ParamSlot<'_>)) {
        if self.path != prefix {
            self.path = prefix.to_string();
        }
        f(ParamSlot::new(
            prefix,
            "weight",
            vec![self.out_features, self.in_features],
            init,
            &mut self.weight,
        ));
        if self.has_bias {
            f(ParamSlot::new(
                prefix,
                "bias",
                vec![self.out_features],
                init,
                &mut self.bias,
            ));
        }
    }
}

/// A high-precision linear (embedders, modulation, final layer): f32
/// weights, shape known before allocation, never quantized.
pub struct Dense {
    /// Shape, weight and bias.
    pub params: LinearParams,
    /// Zero-initialized (Flux's modulation and final layer), so the untrained model outputs 0.
    pub zero_init: bool,
}

impl Dense {
    /// A layer of the given shape, without weights.
    pub fn new(in_features: usize, out_features: usize, has_bias: bool) -> Self {
        Dense {
            params: LinearParams::new(in_features, out_features, has_bias),
            zero_init: false,
        }
    }

    /// The same layer, zero-initialized.
    pub fn zeroed(mut self) -> Self {
        self.zero_init = true;
        self
    }

    /// y = x W^T + b in the activation dtype's high precision: f32 for f32
    /// x; for BF16 x the `bf16` recipe (the weight rounded to BF16 inside
    /// the forward, f32 accumulation, the f32 bias added before the one
    /// rounding), as PyTorch's autocast runs a linear.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.dtype() == crate::DType::BF16 {
            return crate::linear::bf16_linear(&self.params, x);
        }
        let w = self
            .params
            .weight
            .as_ref()
            .ok_or_else(|| Error::NotAllocated {
                what: self.params.describe("linear"),
            })?;
        let b = self.params.bias.as_deref();
        let y = crate::ops::linear(&x.to_dtype(crate::DType::F32)?, w, b)?;
        y.to_dtype(x.dtype())
    }
}

impl Parameters for Dense {
    fn visit_params(&mut self, prefix: &str, f: &mut dyn FnMut(ParamSlot<'_>)) {
        let init = if self.zero_init {
            Init::Zeros
        } else {
            self.params.uniform_init()
        };
        self.params.visit_slots(prefix, init, f);
    }
}

/// A learnable per-channel scale `[dim]`, starting at ones: the weight of
/// an RMSNorm. Its one parameter is `<path>.scale`.
pub struct Scale {
    /// Number of channels.
    pub dim: usize,
    /// The scale, `None` until allocated.
    pub param: Option<Param>,
}

impl Scale {
    /// A scale of `dim` channels, without values.
    pub fn new(dim: usize) -> Self {
        Scale { dim, param: None }
    }

    /// The allocated scale, or the error naming what is missing.
    pub fn get(&self) -> Result<&Param> {
        self.param.as_ref().ok_or_else(|| Error::NotAllocated {
            what: format!("a scale of {} channels", self.dim),
        })
    }
}

impl Parameters for Scale {
    fn visit_params(&mut self, prefix: &str, f: &mut dyn FnMut(ParamSlot<'_>)) {
        f(ParamSlot::new(
            prefix,
            "scale",
            vec![self.dim],
            Init::Ones,
            &mut self.param,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_are_checked() {
        let mut small = vec![Dense::new(3, 4, true), Dense::new(4, 2, false)];
        assert_eq!(try_count_params(&mut small).unwrap(), 3 * 4 + 4 + 4 * 2);
        assert_eq!(count_params(&mut small), 24);
        let mut huge: Vec<Dense> = (0..4)
            .map(|_| Dense::new(1 << 31, 1 << 31, false))
            .collect();
        let e = try_count_params(&mut huge).unwrap_err().to_string();
        assert!(e.contains("overflows 64 bits at `3.weight`"), "{e}");
        assert_eq!(count_params(&mut huge), usize::MAX);
        let mut one = Dense::new(1 << 33, 1 << 31, false);
        assert_eq!(
            try_count_params(&mut one).unwrap_err().to_string(),
            "shape error: the parameter count overflows 64 bits at `weight` [2147483648, 8589934592]; use smaller model sizes"
        );
    }
}
