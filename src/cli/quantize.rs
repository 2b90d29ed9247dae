//! `mxswitch quantize`: quantize every f32, bf16 and f16 tensor of a
//! safetensors file to an MX block format, NVFP4, FP8 with one tensorwise
//! scale or FP8 with rowwise or 128-block scales (SPEC sections 1-3b),
//! write what the quantizer produced, and print the error of each tensor.
//!
//! For every float tensor `NAME` the output holds, in the input's layout:
//! - `NAME.codes` (U8): MX: the input shape with the quantization axis padded
//!   to a multiple of 32, halved for mxfp4 (element 2i in the low nibble);
//!   nvfp4: the axis padded to a multiple of 16 and halved (packed E2M1, as
//!   mxfp4); fp8-block: E4M3 bytes, the axis padded to a multiple of 128;
//!   fp8-rowwise and tensorwise FP8: E4M3 (or the format's) bytes, the input shape.
//! - `NAME.scales`: MX: U8 E8M0 bytes, the axis length L replaced by
//!   ceil(L/32) (with `--tile2d` each tile's byte repeated over its rows);
//!   nvfp4: U8 E4M3 bytes, L replaced by ceil(L/16) (tiles repeated over
//!   their rows); fp8-rowwise: F32, L replaced by 1; fp8-block: F32, L
//!   replaced by ceil(L/128) (tiles repeated per 1x128 row-chunk); tensorwise
//!   FP8: F32 `[1]`. FP8 scales are the ones that multiplied the input (not
//!   their inverses).
//! - `NAME.tensor_scale` (nvfp4 only): F32 `[1]`, the tensor scale t the
//!   block scales are relative to.
//! - `NAME.dequant` (F32, the input's shape), rotated back with `--hadamard`.
//!
//! `--sr SEED,STEP,TENSOR_ID` (MX formats and nvfp4) rounds the elements
//! stochastically under the Philox key `SrKey { seed, step, tensor_id }`
//! (SPEC section 2; STEP and TENSOR_ID count modulo 2^32), as a recipe
//! rounds a gradient operand, instead of to nearest even: the same key
//! gives the same bytes, on the CPU here and in the GPU kernels. Scales are
//! the same either way; only the codes (and the dequantized values) change.
//!
//! Tensors of any other dtype are copied through unchanged and reported as
//! skipped. The metadata keeps the input's own keys and describes this
//! output only (old `mxswitch.*` keys are dropped): the format and every
//! setting it takes, `mxswitch.sr` being the key (`7,3,1`) or `none`.
//!
//! Input that is not finite (NaN or Inf) is refused for every format. A
//! finite block whose scale overflows (EVEN near f32's largest value gives
//! the NaN scale, SPEC section 2) or that dequantizes to Inf is written as
//! the SPEC says, with a warning naming the scale modes that avoid it.
//!
//! Output safety (see `crate::files`): nothing is written unless every
//! tensor quantized. The output goes to a temporary file in its folder,
//! renamed into place at the end and removed on any failure, SIGINT or
//! SIGTERM. An existing output must be a regular file, or a symlink to one
//! (written through, the link kept); a folder, device, FIFO, socket or
//! dangling symlink is refused, and so is the input file itself.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::io::{self, Write as _};
use std::path::PathBuf;

use clap::builder::{PossibleValuesParser, StringValueParser, TypedValueParser};
use mxswitch::files::{self, FileError};
use mxswitch::runtime::quant::dispatch::{
    quantize, QuantFlag, QuantFormat, QuantOptions, Quantized,
};
use mxswitch::runtime::quant::{ScaleMode, SrKey};
use mxswitch::st_file::{self, printable, StTensor};
use safetensors::tensor::Dtype;

