//! The NVFP4 quantizer (SPEC 2b): every configuration (16x16 tiles,
//! Hadamard, stochastic rounding on/off) along either axis and along both
//! at once (every pair of one tiling, from one pass) of awkward matrices,
//! with f32 and BF16 input, against `quant::quantize_nvfp4` byte for byte:
//! packed codes, E4M3 scale bytes and the tensor scale's bits;
//! the BF16 GEMM operand equals decode(code) * s_q of the CPU's bytes, from
//! the quantizer and from the kept codes; a tensor the CPU refuses (NaN,
//! Inf, an overflowing Hadamard sum) leaves a non-finite amax on the GPU.
//! The golden vectors are also checked against the JSON itself.

use serde_json::Value;

use mxswitch_runtime::backend::Along;
use mxswitch_runtime::cuda::{CudaContext, DevBuf, Nvfp4Device, Nvfp4Outputs};
use mxswitch_runtime::formats::{bf16, ElemFormat};
use mxswitch_runtime::quant::{quantize_nvfp4, quantize_nvfp4_rows, Nvfp4Config, Nvfp4Tensor};
use mxswitch_runtime::{DType, Error};

use crate::common::{
    chunked_column_sums, device_input, dtype_name, first_diff, gpu, none_bad, same_sums, Cases,
    Report, Rng,
};
use crate::mx::{hex, SR_KEY};

const GOLDEN: &str = include_str!("../../../tests/golden/nvfp4_blocks.json");

fn all_configs() -> Vec<Nvfp4Config> {
    let mut v = Vec::new();
    for tile2d in [false, true] {
        for hadamard in [false, true] {
            for sr in [None, Some(SR_KEY)] {
                v.push(Nvfp4Config {
                    tile2d,
                    hadamard,
                    sr,
                });
            }
        }
    }
    v
}

fn describe(cfg: &Nvfp4Config, along: Along) -> String {
    format!(
        "along {}{}{}{}",
        if along == Along::Cols { "cols" } else { "rows" },
        if cfg.tile2d { " tile16x16" } else { "" },
        if cfg.hadamard { " hadamard" } else { "" },
        if cfg.sr.is_some() { " sr" } else { "" }
    )
}

/// Finite values of many kinds: per-row magnitudes from 2^-140 (f32
/// subnormals) to 2^100 (`wide`) or N(0,1) rows scaled 2^-3..2^3, with
/// zeros, -0, outliers 1000x and (`special` = 1, 2) one NaN or one Inf.
fn nv_data(rows: usize, len: usize, seed: u64, wide: bool, special: u8) -> Vec<f32> {
    let mut r = Rng::new(seed);
    let mut x = Vec::with_capacity(rows * len);
    for row in 0..rows {
        let e = if wide {
            (r.next_u64() % 60) as i32 - 30
                + match row % 5 {
                    1 => 70,
                    3 => -110,
                    _ => 0,
                }
        } else {
            (row % 7) as i32 - 3
        };
        let s = 2f64.powi(e);
        for _ in 0..len {
            let v = (r.normal() * s) as f32;
            x.push(match r.next_u64() % 50 {
                0 | 1 => 0.0,
                2 => -0.0,
                3 => v * 1000.0,
                _ => v,
            });
        }
    }
    if special > 0 && !x.is_empty() {
        let i = (r.next_u64() % x.len() as u64) as usize;
        x[i] = if special == 1 {
            f32::NAN
        } else {
            f32::INFINITY
        };
    }
    x
}

/// The CPU's quantization of `[rows, cols]` along `along`.
fn cpu_quantize(
    x: &[f32],
    (rows, cols): (usize, usize),
    along: Along,
    cfg: &Nvfp4Config,
) -> mxswitch_runtime::Result<Nvfp4Tensor> {
    match along {
        Along::Cols => quantize_nvfp4_rows(x, rows, cols, cfg),
        Along::Rows => quantize_nvfp4(x, &[rows, cols], 0, cfg),
    }
}

/// BF16 bits of decode(code) * s_q for every element of `q` (the GPU's GEMM operand).
fn expected_operand(q: &Nvfp4Tensor) -> Vec<u16> {
    let (e2m1, e4m3) = (ElemFormat::E2M1, ElemFormat::E4M3FN);
    let mut out = Vec::with_capacity(q.rows * q.padded_len);
    for (b, &byte) in q.scales.iter().enumerate() {
        let sq = e4m3.decode(byte);
        for j in 0..16 {
            let code = (q.codes[b * 8 + j / 2] >> (4 * (j % 2))) & 0xF;
            out.push(bf16::from_f32(e2m1.decode(code) * sq));
        }
    }
    out
}

