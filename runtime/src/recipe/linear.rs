//! The three GEMMs of a quantized linear, y = x W^T + b (SPEC section 4).
//!
//! Shapes: x `[M, K]`, W `[N, K]`, b `[N]`, dy `[M, N]`. Each GEMM quantizes its
//! operands along its own reduction axis:
//!
//! | GEMM | reduction | mxfp4 / mxfp8 | fp8 |
//! |---|---|---|---|
//! | fprop y = x W^T | K | x 1x32 along K; W tiles along K | x, W E4M3 |
//! | dgrad dx = dy W | N | dy 1x32 along N; W along N (saved) | dy E5M2; W E4M3 (saved) |
//! | wgrad dW = dy^T x | M | dy, x 1x32 along M, Hadamard (x saved) | dy E5M2; x E4M3 (saved) |
//!
//! The GEMMs multiply dequantized operands with f32 accumulation (exact for
//! the MX and FP8 codes, whose products are f32 values) and write f32. Bias
//! is added after the GEMM in f32, and db is the f32 column sum of dy.

use std::cell::Cell;

use rayon::prelude::*;

use super::{Recipe, RecipeKind};
use crate::cpu::matmul::matmul;
use crate::formats::{bf16, ElemFormat};
use crate::quant::{
    quantize_mx, quantize_rows, quantize_tensorwise, Fp8Tensor, MxConfig, MxTensor, SrKey,
};
use crate::{Error, Layout, Result, Shape};

thread_local! {
    /// Runs of each recipe's GEMM code (forward and backward calls) on this
    /// thread, so a warm-up can prove that every scheduled recipe's kernels
    /// ran. Per thread, so concurrent work elsewhere cannot fake a run.
    static KERNEL_RUNS: [Cell<u64>; RecipeKind::ALL.len()] = const { [const { Cell::new(0) }; RecipeKind::ALL.len()] };
}

/// How many times the linear forward or backward of `kind` has run on this thread.
pub fn kernel_runs(kind: RecipeKind) -> u64 {
    KERNEL_RUNS.with(|k| k[kind as usize].get())
}

/// Count one run of `kind`'s linear code (the GPU path counts through this too).
pub(crate) fn count_run(kind: RecipeKind) {
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
    /// 1: wgrad dy) when `recipe` asks for SR; every backend uses this one.
    pub fn sr_key(&self, recipe: &Recipe, id: u64) -> Option<SrKey> {
        recipe.sr.then_some(SrKey {
            seed: self.seed,
            step: self.iteration,
            tensor_id: 2 * self.layer_id + id,
        })
    }
}

/// What the forward keeps for the backward, and nothing else.
#[derive(Clone, Debug)]
pub enum Saved {
    /// x in BF16 (the master weight is read again in backward).
    Bf16 { x: Vec<u16> },
    /// x and W in E4M3 with their scales.
    Fp8 { x: Fp8Tensor, w: Fp8Tensor },
    /// x quantized along M (Hadamard per recipe) and W along N.
    Mx { x_m: MxTensor, w_n: MxTensor },
}

impl Saved {
    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        match self {
            Saved::Bf16 { x } => 2 * x.len(),
            Saved::Fp8 { x, w } => x.nbytes() + w.nbytes(),
            Saved::Mx { x_m, w_n } => x_m.nbytes() + w_n.nbytes(),
        }
    }

    /// Elements of the saved tensors, before any padding.
    pub fn elements(&self) -> usize {
        match self {
            Saved::Bf16 { x } => x.len(),
            Saved::Fp8 { x, w } => x.codes.len() + w.codes.len(),
            Saved::Mx { x_m, w_n } => x_m.rows * x_m.len + w_n.rows * w_n.len,
        }
    }
}

/// Gradients of one linear.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearGrads {
    pub dx: Vec<f32>,
    pub dw: Vec<f32>,
    pub db: Option<Vec<f32>>,
}

