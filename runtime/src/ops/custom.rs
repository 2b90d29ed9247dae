//! Ops defined outside the runtime, with their own forward and backward:
//! the quantized linears of SPEC section 4 are written this way, saving
//! quantized buffers instead of their f32 inputs.
//!
//! ```
//! use mxswitch_runtime::{ops::{apply_custom, CustomOp}, Device, Param, Result, Tensor};
//!
//! /// y = 2x, saving nothing.
//! struct Double;
//!
//! impl CustomOp for Double {
//!     type Saved = ();
//!     fn name(&self) -> &str { "double" }
//!     fn forward(&self, inputs: &[Tensor], _needs_backward: bool) -> Result<(Vec<Tensor>, ())> {
//!         Ok((vec![inputs[0].mul_scalar(2.0)?], ()))
//!     }
//!     fn saved_bytes(&self, _saved: &()) -> usize { 0 }
//!     fn backward(&self, _saved: &(), grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
//!         Ok(vec![grads[0].as_ref().map(|g| g.mul_scalar(2.0)).transpose()?])
//!     }
//! }
//!
//! # fn main() -> Result<()> {
//! let x = Param::new(Tensor::from_vec(vec![1.0, 2.0], [2], &Device::Cpu)?)?;
//! let y = apply_custom(Double, &[&x])?.remove(0);
//! let grads = y.sum_all()?.backward()?;
//! assert_eq!(grads.get(x.id()).unwrap().to_vec_f32()?, vec![2.0, 2.0]);
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use crate::autograd::{Node, NodeRef};
use crate::op::Op;
use crate::{no_grad, Error, Result, Tensor};

/// A differentiable op with a hand-written backward pass.
pub trait CustomOp: Send + Sync + 'static {
    /// Whatever the backward pass needs: tensors, quantized byte buffers,
    /// scales. It lives on the tape until the tape is dropped.
    type Saved: Send + Sync + 'static;

    /// Names the op in errors.
    fn name(&self) -> &str;

    /// The label its saved bytes are summed under (a layer name, say);
    /// defaults to [`CustomOp::name`].
    fn label(&self) -> String {
        self.name().to_string()
    }

    /// Computes the outputs from the inputs (detached, in input order) and
    /// what backward will need. Runs without recording. When `needs_backward`
    /// is false the saved value is dropped at once, so the op may skip
    /// preparing it.
    fn forward(
        &self,
        inputs: &[Tensor],
        needs_backward: bool,
    ) -> Result<(Vec<Tensor>, Self::Saved)>;

    /// Bytes held by `saved`, for the saved-bytes accounting
    /// ([`Tensor::saved_bytes`]).
    fn saved_bytes(&self, saved: &Self::Saved) -> usize;

    /// Elements of the tensors `saved` stands for (before any quantization
    /// or padding), so saved bytes per element can be measured; 0 if the op
    /// does not say.
    fn saved_elements(&self, _saved: &Self::Saved) -> usize {
        0
    }

    /// Gradients of the inputs (one entry per input, `None` for an input with
    /// no gradient) from those of the outputs (`None` for an output the loss
    /// does not depend on). Each gradient has its input's shape and dtype.
    fn backward(
        &self,
        saved: &Self::Saved,
        grad_outputs: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>>;
}

/// A custom op with its saved value, as the tape stores it.
pub(crate) trait DynCustomOp: Send + Sync {
    fn name(&self) -> &str;
    fn label(&self) -> String;
    fn saved_bytes(&self) -> usize;
    fn saved_elements(&self) -> usize;
    fn backward(&self, grad_outputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>>;
}

struct Recorded<C: CustomOp> {
    op: C,
    saved: C::Saved,
}

impl<C: CustomOp> DynCustomOp for Recorded<C> {
    fn name(&self) -> &str {
        self.op.name()
    }

    fn label(&self) -> String {
        self.op.label()
    }

    fn saved_bytes(&self) -> usize {
        self.op.saved_bytes(&self.saved)
    }

    fn saved_elements(&self) -> usize {
        self.op.saved_elements(&self.saved)
    }

    fn backward(&self, grad_outputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        self.op.backward(&self.saved, grad_outputs)
    }
}

/// Runs `op` on `inputs` and, when any input tracks gradients (and grad mode
/// is on), records it on the tape with its saved value.
pub fn apply_custom<C: CustomOp>(op: C, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let record = Tensor::should_record(inputs);
    let detached: Vec<Tensor> = inputs.iter().map(|t| t.detach()).collect();
    let (outputs, saved) = no_grad(|| op.forward(&detached, record))?;
    if outputs.is_empty() {
        return Err(Error::Autograd(format!(
            "custom op `{}` returned no outputs",
            op.name()
        )));
    }
    if !record {
        return Ok(outputs);
    }
    let out_info = outputs
        .iter()
        .map(|t| (t.shape().clone(), t.dtype()))
        .collect();
    let input_nodes = inputs.iter().map(|t| t.node_ref().cloned()).collect();
    let node: Arc<Node> = Node::new(
        Op::Custom(Box::new(Recorded { op, saved })),
        input_nodes,
        out_info,
    );
    Ok(outputs
        .into_iter()
        .enumerate()
        .map(|(output, t)| {
            t.detach().with_node(NodeRef {
                node: node.clone(),
                output,
            })
        })
        .collect())
}
