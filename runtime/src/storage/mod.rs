//! The single dispatch from an op to the backend that holds the data.
//!
//! Every op checks here that its operands share a device and dtype, then
//! forwards to one [`BackendStorage`] implementation; the quantized linear,
//! AdamW and the device queries (availability, memory, synchronization)
//! dispatch here too, and nowhere else. A GPU backend adds a variant and one
//! arm per method. A build without the `cuda` feature compiles against a
//! `cuda` module whose devices cannot be opened, so no `cfg` is needed here.
//! Storage is not `Clone`: a copy may fail on a device that is out of
//! memory, so copies are explicit and fallible.
//!
//! This file holds the ops, the quantized linear and the device queries; the
//! fused attention, the fused modulation ops and the multi-tensor optimizer
//! dispatch in `attention.rs`, `fused.rs` and `optim.rs` beside it.

use std::borrow::Cow;

mod attention;
mod fused;
mod optim;

pub(crate) use optim::AdamWEntry;

use crate::backend::{
    AdamWScalars, AdamWStep, BackendDevice, BackendStorage, DeviceStatus, LinearBackend,
    MemoryStats, OptimBackend, Packed,
};
use crate::cpu::{CpuDevice, CpuStorage};
use crate::cuda::{CudaDevice, CudaStorage};
use crate::op::{BinaryOp, ReduceOp, UnaryOp};
use crate::qlinear::{self, Grads, LinearCall, Saved};
use crate::{DType, Device, Error, Layout, Result, Shape};

/// A tensor's buffer on its device.
pub enum Storage {
    /// Host memory, the reference backend.
    Cpu(CpuStorage),
    /// A GPU buffer: NVIDIA's, or AMD's over the HIP driver (never built
    /// without the `cuda` feature).
    Cuda(CudaStorage),
}

/// `$body` on the backend storage held by `$s`, timed as `$name`, its
/// result wrapped in the same variant: the one-operand dispatch.
macro_rules! map {
    ($name:literal, $s:expr, |$b:ident| $body:expr) => {{
        let _p = crate::profile::scope($name, $s.device());
        Ok(match $s {
            Storage::Cpu($b) => Storage::Cpu($body),
            Storage::Cuda($b) => Storage::Cuda($body),
        })
    }};
}

/// `$body` on the backend storages of `$a` and `$b`, which must be the
/// same backend's and dtype (`$op` names the op in errors), timed as
/// `$name`: the two-operand dispatch.
macro_rules! map2 {
    ($name:literal, $op:expr, $a:expr, $b:expr, |$x:ident, $y:ident| $body:expr) => {{
        let _p = crate::profile::scope($name, $a.device());
        $a.same_dtype($b, $op)?;
        Ok(match ($a, $b) {
            (Storage::Cpu($x), Storage::Cpu($y)) => Storage::Cpu($body),
            (Storage::Cuda($x), Storage::Cuda($y)) => Storage::Cuda($body),
            (a, b) => return Err(mixed($op, a, b)),
        })
    }};
}

