//! Suite `fused`: the element-wise vector kernels (`*_vec` in
//! `ops_elementwise.cu`) and the fused modulation ops (`ops_fused.cu`) on
//! the GPU; benchmark `fused`: both at Flux.1 widths.
//!
//! Vector kernels. Each case runs one op three ways from the same values:
//! on the GPU with aligned packed inputs (the vector kernel), on the GPU
//! with the inputs one element off a 16-byte boundary or transposed in
//! memory (the generic kernel: `vec_ok` refuses them), and on the CPU.
//! Bounds: vector == generic bit for bit for every op (the same expression
//! per element); vector == CPU bit for bit for copies, casts, concat,
//! affine, add, sub, mul, div, sqr and the gradients of split_heads and
//! split_fused (concatenations of permuted views), within 4 f32 ulp (plus 1 BF16 ulp
//! in BF16) for gelu_tanh, silu and exp (CUDA's expf is within 2 ulp of
//! libm's, composed once more).
//!
//! rms_norm_rope (QK norm and RoPE), CUDA against the CPU on q views of a
//! fused projection (head dims 32, 64, 120 and 128 through the warp-tile
//! kernels, 256 through the 16-byte row kernels, 6 through the one-pair
//! ones; over one token-sum chunk): out
//! and dx bit for bit (the same f32 operations, each row's f64 sums in
//! element order on both sides), dweight within 2 f32 ulp.
//!
//! Split reductions: sums and maxima over a long axis with few outputs
//! (`ops_reduce_cols_partial`), sums within 2 n 2^-24 sum|terms| of the
//! CPU's, maxima exact.
//!
//! Fused ops, CUDA against the CPU reference (`cpu/fused.rs`), forward and
//! the gradients of loss = sum(out * r), f32 and BF16, on widths that take
//! the 16-byte row kernels and widths that do not, token counts over one
//! token-sum chunk (256) and Flux's hidden 3072:
//! - gated_residual: out, dx and dy bit for bit (the same f32 operations);
//!   dgate within 2 ulp of the output dtype at |cpu| (f64 sums on both
//!   sides, only the order of f64 additions differs);
//! - modulated_layer_norm: out within 4 f32 ulp + 1e-6 |cpu| + 1e-6 (plus 1
//!   BF16 ulp in BF16): the element math is the same, the f64 mean and
//!   variance may round to another f32 (statistics as the norm kernel's);
//!   dshift within 2 ulp of the output dtype; dx and dscale, which read the
//!   statistics, within the ops suite's gradient bound (1e-5 max|cpu| + 8
//!   f32 ulp, in BF16 2^-7 max|cpu| + 1 BF16 ulp).

use mxswitch_runtime::cuda::CudaContext;
use mxswitch_runtime::ops::{
    gated_residual, modulated_layer_norm, rms_norm_rope, split_fused, split_heads,
};
use mxswitch_runtime::{DType, Device, Param, Result, Tensor};

use crate::common::{bf16_ulp, compare, err, f32_ulp, median_ms, Report, Rng, Start};
use crate::op_cases::qkv;
use crate::ops::{sample, tensor, Dist, GPU};

type Op = fn(&[Tensor]) -> Result<Tensor>;

/// One element-wise case: its input shapes and distribution, whether the
/// GPU must give the CPU's bits, and the op.
struct VecCase {
    name: &'static str,
    shapes: Vec<Vec<usize>>,
    dist: Dist,
    exact: bool,
    f: Op,
}

fn vcase(name: &'static str, shapes: &[&[usize]], dist: Dist, exact: bool, f: Op) -> VecCase {
    VecCase {
        name,
        shapes: shapes.iter().map(|s| s.to_vec()).collect(),
        dist,
        exact,
        f,
    }
}

