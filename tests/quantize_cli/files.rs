//! Overflowed scales, metadata, escaped names, other dtypes, bad input,
//! usage errors, and the files a run leaves or keeps.

use super::*;

/// Row 0 holds 3e38: finite, but EVEN rounds its amax up to 2^128, which
/// gives the NaN scale (SPEC section 2); CEIL and RCEIL pick a scale whose
/// largest code overflows f32 on dequantization. Only FLOOR represents it.
fn near_f32_max_input(dir: &Path) -> PathBuf {
    let mut x: Vec<f32> = (0..64).map(|i| (i % 7) as f32 - 3.0).collect();
    x[9] = 3e38;
    write_input(dir, "in.safetensors", &[("w", Tensor::f32(&[2, 32], &x))])
}

#[test]
fn an_overflowed_scale_is_written_as_the_spec_says_with_a_warning() {
    let dir = TempDir::new().unwrap();
    let input = near_f32_max_input(dir.path());
    let output = dir.path().join("out.safetensors");
    let out = quantize(&["--format", "mxfp4"], &input, &output);
    assert_ok(&out);
    assert_eq!(
        stderr(&out),
        "warning: tensor `w` under scale mode even: 1 of 2 block(s) got the NaN scale 0xFF \
         because their scale overflowed, so they dequantize to NaN; \
         --scale-mode floor avoids it\n"
    );
    // The quantizer is unchanged: the SPEC's NaN scale, zero codes, NaN dequant.
    let t = read_output(&output);
    // Row 1 has amax 3: EVEN gives 2^(1 - 2).
    assert_eq!(t["w.scales"].data, [0xFF, SCALE_ONE - 1]);
    assert!(t["w.codes"].data[..16].iter().all(|&c| c == 0));
    let dequant = t["w.dequant"].values();
    assert!(dequant[..32].iter().all(|v| v.is_nan()));
    assert!(dequant[32..].iter().all(|v| v.is_finite()));
    assert_eq!(sqnr_column(&table_row(&out, "w")), "nan");

    let out = quantize(
        &["--format", "mxfp4", "--scale-mode", "ceil"],
        &input,
        &output,
    );
    assert_ok(&out);
    assert_eq!(
        stderr(&out),
        "warning: tensor `w` under scale mode ceil: 1 element(s) dequantize to Inf \
         (code times scale overflows f32); --scale-mode floor avoids it\n"
    );
    let out = quantize(
        &["--format", "mxfp4", "--scale-mode", "floor"],
        &input,
        &output,
    );
    assert_ok(&out);
    assert_eq!(stderr(&out), "", "floor represents 3e38");
    assert!(read_output(&output)["w.dequant"]
        .values()
        .iter()
        .all(|v| v.is_finite()));
}

#[test]
fn requantizing_keeps_only_the_metadata_of_this_output() {
    let dir = TempDir::new().unwrap();
    let x = noise(64, 3, 2.0);
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&[2, 32], &x))],
    );
    let mx = dir.path().join("mx.safetensors");
    assert_ok(&quantize(
        &["--format", "mxfp4", "--axis", "0", "--scale-mode", "floor"],
        &input,
        &mx,
    ));
    assert_eq!(output_metadata(&mx)["mxswitch.axis"], "0");
    let fp8 = dir.path().join("fp8.safetensors");
    assert_ok(&quantize(&["--format", "fp8-e4m3"], &mx, &fp8));
    let meta = output_metadata(&fp8);
    assert_eq!(
        meta,
        HashMap::from([
            ("origin".to_string(), "quantize_cli test".to_string()),
            ("mxswitch.format".to_string(), "fp8-e4m3".to_string()),
            ("mxswitch.pow2".to_string(), "false".to_string()),
        ])
    );
}

#[test]
fn tensor_names_with_control_characters_are_printed_escaped() {
    let dir = TempDir::new().unwrap();
    let name = "w\x1b[2J\x07";
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[(name, Tensor::f32(&[2], &[1.0, 2.0]))],
    );
    let output = dir.path().join("out.safetensors");
    let out = quantize(&["--format", "mxfp8"], &input, &output);
    assert_ok(&out);
    assert!(!stdout(&out).contains('\x1b') && !stdout(&out).contains('\x07'));
    assert_eq!(sqnr_column(&table_row(&out, "w\\x1b[2J\\x07")), "inf");
    // The output keeps the name as it is.
    assert!(read_output(&output).contains_key(&format!("{name}.codes")));

    let bad = write_input(
        dir.path(),
        "nan.safetensors",
        &[(name, Tensor::f32(&[2], &[f32::NAN, 2.0]))],
    );
    let out = quantize(&["--format", "mxfp8"], &bad, &output);
    assert_fails_cleanly(&out, "tensor `w\\x1b[2J\\x07` holds 1 non-finite value(s)");
    assert!(!stderr(&out).contains('\x1b'));
}

