//! FP8 rowwise and 128-block scaling (SPEC 3b) on the GPU: the quantizer
//! bit for bit against the CPU (codes, scales, inverse scales, dequantized
//! values; both directions of a matrix, awkward shapes and values, tiles,
//! pow2 on and off, f32 and BF16 input), a non-finite amax refused, and the
//! cuBLASLt GEMM of each scale mode against an f64 reference of the
//! dequantized operands, with the bound printed.

use mxswitch_runtime::cuda::gemm::GemmSpec;
use mxswitch_runtime::cuda::{CudaContext, Fp8GroupDevice, GemmDType, GemmOperand};
use mxswitch_runtime::quant::{
    quantize_fp8_group_rows, quantize_fp8_groups, Fp8GroupConfig, Fp8GroupTensor, Grouping,
};
use mxswitch_runtime::DType;

use crate::common::{
    chunked_column_sums, device_input, dtype_name, first_diff, gpu, none_bad, same_f32, same_sums,
    Report, Rng,
};
use crate::gemm::{gemm_entries, reference};

/// Every configuration the recipes and options reach.
fn configs() -> [(&'static str, Fp8GroupConfig); 6] {
    let pow2 = |c: Fp8GroupConfig, p| Fp8GroupConfig { pow2: p, ..c };
    [
        ("rowwise pow2", Fp8GroupConfig::rowwise()),
        ("rowwise exact", pow2(Fp8GroupConfig::rowwise(), false)),
        ("1x128 exact", Fp8GroupConfig::block128()),
        ("1x128 pow2", pow2(Fp8GroupConfig::block128(), true)),
        ("128x128 exact", Fp8GroupConfig::block128_tiles()),
        ("128x128 pow2", pow2(Fp8GroupConfig::block128_tiles(), true)),
    ]
}

/// `[rows, cols]` values: normal data whose rows and 128-column blocks
/// have magnitudes spread over many binades, with zero rows, an outlier,
/// f32 subnormals, values near f32's largest and exact E4M3 ties.
fn awkward(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut x = spread(rows, cols, seed);
    let n = x.len();
    let mut put = |i: usize, v: f32| {
        if i < n {
            x[i] = v;
        }
    };
    if rows > 2 {
        for c in 0..cols {
            put(cols + c, if c % 2 == 0 { 0.0 } else { -0.0 });
        }
    }
    put(3 * cols / 2 + 1, 3.0e4);
    put(5, 1.0e-40);
    put(6, -3.0e-42);
    put(n.saturating_sub(1), 3.0e38);
    put(n / 2, -2.5e38);
    put(n / 3, 13.0);
    put(n / 3 + 1, 9.0);
    x
}

/// Normal data whose rows and 128-column blocks span 2^-20 .. 2^20, so a
/// scale read from the wrong group shows.
fn spread(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut x = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            let mag = 2f64.powi(((r * 7 + (c / 128) * 5) % 41) as i32 - 20);
            x[r * cols + c] = (rng.normal() * mag) as f32;
        }
    }
    x
}

/// The GPU's tensor of one direction against the CPU's, bit for bit.
fn same_tensor(ctx: &CudaContext, g: &Fp8GroupDevice, c: &Fp8GroupTensor) -> Result<(), String> {
    let got = gpu(g.to_cpu(ctx, c.shape.clone(), c.axis))?;
    let mut bad = Vec::new();
    if let Some(i) = first_diff(&got.codes, &c.codes) {
        bad.push(format!(
            "code {i}: gpu {:#04x} cpu {:#04x}",
            got.codes[i], c.codes[i]
        ));
    }
    for (name, g, c) in [
        ("scale", &got.scales, &c.scales),
        ("scale_inv", &got.scale_inv, &c.scale_inv),
    ] {
        if let Some(i) = (0..c.len()).find(|&i| g.len() != c.len() || !same_f32(g[i], c[i])) {
            bad.push(format!("{name} {i}: gpu {:e} cpu {:e}", g[i], c[i]));
        }
    }
    if (got.rows, got.len, got.padded_len, got.group_len)
        != (c.rows, c.len, c.padded_len, c.group_len)
    {
        bad.push("layout fields differ".into());
    }
    // The f32 GEMM operand of the fallback: dequantize_rows, padded.
    let d = gpu(ctx.dequantize_fp8_group(g))?;
    let kp = g.stored_len();
    let all: Vec<f32> = gpu(ctx.download(&d, g.rows * kp))?;
    let want = c.dequantize_rows();
    let pl = c.padded_len;
    if let Some(i) = (0..want.len()).find(|&i| !same_f32(all[i / pl.max(1) * kp + i % pl], want[i]))
    {
        bad.push(format!("dequantized {i}: cpu {:e}", want[i]));
    }
    none_bad(bad, || "mismatch".into())
}

