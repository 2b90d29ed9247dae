//! `mxswitch quantize`: quantize every f32, bf16 and f16 tensor of a
//! safetensors file to an MX block format or to FP8 with one tensorwise scale
//! (SPEC sections 1-3), write what the quantizer produced, and print the
//! error of each tensor.
//!
//! For every float tensor `NAME` the output holds, in the input's layout:
//! - `NAME.codes` (U8): MX: the input shape with the quantization axis padded
//!   to a multiple of 32, halved for mxfp4 (element 2i in the low nibble);
//!   FP8: the input shape.
//! - `NAME.scales`: MX: U8 E8M0 bytes, the axis length L replaced by
//!   ceil(L/32) (with `--tile2d` each tile's byte repeated over its rows);
//!   FP8: F32 `[1]` holding the scale that multiplied the input (not its inverse).
//! - `NAME.dequant` (F32, the input's shape), rotated back with `--hadamard`.
//!
//! Tensors of any other dtype are copied through unchanged and reported as
//! skipped. Nothing is written unless every tensor quantized: the output goes
//! to a temporary file in the output's folder, renamed into place at the end.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use clap::builder::{PossibleValuesParser, TypedValueParser};
use mxswitch_runtime::formats::bf16;
use mxswitch_runtime::quant::dispatch::{quantize, QuantFormat, QuantOptions, Quantized};
use mxswitch_runtime::quant::ScaleMode;
use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors, View};

/// Arguments of `mxswitch quantize`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
For every f32, bf16 or f16 tensor NAME the output holds NAME.codes (U8), NAME.scales \
(U8 E8M0 bytes for MX formats, F32 [1] for FP8) and NAME.dequant (F32). Tensors of \
other dtypes are copied unchanged.")]
pub struct QuantizeArgs {
    /// Target format: MX block scaling (32 elements share an E8M0 scale) or
    /// FP8 with one tensorwise scale.
    #[arg(long, value_name = "FORMAT", value_parser = format_parser())]
    pub format: QuantFormat,

    /// How the E8M0 block scale is chosen from the block amax (MX formats only)
    /// [default: even for mxfp4, rceil for mxfp8].
    #[arg(long, value_name = "MODE", value_parser = scale_mode_parser())]
    pub scale_mode: Option<ScaleMode>,

    /// Quantization axis of the MX blocks; negative counts from the end (MX
    /// formats only) [default: -1].
    #[arg(long, value_name = "I", allow_negative_numbers = true)]
    pub axis: Option<isize>,

    /// One scale per 32x32 tile of a 2-D tensor, stored repeated over the
    /// tile's rows (MX formats only).
    #[arg(long)]
    pub tile2d: bool,

    /// Rotate each group of 16 elements along the axis by (1/4) H16 before
    /// quantizing; the dequantized output is rotated back (MX formats only).
    #[arg(long)]
    pub hadamard: bool,

    /// The safetensors file to quantize.
    #[arg(long, value_name = "IN.safetensors")]
    pub input: PathBuf,

    /// Where to write the quantized tensors (replaced only on success).
    #[arg(long, value_name = "OUT.safetensors")]
    pub output: PathBuf,
}

/// `--format`: exactly the runtime's names, listed in `--help`.
fn format_parser() -> impl TypedValueParser<Value = QuantFormat> {
    PossibleValuesParser::new(QuantFormat::ALL.map(QuantFormat::name))
        .try_map(|s| s.parse::<QuantFormat>())
}

/// `--scale-mode`: exactly the runtime's names, listed in `--help`.
fn scale_mode_parser() -> impl TypedValueParser<Value = ScaleMode> {
    PossibleValuesParser::new(ScaleMode::ALL.map(ScaleMode::name))
        .try_map(|s| s.parse::<ScaleMode>())
}

/// Why `mxswitch quantize` failed. Every message is one line.
#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    /// An option that the format does not take (checked by the runtime).
    #[error("{0}")]
    Options(mxswitch_runtime::Error),
    #[error("cannot read `{}`: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("`{}` is not a valid safetensors file: {reason}", path.display())]
    NotSafetensors { path: PathBuf, reason: String },
    #[error("`{}` holds no f32, bf16 or f16 tensor to quantize (found {found})", path.display())]
    NoFloatTensor { path: PathBuf, found: String },
    /// Two outputs would get the same name.
    #[error(
        "the output would hold two tensors named `{name}` \
         (from input tensors `{first}` and `{second}`); rename one of them"
    )]
    NameClash {
        name: String,
        first: String,
        second: String,
    },
    /// The runtime refused one tensor (axis out of range, tiles on a tensor
    /// that is not 2-D, ...).
    #[error("tensor `{name}`: {source}")]
    Tensor {
        name: String,
        source: mxswitch_runtime::Error,
    },
    /// The runtime refused one tensor with a message that already names it.
    #[error("{0}")]
    Runtime(mxswitch_runtime::Error),
    #[error("cannot write `{}`: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
}

