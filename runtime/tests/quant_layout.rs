//! Axis, padding, tile and Hadamard behaviour of the MX quantizer, checked
//! against the plain 1x32 row quantizer (which the golden tests pin down).

use mxswitch_runtime::formats::ElemFormat;
use mxswitch_runtime::quant::hadamard::hadamard16_inplace;
use mxswitch_runtime::quant::mx::swap_last_two;
use mxswitch_runtime::quant::{quantize_mx, quantize_rows, scale_byte, MxConfig, ScaleMode};
use mxswitch_runtime::Error;

/// Deterministic values with a spread of magnitudes.
fn data(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let u = ((i as u32).wrapping_mul(2_654_435_761) >> 8) as f32 / 16_777_216.0;
            (u - 0.5) * (1 + i % 7) as f32 * if i % 13 == 0 { 20.0 } else { 1.0 }
        })
        .collect()
}

#[test]
fn quantizing_along_axis_0_equals_quantizing_the_transpose() {
    let (r, c) = (40, 3);
    let x = data(r * c);
    for cfg in [MxConfig::mxfp4(), MxConfig::mxfp8()] {
        let q = quantize_mx(&x, &[r, c], 0, &cfg).unwrap();
        let xt = swap_last_two(&x, 1, r, c); // [c, r]
        let qt = quantize_mx(&xt, &[c, r], -1, &cfg).unwrap();
        assert_eq!(q.codes, qt.codes);
        assert_eq!(q.scales, qt.scales);
        let cb = q.codes_shape()[0];
        assert_eq!(q.codes_shape(), vec![cb, c]);
        assert_eq!(q.scales_shape(), vec![2, c]);
        assert_eq!(
            q.codes_in_input_layout(),
            swap_last_two(&qt.codes, 1, c, cb)
        );
        assert_eq!(q.dequantize(), swap_last_two(&qt.dequantize(), 1, c, r));
    }
}

#[test]
fn padding_is_zeros() {
    let (rows, len) = (3, 40);
    let x = data(rows * len);
    let mut padded = vec![0.0f32; rows * 64];
    for r in 0..rows {
        padded[r * 64..r * 64 + len].copy_from_slice(&x[r * len..(r + 1) * len]);
    }
    for cfg in [MxConfig::mxfp4(), MxConfig::mxfp8()] {
        let q = quantize_rows(&x, rows, len, &cfg).unwrap();
        let qp = quantize_rows(&padded, rows, 64, &cfg).unwrap();
        assert_eq!(q.padded_len, 64);
        assert_eq!(q.codes, qp.codes);
        assert_eq!(q.scales, qp.scales);
        assert_eq!(
            q.codes_shape(),
            vec![rows, 64 * cfg.elem.bits() as usize / 8]
        );
        assert_eq!(q.scales_shape(), vec![rows, 2]);
        let d = q.dequantize();
        assert_eq!(d.len(), rows * len);
        let dp = qp.dequantize();
        for r in 0..rows {
            assert_eq!(d[r * len..(r + 1) * len], dp[r * 64..r * 64 + len]);
        }
    }
}

#[test]
fn batched_tensor_along_a_middle_axis() {
    let shape = [2, 35, 4];
    let x = data(2 * 35 * 4);
    let cfg = MxConfig::mxfp4();
    let q = quantize_mx(&x, &shape, 1, &cfg).unwrap();
    assert_eq!(q.codes_shape(), vec![2, 32, 4]);
    assert_eq!(q.scales_shape(), vec![2, 2, 4]);
    // Each batch on its own, moved axis-last by hand.
    for b in 0..2 {
        let xb = &x[b * 140..(b + 1) * 140];
        let rows = swap_last_two(xb, 1, 35, 4); // [4, 35]
        let qb = quantize_rows(&rows, 4, 35, &cfg).unwrap();
        assert_eq!(q.scales[b * 8..(b + 1) * 8], qb.scales[..]);
        assert_eq!(q.codes[b * 128..(b + 1) * 128], qb.codes[..]);
    }
    let back = q.dequantize();
    assert_eq!(back.len(), x.len());
}

