//! The GPU collective: NCCL through cudarc (`libnccl` loaded at run time)
//! for `--device cuda`, RCCL (`librccl`, the same C API) for `--device
//! rocm`. Sums run on the stream of the device's context, so they are
//! ordered with the kernels around them without a host wait.

use std::ffi::c_void;

use super::{Collective, Membership};
use crate::cuda::CudaDevice;
use crate::storage::Storage;
use crate::{DType, Device, Error, Result, Tensor};

use cudarc::nccl::{result as nccl, sys};

/// Which library a communicator belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lib {
    Nccl,
    #[cfg(feature = "rocm")]
    Rccl,
}

impl Lib {
    fn of(platform: &str) -> Result<Lib> {
        match platform {
            "cuda" => Ok(Lib::Nccl),
            #[cfg(feature = "rocm")]
            "rocm" => Ok(Lib::Rccl),
            other => Err(Error::InvalidOption(format!(
                "no collective library for `{other}` in this build"
            ))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Lib::Nccl => "NCCL",
            #[cfg(feature = "rocm")]
            Lib::Rccl => "RCCL",
        }
    }
}

/// NCCL's library, or one line saying where cudarc looked.
fn nccl_present() -> Result<()> {
    // SAFETY: only tries to load the library.
    if unsafe { sys::is_culib_present() } {
        return Ok(());
    }
    Err(Error::Backend(
        "NCCL unavailable: cudarc found no libnccl.so (nor libnccl.so.13, .12, ...) on the loader's path (LD_LIBRARY_PATH); PyTorch's wheel ships libnccl.so.2: put a libnccl.so link to it on the path".into(),
    ))
}

fn failed(lib: Lib, call: &str, code: impl std::fmt::Debug) -> Error {
    Error::Backend(format!("{} {call} failed: {code:?}", lib.name()))
}

/// A new 128-byte communicator id from the library of `platform`.
pub fn unique_id(platform: &str) -> Result<[u8; 128]> {
    let lib = Lib::of(platform)?;
    let raw: [std::ffi::c_char; 128] = match lib {
        Lib::Nccl => {
            nccl_present()?;
            nccl::get_uniqueid()
                .map_err(|e| failed(lib, "ncclGetUniqueId", e))?
                .internal
        }
        #[cfg(feature = "rocm")]
        Lib::Rccl => {
            let r = crate::rocm::rccl::rccl().map_err(Error::Backend)?;
            let mut id = crate::rocm::rccl::UniqueId { internal: [0; 128] };
            // SAFETY: the out-parameter is a 128-byte id we own.
            let rc = unsafe { (r.get_unique_id)(&mut id) };
            if rc != crate::rocm::rccl::SUCCESS {
                return Err(failed(lib, "ncclGetUniqueId", rc));
            }
            id.internal
        }
    };
    Ok(raw.map(|c| c as u8))
}

/// Parses the hex id of the launcher's environment.
fn parse_id(hex: &str) -> Result<[std::ffi::c_char; 128]> {
    let bad = || {
        Error::InvalidOption(format!(
            "{}: expected 256 hex digits (the id `mxswitch launch` makes)",
            super::env::NCCL_ID
        ))
    };
    if hex.len() != 256 {
        return Err(bad());
    }
    let mut out = [0 as std::ffi::c_char; 128];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())? as std::ffi::c_char;
    }
    Ok(out)
}

/// One rank's communicator on one GPU.
#[derive(Debug)]
pub struct GpuCollective {
    rank: usize,
    world_size: usize,
    device: Device,
    lib: Lib,
    comm: *mut c_void,
}

// SAFETY: the communicator is used by one thread at a time (`&mut self`);
// NCCL allows a communicator to move between threads.
unsafe impl Send for GpuCollective {}

