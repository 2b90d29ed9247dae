//! `cuda_check`: the CUDA backend against the CPU reference.
//!
//! 1. MX quantizers: every configuration (4 scale modes x E2M1/E4M3 x 32x32
//!    tiles on/off x Hadamard on/off x stochastic rounding on/off) on seeded
//!    random rows of awkward lengths (1, 31, 33, 993, ...) and on the 13 golden
//!    blocks, with f32 and with BF16 input (the CPU quantizes the widened BF16
//!    values); codes, scales and the dequantized values (f32 and BF16, both
//!    layouts) must equal `mxswitch_runtime::quant` byte for byte. The plain
//!    configurations are also checked against the golden JSON directly.
//! 2. FP8 tensorwise (E4M3FN, E5M2 and the FNUZ pair, with and without pow2
//!    scales, f32 and BF16 input): amax, scale and scale_inv bits, codes and
//!    dequantized values; the golden amax -> scale table; NaN/Inf tensors
//!    must be an error. The 2-D cast: codes and transposed codes, zero
//!    padding included, for every format, both input types, pad_to 1 and 16.
//! 3. cuBLASLt GEMMs (BF16, FP8 with per-tensor scales, and the Hopper MXFP4 /
//!    MXFP8 path: dequantize to BF16 + BF16 GEMM) against an f64 reference of
//!    the dequantized operands, with the tolerance printed on each line, and
//!    their speed in TFLOP/s.
//! 4. Quantizer speed at 8192x8192: the `quantizer speed:` line, and one
//!    `BENCH quantize <name> elems= ms= gbps= copy_ratio=` line per quantizer
//!    beside a device-to-device copy of the BF16 tensor (see
//!    `bench_quantizers`), whose outputs are then checked against the CPU.
//!
//! Prints one line per check and exits 1 on any mismatch, 2 when there is no
//! usable GPU (one line saying what was looked for and where).

// Each check body is an immediately called closure so that `?` ends only that
// check and the run goes on to the next one.
#![allow(clippy::redundant_closure_call)]

use std::process::ExitCode;
use std::time::Instant;

use rayon::prelude::*;
use serde_json::Value;

use mxswitch_runtime::cuda::quantize::{Fp8Device2d, Fp8Outputs};
use mxswitch_runtime::cuda::{
    CudaContext, CudaError, DequantLayout, DevBuf, Fp8Device, GemmDType, GemmOperand, MxDevice,
};
use mxswitch_runtime::formats::{bf16, e8m0, ElemFormat};
use mxswitch_runtime::quant::{
    amax, amax_to_scale, quantize_rows, quantize_tensorwise, MxConfig, MxTensor, ScaleMode, SrKey,
};
use mxswitch_runtime::DType;

const MXFP4_GOLDEN: &str = include_str!("../../tests/golden/mxfp4_blocks.json");
const MXFP8_GOLDEN: &str = include_str!("../../tests/golden/mxfp8_e4m3_blocks.json");
const FP8_SCALES_GOLDEN: &str = include_str!("../../tests/golden/fp8_tensorwise_scales.json");

/// The stochastic-rounding key of every SR configuration (high seed bits set
/// so the key's upper word is exercised).
const SR_KEY: SrKey = SrKey {
    seed: 0x1234_5678_9abc_def0,
    step: 12_001,
    tensor_id: 42,
};

type CheckResult = std::result::Result<String, String>;

/// Tally of PASS/FAIL lines.
#[derive(Default)]
struct Report {
    passed: usize,
    failed: usize,
}

impl Report {
    fn line(&mut self, name: &str, r: CheckResult) {
        match r {
            Ok(msg) => {
                self.passed += 1;
                println!("PASS {name}: {msg}");
            }
            Err(msg) => {
                self.failed += 1;
                println!("FAIL {name}: {msg}");
            }
        }
    }
}

fn gpu<T>(r: Result<T, CudaError>) -> Result<T, String> {
    r.map_err(|e| format!("GPU error: {e}"))
}

fn main() -> ExitCode {
    let t0 = Instant::now();
    let ctx = match CudaContext::new(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cuda_check: {e}");
            return ExitCode::from(2);
        }
    };
    println!("device: {}", ctx.info());
    let mut rep = Report::default();
    check_mx_random(&ctx, &mut rep);
    check_mx_golden(&ctx, &mut rep);
    check_fp8(&ctx, &mut rep);
    check_fp8_2d(&ctx, &mut rep);
    check_gemms(&ctx, &mut rep);
    time_quantizers(&ctx, &mut rep);
    bench_quantizers(&ctx, &mut rep);
    let st = ctx.pool_stats();
    println!(
        "pool: {} cuMemAlloc, {} reuses, {:.1} MiB in use, {:.1} MiB cached; NVRTC compilations: {}",
        st.device_allocs,
        st.reuses,
        st.bytes_in_use as f64 / 1048576.0,
        st.bytes_cached as f64 / 1048576.0,
        mxswitch_runtime::cuda::nvrtc::compile_count()
    );
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

