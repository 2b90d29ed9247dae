//! cuBLASLt GEMMs (BF16, FP8 with per-tensor scales, and the Hopper MXFP4 /
//! MXFP8 path: dequantize to BF16 + BF16 GEMM) against an f64 reference of
//! the dequantized operands, with the tolerance printed on each line, and
//! their speed in TFLOP/s at training sizes.

use rayon::prelude::*;

use mxswitch_runtime::cuda::gemm::GemmSpec;
use mxswitch_runtime::cuda::{
    CudaContext, DequantLayout, DevBuf, Fp8Device, GemmDType, GemmOperand,
};
use mxswitch_runtime::formats::ElemFormat;
use mxswitch_runtime::quant::MxConfig;
use mxswitch_runtime::DType;

use crate::common::{download_f32, gpu, mean_ms, normal_data, to_bf16, widen, Report, Rng};
use crate::mx::{describe, SR_KEY};

/// What a GEMM check multiplies.
#[derive(Clone, Copy, Debug)]
enum GemmKind {
    Bf16,
    Fp8 {
        a: ElemFormat,
        b: ElemFormat,
    },
    /// MX quantize both operands, dequantize to BF16, BF16 GEMM (Hopper's MXFP4 path).
    Mx {
        a: MxConfig,
        b: MxConfig,
    },
}

impl GemmKind {
    fn name(&self, out: GemmDType) -> String {
        let o = match out {
            GemmDType::F32 => "f32",
            _ => "bf16",
        };
        match self {
            GemmKind::Bf16 => format!("bf16 x bf16 -> {o}"),
            GemmKind::Fp8 { a, b } => format!("{a} x {b} -> {o} (tensorwise scales)"),
            GemmKind::Mx { a, b } => format!(
                "mx [{}] x [{}] -> dequant bf16 -> bf16 GEMM -> {o}",
                describe(a),
                describe(b)
            ),
        }
    }

    /// Per-element error bound: acc * sum_k |a_ik b_jk| + out_rel * |ref|,
    /// and a bound on the relative Frobenius error.
    fn tolerance(&self, k: usize, out: GemmDType) -> (f64, f64, f64) {
        let eps32 = 2f64.powi(-23);
        let acc = match self {
            // f32 accumulation: K additions of at most one f32 ulp each.
            GemmKind::Bf16 | GemmKind::Mx { .. } => k as f64 * eps32,
            // Hopper FP8 tensor cores keep ~14 significant bits inside one
            // MMA (K = 32) before the f32 promotion: allow 2^-9 of sum |a b|.
            GemmKind::Fp8 { .. } => 2f64.powi(-9) + k as f64 * eps32,
        };
        let (out_rel, fro) = match out {
            // One BF16 rounding of the output: at most 2^-8 relative (8
            // significant bits); the accumulation error is in the first term.
            GemmDType::Bf16 => (2f64.powi(-8), 2f64.powi(-7)),
            _ => (
                2.0 * eps32,
                if matches!(self, GemmKind::Fp8 { .. }) {
                    2f64.powi(-7)
                } else {
                    2f64.powi(-12)
                },
            ),
        };
        (acc, out_rel, fro)
    }
}

/// A GEMM operand held on the device.
enum Held {
    Plain(DevBuf),
    Fp8(Fp8Device),
}

impl Held {
    fn operand(&self, dtype: GemmDType) -> GemmOperand<'_> {
        match self {
            Held::Plain(buf) => GemmOperand {
                buf,
                dtype,
                scale_inv: None,
            },
            Held::Fp8(q) => GemmOperand {
                buf: &q.codes,
                dtype,
                scale_inv: Some(q.scale_inv_ptr()),
            },
        }
    }
}

/// Operands on the device plus their exact values on the host (for the reference).
struct Prepared {
    a: Held,
    b: Held,
    a_dtype: GemmDType,
    b_dtype: GemmDType,
    /// Dequantized operands `[M, K]` and `[N, K]` (K possibly padded).
    a_vals: Vec<f32>,
    b_vals: Vec<f32>,
    k: usize,
}

fn fp8_dtype(e: ElemFormat) -> GemmDType {
    if e == ElemFormat::E5M2 {
        GemmDType::Fp8E5M2
    } else {
        GemmDType::Fp8E4M3
    }
}

