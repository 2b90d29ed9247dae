//! FP8 tensorwise (E4M3FN, E5M2 and the FNUZ pair, with and without pow2
//! scales, f32 and BF16 input): amax, scale and scale_inv bits, codes and
//! dequantized values against the CPU; the golden amax -> scale table;
//! NaN/Inf tensors must be an error on both backends.

use serde_json::Value;

use mxswitch_runtime::cuda::CudaContext;
use mxswitch_runtime::formats::ElemFormat;
use mxswitch_runtime::quant::{amax, amax_to_scale, quantize_tensorwise};
use mxswitch_runtime::DType;

use crate::common::{
    device_input, dtype_name, first_diff, gpu, none_bad, normal_data, same_f32, Cases, Report,
};
use crate::mx::{hex, mx_data};

const FP8_SCALES_GOLDEN: &str = include_str!("../../../tests/golden/fp8_tensorwise_scales.json");

pub const FP8_FORMATS: [ElemFormat; 4] = [
    ElemFormat::E4M3FN,
    ElemFormat::E5M2,
    ElemFormat::E4M3FNUZ,
    ElemFormat::E5M2FNUZ,
];

fn compare_fp8(
    ctx: &CudaContext,
    x: &[f32],
    dtype: DType,
    elem: ElemFormat,
    pow2: bool,
) -> Result<(), String> {
    let (xd, x) = device_input(ctx, x, dtype)?;
    let x = &x[..];
    let q = gpu(ctx.quantize_fp8_of(&xd, dtype, x.len(), elem, pow2))?;
    let cpu =
        quantize_tensorwise(x, &[x.len()], elem, pow2, "x").map_err(|e| format!("CPU: {e}"))?;
    gpu(q.check_finite(ctx, "x"))?;
    let (amax_g, scale, scale_inv) = gpu(q.read_scales(ctx))?;
    let mut bad = Vec::new();
    if amax_g.to_bits() != amax(x).to_bits() {
        bad.push(format!("amax {amax_g:e} vs {:e}", amax(x)));
    }
    if scale.to_bits() != cpu.scale.to_bits() {
        bad.push(format!("scale {scale:e} vs {:e}", cpu.scale));
    }
    if scale_inv.to_bits() != cpu.scale_inv.to_bits() {
        bad.push(format!("scale_inv {scale_inv:e} vs {:e}", cpu.scale_inv));
    }
    let codes: Vec<u8> = gpu(ctx.download(&q.codes, x.len()))?;
    if let Some(i) = first_diff(&codes, &cpu.codes) {
        bad.push(format!(
            "code {i} (x = {:e}): gpu {:#04x} cpu {:#04x}",
            x[i], codes[i], cpu.codes[i]
        ));
    }
    let want = cpu.dequantize();
    let got: Vec<f32> = {
        let d = gpu(ctx.dequantize_fp8(&q, DType::F32))?;
        gpu(ctx.download(&d, x.len()))?
    };
    if let Some(i) = (0..x.len()).find(|&i| !same_f32(got[i], want[i])) {
        bad.push(format!(
            "dequantized {i}: gpu {:e} cpu {:e}",
            got[i], want[i]
        ));
    }
    none_bad(bad, || {
        format!("{elem} {} pow2={pow2} n={}", dtype_name(dtype), x.len())
    })
}

pub fn check_fp8(ctx: &CudaContext, rep: &mut Report) {
    // Sizes around the 8-element vectors, the 16-element cast groups and the
    // amax grid (one CTA per 256 vectors, at most 8 per SM).
    let sizes = [
        0usize,
        1,
        7,
        15,
        17,
        31,
        33,
        993,
        65_537,
        (1 << 20) + 9,
        (1 << 23) + 3,
    ];
    rep.check("fp8 tensorwise quantize", || {
        let mut cases = Cases::new(
            format!("cases (f32/bf16 input x 4 formats x pow2 on/off x sizes {sizes:?}): amax, scale, scale_inv, codes, dequantized bit-exact"),
            "differ".into(),
        );
        for (si, &n) in sizes.iter().enumerate() {
            // Two data sets: plain normals, and normals over a wide exponent range.
            let plain = normal_data(n, 77 + si as u64, 3.0);
            let wide = mx_data(1, n, 99 + si as u64, false);
            for x in [&plain, &wide] {
                for dtype in [DType::F32, DType::BF16] {
                    for elem in FP8_FORMATS {
                        for pow2 in [false, true] {
                            cases.add(compare_fp8(ctx, x, dtype, elem, pow2));
                        }
                    }
                }
            }
        }
        cases.result()
    });

    // The golden amax -> scale table (torchao's amax_to_scale).
    rep.check("fp8 golden amax->scale", || {
        let g: Value =
            serde_json::from_str(FP8_SCALES_GOLDEN).map_err(|e| format!("parse: {e}"))?;
        let rows = g["scales"].as_array().cloned().unwrap_or_default();
        let mut bad = Vec::new();
        let mut n = 0;
        for row in &rows {
            let a = f32::from_bits(hex(&row["amax_f32_bits"]));
            let xd = gpu(ctx.upload(&[a, -a * 0.5]))?;
            for (name, elem) in [("e4m3fn", ElemFormat::E4M3FN), ("e5m2", ElemFormat::E5M2)] {
                for (col, pow2) in [("torchao", false), ("torchao_pow2", true)] {
                    let q = gpu(ctx.quantize_fp8_of(&xd, DType::F32, 2, elem, pow2))?;
                    let (_, s, _) = gpu(q.read_scales(ctx))?;
                    let want = f32::from_bits(hex(&row[name][col]["scale_f32_bits"]));
                    let cpu = amax_to_scale(a, elem, pow2);
                    n += 1;
                    if !same_f32(s, want) || !same_f32(s, cpu) {
                        bad.push(format!(
                            "{name} {col} amax {a:e}: gpu {s:e} golden {want:e} cpu {cpu:e}"
                        ));
                    }
                }
            }
        }
        if bad.is_empty() {
            Ok(format!("{n} scales equal the golden torchao column"))
        } else {
            Err(bad.join("; "))
        }
    });

    // A non-finite amax is an error on both backends (SPEC section 3).
    rep.check("fp8 non-finite amax", || {
        let mut msgs = Vec::new();
        for bad_value in [f32::NAN, f32::INFINITY] {
            let mut x = normal_data(1000, 5, 1.0);
            x[517] = bad_value;
            let xd = gpu(ctx.upload(&x))?;
            let q = gpu(ctx.quantize_fp8_of(&xd, DType::F32, x.len(), ElemFormat::E4M3FN, false))?;
            let g = q.check_finite(ctx, "layer0.x");
            let c = quantize_tensorwise(&x, &[1000], ElemFormat::E4M3FN, false, "layer0.x");
            match (g, c) {
                (Err(ge), Err(_)) => msgs.push(format!("{bad_value}: \"{ge}\"")),
                (g, c) => {
                    return Err(format!(
                        "{bad_value}: gpu error {} cpu error {}",
                        g.is_err(),
                        c.is_err()
                    ))
                }
            }
        }
        Ok(format!("both backends refuse: {}", msgs.join(", ")))
    });
}