/// Run `mxswitch quantize`.
pub fn run(args: &QuantizeArgs) -> Result<(), QuantizeError> {
    let opts = QuantOptions {
        scale_mode: args.scale_mode,
        axis: args.axis,
        tile2d: args.tile2d,
        hadamard: args.hadamard,
    };
    check_options(args.format, &opts)?;

    let bytes = fs::read(&args.input).map_err(|source| QuantizeError::Read {
        path: args.input.clone(),
        source,
    })?;
    let (inputs, in_metadata) =
        parse_safetensors(&bytes).map_err(|reason| QuantizeError::NotSafetensors {
            path: args.input.clone(),
            reason,
        })?;
    if !inputs.iter().any(|t| is_float(t.dtype)) {
        return Err(QuantizeError::NoFloatTensor {
            path: args.input.clone(),
            found: describe_contents(&inputs),
        });
    }
    check_output_names(&inputs)?;

    let mut outputs: BTreeMap<String, OutTensor> = BTreeMap::new();
    let mut rows = Vec::with_capacity(inputs.len());
    for t in &inputs {
        let Some(x) = widen(t.dtype, t.data) else {
            outputs.insert(
                t.name.clone(),
                OutTensor::new(t.dtype, t.shape.clone(), Cow::Borrowed(t.data)),
            );
            rows.push(Row::skipped(t));
            continue;
        };
        let q = quantize_one(t, &x, args.format, &opts)?;
        for (suffix, out) in SUFFIXES.into_iter().zip(q.outputs) {
            outputs.insert(format!("{}.{suffix}", t.name), out);
        }
        rows.push(q.row);
    }

    let metadata = output_metadata(in_metadata, args.format, &opts);
    write_atomically(&args.output, &outputs, &Some(metadata))?;

    let quantized = rows.iter().filter(|r| r.result.is_some()).count();
    let summary = format!(
        "wrote {}: {quantized} tensor(s) quantized to {}, {} copied unchanged",
        args.output.display(),
        describe_format(args.format, &opts),
        rows.len() - quantized
    );
    // The file is written; a closed stdout (`| head`) is no reason to fail
    // or, as `print!` would, to panic.
    let _ = writeln!(io::stdout().lock(), "{}{summary}", render_table(&rows));
    Ok(())
}

/// Reject an option the format does not take before any file is read. The
/// rule belongs to the runtime (`QuantOptions` for FP8 takes none of the MX
/// options); quantizing an empty tensor runs exactly that check. MX options
/// depend on each tensor's rank and are checked when it is quantized.
fn check_options(format: QuantFormat, opts: &QuantOptions) -> Result<(), QuantizeError> {
    if format.is_mx() {
        return Ok(());
    }
    quantize(&[], &[0], format, opts, "")
        .map(drop)
        .map_err(QuantizeError::Options)
}

/// One tensor of the input file.
struct InTensor<'a> {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Little-endian element bytes, as stored.
    data: &'a [u8],
}

/// The tensors of a safetensors file sorted by name, and its `__metadata__`.
/// The error is the reason the bytes are not a usable safetensors file.
fn parse_safetensors(bytes: &[u8]) -> Result<(Vec<InTensor<'_>>, HashMap<String, String>), String> {
    let explain = |e| explain_safetensors_error(e, bytes);
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(explain)?;
    let file = SafeTensors::deserialize(bytes).map_err(explain)?;
    let mut tensors: Vec<InTensor> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| InTensor {
            name,
            dtype: view.dtype(),
            // The trait's `shape` borrows the view only briefly.
            shape: View::shape(&view).to_vec(),
            data: view.data(),
        })
        .collect();
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((tensors, header.metadata().clone().unwrap_or_default()))
}

/// Why a header size does not fit (the first 8 bytes of any other file give
/// some huge number).
const BAD_HEADER_SIZE: &str =
    "the header size in its first 8 bytes does not fit the file (truncated, or not safetensors)";
/// Why the data section does not match the header.
const BAD_DATA_SIZE: &str =
    "its data section does not match the sizes in its header (truncated, or trailing bytes)";

