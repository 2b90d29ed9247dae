//! The quantized linear y = x W^T + b (SPEC section 4), written once for
//! every backend against the [`LinearBackend`] primitives.
//!
//! Shapes: x `[M, K]`, W `[N, K]`, b `[N]`, dy `[M, N]`. A recipe resolves to
//! a [`LinearSpec`]: how each GEMM quantizes its two operands, each along
//! that GEMM's reduction axis:
//!
//! | GEMM | reduction | a | b |
//! |---|---|---|---|
//! | fprop y = x W^T | K | x along its rows | W along its rows |
//! | dgrad dx = dy W | N | dy along its rows | W along its columns (kept) |
//! | wgrad dW = dy^T x | M | dy along its columns | x along its columns (kept) |
//!
//! The forward asks for x's fprop operand and its kept wgrad copy in one
//! request, and likewise for W (nothing kept when dgrad is a BF16 GEMM: it
//! reads the master weight again), so a backend can write both in one pass.
//! The backward asks for both of dy's operands at once. The fprop GEMM adds
//! the bias; db is the f32 column sum of dy. Which quantizer, GEMM and
//! fusion runs is the backend's business; which operand is quantized how is
//! decided here and nowhere else.
//!
//! The per-GEMM overrides of SPEC section 4a need nothing more: a
//! `mxfp4(fprop = bf16)` spec runs fprop in BF16 and keeps x and W in MXFP4.

use std::cell::Cell;

use crate::backend::{Along, BackendStorage, LinearBackend, Want};
use crate::cpu::CpuStorage;
use crate::quant::SrKey;
use crate::recipe::{Recipe, RecipeKind};
use crate::{DType, Error, Result};

thread_local! {
    /// Runs of each recipe's linear (forward and backward calls) on this
    /// thread, so a warm-up can prove that every scheduled recipe's kernels
    /// ran. Per thread, so concurrent work elsewhere cannot fake a run.
    static KERNEL_RUNS: [Cell<u64>; RecipeKind::ALL.len()] = const { [const { Cell::new(0) }; RecipeKind::ALL.len()] };
}

/// How many times the linear forward or backward of `kind` has run on this thread.
pub fn kernel_runs(kind: RecipeKind) -> u64 {
    KERNEL_RUNS.with(|k| k[kind as usize].get())
}

fn count_run(kind: RecipeKind) {
    KERNEL_RUNS.with(|k| k[kind as usize].set(k[kind as usize].get() + 1));
}

/// Sizes of one linear: x [m, k], W [n, k], y [m, n].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearShape {
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

/// Where a linear runs: names its errors and keys its stochastic rounding.
#[derive(Clone, Copy, Debug)]
pub struct LinearCtx<'a> {
    /// Plan path of the layer, e.g. `double_blocks.3.img_qkv`.
    pub layer: &'a str,
    pub iteration: u64,
    pub seed: u64,
    /// Distinct per linear: the SR tensor ids of its two gradient operands
    /// are `2 * layer_id` (dgrad) and `2 * layer_id + 1` (wgrad).
    pub layer_id: u64,
}

impl LinearCtx<'_> {
    /// Tensor label used in non-finite-amax errors (SPEC section 3).
    pub fn label(&self, role: &str) -> String {
        format!("{} {role}, iteration {}", self.layer, self.iteration)
    }

    /// The stochastic-rounding key of gradient operand `id` (0: dgrad dy,
    /// 1: wgrad dy); used only where the operand's spec asks for SR.
    pub fn sr_key(&self, id: u64) -> SrKey {
        SrKey {
            seed: self.seed,
            step: self.iteration,
            tensor_id: 2 * self.layer_id + id,
        }
    }
}

/// What the forward keeps for the backward, and nothing else (SPEC 4a):
/// x as wgrad reads it and W as dgrad reads it, in the backend's memory.
pub struct Saved<B: LinearBackend> {
    pub x: B::Operand<'static>,
    /// `None` when dgrad is a BF16 GEMM, which reads the master weight.
    pub w: Option<B::Operand<'static>>,
}

impl<B: LinearBackend> Saved<B> {
    /// Bytes held (codes and scales, no padding).
    pub fn nbytes(&self) -> usize {
        B::operand_bytes(&self.x) + self.w.as_ref().map_or(0, |w| B::operand_bytes(w))
    }

    /// Elements of the saved tensors, before any padding.
    pub fn elements(&self) -> usize {
        B::operand_elements(&self.x) + self.w.as_ref().map_or(0, |w| B::operand_elements(w))
    }

    /// The saved tensors in host memory, in the CPU backend's form (to
    /// compare two backends byte for byte).
    pub fn to_cpu(&self, device: &B::Device) -> Result<Saved<CpuStorage>> {
        Ok(Saved {
            x: B::operand_to_cpu(device, &self.x)?,
            w: self
                .w
                .as_ref()
                .map(|w| B::operand_to_cpu(device, w))
                .transpose()?,
        })
    }
}

impl<B: LinearBackend> std::fmt::Debug for Saved<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Saved({} bytes, {} elements, W {})",
            self.nbytes(),
            self.elements(),
            if self.w.is_some() { "kept" } else { "not kept" }
        )
    }
}