#[test]
fn other_dtypes_are_copied_and_listed_as_skipped_and_half_types_are_widened() {
    let dir = TempDir::new().unwrap();
    // bf16 and f16 bit patterns of exactly representable MXFP8 values (E4M3
    // elements, RCEIL): 1.5, -0.375, 6, 0.1875, -0.0 and, in f16, the
    // subnormal 2^-15 (0x0200) next to 2^-6 (0x2400).
    let bf16_bits = [
        0x3FC0u16, 0xBEC0, 0x40C0, 0x3E40, 0x8000, 0x3F80, 0xC000, 0x4100,
    ];
    let f16_bits = [
        0x3E00u16, 0xB600, 0x4600, 0x3200, 0x8000, 0x0200, 0x2400, 0xC000,
    ];
    let widened_bf16 = [1.5f32, -0.375, 6.0, 0.1875, -0.0, 1.0, -2.0, 8.0];
    let widened_f16 = [
        1.5f32,
        -0.375,
        6.0,
        0.1875,
        -0.0,
        2f32.powi(-15),
        2f32.powi(-6),
        -2.0,
    ];
    let ids: Vec<u8> = [5i64, -1, 1 << 40]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let tensors = [
        ("w", Tensor::f32(&[2, 3], &[1.0, 2.0, 3.0, -4.0, 0.5, 0.0])),
        ("wb", Tensor::bits16(Dtype::BF16, &[2, 4], &bf16_bits)),
        ("wh", Tensor::bits16(Dtype::F16, &[8], &f16_bits)),
        ("ids", Tensor::bytes(Dtype::I64, &[3], ids)),
        (
            "flags",
            Tensor::bytes(Dtype::U8, &[2, 2], vec![1, 0, 255, 7]),
        ),
        (
            "scale64",
            Tensor::bytes(Dtype::F64, &[1], 2.5f64.to_le_bytes().to_vec()),
        ),
    ];
    let input = write_input(dir.path(), "in.safetensors", &tensors);
    let output = dir.path().join("out.safetensors");
    let out = quantize(&["--format", "mxfp8"], &input, &output);
    assert_ok(&out);
    let t = read_output(&output);

    let names: BTreeSet<String> = t.keys().cloned().collect();
    let mut want: BTreeSet<String> = ["ids", "flags", "scale64"].map(String::from).into();
    for n in ["w", "wb", "wh"] {
        for s in ["codes", "scales", "dequant"] {
            want.insert(format!("{n}.{s}"));
        }
    }
    assert_eq!(names, want);
    for (name, tensor) in &tensors[3..] {
        assert_eq!(&t[*name], tensor, "{name} is copied unchanged");
        let row = table_row(&out, name);
        assert!(
            row.iter().any(|c| c == "skipped"),
            "{name} is listed as skipped: {row:?}"
        );
    }
    assert!(stdout(&out).contains("skipped (F64)"));
    assert_eq!(t["wb.dequant"].shape, [2, 4]);
    assert_eq!(f32_bits(&t["wb.dequant"].values()), f32_bits(&widened_bf16));
    assert_eq!(f32_bits(&t["wh.dequant"].values()), f32_bits(&widened_f16));
    assert_eq!(t["wh.codes"].shape, [32]);
    assert_eq!(t["wh.scales"].shape, [1]);
    for name in ["w", "wb", "wh"] {
        assert_eq!(
            sqnr_column(&table_row(&out, name)),
            "inf",
            "{name} is exact in MXFP8"
        );
    }
}

/// A safetensors file whose header names a dtype the reader does not know.
fn unknown_dtype_file() -> Vec<u8> {
    let header = br#"{"s":{"dtype":"F8_E8M0","shape":[2],"data_offsets":[0,2]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(&[127, 128]);
    bytes
}

