//! Quantizer launches: MX blocks (SPEC section 2) and FP8 tensorwise
//! (SPEC section 3), bit-exact with [`crate::quant::quantize_rows`] and
//! [`crate::quant::quantize_tensorwise`]. The kernels are in
//! `runtime/kernels/quantize_mx.cu` and `quantize_fp8.cu`.
//!
//! Inputs are f32 or BF16 (the `*_of` entry points take a [`DType`]); BF16
//! widens to f32 exactly, so the codes are the CPU's on the widened values.
//! FP8 also has a 2-D cast that writes a matrix's codes and/or their
//! transpose, zero-padded, from one read of the input
//! ([`CudaContext::quantize_fp8_2d`]).

use cudarc::driver::LaunchConfig;

use super::nvrtc::{launch_kernel, QUANTIZE_FP8, QUANTIZE_MX};
use super::storage::by_dtype;
use super::{CudaContext, CudaError, DevBuf, Result};
use crate::formats::ElemFormat;
use crate::quant::{mx::padded, MxConfig, ScaleMode, BLOCK};
use crate::DType;

/// Threads per CTA of the MX quantize kernels, one block each (QUANT_THREADS
/// in quantize_mx.cu).
const MX_QUANT_THREADS: u32 = 256;
/// Threads per CTA of the MX dequantize kernels = blocks per CTA (QTHREADS).
const MX_THREADS: u32 = 128;
/// Threads per CTA of the tile-scale and FP8 dequantize kernels.
const THREADS: u32 = 256;
/// Threads per CTA of the FP8 amax and scale reductions (AMAX_THREADS).
const AMAX_THREADS: u32 = 256;
/// CTAs per SM of the FP8 amax grid-stride loop: enough 16-byte loads in
/// flight to keep HBM busy, few enough partials for one reducing CTA.
const AMAX_CTAS_PER_SM: u64 = 8;
/// Threads per CTA of the FP8 casts (CAST_THREADS) and elements per thread
/// of the 1-D cast (CAST_ELEMS).
const CAST_THREADS: u32 = 256;
const CAST_ELEMS: u64 = 16;
/// Side of the square tile of the 2-D FP8 cast (TILE).
const CAST_TILE: u64 = 64;
/// Bytes of the FP8 state before the amax partials: amax, scale and
/// scale_inv, one 16-byte slot each (quantize_fp8.cu).
const FP8_STATE_BYTES: usize = 48;
const FP8_SCALE_INV_OFFSET: u64 = 32;

/// `phase` argument of quantize_mx_* (enum Phase in quantize_mx.cu) and
/// of nvfp4_tile_* (NV_PHASE_QUANTIZE and NV_PHASE_AMAX, the same values).
#[derive(Clone, Copy)]
#[repr(i32)]
pub(super) enum Phase {
    Quantize = 0,
    Amax = 1,
    EncodeFixed = 2,
}

/// An MX-quantized matrix on the device, in the CPU's axis-last layout
/// ([`crate::quant::MxTensor`] with `shape = [rows, len]`, `axis = 1`).
pub struct MxDevice {
    /// Rows of the axis-last view.
    pub rows: usize,
    /// Length of the quantization axis, before padding.
    pub len: usize,
    /// `len` rounded up to a multiple of 32.
    pub padded_len: usize,
    /// The settings it was quantized with.
    pub config: MxConfig,
    /// `[rows, padded_len]` codes, or `[rows, padded_len / 2]` packed E2M1 bytes.
    pub codes: DevBuf,
    /// `[rows, padded_len / 32]` E8M0 bytes.
    pub scales: DevBuf,
}

impl MxDevice {
    /// Number of 32-element blocks (and of scale bytes).
    pub fn nblocks(&self) -> usize {
        self.rows * self.padded_len / BLOCK
    }

    /// Bytes of `codes`.
    pub fn code_bytes(&self) -> usize {
        self.rows * self.padded_len * self.config.elem.bits() as usize / 8
    }
}

/// Which values a dequantization writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DequantLayout {
    /// `[rows, padded_len]`, in the rotated domain when the Hadamard option is
    /// on: the GEMM operand ([`crate::quant::MxTensor::dequantize_rows`]).
    Rows,
    /// `[rows, len]`, padding dropped and rotated back
    /// ([`crate::quant::MxTensor::dequantize`] of a `[rows, len]` tensor).
    Input,
}