fn vec_cases() -> Vec<VecCase> {
    use Dist::*;
    vec![
        vcase(
            "add contiguous",
            &[&[4, 129, 96], &[4, 129, 96]],
            Sym,
            true,
            |x| x[0].add(&x[1]),
        ),
        vcase(
            "add one run with a tail",
            &[&[1001], &[1001]],
            Sym,
            true,
            |x| x[0].add(&x[1]),
        ),
        vcase(
            "mul [B, L, H] by [B, 1, H]",
            &[&[2, 77, 256], &[2, 1, 256]],
            Sym,
            true,
            |x| x[0].mul(&x[1]),
        ),
        vcase(
            "sub [R, H] - [R, 1]",
            &[&[300, 64], &[300, 1]],
            Sym,
            true,
            |x| x[0].sub(&x[1]),
        ),
        vcase("div [R, H] / [H]", &[&[5, 40], &[40]], Away, true, |x| {
            x[0].div(&x[1])
        }),
        vcase("affine", &[&[8, 520]], Sym, true, |x| {
            x[0].affine(0.37, -1.25)
        }),
        vcase("sqr", &[&[8, 520]], Sym, true, |x| x[0].sqr()),
        vcase("exp", &[&[8, 520]], Sym, false, |x| x[0].exp()),
        vcase("silu", &[&[8, 520]], Sym, false, |x| x[0].silu()),
        vcase("gelu_tanh", &[&[8, 520]], Sym, false, |x| x[0].gelu_tanh()),
        vcase("to_dtype (the other float)", &[&[8, 520]], Sym, true, |x| {
            let to = if x[0].dtype() == DType::F32 {
                DType::BF16
            } else {
                DType::F32
            };
            x[0].to_dtype(to)
        }),
        vcase("copy of a q view", &[&[2, 33, 3, 4, 16]], Sym, true, |x| {
            qkv(&x[0], 1)?.contiguous()
        }),
        vcase("split_heads backward", &[&[2, 33, 192]], Sym, true, |x| {
            let p = Param::new(x[0].clone())?;
            let (q, k, v) = split_heads(p.tensor(), 4)?;
            let loss = q.mul(&k.detach())?.sum_all()?.add(&v.sqr()?.sum_all()?)?;
            grad_of(&loss, &p)
        }),
        vcase("split_fused backward", &[&[2, 1, 384]], Sym, true, |x| {
            let p = Param::new(x[0].clone())?;
            let m = split_fused(p.tensor(), -1, &[64; 6])?;
            let loss = m[0]
                .mul(&m[1].detach())?
                .sum_all()?
                .add(&m[4].sqr()?.sum_all()?)?;
            grad_of(&loss, &p)
        }),
        vcase(
            "concat along L",
            &[&[2, 4, 24, 16], &[2, 4, 40, 16]],
            Sym,
            true,
            |x| Tensor::cat(&[&x[0], &x[1]], 2),
        ),
    ]
}

/// The gradient of `p` in `loss` (zeros where it has none).
fn grad_of(loss: &Tensor, p: &Param) -> Result<Tensor> {
    match loss.backward()?.get(p.id()) {
        Some(g) => Ok(g.clone()),
        None => p.zeros_like(),
    }
}

/// `data` of `shape` on the GPU starting one element past a 16-byte
/// boundary, so the vector kernels refuse it.
fn misaligned(data: &[f32], shape: &[usize], dtype: DType) -> Result<Tensor> {
    let mut v = vec![0.0];
    v.extend_from_slice(data);
    tensor(&v, &[v.len()], dtype, &GPU)?
        .narrow(0, 1, data.len())?
        .reshape(shape.to_vec())
}

/// Bits of the values, so NaNs compare by pattern too.
fn bits(t: &Tensor) -> Result<Vec<u32>> {
    Ok(t.to_vec_f32()?.iter().map(|v| v.to_bits()).collect())
}

