//! The tensor type: a shared buffer, a layout over it and, when it tracks
//! gradients, its place on the autograd tape.
//!
//! A `Tensor` is an `Arc` to immutable state, so cloning is cheap and views
//! (reshape of contiguous data, permute, narrow, broadcast) share the buffer.
//! Buffers are never written after creation: candle's
//! `Arc<RwLock<Storage>>` allows in-place updates but makes every read take a
//! lock and lets a saved tensor change under the tape; here an optimizer step
//! makes a new buffer and [`crate::Param::set`] swaps it in under the same id.

use std::sync::Arc;

use crate::autograd::{is_grad_enabled, Node, NodeRef};
use crate::cpu::CpuStorage;
use crate::op::Op;
use crate::storage::Storage;
use crate::{DType, Device, Error, Layout, Result, Shape};

/// An n-dimensional array of f32, bf16 or u8 on a device.
#[derive(Clone)]
pub struct Tensor(Arc<TensorInner>);

struct TensorInner {
    storage: Arc<Storage>,
    layout: Layout,
    node: Option<NodeRef>,
}

impl Tensor {
    fn new(storage: Arc<Storage>, layout: Layout, node: Option<NodeRef>) -> Tensor {
        Tensor(Arc::new(TensorInner {
            storage,
            layout,
            node,
        }))
    }

    fn from_cpu(data: CpuStorage, shape: Shape, device: &Device) -> Result<Tensor> {
        if data.len() != shape.elem_count() {
            return Err(Error::Shape(format!(
                "{} values do not fill shape {shape:?} ({} elements)",
                data.len(),
                shape.elem_count()
            )));
        }
        let storage = Storage::from_cpu(data, device)?;
        Ok(Tensor::new(
            Arc::new(storage),
            Layout::contiguous(shape),
            None,
        ))
    }

    /// An f32 tensor from row-major values.
    pub fn from_vec(data: Vec<f32>, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        Tensor::from_cpu(CpuStorage::F32(data), shape.into(), device)
    }

    /// An f32 tensor from row-major values, copied; errors if `data.len()` does
    /// not match the shape's element count.
    pub fn from_slice(data: &[f32], shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        Tensor::from_vec(data.to_vec(), shape, device)
    }

    /// A BF16 tensor from raw bf16 bits.
    pub fn from_bf16_bits(
        bits: Vec<u16>,
        shape: impl Into<Shape>,
        device: &Device,
    ) -> Result<Tensor> {
        Tensor::from_cpu(CpuStorage::BF16(bits), shape.into(), device)
    }

    /// A U8 tensor of raw bytes (quantized codes, packed pairs, scales).
    pub fn from_bytes(bytes: Vec<u8>, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        Tensor::from_cpu(CpuStorage::U8(bytes), shape.into(), device)
    }

    /// A rank-0 f32 tensor holding `value`.
    pub fn scalar(value: f32, device: &Device) -> Result<Tensor> {
        Tensor::from_vec(vec![value], (), device)
    }

    /// A tensor of zeros (any dtype, including U8), not tracked.
    pub fn zeros(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        let storage = Storage::zeros(&shape, dtype, device)?;
        Ok(Tensor::new(
            Arc::new(storage),
            Layout::contiguous(shape),
            None,
        ))
    }

    /// A float tensor filled with `value` (rounded to bf16 for BF16).
    pub fn full(
        value: f32,
        shape: impl Into<Shape>,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let n = shape.elem_count();
        match dtype {
            DType::F32 => Tensor::from_vec(vec![value; n], shape, device),
            DType::BF16 => Tensor::from_bf16_bits(
                vec![crate::formats::bf16::from_f32(value); n],
                shape,
                device,
            ),
            DType::U8 => Err(Error::DType(
                "full: u8 has no float value; use from_bytes".into(),
            )),
        }
    }

    /// A float tensor of ones; errors for U8 (see [`Tensor::full`]).
    pub fn ones(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(1.0, shape, dtype, device)
    }

    /// Zeros of this tensor's shape, dtype and device (not tracked).
    pub fn zeros_like(&self) -> Result<Tensor> {
        Tensor::zeros(self.shape().clone(), self.dtype(), &self.device())
    }

    /// Ones of this tensor's shape, dtype and device (not tracked); errors for U8.
    pub fn ones_like(&self) -> Result<Tensor> {
        Tensor::ones(self.shape().clone(), self.dtype(), &self.device())
    }

    /// The tensor's shape (of the view, not of the buffer).
    pub fn shape(&self) -> &Shape {
        self.0.layout.shape()
    }

    /// The tensor's dims, outermost first.
    pub fn dims(&self) -> &[usize] {
        self.0.layout.dims()
    }

    /// Number of dims (0 for a scalar).
    pub fn rank(&self) -> usize {
        self.dims().len()
    }

    /// Number of elements of the view.
    pub fn elem_count(&self) -> usize {
        self.shape().elem_count()
    }

    /// The element type of the buffer.
    pub fn dtype(&self) -> DType {
        self.0.storage.dtype()
    }

    /// The device holding the buffer.
    pub fn device(&self) -> Device {
        self.0.storage.device()
    }

