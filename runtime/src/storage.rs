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

use std::borrow::Cow;

use crate::backend::{
    AdamWScalars, AdamWStep, AttentionBackend, AttentionSaved, AttentionShape, BackendDevice,
    BackendStorage, DeviceStatus, LinearBackend, MemoryStats, OptimBackend, Packed,
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
    /// An NVIDIA GPU buffer (never built without the `cuda` feature).
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
            Device::Cuda(i) => Ok(Storage::Cuda(CudaDevice::get(*i)?.storage_from_cpu(data)?)),
            _ => Err(unavailable(device)),
        }
    }

    pub(crate) fn zeros(shape: &Shape, dtype: DType, device: &Device) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(CpuDevice.zeros(shape, dtype)?)),
            Device::Cuda(i) => Ok(Storage::Cuda(CudaDevice::get(*i)?.zeros(shape, dtype)?)),
            _ => Err(unavailable(device)),
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

fn attention_forward_on<B: AttentionBackend + Variant>(
    (q, k, v): (View, View, View),
    shape: AttentionShape,
    scale: f32,
) -> Result<(Storage, Storage)> {
    let op = "attention";
    let (pq, pk, pv) = (
        packed::<B>(op, q.0, q)?,
        packed::<B>(op, q.0, k)?,
        packed::<B>(op, q.0, v)?,
    );
    let (o, lse) = B::attention_forward(&pq, &pk, &pv, shape, scale)?;
    Ok((o.wrap(), lse.wrap()))
}

fn attention_backward_on<B: AttentionBackend + Variant>(
    saved: [View; 5],
    d_o: View,
    shape: AttentionShape,
    scale: f32,
) -> Result<(Storage, Storage, Storage)> {
    let op = "attention backward";
    let first = saved[0].0;
    let [q, k, v, o, lse] = saved.map(|s| packed::<B>(op, first, s));
    let (q, k, v, o, lse) = (q?, k?, v?, o?, lse?);
    let d_o = packed::<B>(op, first, d_o)?;
    let saved = AttentionSaved {
        q: &*q,
        k: &*k,
        v: &*v,
        o: &*o,
        lse: &*lse,
    };
    let (dq, dk, dv) = B::attention_backward(saved, &d_o, shape, scale)?;
    Ok((dq.wrap(), dk.wrap(), dv.wrap()))
}

impl Storage {
    /// Fused attention's forward ([`AttentionBackend::attention_forward`])
    /// on the backend holding q; k and v must be on the same device and in
    /// q's dtype.
    pub(crate) fn attention_forward(
        q: View,
        k: View,
        v: View,
        shape: AttentionShape,
        scale: f32,
    ) -> Result<(Storage, Storage)> {
        let _p = crate::profile::scope("attention forward", q.0.device());
        q.0.same_dtype(k.0, "attention")?;
        q.0.same_dtype(v.0, "attention")?;
        match q.0 {
            Storage::Cpu(_) => attention_forward_on::<CpuStorage>((q, k, v), shape, scale),
            Storage::Cuda(_) => attention_forward_on::<CudaStorage>((q, k, v), shape, scale),
        }
    }

    /// Fused attention's backward from the saved q, k, v, o and
    /// log-sum-exp (in that order) and dO.
    pub(crate) fn attention_backward(
        saved: [View; 5],
        d_o: View,
        shape: AttentionShape,
        scale: f32,
    ) -> Result<(Storage, Storage, Storage)> {
        let _p = crate::profile::scope("attention backward", d_o.0.device());
        d_o.0.same_dtype(saved[0].0, "attention backward")?;
        match saved[0].0 {
            Storage::Cpu(_) => attention_backward_on::<CpuStorage>(saved, d_o, shape, scale),
            Storage::Cuda(_) => attention_backward_on::<CudaStorage>(saved, d_o, shape, scale),
        }
    }
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
        Device::Cuda(i) => CudaDevice::get(*i).is_ok(),
        _ => false,
    }
}

