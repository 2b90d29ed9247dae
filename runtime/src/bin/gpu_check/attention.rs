//! Fused attention on the GPU against the CPU backend: the forward (o and
//! the log-sum-exp) and the backward (dq, dk, dv) of each kernel path
//! (tensor-core BF16 at d = 32, 64, 128; scalar f32 and BF16 at other
//! widths, d != dv, up to 256) on ragged shapes, through the
//! `AttentionBackend` trait of both storages; the same through the tensor
//! API on strided q, k, v views; and the bench of fused against
//! `attention_unfused` at Flux shapes.
//!
//! Bounds, relative to the largest |value| of each CPU tensor (at least
//! 1e-2: the inputs are of order 1, and with one key dq and dk are zero up
//! to rounding on both sides): f32 1e-5; BF16 o 2 BF16 ulps of that value
//! and the gradients 4 (the GPU rounds p and ds to BF16 as MMA inputs, the
//! CPU keeps them f32); lse 1e-5 in both.

use mxswitch_runtime::backend::{
    AttentionBackend, AttentionSaved, AttentionShape, BackendDevice, BackendStorage,
};
use mxswitch_runtime::cpu::CpuStorage;
use mxswitch_runtime::cuda::{CudaContext, CudaDevice, CudaStorage};
use mxswitch_runtime::formats::bf16;
use mxswitch_runtime::ops::{attention_unfused, scaled_dot_product_attention};
use mxswitch_runtime::{DType, Device, Param, Tensor};

use crate::common::{
    bf16_ulp, compare, dtype_name, err, median_ms, normal_data, CheckResult, Report, Start,
};
use crate::op_cases::qkv;
use crate::ops::GPU;

/// One checked shape: (heads, l, s, d, dv, dtype).
type Case = (usize, usize, usize, usize, usize, DType);

const CASES: [Case; 14] = [
    // Scalar f32: ragged tiles, d != dv, widths past 128 (16-row tiles).
    (2, 70, 130, 16, 8, DType::F32),
    (3, 257, 200, 64, 64, DType::F32),
    (2, 300, 333, 128, 128, DType::F32),
    (1, 100, 90, 256, 200, DType::F32),
    // Tensor cores: Flux's d = 128 (self and cross lengths), 64, 32, one row.
    (4, 1024, 1024, 128, 128, DType::BF16),
    (2, 1000, 777, 128, 128, DType::BF16),
    (1, 64, 2000, 128, 128, DType::BF16),
    (3, 1000, 777, 64, 64, DType::BF16),
    (2, 130, 70, 32, 32, DType::BF16),
    (2, 1, 1, 128, 128, DType::BF16),
    // No query row: empty o, zero dk and dv.
    (2, 0, 50, 64, 64, DType::BF16),
    // Scalar BF16: other widths.
    (2, 200, 150, 48, 48, DType::BF16),
    (2, 90, 100, 64, 32, DType::BF16),
    (1, 100, 129, 256, 256, DType::BF16),
];

/// Host storage of `x` in `dtype` and the f32 values it holds.
fn host(x: &[f32], dtype: DType) -> (CpuStorage, Vec<f32>) {
    match dtype {
        DType::BF16 => {
            let bits: Vec<u16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
            let wide = bits.iter().map(|&b| bf16::to_f32(b)).collect();
            (CpuStorage::BF16(bits), wide)
        }
        _ => (CpuStorage::F32(x.to_vec()), x.to_vec()),
    }
}

/// The f32 values of a storage of either backend.
fn values(s: &CpuStorage) -> Vec<f32> {
    match s {
        CpuStorage::F32(v) => v.clone(),
        CpuStorage::BF16(v) => v.iter().map(|&b| bf16::to_f32(b)).collect(),
        CpuStorage::U8(v) => v.iter().map(|&b| f32::from(b)).collect(),
    }
}

fn gpu_values(s: &CudaStorage) -> Result<Vec<f32>, String> {
    Ok(values(&s.to_cpu_storage().map_err(err)?))
}

/// GPU against CPU within `k` of the bound unit at the CPU's largest |value|
/// or 1e-2, whichever is larger (f32: 1e-5 of it; BF16: its BF16 ulp).
fn within(cpu: &[f32], gpu: &[f32], dtype: DType, k: f32) -> CheckResult {
    let max = cpu.iter().fold(0f32, |m, x| m.max(x.abs()));
    let bound = if dtype == DType::BF16 {
        k * bf16_ulp(max.max(1e-2))
    } else {
        1e-5 * max.max(1e-2)
    };
    compare(cpu, gpu, |_| bound).map(|m| format!("{m}; bound {bound:.2e} (max |cpu| {max:.3e})"))
}

