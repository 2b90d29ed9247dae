//! `cuda_ops_check`: the CUDA tensor backend (`cuda::storage`) against the
//! CPU reference, op by op, forward and backward, in f32 and BF16.
//!
//! Every check builds the same graph on `Device::Cpu` and `Device::Cuda(0)`
//! from seeded random inputs (strided views and broadcasts included), and
//! compares the outputs, then the parameter gradients of
//! `loss = sum(out * r)` (r a fixed random tensor), element by element.
//!
//! Tolerances (|cpu - gpu| per element; "ulp" is the f32 spacing at |cpu|):
//! - exact (0): copies, casts, concat, affine, add/sub/mul/div/eq, sqr, sqrt,
//!   rsqrt, max, rope: the same IEEE operations in the same order;
//! - exp, log, tanh, silu, gelu_tanh: 4 ulp (CUDA's expf/logf/tanhf are
//!   within 2 ulp of libm, composed once more); silu_grad, gelu_tanh_grad:
//!   4 ulp + 2^-21 absolute (cancellation in 1 - s and 1 + x (1 - s));
//! - softmax: 4 ulp; layer / RMS norm y: 4 ulp + 1e-6, rstd: 2 ulp (statistics
//!   in f64 on both sides, only the order of f64 additions differs);
//! - sum, mean, matmul: accumulation-order bound 2 n 2^-24 sum|terms| (n the
//!   reduced length, sum|terms| from the same op on |inputs|);
//! - BF16 outputs: the above plus 1 BF16 ulp of max(|cpu|, |gpu|);
//! - gradients: 1e-5 max|ref| + 8 ulp in f32, 2^-7 max|ref| + 1 BF16 ulp in
//!   BF16 (a 1-ulp flip of an intermediate BF16 rounding propagates).
//!
//! Matmuls (`CudaStorage::matmul`: one strided-batched cuBLASLt call, the
//! operands read in place or packed once) are checked on attention shapes
//! (`[8,6,256,64]`, `k^T` views, q/k/v views of a fused `[B,L,3,H,D]`
//! projection), odd sizes, batch dims that do not coalesce, offsets and
//! padded rows; a check fails if any of them missed cuBLASLt. The `gemm`
//! checks call [`CudaContext::gemm`] directly (transposes, batches, shared
//! b, offsets, bias epilogue into BF16 and f32, FP8 TN and its refusals)
//! against an f64 reference with the accumulation bound above, over k + 1
//! terms (the bias), plus 2^-9 sum|terms| for FP8 (as in cuda_check).
//!
//! Prints one line per check and `summary: N passed, M failed`; exits 1 on a
//! failure and 2 when there is no usable GPU. Before the summary it prints
//! timings of attention-shaped BF16 matmuls as `BENCH matmul <name>
//! ms=<median> tflops=<...>`.

use std::process::ExitCode;
use std::time::Instant;

use mxswitch_runtime::backend::{BackendDevice, BackendStorage};
use mxswitch_runtime::cpu::{CpuDevice, CpuStorage};
use mxswitch_runtime::cuda::gemm::{GemmBias, GemmSpec, MatLayout};
use mxswitch_runtime::cuda::storage::matmul_fallbacks;
use mxswitch_runtime::cuda::{CudaContext, CudaDevice, CudaError, DevBuf, GemmDType, GemmOperand};
use mxswitch_runtime::formats::{bf16, ElemFormat};
use mxswitch_runtime::{DType, Device, Layout, Param, Result, Shape, Tensor};

const GPU: Device = Device::Cuda(0);

/// How far the GPU may be from the CPU.
#[derive(Clone, Copy, Debug)]
enum Tol {
    Exact,
    /// ulps of f32 at |ref|, plus an absolute term.
    Ulp(u32, f32),
    /// Accumulation over `n` terms: 2 n 2^-24 times the op on |inputs|.
    Accum(usize),
    /// A composite graph: as the gradients (relative to max|ref|).
    Graph,
}

impl std::fmt::Display for Tol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tol::Exact => write!(f, "exact"),
            Tol::Ulp(u, 0.0) => write!(f, "{u} ulp"),
            Tol::Ulp(u, a) => write!(f, "{u} ulp + {a:e}"),
            Tol::Accum(n) => write!(f, "2*{n}*2^-24*sum|terms|"),
            Tol::Graph => write!(f, "graph: 1e-5 max + 8 ulp / bf16 2^-7 max + 1 ulp"),
        }
    }
}

fn f32_ulp(x: f32) -> f32 {
    let a = x.abs();
    if !a.is_finite() {
        return 0.0;
    }
    f32::from_bits(a.to_bits() + 1) - a
}

fn bf16_ulp(x: f32) -> f32 {
    let a = bf16::round(x.abs());
    if !a.is_finite() || a == 0.0 {
        return f32::from_bits(1 << 16);
    }
    let b = bf16::from_f32(a);
    bf16::to_f32(b + 1) - a
}

/// Element-wise comparison; `allowed(i)` is the bound of element i.
fn compare(
    cpu: &[f32],
    gpu: &[f32],
    allowed: impl Fn(usize) -> f32,
) -> std::result::Result<String, String> {
    if cpu.len() != gpu.len() {
        return Err(format!(
            "lengths {} (cpu) and {} (gpu)",
            cpu.len(),
            gpu.len()
        ));
    }
    let mut worst = (0usize, 0f32, 0f32);
    let mut bad = 0usize;
    let mut first_bad = None;
    for (i, (&c, &g)) in cpu.iter().zip(gpu).enumerate() {
        if c.is_nan() && g.is_nan() || c == g {
            continue;
        }
        let d = (c - g).abs();
        let lim = allowed(i);
        let ratio = if lim > 0.0 { d / lim } else { f32::INFINITY };
        if d.is_nan() || d > lim {
            bad += 1;
            first_bad.get_or_insert((i, c, g, lim));
        }
        if ratio > worst.1 || worst.1 == 0.0 {
            worst = (i, ratio, d);
        }
    }
    if let Some((i, c, g, lim)) = first_bad {
        return Err(format!(
            "{bad}/{} elements off; first at {i}: cpu {c:e} gpu {g:e} (|d| {:e} > {lim:e})",
            cpu.len(),
            (c - g).abs()
        ));
    }
    Ok(if worst.2 == 0.0 {
        format!("{} elements bit-equal", cpu.len())
    } else {
        format!(
            "{} elements, max |d| {:e} ({:.2} of the bound, at {})",
            cpu.len(),
            worst.2,
            worst.1,
            worst.0
        )
    })
}

