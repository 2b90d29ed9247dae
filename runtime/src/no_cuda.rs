//! The `cuda` module of a build without the `cuda` feature: the backend's
//! types with no values. `CudaDevice::get` fails with "device cuda:N is
//! not available: this build of mxswitch has no backend for it", so no
//! storage on a GPU can exist and the dispatch in `storage/` compiles
//! unchanged (candle's dummy backend does the same).

use crate::backend::{
    AdamWStep, AttentionBackend, AttentionSaved, AttentionShape, BackendDevice, BackendStorage,
    DeviceStatus, LinearBackend, MemoryStats, OptimBackend, Quantized, Request,
};
use crate::cpu::{CpuOperand, CpuStorage};
use crate::op::{BinaryOp, ReduceOp, UnaryOp};
use crate::{DType, Device, Error, Layout, Result, Shape};

/// A GPU buffer; none can exist in this build.
#[derive(Debug)]
pub enum CudaStorage {}

/// A GPU; none can be opened in this build.
#[derive(Clone, Debug)]
pub enum CudaDevice {}

impl CudaDevice {
    /// Always the "no backend" error.
    pub fn get(ordinal: usize) -> Result<CudaDevice> {
        CudaDevice::open(Device::Cuda(ordinal))
    }

    /// Always the "no backend" error.
    pub fn open(device: Device) -> Result<CudaDevice> {
        Err(Error::DeviceUnavailable {
            device: device.to_string(),
        })
    }
}

impl BackendStorage for CudaStorage {
    type Device = CudaDevice;

    fn device(&self) -> &CudaDevice {
        match *self {}
    }
    fn dtype(&self) -> DType {
        match *self {}
    }
    fn buffer_bytes(&self) -> usize {
        match *self {}
    }
    fn to_cpu_storage(&self) -> Result<CpuStorage> {
        match *self {}
    }
    fn copy_strided(&self, _: &Layout) -> Result<Self> {
        match *self {}
    }
    fn to_dtype(&self, _: &Layout, _: DType) -> Result<Self> {
        match *self {}
    }
    fn unary(&self, _: &Layout, _: UnaryOp) -> Result<Self> {
        match *self {}
    }
    fn affine(&self, _: &Layout, _: f32, _: f32) -> Result<Self> {
        match *self {}
    }
    fn binary(&self, _: &Layout, _: &Self, _: &Layout, _: BinaryOp) -> Result<Self> {
        match *self {}
    }
    fn reduce(&self, _: &Layout, _: ReduceOp, _: usize) -> Result<Self> {
        match *self {}
    }
    fn matmul(&self, _: &Layout, _: &Self, _: &Layout) -> Result<Self> {
        match *self {}
    }
    fn concat(parts: &[(&Self, &Layout)], _: usize) -> Result<Self> {
        match parts.first() {
            Some((s, _)) => match **s {},
            None => Err(Error::Shape("concat of no tensors".into())),
        }
    }
    fn softmax_last_dim(&self, _: &Layout) -> Result<Self> {
        match *self {}
    }
    fn norm_last_dim(&self, _: &Layout, _: f32, _: bool) -> Result<(Self, Self)> {
        match *self {}
    }
    fn rope_interleaved(
        &self,
        _: &Layout,
        _: &Self,
        _: &Layout,
        _: &Self,
        _: &Layout,
    ) -> Result<Self> {
        match *self {}
    }
}

impl BackendDevice for CudaDevice {
    type Storage = CudaStorage;

    fn location(&self) -> Device {
        match *self {}
    }
    fn zeros(&self, _: &Shape, _: DType) -> Result<CudaStorage> {
        match *self {}
    }
    fn storage_from_cpu(&self, _: CpuStorage) -> Result<CudaStorage> {
        match *self {}
    }
}

impl LinearBackend for CudaStorage {
    type Operand<'a> = std::convert::Infallible;