/// Codes, scale bytes and t of the GPU's quantization against the CPU's,
/// then the BF16 operand from the quantizer and from the kept codes.
fn compare_bytes(ctx: &CudaContext, g: &Nvfp4Device, c: &Nvfp4Tensor, along: Along) -> Vec<String> {
    let mut bad = Vec::new();
    let gt = match g.to_tensor(ctx, along) {
        Ok(t) => t,
        Err(e) => return vec![format!("read back: {e}")],
    };
    if (gt.rows, gt.len, gt.padded_len, &gt.shape, gt.axis)
        != (c.rows, c.len, c.padded_len, &c.shape, c.axis)
    {
        bad.push("layout differs".into());
    }
    if gt.tensor_scale.to_bits() != c.tensor_scale.to_bits() {
        bad.push(format!(
            "t: gpu {:e} cpu {:e}",
            gt.tensor_scale, c.tensor_scale
        ));
    }
    if let Some(i) = first_diff(&gt.scales, &c.scales) {
        bad.push(format!(
            "scale byte {i}: gpu {:#04x} cpu {:#04x}",
            gt.scales[i], c.scales[i]
        ));
    }
    if let Some(i) = first_diff(&gt.codes, &c.codes) {
        bad.push(format!(
            "code byte {i}: gpu {:#04x} cpu {:#04x}",
            gt.codes[i], c.codes[i]
        ));
    }
    let want = expected_operand(c);
    let n = want.len();
    let mut operands = Vec::new();
    if let Some(d) = &g.deq {
        operands.push(("operand", gpu(ctx.download::<u16>(d, n))));
    }
    let kept = gpu(ctx.dequantize_nvfp4(g)).and_then(|d| gpu(ctx.download::<u16>(&d, n)));
    operands.push(("operand of kept codes", kept));
    for (name, got) in operands {
        match got {
            Ok(v) => {
                if let Some(i) = first_diff(&v, &want) {
                    bad.push(format!(
                        "{name}[{i}]: gpu {:#06x} cpu {:#06x}",
                        v[i], want[i]
                    ));
                }
            }
            Err(e) => bad.push(format!("{name}: {e}")),
        }
    }
    bad
}

/// One direction's GPU result against the CPU: bit-exact, or both refuse.
fn check_dir(
    ctx: &CudaContext,
    g: &Nvfp4Device,
    x: &[f32],
    dims: (usize, usize),
    along: Along,
    cfg: &Nvfp4Config,
) -> Result<(), String> {
    let what = || describe(cfg, along);
    match cpu_quantize(x, dims, along, cfg) {
        Ok(c) => none_bad(compare_bytes(ctx, g, &c, along), what),
        Err(Error::NonFiniteAmax { amax, .. }) => {
            let (ga, _) = gpu(g.read_scales(ctx))?;
            let same = ga.is_nan() == amax.is_nan() && ga.is_infinite() == amax.is_infinite();
            none_bad(
                (!same)
                    .then(|| format!("CPU refused amax {amax}, GPU amax {ga}"))
                    .into_iter()
                    .collect(),
                what,
            )
        }
        Err(e) => Err(format!("{}: CPU quantizer: {e}", what())),
    }
}

const BOTH: Nvfp4Outputs = Nvfp4Outputs {
    codes: true,
    deq: true,
};

/// One configuration and axis on one matrix: bit-exact, or both refuse.
fn compare_nv(
    ctx: &CudaContext,
    (xd, dtype): (&DevBuf, DType),
    x: &[f32],
    dims: (usize, usize),
    along: Along,
    cfg: &Nvfp4Config,
) -> Result<(), String> {
    let g = gpu(ctx.quantize_nvfp4((xd, dtype), dims, along, cfg, BOTH))?;
    check_dir(ctx, &g, x, dims, along, cfg)
}

/// The f32 column sums of x in the order `nvfp4_amax` takes them: 16 rows
/// a thread, then the 8 warps of a CTA (128 rows) in order.
fn amax_pass_column_sums(x: &[f32], dims: (usize, usize)) -> Vec<f32> {
    chunked_column_sums(x, dims, (128, (8, 16)), |w, i| 16 * w + i)
}

