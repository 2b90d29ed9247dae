//! Quantizer launches: MX blocks (SPEC section 2) and FP8 tensorwise
//! (SPEC section 3), bit-exact with [`crate::quant::quantize_rows`] and
//! [`crate::quant::quantize_tensorwise`]. The kernels are in
//! `runtime/kernels/quantize_mx.cu` and `quantize_fp8.cu`.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::nvrtc::{QUANTIZE_FP8, QUANTIZE_MX};
use super::{driver_err, CudaContext, CudaError, DevBuf, Result};
use crate::formats::ElemFormat;
use crate::quant::{mx::padded, MxConfig, ScaleMode, BLOCK};
use crate::DType;

/// Threads per CTA of the MX kernels = blocks per CTA (QTHREADS in quantize_mx.cu).
const MX_THREADS: u32 = 128;
/// Threads per CTA of the tile-scale, FP8 cast and dequantize kernels.
const THREADS: u32 = 256;
/// Most CTAs of the FP8 amax reduction (each ends in one atomicMax).
const AMAX_MAX_CTAS: u64 = 1024;
/// Elements per thread of the FP8 cast (CAST_VEC in quantize_fp8.cu).
const CAST_VEC: u64 = 4;
/// Byte offsets in the FP8 state buffer (16-byte slots; quantize_fp8.cu).
const FP8_STATE_BYTES: usize = 48;
const FP8_SCALE_INV_OFFSET: u64 = 32;

/// `phase` argument of quantize_mx_* (enum Phase in quantize_mx.cu).
const PHASE_QUANTIZE: i32 = 0;
const PHASE_AMAX: i32 = 1;
const PHASE_ENCODE_FIXED: i32 = 2;

/// An MX-quantized matrix on the device, in the CPU's axis-last layout
/// ([`crate::quant::MxTensor`] with `shape = [rows, len]`, `axis = 1`).
pub struct MxDevice {
    pub rows: usize,
    pub len: usize,
    /// `len` rounded up to a multiple of 32.
    pub padded_len: usize,
    pub config: MxConfig,
    /// `[rows, padded_len]` codes, or `[rows, padded_len / 2]` packed E2M1 bytes.
    pub codes: DevBuf,
    /// `[rows, padded_len / 32]` E8M0 bytes.
    pub scales: DevBuf,
}

impl MxDevice {
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
    pub numel: usize,
    pub elem: ElemFormat,
    pub codes: DevBuf,
    /// amax bits, scale and scale_inv, one 16-byte slot each.
    pub state: DevBuf,
}

impl Fp8Device {
    /// Device address of scale_inv, the f32 a GEMM multiplies its result by.
    pub fn scale_inv_ptr(&self) -> u64 {
        self.state.ptr() + FP8_SCALE_INV_OFFSET
    }

    /// (amax, scale, scale_inv), read back to the host (waits for the stream).
    pub fn read_scales(&self, ctx: &CudaContext) -> Result<(f32, f32, f32)> {
        let w: Vec<u32> = ctx.download(&self.state, FP8_STATE_BYTES / 4)?;
        Ok((
            f32::from_bits(w[0]),
            f32::from_bits(w[4]),
            f32::from_bits(w[8]),
        ))
    }

