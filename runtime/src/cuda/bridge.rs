//! Tensors as packed device buffers and back, for the custom ops that call
//! GPU kernels directly (the quantized linears).

use super::{CudaDevice, CudaStorage, DevBuf};
use crate::backend::BackendStorage;
use crate::storage::Storage;
use crate::{DType, Error, Result, Shape, Tensor};

/// A tensor's elements in one packed device buffer: its own buffer when the
/// tensor already covers it exactly, else a packed copy.
pub(crate) enum Packed<'a> {
    Borrowed(&'a CudaStorage),
    Owned(CudaStorage),
}

impl Packed<'_> {
    pub(crate) fn buf(&self) -> &DevBuf {
        match self {
            Packed::Borrowed(s) => s.buffer(),
            Packed::Owned(s) => s.buffer(),
        }
    }

    pub(crate) fn device(&self) -> &CudaDevice {
        match self {
            Packed::Borrowed(s) => s.device(),
            Packed::Owned(s) => s.device(),
        }
    }
}

/// The packed device buffer of `t`, which must be on a GPU.
pub(crate) fn packed(t: &Tensor) -> Result<Packed<'_>> {
    let Storage::Cuda(s) = t.storage() else {
        return Err(Error::InvalidOption(format!(
            "expected a tensor on a GPU, got one on {}",
            t.device()
        )));
    };
    let n = t.elem_count();
    if t.layout().contiguous_range() == Some(0..n) && s.len() == n {
        return Ok(Packed::Borrowed(s));
    }
    match t.storage().copy_strided(t.layout())? {
        Storage::Cuda(c) => Ok(Packed::Owned(c)),
        _ => Err(Error::Backend(
            "a GPU copy came back on another device".into(),
        )),
    }
}

/// Wrap a packed device buffer of `dtype` as an untracked tensor.
pub(crate) fn tensor_from_buffer(
    device: &CudaDevice,
    buf: DevBuf,
    dtype: DType,
    dims: &[usize],
) -> Result<Tensor> {
    let shape = Shape::new(dims.to_vec());
    let n = shape.elem_count();
    if buf.len_bytes() < n * dtype.size_in_bytes() {
        return Err(Error::Backend(format!(
            "a GPU result of {} bytes cannot hold {n} {dtype} values",
            buf.len_bytes()
        )));
    }
    Ok(Tensor::untracked(
        Storage::Cuda(CudaStorage::from_buffer(buf, dtype, n, device.clone())),
        shape,
    ))
}
