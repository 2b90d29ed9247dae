//! Reverse-mode autograd on a tape of recorded ops.
//!
//! Every op whose inputs track gradients appends a `Node` to the tape: the
//! `Op` (with exactly what its backward pass needs) and the nodes of its
//! inputs. A node's position on the tape is a global sequence number, and an
//! input is always recorded before the ops that read it, so walking the
//! nodes reachable from the loss in decreasing sequence order is a reverse
//! topological order: [`Tensor::backward`] does that walk and returns the
//! gradient of every parameter it reaches, keyed by [`ParamId`].
//!
//! Nodes point at the nodes of their inputs, never at input tensors, so an
//! op that saves less than its inputs (a quantized linear saving FP4 codes
//! instead of f32 activations) really frees them. The tape of a step is
//! freed when its last tensor is dropped.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::op::Op;
use crate::{backprop, DType, Error, Result, Shape, Tensor};

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Whether ops on this thread record onto the tape.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// Runs `f` without recording: results track no gradient and ops save
/// nothing. For evaluation and for code inside backward passes. The mode is
/// per thread and restored when `f` returns or panics.
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GRAD_ENABLED.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(GRAD_ENABLED.with(|g| g.replace(false)));
    f()
}

/// Stable identity of a trainable parameter; gradients and optimizer state
/// are keyed by it, so replacing a parameter's value keeps both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParamId(u64);

impl ParamId {
    fn fresh() -> ParamId {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        ParamId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The raw number: unique within the process, handed out in creation order,
    /// so not stable across runs.
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

/// A trainable tensor: a leaf of the tape with a stable [`ParamId`].
///
/// It derefs to its current value, so `x.matmul(&w)` works on a `Param`.
/// Not `Clone`: two copies could be updated apart and silently diverge.
pub struct Param {
    id: ParamId,
    value: Tensor,
}

impl Param {
    /// Makes `value` (detached from any tape) a parameter with a fresh id.
    pub fn new(value: Tensor) -> Result<Param> {
        let id = ParamId::fresh();
        Ok(Param {
            id,
            value: leaf(id, &value)?,
        })
    }

    /// The parameter's id, kept across [`Param::set`].
    pub fn id(&self) -> ParamId {
        self.id
    }

    /// The current value, a tape leaf: ops on it record gradients for this id.
    pub fn tensor(&self) -> &Tensor {
        &self.value
    }

    /// Replaces the value, keeping the id; shape and dtype must not change.
    pub fn set(&mut self, value: Tensor) -> Result<()> {
        if value.shape() != self.value.shape() || value.dtype() != self.value.dtype() {
            return Err(Error::Shape(format!(
                "Param::set: new value is {:?} {}, the parameter is {:?} {}",
                value.shape(),
                value.dtype(),
                self.value.shape(),
                self.value.dtype()
            )));
        }
        self.value = leaf(self.id, &value)?;
        Ok(())
    }
}

impl std::ops::Deref for Param {
    type Target = Tensor;
    fn deref(&self) -> &Tensor {
        &self.value
    }
}

impl std::fmt::Debug for Param {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Param({:?}, {:?})", self.id, self.value)
    }
}

/// `value` as the tape leaf of parameter `id`.
fn leaf(id: ParamId, value: &Tensor) -> Result<Tensor> {
    if !value.dtype().is_float() {
        return Err(Error::DType(format!(
            "a parameter must be f32 or bf16, got {}",
            value.dtype()
        )));
    }
    let node = Node::new(
        Op::Param(id),
        vec![],
        vec![(value.shape().clone(), value.dtype())],
    );
    Ok(value.detach().with_node(NodeRef { node, output: 0 }))
}

/// One recorded op on the tape.
pub(crate) struct Node {
    /// Position on the tape; inputs always have smaller numbers.
    seq: u64,
    op: Op,
    /// Nodes of the op's inputs, in input order; `None` for an input that
    /// tracks no gradient.
    inputs: Vec<Option<NodeRef>>,
    /// Shape and dtype of each output, to check gradients against.
    outputs: Vec<(Shape, DType)>,
}

/// Output `output` of a node: how a tracked tensor points into the tape.
#[derive(Clone)]
pub(crate) struct NodeRef {
    pub(crate) node: Arc<Node>,
    pub(crate) output: usize,
}

impl Node {
    pub(crate) fn new(
        op: Op,
        inputs: Vec<Option<NodeRef>>,
        outputs: Vec<(Shape, DType)>,
    ) -> Arc<Node> {
        static NEXT_SEQ: AtomicU64 = AtomicU64::new(0);
        let seq = NEXT_SEQ.fetch_add(1, Ordering::Relaxed);
        Arc::new(Node {
            seq,
            op,
            inputs,
            outputs,
        })
    }
}

impl Drop for Node {
    /// Frees a long chain of nodes iteratively; the default recursive drop
    /// would overflow the stack on a deep tape.
    fn drop(&mut self) {
        let mut stack: Vec<Arc<Node>> = self.inputs.drain(..).flatten().map(|r| r.node).collect();
        while let Some(node) = stack.pop() {
            if let Some(mut node) = Arc::into_inner(node) {
                stack.extend(node.inputs.drain(..).flatten().map(|r| r.node));
            }
        }
    }
}

/// Every node reachable from `root`, last recorded first.
fn reverse_tape(root: &Arc<Node>) -> Vec<Arc<Node>> {
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![root.clone()];
    let mut nodes = Vec::new();
    while let Some(node) = stack.pop() {
        if !seen.insert(node.seq) {
            continue;
        }
        stack.extend(node.inputs.iter().flatten().map(|r| r.node.clone()));
        nodes.push(node);
    }
    nodes.sort_unstable_by_key(|n| std::cmp::Reverse(n.seq));
    nodes
}

/// Gradients of the parameters a backward pass reached.
#[derive(Clone, Debug, Default)]
pub struct Gradients {
    map: HashMap<ParamId, Tensor>,
}

impl Gradients {
    /// The gradient of `id`, if the backward pass reached it.
    pub fn get(&self, id: ParamId) -> Option<&Tensor> {
        self.map.get(&id)
    }

