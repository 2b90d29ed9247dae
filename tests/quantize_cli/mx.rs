//! MXFP4 and MXFP8 codes, scales and layouts, 32x32 tiles, tensorwise FP8,
//! the Hadamard, and non-finite input refused alike by every format.

use super::*;

#[test]
fn mxfp4_along_last_axis_pads_packs_and_scales_in_input_layout() {
    let dir = TempDir::new().unwrap();
    let (rows, len) = (3, 40);
    let mut x = Vec::new();
    for r in 0..rows {
        for j in 0..len {
            x.push(e2m1_pattern(r, j).0);
        }
    }
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&[rows, len], &x))],
    );
    let output = dir.path().join("out.safetensors");
    let out = quantize(&["--format", "mxfp4"], &input, &output);
    assert_ok(&out);

    let t = read_output(&output);
    let names: BTreeSet<&str> = t.keys().map(String::as_str).collect();
    assert_eq!(names, BTreeSet::from(["w.codes", "w.scales", "w.dequant"]));

    // 40 padded to 64, two E2M1 codes per byte: [3, 32].
    let codes = &t["w.codes"];
    assert_eq!(
        (codes.dtype, codes.shape.as_slice()),
        (Dtype::U8, &[3, 32][..])
    );
    for r in 0..rows {
        for p in 0..32 {
            let code = |j: usize| if j < len { e2m1_pattern(r, j).1 } else { 0 };
            let want = code(2 * p) | (code(2 * p + 1) << 4);
            assert_eq!(
                codes.data[r * 32 + p],
                want,
                "row {r} byte {p}: element 2i in the low nibble"
            );
        }
    }
    // ceil(40 / 32) = 2 E8M0 bytes per row.
    let scales = &t["w.scales"];
    assert_eq!(
        (scales.dtype, scales.shape.as_slice()),
        (Dtype::U8, &[3, 2][..])
    );
    assert!(
        scales.data.iter().all(|&b| b == SCALE_ONE),
        "{:?}",
        scales.data
    );

    let dequant = &t["w.dequant"];
    assert_eq!(
        (dequant.dtype, dequant.shape.as_slice()),
        (Dtype::F32, &[3, 40][..])
    );
    assert_eq!(
        f32_bits(&dequant.values()),
        f32_bits(&x),
        "exact, including -0.0"
    );

    let row = table_row(&out, "w");
    assert!(row.contains(&"mxfp4".to_string()), "{row:?}");
    assert_eq!(sqnr_column(&row), "inf");
    assert!(stdout(&out).contains("[3, 40]"));
    let meta = output_metadata(&output);
    assert_eq!(
        meta.get("mxswitch.format").map(String::as_str),
        Some("mxfp4")
    );
    assert_eq!(
        meta.get("mxswitch.scale_mode").map(String::as_str),
        Some("even")
    );
    assert_eq!(
        meta.get("origin").map(String::as_str),
        Some("quantize_cli test"),
        "input metadata is kept"
    );
}

#[test]
fn mxfp4_along_axis_0_keeps_the_axis_in_place() {
    let dir = TempDir::new().unwrap();
    let (len, cols) = (40, 3);
    // x[j][r] = pattern(r, j): blocks run down the columns.
    let mut x = Vec::new();
    for j in 0..len {
        for r in 0..cols {
            x.push(e2m1_pattern(r, j).0);
        }
    }
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&[len, cols], &x))],
    );
    let out0 = dir.path().join("axis0.safetensors");
    assert_ok(&quantize(
        &["--format", "mxfp4", "--axis", "0"],
        &input,
        &out0,
    ));
    let t = read_output(&out0);

    let codes = &t["w.codes"];
    assert_eq!(codes.shape, [32, 3]);
    for p in 0..32 {
        for r in 0..cols {
            let code = |j: usize| if j < len { e2m1_pattern(r, j).1 } else { 0 };
            assert_eq!(
                codes.data[p * cols + r],
                code(2 * p) | (code(2 * p + 1) << 4),
                "byte ({p}, {r})"
            );
        }
    }
    assert_eq!(t["w.scales"].shape, [2, 3]);
    assert!(t["w.scales"].data.iter().all(|&b| b == SCALE_ONE));
    assert_eq!(t["w.dequant"].shape, [40, 3]);
    assert_eq!(f32_bits(&t["w.dequant"].values()), f32_bits(&x));

    // A negative axis counts from the end: -2 is axis 0 here.
    let out_neg = dir.path().join("axis-2.safetensors");
    assert_ok(&quantize(
        &["--format", "mxfp4", "--axis", "-2"],
        &input,
        &out_neg,
    ));
    let t2 = read_output(&out_neg);
    for name in ["w.codes", "w.scales", "w.dequant"] {
        assert_eq!(t2[name], t[name], "{name}");
    }
}