    /// SPEC section 3: a non-finite amax is an error naming the tensor. Waits
    /// for the stream, so callers batch it (for example once per step).
    pub fn check_finite(&self, ctx: &CudaContext, name: &str) -> Result<()> {
        let (amax, _, _) = self.read_scales(ctx)?;
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
}

fn mode_arg(m: ScaleMode) -> i32 {
    match m {
        ScaleMode::Floor => 0,
        ScaleMode::Ceil => 1,
        ScaleMode::Even => 2,
        ScaleMode::Rceil => 3,
    }
}

/// Kernel names of one MX element format (quantize_mx.cu).
struct MxKernels {
    quantize: &'static str,
    tile_scales: &'static str,
    dequantize: &'static str,
}

fn mx_kernels(elem: ElemFormat) -> Result<MxKernels> {
    match elem {
        ElemFormat::E2M1 => Ok(MxKernels {
            quantize: "quantize_mx_e2m1",
            tile_scales: "mx_tile_scales_e2m1",
            dequantize: "dequantize_mx_e2m1",
        }),
        ElemFormat::E4M3FN => Ok(MxKernels {
            quantize: "quantize_mx_e4m3fn",
            tile_scales: "mx_tile_scales_e4m3fn",
            dequantize: "dequantize_mx_e4m3fn",
        }),
        other => Err(CudaError::Invalid(format!(
            "MX blocks hold e2m1 or e4m3fn elements, not {other}"
        ))),
    }
}

/// Kernel names of one FP8 element format (quantize_fp8.cu).
struct Fp8Kernels {
    cast: &'static str,
    dequantize: &'static str,
}

fn fp8_kernels(elem: ElemFormat) -> Result<Fp8Kernels> {
    let (cast, dequantize) = match elem {
        ElemFormat::E4M3FN => ("fp8_cast_e4m3fn", "fp8_dequantize_e4m3fn"),
        ElemFormat::E5M2 => ("fp8_cast_e5m2", "fp8_dequantize_e5m2"),
        ElemFormat::E4M3FNUZ => ("fp8_cast_e4m3fnuz", "fp8_dequantize_e4m3fnuz"),
        ElemFormat::E5M2FNUZ => ("fp8_cast_e5m2fnuz", "fp8_dequantize_e5m2fnuz"),
        ElemFormat::E2M1 => {
            return Err(CudaError::Invalid(
                "tensorwise FP8 needs an 8-bit element format, not e2m1".into(),
            ))
        }
    };
    Ok(Fp8Kernels { cast, dequantize })
}

/// A 1-D launch of `threads`-thread CTAs, each covering `per_cta` of `items`.
fn grid(items: u64, per_cta: u64, threads: u32) -> Result<LaunchConfig> {
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
    /// MX-quantizes `rows` rows of `len` f32 (row-major in `x`), as
    /// [`crate::quant::quantize_rows`] does on the CPU, bit for bit.
    pub fn quantize_mx_rows(
        &self,
        x: &DevBuf,
        rows: usize,
        len: usize,
        cfg: &MxConfig,
    ) -> Result<MxDevice> {
        let names = mx_kernels(cfg.elem)?;
        if x.len_bytes() < rows * len * 4 {
            return Err(CudaError::Invalid(format!(
                "{} bytes do not hold {rows} rows of {len} f32",
                x.len_bytes()
            )));
        }
        let padded_len = padded(len);
        let nb = padded_len / BLOCK;
        let nblocks = rows * nb;
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
        let quantize = self.function(&QUANTIZE_MX, names.quantize)?;
        let cfg_q = grid(nblocks as u64, MX_THREADS as u64, MX_THREADS)?;
        let (xp, cp, sp) = (x.ptr(), q.codes.ptr(), q.scales.ptr());
        self.bind()?;
        let launch = |phase: i32, amax_ptr: u64| -> Result<()> {
            let mut b = self.stream().launch_builder(&quantize);
            b.arg(&xp)
                .arg(&cp)
                .arg(&sp)
                .arg(&amax_ptr)
                .arg(&rows32)
                .arg(&len32)
                .arg(&nb32)
                .arg(&mode)
                .arg(&phase)
                .arg(&hadamard)
                .arg(&sr)
                .arg(&seed_lo)
                .arg(&seed_hi)
                .arg(&step)
                .arg(&tensor_id);
            // SAFETY: argument types and buffer sizes match quantize_mx_* in quantize_mx.cu.
            unsafe { b.launch(cfg_q) }
                .map(|_| ())
                .map_err(driver_err(format!("launch {}", names.quantize)))
        };
        if !cfg.tile2d {
            launch(PHASE_QUANTIZE, 0)?;
            return Ok(q);
        }
        // 32x32 tiles: per-block amax, per-tile scale bytes, then encode.
        let amax = self.alloc(nblocks * 4)?;
        launch(PHASE_AMAX, amax.ptr())?;
        let tiles = self.function(&QUANTIZE_MX, names.tile_scales)?;
        let ntiles = rows.div_ceil(BLOCK) * nb;
        let ap = amax.ptr();
        let mut b = self.stream().launch_builder(&tiles);
        b.arg(&ap).arg(&sp).arg(&rows32).arg(&nb32).arg(&mode);
        // SAFETY: matches mx_tile_scales_* in quantize_mx.cu.
        unsafe { b.launch(grid(ntiles as u64, THREADS as u64, THREADS)?) }
            .map_err(driver_err(format!("launch {}", names.tile_scales)))?;
        launch(PHASE_ENCODE_FIXED, 0)?;
        Ok(q)
    }

    /// Dequantizes `q` to f32 or BF16 ([`DequantLayout`] says which values).
    pub fn dequantize_mx(
        &self,
        q: &MxDevice,
        layout: DequantLayout,
        dtype: DType,
    ) -> Result<DevBuf> {
        let names = mx_kernels(q.config.elem)?;
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
        let f = self.function(&QUANTIZE_MX, names.dequantize)?;
        let (cp, sp) = (q.codes.ptr(), q.scales.ptr());
        let rows32 = to_u32(q.rows, "rows")?;
        let nb32 = to_u32(q.padded_len / BLOCK, "blocks per row")?;
        let out_len32 = to_u32(out_len, "row length")?;
        self.bind()?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&cp)
            .arg(&sp)
            .arg(&of)
            .arg(&ob)
            .arg(&rows32)
            .arg(&nb32)
            .arg(&out_len32)
            .arg(&out_len32)
            .arg(&unrotate);
        // SAFETY: matches dequantize_mx_* in quantize_mx.cu; `out` holds rows * out_len elements.
        unsafe { b.launch(grid(nblocks as u64, MX_THREADS as u64, MX_THREADS)?) }
            .map_err(driver_err(format!("launch {}", names.dequantize)))?;
        Ok(out)
    }

