//! Data parallelism: the ranks of a run and what they exchange (SPEC
//! section 9).
//!
//! A run of `N` ranks is `N` processes, one per device, that `mxswitch
//! launch` starts with the variables of [`env`](mod@env). Each rank trains on its
//! slice of the global batch; after backward the gradients are summed over
//! the ranks in buckets ([`average_gradients`]) and divided by `N`, so every
//! rank takes the same optimizer step. Three [`Collective`]s move the data:
//! TCP on localhost for the CPU ([`tcp`]), NCCL through cudarc for CUDA and
//! RCCL for ROCm (module `gpu`, built with the `cuda` feature).

use std::fmt::Debug;

use crate::{DType, Device, Error, Gradients, ParamId, Result, Tensor};

#[cfg(feature = "cuda")]
pub mod gpu;
pub mod tcp;

/// The variables `mxswitch launch` sets for each rank.
pub mod env {
    /// This process's rank, `0..WORLD_SIZE`.
    pub const RANK: &str = "MXSWITCH_RANK";
    /// Number of ranks.
    pub const WORLD_SIZE: &str = "MXSWITCH_WORLD_SIZE";
    /// The device ordinal among the visible ones (the rank, on one host).
    pub const LOCAL_RANK: &str = "MXSWITCH_LOCAL_RANK";
    /// `HOST:PORT` where rank 0 listens for the others.
    pub const RENDEZVOUS: &str = "MXSWITCH_RENDEZVOUS";
    /// NCCL's (or RCCL's) 128-byte unique id, as hex: made once by the
    /// launcher so that every rank joins one communicator.
    pub const NCCL_ID: &str = "MXSWITCH_NCCL_ID";
}

/// Gradient bytes summed per call: large enough to amortize a call's
/// latency, small enough that a bucket's copy stays small beside the model.
pub const BUCKET_BYTES: usize = 25 << 20;

/// Sums buffers over the ranks of a run.
pub trait Collective: Send + Debug {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Where the tensors it sums live.
    fn device(&self) -> Device;
    /// The element-wise sum over the ranks of the contiguous f32 tensor `t`
    /// (same shape on every rank), on every rank. Ranks add in rank order,
    /// so every rank gets the same bits.
    fn all_reduce_sum(&mut self, t: &Tensor) -> Result<Tensor>;
}

/// This process's place in a launched run, read from [`env`](mod@env); `None`
/// outside `mxswitch launch`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Membership {
    /// [`env::RANK`].
    pub rank: usize,
    /// [`env::WORLD_SIZE`].
    pub world_size: usize,
    /// [`env::LOCAL_RANK`]: the device ordinal among the visible ones.
    pub local_rank: usize,
    /// [`env::RENDEZVOUS`].
    pub rendezvous: String,
    /// [`env::NCCL_ID`], for a GPU run.
    pub nccl_id: Option<String>,
}

impl Membership {
    /// The variables of [`env`](mod@env), checked, or `None` when `WORLD_SIZE` is unset.
    pub fn from_env() -> Result<Option<Membership>> {
        let var = |name: &str| std::env::var(name).ok();
        let Some(world) = var(env::WORLD_SIZE) else {
            return Ok(None);
        };
        let number = |name: &str, v: Option<String>| -> Result<usize> {
            let v = v.ok_or_else(|| {
                Error::InvalidOption(format!(
                    "{} is set but {name} is not: start ranks with `mxswitch launch`",
                    env::WORLD_SIZE
                ))
            })?;
            v.parse()
                .map_err(|_| Error::InvalidOption(format!("{name}={v}: expected a whole number")))
        };
        let world_size = number(env::WORLD_SIZE, Some(world))?;
        let rank = number(env::RANK, var(env::RANK))?;
        let local_rank = match var(env::LOCAL_RANK) {
            Some(v) => number(env::LOCAL_RANK, Some(v))?,
            None => rank,
        };
        if world_size == 0 || rank >= world_size {
            return Err(Error::InvalidOption(format!(
                "{}={rank} with {}={world_size}: the rank must be below the world size",
                env::RANK,
                env::WORLD_SIZE
            )));
        }
        let rendezvous = var(env::RENDEZVOUS).ok_or_else(|| {
            Error::InvalidOption(format!(
                "{} is set but {} is not: start ranks with `mxswitch launch`",
                env::WORLD_SIZE,
                env::RENDEZVOUS
            ))
        })?;
        Ok(Some(Membership {
            rank,
            world_size,
            local_rank,
            rendezvous,
            nccl_id: var(env::NCCL_ID),
        }))
    }

