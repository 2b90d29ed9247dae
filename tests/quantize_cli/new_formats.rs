//! NVFP4, FP8 rowwise and FP8 128-block (SPEC sections 2b and 3b).

use super::*;

use mxswitch::runtime::quant::{
    quantize_fp8_groups, quantize_nvfp4, Fp8GroupConfig, Grouping, Nvfp4Config,
};

/// Bytes of little-endian f32 values.
fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The saturated column as the table prints a fraction.
fn fraction_column(count: usize, total: usize) -> String {
    let f = count as f64 / total as f64;
    if f == 0.0 {
        "0".into()
    } else if f >= 1e-4 {
        format!("{f:.4}")
    } else {
        // `2.56e-05`: two digits, a signed two-digit exponent.
        let s = format!("{f:.2e}");
        let (mantissa, exp) = s.split_once('e').unwrap();
        let exp: i32 = exp.parse().unwrap();
        format!("{mantissa}e-{:02}", -exp)
    }
}

#[test]
fn nvfp4_writes_codes_scales_tensor_scale_and_dequant_as_the_library_quantizes() {
    let dir = TempDir::new().unwrap();
    let (rows, len) = (5, 40);
    let x = spread(rows * len, 21);
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&[rows, len], &x))],
    );
    for (args, axis, tile2d, hadamard, codes_shape, scales_shape) in [
        (vec![], -1, false, false, [5, 24], [5, 3]),
        (vec!["--axis", "0"], 0, false, false, [8, 40], [1, 40]),
        (vec!["--tile2d"], -1, true, false, [5, 24], [5, 3]),
        (
            vec!["--hadamard", "--axis", "-2"],
            -2,
            false,
            true,
            [8, 40],
            [1, 40],
        ),
    ] {
        let output = dir.path().join("out.safetensors");
        let mut all = vec!["--format", "nvfp4"];
        all.extend(&args);
        let out = quantize(&all, &input, &output);
        assert_ok(&out);
        let cfg = Nvfp4Config {
            tile2d,
            hadamard,
            sr: None,
        };
        let q = quantize_nvfp4(&x, &[rows, len], axis, &cfg).unwrap();
        let t = read_output(&output);
        let names: BTreeSet<&str> = t.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            BTreeSet::from(["w.codes", "w.scales", "w.tensor_scale", "w.dequant"]),
            "{args:?}"
        );
        // Packed E2M1 codes (as mxfp4), the axis padded to 16 and halved.
        let codes = &t["w.codes"];
        assert_eq!(
            (codes.dtype, codes.shape.as_slice()),
            (Dtype::U8, &codes_shape[..]),
            "{args:?}"
        );
        assert_eq!(codes.shape, q.codes_shape());
        assert_eq!(codes.data, q.codes_in_input_layout(), "{args:?}");
        // One E4M3 byte per 1x16 block (a tile's byte repeated over its rows).
        let scales = &t["w.scales"];
        assert_eq!(
            (scales.dtype, scales.shape.as_slice()),
            (Dtype::U8, &scales_shape[..]),
            "{args:?}"
        );
        assert_eq!(scales.data, q.scales_in_input_layout(), "{args:?}");
        let ts = &t["w.tensor_scale"];
        assert_eq!((ts.dtype, ts.shape.as_slice()), (Dtype::F32, &[1][..]));
        assert_eq!(ts.values()[0].to_bits(), q.tensor_scale.to_bits());
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        if !hadamard {
            assert_eq!(ts.values()[0], amax / 2688.0, "t = A / (448 * 6)");
        }
        let dequant = &t["w.dequant"];
        assert_eq!(dequant.shape, [rows, len]);
        assert_eq!(f32_bits(&dequant.values()), f32_bits(&q.dequantize()));
        // The table: SQNR and the saturated fraction of the library's count.
        let row = table_row(&out, "w");
        assert!(row.contains(&"nvfp4".to_string()), "{row:?}");
        let sqnr = sqnr_db(&x, &dequant.values());
        assert_eq!(sqnr_column(&row), format!("{sqnr:.2}"));
        assert!(sqnr > 15.0, "{args:?}: {sqnr}");
        assert_eq!(
            row[row.len() - 1],
            fraction_column(q.count_saturated(&x), x.len()),
            "{args:?}"
        );
        let meta = output_metadata(&output);
        assert_eq!(meta["mxswitch.format"], "nvfp4");
        assert_eq!(meta["mxswitch.axis"], axis.to_string());
        assert_eq!(meta["mxswitch.tile2d"], tile2d.to_string());
        assert_eq!(meta["mxswitch.hadamard"], hadamard.to_string());
        assert!(!meta.contains_key("mxswitch.scale_mode"));
        assert!(!meta.contains_key("mxswitch.pow2"));
    }
}

