//! AdamW on the GPU (`runtime/kernels/adamw.cu`): the f32 moments are
//! updated in place and the new parameter written into a fresh buffer, with
//! the same f32 operations in the same order as the CPU's update in
//! `cpu/adamw.rs` (bit-identical; see the kernel's header).
//!
//! Two paths: [`OptimBackend::adamw_step`] launches once per parameter (the
//! reference); [`MultiOptimBackend`] steps a whole list of parameters in one
//! launch from a table uploaded once (pointers, sizes, each parameter's
//! scalars), computes the f64 sum of squares of a list of gradients in two
//! launches and one read-back, and scales a list of gradients in one.

use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::nvrtc::{launch_kernel, KernelSource};
use super::storage::backend_err;
use super::{CudaDevice, CudaStorage};
use crate::backend::{AdamWScalars, AdamWStep, BackendStorage, MultiOptimBackend, OptimBackend};
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
/// Elements per chunk of a multi-tensor launch (MT_CHUNK in the kernels).
const MT_CHUNK: u64 = 32768;
/// Threads per CTA of the multi-tensor kernels (MT_THREADS in the kernels).
const MT_THREADS: u32 = 256;

// SAFETY: plain old data with the C layout of the kernel's struct AdamWScalars.
unsafe impl DeviceRepr for AdamWScalars {}

/// One parameter of an `adamw_multi` launch (struct AdamWTensor in the kernels).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct AdamWTensor {
    w_in: u64,
    w_out: u64,
    g: u64,
    m: u64,
    v: u64,
    n: u64,
    chunk_begin: u64,
    /// Bit 0: the parameter is BF16; bit 1: the gradient is BF16; bit 2:
    /// the gradient is multiplied by the f32 whose bits are `pad`.
    kind: u32,
    /// The bits of the gradient multiplier (kind bit 2), else 0.
    pad: u32,
    s: AdamWScalars,
}

/// One gradient of a sum-of-squares or scale launch (struct GradTensor).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct GradTensor {
    src: u64,
    dst: u64,
    n: u64,
    chunk_begin: u64,
    bf16: u32,
    pad: u32,
}

// The kernels read these tables with the C layouts above.
const _: () = assert!(std::mem::size_of::<AdamWTensor>() == 96);
const _: () = assert!(std::mem::size_of::<GradTensor>() == 40);

// SAFETY: plain old data with the C layouts of the kernels' structs.
unsafe impl DeviceRepr for AdamWTensor {}
// SAFETY: as above.
unsafe impl DeviceRepr for GradTensor {}

/// Address of element `start` of a packed buffer of `dtype`.
fn addr(s: &CudaStorage, start: usize) -> u64 {
    s.buffer().ptr() + (start * s.dtype().size_in_bytes()) as u64
}

/// The device address of the elements of `layout` of `s`, packed: in place
/// when the view is contiguous, else a packed copy pushed onto `keep` (alive
/// until the launch is queued; the pool reuses it stream-ordered).
fn packed_addr(s: &CudaStorage, layout: &Layout, keep: &mut Vec<CudaStorage>) -> Result<u64> {
    match layout.contiguous_range() {
        Some(r) if r.end <= s.len() => Ok(addr(s, r.start)),
        Some(r) => Err(Error::Shape(format!(
            "a view of elements {r:?} of a buffer of {} elements",
            s.len()
        ))),
        None => {
            let c = s.copy_strided(layout)?;
            let a = c.buffer().ptr();
            keep.push(c);
            Ok(a)
        }
    }
}

/// 0 for f32, 1 for BF16, else the error naming `what`.
fn float_index(d: DType, what: &str) -> Result<usize> {
    match d {
        DType::F32 => Ok(0),
        DType::BF16 => Ok(1),
        d => Err(Error::DType(format!(
            "AdamW needs float {what}s (f32 or bf16), got {d}"
        ))),
    }
}

