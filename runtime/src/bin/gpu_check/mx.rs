//! MX quantizers: every configuration (4 scale modes x E2M1/E4M3 x 32x32
//! tiles on/off x Hadamard on/off x stochastic rounding on/off) on seeded
//! random rows of awkward lengths and on the 13 golden blocks, with f32 and
//! BF16 input: codes, scales and the dequantized values (f32 and BF16, both
//! layouts) equal `mxswitch_runtime::quant` byte for byte; the plain
//! configurations also equal the golden JSON itself. The column sums (db)
//! that the MX pass over a dy takes are bit-exact in the kernel's order.

use serde_json::Value;

use mxswitch_runtime::backend::{Along, LinearBackend, Request, Want};
use mxswitch_runtime::cuda::{CudaContext, CudaDevice, DequantLayout, DevBuf, MxDevice};
use mxswitch_runtime::formats::{bf16, ElemFormat};
use mxswitch_runtime::quant::{quantize_rows, MxConfig, MxTensor, ScaleMode, SrKey};
use mxswitch_runtime::recipe::{Recipe, RecipeKind};
use mxswitch_runtime::DType;

use crate::common::{
    chunked_column_sums, device_input, dtype_name, err, first_diff, gpu, none_bad, same_f32,
    same_sums, Cases, Report, Rng,
};
use crate::linear::{upload, values};

const MXFP4_GOLDEN: &str = include_str!("../../../tests/golden/mxfp4_blocks.json");
const MXFP8_GOLDEN: &str = include_str!("../../../tests/golden/mxfp8_e4m3_blocks.json");

/// The stochastic-rounding key of every SR configuration (high seed bits set
/// so the key's upper word is exercised).
pub const SR_KEY: SrKey = SrKey {
    seed: 0x1234_5678_9abc_def0,
    step: 12_001,
    tensor_id: 42,
};

/// Rows of normal values whose magnitude varies by row (2^-30 .. 2^30, some
/// rows near 2^100 and some in the f32 subnormal range), so every scale
/// path runs. With `specials`, about 6% of the values are NaN, +-Inf, -0,
/// the smallest subnormal or f32::MAX.
pub fn mx_data(rows: usize, len: usize, seed: u64, specials: bool) -> Vec<f32> {
    let mut r = Rng::new(seed);
    let mut x = Vec::with_capacity(rows * len);
    for row in 0..rows {
        let e = (r.next_u64() % 60) as i32 - 30
            + match row % 7 {
                3 => 100,
                5 => -125,
                _ => 0,
            };
        let s = 2f64.powi(e);
        for _ in 0..len {
            let mut v = (r.normal() * s) as f32;
            if specials {
                v = match r.next_u64() % 97 {
                    0 => f32::NAN,
                    1 => f32::INFINITY,
                    2 => -0.0,
                    3 => f32::NEG_INFINITY,
                    4 => f32::from_bits(1),
                    5 => f32::MAX,
                    _ => v,
                };
            }
            x.push(v);
        }
    }
    x
}

fn all_mx_configs() -> Vec<MxConfig> {
    let mut v = Vec::new();
    for elem in [ElemFormat::E2M1, ElemFormat::E4M3FN] {
        for scale_mode in ScaleMode::ALL {
            for tile2d in [false, true] {
                for hadamard in [false, true] {
                    for sr in [None, Some(SR_KEY)] {
                        v.push(MxConfig {
                            elem,
                            scale_mode,
                            tile2d,
                            hadamard,
                            sr,
                        });
                    }
                }
            }
        }
    }
    v
}

pub fn describe(cfg: &MxConfig) -> String {
    format!(
        "{} {}{}{}{}",
        cfg.elem,
        cfg.scale_mode,
        if cfg.tile2d { " tile32x32" } else { "" },
        if cfg.hadamard { " hadamard" } else { "" },
        if cfg.sr.is_some() { " sr" } else { "" }
    )
}

/// GPU quantize + dequantize of one configuration, compared with the CPU.
/// `x` holds the values the CPU quantizes (for BF16 input, the widened BF16
/// values `xd` holds).
fn compare_mx(
    ctx: &CudaContext,
    xd: &DevBuf,
    dtype: DType,
    x: &[f32],
    rows: usize,
    len: usize,
    cfg: &MxConfig,
) -> Result<(), String> {
    let cpu = quantize_rows(x, rows, len, cfg).map_err(|e| format!("CPU quantizer: {e}"))?;
    let q = gpu(ctx.quantize_mx_rows_of(xd, dtype, rows, len, cfg))?;
    let codes: Vec<u8> = gpu(ctx.download(&q.codes, q.code_bytes()))?;
    let scales: Vec<u8> = gpu(ctx.download(&q.scales, q.nblocks()))?;
    let mut bad = Vec::new();
    if let Some(i) = first_diff(&scales, &cpu.scales) {
        let (row, blk) = (i / (cpu.padded_len / 32), i % (cpu.padded_len / 32));
        bad.push(format!(
            "scale byte {i} (row {row}, block {blk}): gpu {} cpu {}",
            scales.get(i).copied().unwrap_or(0),
            cpu.scales.get(i).copied().unwrap_or(0)
        ));
    }
    if let Some(i) = first_diff(&codes, &cpu.codes) {
        bad.push(format!(
            "code byte {i}: gpu {:#04x} cpu {:#04x}",
            codes.get(i).copied().unwrap_or(0),
            cpu.codes.get(i).copied().unwrap_or(0)
        ));
    }
    bad.extend(compare_dequant(ctx, &q, &cpu)?);
    none_bad(bad, || describe(cfg))
}

