//! Fused element-wise ops of the Flux blocks, each one op on the tape with
//! its own backward ([`FusedBackend`]):
//!
//! - [`modulated_layer_norm`]: (1 + scale) * LayerNorm(x) + shift, the
//!   adaLN modulation (SPEC section 8), one pass where the composition
//!   `x.layer_norm(eps).mul(&scale.add_scalar(1)).add(&shift)` makes four
//!   ops forward and about a dozen backward; it keeps x and two f32
//!   statistics per row where the composition keeps the normalized x.
//! - [`gated_residual`]: x + gate * y, the gated residual add, one pass
//!   instead of two, and a backward of one multiply and one fused sum.
//!
//! - [`rms_norm_rope`]: Flux's QK norm (RMSNorm in f32 with a learnable
//!   scale, cast back) and the RoPE after it, one pass over q or k where
//!   the composition casts, normalizes, scales, casts and rotates.
//! - [`split_fused`] and [`split_heads`]: views of pieces of a tensor (the
//!   modulation vectors, the text and image parts of the joint sequence,
//!   q, k and v of a fused projection) whose backward writes the input's
//!   gradient with one concatenation, where [`Tensor::split`]'s narrows
//!   each pad their gradient with zeros to the whole input and add them up.
//!
//! Element math is f32 in the composition's order, so in f32 the outputs
//! are the composition's bits; in BF16 they are rounded once where the
//! composition rounds after every op (SPEC allows f32 inside a kernel).
//! The splits move data only: their values and gradients are exact.

#[allow(unused_imports)] // for the doc links
use crate::backend::FusedBackend;
use crate::backend::{ModShape, RopeShape};
use crate::ops::{apply_custom, CustomOp};
use crate::storage::Storage;
use crate::{DType, Device, Error, Layout, Result, Shape, Tensor};

/// (1 + scale) * LayerNorm(x) + shift for x `[.., L, H]` and shift, scale
/// `[.., 1, H]` with the same leading dims (Flux: `[B, L, H]` and
/// `[B, 1, H]`), one dtype (f32 or BF16). The LayerNorm has no affine
/// weights and takes mean and variance in f64, as
/// [`Tensor::layer_norm`] does; the rest is f32 with one rounding.
pub fn modulated_layer_norm(
    x: &Tensor,
    shift: &Tensor,
    scale: &Tensor,
    eps: f32,
) -> Result<Tensor> {
    let shape = mod_shape(
        "modulated_layer_norm",
        x,
        &[("shift", shift), ("scale", scale)],
    )?;
    let op = ModulatedNorm {
        shape,
        eps,
        x_dims: x.shape().clone(),
        vec_dims: shift.shape().clone(),
    };
    Ok(apply_custom(op, &[x, shift, scale])?.remove(0))
}

/// x + gate * y for x, y `[.., L, H]` and gate `[.., 1, H]` with the same
/// leading dims (Flux's gated residual add), one dtype (f32 or BF16),
/// computed in f32 with one rounding.
pub fn gated_residual(x: &Tensor, gate: &Tensor, y: &Tensor) -> Result<Tensor> {
    let shape = mod_shape("gated_residual", x, &[("gate", gate)])?;
    if y.shape() != x.shape() {
        return Err(Error::Shape(format!(
            "gated_residual: y {:?} must have x's shape {:?}",
            y.shape(),
            x.shape()
        )));
    }
    let op = GatedResidual {
        shape,
        x_dims: x.shape().clone(),
        gate_dims: gate.shape().clone(),
    };
    Ok(apply_custom(op, &[x, gate, y])?.remove(0))
}

