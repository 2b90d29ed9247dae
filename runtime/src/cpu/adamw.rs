//! AdamW on the host ([`OptimBackend`]): the f32 update every backend
//! matches bit for bit (`runtime/kernels/adamw.cu` does the same operations
//! in the same order). The multi-tensor entry points
//! ([`MultiOptimBackend`]) run the per-tensor operations one tensor after
//! another, so the host's bits do not depend on which path a step takes.

use rayon::prelude::*;

use super::{CpuStorage, PAR_MIN_ELEMS};
use crate::backend::{AdamWScalars, AdamWStep, BackendStorage, MultiOptimBackend, OptimBackend};
use crate::op::{ReduceOp, UnaryOp};
use crate::{DType, Error, Layout, Result, Shape};

/// Elements per rayon task of a large update.
const CHUNK: usize = 1 << 14;

/// How the update reads each gradient element: as it is, or times the clip
/// factor with the bits of `affine(mul, 0)` in the gradient's dtype (what
/// [`MultiOptimBackend::scale_all`] would have written).
#[derive(Clone, Copy)]
enum Read {
    Plain,
    Scaled { mul: f32, bf16: bool },
}

impl Read {
    #[inline(always)]
    fn grad(self, g: f32) -> f32 {
        match self {
            Read::Plain => g,
            Read::Scaled { mul, bf16 } => {
                let x = g * mul + 0.0;
                match bf16 {
                    true => f32::from_bits(u32::from(crate::formats::bf16::from_f32(x)) << 16),
                    false => x,
                }
            }
        }
    }
}

/// One AdamW step over flat slices, split across threads when large.
fn update(s: &AdamWScalars, read: Read, w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
    let kernel = |w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]| {
        for (((w, &g), m), v) in w.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            let g = read.grad(g);
            *w *= s.decay;
            *m = s.b1 * *m + s.one_minus_b1 * g;
            *v = s.b2 * *v + s.one_minus_b2 * g * g;
            *w -= s.step_size * *m / (v.sqrt() / s.bias2_sqrt + s.eps);
        }
    };
    if w.len() < PAR_MIN_ELEMS {
        kernel(w, g, m, v);
        return;
    }
    w.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK))
        .zip(v.par_chunks_mut(CHUNK))
        .for_each(|(((w, g), m), v)| kernel(w, g, m, v));
}

impl OptimBackend for CpuStorage {
    fn adamw_step(&self, step: AdamWStep<'_, CpuStorage>) -> Result<CpuStorage> {
        self.adamw_read(step, Read::Plain)
    }
}

impl CpuStorage {
    /// [`OptimBackend::adamw_step`], reading the gradient through `read`.
    fn adamw_read(&self, step: AdamWStep<'_, CpuStorage>, read: Read) -> Result<CpuStorage> {
        let n = step.layout.shape().elem_count();
        let mut w = self.packed_f32(step.layout, "AdamW")?.into_owned();
        let g = step.grad.packed_f32(step.grad_layout, "AdamW")?;
        let (CpuStorage::F32(m), CpuStorage::F32(v)) = (step.m, step.v) else {
            return Err(Error::DType("AdamW moments must be f32".into()));
        };
        if g.len() != n || m.len() != n || v.len() != n {
            return Err(Error::Shape(format!(
                "AdamW: gradient and moments of {} / {} / {} values for a parameter of {n}",
                g.len(),
                m.len(),
                v.len()
            )));
        }
        update(step.scalars, read, &mut w, &g, m, v);
        let w = CpuStorage::F32(w);
        match self.dtype() {
            DType::F32 => Ok(w),
            d => w.to_dtype(&Layout::contiguous(Shape::new(vec![n])), d),
        }
    }
}

impl MultiOptimBackend for CpuStorage {
    /// One parameter after another through [`OptimBackend::adamw_step`]
    /// (a large update already runs on every core): the per-parameter bits.
    fn adamw_multi<'a>(steps: Vec<(&'a Self, AdamWStep<'a, Self>)>) -> Result<Vec<Self>> {
        steps.into_iter().map(|(w, s)| w.adamw_step(s)).collect()
    }

    /// Per gradient, the f32 value of the tensor ops `g.sqr().sum_all()`
    /// (squares rounded to the gradient's dtype, added by the CPU
    /// reduction), widened to f64 and added in the order given: the bits of
    /// the per-gradient norm `optim::clip_grad_norm` computed before.
    fn sum_squares(grads: &[(&Self, &Layout)]) -> Result<f64> {
        let mut sum = 0f64;
        for &(g, layout) in grads {
            let n = layout.shape().elem_count();
            let flat = Layout::contiguous(Shape::new(vec![n]));
            let s = g
                .unary(layout, UnaryOp::Sqr)?
                .reduce(&flat, ReduceOp::Sum, 0)?;
            let s = s.packed_f32(&Layout::contiguous(Shape::new(vec![1])), "gradient norm")?;
            sum += f64::from(s[0]);
        }
        Ok(sum)
    }

    /// `affine(mul, 0)` of each gradient, one after another.
    fn scale_all(grads: &[(&Self, &Layout)], mul: f32) -> Result<Vec<Self>> {
        grads.iter().map(|&(g, l)| g.affine(l, mul, 0.0)).collect()
    }
}

impl crate::backend::ScaledAdamWBackend for CpuStorage {
    /// Each gradient element read as [`MultiOptimBackend::scale_all`] would
    /// have written it (`affine(grad_mul, 0)`, rounded to its dtype), in the
    /// update's one pass: by construction the bits of clipping first, the
    /// reference the GPU's fused kernel matches.
    fn adamw_multi_scaled<'a>(
        steps: Vec<(&'a Self, AdamWStep<'a, Self>)>,
        grad_mul: f32,
    ) -> Result<Vec<Self>> {
        steps
            .into_iter()
            .map(|(w, s)| {
                let bf16 = s.grad.dtype() == DType::BF16;
                w.adamw_read(
                    s,
                    Read::Scaled {
                        mul: grad_mul,
                        bf16,
                    },
                )
            })
            .collect()
    }
}