/// Forward and backward of one shape through both backends' trait methods.
/// The backward of both reads the CPU's o and lse, so that it is checked
/// apart from the forward.
fn check_case(dev: &CudaDevice, (heads, l, s, d, dv, dtype): Case, seed: u64, rep: &mut Report) {
    let sh = AttentionShape { heads, l, s, d, dv };
    let scale = 1.0 / (d as f32).sqrt();
    let name = format!(
        "attention {} heads={heads} L={l} S={s} d={d} dv={dv}",
        dtype_name(dtype)
    );
    let data = |n, k: u64, sd| host(&normal_data(n, seed * 16 + k, sd), dtype).0;
    let (q, k, v) = (
        data(heads * l * d, 1, 1.5),
        data(heads * s * d, 2, 1.5),
        data(heads * s * dv, 3, 1.0),
    );
    let d_o = data(heads * l * dv, 4, 1.0);
    let r = (|| -> Result<(), String> {
        let up = |c: &CpuStorage| dev.storage_from_cpu(c.clone()).map_err(err);
        let (gq, gk, gv, gdo) = (up(&q)?, up(&k)?, up(&v)?, up(&d_o)?);
        let (co, clse) = CpuStorage::attention_forward(&q, &k, &v, sh, scale).map_err(err)?;
        let (go, glse) = CudaStorage::attention_forward(&gq, &gk, &gv, sh, scale).map_err(err)?;
        rep.line(
            &format!("{name} o"),
            within(&values(&co), &gpu_values(&go)?, dtype, 2.0),
        );
        rep.line(
            &format!("{name} lse"),
            within(&values(&clse), &gpu_values(&glse)?, DType::F32, 1.0),
        );
        let (go, glse) = (up(&co)?, up(&clse)?);
        let cpu_saved = AttentionSaved {
            q: &q,
            k: &k,
            v: &v,
            o: &co,
            lse: &clse,
        };
        let cg = CpuStorage::attention_backward(cpu_saved, &d_o, sh, scale).map_err(err)?;
        let gpu_saved = || AttentionSaved {
            q: &gq,
            k: &gk,
            v: &gv,
            o: &go,
            lse: &glse,
        };
        let gg = CudaStorage::attention_backward(gpu_saved(), &gdo, sh, scale).map_err(err)?;
        let cpu_grads = [values(&cg.0), values(&cg.1), values(&cg.2)];
        let gpu_grads = [gpu_values(&gg.0)?, gpu_values(&gg.1)?, gpu_values(&gg.2)?];
        for (i, g) in ["dq", "dk", "dv"].iter().enumerate() {
            rep.line(
                &format!("{name} {g}"),
                within(&cpu_grads[i], &gpu_grads[i], dtype, 4.0),
            );
        }
        // One writer per element: a second run gives the same bits.
        let again = CudaStorage::attention_backward(gpu_saved(), &gdo, sh, scale).map_err(err)?;
        let same = [
            gpu_values(&again.0)?,
            gpu_values(&again.1)?,
            gpu_values(&again.2)?,
        ]
        .iter()
        .zip(&gpu_grads)
        .all(|(a, b)| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
        rep.line(
            &format!("{name} backward deterministic"),
            if same {
                Ok("two runs bit-equal".into())
            } else {
                Err("two runs of the backward differ".into())
            },
        );
        Ok(())
    })();
    if let Err(e) = r {
        rep.line(&name, Err(e));
    }
}

/// o and the three gradients of sdpa(q, k, v) for the loss sum(o * r), with
/// q, k and v strided views of one fused `[b, l, 3, h, d]` parameter (as
/// Flux's qkv projection gives them), on `device`.
fn tensor_run(
    fused: &[f32],
    r: &[f32],
    (b, l, h, d): (usize, usize, usize, usize),
    dtype: DType,
    device: &Device,
) -> mxswitch_runtime::Result<Vec<Vec<f32>>> {
    let x = Tensor::from_slice(fused, [b, l, 3, h, d], &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(device)?;
    let p = Param::new(x)?;
    let (q, k, v) = (qkv(&p, 0)?, qkv(&p, 1)?, qkv(&p, 2)?);
    let o = scaled_dot_product_attention(&q, &k, &v)?;
    let rt = Tensor::from_slice(r, o.dims(), &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(device)?;
    let grads = o.backward_with(&rt)?;
    let g = grads
        .get(p.id())
        .ok_or_else(|| mxswitch_runtime::Error::Autograd("no gradient for qkv".into()))?;
    Ok(vec![o.to_vec_f32()?, g.to_vec_f32()?])
}

/// The op on the tape, CPU against GPU, with q, k, v strided views.
fn check_tensor_api(rep: &mut Report) {
    let (b, l, h, d) = (2, 200, 3, 64);
    let fused = normal_data(b * l * 3 * h * d, 901, 1.5);
    let r = normal_data(b * h * l * d, 902, 1.0);
    for dtype in [DType::F32, DType::BF16] {
        let name = format!(
            "attention tensor api {} [b={b}, h={h}, L={l}, d={d}] qkv views",
            dtype_name(dtype)
        );
        let run = |dev: &Device| tensor_run(&fused, &r, (b, l, h, d), dtype, dev).map_err(err);
        match (run(&Device::Cpu), run(&GPU)) {
            (Ok(c), Ok(g)) => {
                rep.line(&format!("{name} o"), within(&c[0], &g[0], dtype, 2.0));
                rep.line(&format!("{name} dqkv"), within(&c[1], &g[1], dtype, 4.0));
            }
            (Err(e), _) | (_, Err(e)) => rep.line(&name, Err(e)),
        }
    }
}

/// The `attention` suite.
pub fn check_attention(rep: &mut Report) {
    let dev = match CudaDevice::get(0) {
        Ok(d) => d,
        Err(e) => return rep.line("attention", Err(err(e))),
    };
    for (i, c) in CASES.iter().enumerate() {
        check_case(&dev, *c, 40 + i as u64, rep);
    }
    check_tensor_api(rep);
}

/// A seeded BF16 tensor of `dims` on the GPU (normal, times `sd`).
fn gpu_bf16(dims: [usize; 4], seed: u64, sd: f64) -> Result<Tensor, String> {
    let n = dims.iter().product();
    Tensor::from_slice(&normal_data(n, seed, sd), dims, &Device::Cpu)
        .and_then(|t| t.to_dtype(DType::BF16))
        .and_then(|t| t.to_device(&GPU))
        .map_err(err)
}

type Attn = fn(&Tensor, &Tensor, &Tensor) -> mxswitch_runtime::Result<Tensor>;

/// Median ms of the forward alone and of forward + backward of `f`.
fn time_attention(
    ctx: &CudaContext,
    f: Attn,
    (q, k, v, d_o): (&Tensor, &Tensor, &Tensor, &Tensor),
    runs: usize,
) -> Result<(f64, f64), String> {
    let fwd = median_ms(ctx, Start::Idle, 2, runs, || f(q, k, v).map_err(err))?;
    let params = [q, k, v].map(|t| Param::new(t.clone()).map_err(err));
    let [qp, kp, vp] = params;
    let (qp, kp, vp) = (qp?, kp?, vp?);
    let both = median_ms(ctx, Start::Idle, 2, runs, || {
        let o = f(&qp, &kp, &vp).map_err(err)?;
        o.backward_with(d_o).map_err(err)
    })?;
    Ok((fwd, both))
}

/// `BENCH attention` lines: fused against `attention_unfused`, forward and
/// forward + backward, BF16, at Flux's [batch 2, 24 heads, 4608, 128] and
/// [batch 16, 24 heads, 512, 128]. TFLOP/s count 4 b h L^2 d for the
/// forward and 2.5 times that for the backward (flash-attention's measure).
pub fn bench(ctx: &CudaContext, rep: &mut Report) {
    for (b, h, l, d) in [(2, 24, 4608, 128), (16, 24, 512, 128)] {
        let r = (|| -> Result<(), String> {
            let dims = [b, h, l, d];
            let (q, k, v, d_o) = (
                gpu_bf16(dims, 1, 1.0)?,
                gpu_bf16(dims, 2, 1.0)?,
                gpu_bf16(dims, 3, 1.0)?,
                gpu_bf16(dims, 4, 1e-2)?,
            );
            let ops = (&q, &k, &v, &d_o);
            let fwd_flop = 4.0 * (b * h * l * l * d) as f64;
            let shape = format!("B={b} H={h} L={l} D={d} bf16");
            let fused = time_attention(ctx, scaled_dot_product_attention, ops, 10)?;
            let tf = |flop: f64, ms: f64| flop / (ms * 1e-3) / 1e12;
            println!(
                "BENCH attention fused {shape} fwd_ms={:.3} fwd_tflops={:.1} fwdbwd_ms={:.3} fwdbwd_tflops={:.1}",
                fused.0,
                tf(fwd_flop, fused.0),
                fused.1,
                tf(3.5 * fwd_flop, fused.1)
            );
            match time_attention(ctx, attention_unfused, ops, 5) {
                Ok(plain) => println!(
                    "BENCH attention unfused {shape} fwd_ms={:.3} fwdbwd_ms={:.3} speedup_fwd={:.2}x speedup_fwdbwd={:.2}x",
                    plain.0,
                    plain.1,
                    plain.0 / fused.0,
                    plain.1 / fused.1
                ),
                Err(e) => println!("BENCH attention unfused {shape} failed: {e}"),
            }
            Ok(())
        })();
        if let Err(e) = r {
            rep.line(&format!("attention bench B={b} H={h} L={l} D={d}"), Err(e));
        }
    }
}
