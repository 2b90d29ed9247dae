//! Bit-exact checks of the NVFP4 and FP8 rowwise / 128-block quantizers
//! (SPEC sections 2b and 3b) against the golden vectors in `tests/golden/`:
//! `nvfp4_blocks.json` (made by `gen_golden_nvfp4.py`: torchao's own
//! `nvfp4_quantize` where torchao was available, its numpy reference of SPEC
//! 2b otherwise, as the file's `source` says) and `fp8_rowwise.json` /
//! `fp8_block.json` (made by `gen_golden_groups.py` with numpy and
//! ml_dtypes). Every tensor scale, scale byte or value, code, packed byte and
//! dequantized value must match exactly.

use mxswitch_runtime::quant::{
    quantize_fp8_group_rows, quantize_nvfp4_rows, Fp8GroupConfig, Grouping, Nvfp4Config,
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

/// A list of rows of hex strings, flattened row-major.
fn hex_rows(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected a list of rows, got {v}"))
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(hex))
        .collect()
}

fn f32_rows(v: &Value) -> Vec<f32> {
    hex_rows(v).into_iter().map(f32::from_bits).collect()
}

fn bytes_rows(v: &Value) -> Vec<u8> {
    hex_rows(v).into_iter().map(|b| b as u8).collect()
}

fn usize_of(v: &Value) -> usize {
    v.as_u64()
        .unwrap_or_else(|| panic!("expected a count, got {v}")) as usize
}

/// Bit patterns of f32s, where the first mismatch is reported by index.
fn assert_bits(got: &[f32], want: &[u32], ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}: length");
    for (i, (g, &w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w,
            "{ctx}[{i}]: got {g:e} (0x{:08x}), want {:e} (0x{w:08x})",
            g.to_bits(),
            f32::from_bits(w)
        );
    }
}

#[test]
fn nvfp4_blocks_bit_exact() {
    let g = load("nvfp4_blocks.json");
    let source = g["source"].as_str().unwrap();
    assert!(
        source == "numpy reference of SPEC 2b" || source.starts_with("torchao 0.18."),
        "unexpected source {source}"
    );
    let vectors = g["vectors"].as_array().unwrap();
    assert_eq!(vectors.len(), 17);
    for v in vectors {
        let name = v["name"].as_str().unwrap();
        let ctx = format!("nvfp4_blocks.json ({source}) vector {name}");
        let (rows, len) = (usize_of(&v["rows"]), usize_of(&v["len"]));
        let cfg = Nvfp4Config {
            tile2d: v["tile2d"].as_bool().unwrap(),
            hadamard: v["hadamard"].as_bool().unwrap(),
            sr: None,
        };
        let x = f32_rows(&v["input_f32_bits"]);
        assert_eq!(x.len(), rows * len, "{ctx}: input");
        let q = quantize_nvfp4_rows(&x, rows, len, &cfg).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(
            q.padded_len,
            usize_of(&v["padded_len"]),
            "{ctx}: padded_len"
        );
        assert_eq!(
            q.tensor_scale.to_bits(),
            hex(&v["tensor_scale_f32_bits"]),
            "{ctx}: tensor scale {:e}",
            q.tensor_scale
        );
        assert_eq!(
            q.scales,
            bytes_rows(&v["scale_bytes"]),
            "{ctx}: scale bytes"
        );
        assert_eq!(
            q.codes,
            bytes_rows(&v["packed_bytes"]),
            "{ctx}: packed bytes"
        );
        let unpacked: Vec<u8> = q.codes.iter().flat_map(|b| [b & 0xF, b >> 4]).collect();
        assert_eq!(unpacked, bytes_rows(&v["codes"]), "{ctx}: codes");
        let want = hex_rows(&v["dequantized_f32_bits"]);
        assert_bits(&q.dequantize_rows(), &want, &format!("{ctx}: dequantized"));
        if !cfg.hadamard {
            // In the input domain: the same values without the padding.
            let pl = q.padded_len;
            let unpadded: Vec<u32> = (0..rows * len)
                .map(|i| want[(i / len) * pl + i % len])
                .collect();
            assert_bits(&q.dequantize(), &unpadded, &format!("{ctx}: dequantize()"));
        }
    }
}

/// Every vector of one FP8 group file under each of its modes.
fn check_fp8_groups(file: &str, rowwise: bool, nvectors: usize) {
    let g = load(file);
    let vectors = g["vectors"].as_array().unwrap();
    assert_eq!(vectors.len(), nvectors, "{file}: vectors");
    let mut checked = 0;
    for v in vectors {
        let name = v["name"].as_str().unwrap();
        let (rows, len) = (usize_of(&v["rows"]), usize_of(&v["len"]));
        let x = f32_rows(&v["input_f32_bits"]);
        assert_eq!(x.len(), rows * len, "{file} {name}: input");
        for (mode, tile2d, pow2) in [
            ("exact", false, false),
            ("pow2", false, true),
            ("tile2d_exact", true, false),
            ("tile2d_pow2", true, true),
        ] {
            let want = &v[mode];
            if want.is_null() {
                continue;
            }
            assert!(!(rowwise && tile2d), "{file} {name}: rowwise has no tiles");
            let grouping = if rowwise {
                Grouping::Rowwise
            } else {
                Grouping::Block128 { tile2d }
            };
            let cfg = Fp8GroupConfig { grouping, pow2 };
            let ctx = format!("{file} vector {name} mode {mode}");
            let q = quantize_fp8_group_rows(&x, rows, len, &cfg)
                .unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert_eq!(
                q.padded_len,
                usize_of(&want["padded_len"]),
                "{ctx}: padded_len"
            );
            assert_eq!(
                q.group_len,
                usize_of(&want["group_len"]),
                "{ctx}: group_len"
            );
            assert_bits(
                &q.scales,
                &hex_rows(&want["scales_f32_bits"]),
                &format!("{ctx}: scales"),
            );
            assert_bits(
                &q.scale_inv,
                &hex_rows(&want["scale_inv_f32_bits"]),
                &format!("{ctx}: scale_inv"),
            );
            // The golden codes and values are the real elements, [rows, len].
            let pl = q.padded_len;
            let real: Vec<u8> = (0..rows * len)
                .map(|i| q.codes[(i / len.max(1)) * pl + i % len.max(1)])
                .collect();
            assert_eq!(real, bytes_rows(&want["codes"]), "{ctx}: codes");
            for r in 0..rows {
                assert!(
                    q.codes[r * pl + len..(r + 1) * pl].iter().all(|&c| c == 0),
                    "{ctx}: padding codes of row {r}"
                );
            }
            assert_bits(
                &q.dequantize(),
                &hex_rows(&want["dequantized_f32_bits"]),
                &format!("{ctx}: dequantized"),
            );
            checked += 1;
        }
    }
    assert!(
        checked >= nvectors * if rowwise { 2 } else { 4 } - 3,
        "{file}: {checked} modes"
    );
}

#[test]
fn fp8_rowwise_bit_exact() {
    check_fp8_groups("fp8_rowwise.json", true, 12);
}

#[test]
fn fp8_block_bit_exact() {
    check_fp8_groups("fp8_block.json", false, 13);
}

/// The defaults the golden files call the recipes' defaults.
#[test]
fn fp8_group_defaults_match_the_golden_descriptions() {
    assert!(Fp8GroupConfig::rowwise().pow2);
    assert!(!Fp8GroupConfig::block128().pow2);
    assert_eq!(
        Fp8GroupConfig::block128_tiles().grouping,
        Grouping::Block128 { tile2d: true }
    );
}