/// A tensor quantized to FP8 with one dynamic scale, on the device.
pub struct Fp8Device {
    /// Number of elements (and of codes).
    pub numel: usize,
    /// The 8-bit element format of the codes.
    pub elem: ElemFormat,
    /// One code per element, in the input's order.
    pub codes: DevBuf,
    /// amax bits, scale and scale_inv, one 16-byte slot each.
    pub state: DevBuf,
}

/// The accessors of an FP8 result's scale state (its `state` field), one
/// definition for [`Fp8Device`] and [`Fp8Device2d`].
macro_rules! fp8_state_accessors {
    ($t:ty) => {
        impl $t {
            /// Device address of the amax bits (the state's first word).
            pub fn amax_ptr(&self) -> u64 {
                self.state.ptr()
            }

            /// Device address of scale_inv, the f32 a GEMM multiplies its
            /// result by (shared by both orientations of a 2-D cast).
            pub fn scale_inv_ptr(&self) -> u64 {
                state_scale_inv_ptr(&self.state)
            }

            /// (amax, scale, scale_inv), read back to the host (waits for the stream).
            pub fn read_scales(&self, ctx: &CudaContext) -> Result<(f32, f32, f32)> {
                read_state(ctx, &self.state)
            }

            /// SPEC section 3: a non-finite amax is an error naming the
            /// tensor. Waits for the stream, so callers batch it (for
            /// example once per step).
            pub fn check_finite(&self, ctx: &CudaContext, name: &str) -> Result<()> {
                check_state_finite(ctx, &self.state, name)
            }
        }
    };
}

fp8_state_accessors!(Fp8Device);
fp8_state_accessors!(Fp8Device2d);

/// Which orientations the 2-D FP8 cast writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8Outputs {
    /// The codes in the input's layout, `[rows_pad, cols_pad]`.
    pub rows: bool,
    /// The transposed codes, `[cols_pad, rows_pad]`.
    pub cols: bool,
}

/// A `[rows, cols]` matrix quantized to FP8 with one dynamic scale, with its
/// codes zero-padded and in one or both orientations (the operands of a
/// linear's GEMMs: x for fprop and x^T for wgrad, and so on).
pub struct Fp8Device2d {
    /// Rows of the input matrix, before padding.
    pub rows: usize,
    /// Columns of the input matrix, before padding.
    pub cols: usize,
    /// `[rows_pad, cols_pad]`: rows and cols rounded up to the padding asked for.
    pub padded: [usize; 2],
    /// The 8-bit element format of the codes.
    pub elem: ElemFormat,
    /// `[rows_pad, cols_pad]` codes, if asked for; padding is the zero code.
    pub codes: Option<DevBuf>,
    /// `[cols_pad, rows_pad]` codes (the transpose), if asked for.
    pub codes_t: Option<DevBuf>,
    /// amax bits, scale and scale_inv, one 16-byte slot each (as [`Fp8Device`]).
    pub state: DevBuf,
}

/// Device address of scale_inv in an FP8 state buffer.
pub fn state_scale_inv_ptr(state: &DevBuf) -> u64 {
    state.ptr() + FP8_SCALE_INV_OFFSET
}

/// (amax, scale, scale_inv) of an FP8 state buffer (waits for the stream).
pub fn read_state(ctx: &CudaContext, state: &DevBuf) -> Result<(f32, f32, f32)> {
    let w: Vec<u32> = ctx.download(state, FP8_STATE_BYTES / 4)?;
    Ok((
        f32::from_bits(w[0]),
        f32::from_bits(w[4]),
        f32::from_bits(w[8]),
    ))
}

fn check_state_finite(ctx: &CudaContext, state: &DevBuf, name: &str) -> Result<()> {
    let (amax, _, _) = read_state(ctx, state)?;
    if amax.is_finite() {
        Ok(())
    } else {
        Err(crate::Error::NonFiniteAmax {
            tensor: name.to_string(),
            amax,
        }
        .into())
    }
}

pub(crate) fn mode_arg(m: ScaleMode) -> i32 {
    match m {
        ScaleMode::Floor => 0,
        ScaleMode::Ceil => 1,
        ScaleMode::Even => 2,
        ScaleMode::Rceil => 3,
    }
}

/// Bytes per element of a quantizer input: f32 or BF16.
pub(super) fn input_size(dtype: DType) -> Result<usize> {
    match dtype {
        DType::F32 | DType::BF16 => Ok(dtype.size_in_bytes()),
        other => Err(CudaError::Invalid(format!(
            "quantizers read f32 or bf16 input, not {other:?}"
        ))),
    }
}

