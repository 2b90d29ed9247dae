//! The backend methods with two outputs or no Tensor-level form, called on
//! the storages directly, and exact conversions and U8 transfers.

#![allow(clippy::redundant_closure_call)]

use mxswitch_runtime::backend::{BackendDevice, BackendStorage};
use mxswitch_runtime::cpu::{CpuDevice, CpuStorage};
use mxswitch_runtime::cuda::CudaDevice;
use mxswitch_runtime::formats::bf16;
use mxswitch_runtime::{DType, Device, Layout, Shape, Tensor};

use crate::common::{bf16_ulp, compare, err, f32_ulp, host, Report, Rng};
use crate::ops::{sample, Dist, GPU};

/// The backend methods with two outputs or no Tensor-level form: norm_last_dim
/// (y and rstd), the activations' backward kernels, U8 copies and zeros.
pub fn backend_checks(rep: &mut Report) {
    use mxswitch_runtime::op::BinaryOp;
    let dev = match CudaDevice::get(0) {
        Ok(d) => d,
        Err(e) => return rep.line("backend checks", Err(err(e))),
    };
    let mut rng = Rng::new(77);
    for dtype in [DType::F32, DType::BF16] {
        let data = sample(&mut rng, 6 * 300, Dist::Sym);
        let xh = host(&data, dtype);
        let widen = |s: &CpuStorage| -> Vec<f32> {
            match s {
                CpuStorage::F32(v) => v.clone(),
                CpuStorage::BF16(v) => v.iter().map(|&b| bf16::to_f32(b)).collect(),
                CpuStorage::U8(v) => v.iter().map(|&b| b as f32).collect(),
            }
        };
        let bf = dtype == DType::BF16;
        let layout = Layout::contiguous(Shape::from([6, 300]));
        let r = (|| -> std::result::Result<(), String> {
            let g = dev.storage_from_cpu(xh.clone()).map_err(err)?;
            for rms in [false, true] {
                let (cy, cr) = xh.norm_last_dim(&layout, 1e-5, rms).map_err(err)?;
                let (gy, gr) = g.norm_last_dim(&layout, 1e-5, rms).map_err(err)?;
                let (cy, gy) = (widen(&cy), widen(&gy.to_cpu_storage().map_err(err)?));
                let (cr, gr) = (widen(&cr), widen(&gr.to_cpu_storage().map_err(err)?));
                let extra = |a: f32, b: f32| {
                    if bf {
                        bf16_ulp(a.abs().max(b.abs()))
                    } else {
                        0.0
                    }
                };
                let name = if rms { "rms" } else { "layer" };
                rep.line(
                    &format!("backend norm_last_dim({name}) y {dtype} [4 ulp + 1e-6]"),
                    compare(&cy, &gy, |i| {
                        4.0 * f32_ulp(cy[i]) + 1e-6 + extra(cy[i], gy[i])
                    }),
                );
                rep.line(
                    &format!("backend norm_last_dim({name}) rstd {dtype} [2 ulp]"),
                    compare(&cr, &gr, |i| 2.0 * f32_ulp(cr[i]) + extra(cr[i], gr[i])),
                );
            }
            // The activations' backward: g times the slope at x, where the
            // slope is within 4 ulp + 2^-21 (cancellation in 1 - s and
            // 1 + x (1 - s)), so the product within 8 ulp + 2^-21 |g|.
            let gh = host(&sample(&mut rng, 6 * 300, Dist::Sym), dtype);
            let gd = dev.storage_from_cpu(gh.clone()).map_err(err)?;
            let gw = widen(&gh);
            for op in [BinaryOp::SiluBackward, BinaryOp::GeluTanhBackward] {
                let c = widen(&gh.binary(&layout, &xh, &layout, op).map_err(err)?);
                let gg = widen(
                    &gd.binary(&layout, &g, &layout, op)
                        .map_err(err)?
                        .to_cpu_storage()
                        .map_err(err)?,
                );
                rep.line(
                    &format!("backend binary {} {dtype} [8 ulp + 2^-21 |g|]", op.name()),
                    compare(&c, &gg, |i| {
                        8.0 * f32_ulp(c[i])
                            + 2f32.powi(-21) * gw[i].abs()
                            + if bf {
                                bf16_ulp(c[i].abs().max(gg[i].abs()))
                            } else {
                                0.0
                            }
                    }),
                );
            }
            Ok(())
        })();
        if let Err(m) = r {
            rep.line(&format!("backend checks {dtype}"), Err(m));
        }
    }
    // U8: upload, strided copy, concat, download; zeros.
    rep.check("backend u8/zeros [exact]", || {
        let bytes: Vec<u8> = (0..5 * 7).map(|i| (i * 37 % 251) as u8).collect();
        let t = Tensor::from_bytes(bytes.clone(), [5, 7], &Device::Cpu).map_err(err)?;
        let g = t.to_device(&GPU).map_err(err)?;
        let c = Tensor::cat(&[&t.t().map_err(err)?, &t.t().map_err(err)?], 0).map_err(err)?;
        let gc = Tensor::cat(&[&g.t().map_err(err)?, &g.t().map_err(err)?], 0).map_err(err)?;
        if c.to_vec_u8().map_err(err)? != gc.to_vec_u8().map_err(err)? {
            return Err("u8 transpose + concat differs".into());
        }
        let z = Tensor::zeros([3, 5], DType::BF16, &GPU).map_err(err)?;
        if z.to_vec_bf16_bits().map_err(err)? != vec![0u16; 15] {
            return Err("zeros are not zero".into());
        }
        let back = g.to_device(&Device::Cpu).map_err(err)?;
        if back.to_vec_u8().map_err(err)? != bytes {
            return Err("u8 round trip differs".into());
        }
        let _ = CpuDevice.zeros(&Shape::from([1]), DType::U8).map_err(err)?;
        Ok("u8 upload, transpose, concat, download and bf16 zeros exact".into())
    });
    // f32 -> bf16 rounding on ties, NaN, infinities and subnormals.
    rep.check("to_dtype f32->bf16 special values [exact bits]", || {
        let mut v = vec![
            1.0 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
            -(1.0 + 2f32.powi(-8)),
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            1e-40,
            -1e-39,
            0.0,
            -0.0,
        ];
        v.extend(sample(&mut rng, 1000, Dist::Sym));
        let t = Tensor::from_slice(&v, [v.len()], &Device::Cpu).map_err(err)?;
        let c = t
            .to_dtype(DType::BF16)
            .map_err(err)?
            .to_vec_bf16_bits()
            .map_err(err)?;
        let g = t
            .to_device(&GPU)
            .and_then(|g| g.to_dtype(DType::BF16))
            .and_then(|g| g.to_vec_bf16_bits())
            .map_err(err)?;
        if c != g {
            let i = c.iter().zip(&g).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!(
                "bits differ at {i}: cpu {:#06x} gpu {:#06x}",
                c[i], g[i]
            ));
        }
        Ok(format!(
            "{} values bit-equal (ties, NaN, inf, subnormals)",
            v.len()
        ))
    });
}