/// Say in words why safetensors rejected `bytes` (its own `Display` is `Debug`).
fn explain_safetensors_error(err: SafeTensorError, bytes: &[u8]) -> String {
    match err {
        SafeTensorError::HeaderTooSmall => format!(
            "it is {} bytes long, too short for the 8-byte header size",
            bytes.len()
        ),
        SafeTensorError::HeaderTooLarge | SafeTensorError::InvalidHeaderLength => {
            BAD_HEADER_SIZE.into()
        }
        SafeTensorError::InvalidHeader | SafeTensorError::InvalidHeaderStart => {
            "its header is not UTF-8 JSON".into()
        }
        SafeTensorError::InvalidHeaderDeserialization | SafeTensorError::JsonError(_) => {
            explain_bad_header(bytes)
        }
        SafeTensorError::MetadataIncompleteBuffer => BAD_DATA_SIZE.into(),
        SafeTensorError::InvalidOffset(name) => {
            format!("the data offsets of tensor `{name}` are invalid")
        }
        SafeTensorError::TensorInvalidInfo | SafeTensorError::ValidationOverflow => {
            "a tensor's dtype, shape and data offsets do not agree".into()
        }
        other => format!("{other:?}"),
    }
}

/// The header did not deserialize: say whether it is not JSON at all or uses
/// a dtype this reader does not know (newer writers add dtypes).
fn explain_bad_header(bytes: &[u8]) -> String {
    let header = bytes
        .get(..8)
        .and_then(|n| <[u8; 8]>::try_from(n).ok())
        .and_then(|n| usize::try_from(u64::from_le_bytes(n)).ok())
        .and_then(|n| bytes.get(8..8usize.checked_add(n)?));
    let Some(Ok(serde_json::Value::Object(entries))) =
        header.map(serde_json::from_slice::<serde_json::Value>)
    else {
        return "its header is not JSON".into();
    };
    let unknown = entries.iter().find_map(|(name, entry)| {
        let dtype = entry.get("dtype")?;
        serde_json::from_value::<Dtype>(dtype.clone())
            .is_err()
            .then(|| {
                format!("tensor `{name}` has dtype {dtype}, which this reader does not support")
            })
    });
    unknown.unwrap_or_else(|| "its header is JSON but not a safetensors header".into())
}

/// The dtypes this command quantizes.
fn is_float(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16)
}

/// f32 values of a float tensor's little-endian bytes (bf16 and f16 widen
/// exactly); `None` for any other dtype.
fn widen(dtype: Dtype, data: &[u8]) -> Option<Vec<f32>> {
    let x = match dtype {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| bf16::to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => return None,
    };
    Some(x)
}

/// "2 tensor(s): ids (I64), mask (BOOL)" for the no-float-tensor error,
/// naming at most the first few.
fn describe_contents(inputs: &[InTensor]) -> String {
    const SHOWN: usize = 5;
    if inputs.is_empty() {
        return "no tensors at all".into();
    }
    let mut list: Vec<String> = inputs
        .iter()
        .take(SHOWN)
        .map(|t| format!("{} ({:?})", t.name, t.dtype))
        .collect();
    if inputs.len() > SHOWN {
        list.push(format!("and {} more", inputs.len() - SHOWN));
    }
    format!("{} tensor(s): {}", inputs.len(), list.join(", "))
}

/// The suffixes of the tensors written for each quantized tensor.
const SUFFIXES: [&str; 3] = ["codes", "scales", "dequant"];

/// Fail before quantizing if two outputs would share a name, e.g. an input
/// tensor `w.codes` beside a float tensor `w`.
fn check_output_names(inputs: &[InTensor]) -> Result<(), QuantizeError> {
    let mut seen: HashMap<String, &str> = HashMap::new();
    for t in inputs {
        let names: Vec<String> = if is_float(t.dtype) {
            SUFFIXES.iter().map(|s| format!("{}.{s}", t.name)).collect()
        } else {
            vec![t.name.clone()]
        };
        for name in names {
            if let Some(first) = seen.insert(name.clone(), &t.name) {
                return Err(QuantizeError::NameClash {
                    name,
                    first: first.to_string(),
                    second: t.name.clone(),
                });
            }
        }
    }
    Ok(())
}

/// A tensor to write: dtype, shape and little-endian bytes.
struct OutTensor<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Cow<'a, [u8]>,
}

impl<'a> OutTensor<'a> {
    fn new(dtype: Dtype, shape: Vec<usize>, data: Cow<'a, [u8]>) -> Self {
        OutTensor { dtype, shape, data }
    }

    fn f32(shape: Vec<usize>, values: &[f32]) -> Self {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        OutTensor::new(Dtype::F32, shape, Cow::Owned(bytes))
    }

