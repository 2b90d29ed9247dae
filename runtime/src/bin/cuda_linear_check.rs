//! `cuda_linear_check`: the GPU recipe linears ([`mxswitch_runtime::cuda::linear`])
//! against the CPU reference ([`mxswitch_runtime::recipe::linear`]).
//!
//! For several shapes (including M, K, N that are not multiples of 16 or 32
//! and a Flux-like 512 x 768 -> 3072), every recipe (and `mxfp4(sr = true)`)
//! and both activation dtypes (f32, BF16), on seeded random x, W, b, dy:
//!
//! - the saved tensors must equal the CPU's `Saved` byte for byte (codes,
//!   scale bytes, FP8 scale and scale_inv bits), with the same byte and
//!   element counts;
//! - y, dx, dW must agree up to accumulation order plus the rounding of the
//!   output: `|gpu - cpu| <= eps * ||a_i||_2 ||b_j||_2 + rel * |cpu| + 2^-126`
//!   with `eps = K_red * 2^-23`, where a_i, b_j are the rows of the two GEMM
//!   operands as the CPU dequantized them (so `||a_i|| ||b_j||` bounds
//!   `sum_k |a_ik b_jk|`), K_red the reduction length, and rel = 2^-8 for a
//!   BF16 output, 2^-22 for f32. The `fp8` recipe's cuBLASLt FP8 GEMMs add
//!   2^-9 to eps: Hopper's FP8 MMA keeps about 14 bits of its accumulator,
//!   truncating (biased) between cuBLASLt's promotions to f32; measured
//!   errors reach 2^-11.2 * sum |a b|, so this bound is empirical (4x margin);
//! - db (f32 column sums in another order): M * 2^-23 * sum_i |dy_ij|.
//!
//! Then fwd + bwd of every recipe at M = 4096, K = N = 3072 (BF16
//! activations), in TFLOP/s and relative to `bf16`. Prints `N passed, M
//! failed`; exits 1 on a failure and 2 without a usable GPU.

use std::process::ExitCode;
use std::time::Instant;

use rayon::prelude::*;

use mxswitch_runtime::cuda::linear as glin;
use mxswitch_runtime::cuda::{CudaContext, CudaError, DevBuf};
use mxswitch_runtime::formats::{bf16, ElemFormat};
use mxswitch_runtime::quant::{
    quantize_mx, quantize_rows, quantize_tensorwise, MxConfig, MxTensor, SrKey,
};
use mxswitch_runtime::recipe::linear::{self as clin, LinearCtx, LinearShape, Saved};
use mxswitch_runtime::recipe::{Recipe, RecipeKind};
use mxswitch_runtime::DType;

type CheckResult = std::result::Result<String, String>;

fn gpu<T>(r: Result<T, CudaError>) -> Result<T, String> {
    r.map_err(|e| format!("GPU error: {e}"))
}

fn cpu<T>(r: mxswitch_runtime::Result<T>) -> Result<T, String> {
    r.map_err(|e| format!("CPU error: {e}"))
}

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let u = self.unit().max(1e-300);
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * self.unit()).cos()
    }
}