    /// How the view's elements sit in the shared buffer.
    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }

    /// Whether the view is row-major and packed (see [`Layout::is_contiguous`]).
    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }

    /// Whether this tensor is on a tape (depends on a parameter, recorded
    /// with gradients enabled).
    pub fn tracks_grad(&self) -> bool {
        self.0.node.is_some()
    }

    /// Whether two tensors share one buffer (a view of the other, or a clone).
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }

    pub(crate) fn storage(&self) -> &Storage {
        &self.0.storage
    }

    pub(crate) fn node_ref(&self) -> Option<&NodeRef> {
        self.0.node.as_ref()
    }

    /// Size of the whole underlying buffer, which a saved view keeps alive.
    pub(crate) fn buffer_bytes(&self) -> usize {
        self.0.storage.buffer_bytes()
    }

    /// The same values, off the tape: gradients do not flow through it.
    pub fn detach(&self) -> Tensor {
        match self.0.node {
            None => self.clone(),
            Some(_) => Tensor::new(self.0.storage.clone(), self.0.layout.clone(), None),
        }
    }

    pub(crate) fn with_node(self, node: NodeRef) -> Tensor {
        Tensor::new(self.0.storage.clone(), self.0.layout.clone(), Some(node))
    }

    /// Whether an op on `inputs` is recorded.
    pub(crate) fn should_record(inputs: &[&Tensor]) -> bool {
        is_grad_enabled() && inputs.iter().any(|t| t.tracks_grad())
    }

    /// Wraps a packed buffer that is not the output of a differentiable op
    /// (a mask, a statistic saved for backward).
    pub(crate) fn untracked(storage: Storage, shape: Shape) -> Tensor {
        Tensor::new(Arc::new(storage), Layout::contiguous(shape), None)
    }

    /// Wraps a new packed buffer made from `inputs`, recording `op` when
    /// gradients are tracked. `op` gets the (untracked) output, for ops that
    /// save it, and runs only when recording, so nothing is saved otherwise.
    pub(crate) fn from_op(
        storage: Storage,
        shape: Shape,
        inputs: &[&Tensor],
        op: impl FnOnce(&Tensor) -> Op,
    ) -> Tensor {
        Tensor::untracked(storage, shape).recorded(inputs, op)
    }

    /// A view of this tensor's buffer with another layout, recorded as `op`.
    pub(crate) fn view(&self, layout: Layout, op: impl FnOnce() -> Op) -> Tensor {
        Tensor::new(self.0.storage.clone(), layout, None).recorded(&[self], |_| op())
    }

    /// This (untracked) tensor as the output of `op` on `inputs`, if recording.
    fn recorded(self, inputs: &[&Tensor], op: impl FnOnce(&Tensor) -> Op) -> Tensor {
        if !Tensor::should_record(inputs) {
            return self;
        }
        let inputs = inputs.iter().map(|t| t.0.node.clone()).collect();
        let node = Node::new(
            op(&self),
            inputs,
            vec![(self.shape().clone(), self.dtype())],
        );
        self.with_node(NodeRef { node, output: 0 })
    }

    /// A packed copy when the layout is strided; the same tensor otherwise.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let storage = self.storage().copy_strided(self.layout())?;
        Ok(Tensor::from_op(
            storage,
            self.shape().clone(),
            &[self],
            |_| Op::Copy,
        ))
    }

    /// Converts the elements (f32 to bf16 rounds to nearest even). The
    /// gradient passes straight through, cast back to this tensor's dtype.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let storage = self.storage().to_dtype(self.layout(), dtype)?;
        let from = self.dtype();
        Ok(Tensor::from_op(
            storage,
            self.shape().clone(),
            &[self],
            |_| Op::ToDType { from },
        ))
    }

    /// This tensor on `device` (a copy through host memory when it moves).
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if *device == self.device() {
            return Ok(self.clone());
        }
        // A packed host tensor uploads straight from its buffer.
        if let Storage::Cpu(data) = self.storage() {
            let l = self.layout();
            if l.is_contiguous() && l.offset() == 0 && data.len() == self.elem_count() {
                let storage = Storage::from_host(data, device)?;
                return Ok(Tensor::new(
                    Arc::new(storage),
                    Layout::contiguous(self.shape().clone()),
                    None,
                ));
            }
        }
        Tensor::from_cpu(self.host()?, self.shape().clone(), device)
    }

    /// The elements, packed, in host memory.
    fn host(&self) -> Result<CpuStorage> {
        self.storage()
            .copy_strided(self.layout())?
            .into_cpu_storage()
    }

    /// The values as f32, row-major (BF16 widened exactly).
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        match self.to_dtype(DType::F32)?.host()? {
            CpuStorage::F32(v) => Ok(v),
            _ => unreachable!("converted to f32 above"),
        }
    }

    /// The raw bits of a BF16 tensor, row-major.
    pub fn to_vec_bf16_bits(&self) -> Result<Vec<u16>> {
        match self.host()? {
            CpuStorage::BF16(v) => Ok(v),
            _ => Err(self.wrong_dtype("to_vec_bf16_bits")),
        }
    }

    /// The bytes of a U8 tensor, row-major.
    pub fn to_vec_u8(&self) -> Result<Vec<u8>> {
        match self.host()? {
            CpuStorage::U8(v) => Ok(v),
            _ => Err(self.wrong_dtype("to_vec_u8")),
        }
    }

    /// The error of a raw-element read, `method`, of a tensor of another dtype.
    fn wrong_dtype(&self, method: &str) -> Error {
        Error::DType(format!("{method} on a {} tensor", self.dtype()))
    }

    /// The value of a single-element float tensor.
    pub fn to_scalar_f32(&self) -> Result<f32> {
        if self.elem_count() != 1 {
            return Err(Error::Shape(format!(
                "to_scalar_f32 of a tensor of shape {:?}",
                self.shape()
            )));
        }
        Ok(self.to_vec_f32()?[0])
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor[{:?}, {}, {}",
            self.shape(),
            self.dtype(),
            self.device()
        )?;
        if self.tracks_grad() {
            write!(f, ", grad")?;
        }
        if self.dtype().is_float() && self.elem_count() <= 8 {
            if let Ok(v) = self.to_vec_f32() {
                write!(f, ", {v:?}")?;
            }
        }
        write!(f, "]")
    }
}
