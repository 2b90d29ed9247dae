//! The quantized linear y = x W^T + b (SPEC section 4), written once for
//! every backend against the [`LinearBackend`] primitives.
//!
//! Shapes: x `[M, K]`, W `[N, K]`, b `[N]`, dy `[M, N]`. A recipe resolves to
//! a [`LinearSpec`]: how each GEMM quantizes its two operands, each along
//! that GEMM's reduction axis:
//!
//! | GEMM | reduction | a | b |
//! |---|---|---|---|
//! | fprop y = x W^T | K | x along K ([`Along::Cols`]) | W along K |
//! | dgrad dx = dy W | N | dy along N | W along N ([`Along::Rows`], kept) |
//! | wgrad dW = dy^T x | M | dy along M | x along M (kept) |
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
//!
//! To check a backend against the CPU, call both with packed storages of
//! the same values (`CudaDevice::get(0)?.storage_from_cpu(..)` through
//! [`crate::backend::BackendDevice`]): [`forward`] gives y and a [`Saved`],
//! [`backward`] the [`Grads`]; [`Saved::to_cpu`] downloads the kept operands
//! in the CPU's form, so they compare with `==` (codes, scale bytes and FP8
//! scales), and `to_cpu_storage` downloads y, dx, dW and db.

use std::cell::Cell;

use crate::backend::{Along, BackendStorage, LinearBackend, Quantized, Request, Want};
use crate::cpu::CpuStorage;
use crate::quant::SrKey;
use crate::recipe::{LinearSpec, Recipe, RecipeKind};
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
    /// Rows of x and y (tokens).
    pub m: usize,
    /// Input features: columns of x and W.
    pub k: usize,
    /// Output features: rows of W, columns of y.
    pub n: usize,
}

/// Where a linear runs: names its errors and keys its stochastic rounding.
#[derive(Clone, Copy, Debug)]
pub struct LinearCtx<'a> {
    /// Plan path of the layer, e.g. `double_blocks.3.img_qkv`.
    pub layer: &'a str,
    /// The training iteration: names errors and is the SR key's step.
    pub iteration: u64,
    /// The run's seed, keying stochastic rounding.
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

/// One call of a linear: its recipe, its sizes and where it runs.
#[derive(Clone, Copy, Debug)]
pub struct LinearCall<'a> {
    /// The recipe whose [`LinearSpec`] decides each GEMM's operand formats.
    pub recipe: &'a Recipe,
    /// The sizes; [`forward`] and [`backward`] check the buffers against them.
    pub shape: LinearShape,
    /// The layer, iteration and seed of this call.
    pub ctx: LinearCtx<'a>,
}

impl LinearCall<'_> {
    /// The recipe's GEMMs, counting one run of its linear.
    fn start(&self) -> LinearSpec {
        count_run(self.recipe.kind);
        self.recipe.spec()
    }
}

/// What the forward keeps for the backward, and nothing else (SPEC 4a):
/// x as wgrad reads it and W as dgrad reads it, in the backend's memory.
pub struct Saved<B: LinearBackend> {
    /// x `[M, K]` as wgrad reads it (along M).
    pub x: B::Operand<'static>,
    /// `None` when dgrad is a BF16 GEMM, which reads the master weight.
    pub w: Option<B::Operand<'static>>,
    /// x's dtype, which dx takes.
    pub act: DType,
    /// Whether the forward added a bias, so the backward sums db.
    pub has_bias: bool,
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
            act: self.act,
            has_bias: self.has_bias,
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
    /// dx `[m, k]`, in x's dtype.
    pub dx: B,
    /// dW `[n, k]`, f32.
    pub dw: B,
    /// db `[n]`, f32; `None` when the forward had no bias.
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

/// Asks `t` (a packed `[rows, cols]` matrix) for its copies (and, with
/// `column_sums`, its column sums) and checks that the backend served each.
fn quantize<'a, B: LinearBackend>(
    t: &'a B,
    (rows, cols): (usize, usize),
    (now, keep, column_sums): (&[Want], Option<Want>, bool),
    label: &dyn Fn() -> String,
) -> Result<Quantized<'a, B>> {
    let req = Request {
        rows,
        cols,
        now,
        keep,
        column_sums,
        label,
    };
    let q = t.quantize(&req)?;
    if q.now.len() != now.len()
        || q.keep.is_some() != keep.is_some()
        || q.column_sums.is_some() != column_sums
    {
        return Err(not_as_asked());
    }
    Ok(q)
}

