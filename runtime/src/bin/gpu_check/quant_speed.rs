//! Quantizer speed at 8192x8192: the `quantizer speed:` line, and one
//! `BENCH quantize <name> elems= ms= gbps= copy_ratio=` line per quantizer
//! (MX, FP8, and NVFP4 one direction and both at once as the linear asks)
//! beside a device-to-device copy of the BF16 tensor, whose outputs are then
//! checked against the CPU bit for bit.

use mxswitch_runtime::backend::Along;
use mxswitch_runtime::cuda::quantize::Fp8Outputs;
use mxswitch_runtime::cuda::{CudaContext, DequantLayout, DevBuf, Nvfp4Device, Nvfp4Outputs};
use mxswitch_runtime::formats::{e8m0, ElemFormat};
use mxswitch_runtime::quant::{
    quantize_nvfp4, quantize_nvfp4_rows, quantize_rows, quantize_tensorwise, MxConfig, Nvfp4Config,
    Nvfp4Tensor,
};
use mxswitch_runtime::DType;

use crate::common::{copy_dtod, device_input, gpu, mean_ms, median_ms, normal_data, Report, Start};
use crate::fp8_2d::padded_codes;
use crate::mx::SR_KEY;

/// Mean time of each quantizer and the MXFP4 dequantize over 10 runs, with
/// a spot check that the timed outputs are still the CPU's.
pub fn time_quantizers(ctx: &CudaContext, rep: &mut Report) {
    let (rows, len) = (8192usize, 8192usize);
    rep.check("quantizer speed", || {
        let x = normal_data(rows * len, 4242, 1.0);
        let xd = gpu(ctx.upload(&x))?;
        let mut lines = Vec::new();
        let iters = 10;
        let mut run =
            |name: &str, bytes: f64, f: &dyn Fn() -> Result<(), String>| -> Result<(), String> {
                let ms = mean_ms(ctx, 1, iters, f)?;
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
                gpu(ctx.quantize_mx_rows_of(&xd, DType::F32, rows, len, &cfg)).map(|_| ())
            })?;
        }
        let q = gpu(ctx.quantize_mx_rows_of(&xd, DType::F32, rows, len, &MxConfig::mxfp4()))?;
        run("dequant mxfp4->bf16", n * (0.5 + 1.0 / 32.0 + 2.0), &|| {
            gpu(ctx.dequantize_mx(&q, DequantLayout::Rows, DType::BF16)).map(|_| ())
        })?;
        run("fp8 e4m3 tensorwise", n * (4.0 + 4.0 + 1.0), &|| {
            gpu(ctx.quantize_fp8_of(&xd, DType::F32, rows * len, ElemFormat::E4M3FN, false))
                .map(|_| ())
        })?;
        // The one-off dequantized values must stay exact: spot-check a block.
        let cpu =
            quantize_rows(&x[..len], 1, len, &MxConfig::mxfp4()).map_err(|e| e.to_string())?;
        let first: Vec<u8> = gpu(ctx.download(&q.scales, 1))?;
        if first[0] != cpu.scales[0] || e8m0::decode(first[0]).is_nan() {
            return Err("first scale byte differs from the CPU".into());
        }
        Ok(format!("{rows}x{len} f32: {}", lines.join(", ")))
    });
}