    fn quantize(&self, _: &Request) -> Result<Quantized<'_, Self>> {
        match *self {}
    }
    fn gemm(
        device: &CudaDevice,
        _: &Self::Operand<'_>,
        _: &Self::Operand<'_>,
        _: Option<&Self>,
        _: DType,
    ) -> Result<Self> {
        match *device {}
    }
    fn column_sums(&self, _: usize, _: usize) -> Result<Self> {
        match *self {}
    }
    fn operand_bytes(op: &Self::Operand<'_>) -> usize {
        match *op {}
    }
    fn operand_elements(op: &Self::Operand<'_>) -> usize {
        match *op {}
    }
    fn operand_to_cpu(_: &CudaDevice, op: &Self::Operand<'_>) -> Result<CpuOperand> {
        match *op {}
    }
}

impl AttentionBackend for CudaStorage {
    fn attention_forward(
        q: &Self,
        _: &Self,
        _: &Self,
        _: AttentionShape,
        _: f32,
    ) -> Result<(Self, Self)> {
        match *q {}
    }
    fn attention_backward(
        saved: AttentionSaved<'_, Self>,
        _: &Self,
        _: AttentionShape,
        _: f32,
    ) -> Result<(Self, Self, Self)> {
        match *saved.q {}
    }
}

impl OptimBackend for CudaStorage {
    fn adamw_step(&self, _: AdamWStep<'_, Self>) -> Result<Self> {
        match *self {}
    }
}

impl DeviceStatus for CudaDevice {
    fn synchronize(&self) -> Result<()> {
        match *self {}
    }
    fn memory_info(&self) -> Result<(u64, u64)> {
        match *self {}
    }
    fn memory_stats(&self) -> MemoryStats {
        match *self {}
    }
}

impl crate::backend::MultiOptimBackend for CudaStorage {
    fn adamw_multi<'a>(steps: Vec<(&'a Self, AdamWStep<'a, Self>)>) -> Result<Vec<Self>> {
        match steps.first() {
            Some((w, _)) => match **w {},
            None => Ok(Vec::new()),
        }
    }
    fn sum_squares(grads: &[(&Self, &Layout)]) -> Result<f64> {
        match grads.first() {
            Some((g, _)) => match **g {},
            None => Ok(0.0),
        }
    }
    fn scale_all(grads: &[(&Self, &Layout)], _: f32) -> Result<Vec<Self>> {
        match grads.first() {
            Some((g, _)) => match **g {},
            None => Ok(Vec::new()),
        }
    }
}

impl crate::backend::FusedBackend for CudaStorage {
    fn modulated_norm(
        x: &Self,
        _: &Self,
        _: &Self,
        _: crate::backend::ModShape,
        _: f32,
    ) -> Result<(Self, Self, Self)> {
        match *x {}
    }
    fn modulated_norm_backward(
        saved: crate::backend::ModNormSaved<'_, Self>,
        _: &Self,
        _: crate::backend::ModShape,
    ) -> Result<(Self, Self, Self)> {
        match *saved.x {}
    }
    fn gated_add(x: &Self, _: &Self, _: &Self, _: crate::backend::ModShape) -> Result<Self> {
        match *x {}
    }
    fn gated_add_dgate(g: &Self, _: &Self, _: crate::backend::ModShape) -> Result<Self> {
        match *g {}
    }
    fn rms_norm_rope(
        x: &Self,
        _: &Self,
        _: [&Self; 2],
        _: crate::backend::RopeShape,
        _: f32,
    ) -> Result<(Self, Self)> {
        match *x {}
    }
    fn rms_norm_rope_backward(
        saved: crate::backend::RmsRopeSaved<'_, Self>,
        _: &Self,
        _: crate::backend::RopeShape,
    ) -> Result<(Self, Self)> {
        match *saved.x {}
    }
}

impl crate::backend::ScaledAdamWBackend for CudaStorage {
    fn adamw_multi_scaled<'a>(
        steps: Vec<(&'a Self, AdamWStep<'a, Self>)>,
        _: f32,
    ) -> Result<Vec<Self>> {
        match steps.first() {
            Some((w, _)) => match **w {},
            None => Ok(Vec::new()),
        }
    }
}
