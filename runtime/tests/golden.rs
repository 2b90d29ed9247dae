//! Bit-exact checks against the golden vectors in `tests/golden/` (made by
//! `tests/golden/gen_golden.py` with numpy and ml_dtypes). Every bit pattern
//! of every format, every scalar cast, every MX block under every scale mode
//! and every tensorwise scale must match exactly.

use mxswitch_runtime::formats::{bf16, e8m0, ElemFormat};
use mxswitch_runtime::quant::{
    amax_to_scale, quantize_rows, quantize_tensorwise, MxConfig, ScaleMode,
};
use serde_json::Value;

fn load(name: &str) -> Value {
    let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {path}: {e}"))
}

fn hex(v: &Value) -> u32 {
    let s = v
        .as_str()
        .unwrap_or_else(|| panic!("expected a hex string, got {v}"));
    u32::from_str_radix(s.trim_start_matches("0x"), 16).unwrap()
}

fn f32_hex(v: &Value) -> f32 {
    f32::from_bits(hex(v))
}

/// A code given as a hex string; `null` (the codes of a NaN-scale block) is 0.
fn code(v: &Value) -> u8 {
    if v.is_null() {
        0
    } else {
        hex(v) as u8
    }
}

/// A value given as a JSON number or one of the strings of README.json.
fn value(v: &Value) -> f32 {
    match v {
        Value::String(s) => match s.as_str() {
            "nan" => f32::NAN,
            "inf" => f32::INFINITY,
            "-inf" => f32::NEG_INFINITY,
            "-0.0" => -0.0,
            other => panic!("unexpected value string {other}"),
        },
        v => v
            .as_f64()
            .unwrap_or_else(|| panic!("expected a number, got {v}")) as f32,
    }
}