/// Tolerance of gradients and composite graphs: relative to the tensor's
/// largest magnitude `scale`, plus ulps of the element.
fn graph_tol(bf: bool, scale: f32, c: f32, g: f32) -> f32 {
    if bf {
        scale * 2f32.powi(-7) + bf16_ulp(c.abs().max(g.abs()))
    } else {
        scale * 1e-5 + 8.0 * f32_ulp(c)
    }
}

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// Value distribution of an input.
#[derive(Clone, Copy)]
enum Dist {
    /// Uniform in [-4, 4].
    Sym,
    /// Uniform in [0.05, 4].
    Pos,
    /// Magnitude in [0.5, 2], random sign (divisors).
    Away,
    /// Integers 0..4 (ties and equalities).
    Small,
}

fn sample(rng: &mut Rng, n: usize, d: Dist) -> Vec<f32> {
    (0..n)
        .map(|_| match d {
            Dist::Sym => rng.uniform(-4.0, 4.0),
            Dist::Pos => rng.uniform(0.05, 4.0),
            Dist::Away => {
                let m = rng.uniform(0.5, 2.0);
                if rng.next() & 1 == 0 {
                    m
                } else {
                    -m
                }
            }
            Dist::Small => (rng.next() % 4) as f32,
        })
        .collect()
}

/// An input: shape, distribution, and whether it is a parameter (gets a gradient).
struct Input {
    shape: Vec<usize>,
    dist: Dist,
    param: bool,
}

fn inp(shape: &[usize], dist: Dist, param: bool) -> Input {
    Input {
        shape: shape.to_vec(),
        dist,
        param,
    }
}

type Graph = Box<dyn Fn(&[Tensor]) -> Result<Tensor>>;

struct Case {
    name: &'static str,
    inputs: Vec<Input>,
    tol: Tol,
    f: Graph,
}

fn case(
    name: &'static str,
    inputs: Vec<Input>,
    tol: Tol,
    f: impl Fn(&[Tensor]) -> Result<Tensor> + 'static,
) -> Case {
    Case {
        name,
        inputs,
        tol,
        f: Box::new(f),
    }
}

