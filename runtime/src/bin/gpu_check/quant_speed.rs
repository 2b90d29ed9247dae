//! Quantizer speed at 8192x8192: the `quantizer speed:` line, and one
//! `BENCH quantize <name> elems= ms= gbps= copy_ratio=` line per quantizer
//! beside a device-to-device copy of the BF16 tensor, whose outputs are then
//! checked against the CPU bit for bit.

use mxswitch_runtime::cuda::quantize::Fp8Outputs;
use mxswitch_runtime::cuda::{CudaContext, DequantLayout};
use mxswitch_runtime::formats::{e8m0, ElemFormat};
use mxswitch_runtime::quant::{quantize_rows, quantize_tensorwise, MxConfig};
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
    });
}