/// The sizes of x `[.., L, H]` with per-batch vectors `[.., 1, H]`, or the
/// error naming the shapes; checks the dtypes too.
fn mod_shape(op: &str, x: &Tensor, vectors: &[(&str, &Tensor)]) -> Result<ModShape> {
    let r = x.rank();
    if r < 2 {
        return Err(Error::Shape(format!(
            "{op}: x must be [.., L, H], got {:?}",
            x.shape()
        )));
    }
    let (lead, tokens, hidden) = (&x.dims()[..r - 2], x.dims()[r - 2], x.dims()[r - 1]);
    if hidden == 0 {
        return Err(Error::Shape(format!(
            "{op}: x {:?} has rows of no elements",
            x.shape()
        )));
    }
    let mut want = lead.to_vec();
    want.extend([1, hidden]);
    for (name, v) in vectors {
        if v.dims() != want.as_slice() {
            return Err(Error::Shape(format!(
                "{op}: {name} {:?} must be {want:?} for x {:?}",
                v.shape(),
                x.shape()
            )));
        }
    }
    for t in std::iter::once(x).chain(vectors.iter().map(|v| v.1)) {
        if !matches!(t.dtype(), DType::F32 | DType::BF16) {
            return Err(Error::DType(format!(
                "{op}: {} operands are not supported; use f32 or bf16",
                t.dtype()
            )));
        }
    }
    Ok(ModShape {
        batch: lead.iter().product(),
        tokens,
        hidden,
    })
}

fn view(t: &Tensor) -> (&Storage, &Layout) {
    (t.storage(), t.layout())
}

/// Bytes of the elements of `ts` (what a saved tensor stands for).
fn bytes(ts: &[&Tensor]) -> usize {
    ts.iter()
        .map(|t| t.elem_count() * t.dtype().size_in_bytes())
        .sum()
}

/// One [`modulated_layer_norm`] on the tape.
struct ModulatedNorm {
    shape: ModShape,
    eps: f32,
    x_dims: Shape,
    vec_dims: Shape,
}

/// What its backward reads: x, scale and each row's f32 mean and rstd.
struct ModNormSaved {
    x: Tensor,
    scale: Tensor,
    mean: Tensor,
    rstd: Tensor,
}

impl CustomOp for ModulatedNorm {
    type Saved = Option<ModNormSaved>;

    fn name(&self) -> &str {
        "modulated_layer_norm"
    }

    fn forward(
        &self,
        inputs: &[Tensor],
        needs_backward: bool,
    ) -> Result<(Vec<Tensor>, Option<ModNormSaved>)> {
        let (x, shift, scale) = (&inputs[0], &inputs[1], &inputs[2]);
        let (y, mean, rstd) =
            Storage::modulated_norm([view(x), view(shift), view(scale)], self.shape, self.eps)?;
        let rows = Shape::from([self.shape.batch * self.shape.tokens]);
        let saved = needs_backward.then(|| ModNormSaved {
            x: x.clone(),
            scale: scale.clone(),
            mean: Tensor::untracked(mean, rows.clone()),
            rstd: Tensor::untracked(rstd, rows),
        });
        Ok((vec![Tensor::untracked(y, self.x_dims.clone())], saved))
    }

    fn saved_bytes(&self, saved: &Option<ModNormSaved>) -> usize {
        saved
            .as_ref()
            .map_or(0, |s| bytes(&[&s.x, &s.scale, &s.mean, &s.rstd]))
    }

    fn backward(
        &self,
        saved: &Option<ModNormSaved>,
        grads: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        let (Some(s), Some(g)) = (saved, &grads[0]) else {
            return Ok(vec![None, None, None]);
        };
        let g = g.to_dtype(s.x.dtype())?;
        let (dx, dshift, dscale) = Storage::modulated_norm_backward(
            [view(&s.x), view(&s.scale), view(&s.mean), view(&s.rstd)],
            view(&g),
            self.shape,
        )?;
        Ok(vec![
            Some(Tensor::untracked(dx, self.x_dims.clone())),
            Some(Tensor::untracked(dshift, self.vec_dims.clone())),
            Some(Tensor::untracked(dscale, self.vec_dims.clone())),
        ])
    }
}

/// One [`gated_residual`] on the tape.
struct GatedResidual {
    shape: ModShape,
    x_dims: Shape,
    gate_dims: Shape,
}