/// Arguments of `mxswitch quantize`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
For every f32, bf16 or f16 tensor NAME the output holds NAME.codes (U8), NAME.scales \
(U8 E8M0 bytes for MX formats, U8 E4M3 bytes for nvfp4, F32 for the FP8 formats: [1] \
tensorwise, one per row or 1x128 block otherwise), for nvfp4 NAME.tensor_scale (F32 [1]), \
and NAME.dequant (F32). Tensors of other dtypes are copied unchanged. NaN or Inf input \
is refused; blocks whose scale overflows are reported as a warning.")]
pub struct QuantizeArgs {
    /// Target format: MX block scaling (32 elements share an E8M0 scale),
    /// NVFP4 (16 E2M1 elements share an E4M3 scale under an f32 tensor
    /// scale), FP8 with one tensorwise scale, or E4M3 with one f32 scale per
    /// row (fp8-rowwise) or per 1x128 block (fp8-block).
    #[arg(long, value_name = "FORMAT", value_parser = format_parser())]
    pub format: QuantFormat,

    /// How the E8M0 block scale is chosen from the block amax (MX formats only)
    /// [default: even for mxfp4, rceil for mxfp8].
    #[arg(long, value_name = "MODE", value_parser = scale_mode_parser())]
    pub scale_mode: Option<ScaleMode>,

    /// Quantization axis of the blocks or rows; negative counts from the end
    /// (every format but tensorwise FP8) [default: -1].
    #[arg(long, value_name = "I", allow_negative_numbers = true)]
    pub axis: Option<isize>,

    /// One scale per 32x32 (MX), 16x16 (nvfp4) or 128x128 (fp8-block) tile
    /// of a 2-D tensor, stored repeated over the tile's rows (those formats only).
    #[arg(long)]
    pub tile2d: bool,

    /// Rotate each group of 16 elements along the axis by (1/4) H16 before
    /// quantizing; the dequantized output is rotated back (MX formats and
    /// nvfp4 only).
    #[arg(long)]
    pub hadamard: bool,

    /// Round the FP8 scales down to powers of two (FP8 formats only)
    /// [default: the recipe's: true for fp8-rowwise, false for the others].
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set,
          value_parser = clap::builder::BoolValueParser::new())]
    pub pow2: Option<bool>,

    /// Round the elements stochastically under the Philox key SEED,STEP,TENSOR_ID
    /// (three unsigned decimal integers; STEP and TENSOR_ID count modulo 2^32),
    /// as a recipe rounds a gradient, instead of to nearest even (MX formats
    /// and nvfp4 only).
    #[arg(long, value_name = "SEED,STEP,TENSOR_ID", value_parser = sr_key_parser())]
    pub sr: Option<SrKey>,

    /// The safetensors file to quantize (a regular file).
    #[arg(long, value_name = "IN.safetensors")]
    pub input: PathBuf,

    /// Where to write the quantized tensors, replaced only on success. An
    /// existing path must be a regular file or a symlink to one (written
    /// through, the link kept); folders, devices, FIFOs, sockets, dangling
    /// symlinks and the input file itself are refused.
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

/// `--sr`: the runtime's text form of a stochastic-rounding key.
fn sr_key_parser() -> impl TypedValueParser<Value = SrKey> {
    StringValueParser::new().try_map(|s| s.parse::<SrKey>())
}

/// Why `mxswitch quantize` failed. Every message is one line; tensor names
/// in it are [`printable`].
#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    /// An option that the format does not take (checked by the runtime).
    #[error("{0}")]
    Options(mxswitch::runtime::Error),
    /// The input could not be read or the output not written.
    #[error("{0}")]
    File(#[from] FileError),
    #[error(
        "--output `{}` is the input file `{}` itself; write to another path",
        output.display(), input.display()
    )]
    SameFile { input: PathBuf, output: PathBuf },
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
    /// NaN or Inf in the input: no format can scale it (SPEC section 3).
    #[error(
        "tensor `{name}` holds {count} non-finite value(s) (NaN or Inf) among {total}; \
         quantizing needs finite input: look for NaN or Inf upstream"
    )]
    NonFinite {
        name: String,
        count: usize,
        total: usize,
    },
    /// The runtime refused one tensor (axis out of range, tiles on a tensor
    /// that is not 2-D, ...).
    #[error("tensor `{name}`: {source}")]
    Tensor {
        name: String,
        source: mxswitch::runtime::Error,
    },
}