fn tensor(data: &[f32], shape: &[usize], dtype: DType, dev: &Device) -> Result<Tensor> {
    Tensor::from_slice(data, shape.to_vec(), &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(dev)
}

#[derive(Default)]
struct Report {
    passed: usize,
    failed: usize,
}

impl Report {
    fn line(&mut self, name: &str, r: std::result::Result<String, String>) {
        match r {
            Ok(m) => {
                self.passed += 1;
                println!("PASS {name}: {m}");
            }
            Err(m) => {
                self.failed += 1;
                println!("FAIL {name}: {m}");
            }
        }
    }
}

fn err(e: mxswitch_runtime::Error) -> String {
    format!("error: {e}")
}

/// Forward and backward of one case in one dtype.
fn run_case(c: &Case, dtype: DType, seed: u64, rep: &mut Report) {
    let mut rng = Rng(seed);
    let data: Vec<Vec<f32>> = c
        .inputs
        .iter()
        .map(|i| sample(&mut rng, i.shape.iter().product(), i.dist))
        .collect();
    let bf = dtype == DType::BF16;
    let tag = format!("{} {}", c.name, dtype);
    let build = |dev: &Device, abs: bool| -> Result<Vec<Tensor>> {
        c.inputs
            .iter()
            .zip(&data)
            .map(|(i, d)| {
                let v: Vec<f32> = if abs {
                    d.iter().map(|x| x.abs()).collect()
                } else {
                    d.clone()
                };
                tensor(&v, &i.shape, dtype, dev)
            })
            .collect()
    };
    // Forward.
    let fwd = (|| -> std::result::Result<(Vec<f32>, String), String> {
        let cpu = (c.f)(&build(&Device::Cpu, false).map_err(err)?).map_err(err)?;
        let gpu = (c.f)(&build(&GPU, false).map_err(err)?).map_err(err)?;
        if gpu.device() != GPU {
            return Err(format!("output is on {}", gpu.device()));
        }
        let (cv, gv) = (
            cpu.to_vec_f32().map_err(err)?,
            gpu.to_vec_f32().map_err(err)?,
        );
        let bound: Vec<f32> = match c.tol {
            Tol::Accum(n) => {
                let mag = (c.f)(&build(&Device::Cpu, true).map_err(err)?).map_err(err)?;
                let k = 2.0 * n as f32 * 2f32.powi(-24);
                mag.to_vec_f32()
                    .map_err(err)?
                    .iter()
                    .map(|m| k * m)
                    .collect()
            }
            _ => vec![],
        };
        let scale = cv.iter().fold(0f32, |m, v| m.max(v.abs()));
        let r = compare(&cv, &gv, |i| {
            if matches!(c.tol, Tol::Graph) {
                return graph_tol(bf, scale, cv[i], gv[i]);
            }
            let base = match c.tol {
                Tol::Graph => 0.0,
                Tol::Exact => 0.0,
                Tol::Ulp(u, a) => u as f32 * f32_ulp(cv[i]) + a,
                Tol::Accum(_) => bound[i],
            };
            let extra = if bf && !matches!(c.tol, Tol::Exact) {
                bf16_ulp(cv[i].abs().max(gv[i].abs()))
            } else {
                0.0
            };
            base + extra
        })?;
        Ok((cv, r))
    })();
    match fwd {
        Ok((_, msg)) => rep.line(&format!("fwd {tag} [{}]", c.tol), Ok(msg)),
        Err(m) => {
            rep.line(&format!("fwd {tag} [{}]", c.tol), Err(m));
            return;
        }
    }
    if !c.inputs.iter().any(|i| i.param) {
        return;
    }
    // Backward: loss = sum(out * r).
    let grads = |dev: &Device| -> Result<Vec<Vec<f32>>> {
        let ts = build(dev, false)?;
        let params: Vec<Option<Param>> = c
            .inputs
            .iter()
            .zip(&ts)
            .map(|(i, t)| {
                if i.param {
                    Param::new(t.clone()).map(Some)
                } else {
                    Ok(None)
                }
            })
            .collect::<Result<_>>()?;
        let args: Vec<Tensor> = params
            .iter()
            .zip(&ts)
            .map(|(p, t)| {
                p.as_ref()
                    .map(|p| p.tensor().clone())
                    .unwrap_or_else(|| t.clone())
            })
            .collect();
        let out = (c.f)(&args)?;
        let mut rr = Rng(seed ^ 0x5EED);
        let r = tensor(
            &sample(&mut rr, out.elem_count(), Dist::Sym),
            out.dims(),
            dtype,
            dev,
        )?;
        let g = out.mul(&r)?.sum_all()?.backward()?;
        params
            .iter()
            .flatten()
            .map(|p| match g.get(p.id()) {
                Some(t) => t.to_vec_f32(),
                None => Ok(vec![0.0; p.elem_count()]),
            })
            .collect()
    };
    let bwd = (|| -> std::result::Result<String, String> {
        let gc = grads(&Device::Cpu).map_err(err)?;
        let gg = grads(&GPU).map_err(err)?;
        let mut msgs = Vec::new();
        for (j, (c, g)) in gc.iter().zip(&gg).enumerate() {
            let scale = c.iter().fold(0f32, |m, v| m.max(v.abs()));
            let m = compare(c, g, |i| graph_tol(bf, scale, c[i], g[i]))
                .map_err(|e| format!("grad {j}: {e}"))?;
            msgs.push(format!("grad {j}: {m}"));
        }
        Ok(msgs.join("; "))
    })();
    let tol = if bf {
        "2^-7 max + 1 bf16 ulp"
    } else {
        "1e-5 max + 8 ulp"
    };
    rep.line(&format!("bwd {tag} [{tol}]"), bwd);
}

/// Part `i` (0 = q, 1 = k, 2 = v) of a fused `[B, L, 3, H, D]` projection
/// as the `[B, H, L, D]` view attention multiplies: batch dims that do not
/// coalesce and an offset.
fn qkv(x: &Tensor, i: usize) -> Result<Tensor> {
    x.narrow(2, i, 1)?.squeeze(2)?.permute(&[0, 2, 1, 3])
}

fn cases() -> Vec<Case> {
    use Dist::*;
    let u = |name, d, f: fn(&Tensor) -> Result<Tensor>, tol| {
        // A transposed view as input: the strided gather path.
        case(name, vec![inp(&[3, 37, 5], d, true)], tol, move |x| {
            f(&x[0].transpose(0, 2)?)
        })
    };
    let tr = Tol::Ulp(4, 0.0);
    let v = vec![
        case(
            "copy_strided(transpose+narrow)",
            vec![inp(&[4, 6, 35], Sym, true)],
            Tol::Exact,
            |x| x[0].transpose(0, 2)?.narrow(1, 1, 4)?.contiguous(),
        ),
        u("exp", Sym, Tensor::exp, tr),
        u("log", Pos, Tensor::log, tr),
        u("sqrt", Pos, Tensor::sqrt, Tol::Exact),
        u("rsqrt", Pos, Tensor::rsqrt, Tol::Exact),
        u("sqr", Sym, Tensor::sqr, Tol::Exact),
        u("tanh", Sym, Tensor::tanh, tr),
        u("silu", Sym, Tensor::silu, tr),
        u("gelu_tanh", Sym, Tensor::gelu_tanh, tr),
        case("affine", vec![inp(&[5, 67], Sym, true)], Tol::Exact, |x| {
            x[0].t()?.affine(0.37, -1.25)
        }),
        case(
            "add(broadcast)",
            vec![inp(&[4, 1, 33], Sym, true), inp(&[6, 33], Sym, true)],
            Tol::Exact,
            |x| x[0].add(&x[1]),
        ),
        case(
            "sub(broadcast)",
            vec![inp(&[4, 6, 33], Sym, true), inp(&[4, 6, 1], Sym, true)],
            Tol::Exact,
            |x| x[0].sub(&x[1]),
        ),
        case(
            "mul(transposed)",
            vec![inp(&[9, 33], Sym, true), inp(&[33, 9], Sym, true)],
            Tol::Exact,
            |x| x[0].mul(&x[1].t()?),
        ),
        case(
            "div(broadcast)",
            vec![inp(&[5, 40], Sym, true), inp(&[40], Away, true)],
            Tol::Exact,
            |x| x[0].div(&x[1]),
        ),
        case(
            "eq_mask",
            vec![inp(&[7, 45], Small, false), inp(&[45], Small, false)],
            Tol::Exact,
            |x| x[0].eq_mask(&x[1]),
        ),
        case(
            "sum(axis 0)",
            vec![inp(&[37, 5, 9], Sym, true)],
            Tol::Accum(37),
            |x| x[0].sum(&[0], false),
        ),
        case(
            "sum(axis 1)",
            vec![inp(&[3, 300, 7], Sym, true)],
            Tol::Accum(300),
            |x| x[0].sum(&[1], true),
        ),
        case(
            "sum(last, long rows)",
            vec![inp(&[3, 5000], Sym, true)],
            Tol::Accum(5000),
            |x| x[0].sum(&[-1], false),
        ),
        case(
            "sum(last, few rows longer than a chunk)",
            vec![inp(&[2, 40_000], Sym, true)],
            Tol::Accum(40_000),
            |x| x[0].sum(&[-1], false),
        ),
        case(
            "max(last, one row longer than a chunk, with ties)",
            vec![inp(&[1, 50_000], Small, true)],
            Tol::Exact,
            |x| x[0].max(&[-1], false),
        ),
        case(
            "sum(last, transposed)",
            vec![inp(&[70, 6], Sym, true)],
            Tol::Accum(70),
            |x| x[0].t()?.sum(&[-1], false),
        ),
        case(
            "mean(axes 0,2)",
            vec![inp(&[6, 5, 11], Sym, true)],
            Tol::Accum(66),
            |x| x[0].mean(&[0, 2], true),
        ),
        case(
            "max(axis 1, ties)",
            vec![inp(&[4, 50, 3], Small, true)],
            Tol::Exact,
            |x| x[0].max(&[1], false),
        ),
        case(
            "max(last)",
            vec![inp(&[9, 1000], Sym, true)],
            Tol::Exact,
            |x| x[0].max(&[-1], true),
        ),
        case(
            "matmul(batched)",
            vec![
                inp(&[2, 3, 17, 33], Sym, true),
                inp(&[2, 3, 33, 19], Sym, true),
            ],
            Tol::Accum(33),
            |x| x[0].matmul(&x[1]),
        ),
        case(
            "matmul(x w^T, broadcast batch)",
            vec![inp(&[4, 20, 48], Sym, true), inp(&[24, 48], Sym, true)],
            Tol::Accum(48),
            |x| x[0].matmul(&x[1].t()?),
        ),
        case(
            "matmul(a^T b, 128x96x200)",
            vec![inp(&[200, 128], Sym, true), inp(&[200, 96], Sym, true)],
            Tol::Accum(200),
            |x| x[0].t()?.matmul(&x[1]),
        ),
        case(
            "matmul(attention [8,6,256,64] x [8,6,64,256])",
            vec![
                inp(&[8, 6, 256, 64], Sym, true),
                inp(&[8, 6, 64, 256], Sym, true),
            ],
            Tol::Accum(64),
            |x| x[0].matmul(&x[1]),
        ),
        case(
            "matmul(q k^T, k transposed view)",
            vec![
                inp(&[8, 6, 256, 64], Sym, true),
                inp(&[8, 6, 256, 64], Sym, true),
            ],
            Tol::Accum(64),
            |x| x[0].matmul(&x[1].transpose(-1, -2)?),
        ),
        case(
            "matmul(q k^T, q k from a [B,L,3,H,D] view)",
            vec![inp(&[2, 32, 3, 4, 16], Sym, true)],
            Tol::Accum(16),
            |x| qkv(&x[0], 0)?.matmul(&qkv(&x[0], 1)?.transpose(-1, -2)?),
        ),
        case(
            "matmul(p v, v from a [B,L,3,H,D] view)",
            vec![
                inp(&[2, 4, 32, 32], Sym, true),
                inp(&[2, 32, 3, 4, 16], Sym, true),
            ],
            Tol::Accum(32),
            |x| x[0].matmul(&qkv(&x[1], 2)?),
        ),
        case(
            "matmul(odd 7x13x5)",
            vec![inp(&[7, 13], Sym, true), inp(&[13, 5], Sym, true)],
            Tol::Accum(13),
            |x| x[0].matmul(&x[1]),
        ),
        case(
            "matmul(odd batched, a^T and b^T views)",
            vec![inp(&[3, 13, 7], Sym, true), inp(&[3, 5, 13], Sym, true)],
            Tol::Accum(13),
            |x| x[0].transpose(-1, -2)?.matmul(&x[1].transpose(-1, -2)?),
        ),
        case(
            "matmul(batch dims that do not coalesce)",
            vec![
                inp(&[3, 4, 7, 13], Sym, true),
                inp(&[4, 3, 13, 5], Sym, true),
            ],
            Tol::Accum(13),
            |x| x[0].transpose(0, 1)?.matmul(&x[1]),
        ),
        case(
            "matmul(narrowed views: odd offsets and padded rows)",
            vec![
                inp(&[2, 5, 9, 16], Sym, true),
                inp(&[2, 5, 12, 8], Sym, true),
            ],
            Tol::Accum(11),
            |x| x[0].narrow(3, 3, 11)?.matmul(&x[1].narrow(2, 1, 11)?),
        ),
        case(
            "concat(axis 1, strided part)",
            vec![inp(&[3, 4, 5], Sym, true), inp(&[3, 5, 2], Sym, true)],
            Tol::Exact,
            |x| Tensor::cat(&[&x[0], &x[1].transpose(1, 2)?], 1),
        ),
        case(
            "concat(axis 0)",
            vec![
                inp(&[2, 7], Sym, true),
                inp(&[5, 7], Sym, true),
                inp(&[1, 7], Sym, true),
            ],
            Tol::Exact,
            |x| Tensor::cat(&[&x[0], &x[1], &x[2]], 0),
        ),
        case(
            "concat(last, transposed)",
            vec![inp(&[6, 4], Sym, true), inp(&[3, 6], Sym, true)],
            Tol::Exact,
            |x| Tensor::cat(&[&x[0], &x[1].t()?], -1),
        ),
        case(
            "softmax",
            vec![inp(&[7, 129], Sym, true)],
            Tol::Ulp(4, 0.0),
            |x| x[0].softmax_last_dim(),
        ),
        case(
            "softmax(long rows, transposed)",
            vec![inp(&[3000, 2], Sym, true)],
            Tol::Ulp(4, 0.0),
            |x| x[0].t()?.softmax_last_dim(),
        ),
        case(
            "layer_norm",
            vec![inp(&[5, 257], Sym, true)],
            Tol::Ulp(4, 1e-6),
            |x| x[0].layer_norm(1e-5),
        ),
        case(
            "rms_normalize",
            vec![inp(&[6, 3, 100], Sym, true)],
            Tol::Ulp(4, 1e-6),
            |x| x[0].rms_normalize(1e-6),
        ),
        case(
            "rope_interleaved",
            vec![
                inp(&[2, 3, 8, 16], Sym, true),
                inp(&[8, 8], Sym, false),
                inp(&[8, 8], Sym, false),
            ],
            Tol::Exact,
            |x| x[0].rope_interleaved(&x[1], &x[2]),
        ),
        case(
            "rope_interleaved(strided x)",
            vec![
                inp(&[2, 16, 5], Sym, true),
                inp(&[5, 8], Sym, false),
                inp(&[5, 8], Sym, false),
            ],
            Tol::Exact,
            |x| x[0].transpose(1, 2)?.rope_interleaved(&x[1], &x[2]),
        ),
        case(
            "to_dtype round trip",
            vec![inp(&[9, 31], Sym, true)],
            Tol::Exact,
            |x| {
                let other = if x[0].dtype() == DType::F32 {
                    DType::BF16
                } else {
                    DType::F32
                };
                x[0].t()?
                    .to_dtype(other)?
                    .mul_scalar(3.0)?
                    .to_dtype(x[0].dtype())
            },
        ),
        case(
            "mlp block (linear, gelu, rms)",
            vec![
                inp(&[8, 32], Sym, true),
                inp(&[48, 32], Sym, true),
                inp(&[48], Sym, true),
            ],
            Tol::Graph,
            |x| {
                mxswitch_runtime::ops::linear(&x[0], &x[1], Some(&x[2]))?
                    .gelu_tanh()?
                    .rms_normalize(1e-6)
            },
        ),
        case(
            "attention",
            vec![
                inp(&[2, 8, 16], Sym, true),
                inp(&[2, 8, 16], Sym, true),
                inp(&[2, 8, 16], Sym, true),
            ],
            Tol::Graph,
            |x| mxswitch_runtime::ops::scaled_dot_product_attention(&x[0], &x[1], &x[2]),
        ),
    ];
    v
}

/// The backend methods with two outputs or no Tensor-level form: norm_last_dim
/// (y and rstd), the raw unary grad kernels, U8 copies and zeros.
fn backend_checks(dev: &CudaDevice, rep: &mut Report) {
    use mxswitch_runtime::op::UnaryOp;
    let mut rng = Rng(77);
    for dtype in [DType::F32, DType::BF16] {
        let data = sample(&mut rng, 6 * 300, Dist::Sym);
        let host = match dtype {
            DType::BF16 => CpuStorage::BF16(data.iter().map(|&v| bf16::from_f32(v)).collect()),
            _ => CpuStorage::F32(data.clone()),
        };
        let widen = |s: &CpuStorage| -> Vec<f32> {
            match s {
                CpuStorage::F32(v) => v.clone(),
                CpuStorage::BF16(v) => v.iter().map(|&b| bf16::to_f32(b)).collect(),
                CpuStorage::U8(v) => v.iter().map(|&b| b as f32).collect(),
            }
        };
        let bf = dtype == DType::BF16;
        let layout = Layout::contiguous(Shape::from([6, 300]));
        let r = (|| -> std::result::Result<(), String> {
            let g = dev.storage_from_cpu(host.clone()).map_err(err)?;
            for rms in [false, true] {
                let (cy, cr) = host.norm_last_dim(&layout, 1e-5, rms).map_err(err)?;
                let (gy, gr) = g.norm_last_dim(&layout, 1e-5, rms).map_err(err)?;
                let (cy, gy) = (widen(&cy), widen(&gy.to_cpu_storage().map_err(err)?));
                let (cr, gr) = (widen(&cr), widen(&gr.to_cpu_storage().map_err(err)?));
                let extra = |a: f32, b: f32| {
                    if bf {
                        bf16_ulp(a.abs().max(b.abs()))
                    } else {
                        0.0
                    }
                };
                let name = if rms { "rms" } else { "layer" };
                rep.line(
                    &format!("backend norm_last_dim({name}) y {dtype} [4 ulp + 1e-6]"),
                    compare(&cy, &gy, |i| {
                        4.0 * f32_ulp(cy[i]) + 1e-6 + extra(cy[i], gy[i])
                    }),
                );
                rep.line(
                    &format!("backend norm_last_dim({name}) rstd {dtype} [2 ulp]"),
                    compare(&cr, &gr, |i| 2.0 * f32_ulp(cr[i]) + extra(cr[i], gr[i])),
                );
            }
            for op in [UnaryOp::SiluGrad, UnaryOp::GeluTanhGrad] {
                let c = widen(&host.unary(&layout, op).map_err(err)?);
                let gg = widen(
                    &g.unary(&layout, op)
                        .map_err(err)?
                        .to_cpu_storage()
                        .map_err(err)?,
                );
                rep.line(
                    &format!("backend unary {} {dtype} [4 ulp + 2^-21]", op.name()),
                    compare(&c, &gg, |i| {
                        4.0 * f32_ulp(c[i])
                            + 2f32.powi(-21)
                            + if bf {
                                bf16_ulp(c[i].abs().max(gg[i].abs()))
                            } else {
                                0.0
                            }
                    }),
                );
            }
            Ok(())
        })();
        if let Err(m) = r {
            rep.line(&format!("backend checks {dtype}"), Err(m));
        }
    }
    // U8: upload, strided copy, concat, download; zeros.
    let r = (|| -> std::result::Result<String, String> {
        let bytes: Vec<u8> = (0..5 * 7).map(|i| (i * 37 % 251) as u8).collect();
        let t = Tensor::from_bytes(bytes.clone(), [5, 7], &Device::Cpu).map_err(err)?;
        let g = t.to_device(&GPU).map_err(err)?;
        let c = Tensor::cat(&[&t.t().map_err(err)?, &t.t().map_err(err)?], 0).map_err(err)?;
        let gc = Tensor::cat(&[&g.t().map_err(err)?, &g.t().map_err(err)?], 0).map_err(err)?;
        if c.to_vec_u8().map_err(err)? != gc.to_vec_u8().map_err(err)? {
            return Err("u8 transpose + concat differs".into());
        }
        let z = Tensor::zeros([3, 5], DType::BF16, &GPU).map_err(err)?;
        if z.to_vec_bf16_bits().map_err(err)? != vec![0u16; 15] {
            return Err("zeros are not zero".into());
        }
        let back = g.to_device(&Device::Cpu).map_err(err)?;
        if back.to_vec_u8().map_err(err)? != bytes {
            return Err("u8 round trip differs".into());
        }
        let _ = CpuDevice.zeros(&Shape::from([1]), DType::U8).map_err(err)?;
        Ok("u8 upload, transpose, concat, download and bf16 zeros exact".into())
    })();
    rep.line("backend u8/zeros [exact]", r);
    // f32 -> bf16 rounding on ties, NaN, infinities and subnormals.
    let r = (|| -> std::result::Result<String, String> {
        let mut v = vec![
            1.0 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
            -(1.0 + 2f32.powi(-8)),
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            1e-40,
            -1e-39,
            0.0,
            -0.0,
        ];
        v.extend(sample(&mut rng, 1000, Dist::Sym));
        let t = Tensor::from_slice(&v, [v.len()], &Device::Cpu).map_err(err)?;
        let c = t
            .to_dtype(DType::BF16)
            .map_err(err)?
            .to_vec_bf16_bits()
            .map_err(err)?;
        let g = t
            .to_device(&GPU)
            .and_then(|g| g.to_dtype(DType::BF16))
            .and_then(|g| g.to_vec_bf16_bits())
            .map_err(err)?;
        if c != g {
            let i = c.iter().zip(&g).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!(
                "bits differ at {i}: cpu {:#06x} gpu {:#06x}",
                c[i], g[i]
            ));
        }
        Ok(format!(
            "{} values bit-equal (ties, NaN, inf, subnormals)",
            v.len()
        ))
    })();
    rep.line("to_dtype f32->bf16 special values [exact bits]", r);
}