#[test]
fn bad_input_fails_with_one_line_and_writes_nothing() {
    let good = |dir: &Path| {
        let x = noise(64, 5, 1.0);
        write_input(
            dir,
            "in.safetensors",
            &[
                ("w", Tensor::f32(&[2, 32], &x)),
                ("b", Tensor::f32(&[4], &x[..4])),
            ],
        )
    };
    let valid_bytes = {
        let dir = TempDir::new().unwrap();
        fs::read(good(dir.path())).unwrap()
    };
    /// How a case makes its input file.
    type MakeInput = Box<dyn Fn(&Path) -> PathBuf>;
    let file = |bytes: Vec<u8>| -> MakeInput {
        Box::new(move |dir: &Path| {
            let p = dir.join("in.safetensors");
            fs::write(&p, &bytes).unwrap();
            p
        })
    };
    let cases: Vec<(&str, MakeInput, Vec<&str>, &str)> = vec![
        (
            "missing file",
            Box::new(|d: &Path| d.join("absent.safetensors")),
            vec!["--format", "mxfp4"],
            "cannot read",
        ),
        (
            "not safetensors",
            file(b"hello, this is not a safetensors file\n".to_vec()),
            vec!["--format", "mxfp4"],
            "not a valid safetensors file",
        ),
        (
            "empty file",
            file(Vec::new()),
            vec!["--format", "mxfp4"],
            "0 bytes long",
        ),
        (
            "truncated data",
            file(valid_bytes[..valid_bytes.len() - 9].to_vec()),
            vec!["--format", "mxfp4"],
            "truncated",
        ),
        (
            "truncated header",
            file(valid_bytes[..40].to_vec()),
            vec!["--format", "mxfp8"],
            "truncated",
        ),
        (
            "unknown dtype",
            file(unknown_dtype_file()),
            vec!["--format", "mxfp8"],
            "F8_E8M0",
        ),
        (
            "no float tensor",
            Box::new(|d: &Path| {
                write_input(
                    d,
                    "in.safetensors",
                    &[("ids", Tensor::bytes(Dtype::I64, &[1], vec![0; 8]))],
                )
            }),
            vec!["--format", "mxfp4"],
            "no f32, bf16 or f16 tensor",
        ),
        (
            "axis too large",
            Box::new(good),
            vec!["--format", "mxfp4", "--axis", "2"],
            "axis 2 is out of range",
        ),
        (
            "axis too negative",
            Box::new(good),
            vec!["--format", "mxfp8", "--axis", "-3"],
            "axis -3 is out of range",
        ),
        (
            "fp8 with --scale-mode",
            Box::new(good),
            vec!["--format", "fp8-e4m3", "--scale-mode", "floor"],
            "--scale-mode applies only to mxfp4, mxfp8, not to fp8-e4m3",
        ),
        (
            "fp8 with --tile2d",
            Box::new(good),
            vec!["--format", "fp8-e5m2", "--tile2d"],
            "--tile2d applies only to mxfp4, mxfp8, nvfp4, fp8-block, not to fp8-e5m2",
        ),
        (
            "fp8 with --hadamard",
            Box::new(good),
            vec!["--format", "fp8-e4m3fnuz", "--hadamard"],
            "--hadamard applies only to mxfp4, mxfp8, nvfp4, not to fp8-e4m3fnuz",
        ),
        (
            "fp8 with --axis",
            Box::new(good),
            vec!["--format", "fp8-e5m2fnuz", "--axis", "0"],
            "--axis applies only to mxfp4, mxfp8, nvfp4, fp8-rowwise, fp8-block, not to fp8-e5m2fnuz",
        ),
        // The option is checked before the file is read.
        (
            "fp8 option, missing file",
            Box::new(|d: &Path| d.join("absent.safetensors")),
            vec!["--format", "fp8-e4m3", "--tile2d"],
            "--tile2d applies only",
        ),
        (
            "tile2d on a 1-D tensor",
            Box::new(good),
            vec!["--format", "mxfp4", "--tile2d"],
            "tensor `b`: invalid option: 32x32 tiles need a 2-D tensor",
        ),
        (
            "output name clash",
            Box::new(|d: &Path| {
                write_input(
                    d,
                    "in.safetensors",
                    &[
                        ("w", Tensor::f32(&[1], &[1.0])),
                        ("w.codes", Tensor::bytes(Dtype::U8, &[1], vec![0])),
                    ],
                )
            }),
            vec!["--format", "mxfp4"],
            "two tensors named `w.codes`",
        ),
        (
            "unknown format",
            Box::new(good),
            vec!["--format", "mxfp9"],
            "invalid value 'mxfp9'",
        ),
        (
            "unknown scale mode",
            Box::new(good),
            vec!["--format", "mxfp4", "--scale-mode", "nearest"],
            "invalid value 'nearest'",
        ),
    ];
    for (what, make, args, needle) in cases {
        let dir = TempDir::new().unwrap();
        let input = make(dir.path());
        let before = entries(dir.path());
        let output = dir.path().join("out.safetensors");
        let out = quantize(&args, &input, &output);
        assert_fails_cleanly(&out, needle);
        assert!(!output.exists(), "{what}: an output file was written");
        assert_eq!(
            entries(dir.path()),
            before,
            "{what}: a file was left behind"
        );
    }
}