/// The f32 column sums of x in the order `fp8g_block2d` takes them: in
/// each 128-row tile, thread t < 32 adds rows t, t + 32, t + 64 and t + 96,
/// the tile adds its 32 threads' sums in order.
fn block2d_column_sums(x: &[f32], dims: (usize, usize)) -> Vec<f32> {
    chunked_column_sums(x, dims, (128, (32, 4)), |t, k| t + 32 * k)
}

/// Both directions of a `[rows, cols]` matrix under `cfg`, from one call
/// (the linears' case: one amax and one encode pass for both, which for
/// 128-blocks also takes the column sums, bit-exact in its order) and from
/// a call per direction.
fn compare(
    ctx: &CudaContext,
    x: &[f32],
    (rows, cols): (usize, usize),
    dtype: DType,
    cfg: &Fp8GroupConfig,
) -> Result<(), String> {
    let (xd, x) = device_input(ctx, x, dtype)?;
    let cc = quantize_fp8_group_rows(&x, rows, cols, cfg).map_err(|e| format!("CPU: {e}"))?;
    let cr = quantize_fp8_groups(&x, &[rows, cols], 0, cfg).map_err(|e| format!("CPU: {e}"))?;
    for (dirs, how) in [
        ([true, true], "both at once"),
        ([true, false], "alone"),
        ([false, true], "alone"),
    ] {
        let sums = dirs == [true, true];
        let ([qc, qr], got) =
            gpu(ctx.quantize_fp8_group_2d(&xd, dtype, (rows, cols), cfg, dirs, sums))?;
        if qc.is_some() != dirs[0] || qr.is_some() != dirs[1] {
            return Err(format!("asked {dirs:?}, got other directions"));
        }
        let block = matches!(cfg.grouping, Grouping::Block128 { .. });
        match got {
            Some(s) if sums && block && rows * cols > 0 => {
                let got = gpu(ctx.download::<f32>(&s, cols))?;
                same_sums(&got, &block2d_column_sums(&x, (rows, cols)))?;
            }
            None if !(sums && block && rows * cols > 0) => {}
            s => {
                return Err(format!(
                    "column sums: got {}",
                    if s.is_some() { "some" } else { "none" }
                ))
            }
        }
        if let Some(qc) = qc {
            gpu(qc.check_finite(ctx, "x"))?;
            same_tensor(ctx, &qc, &cc).map_err(|e| format!("along the columns, {how}: {e}"))?;
        }
        if let Some(qr) = qr {
            gpu(qr.check_finite(ctx, "x"))?;
            same_tensor(ctx, &qr, &cr).map_err(|e| format!("along the rows, {how}: {e}"))?;
        }
    }
    Ok(())
}

/// A NaN or an Inf anywhere is the CPU's error on both backends, whichever
/// directions the device quantizes (each direction's flag is the shared
/// one).
fn refuses_non_finite(ctx: &CudaContext, cfg: &Fp8GroupConfig) -> Result<(), String> {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let (rows, cols) = (130, 300);
        let mut x = awkward(rows, cols, 5);
        x[129 * cols + 257] = bad;
        if quantize_fp8_group_rows(&x, rows, cols, cfg).is_ok() {
            return Err(format!("CPU accepted {bad}"));
        }
        let xd = gpu(ctx.upload(&x))?;
        for dirs in [[true, false], [false, true], [true, true]] {
            let (qs, _) =
                gpu(ctx.quantize_fp8_group_2d(&xd, DType::F32, (rows, cols), cfg, dirs, false))?;
            let q = qs.iter().flatten().next().ok_or("no codes")?;
            match q.check_finite(ctx, "x") {
                Err(e) if e.to_string().contains("non-finite amax") => {}
                Err(e) => return Err(format!("{bad} {dirs:?}: unexpected error {e}")),
                Ok(()) => return Err(format!("GPU accepted {bad} {dirs:?}")),
            }
        }
    }
    Ok(())
}