/// Refuses an input buffer `x` shorter than the `bytes` its `shape` of
/// `dtype` values need.
pub(super) fn check_holds(
    x: &DevBuf,
    bytes: usize,
    shape: std::fmt::Arguments,
    dtype: DType,
) -> Result<()> {
    if x.len_bytes() < bytes {
        return Err(CudaError::Invalid(format!(
            "{} bytes do not hold {shape} {dtype:?}",
            x.len_bytes()
        )));
    }
    Ok(())
}

/// The f32 or BF16 instance `<prefix><fmt>_f32` / `_bf16` of a kernel
/// (after [`input_size`] has checked the dtype).
macro_rules! by_input {
    ($dtype:expr, $prefix:literal, $fmt:literal) => {
        by_dtype(
            $dtype,
            concat!($prefix, $fmt, "_f32"),
            concat!($prefix, $fmt, "_bf16"),
        )
    };
}

/// Kernel names of one MX element format and input type (quantize_mx.cu).
struct MxKernels {
    /// Every option (Hadamard, SR, tile phases).
    quantize: &'static str,
    /// No Hadamard, SR or tiles: the production 1x32 path.
    quantize_plain: &'static str,
    tile_scales: &'static str,
    dequantize: &'static str,
    /// The BF16 GEMM operand ([`DequantLayout::Rows`]), 16 bytes a thread.
    dequantize_operand: &'static str,
}

fn mx_kernels(elem: ElemFormat, dtype: DType) -> Result<MxKernels> {
    macro_rules! names {
        ($fmt:literal) => {
            MxKernels {
                quantize: by_input!(dtype, "quantize_mx_", $fmt),
                quantize_plain: by_input!(dtype, "quantize_mx_plain_", $fmt),
                tile_scales: concat!("mx_tile_scales_", $fmt),
                dequantize: concat!("dequantize_mx_", $fmt),
                dequantize_operand: concat!("dequantize_mx_operand_", $fmt),
            }
        };
    }
    match elem {
        ElemFormat::E2M1 => Ok(names!("e2m1")),
        ElemFormat::E4M3FN => Ok(names!("e4m3fn")),
        other => Err(CudaError::Invalid(format!(
            "MX blocks hold e2m1 or e4m3fn elements, not {other}"
        ))),
    }
}

fn fp8_kernels(elem: ElemFormat, dtype: DType) -> Result<Fp8Kernels> {
    macro_rules! names {
        ($fmt:literal) => {
            (
                by_input!(dtype, "fp8_cast_", $fmt),
                by_input!(dtype, "fp8_cast_2d_", $fmt),
                concat!("fp8_dequantize_", $fmt),
            )
        };
    }
    let (cast, cast_2d, dequantize) = match elem {
        ElemFormat::E4M3FN => names!("e4m3fn"),
        ElemFormat::E5M2 => names!("e5m2"),
        ElemFormat::E4M3FNUZ => names!("e4m3fnuz"),
        ElemFormat::E5M2FNUZ => names!("e5m2fnuz"),
        ElemFormat::E2M1 => {
            return Err(CudaError::Invalid(
                "tensorwise FP8 needs an 8-bit element format, not e2m1".into(),
            ))
        }
    };
    Ok(Fp8Kernels {
        cast,
        cast_2d,
        dequantize,
    })
}

/// Kernel names of one FP8 element format and input type (quantize_fp8.cu).
pub(super) struct Fp8Kernels {
    cast: &'static str,
    cast_2d: &'static str,
    dequantize: &'static str,
}

/// A 1-D launch of `threads`-thread CTAs, each covering `per_cta` of `items`.
pub(super) fn grid(items: u64, per_cta: u64, threads: u32) -> Result<LaunchConfig> {
    let ctas = items.div_ceil(per_cta);
    if ctas > i32::MAX as u64 {
        return Err(CudaError::Invalid(format!(
            "{items} work items need {ctas} CTAs, over the grid limit"
        )));
    }
    Ok(LaunchConfig {
        grid_dim: (ctas.max(1) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    })
}

fn to_u32(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| CudaError::Invalid(format!("{what} = {v} does not fit in 32 bits")))
}

fn out_pointers(out: &DevBuf, dtype: DType) -> Result<(u64, u64)> {
    match dtype {
        DType::F32 => Ok((out.ptr(), 0)),
        DType::BF16 => Ok((0, out.ptr())),
        other => Err(CudaError::Invalid(format!(
            "dequantize writes f32 or bf16, not {other:?}"
        ))),
    }
}