/// Both directions from one pass (`c` along the columns, `r` along the
/// rows, the same tiling): each bit-exact with its own CPU quantization,
/// and the column sums the amax pass takes on the way (when the direction
/// along the columns has no Hadamard) bit-exact in its order (a NaN sum
/// matches any NaN: the CPU keeps the input's payload, the GPU does not).
fn compare_pair(
    ctx: &CudaContext,
    xd: (&DevBuf, DType),
    x: &[f32],
    dims: (usize, usize),
    (c, r): (&Nvfp4Config, &Nvfp4Config),
) -> Result<(), String> {
    let dirs = [Some((*c, BOTH)), Some((*r, BOTH))];
    let ([gc, gr], sums) = gpu(ctx.quantize_nvfp4_2d(xd, dims, dirs, true))?;
    match (sums, c.hadamard || dims.0 * dims.1 == 0) {
        (Some(s), false) => {
            let got = gpu(ctx.download::<f32>(&s, dims.1))?;
            same_sums(&got, &amax_pass_column_sums(x, dims))?;
        }
        (None, true) => {}
        (s, _) => {
            return Err(format!(
                "column sums: got {}",
                if s.is_some() { "some" } else { "none" }
            ))
        }
    }
    let pair = |e: String| {
        format!(
            "both at once ({} | {}): {e}",
            describe(c, Along::Cols),
            describe(r, Along::Rows)
        )
    };
    let (gc, gr) = (
        gc.ok_or("no copy along cols")?,
        gr.ok_or("no copy along rows")?,
    );
    check_dir(ctx, &gc, x, dims, Along::Cols, c).map_err(pair)?;
    check_dir(ctx, &gr, x, dims, Along::Rows, r).map_err(pair)
}

/// Every configuration along both axes of one matrix; one report line.
fn nv_sweep(
    ctx: &CudaContext,
    rep: &mut Report,
    name: &str,
    x: &[f32],
    dims: (usize, usize),
    dtype: DType,
) {
    rep.check(name, || {
        let (xd, x) = device_input(ctx, x, dtype)?;
        let d = dtype_name(dtype);
        let mut cases = Cases::new(
            format!("configs x axes, one axis and both at once, {d} input: codes, scale bytes, t and BF16 operand bit-exact (or both refuse)"),
            format!("configs x axes differ ({d} input)"),
        );
        let configs = all_configs();
        for cfg in &configs {
            for along in [Along::Cols, Along::Rows] {
                cases.add(compare_nv(ctx, (&xd, dtype), &x, dims, along, cfg));
            }
        }
        // Both directions at once: every pair of configurations of one tiling.
        for c in &configs {
            for r in configs.iter().filter(|r| r.tile2d == c.tile2d) {
                cases.add(compare_pair(ctx, (&xd, dtype), &x, dims, (c, r)));
            }
        }
        cases.result()
    });
}

pub fn check_nvfp4_random(ctx: &CudaContext, rep: &mut Report) {
    // Lengths on both sides of 16 along either axis, tile rows cut short,
    // BF16 vector loads (len % 8 == 0) with a partial last block, a long row,
    // several 64x64 slabs each way (partial, with and without vector loads).
    let shapes: [(usize, usize); 14] = [
        (1, 1),
        (3, 17),
        (2, 15),
        (16, 16),
        (17, 40),
        (5, 33),
        (37, 100),
        (40, 96),
        (9, 72),
        (70, 8),
        (33, 64),
        (64, 993),
        (150, 131),
        (136, 200),
    ];
    for dtype in [DType::F32, DType::BF16] {
        for (i, &(rows, cols)) in shapes.iter().enumerate() {
            let (wide, special) = (i % 2 == 1, [0, 0, 0, 1, 0, 2][i % 6] * (i < 6) as u8);
            let x = nv_data(rows, cols, 7000 + i as u64, wide, special);
            let kind = match (wide, special) {
                (_, 1) => "with a NaN",
                (_, 2) => "with an Inf",
                (true, _) => "magnitudes 2^-140..2^100",
                _ => "N(0,1) rows, zeros, outliers",
            };
            let name = format!(
                "nvfp4 quantize {rows}x{cols} {} ({kind})",
                dtype_name(dtype)
            );
            nv_sweep(ctx, rep, &name, &x, (rows, cols), dtype);
        }
    }
}

/// A JSON field of hex strings, rows of them, flattened.
fn hex_rows(v: &Value) -> Vec<u32> {
    v.as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r.as_array().cloned().unwrap_or_default())
        .map(|h| hex(&h))
        .collect()
}

/// One golden vector: its input and configuration, and what the JSON says.
struct Golden {
    name: String,
    rows: usize,
    len: usize,
    x: Vec<f32>,
    cfg: Nvfp4Config,
    tensor_scale: u32,
    scales: Vec<u8>,
    packed: Vec<u8>,
}

