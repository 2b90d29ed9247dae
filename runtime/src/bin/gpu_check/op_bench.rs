//! Benchmarks of the tensor backend: attention-shaped BF16 matmuls and
//! element-wise ops of flux-small's activation shapes, as `BENCH` lines.

use mxswitch_runtime::cuda::CudaContext;
use mxswitch_runtime::{DType, Result, Tensor};

use crate::common::{err, median_ms, Report, Rng, Start};
use crate::op_cases::qkv;
use crate::ops::{sample, tensor, Dist, GPU};

/// A timed op: its name, its work (flops or bytes) and the op itself.
type Op<'a> = (&'static str, f64, Box<dyn Fn() -> Result<Tensor> + 'a>);

/// Prints `BENCH <group> <name> ms=<median> <unit>=<work / time / per>` for
/// each op: medians of 20 runs after 3 warm-ups, each from an idle device
/// (output allocation and any packing included).
fn time_ops(
    ctx: &CudaContext,
    group: &str,
    (unit, per): (&str, f64),
    ops: &[Op],
) -> std::result::Result<(), String> {
    for (name, work, f) in ops {
        let med = median_ms(ctx, Start::Idle, 3, 20, || f().map_err(err))?;
        println!(
            "BENCH {group} {name} ms={med:.4} {unit}={:.1}",
            work / (med * 1e-3) / per
        );
    }
    Ok(())
}

/// A seeded `[shape]` tensor of `dtype` on the GPU.
fn make(shape: &[usize], dtype: DType, seed: u64) -> std::result::Result<Tensor, String> {
    let v = sample(&mut Rng::new(seed), shape.iter().product(), Dist::Sym);
    tensor(&v, shape, dtype, &GPU).map_err(err)
}

/// Attention-shaped BF16 matmuls through the tensor API, in TFLOP/s.
pub fn matmul_bench(ctx: &CudaContext, rep: &mut Report) {
    let (b, h, l, d) = (8, 6, 512, 64);
    let r = (|| -> std::result::Result<(), String> {
        let bf = |shape: &[usize], seed| make(shape, DType::BF16, seed);
        let q = bf(&[b, h, l, d], 1)?;
        let k = bf(&[b, h, l, d], 2)?;
        let kt = bf(&[b, h, d, l], 3)?;
        let p = bf(&[b, h, l, l], 4)?
            .affine(1.0 / l as f32, 0.0)
            .map_err(err)?;
        let v = bf(&[b, h, l, d], 5)?;
        let fused = bf(&[b, l, 3, h, d], 6)?;
        let view = |i| qkv(&fused, i).map_err(err);
        let (fq, fk, fv) = (view(0)?, view(1)?, view(2)?);
        let flops = 2.0 * (b * h * l * l * d) as f64;
        let ops: Vec<Op> = vec![
            (
                "qk_contiguous_8x6x512x64",
                flops,
                Box::new(|| q.matmul(&kt)),
            ),
            (
                "qk_t_view_8x6x512x64",
                flops,
                Box::new(|| q.matmul(&k.transpose(-1, -2)?)),
            ),
            ("av_8x6x512x512x64", flops, Box::new(|| p.matmul(&v))),
            (
                "qk_t_from_qkv_view",
                flops,
                Box::new(|| fq.matmul(&fk.transpose(-1, -2)?)),
            ),
            ("av_v_from_qkv_view", flops, Box::new(|| p.matmul(&fv))),
        ];
        time_ops(ctx, "matmul", ("tflops", 1e12), &ops)
    })();
    if let Err(e) = r {
        rep.line("matmul bench", Err(e));
    }
}

/// Element-wise binary ops of flux-small's activation shapes, in GB/s of
/// bytes moved.
pub fn elementwise_bench(ctx: &CudaContext, rep: &mut Report) {
    let r = (|| -> std::result::Result<(), String> {
        let a = make(&[8, 512, 768], DType::BF16, 11)?;
        let b = make(&[8, 512, 768], DType::BF16, 12)?;
        let m = make(&[8, 1, 768], DType::BF16, 13)?;
        let af = make(&[8, 512, 3072], DType::F32, 14)?;
        let bf = make(&[8, 512, 3072], DType::F32, 15)?;
        let n = (8 * 512 * 768) as f64;
        let ops: Vec<Op> = vec![
            ("add_bf16_8x512x768", 6.0 * n, Box::new(|| a.add(&b))),
            (
                "mul_bf16_broadcast_8x512x768_by_8x1x768",
                4.0 * n,
                Box::new(|| a.mul(&m)),
            ),
            (
                "add_f32_8x512x3072",
                12.0 * 4.0 * n,
                Box::new(|| af.add(&bf)),
            ),
        ];
        time_ops(ctx, "elementwise", ("gbps", 1e9), &ops)
    })();
    if let Err(e) = r {
        rep.line("elementwise bench", Err(e));
    }
}