/// Errors unless `s` lives on `dev`.
fn on_device(s: &CudaStorage, dev: &CudaDevice, what: &str) -> Result<()> {
    if s.device().ordinal() == dev.ordinal() {
        Ok(())
    } else {
        Err(Error::InvalidOption(format!(
            "AdamW: {what} on cuda:{} in a step on cuda:{}",
            s.device().ordinal(),
            dev.ordinal()
        )))
    }
}

/// A checked parameter step: its size, its (parameter, gradient) dtype
/// indices and the packed addresses of w and g (copies kept in `keep`).
struct Checked {
    n: usize,
    wi: usize,
    gi: usize,
    w: u64,
    g: u64,
}

/// Checks one step (sizes, dtypes, moments, devices) against `dev`.
fn check(
    w: &CudaStorage,
    st: &AdamWStep<'_, CudaStorage>,
    dev: &CudaDevice,
    keep: &mut Vec<CudaStorage>,
) -> Result<Checked> {
    let n = st.layout.shape().elem_count();
    if st.grad_layout.shape().elem_count() != n {
        return Err(Error::Shape(format!(
            "AdamW: a gradient of {} values for a parameter of {n}",
            st.grad_layout.shape().elem_count()
        )));
    }
    let (m, v) = (&*st.m, &*st.v);
    if m.len() != n || v.len() != n || m.dtype() != DType::F32 || v.dtype() != DType::F32 {
        return Err(Error::Shape(format!(
            "AdamW: moments of {} / {} values for a parameter of {n}",
            m.len(),
            v.len()
        )));
    }
    for (s, what) in [
        (w, "the parameter"),
        (st.grad, "the gradient"),
        (m, "m"),
        (v, "v"),
    ] {
        on_device(s, dev, what)?;
    }
    let wi = float_index(w.dtype(), "parameter")?;
    let gi = float_index(st.grad.dtype(), "gradient")?;
    Ok(Checked {
        n,
        wi,
        gi,
        w: packed_addr(w, st.layout, keep)?,
        g: packed_addr(st.grad, st.grad_layout, keep)?,
    })
}

/// A fresh buffer of `n` elements of `dtype` on `dev`.
fn alloc(dev: &CudaDevice, n: usize, dtype: DType) -> Result<CudaStorage> {
    let buf = dev
        .context()
        .alloc(n * dtype.size_in_bytes())
        .map_err(backend_err)?;
    Ok(CudaStorage::from_buffer(buf, dtype, n, dev.clone()))
}

