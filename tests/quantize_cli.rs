//! End-to-end tests of `mxswitch quantize`: the binary is run on safetensors
//! files written here (and one written by Python's safetensors, under
//! `tests/fixtures/`), and its output file, table and errors are checked.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use mxswitch::runtime::formats::{e8m0, ElemFormat};
use mxswitch::runtime::quant::hadamard::hadamard16_inplace;
use safetensors::tensor::{Dtype, SafeTensors, TensorView, View};
use tempfile::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_mxswitch");

/// E2M1 magnitudes by code (SPEC section 1).
const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// The E8M0 byte of scale 1 (2^0).
const SCALE_ONE: u8 = 127;

#[derive(Clone, Debug, PartialEq)]
struct Tensor {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl Tensor {
    fn f32(shape: &[usize], values: &[f32]) -> Self {
        assert_eq!(shape.iter().product::<usize>(), values.len());
        Tensor {
            dtype: Dtype::F32,
            shape: shape.to_vec(),
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    fn bits16(dtype: Dtype, shape: &[usize], bits: &[u16]) -> Self {
        Tensor {
            dtype,
            shape: shape.to_vec(),
            data: bits.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    fn bytes(dtype: Dtype, shape: &[usize], data: Vec<u8>) -> Self {
        Tensor {
            dtype,
            shape: shape.to_vec(),
            data,
        }
    }

    fn values(&self) -> Vec<f32> {
        assert_eq!(self.dtype, Dtype::F32);
        self.data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }
}

/// Write `tensors` as a safetensors file `dir/name` with the crate's writer.
fn write_input(dir: &Path, name: &str, tensors: &[(&str, Tensor)]) -> PathBuf {
    let path = dir.join(name);
    let views: Vec<(&str, TensorView)> = tensors
        .iter()
        .map(|(n, t)| {
            (
                *n,
                TensorView::new(t.dtype, t.shape.clone(), &t.data).unwrap(),
            )
        })
        .collect();
    let metadata = Some(HashMap::from([(
        "origin".to_string(),
        "quantize_cli test".to_string(),
    )]));
    safetensors::serialize_to_file(views, &metadata, &path).unwrap();
    path
}

fn read_output(path: &Path) -> HashMap<String, Tensor> {
    let bytes = fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, v)| {
            let t = Tensor::bytes(v.dtype(), View::shape(&v), v.data().to_vec());
            (name, t)
        })
        .collect()
}

fn output_metadata(path: &Path) -> HashMap<String, String> {
    let bytes = fs::read(path).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    meta.metadata().clone().unwrap_or_default()
}

/// Run `mxswitch quantize ARGS --input IN --output OUT`.
fn quantize(args: &[&str], input: &Path, output: &Path) -> Output {
    Command::new(BIN)
        .arg("quantize")
        .args(args)
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(output)
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[track_caller]
fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        stderr(out),
        stdout(out)
    );
}

/// The run failed with exactly one `error: ...` line that contains `needle`,
/// printed nothing on stdout and did not panic.
#[track_caller]
fn assert_fails_cleanly(out: &Output, needle: &str) {
    let err = stderr(out);
    assert!(
        !out.status.success(),
        "expected a failure, got success; stdout:\n{}",
        stdout(out)
    );
    assert!(!err.contains("panicked"), "panicked: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "expected one error line, got:\n{err}");
    assert!(
        lines[0].starts_with("error: "),
        "no `error: ` prefix: {err}"
    );
    assert!(lines[0].contains(needle), "`{needle}` not in: {err}");
    assert_eq!(stdout(out), "", "nothing is printed on stdout on failure");
}

/// Names of the entries of `dir`, sorted.
fn entries(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// The table row of tensor `name`, split on whitespace.
fn table_row(out: &Output, name: &str) -> Vec<String> {
    let text = stdout(out);
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row for `{name}` in:\n{text}"));
    line.split_whitespace().map(str::to_string).collect()
}

/// The SQNR column of a row (the shape column holds spaces, so count from the right).
fn sqnr_column(row: &[String]) -> &str {
    &row[row.len() - 3]
}

/// A 4-bit E2M1 code: magnitude index `idx`, sign bit 3.
fn e2m1_code(idx: usize, negative: bool) -> u8 {
    idx as u8 | (u8::from(negative) << 3)
}

/// An exactly representable MXFP4 pattern: element (r, j) of a row is
/// +-E2M1[(r + j) % 8]. Every run of 8 along j holds 6.0, so every block's
/// amax is 6 and its EVEN scale is 2^0: codes and dequantized values are exact.
fn e2m1_pattern(r: usize, j: usize) -> (f32, u8) {
    let idx = (r + j) % 8;
    let negative = j % 3 == 0;
    let v = if negative { -E2M1[idx] } else { E2M1[idx] };
    (v, e2m1_code(idx, negative))
}

/// Pseudo-random values in [-scale, scale) from a fixed seed (xorshift32).
fn noise(n: usize, seed: u32, scale: f32) -> Vec<f32> {
    let mut s = seed.max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn f32_bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// 10 log10(sum x^2 / sum (x - y)^2) in f64, as the table prints it.
fn sqnr_db(x: &[f32], y: &[f32]) -> f64 {
    let signal: f64 = x.iter().map(|&a| f64::from(a).powi(2)).sum();
    let noise: f64 = x
        .iter()
        .zip(y)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
        .sum();
    10.0 * (signal / noise).log10()
}

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

// ---- nvfp4, fp8-rowwise and fp8-block (SPEC sections 2b and 3b) ----

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

/// Values with spread magnitudes, outliers and zeros, so blocks, rows and
/// tiles get different scales and some elements saturate.
fn spread(n: usize, seed: u32) -> Vec<f32> {
    noise(n, seed, 1.0)
        .into_iter()
        .enumerate()
        .map(|(i, v)| match i % 37 {
            0 => 40.0 * v,
            5 => 0.0,
            _ => v * (1 + (i / 23) % 6) as f32,
        })
        .collect()
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

// ---- --sr SEED,STEP,TENSOR_ID: stochastic rounding (SPEC sections 2 and 2b) ----

use mxswitch::runtime::quant::{quantize_mx, MxConfig, SrKey};

/// What the runtime's quantizer of `format` gives for `x` of `shape` along
/// the last axis with `sr`: (codes, scales, dequant) in the CLI's layout.
fn library_quantize(
    format: &str,
    x: &[f32],
    shape: &[usize],
    hadamard: bool,
    sr: Option<SrKey>,
) -> (Vec<u8>, Vec<u8>, Vec<f32>) {
    match format {
        "nvfp4" => {
            let cfg = Nvfp4Config {
                tile2d: false,
                hadamard,
                sr,
            };
            let q = quantize_nvfp4(x, shape, -1, &cfg).unwrap();
            (
                q.codes_in_input_layout(),
                q.scales_in_input_layout(),
                q.dequantize(),
            )
        }
        "mxfp4" | "mxfp8" => {
            let base = if format == "mxfp4" {
                MxConfig::mxfp4()
            } else {
                MxConfig::mxfp8()
            };
            let cfg = MxConfig {
                hadamard,
                sr,
                ..base
            };
            let q = quantize_mx(x, shape, -1, &cfg).unwrap();
            (
                q.codes_in_input_layout(),
                q.scales_in_input_layout(),
                q.dequantize(),
            )
        }
        _ => unreachable!("{format}"),
    }
}

/// The E2M1 codes of packed bytes, low nibble first.
fn nibbles(bytes: &[u8]) -> Vec<u8> {
    bytes.iter().flat_map(|b| [b & 0xF, b >> 4]).collect()
}

#[test]
fn sr_codes_are_the_runtime_quantizers_under_that_key_and_not_rne() {
    let dir = TempDir::new().unwrap();
    let shape = [6, 64];
    // Spread magnitudes: almost no value is a code times its block's scale.
    let x = spread(6 * 64, 31);
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&shape, &x))],
    );
    let key = SrKey {
        seed: 7,
        step: 3,
        tensor_id: 1,
    };
    for format in ["nvfp4", "mxfp4", "mxfp8"] {
        for hadamard in [false, true] {
            let what = format!("{format} hadamard={hadamard}");
            let mut args = vec!["--format", format];
            if hadamard {
                args.push("--hadamard");
            }
            let rne_path = dir.path().join("rne.safetensors");
            assert_ok(&quantize(&args, &input, &rne_path));
            args.extend(["--sr", "7,3,1"]);
            let sr_path = dir.path().join("sr.safetensors");
            let out = quantize(&args, &input, &sr_path);
            assert_ok(&out);
            let (sr, rne) = (read_output(&sr_path), read_output(&rne_path));

            // Exactly the runtime's quantizer under SrKey { 7, 3, 1 }.
            let (codes, scales, dequant) =
                library_quantize(format, &x, &shape, hadamard, Some(key));
            assert_eq!(sr["w.codes"].data, codes, "{what}");
            assert_eq!(sr["w.scales"].data, scales, "{what}");
            assert_eq!(
                f32_bits(&sr["w.dequant"].values()),
                f32_bits(&dequant),
                "{what}"
            );
            // Not a key with the fields in another order.
            let swapped = SrKey {
                step: 1,
                tensor_id: 3,
                ..key
            };
            let (other, _, _) = library_quantize(format, &x, &shape, hadamard, Some(swapped));
            assert_ne!(sr["w.codes"].data, other, "{what}");
            // The RNE run is the runtime's RNE quantizer.
            let (rne_codes, rne_scales, _) = library_quantize(format, &x, &shape, hadamard, None);
            assert_eq!(rne["w.codes"].data, rne_codes, "{what}");

            // Rounding changes codes, never scales: the scales are RNE's,
            // and many codes are the other neighbour of the value.
            assert_eq!(sr["w.scales"].data, rne_scales, "{what}");
            if format != "mxfp8" {
                let (s, r) = (nibbles(&sr["w.codes"].data), nibbles(&rne["w.codes"].data));
                let differing = s.iter().zip(&r).filter(|(a, b)| a != b).count();
                assert!(
                    differing > s.len() / 5,
                    "{what}: {differing} of {}",
                    s.len()
                );
                // SR picks one of the two codes around the value, RNE the
                // nearer: the magnitudes are at most one code apart.
                for (i, (&a, &b)) in s.iter().zip(&r).enumerate() {
                    let (ma, mb) = (i32::from(a & 7), i32::from(b & 7));
                    assert!(
                        (ma - mb).abs() <= 1,
                        "{what}: element {i}: {a:#x} vs {b:#x}"
                    );
                }
            } else {
                let s = &sr["w.codes"].data;
                let differing = s
                    .iter()
                    .zip(&rne["w.codes"].data)
                    .filter(|(a, b)| a != b)
                    .count();
                assert!(
                    differing > s.len() / 5,
                    "{what}: {differing} of {}",
                    s.len()
                );
            }
            let sr_err = sqnr_db(&x, &sr["w.dequant"].values());
            let rne_err = sqnr_db(&x, &rne["w.dequant"].values());
            assert!(
                sr_err < rne_err,
                "{what}: SR {sr_err} dB vs RNE {rne_err} dB"
            );

            // Recorded as the other options are.
            let summary = stdout(&out);
            assert!(summary.contains(", sr 7,3,1)"), "{what}: {summary}");
            assert_eq!(output_metadata(&sr_path)["mxswitch.sr"], "7,3,1", "{what}");
            assert_eq!(output_metadata(&rne_path)["mxswitch.sr"], "none", "{what}");
        }
    }
}

#[test]
fn sr_with_one_key_is_reproducible_and_another_step_changes_the_codes() {
    let dir = TempDir::new().unwrap();
    let shape = [4, 48];
    let x = spread(4 * 48, 32);
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("g", Tensor::f32(&shape, &x))],
    );
    for format in ["nvfp4", "mxfp4"] {
        let run = |key: &str, name: &str| {
            let path = dir.path().join(name);
            assert_ok(&quantize(&["--format", format, "--sr", key], &input, &path));
            path
        };
        let (a, b) = (
            run("9,100,4", "a.safetensors"),
            run("9,100,4", "b.safetensors"),
        );
        assert_eq!(fs::read(&a).unwrap(), fs::read(&b).unwrap(), "{format}");
        let c = run("9,101,4", "c.safetensors");
        let (a, c) = (read_output(&a), read_output(&c));
        assert_ne!(a["g.codes"].data, c["g.codes"].data, "{format}");
        assert_eq!(a["g.scales"].data, c["g.scales"].data, "{format}");
        // Step and tensor id count modulo 2^32 (SPEC section 2), as the runtime's key does.
        let wrapped = run(&format!("9,{},4", 100 + (1u64 << 32)), "d.safetensors");
        assert_eq!(
            read_output(&wrapped)["g.codes"].data,
            a["g.codes"].data,
            "{format}"
        );
        assert_eq!(output_metadata(&wrapped)["mxswitch.sr"], "9,4294967396,4");
    }
}