impl CudaContext {
    /// MX-quantizes `rows` rows of `len` f32 or BF16 values (row-major in
    /// `x`), as [`crate::quant::quantize_rows`] does on the CPU, bit for bit.
    /// BF16 widens to f32 exactly, so the result is the CPU quantizer's on
    /// the widened values.
    pub fn quantize_mx_rows_of(
        &self,
        x: &DevBuf,
        dtype: DType,
        rows: usize,
        len: usize,
        cfg: &MxConfig,
    ) -> Result<MxDevice> {
        let size = input_size(dtype)?;
        let names = mx_kernels(cfg.elem, dtype)?;
        check_holds(
            x,
            rows * len * size,
            format_args!("{rows} rows of {len}"),
            dtype,
        )?;
        let padded_len = padded(len);
        let nb = padded_len / BLOCK;
        let nblocks = rows * nb;
        // The kernels number blocks (and their threads) in 32 bits.
        if nblocks + MX_QUANT_THREADS as usize > u32::MAX as usize {
            return Err(CudaError::Invalid(format!(
                "{rows} rows of {len} make {nblocks} MX blocks, over the 32-bit block index"
            )));
        }
        let q = MxDevice {
            rows,
            len,
            padded_len,
            config: *cfg,
            codes: self.alloc(rows * padded_len * cfg.elem.bits() as usize / 8)?,
            scales: self.alloc(nblocks)?,
        };
        if nblocks == 0 {
            return Ok(q);
        }
        let (rows32, len32, nb32) = (
            to_u32(rows, "rows")?,
            to_u32(len, "len")?,
            to_u32(nb, "blocks per row")?,
        );
        let mode = mode_arg(cfg.scale_mode);
        let hadamard = cfg.hadamard as i32;
        let (sr, seed_lo, seed_hi, step, tensor_id) = match cfg.sr {
            Some(k) => (
                1i32,
                k.seed as u32,
                (k.seed >> 32) as u32,
                k.step as u32,
                k.tensor_id as u32,
            ),
            None => (0, 0, 0, 0, 0),
        };
        let plain = !cfg.hadamard && cfg.sr.is_none() && !cfg.tile2d;
        let name = if plain {
            names.quantize_plain
        } else {
            names.quantize
        };
        let cfg_q = grid(nblocks as u64, MX_QUANT_THREADS as u64, MX_QUANT_THREADS)?;
        let (xp, cp, sp) = (x.ptr(), q.codes.ptr(), q.scales.ptr());
        // As quantize_mx_* in quantize_mx.cu: x, codes and scales from the
        // pool, 256-byte aligned for its 16-byte loads and stores.
        let launch = |phase: Phase, amax_ptr: u64| -> Result<()> {
            let phase = phase as i32;
            launch_kernel!(
                self,
                &QUANTIZE_MX,
                name,
                cfg_q,
                &xp,
                &cp,
                &sp,
                &amax_ptr,
                &rows32,
                &len32,
                &nb32,
                &mode,
                &phase,
                &hadamard,
                &sr,
                &seed_lo,
                &seed_hi,
                &step,
                &tensor_id
            )
        };
        if !cfg.tile2d {
            launch(Phase::Quantize, 0)?;
            return Ok(q);
        }
        // 32x32 tiles: per-block amax, per-tile scale bytes, then encode.
        let amax = self.alloc(nblocks * 4)?;
        launch(Phase::Amax, amax.ptr())?;
        let ntiles = rows.div_ceil(BLOCK) * nb;
        let ap = amax.ptr();
        let cfg_t = grid(ntiles as u64, THREADS as u64, THREADS)?;
        // As mx_tile_scales_* in quantize_mx.cu.
        launch_kernel!(
            self,
            &QUANTIZE_MX,
            names.tile_scales,
            cfg_t,
            &ap,
            &sp,
            &rows32,
            &nb32,
            &mode
        )?;
        launch(Phase::EncodeFixed, 0)?;
        Ok(q)
    }