/// Same f32, treating every NaN as equal (NaN payloads are not specified).
fn same_f32(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

fn elem(name: &str) -> ElemFormat {
    ElemFormat::ALL
        .into_iter()
        .find(|f| f.spec().name == name)
        .unwrap_or_else(|| panic!("unknown format {name}"))
}

#[test]
fn decode_tables_every_bit_pattern() {
    let g = load("fp_decode_tables.json");
    let mut checked = 0;
    for name in ["e4m3fn", "e5m2", "e2m1"] {
        let f = elem(name);
        for e in g["formats"][name]["entries"].as_array().unwrap() {
            let bits = e["bits"].as_u64().unwrap() as u8;
            let want = f32_hex(&e["f32_bits"]);
            let got = f.decode(bits);
            assert!(
                same_f32(got, want),
                "{name} 0x{bits:02x}: got {got:e}, want {want:e}"
            );
            checked += 1;
        }
    }
    for e in g["formats"]["e8m0"]["entries"].as_array().unwrap() {
        let bits = e["bits"].as_u64().unwrap() as u8;
        let want = f32_hex(&e["f32_bits"]);
        assert!(same_f32(e8m0::decode(bits), want), "e8m0 0x{bits:02x}");
        checked += 1;
    }
    assert_eq!(checked, 256 + 256 + 16 + 256);
}

#[test]
fn scalar_casts_satfinite() {
    let g = load("scalar_casts.json");
    let cases = g["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 199);
    let mut failures = Vec::new();
    for c in cases {
        let x = f32_hex(&c["input_f32_bits"]);
        for name in ["e4m3fn", "e5m2", "e2m1"] {
            let want = &c[name]["satfinite"];
            let got = elem(name).encode(x);
            // E2M1 has no NaN: the golden value is null there.
            if want.is_null() {
                assert!(x.is_nan(), "{name}: null only for NaN inputs");
                continue;
            }
            if got as u32 != hex(want) {
                failures.push(format!(
                    "{name} {x:e} ({}): got 0x{got:02x}, want {want}",
                    c["note"]
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn fnuz_tables_decode_and_casts() {
    let g = load("fp8_fnuz_tables.json");
    for name in ["e4m3fnuz", "e5m2fnuz"] {
        let f = elem(name);
        let fmt = &g["formats"][name];
        assert_eq!(fmt["max"].as_f64().unwrap() as f32, f.max_value());
        let decode_rows = fmt["decode"].as_array().unwrap();
        assert_eq!(decode_rows.len(), 256);
        for e in decode_rows {
            let bits = hex(&e["bits"]) as u8;
            let want = f32_hex(&e["f32_bits"]);
            assert!(same_f32(f.decode(bits), want), "{name} decode 0x{bits:02x}");
        }
        let casts = fmt["casts"].as_array().unwrap();
        assert_eq!(casts.len(), 199);
        for c in casts {
            let x = f32_hex(&c["input_f32_bits"]);
            let got = f.encode(x);
            assert_eq!(
                got as u32,
                hex(&c["satfinite"]),
                "{name} cast of {x:e} ({})",
                c["note"]
            );
        }
    }
}

/// Every block of one MX golden file, under all four scale modes.
fn check_mx_blocks(file: &str, cfg: MxConfig) {
    let g = load(file);
    let blocks = g["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 13);
    for b in blocks {
        let name = b["name"].as_str().unwrap();
        let x: Vec<f32> = b["input_f32_bits"]
            .as_array()
            .unwrap()
            .iter()
            .map(f32_hex)
            .collect();
        for mode in ScaleMode::ALL {
            let want = &b[mode.name()];
            let cfg = MxConfig {
                scale_mode: mode,
                ..cfg
            };
            let q = quantize_rows(&x, 1, 32, &cfg).unwrap();
            let ctx = format!("{file} block {name} mode {mode}");
            assert_eq!(
                q.scales,
                vec![want["scale_e8m0"].as_u64().unwrap() as u8],
                "{ctx}: scale"
            );
            // Codes of a NaN-scale block are 0 (the golden leaves them unspecified: null).
            let want_codes: Vec<u8> = match want["codes"].as_array() {
                Some(codes) => codes.iter().map(code).collect(),
                None => vec![0; 32],
            };
            if cfg.elem == ElemFormat::E2M1 {
                if let Some(packed) = want["packed_bytes_hex"].as_array() {
                    let packed: Vec<u8> = packed.iter().map(|h| hex(h) as u8).collect();
                    assert_eq!(q.codes, packed, "{ctx}: packed bytes");
                }
                let unpacked: Vec<u8> = q.codes.iter().flat_map(|b| [b & 0xF, b >> 4]).collect();
                assert_eq!(unpacked, want_codes, "{ctx}: codes");
            } else {
                assert_eq!(q.codes, want_codes, "{ctx}: codes");
            }
            let deq = q.dequantize();
            for (i, (got, w)) in deq
                .iter()
                .zip(want["dequantized"].as_array().unwrap())
                .enumerate()
            {
                let w = value(w);
                assert!(
                    same_f32(*got, w),
                    "{ctx}: dequantized[{i}] = {got:e}, want {w:e}"
                );
            }
        }
    }
}

#[test]
fn mxfp4_blocks_every_mode() {
    check_mx_blocks("mxfp4_blocks.json", MxConfig::mxfp4());
}

#[test]
fn mxfp8_blocks_every_mode() {
    check_mx_blocks("mxfp8_e4m3_blocks.json", MxConfig::mxfp8());
}

#[test]
fn tensorwise_scales_torchao() {
    let g = load("fp8_tensorwise_scales.json");
    for row in g["scales"].as_array().unwrap() {
        let amax = f32_hex(&row["amax_f32_bits"]);
        for (name, f) in [("e4m3fn", ElemFormat::E4M3FN), ("e5m2", ElemFormat::E5M2)] {
            for (col, pow2) in [("torchao", false), ("torchao_pow2", true)] {
                let want = f32_hex(&row[name][col]["scale_f32_bits"]);
                let got = amax_to_scale(amax, f, pow2);
                assert!(
                    same_f32(got, want),
                    "{name} {col} amax {amax:e}: got {got:e}, want {want:e}"
                );
            }
        }
    }
}

#[test]
fn tensorwise_example_tensor() {
    let g = load("fp8_tensorwise_scales.json");
    let ex = &g["example_tensor_torchao"];
    let x: Vec<f32> = ex["input_f32_bits"]
        .as_array()
        .unwrap()
        .iter()
        .map(f32_hex)
        .collect();
    for (key, f, pow2) in [
        ("e4m3fn", ElemFormat::E4M3FN, false),
        ("e4m3fn_pow2", ElemFormat::E4M3FN, true),
        ("e5m2", ElemFormat::E5M2, false),
        ("e5m2_pow2", ElemFormat::E5M2, true),
    ] {
        let want = &ex[key];
        let q = quantize_tensorwise(&x, &[x.len()], f, pow2, "example").unwrap();
        assert_eq!(
            q.scale.to_bits(),
            hex(&want["scale_f32_bits"]),
            "{key} scale"
        );
        assert_eq!(
            q.scale_inv.to_bits(),
            hex(&want["inverse_scale_f32_bits"]),
            "{key} inverse scale"
        );
        let codes: Vec<u8> = want["codes"].as_array().unwrap().iter().map(code).collect();
        assert_eq!(q.codes, codes, "{key} codes");
        let deq = q.dequantize();
        for (got, w) in deq.iter().zip(
            want["dequantized_code_times_inverse_scale"]
                .as_array()
                .unwrap(),
        ) {
            assert!(
                same_f32(*got, value(w)),
                "{key} dequantized: {got:e} vs {w}"
            );
        }
    }
}

#[test]
fn tensorwise_rejects_non_finite_amax_by_name() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let x = [1.0, bad, 2.0];
        let err = quantize_tensorwise(
            &x,
            &[3],
            ElemFormat::E4M3FN,
            false,
            "blocks.3.img_qkv.weight",
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("blocks.3.img_qkv.weight"), "{msg}");
        assert!(msg.contains("non-finite amax"), "{msg}");
    }
}

/// BF16 rounding of every scalar-cast input agrees with an independent f64
/// round-to-nearest-even on the 8-bit significand.
#[test]
fn bf16_round_trip_on_scalar_inputs() {
    let g = load("scalar_casts.json");
    for c in g["cases"].as_array().unwrap() {
        let x = f32_hex(&c["input_f32_bits"]);
        let got = bf16::round(x);
        if !x.is_finite() {
            assert!(same_f32(got, x), "{x:e}");
            continue;
        }
        // Independent reference: the two BF16 neighbours of x, and RNE between them.
        let lo = f32::from_bits(x.to_bits() & 0xFFFF_0000);
        let hi = f32::from_bits((x.to_bits() & 0xFFFF_0000) + 0x1_0000);
        // Above the largest BF16 the next step is 2^128, which rounds to Inf.
        let hi_f64 = if hi.is_infinite() {
            hi.signum() as f64 * 2f64.powi(128)
        } else {
            hi as f64
        };
        let (dl, dh) = ((x as f64 - lo as f64).abs(), (hi_f64 - x as f64).abs());
        let want = if dl < dh || (dl == dh && (lo.to_bits() >> 16) & 1 == 0) {
            lo
        } else {
            hi
        };
        assert!(same_f32(got, want), "bf16({x:e}) = {got:e}, want {want:e}");
    }
}