fn run_vec_case(c: &VecCase, dtype: DType, seed: u64, rep: &mut Report) {
    let mut rng = Rng::new(seed);
    let data: Vec<Vec<f32>> = c
        .shapes
        .iter()
        .map(|s| sample(&mut rng, s.iter().product(), c.dist))
        .collect();
    let tag = format!("vec {} {dtype}", c.name);
    let r = (|| -> std::result::Result<String, String> {
        let on = |dev: &Device| -> Result<Vec<Tensor>> {
            c.shapes
                .iter()
                .zip(&data)
                .map(|(s, d)| tensor(d, s, dtype, dev))
                .collect()
        };
        let off: Vec<Tensor> = c
            .shapes
            .iter()
            .zip(&data)
            .map(|(s, d)| misaligned(d, s, dtype))
            .collect::<Result<_>>()
            .map_err(err)?;
        let fast = (c.f)(&on(&GPU).map_err(err)?).map_err(err)?;
        let generic = (c.f)(&off).map_err(err)?;
        let cpu = (c.f)(&on(&Device::Cpu).map_err(err)?).map_err(err)?;
        if bits(&fast).map_err(err)? != bits(&generic).map_err(err)? {
            let (f, g) = (
                fast.to_vec_f32().map_err(err)?,
                generic.to_vec_f32().map_err(err)?,
            );
            let at = f
                .iter()
                .zip(&g)
                .position(|(a, b)| a.to_bits() != b.to_bits());
            return Err(format!(
                "vector and generic kernels differ at {at:?} of {}",
                f.len()
            ));
        }
        let (cv, fv) = (
            cpu.to_vec_f32().map_err(err)?,
            fast.to_vec_f32().map_err(err)?,
        );
        let bf = fast.dtype() == DType::BF16;
        let vs_cpu = compare(&cv, &fv, |i| {
            if c.exact {
                0.0
            } else {
                4.0 * f32_ulp(cv[i])
                    + if bf {
                        bf16_ulp(cv[i].abs().max(fv[i].abs()))
                    } else {
                        0.0
                    }
            }
        })?;
        Ok(format!("vector == generic bit for bit; vs cpu: {vs_cpu}"))
    })();
    let bound = if c.exact { "exact" } else { "4 ulp" };
    rep.line(&format!("{tag} [generic: exact, cpu: {bound}]"), r);
}

/// Reductions over a long middle axis with few outputs, which the CUDA
/// backend splits into chunks (`ops_reduce_cols_partial`), against the CPU:
/// sums within the ops suite's accumulation bound 2 n 2^-24 sum|terms| (n
/// the reduced length, plus 1 BF16 ulp in BF16), maxima exact.
fn check_split_reductions(rep: &mut Report) {
    type Reduce = fn(&Tensor) -> Result<Tensor>;
    let cases: [(&str, &[usize], usize, bool, Reduce); 4] = [
        (
            "sum axis 0 of [2048, 100]",
            &[2048, 100],
            2048,
            false,
            |x| x.sum(&[0], true),
        ),
        (
            "sum axis 1 of [3, 1500, 40]",
            &[3, 1500, 40],
            1500,
            false,
            |x| x.sum(&[1], true),
        ),
        (
            "sum to [D] of [1, 4, 8192, 128] (a QK-norm scale's gradient)",
            &[1, 4, 8192, 128],
            4 * 8192,
            false,
            |x| x.sum(&[0, 1, 2], false),
        ),
        ("max axis 0 of [2048, 100]", &[2048, 100], 2048, true, |x| {
            x.max(&[0], true)
        }),
    ];
    for (k, (name, shape, n, exact, f)) in cases.into_iter().enumerate() {
        for dtype in [DType::F32, DType::BF16] {
            let r = (|| -> std::result::Result<String, String> {
                let data = sample(
                    &mut Rng::new(900 + k as u64),
                    shape.iter().product(),
                    Dist::Sym,
                );
                let abs: Vec<f32> = data.iter().map(|v| v.abs()).collect();
                let on = |d: &[f32], dev: &Device| tensor(d, shape, dtype, dev).and_then(|t| f(&t));
                let cpu = on(&data, &Device::Cpu)
                    .map_err(err)?
                    .to_vec_f32()
                    .map_err(err)?;
                let gpu = on(&data, &GPU).map_err(err)?.to_vec_f32().map_err(err)?;
                let mag = on(&abs, &Device::Cpu)
                    .map_err(err)?
                    .to_vec_f32()
                    .map_err(err)?;
                let bf = dtype == DType::BF16;
                compare(&cpu, &gpu, |i| {
                    if exact {
                        return 0.0;
                    }
                    let extra = if bf {
                        bf16_ulp(cpu[i].abs().max(gpu[i].abs()))
                    } else {
                        0.0
                    };
                    2.0 * n as f32 * 2f32.powi(-24) * mag[i] + extra
                })
            })();
            let bound = if exact {
                "exact"
            } else {
                "2 n 2^-24 sum|terms|"
            };
            rep.line(&format!("split reduction {name} {dtype} [{bound}]"), r);
        }
    }
}