    fn u8(shape: Vec<usize>, bytes: Vec<u8>) -> Self {
        OutTensor::new(Dtype::U8, shape, Cow::Owned(bytes))
    }
}

impl View for &OutTensor<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// What quantizing one tensor produced.
struct QuantizedTensor {
    /// Codes, scales and the dequantized tensor, in [`SUFFIXES`] order.
    outputs: [OutTensor<'static>; 3],
    row: Row,
}

/// Quantize one float tensor whose values, widened to f32, are `x`.
fn quantize_one(
    t: &InTensor,
    x: &[f32],
    format: QuantFormat,
    opts: &QuantOptions,
) -> Result<QuantizedTensor, QuantizeError> {
    let q = quantize(x, &t.shape, format, opts, &t.name).map_err(|source| match source {
        e @ mxswitch_runtime::Error::NonFiniteAmax { .. } => QuantizeError::Runtime(e),
        source => QuantizeError::Tensor {
            name: t.name.clone(),
            source,
        },
    })?;
    let dequant = q.dequantize();
    let saturated = q.saturated(x);
    let (codes, scales) = match q {
        Quantized::Mx(m) => (
            OutTensor::u8(m.codes_shape(), m.codes_in_input_layout()),
            OutTensor::u8(m.scales_shape(), m.scales_in_input_layout()),
        ),
        Quantized::Fp8(f) => (
            OutTensor::u8(t.shape.clone(), f.codes),
            OutTensor::f32(vec![1], &[f.scale]),
        ),
    };
    let result = Metrics::new(x, &dequant, saturated);
    let dequant = OutTensor::f32(t.shape.clone(), &dequant);
    let row = Row {
        name: t.name.clone(),
        shape: t.shape.clone(),
        format: format.name().to_string(),
        result: Some(result),
    };
    Ok(QuantizedTensor {
        outputs: [codes, scales, dequant],
        row,
    })
}

/// How well one tensor survived quantization.
#[derive(Clone, Copy, Debug)]
struct Metrics {
    /// 20 log10(|x| / |x - dequant|) over the whole tensor: +inf when exact,
    /// NaN when the input holds NaN or Inf.
    sqnr_db: f64,
    /// max |x - dequant|; NaN when any difference is NaN.
    max_abs_err: f64,
    /// Fraction of elements clipped to the format's largest value.
    saturated: f64,
}

impl Metrics {
    /// Norms in f64, so neither the squares of large f32 values nor long sums overflow.
    fn new(x: &[f32], dequant: &[f32], saturated: usize) -> Self {
        let (mut signal, mut noise, mut max_abs_err, mut nan) = (0.0f64, 0.0f64, 0.0f64, false);
        for (&a, &b) in x.iter().zip(dequant) {
            let (a, d) = (f64::from(a), f64::from(a) - f64::from(b));
            signal += a * a;
            noise += d * d;
            nan |= d.is_nan();
            max_abs_err = max_abs_err.max(d.abs());
        }
        let sqnr_db = if noise == 0.0 {
            f64::INFINITY
        } else {
            10.0 * (signal / noise).log10()
        };
        Metrics {
            sqnr_db,
            max_abs_err: if nan { f64::NAN } else { max_abs_err },
            saturated: if x.is_empty() {
                0.0
            } else {
                saturated as f64 / x.len() as f64
            },
        }
    }
}

/// One line of the printed table; `result` is `None` for a skipped tensor.
struct Row {
    name: String,
    shape: Vec<usize>,
    /// The format, or why the tensor was skipped.
    format: String,
    result: Option<Metrics>,
}

impl Row {
    fn skipped(t: &InTensor) -> Self {
        Row {
            name: t.name.clone(),
            shape: t.shape.clone(),
            format: format!("skipped ({:?})", t.dtype),
            result: None,
        }
    }
}

/// The table: name, shape, format, SQNR (dB), max abs error, saturated fraction.
fn render_table(rows: &[Row]) -> String {
    const HEADER: [&str; 6] = [
        "tensor",
        "shape",
        "format",
        "SQNR dB",
        "max abs err",
        "saturated",
    ];
    /// Columns from this one on hold numbers and align right.
    const FIRST_NUMERIC: usize = 3;
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            let (sqnr, err, sat) = match r.result {
                Some(m) => (
                    fmt_db(m.sqnr_db),
                    fmt_err(m.max_abs_err),
                    fmt_fraction(m.saturated),
                ),
                None => ("-".into(), "-".into(), "-".into()),
            };
            [
                r.name.clone(),
                format!("{:?}", r.shape),
                r.format.clone(),
                sqnr,
                err,
                sat,
            ]
        })
        .collect();
    let mut widths = HEADER.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[&str]| {
        let parts: Vec<String> = cells
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i < FIRST_NUMERIC {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        parts.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(&HEADER);
    out += &line(&widths.map(|w| "-".repeat(w)).each_ref().map(String::as_str));
    for row in &cells {
        out += &line(&row.each_ref().map(String::as_str));
    }
    out
}

fn fmt_db(db: f64) -> String {
    if db.is_nan() {
        "nan".into()
    } else if db.is_infinite() {
        if db > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{db:.2}")
    }
}

fn fmt_err(err: f64) -> String {
    if err.is_nan() {
        "nan".into()
    } else if err == 0.0 {
        "0".into()
    } else {
        fmt_sci(err, 3)
    }
}

fn fmt_fraction(f: f64) -> String {
    if f == 0.0 {
        "0".into()
    } else if f >= 1e-4 {
        format!("{f:.4}")
    } else {
        fmt_sci(f, 2)
    }
}

/// Scientific notation with a signed two-digit exponent, `1.786e-02`, rather
/// than Rust's `1.786e-2`.
fn fmt_sci(v: f64, digits: usize) -> String {
    let s = format!("{v:.digits$e}");
    match s.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, exp) = exp.strip_prefix('-').map_or(("+", exp), |e| ("-", e));
            format!("{mantissa}e{sign}{exp:0>2}")
        }
        None => s,
    }
}