    /// The device this rank trains on, of the kind `device` names: the
    /// `local_rank`-th visible GPU.
    pub fn device(&self, device: Device) -> Device {
        match device {
            Device::Cpu => Device::Cpu,
            Device::Cuda(_) => Device::Cuda(self.local_rank),
            Device::Rocm(_) => Device::Rocm(self.local_rank),
        }
    }

    /// Join the run's collective on `device`.
    pub fn join(&self, device: Device) -> Result<Box<dyn Collective>> {
        match device {
            Device::Cpu => Ok(Box::new(tcp::TcpCollective::connect(self)?)),
            #[cfg(feature = "cuda")]
            gpu => Ok(Box::new(gpu::GpuCollective::join(self, gpu)?)),
            #[cfg(not(feature = "cuda"))]
            gpu => Err(Error::InvalidOption(format!(
                "{gpu}: this build has no GPU backend, so no NCCL or RCCL"
            ))),
        }
    }
}

/// A new communicator id for the ranks of a run on `platform` (`cuda` for
/// NCCL, `rocm` for RCCL), as the hex text of [`env::NCCL_ID`].
pub fn unique_id_hex(platform: &str) -> Result<String> {
    #[cfg(feature = "cuda")]
    {
        let id = gpu::unique_id(platform)?;
        Ok(id.iter().map(|b| format!("{b:02x}")).collect())
    }
    #[cfg(not(feature = "cuda"))]
    Err(Error::InvalidOption(format!(
        "--device {platform}: this build has no GPU backend, so no NCCL or RCCL"
    )))
}

/// The sum over the ranks of host values `v`.
pub fn all_reduce_f32(c: &mut dyn Collective, v: &[f32]) -> Result<Vec<f32>> {
    let t = Tensor::from_vec(v.to_vec(), [v.len()], &Device::Cpu)?.to_device(&c.device())?;
    c.all_reduce_sum(&t)?.to_vec_f32()
}

/// Every rank's `mine` (the same length on every rank), in rank order.
/// Carried as one f32 per byte, which a sum keeps exact: every slot but
/// the owner's is zero.
pub fn all_gather_bytes(c: &mut dyn Collective, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
    let (n, len) = (c.world_size(), mine.len());
    let mut v = vec![0.0f32; n * len];
    for (slot, &b) in v[c.rank() * len..].iter_mut().zip(mine) {
        *slot = b as f32;
    }
    let sum = all_reduce_f32(c, &v)?;
    Ok(sum
        .chunks(len.max(1))
        .take(n)
        .map(|chunk| chunk.iter().map(|&x| x as u8).collect())
        .collect())
}

/// Replace each gradient with its mean over the ranks: the gradients in
/// `order` (the same on every rank) are flattened into buckets of about
/// `bucket_bytes`, each bucket summed in one call and scaled by
/// 1 / world size. For gradients already computed; a training step uses
/// [`backward_averaged`], which overlaps the buckets with backward.
pub fn average_gradients(
    c: &mut dyn Collective,
    grads: &mut Gradients,
    order: &[ParamId],
    bucket_bytes: usize,
) -> Result<()> {
    let ids: Vec<ParamId> = order
        .iter()
        .copied()
        .filter(|id| grads.get(*id).is_some())
        .collect();
    if ids.len() != grads.len() {
        return Err(Error::Autograd(format!(
            "{} gradients, but only {} of them belong to the model's parameters",
            grads.len(),
            ids.len()
        )));
    }
    let mut buckets = Buckets::new(bucket_bytes);
    let mut full = Vec::new();
    for id in ids {
        let g = grads
            .get(id)
            .expect("ids are filtered to present gradients");
        full.extend(buckets.push(id, g));
    }
    full.extend(buckets.rest());
    for bucket in full {
        for (id, g) in reduce_bucket(c, bucket)? {
            grads.insert(id, g);
        }
    }
    Ok(())
}