/// Dequantized values (rows layout in f32 and BF16, input layout in f32).
fn compare_dequant(ctx: &CudaContext, q: &MxDevice, cpu: &MxTensor) -> Result<Vec<String>, String> {
    let mut bad = Vec::new();
    let want_rows = cpu.dequantize_rows();
    for (layout, name, want) in [
        (DequantLayout::Rows, "dequantize_rows", &want_rows),
        (DequantLayout::Input, "dequantize", &cpu.dequantize()),
    ] {
        let d = gpu(ctx.dequantize_mx(q, layout, DType::F32))?;
        let got: Vec<f32> = gpu(ctx.download(&d, want.len()))?;
        if let Some(i) = (0..want.len()).find(|&i| !same_f32(got[i], want[i])) {
            bad.push(format!("{name}[{i}]: gpu {:e} cpu {:e}", got[i], want[i]));
        }
    }
    let got_bf: Vec<u16> = {
        let d = gpu(ctx.dequantize_mx(q, DequantLayout::Rows, DType::BF16))?;
        gpu(ctx.download(&d, want_rows.len()))?
    };
    if let Some(i) = (0..want_rows.len()).find(|&i| {
        let w = bf16::from_f32(want_rows[i]);
        got_bf[i] != w && !(bf16::to_f32(got_bf[i]).is_nan() && bf16::to_f32(w).is_nan())
    }) {
        bad.push(format!(
            "dequantize_rows bf16[{i}]: gpu {:#06x} cpu {:#06x}",
            got_bf[i],
            bf16::from_f32(want_rows[i])
        ));
    }
    Ok(bad)
}

/// Every configuration on one matrix, given as f32 or BF16; one report line.
#[allow(clippy::too_many_arguments)]
fn mx_sweep(
    ctx: &CudaContext,
    rep: &mut Report,
    name: &str,
    x: &[f32],
    rows: usize,
    len: usize,
    dtype: DType,
) {
    let configs = all_mx_configs();
    rep.check(name, || {
        let (xd, x) = device_input(ctx, x, dtype)?;
        let d = dtype_name(dtype);
        let mut cases = Cases::new(
            format!("configs, {d} input, codes + scales + dequantized (f32, bf16, input layout) bit-exact"),
            format!("configs differ ({d} input)"),
        );
        for cfg in &configs {
            cases.add(compare_mx(ctx, &xd, dtype, &x, rows, len, cfg));
        }
        cases.result()
    });
}

pub fn check_mx_random(ctx: &CudaContext, rep: &mut Report) {
    // (rows, len): lengths on both sides of 32, rows on both sides of the
    // 32-row tile, a long row, and three with NaN/Inf-laden data. With BF16 input
    // the 16-byte loads need len % 8 == 0, so 40, 72 and 96 take them with a
    // partial last block and the odd lengths take the element loads.
    let shapes: [(usize, usize); 12] = [
        (1, 1),
        (3, 31),
        (5, 33),
        (33, 64),
        (37, 100),
        (64, 993),
        (40, 96),
        (96, 1024),
        (7, 4133),
        (1, 40),
        (9, 72),
        (70, 8),
    ];
    let with_specials = |shape| matches!(shape, (37, 100) | (40, 96) | (9, 72));
    for dtype in [DType::F32, DType::BF16] {
        for (i, &(rows, len)) in shapes.iter().enumerate() {
            let specials = with_specials((rows, len));
            let x = mx_data(rows, len, 1000 + i as u64, specials);
            let name = format!(
                "mx quantize {rows}x{len} {}{}",
                dtype_name(dtype),
                if specials {
                    " (NaN/Inf/subnormal data)"
                } else {
                    ""
                }
            );
            mx_sweep(ctx, rep, &name, &x, rows, len, dtype);
        }
    }
}

pub fn hex(v: &Value) -> u32 {
    v.as_str()
        .and_then(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0)
}