/// One direct [`CudaContext::gemm`] call against an f64 reference, with
/// element offsets, padded rows and gaps between batch matrices, so every
/// [`MatLayout`] field is exercised.
struct GemmCase {
    name: &'static str,
    /// Type of both operands.
    dtype: GemmDType,
    out: GemmDType,
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    /// a stored `[K, M]`, b stored `[K, N]`.
    a_t: bool,
    b_t: bool,
    /// b's batch stride is 0 (one b for the whole batch).
    b_shared: bool,
    /// Per a, b, y: element offset, row padding, gap after each matrix.
    pads: [(usize, usize, usize); 3],
    bias: Option<GemmDType>,
    /// The call must be refused with `CudaError::Invalid`.
    invalid: bool,
}

/// The layout of `batch` matrices of logical `rows x cols` (stored the
/// other way when `t`) and the buffer length it needs.
fn gemm_mat(
    rows: usize,
    cols: usize,
    t: bool,
    (off, pad, gap): (usize, usize, usize),
    batch: usize,
    shared: bool,
) -> (MatLayout, usize) {
    let (sr, sc) = if t { (cols, rows) } else { (rows, cols) };
    let ld = sc + pad;
    let per = sr * ld + gap;
    let l = MatLayout {
        offset_elems: off,
        ld,
        batch_stride: if shared { 0 } else { per },
        transposed: t,
    };
    (l, off + if shared { 1 } else { batch } * per)
}

