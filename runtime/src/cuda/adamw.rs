//! AdamW on the GPU (`runtime/kernels/adamw.cu`): one launch per parameter
//! updates the f32 moments in place and writes the new parameter into a fresh
//! buffer, with the same f32 operations in the same order as the CPU's
//! update in `cpu/adamw.rs` (bit-identical; see the kernel's header).

use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::nvrtc::{launch_kernel, KernelSource};
use super::storage::backend_err;
use super::CudaStorage;
use crate::backend::{AdamWScalars, AdamWStep, BackendStorage, OptimBackend};
use crate::{DType, Error, Layout, Result};

/// The AdamW kernels.
pub const ADAMW: KernelSource = KernelSource {
    name: "adamw.cu",
    body: include_str!("../../kernels/adamw.cu"),
};

/// The kernel of each (parameter, gradient) dtype, f32 then BF16.
const KERNELS: [[&str; 2]; 2] = [
    ["adamw_w32_g32", "adamw_w32_g16"],
    ["adamw_w16_g32", "adamw_w16_g16"],
];

const THREADS: u32 = 256;
const MAX_CTAS: u64 = 1 << 20;

// SAFETY: plain old data with the C layout of the kernel's struct AdamWScalars.
unsafe impl DeviceRepr for AdamWScalars {}

/// Address of element `start` of a packed buffer of `dtype`.
fn addr(s: &CudaStorage, start: usize) -> u64 {
    s.buffer().ptr() + (start * s.dtype().size_in_bytes()) as u64
}

/// A packed view of `s` for a kernel: (storage holding it, first element),
/// a packed copy when `layout` is strided.
fn packed<'a>(
    s: &'a CudaStorage,
    layout: &Layout,
    copy: &'a mut Option<CudaStorage>,
) -> Result<(&'a CudaStorage, usize)> {
    match layout.contiguous_range() {
        Some(r) => Ok((s, r.start)),
        None => Ok((copy.insert(s.copy_strided(layout)?), 0)),
    }
}

impl OptimBackend for CudaStorage {
    /// One launch: `w` and the gradient (f32 or BF16) give a new parameter
    /// buffer of `w`'s dtype; `m` and `v` are updated in place.
    fn adamw_step(&self, st: AdamWStep<'_, CudaStorage>) -> Result<CudaStorage> {
        let n = st.layout.shape().elem_count();
        if st.grad_layout.shape().elem_count() != n {
            return Err(Error::Shape(format!(
                "AdamW: a gradient of {} values for a parameter of {n}",
                st.grad_layout.shape().elem_count()
            )));
        }
        let (mut wc, mut gc) = (None, None);
        let (w, w_start) = packed(self, st.layout, &mut wc)?;
        let (g, g_start) = packed(st.grad, st.grad_layout, &mut gc)?;
        step(w, w_start, g, g_start, st.m, st.v, n, *st.scalars)
    }
}

/// One AdamW step on the device: `w` (f32 or BF16, packed from element
/// `w_start`, `n` values) and `g` (f32 or BF16, packed from `g_start`) give
/// a new parameter buffer of `w`'s dtype; `m` and `v` are updated in place.
#[allow(clippy::too_many_arguments)]
fn step(
    w: &CudaStorage,
    w_start: usize,
    g: &CudaStorage,
    g_start: usize,
    m: &mut CudaStorage,
    v: &mut CudaStorage,
    n: usize,
    s: AdamWScalars,
) -> Result<CudaStorage> {
    let dev = w.device().clone();
    let ctx = dev.context();
    let wd = w.dtype();
    if m.len() != n || v.len() != n || m.dtype() != DType::F32 || v.dtype() != DType::F32 {
        return Err(Error::Shape(format!(
            "AdamW: moments of {} / {} values for a parameter of {n}",
            m.len(),
            v.len()
        )));
    }
    let float = |d: DType| [DType::F32, DType::BF16].iter().position(|&f| f == d);
    let (Some(wi), Some(gi)) = (float(wd), float(g.dtype())) else {
        return Err(Error::DType(format!(
            "AdamW needs float parameters and gradients, got {wd} and {}",
            g.dtype()
        )));
    };
    let name = KERNELS[wi][gi];
    let out = CudaStorage::from_buffer(
        ctx.alloc(n * wd.size_in_bytes()).map_err(backend_err)?,
        wd,
        n,
        dev.clone(),
    );
    if n == 0 {
        return Ok(out);
    }
    let (w_in, w_out, g_ptr, m_ptr, v_ptr, n64) = (
        addr(w, w_start),
        out.buffer().ptr(),
        addr(g, g_start),
        m.buffer().ptr(),
        v.buffer().ptr(),
        n as u64,
    );
    let cfg = LaunchConfig {
        grid_dim: (
            n64.div_ceil(u64::from(THREADS)).clamp(1, MAX_CTAS) as u32,
            1,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // w, g, m, v and out each hold n elements from the given addresses.
    launch_kernel!(ctx, &ADAMW, name, cfg, &w_in, &w_out, &g_ptr, &m_ptr, &v_ptr, &n64, &s)
        .map_err(backend_err)?;
    Ok(out)
}
