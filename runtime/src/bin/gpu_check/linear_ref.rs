//! The CPU side of the linear checks: the row norms that bound each GEMM's
//! accumulation error, the bounded comparison, and the byte-for-byte
//! comparison of the saved operands.

use rayon::prelude::*;

use mxswitch_runtime::backend::{Along, Format, Want};
use mxswitch_runtime::cpu::{CpuOperand, CpuStorage};
use mxswitch_runtime::formats::{bf16, ElemFormat};
use mxswitch_runtime::qlinear::{LinearCtx, Saved};
use mxswitch_runtime::quant::{
    quantize_fp8_group_rows, quantize_fp8_groups, quantize_mx, quantize_nvfp4, quantize_nvfp4_rows,
    quantize_rows, quantize_tensorwise,
};
use mxswitch_runtime::recipe::Recipe;

use crate::common::{cpu, first_diff};

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

/// One GEMM as the CPU runs it: the L2 norms of the rows of its two
/// operands along the reduction (as dequantized, rotated, scale_inv
/// applied), the reduction length, and whether the GPU runs it on the FP8
/// tensor cores.
pub struct GemmRef {
    pub a: Vec<f64>,
    pub b: Vec<f64>,
    pub k_red: usize,
    pub fp8_mma: bool,
}

/// The L2 norms of the rows of `want`'s operand of the `[rows, cols]`
/// matrix `x` along its reduction axis, as the CPU quantizers
/// ([`mxswitch_runtime::quant`]) dequantize it, and that axis' length.
fn operand_norms(
    x: &[f32],
    (rows, cols): (usize, usize),
    want: Want,
) -> Result<(Vec<f64>, usize), String> {
    let (values, rows, cols, along) = match want.format {
        Format::Bf16 => (
            x.par_iter().map(|&v| bf16::round(v)).collect(),
            rows,
            cols,
            want.along,
        ),
        Format::Tensorwise { elem, pow2 } => {
            let q = cpu(quantize_tensorwise(
                x,
                &[rows, cols],
                elem,
                pow2,
                "reference",
            ))?;
            (q.dequantize(), rows, cols, want.along)
        }
        // MX blocks run along the reduction axis: axis-last rows.
        Format::Mx(cfg) => {
            let q = match want.along {
                Along::Cols => cpu(quantize_rows(x, rows, cols, &cfg))?,
                Along::Rows => cpu(quantize_mx(x, &[rows, cols], 0, &cfg))?,
            };
            (q.dequantize_rows(), q.rows, q.padded_len, Along::Cols)
        }
        // NVFP4 and FP8 group scales run along the reduction axis too.
        Format::Nvfp4(cfg) => {
            let q = match want.along {
                Along::Cols => cpu(quantize_nvfp4_rows(x, rows, cols, &cfg))?,
                Along::Rows => cpu(quantize_nvfp4(x, &[rows, cols], 0, &cfg))?,
            };
            (q.dequantize_rows(), q.rows, q.padded_len, Along::Cols)
        }
        Format::Fp8Group(cfg) => {
            let q = match want.along {
                Along::Cols => cpu(quantize_fp8_group_rows(x, rows, cols, &cfg))?,
                Along::Rows => cpu(quantize_fp8_groups(x, &[rows, cols], 0, &cfg))?,
            };
            (q.dequantize_rows(), q.rows, q.padded_len, Along::Cols)
        }
    };
    Ok(match along {
        Along::Cols => (row_norms(&values, rows, cols), cols),
        Along::Rows => (col_norms(&values, rows, cols), rows),
    })
}

/// Whether cuBLASLt multiplies these operands in FP8: both tensorwise in
/// the OCP formats, one of them E4M3 (the backend's `cublas_fp8` rule), or
/// both E4M3 with rowwise / 128-block scales.
fn fp8_mma(a: &Want, b: &Want) -> bool {
    if matches!(
        (a.format, b.format),
        (Format::Fp8Group(_), Format::Fp8Group(_))
    ) {
        return true;
    }
    let ocp = |w: &Want| match w.format {
        Format::Tensorwise { elem, .. } => {
            matches!(elem, ElemFormat::E4M3FN | ElemFormat::E5M2).then_some(elem)
        }
        _ => None,
    };
    match (ocp(a), ocp(b)) {
        (Some(ea), Some(eb)) => ea == ElemFormat::E4M3FN || eb == ElemFormat::E4M3FN,
        _ => false,
    }
}