impl GpuCollective {
    /// Join the run's communicator on `device` with the launcher's id.
    pub fn join(m: &Membership, device: Device) -> Result<GpuCollective> {
        let platform = match device {
            Device::Rocm(_) => "rocm",
            _ => "cuda",
        };
        let lib = Lib::of(platform)?;
        let hex = m.nccl_id.as_deref().ok_or_else(|| {
            Error::InvalidOption(format!(
                "{} is not set: start GPU ranks with `mxswitch launch`, which makes the {} id",
                super::env::NCCL_ID,
                lib.name()
            ))
        })?;
        let id = parse_id(hex)?;
        // The communicator binds to the current device: the context's.
        let dev = CudaDevice::open(device)?;
        dev.context()
            .bind()
            .map_err(|e| Error::Backend(e.to_string()))?;
        let (n, r) = (m.world_size as i32, m.rank as i32);
        let comm: *mut c_void = match lib {
            Lib::Nccl => {
                nccl_present()?;
                let mut comm: sys::ncclComm_t = std::ptr::null_mut();
                // SAFETY: an out-parameter we own and the id the launcher made.
                unsafe {
                    nccl::comm_init_rank(&mut comm, n, sys::ncclUniqueId { internal: id }, r)
                }
                .map_err(|e| failed(lib, "ncclCommInitRank", e))?;
                comm.cast()
            }
            #[cfg(feature = "rocm")]
            Lib::Rccl => {
                let rccl = crate::rocm::rccl::rccl().map_err(Error::Backend)?;
                let mut comm: crate::rocm::rccl::Comm = std::ptr::null_mut();
                let id = crate::rocm::rccl::UniqueId { internal: id };
                // SAFETY: as above.
                let rc = unsafe { (rccl.comm_init_rank)(&mut comm, n, id, r) };
                if rc != crate::rocm::rccl::SUCCESS {
                    return Err(failed(lib, "ncclCommInitRank", rc));
                }
                comm
            }
        };
        Ok(GpuCollective {
            rank: m.rank,
            world_size: m.world_size,
            device,
            lib,
            comm,
        })
    }
}

impl Drop for GpuCollective {
    fn drop(&mut self) {
        // SAFETY: the communicator was made by this library and is dropped once.
        // A failure to free it at exit leaves nothing to do.
        unsafe {
            match self.lib {
                Lib::Nccl => {
                    let _ = nccl::comm_destroy(self.comm.cast());
                }
                #[cfg(feature = "rocm")]
                Lib::Rccl => {
                    if let Ok(r) = crate::rocm::rccl::rccl() {
                        let _ = (r.comm_destroy)(self.comm);
                    }
                }
            }
        }
    }
}

/// The device buffer address of a contiguous GPU tensor's first element.
fn device_ptr(t: &Tensor) -> Result<u64> {
    match t.storage() {
        Storage::Cuda(s) => {
            Ok(s.buffer().ptr() + (t.layout().offset() * t.dtype().size_in_bytes()) as u64)
        }
        _ => Err(Error::Backend(format!(
            "a GPU collective was given a tensor on {}",
            t.device()
        ))),
    }
}

impl Collective for GpuCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn device(&self) -> Device {
        self.device
    }

    fn all_reduce_sum(&mut self, t: &Tensor) -> Result<Tensor> {
        if t.dtype() != DType::F32 || !t.is_contiguous() {
            return Err(Error::Backend(
                "a collective sums contiguous f32 tensors only".into(),
            ));
        }
        let out = Tensor::zeros(t.dims(), DType::F32, &self.device)?;
        let (src, dst) = (device_ptr(t)?, device_ptr(&out)?);
        let dev = CudaDevice::open(self.device)?;
        let ctx = dev.context();
        let stream = ctx.stream_handle();
        let count = t.elem_count();
        match self.lib {
            Lib::Nccl => {
                // SAFETY: both buffers hold `count` f32 on this communicator's
                // device, and the call is queued on the context's stream.
                unsafe {
                    nccl::all_reduce(
                        src as *const c_void,
                        dst as *mut c_void,
                        count,
                        sys::ncclDataType_t::ncclFloat32,
                        sys::ncclRedOp_t::ncclSum,
                        self.comm.cast(),
                        stream.cast(),
                    )
                }
                .map_err(|e| failed(self.lib, "ncclAllReduce", e))?;
            }
            #[cfg(feature = "rocm")]
            Lib::Rccl => {
                use crate::rocm::rccl::{rccl, FLOAT32, SUCCESS, SUM};
                let r = rccl().map_err(Error::Backend)?;
                // SAFETY: as above.
                let rc = unsafe {
                    (r.all_reduce)(
                        src as *const c_void,
                        dst as *mut c_void,
                        count,
                        FLOAT32,
                        SUM,
                        self.comm,
                        stream,
                    )
                };
                if rc != SUCCESS {
                    return Err(failed(self.lib, "ncclAllReduce", rc));
                }
            }
        }
        Ok(out)
    }
}