/// What its backward reads: the gate and y.
struct GatedSaved {
    gate: Tensor,
    y: Tensor,
}

impl CustomOp for GatedResidual {
    type Saved = Option<GatedSaved>;

    fn name(&self) -> &str {
        "gated_residual"
    }

    fn forward(
        &self,
        inputs: &[Tensor],
        needs_backward: bool,
    ) -> Result<(Vec<Tensor>, Option<GatedSaved>)> {
        let (x, gate, y) = (&inputs[0], &inputs[1], &inputs[2]);
        let out = Storage::gated_add([view(x), view(gate), view(y)], self.shape)?;
        let saved = needs_backward.then(|| GatedSaved {
            gate: gate.clone(),
            y: y.clone(),
        });
        Ok((vec![Tensor::untracked(out, self.x_dims.clone())], saved))
    }

    fn saved_bytes(&self, saved: &Option<GatedSaved>) -> usize {
        saved.as_ref().map_or(0, |s| bytes(&[&s.gate, &s.y]))
    }

    /// dx = g, dy = g * gate (the composition's multiply, so its bits),
    /// dgate = the f64 sum of g * y over each batch's tokens.
    fn backward(
        &self,
        saved: &Option<GatedSaved>,
        grads: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        let (Some(s), Some(g)) = (saved, &grads[0]) else {
            return Ok(vec![None, None, None]);
        };
        let g = g.to_dtype(s.y.dtype())?;
        let dgate = Storage::gated_add_dgate([view(&g), view(&s.y)], self.shape)?;
        let dy = g.mul(&s.gate)?;
        Ok(vec![
            Some(g),
            Some(Tensor::untracked(dgate, self.gate_dims.clone())),
            Some(dy),
        ])
    }
}

/// Views of consecutive pieces of `axis` with the given sizes, as
/// [`Tensor::split`] makes them, recorded as one op whose backward is one
/// concatenation of the pieces' gradients (zeros for a piece that has none).
pub fn split_fused(x: &Tensor, axis: isize, sizes: &[usize]) -> Result<Vec<Tensor>> {
    let axis = x.shape().axis(axis)?;
    let pieces = x.split(axis as isize, sizes)?;
    if pieces.len() < 2 || !x.tracks_grad() {
        return Ok(pieces);
    }
    let op = Split {
        axis,
        sizes: sizes.to_vec(),
        dims: x.dims().to_vec(),
        dtype: x.dtype(),
        device: x.device(),
    };
    apply_custom(op, &[x])
}

/// One [`split_fused`] on the tape.
struct Split {
    axis: usize,
    sizes: Vec<usize>,
    dims: Vec<usize>,
    dtype: DType,
    device: Device,
}

/// The gradient of each output, zeros of its shape where it has none.
fn grads_or_zeros(
    grads: &[Option<Tensor>],
    dims: impl Fn(usize) -> Vec<usize>,
    dtype: DType,
    device: &Device,
) -> Result<Vec<Tensor>> {
    grads
        .iter()
        .enumerate()
        .map(|(k, g)| match g {
            Some(g) => g.to_dtype(dtype),
            None => Tensor::zeros(dims(k), dtype, device),
        })
        .collect()
}

impl CustomOp for Split {
    type Saved = ();

    fn name(&self) -> &str {
        "split"
    }

    fn forward(&self, inputs: &[Tensor], _: bool) -> Result<(Vec<Tensor>, ())> {
        Ok((inputs[0].split(self.axis as isize, &self.sizes)?, ()))
    }

    fn saved_bytes(&self, _: &()) -> usize {
        0
    }

    fn backward(&self, _: &(), grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        if grads.iter().all(Option::is_none) {
            return Ok(vec![None]);
        }
        let piece = |k: usize| {
            let mut d = self.dims.clone();
            d[self.axis] = self.sizes[k];
            d
        };
        let parts = grads_or_zeros(grads, piece, self.dtype, &self.device)?;
        let parts: Vec<&Tensor> = parts.iter().collect();
        Ok(vec![Some(Tensor::cat(&parts, self.axis as isize)?)])
    }
}