    /// FP8 tensorwise quantization of `numel` f32 (SPEC section 3), bit for
    /// bit as [`crate::quant::quantize_tensorwise`]. Runs without waiting for
    /// the device: call [`Fp8Device::check_finite`] to get the CPU's
    /// non-finite-amax error.
    pub fn quantize_fp8_tensorwise(
        &self,
        x: &DevBuf,
        numel: usize,
        elem: ElemFormat,
        pow2: bool,
    ) -> Result<Fp8Device> {
        let names = fp8_kernels(elem)?;
        if x.len_bytes() < numel * 4 {
            return Err(CudaError::Invalid(format!(
                "{} bytes do not hold {numel} f32",
                x.len_bytes()
            )));
        }
        let q = Fp8Device {
            numel,
            elem,
            codes: self.alloc(numel)?,
            state: self.alloc_zeroed(FP8_STATE_BYTES)?,
        };
        let (xp, stp, cp) = (x.ptr(), q.state.ptr(), q.codes.ptr());
        let n = numel as u64;
        self.bind()?;
        if n > 0 {
            let f = self.function(&QUANTIZE_FP8, "fp8_amax")?;
            let ctas = n.div_ceil(THREADS as u64).min(AMAX_MAX_CTAS);
            let mut b = self.stream().launch_builder(&f);
            b.arg(&xp).arg(&n).arg(&stp);
            // SAFETY: matches fp8_amax in quantize_fp8.cu.
            unsafe { b.launch(grid(ctas, 1, THREADS)?) }.map_err(driver_err("launch fp8_amax"))?;
        }
        let f = self.function(&QUANTIZE_FP8, "fp8_scale")?;
        let fmt_max = elem.max_value();
        let pow2 = pow2 as i32;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&stp).arg(&fmt_max).arg(&pow2);
        // SAFETY: matches fp8_scale in quantize_fp8.cu.
        unsafe { b.launch(grid(1, 1, 1)?) }.map_err(driver_err("launch fp8_scale"))?;
        if n > 0 {
            let f = self.function(&QUANTIZE_FP8, names.cast)?;
            let mut b = self.stream().launch_builder(&f);
            b.arg(&xp).arg(&stp).arg(&cp).arg(&n);
            // SAFETY: matches fp8_cast_* in quantize_fp8.cu; x and codes come
            // from the pool (256-byte aligned) so the float4 loads are aligned.
            unsafe { b.launch(grid(n.div_ceil(CAST_VEC), THREADS as u64, THREADS)?) }
                .map_err(driver_err(format!("launch {}", names.cast)))?;
        }
        Ok(q)
    }

    /// decode(code) * scale_inv for every element, as f32 or BF16.
    pub fn dequantize_fp8(&self, q: &Fp8Device, dtype: DType) -> Result<DevBuf> {
        let names = fp8_kernels(q.elem)?;
        let out = self.alloc(q.numel * dtype.size_in_bytes())?;
        let (of, ob) = out_pointers(&out, dtype)?;
        let n = q.numel as u64;
        if n == 0 {
            return Ok(out);
        }
        let f = self.function(&QUANTIZE_FP8, names.dequantize)?;
        let (cp, stp) = (q.codes.ptr(), q.state.ptr());
        self.bind()?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&cp).arg(&stp).arg(&of).arg(&ob).arg(&n);
        // SAFETY: matches fp8_dequantize_* in quantize_fp8.cu.
        unsafe { b.launch(grid(n, THREADS as u64, THREADS)?) }
            .map_err(driver_err(format!("launch {}", names.dequantize)))?;
        Ok(out)
    }
}