/// Free and total bytes of a device's own memory; `None` on the CPU.
pub(crate) fn memory_info(device: &Device) -> Result<Option<(u64, u64)>> {
    match device {
        Device::Cpu => Ok(None),
        Device::Cuda(i) => CudaDevice::get(*i)?.memory_info().map(Some),
        _ => Err(unavailable(device)),
    }
}

/// Allocator counts of a device that is open; `None` on the CPU.
pub(crate) fn memory_stats(device: &Device) -> Option<MemoryStats> {
    match device {
        Device::Cuda(i) => CudaDevice::get(*i).ok().map(|d| d.memory_stats()),
        _ => None,
    }
}

/// Waits until the device has finished the work queued so far.
pub(crate) fn synchronize(device: &Device) -> Result<()> {
    match device {
        Device::Cuda(i) => CudaDevice::get(*i)?.synchronize(),
        _ => Ok(()),
    }
}

fn unavailable(device: &Device) -> Error {
    Error::DeviceUnavailable {
        device: device.to_string(),
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

// ---------------------------------------------------------------------------
// Multi-tensor optimizer dispatch (issue 14): AdamW over many parameters and
// the gradient norm's sum of squares and scaling over many gradients, each a
// few launches per device ([`crate::backend::MultiOptimBackend`]).

/// One parameter of a multi-tensor AdamW step.
pub(crate) struct AdamWEntry<'a> {
    /// The parameter's storage and view.
    pub(crate) w: View<'a>,
    /// The gradient's storage and view, on the parameter's device.
    pub(crate) grad: View<'a>,
    /// The f32 first moment, packed, updated in place.
    pub(crate) m: &'a mut Storage,
    /// The f32 second moment, packed, updated in place.
    pub(crate) v: &'a mut Storage,
    /// This parameter's step scalars.
    pub(crate) scalars: &'a AdamWScalars,
}

impl Storage {
    /// AdamW steps of many parameters of one device (the backend's
    /// `adamw_multi`): the new parameters in order, each with the bits of
    /// [`Storage::adamw_step`]; an empty list is no work.
    pub(crate) fn adamw_multi(entries: Vec<AdamWEntry<'_>>) -> Result<Vec<Storage>> {
        let Some(first) = entries.first().map(|e| e.w.0) else {
            return Ok(Vec::new());
        };
        let _p = crate::profile::scope("adamw multi", first.device());
        match first {
            Storage::Cpu(_) => adamw_multi_on::<CpuStorage>(first, entries),
            Storage::Cuda(_) => adamw_multi_on::<CudaStorage>(first, entries),
        }
    }

    /// The f64 sum of the squares of every element of `grads`, all on one
    /// device (the backend's `sum_squares`); 0 for none.
    pub(crate) fn sum_squares(grads: &[View<'_>]) -> Result<f64> {
        let Some(&(first, _)) = grads.first() else {
            return Ok(0.0);
        };
        let _p = crate::profile::scope("grad sum of squares", first.device());
        match first {
            Storage::Cpu(_) => grads_on::<CpuStorage, _>(first, grads, |g| {
                <CpuStorage as crate::backend::MultiOptimBackend>::sum_squares(g)
            }),
            Storage::Cuda(_) => grads_on::<CudaStorage, _>(first, grads, |g| {
                <CudaStorage as crate::backend::MultiOptimBackend>::sum_squares(g)
            }),
        }
    }

    /// Every gradient of `grads` (one device) times `mul`, with the bits of
    /// `affine(mul, 0)`, packed, in order.
    pub(crate) fn scale_all(grads: &[View<'_>], mul: f32) -> Result<Vec<Storage>> {
        let Some(&(first, _)) = grads.first() else {
            return Ok(Vec::new());
        };
        let _p = crate::profile::scope("grad scale", first.device());
        match first {
            Storage::Cpu(_) => grads_on::<CpuStorage, _>(first, grads, |g| {
                let v = <CpuStorage as crate::backend::MultiOptimBackend>::scale_all(g, mul)?;
                Ok(v.into_iter().map(Variant::wrap).collect())
            }),
            Storage::Cuda(_) => grads_on::<CudaStorage, _>(first, grads, |g| {
                let v = <CudaStorage as crate::backend::MultiOptimBackend>::scale_all(g, mul)?;
                Ok(v.into_iter().map(Variant::wrap).collect())
            }),
        }
    }
}

/// `f` on the views of `grads` as storages of backend `B` on `first`'s device.
fn grads_on<B: Variant, T>(
    first: &Storage,
    grads: &[View<'_>],
    f: impl FnOnce(&[(&B, &Layout)]) -> Result<T>,
) -> Result<T> {
    let views = grads
        .iter()
        .map(|&(s, l)| Ok((same::<B>("gradient norm", first, s)?, l)))
        .collect::<Result<Vec<(&B, &Layout)>>>()?;
    f(&views)
}

fn adamw_multi_on<'a, B: crate::backend::MultiOptimBackend + Variant>(
    first: &Storage,
    entries: Vec<AdamWEntry<'a>>,
) -> Result<Vec<Storage>> {
    let mut steps = Vec::with_capacity(entries.len());
    for e in entries {
        let w = same::<B>("AdamW", first, e.w.0)?;
        let g = same::<B>("AdamW", first, e.grad.0)?;
        let (m_dev, v_dev) = (e.m.device(), e.v.device());
        let on_device = m_dev == first.device() && v_dev == first.device();
        let (Some(m), Some(v), true) = (B::of_mut(e.m), B::of_mut(e.v), on_device) else {
            return Err(Error::InvalidOption(format!(
                "AdamW: moments on {m_dev} and {v_dev} for a parameter on {}",
                first.device()
            )));
        };
        let step = AdamWStep {
            layout: e.w.1,
            grad: g,
            grad_layout: e.grad.1,
            m,
            v,
            scalars: e.scalars,
        };
        steps.push((w, step));
    }
    Ok(B::adamw_multi(steps)?.into_iter().map(B::wrap).collect())
}

// The fused modulation ops (`crate::ops::fused`, [`FusedBackend`]).
use crate::backend::{FusedBackend, ModNormSaved, ModShape, RmsRopeSaved, RopeShape};

/// `views` packed, as storages of backend `B` on the device of the first.
fn packed_all<'a, B: BackendStorage + Variant, const N: usize>(
    op: &str,
    views: [View<'a>; N],
) -> Result<[Packed<'a, B>; N]> {
    let first = views[0].0;
    let mut out = Vec::with_capacity(N);
    for v in views {
        first.same_dtype(v.0, op)?;
        out.push(packed::<B>(op, first, v)?);
    }
    Ok(out
        .try_into()
        .unwrap_or_else(|_| unreachable!("N views give N packed")))
}

fn modulated_norm_on<B: FusedBackend + Variant>(
    views: [View; 3],
    shape: ModShape,
    eps: f32,
) -> Result<(Storage, Storage, Storage)> {
    let [x, shift, scale] = packed_all::<B, 3>("modulated_layer_norm", views)?;
    let (y, mean, rstd) = B::modulated_norm(&x, &shift, &scale, shape, eps)?;
    Ok((y.wrap(), mean.wrap(), rstd.wrap()))
}

fn modulated_norm_backward_on<B: FusedBackend + Variant>(
    [x, scale, mean, rstd]: [View; 4],
    g: View,
    shape: ModShape,
) -> Result<(Storage, Storage, Storage)> {
    let op = "modulated_layer_norm backward";
    let [x, scale, g] = packed_all::<B, 3>(op, [x, scale, g])?;
    let [mean, rstd] = packed_all::<B, 2>(op, [mean, rstd])?;
    let saved = ModNormSaved {
        x: &*x,
        scale: &*scale,
        mean: &*mean,
        rstd: &*rstd,
    };
    let (dx, dshift, dscale) = B::modulated_norm_backward(saved, &g, shape)?;
    Ok((dx.wrap(), dshift.wrap(), dscale.wrap()))
}

fn gated_add_on<B: FusedBackend + Variant>(views: [View; 3], shape: ModShape) -> Result<Storage> {
    let [x, gate, y] = packed_all::<B, 3>("gated_residual", views)?;
    Ok(B::gated_add(&x, &gate, &y, shape)?.wrap())
}

fn gated_add_dgate_on<B: FusedBackend + Variant>(
    views: [View; 2],
    shape: ModShape,
) -> Result<Storage> {
    let [g, y] = packed_all::<B, 2>("gated_residual backward", views)?;
    Ok(B::gated_add_dgate(&g, &y, shape)?.wrap())
}

fn rms_norm_rope_on<B: FusedBackend + Variant>(
    [x, weight, cos, sin]: [View; 4],
    shape: RopeShape,
    eps: f32,
) -> Result<(Storage, Storage)> {
    let op = "rms_norm_rope";
    let first = x.0;
    let [x, cos, sin] = packed_all::<B, 3>(op, [x, cos, sin])?;
    let weight = packed::<B>(op, first, weight)?;
    let (y, rstd) = B::rms_norm_rope(&x, &weight, [&cos, &sin], shape, eps)?;
    Ok((y.wrap(), rstd.wrap()))
}

fn rms_norm_rope_backward_on<B: FusedBackend + Variant>(
    [x, weight, cos, sin, rstd]: [View; 5],
    g: View,
    shape: RopeShape,
) -> Result<(Storage, Storage)> {
    let op = "rms_norm_rope backward";
    let first = x.0;
    let [x, cos, sin, g] = packed_all::<B, 4>(op, [x, cos, sin, g])?;
    let (weight, rstd) = (
        packed::<B>(op, first, weight)?,
        packed::<B>(op, first, rstd)?,
    );
    let saved = RmsRopeSaved {
        x: &*x,
        weight: &*weight,
        tables: [&*cos, &*sin],
        rstd: &*rstd,
    };
    let (dx, dw) = B::rms_norm_rope_backward(saved, &g, shape)?;
    Ok((dx.wrap(), dw.wrap()))
}

impl Storage {
    /// [`FusedBackend::rms_norm_rope`] of x, the f32 weight and the cos and
    /// sin tables (in that order; the tables in x's dtype): (out, rstd).
    pub(crate) fn rms_norm_rope(
        views: [View; 4],
        shape: RopeShape,
        eps: f32,
    ) -> Result<(Storage, Storage)> {
        let _p = crate::profile::scope("fused rms norm rope", views[0].0.device());
        match views[0].0 {
            Storage::Cpu(_) => rms_norm_rope_on::<CpuStorage>(views, shape, eps),
            Storage::Cuda(_) => rms_norm_rope_on::<CudaStorage>(views, shape, eps),
        }
    }

    /// [`FusedBackend::rms_norm_rope_backward`] from the saved x, weight,
    /// cos, sin and rstd (in that order) and the gradient g: (dx, dweight).
    pub(crate) fn rms_norm_rope_backward(
        saved: [View; 5],
        g: View,
        shape: RopeShape,
    ) -> Result<(Storage, Storage)> {
        let _p = crate::profile::scope("fused rms norm rope backward", g.0.device());
        match saved[0].0 {
            Storage::Cpu(_) => rms_norm_rope_backward_on::<CpuStorage>(saved, g, shape),
            Storage::Cuda(_) => rms_norm_rope_backward_on::<CudaStorage>(saved, g, shape),
        }
    }
}

impl Storage {
    /// [`FusedBackend::modulated_norm`] of x, shift and scale (in that
    /// order; one device, one dtype) on the backend holding x:
    /// (out, mean, rstd).
    pub(crate) fn modulated_norm(
        views: [View; 3],
        shape: ModShape,
        eps: f32,
    ) -> Result<(Storage, Storage, Storage)> {
        let _p = crate::profile::scope("fused modulated norm", views[0].0.device());
        match views[0].0 {
            Storage::Cpu(_) => modulated_norm_on::<CpuStorage>(views, shape, eps),
            Storage::Cuda(_) => modulated_norm_on::<CudaStorage>(views, shape, eps),
        }
    }

    /// [`FusedBackend::modulated_norm_backward`] from the saved x, scale,
    /// mean and rstd (in that order) and the gradient g: (dx, dshift, dscale).
    pub(crate) fn modulated_norm_backward(
        saved: [View; 4],
        g: View,
        shape: ModShape,
    ) -> Result<(Storage, Storage, Storage)> {
        let _p = crate::profile::scope("fused modulated norm backward", g.0.device());
        match saved[0].0 {
            Storage::Cpu(_) => modulated_norm_backward_on::<CpuStorage>(saved, g, shape),
            Storage::Cuda(_) => modulated_norm_backward_on::<CudaStorage>(saved, g, shape),
        }
    }

    /// [`FusedBackend::gated_add`] of x, gate and y (in that order).
    pub(crate) fn gated_add(views: [View; 3], shape: ModShape) -> Result<Storage> {
        let _p = crate::profile::scope("fused gated add", views[0].0.device());
        match views[0].0 {
            Storage::Cpu(_) => gated_add_on::<CpuStorage>(views, shape),
            Storage::Cuda(_) => gated_add_on::<CudaStorage>(views, shape),
        }
    }

    /// [`FusedBackend::gated_add_dgate`] of g and y (in that order).
    pub(crate) fn gated_add_dgate(views: [View; 2], shape: ModShape) -> Result<Storage> {
        let _p = crate::profile::scope("fused gated add backward", views[0].0.device());
        match views[0].0 {
            Storage::Cpu(_) => gated_add_dgate_on::<CpuStorage>(views, shape),
            Storage::Cuda(_) => gated_add_dgate_on::<CudaStorage>(views, shape),
        }
    }
}

impl Storage {
    /// [`Storage::adamw_multi`] with every gradient element multiplied by
    /// `grad_mul` as the update reads it (the backend's
    /// `adamw_multi_scaled`): the bits of scaling the gradients with
    /// [`Storage::scale_all`] first, without the scaling pass.
    pub(crate) fn adamw_multi_scaled(
        entries: Vec<AdamWEntry<'_>>,
        grad_mul: f32,
    ) -> Result<Vec<Storage>> {
        let Some(first) = entries.first().map(|e| e.w.0) else {
            return Ok(Vec::new());
        };
        let _p = crate::profile::scope("adamw multi", first.device());
        match first {
            Storage::Cpu(_) => adamw_multi_scaled_on::<CpuStorage>(first, entries, grad_mul),
            Storage::Cuda(_) => adamw_multi_scaled_on::<CudaStorage>(first, entries, grad_mul),
        }
    }
}

fn adamw_multi_scaled_on<'a, B: crate::backend::ScaledAdamWBackend + Variant>(
    first: &Storage,
    entries: Vec<AdamWEntry<'a>>,
    grad_mul: f32,
) -> Result<Vec<Storage>> {
    let mut steps = Vec::with_capacity(entries.len());
    for e in entries {
        let w = same::<B>("AdamW", first, e.w.0)?;
        let g = same::<B>("AdamW", first, e.grad.0)?;
        let (m_dev, v_dev) = (e.m.device(), e.v.device());
        let on_device = m_dev == first.device() && v_dev == first.device();
        let (Some(m), Some(v), true) = (B::of_mut(e.m), B::of_mut(e.v), on_device) else {
            return Err(Error::InvalidOption(format!(
                "AdamW: moments on {m_dev} and {v_dev} for a parameter on {}",
                first.device()
            )));
        };
        let step = AdamWStep {
            layout: e.w.1,
            grad: g,
            grad_layout: e.grad.1,
            m,
            v,
            scalars: e.scalars,
        };
        steps.push((w, step));
    }
    Ok(B::adamw_multi_scaled(steps, grad_mul)?
        .into_iter()
        .map(B::wrap)
        .collect())
}