#[test]
fn mxfp8_codes_are_unpacked_and_scale_modes_default_per_format() {
    let dir = TempDir::new().unwrap();
    // amax 7.5 = 1.875 * 2^2 tells the modes apart (SPEC section 2):
    // mxfp4: EVEN bumps the exponent (significand >= 1.75) -> 3 - 2 + 127 = 128, FLOOR -> 127;
    // mxfp8: RCEIL 7.5/448 -> 2^-5 -> 122, EVEN (3 mantissa bits, no carry) -> 2 - 8 + 127 = 121.
    let mut x = vec![0.25f32; 32];
    x[7] = -7.5;
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&[1, 32], &x))],
    );
    let cases: [(&[&str], u8); 5] = [
        (&["--format", "mxfp4"], 128),
        (&["--format", "mxfp4", "--scale-mode", "floor"], 127),
        (&["--format", "mxfp8"], 122),
        (&["--format", "mxfp8", "--scale-mode", "rceil"], 122),
        (&["--format", "mxfp8", "--scale-mode", "even"], 121),
    ];
    for (i, (args, byte)) in cases.into_iter().enumerate() {
        let output = dir.path().join(format!("out{i}.safetensors"));
        assert_ok(&quantize(args, &input, &output));
        let t = read_output(&output);
        assert_eq!(t["w.scales"].data, [byte], "{args:?}");
        let want_codes = if args[1] == "mxfp8" { [1, 32] } else { [1, 16] };
        assert_eq!(t["w.codes"].shape, want_codes, "{args:?}");
    }

    // [3, 40] in MXFP8: one byte per element, the axis padded to 64.
    let y = noise(120, 7, 3.0);
    let input = write_input(
        dir.path(),
        "in2.safetensors",
        &[("w", Tensor::f32(&[3, 40], &y))],
    );
    let output = dir.path().join("mxfp8.safetensors");
    let out = quantize(&["--format", "mxfp8"], &input, &output);
    assert_ok(&out);
    let t = read_output(&output);
    assert_eq!(
        (t["w.codes"].dtype, t["w.codes"].shape.as_slice()),
        (Dtype::U8, &[3, 64][..])
    );
    assert_eq!(
        (t["w.scales"].dtype, t["w.scales"].shape.as_slice()),
        (Dtype::U8, &[3, 2][..])
    );
    assert_eq!(t["w.dequant"].shape, [3, 40]);
    // Padding encodes as zero.
    for r in 0..3 {
        assert!(t["w.codes"].data[r * 64 + 40..(r + 1) * 64]
            .iter()
            .all(|&c| c == 0));
    }
    let sqnr = sqnr_db(&y, &t["w.dequant"].values());
    assert!(sqnr > 25.0, "MXFP8 keeps ~30 dB: {sqnr}");
    assert_eq!(sqnr_column(&table_row(&out, "w")), format!("{sqnr:.2}"));
}

/// `scales` of a `[rows, cols]` tensor: byte (r, c).
fn at(t: &Tensor, r: usize, c: usize) -> u8 {
    t.data[r * t.shape[1] + c]
}