impl Storage {
    /// Places host data on `device`; devices without a backend are an error.
    pub(crate) fn from_cpu(data: CpuStorage, device: &Device) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(CpuDevice.storage_from_cpu(data)?)),
            // Elsewhere the backend copies from the host buffer anyway.
            _ => Storage::from_host(&data, device),
        }
    }

    /// A copy of the host `data` on `device` (a CPU copy on the CPU).
    pub(crate) fn from_host(data: &CpuStorage, device: &Device) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(CpuDevice.storage_from_host(data)?)),
            gpu => Ok(Storage::Cuda(
                CudaDevice::open(*gpu)?.storage_from_host(data)?,
            )),
        }
    }

    pub(crate) fn zeros(shape: &Shape, dtype: DType, device: &Device) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(CpuDevice.zeros(shape, dtype)?)),
            gpu => Ok(Storage::Cuda(CudaDevice::open(*gpu)?.zeros(shape, dtype)?)),
        }
    }

    /// The device holding the buffer.
    pub fn device(&self) -> Device {
        match self {
            Storage::Cpu(s) => s.device().location(),
            Storage::Cuda(s) => s.device().location(),
        }
    }

    /// The element type of the buffer.
    pub fn dtype(&self) -> DType {
        match self {
            Storage::Cpu(s) => s.dtype(),
            Storage::Cuda(s) => s.dtype(),
        }
    }

    pub(crate) fn buffer_bytes(&self) -> usize {
        match self {
            Storage::Cpu(s) => s.buffer_bytes(),
            Storage::Cuda(s) => s.buffer_bytes(),
        }
    }

    /// Host data, moved out without a copy when it is already on the host.
    pub(crate) fn into_cpu_storage(self) -> Result<CpuStorage> {
        match self {
            Storage::Cpu(s) => Ok(s),
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
        map!("copy_strided", self, |s| s.copy_strided(layout)?)
    }

    pub(crate) fn to_dtype(&self, layout: &Layout, dtype: DType) -> Result<Storage> {
        map!("to_dtype", self, |s| s.to_dtype(layout, dtype)?)
    }

    pub(crate) fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<Storage> {
        map!("unary", self, |s| s.unary(layout, op)?)
    }

    pub(crate) fn affine(&self, layout: &Layout, mul: f32, add: f32) -> Result<Storage> {
        map!("affine", self, |s| s.affine(layout, mul, add)?)
    }

    pub(crate) fn binary(
        &self,
        layout: &Layout,
        rhs: &Storage,
        rhs_layout: &Layout,
        op: BinaryOp,
    ) -> Result<Storage> {
        map2!("binary", op.name(), self, rhs, |a, b| a
            .binary(layout, b, rhs_layout, op)?)
    }

    pub(crate) fn reduce(&self, layout: &Layout, op: ReduceOp, axis: usize) -> Result<Storage> {
        map!("reduce", self, |s| s.reduce(layout, op, axis)?)
    }

    pub(crate) fn matmul(
        &self,
        layout: &Layout,
        rhs: &Storage,
        rhs_layout: &Layout,
    ) -> Result<Storage> {
        map2!("matmul", "matmul", self, rhs, |a, b| a
            .matmul(layout, b, rhs_layout)?)
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
            Storage::Cpu(_) => concat_on::<CpuStorage>(first, parts, axis),
            Storage::Cuda(_) => concat_on::<CudaStorage>(first, parts, axis),
        }
    }

    pub(crate) fn softmax_last_dim(&self, layout: &Layout) -> Result<Storage> {
        map!("softmax", self, |s| s.softmax_last_dim(layout)?)
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
            (Storage::Cuda(x), Storage::Cuda(c), Storage::Cuda(s)) => Ok(Storage::Cuda(
                x.rope_interleaved(layout, c, cos.1, s, sin.1)?,
            )),
            (x, c, s) => Err(if x.device() != c.device() {
                mixed("rope_interleaved", x, c)
            } else {
                mixed("rope_interleaved", x, s)
            }),
        }
    }
}

/// A backend's own storage inside [`Storage`], for the dispatches that
/// hand several operands to one generic function.
trait Variant: Sized {
    fn of(s: &Storage) -> Option<&Self>;
    fn of_mut(s: &mut Storage) -> Option<&mut Self>;
    fn wrap(self) -> Storage;
}

/// [`Variant`] of the storage held by `Storage::$arm`.
macro_rules! variant {
    ($t:ty, $arm:ident) => {
        impl Variant for $t {
            fn of(s: &Storage) -> Option<&Self> {
                match s {
                    Storage::$arm(c) => Some(c),
                    _ => None,
                }
            }
            fn of_mut(s: &mut Storage) -> Option<&mut Self> {
                match s {
                    Storage::$arm(c) => Some(c),
                    _ => None,
                }
            }
            fn wrap(self) -> Storage {
                Storage::$arm(self)
            }
        }
    };
}

variant!(CpuStorage, Cpu);
variant!(CudaStorage, Cuda);