fn check_len(what: &str, got: usize, want: usize, shape: LinearShape) -> Result<()> {
    if got != want {
        return Err(Error::Shape(format!(
            "linear {}x{} -> {}: {what} has {got} elements, expected {want}",
            shape.m, shape.k, shape.n
        )));
    }
    Ok(())
}

/// Forward y = x W^T + b under `recipe`; returns y [m, n] and what backward needs.
pub fn forward(
    recipe: &Recipe,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    s: LinearShape,
    ctx: &LinearCtx,
) -> Result<(Vec<f32>, Saved)> {
    check_len("x", x.len(), s.m * s.k, s)?;
    check_len("W", w.len(), s.n * s.k, s)?;
    if let Some(b) = b {
        check_len("b", b.len(), s.n, s)?;
    }
    let LinearShape { m, k, n } = s;
    count_run(recipe.kind);
    let (mut y, saved) = match recipe.kind {
        RecipeKind::Bf16 => {
            let xb: Vec<u16> = x.par_iter().map(|&v| bf16::from_f32(v)).collect();
            let xr = widen(&xb);
            let wr: Vec<f32> = w.par_iter().map(|&v| bf16::round(v)).collect();
            (gemm_nt(&xr, &wr, m, n, k, 1.0), Saved::Bf16 { x: xb })
        }
        RecipeKind::Fp8 | RecipeKind::Fp8Fnuz => {
            let (fwd, _) = recipe.fp8_formats();
            let xq = quantize_tensorwise(x, &[m, k], fwd, recipe.pow2, &ctx.label("activation"))?;
            let wq = quantize_tensorwise(w, &[n, k], fwd, recipe.pow2, &ctx.label("weight"))?;
            let y = gemm_nt(
                &decode(&xq),
                &decode(&wq),
                m,
                n,
                k,
                xq.scale_inv * wq.scale_inv,
            );
            (y, Saved::Fp8 { x: xq, w: wq })
        }
        RecipeKind::Mxfp4 | RecipeKind::Mxfp8 => {
            let cfg = recipe.mx_config();
            let tiles = MxConfig {
                tile2d: recipe.tile2d,
                ..cfg
            };
            let x_k = quantize_rows(x, m, k, &cfg)?;
            let w_k = quantize_rows(w, n, k, &tiles)?;
            let y = gemm_nt(
                &x_k.dequantize_rows(),
                &w_k.dequantize_rows(),
                m,
                n,
                x_k.padded_len,
                1.0,
            );
            let x_m = quantize_mx(
                x,
                &[m, k],
                0,
                &MxConfig {
                    hadamard: recipe.hadamard,
                    ..cfg
                },
            )?;
            let w_n = quantize_mx(w, &[n, k], 0, &tiles)?;
            (y, Saved::Mx { x_m, w_n })
        }
    };
    if let Some(b) = b {
        y.par_chunks_mut(n)
            .for_each(|row| row.iter_mut().zip(b).for_each(|(v, b)| *v += b));
    }
    Ok((y, saved))
}

