//! The quantized linear ([`mxswitch_runtime::qlinear`]) on the CUDA backend
//! against the CPU backend.
//!
//! For several shapes (including M, K, N that are not multiples of 16 or 32
//! and a Flux-like 512 x 768 -> 3072), every recipe the GPU runs (all but
//! `nvfp4`), `mxfp4(sr = true)` and the per-GEMM overrides `mxfp4(fprop =
//! bf16)`, `mxfp4(dgrad = fp8, wgrad = fp8)` and `mxfp4(dgrad = fp8_block)`,
//! and both activation dtypes (f32, BF16), on seeded random
//! x, W, b, dy:
//!
//! - the saved tensors must equal the CPU's byte for byte (codes, scale
//!   bytes, FP8 scale and scale_inv bits, BF16 bits), with the same byte and
//!   element counts;
//! - y, dx, dW must agree up to accumulation order plus the rounding of the
//!   output: `|gpu - cpu| <= eps * ||a_i||_2 ||b_j||_2 + rel * |cpu| + 2^-126`
//!   with `eps = K_red * 2^-23`, where a_i, b_j are the rows of the two GEMM
//!   operands as the CPU dequantized them (so `||a_i|| ||b_j||` bounds
//!   `sum_k |a_ik b_jk|`), K_red the reduction length, and rel = 2^-8 for a
//!   BF16 output, 2^-22 for f32. A GEMM on the FP8 tensor cores adds 2^-9 to
//!   eps: Hopper's FP8 MMA keeps about 14 bits of its accumulator,
//!   truncating (biased) between cuBLASLt's promotions to f32; measured
//!   errors reach 2^-11.2 * sum |a b|, so this bound is empirical (4x margin);
//! - db (f32 column sums in another order): M * 2^-23 * sum_i |dy_ij|.

use mxswitch_runtime::backend::{BackendDevice, BackendStorage};
use mxswitch_runtime::cpu::CpuStorage;
use mxswitch_runtime::cuda::{CudaDevice, CudaError, CudaStorage};
use mxswitch_runtime::formats::bf16;
use mxswitch_runtime::qlinear::{self, LinearCall, LinearCtx, LinearShape};
use mxswitch_runtime::recipe::{Recipe, RecipeKind};
use mxswitch_runtime::DType;

use crate::common::{cpu, err, gpu, host, normal_chunks, widen, CheckResult, Report};
use crate::linear_ref::{gemm_refs, same_saved, within_bound};

/// `rows x cols` normal values times `scale`, each row also scaled by
/// 2^(row % 7 - 3) so that MX blocks see different magnitudes.
pub fn data(rows: usize, cols: usize, seed: u64, scale: f64) -> Vec<f32> {
    normal_chunks(rows * cols, cols, seed, |r| {
        scale * 2f64.powi((r % 7) as i32 - 3)
    })
}

/// `v` on the GPU as `dtype`.
pub fn upload(dev: &CudaDevice, v: &[f32], dtype: DType) -> Result<CudaStorage, String> {
    dev.storage_from_cpu(host(v, dtype)).map_err(err)
}

/// The values of a packed f32 or BF16 storage, as f32.
pub fn values<S: BackendStorage>(s: &S) -> Result<Vec<f32>, String> {
    match s.to_cpu_storage().map_err(err)? {
        CpuStorage::F32(v) => Ok(v),
        CpuStorage::BF16(b) => Ok(widen(&b)),
        CpuStorage::U8(_) => Err("a linear output of u8 codes".into()),
    }
}