pub fn check_fp8_group(ctx: &CudaContext, rep: &mut Report) {
    // Lengths around 16 and 128, rows around the 128-row tiles; the last
    // three have rows and columns spanning many 64 x 64 encoder tiles (a
    // rowwise group's amax reduced over 16 and 20 of them).
    let shapes = [
        (1, 1),
        (3, 17),
        (16, 127),
        (129, 128),
        (2, 129),
        (130, 300),
        (257, 520),
        (1000, 33),
        (64, 64),
        (300, 1000),
        (1283, 77),
    ];
    for (name, cfg) in configs() {
        for dtype in [DType::F32, DType::BF16] {
            let mut ok = 0;
            let mut fails = Vec::new();
            for (i, &(r, c)) in shapes.iter().enumerate() {
                let x = awkward(r, c, 100 + i as u64);
                match compare(ctx, &x, (r, c), dtype, &cfg) {
                    Ok(()) => ok += 1,
                    Err(e) => fails.push(format!("[{r}, {c}]: {e}")),
                }
            }
            let label = format!(
                "fp8 {name} quantize {} ({} shapes, both axes)",
                dtype_name(dtype),
                shapes.len()
            );
            rep.line(
                &label,
                if fails.is_empty() {
                    Ok(format!("{ok} shapes bit-exact"))
                } else {
                    Err(fails.join("; "))
                },
            );
        }
        rep.line(
            &format!("fp8 {name} non-finite amax refused"),
            refuses_non_finite(ctx, &cfg).map(|()| "NaN, Inf and -Inf are errors".into()),
        );
    }
    gemm_checks(ctx, rep);
}

/// One scaled GEMM `a · b^T` of operands quantized from `[m, k]` and
/// `[n, k]` f32 data, read as `types`, against the f64 sum of the CPU's
/// dequantized values; `Ok(None)` where cuBLASLt has no algorithm.
fn scaled_gemm(
    ctx: &CudaContext,
    (m, n, k): (usize, usize, usize),
    (ca, cb): (Fp8GroupConfig, Fp8GroupConfig),
    types: (GemmDType, GemmDType),
) -> Result<Option<f64>, String> {
    let (a, b) = (spread(m, k, 7), spread(n, k, 8));
    let q = |x: &[f32], rows, cfg: &Fp8GroupConfig| -> Result<Fp8GroupDevice, String> {
        let xd = gpu(ctx.upload(x))?;
        let ([q, _], _) =
            gpu(ctx.quantize_fp8_group_2d(&xd, DType::F32, (rows, k), cfg, [true, false], false))?;
        q.ok_or_else(|| "no codes".to_string())
    };
    let (qa, qb) = (q(&a, m, &ca)?, q(&b, n, &cb)?);
    let ptr = |q: &Fp8GroupDevice, t| match (t, &q.blk) {
        (GemmDType::Fp8E4M3Blk128, Some(blk)) => blk.ptr(),
        _ => q.vec.ptr(),
    };
    let kp = qa.stored_len();
    let (m16, n16) = (m.next_multiple_of(16), n.next_multiple_of(16));
    let y = gpu(ctx.alloc(4 * m16 * n16))?;
    fn op(q: &Fp8GroupDevice, t: GemmDType, scale: u64) -> GemmOperand<'_> {
        GemmOperand {
            buf: &q.codes,
            dtype: t,
            scale_inv: Some(scale),
        }
    }
    match ctx.gemm(
        &op(&qa, types.0, ptr(&qa, types.0)),
        &op(&qb, types.1, ptr(&qb, types.1)),
        &GemmSpec::nt(m16, n16, kp),
        &y,
        GemmDType::F32,
    ) {
        Ok(()) => {}
        Err(mxswitch_runtime::cuda::CudaError::Blas(_)) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    }
    let got: Vec<f32> = gpu(ctx.download(&y, m16 * n16))?;
    let da = quantize_fp8_group_rows(&a, m, k, &ca)
        .map_err(|e| e.to_string())?
        .dequantize_rows();
    let db = quantize_fp8_group_rows(&b, n, k, &cb)
        .map_err(|e| e.to_string())?
        .dequantize_rows();
    let pl = da.len() / m;
    // FP8 tensor cores keep ~14 bits inside an MMA before promoting to f32.
    let acc = 2f64.powi(-9) + kp as f64 * 2f64.powi(-23);
    let entries = gemm_entries(m, n, true);
    let mut worst = 0.0f64;
    for (&(i, j), &(s, abs)) in entries.iter().zip(&reference(&da, &db, pl, &entries)) {
        let tol = acc * abs + 2f64.powi(-22) * s.abs() + 2f64.powi(-126);
        let e = (got[i * n16 + j] as f64 - s).abs();
        if e.is_nan() || e > tol {
            return Err(format!(
                "y[{i}, {j}] = {:e}, f64 {s:e}, |err| {e:.3e} > {tol:.3e}",
                got[i * n16 + j]
            ));
        }
        worst = worst.max(e / tol);
    }
    Ok(Some(worst))
}

