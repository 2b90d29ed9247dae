//! Fused attention, o = softmax(q k^T / sqrt(D)) v, as one op with its own
//! backward: the forward keeps q, k, v, o and the f32 log-sum-exp of each
//! score row (O(L) beside the inputs), never the `[L, S]` scores, and the
//! backward recomputes the scores tile by tile. The tiling lives in the
//! backends ([`AttentionBackend`]); this file is the op and its shapes.

#[allow(unused_imports)] // for the doc link
use crate::backend::AttentionBackend;
use crate::backend::AttentionShape;
use crate::ops::{apply_custom, CustomOp};
use crate::storage::Storage;
use crate::{DType, Error, Result, Shape, Tensor};

/// softmax(q k^T / sqrt(D)) v for q `[.., L, D]`, k `[.., S, D]`, v
/// `[.., S, Dv]` with equal leading dims (Flux: `[B, H, L, D]`), in one dtype
/// (f32 or BF16, accumulated in f32). Fused: memory grows linearly with L.
pub fn scaled_dot_product_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let shape = check_shapes(q, k, v)?;
    let mut out_dims = q.dims().to_vec();
    *out_dims.last_mut().expect("rank >= 2") = shape.dv;
    let op = Attention {
        shape,
        scale: 1.0 / (shape.d as f32).sqrt(),
        q_dims: q.dims().to_vec(),
        k_dims: k.dims().to_vec(),
        v_dims: v.dims().to_vec(),
        out_dims,
    };
    Ok(apply_custom(op, &[q, k, v])?.remove(0))
}

/// The problem sizes of q, k and v, or the error naming all three shapes.
pub(crate) fn check_shapes(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<AttentionShape> {
    let bad = || {
        Error::Shape(format!(
            "attention: q {:?}, k {:?}, v {:?} do not fit; expected [.., L, D], [.., S, D], [.., S, Dv] with equal leading dims",
            q.shape(),
            k.shape(),
            v.shape()
        ))
    };
    let r = q.rank();
    if r < 2 || k.rank() != r || v.rank() != r {
        return Err(bad());
    }
    let (lead, qd, kd, vd) = (&q.dims()[..r - 2], q.dims(), k.dims(), v.dims());
    if &kd[..r - 2] != lead
        || &vd[..r - 2] != lead
        || kd[r - 1] != qd[r - 1]
        || kd[r - 2] != vd[r - 2]
    {
        return Err(bad());
    }
    let shape = AttentionShape {
        heads: lead.iter().product(),
        l: qd[r - 2],
        s: kd[r - 2],
        d: qd[r - 1],
        dv: vd[r - 1],
    };
    if shape.d == 0 || shape.s == 0 || shape.dv == 0 {
        return Err(bad());
    }
    for t in [q, k, v] {
        if !matches!(t.dtype(), DType::F32 | DType::BF16) {
            return Err(Error::DType(format!(
                "attention: {} operands are not supported; use f32 or bf16",
                t.dtype()
            )));
        }
    }
    Ok(shape)
}

/// One call on the tape.
struct Attention {
    shape: AttentionShape,
    scale: f32,
    q_dims: Vec<usize>,
    k_dims: Vec<usize>,
    v_dims: Vec<usize>,
    out_dims: Vec<usize>,
}

/// What the backward reads: the inputs, the output and the log-sum-exp.
struct AttentionSaved {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
}

fn view(t: &Tensor) -> (&Storage, &crate::Layout) {
    (t.storage(), t.layout())
}

impl CustomOp for Attention {
    type Saved = Option<AttentionSaved>;

    fn name(&self) -> &str {
        "attention"
    }

    fn forward(
        &self,
        inputs: &[Tensor],
        needs_backward: bool,
    ) -> Result<(Vec<Tensor>, Option<AttentionSaved>)> {
        let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
        let (o, lse) =
            Storage::attention_forward(view(q), view(k), view(v), self.shape, self.scale)?;
        let o = Tensor::untracked(o, self.out_dims.clone().into());
        let lse = Tensor::untracked(lse, Shape::from([self.shape.heads, self.shape.l]));
        let saved = needs_backward.then(|| AttentionSaved {
            q: q.clone(),
            k: k.clone(),
            v: v.clone(),
            o: o.clone(),
            lse,
        });
        Ok((vec![o], saved))
    }

    fn saved_bytes(&self, saved: &Option<AttentionSaved>) -> usize {
        saved.as_ref().map_or(0, |s| {
            [&s.q, &s.k, &s.v, &s.o, &s.lse]
                .iter()
                .map(|t| t.elem_count() * t.dtype().size_in_bytes())
                .sum()
        })
    }

    fn backward(
        &self,
        saved: &Option<AttentionSaved>,
        grads: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        let (Some(s), Some(d_o)) = (saved, &grads[0]) else {
            return Ok(vec![None, None, None]);
        };
        let d_o = d_o.to_dtype(s.o.dtype())?;
        let (dq, dk, dv) = Storage::attention_backward(
            [view(&s.q), view(&s.k), view(&s.v), view(&s.o), view(&s.lse)],
            view(&d_o),
            self.shape,
            self.scale,
        )?;
        Ok(vec![
            Some(Tensor::untracked(dq, self.q_dims.clone().into())),
            Some(Tensor::untracked(dk, self.k_dims.clone().into())),
            Some(Tensor::untracked(dv, self.v_dims.clone().into())),
        ])
    }
}