fn parse_golden() -> Result<Vec<Golden>, String> {
    let g: Value = serde_json::from_str(GOLDEN).map_err(|e| format!("parse error: {e}"))?;
    let vectors = g["vectors"].as_array().cloned().unwrap_or_default();
    if vectors.len() != 17 {
        return Err(format!("expected 17 vectors, got {}", vectors.len()));
    }
    let bytes = |v: &Value| hex_rows(v).into_iter().map(|b| b as u8).collect();
    vectors
        .iter()
        .map(|v| {
            let num = |k: &str| v[k].as_u64().unwrap_or(0) as usize;
            let g = Golden {
                name: v["name"].as_str().unwrap_or("?").to_string(),
                rows: num("rows"),
                len: num("len"),
                x: hex_rows(&v["input_f32_bits"])
                    .into_iter()
                    .map(f32::from_bits)
                    .collect(),
                cfg: Nvfp4Config {
                    tile2d: v["tile2d"].as_bool().unwrap_or(false),
                    hadamard: v["hadamard"].as_bool().unwrap_or(false),
                    sr: None,
                },
                tensor_scale: hex(&v["tensor_scale_f32_bits"]),
                scales: bytes(&v["scale_bytes"]),
                packed: bytes(&v["packed_bytes"]),
            };
            if g.x.len() == g.rows * g.len {
                Ok(g)
            } else {
                Err(format!(
                    "{}: {} values for {}x{}",
                    g.name,
                    g.x.len(),
                    g.rows,
                    g.len
                ))
            }
        })
        .collect()
}

/// The vector's own configuration on the GPU against the JSON.
fn golden_vs_json(ctx: &CudaContext, v: &Golden) -> Result<(), String> {
    let xd = gpu(ctx.upload(&v.x))?;
    let out = Nvfp4Outputs {
        codes: true,
        deq: false,
    };
    let dims = (v.rows, v.len);
    let g = gpu(ctx.quantize_nvfp4((&xd, DType::F32), dims, Along::Cols, &v.cfg, out))?;
    let q = gpu(g.to_tensor(ctx, Along::Cols))?;
    let mut bad = Vec::new();
    if q.tensor_scale.to_bits() != v.tensor_scale {
        bad.push(format!(
            "t {:#010x} want {:#010x}",
            q.tensor_scale.to_bits(),
            v.tensor_scale
        ));
    }
    if q.scales != v.scales {
        bad.push("scale bytes differ".into());
    }
    if q.codes != v.packed {
        bad.push("packed bytes differ".into());
    }
    none_bad(bad, || v.name.clone())
}

/// The 17 golden vectors: each through every configuration and axis (GPU
/// vs CPU, f32 and BF16 input), and in its own configuration against the JSON.
pub fn check_nvfp4_golden(ctx: &CudaContext, rep: &mut Report) {
    let vectors = match parse_golden() {
        Ok(v) => v,
        Err(e) => return rep.line("nvfp4 golden", Err(e)),
    };
    for dtype in [DType::F32, DType::BF16] {
        let d = dtype_name(dtype);
        rep.check(&format!("nvfp4 golden vectors {d}, GPU vs CPU"), || {
            let mut cases = Cases::new(
                format!("vectors x configs x axes (one and both at once), {d} input: bytes, t and BF16 operand bit-exact (or both refuse)"),
                format!("cases differ ({d} input)"),
            );
            for v in &vectors {
                let (xd, x) = device_input(ctx, &v.x, dtype)?;
                let (configs, dims) = (all_configs(), (v.rows, v.len));
                for cfg in &configs {
                    for along in [Along::Cols, Along::Rows] {
                        let r = compare_nv(ctx, (&xd, dtype), &x, dims, along, cfg);
                        cases.add(r.map_err(|e| format!("{}: {e}", v.name)));
                    }
                }
                for c in &configs {
                    for r in configs.iter().filter(|r| r.tile2d == c.tile2d) {
                        let res = compare_pair(ctx, (&xd, dtype), &x, dims, (c, r));
                        cases.add(res.map_err(|e| format!("{}: {e}", v.name)));
                    }
                }
            }
            cases.result()
        });
    }
    rep.check("nvfp4 golden vectors vs JSON", || {
        let mut cases = Cases::new(
            "vectors: tensor scale, scale bytes and packed codes equal the JSON".into(),
            "vectors differ from the JSON".into(),
        );
        for v in &vectors {
            cases.add(golden_vs_json(ctx, v));
        }
        cases.result()
    });
}