/// `s` as the backend storage of `first`, or the mixed-devices error.
fn same<'a, B: Variant>(op: &str, first: &Storage, s: &'a Storage) -> Result<&'a B> {
    match B::of(s) {
        Some(b) if s.device() == first.device() => Ok(b),
        _ => Err(mixed(op, first, s)),
    }
}

fn concat_on<B: BackendStorage + Variant>(
    first: &Storage,
    parts: &[(&Storage, &Layout)],
    axis: usize,
) -> Result<Storage> {
    let parts = parts
        .iter()
        .map(|&(s, l)| Ok((same::<B>("concat", first, s)?, l)))
        .collect::<Result<Vec<(&B, &Layout)>>>()?;
    Ok(B::concat(&parts, axis)?.wrap())
}

/// What a quantized linear's forward keeps, in the memory of the backend
/// that ran it.
pub enum SavedLinear {
    /// Kept by the CPU backend.
    Cpu(Box<Saved<CpuStorage>>),
    /// Kept on the GPU by the CUDA backend.
    Cuda(Box<Saved<CudaStorage>>),
}

impl SavedLinear {
    /// Bytes held (SPEC section 4's count).
    pub fn nbytes(&self) -> usize {
        match self {
            SavedLinear::Cpu(s) => s.nbytes(),
            SavedLinear::Cuda(s) => s.nbytes(),
        }
    }

    /// Elements of the saved tensors, before padding.
    pub fn elements(&self) -> usize {
        match self {
            SavedLinear::Cpu(s) => s.elements(),
            SavedLinear::Cuda(s) => s.elements(),
        }
    }
}

/// A tensor's storage and layout, as the linear dispatch takes its operands.
pub(crate) type View<'a> = (&'a Storage, &'a Layout);

/// `v` packed, as the storage of backend `B` on `first`'s device.
fn packed<'a, B: BackendStorage + Variant>(
    op: &str,
    first: &Storage,
    v: View<'a>,
) -> Result<Packed<'a, B>> {
    Packed::of(same::<B>(op, first, v.0)?, v.1)
}

fn linear_forward_on<B: LinearBackend + Variant>(
    call: &LinearCall,
    (x, w, b): (View, View, Option<View>),
) -> Result<(B, Saved<B>)> {
    let op = "linear";
    let b = b.map(|b| packed::<B>(op, x.0, b)).transpose()?;
    let (x, w) = (packed::<B>(op, x.0, x)?, packed::<B>(op, x.0, w)?);
    qlinear::forward(call, &x, &w, b.as_deref())
}

fn linear_backward_on<B: LinearBackend + Variant>(
    call: &LinearCall,
    saved: &Saved<B>,
    (w, dy): (Option<View>, View),
) -> Result<Grads<Storage>> {
    let op = "linear backward";
    let w = w.map(|w| packed::<B>(op, dy.0, w)).transpose()?;
    let dy = packed::<B>(op, dy.0, dy)?;
    let g = qlinear::backward(call, saved, w.as_deref(), &dy)?;
    Ok(Grads {
        dx: g.dx.wrap(),
        dw: g.dw.wrap(),
        db: g.db.map(B::wrap),
    })
}

fn adamw_on<B: OptimBackend + Variant>(
    w: (&B, &Layout),
    first: &Storage,
    grad: View,
    m: &mut Storage,
    v: &mut Storage,
    s: &AdamWScalars,
) -> Result<Storage> {
    let g = same::<B>("AdamW", first, grad.0)?;
    let (m_dev, v_dev) = (m.device(), v.device());
    let (Some(m), Some(v)) = (B::of_mut(m), B::of_mut(v)) else {
        return Err(Error::InvalidOption(format!(
            "AdamW: moments on {m_dev} and {v_dev} for a parameter on {}",
            first.device()
        )));
    };
    let step = AdamWStep {
        layout: w.1,
        grad: g,
        grad_layout: grad.1,
        m,
        v,
        scalars: s,
    };
    Ok(w.0.adamw_step(step)?.wrap())
}

