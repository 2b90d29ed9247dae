//! The FP8 2-D cast: codes and transposed codes, zero padding included,
//! for every format, both input types, pad_to 1 and 16, each orientation
//! alone; a NaN keeps the padding zero and makes the amax an error.

use mxswitch_runtime::cuda::quantize::{Fp8Device2d, Fp8Outputs};
use mxswitch_runtime::cuda::{CudaContext, DevBuf};
use mxswitch_runtime::formats::ElemFormat;
use mxswitch_runtime::quant::{amax, quantize_tensorwise};
use mxswitch_runtime::DType;

use crate::common::{
    device_input, dtype_name, first_diff, gpu, none_bad, normal_data, Cases, Report,
};
use crate::fp8::FP8_FORMATS;
use crate::mx::mx_data;

/// The codes a 2-D cast must write: the CPU's codes of the `[rows, cols]`
/// matrix zero-padded to `[rows_pad, cols_pad]`, and their transpose.
pub fn padded_codes(
    codes: &[u8],
    rows: usize,
    cols: usize,
    rows_pad: usize,
    cols_pad: usize,
) -> (Vec<u8>, Vec<u8>) {
    let mut out = vec![0u8; rows_pad * cols_pad];
    let mut out_t = vec![0u8; rows_pad * cols_pad];
    for r in 0..rows {
        for c in 0..cols {
            out[r * cols_pad + c] = codes[r * cols + c];
            out_t[c * rows_pad + r] = codes[r * cols + c];
        }
    }
    (out, out_t)
}

/// Where two code buffers first differ, as "name[row, col]: gpu .. want ..".
fn diff_2d(name: &str, got: &[u8], want: &[u8], width: usize) -> Option<String> {
    first_diff(got, want).map(|i| {
        format!(
            "{name}[{}, {}]: gpu {:#04x} want {:#04x}",
            i / width.max(1),
            i % width.max(1),
            got.get(i).copied().unwrap_or(0),
            want.get(i).copied().unwrap_or(0)
        )
    })
}

/// One 2-D cast against the CPU: scale state, codes and transposed codes
/// (padding included), for the orientations `outputs` asks for.
#[allow(clippy::too_many_arguments)]
fn compare_fp8_2d(
    ctx: &CudaContext,
    x: &[f32],
    rows: usize,
    cols: usize,
    dtype: DType,
    elem: ElemFormat,
    pad_to: usize,
    outputs: Fp8Outputs,
) -> Result<(), String> {
    let (xd, x) = device_input(ctx, x, dtype)?;
    let q: Fp8Device2d =
        gpu(ctx.quantize_fp8_2d(&xd, dtype, rows, cols, elem, false, pad_to, outputs))?;
    let cpu = quantize_tensorwise(&x, &[rows, cols], elem, false, "x")
        .map_err(|e| format!("CPU: {e}"))?;
    let (rp, cp) = (rows.next_multiple_of(pad_to), cols.next_multiple_of(pad_to));
    let mut bad = Vec::new();
    if q.padded != [rp, cp] {
        bad.push(format!("padded shape {}x{}", q.padded[0], q.padded[1]));
    }
    let (amax_g, scale, scale_inv) = gpu(q.read_scales(ctx))?;
    if amax_g.to_bits() != amax(&x).to_bits()
        || scale.to_bits() != cpu.scale.to_bits()
        || scale_inv.to_bits() != cpu.scale_inv.to_bits()
    {
        bad.push(format!(
            "scales (amax, scale, scale_inv) gpu ({amax_g:e}, {scale:e}, {scale_inv:e}) cpu ({:e}, {:e}, {:e})",
            amax(&x),
            cpu.scale,
            cpu.scale_inv
        ));
    }
    let (want, want_t) = padded_codes(&cpu.codes, rows, cols, rp, cp);
    for (name, buf, asked, want, width) in [
        ("codes", &q.codes, outputs.rows, &want, cp),
        ("codes_t", &q.codes_t, outputs.cols, &want_t, rp),
    ] {
        match (buf, asked) {
            (Some(b), true) => {
                let got: Vec<u8> = gpu(ctx.download(b, rp * cp))?;
                bad.extend(diff_2d(name, &got, want, width));
            }
            (None, false) => {}
            _ => bad.push(format!("{name} present unasked or missing")),
        }
    }
    none_bad(bad, || {
        format!("{elem} {} {rows}x{cols} pad_to {pad_to}", dtype_name(dtype))
    })
}