/// q, k and v `[B, h, L, D]` of a fused projection `[B, L, 3 h D]` laid out
/// as `[B, L, 3, h, D]`: views, recorded as one op whose backward writes
/// the projection's gradient with one concatenation (along the heads of
/// `[B, L, 3h, D]`, which is that layout).
pub fn split_heads(qkv: &Tensor, heads: usize) -> Result<(Tensor, Tensor, Tensor)> {
    let bad = || {
        Error::Shape(format!(
            "split_heads: {:?} is not [B, L, 3 * {heads} * D]",
            qkv.shape()
        ))
    };
    if qkv.rank() != 3 || heads == 0 || qkv.dims()[2] % (3 * heads) != 0 {
        return Err(bad());
    }
    let op = SplitHeads {
        dims: qkv.dims().to_vec(),
        heads,
        dtype: qkv.dtype(),
        device: qkv.device(),
    };
    let mut out = if qkv.tracks_grad() {
        apply_custom(op, &[qkv])?
    } else {
        op.views(qkv)?
    };
    let v = out.pop().ok_or_else(bad)?;
    let k = out.pop().ok_or_else(bad)?;
    let q = out.pop().ok_or_else(bad)?;
    Ok((q, k, v))
}

/// One [`split_heads`] on the tape.
struct SplitHeads {
    dims: Vec<usize>,
    heads: usize,
    dtype: DType,
    device: Device,
}

impl SplitHeads {
    /// (B, L, D).
    fn sizes(&self) -> (usize, usize, usize) {
        (self.dims[0], self.dims[1], self.dims[2] / 3 / self.heads)
    }

    /// q, k and v as views of `qkv`.
    fn views(&self, qkv: &Tensor) -> Result<Vec<Tensor>> {
        let (b, l, d) = self.sizes();
        let x = qkv
            .reshape([b, l, 3, self.heads, d])?
            .permute(&[2, 0, 3, 1, 4])?; // [3, B, h, L, D]
        x.split(0, &[1, 1, 1])?
            .into_iter()
            .map(|t| t.squeeze(0))
            .collect()
    }
}

impl CustomOp for SplitHeads {
    type Saved = ();

    fn name(&self) -> &str {
        "split_heads"
    }

    fn forward(&self, inputs: &[Tensor], _: bool) -> Result<(Vec<Tensor>, ())> {
        Ok((self.views(&inputs[0])?, ()))
    }

    fn saved_bytes(&self, _: &()) -> usize {
        0
    }

    fn backward(&self, _: &(), grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        if grads.iter().all(Option::is_none) {
            return Ok(vec![None]);
        }
        let (b, l, d) = self.sizes();
        let each = |_| vec![b, self.heads, l, d];
        let parts = grads_or_zeros(grads, each, self.dtype, &self.device)?
            .iter()
            .map(|g| g.permute(&[0, 2, 1, 3])) // [B, L, h, D]
            .collect::<Result<Vec<Tensor>>>()?;
        let parts: Vec<&Tensor> = parts.iter().collect();
        Ok(vec![Some(
            Tensor::cat(&parts, 2)?.reshape(self.dims.clone())?,
        )])
    }
}

