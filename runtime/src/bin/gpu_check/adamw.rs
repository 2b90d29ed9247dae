//! AdamW on the GPU (`runtime/kernels/adamw.cu`) against the CPU update of
//! `optim.rs`, bit for bit.
//!
//! For each case (f32 and BF16 parameters, f32 and BF16 gradients, sizes
//! below and above the CPU's parallel threshold, a non-contiguous gradient),
//! the same seeded parameters take 5 AdamW steps with the same seeded
//! gradients on `Device::Cpu` and `Device::Cuda(0)`; the parameters and both
//! moments must have identical bits after every step. Then a clone of the GPU
//! optimizer and a copy restored through `state` / `set_state` must continue
//! exactly like the original, and `clip_grad_norm` must agree with the CPU
//! within accumulation-order noise.

use mxswitch_runtime::module::SplitMix64;
use mxswitch_runtime::optim::{clip_grad_norm, AdamW, AdamWConfig};
use mxswitch_runtime::{DType, Device, Gradients, Param, Result, Tensor};

use crate::common::{err, CheckResult, Report};
use crate::ops::GPU;

fn cfg() -> AdamWConfig {
    AdamWConfig {
        lr: 3e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    }
}

/// Seeded values with a wide spread of magnitudes, some exact zeros.
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut r = SplitMix64::new(seed);
    (0..n)
        .map(|i| {
            if i % 97 == 13 {
                0.0
            } else {
                let scale = 10f32.powi((r.next_u64() % 9) as i32 - 6);
                r.normal() * scale
            }
        })
        .collect()
}

fn bits(t: &Tensor) -> Result<Vec<u32>> {
    Ok(t.to_vec_f32()?.iter().map(|x| x.to_bits()).collect())
}

fn vbits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Number of differing elements (and the first index) between two bit vectors.
fn diff(a: &[u32], b: &[u32]) -> Option<String> {
    if a.len() != b.len() {
        return Some(format!("lengths {} and {}", a.len(), b.len()));
    }
    let bad: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
    bad.first().map(|&i| {
        format!(
            "{} of {} differ, first at {i}: cpu {:e} gpu {:e}",
            bad.len(),
            a.len(),
            f32::from_bits(a[i]),
            f32::from_bits(b[i])
        )
    })
}

struct Side {
    param: Param,
    opt: AdamW,
}

impl Side {
    fn new(w: &[f32], dims: &[usize], dtype: DType, device: &Device) -> Result<Side> {
        let t = Tensor::from_slice(w, dims.to_vec(), device)?.to_dtype(dtype)?;
        Ok(Side {
            param: Param::new(t)?,
            opt: AdamW::new(cfg())?,
        })
    }

    fn step(&mut self, g: &[f32], dims: &[usize], gdtype: DType, transposed: bool) -> Result<()> {
        let device = self.param.device();
        let grad = if transposed {
            // A non-contiguous gradient: the transpose of a [cols, rows] tensor.
            let (r, c) = (dims[0], dims[1]);
            let mut gt = vec![0.0; g.len()];
            for i in 0..r {
                for j in 0..c {
                    gt[j * r + i] = g[i * c + j];
                }
            }
            Tensor::from_vec(gt, vec![c, r], &device)?
                .to_dtype(gdtype)?
                .transpose(0, 1)?
        } else {
            Tensor::from_slice(g, dims.to_vec(), &device)?.to_dtype(gdtype)?
        };
        let mut grads = Gradients::default();
        grads.insert(self.param.id(), grad);
        self.opt.step(std::iter::once(&mut self.param), &grads)
    }

    #[allow(clippy::type_complexity)]
    fn snapshot(&self) -> Result<(Vec<u32>, u64, Vec<u32>, Vec<u32>)> {
        let (n, m, v) = self
            .opt
            .state(self.param.id())?
            .expect("the parameter has taken a step");
        Ok((bits(self.param.tensor())?, n, vbits(&m), vbits(&v)))
    }
}

fn compare(cpu: &Side, gpu: &Side) -> Result<Option<String>> {
    let (cw, cn, cm, cv) = cpu.snapshot()?;
    let (gw, gn, gm, gv) = gpu.snapshot()?;
    if gpu.param.device() != GPU {
        return Ok(Some("the GPU parameter left the GPU".into()));
    }
    if cn != gn {
        return Ok(Some(format!("steps {cn} and {gn}")));
    }
    for (what, a, b) in [("param", &cw, &gw), ("m", &cm, &gm), ("v", &cv, &gv)] {
        if let Some(d) = diff(a, b) {
            return Ok(Some(format!("{what}: {d}")));
        }
    }
    Ok(None)
}