impl Storage {
    /// The quantized linear's forward ([`qlinear::forward`]) on the backend
    /// holding x; W and b must be on the same device.
    pub(crate) fn linear_forward(
        call: &LinearCall,
        x: View,
        w: View,
        b: Option<View>,
    ) -> Result<(Storage, SavedLinear)> {
        let _p = crate::profile::scope("linear forward", x.0.device());
        let views = (x, w, b);
        match x.0 {
            Storage::Cpu(_) => linear_forward_on::<CpuStorage>(call, views)
                .map(|(y, saved)| (y.wrap(), SavedLinear::Cpu(Box::new(saved)))),
            Storage::Cuda(_) => linear_forward_on::<CudaStorage>(call, views)
                .map(|(y, saved)| (y.wrap(), SavedLinear::Cuda(Box::new(saved)))),
        }
    }

    /// The quantized linear's backward ([`qlinear::backward`]) on the
    /// backend that holds the saved tensors.
    pub(crate) fn linear_backward(
        call: &LinearCall,
        saved: &SavedLinear,
        w: Option<View>,
        dy: View,
    ) -> Result<Grads<Storage>> {
        let _p = crate::profile::scope("linear backward", dy.0.device());
        match saved {
            SavedLinear::Cpu(sv) => linear_backward_on(call, sv, (w, dy)),
            SavedLinear::Cuda(sv) => linear_backward_on(call, sv, (w, dy)),
        }
    }

    /// One AdamW step of the parameter in `self` (viewed by `layout`) on
    /// its device: the new parameter; the f32 moments `m` and `v`, which
    /// must be on the same device, are updated in place.
    pub(crate) fn adamw_step(
        &self,
        layout: &Layout,
        grad: View,
        m: &mut Storage,
        v: &mut Storage,
        s: &AdamWScalars,
    ) -> Result<Storage> {
        let _p = crate::profile::scope("adamw", self.device());
        match self {
            Storage::Cpu(w) => adamw_on((w, layout), self, grad, m, v, s),
            Storage::Cuda(w) => adamw_on((w, layout), self, grad, m, v, s),
        }
    }

    /// The f32 values of a packed f32 buffer on the host: borrowed there,
    /// downloaded from a device.
    pub(crate) fn host_f32(&self) -> Result<Cow<'_, [f32]>> {
        let host = match self {
            Storage::Cpu(CpuStorage::F32(v)) => return Ok(Cow::Borrowed(v)),
            Storage::Cpu(c) => c.clone(),
            Storage::Cuda(s) => s.to_cpu_storage()?,
        };
        match host {
            CpuStorage::F32(v) => Ok(Cow::Owned(v)),
            c => Err(Error::DType(format!(
                "expected f32 values, got {}",
                c.dtype()
            ))),
        }
    }
}

/// Whether this build can run tensors on `device`.
pub(crate) fn is_available(device: &Device) -> bool {
    match device {
        Device::Cpu => true,
        gpu => CudaDevice::open(*gpu).is_ok(),
    }
}

/// Free and total bytes of a device's own memory; `None` on the CPU.
pub(crate) fn memory_info(device: &Device) -> Result<Option<(u64, u64)>> {
    match device {
        Device::Cpu => Ok(None),
        gpu => CudaDevice::open(*gpu)?.memory_info().map(Some),
    }
}

/// Allocator counts of a device that is open; `None` on the CPU.
pub(crate) fn memory_stats(device: &Device) -> Option<MemoryStats> {
    match device {
        Device::Cpu => None,
        gpu => CudaDevice::open(*gpu).ok().map(|d| d.memory_stats()),
    }
}

/// Waits until the device has finished the work queued so far.
pub(crate) fn synchronize(device: &Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        gpu => CudaDevice::open(*gpu)?.synchronize(),
    }
}

/// Operands on different devices: move one with `to_device` first.
fn mixed(op: &str, a: &Storage, b: &Storage) -> Error {
    Error::InvalidOption(format!(
        "{op}: operands are on different devices ({} and {}); move one with to_device",
        a.device(),
        b.device()
    ))
}