/// Quantizes / converts the f32 operands as `kind` asks, on the GPU.
fn prepare(
    ctx: &CudaContext,
    kind: &GemmKind,
    a: &[f32],
    b: &[f32],
    m: usize,
    n: usize,
    k: usize,
) -> Result<Prepared, String> {
    match kind {
        GemmKind::Bf16 => {
            let (ab, bb) = (to_bf16(a), to_bf16(b));
            Ok(Prepared {
                a: Held::Plain(gpu(ctx.upload(&ab))?),
                b: Held::Plain(gpu(ctx.upload(&bb))?),
                a_dtype: GemmDType::Bf16,
                b_dtype: GemmDType::Bf16,
                a_vals: widen(&ab),
                b_vals: widen(&bb),
                k,
            })
        }
        GemmKind::Fp8 { a: ea, b: eb } => {
            let (ad, bd) = (gpu(ctx.upload(a))?, gpu(ctx.upload(b))?);
            let qa = gpu(ctx.quantize_fp8_of(&ad, DType::F32, m * k, *ea, false))?;
            let qb = gpu(ctx.quantize_fp8_of(&bd, DType::F32, n * k, *eb, false))?;
            let vals = |q: &Fp8Device, len: usize| -> Result<Vec<f32>, String> {
                let codes: Vec<u8> = gpu(ctx.download(&q.codes, len))?;
                let (_, _, inv) = gpu(q.read_scales(ctx))?;
                let table = q.elem.decode_table();
                Ok(codes.par_iter().map(|&c| table[c as usize] * inv).collect())
            };
            let (a_vals, b_vals) = (vals(&qa, m * k)?, vals(&qb, n * k)?);
            Ok(Prepared {
                a: Held::Fp8(qa),
                b: Held::Fp8(qb),
                a_dtype: fp8_dtype(*ea),
                b_dtype: fp8_dtype(*eb),
                a_vals,
                b_vals,
                k,
            })
        }
        GemmKind::Mx { a: ca, b: cb } => {
            let (ad, bd) = (gpu(ctx.upload(a))?, gpu(ctx.upload(b))?);
            let qa = gpu(ctx.quantize_mx_rows_of(&ad, DType::F32, m, k, ca))?;
            let qb = gpu(ctx.quantize_mx_rows_of(&bd, DType::F32, n, k, cb))?;
            let kp = qa.padded_len;
            let da = gpu(ctx.dequantize_mx(&qa, DequantLayout::Rows, DType::BF16))?;
            let db = gpu(ctx.dequantize_mx(&qb, DequantLayout::Rows, DType::BF16))?;
            // The reference multiplies the GPU's own BF16 operands, so this
            // check is about the GEMM; the quantizer checks cover the rest.
            let ha: Vec<u16> = gpu(ctx.download(&da, m * kp))?;
            let hb: Vec<u16> = gpu(ctx.download(&db, n * kp))?;
            Ok(Prepared {
                a: Held::Plain(da),
                b: Held::Plain(db),
                a_dtype: GemmDType::Bf16,
                b_dtype: GemmDType::Bf16,
                a_vals: widen(&ha),
                b_vals: widen(&hb),
                k: kp,
            })
        }
    }
}

/// f64 dot products and sums of |products| of the requested (i, j) entries.
pub fn reference(a: &[f32], b: &[f32], k: usize, entries: &[(usize, usize)]) -> Vec<(f64, f64)> {
    entries
        .par_iter()
        .map(|&(i, j)| {
            let (ra, rb) = (&a[i * k..(i + 1) * k], &b[j * k..(j + 1) * k]);
            ra.iter().zip(rb).fold((0.0, 0.0), |(s, sa), (&x, &y)| {
                let p = x as f64 * y as f64;
                (s + p, sa + p.abs())
            })
        })
        .collect()
}

pub fn gemm_entries(m: usize, n: usize, full: bool) -> Vec<(usize, usize)> {
    if full {
        (0..m).flat_map(|i| (0..n).map(move |j| (i, j))).collect()
    } else {
        let mut r = Rng::new(m as u64 * 31 + n as u64);
        let mut v: Vec<(usize, usize)> = (0..2048)
            .map(|_| {
                (
                    (r.next_u64() % m as u64) as usize,
                    (r.next_u64() % n as u64) as usize,
                )
            })
            .collect();
        // Corners, where layout mistakes show first.
        v.extend([(0, 0), (0, n - 1), (m - 1, 0), (m - 1, n - 1)]);
        v
    }
}