/// One recipe on one shape and activation dtype: saved operands byte for
/// byte, y, dx, dW and db within their bounds.
fn check_case(dev: &CudaDevice, r: &Recipe, s: LinearShape, act: DType, seed: u64) -> CheckResult {
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
    // CPU reference, in f32.
    let f32s = |v: &[f32]| CpuStorage::F32(v.to_vec());
    let (xc, wc, bc, dyc) = (f32s(&x), f32s(&w), f32s(&b), f32s(&dy));
    let call = LinearCall {
        recipe: r,
        shape: s,
        ctx: lctx,
    };
    let (cy, csaved) = cpu(qlinear::forward(&call, &xc, &wc, Some(&bc)))?;
    let cg = cpu(qlinear::backward(&call, &csaved, Some(&wc), &dyc))?;
    // GPU, activations and dx in `act`.
    let (xd, wd, bd, dyd) = (
        upload(dev, &x, act)?,
        upload(dev, &w, DType::F32)?,
        upload(dev, &b, DType::F32)?,
        upload(dev, &dy, act)?,
    );
    let (gy, gsaved) = qlinear::forward(&call, &xd, &wd, Some(&bd)).map_err(err)?;
    let gg = qlinear::backward(&call, &gsaved, Some(&wd), &dyd).map_err(err)?;
    gpu(dev.context().check_deferred())?;
    let (gy, gdx, gdw) = (values(&gy)?, values(&gg.dx)?, values(&gg.dw)?);
    let gdb = values(gg.db.as_ref().ok_or("no db")?)?;
    // Saved, byte for byte.
    same_saved(&gsaved.to_cpu(dev).map_err(err)?, &csaved)?;
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
    let [nf, nd, nw] = gemm_refs(r, (&x, &w, &dy), (m, k, n), &lctx)?;
    let bf = act == DType::BF16;
    let ry = within_bound("y", &gy, &values(&cy)?, &nf, bf)?;
    let rdx = within_bound("dx", &gdx, &values(&cg.dx)?, &nd, bf)?;
    let rdw = within_bound("dW", &gdw, &values(&cg.dw)?, &nw, false)?;
    let cdb = values(cg.db.as_ref().ok_or("CPU gave no db")?)?;
    let mut rdb = 0.0f64;
    for j in 0..n {
        let abs: f64 = (0..m).map(|i| (dy[i * n + j] as f64).abs()).sum();
        let tol = m as f64 * 2f64.powi(-23) * abs + 2f64.powi(-126);
        let e = (gdb[j] as f64 - cdb[j] as f64).abs();
        if e.is_nan() || e > tol {
            return Err(format!(
                "db[{j}]: gpu {:e}, cpu {:e}, |err| {e:.3e} > {tol:.3e}",
                gdb[j], cdb[j]
            ));
        }
        rdb = rdb.max(e / tol);
    }
    Ok(format!(
        "saved identical ({} B, {:.5} B/elem); worst err/bound y {ry:.3}, dx {rdx:.3}, dW {rdw:.3}, db {rdb:.3}",
        gsaved.nbytes(),
        gsaved.nbytes() as f64 / gsaved.elements() as f64
    ))
}

/// The forward of `call` over an `x` holding a NaN: the CPU's refusal
/// message, after the same forward on the GPU, which records the amax and
/// raises at the next check (the forward itself returns, and nothing is read
/// back before the caller's check); and the uploaded weight.
fn refused_forward(
    dev: &CudaDevice,
    call: &LinearCall,
    x: &[f32],
    w: &[f32],
) -> Result<(String, CudaStorage), String> {
    let (xc, wc) = (host(x, DType::F32), host(w, DType::F32));
    let cpu_err = match qlinear::forward(call, &xc, &wc, None) {
        Err(e) => e.to_string(),
        Ok(_) => return Err("CPU accepted a NaN activation".into()),
    };
    let (xd, wd) = (upload(dev, x, DType::F32)?, upload(dev, w, DType::F32)?);
    drop(qlinear::forward(call, &xd, &wd, None).map_err(err)?);
    Ok((cpu_err, wd))
}