#[test]
fn tile2d_repeats_each_tile_scale_over_the_tile() {
    let dir = TempDir::new().unwrap();
    let (rows, cols) = (40, 64);
    let mut x: Vec<f32> = (0..rows * cols)
        .map(|i| (i % 7) as f32 * 0.25 + 0.25)
        .collect();
    x[5 * cols + 3] = 100.0; // tile (0, 0)
    for r in 32..rows {
        for c in 32..cols {
            x[r * cols + c] /= 1024.0; // tile (1, 1) is small
        }
    }
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&[rows, cols], &x))],
    );

    // Blocks along the last axis: scales [40, 2], one byte per 32x32 tile.
    let tiled = dir.path().join("tiled.safetensors");
    let plain = dir.path().join("plain.safetensors");
    assert_ok(&quantize(
        &["--format", "mxfp4", "--tile2d"],
        &input,
        &tiled,
    ));
    assert_ok(&quantize(&["--format", "mxfp4"], &input, &plain));
    let (st, sp) = (
        &read_output(&tiled)["w.scales"],
        &read_output(&plain)["w.scales"],
    );
    assert_eq!(st.shape, [40, 2]);
    for (r0, r1) in [(0, 32), (32, 40)] {
        for b in 0..2 {
            // The tile's byte is the block bytes' max (every scale rule grows with amax).
            let want = (r0..r1).map(|r| at(sp, r, b)).max().unwrap();
            for r in r0..r1 {
                assert_eq!(at(st, r, b), want, "row {r}, block {b}");
            }
        }
    }
    // 100 = 1.5625 * 2^6: EVEN gives 6 - 2 + 127.
    assert_eq!(at(st, 0, 0), 131);
    assert_ne!(at(sp, 0, 0), 131, "without tiles row 0 has its own scale");

    // Blocks along axis 0 of the transposed layout: scales [2, 40], repeated along axis 1.
    let xt: Vec<f32> = (0..cols)
        .flat_map(|c| (0..rows).map(move |r| (r, c)))
        .map(|(r, c)| x[r * cols + c])
        .collect();
    let input_t = write_input(
        dir.path(),
        "in_t.safetensors",
        &[("w", Tensor::f32(&[cols, rows], &xt))],
    );
    let tiled_t = dir.path().join("tiled_t.safetensors");
    assert_ok(&quantize(
        &["--format", "mxfp4", "--tile2d", "--axis", "0"],
        &input_t,
        &tiled_t,
    ));
    let stt = &read_output(&tiled_t)["w.scales"];
    assert_eq!(stt.shape, [2, 40]);
    for b in 0..2 {
        for c in 0..40 {
            assert_eq!(at(stt, b, c), at(st, c, b), "the same tiles, transposed");
        }
    }
}

#[test]
fn fp8_tensorwise_scale_is_fmt_max_over_amax_in_f32() {
    let dir = TempDir::new().unwrap();
    let mut x = noise(20, 3, 2.0);
    x[13] = -3.7;
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&[4, 5], &x))],
    );
    for (format, max) in [
        ("fp8-e4m3", 448.0f32),
        ("fp8-e5m2", 57344.0),
        ("fp8-e4m3fnuz", 240.0),
        ("fp8-e5m2fnuz", 57344.0),
    ] {
        let output = dir.path().join(format!("{format}.safetensors"));
        let out = quantize(&["--format", format], &input, &output);
        assert_ok(&out);
        let t = read_output(&output);
        assert_eq!(
            (t["w.codes"].dtype, t["w.codes"].shape.as_slice()),
            (Dtype::U8, &[4, 5][..])
        );
        let scales = &t["w.scales"];
        assert_eq!(
            (scales.dtype, scales.shape.as_slice()),
            (Dtype::F32, &[1][..])
        );
        // IEEE f32 division is correctly rounded: fl32(max / amax), the scale, not its inverse.
        assert_eq!(
            scales.values()[0].to_bits(),
            (max / 3.7f32).to_bits(),
            "{format}"
        );
        let dequant = t["w.dequant"].values();
        assert_eq!(t["w.dequant"].shape, [4, 5]);
        assert!(
            (dequant[13] + 3.7).abs() < 1e-5,
            "{format}: amax survives, {}",
            dequant[13]
        );
        assert!(table_row(&out, "w").contains(&format.to_string()));
    }
    // -amax encodes to -448 in E4M3FN: sign, exponent 1111, mantissa 110.
    let t = read_output(&dir.path().join("fp8-e4m3.safetensors"));
    assert_eq!(t["w.codes"].data[13], 0xFE);
}