    /// Sets the gradient of `id`, returning the one it replaces (no accumulation;
    /// see [`Gradients::accumulate`]).
    pub fn insert(&mut self, id: ParamId, grad: Tensor) -> Option<Tensor> {
        self.map.insert(id, grad)
    }

    /// Takes the gradient of `id` out, if present.
    pub fn remove(&mut self, id: ParamId) -> Option<Tensor> {
        self.map.remove(&id)
    }

    /// Number of parameters with a gradient.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no parameter has a gradient.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The `(id, gradient)` pairs, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (ParamId, &Tensor)> {
        self.map.iter().map(|(&id, g)| (id, g))
    }

    /// The `(id, gradient)` pairs with the gradients mutable (e.g. for clipping),
    /// in no particular order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (ParamId, &mut Tensor)> {
        self.map.iter_mut().map(|(&id, g)| (id, g))
    }

    /// Adds `grad` to the gradient of `id` (a parameter used twice gets both).
    pub fn accumulate(&mut self, id: ParamId, grad: Tensor) -> Result<()> {
        let sum = match self.map.remove(&id) {
            Some(prev) => prev.add(&grad)?,
            None => grad,
        };
        self.map.insert(id, sum);
        Ok(())
    }
}

/// Bytes kept for backward passes, summed per label over a tape.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SavedBytes {
    /// (bytes, elements) per label.
    by_label: BTreeMap<String, (usize, usize)>,
}

impl SavedBytes {
    /// The bytes saved under `label` (0 if none).
    pub fn get(&self, label: &str) -> usize {
        self.by_label.get(label).map_or(0, |e| e.0)
    }

    /// The bytes saved over all labels.
    pub fn total(&self) -> usize {
        self.by_label.values().map(|e| e.0).sum()
    }

    /// Elements the bytes under `label` stand for (as its ops report them).
    pub fn elements(&self, label: &str) -> usize {
        self.by_label.get(label).map_or(0, |e| e.1)
    }

    /// Bytes per element over the labels whose ops report elements (the
    /// quantized linears): SPEC section 4's measure.
    pub fn per_element(&self) -> f64 {
        let (b, e) = self
            .by_label
            .values()
            .filter(|e| e.1 > 0)
            .fold((0, 0), |a, e| (a.0 + e.0, a.1 + e.1));
        if e == 0 {
            0.0
        } else {
            b as f64 / e as f64
        }
    }

    /// Labels and bytes, sorted by label.
    pub fn iter(&self) -> impl Iterator<Item = (&str, usize)> {
        self.by_label.iter().map(|(l, e)| (l.as_str(), e.0))
    }
}

impl Tensor {
    /// Gradients of every parameter this scalar depends on.
    pub fn backward(&self) -> Result<Gradients> {
        if self.elem_count() != 1 {
            return Err(Error::Autograd(format!(
                "backward() needs a single-element loss, got shape {:?}; use backward_with for a given output gradient",
                self.shape()
            )));
        }
        let seed = Tensor::ones(self.shape().clone(), self.dtype(), &self.device())?;
        self.backward_with(&seed)
    }