// ---------------------------------------------------------------------------
// Data

/// SplitMix64: small, seedable, good enough for test data.
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

    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let u = self.unit().max(1e-300);
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * self.unit()).cos()
    }
}

/// Rows of normal values whose magnitude varies by row (2^-30 .. 2^30, some
/// rows near 2^100 and some in the f32 subnormal range), so every scale
/// path runs. With `specials`, about 6% of the values are NaN, +-Inf, -0,
/// the smallest subnormal or f32::MAX.
fn mx_data(rows: usize, len: usize, seed: u64, specials: bool) -> Vec<f32> {
    let mut r = Rng(seed);
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

/// `n` normal values times `scale`, generated in parallel (seeded per chunk).
fn normal_data(n: usize, seed: u64, scale: f64) -> Vec<f32> {
    const CHUNK: usize = 1 << 16;
    let mut x = vec![0.0f32; n];
    x.par_chunks_mut(CHUNK).enumerate().for_each(|(c, out)| {
        let mut r = Rng(seed ^ (c as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
        for v in out {
            *v = (r.normal() * scale) as f32;
        }
    });
    x
}

/// The input as the device sees it (f32 values, or their BF16 rounding as
/// raw bits) and the f32 values the CPU reference quantizes (for BF16 the
/// widened BF16 values, which the GPU kernels widen to exactly).
fn device_input(ctx: &CudaContext, x: &[f32], dtype: DType) -> Result<(DevBuf, Vec<f32>), String> {
    match dtype {
        DType::BF16 => {
            let bits: Vec<u16> = x.par_iter().map(|&v| bf16::from_f32(v)).collect();
            let wide = bits.par_iter().map(|&h| bf16::to_f32(h)).collect();
            Ok((gpu(ctx.upload(&bits))?, wide))
        }
        _ => Ok((gpu(ctx.upload(x))?, x.to_vec())),
    }
}

fn dtype_name(dtype: DType) -> &'static str {
    if dtype == DType::BF16 {
        "bf16"
    } else {
        "f32"
    }
}

/// Same f32, every NaN equal to every NaN (payloads are not specified).
fn same_f32(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

fn first_diff<T: PartialEq>(a: &[T], b: &[T]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

// ---------------------------------------------------------------------------
// MX quantizers

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

fn describe(cfg: &MxConfig) -> String {
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
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("{}: {}", describe(cfg), bad.join("; ")))
    }
}

/// Dequantized values (rows layout in f32 and BF16, input layout in f32).
fn compare_dequant(ctx: &CudaContext, q: &MxDevice, cpu: &MxTensor) -> Result<Vec<String>, String> {
    let mut bad = Vec::new();
    let want_rows = cpu.dequantize_rows();
    let got: Vec<f32> = {
        let d = gpu(ctx.dequantize_mx(q, DequantLayout::Rows, DType::F32))?;
        gpu(ctx.download(&d, want_rows.len()))?
    };
    if let Some(i) = (0..want_rows.len()).find(|&i| !same_f32(got[i], want_rows[i])) {
        bad.push(format!(
            "dequantize_rows[{i}]: gpu {:e} cpu {:e}",
            got[i], want_rows[i]
        ));
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
    let want_in = cpu.dequantize();
    let got_in: Vec<f32> = {
        let d = gpu(ctx.dequantize_mx(q, DequantLayout::Input, DType::F32))?;
        gpu(ctx.download(&d, want_in.len()))?
    };
    if let Some(i) = (0..want_in.len()).find(|&i| !same_f32(got_in[i], want_in[i])) {
        bad.push(format!(
            "dequantize[{i}]: gpu {:e} cpu {:e}",
            got_in[i], want_in[i]
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
    let r = (|| -> CheckResult {
        let (xd, x) = device_input(ctx, x, dtype)?;
        let mut fails = Vec::new();
        for cfg in &configs {
            if let Err(e) = compare_mx(ctx, &xd, dtype, &x, rows, len, cfg) {
                fails.push(e);
            }
        }
        if fails.is_empty() {
            Ok(format!(
                "{} configs, {} input, codes + scales + dequantized (f32, bf16, input layout) bit-exact",
                configs.len(),
                dtype_name(dtype)
            ))
        } else {
            let n = fails.len();
            fails.truncate(4);
            Err(format!(
                "{n} of {} configs differ ({} input); first: {}",
                configs.len(),
                dtype_name(dtype),
                fails.join(" | ")
            ))
        }
    })();
    rep.line(name, r);
}

fn check_mx_random(ctx: &CudaContext, rep: &mut Report) {
    // (rows, len, specials): lengths on both sides of 32, rows on both sides
    // of the 32-row tile, a long row, and NaN/Inf-laden data. With BF16 input
    // the 16-byte loads need len % 8 == 0, so 40, 72 and 96 take them with a
    // partial last block and the odd lengths take the element loads.
    let shapes: [(usize, usize, bool); 12] = [
        (1, 1, false),
        (3, 31, false),
        (5, 33, false),
        (33, 64, false),
        (37, 100, true),
        (64, 993, false),
        (40, 96, true),
        (96, 1024, false),
        (7, 4133, false),
        (1, 40, false),
        (9, 72, true),
        (70, 8, false),
    ];
    for dtype in [DType::F32, DType::BF16] {
        for (i, &(rows, len, specials)) in shapes.iter().enumerate() {
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

fn hex(v: &Value) -> u32 {
    v.as_str()
        .and_then(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0)
}

fn check_mx_golden(ctx: &CudaContext, rep: &mut Report) {
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
        let r = (|| -> CheckResult {
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
                let q = gpu(ctx.quantize_mx_rows(&xd, rows, 32, &cfg))?;
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
        })();
        rep.line(&format!("golden {file} vs JSON"), r);
    }
}

// ---------------------------------------------------------------------------
// FP8 tensorwise

const FP8_FORMATS: [ElemFormat; 4] = [
    ElemFormat::E4M3FN,
    ElemFormat::E5M2,
    ElemFormat::E4M3FNUZ,
    ElemFormat::E5M2FNUZ,
];

fn compare_fp8(
    ctx: &CudaContext,
    x: &[f32],
    dtype: DType,
    elem: ElemFormat,
    pow2: bool,
) -> Result<(), String> {
    let (xd, x) = device_input(ctx, x, dtype)?;
    let x = &x[..];
    let q = gpu(ctx.quantize_fp8_of(&xd, dtype, x.len(), elem, pow2))?;
    let cpu =
        quantize_tensorwise(x, &[x.len()], elem, pow2, "x").map_err(|e| format!("CPU: {e}"))?;
    gpu(q.check_finite(ctx, "x"))?;
    let (amax_g, scale, scale_inv) = gpu(q.read_scales(ctx))?;
    let mut bad = Vec::new();
    if amax_g.to_bits() != amax(x).to_bits() {
        bad.push(format!("amax {amax_g:e} vs {:e}", amax(x)));
    }
    if scale.to_bits() != cpu.scale.to_bits() {
        bad.push(format!("scale {scale:e} vs {:e}", cpu.scale));
    }
    if scale_inv.to_bits() != cpu.scale_inv.to_bits() {
        bad.push(format!("scale_inv {scale_inv:e} vs {:e}", cpu.scale_inv));
    }
    let codes: Vec<u8> = gpu(ctx.download(&q.codes, x.len()))?;
    if let Some(i) = first_diff(&codes, &cpu.codes) {
        bad.push(format!(
            "code {i} (x = {:e}): gpu {:#04x} cpu {:#04x}",
            x[i], codes[i], cpu.codes[i]
        ));
    }
    let want = cpu.dequantize();
    let got: Vec<f32> = {
        let d = gpu(ctx.dequantize_fp8(&q, DType::F32))?;
        gpu(ctx.download(&d, x.len()))?
    };
    if let Some(i) = (0..x.len()).find(|&i| !same_f32(got[i], want[i])) {
        bad.push(format!(
            "dequantized {i}: gpu {:e} cpu {:e}",
            got[i], want[i]
        ));
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{elem} {} pow2={pow2} n={}: {}",
            dtype_name(dtype),
            x.len(),
            bad.join("; ")
        ))
    }
}

fn check_fp8(ctx: &CudaContext, rep: &mut Report) {
    // Sizes around the 8-element vectors, the 16-element cast groups and the
    // amax grid (one CTA per 256 vectors, at most 8 per SM).
    let sizes = [
        0usize,
        1,
        7,
        15,
        17,
        31,
        33,
        993,
        65_537,
        (1 << 20) + 9,
        (1 << 23) + 3,
    ];
    let r = (|| -> CheckResult {
        let mut fails = Vec::new();
        let mut n_cases = 0;
        for (si, &n) in sizes.iter().enumerate() {
            // Two data sets: plain normals, and normals over a wide exponent range.
            let plain = normal_data(n, 77 + si as u64, 3.0);
            let wide = mx_data(1, n, 99 + si as u64, false);
            for x in [&plain, &wide] {
                for dtype in [DType::F32, DType::BF16] {
                    for elem in FP8_FORMATS {
                        for pow2 in [false, true] {
                            n_cases += 1;
                            if let Err(e) = compare_fp8(ctx, x, dtype, elem, pow2) {
                                fails.push(e);
                            }
                        }
                    }
                }
            }
        }
        if fails.is_empty() {
            Ok(format!(
                "{n_cases} cases (f32/bf16 input x 4 formats x pow2 on/off x sizes {sizes:?}): amax, scale, scale_inv, codes, dequantized bit-exact"
            ))
        } else {
            let n = fails.len();
            fails.truncate(4);
            Err(format!(
                "{n} of {n_cases} differ; first: {}",
                fails.join(" | ")
            ))
        }
    })();
    rep.line("fp8 tensorwise quantize", r);

    // The golden amax -> scale table (torchao's amax_to_scale).
    let r = (|| -> CheckResult {
        let g: Value =
            serde_json::from_str(FP8_SCALES_GOLDEN).map_err(|e| format!("parse: {e}"))?;
        let rows = g["scales"].as_array().cloned().unwrap_or_default();
        let mut bad = Vec::new();
        let mut n = 0;
        for row in &rows {
            let a = f32::from_bits(hex(&row["amax_f32_bits"]));
            let xd = gpu(ctx.upload(&[a, -a * 0.5]))?;
            for (name, elem) in [("e4m3fn", ElemFormat::E4M3FN), ("e5m2", ElemFormat::E5M2)] {
                for (col, pow2) in [("torchao", false), ("torchao_pow2", true)] {
                    let q = gpu(ctx.quantize_fp8_tensorwise(&xd, 2, elem, pow2))?;
                    let (_, s, _) = gpu(q.read_scales(ctx))?;
                    let want = f32::from_bits(hex(&row[name][col]["scale_f32_bits"]));
                    let cpu = amax_to_scale(a, elem, pow2);
                    n += 1;
                    if !same_f32(s, want) || !same_f32(s, cpu) {
                        bad.push(format!(
                            "{name} {col} amax {a:e}: gpu {s:e} golden {want:e} cpu {cpu:e}"
                        ));
                    }
                }
            }
        }
        if bad.is_empty() {
            Ok(format!("{n} scales equal the golden torchao column"))
        } else {
            Err(bad.join("; "))
        }
    })();
    rep.line("fp8 golden amax->scale", r);

    // A non-finite amax is an error on both backends (SPEC section 3).
    let r = (|| -> CheckResult {
        let mut msgs = Vec::new();
        for bad_value in [f32::NAN, f32::INFINITY] {
            let mut x = normal_data(1000, 5, 1.0);
            x[517] = bad_value;
            let xd = gpu(ctx.upload(&x))?;
            let q = gpu(ctx.quantize_fp8_tensorwise(&xd, x.len(), ElemFormat::E4M3FN, false))?;
            let g = q.check_finite(ctx, "layer0.x");
            let c = quantize_tensorwise(&x, &[1000], ElemFormat::E4M3FN, false, "layer0.x");
            match (g, c) {
                (Err(ge), Err(_)) => msgs.push(format!("{bad_value}: \"{ge}\"")),
                (g, c) => {
                    return Err(format!(
                        "{bad_value}: gpu error {} cpu error {}",
                        g.is_err(),
                        c.is_err()
                    ))
                }
            }
        }
        Ok(format!("both backends refuse: {}", msgs.join(", ")))
    })();
    rep.line("fp8 non-finite amax", r);
}

/// The codes a 2-D cast must write: the CPU's codes of the `[rows, cols]`
/// matrix zero-padded to `[rows_pad, cols_pad]`, and their transpose.
fn padded_codes(
    codes: &[u8],
    rows: usize,
    cols: usize,
    rows_pad: usize,
    cols_pad: usize,
) -> (Vec<u8>, Vec<u8>) {
    let mut out = vec![0u8; rows_pad * cols_pad];
    let mut out_t = vec![0u8; rows_pad * cols_pad];
    for r in 0..rows {
        for c in 0..cols {
            out[r * cols_pad + c] = codes[r * cols + c];
            out_t[c * rows_pad + r] = codes[r * cols + c];
        }
    }
    (out, out_t)
}

/// Where two code buffers first differ, as "name[row, col]: gpu .. want ..".
fn diff_2d(name: &str, got: &[u8], want: &[u8], width: usize) -> Option<String> {
    first_diff(got, want).map(|i| {
        format!(
            "{name}[{}, {}]: gpu {:#04x} want {:#04x}",
            i / width.max(1),
            i % width.max(1),
            got.get(i).copied().unwrap_or(0),
            want.get(i).copied().unwrap_or(0)
        )
    })
}

/// One 2-D cast against the CPU: scale state, codes and transposed codes
/// (padding included), for the orientations `outputs` asks for.
#[allow(clippy::too_many_arguments)]
fn compare_fp8_2d(
    ctx: &CudaContext,
    x: &[f32],
    rows: usize,
    cols: usize,
    dtype: DType,
    elem: ElemFormat,
    pad_to: usize,
    outputs: Fp8Outputs,
) -> Result<(), String> {
    let (xd, x) = device_input(ctx, x, dtype)?;
    let q: Fp8Device2d =
        gpu(ctx.quantize_fp8_2d(&xd, dtype, rows, cols, elem, false, pad_to, outputs))?;
    let cpu = quantize_tensorwise(&x, &[rows, cols], elem, false, "x")
        .map_err(|e| format!("CPU: {e}"))?;
    let (rp, cp) = (rows.next_multiple_of(pad_to), cols.next_multiple_of(pad_to));
    let mut bad = Vec::new();
    if (q.rows_pad, q.cols_pad) != (rp, cp) {
        bad.push(format!("padded shape {}x{}", q.rows_pad, q.cols_pad));
    }
    let (amax_g, scale, scale_inv) = gpu(q.read_scales(ctx))?;
    if amax_g.to_bits() != amax(&x).to_bits()
        || scale.to_bits() != cpu.scale.to_bits()
        || scale_inv.to_bits() != cpu.scale_inv.to_bits()
    {
        bad.push(format!(
            "scales (amax, scale, scale_inv) gpu ({amax_g:e}, {scale:e}, {scale_inv:e}) cpu ({:e}, {:e}, {:e})",
            amax(&x),
            cpu.scale,
            cpu.scale_inv
        ));
    }
    let (want, want_t) = padded_codes(&cpu.codes, rows, cols, rp, cp);
    match (&q.codes, outputs.rows) {
        (Some(b), true) => {
            let got: Vec<u8> = gpu(ctx.download(b, rp * cp))?;
            bad.extend(diff_2d("codes", &got, &want, cp));
        }
        (None, false) => {}
        _ => bad.push("codes present unasked or missing".into()),
    }
    match (&q.codes_t, outputs.cols) {
        (Some(b), true) => {
            let got: Vec<u8> = gpu(ctx.download(b, rp * cp))?;
            bad.extend(diff_2d("codes_t", &got, &want_t, rp));
        }
        (None, false) => {}
        _ => bad.push("codes_t present unasked or missing".into()),
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{elem} {} {rows}x{cols} pad_to {pad_to}: {}",
            dtype_name(dtype),
            bad.join("; ")
        ))
    }
}

fn check_fp8_2d(ctx: &CudaContext, rep: &mut Report) {
    // Shapes: single rows and columns, tails of the 16-column groups and of
    // the 64x64 tiles, rows of a length that is a multiple of 8 but not 16
    // (vector loads with a partial group), and odd lengths (element loads).
    let shapes: [(usize, usize); 11] = [
        (1, 1),
        (1, 37),
        (5, 3),
        (17, 33),
        (64, 64),
        (65, 130),
        (100, 24),
        (3, 200),
        (130, 67),
        (128, 256),
        (257, 96),
    ];
    let both = Fp8Outputs {
        rows: true,
        cols: true,
    };
    let r = (|| -> CheckResult {
        let mut fails = Vec::new();
        let mut n_cases = 0;
        for (si, &(rows, cols)) in shapes.iter().enumerate() {
            // Tensorwise FP8 needs a finite amax (the non-finite case is its
            // own check below); mx_data's widest rows overflow f32 or, rounded to BF16, become Inf.
            let wide: Vec<f32> = mx_data(rows, cols, 300 + si as u64, false)
                .into_iter()
                .map(|v| if v.abs() < 2f32.powi(127) { v } else { 0.0 })
                .collect();
            for dtype in [DType::F32, DType::BF16] {
                for elem in FP8_FORMATS {
                    for pad_to in [1usize, 16] {
                        n_cases += 1;
                        if let Err(e) =
                            compare_fp8_2d(ctx, &wide, rows, cols, dtype, elem, pad_to, both)
                        {
                            fails.push(e);
                        }
                    }
                }
                // One orientation at a time.
                for outputs in [
                    Fp8Outputs {
                        rows: true,
                        cols: false,
                    },
                    Fp8Outputs {
                        rows: false,
                        cols: true,
                    },
                ] {
                    n_cases += 1;
                    let e4 = ElemFormat::E4M3FN;
                    if let Err(e) = compare_fp8_2d(ctx, &wide, rows, cols, dtype, e4, 16, outputs) {
                        fails.push(e);
                    }
                }
            }
        }
        if fails.is_empty() {
            Ok(format!(
                "{n_cases} cases (f32/bf16 x 4 formats x pad_to 1/16, and each orientation alone; shapes {shapes:?}): scales, codes and transposed codes with zero padding bit-exact"
            ))
        } else {
            let n = fails.len();
            fails.truncate(4);
            Err(format!(
                "{n} of {n_cases} differ; first: {}",
                fails.join(" | ")
            ))
        }
    })();
    rep.line("fp8 2-D cast (codes + transposed codes)", r);

    // A NaN in the matrix: the padding stays the zero code and the amax is
    // an error, as for the 1-D quantizer.
    let r = (|| -> CheckResult {
        let (rows, cols) = (5usize, 13usize);
        let mut x = normal_data(rows * cols, 9, 1.0);
        x[17] = f32::NAN;
        let xd = gpu(ctx.upload(&x))?;
        let q = gpu(ctx.quantize_fp8_2d(
            &xd,
            DType::F32,
            rows,
            cols,
            ElemFormat::E4M3FN,
            false,
            16,
            both,
        ))?;
        let (rp, cp) = (q.rows_pad, q.cols_pad);
        let pad_nonzero = |b: &Option<DevBuf>, width: usize, real_r: usize, real_c: usize| {
            let v: Vec<u8> = b
                .as_ref()
                .map(|b| gpu(ctx.download(b, rp * cp)))
                .transpose()?
                .unwrap_or_default();
            Ok::<usize, String>(
                v.iter()
                    .enumerate()
                    .filter(|&(i, &c)| (i / width >= real_r || i % width >= real_c) && c != 0)
                    .count(),
            )
        };
        let n1 = pad_nonzero(&q.codes, cp, rows, cols)?;
        let n2 = pad_nonzero(&q.codes_t, rp, cols, rows)?;
        let err = q.check_finite(ctx, "layer0.x");
        if n1 + n2 > 0 || err.is_ok() {
            return Err(format!(
                "{n1} + {n2} non-zero padding codes, check_finite error: {}",
                err.is_err()
            ));
        }
        Ok(format!(
            "padding stays zero, amax is an error: \"{}\"",
            err.err().map(|e| e.to_string()).unwrap_or_default()
        ))
    })();
    rep.line("fp8 2-D cast non-finite amax", r);
}

// ---------------------------------------------------------------------------
// GEMMs

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
            let ab: Vec<u16> = a.par_iter().map(|&v| bf16::from_f32(v)).collect();
            let bb: Vec<u16> = b.par_iter().map(|&v| bf16::from_f32(v)).collect();
            Ok(Prepared {
                a: Held::Plain(gpu(ctx.upload(&ab))?),
                b: Held::Plain(gpu(ctx.upload(&bb))?),
                a_dtype: GemmDType::Bf16,
                b_dtype: GemmDType::Bf16,
                a_vals: ab.par_iter().map(|&h| bf16::to_f32(h)).collect(),
                b_vals: bb.par_iter().map(|&h| bf16::to_f32(h)).collect(),
                k,
            })
        }
        GemmKind::Fp8 { a: ea, b: eb } => {
            let (ad, bd) = (gpu(ctx.upload(a))?, gpu(ctx.upload(b))?);
            let qa = gpu(ctx.quantize_fp8_tensorwise(&ad, m * k, *ea, false))?;
            let qb = gpu(ctx.quantize_fp8_tensorwise(&bd, n * k, *eb, false))?;
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
            let qa = gpu(ctx.quantize_mx_rows(&ad, m, k, ca))?;
            let qb = gpu(ctx.quantize_mx_rows(&bd, n, k, cb))?;
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
                a_vals: ha.par_iter().map(|&h| bf16::to_f32(h)).collect(),
                b_vals: hb.par_iter().map(|&h| bf16::to_f32(h)).collect(),
                k: kp,
            })
        }
    }
}