#[test]
fn sr_is_refused_by_the_fp8_formats_and_a_malformed_key_is_one_line() {
    let dir = TempDir::new().unwrap();
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&[4, 32], &noise(128, 5, 1.0)))],
    );
    let output = dir.path().join("out.safetensors");
    for format in [
        "fp8-rowwise",
        "fp8-block",
        "fp8-e4m3",
        "fp8-e5m2",
        "fp8-e4m3fnuz",
    ] {
        assert_fails_cleanly(
            &quantize(&["--format", format, "--sr", "7,3,1"], &input, &output),
            &format!("--sr applies only to mxfp4, mxfp8, nvfp4, not to {format}"),
        );
        // Before the input is read.
        assert_fails_cleanly(
            &quantize(
                &["--format", format, "--sr", "7,3,1"],
                &dir.path().join("absent.safetensors"),
                &output,
            ),
            "--sr applies only",
        );
    }
    for bad in [
        "1,2",
        "1,2,3,4",
        "1,2,-3",
        "a,b,c",
        "1,,3",
        "",
        "18446744073709551616,0,0",
    ] {
        let out = quantize(&["--format", "nvfp4", "--sr", bad], &input, &output);
        assert_fails_cleanly(&out, "--sr <SEED,STEP,TENSOR_ID>");
        let err = stderr(&out);
        assert!(
            err.contains("three unsigned decimal integers") && err.contains(&format!("`{bad}`")),
            "{bad:?}: {err}"
        );
        assert_eq!(out.status.code(), Some(2), "{bad:?}: a usage error");
    }
    // The flag needs its value.
    let out = Command::new(BIN)
        .args(["quantize", "--format", "nvfp4", "--sr"])
        .output()
        .unwrap();
    assert_fails_cleanly(&out, "--sr");
    assert_eq!(
        entries(dir.path()),
        BTreeSet::from(["in.safetensors".to_string()])
    );
    // And --help says what it is.
    let help = Command::new(BIN)
        .args(["quantize", "--help"])
        .output()
        .unwrap();
    assert!(stdout(&help).contains("--sr <SEED,STEP,TENSOR_ID>"));
}