/// Run `mxswitch quantize`.
pub fn run(args: &QuantizeArgs) -> Result<(), QuantizeError> {
    // From here on, a signal removes the temporary output and exits with 130.
    files::interrupt::install();
    let opts = QuantOptions {
        scale_mode: args.scale_mode,
        axis: args.axis,
        tile2d: args.tile2d,
        hadamard: args.hadamard,
        pow2: args.pow2,
        sr: args.sr,
    };
    check_options(args.format, &opts)?;
    if files::same_file(&args.input, &args.output) {
        return Err(QuantizeError::SameFile {
            input: args.input.clone(),
            output: args.output.clone(),
        });
    }
    // Refuse a bad output before the work, not after it.
    files::output_target(&args.output)?;

    // Bounded by the file's real size: a device or FIFO is refused.
    let bytes = files::read_regular(&args.input, u64::MAX)?;
    let (inputs, in_metadata) =
        st_file::parse(&bytes).map_err(|reason| QuantizeError::NotSafetensors {
            path: args.input.clone(),
            reason,
        })?;
    if !inputs.iter().any(|t| is_float(t.dtype)) {
        return Err(QuantizeError::NoFloatTensor {
            path: args.input.clone(),
            found: describe_contents(&inputs),
        });
    }
    check_output_names(&inputs, args.format)?;
    let metadata = output_metadata(in_metadata, args.format, &opts);

    // Quantize while the temporary file exists, so an interrupt at any
    // point of the run removes it; a quantization error is kept aside.
    let mut failure = None;
    let mut done = None;
    let written = files::write_atomically(&args.output, |file| {
        match quantize_all(&inputs, args.format, &opts) {
            Ok((outputs, report)) => {
                let views: Vec<StTensor> = outputs
                    .iter()
                    .map(|(name, t)| StTensor {
                        name: name.clone(),
                        dtype: t.dtype,
                        shape: t.shape.clone(),
                        data: &t.data,
                    })
                    .collect();
                st_file::write(file, &views, &metadata)?;
                done = Some(report);
                Ok(())
            }
            Err(e) => {
                failure = Some(e);
                Err(io::Error::other("quantization failed"))
            }
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    written?;
    // A successful write always stored its report.
    let (rows, warnings) = done.unwrap_or_default();

    let quantized = rows.iter().filter(|r| r.result.is_some()).count();
    let summary = format!(
        "wrote {}: {quantized} tensor(s) quantized to {}, {} copied unchanged",
        args.output.display(),
        describe_format(args.format, &opts),
        rows.len() - quantized
    );
    // The file is written; a closed stdout (`| head`) or stderr is no
    // reason to fail or, as `print!` would, to panic.
    let _ = writeln!(io::stdout().lock(), "{}{summary}", render_table(&rows));
    let mut err = io::stderr().lock();
    for w in &warnings {
        let _ = writeln!(err, "warning: {w}");
    }
    Ok(())
}

/// The output tensors in name order, the table rows and the warnings.
type Quantization<'a> = (Vec<(String, OutTensor<'a>)>, (Vec<Row>, Vec<ScaleTrouble>));

/// Quantize every float tensor of `inputs` and copy the others.
fn quantize_all<'a>(
    inputs: &[StTensor<'a>],
    format: QuantFormat,
    opts: &QuantOptions,
) -> Result<Quantization<'a>, QuantizeError> {
    let mut outputs = Vec::with_capacity(inputs.len() * suffixes(format).len());
    let mut rows = Vec::with_capacity(inputs.len());
    let mut warnings = Vec::new();
    for t in inputs {
        let Some(x) = widen(t.dtype, t.data) else {
            let copy = OutTensor::new(t.dtype, t.shape.clone(), Cow::Borrowed(t.data));
            outputs.push((t.name.clone(), copy));
            rows.push(Row::skipped(t));
            continue;
        };
        let q = quantize_one(t, &x, format, opts)?;
        for (suffix, out) in suffixes(format).iter().zip(q.outputs) {
            outputs.push((format!("{}.{suffix}", t.name), out));
        }
        rows.push(q.row);
        warnings.extend(q.trouble);
    }
    outputs.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((outputs, (rows, warnings)))
}