/// f64 dot products and sums of |products| of the requested (i, j) entries.
fn reference(a: &[f32], b: &[f32], k: usize, entries: &[(usize, usize)]) -> Vec<(f64, f64)> {
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

fn gemm_entries(m: usize, n: usize, full: bool) -> Vec<(usize, usize)> {
    if full {
        (0..m).flat_map(|i| (0..n).map(move |j| (i, j))).collect()
    } else {
        let mut r = Rng(m as u64 * 31 + n as u64);
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
    let r = (|| -> CheckResult {
        let a = normal_data(m * k, (m * 7 + k) as u64, 3.0);
        let b = normal_data(n * k, (n * 13 + k) as u64, 0.02);
        let p = prepare(ctx, &kind, &a, &b, m, n, k)?;
        let (opa, opb) = (p.a.operand(p.a_dtype), p.b.operand(p.b_dtype));
        let y = gpu(ctx.gemm_nt(&opa, &opb, m, n, p.k, out))?;
        let full = m * n * p.k <= 1 << 28;
        let entries = gemm_entries(m, n, full);
        let got: Vec<f64> = match out {
            GemmDType::F32 => gpu(ctx.download::<f32>(&y, m * n))?
                .into_iter()
                .map(f64::from)
                .collect(),
            _ => gpu(ctx.download::<u16>(&y, m * n))?
                .into_iter()
                .map(|h| bf16::to_f32(h) as f64)
                .collect(),
        };
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
            let iters = 20;
            for _ in 0..3 {
                gpu(ctx.gemm_nt_into(&opa, &opb, m, n, p.k, &y, out))?;
            }
            let t = gpu(ctx.timer())?;
            for _ in 0..iters {
                gpu(ctx.gemm_nt_into(&opa, &opb, m, n, p.k, &y, out))?;
            }
            let ms = gpu(t.stop_ms())? as f64 / iters as f64;
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
    })();
    rep.line(&name, r);
}

fn check_gemms(ctx: &CudaContext, rep: &mut Report) {
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

// ---------------------------------------------------------------------------
// Quantizer speed

fn time_quantizers(ctx: &CudaContext, rep: &mut Report) {
    let (rows, len) = (8192usize, 8192usize);
    let r = (|| -> CheckResult {
        let x = normal_data(rows * len, 4242, 1.0);
        let xd = gpu(ctx.upload(&x))?;
        let mut lines = Vec::new();
        let iters = 10;
        let mut run =
            |name: &str, bytes: f64, f: &dyn Fn() -> Result<(), String>| -> Result<(), String> {
                f()?;
                let t = gpu(ctx.timer())?;
                for _ in 0..iters {
                    f()?;
                }
                let ms = gpu(t.stop_ms())? as f64 / iters as f64;
                lines.push(format!(
                    "{name} {ms:.3} ms ({:.0} GB/s)",
                    bytes / (ms * 1e-3) / 1e9
                ));
                Ok(())
            };
        let n = (rows * len) as f64;
        for (name, cfg) in [
            ("mxfp4", MxConfig::mxfp4()),
            (
                "mxfp4+tiles",
                MxConfig {
                    tile2d: true,
                    ..MxConfig::mxfp4()
                },
            ),
            (
                "mxfp4+hadamard+sr",
                MxConfig {
                    hadamard: true,
                    sr: Some(SR_KEY),
                    ..MxConfig::mxfp4()
                },
            ),
            ("mxfp8", MxConfig::mxfp8()),
        ] {
            let out_bytes = n * cfg.bytes_per_element();
            run(name, n * 4.0 + out_bytes, &|| {
                gpu(ctx.quantize_mx_rows(&xd, rows, len, &cfg)).map(|_| ())
            })?;
        }
        let q = gpu(ctx.quantize_mx_rows(&xd, rows, len, &MxConfig::mxfp4()))?;
        run("dequant mxfp4->bf16", n * (0.5 + 1.0 / 32.0 + 2.0), &|| {
            gpu(ctx.dequantize_mx(&q, DequantLayout::Rows, DType::BF16)).map(|_| ())
        })?;
        run("fp8 e4m3 tensorwise", n * (4.0 + 4.0 + 1.0), &|| {
            gpu(ctx.quantize_fp8_tensorwise(&xd, rows * len, ElemFormat::E4M3FN, false)).map(|_| ())
        })?;
        // The one-off dequantized values must stay exact: spot-check a block.
        let cpu =
            quantize_rows(&x[..len], 1, len, &MxConfig::mxfp4()).map_err(|e| e.to_string())?;
        let first: Vec<u8> = gpu(ctx.download(&q.scales, 1))?;
        if first[0] != cpu.scales[0] || e8m0::decode(first[0]).is_nan() {
            return Err("first scale byte differs from the CPU".into());
        }
        Ok(format!("{rows}x{len} f32: {}", lines.join(", ")))
    })();
    rep.line("quantizer speed", r);
}

/// Median of `runs` timings of `f` (after 3 warm-up calls), each behind a
/// device-to-device copy of `delay` so that the host has queued the whole
/// of `f` before the GPU reaches it: the time is the GPU's, not the launch
/// latency's.
fn median_ms(
    ctx: &CudaContext,
    delay: &DevBuf,
    runs: usize,
    f: &dyn Fn() -> Result<(), String>,
) -> Result<f64, String> {
    for _ in 0..3 {
        f()?;
    }
    let half = delay.len_bytes() / 2;
    let mut ms = Vec::with_capacity(runs);
    for _ in 0..runs {
        copy_dtod(ctx, delay.ptr() + half as u64, delay.ptr(), half)?;
        let t = gpu(ctx.timer())?;
        f()?;
        ms.push(gpu(t.stop_ms())? as f64);
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[runs / 2])
}

/// cuMemcpyDtoDAsync on the context's stream.
fn copy_dtod(ctx: &CudaContext, dst: u64, src: u64, bytes: usize) -> Result<(), String> {
    let stream = ctx.stream();
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| format!("bind: {e:?}"))?;
    // SAFETY: both ranges lie in live pool buffers of at least `bytes` bytes
    // and do not overlap; the copy is ordered on the context's one stream.
    unsafe {
        cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream())
            .map_err(|e| format!("cuMemcpyDtoDAsync: {e:?}"))
    }
}

/// The quantizer speed lines a script parses, for an 8192x8192 tensor:
/// `BENCH quantize <name> elems=<n> ms=<median> gbps=<bf16 input GB/s> copy_ratio=<copy ms / ms>`,
/// the medians of 25 runs, beside a device-to-device copy of the BF16
/// tensor. Then the bench outputs are checked against the CPU.
fn bench_quantizers(ctx: &CudaContext, rep: &mut Report) {
    let (rows, cols) = (8192usize, 8192usize);
    let n = rows * cols;
    let runs = 25;
    let r = (|| -> CheckResult {
        let x = normal_data(n, 4242, 1.0);
        let (xb, xw) = device_input(ctx, &x, DType::BF16)?;
        let xf = gpu(ctx.upload(&x))?;
        let copy_dst = gpu(ctx.alloc(n * 2))?;
        let delay = gpu(ctx.alloc(1 << 30))?;
        let e4 = ElemFormat::E4M3FN;
        let mx = MxConfig::mxfp4();
        let both = Fp8Outputs {
            rows: true,
            cols: true,
        };
        type Job<'a> = (&'static str, Box<dyn Fn() -> Result<(), String> + 'a>);
        let jobs: Vec<Job> = vec![
            (
                "copy_bf16",
                Box::new(|| copy_dtod(ctx, copy_dst.ptr(), xb.ptr(), n * 2)),
            ),
            (
                "mxfp4_1x32_even_bf16",
                Box::new(|| {
                    gpu(ctx.quantize_mx_rows_of(&xb, DType::BF16, rows, cols, &mx)).map(|_| ())
                }),
            ),
            (
                "fp8_tensorwise_e4m3_bf16",
                Box::new(|| gpu(ctx.quantize_fp8_of(&xb, DType::BF16, n, e4, false)).map(|_| ())),
            ),
            (
                "fp8_cast_2d_both_e4m3_bf16",
                Box::new(|| {
                    gpu(ctx.quantize_fp8_2d(&xb, DType::BF16, rows, cols, e4, false, 16, both))
                        .map(|_| ())
                }),
            ),
            (
                "mxfp4_1x32_even_f32",
                Box::new(|| {
                    gpu(ctx.quantize_mx_rows_of(&xf, DType::F32, rows, cols, &mx)).map(|_| ())
                }),
            ),
            (
                "fp8_tensorwise_e4m3_f32",
                Box::new(|| gpu(ctx.quantize_fp8_of(&xf, DType::F32, n, e4, false)).map(|_| ())),
            ),
        ];
        let mut copy_ms = 0.0;
        let mut summary = Vec::new();
        for (name, f) in &jobs {
            let ms = median_ms(ctx, &delay, runs, f.as_ref())?;
            if *name == "copy_bf16" {
                copy_ms = ms;
            }
            let gbps = n as f64 * 2.0 / 1e9 / (ms / 1e3);
            println!(
                "BENCH quantize {name} elems={n} ms={ms:.4} gbps={gbps:.1} copy_ratio={:.3}",
                copy_ms / ms
            );
            summary.push(format!("{name} {:.3}x", copy_ms / ms));
        }
        // The timed kernels at this size must still be exact.
        let mut bad = Vec::new();
        let q = gpu(ctx.quantize_mx_rows_of(&xb, DType::BF16, rows, cols, &mx))?;
        let cpu = quantize_rows(&xw, rows, cols, &mx).map_err(|e| e.to_string())?;
        let codes: Vec<u8> = gpu(ctx.download(&q.codes, q.code_bytes()))?;
        let scales: Vec<u8> = gpu(ctx.download(&q.scales, q.nblocks()))?;
        if codes != cpu.codes || scales != cpu.scales {
            bad.push("mxfp4 bf16 codes or scales differ from the CPU");
        }
        let cpu =
            quantize_tensorwise(&xw, &[rows, cols], e4, false, "x").map_err(|e| e.to_string())?;
        let q = gpu(ctx.quantize_fp8_of(&xb, DType::BF16, n, e4, false))?;
        let codes: Vec<u8> = gpu(ctx.download(&q.codes, n))?;
        let (_, scale, _) = gpu(q.read_scales(ctx))?;
        if codes != cpu.codes || scale.to_bits() != cpu.scale.to_bits() {
            bad.push("fp8 bf16 codes or scale differ from the CPU");
        }
        let q = gpu(ctx.quantize_fp8_2d(&xb, DType::BF16, rows, cols, e4, false, 16, both))?;
        let (want, want_t) = padded_codes(&cpu.codes, rows, cols, rows, cols);
        let got: Vec<u8> = gpu(ctx.download(q.codes.as_ref().ok_or("no codes")?, n))?;
        let got_t: Vec<u8> = gpu(ctx.download(q.codes_t.as_ref().ok_or("no codes_t")?, n))?;
        if got != want || got_t != want_t {
            bad.push("fp8 2-D bf16 codes or transposed codes differ from the CPU");
        }
        if bad.is_empty() {
            Ok(format!(
                "{rows}x{cols}, medians of {runs} (copy {copy_ms:.4} ms): {}; outputs bit-exact",
                summary.join(", ")
            ))
        } else {
            Err(bad.join("; "))
        }
    })();
    rep.line("quantizer bench", r);
}