/// Backward of the scalar `loss` with every gradient replaced by its mean
/// over the ranks. A bucket is summed as soon as its gradients are final,
/// while the rest of the tape runs: on the CPU on a helper thread (the sum
/// overlaps backward); on a GPU from the backward's own thread, so the sum
/// is queued on the stream between the backward's kernels (interleaved,
/// not concurrent: there is one stream).
pub fn backward_averaged(
    c: &mut dyn Collective,
    loss: &Tensor,
    bucket_bytes: usize,
) -> Result<Gradients> {
    let seed = Tensor::ones(loss.shape().clone(), loss.dtype(), &loss.device())?;
    let mut buckets = Buckets::new(bucket_bytes);
    if c.device() != Device::Cpu {
        let mut done = Vec::new();
        let mut grads = loss.backward_streaming(&seed, &mut |id, g| {
            if let Some(b) = buckets.push(id, g) {
                done.extend(reduce_bucket(c, b)?);
            }
            Ok(())
        })?;
        if let Some(b) = buckets.rest() {
            done.extend(reduce_bucket(c, b)?);
        }
        return replace_all(&mut grads, done).map(|()| grads);
    }
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<(ParamId, Tensor)>>();
        let summer = s.spawn(move || -> Result<Vec<(ParamId, Tensor)>> {
            let mut done = Vec::new();
            for b in rx {
                done.extend(reduce_bucket(c, b)?);
            }
            Ok(done)
        });
        let grads = loss.backward_streaming(&seed, &mut |id, g| {
            if let Some(b) = buckets.push(id, g) {
                // A closed channel means the helper failed: join says why.
                let _ = tx.send(b);
            }
            Ok(())
        });
        if let Some(b) = buckets.rest() {
            let _ = tx.send(b);
        }
        drop(tx);
        let done = summer
            .join()
            .map_err(|_| Error::Backend("the gradient all-reduce thread panicked".into()))??;
        let mut grads = grads?;
        replace_all(&mut grads, done).map(|()| grads)
    })
}

/// Put the averaged gradients in, checking that every one was averaged.
fn replace_all(grads: &mut Gradients, done: Vec<(ParamId, Tensor)>) -> Result<()> {
    if done.len() != grads.len() {
        return Err(Error::Autograd(format!(
            "{} of {} gradients were averaged over the ranks",
            done.len(),
            grads.len()
        )));
    }
    for (id, g) in done {
        grads.insert(id, g);
    }
    Ok(())
}

/// Gradients gathered into buckets of about `bytes` (as f32).
struct Buckets {
    bytes: usize,
    filled: usize,
    open: Vec<(ParamId, Tensor)>,
}

impl Buckets {
    fn new(bytes: usize) -> Buckets {
        Buckets {
            bytes,
            filled: 0,
            open: Vec::new(),
        }
    }

    /// Add a gradient; returns the bucket it filled.
    fn push(&mut self, id: ParamId, g: &Tensor) -> Option<Vec<(ParamId, Tensor)>> {
        self.open.push((id, g.clone()));
        self.filled += g.elem_count() * 4;
        (self.filled >= self.bytes).then(|| {
            self.filled = 0;
            std::mem::take(&mut self.open)
        })
    }

    /// The last, partly filled bucket.
    fn rest(&mut self) -> Option<Vec<(ParamId, Tensor)>> {
        (!self.open.is_empty()).then(|| std::mem::take(&mut self.open))
    }
}

/// One bucket's gradients, each replaced by its mean over the ranks.
fn reduce_bucket(
    c: &mut dyn Collective,
    bucket: Vec<(ParamId, Tensor)>,
) -> Result<Vec<(ParamId, Tensor)>> {
    let scale = 1.0 / c.world_size() as f32;
    let mut flat = Vec::with_capacity(bucket.len());
    for (_, g) in &bucket {
        flat.push(g.to_dtype(DType::F32)?.reshape([g.elem_count()])?);
    }
    let parts: Vec<&Tensor> = flat.iter().collect();
    let sum = c
        .all_reduce_sum(&Tensor::cat(&parts, 0)?.contiguous()?)?
        .mul_scalar(scale)?;
    let sizes: Vec<usize> = bucket.iter().map(|(_, g)| g.elem_count()).collect();
    bucket
        .into_iter()
        .zip(sum.split(0, &sizes)?)
        .map(|((id, g), part)| {
            let mean = part.reshape(g.dims())?.to_dtype(g.dtype())?.contiguous()?;
            Ok((id, mean))
        })
        .collect()
}
