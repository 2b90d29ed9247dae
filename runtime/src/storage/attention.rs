//! The fused attention dispatch ([`AttentionBackend`]).

use crate::backend::{AttentionBackend, AttentionSaved, AttentionShape};

use super::{packed, CpuStorage, CudaStorage, Storage, Variant, View};
use crate::Result;

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