#[test]
fn fp8_rowwise_writes_one_f32_scale_per_row_pow2_by_default() {
    let dir = TempDir::new().unwrap();
    let (rows, len) = (6, 50);
    let x = spread(rows * len, 22);
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&[rows, len], &x))],
    );
    for (args, axis, pow2, scales_shape) in [
        (vec![], -1, true, [6, 1]),
        (vec!["--pow2", "false"], -1, false, [6, 1]),
        (vec!["--axis", "0", "--pow2", "true"], 0, true, [1, 50]),
    ] {
        let output = dir.path().join("out.safetensors");
        let mut all = vec!["--format", "fp8-rowwise"];
        all.extend(&args);
        let out = quantize(&all, &input, &output);
        assert_ok(&out);
        let cfg = Fp8GroupConfig {
            grouping: Grouping::Rowwise,
            pow2,
        };
        let q = quantize_fp8_groups(&x, &[rows, len], axis, &cfg).unwrap();
        let t = read_output(&output);
        let names: BTreeSet<&str> = t.keys().map(String::as_str).collect();
        assert_eq!(names, BTreeSet::from(["w.codes", "w.scales", "w.dequant"]));
        // E4M3 bytes in the input's shape (rows are never padded).
        let codes = &t["w.codes"];
        assert_eq!(
            (codes.dtype, codes.shape.as_slice()),
            (Dtype::U8, &[6, 50][..])
        );
        assert_eq!(codes.data, q.codes_in_input_layout(), "{args:?}");
        // F32 scales (not their inverses), the axis replaced by 1.
        let scales = &t["w.scales"];
        assert_eq!(
            (scales.dtype, scales.shape.as_slice()),
            (Dtype::F32, &scales_shape[..]),
            "{args:?}"
        );
        assert_eq!(scales.data, f32_bytes(&q.scales_in_input_layout()));
        let s = scales.values();
        assert_eq!(
            s.iter().all(|v| v.to_bits() & 0x7F_FFFF == 0),
            pow2,
            "{args:?}: power-of-two scales iff pow2, {s:?}"
        );
        // Row 0's scale is 448 / amax (rounded down to a power of two with pow2).
        if axis == -1 {
            let amax = x[..len].iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let exact = ((448.0f64 / amax as f64) as f32).to_bits();
            let want = if pow2 { exact & 0xFF80_0000 } else { exact };
            assert_eq!(s[0].to_bits(), want, "{args:?}");
        }
        let dequant = t["w.dequant"].values();
        assert_eq!(f32_bits(&dequant), f32_bits(&q.dequantize()));
        let row = table_row(&out, "w");
        assert!(row.contains(&"fp8-rowwise".to_string()), "{row:?}");
        let sqnr = sqnr_db(&x, &dequant);
        assert_eq!(sqnr_column(&row), format!("{sqnr:.2}"));
        assert!(sqnr > 25.0, "{sqnr}");
        assert_eq!(
            row[row.len() - 1],
            fraction_column(q.count_saturated(&x), x.len())
        );
        let meta = output_metadata(&output);
        assert_eq!(meta["mxswitch.pow2"], pow2.to_string());
        assert_eq!(meta["mxswitch.axis"], axis.to_string());
        assert!(!meta.contains_key("mxswitch.tile2d"));
        let summary = stdout(&out);
        let want = format!(
            "fp8-rowwise (axis {axis}{})",
            if pow2 { ", pow2" } else { "" }
        );
        assert!(summary.contains(&want), "{summary}");
    }
}