/// `rows x cols` normal values times `scale`, each row also scaled by
/// 2^(row % 7 - 3) so that MX blocks see different magnitudes.
fn data(rows: usize, cols: usize, seed: u64, scale: f64) -> Vec<f32> {
    let mut x = vec![0.0f32; rows * cols];
    x.par_chunks_mut(cols.max(1))
        .enumerate()
        .for_each(|(r, out)| {
            let mut g = Rng(seed ^ (r as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
            let s = scale * 2f64.powi((r % 7) as i32 - 3);
            for v in out {
                *v = (g.normal() * s) as f32;
            }
        });
    x
}

fn mx_cfg(r: &Recipe) -> MxConfig {
    MxConfig {
        elem: if r.kind == RecipeKind::Mxfp4 {
            ElemFormat::E2M1
        } else {
            ElemFormat::E4M3FN
        },
        scale_mode: r.scale,
        tile2d: false,
        hadamard: false,
        sr: None,
    }
}

/// L2 norms of the rows of `[rows, cols]`, in f64.
fn row_norms(x: &[f32], rows: usize, cols: usize) -> Vec<f64> {
    (0..rows)
        .into_par_iter()
        .map(|r| {
            x[r * cols..(r + 1) * cols]
                .iter()
                .map(|&v| (v as f64) * (v as f64))
                .sum::<f64>()
                .sqrt()
        })
        .collect()
}

/// L2 norms of the columns of `[rows, cols]`.
fn col_norms(x: &[f32], rows: usize, cols: usize) -> Vec<f64> {
    let mut s = vec![0.0f64; cols];
    for r in 0..rows {
        for (c, acc) in s.iter_mut().enumerate() {
            let v = x[r * cols + c] as f64;
            *acc += v * v;
        }
    }
    s.into_iter().map(f64::sqrt).collect()
}

fn mx_norms(q: &MxTensor) -> Vec<f64> {
    row_norms(&q.dequantize_rows(), q.rows, q.padded_len)
}

/// Row norms of the two operands of each GEMM as the CPU multiplies them
/// (dequantized, rotated, scale_inv applied): (fprop, dgrad, wgrad), each
/// (a rows, b rows, reduction length).
type Norms = (Vec<f64>, Vec<f64>, usize);

#[allow(clippy::too_many_arguments)]
fn operand_norms(
    r: &Recipe,
    x: &[f32],
    w: &[f32],
    dy: &[f32],
    saved: &Saved,
    s: LinearShape,
    l: &LinearCtx,
) -> Result<[Norms; 3], String> {
    let LinearShape { m, k, n } = s;
    Ok(match saved {
        Saved::Bf16 { x: xb } => {
            let xr: Vec<f32> = xb.iter().map(|&v| bf16::to_f32(v)).collect();
            let wr: Vec<f32> = w.iter().map(|&v| bf16::round(v)).collect();
            let dyr: Vec<f32> = dy.iter().map(|&v| bf16::round(v)).collect();
            [
                (row_norms(&xr, m, k), row_norms(&wr, n, k), k),
                (row_norms(&dyr, m, n), col_norms(&wr, n, k), n),
                (col_norms(&dyr, m, n), col_norms(&xr, m, k), m),
            ]
        }
        Saved::Fp8 { x: xq, w: wq } => {
            let grad = if r.kind == RecipeKind::Fp8Fnuz {
                ElemFormat::E5M2FNUZ
            } else {
                ElemFormat::E5M2
            };
            let dyq = cpu(quantize_tensorwise(dy, &[m, n], grad, r.pow2, "dy"))?;
            let (xd, wd, dyd) = (xq.dequantize(), wq.dequantize(), dyq.dequantize());
            [
                (row_norms(&xd, m, k), row_norms(&wd, n, k), k),
                (row_norms(&dyd, m, n), col_norms(&wd, n, k), n),
                (col_norms(&dyd, m, n), col_norms(&xd, m, k), m),
            ]
        }
        Saved::Mx { x_m, w_n } => {
            let cfg = mx_cfg(r);
            let tiles = MxConfig {
                tile2d: r.tile2d,
                ..cfg
            };
            let sr = |id| {
                r.sr.then_some(SrKey {
                    seed: l.seed,
                    step: l.iteration,
                    tensor_id: 2 * l.layer_id + id,
                })
            };
            let x_k = cpu(quantize_rows(x, m, k, &cfg))?;
            let w_k = cpu(quantize_rows(w, n, k, &tiles))?;
            let dy_n = cpu(quantize_rows(dy, m, n, &MxConfig { sr: sr(0), ..cfg }))?;
            let dy_m = cpu(quantize_mx(
                dy,
                &[m, n],
                0,
                &MxConfig {
                    sr: sr(1),
                    hadamard: r.hadamard,
                    ..cfg
                },
            ))?;
            [
                (mx_norms(&x_k), mx_norms(&w_k), x_k.padded_len),
                (mx_norms(&dy_n), mx_norms(w_n), dy_n.padded_len),
                (mx_norms(&dy_m), mx_norms(x_m), dy_m.padded_len),
            ]
        }
    })
}

/// Worst |gpu - cpu| / bound over `[rows, cols]`, or the first violation.
fn compare(
    what: &str,
    got: &[f32],
    want: &[f32],
    norms: &Norms,
    bf16_out: bool,
    fp8_mma: bool,
) -> Result<f64, String> {
    let (na, nb, kred) = norms;
    let cols = nb.len();
    let rel = if bf16_out {
        2f64.powi(-8)
    } else {
        2f64.powi(-22)
    };
    // Hopper's FP8 MMA keeps about 14 bits in its accumulator between
    // cuBLASLt's promotions to f32, truncating: up to 2^-11.2 of the
    // |products| summed was measured on an H200; 2^-9 leaves 4x margin.
    let eps = *kred as f64 * 2f64.powi(-23) + if fp8_mma { 2f64.powi(-9) } else { 0.0 };
    if got.len() != want.len() || got.len() != na.len() * cols {
        return Err(format!(
            "{what}: {} values, CPU {}, expected {}",
            got.len(),
            want.len(),
            na.len() * cols
        ));
    }
    let mut worst = 0.0f64;
    for (i, (&g, &c)) in got.iter().zip(want).enumerate() {
        let (r, j) = (i / cols, i % cols);
        let tol = eps * na[r] * nb[j] + rel * (c as f64).abs() + 2f64.powi(-126);
        let err = (g as f64 - c as f64).abs();
        if err.is_nan() || err > tol {
            return Err(format!(
                "{what}[{r}, {j}]: gpu {g:e}, cpu {c:e}, |err| {err:.3e} > bound {tol:.3e}"
            ));
        }
        worst = worst.max(err / tol);
    }
    Ok(worst)
}

fn same_saved(g: &Saved, c: &Saved) -> Result<(), String> {
    match (g, c) {
        (Saved::Bf16 { x: a }, Saved::Bf16 { x: b }) => {
            (a == b).then_some(()).ok_or("saved BF16 x differs".into())
        }
        (Saved::Fp8 { x: gx, w: gw }, Saved::Fp8 { x: cx, w: cw }) => {
            for (name, a, b) in [("x", gx, cx), ("W", gw, cw)] {
                if a.codes != b.codes {
                    let i = a.codes.iter().zip(&b.codes).position(|(p, q)| p != q);
                    return Err(format!(
                        "saved FP8 {name} codes differ (first at {i:?}, {} vs {} codes)",
                        a.codes.len(),
                        b.codes.len()
                    ));
                }
                if a.scale.to_bits() != b.scale.to_bits()
                    || a.scale_inv.to_bits() != b.scale_inv.to_bits()
                    || a.elem != b.elem
                    || a.shape != b.shape
                {
                    return Err(format!(
                        "saved FP8 {name}: scale {:e}/{:e} vs CPU {:e}/{:e}",
                        a.scale, a.scale_inv, b.scale, b.scale_inv
                    ));
                }
            }
            Ok(())
        }
        (Saved::Mx { x_m: gx, w_n: gw }, Saved::Mx { x_m: cx, w_n: cw }) => {
            for (name, a, b) in [("x_m", gx, cx), ("w_n", gw, cw)] {
                if (a.rows, a.len, a.padded_len, &a.shape, a.axis)
                    != (b.rows, b.len, b.padded_len, &b.shape, b.axis)
                {
                    return Err(format!("saved {name} layout differs"));
                }
                if a.scales != b.scales {
                    let i = a.scales.iter().zip(&b.scales).position(|(p, q)| p != q);
                    return Err(format!("saved {name} scale bytes differ (first at {i:?})"));
                }
                if a.codes != b.codes {
                    let i = a.codes.iter().zip(&b.codes).position(|(p, q)| p != q);
                    return Err(format!("saved {name} codes differ (first at {i:?})"));
                }
            }
            Ok(())
        }
        _ => Err("saved tensors of another recipe".into()),
    }
}

/// Uploads `v` as f32 or as BF16.
fn upload_act(ctx: &CudaContext, v: &[f32], act: DType) -> Result<DevBuf, String> {
    if act == DType::BF16 {
        let h: Vec<u16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
        gpu(ctx.upload(&h))
    } else {
        gpu(ctx.upload(v))
    }
}

fn download_act(ctx: &CudaContext, b: &DevBuf, n: usize, act: DType) -> Result<Vec<f32>, String> {
    if act == DType::BF16 {
        let h: Vec<u16> = gpu(ctx.download(b, n))?;
        Ok(h.iter().map(|&v| bf16::to_f32(v)).collect())
    } else {
        gpu(ctx.download(b, n))
    }
}

fn check_case(ctx: &CudaContext, r: &Recipe, s: LinearShape, act: DType, seed: u64) -> CheckResult {
    let LinearShape { m, k, n } = s;
    let lctx = LinearCtx {
        layer: "check.linear",
        iteration: 1234,
        seed: 0x5eed_0000_0000_0001 ^ seed,
        layer_id: 7,
    };
    let mut x = data(m, k, seed, 1.0);
    let w = data(n, k, seed + 1, 1.0 / (k as f64).sqrt());
    let b = data(1, n, seed + 2, 0.1);
    let mut dy = data(m, n, seed + 3, 1e-3);
    if act == DType::BF16 {
        // The CPU sees the values the GPU holds.
        x.iter_mut().for_each(|v| *v = bf16::round(*v));
        dy.iter_mut().for_each(|v| *v = bf16::round(*v));
    }
    // CPU reference.
    let (cy, csaved) = cpu(clin::forward(r, &x, &w, Some(&b), s, &lctx))?;
    let cg = cpu(clin::backward(r, &csaved, &w, &dy, true, s, &lctx))?;
    // GPU.
    let (xd, wd, bd, dyd) = (
        upload_act(ctx, &x, act)?,
        gpu(ctx.upload(&w))?,
        gpu(ctx.upload(&b))?,
        upload_act(ctx, &dy, act)?,
    );
    let (gy, gsaved) = gpu(glin::forward(ctx, r, &xd, act, &wd, Some(&bd), s, &lctx))?;
    let gg = gpu(glin::backward(
        ctx, r, &gsaved, &wd, &dyd, act, true, s, &lctx,
    ))?;
    let gy = download_act(ctx, &gy, m * n, act)?;
    let gdx = download_act(ctx, &gg.dx, m * k, act)?;
    let gdw: Vec<f32> = gpu(ctx.download(&gg.dw, n * k))?;
    let gdb: Vec<f32> = gpu(ctx.download(gg.db.as_ref().ok_or("no db")?, n))?;
    // Saved, byte for byte.
    let gs = gpu(gsaved.download(ctx))?;
    same_saved(&gs, &csaved)?;
    if gsaved.nbytes() != csaved.nbytes() || gsaved.elements() != csaved.elements() {
        return Err(format!(
            "saved {} bytes / {} elements, CPU {} / {}",
            gsaved.nbytes(),
            gsaved.elements(),
            csaved.nbytes(),
            csaved.elements()
        ));
    }
    // Results.
    let [nf, nd, nw] = operand_norms(r, &x, &w, &dy, &csaved, s, &lctx)?;
    let bf = act == DType::BF16;
    let f8 = r.kind == RecipeKind::Fp8;
    let ry = compare("y", &gy, &cy, &nf, bf, f8)?;
    let rdx = compare("dx", &gdx, &cg.dx, &nd, bf, f8)?;
    let rdw = compare("dW", &gdw, &cg.dw, &nw, false, f8)?;
    let cdb = cg.db.as_ref().ok_or("CPU gave no db")?;
    let mut rdb = 0.0f64;
    for j in 0..n {
        let abs: f64 = (0..m).map(|i| (dy[i * n + j] as f64).abs()).sum();
        let tol = m as f64 * 2f64.powi(-23) * abs + 2f64.powi(-126);
        let err = (gdb[j] as f64 - cdb[j] as f64).abs();
        if err.is_nan() || err > tol {
            return Err(format!(
                "db[{j}]: gpu {:e}, cpu {:e}, |err| {err:.3e} > {tol:.3e}",
                gdb[j], cdb[j]
            ));
        }
        rdb = rdb.max(err / tol);
    }
    Ok(format!(
        "saved identical ({} B, {:.5} B/elem); worst err/bound y {ry:.3}, dx {rdx:.3}, dW {rdw:.3}, db {rdb:.3}",
        gsaved.nbytes(),
        gsaved.nbytes() as f64 / gsaved.elements() as f64
    ))
}

/// A NaN in x under fp8 must be the CPU's error, naming layer, role, iteration.
fn check_nonfinite(ctx: &CudaContext) -> CheckResult {
    let s = LinearShape {
        m: 32,
        k: 32,
        n: 32,
    };
    let lctx = LinearCtx {
        layer: "blocks.3.qkv",
        iteration: 77,
        seed: 1,
        layer_id: 3,
    };
    let mut x = data(32, 32, 9, 1.0);
    x[5] = f32::NAN;
    let w = data(32, 32, 10, 0.1);
    let r = Recipe::new(RecipeKind::Fp8);
    let cpu_err = match clin::forward(&r, &x, &w, None, s, &lctx) {
        Err(e) => e.to_string(),
        Ok(_) => return Err("CPU accepted a NaN activation".into()),
    };
    // The GPU records the amax and raises the error at the next check, so
    // the forward itself returns; nothing is read back before the check.
    let (xd, wd) = (gpu(ctx.upload(&x))?, gpu(ctx.upload(&w))?);
    let fwd = glin::forward(ctx, &r, &xd, DType::F32, &wd, None, s, &lctx);
    let gpu_err = match fwd.and_then(|_| ctx.check_deferred()) {
        Err(CudaError::Runtime(e)) if e.to_string() == cpu_err => e.to_string(),
        Err(e) => return Err(format!("GPU error `{e}`, CPU `{cpu_err}`")),
        Ok(_) => return Err("GPU accepted a NaN activation".into()),
    };
    // A NaN gradient is named as the gradient, and a finite step leaves no error.
    let xd = gpu(ctx.upload(&data(32, 32, 9, 1.0)))?;
    let (_, saved) = gpu(glin::forward(ctx, &r, &xd, DType::F32, &wd, None, s, &lctx))?;
    gpu(ctx.check_deferred()).map_err(|e| format!("finite forward: {e}"))?;
    let mut dy = data(32, 32, 11, 1.0);
    dy[40] = f32::INFINITY;
    let dyd = gpu(ctx.upload(&dy))?;
    let bwd = glin::backward(ctx, &r, &saved, &wd, &dyd, DType::F32, false, s, &lctx);
    match bwd.and_then(|_| ctx.check_deferred()) {
        Err(CudaError::Runtime(e))
            if e.to_string()
                .contains("blocks.3.qkv gradient, iteration 77") =>
        {
            Ok(format!("errors `{gpu_err}` and `{e}`"))
        }
        Err(e) => Err(format!("infinite gradient gave `{e}`")),
        Ok(_) => Err("GPU accepted an infinite gradient".into()),
    }
}

fn recipes() -> Vec<Recipe> {
    let mut v: Vec<Recipe> = RecipeKind::ALL.iter().map(|&k| Recipe::new(k)).collect();
    v.push(
        Recipe::new(RecipeKind::Mxfp4)
            .with_option("sr", "true")
            .expect("sr applies to mxfp4"),
    );
    v
}

/// Median milliseconds of one fwd + bwd (BF16 activations, with bias) over
/// `iters` timed runs after two warm-ups, each run timed on the stream.
fn time_recipe(
    ctx: &CudaContext,
    r: &Recipe,
    s: LinearShape,
    bufs: (&DevBuf, &DevBuf, Option<&DevBuf>, &DevBuf),
    iters: usize,
) -> Result<f64, String> {
    let (xd, wd, bd, dyd) = bufs;
    let lctx = LinearCtx {
        layer: "bench",
        iteration: 1,
        seed: 3,
        layer_id: 1,
    };
    let step = || -> Result<(), String> {
        let (y, saved) = gpu(glin::forward(ctx, r, xd, DType::BF16, wd, bd, s, &lctx))?;
        let g = gpu(glin::backward(
            ctx,
            r,
            &saved,
            wd,
            dyd,
            DType::BF16,
            bd.is_some(),
            s,
            &lctx,
        ))?;
        drop((y, saved, g));
        Ok(())
    };
    for _ in 0..2 {
        step()?;
    }
    gpu(ctx.check_deferred())?;
    let mut ms = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = gpu(ctx.timer())?;
        step()?;
        ms.push(gpu(t.stop_ms())? as f64);
    }
    gpu(ctx.check_deferred())?;
    ms.sort_by(f64::total_cmp);
    Ok(ms[ms.len() / 2])
}

/// Prints one `BENCH linear` line per recipe and shape (fwd + bwd,
/// quantization included, TFLOP/s = 6 M K N / time).
/// `BENCH linear_nobias` lines time the same without a bias: cuBLASLt has no
/// f32 bias in a BF16-output or FP8 epilogue, so with a bias the forward
/// writes an f32 result and adds the bias in a second pass; the difference
/// measures that cost.
fn bench(ctx: &CudaContext, shapes: &[LinearShape], recipes: &[Recipe]) -> Result<(), String> {
    let to_bf = |v: Vec<f32>| -> Vec<u16> { v.iter().map(|&x| bf16::from_f32(x)).collect() };
    for &s in shapes {
        let xd = gpu(ctx.upload(&to_bf(data(s.m, s.k, 91, 1.0))))?;
        let wd = gpu(ctx.upload(&data(s.n, s.k, 92, 1.0 / (s.k as f64).sqrt())))?;
        let bd = gpu(ctx.upload(&data(1, s.n, 93, 0.1)))?;
        let dyd = gpu(ctx.upload(&to_bf(data(s.m, s.n, 94, 1e-3))))?;
        for r in recipes {
            for (bias, tag) in [(Some(&bd), "linear"), (None, "linear_nobias")] {
                let before = glin::bias_fallbacks();
                let ms = time_recipe(ctx, r, s, (&xd, &wd, bias, &dyd), 20)?;
                if glin::bias_fallbacks() != before {
                    println!("  ({r}: bias added after the GEMM, not in its epilogue)");
                }
                let tf = 6.0 * (s.m * s.n * s.k) as f64 / (ms * 1e-3) / 1e12;
                println!(
                    "BENCH {tag} {r} M={} K={} N={} ms={ms:.4} tflops={tf:.1}",
                    s.m, s.k, s.n
                );
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let t0 = Instant::now();
    let ctx = match CudaContext::new(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cuda_linear_check: {e}");
            return ExitCode::from(2);
        }
    };
    println!("device: {}", ctx.info());
    println!(
        "bound: |gpu - cpu| <= (K_red * 2^-23 [+ 2^-9 for fp8's FP8 MMA]) * ||a_i||_2 ||b_j||_2 + rel |cpu| + 2^-126 (rel 2^-8 BF16 out, 2^-22 f32 out); db: M * 2^-23 * sum_i |dy_ij|"
    );
    let (mut passed, mut failed) = (0usize, 0usize);
    let mut line = |name: String, r: CheckResult| match r {
        Ok(msg) => {
            passed += 1;
            println!("PASS {name}: {msg}");
        }
        Err(msg) => {
            failed += 1;
            println!("FAIL {name}: {msg}");
        }
    };
    let shapes = [
        LinearShape {
            m: 45,
            k: 70,
            n: 38,
        },
        LinearShape {
            m: 96,
            k: 64,
            n: 160,
        },
        LinearShape {
            m: 200,
            k: 1000,
            n: 120,
        },
        LinearShape {
            m: 512,
            k: 768,
            n: 3072,
        },
    ];
    for (si, &s) in shapes.iter().enumerate() {
        for (ri, r) in recipes().iter().enumerate() {
            for act in [DType::F32, DType::BF16] {
                let seed = 1000 * si as u64 + 10 * ri as u64 + (act == DType::BF16) as u64;
                let name = format!("{r} {act:?} {}x{}->{}", s.m, s.k, s.n);
                line(name, check_case(&ctx, r, s, act, seed));
            }
        }
    }
    line("fp8 NaN activation".into(), check_nonfinite(&ctx));

    // Speed: fwd + bwd with BF16 activations; `--bench` runs issue 7's shapes.
    let shape = |m, k, n| LinearShape { m, k, n };
    let (shapes, rs) = if std::env::args().any(|a| a == "--bench") {
        let rs = ["bf16", "fp8", "mxfp4", "mxfp8"]
            .iter()
            .map(|n| Recipe::new(RecipeKind::from_name(n).expect("a named recipe")))
            .collect();
        let m = 16384;
        (
            vec![
                shape(m, 3072, 12288),
                shape(m, 12288, 3072),
                shape(m, 3072, 3072),
            ],
            rs,
        )
    } else {
        (vec![shape(4096, 3072, 3072)], recipes())
    };
    if let Err(e) = bench(&ctx, &shapes, &rs) {
        line("timing".into(), Err(e));
    }
    let st = ctx.pool_stats();
    println!(
        "pool: {} cuMemAlloc, {} reuses, {:.1} MiB in use, {:.1} MiB cached",
        st.device_allocs,
        st.reuses,
        st.bytes_in_use as f64 / 1048576.0,
        st.bytes_cached as f64 / 1048576.0
    );
    println!(
        "summary: {passed} passed, {failed} failed ({:.1} s)",
        t0.elapsed().as_secs_f64()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