/// One GEMM configuration: correctness against f64 and (optionally) timing.
#[allow(clippy::too_many_arguments)]
fn gemm_check(
    ctx: &CudaContext,
    rep: &mut Report,
    kind: GemmKind,
    out: GemmDType,
    m: usize,
    n: usize,
    k: usize,
    time: bool,
) {
    let name = format!("gemm {} M={m} N={n} K={k}", kind.name(out));
    rep.check(&name, || {
        let a = normal_data(m * k, (m * 7 + k) as u64, 3.0);
        let b = normal_data(n * k, (n * 13 + k) as u64, 0.02);
        let p = prepare(ctx, &kind, &a, &b, m, n, k)?;
        let (opa, opb) = (p.a.operand(p.a_dtype), p.b.operand(p.b_dtype));
        let y = gpu(ctx.gemm_nt(&opa, &opb, m, n, p.k, out))?;
        let full = m * n * p.k <= 1 << 28;
        let entries = gemm_entries(m, n, full);
        let out_dtype = if out == GemmDType::F32 {
            DType::F32
        } else {
            DType::BF16
        };
        let got: Vec<f64> = download_f32(ctx, &y, m * n, out_dtype)?
            .into_iter()
            .map(f64::from)
            .collect();
        let refs = reference(&p.a_vals, &p.b_vals, p.k, &entries);
        let (acc, out_rel, fro_tol) = kind.tolerance(p.k, out);
        let (mut worst, mut worst_at, mut err2, mut ref2, mut max_rel_abs) =
            (0.0f64, 0usize, 0.0f64, 0.0f64, 0.0f64);
        for (e, (&(i, j), &(r, sa))) in entries.iter().zip(&refs).enumerate() {
            let g = got[i * n + j];
            let err = (g - r).abs();
            let bound = acc * sa + out_rel * r.abs() + 1e-30;
            // A NaN or Inf output fails whatever the bound.
            let ratio = if g.is_finite() {
                err / bound
            } else {
                f64::INFINITY
            };
            if ratio > worst {
                worst = ratio;
                worst_at = e;
            }
            err2 += err * err;
            ref2 += r * r;
            if sa > 0.0 {
                max_rel_abs = max_rel_abs.max(err / sa);
            }
        }
        let fro = (err2 / ref2.max(1e-300)).sqrt();
        let (wi, wj) = entries[worst_at];
        let stats = format!(
            "{} entries{}, max |err| / sum|ab| = {:.2e}, rel Frobenius err {:.2e} (tol |err| <= {:.1e} sum|ab| + {:.1e} |ref|, Frobenius <= {:.1e}); worst at ({wi},{wj}) {:.0}% of bound",
            entries.len(),
            if full { " (all)" } else { " (sampled)" },
            max_rel_abs,
            fro,
            acc,
            out_rel,
            fro_tol,
            worst * 100.0
        );
        let mut timing = String::new();
        if time {
            let allocs = ctx.pool_stats().device_allocs;
            let ms = mean_ms(ctx, 3, 20, || {
                gpu(ctx.gemm(&opa, &opb, &GemmSpec::nt(m, n, p.k), &y, out))
            })?;
            let tflops = 2.0 * m as f64 * n as f64 * p.k as f64 / (ms * 1e-3) / 1e12;
            timing = format!(
                "; {ms:.3} ms = {tflops:.1} TFLOP/s ({} new cuMemAlloc while timing)",
                ctx.pool_stats().device_allocs - allocs
            );
        }
        if worst <= 1.0 && fro <= fro_tol {
            Ok(format!("{stats}{timing}"))
        } else {
            let (r, _) = refs[worst_at];
            Err(format!(
                "{stats}; at ({wi},{wj}) gpu {:e} ref {r:e}{timing}",
                got[wi * n + wj]
            ))
        }
    });
}

pub fn check_gemms(ctx: &CudaContext, rep: &mut Report) {
    let e4 = ElemFormat::E4M3FN;
    let e5 = ElemFormat::E5M2;
    let mxfp4_x = MxConfig::mxfp4();
    let mxfp4_w = MxConfig {
        tile2d: true,
        ..MxConfig::mxfp4()
    };
    let wgrad_dy = MxConfig {
        hadamard: true,
        sr: Some(SR_KEY),
        ..MxConfig::mxfp4()
    };
    let wgrad_x = MxConfig {
        hadamard: true,
        ..MxConfig::mxfp4()
    };
    let mxfp8 = MxConfig::mxfp8();
    let (bf, f32o) = (GemmDType::Bf16, GemmDType::F32);
    // Correctness at a small shape, every kind and output.
    for (kind, out) in [
        (GemmKind::Bf16, f32o),
        (GemmKind::Bf16, bf),
        (GemmKind::Fp8 { a: e4, b: e4 }, bf),
        (GemmKind::Fp8 { a: e4, b: e4 }, f32o),
        (GemmKind::Fp8 { a: e5, b: e4 }, bf),
        (GemmKind::Fp8 { a: e4, b: e5 }, f32o),
    ] {
        gemm_check(ctx, rep, kind, out, 256, 384, 1024, false);
    }
    // MX paths, with K = 1000 padded to 1024 and M, N not multiples of 16.
    for (a, b) in [(mxfp4_x, mxfp4_w), (wgrad_dy, wgrad_x), (mxfp8, mxfp8)] {
        gemm_check(ctx, rep, GemmKind::Mx { a, b }, bf, 200, 300, 1000, false);
    }
    // Speed (sampled correctness) at training sizes.
    for s in [4096usize, 8192] {
        gemm_check(ctx, rep, GemmKind::Bf16, bf, s, s, s, true);
        gemm_check(ctx, rep, GemmKind::Fp8 { a: e4, b: e4 }, bf, s, s, s, true);
        gemm_check(ctx, rep, GemmKind::Fp8 { a: e5, b: e4 }, bf, s, s, s, true);
    }
    gemm_check(
        ctx,
        rep,
        GemmKind::Fp8 { a: e4, b: e4 },
        f32o,
        8192,
        8192,
        8192,
        true,
    );
}