/// Each scale mode cuBLASLt runs, on shapes with partial 128-row tiles.
fn gemm_checks(ctx: &CudaContext, rep: &mut Report) {
    use GemmDType::{Fp8E4M3Blk128 as Blk, Fp8E4M3Rowwise as Row, Fp8E4M3Vec128 as Vec};
    println!("fp8 group GEMM bound: |gpu - f64| <= (2^-9 + K * 2^-23) * sum_k |a_k b_k| + 2^-22 |ref| + 2^-126");
    let (row, blk, tile) = (
        Fp8GroupConfig::rowwise(),
        Fp8GroupConfig::block128(),
        Fp8GroupConfig::block128_tiles(),
    );
    let row_exact = Fp8GroupConfig { pow2: false, ..row };
    let cases = [
        (
            "OUTER_VEC x OUTER_VEC",
            (row, row),
            (Row, Row),
            (256, 384, 512),
        ),
        (
            "OUTER_VEC x OUTER_VEC",
            (row_exact, row_exact),
            (Row, Row),
            (45, 70, 300),
        ),
        ("VEC128 x VEC128", (blk, blk), (Vec, Vec), (200, 136, 512)),
        (
            "VEC128 x BLK128x128",
            (blk, tile),
            (Vec, Blk),
            (200, 300, 512),
        ),
        (
            "BLK128x128 x VEC128",
            (tile, blk),
            (Blk, Vec),
            (300, 136, 1024),
        ),
    ];
    for (name, cfgs, types, (m, n, k)) in cases {
        let label = format!(
            "fp8 group GEMM {name} M={m} N={n} K={k} ({}, {})",
            describe(&cfgs.0),
            describe(&cfgs.1)
        );
        let r = scaled_gemm(ctx, (m, n, k), cfgs, types).and_then(|w| match w {
            Some(w) => Ok(format!("worst err/bound {w:.3}")),
            None => Err("cuBLASLt has no algorithm".into()),
        });
        rep.line(&label, r);
    }
    // A tile row of 3 tiles: the runtime reads such tiles as 1 x 128
    // vectors because the probe's layout leaves cuBLASLt's leading dimension
    // open there; this prints what the 128x128 mode itself does.
    let info = match scaled_gemm(ctx, (200, 300, 384), (blk, tile), (Vec, Blk)) {
        Ok(Some(w)) => format!("matches, worst err/bound {w:.3}"),
        Ok(None) => "no algorithm".into(),
        Err(e) => format!("does not match ({e})"),
    };
    println!("INFO fp8 group GEMM VEC128 x BLK128x128 with 3 tiles per tile row (K=384), not used by the runtime: {info}");
}

fn describe(c: &Fp8GroupConfig) -> String {
    let g = match c.grouping {
        Grouping::Rowwise => "rowwise",
        Grouping::Block128 { tile2d: false } => "1x128",
        Grouping::Block128 { tile2d: true } => "128x128",
    };
    format!("{g}{}", if c.pow2 { " pow2" } else { "" })
}