    /// Backpropagates `grad` (the gradient of some scalar with respect to this
    /// tensor, same shape) down the tape. Runs without recording, so there are
    /// no gradients of gradients.
    pub fn backward_with(&self, grad: &Tensor) -> Result<Gradients> {
        self.backward_streaming(grad, &mut |_, _| Ok(()))
    }

    /// [`Tensor::backward_with`], calling `on_final(id, gradient)` as soon
    /// as a parameter's gradient is final (the tape reached its last leaf)
    /// while the rest of the tape still runs: where a data-parallel step
    /// starts summing gradient buckets during backward.
    pub fn backward_streaming(
        &self,
        grad: &Tensor,
        on_final: &mut dyn FnMut(ParamId, &Tensor) -> Result<()>,
    ) -> Result<Gradients> {
        let root = self.node_ref().ok_or_else(|| {
            Error::Autograd(
                "backward of a tensor that tracks no gradient: no parameter was used, or it ran under no_grad"
                    .into(),
            )
        })?;
        if grad.shape() != self.shape() || grad.dtype() != self.dtype() {
            return Err(Error::Shape(format!(
                "backward_with: gradient {:?} {} differs from the tensor's {:?} {}",
                grad.shape(),
                grad.dtype(),
                self.shape(),
                self.dtype()
            )));
        }
        no_grad(|| {
            let mut pending: HashMap<u64, Vec<Option<Tensor>>> = HashMap::new();
            let mut root_grads = vec![None; root.node.outputs.len()];
            root_grads[root.output] = Some(grad.detach());
            pending.insert(root.node.seq, root_grads);
            let mut grads = Gradients::default();
            let tape = reverse_tape(&root.node);
            // Leaves left per parameter: its gradient is final at the last.
            let mut leaves: HashMap<ParamId, usize> = HashMap::new();
            for node in &tape {
                if let Op::Param(id) = node.op {
                    *leaves.entry(id).or_default() += 1;
                }
            }
            for node in tape {
                let out_grads = pending.remove(&node.seq);
                if let Op::Param(id) = node.op {
                    if let Some(g) = out_grads.and_then(|g| g.into_iter().next().flatten()) {
                        grads.accumulate(id, g)?;
                    }
                    let left = leaves.get_mut(&id).expect("counted above");
                    *left -= 1;
                    if let (0, Some(g)) = (*left, grads.get(id)) {
                        on_final(id, g)?;
                    }
                    continue;
                }
                // A node reached only through inputs that got no gradient.
                let Some(out_grads) = out_grads else {
                    continue;
                };
                let in_grads = backprop::backward(&node.op, &out_grads)?;
                if in_grads.len() != node.inputs.len() {
                    return Err(Error::Autograd(format!(
                        "backward of `{}` returned {} gradients for {} inputs",
                        node.op.name(),
                        in_grads.len(),
                        node.inputs.len()
                    )));
                }
                for (input, g) in node.inputs.iter().zip(in_grads) {
                    let (Some(input), Some(g)) = (input, g) else {
                        continue;
                    };
                    let (shape, dtype) = &input.node.outputs[input.output];
                    if g.shape() != shape || g.dtype() != *dtype {
                        return Err(Error::Autograd(format!(
                            "backward of `{}` gave a {:?} {} gradient for an input of {:?} {}",
                            node.op.name(),
                            g.shape(),
                            g.dtype(),
                            shape,
                            dtype
                        )));
                    }
                    let slot = pending
                        .entry(input.node.seq)
                        .or_insert_with(|| vec![None; input.node.outputs.len()]);
                    slot[input.output] = Some(match slot[input.output].take() {
                        Some(prev) => prev.add(&g)?,
                        None => g,
                    });
                }
            }
            Ok(grads)
        })
    }

    /// Bytes that the ops of this tensor's tape keep for backward, per label:
    /// custom ops under their own label and count, built-in ops under their
    /// name (counting the buffers their saved tensors hold alive).
    pub fn saved_bytes(&self) -> SavedBytes {
        let mut out = SavedBytes::default();
        if let Some(root) = self.node_ref() {
            for node in reverse_tape(&root.node) {
                let (label, bytes, elements) = node.op.saved_bytes();
                if bytes > 0 || matches!(node.op, Op::Custom(_)) {
                    let e = out.by_label.entry(label).or_insert((0, 0));
                    e.0 += bytes;
                    e.1 += elements;
                }
            }
        }
        out
    }
}