/// Buffer index of logical element (r, c) of matrix `bi`.
fn gemm_pos(l: &MatLayout, bi: usize, r: usize, c: usize) -> usize {
    let (sr, sc) = if l.transposed { (c, r) } else { (r, c) };
    l.offset_elems + bi * l.batch_stride + sr * l.ld + sc
}

/// Random values exact in `t`, and the buffer holding them.
fn gemm_upload(
    ctx: &CudaContext,
    rng: &mut Rng,
    len: usize,
    t: GemmDType,
) -> std::result::Result<(Vec<f32>, DevBuf), String> {
    let raw = sample(rng, len, Dist::Sym);
    let up = |r: std::result::Result<DevBuf, CudaError>| r.map_err(|e| e.to_string());
    Ok(match t {
        GemmDType::F32 => (raw.clone(), up(ctx.upload(&raw))?),
        GemmDType::Bf16 => {
            let bits: Vec<u16> = raw.iter().map(|&v| bf16::from_f32(v)).collect();
            (
                bits.iter().map(|&b| bf16::to_f32(b)).collect(),
                up(ctx.upload(&bits))?,
            )
        }
        GemmDType::Fp8E4M3 | GemmDType::Fp8E5M2 => {
            let f = if t == GemmDType::Fp8E4M3 {
                ElemFormat::E4M3FN
            } else {
                ElemFormat::E5M2
            };
            let codes: Vec<u8> = raw.iter().map(|&v| f.encode(v)).collect();
            (
                codes.iter().map(|&c| f.decode(c)).collect(),
                up(ctx.upload(&codes))?,
            )
        }
    })
}