#[test]
fn tiles_share_one_scale_over_32_rows() {
    let (rows, cols) = (70, 64);
    let x = data(rows * cols);
    for mode in ScaleMode::ALL {
        let cfg = MxConfig {
            tile2d: true,
            scale_mode: mode,
            ..MxConfig::mxfp4()
        };
        let q = quantize_mx(&x, &[rows, cols], -1, &cfg).unwrap();
        let nb = cols / 32;
        for r0 in (0..rows).step_by(32) {
            for b in 0..nb {
                let tile_amax = (r0..(r0 + 32).min(rows))
                    .flat_map(|r| x[r * cols + b * 32..r * cols + b * 32 + 32].iter())
                    .fold(0.0f32, |m, v| m.max(v.abs()));
                let want = scale_byte(mode, tile_amax, ElemFormat::E2M1);
                for r in r0..(r0 + 32).min(rows) {
                    assert_eq!(q.scales[r * nb + b], want, "{mode} tile ({r0},{b}) row {r}");
                }
            }
        }
        // A tile's scale is never below the block's own: no element saturates harder.
        let plain = quantize_mx(
            &x,
            &[rows, cols],
            -1,
            &MxConfig {
                tile2d: false,
                ..cfg
            },
        )
        .unwrap();
        assert!(q.scales.iter().zip(&plain.scales).all(|(t, p)| t >= p));
    }
}

#[test]
fn hadamard_quantizes_the_rotated_tensor_and_rotates_back() {
    let (rows, len) = (4, 48);
    let x = data(rows * len);
    let cfg = MxConfig {
        hadamard: true,
        ..MxConfig::mxfp4()
    };
    let q = quantize_rows(&x, rows, len, &cfg).unwrap();
    // Reference: pad to 64, rotate each group of 16, quantize without the option.
    let mut rotated = vec![0.0f32; rows * 64];
    for r in 0..rows {
        rotated[r * 64..r * 64 + len].copy_from_slice(&x[r * len..(r + 1) * len]);
        hadamard16_inplace(&mut rotated[r * 64..(r + 1) * 64]);
    }
    let qr = quantize_rows(&rotated, rows, 64, &MxConfig::mxfp4()).unwrap();
    assert_eq!(q.codes, qr.codes);
    assert_eq!(q.scales, qr.scales);
    assert_eq!(q.dequantize_rows(), qr.dequantize());
    // Rotated back, the dequantized tensor approximates the input (MXFP4 SQNR > 10 dB).
    let d = q.dequantize();
    let sig: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum();
    let err: f64 = x
        .iter()
        .zip(&d)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum();
    let sqnr = 10.0 * (sig / err).log10();
    assert!(sqnr > 10.0, "SQNR {sqnr:.1} dB");
}

#[test]
fn bad_requests_are_errors() {
    let x = data(64);
    let cfg = MxConfig::mxfp4();
    assert!(matches!(
        quantize_mx(&x, &[8, 8], 2, &cfg),
        Err(Error::AxisOutOfRange { axis: 2, rank: 2 })
    ));
    assert!(matches!(
        quantize_mx(&x, &[8, 8], -3, &cfg),
        Err(Error::AxisOutOfRange { .. })
    ));
    assert!(matches!(
        quantize_mx(&x, &[8, 9], -1, &cfg),
        Err(Error::Shape(_))
    ));
    let tiled = MxConfig {
        tile2d: true,
        ..cfg
    };
    assert!(matches!(
        quantize_mx(&x, &[2, 4, 8], -1, &tiled),
        Err(Error::InvalidOption(_))
    ));
    let e5m2 = MxConfig {
        elem: ElemFormat::E5M2,
        ..cfg
    };
    assert!(matches!(
        quantize_rows(&x, 2, 32, &e5m2),
        Err(Error::InvalidOption(_))
    ));
}
