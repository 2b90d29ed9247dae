//! The CUDA tensor backend (`cuda::storage`) against the CPU reference, op
//! by op, forward and backward, in f32 and BF16.
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
//!   within 2 ulp of libm, composed once more); silu_backward,
//!   gelu_tanh_backward (g times the slope at x): 8 ulp + 2^-21 |g|
//!   (cancellation in 1 - s and 1 + x (1 - s));
//! - softmax: 4 ulp; layer / RMS norm y: 4 ulp + 1e-6, rstd: 2 ulp (statistics
//!   in f64 on both sides, only the order of f64 additions differs);
//! - sum, mean, matmul: accumulation-order bound 2 n 2^-24 sum|terms| (n the
//!   reduced length, sum|terms| from the same op on |inputs|);
//! - BF16 outputs: the above plus 1 BF16 ulp of max(|cpu|, |gpu|);
//! - gradients: 1e-5 max|ref| + 8 ulp in f32, 2^-7 max|ref| + 1 BF16 ulp in
//!   BF16 (a 1-ulp flip of an intermediate BF16 rounding propagates).
//!
//! Matmuls (`CudaStorage::matmul`: one strided-batched cuBLASLt call, the
//! operands read in place or packed once) are checked on attention shapes,
//! odd sizes, batch dims that do not coalesce, offsets and padded rows
//! (`op_cases.rs`); a check fails if any of them missed cuBLASLt.

#![allow(clippy::redundant_closure_call)]

use mxswitch_runtime::cuda::storage::matmul_fallbacks;
use mxswitch_runtime::{DType, Device, Param, Result, Tensor};

use crate::common::{bf16_ulp, compare, err, f32_ulp, Report, Rng};

pub const GPU: Device = Device::Cuda(0);

/// How far the GPU may be from the CPU.
#[derive(Clone, Copy, Debug)]
pub enum Tol {
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

/// Tolerance of gradients and composite graphs: relative to the tensor's
/// largest magnitude `scale`, plus ulps of the element.
fn graph_tol(bf: bool, scale: f32, c: f32, g: f32) -> f32 {
    if bf {
        scale * 2f32.powi(-7) + bf16_ulp(c.abs().max(g.abs()))
    } else {
        scale * 1e-5 + 8.0 * f32_ulp(c)
    }
}

/// Value distribution of an input.
#[derive(Clone, Copy)]
pub enum Dist {
    /// Uniform in [-4, 4].
    Sym,
    /// Uniform in [0.05, 4].
    Pos,
    /// Magnitude in [0.5, 2], random sign (divisors).
    Away,
    /// Integers 0..4 (ties and equalities).
    Small,
}

pub fn sample(rng: &mut Rng, n: usize, d: Dist) -> Vec<f32> {
    (0..n)
        .map(|_| match d {
            Dist::Sym => rng.uniform(-4.0, 4.0),
            Dist::Pos => rng.uniform(0.05, 4.0),
            Dist::Away => {
                let m = rng.uniform(0.5, 2.0);
                if rng.next_u64() & 1 == 0 {
                    m
                } else {
                    -m
                }
            }
            Dist::Small => (rng.next_u64() % 4) as f32,
        })
        .collect()
}

/// An input: shape, distribution, and whether it is a parameter (gets a gradient).
pub struct Input {
    shape: Vec<usize>,
    dist: Dist,
    param: bool,
}

pub fn inp(shape: &[usize], dist: Dist, param: bool) -> Input {
    Input {
        shape: shape.to_vec(),
        dist,
        param,
    }
}

type Graph = Box<dyn Fn(&[Tensor]) -> Result<Tensor>>;

pub struct Case {
    name: &'static str,
    inputs: Vec<Input>,
    tol: Tol,
    f: Graph,
}

pub fn case(
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

pub fn tensor(data: &[f32], shape: &[usize], dtype: DType, dev: &Device) -> Result<Tensor> {
    Tensor::from_slice(data, shape.to_vec(), &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(dev)
}

/// Forward and backward of one case in one dtype.
fn run_case(c: &Case, dtype: DType, seed: u64, rep: &mut Report) {
    let mut rng = Rng::new(seed);
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
        let mut rr = Rng::new(seed ^ 0x5EED);
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

/// Every case of `op_cases.rs` in f32 and BF16, forward and backward, then
/// whether all their matmuls ran in one cuBLASLt call.
pub fn check_ops(rep: &mut Report) {
    let before = matmul_fallbacks();
    for (k, c) in crate::op_cases::cases().iter().enumerate() {
        for dtype in [DType::F32, DType::BF16] {
            run_case(c, dtype, 1000 + k as u64, rep);
        }
    }
    let after = matmul_fallbacks();
    let (retries, tiled) = (after[0] - before[0], after[1] - before[1]);
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
}
