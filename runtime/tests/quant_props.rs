//! Property tests of the quantizers (proptest), with the bounds they promise.

use mxswitch_runtime::formats::{e8m0, ElemFormat};
use mxswitch_runtime::quant::hadamard::hadamard16_inplace;
use mxswitch_runtime::quant::{quantize_rows, quantize_tensorwise, MxConfig, ScaleMode, SrKey};
use proptest::prelude::*;

/// Rows of 64 values spread over 2^-20 .. 2^20 in magnitude, with zeros and
/// exact ties mixed in: wide enough to exercise every scale rule, narrow
/// enough that no dequantized value overflows f32 (that only happens for
/// scale bytes >= 253, which the golden blocks cover).
fn values(n: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(
        prop_oneof![
            8 => (-20i32..20, -1.0f32..1.0).prop_map(|(e, m)| m * 2f32.powi(e)),
            1 => Just(0.0f32),
            1 => (-8i32..8, 0u32..16).prop_map(|(e, k)| (k as f32 * 0.25) * 2f32.powi(e)),
        ],
        n,
    )
}

fn mx_configs() -> Vec<MxConfig> {
    let mut v = Vec::new();
    for base in [MxConfig::mxfp4(), MxConfig::mxfp8()] {
        for scale_mode in ScaleMode::ALL {
            v.push(MxConfig { scale_mode, ..base });
        }
    }
    v
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Distance from |q| to the next code up: the code step at q, in the
/// element's own units (normal: 2^(e - mbits); subnormal: 2^(1 - bias - mbits)).
fn code_step(elem: ElemFormat, q: f32) -> f64 {
    let s = elem.spec();
    let min_exp = 1 - s.bias;
    let e = (q.abs() as f64).log2().floor().max(min_exp as f64) as i32;
    2f64.powi(e - s.man_bits as i32)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Quantize(dequantize(q)) dequantizes to the same bits under every MX
    /// mode; FLOOR and EVEN also reproduce the codes and scales.
    #[test]
    fn mx_requantize_is_a_fixed_point(x in values(128)) {
        for cfg in mx_configs() {
            let q1 = quantize_rows(&x, 2, 64, &cfg).unwrap();
            let d1 = q1.dequantize();
            let q2 = quantize_rows(&d1, 2, 64, &cfg).unwrap();
            let d2 = q2.dequantize();
            prop_assert_eq!(bits(&d1), bits(&d2), "{:?}", cfg);
            if matches!(cfg.scale_mode, ScaleMode::Floor | ScaleMode::Even) {
                prop_assert_eq!(&q1.codes, &q2.codes, "{:?}", cfg);
                prop_assert_eq!(&q1.scales, &q2.scales, "{:?}", cfg);
            }
        }
    }

    /// Tensorwise FP8 with power-of-two scales is a fixed point too.
    ///
    /// With the exact quotient scale of SPEC section 3 it cannot be: the
    /// second amax is fl32(fmt_max * fl32(1 / scale)), and fmt_max divided by
    /// it rounds to a scale up to a few ulps from the first (three f32
    /// roundings of 2^-24 each). The codes then come out the same and each
    /// dequantized value moves by that scale drift: at most 4 ulps.
    #[test]
    fn fp8_requantize_is_a_fixed_point(x in values(256)) {
        for elem in [ElemFormat::E4M3FN, ElemFormat::E5M2, ElemFormat::E4M3FNUZ, ElemFormat::E5M2FNUZ] {
            for pow2 in [false, true] {
                let q1 = quantize_tensorwise(&x, &[256], elem, pow2, "x").unwrap();
                let d1 = q1.dequantize();
                let q2 = quantize_tensorwise(&d1, &[256], elem, pow2, "x").unwrap();
                let d2 = q2.dequantize();
                if pow2 {
                    prop_assert_eq!(bits(&d1), bits(&d2), "{} pow2", elem);
                } else {
                    prop_assert_eq!(&q1.codes, &q2.codes, "{}", elem);
                    for (a, b) in d1.iter().zip(&d2) {
                        let ulps = (a.to_bits() as i64 - b.to_bits() as i64).abs();
                        prop_assert!(ulps <= 4, "{elem}: {a:e} vs {b:e}");
                    }
                }
            }
        }
    }

    /// |x - dequant| <= step/2 * scale for every element that did not saturate.
    #[test]
    fn mx_error_is_at_most_half_a_step(x in values(128)) {
        for cfg in mx_configs() {
            let q = quantize_rows(&x, 4, 32, &cfg).unwrap();
            let d = q.dequantize();
            let max = cfg.elem.max_value();
            for (i, (&xi, &di)) in x.iter().zip(&d).enumerate() {
                let byte = q.scales[i / 32];
                let scale = e8m0::decode(byte) as f64;
                let scaled = xi * e8m0::reciprocal(byte);
                if scaled.abs() > max {
                    continue; // saturated
                }
                let bound = 0.5 * code_step(cfg.elem, scaled) * scale;
                let err = (xi as f64 - di as f64).abs();
                prop_assert!(err <= bound, "{:?} x={xi:e} dq={di:e} err={err:e} bound={bound:e}", cfg);
            }
        }
    }

    /// Tensorwise: the same bound plus the two f32 roundings (x * scale and
    /// code * scale_inv), each at most 2^-24 relative: slack 2^-22 |x|.
    #[test]
    fn fp8_error_is_at_most_half_a_step(x in values(256)) {
        for elem in [ElemFormat::E4M3FN, ElemFormat::E5M2] {
            let q = quantize_tensorwise(&x, &[256], elem, false, "x").unwrap();
            let d = q.dequantize();
            for (&xi, &di) in x.iter().zip(&d) {
                let scaled = xi * q.scale;
                if scaled.abs() > elem.max_value() {
                    continue;
                }
                let bound = 0.5 * code_step(elem, scaled) * q.scale_inv as f64 + 2f64.powi(-22) * (xi as f64).abs();
                let err = (xi as f64 - di as f64).abs();
                prop_assert!(err <= bound, "{elem} x={xi:e} dq={di:e} err={err:e} bound={bound:e}");
            }
        }
    }

    /// H(H(x)) = x up to f32 rounding: eight butterfly stages whose partial
    /// sums stay below 16 max|x|, so the error is below 2^-16 max|x| per group.
    #[test]
    fn hadamard_twice_is_identity(x in values(64)) {
        let mut y = x.clone();
        hadamard16_inplace(&mut y);
        hadamard16_inplace(&mut y);
        for (g, h) in x.chunks(16).zip(y.chunks(16)) {
            let m = g.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
            for (a, b) in g.iter().zip(h) {
                prop_assert!((*a as f64 - *b as f64).abs() <= m * 2f64.powi(-16), "{a:e} vs {b:e}");
            }
        }
    }
}

/// The mean of stochastically rounded copies of v equals v: with n
/// independent roundings between codes a step apart, the mean's standard
/// deviation is step * sqrt(p (1 - p) / n); we allow 5 of them.
#[test]
fn stochastic_rounding_is_unbiased() {
    let rows = 4096;
    for (elem, v) in [
        (ElemFormat::E2M1, 2.3f32),
        (ElemFormat::E2M1, 0.6),
        (ElemFormat::E2M1, -4.9),
        (ElemFormat::E4M3FN, 3.3),
    ] {
        // Element 0 of every block pins the scale to 1 (amax = max_value, EVEN).
        let mut x = vec![v; rows * 32];
        for r in 0..rows {
            x[r * 32] = elem.max_value();
        }
        let key = SrKey {
            seed: 1234,
            step: 7,
            tensor_id: 3,
        };
        let cfg = MxConfig {
            elem,
            scale_mode: ScaleMode::Even,
            sr: Some(key),
            ..MxConfig::mxfp4()
        };
        let q = quantize_rows(&x, rows, 32, &cfg).unwrap();
        assert!(
            q.scales.iter().all(|&b| b == 127),
            "{elem}: scale must be 1"
        );
        let d = q.dequantize();
        let samples: Vec<f64> = d
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 32 != 0)
            .map(|(_, &v)| v as f64)
            .collect();
        let n = samples.len() as f64;
        let mean = samples.iter().sum::<f64>() / n;
        let (lo, hi) = neighbours(elem, v);
        let p = (v as f64 - lo) / (hi - lo);
        let sigma = (hi - lo) * (p * (1.0 - p) / n).sqrt();
        assert!(
            samples.iter().all(|&s| s == lo || s == hi),
            "{elem}: only the two neighbours"
        );
        assert!(
            (mean - v as f64).abs() <= 5.0 * sigma,
            "{elem} v={v}: mean {mean} off by more than 5 sigma ({sigma:e})"
        );
        // Rounding to nearest would put every sample on one side: the test can fail.
        assert!(p > 0.05 && p < 0.95);
    }
}