fn gemm_case(ctx: &CudaContext, c: &GemmCase, seed: u64) -> std::result::Result<String, String> {
    let mut rng = Rng(seed);
    let (m, n, k, batch) = (c.m, c.n, c.k, c.batch);
    let (la, len_a) = gemm_mat(m, k, c.a_t, c.pads[0], batch, false);
    let (lb, len_b) = gemm_mat(n, k, c.b_t, c.pads[1], batch, c.b_shared);
    let (ly, len_y) = gemm_mat(m, n, false, c.pads[2], batch, false);
    let (av, abuf) = gemm_upload(ctx, &mut rng, len_a, c.dtype)?;
    let (bv, bbuf) = gemm_upload(ctx, &mut rng, len_b, c.dtype)?;
    let (biasv, biasbuf) = match c.bias {
        Some(t) => {
            let (v, b) = gemm_upload(ctx, &mut rng, n, t)?;
            (v, Some((b, t)))
        }
        None => (vec![0.0; n], None),
    };
    let fp8 = c.dtype.is_fp8();
    let (sa, sb) = if fp8 { (0.5f32, 0.25f32) } else { (1.0, 1.0) };
    // One 16-byte slot per scale, as the FP8 quantizers keep them.
    let scales = ctx
        .upload(&[sa, 0.0, 0.0, 0.0, sb, 0.0, 0.0, 0.0])
        .map_err(|e| e.to_string())?;
    let scale_inv = |i: u64| fp8.then(|| scales.ptr() + 16 * i);
    // y starts as a sentinel (exact in BF16), so writes outside its matrices show.
    const SENTINEL: f32 = 4096.0;
    let ybuf = match c.out {
        GemmDType::F32 => ctx.upload(&vec![SENTINEL; len_y]),
        _ => ctx.upload(&vec![bf16::from_f32(SENTINEL); len_y]),
    }
    .map_err(|e| e.to_string())?;
    let spec = GemmSpec {
        m,
        n,
        k,
        batch,
        a: la,
        b: lb,
        y: ly,
        bias: biasbuf
            .as_ref()
            .map(|(buf, dtype)| GemmBias { buf, dtype: *dtype }),
    };
    let op = |buf, i| GemmOperand {
        buf,
        dtype: c.dtype,
        scale_inv: scale_inv(i),
    };
    let r = ctx.gemm(&op(&abuf, 0), &op(&bbuf, 1), &spec, &ybuf, c.out);
    if c.invalid {
        return match r {
            Err(CudaError::Invalid(m)) => Ok(format!("refused as expected: {m}")),
            Err(e) => Err(format!("expected an invalid-argument error, got: {e}")),
            Ok(()) => Err("expected an invalid-argument error, the call ran".into()),
        };
    }
    r.map_err(|e| e.to_string())?;
    let got: Vec<f32> = match c.out {
        GemmDType::F32 => ctx.download::<f32>(&ybuf, len_y),
        _ => ctx
            .download::<u16>(&ybuf, len_y)
            .map(|v| v.iter().map(|&b| bf16::to_f32(b)).collect()),
    }
    .map_err(|e| e.to_string())?;
    let mut written = vec![false; len_y];
    let (mut cpu, mut gpu, mut bound) = (vec![], vec![], vec![]);
    // f32 accumulation of k products and the bias; FP8 tensor cores keep
    // ~14 bits inside one MMA before promoting (as in cuda_check).
    let acc = (k + 1) as f64 * 2f64.powi(-23) + if fp8 { 2f64.powi(-9) } else { 0.0 };
    let scale = f64::from(sa) * f64::from(sb);
    for bi in 0..batch {
        let bb = if c.b_shared { 0 } else { bi };
        for i in 0..m {
            for j in 0..n {
                let (mut r, mut mag) = (f64::from(biasv[j]), f64::from(biasv[j].abs()));
                for p in 0..k {
                    let t = f64::from(av[gemm_pos(&la, bi, i, p)])
                        * f64::from(bv[gemm_pos(&lb, bb, j, p)])
                        * scale;
                    r += t;
                    mag += t.abs();
                }
                let at = gemm_pos(&ly, bi, i, j);
                written[at] = true;
                cpu.push(r as f32);
                gpu.push(got[at]);
                bound.push((acc * mag) as f32);
            }
        }
    }
    if let Some(at) = (0..len_y).find(|&i| !written[i] && got[i] != SENTINEL) {
        return Err(format!(
            "element {at} outside y's matrices was overwritten ({})",
            got[at]
        ));
    }
    let bf = c.out == GemmDType::Bf16;
    compare(&cpu, &gpu, |i| {
        bound[i]
            + f32_ulp(cpu[i])
            + if bf {
                bf16_ulp(cpu[i].abs().max(gpu[i].abs()))
            } else {
                0.0
            }
    })
}