/// A NaN in x under fp8 must be the CPU's error, naming layer, role, iteration.
fn check_nonfinite(dev: &CudaDevice) -> CheckResult {
    let ctx = dev.context();
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
    let call = LinearCall {
        recipe: &r,
        shape: s,
        ctx: lctx,
    };
    let (cpu_err, wd) = refused_forward(dev, &call, &x, &w)?;
    let gpu_err = match ctx.check_deferred() {
        Err(CudaError::Runtime(e)) if e.to_string() == cpu_err => e.to_string(),
        Err(e) => return Err(format!("GPU error `{e}`, CPU `{cpu_err}`")),
        Ok(_) => return Err("GPU accepted a NaN activation".into()),
    };
    // A NaN gradient is named as the gradient, and a finite step leaves no error.
    let xd = upload(dev, &data(32, 32, 9, 1.0), DType::F32)?;
    let (_, saved) = qlinear::forward(&call, &xd, &wd, None).map_err(err)?;
    gpu(ctx.check_deferred()).map_err(|e| format!("finite forward: {e}"))?;
    let mut dy = data(32, 32, 11, 1.0);
    dy[40] = f32::INFINITY;
    let dyd = upload(dev, &dy, DType::F32)?;
    let bwd = qlinear::backward(&call, &saved, Some(&wd), &dyd);
    drop(bwd.map_err(err)?);
    match ctx.check_deferred() {
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

/// A NaN in x under nvfp4 is refused as the CPU refuses it: the same
/// message but for the first block's place (`, first in row .. of the axis`),
/// which the GPU does not look for.
fn check_nonfinite_nvfp4(dev: &CudaDevice) -> CheckResult {
    let s = LinearShape {
        m: 32,
        k: 40,
        n: 16,
    };
    let lctx = LinearCtx {
        layer: "blocks.5.mlp",
        iteration: 9,
        seed: 1,
        layer_id: 5,
    };
    let mut x = data(32, 40, 12, 1.0);
    x[45] = f32::NAN;
    let w = data(16, 40, 13, 0.1);
    let r = Recipe::new(RecipeKind::Nvfp4);
    let call = LinearCall {
        recipe: &r,
        shape: s,
        ctx: lctx,
    };
    let (cpu_err, _) = refused_forward(dev, &call, &x, &w)?;
    // The CPU's text with ", first in row .. of the axis" left out.
    let tail = " of the axis";
    let end = cpu_err.find("`: ").unwrap_or(0);
    let want = match (cpu_err.find(", first in row"), cpu_err[..end].rfind(tail)) {
        (Some(a), Some(b)) if a < b => format!("{}{}", &cpu_err[..a], &cpu_err[b + tail.len()..]),
        _ => return Err(format!("unexpected CPU error `{cpu_err}`")),
    };
    match dev.context().check_deferred() {
        Err(CudaError::Runtime(e)) if e.to_string() == want => Ok(format!("error `{e}`")),
        Err(e) => Err(format!("GPU error `{e}`, want `{want}`")),
        Ok(_) => Err("GPU accepted a NaN activation".into()),
    }
}

/// Every recipe of the table that the GPU backend runs, `mxfp4(sr = true)`
/// and SPEC section 4a's per-GEMM overrides `mxfp4(fprop = bf16)`,
/// `mxfp4(dgrad = fp8, wgrad = fp8)`, `mxfp4(dgrad = nvfp4)` and
/// `mxfp4(dgrad = fp8_block)`.
pub fn recipes() -> Result<Vec<Recipe>, String> {
    let mxfp4 = |opts: &[(&str, &str)]| {
        opts.iter()
            .try_fold(Recipe::new(RecipeKind::Mxfp4), |r, (k, v)| {
                r.with_option(k, v)
            })
            .map_err(|e| format!("recipe option: {e}"))
    };
    let mut v: Vec<Recipe> = RecipeKind::ALL.iter().map(|&k| Recipe::new(k)).collect();
    v.push(mxfp4(&[("sr", "true")])?);
    v.push(mxfp4(&[("fprop", "bf16")])?);
    v.push(mxfp4(&[("dgrad", "fp8"), ("wgrad", "fp8")])?);
    v.push(mxfp4(&[("dgrad", "nvfp4")])?);
    v.push(mxfp4(&[("dgrad", "fp8_block")])?);
    Ok(v)
}

/// Every recipe on every shape in f32 and BF16, then the non-finite errors.
pub fn check_linears(rep: &mut Report) {
    println!(
        "linear bound: |gpu - cpu| <= (K_red * 2^-23 [+ 2^-9 for an FP8 MMA]) * ||a_i||_2 ||b_j||_2 + rel |cpu| + 2^-126 (rel 2^-8 BF16 out, 2^-22 f32 out); db: M * 2^-23 * sum_i |dy_ij|"
    );
    let setup = CudaDevice::get(0)
        .map_err(err)
        .and_then(|d| Ok((d, recipes()?)));
    let (dev, recipes) = match setup {
        Ok(r) => r,
        Err(e) => return rep.line("linear setup", Err(e)),
    };
    let shape = |m, k, n| LinearShape { m, k, n };
    let shapes = [
        shape(45, 70, 38),
        shape(96, 64, 160),
        shape(200, 1000, 120),
        shape(512, 768, 3072),
    ];
    for (si, &s) in shapes.iter().enumerate() {
        for (ri, r) in recipes.iter().enumerate() {
            for act in [DType::F32, DType::BF16] {
                let seed = 1000 * si as u64 + 10 * ri as u64 + (act == DType::BF16) as u64;
                let name = format!("{r} {act:?} {}x{}->{}", s.m, s.k, s.n);
                rep.line(&name, check_case(&dev, r, s, act, seed));
            }
        }
    }
    rep.line("fp8 NaN activation", check_nonfinite(&dev));
    rep.line("nvfp4 NaN activation", check_nonfinite_nvfp4(&dev));
}