/// Gradients of one linear: dx `[m, k]` in the activation dtype, dW
/// `[n, k]` and db `[n]` in f32.
#[derive(Debug)]
pub struct Grads<B> {
    pub dx: B,
    pub dw: B,
    pub db: Option<B>,
}

fn check_len<B: BackendStorage>(what: &str, t: &B, want: usize, s: LinearShape) -> Result<()> {
    let got = t.buffer_bytes() / t.dtype().size_in_bytes();
    if got != want {
        return Err(Error::Shape(format!(
            "linear {}x{} -> {}: {what} has {got} elements, expected {want}",
            s.m, s.k, s.n
        )));
    }
    Ok(())
}

/// A backend answered a request with other operands than it asked for.
fn not_as_asked() -> Error {
    Error::Backend("the backend returned other operands than asked for".into())
}

/// The one operand of a single-entry request.
fn single<T>(mut ops: Vec<T>) -> Result<T> {
    match (ops.pop(), ops.is_empty()) {
        (Some(op), true) => Ok(op),
        _ => Err(not_as_asked()),
    }
}

/// Forward y = x W^T + b under `recipe`: x `[m, k]` (f32 or BF16), W `[n, k]`
/// and b `[n]` f32, all packed; returns y `[m, n]` in x's dtype and what the
/// backward needs.
pub fn forward<B: LinearBackend>(
    recipe: &Recipe,
    x: &B,
    w: &B,
    b: Option<&B>,
    s: LinearShape,
    ctx: &LinearCtx,
) -> Result<(B, Saved<B>)> {
    let LinearShape { m, k, n } = s;
    check_len("x", x, m * k, s)?;
    check_len("W", w, n * k, s)?;
    if let Some(b) = b {
        check_len("b", b, n, s)?;
    }
    let spec = recipe.spec();
    count_run(recipe.kind);
    let (xq, x_keep) = x.quantize(
        m,
        k,
        &[Want::new(&spec.fprop.a, Along::Cols, None)?],
        Some(Want::new(&spec.wgrad.b, Along::Rows, None)?),
        &|| ctx.label("activation"),
    )?;
    let w_keep = spec
        .saved()
        .w
        .map(|w| Want::new(&w, Along::Rows, None))
        .transpose()?;
    let (wq, w_keep) = w.quantize(
        n,
        k,
        &[Want::new(&spec.fprop.b, Along::Cols, None)?],
        w_keep,
        &|| ctx.label("weight"),
    )?;
    if w_keep.is_some() != spec.saved().w.is_some() {
        return Err(not_as_asked());
    }
    let y = B::gemm(x.device(), &single(xq)?, &single(wq)?, b, x.dtype())?;
    Ok((
        y,
        Saved {
            x: x_keep.ok_or_else(not_as_asked)?,
            w: w_keep,
        },
    ))
}

/// Whether the backward of `recipe` reads the master weight (a BF16 dgrad
/// keeps no copy of W), so the caller must hold on to it.
pub fn reads_master_weight(recipe: &Recipe) -> bool {
    recipe.spec().saved().w.is_none()
}

/// Backward of [`forward`]: dx `[m, k]` as `dx_dtype`, dW `[n, k]` and, with
/// a bias, db `[n]` in f32. `dy` is `[m, n]`, packed; `w` is the master
/// weight, needed when [`reads_master_weight`].
#[allow(clippy::too_many_arguments)]
pub fn backward<B: LinearBackend>(
    recipe: &Recipe,
    saved: &Saved<B>,
    w: Option<&B>,
    dy: &B,
    has_bias: bool,
    dx_dtype: DType,
    s: LinearShape,
    ctx: &LinearCtx,
) -> Result<Grads<B>> {
    let LinearShape { m, k, n } = s;
    check_len("dy", dy, m * n, s)?;
    let spec = recipe.spec();
    count_run(recipe.kind);
    let dev = dy.device();
    let (mut dyq, _) = dy.quantize(
        m,
        n,
        &[
            Want::new(&spec.dgrad.a, Along::Cols, Some(ctx.sr_key(0)))?,
            Want::new(&spec.wgrad.a, Along::Rows, Some(ctx.sr_key(1)))?,
        ],
        None,
        &|| ctx.label("gradient"),
    )?;
    let (Some(dy_m), Some(dy_n), None) = (dyq.pop(), dyq.pop(), dyq.pop()) else {
        return Err(not_as_asked());
    };
    // dgrad dx = dy W: reduction over N.
    let dx = match &saved.w {
        Some(wk) => B::gemm(dev, &dy_n, wk, None, dx_dtype)?,
        None => {
            let w = w.ok_or_else(|| {
                Error::Autograd(format!(
                    "the backward of `{recipe}` reads the master weight, which was not kept"
                ))
            })?;
            check_len("W", w, n * k, s)?;
            let (wq, _) = w.quantize(
                n,
                k,
                &[Want::new(&spec.dgrad.b, Along::Rows, None)?],
                None,
                &|| ctx.label("weight"),
            )?;
            B::gemm(dev, &dy_n, &single(wq)?, None, dx_dtype)?
        }
    };
    drop(dy_n);
    // wgrad dW = dy^T x: reduction over M.
    let dw = B::gemm(dev, &dy_m, &saved.x, None, DType::F32)?;
    drop(dy_m);
    let db = has_bias.then(|| dy.column_sums(m, n)).transpose()?;
    Ok(Grads { dx, dw, db })
}
