//! f32 linear forward + backward through the runtime (tape, views, bias,
//! allocation included) against the three raw `gemm`-crate GEMMs it needs, on
//! the same shapes and threads. The ratio is the runtime's overhead; the
//! target is >= 0.8.
//!
//! y = x W^T + b (fprop), dx = dy W (dgrad), dW = dy^T x (wgrad), db = sum_rows(dy):
//! 3 * 2 * M * N * K flops per step. Each figure is the median of REPS runs,
//! alternating runtime and raw so load from other processes hits both alike.
//!
//! A second table times the recipe linears (`QuantLinear`, quantization
//! included) and prints each recipe's throughput relative to `bf16`.
//!
//! Run: `cargo bench -p mxswitch-runtime --bench linear`.

use std::time::Instant;

use gemm::{gemm, Parallelism};
use mxswitch_runtime::linear::QuantLinear;
use mxswitch_runtime::module::allocate;
use mxswitch_runtime::ops::linear;
use mxswitch_runtime::plan::PlanLinear;
use mxswitch_runtime::recipe::{Recipe, RecipeKind};
use mxswitch_runtime::{Device, Param, Tensor};

const REPS: usize = 9;
const WARMUP: usize = 2;
/// (M, K, N): a square case and a Flux-like MLP projection.
const SHAPES: [(usize, usize, usize); 2] = [(1024, 1024, 1024), (2048, 768, 3072)];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect()
}

/// dst[m x n] = lhs * rhs with explicit (row, column) strides, all cores.
#[allow(clippy::too_many_arguments)]
fn raw_gemm(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    lhs: &[f32],
    l_rs: isize,
    l_cs: isize,
    rhs: &[f32],
    r_rs: isize,
    r_cs: isize,
) {
    assert_eq!(dst.len(), m * n);
    // SAFETY: the callers pass buffers of exactly the sizes the strides cover.
    unsafe {
        gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            lhs.as_ptr(),
            l_cs,
            l_rs,
            rhs.as_ptr(),
            r_cs,
            r_rs,
            0.0,
            1.0,
            false,
            false,
            false,
            Parallelism::Rayon(0),
        )
    }
}

fn main() -> mxswitch_runtime::Result<()> {
    println!(
        "f32 linear forward+backward, {} threads, median of {REPS}",
        rayon::current_num_threads()
    );
    println!(
        "{:>5} {:>5} {:>5} | {:>14} {:>14} | {:>6}",
        "M", "K", "N", "runtime GF/s", "raw gemm GF/s", "ratio"
    );
    for (m, k, n) in SHAPES {
        let dev = Device::Cpu;
        let (xv, wv, bv, dyv) = (
            values(m * k, 1),
            values(n * k, 2),
            values(n, 3),
            values(m * n, 4),
        );
        let x = Param::new(Tensor::from_vec(xv.clone(), [m, k], &dev)?)?;
        let w = Param::new(Tensor::from_vec(wv.clone(), [n, k], &dev)?)?;
        let b = Param::new(Tensor::from_vec(bv, [n], &dev)?)?;
        let dy = Tensor::from_vec(dyv.clone(), [m, n], &dev)?;
        let (mut y, mut dx, mut dw) = (vec![0f32; m * n], vec![0f32; m * k], vec![0f32; n * k]);

        let (mut ours, mut raw) = (Vec::new(), Vec::new());
        for rep in 0..WARMUP + REPS {
            let start = Instant::now();
            let out = linear(&x, &w, Some(&b))?;
            let grads = out.backward_with(&dy)?;
            // Every gradient is materialized before the clock stops.
            assert_eq!(grads.len(), 3);
            let t_ours = start.elapsed().as_secs_f64();
            drop((out, grads));

            let start = Instant::now();
            let (ki, ni) = (k as isize, n as isize);
            raw_gemm(m, n, k, &mut y, &xv, ki, 1, &wv, 1, ki); // x [M,K] * W^T [K,N]
            raw_gemm(m, k, n, &mut dx, &dyv, ni, 1, &wv, ki, 1); // dy [M,N] * W [N,K]
            raw_gemm(n, k, m, &mut dw, &dyv, 1, ni, &xv, ki, 1); // dy^T [N,M] * x [M,K]
            let t_raw = start.elapsed().as_secs_f64();
            if rep >= WARMUP {
                ours.push(t_ours);
                raw.push(t_raw);
            }
        }
        let flops = 3.0 * 2.0 * (m * n * k) as f64;
        let (g_ours, g_raw) = (flops / median(ours) / 1e9, flops / median(raw) / 1e9);
        println!(
            "{m:>5} {k:>5} {n:>5} | {g_ours:>14.1} {g_raw:>14.1} | {:>6.3}",
            g_ours / g_raw
        );
    }
    recipes()
}

/// Recipe linears forward + backward, relative to the bf16 recipe.
fn recipes() -> mxswitch_runtime::Result<()> {
    println!("\nrecipe linears forward+backward (quantization included), median of {REPS}");
    println!(
        "{:>5} {:>5} {:>5} | {:>8} {:>10} {:>9}",
        "M", "K", "N", "recipe", "GF/s", "vs bf16"
    );
    for (m, k, n) in SHAPES {
        let dev = Device::Cpu;
        let mut lin = QuantLinear::new(k, n, true);
        allocate(&mut lin, 7)?;
        let x = Tensor::from_vec(values(m * k, 1), [m, k], &dev)?;
        let dy = Tensor::from_vec(values(m * n, 4), [m, n], &dev)?;
        let flops = 3.0 * 2.0 * (m * n * k) as f64;
        let mut bf16 = 0.0;
        for kind in [
            RecipeKind::Bf16,
            RecipeKind::Fp8,
            RecipeKind::Mxfp8,
            RecipeKind::Mxfp4,
        ] {
            lin.set_recipe(Recipe::new(kind));
            let mut times = Vec::new();
            for rep in 0..WARMUP + REPS {
                let start = Instant::now();
                let grads = lin.forward(&x)?.backward_with(&dy)?;
                assert_eq!(grads.len(), 2);
                if rep >= WARMUP {
                    times.push(start.elapsed().as_secs_f64());
                }
            }
            let gf = flops / median(times) / 1e9;
            if kind == RecipeKind::Bf16 {
                bf16 = gf;
            }
            println!(
                "{m:>5} {k:>5} {n:>5} | {:>8} {gf:>10.1} {:>8.2}x",
                kind.name(),
                gf / bf16
            );
        }
    }
    Ok(())
}