/// 5 steps on both devices, compared after each; then a clone and a
/// state round trip of the GPU optimizer continue for 2 more steps.
fn case(
    dims: &[usize],
    wdt: DType,
    gdt: DType,
    transposed: bool,
    seed: u64,
) -> Result<Option<String>> {
    let n: usize = dims.iter().product();
    let w = random(n, seed);
    let mut cpu = Side::new(&w, dims, wdt, &Device::Cpu)?;
    let mut gpu = Side::new(&w, dims, wdt, &GPU)?;
    for s in 0..5 {
        let g = random(n, seed * 1000 + s);
        cpu.step(&g, dims, gdt, transposed)?;
        gpu.step(&g, dims, gdt, transposed)?;
        if let Some(d) = compare(&cpu, &gpu)? {
            return Ok(Some(format!("step {}: {d}", s + 1)));
        }
    }
    // A clone (deep device copy) and a copy through state() / set_state()
    // (download, upload) continue from step 5 exactly like the CPU.
    let value = gpu.param.tensor().clone();
    let original = std::mem::replace(&mut gpu.opt, AdamW::new(cfg())?);
    let before = original.state(gpu.param.id())?.expect("stepped");
    let (before_m, before_v) = (vbits(&before.1), vbits(&before.2));
    let cloned = original.clone();
    let mut restored = AdamW::new(cfg())?;
    restored.set_state(
        gpu.param.id(),
        before.0,
        before.1.into_owned(),
        before.2.into_owned(),
    )?;
    for s in 5..7 {
        cpu.step(&random(n, seed * 1000 + s), dims, gdt, transposed)?;
    }
    for (what, opt) in [("clone", cloned), ("set_state", restored)] {
        gpu.param.set(value.clone())?;
        gpu.opt = opt;
        for s in 5..7 {
            gpu.step(&random(n, seed * 1000 + s), dims, gdt, transposed)?;
        }
        if let Some(d) = compare(&cpu, &gpu)? {
            return Ok(Some(format!("{what}, steps 6-7: {d}")));
        }
    }
    // Stepping the clone must not have touched the original's moments.
    let after = original.state(gpu.param.id())?.expect("stepped");
    if vbits(&after.1) != before_m || vbits(&after.2) != before_v || after.0 != 5 {
        return Ok(Some(
            "the clone shares device buffers with the original".into(),
        ));
    }
    Ok(None)
}

/// `clip_grad_norm` over four gradients on both devices: the norms and the
/// clipped norm agree within accumulation-order noise.
fn clip_case() -> Result<CheckResult> {
    let shapes: [&[usize]; 4] = [&[64, 33], &[1000], &[3, 5, 7], &[70_000]];
    let mut per_device = Vec::new();
    for device in [Device::Cpu, GPU] {
        let mut grads = Gradients::default();
        let mut params = Vec::new();
        for (i, dims) in shapes.iter().enumerate() {
            let n: usize = dims.iter().product();
            let p = Param::new(Tensor::zeros(dims.to_vec(), DType::F32, &device)?)?;
            let g = Tensor::from_vec(random(n, 7 + i as u64), dims.to_vec(), &device)?
                .mul_scalar(100.0)?;
            grads.insert(p.id(), g);
            params.push(p);
        }
        let norm = clip_grad_norm(&mut grads, 1.0)?;
        let mut after = 0f64;
        for p in &params {
            for x in grads.get(p.id()).expect("inserted").to_vec_f32()? {
                after += f64::from(x) * f64::from(x);
            }
        }
        per_device.push((norm, after.sqrt()));
    }
    let ((cn, ca), (gn, ga)) = (per_device[0], per_device[1]);
    let nums = format!("norm cpu {cn} gpu {gn}, after cpu {ca:.6} gpu {ga:.6}");
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * a.abs().max(b.abs());
    if !close(f64::from(cn), f64::from(gn)) || !close(ca, ga) || (ga - 1.0).abs() > 1e-4 {
        return Ok(Err(format!("clip_grad_norm differs from the CPU: {nums}")));
    }
    Ok(Ok(format!("GPU agrees with the CPU: {nums}")))
}

/// Every AdamW case, then clipping.
pub fn check_adamw(rep: &mut Report) {
    let cases: [(&str, &[usize], DType, DType, bool); 8] = [
        ("f32 [1]", &[1], DType::F32, DType::F32, false),
        ("f32 [37, 29]", &[37, 29], DType::F32, DType::F32, false),
        (
            "f32 [300, 257] (parallel CPU)",
            &[300, 257],
            DType::F32,
            DType::F32,
            false,
        ),
        ("f32 [1 << 20]", &[1 << 20], DType::F32, DType::F32, false),
        (
            "f32, bf16 grad [123, 45]",
            &[123, 45],
            DType::F32,
            DType::BF16,
            false,
        ),
        (
            "bf16 [333, 129]",
            &[333, 129],
            DType::BF16,
            DType::BF16,
            false,
        ),
        (
            "bf16, f32 grad [4097]",
            &[4097],
            DType::BF16,
            DType::F32,
            false,
        ),
        (
            "f32, transposed grad [64, 48]",
            &[64, 48],
            DType::F32,
            DType::F32,
            true,
        ),
    ];
    for (i, (name, dims, wdt, gdt, tr)) in cases.iter().enumerate() {
        let r = match case(dims, *wdt, *gdt, *tr, 11 + i as u64) {
            Ok(None) => Ok(
                "5 steps bit-identical (params, m, v); clone and set_state continue exactly".into(),
            ),
            Ok(Some(d)) => Err(d),
            Err(e) => Err(err(e)),
        };
        rep.line(&format!("adamw {name}"), r);
    }
    rep.line(
        "clip_grad_norm",
        clip_case().unwrap_or_else(|e| Err(err(e))),
    );
}