/// Reject an option the format does not take before any file is read. The
/// rule belongs to the runtime (`QuantOptions::check`, which `quantize`
/// runs too); what depends on each tensor's rank (tiles, the axis) is
/// checked when it is quantized.
fn check_options(format: QuantFormat, opts: &QuantOptions) -> Result<(), QuantizeError> {
    opts.check(format).map_err(QuantizeError::Options)
}

/// The dtypes this command quantizes.
fn is_float(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16)
}

/// f32 values of a tensor this command quantizes (bf16 and f16 widen
/// exactly); `None` for any other dtype.
fn widen(dtype: Dtype, data: &[u8]) -> Option<Vec<f32>> {
    if is_float(dtype) {
        mxswitch::st_file::floats(dtype, data)
    } else {
        None
    }
}

/// "2 tensor(s): ids (I64), mask (BOOL)" for the no-float-tensor error,
/// naming at most the first few.
fn describe_contents(inputs: &[StTensor]) -> String {
    const SHOWN: usize = 5;
    if inputs.is_empty() {
        return "no tensors at all".into();
    }
    let mut list: Vec<String> = inputs
        .iter()
        .take(SHOWN)
        .map(|t| format!("{} ({:?})", printable(&t.name), t.dtype))
        .collect();
    if inputs.len() > SHOWN {
        list.push(format!("and {} more", inputs.len() - SHOWN));
    }
    format!("{} tensor(s): {}", inputs.len(), list.join(", "))
}

/// The suffixes of the tensors written for each quantized tensor, in the
/// order [`QuantizedTensor::outputs`] holds them.
fn suffixes(format: QuantFormat) -> &'static [&'static str] {
    match format {
        QuantFormat::Nvfp4 => &["codes", "scales", "tensor_scale", "dequant"],
        _ => &["codes", "scales", "dequant"],
    }
}