    /// Dequantizes `q` to f32 or BF16 ([`DequantLayout`] says which values).
    pub fn dequantize_mx(
        &self,
        q: &MxDevice,
        layout: DequantLayout,
        dtype: DType,
    ) -> Result<DevBuf> {
        let names = mx_kernels(q.config.elem, DType::F32)?;
        let (out_len, unrotate) = match layout {
            DequantLayout::Rows => (q.padded_len, 0i32),
            DequantLayout::Input => (q.len, q.config.hadamard as i32),
        };
        let out = self.alloc(q.rows * out_len * dtype.size_in_bytes())?;
        let (of, ob) = out_pointers(&out, dtype)?;
        let nblocks = q.nblocks();
        if nblocks == 0 {
            return Ok(out);
        }
        let (cp, sp) = (q.codes.ptr(), q.scales.ptr());
        if layout == DequantLayout::Rows && dtype == DType::BF16 {
            // One thread per 8 elements: nblocks * 4 of them.
            let octets = (nblocks * (BLOCK / 8)) as u64;
            let op = out.ptr();
            // As dequantize_mx_operand_*: codes and scales of nblocks blocks, out nblocks * 32 BF16.
            launch_kernel!(
                self,
                &QUANTIZE_MX,
                names.dequantize_operand,
                grid(octets, MX_THREADS as u64, MX_THREADS)?,
                &cp,
                &sp,
                &op,
                &octets
            )?;
            return Ok(out);
        }
        let rows32 = to_u32(q.rows, "rows")?;
        let nb32 = to_u32(q.padded_len / BLOCK, "blocks per row")?;
        let out_len32 = to_u32(out_len, "row length")?;
        // As dequantize_mx_* in quantize_mx.cu; `out` holds rows * out_len elements.
        launch_kernel!(
            self,
            &QUANTIZE_MX,
            names.dequantize,
            grid(nblocks as u64, MX_THREADS as u64, MX_THREADS)?,
            &cp,
            &sp,
            &of,
            &ob,
            &rows32,
            &nb32,
            &out_len32,
            &out_len32,
            &unrotate
        )?;
        Ok(out)
    }

    /// FP8 tensorwise quantization of `numel` f32 or BF16 values (SPEC
    /// section 3), bit for bit as [`crate::quant::quantize_tensorwise`] (of
    /// the widened values for BF16): amax and scale, then the cast. Runs
    /// without waiting for the device: call [`Fp8Device::check_finite`] to
    /// get the CPU's non-finite-amax error.
    pub fn quantize_fp8_of(
        &self,
        x: &DevBuf,
        dtype: DType,
        numel: usize,
        elem: ElemFormat,
        pow2: bool,
    ) -> Result<Fp8Device> {
        let (state, names) = self.fp8_amax_scale((x, dtype, numel), elem, pow2)?;
        let q = Fp8Device {
            numel,
            elem,
            codes: self.alloc(numel)?,
            state,
        };
        let n = numel as u64;
        if n > 0 {
            let (xp, stp, cp) = (x.ptr(), q.state.ptr(), q.codes.ptr());
            let threads = n.div_ceil(CAST_ELEMS);
            // As fp8_cast_* in quantize_fp8.cu (16-byte accesses to x and codes).
            let cfg = grid(threads, CAST_THREADS as u64, CAST_THREADS)?;
            launch_kernel!(self, &QUANTIZE_FP8, names.cast, cfg, &xp, &stp, &cp, &n)?;
        }
        Ok(q)
    }

    /// The FP8 scale state of `numel` f32 or BF16 values (amax, scale and
    /// scale_inv in the slots [`Fp8Device`] documents, then the per-CTA
    /// partials of the amax) and the kernels of `elem` for `dtype`. Two
    /// launches, no host sync.
    pub(super) fn fp8_amax_scale(
        &self,
        (x, dtype, numel): (&DevBuf, DType, usize),
        elem: ElemFormat,
        pow2: bool,
    ) -> Result<(DevBuf, Fp8Kernels)> {
        let size = input_size(dtype)?;
        let names = fp8_kernels(elem, dtype)?;
        check_holds(x, numel * size, format_args!("{numel}"), dtype)?;
        let n = numel as u64;
        // 16-byte vectors of the input, spread over a few CTAs per SM.
        let vectors = n / (16 / size as u64);
        let sms = self.info().multiprocessors.max(1) as u64;
        let parts: u64 = if n == 0 {
            0
        } else {
            vectors
                .div_ceil(AMAX_THREADS as u64)
                .clamp(1, sms * AMAX_CTAS_PER_SM)
        };
        let state = self.alloc(FP8_STATE_BYTES + 4 * parts as usize)?;
        let (xp, stp) = (x.ptr(), state.ptr());
        if parts > 0 {
            // As fp8_amax_* in quantize_fp8.cu; the state holds `parts` partials.
            let cfg = grid(parts, 1, AMAX_THREADS)?;
            let amax = by_dtype(dtype, "fp8_amax_f32", "fp8_amax_bf16");
            launch_kernel!(self, &QUANTIZE_FP8, amax, cfg, &xp, &n, &stp)?;
        }
        let (parts32, fmt_max, pow2) = (parts as u32, elem.max_value(), pow2 as i32);
        // As fp8_scale in quantize_fp8.cu (one CTA).
        let cfg = grid(1, 1, AMAX_THREADS)?;
        launch_kernel!(
            self,
            &QUANTIZE_FP8,
            "fp8_scale",
            cfg,
            &stp,
            &parts32,
            &fmt_max,
            &pow2
        )?;
        Ok((state, names))
    }