/// [`CudaContext::gemm`] directly: every transpose combination, batches
/// (strided and with a shared b), offsets and padded rows, the bias
/// epilogue with BF16 and f32 outputs, FP8 (TN only) and its refusals.
fn gemm_checks(ctx: &CudaContext, rep: &mut Report) {
    use GemmDType::{Bf16, Fp8E4M3, F32};
    let base = GemmCase {
        name: "",
        dtype: Bf16,
        out: Bf16,
        m: 64,
        n: 48,
        k: 40,
        batch: 1,
        a_t: false,
        b_t: false,
        b_shared: false,
        pads: [(0, 0, 0); 3],
        bias: None,
        invalid: false,
    };
    let fp8_pads = [(16, 16, 32), (32, 16, 16), (8, 8, 8)];
    // cuBLASLt (13.x, Hopper) fuses an f32 bias only for BF16 operands with
    // an f32 output (gemm::fuses_f32_bias); `gemm` refuses the rest up front
    // and the linears add the bias after an f32 GEMM there.
    let cases = [
        GemmCase {
            name: "bf16 TN batch=3 + f32 bias -> f32",
            out: F32,
            batch: 3,
            bias: Some(F32),
            ..base
        },
        GemmCase {
            name: "bf16 a^T b^T, offsets, padded rows, batch=4 + f32 bias -> f32",
            out: F32,
            m: 33,
            n: 20,
            k: 17,
            batch: 4,
            a_t: true,
            b_t: true,
            pads: [(3, 5, 7), (1, 2, 3), (5, 3, 11)],
            bias: Some(F32),
            ..base
        },
        GemmCase {
            name: "bf16 b^T, odd 7x13x5, batch=2 -> bf16",
            m: 7,
            n: 13,
            k: 5,
            batch: 2,
            b_t: true,
            pads: [(1, 0, 1), (0, 1, 0), (0, 0, 0)],
            ..base
        },
        GemmCase {
            name: "bf16 a^T, batch=1 + f32 bias -> f32",
            out: F32,
            m: 40,
            n: 24,
            k: 72,
            a_t: true,
            bias: Some(F32),
            ..base
        },
        GemmCase {
            name: "bf16 shared b (x w^T folded), batch=5 + f32 bias -> f32",
            out: F32,
            m: 24,
            n: 40,
            k: 32,
            batch: 5,
            b_shared: true,
            bias: Some(F32),
            ..base
        },
        GemmCase {
            name: "bf16 shared b, a^T (batch stride 0), batch=3 -> f32",
            out: F32,
            m: 24,
            n: 40,
            k: 32,
            batch: 3,
            a_t: true,
            b_shared: true,
            ..base
        },
        GemmCase {
            name: "f32 b^T, padded, batch=2 + f32 bias -> f32",
            dtype: F32,
            out: F32,
            m: 50,
            n: 30,
            k: 70,
            batch: 2,
            b_t: true,
            pads: [(2, 1, 0), (0, 3, 5), (1, 0, 2)],
            bias: Some(F32),
            ..base
        },
        GemmCase {
            name: "e4m3 TN, offsets, padded, batch=2 -> bf16",
            dtype: Fp8E4M3,
            m: 32,
            n: 48,
            k: 64,
            batch: 2,
            pads: fp8_pads,
            ..base
        },
        GemmCase {
            name: "e4m3 + f32 bias -> bf16 refused (no such cuBLASLt epilogue)",
            dtype: Fp8E4M3,
            m: 32,
            n: 48,
            k: 64,
            bias: Some(F32),
            invalid: true,
            ..base
        },
        GemmCase {
            name: "bf16 + f32 bias -> bf16 refused (no such cuBLASLt epilogue)",
            bias: Some(F32),
            invalid: true,
            ..base
        },
        GemmCase {
            name: "e4m3 TN, batch=1 -> f32",
            dtype: Fp8E4M3,
            out: F32,
            m: 32,
            n: 48,
            k: 64,
            ..base
        },
        GemmCase {
            name: "e4m3 TN, batch=3 -> f32",
            dtype: Fp8E4M3,
            out: F32,
            m: 48,
            n: 32,
            k: 96,
            batch: 3,
            pads: [(16, 16, 32), (32, 16, 16), (16, 16, 16)],
            ..base
        },
        GemmCase {
            name: "e4m3 a^T refused",
            dtype: Fp8E4M3,
            m: 32,
            n: 48,
            k: 64,
            a_t: true,
            invalid: true,
            ..base
        },
        GemmCase {
            name: "e4m3 8-byte offset refused",
            dtype: Fp8E4M3,
            m: 32,
            n: 48,
            k: 64,
            pads: [(8, 0, 0), (0, 0, 0), (0, 0, 0)],
            invalid: true,
            ..base
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        let tol = if c.invalid {
            "CudaError::Invalid".to_string()
        } else {
            format!(
                "(k+1) 2^-23{} sum|terms| + 1 ulp{}",
                if c.dtype.is_fp8() { " + 2^-9" } else { "" },
                if c.out == Bf16 { " + 1 bf16 ulp" } else { "" }
            )
        };
        rep.line(
            &format!("gemm {} [{tol}]", c.name),
            gemm_case(ctx, c, 500 + i as u64),
        );
    }
}

/// Median milliseconds of `f` on the GPU over 20 runs after 3 warm-ups,
/// each run timed on the stream from an idle device.
fn median_ms(f: &dyn Fn() -> Result<Tensor>) -> Result<f64> {
    let ctx = CudaDevice::get(0)?.context().clone();
    let cuda = |e: CudaError| mxswitch_runtime::Error::Backend(e.to_string());
    for _ in 0..3 {
        f()?;
    }
    let mut ms = vec![];
    for _ in 0..20 {
        ctx.synchronize().map_err(cuda)?;
        let t = ctx.timer().map_err(cuda)?;
        let y = f()?;
        ms.push(f64::from(t.stop_ms().map_err(cuda)?));
        drop(y);
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[ms.len() / 2])
}

/// Median time of attention-shaped BF16 matmuls through the tensor API
/// (output allocation and any packing included), printed as
/// `BENCH matmul <name> ms=<median> tflops=<...>`.
fn matmul_bench(rep: &mut Report) {
    let (b, h, l, d) = (8, 6, 512, 64);
    let r = (|| -> Result<()> {
        let bf = |shape: &[usize], seed| -> Result<Tensor> {
            let v = sample(&mut Rng(seed), shape.iter().product(), Dist::Sym);
            tensor(&v, shape, DType::BF16, &GPU)
        };
        let q = bf(&[b, h, l, d], 1)?;
        let k = bf(&[b, h, l, d], 2)?;
        let kt = bf(&[b, h, d, l], 3)?;
        let p = bf(&[b, h, l, l], 4)?.affine(1.0 / l as f32, 0.0)?;
        let v = bf(&[b, h, l, d], 5)?;
        let fused = bf(&[b, l, 3, h, d], 6)?;
        let (fq, fk, fv) = (qkv(&fused, 0)?, qkv(&fused, 1)?, qkv(&fused, 2)?);
        let qk_flops = 2.0 * (b * h * l * l * d) as f64;
        type Mm<'a> = Box<dyn Fn() -> Result<Tensor> + 'a>;
        let runs: Vec<(&str, Mm)> = vec![
            ("qk_contiguous_8x6x512x64", Box::new(|| q.matmul(&kt))),
            (
                "qk_t_view_8x6x512x64",
                Box::new(|| q.matmul(&k.transpose(-1, -2)?)),
            ),
            ("av_8x6x512x512x64", Box::new(|| p.matmul(&v))),
            (
                "qk_t_from_qkv_view",
                Box::new(|| fq.matmul(&fk.transpose(-1, -2)?)),
            ),
            ("av_v_from_qkv_view", Box::new(|| p.matmul(&fv))),
        ];
        for (name, f) in &runs {
            let med = median_ms(f.as_ref())?;
            println!(
                "BENCH matmul {name} ms={med:.4} tflops={:.1}",
                qk_flops / (med * 1e-3) / 1e12
            );
        }
        Ok(())
    })();
    if let Err(e) = r {
        rep.line("matmul bench", Err(err(e)));
    }
}

/// Median time of element-wise binary ops of flux-small's activation shapes,
/// printed as `BENCH elementwise <name> ms=<median> gbps=<bytes moved / time>`.
fn elementwise_bench(rep: &mut Report) {
    let r = (|| -> Result<()> {
        let make = |shape: &[usize], dt, seed| -> Result<Tensor> {
            let v = sample(&mut Rng(seed), shape.iter().product(), Dist::Sym);
            tensor(&v, shape, dt, &GPU)
        };
        let a = make(&[8, 512, 768], DType::BF16, 11)?;
        let b = make(&[8, 512, 768], DType::BF16, 12)?;
        let m = make(&[8, 1, 768], DType::BF16, 13)?;
        let af = make(&[8, 512, 3072], DType::F32, 14)?;
        let bf = make(&[8, 512, 3072], DType::F32, 15)?;
        let n = 8 * 512 * 768;
        type Op<'a> = Box<dyn Fn() -> Result<Tensor> + 'a>;
        let runs: Vec<(&str, usize, Op)> = vec![
            ("add_bf16_8x512x768", 6 * n, Box::new(|| a.add(&b))),
            (
                "mul_bf16_broadcast_8x512x768_by_8x1x768",
                4 * n,
                Box::new(|| a.mul(&m)),
            ),
            ("add_f32_8x512x3072", 12 * 4 * n, Box::new(|| af.add(&bf))),
        ];
        for (name, bytes, f) in &runs {
            let med = median_ms(f.as_ref())?;
            println!(
                "BENCH elementwise {name} ms={med:.4} gbps={:.1}",
                *bytes as f64 / (med * 1e-3) / 1e9
            );
        }
        Ok(())
    })();
    if let Err(e) = r {
        rep.line("elementwise bench", Err(err(e)));
    }
}

fn main() -> ExitCode {
    let t0 = Instant::now();
    let dev = match CudaDevice::get(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cuda_ops_check: {e}");
            return ExitCode::from(2);
        }
    };
    println!("device: {}", dev.context().info());
    let mut rep = Report::default();
    for (k, c) in cases().iter().enumerate() {
        for dtype in [DType::F32, DType::BF16] {
            run_case(c, dtype, 1000 + k as u64, &mut rep);
        }
    }
    let [retries, tiled] = matmul_fallbacks();
    rep.line(
        "matmul path [every matmul above in one cuBLASLt call]",
        if retries + tiled == 0 {
            Ok("no cuBLASLt refusals".into())
        } else {
            Err(format!(
                "cuBLASLt refused {retries} first attempts; {tiled} matmuls ran the tiled kernel"
            ))
        },
    );
    backend_checks(&dev, &mut rep);
    gemm_checks(dev.context(), &mut rep);
    matmul_bench(&mut rep);
    elementwise_bench(&mut rep);
    println!(
        "summary: {} passed, {} failed ({:.1} s)",
        rep.passed,
        rep.failed,
        t0.elapsed().as_secs_f64()
    );
    if rep.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