#[test]
fn usage_errors_are_one_line_too() {
    let dir = TempDir::new().unwrap();
    let out = Command::new(BIN)
        .args(["quantize", "--format", "mxfp4", "--input"])
        .arg(dir.path().join("in.safetensors"))
        .output()
        .unwrap();
    assert_fails_cleanly(&out, "--output");
    let out = Command::new(BIN)
        .args(["quantize", "--format", "mxfp4", "--bogus"])
        .output()
        .unwrap();
    assert_fails_cleanly(&out, "--bogus");
    // Help is not an error.
    let help = Command::new(BIN)
        .args(["quantize", "--help"])
        .output()
        .unwrap();
    assert_ok(&help);
    assert!(stdout(&help).contains("fp8-e5m2fnuz"));
}

#[test]
fn unwritable_output_fails_with_one_line_and_leaves_no_file() {
    let dir = TempDir::new().unwrap();
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&[2, 2], &[1.0, 2.0, 3.0, 4.0]))],
    );
    let before = entries(dir.path());

    let missing_folder = dir.path().join("no_such_folder").join("out.safetensors");
    assert_fails_cleanly(
        &quantize(&["--format", "mxfp4"], &input, &missing_folder),
        "does not exist",
    );

    // The output names an existing folder: the rename fails and the temporary file goes.
    let folder = dir.path().join("a_folder");
    fs::create_dir(&folder).unwrap();
    assert_fails_cleanly(
        &quantize(&["--format", "mxfp4"], &input, &folder),
        "cannot write",
    );
    assert!(entries(&folder).is_empty());
    fs::remove_dir(&folder).unwrap();
    assert_eq!(
        entries(dir.path()),
        before,
        "no temporary file is left behind"
    );
}

#[test]
fn a_failed_run_keeps_the_previous_output_and_a_good_run_replaces_it() {
    let dir = TempDir::new().unwrap();
    let output = dir.path().join("out.safetensors");
    fs::write(&output, b"previous contents").unwrap();
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&[3], &[1.0, 2.0, 3.0]))],
    );

    assert_fails_cleanly(
        &quantize(&["--format", "mxfp4", "--axis", "1"], &input, &output),
        "out of range",
    );
    assert_eq!(fs::read(&output).unwrap(), b"previous contents");

    assert_ok(&quantize(&["--format", "mxfp4"], &input, &output));
    assert_eq!(read_output(&output)["w.dequant"].values(), [1.0, 2.0, 3.0]);
    assert_eq!(
        entries(dir.path()),
        BTreeSet::from(["in.safetensors".into(), "out.safetensors".into()])
    );
}

/// `tests/fixtures/python_small.safetensors`, written by Python's safetensors
/// (`make_python_fixture.py`), with what it holds recorded in `python_small.json`.
#[test]
fn reads_a_file_written_by_python() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let record: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(fixtures.join("python_small.json")).unwrap())
            .unwrap();
    let record = record.as_object().unwrap();
    let dir = TempDir::new().unwrap();
    let output = dir.path().join("out.safetensors");
    let out = quantize(
        &["--format", "mxfp8"],
        &fixtures.join("python_small.safetensors"),
        &output,
    );
    assert_ok(&out);
    let t = read_output(&output);
    assert_eq!(
        output_metadata(&output)
            .get("written_by")
            .map(String::as_str),
        Some("make_python_fixture.py")
    );

    let mut floats = 0;
    for (name, entry) in record {
        let shape: Vec<usize> = entry["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        let hex = entry["bytes_hex"].as_str().unwrap();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        match entry.get("f32_bits") {
            Some(bits) => {
                floats += 1;
                let want: Vec<u32> = bits
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|b| u32::from_str_radix(b.as_str().unwrap(), 16).unwrap())
                    .collect();
                let dequant = &t[&format!("{name}.dequant")];
                assert_eq!(dequant.shape, shape, "{name}");
                // Exact in MXFP8 by construction, so what was read is what Python wrote.
                assert_eq!(f32_bits(&dequant.values()), want, "{name}");
                let mut codes_shape = shape.clone();
                *codes_shape.last_mut().unwrap() = shape.last().unwrap().div_ceil(32) * 32;
                assert_eq!(t[&format!("{name}.codes")].shape, codes_shape, "{name}");
                assert_eq!(sqnr_column(&table_row(&out, name)), "inf", "{name}");
            }
            None => {
                let dtype = match entry["dtype"].as_str().unwrap() {
                    "int64" => Dtype::I64,
                    "bool" => Dtype::BOOL,
                    other => panic!("unexpected dtype {other}"),
                };
                assert_eq!(
                    t[name],
                    Tensor::bytes(dtype, &shape, bytes),
                    "{name} is copied unchanged"
                );
                assert!(table_row(&out, name).iter().any(|c| c == "skipped"));
            }
        }
    }
    assert_eq!(floats, 4, "f32 (two), f16 and bf16 tensors");
}