/// Gradient bound of the ops suite, relative to max|cpu| `scale`.
fn graph_tol(bf: bool, scale: f32, c: f32, g: f32) -> f32 {
    if bf {
        scale * 2f32.powi(-7) + bf16_ulp(c.abs().max(g.abs()))
    } else {
        scale * 1e-5 + 8.0 * f32_ulp(c)
    }
}

/// `k` ulps of the output dtype at |c|, g the GPU's value.
fn ulps(bf: bool, k: f32, c: f32, g: f32) -> f32 {
    if bf {
        k * bf16_ulp(c.abs().max(g.abs()))
    } else {
        k * f32_ulp(c).max(f32::MIN_POSITIVE)
    }
}

/// How one output or gradient of a fused op may differ.
#[derive(Clone, Copy)]
enum Bound {
    Exact,
    /// `k` ulps of the output dtype.
    Ulps(f32),
    /// The modulated norm's output: 4 f32 ulp + 1e-6 |c| + 1e-6 (+ 1 BF16 ulp).
    Norm,
    /// The ops suite's gradient bound.
    Graph,
}

impl Bound {
    fn name(self) -> String {
        match self {
            Bound::Exact => "exact".into(),
            Bound::Ulps(k) => format!("{k} ulp"),
            Bound::Norm => "4 ulp + 1e-6 |cpu| + 1e-6".into(),
            Bound::Graph => "1e-5 max + 8 ulp / bf16 2^-7 max + 1 ulp".into(),
        }
    }

    fn check(self, bf: bool, c: &[f32], g: &[f32]) -> std::result::Result<String, String> {
        let scale = c.iter().fold(0f32, |m, v| m.max(v.abs()));
        compare(c, g, |i| match self {
            Bound::Exact => 0.0,
            Bound::Ulps(k) => ulps(bf, k, c[i], g[i]),
            Bound::Norm => {
                4.0 * f32_ulp(c[i])
                    + 1e-6 * (1.0 + c[i].abs())
                    + if bf {
                        bf16_ulp(c[i].abs().max(g[i].abs()))
                    } else {
                        0.0
                    }
            }
            Bound::Graph => graph_tol(bf, scale, c[i], g[i]),
        })
    }
}