#[test]
fn fp8_block_pads_to_128_and_tiles_repeat_per_row_chunk() {
    let dir = TempDir::new().unwrap();
    let (rows, len) = (130, 300);
    let x = spread(rows * len, 23);
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&[rows, len], &x))],
    );
    for (args, axis, tile2d, pow2, codes_shape, scales_shape) in [
        (vec![], -1, false, false, [130, 384], [130, 3]),
        (vec!["--tile2d"], -1, true, false, [130, 384], [130, 3]),
        (
            vec!["--pow2", "true", "--axis", "0"],
            0,
            false,
            true,
            [256, 300],
            [2, 300],
        ),
    ] {
        let output = dir.path().join("out.safetensors");
        let mut all = vec!["--format", "fp8-block"];
        all.extend(&args);
        let out = quantize(&all, &input, &output);
        assert_ok(&out);
        let cfg = Fp8GroupConfig {
            grouping: Grouping::Block128 { tile2d },
            pow2,
        };
        let q = quantize_fp8_groups(&x, &[rows, len], axis, &cfg).unwrap();
        let t = read_output(&output);
        let codes = &t["w.codes"];
        assert_eq!(
            (codes.dtype, codes.shape.as_slice()),
            (Dtype::U8, &codes_shape[..]),
            "{args:?}"
        );
        assert_eq!(codes.data, q.codes_in_input_layout(), "{args:?}");
        let scales = &t["w.scales"];
        assert_eq!(
            (scales.dtype, scales.shape.as_slice()),
            (Dtype::F32, &scales_shape[..]),
            "{args:?}"
        );
        assert_eq!(scales.data, f32_bytes(&q.scales_in_input_layout()));
        let s = scales.values();
        if tile2d {
            // Rows 0..128 share each block column's scale, rows 128..130 theirs.
            for r in 0..rows {
                for k in 0..3 {
                    let tile0 = (r / 128) * 128;
                    assert_eq!(s[r * 3 + k], s[tile0 * 3 + k], "row {r} block {k}");
                }
            }
            assert_ne!(s[0], s[128 * 3], "two tiles, two scales");
        } else if axis == -1 {
            // Block (0, 2) covers elements 256..300 of row 0.
            let amax = x[256..300].iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert_eq!(s[2], (448.0f64 / amax as f64) as f32);
        }
        assert_eq!(s.iter().all(|v| v.to_bits() & 0x7F_FFFF == 0), pow2);
        let dequant = t["w.dequant"].values();
        assert_eq!(t["w.dequant"].shape, [rows, len]);
        assert_eq!(f32_bits(&dequant), f32_bits(&q.dequantize()));
        let row = table_row(&out, "w");
        assert!(row.contains(&"fp8-block".to_string()), "{row:?}");
        assert_eq!(sqnr_column(&row), format!("{:.2}", sqnr_db(&x, &dequant)));
        assert_eq!(
            row[row.len() - 1],
            fraction_column(q.count_saturated(&x), x.len())
        );
        let meta = output_metadata(&output);
        assert_eq!(meta["mxswitch.tile2d"], tile2d.to_string());
        assert_eq!(meta["mxswitch.pow2"], pow2.to_string());
        assert!(!meta.contains_key("mxswitch.hadamard"));
    }
}

#[test]
fn pow2_applies_to_tensorwise_fp8_too() {
    let dir = TempDir::new().unwrap();
    let mut x = noise(20, 3, 2.0);
    x[13] = -3.7;
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&[4, 5], &x))],
    );
    let output = dir.path().join("out.safetensors");
    assert_ok(&quantize(
        &["--format", "fp8-e4m3", "--pow2", "true"],
        &input,
        &output,
    ));
    let t = read_output(&output);
    // 448 / 3.7 = 121.08..., rounded down to 64.
    assert_eq!(t["w.scales"].values(), [64.0]);
    assert_eq!(output_metadata(&output)["mxswitch.pow2"], "true");
}

