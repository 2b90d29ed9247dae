//! Network ops: fused softmax, norms and RoPE, and the composed linear,
//! attention and MSE loss.

use crate::op::Op;
use crate::{is_grad_enabled, Error, Result, Shape, Tensor};

impl Tensor {
    fn require_rank(&self, op: &str, rank: usize) -> Result<()> {
        if self.rank() < rank {
            return Err(Error::Shape(format!(
                "{op}: needs rank >= {rank}, got {:?}",
                self.shape()
            )));
        }
        Ok(())
    }

    /// Softmax over the last axis, max-subtracted so large logits do not overflow.
    pub fn softmax_last_dim(&self) -> Result<Tensor> {
        self.require_rank("softmax", 1)?;
        let storage = self.storage().softmax_last_dim(self.layout())?;
        Ok(Tensor::from_op(
            storage,
            self.shape().clone(),
            &[self],
            |y| Op::SoftmaxLastDim { y: y.clone() },
        ))
    }

    /// Normalizes the last axis; returns y and rstd (`[.., 1]`).
    fn norm_last_dim(&self, eps: f32, rms: bool) -> Result<Tensor> {
        self.require_rank(if rms { "rms_norm" } else { "layer_norm" }, 1)?;
        let (y, rstd) = self.storage().norm_last_dim(self.layout(), eps, rms)?;
        let rstd = Tensor::untracked(rstd, self.shape().keepdim(&[self.rank() - 1]));
        Ok(Tensor::from_op(y, self.shape().clone(), &[self], |y| {
            let y = y.clone();
            if rms {
                Op::RmsNorm { y, rstd }
            } else {
                Op::LayerNorm { y, rstd }
            }
        }))
    }

    /// Layer norm over the last axis without affine weights:
    /// (x - mean) / sqrt(var + eps), with the biased variance.
    pub fn layer_norm(&self, eps: f32) -> Result<Tensor> {
        self.norm_last_dim(eps, false)
    }

    /// x / sqrt(mean(x^2) + eps) over the last axis, without a scale.
    pub fn rms_normalize(&self, eps: f32) -> Result<Tensor> {
        self.norm_last_dim(eps, true)
    }

    /// RMSNorm with a learnable scale `weight` of shape `[D]` (D the last
    /// axis); Flux's QK norm uses eps 1e-6.
    pub fn rms_norm(&self, weight: &Tensor, eps: f32) -> Result<Tensor> {
        let d = self.dims().last().copied().unwrap_or(0);
        if weight.dims() != [d] {
            return Err(Error::Shape(format!(
                "rms_norm: weight {:?} must be [{d}] for input {:?}",
                weight.shape(),
                self.shape()
            )));
        }
        self.rms_normalize(eps)?.mul(weight)
    }

    /// RoPE on interleaved pairs: for x `[.., L, D]` and tables `cos`, `sin`
    /// of shape `[L, D/2]`, pair (2i, 2i+1) at position p becomes
    /// (x0 c - x1 s, x0 s + x1 c) with c = cos[p, i], s = sin[p, i].
    /// The tables are constants: they may not track gradients.
    pub fn rope_interleaved(&self, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        self.require_rank("rope_interleaved", 2)?;
        let (l, d) = (self.dims()[self.rank() - 2], self.dims()[self.rank() - 1]);
        if d % 2 != 0 || cos.dims() != [l, d / 2] || sin.dims() != [l, d / 2] {
            return Err(Error::Shape(format!(
                "rope_interleaved: x {:?} needs an even last dim and cos/sin of [{l}, {}], got {:?} and {:?}",
                self.shape(),
                d / 2,
                cos.shape(),
                sin.shape()
            )));
        }
        if is_grad_enabled() && (cos.tracks_grad() || sin.tracks_grad()) {
            return Err(Error::Autograd(
                "rope_interleaved: the cos/sin tables must not track gradients".into(),
            ));
        }
        let storage = self.storage().rope_interleaved(
            self.layout(),
            (cos.storage(), cos.layout()),
            (sin.storage(), sin.layout()),
        )?;
        Ok(Tensor::from_op(
            storage,
            self.shape().clone(),
            &[self],
            |_| Op::RopeInterleaved {
                cos: cos.detach(),
                sin: sin.detach(),
            },
        ))
    }
}

/// y = x W^T + b for x `[.., K]`, W `[N, K]` and b `[N]`. W^T is a view, so
/// the GEMM reads W in place.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let k = x.dims().last().copied().unwrap_or(0);
    if x.rank() == 0 || w.rank() != 2 || w.dims()[1] != k {
        return Err(Error::Shape(format!(
            "linear: x {:?} and W {:?} do not fit; expected x [.., K] and W [N, K]",
            x.shape(),
            w.shape()
        )));
    }
    let n = w.dims()[0];
    if let Some(b) = b {
        if b.dims() != [n] {
            return Err(Error::Shape(format!(
                "linear: bias {:?} must be [{n}] for W {:?}",
                b.shape(),
                w.shape()
            )));
        }
    }
    let m = x.elem_count() / k.max(1);
    let y = x.reshape([m, k])?.matmul(&w.t()?)?;
    let y = match b {
        Some(b) => y.add(b)?,
        None => y,
    };
    let mut dims = x.dims().to_vec();
    *dims.last_mut().expect("rank checked above") = n;
    y.reshape(Shape::new(dims))
}

/// softmax(q k^T / sqrt(D)) v composed from matmul and softmax: the
/// `[.., L, S]` scores exist in memory. The reference that the fused
/// [`scaled_dot_product_attention`](super::scaled_dot_product_attention) is
/// checked against; shapes as there.
pub fn attention_unfused(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let d = super::attention::check_shapes(q, k, v)?.d;
    let scores = q.matmul(&k.t()?)?.mul_scalar(1.0 / (d as f32).sqrt())?;
    scores.softmax_last_dim()?.matmul(v)
}

/// Mean of (pred - target)^2 over every element; shapes must be equal.
pub fn mse_loss(pred: &Tensor, target: &Tensor) -> Result<Tensor> {
    if pred.shape() != target.shape() {
        return Err(Error::Shape(format!(
            "mse_loss: prediction {:?} and target {:?} differ",
            pred.shape(),
            target.shape()
        )));
    }
    pred.sub(target)?.sqr()?.mean_all()
}