/// A fused op on (x, vector, y-or-vector) and the bounds of its output and
/// of its three inputs' gradients.
struct FusedCase {
    name: &'static str,
    f: Op,
    bounds: [(&'static str, Bound); 4],
}

fn fused_cases() -> [FusedCase; 2] {
    [
        FusedCase {
            name: "modulated_layer_norm",
            f: |t| modulated_layer_norm(&t[0], &t[1], &t[2], 1e-6),
            bounds: [
                ("out", Bound::Norm),
                ("dx", Bound::Graph),
                ("dshift", Bound::Ulps(2.0)),
                ("dscale", Bound::Graph),
            ],
        },
        FusedCase {
            name: "gated_residual",
            f: |t| gated_residual(&t[0], &t[1], &t[2]),
            bounds: [
                ("out", Bound::Exact),
                ("dx", Bound::Exact),
                ("dgate", Bound::Ulps(2.0)),
                ("dy", Bound::Exact),
            ],
        },
    ]
}

/// The output and the three gradients of `c` on `dev` for x `[b, l, h]`,
/// the modulation vectors split from one `[b, 1, 3h]` tensor as Flux does.
fn fused_run(
    c: &FusedCase,
    dev: &Device,
    dtype: DType,
    (b, l, h): (usize, usize, usize),
    seed: u64,
) -> Result<Vec<Vec<f32>>> {
    let mut rng = Rng::new(seed);
    let x = tensor(
        &sample(&mut rng, b * l * h, Dist::Sym),
        &[b, l, h],
        dtype,
        dev,
    )?;
    let m = tensor(
        &sample(&mut rng, b * 3 * h, Dist::Sym),
        &[b, 1, 3 * h],
        dtype,
        dev,
    )?
    .affine(0.25, 0.0)?;
    let y = tensor(
        &sample(&mut rng, b * l * h, Dist::Sym),
        &[b, l, h],
        dtype,
        dev,
    )?;
    let r = tensor(
        &sample(&mut rng, b * l * h, Dist::Sym),
        &[b, l, h],
        dtype,
        dev,
    )?;
    let parts = m.split(-1, &[h, h, h])?;
    let third = if c.name == "gated_residual" {
        y
    } else {
        parts[1].clone()
    };
    // The vectors stay views of the modulation output (strided for b > 1).
    let second = parts[if c.name == "gated_residual" { 2 } else { 0 }].clone();
    let params = [Param::new(x)?, Param::new(second)?, Param::new(third)?];
    let args: Vec<Tensor> = params.iter().map(|p| p.tensor().clone()).collect();
    let out = (c.f)(&args)?;
    let grads = out.mul(&r)?.sum_all()?.backward()?;
    let mut res = vec![out.to_vec_f32()?];
    for p in &params {
        res.push(match grads.get(p.id()) {
            Some(g) => g.to_vec_f32()?,
            None => vec![0.0; p.elem_count()],
        });
    }
    Ok(res)
}

fn run_fused_case(c: &FusedCase, dtype: DType, shape: (usize, usize, usize), rep: &mut Report) {
    let seed = 77 + shape.0 as u64 * 1000 + shape.1 as u64 + shape.2 as u64 * 7;
    let tag = format!("{} {dtype} {:?}", c.name, [shape.0, shape.1, shape.2]);
    let bf = dtype == DType::BF16;
    let runs = (|| -> std::result::Result<_, String> {
        Ok((
            fused_run(c, &Device::Cpu, dtype, shape, seed).map_err(err)?,
            fused_run(c, &GPU, dtype, shape, seed).map_err(err)?,
        ))
    })();
    let (cpu, gpu) = match runs {
        Ok(r) => r,
        Err(e) => return rep.line(&tag, Err(e)),
    };
    for (k, (what, bound)) in c.bounds.iter().enumerate() {
        let r = bound.check(bf, &cpu[k], &gpu[k]);
        rep.line(&format!("{tag} {what} [{}]", bound.name()), r);
    }
}

/// rms_norm_rope's output and gradients for q of a `[b, l, 3 h d]`
/// projection (a strided view) with tables of l positions.
fn rms_rope_run(
    dev: &Device,
    dtype: DType,
    (b, l, h, d): (usize, usize, usize, usize),
) -> Result<Vec<Vec<f32>>> {
    let mut rng = Rng::new(31 + (l * d) as u64);
    let qkv = tensor(
        &sample(&mut rng, b * l * 3 * h * d, Dist::Sym),
        &[b, l, 3 * h * d],
        dtype,
        dev,
    )?;
    let w = tensor(&sample(&mut rng, d, Dist::Pos), &[d], DType::F32, dev)?;
    let angles = sample(&mut rng, l * d / 2, Dist::Sym);
    let table = |f: fn(f32) -> f32| {
        let v: Vec<f32> = angles.iter().map(|&a| f(a)).collect();
        tensor(&v, &[l, d / 2], DType::F32, dev)
    };
    let (cos, sin) = (table(f32::cos)?, table(f32::sin)?);
    let (q, _, _) = split_heads(&qkv, h)?;
    let (xp, wp) = (Param::new(q)?, Param::new(w)?);
    let out = rms_norm_rope(&xp, &wp, &cos, &sin, 1e-6)?;
    let r = tensor(
        &sample(&mut rng, out.elem_count(), Dist::Sym),
        out.dims(),
        dtype,
        dev,
    )?;
    let g = out.mul(&r)?.sum_all()?.backward()?;
    let grad = |p: &Param| match g.get(p.id()) {
        Some(t) => t.to_vec_f32(),
        None => Ok(vec![0.0; p.elem_count()]),
    };
    Ok(vec![out.to_vec_f32()?, grad(&xp)?, grad(&wp)?])
}

/// rms_norm_rope on the GPU against the CPU: out and dx bit for bit (the
/// same f32 operations, each row's f64 sums in element order on both
/// sides), dweight within 2 f32 ulp (f64 sums over rows in another order).
fn check_rms_rope(rep: &mut Report) {
    let bounds = [
        ("out", Bound::Exact),
        ("dx", Bound::Exact),
        ("dweight", Bound::Ulps(2.0)),
    ];
    // Head dims 32, 64, 120 and 128 take the warp-tile kernels (partial
    // tiles of 21 and 111 rows among them), 256 the 16-byte one-thread-per-row
    // ones, 6 the one-pair ones.
    for shape in [
        (2, 300, 4, 32),
        (1, 7, 3, 64),
        (1, 37, 3, 120),
        (1, 5, 3, 256),
        (3, 17, 2, 6),
        (1, 1024, 24, 128),
    ] {
        for dtype in [DType::F32, DType::BF16] {
            let tag = format!(
                "rms_norm_rope {dtype} [b, l, h, d] = {:?}",
                [shape.0, shape.1, shape.2, shape.3]
            );
            let runs = (|| -> std::result::Result<_, String> {
                Ok((
                    rms_rope_run(&Device::Cpu, dtype, shape).map_err(err)?,
                    rms_rope_run(&GPU, dtype, shape).map_err(err)?,
                ))
            })();
            let (cpu, gpu) = match runs {
                Ok(r) => r,
                Err(e) => {
                    rep.line(&tag, Err(e));
                    continue;
                }
            };
            for (k, (what, bound)) in bounds.iter().enumerate() {
                // dweight is f32 whatever x's dtype.
                let bf = dtype == DType::BF16 && k < 2;
                let r = bound.check(bf, &cpu[k], &gpu[k]);
                rep.line(&format!("{tag} {what} [{}]", bound.name()), r);
            }
        }
    }
}

/// The suite: every vector-kernel case in f32 and BF16, then the fused ops.
pub fn check_fused(rep: &mut Report) {
    for (k, c) in vec_cases().iter().enumerate() {
        for dtype in [DType::F32, DType::BF16] {
            run_vec_case(c, dtype, 500 + k as u64, rep);
        }
    }
    check_split_reductions(rep);
    check_rms_rope(rep);
    let shapes = [(1, 300, 64), (2, 37, 40), (3, 5, 33), (1, 1024, 3072)];
    for c in &fused_cases() {
        for dtype in [DType::F32, DType::BF16] {
            for &s in &shapes {
                run_fused_case(c, dtype, s, rep);
            }
        }
    }
}

/// The benchmark: BF16 `[1, 8192, 3072]` (a Flux.1 step's tokens and
/// width, 24 heads of 128): binary ops through the vector and the generic
/// kernels, and each fused op beside the composition it replaces, forward
/// and forward + backward. `BENCH fused <name> ms=<median> gbps=<bytes the fused op or
/// kernel must move / time>` (the composition's line uses the fused op's
/// bytes, so the two GB/s compare as speeds).
pub fn fused_bench(ctx: &CudaContext, rep: &mut Report) {
    let r = (|| -> std::result::Result<(), String> {
        let (b, l, h) = (1, 8192, 3072);
        let n = b * l * h;
        let mut rng = Rng::new(9);
        let data = |rng: &mut Rng, k: usize| sample(rng, k, Dist::Sym);
        let bf = DType::BF16;
        let (xd, yd) = (data(&mut rng, n), data(&mut rng, n));
        let x = tensor(&xd, &[b, l, h], bf, &GPU).map_err(err)?;
        let y = tensor(&yd, &[b, l, h], bf, &GPU).map_err(err)?;
        let x_off = misaligned(&xd, &[b, l, h], bf).map_err(err)?;
        let y_off = misaligned(&yd, &[b, l, h], bf).map_err(err)?;
        let v = |rng: &mut Rng| tensor(&data(rng, b * h), &[b, 1, h], bf, &GPU)?.affine(0.25, 0.0);
        let (shift, scale, gate) = (
            v(&mut rng).map_err(err)?,
            v(&mut rng).map_err(err)?,
            v(&mut rng).map_err(err)?,
        );
        let bytes = (2 * n) as f64;
        let time = |name: &str, moved: f64, f: &dyn Fn() -> Result<Tensor>| {
            let med = median_ms(ctx, Start::Idle, 3, 20, || f().map_err(err))?;
            println!(
                "BENCH fused {name} ms={med:.4} gbps={:.1}",
                moved / (med * 1e-3) / 1e9
            );
            Ok::<(), String>(())
        };
        time("add_vec", 3.0 * bytes, &|| x.add(&y))?;
        time("add_generic", 3.0 * bytes, &|| x_off.add(&y_off))?;
        time("mul_by_b1h_vec", 2.0 * bytes, &|| x.mul(&gate))?;
        time("mul_by_b1h_generic", 2.0 * bytes, &|| x_off.mul(&gate))?;
        time("modulated_layer_norm", 2.0 * bytes, &|| {
            modulated_layer_norm(&x, &shift, &scale, 1e-6)
        })?;
        time("modulated_layer_norm_composed", 2.0 * bytes, &|| {
            x.layer_norm(1e-6)?
                .mul(&scale.add_scalar(1.0)?)?
                .add(&shift)
        })?;
        time("gated_residual", 3.0 * bytes, &|| {
            gated_residual(&x, &gate, &y)
        })?;
        time("gated_residual_composed", 3.0 * bytes, &|| {
            x.add(&gate.mul(&y)?)
        })?;
        // Forward + backward with every input a parameter; the bytes are
        // the fused pair's reads and writes (norm: x, then x, g and dx, and
        // x and g again for the token sums; residual: x, y, out, then g, y
        // for dgate and g, dy for the multiply).
        let fwd_bwd = |f: &dyn Fn(&[Tensor]) -> Result<Tensor>, ins: [&Tensor; 3]| {
            let ps = ins
                .iter()
                .map(|t| Param::new((*t).clone()))
                .collect::<Result<Vec<_>>>()?;
            let args: Vec<Tensor> = ps.iter().map(|p| p.tensor().clone()).collect();
            let out = f(&args)?;
            let g = out.ones_like()?;
            let grads = out.backward_with(&g)?;
            Ok(grads.get(ps[0].id()).cloned().unwrap_or(g))
        };
        let norm: &dyn Fn(&[Tensor]) -> Result<Tensor> =
            &|t| modulated_layer_norm(&t[0], &t[1], &t[2], 1e-6);
        let norm_c: &dyn Fn(&[Tensor]) -> Result<Tensor> = &|t| {
            t[0].layer_norm(1e-6)?
                .mul(&t[2].add_scalar(1.0)?)?
                .add(&t[1])
        };
        let res: &dyn Fn(&[Tensor]) -> Result<Tensor> = &|t| gated_residual(&t[0], &t[1], &t[2]);
        let res_c: &dyn Fn(&[Tensor]) -> Result<Tensor> = &|t| t[0].add(&t[1].mul(&t[2])?);
        time("modulated_layer_norm_fwd_bwd", 7.0 * bytes, &|| {
            fwd_bwd(norm, [&x, &shift, &scale])
        })?;
        time(
            "modulated_layer_norm_composed_fwd_bwd",
            7.0 * bytes,
            &|| fwd_bwd(norm_c, [&x, &shift, &scale]),
        )?;
        time("gated_residual_fwd_bwd", 7.0 * bytes, &|| {
            fwd_bwd(res, [&x, &gate, &y])
        })?;
        time("gated_residual_composed_fwd_bwd", 7.0 * bytes, &|| {
            fwd_bwd(res_c, [&x, &gate, &y])
        })?;
        // QK norm and RoPE of q, a [1, 24, 8192, 128] view of a [1, 8192,
        // 3 * 3072] projection; bytes: q read and written (forward), g read
        // twice, g' written and read, dx written (backward).
        let qkv = tensor(&data(&mut rng, 3 * n), &[b, l, 3 * h], bf, &GPU).map_err(err)?;
        let (q, _, _) = split_heads(&qkv, 24).map_err(err)?;
        let w = Tensor::ones([128], DType::F32, &GPU).map_err(err)?;
        let angles = data(&mut rng, l * 64);
        let table = |f: fn(f32) -> f32| {
            let v: Vec<f32> = angles.iter().map(|&a| f(a)).collect();
            tensor(&v, &[l, 64], DType::F32, &GPU).map_err(err)
        };
        let (cos, sin) = (table(f32::cos)?, table(f32::sin)?);
        let qk: &dyn Fn(&[Tensor]) -> Result<Tensor> =
            &|t| rms_norm_rope(&t[0], &t[1], &cos, &sin, 1e-6);
        let qk_c: &dyn Fn(&[Tensor]) -> Result<Tensor> = &|t| {
            let z = t[0]
                .to_dtype(DType::F32)?
                .rms_norm(&t[1], 1e-6)?
                .to_dtype(bf)?;
            z.rope_interleaved(&cos.to_dtype(bf)?, &sin.to_dtype(bf)?)
        };
        let qk_fwd_bwd = |f: &dyn Fn(&[Tensor]) -> Result<Tensor>| {
            let (pq, pw) = (Param::new(q.clone())?, Param::new(w.clone())?);
            let out = f(&[pq.tensor().clone(), pw.tensor().clone()])?;
            let grads = out.backward_with(&out.ones_like()?)?;
            Ok(grads.get(pq.id()).cloned().unwrap_or(out))
        };
        time("rms_norm_rope", 2.0 * bytes, &|| {
            qk(&[q.clone(), w.clone()])
        })?;
        time("rms_norm_rope_composed", 2.0 * bytes, &|| {
            qk_c(&[q.clone(), w.clone()])
        })?;
        time("rms_norm_rope_fwd_bwd", 8.0 * bytes, &|| qk_fwd_bwd(qk))?;
        time("rms_norm_rope_composed_fwd_bwd", 8.0 * bytes, &|| {
            qk_fwd_bwd(qk_c)
        })?;
        Ok(())
    })();
    if let Err(e) = r {
        rep.line("fused bench", Err(e));
    }
}
