//! End-to-end tests of `mxswitch quantize`: the binary is run on safetensors
//! files written here (and one written by Python's safetensors, under
//! `tests/fixtures/`), and its output file, table and errors are checked.
//! This file holds what every part shares; the tests are in:
//! - `mx.rs`: MXFP4, MXFP8, tiles, tensorwise FP8, the Hadamard, refusals;
//! - `files.rs`: overflow warnings, metadata, names, other dtypes, bad input,
//!   usage errors and what is left on disk;
//! - `new_formats.rs`: NVFP4, FP8 rowwise and FP8 128-block;
//! - `sr.rs`: stochastic rounding.

mod files;
mod mx;
mod new_formats;
mod sr;

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