pub fn check_fp8_2d(ctx: &CudaContext, rep: &mut Report) {
    // Shapes: single rows and columns, tails of the 16-column groups and of
    // the 64x64 tiles, rows of a length that is a multiple of 8 but not 16
    // (vector loads with a partial group), and odd lengths (element loads).
    let shapes: [(usize, usize); 11] = [
        (1, 1),
        (1, 37),
        (5, 3),
        (17, 33),
        (64, 64),
        (65, 130),
        (100, 24),
        (3, 200),
        (130, 67),
        (128, 256),
        (257, 96),
    ];
    let both = Fp8Outputs {
        rows: true,
        cols: true,
    };
    // A NaN in the matrix: the padding stays the zero code and the amax is
    // an error, as for the 1-D quantizer.
    rep.check("fp8 2-D cast non-finite amax", || {
        let (rows, cols) = (5usize, 13usize);
        let mut x = normal_data(rows * cols, 9, 1.0);
        x[17] = f32::NAN;
        let xd = gpu(ctx.upload(&x))?;
        let q = gpu(ctx.quantize_fp8_2d(
            &xd,
            DType::F32,
            rows,
            cols,
            ElemFormat::E4M3FN,
            false,
            16,
            both,
        ))?;
        let [rp, cp] = q.padded;
        let pad_nonzero = |b: &Option<DevBuf>, width: usize, real_r: usize, real_c: usize| {
            let v: Vec<u8> = b
                .as_ref()
                .map(|b| gpu(ctx.download(b, rp * cp)))
                .transpose()?
                .unwrap_or_default();
            Ok::<usize, String>(
                v.iter()
                    .enumerate()
                    .filter(|&(i, &c)| (i / width >= real_r || i % width >= real_c) && c != 0)
                    .count(),
            )
        };
        let n1 = pad_nonzero(&q.codes, cp, rows, cols)?;
        let n2 = pad_nonzero(&q.codes_t, rp, cols, rows)?;
        let err = q.check_finite(ctx, "layer0.x");
        if n1 + n2 > 0 || err.is_ok() {
            return Err(format!(
                "{n1} + {n2} non-zero padding codes, check_finite error: {}",
                err.is_err()
            ));
        }
        Ok(format!(
            "padding stays zero, amax is an error: \"{}\"",
            err.err().map(|e| e.to_string()).unwrap_or_default()
        ))
    });

    rep.check("fp8 2-D cast (codes + transposed codes)", || {
        let mut cases = Cases::new(
            format!("cases (f32/bf16 x 4 formats x pad_to 1/16, and each orientation alone; shapes {shapes:?}): scales, codes and transposed codes with zero padding bit-exact"),
            "differ".into(),
        );
        for (si, &(rows, cols)) in shapes.iter().enumerate() {
            // Tensorwise FP8 needs a finite amax (the non-finite case is its
            // own check below); mx_data's widest rows overflow f32 or, rounded to BF16, become Inf.
            let wide: Vec<f32> = mx_data(rows, cols, 300 + si as u64, false)
                .into_iter()
                .map(|v| if v.abs() < 2f32.powi(127) { v } else { 0.0 })
                .collect();
            for dtype in [DType::F32, DType::BF16] {
                for elem in FP8_FORMATS {
                    for pad_to in [1usize, 16] {
                        cases.add(compare_fp8_2d(
                            ctx, &wide, rows, cols, dtype, elem, pad_to, both,
                        ));
                    }
                }
                // One orientation at a time.
                for outputs in [
                    Fp8Outputs {
                        rows: true,
                        cols: false,
                    },
                    Fp8Outputs {
                        rows: false,
                        cols: true,
                    },
                ] {
                    let e4 = ElemFormat::E4M3FN;
                    cases.add(compare_fp8_2d(
                        ctx, &wide, rows, cols, dtype, e4, 16, outputs,
                    ));
                }
            }
        }
        cases.result()
    });
}