/// A grid of one CTA per chunk (grid-stride past [`MAX_CTAS`]).
fn chunk_grid(chunks: u64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (chunks.clamp(1, MAX_CTAS) as u32, 1, 1),
        block_dim: (MT_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl OptimBackend for CudaStorage {
    /// One launch: `w` and the gradient (f32 or BF16) give a new parameter
    /// buffer of `w`'s dtype; `m` and `v` are updated in place.
    fn adamw_step(&self, st: AdamWStep<'_, CudaStorage>) -> Result<CudaStorage> {
        let dev = self.device().clone();
        let mut keep = Vec::new();
        let c = check(self, &st, &dev, &mut keep)?;
        let out = alloc(&dev, c.n, self.dtype())?;
        if c.n == 0 {
            return Ok(out);
        }
        let (w_in, w_out, g_ptr, n64) = (c.w, out.buffer().ptr(), c.g, c.n as u64);
        let (m_ptr, v_ptr) = (st.m.buffer().ptr(), st.v.buffer().ptr());
        let s = *st.scalars;
        let cfg = LaunchConfig {
            grid_dim: (
                n64.div_ceil(u64::from(THREADS)).clamp(1, MAX_CTAS) as u32,
                1,
                1,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let ctx = dev.context();
        let name = KERNELS[c.wi][c.gi];
        // w, g, m, v and out each hold n elements from the given addresses.
        launch_kernel!(ctx, &ADAMW, name, cfg, &w_in, &w_out, &g_ptr, &m_ptr, &v_ptr, &n64, &s)
            .map_err(backend_err)?;
        Ok(out)
    }
}

impl MultiOptimBackend for CudaStorage {
    /// One `adamw_multi` launch for every parameter of the list (chunks of
    /// `MT_CHUNK` elements, one CTA each), after one upload of the table;
    /// the element update is the per-parameter kernel's, so are the bits.
    fn adamw_multi<'a>(steps: Vec<(&'a Self, AdamWStep<'a, Self>)>) -> Result<Vec<Self>> {
        adamw_multi_launch(steps, None)
    }

    /// Two launches and one read-back: an f64 partial sum per chunk of
    /// `MT_CHUNK` elements (each thread adds its elements in order, then a
    /// fixed tree), then the partials in a fixed order. The squares are
    /// exact in f64, so the sum is the f64 sum of the exact squares in that
    /// order: deterministic, but not the CPU's (which rounds each square to
    /// the gradient's dtype and each gradient's sum to f32). Waits for the
    /// device, and raises a deferred non-finite amax like every read-back.
    fn sum_squares(grads: &[(&Self, &Layout)]) -> Result<f64> {
        let Some(dev) = grads.first().map(|(g, _)| g.device().clone()) else {
            return Ok(0.0);
        };
        let mut keep = Vec::new();
        let (table, chunks) = grad_table(&dev, grads, None, &mut keep)?;
        if table.is_empty() {
            return Ok(0.0);
        }
        let ctx = dev.context();
        let tab = ctx.upload(&table).map_err(backend_err)?;
        let partial = ctx.alloc(chunks as usize * 8).map_err(backend_err)?;
        let total = ctx.alloc(8).map_err(backend_err)?;
        let (tab_ptr, count, part_ptr, total_ptr) =
            (tab.ptr(), table.len() as u64, partial.ptr(), total.ptr());
        // `partial` holds one f64 per chunk, `total` one f64.
        launch_kernel!(
            ctx,
            &ADAMW,
            "grad_sumsq_partial",
            chunk_grid(chunks),
            &tab_ptr,
            &count,
            &chunks,
            &part_ptr
        )
        .map_err(backend_err)?;
        launch_kernel!(
            ctx,
            &ADAMW,
            "grad_sumsq_final",
            chunk_grid(1),
            &part_ptr,
            &chunks,
            &total_ptr
        )
        .map_err(backend_err)?;
        let sum: Vec<f64> = ctx.download(&total, 1).map_err(backend_err)?;
        Ok(sum[0])
    }

    /// One `grad_scale` launch over the list: `x * mul + 0` in f32, rounded
    /// to the gradient's dtype, as `ops_affine` computes it.
    fn scale_all(grads: &[(&Self, &Layout)], mul: f32) -> Result<Vec<Self>> {
        let Some(dev) = grads.first().map(|(g, _)| g.device().clone()) else {
            return Ok(Vec::new());
        };
        let mut outs = Vec::with_capacity(grads.len());
        for &(g, layout) in grads {
            float_index(g.dtype(), "gradient")?;
            outs.push(alloc(&dev, layout.shape().elem_count(), g.dtype())?);
        }
        let mut keep = Vec::new();
        let (table, chunks) = grad_table(&dev, grads, Some(&outs), &mut keep)?;
        if table.is_empty() {
            return Ok(outs);
        }
        let ctx = dev.context();
        let tab = ctx.upload(&table).map_err(backend_err)?;
        let (tab_ptr, count, add) = (tab.ptr(), table.len() as u64, 0f32);
        // Every entry's src and dst hold its n elements.
        launch_kernel!(
            ctx,
            &ADAMW,
            "grad_scale",
            chunk_grid(chunks),
            &tab_ptr,
            &count,
            &chunks,
            &mul,
            &add
        )
        .map_err(backend_err)?;
        Ok(outs)
    }
}

/// The table of the non-empty gradients of `grads` (packed copies of
/// strided ones pushed onto `keep`) with `outs`' buffers as destinations,
/// and the number of chunks.
fn grad_table(
    dev: &CudaDevice,
    grads: &[(&CudaStorage, &Layout)],
    outs: Option<&[CudaStorage]>,
    keep: &mut Vec<CudaStorage>,
) -> Result<(Vec<GradTensor>, u64)> {
    let mut table = Vec::with_capacity(grads.len());
    let mut chunks = 0u64;
    for (i, &(g, layout)) in grads.iter().enumerate() {
        on_device(g, dev, "a gradient")?;
        let bf16 = float_index(g.dtype(), "gradient")? as u32;
        let n = layout.shape().elem_count() as u64;
        if n == 0 {
            continue;
        }
        table.push(GradTensor {
            src: packed_addr(g, layout, keep)?,
            dst: outs.map_or(0, |o| o[i].buffer().ptr()),
            n,
            chunk_begin: chunks,
            bf16,
            pad: 0,
        });
        chunks += n.div_ceil(MT_CHUNK);
    }
    Ok((table, chunks))
}

/// The `adamw_multi` launch of [`MultiOptimBackend::adamw_multi`]; with a
/// `grad_mul`, each gradient element is first multiplied by it as the
/// kernel reads it (kind bit 2, the factor's bits in the entry's `pad`).
fn adamw_multi_launch<'a>(
    steps: Vec<(&'a CudaStorage, AdamWStep<'a, CudaStorage>)>,
    grad_mul: Option<f32>,
) -> Result<Vec<CudaStorage>> {
    let Some(dev) = steps.first().map(|(w, _)| w.device().clone()) else {
        return Ok(Vec::new());
    };
    let mut keep = Vec::new();
    let mut outs = Vec::with_capacity(steps.len());
    let mut table = Vec::with_capacity(steps.len());
    let mut chunks = 0u64;
    for (w, st) in &steps {
        let c = check(w, st, &dev, &mut keep)?;
        let out = alloc(&dev, c.n, w.dtype())?;
        if c.n > 0 {
            table.push(AdamWTensor {
                w_in: c.w,
                w_out: out.buffer().ptr(),
                g: c.g,
                m: st.m.buffer().ptr(),
                v: st.v.buffer().ptr(),
                n: c.n as u64,
                chunk_begin: chunks,
                kind: (c.wi | (c.gi << 1)) as u32 | if grad_mul.is_some() { 4 } else { 0 },
                pad: grad_mul.map_or(0, f32::to_bits),
                s: *st.scalars,
            });
            chunks += (c.n as u64).div_ceil(MT_CHUNK);
        }
        outs.push(out);
    }
    if table.is_empty() {
        return Ok(outs);
    }
    let ctx = dev.context();
    let tab = ctx.upload(&table).map_err(backend_err)?;
    let (tab_ptr, count) = (tab.ptr(), table.len() as u64);
    // The table lists `count` parameters whose chunks number `chunks`;
    // each entry's buffers hold its n elements.
    launch_kernel!(
        ctx,
        &ADAMW,
        "adamw_multi",
        chunk_grid(chunks),
        &tab_ptr,
        &count,
        &chunks
    )
    .map_err(backend_err)?;
    Ok(outs)
}

impl crate::backend::ScaledAdamWBackend for CudaStorage {
    /// One `adamw_multi` launch as [`MultiOptimBackend::adamw_multi`],
    /// each gradient element read as `g * grad_mul + 0` rounded to the
    /// gradient's dtype (`grad_scale`'s operations): the bits of
    /// `scale_all` then `adamw_multi`, one read of the gradients.
    fn adamw_multi_scaled<'a>(
        steps: Vec<(&'a Self, AdamWStep<'a, Self>)>,
        grad_mul: f32,
    ) -> Result<Vec<Self>> {
        adamw_multi_launch(steps, Some(grad_mul))
    }
}
