//! Speed of the quantized linear on the GPU: fwd + bwd with BF16
//! activations, one `BENCH linear` line per recipe and shape.

use mxswitch_runtime::cuda::{
    bias_fallbacks, fp8_group_fallbacks, scale_fallbacks, CudaDevice, CudaStorage,
};
use mxswitch_runtime::qlinear::{self, LinearCall, LinearCtx, LinearShape};
use mxswitch_runtime::recipe::{Recipe, RecipeKind};
use mxswitch_runtime::DType;

use crate::common::{err, gpu, median_ms, Report, Start};
use crate::linear::{data, recipes, upload};

/// The inputs of one timed shape on the GPU: x, W, b, dy.
type Inputs = (CudaStorage, CudaStorage, CudaStorage, CudaStorage);

/// Median milliseconds of one fwd + bwd (BF16 activations, with or without
/// bias) over `iters` timed runs after two warm-ups: back to back, as the
/// torch peer times `F.linear`, then each from an idle device.
fn time_recipe(
    dev: &CudaDevice,
    r: &Recipe,
    s: LinearShape,
    (x, w, b, dy): (
        &CudaStorage,
        &CudaStorage,
        Option<&CudaStorage>,
        &CudaStorage,
    ),
    iters: usize,
) -> Result<Times, String> {
    let lctx = LinearCtx {
        layer: "bench",
        iteration: 1,
        seed: 3,
        layer_id: 1,
    };
    let call = LinearCall {
        recipe: r,
        shape: s,
        ctx: lctx,
    };
    let step = || -> Result<(), String> {
        let (y, saved) = qlinear::forward(&call, x, w, b).map_err(err)?;
        let g = qlinear::backward(&call, &saved, Some(w), dy);
        drop((y, saved, g.map_err(err)?));
        Ok(())
    };
    let behind = median_ms(dev.context(), Start::Behind, 2, iters, step)?;
    let idle = median_ms(dev.context(), Start::Idle, 2, iters, step)?;
    // The bench data is finite: a deferred non-finite amax is a failure.
    gpu(dev.context().check_deferred())?;
    Ok(Times { behind, idle })
}

/// Median milliseconds of one shape's fwd + bwd, timed two ways.
struct Times {
    /// Runs back to back: the host queues one while the GPU runs the one
    /// before, as in training and as the torch peer is timed.
    behind: f64,
    /// Each run from an idle device: adds the launch latency the GPU waits
    /// out, which a recipe with more launches pays more of.
    idle: f64,
}

/// Prints one `BENCH linear` line per recipe and shape (fwd + bwd,
/// quantization included, TFLOP/s = 6 M K N / time).
/// `BENCH linear_nobias` lines time the same without a bias: cuBLASLt has no
/// f32 bias in a BF16-output or FP8 epilogue, so with a bias the forward
/// writes an f32 result and adds the bias in a second pass; the difference
/// measures that cost.
fn run(dev: &CudaDevice, shapes: &[LinearShape], recipes: &[Recipe]) -> Result<(), String> {
    for &s in shapes {
        let (x, w, b, dy): Inputs = (
            upload(dev, &data(s.m, s.k, 91, 1.0), DType::BF16)?,
            upload(
                dev,
                &data(s.n, s.k, 92, 1.0 / (s.k as f64).sqrt()),
                DType::F32,
            )?,
            upload(dev, &data(1, s.n, 93, 0.1), DType::F32)?,
            upload(dev, &data(s.m, s.n, 94, 1e-3), DType::BF16)?,
        );
        for r in recipes {
            for (bias, tag) in [(Some(&b), "linear"), (None, "linear_nobias")] {
                let before = (bias_fallbacks(), fp8_group_fallbacks(), scale_fallbacks());
                let t = time_recipe(dev, r, s, (&x, &w, bias, &dy), 20)?;
                if bias_fallbacks() != before.0 {
                    println!("  ({r}: bias added after the GEMM, not in its epilogue)");
                }
                if scale_fallbacks() != before.2 {
                    println!("  ({r}: tensor scales applied after the GEMM, not as its alpha)");
                }
                if fp8_group_fallbacks() != before.1 {
                    println!("  ({r}: some GEMMs ran on dequantized f32 values, not scaled FP8)");
                }
                let tf = 6.0 * (s.m * s.n * s.k) as f64 / (t.behind * 1e-3) / 1e12;
                println!(
                    "BENCH {tag} {r} M={} K={} N={} ms={:.4} tflops={tf:.1} idle_ms={:.4}",
                    s.m, s.k, s.n, t.behind, t.idle
                );
            }
        }
    }
    Ok(())
}

/// The environment variable that limits the large benchmark to some
/// recipes (comma-separated names, e.g. `nvfp4,fp8_rowwise`), so that a
/// profiler run sees one recipe's kernels only.
const ONLY: &str = "GPU_CHECK_RECIPES";

/// With this variable `1`, the large benchmark times only its first shape
/// (K = 3072, N = 12288).
const FIRST_SHAPE: &str = "GPU_CHECK_FIRST_SHAPE";

/// `recipes` limited to those [`ONLY`] names, when it is set.
fn only_named(recipes: Vec<Recipe>) -> Vec<Recipe> {
    match std::env::var(ONLY) {
        Ok(names) if !names.is_empty() => {
            let keep: Vec<&str> = names.split(',').map(str::trim).collect();
            recipes
                .into_iter()
                .filter(|r| keep.contains(&r.to_string().as_str()))
                .collect()
        }
        _ => recipes,
    }
}

/// Every recipe at M = 4096, K = N = 3072, or with `large` issue 7's shapes
/// at M = 16384 for bf16, fp8, mxfp4, mxfp8, nvfp4, fp8_rowwise and
/// fp8_block (those `GPU_CHECK_RECIPES` names, when set); a failure is one
/// FAIL line.
pub fn bench(rep: &mut Report, large: bool) {
    let shape = |m, k, n| LinearShape { m, k, n };
    let r = CudaDevice::get(0).map_err(err).and_then(|dev| {
        if large {
            let m = 16384;
            let mut shapes = vec![
                shape(m, 3072, 12288),
                shape(m, 12288, 3072),
                shape(m, 3072, 3072),
            ];
            if std::env::var(FIRST_SHAPE).is_ok_and(|v| v == "1") {
                shapes.truncate(1);
            }
            let kinds = [
                RecipeKind::Bf16,
                RecipeKind::Fp8,
                RecipeKind::Mxfp4,
                RecipeKind::Mxfp8,
                RecipeKind::Nvfp4,
                RecipeKind::Fp8Rowwise,
                RecipeKind::Fp8Block,
            ];
            run(&dev, &shapes, &only_named(kinds.map(Recipe::new).to_vec()))
        } else {
            run(&dev, &[shape(4096, 3072, 3072)], &recipes()?)
        }
    });
    if let Err(e) = r {
        rep.line("linear timing", Err(e));
    }
}