/// The two codes' values that bracket v (v is not itself a code).
fn neighbours(elem: ElemFormat, v: f32) -> (f64, f64) {
    let mut vals: Vec<f64> = (0..=255u8)
        .filter(|&c| (c as u32) < (1 << elem.bits()))
        .map(|c| elem.decode(c) as f64)
        .filter(|x| x.is_finite())
        .collect();
    vals.sort_by(f64::total_cmp);
    let hi = *vals.iter().find(|&&x| x > v as f64).unwrap();
    let lo = *vals.iter().rev().find(|&&x| x < v as f64).unwrap();
    (lo, hi)
}

/// Same key, same bits; another step or tensor id, other bits.
#[test]
fn stochastic_rounding_is_reproducible_per_key() {
    let x: Vec<f32> = (0..64 * 32)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
        .collect();
    let run = |seed, step, tensor_id| {
        let cfg = MxConfig {
            sr: Some(SrKey {
                seed,
                step,
                tensor_id,
            }),
            ..MxConfig::mxfp4()
        };
        quantize_rows(&x, 64, 32, &cfg).unwrap().codes
    };
    let a = run(1, 2, 3);
    assert_eq!(a, run(1, 2, 3));
    assert_ne!(a, run(1, 3, 3));
    assert_ne!(a, run(1, 2, 4));
    assert_ne!(a, run(2, 2, 3));
    let rne = quantize_rows(&x, 64, 32, &MxConfig::mxfp4()).unwrap().codes;
    assert_ne!(a, rne, "stochastic rounding must differ from RNE somewhere");
}