/// Flux's QK norm and RoPE as one op: `x.to_dtype(F32).rms_norm(weight,
/// eps)` cast back to x's dtype, then `rope_interleaved` with the tables
/// cast to x's dtype, with that composition's bits (the same f32
/// operations and roundings, the statistic in f64 in element order) in one
/// pass over x. x `[.., L, D]` (D even; f32 or BF16), weight `[D]` f32,
/// cos and sin `[L, D/2]` constants (they may not track gradients).
pub fn rms_norm_rope(
    x: &Tensor,
    weight: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    eps: f32,
) -> Result<Tensor> {
    let op = "rms_norm_rope";
    let r = x.rank();
    if r < 2 || x.dims()[r - 1] % 2 != 0 {
        return Err(Error::Shape(format!(
            "{op}: x must be [.., L, D] with D even, got {:?}",
            x.shape()
        )));
    }
    let (l, d) = (x.dims()[r - 2], x.dims()[r - 1]);
    if weight.dims() != [d] || cos.dims() != [l, d / 2] || sin.dims() != [l, d / 2] {
        return Err(Error::Shape(format!(
            "{op}: weight {:?}, cos {:?} and sin {:?} must be [{d}], [{l}, {}] and [{l}, {}] for x {:?}",
            weight.shape(),
            cos.shape(),
            sin.shape(),
            d / 2,
            d / 2,
            x.shape()
        )));
    }
    if !matches!(x.dtype(), DType::F32 | DType::BF16) || weight.dtype() != DType::F32 {
        return Err(Error::DType(format!(
            "{op}: x must be f32 or bf16 and the weight f32, got {} and {}",
            x.dtype(),
            weight.dtype()
        )));
    }
    if crate::is_grad_enabled() && (cos.tracks_grad() || sin.tracks_grad()) {
        return Err(Error::Autograd(format!(
            "{op}: the cos/sin tables must not track gradients"
        )));
    }
    let op = RmsRope {
        shape: RopeShape {
            rows: x.elem_count() / d.max(1),
            d,
            seq: l,
        },
        eps,
        x_dims: x.shape().clone(),
        cos: cos.detach().to_dtype(x.dtype())?,
        sin: sin.detach().to_dtype(x.dtype())?,
    };
    Ok(apply_custom(op, &[x, weight])?.remove(0))
}

/// One [`rms_norm_rope`] on the tape, with its tables in x's dtype.
struct RmsRope {
    shape: RopeShape,
    eps: f32,
    x_dims: Shape,
    cos: Tensor,
    sin: Tensor,
}

/// What its backward reads besides the tables: x, the weight, rstd.
struct RmsRopeSaved {
    x: Tensor,
    weight: Tensor,
    rstd: Tensor,
}

impl CustomOp for RmsRope {
    type Saved = Option<RmsRopeSaved>;

    fn name(&self) -> &str {
        "rms_norm_rope"
    }

    fn forward(
        &self,
        inputs: &[Tensor],
        needs_backward: bool,
    ) -> Result<(Vec<Tensor>, Option<RmsRopeSaved>)> {
        let (x, w) = (&inputs[0], &inputs[1]);
        let views = [view(x), view(w), view(&self.cos), view(&self.sin)];
        let (y, rstd) = Storage::rms_norm_rope(views, self.shape, self.eps)?;
        let saved = needs_backward.then(|| RmsRopeSaved {
            x: x.clone(),
            weight: w.clone(),
            rstd: Tensor::untracked(rstd, Shape::from([self.shape.rows])),
        });
        Ok((vec![Tensor::untracked(y, self.x_dims.clone())], saved))
    }

    fn saved_bytes(&self, saved: &Option<RmsRopeSaved>) -> usize {
        saved
            .as_ref()
            .map_or(0, |s| bytes(&[&s.x, &s.weight, &s.rstd]))
    }

    fn backward(
        &self,
        saved: &Option<RmsRopeSaved>,
        grads: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        let (Some(s), Some(g)) = (saved, &grads[0]) else {
            return Ok(vec![None, None]);
        };
        let g = g.to_dtype(s.x.dtype())?;
        let saved = [
            view(&s.x),
            view(&s.weight),
            view(&self.cos),
            view(&self.sin),
            view(&s.rstd),
        ];
        let (dx, dw) = Storage::rms_norm_rope_backward(saved, view(&g), self.shape)?;
        Ok(vec![
            Some(Tensor::untracked(dx, self.x_dims.clone())),
            Some(Tensor::untracked(dw, s.weight.shape().clone())),
        ])
    }
}
