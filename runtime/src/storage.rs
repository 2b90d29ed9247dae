//! The single dispatch from an op to the backend that holds the data.
//!
//! Every op checks here that its operands share a device and dtype, then
//! forwards to one [`BackendStorage`] implementation. A GPU backend adds a
//! variant and one arm per method. Storage is not `Clone`: a copy may fail on
//! a device that is out of memory, so copies are explicit and fallible.

use crate::backend::{BackendDevice, BackendStorage};
use crate::cpu::{CpuDevice, CpuStorage};
#[cfg(feature = "cuda")]
use crate::cuda::{CudaDevice, CudaStorage};
use crate::op::{BinaryOp, ReduceOp, UnaryOp};
use crate::{DType, Device, Error, Layout, Result, Shape};

/// A tensor's buffer on its device.
pub enum Storage {
    Cpu(CpuStorage),
    #[cfg(feature = "cuda")]
    Cuda(CudaStorage),
}

impl Storage {
    /// Places host data on `device`; devices without a backend are an error.
    pub(crate) fn from_cpu(data: CpuStorage, device: &Device) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(CpuDevice.storage_from_cpu(data)?)),
            #[cfg(feature = "cuda")]
            Device::Cuda(i) => Ok(Storage::Cuda(CudaDevice::get(*i)?.storage_from_cpu(data)?)),
            _ => Err(unavailable(device)),
        }
    }

    pub(crate) fn zeros(shape: &Shape, dtype: DType, device: &Device) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(CpuDevice.zeros(shape, dtype)?)),
            #[cfg(feature = "cuda")]
            Device::Cuda(i) => Ok(Storage::Cuda(CudaDevice::get(*i)?.zeros(shape, dtype)?)),
            _ => Err(unavailable(device)),
        }
    }

    pub fn device(&self) -> Device {
        match self {
            Storage::Cpu(s) => s.device().location(),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s.device().location(),
        }
    }

    pub fn dtype(&self) -> DType {
        match self {
            Storage::Cpu(s) => s.dtype(),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s.dtype(),
        }
    }

    pub(crate) fn buffer_bytes(&self) -> usize {
        match self {
            Storage::Cpu(s) => s.buffer_bytes(),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s.buffer_bytes(),
        }
    }

    /// Host data, moved out without a copy when it is already on the host.
    pub(crate) fn into_cpu_storage(self) -> Result<CpuStorage> {
        match self {
            Storage::Cpu(s) => Ok(s),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s.to_cpu_storage(),
        }
    }

    /// Rejects operands of different dtypes (no silent promotion).
    fn same_dtype(&self, rhs: &Storage, op: &str) -> Result<()> {
        if self.dtype() != rhs.dtype() {
            return Err(Error::DType(format!(
                "{op}: operands have different dtypes ({} and {}); cast one with to_dtype",
                self.dtype(),
                rhs.dtype()
            )));
        }
        Ok(())
    }

    pub(crate) fn copy_strided(&self, layout: &Layout) -> Result<Storage> {
        let _p = crate::profile::scope("copy_strided", self.device());
        match self {
            Storage::Cpu(s) => Ok(Storage::Cpu(s.copy_strided(layout)?)),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => Ok(Storage::Cuda(s.copy_strided(layout)?)),
        }
    }

    pub(crate) fn to_dtype(&self, layout: &Layout, dtype: DType) -> Result<Storage> {
        let _p = crate::profile::scope("to_dtype", self.device());
        match self {
            Storage::Cpu(s) => Ok(Storage::Cpu(s.to_dtype(layout, dtype)?)),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => Ok(Storage::Cuda(s.to_dtype(layout, dtype)?)),
        }
    }

    pub(crate) fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<Storage> {
        let _p = crate::profile::scope("unary", self.device());
        match self {
            Storage::Cpu(s) => Ok(Storage::Cpu(s.unary(layout, op)?)),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => Ok(Storage::Cuda(s.unary(layout, op)?)),
        }
    }

    pub(crate) fn affine(&self, layout: &Layout, mul: f32, add: f32) -> Result<Storage> {
        let _p = crate::profile::scope("affine", self.device());
        match self {
            Storage::Cpu(s) => Ok(Storage::Cpu(s.affine(layout, mul, add)?)),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => Ok(Storage::Cuda(s.affine(layout, mul, add)?)),
        }
    }

    pub(crate) fn binary(
        &self,
        layout: &Layout,
        rhs: &Storage,
        rhs_layout: &Layout,
        op: BinaryOp,
    ) -> Result<Storage> {
        let _p = crate::profile::scope("binary", self.device());
        self.same_dtype(rhs, op.name())?;
        match (self, rhs) {
            (Storage::Cpu(a), Storage::Cpu(b)) => {
                Ok(Storage::Cpu(a.binary(layout, b, rhs_layout, op)?))
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(a), Storage::Cuda(b)) => {
                Ok(Storage::Cuda(a.binary(layout, b, rhs_layout, op)?))
            }
            #[cfg(feature = "cuda")]
            (a, b) => Err(mixed(op.name(), a, b)),
        }
    }

    pub(crate) fn reduce(&self, layout: &Layout, op: ReduceOp, axis: usize) -> Result<Storage> {
        let _p = crate::profile::scope("reduce", self.device());
        match self {
            Storage::Cpu(s) => Ok(Storage::Cpu(s.reduce(layout, op, axis)?)),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => Ok(Storage::Cuda(s.reduce(layout, op, axis)?)),
        }
    }

    pub(crate) fn matmul(
        &self,
        layout: &Layout,
        rhs: &Storage,
        rhs_layout: &Layout,
    ) -> Result<Storage> {
        let _p = crate::profile::scope("matmul", self.device());
        self.same_dtype(rhs, "matmul")?;
        match (self, rhs) {
            (Storage::Cpu(a), Storage::Cpu(b)) => {
                Ok(Storage::Cpu(a.matmul(layout, b, rhs_layout)?))
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(a), Storage::Cuda(b)) => {
                Ok(Storage::Cuda(a.matmul(layout, b, rhs_layout)?))
            }
            #[cfg(feature = "cuda")]
            (a, b) => Err(mixed("matmul", a, b)),
        }
    }

    pub(crate) fn concat(parts: &[(&Storage, &Layout)], axis: usize) -> Result<Storage> {
        let _p = parts
            .first()
            .and_then(|(p, _)| crate::profile::scope("concat", p.device()));
        let (first, _) = parts[0];
        for (s, _) in &parts[1..] {
            first.same_dtype(s, "concat")?;
        }
        match first {
            Storage::Cpu(_) => {
                let cpu = parts
                    .iter()
                    .map(|&(s, l)| match s {
                        Storage::Cpu(c) => Ok((c, l)),
                        #[cfg(feature = "cuda")]
                        other => Err(mixed("concat", first, other)),
                    })
                    .collect::<Result<Vec<(&CpuStorage, &Layout)>>>()?;
                Ok(Storage::Cpu(CpuStorage::concat(&cpu, axis)?))
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => {
                let gpu = parts
                    .iter()
                    .map(|&(s, l)| match s {
                        Storage::Cuda(c) => Ok((c, l)),
                        other => Err(mixed("concat", first, other)),
                    })
                    .collect::<Result<Vec<(&CudaStorage, &Layout)>>>()?;
                Ok(Storage::Cuda(CudaStorage::concat(&gpu, axis)?))
            }
        }
    }

    pub(crate) fn softmax_last_dim(&self, layout: &Layout) -> Result<Storage> {
        let _p = crate::profile::scope("softmax", self.device());
        match self {
            Storage::Cpu(s) => Ok(Storage::Cpu(s.softmax_last_dim(layout)?)),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => Ok(Storage::Cuda(s.softmax_last_dim(layout)?)),
        }
    }

    pub(crate) fn norm_last_dim(
        &self,
        layout: &Layout,
        eps: f32,
        rms: bool,
    ) -> Result<(Storage, Storage)> {
        let _p = crate::profile::scope("norm", self.device());
        match self {
            Storage::Cpu(s) => {
                let (y, rstd) = s.norm_last_dim(layout, eps, rms)?;
                Ok((Storage::Cpu(y), Storage::Cpu(rstd)))
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => {
                let (y, rstd) = s.norm_last_dim(layout, eps, rms)?;
                Ok((Storage::Cuda(y), Storage::Cuda(rstd)))
            }
        }
    }

    pub(crate) fn rope_interleaved(
        &self,
        layout: &Layout,
        cos: (&Storage, &Layout),
        sin: (&Storage, &Layout),
    ) -> Result<Storage> {
        let _p = crate::profile::scope("rope", self.device());
        self.same_dtype(cos.0, "rope_interleaved")?;
        self.same_dtype(sin.0, "rope_interleaved")?;
        match (self, cos.0, sin.0) {
            (Storage::Cpu(x), Storage::Cpu(c), Storage::Cpu(s)) => Ok(Storage::Cpu(
                x.rope_interleaved(layout, c, cos.1, s, sin.1)?,
            )),
            #[cfg(feature = "cuda")]
            (Storage::Cuda(x), Storage::Cuda(c), Storage::Cuda(s)) => Ok(Storage::Cuda(
                x.rope_interleaved(layout, c, cos.1, s, sin.1)?,
            )),
            #[cfg(feature = "cuda")]
            (x, c, s) => Err(if x.device() != c.device() {
                mixed("rope_interleaved", x, c)
            } else {
                mixed("rope_interleaved", x, s)
            }),
        }
    }
}

fn unavailable(device: &Device) -> Error {
    Error::DeviceUnavailable {
        device: device.to_string(),
    }
}

/// Operands on different devices: move one with `to_device` first.
#[cfg(feature = "cuda")]
fn mixed(op: &str, a: &Storage, b: &Storage) -> Error {
    Error::InvalidOption(format!(
        "{op}: operands are on different devices ({} and {}); move one with to_device",
        a.device(),
        b.device()
    ))
}