/// The quantizer speed lines a script parses, for an 8192x8192 tensor:
/// `BENCH quantize <name> elems=<n> ms=<median> gbps=<bf16 input GB/s> copy_ratio=<copy ms / ms>`,
/// the medians of 25 runs, beside a device-to-device copy of the BF16
/// tensor. Then the bench outputs are checked against the CPU.
pub fn bench_quantizers(ctx: &CudaContext, rep: &mut Report) {
    let (rows, cols) = (8192usize, 8192usize);
    let n = rows * cols;
    let runs = 25;
    rep.check("quantizer bench", || {
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
        let jobs: Vec<Job> = jobs
            .into_iter()
            .chain(nvfp4_jobs(ctx, (&xb, &xf), (rows, cols)))
            .collect();
        let mut copy_ms = 0.0;
        let mut summary = Vec::new();
        for (name, f) in &jobs {
            let ms = median_ms(ctx, Start::Queued(&delay), 3, runs, f.as_ref())?;
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
        let mut bad: Vec<&str> = Vec::new();
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
        bad.extend(nvfp4_exact(ctx, &xb, &xw, (rows, cols))?);
        if bad.is_empty() {
            Ok(format!(
                "{rows}x{cols}, medians of {runs} (copy {copy_ms:.4} ms): {}; outputs bit-exact",
                summary.join(", ")
            ))
        } else {
            Err(bad.join("; "))
        }
    });
}

type Job<'a> = (&'static str, Box<dyn Fn() -> Result<(), String> + 'a>);

/// The NVFP4 quantizations the linear asks for (`nvfp4` recipe): x's
/// forward operand and kept Hadamard copy, dy's two SR operands, the f32
/// weight's 16x16-tiled operand and kept copy (each one pass, both
/// directions), and one direction alone.
fn nvfp4_jobs<'a>(
    ctx: &'a CudaContext,
    (xb, xf): (&'a DevBuf, &'a DevBuf),
    dims: (usize, usize),
) -> Vec<Job<'a>> {
    let plain = Nvfp4Config::default();
    let had = Nvfp4Config {
        hadamard: true,
        ..plain
    };
    let sr = |c: Nvfp4Config| Nvfp4Config {
        sr: Some(SR_KEY),
        ..c
    };
    let tiles = Nvfp4Config {
        tile2d: true,
        ..plain
    };
    let (codes, deq) = (
        Nvfp4Outputs {
            codes: true,
            deq: false,
        },
        Nvfp4Outputs {
            codes: false,
            deq: true,
        },
    );
    let both = move |x: &'a DevBuf, dtype: DType, c: (Nvfp4Config, Nvfp4Outputs), r| -> Job<'a> {
        let name = match (dtype, c.0.tile2d, c.0.sr.is_some()) {
            (_, true, _) => "nvfp4_w_16x16_both_f32",
            (_, _, true) => "nvfp4_dy_both_sr_bf16",
            _ => "nvfp4_x_both_bf16",
        };
        let f = move || {
            gpu(ctx.quantize_nvfp4_2d((x, dtype), dims, [Some(c), Some(r)], false)).map(|_| ())
        };
        (name, Box::new(f))
    };
    vec![
        (
            "nvfp4_1x16_bf16",
            Box::new(move || {
                gpu(ctx.quantize_nvfp4((xb, DType::BF16), dims, Along::Cols, &plain, codes))
                    .map(|_| ())
            }),
        ),
        both(xb, DType::BF16, (plain, deq), (had, codes)),
        both(xb, DType::BF16, (sr(plain), deq), (sr(had), deq)),
        both(xf, DType::F32, (tiles, deq), (tiles, codes)),
    ]
}

/// The NVFP4 bench shapes stay exact: one direction alone, and both
/// directions of x from one pass, against the CPU.
fn nvfp4_exact(
    ctx: &CudaContext,
    xb: &DevBuf,
    xw: &[f32],
    (rows, cols): (usize, usize),
) -> Result<Vec<&'static str>, String> {
    let had = Nvfp4Config {
        hadamard: true,
        ..Nvfp4Config::default()
    };
    let out = Nvfp4Outputs {
        codes: true,
        deq: false,
    };
    let x = (xb, DType::BF16);
    let plain = Nvfp4Config::default();
    let ([gc, gr], _) = gpu(ctx.quantize_nvfp4_2d(
        x,
        (rows, cols),
        [Some((plain, out)), Some((had, out))],
        false,
    ))?;
    let one = gpu(ctx.quantize_nvfp4(x, (rows, cols), Along::Cols, &plain, out))?;
    let cpu_c = quantize_nvfp4_rows(xw, rows, cols, &plain).map_err(|e| e.to_string())?;
    let cpu_r = quantize_nvfp4(xw, &[rows, cols], 0, &had).map_err(|e| e.to_string())?;
    let mut bad = Vec::new();
    let same = |g: &Nvfp4Device, c: &Nvfp4Tensor, along| -> Result<bool, String> {
        let t = gpu(g.to_tensor(ctx, along))?;
        Ok(t.codes == c.codes
            && t.scales == c.scales
            && t.tensor_scale.to_bits() == c.tensor_scale.to_bits())
    };
    let gc = gc.ok_or("no NVFP4 copy along cols")?;
    let gr = gr.ok_or("no NVFP4 copy along rows")?;
    if !same(&one, &cpu_c, Along::Cols)? || !same(&gc, &cpu_c, Along::Cols)? {
        bad.push("nvfp4 bf16 codes, scales or t along cols differ from the CPU");
    }
    if !same(&gr, &cpu_r, Along::Rows)? {
        bad.push("nvfp4 bf16 Hadamard codes, scales or t along rows differ from the CPU");
    }
    Ok(bad)
}
