//! Quantizer throughput on the CPU, beside a plain parallel copy of the same
//! buffer on the same rayon threads, measured in one run.
//!
//! `cargo bench -p mxswitch-runtime --bench quantize [-- MiB]` (default 64 MiB
//! of f32). Prints GB/s of f32 input (median of the repetitions) and the
//! ratio to the copy. Target: MXFP4 >= 0.5x the copy.

use std::hint::black_box;
use std::time::Instant;

use mxswitch_runtime::formats::ElemFormat;
use mxswitch_runtime::quant::{quantize_rows, quantize_tensorwise, MxConfig};
use rayon::prelude::*;

const REPS: usize = 15;

/// Median seconds of `REPS` runs of `f` (after one warm-up run).
fn median_secs(mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..REPS)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[REPS / 2]
}

fn main() {
    let mib: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(64);
    let n = mib * (1 << 20) / 4;
    let cols = 4096;
    let rows = n / cols;
    // Deterministic, roughly normal-looking data with outliers.
    let x: Vec<f32> = (0..rows * cols)
        .map(|i| {
            let u = ((i as u32).wrapping_mul(2_654_435_761) >> 8) as f32 / 16_777_216.0;
            (u - 0.5) * if i % 97 == 0 { 40.0 } else { 3.0 }
        })
        .collect();
    let bytes = (x.len() * 4) as f64;
    println!(
        "input: {rows} x {cols} f32 ({mib} MiB), {} rayon threads, median of {REPS}",
        rayon::current_num_threads()
    );

    let mut dst = vec![0.0f32; x.len()];
    let copy = median_secs(|| {
        dst.par_chunks_mut(1 << 16)
            .zip(x.par_chunks(1 << 16))
            .for_each(|(d, s)| d.copy_from_slice(s));
        black_box(&dst);
    });
    let report = |name: &str, secs: f64| {
        println!(
            "{name:<28} {:>8.2} GB/s   {:>5.2}x copy",
            bytes / secs / 1e9,
            copy / secs
        );
    };
    report("copy (parallel)", copy);

    let mxfp4 = MxConfig::mxfp4();
    report(
        "mxfp4 1x32 even",
        median_secs(|| {
            black_box(quantize_rows(&x, rows, cols, &mxfp4).unwrap());
        }),
    );
    let mxfp8 = MxConfig::mxfp8();
    report(
        "mxfp8 1x32 rceil",
        median_secs(|| {
            black_box(quantize_rows(&x, rows, cols, &mxfp8).unwrap());
        }),
    );
    report(
        "fp8 e4m3 tensorwise",
        median_secs(|| {
            black_box(
                quantize_tensorwise(&x, &[rows, cols], ElemFormat::E4M3FN, false, "x").unwrap(),
            );
        }),
    );
}
