//! The traits every backend implements. The CPU backend (`cpu/`) is the
//! reference; a CUDA or ROCm backend adds a type implementing these traits and
//! one arm per method in `storage.rs`, and nothing above the storage changes.
//!
//! Layouts passed in may be strided views (transposes, narrows, stride-0
//! broadcasts); every method returns a new contiguous buffer.

use crate::cpu::CpuStorage;
use crate::op::{BinaryOp, ReduceOp, UnaryOp};
use crate::{DType, Device, Layout, Result, Shape};

/// A buffer of elements on one device.
pub trait BackendStorage: Sized + Send + Sync {
    type Device: BackendDevice<Storage = Self>;

    fn device(&self) -> &Self::Device;
    fn dtype(&self) -> DType;
    /// Size of the whole buffer in bytes (what a view of it keeps alive).
    fn buffer_bytes(&self) -> usize;
    /// Copies the buffer to host memory.
    fn to_cpu_storage(&self) -> Result<CpuStorage>;

    /// The elements of `layout`, packed row-major.
    fn copy_strided(&self, layout: &Layout) -> Result<Self>;
    /// Converts the elements; f32 to bf16 rounds to nearest even.
    fn to_dtype(&self, layout: &Layout, dtype: DType) -> Result<Self>;
    fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<Self>;
    /// x * mul + add.
    fn affine(&self, layout: &Layout, mul: f32, add: f32) -> Result<Self>;
    /// Both layouts have the same shape (broadcast already applied as strides).
    fn binary(
        &self,
        layout: &Layout,
        rhs: &Self,
        rhs_layout: &Layout,
        op: BinaryOp,
    ) -> Result<Self>;
    /// Reduces `axis`, keeping it with size 1.
    fn reduce(&self, layout: &Layout, op: ReduceOp, axis: usize) -> Result<Self>;
    /// Batched `[.., M, K] x [.., K, N]`; the batch dims are equal (stride 0
    /// where broadcast), the matrices may be transposed views.
    fn matmul(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout) -> Result<Self>;
    /// Concatenates along `axis`; shapes agree except on `axis`.
    fn concat(parts: &[(&Self, &Layout)], axis: usize) -> Result<Self>;
    fn softmax_last_dim(&self, layout: &Layout) -> Result<Self>;
    /// Normalizes each row of the last axis; returns `(y, rstd)` with rstd of
    /// shape `[.., 1]`. `rms` skips the mean subtraction (RMSNorm).
    fn norm_last_dim(&self, layout: &Layout, eps: f32, rms: bool) -> Result<(Self, Self)>;
    /// Rotates pairs (2i, 2i+1) of the last axis of x `[.., L, D]` by the
    /// angle whose cos and sin are the `[L, D/2]` tables.
    fn rope_interleaved(
        &self,
        layout: &Layout,
        cos: &Self,
        cos_layout: &Layout,
        sin: &Self,
        sin_layout: &Layout,
    ) -> Result<Self>;
}

/// A device that can hold storages.
pub trait BackendDevice: Sized + Clone + Send + Sync {
    type Storage: BackendStorage<Device = Self>;

    fn location(&self) -> Device;
    fn zeros(&self, shape: &Shape, dtype: DType) -> Result<Self::Storage>;
    /// Uploads host data.
    fn storage_from_cpu(&self, data: CpuStorage) -> Result<Self::Storage>;
}