    /// FP8 tensorwise quantization of a row-major `[rows, cols]` f32 or BF16
    /// matrix, writing the codes `[rows_pad, cols_pad]` and/or their
    /// transpose `[cols_pad, rows_pad]` as `outputs` asks, where rows_pad and
    /// cols_pad are rows and cols rounded up to a multiple of `pad_to` and
    /// the padding is the zero code. One read of the input for both.
    #[allow(clippy::too_many_arguments)]
    pub fn quantize_fp8_2d(
        &self,
        x: &DevBuf,
        dtype: DType,
        rows: usize,
        cols: usize,
        elem: ElemFormat,
        pow2: bool,
        pad_to: usize,
        outputs: Fp8Outputs,
    ) -> Result<Fp8Device2d> {
        if pad_to == 0 {
            return Err(CudaError::Invalid("pad_to must be at least 1".into()));
        }
        let (state, names) = self.fp8_amax_scale((x, dtype, rows * cols), elem, pow2)?;
        let (rows_pad, cols_pad) = (rows.next_multiple_of(pad_to), cols.next_multiple_of(pad_to));
        let bytes = rows_pad * cols_pad;
        let q = Fp8Device2d {
            rows,
            cols,
            padded: [rows_pad, cols_pad],
            elem,
            codes: outputs.rows.then(|| self.alloc(bytes)).transpose()?,
            codes_t: outputs.cols.then(|| self.alloc(bytes)).transpose()?,
            state,
        };
        if bytes == 0 || !(outputs.rows || outputs.cols) {
            return Ok(q);
        }
        let (rows32, cols32, rows_pad32, cols_pad32) = (
            to_u32(rows, "rows")?,
            to_u32(cols, "cols")?,
            to_u32(rows_pad, "padded rows")?,
            to_u32(cols_pad, "padded cols")?,
        );
        let ptr = |b: &Option<DevBuf>| b.as_ref().map_or(0, DevBuf::ptr);
        let (xp, stp, cp, ctp) = (x.ptr(), q.state.ptr(), ptr(&q.codes), ptr(&q.codes_t));
        let tiles = (rows_pad as u64).div_ceil(CAST_TILE) * (cols_pad as u64).div_ceil(CAST_TILE);
        // As fp8_cast_2d_* in quantize_fp8.cu; each output holds rows_pad *
        // cols_pad bytes (a null one is skipped); 16-byte accesses are used
        // only where the row lengths keep them aligned.
        launch_kernel!(
            self,
            &QUANTIZE_FP8,
            names.cast_2d,
            grid(tiles, 1, CAST_THREADS)?,
            &xp,
            &stp,
            &cp,
            &ctp,
            &rows32,
            &cols32,
            &rows_pad32,
            &cols_pad32
        )?;
        Ok(q)
    }

    /// decode(code) * scale_inv for every element, as f32 or BF16.
    pub fn dequantize_fp8(&self, q: &Fp8Device, dtype: DType) -> Result<DevBuf> {
        let names = fp8_kernels(q.elem, DType::F32)?;
        let out = self.alloc(q.numel * dtype.size_in_bytes())?;
        let (of, ob) = out_pointers(&out, dtype)?;
        let n = q.numel as u64;
        if n == 0 {
            return Ok(out);
        }
        let (cp, stp) = (q.codes.ptr(), q.state.ptr());
        // As fp8_dequantize_* in quantize_fp8.cu.
        let cfg = grid(n, THREADS as u64, THREADS)?;
        launch_kernel!(
            self,
            &QUANTIZE_FP8,
            names.dequantize,
            cfg,
            &cp,
            &stp,
            &of,
            &ob,
            &n
        )?;
        Ok(out)
    }
}