#[test]
fn hadamard_codes_are_rotated_and_dequant_is_rotated_back() {
    let dir = TempDir::new().unwrap();
    let (rows, len) = (4, 64);
    let mut x = noise(rows * len, 11, 1.0);
    x[17] = 9.0; // an outlier the rotation spreads over its group of 16
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&[rows, len], &x))],
    );

    let rotated = dir.path().join("had.safetensors");
    let out = quantize(&["--format", "mxfp8", "--hadamard"], &input, &rotated);
    assert_ok(&out);
    let t = read_output(&rotated);
    assert_eq!(t["w.codes"].shape, [4, 64]);
    assert_eq!(t["w.scales"].shape, [4, 2]);

    // Decoding codes and scales gives the rotated tensor; rotating it again
    // (H16 / 4 is its own inverse) must give NAME.dequant bit for bit.
    let (codes, scales) = (&t["w.codes"].data, &t["w.scales"].data);
    let mut back: Vec<f32> = (0..rows * len)
        .map(|i| ElemFormat::E4M3FN.decode(codes[i]) * e8m0::decode(scales[i / 32]))
        .collect();
    back.chunks_mut(len).for_each(hadamard16_inplace);
    let dequant = t["w.dequant"].values();
    assert_eq!(f32_bits(&back), f32_bits(&dequant));

    // Like with like: the dequantized tensor is close to the input, and the table says so.
    let sqnr = sqnr_db(&x, &dequant);
    assert!(sqnr > 25.0, "{sqnr}");
    assert_eq!(sqnr_column(&table_row(&out, "w")), format!("{sqnr:.2}"));

    let plain = dir.path().join("plain.safetensors");
    assert_ok(&quantize(&["--format", "mxfp8"], &input, &plain));
    assert_ne!(
        read_output(&plain)["w.codes"].data,
        *codes,
        "the codes are of the rotated tensor"
    );

    let fp4 = dir.path().join("had4.safetensors");
    assert_ok(&quantize(
        &["--format", "mxfp4", "--hadamard"],
        &input,
        &fp4,
    ));
    let sqnr4 = sqnr_db(&x, &read_output(&fp4)["w.dequant"].values());
    assert!(sqnr4 > 12.0, "mxfp4 with Hadamard is still close: {sqnr4}");
}

#[test]
fn nan_or_inf_input_is_refused_alike_by_every_format() {
    let dir = TempDir::new().unwrap();
    let mut x: Vec<f32> = (0..128).map(|i| 0.5 + (i % 5) as f32).collect();
    x[5] = f32::NAN;
    x[64 + 40] = f32::NEG_INFINITY;
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[
            ("ok", Tensor::f32(&[4], &[1.0, 2.0, 3.0, 4.0])),
            ("w", Tensor::f32(&[2, 64], &x)),
        ],
    );
    let output = dir.path().join("out.safetensors");
    for format in [
        "mxfp4",
        "mxfp8",
        "fp8-e4m3",
        "fp8-e5m2",
        "nvfp4",
        "fp8-rowwise",
        "fp8-block",
    ] {
        assert_fails_cleanly(
            &quantize(&["--format", format], &input, &output),
            "tensor `w` holds 2 non-finite value(s) (NaN or Inf) among 128",
        );
        assert!(!output.exists(), "{format}");
    }
    assert_eq!(
        entries(dir.path()),
        BTreeSet::from(["in.safetensors".to_string()])
    );
}
