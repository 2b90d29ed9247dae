//! `gpu_check`: the CUDA backend against the CPU reference, in one binary.
//!
//! ```text
//! gpu_check [check] [SUITE...]   the checks of each SUITE (all when none)
//! gpu_check bench [BENCH...]     the benchmarks (all but linear-large when none)
//! ```
//!
//! Suites: `quantize` (MX, NVFP4, FP8 tensorwise and FP8 rowwise / 128-block
//! quantizers bit-exact with the CPU, their speed, the scaled FP8 group
//! GEMMs against f64), `gemm` (cuBLASLt GEMMs against f64), `ops` (every tensor op,
//! forward and backward), `linear` (the recipe linears with byte-identical
//! saved operands, per-GEMM overrides included), `adamw` (AdamW bit-identical,
//! clipping), `attention` (fused attention forward and backward against the
//! CPU backend, every kernel path), `fused` (the element-wise vector kernels
//! against the generic ones and the CPU, the fused modulation ops forward
//! and backward). Benchmarks: `quantize`, `matmul`, `elementwise`, `linear`
//! (M = 4096, K = N = 3072, every recipe), `fused` (those kernels and ops at
//! Flux.1 widths), `attention` (fused against unfused at Flux shapes) and
//! `linear-large` (issue 7's shapes). Each check prints
//! `PASS name: ..` or `FAIL name: ..`, each benchmark `BENCH ..` lines; the
//! last line is `summary: N passed, M failed`.
//! Exits 0 when nothing failed, 1 on a failure, 2 without a usable GPU (one
//! line saying what was looked for and where) or on a usage error.

mod adamw;
mod attention;
mod common;
mod fp8;
mod fp8_2d;
mod fp8_group;
mod fused;
mod gemm;
mod gemm_layout;
mod linear;
mod linear_bench;
mod linear_ref;
mod mx;
mod nvfp4;
mod op_backend;
mod op_bench;
mod op_cases;
mod ops;
mod quant_speed;

use std::process::ExitCode;
use std::time::Instant;

use mxswitch_runtime::cuda::{CudaContext, CudaDevice};

use common::Report;

/// One named part of a run.
type Part = (&'static str, fn(&CudaContext, &mut Report));

/// The check suites, in run order.
const SUITES: [Part; 7] = [
    ("quantize", |ctx, rep| {
        mx::check_mx_random(ctx, rep);
        mx::check_mx_golden(ctx, rep);
        nvfp4::check_nvfp4_random(ctx, rep);
        nvfp4::check_nvfp4_golden(ctx, rep);
        fp8::check_fp8(ctx, rep);
        fp8_2d::check_fp8_2d(ctx, rep);
        fp8_group::check_fp8_group(ctx, rep);
        quant_speed::time_quantizers(ctx, rep);
        quant_speed::bench_quantizers(ctx, rep);
    }),
    ("gemm", |ctx, rep| {
        gemm::check_gemms(ctx, rep);
        gemm_layout::gemm_checks(ctx, rep);
    }),
    ("ops", |_, rep| {
        ops::check_ops(rep);
        op_backend::backend_checks(rep);
    }),
    ("linear", |_, rep| {
        linear::check_linears(rep);
        mx::check_mx_column_sums(rep);
    }),
    ("adamw", |_, rep| adamw::check_adamw(rep)),
    ("attention", |_, rep| attention::check_attention(rep)),
    ("fused", |_, rep| fused::check_fused(rep)),
];

/// The benchmarks; the last runs only when named.
const BENCHES: [Part; 7] = [
    ("quantize", quant_speed::bench_quantizers),
    ("matmul", op_bench::matmul_bench),
    ("elementwise", op_bench::elementwise_bench),
    ("linear", |_, rep| linear_bench::bench(rep, false)),
    ("fused", fused::fused_bench),
    ("attention", attention::bench),
    ("linear-large", |_, rep| linear_bench::bench(rep, true)),
];

const USAGE: &str = "usage: gpu_check [check] [quantize|gemm|ops|linear|adamw|attention|fused ...] | gpu_check bench [quantize|matmul|elementwise|linear|attention|fused|linear-large ...]";

/// The parts the arguments name, or a usage error.
fn select(args: &[String]) -> Result<Vec<Part>, String> {
    let (table, names, default): (&[Part], &[String], usize) =
        match args.first().map(String::as_str) {
            Some("bench") => (&BENCHES, &args[1..], BENCHES.len() - 1),
            Some("check") => (&SUITES, &args[1..], SUITES.len()),
            _ => (&SUITES, args, SUITES.len()),
        };
    if names.is_empty() {
        return Ok(table[..default].to_vec());
    }
    names
        .iter()
        .map(|n| {
            table
                .iter()
                .find(|(name, _)| name == n)
                .copied()
                .ok_or_else(|| format!("gpu_check: unknown name `{n}`; {USAGE}"))
        })
        .collect()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let parts = match select(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let t0 = Instant::now();
    // One context for the whole run: the tensor checks reach it through
    // `Device::Cuda(0)`, the others take it directly.
    let dev = match CudaDevice::get(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("gpu_check: {e}");
            return ExitCode::from(2);
        }
    };
    let ctx = dev.context();
    println!("device: {}", ctx.info());
    let mut rep = Report::default();
    for (_, run) in parts {
        run(ctx, &mut rep);
    }
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