/// "mxfp4 (scale even, axis -1, 32x32 tiles, hadamard)" or "fp8-e4m3 (tensorwise)".
fn describe_format(format: QuantFormat, opts: &QuantOptions) -> String {
    let Some(cfg) = format.default_config() else {
        return format!("{format} (tensorwise)");
    };
    let mut parts = vec![
        format!("scale {}", opts.scale_mode.unwrap_or(cfg.scale_mode)),
        format!("axis {}", opts.axis.unwrap_or(-1)),
    ];
    if opts.tile2d {
        parts.push("32x32 tiles".into());
    }
    if opts.hadamard {
        parts.push("hadamard".into());
    }
    format!("{format} ({})", parts.join(", "))
}

/// The input's `__metadata__` plus how the output was made, so a reader
/// can tell what the codes mean.
fn output_metadata(
    mut metadata: HashMap<String, String>,
    format: QuantFormat,
    opts: &QuantOptions,
) -> HashMap<String, String> {
    metadata.insert("mxswitch.format".into(), format.name().into());
    if let Some(cfg) = format.default_config() {
        let mode = opts.scale_mode.unwrap_or(cfg.scale_mode);
        metadata.insert("mxswitch.scale_mode".into(), mode.name().into());
        metadata.insert("mxswitch.axis".into(), opts.axis.unwrap_or(-1).to_string());
        metadata.insert("mxswitch.tile2d".into(), opts.tile2d.to_string());
        metadata.insert("mxswitch.hadamard".into(), opts.hadamard.to_string());
    }
    metadata
}

/// Write `tensors` to a temporary file in `path`'s folder and rename it to
/// `path`: a failure at any point leaves no partial file and any existing
/// `path` untouched.
fn write_atomically(
    path: &Path,
    tensors: &BTreeMap<String, OutTensor>,
    metadata: &Option<HashMap<String, String>>,
) -> Result<(), QuantizeError> {
    let write_error = |source| QuantizeError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    builder.prefix(".mxswitch-quantize-").suffix(".tmp");
    // A temporary file is private (0600) by default; ask for 0666 so that,
    // after the umask, the output gets the permissions of any new file.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(fs::Permissions::from_mode(0o666));
    }
    if !dir.is_dir() {
        let msg = format!("folder `{}` does not exist", dir.display());
        return Err(write_error(io::Error::new(io::ErrorKind::NotFound, msg)));
    }
    // Dropping `tmp` before `persist` deletes the file. tempfile adds the
    // random temporary name to its errors; the user only knows `path`.
    let tmp = builder
        .tempfile_in(dir)
        .map_err(|e| write_error(e.raw_os_error().map_or(e, io::Error::from_raw_os_error)))?;
    safetensors::serialize_to_file(
        tensors.iter().map(|(n, t)| (n.as_str(), t)),
        metadata,
        tmp.path(),
    )
    .map_err(|e| match e {
        SafeTensorError::IoError(e) => write_error(e),
        other => write_error(io::Error::other(format!("{other:?}"))),
    })?;
    tmp.as_file().sync_all().map_err(write_error)?;
    tmp.persist(path).map_err(|e| write_error(e.error))?;
    Ok(())
}
