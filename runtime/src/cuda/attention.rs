//! Fused attention on CUDA ([`AttentionBackend`]). For now it runs the CPU
//! backend's tiled kernels on host copies and uploads the results: correct,
//! O(L) in memory, and slow; the GPU kernels replace this.

use crate::backend::{
    AttentionBackend, AttentionSaved, AttentionShape, BackendDevice, BackendStorage,
};
use crate::cpu::CpuStorage;
use crate::Result;

use super::CudaStorage;

impl AttentionBackend for CudaStorage {
    fn attention_forward(
        q: &Self,
        k: &Self,
        v: &Self,
        shape: AttentionShape,
        scale: f32,
    ) -> Result<(Self, Self)> {
        let (o, lse) = CpuStorage::attention_forward(
            &q.to_cpu_storage()?,
            &k.to_cpu_storage()?,
            &v.to_cpu_storage()?,
            shape,
            scale,
        )?;
        let dev = q.device();
        Ok((dev.storage_from_cpu(o)?, dev.storage_from_cpu(lse)?))
    }

    fn attention_backward(
        saved: AttentionSaved<'_, Self>,
        d_o: &Self,
        shape: AttentionShape,
        scale: f32,
    ) -> Result<(Self, Self, Self)> {
        let host = [saved.q, saved.k, saved.v, saved.o, saved.lse].map(|s| s.to_cpu_storage());
        let [q, k, v, o, lse] = host;
        let (q, k, v, o, lse) = (q?, k?, v?, o?, lse?);
        let saved_cpu = AttentionSaved {
            q: &q,
            k: &k,
            v: &v,
            o: &o,
            lse: &lse,
        };
        let (dq, dk, dv) =
            CpuStorage::attention_backward(saved_cpu, &d_o.to_cpu_storage()?, shape, scale)?;
        let dev = d_o.device();
        Ok((
            dev.storage_from_cpu(dq)?,
            dev.storage_from_cpu(dk)?,
            dev.storage_from_cpu(dv)?,
        ))
    }
}
