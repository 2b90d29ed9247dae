//! The fused modulation ops' dispatch (`crate::ops::fused`, [`FusedBackend`]).

use crate::backend::{
    BackendStorage, FusedBackend, ModNormSaved, ModShape, Packed, RmsRopeSaved, RopeShape,
};

use super::{packed, CpuStorage, CudaStorage, Storage, Variant, View};
use crate::Result;

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