/// fprop, dgrad and wgrad of `r` as the CPU runs them on x `[m, k]`, W
/// `[n, k]` and dy `[m, n]` (each GEMM's operands as its spec asks, the
/// gradients with the linear's SR keys, W as dgrad keeps it).
pub fn gemm_refs(
    r: &Recipe,
    (x, w, dy): (&[f32], &[f32], &[f32]),
    (m, k, n): (usize, usize, usize),
    l: &LinearCtx,
) -> Result<[GemmRef; 3], String> {
    let spec = r.spec();
    let want = |s, along, sr| cpu(Want::new(s, along, sr));
    let dgrad_w = spec.saved().w.unwrap_or(spec.dgrad.b);
    let (sr_dgrad, sr_wgrad) = (Some(l.sr_key(0)), Some(l.sr_key(1)));
    // Per GEMM: (a's matrix, its [rows, cols], its want), then b's.
    let gemms = [
        (x, (m, k), want(&spec.fprop.a, Along::Cols, None)?),
        (w, (n, k), want(&spec.fprop.b, Along::Cols, None)?),
        (dy, (m, n), want(&spec.dgrad.a, Along::Cols, sr_dgrad)?),
        (w, (n, k), want(&dgrad_w, Along::Rows, None)?),
        (dy, (m, n), want(&spec.wgrad.a, Along::Rows, sr_wgrad)?),
        (x, (m, k), want(&spec.wgrad.b, Along::Rows, None)?),
    ];
    let mut out = Vec::with_capacity(3);
    for pair in gemms.chunks(2) {
        let [(ta, da, wa), (tb, db, wb)] = pair else {
            return Err("two operands per GEMM".into());
        };
        let (a, k_red) = operand_norms(ta, *da, *wa)?;
        let (b, _) = operand_norms(tb, *db, *wb)?;
        out.push(GemmRef {
            a,
            b,
            k_red,
            fp8_mma: fp8_mma(wa, wb),
        });
    }
    out.try_into()
        .map_err(|_| "three GEMMs expected".to_string())
}

/// Worst |gpu - cpu| / bound over `[rows, cols]`, or the first violation of
/// `eps * ||a_i|| ||b_j|| + rel * |cpu| + 2^-126`.
pub fn within_bound(
    what: &str,
    got: &[f32],
    want: &[f32],
    g: &GemmRef,
    bf16_out: bool,
) -> Result<f64, String> {
    let (na, nb) = (&g.a, &g.b);
    let cols = nb.len();
    let rel = if bf16_out {
        2f64.powi(-8)
    } else {
        2f64.powi(-22)
    };
    // Hopper's FP8 MMA keeps about 14 bits in its accumulator between
    // cuBLASLt's promotions to f32, truncating: up to 2^-11.2 of the
    // |products| summed was measured on an H200; 2^-9 leaves 4x margin.
    let eps = g.k_red as f64 * 2f64.powi(-23) + if g.fp8_mma { 2f64.powi(-9) } else { 0.0 };
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

/// `Err` naming the first differing byte of two byte-like slices.
fn same<T: PartialEq>(what: &str, a: &[T], b: &[T]) -> Result<(), String> {
    match first_diff(a, b) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what} differ (first at {i}, {} vs {} values)",
            a.len(),
            b.len()
        )),
    }
}

/// One kept operand of the GPU against the CPU's, byte for byte.
fn same_operand(name: &str, g: &CpuOperand, c: &CpuOperand) -> Result<(), String> {
    match (g, c) {
        (
            CpuOperand::Bf16 {
                bits: a,
                rows: ra,
                cols: ca,
                along: la,
            },
            CpuOperand::Bf16 {
                bits: b,
                rows: rb,
                cols: cb,
                along: lb,
            },
        ) => {
            if (ra, ca, la) != (rb, cb, lb) {
                return Err(format!("saved BF16 {name} layout differs"));
            }
            same(&format!("saved BF16 {name} bits"), a, b)
        }
        (CpuOperand::Fp8 { q: a, along: la }, CpuOperand::Fp8 { q: b, along: lb }) => {
            same(&format!("saved FP8 {name} codes"), &a.codes, &b.codes)?;
            if a.scale.to_bits() != b.scale.to_bits()
                || a.scale_inv.to_bits() != b.scale_inv.to_bits()
                || a.elem != b.elem
                || a.shape != b.shape
                || la != lb
            {
                return Err(format!(
                    "saved FP8 {name}: scale {:e}/{:e} vs CPU {:e}/{:e}",
                    a.scale, a.scale_inv, b.scale, b.scale_inv
                ));
            }
            Ok(())
        }
        (CpuOperand::Mx(a), CpuOperand::Mx(b)) => {
            if (a.rows, a.len, a.padded_len, &a.shape, a.axis)
                != (b.rows, b.len, b.padded_len, &b.shape, b.axis)
            {
                return Err(format!("saved {name} layout differs"));
            }
            same(&format!("saved {name} scale bytes"), &a.scales, &b.scales)?;
            same(&format!("saved {name} codes"), &a.codes, &b.codes)
        }
        (CpuOperand::Nvfp4(a), CpuOperand::Nvfp4(b)) if a == b => Ok(()),
        (CpuOperand::Fp8Group(a), CpuOperand::Fp8Group(b)) if a == b => Ok(()),
        (CpuOperand::Nvfp4(_), CpuOperand::Nvfp4(_)) => Err(format!("saved NVFP4 {name} differs")),
        (CpuOperand::Fp8Group(_), CpuOperand::Fp8Group(_)) => {
            Err(format!("saved FP8 group {name} differs"))
        }
        _ => Err(format!("saved {name} is another kind of operand")),
    }
}

/// What the GPU forward kept against what the CPU forward kept.
pub fn same_saved(g: &Saved<CpuStorage>, c: &Saved<CpuStorage>) -> Result<(), String> {
    same_operand("x", &g.x, &c.x)?;
    match (&g.w, &c.w) {
        (Some(a), Some(b)) => same_operand("W", a, b),
        (None, None) => Ok(()),
        _ => Err("W kept on one backend only".into()),
    }
}