/// Fail before quantizing if two outputs would share a name, e.g. an input
/// tensor `w.codes` beside a float tensor `w`.
fn check_output_names(inputs: &[StTensor], format: QuantFormat) -> Result<(), QuantizeError> {
    let mut seen: HashMap<String, &str> = HashMap::new();
    for t in inputs {
        let names: Vec<String> = if is_float(t.dtype) {
            suffixes(format)
                .iter()
                .map(|s| format!("{}.{s}", t.name))
                .collect()
        } else {
            vec![t.name.clone()]
        };
        for name in names {
            if let Some(first) = seen.insert(name.clone(), &t.name) {
                return Err(QuantizeError::NameClash {
                    name: printable(&name),
                    first: printable(first),
                    second: printable(&t.name),
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

/// What quantizing one tensor produced.
struct QuantizedTensor {
    /// Codes, scales (nvfp4: and the tensor scale) and the dequantized
    /// tensor, in [`suffixes`] order.
    outputs: Vec<OutTensor<'static>>,
    row: Row,
    /// Set when finite input got the NaN scale or dequantized to Inf.
    trouble: Option<ScaleTrouble>,
}

/// Quantize one float tensor whose values, widened to f32, are `x`.
fn quantize_one(
    t: &StTensor,
    x: &[f32],
    format: QuantFormat,
    opts: &QuantOptions,
) -> Result<QuantizedTensor, QuantizeError> {
    let name = printable(&t.name);
    let non_finite = x.iter().filter(|v| !v.is_finite()).count();
    if non_finite > 0 {
        return Err(QuantizeError::NonFinite {
            name,
            count: non_finite,
            total: x.len(),
        });
    }
    let q = quantize(x, &t.shape, format, opts, &name).map_err(|source| QuantizeError::Tensor {
        name: name.clone(),
        source,
    })?;
    let dequant = q.dequantize();
    let saturated = q.saturated(x);
    let trouble = ScaleTrouble::find(&name, x, &t.shape, format, opts, &q, &dequant);
    let mut outputs = match q {
        Quantized::Mx(m) => vec![
            OutTensor::u8(m.codes_shape(), m.codes_in_input_layout()),
            OutTensor::u8(m.scales_shape(), m.scales_in_input_layout()),
        ],
        Quantized::Fp8(f) => vec![
            OutTensor::u8(t.shape.clone(), f.codes),
            OutTensor::f32(vec![1], &[f.scale]),
        ],
        Quantized::Nvfp4(n) => vec![
            OutTensor::u8(n.codes_shape(), n.codes_in_input_layout()),
            OutTensor::u8(n.scales_shape(), n.scales_in_input_layout()),
            OutTensor::f32(vec![1], &[n.tensor_scale]),
        ],
        Quantized::Fp8Group(g) => vec![
            OutTensor::u8(g.codes_shape(), g.codes_in_input_layout()),
            OutTensor::f32(g.scales_shape(), &g.scales_in_input_layout()),
        ],
    };
    let result = Metrics::new(x, &dequant, saturated);
    outputs.push(OutTensor::f32(t.shape.clone(), &dequant));
    let row = Row {
        name,
        shape: t.shape.clone(),
        format: format.name().to_string(),
        result: Some(result),
    };
    Ok(QuantizedTensor {
        outputs,
        row,
        trouble,
    })
}

/// Finite input that the chosen scales could not represent: blocks given
/// the NaN scale because their scale overflowed (MX), and elements whose
/// dequantized value overflowed to Inf (MX, and FP8 with power-of-two
/// scales, whose inverse can be up to twice the exact one's).
#[derive(Debug)]
struct ScaleTrouble {
    name: String,
    /// The setting at fault: "scale mode even", "power-of-two scales".
    setting: String,
    nan_blocks: usize,
    blocks: usize,
    inf_elements: usize,
    /// The flag whose other values are tried (`--scale-mode`, `--pow2`).
    flag: &'static str,
    /// Its values under which the tensor dequantizes finite.
    avoided_by: Vec<&'static str>,
}

impl ScaleTrouble {
    /// Check a quantized finite tensor `x`; the other settings are tried
    /// only when there is trouble.
    fn find(
        name: &str,
        x: &[f32],
        shape: &[usize],
        format: QuantFormat,
        opts: &QuantOptions,
        q: &Quantized,
        dequant: &[f32],
    ) -> Option<ScaleTrouble> {
        let (nan_blocks, blocks) = q.nan_scales();
        let inf_elements = dequant.iter().filter(|v| v.is_infinite()).count();
        if nan_blocks == 0 && inf_elements == 0 {
            return None;
        }
        let fine = |other: &QuantOptions| {
            quantize(x, shape, format, other, name).is_ok_and(|q| {
                q.nan_scales().0 == 0 && q.dequantize().iter().all(|v| v.is_finite())
            })
        };
        let (setting, flag, avoided_by) = if let Some(cfg) = format.default_config() {
            let mode = opts.scale_mode.unwrap_or(cfg.scale_mode);
            let avoided_by = ScaleMode::ALL
                .into_iter()
                .filter(|&m| m != mode)
                .filter(|&m| {
                    fine(&QuantOptions {
                        scale_mode: Some(m),
                        ..*opts
                    })
                })
                .map(ScaleMode::name)
                .collect();
            (
                format!("scale mode {mode}"),
                QuantFlag::ScaleMode,
                avoided_by,
            )
        } else {
            // Only power-of-two FP8 scales can get here (NVFP4 and exact
            // FP8 scales dequantize finite input to finite values).
            let pow2 = opts.pow2.or(format.default_pow2())?;
            let other = QuantOptions {
                pow2: Some(!pow2),
                ..*opts
            };
            let avoided_by = fine(&other)
                .then_some(if pow2 { "false" } else { "true" })
                .into_iter()
                .collect();
            let setting = if pow2 {
                "power-of-two scales"
            } else {
                "exact scales"
            };
            (setting.to_string(), QuantFlag::Pow2, avoided_by)
        };
        Some(ScaleTrouble {
            name: name.to_string(),
            setting,
            nan_blocks,
            blocks,
            inf_elements,
            flag: flag.name(),
            avoided_by,
        })
    }
}

impl fmt::Display for ScaleTrouble {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tensor `{}` under {}: ", self.name, self.setting)?;
        let mut parts = Vec::new();
        if self.nan_blocks > 0 {
            parts.push(format!(
                "{} of {} block(s) got the NaN scale 0xFF because their scale overflowed, \
                 so they dequantize to NaN",
                self.nan_blocks, self.blocks
            ));
        }
        if self.inf_elements > 0 {
            parts.push(format!(
                "{} element(s) dequantize to Inf (code times scale overflows f32)",
                self.inf_elements
            ));
        }
        write!(f, "{}; ", parts.join(" and "))?;
        let flag = self.flag;
        match self.avoided_by.split_last() {
            None => write!(f, "no other value of {flag} avoids it"),
            Some((last, [])) => write!(f, "{flag} {last} avoids it"),
            Some((last, rest)) => {
                write!(f, "{flag} {} or {last} avoid it", rest.join(", "))
            }
        }
    }
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
    fn skipped(t: &StTensor) -> Self {
        Row {
            name: printable(&t.name),
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

/// "mxfp4 (scale even, axis -1, 32x32 tiles, hadamard)", "nvfp4 (axis -1,
/// 16x16 tiles, sr 7,3,1)", "fp8-rowwise (axis -1, pow2)" or "fp8-e4m3
/// (tensorwise)".
fn describe_format(format: QuantFormat, opts: &QuantOptions) -> String {
    let mut parts = Vec::new();
    if let Some(cfg) = format.default_config() {
        parts.push(format!(
            "scale {}",
            opts.scale_mode.unwrap_or(cfg.scale_mode)
        ));
    }
    if let QuantFormat::Fp8(_) = format {
        parts.push("tensorwise".into());
    } else {
        parts.push(format!("axis {}", opts.axis.unwrap_or(-1)));
    }
    if opts.tile2d {
        parts.push(match format {
            QuantFormat::Nvfp4 => "16x16 tiles".into(),
            QuantFormat::Fp8Block => "128x128 tiles".into(),
            _ => "32x32 tiles".into(),
        });
    }
    if opts.hadamard {
        parts.push("hadamard".into());
    }
    if let Some(key) = opts.sr {
        parts.push(format!("sr {key}"));
    }
    if opts.pow2.or(format.default_pow2()) == Some(true) {
        parts.push("pow2".into());
    }
    format!("{format} ({})", parts.join(", "))
}

/// The input's own `__metadata__` plus how this output was made, so a
/// reader can tell what the codes mean: every setting the format takes.
/// Every `mxswitch.*` key of the input is dropped: it described an earlier
/// quantization, not this one.
fn output_metadata(
    mut metadata: HashMap<String, String>,
    format: QuantFormat,
    opts: &QuantOptions,
) -> HashMap<String, String> {
    metadata.retain(|key, _| !key.starts_with("mxswitch."));
    metadata.insert("mxswitch.format".into(), format.name().into());
    if let Some(cfg) = format.default_config() {
        let mode = opts.scale_mode.unwrap_or(cfg.scale_mode);
        metadata.insert("mxswitch.scale_mode".into(), mode.name().into());
    }
    let mut set = |flag: QuantFlag, key: &str, value: String| {
        if format.takes(flag) {
            metadata.insert(format!("mxswitch.{key}"), value);
        }
    };
    set(QuantFlag::Axis, "axis", opts.axis.unwrap_or(-1).to_string());
    set(QuantFlag::Tile2d, "tile2d", opts.tile2d.to_string());
    set(QuantFlag::Hadamard, "hadamard", opts.hadamard.to_string());
    let pow2 = opts.pow2.or(format.default_pow2()).unwrap_or(false);
    set(QuantFlag::Pow2, "pow2", pow2.to_string());
    let sr = opts.sr.map_or_else(|| "none".into(), |key| key.to_string());
    set(QuantFlag::Sr, "sr", sr);
    metadata
}