/// Forward y = x W^T + b: x `[m, k]` (f32 or BF16), W `[n, k]` and b `[n]`
/// f32, all packed; returns y `[m, n]` in x's dtype and what the backward
/// needs.
pub fn forward<B: LinearBackend>(
    call: &LinearCall,
    x: &B,
    w: &B,
    b: Option<&B>,
) -> Result<(B, Saved<B>)> {
    let (s, ctx) = (call.shape, &call.ctx);
    let LinearShape { m, k, n } = s;
    check_len("x", x, m * k, s)?;
    check_len("W", w, n * k, s)?;
    if let Some(b) = b {
        check_len("b", b, n, s)?;
    }
    let spec = call.start();
    let xq = quantize(
        x,
        (m, k),
        (
            &[Want::new(&spec.fprop.a, Along::Cols, None)?],
            Some(Want::new(&spec.wgrad.b, Along::Rows, None)?),
            false,
        ),
        &|| ctx.label("activation"),
    )?;
    let w_keep = spec.saved().w;
    let w_keep = w_keep
        .map(|w| Want::new(&w, Along::Rows, None))
        .transpose()?;
    let w_fprop = Want::new(&spec.fprop.b, Along::Cols, None)?;
    let wq = quantize(w, (n, k), (&[w_fprop], w_keep, false), &|| {
        ctx.label("weight")
    })?;
    let y = B::gemm(x.device(), &xq.now[0], &wq.now[0], b, x.dtype())?;
    let saved = Saved {
        x: xq.keep.ok_or_else(not_as_asked)?,
        w: wq.keep,
        act: x.dtype(),
        has_bias: b.is_some(),
    };
    Ok((y, saved))
}

/// Whether the backward of `recipe` reads the master weight (a BF16 dgrad
/// keeps no copy of W), so the caller must hold on to it.
pub fn reads_master_weight(recipe: &Recipe) -> bool {
    recipe.spec().saved().w.is_none()
}

/// Backward of [`forward`]: dx `[m, k]` in x's dtype, dW `[n, k]` and, with
/// a bias, db `[n]` in f32. `dy` is `[m, n]`, packed; `w` is the master
/// weight, needed when [`reads_master_weight`].
pub fn backward<B: LinearBackend>(
    call: &LinearCall,
    saved: &Saved<B>,
    w: Option<&B>,
    dy: &B,
) -> Result<Grads<B>> {
    let (s, ctx) = (call.shape, &call.ctx);
    let LinearShape { m, k, n } = s;
    check_len("dy", dy, m * n, s)?;
    let spec = call.start();
    let dev = dy.device();
    // db comes with dy's operands, from the same pass over dy where the
    // backend's kernels allow.
    let dyq = quantize(
        dy,
        (m, n),
        (
            &[
                Want::new(&spec.dgrad.a, Along::Cols, Some(ctx.sr_key(0)))?,
                Want::new(&spec.wgrad.a, Along::Rows, Some(ctx.sr_key(1)))?,
            ],
            None,
            saved.has_bias,
        ),
        &|| ctx.label("gradient"),
    )?;
    let db = dyq.column_sums;
    let [dy_n, dy_m]: [B::Operand<'_>; 2] = dyq.now.try_into().map_err(|_| not_as_asked())?;
    // dgrad dx = dy W: reduction over N.
    let dx = match &saved.w {
        Some(wk) => B::gemm(dev, &dy_n, wk, None, saved.act)?,
        None => {
            let w = w.ok_or_else(|| {
                Error::Autograd(format!(
                    "the backward of `{}` reads the master weight, which was not kept",
                    call.recipe
                ))
            })?;
            check_len("W", w, n * k, s)?;
            let w_dgrad = Want::new(&spec.dgrad.b, Along::Rows, None)?;
            let wq = quantize(w, (n, k), (&[w_dgrad], None, false), &|| {
                ctx.label("weight")
            })?;
            B::gemm(dev, &dy_n, &wq.now[0], None, saved.act)?
        }
    };
    drop(dy_n);
    // wgrad dW = dy^T x: reduction over M.
    let dw = B::gemm(dev, &dy_m, &saved.x, None, DType::F32)?;
    drop(dy_m);
    Ok(Grads { dx, dw, db })
}