#[test]
fn flags_a_format_does_not_take_are_one_line_errors() {
    let dir = TempDir::new().unwrap();
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[
            ("w", Tensor::f32(&[4, 32], &noise(128, 5, 1.0))),
            ("b", Tensor::f32(&[32], &noise(32, 6, 1.0))),
        ],
    );
    let output = dir.path().join("out.safetensors");
    let cases: &[(&[&str], &str)] = &[
        (
            &["--format", "nvfp4", "--scale-mode", "rceil"],
            "--scale-mode applies only to mxfp4, mxfp8, not to nvfp4",
        ),
        (
            &["--format", "nvfp4", "--pow2", "true"],
            "--pow2 applies only to fp8-e4m3, fp8-e5m2, fp8-e4m3fnuz, fp8-e5m2fnuz, \
             fp8-rowwise, fp8-block, not to nvfp4",
        ),
        (
            &["--format", "fp8-rowwise", "--tile2d"],
            "--tile2d applies only to mxfp4, mxfp8, nvfp4, fp8-block, not to fp8-rowwise",
        ),
        (
            &["--format", "fp8-rowwise", "--hadamard"],
            "--hadamard applies only to mxfp4, mxfp8, nvfp4, not to fp8-rowwise",
        ),
        (
            &["--format", "fp8-rowwise", "--scale-mode", "floor"],
            "--scale-mode applies only to mxfp4, mxfp8, not to fp8-rowwise",
        ),
        (
            &["--format", "fp8-block", "--hadamard"],
            "--hadamard applies only to mxfp4, mxfp8, nvfp4, not to fp8-block",
        ),
        (
            &["--format", "fp8-block", "--scale-mode", "even"],
            "--scale-mode applies only to mxfp4, mxfp8, not to fp8-block",
        ),
        (
            &["--format", "mxfp4", "--pow2", "false"],
            "--pow2 applies only to fp8-e4m3",
        ),
        (
            &["--format", "fp8-e4m3", "--axis", "0"],
            "--axis applies only to mxfp4, mxfp8, nvfp4, fp8-rowwise, fp8-block, not to fp8-e4m3",
        ),
        // Rank-dependent: checked on the tensor that breaks it.
        (
            &["--format", "nvfp4", "--tile2d"],
            "tensor `b`: invalid option: 16x16 NVFP4 tiles need a 2-D tensor",
        ),
        (
            &["--format", "fp8-block", "--tile2d"],
            "tensor `b`: invalid option: 128x128 FP8 tiles need a 2-D tensor",
        ),
        (
            &["--format", "fp8-rowwise", "--axis", "2"],
            "tensor `b`: axis 2 is out of range",
        ),
        (&["--format", "fp8-block", "--pow2", "maybe"], "--pow2"),
    ];
    for (args, needle) in cases {
        assert_fails_cleanly(&quantize(args, &input, &output), needle);
        assert!(!output.exists(), "{args:?}");
    }
    // Checked before the file is read.
    assert_fails_cleanly(
        &quantize(
            &["--format", "fp8-rowwise", "--tile2d"],
            &dir.path().join("absent.safetensors"),
            &output,
        ),
        "--tile2d applies only",
    );
    assert_eq!(
        entries(dir.path()),
        BTreeSet::from(["in.safetensors".to_string()])
    );
}

/// Power-of-two FP8 scales round the scale down, so near f32's largest
/// value the inverse scale times a large code overflows (SPEC 3b): written
/// as the quantizer gives it, with a warning naming `--pow2 false`.
#[test]
fn an_fp8_pow2_overflow_is_written_with_a_warning() {
    let dir = TempDir::new().unwrap();
    let mut x: Vec<f32> = (0..64).map(|i| (i % 7) as f32 - 3.0).collect();
    x[9] = 3.4e38;
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&[2, 32], &x))],
    );
    let output = dir.path().join("out.safetensors");
    let out = quantize(&["--format", "fp8-rowwise"], &input, &output);
    assert_ok(&out);
    assert_eq!(
        stderr(&out),
        "warning: tensor `w` under power-of-two scales: 1 element(s) dequantize to Inf \
         (code times scale overflows f32); --pow2 false avoids it\n"
    );
    let dequant = read_output(&output)["w.dequant"].values();
    assert_eq!(dequant[9], f32::INFINITY);
    let out = quantize(
        &["--format", "fp8-rowwise", "--pow2", "false"],
        &input,
        &output,
    );
    assert_ok(&out);
    assert_eq!(stderr(&out), "");
    assert!(read_output(&output)["w.dequant"]
        .values()
        .iter()
        .all(|v| v.is_finite()));
}