pub fn check_mx_golden(ctx: &CudaContext, rep: &mut Report) {
    for (file, text, elem) in [
        ("mxfp4_blocks.json", MXFP4_GOLDEN, ElemFormat::E2M1),
        ("mxfp8_e4m3_blocks.json", MXFP8_GOLDEN, ElemFormat::E4M3FN),
    ] {
        let g: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                rep.line(&format!("golden {file}"), Err(format!("parse error: {e}")));
                continue;
            }
        };
        let blocks = g["blocks"].as_array().cloned().unwrap_or_default();
        let x: Vec<f32> = blocks
            .iter()
            .flat_map(|b| {
                b["input_f32_bits"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|v| f32::from_bits(hex(&v)))
            })
            .collect();
        let rows = blocks.len();
        if rows != 13 || x.len() != rows * 32 {
            rep.line(
                &format!("golden {file}"),
                Err(format!(
                    "expected 13 blocks of 32, got {rows} blocks / {} values",
                    x.len()
                )),
            );
            continue;
        }
        // (a) The 13 blocks as a [13, 32] matrix through every configuration.
        for dtype in [DType::F32, DType::BF16] {
            mx_sweep(
                ctx,
                rep,
                &format!("golden {file} blocks {}, GPU vs CPU", dtype_name(dtype)),
                &x,
                rows,
                32,
                dtype,
            );
        }
        // (b) The plain 1x32 configurations against the JSON itself.
        rep.check(&format!("golden {file} vs JSON"), || {
            let xd = gpu(ctx.upload(&x))?;
            let mut bad = Vec::new();
            for mode in ScaleMode::ALL {
                let cfg = MxConfig {
                    elem,
                    scale_mode: mode,
                    tile2d: false,
                    hadamard: false,
                    sr: None,
                };
                let q = gpu(ctx.quantize_mx_rows_of(&xd, DType::F32, rows, 32, &cfg))?;
                let codes: Vec<u8> = gpu(ctx.download(&q.codes, q.code_bytes()))?;
                let scales: Vec<u8> = gpu(ctx.download(&q.scales, rows))?;
                for (bi, b) in blocks.iter().enumerate() {
                    let want = &b[mode.name()];
                    let ws = want["scale_e8m0"].as_u64().unwrap_or(999) as u8;
                    if scales[bi] != ws {
                        bad.push(format!(
                            "{} {mode}: scale {} want {ws}",
                            b["name"], scales[bi]
                        ));
                    }
                    let want_codes: Vec<u8> = match want["codes"].as_array() {
                        Some(c) => c
                            .iter()
                            .map(|v| if v.is_null() { 0 } else { hex(v) as u8 })
                            .collect(),
                        None => vec![0; 32],
                    };
                    let got: Vec<u8> = if elem == ElemFormat::E2M1 {
                        codes[bi * 16..bi * 16 + 16]
                            .iter()
                            .flat_map(|c| [c & 0xF, c >> 4])
                            .collect()
                    } else {
                        codes[bi * 32..bi * 32 + 32].to_vec()
                    };
                    if got != want_codes {
                        bad.push(format!("{} {mode}: codes differ", b["name"]));
                    }
                }
            }
            if bad.is_empty() {
                Ok(
                    "13 blocks x 4 scale modes: scale bytes and codes equal the golden vectors"
                        .into(),
                )
            } else {
                Err(bad.join("; "))
            }
        });
    }
}

/// db on dy's MX read: for the `mxfp4` and `mxfp8` recipes' dy (dgrad along
/// N, wgrad along M with its Hadamard and SR), the column sums that `mx_tile`
/// takes equal, bit for bit, f32 sums in its order: per 32-row chunk the
/// column's rows in order, then the chunks in order (`lin_colsum_final`).
pub fn check_mx_column_sums(rep: &mut Report) {
    let shapes: [(usize, usize); 6] = [(1, 1), (31, 5), (33, 70), (64, 96), (130, 300), (257, 129)];
    for kind in [RecipeKind::Mxfp4, RecipeKind::Mxfp8] {
        for dtype in [DType::F32, DType::BF16] {
            let name = format!("mx column sums {kind:?} {}", dtype_name(dtype));
            rep.check(&name, || {
                let dev = CudaDevice::get(0).map_err(err)?;
                let mut cases = Cases::new(
                    "shapes, column sums bit-exact in mx_tile's order".into(),
                    "shapes differ".into(),
                );
                for (i, &(rows, cols)) in shapes.iter().enumerate() {
                    let x = mx_data(rows, cols, 3000 + i as u64, false);
                    cases.add(compare_column_sums(&dev, &x, (rows, cols), dtype, kind));
                }
                cases.result()
            });
        }
    }
}

fn compare_column_sums(
    dev: &CudaDevice,
    x: &[f32],
    (rows, cols): (usize, usize),
    dtype: DType,
    kind: RecipeKind,
) -> Result<(), String> {
    let xs = upload(dev, x, dtype)?;
    let x = values(&xs)?;
    let spec = Recipe::new(kind).spec();
    let key = |tensor_id| SrKey {
        tensor_id,
        ..SR_KEY
    };
    let now = [
        Want::new(&spec.dgrad.a, Along::Cols, Some(key(2))).map_err(err)?,
        Want::new(&spec.wgrad.a, Along::Rows, Some(key(3))).map_err(err)?,
    ];
    let req = Request {
        rows,
        cols,
        now: &now,
        keep: None,
        column_sums: true,
        label: &|| "dy".into(),
    };
    let q = xs.quantize(&req).map_err(err)?;
    let sums = q.column_sums.ok_or("no column sums")?;
    let want = chunked_column_sums(&x, (rows, cols), (32, (1, 32)), |_, i| i);
    same_sums(&values(&sums)?, &want).map_err(|e| format!("{rows}x{cols}: {e}"))
}