/// Backward of [`forward`]: dx `[m, k]`, dW `[n, k]` and, with a bias, db `[n]`.
/// `w` is the master weight (read only by the `bf16` recipe).
pub fn backward(
    recipe: &Recipe,
    saved: &Saved,
    w: &[f32],
    dy: &[f32],
    has_bias: bool,
    s: LinearShape,
    ctx: &LinearCtx,
) -> Result<LinearGrads> {
    check_len("dy", dy.len(), s.m * s.n, s)?;
    let LinearShape { m, k, n } = s;
    count_run(recipe.kind);
    let (dx, dw) = match (recipe.kind, saved) {
        (RecipeKind::Bf16, Saved::Bf16 { x }) => {
            check_len("W", w.len(), n * k, s)?;
            let dyr: Vec<f32> = dy.par_iter().map(|&v| bf16::round(v)).collect();
            let wr: Vec<f32> = w.par_iter().map(|&v| bf16::round(v)).collect();
            let dx = gemm(&dyr, &[m, n], false, &wr, &[n, k], false, 1.0);
            let dw = gemm(&dyr, &[m, n], true, &widen(x), &[m, k], false, 1.0);
            (dx, dw)
        }
        (RecipeKind::Fp8 | RecipeKind::Fp8Fnuz, Saved::Fp8 { x, w }) => {
            let (_, grad) = recipe.fp8_formats();
            let dyq = quantize_tensorwise(dy, &[m, n], grad, recipe.pow2, &ctx.label("gradient"))?;
            let dyd = decode(&dyq);
            let dx = gemm(&dyd, &[m, n], false, &decode(w), &[n, k], false, dyq.scale_inv * w.scale_inv);
            let dw = gemm(&dyd, &[m, n], true, &decode(x), &[m, k], false, dyq.scale_inv * x.scale_inv);
            (dx, dw)
        }
        (RecipeKind::Mxfp4 | RecipeKind::Mxfp8, Saved::Mx { x_m, w_n }) => {
            let cfg = recipe.mx_config();
            let sr = |id| ctx.sr_key(recipe, id);
            // dgrad: reduction over N.
            let dy_n = quantize_rows(dy, m, n, &MxConfig { sr: sr(0), ..cfg })?;
            let dx = gemm_nt(&dy_n.dequantize_rows(), &w_n.dequantize_rows(), m, k, dy_n.padded_len, 1.0);
            // wgrad: reduction over M, both operands rotated alike.
            let dy_m = quantize_mx(dy, &[m, n], 0, &MxConfig { sr: sr(1), hadamard: recipe.hadamard, ..cfg })?;
            let dw = gemm_nt(&dy_m.dequantize_rows(), &x_m.dequantize_rows(), n, k, dy_m.padded_len, 1.0);
            (dx, dw)
        }
        (kind, _) => {
            return Err(Error::InvalidOption(format!(
                "the saved tensors do not belong to recipe `{kind}`: a linear switched recipe between its forward and backward"
            )))
        }
    };
    let db = has_bias.then(|| column_sums(dy, m, n));
    Ok(LinearGrads { dx, dw, db })
}

/// Column sums of a row-major [m, n] matrix, in f32.
fn column_sums(x: &[f32], m: usize, n: usize) -> Vec<f32> {
    let mut s = vec![0.0f32; n];
    for row in x.chunks(n).take(m) {
        s.iter_mut().zip(row).for_each(|(s, v)| *s += v);
    }
    s
}

fn widen(x: &[u16]) -> Vec<f32> {
    x.par_iter().map(|&v| bf16::to_f32(v)).collect()
}

/// Decoded codes (exact values, scale not applied).
fn decode(q: &Fp8Tensor) -> Vec<f32> {
    let t = q.elem.decode_table();
    debug_assert!(q.elem != ElemFormat::E2M1);
    q.codes.par_iter().map(|&c| t[c as usize]).collect()
}

/// C [m, n] = alpha * A [m, k] B [n, k]^T, both operands K-major.
fn gemm_nt(a: &[f32], b: &[f32], m: usize, n: usize, k: usize, alpha: f32) -> Vec<f32> {
    gemm(a, &[m, k], false, b, &[n, k], true, alpha)
}

/// C = alpha * op(A) op(B) for row-major A and B of the given shapes, where
/// op transposes when asked (a strided view, no copy); f32 accumulation.
fn gemm(
    a: &[f32],
    a_dims: &[usize; 2],
    a_t: bool,
    b: &[f32],
    b_dims: &[usize; 2],
    b_t: bool,
    alpha: f32,
) -> Vec<f32> {
    let view = |dims: &[usize; 2], t: bool| {
        let l = Layout::contiguous(Shape::new(dims.to_vec()));
        if t {
            l.permute(&[1, 0]).expect("a 2-D layout permutes")
        } else {
            l
        }
    };
    let mut c = matmul(a, &view(a_dims, a_t), b, &view(b_dims, b_t));
    if alpha != 1.0 {
        c.par_iter_mut().for_each(|v| *v *= alpha);
    }
    c
}
