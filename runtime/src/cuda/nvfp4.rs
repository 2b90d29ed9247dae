//! NVFP4 quantization on the device (SPEC section 2b), bit-exact with
//! [`crate::quant::quantize_nvfp4`]: the kernels of
//! `runtime/kernels/quantize_nvfp4.cu`, with the tensor amax reduced by the
//! FP8 amax kernels (`quantize_fp8.cu`), whose state buffer also carries the
//! tensor scale t.
//!
//! Hopper has no FP4 MMA, so the GEMM operand is BF16: decode(code) * s_q,
//! exact in BF16 (a 2-bit by a 4-bit significand, between 2^-7 and 2688),
//! with t applied to the GEMM's f32 result as a per-tensor scale, as the
//! FNUZ FP8 operands are.

use cudarc::driver::DeviceRepr;

use super::lin_kernels::u32_of;
use super::nvrtc::{launch_kernel, KernelSource};
use super::quantize::{grid, input_size, read_state, state_scale_inv_ptr, Phase};
use super::storage::by_dtype;
use super::{CudaContext, CudaError, DevBuf, Result};
use crate::backend::Along;
use crate::formats::ElemFormat;
use crate::quant::nvfp4::nvfp4_padded;
use crate::quant::{Nvfp4Config, Nvfp4Tensor, NVFP4_BLOCK};
use crate::DType;

/// `runtime/kernels/quantize_nvfp4.cu`.
pub const QUANTIZE_NVFP4: KernelSource = KernelSource {
    name: "quantize_nvfp4.cu",
    body: include_str!("../../kernels/quantize_nvfp4.cu"),
};

/// Threads per CTA of the NVFP4 kernels, one block each (NV_THREADS).
const THREADS: u32 = 256;
/// Bytes of a state buffer written for an empty tensor: the FP8 state's
/// amax, scale and scale_inv slots (quantize_fp8.cu).
const EMPTY_STATE_WORDS: usize = 12;
/// Word of the state holding t (NV_T, the FP8 state's scale_inv slot).
const T_WORD: usize = 8;

/// The stochastic-rounding key as the kernels take it (struct MxSrKey in
/// common.cuh).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SrArg {
    seed_lo: u32,
    seed_hi: u32,
    step: u32,
    tensor_id: u32,
}

// SAFETY: a plain #[repr(C)] struct of four u32, laid out as MxSrKey.
unsafe impl DeviceRepr for SrArg {}

/// What one NVFP4 quantization writes besides the scale bytes and state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvfp4Outputs {
    /// The packed E2M1 codes (a kept copy).
    pub codes: bool,
    /// The BF16 GEMM operand decode(code) * s_q.
    pub deq: bool,
}

/// An NVFP4-quantized matrix on the device, in the CPU's axis-last layout
/// ([`Nvfp4Tensor`] of the `[rows, len]` view).
pub struct Nvfp4Device {
    /// Rows of the axis-last view.
    pub rows: usize,
    /// Length of the quantization axis, before padding.
    pub len: usize,
    /// `len` rounded up to a multiple of 16.
    pub padded_len: usize,
    /// The settings it was quantized with.
    pub config: Nvfp4Config,
    /// `[rows, padded_len / 2]` packed E2M1 codes, if asked for.
    pub codes: Option<DevBuf>,
    /// `[rows, padded_len / 16]` E4M3FN bytes.
    pub scales: DevBuf,
    /// `[rows, padded_len]` BF16 decode(code) * s_q, if asked for.
    pub deq: Option<DevBuf>,
    /// The FP8 state layout: the tensor amax bits first, t at scale_inv.
    pub state: DevBuf,
}

impl Nvfp4Device {
    /// Number of 16-element blocks (and of scale bytes).
    pub fn nblocks(&self) -> usize {
        self.rows * self.padded_len / NVFP4_BLOCK
    }

    /// Bytes of the packed codes.
    pub fn code_bytes(&self) -> usize {
        self.rows * self.padded_len / 2
    }

    /// Device address of the tensor amax bits (for the deferred finite check).
    pub fn amax_ptr(&self) -> u64 {
        self.state.ptr()
    }

    /// Device address of the f32 tensor scale t, the GEMM's per-tensor scale.
    pub fn tensor_scale_ptr(&self) -> u64 {
        state_scale_inv_ptr(&self.state)
    }

    /// (tensor amax, t), read back (waits for the stream).
    pub fn read_scales(&self, ctx: &CudaContext) -> Result<(f32, f32)> {
        let (amax, _, t) = read_state(ctx, &self.state)?;
        Ok((amax, t))
    }

    /// The CPU's [`Nvfp4Tensor`] of the input `[rows, cols]` quantized
    /// along `along` (codes needed).
    pub fn to_tensor(&self, ctx: &CudaContext, along: Along) -> Result<Nvfp4Tensor> {
        let codes = self
            .codes
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("the NVFP4 codes were not kept".into()))?;
        let (shape, axis) = match along {
            Along::Rows => (vec![self.len, self.rows], 0),
            Along::Cols => (vec![self.rows, self.len], 1),
        };
        let (_, tensor_scale) = self.read_scales(ctx)?;
        Ok(Nvfp4Tensor {
            shape,
            axis,
            config: self.config,
            rows: self.rows,
            len: self.len,
            padded_len: self.padded_len,
            codes: ctx.download(codes, self.code_bytes())?,
            scales: ctx.download(&self.scales, self.nblocks())?,
            tensor_scale,
        })
    }
}

impl CudaContext {
    /// NVFP4 quantization of the row-major `[rows, cols]` f32 or BF16 matrix
    /// `x` along its columns (`Along::Cols`: the CPU's
    /// `quantize_nvfp4_rows(x, rows, cols, ..)`) or its rows (`Along::Rows`:
    /// `quantize_nvfp4(x, [rows, cols], 0, ..)`), bit for bit. Runs without
    /// waiting for the device: a NaN or Inf in the input (or a Hadamard sum
    /// that overflows) leaves a non-finite amax at [`Nvfp4Device::amax_ptr`]
    /// for the caller's deferred check, and the outputs are then undefined.
    pub fn quantize_nvfp4(
        &self,
        (x, dtype): (&DevBuf, DType),
        (rows, cols): (usize, usize),
        along: Along,
        cfg: &Nvfp4Config,
        outputs: Nvfp4Outputs,
    ) -> Result<Nvfp4Device> {
        let size = input_size(dtype)?;
        if x.len_bytes() < rows * cols * size {
            return Err(CudaError::Invalid(format!(
                "{} bytes do not hold [{rows}, {cols}] {dtype:?}",
                x.len_bytes()
            )));
        }
        let (vrows, len) = match along {
            Along::Cols => (rows, cols),
            Along::Rows => (cols, rows),
        };
        let padded_len = nvfp4_padded(len);
        let nb = padded_len / NVFP4_BLOCK;
        let nblocks = vrows * nb;
        // The kernels number blocks (and their threads) in 32 bits.
        if nblocks + THREADS as usize > u32::MAX as usize {
            return Err(CudaError::Invalid(format!(
                "[{rows}, {cols}] makes {nblocks} NVFP4 blocks, over the 32-bit block index"
            )));
        }
        let opt = |want: bool, bytes: usize| want.then(|| self.alloc(bytes)).transpose();
        if nblocks == 0 {
            // Nothing to reduce: t = 1, as tensor_scale(0) is.
            let mut words = [0u32; EMPTY_STATE_WORDS];
            words[T_WORD] = 1f32.to_bits();
            return Ok(Nvfp4Device {
                rows: vrows,
                len,
                padded_len,
                config: *cfg,
                codes: opt(outputs.codes, 0)?,
                scales: self.alloc(0)?,
                deq: opt(outputs.deq, 0)?,
                state: self.upload(&words)?,
            });
        }
        let q_codes = opt(outputs.codes, nblocks * NVFP4_BLOCK / 2)?;
        let q_deq = opt(outputs.deq, nblocks * NVFP4_BLOCK * 2)?;
        let scales = self.alloc(nblocks)?;
        let extras = cfg.hadamard || cfg.sr.is_some() || cfg.tile2d;
        let name = if extras {
            by_dtype(dtype, "quantize_nvfp4_f32", "quantize_nvfp4_bf16")
        } else {
            by_dtype(
                dtype,
                "quantize_nvfp4_plain_f32",
                "quantize_nvfp4_plain_bf16",
            )
        };
        let key = cfg.sr.map_or(SrArg::default(), |k| SrArg {
            seed_lo: k.seed as u32,
            seed_hi: (k.seed >> 32) as u32,
            step: k.step as u32,
            tensor_id: k.tensor_id as u32,
        });
        let (r32, len32, nb32) = (
            u32_of(vrows, "rows")?,
            u32_of(len, "len")?,
            u32_of(nb, "blocks per row")?,
        );
        let transposed = (along == Along::Rows) as i32;
        let (hadamard, sr) = (cfg.hadamard as i32, cfg.sr.is_some() as i32);
        let ptr = |b: &Option<DevBuf>| b.as_ref().map_or(0, DevBuf::ptr);
        let (xp, cp, sp, dp) = (x.ptr(), ptr(&q_codes), scales.ptr(), ptr(&q_deq));
        let cfg_q = grid(nblocks as u64, THREADS as u64, THREADS)?;
        // As quantize_nvfp4_* in quantize_nvfp4.cu: codes, scales, deq and
        // amax hold their [rows, nb] blocks' worth, state an FP8 state.
        let launch = |phase: Phase, amax: u64, state: u64| -> Result<()> {
            let phase = phase as i32;
            launch_kernel!(
                self,
                &QUANTIZE_NVFP4,
                name,
                cfg_q,
                &xp,
                &cp,
                &sp,
                &dp,
                &amax,
                &state,
                &r32,
                &len32,
                &nb32,
                &transposed,
                &phase,
                &hadamard,
                &sr,
                &key
            )
        };
        let e4m3 = ElemFormat::E4M3FN;
        let state = if cfg.hadamard || cfg.tile2d {
            // The block amaxes first; their max (the bits read as f32) is A.
            let amax = self.alloc(nblocks * 4)?;
            launch(Phase::Amax, amax.ptr(), 0)?;
            let (state, _) = self.fp8_amax_scale((&amax, DType::F32, nblocks), e4m3, false)?;
            if cfg.tile2d {
                let ntiles = vrows.div_ceil(NVFP4_BLOCK) * nb;
                let (ap, stp) = (amax.ptr(), state.ptr());
                // As nvfp4_tile_scales: amax and scales hold [rows, nb].
                launch_kernel!(
                    self,
                    &QUANTIZE_NVFP4,
                    "nvfp4_tile_scales",
                    grid(ntiles as u64, THREADS as u64, THREADS)?,
                    &ap,
                    &sp,
                    &stp,
                    &r32,
                    &nb32
                )?;
                launch(Phase::EncodeFixed, 0, stp)?;
            } else {
                launch(Phase::Quantize, 0, state.ptr())?;
            }
            state
        } else {
            // Without the rotation the tensor amax is that of x itself.
            let (state, _) = self.fp8_amax_scale((x, dtype, rows * cols), e4m3, false)?;
            launch(Phase::Quantize, 0, state.ptr())?;
            state
        };
        Ok(Nvfp4Device {
            rows: vrows,
            len,
            padded_len,
            config: *cfg,
            codes: q_codes,
            scales,
            deq: q_deq,
            state,
        })
    }

    /// The BF16 GEMM operand decode(code) * s_q, `[rows, padded_len]`, of
    /// kept codes.
    pub fn dequantize_nvfp4(&self, q: &Nvfp4Device) -> Result<DevBuf> {
        let codes = q
            .codes
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("the NVFP4 codes were not kept".into()))?;
        let n = q.nblocks();
        let out = self.alloc(n * NVFP4_BLOCK * 2)?;
        if n == 0 {
            return Ok(out);
        }
        let (cp, sp, op, n32) = (codes.ptr(), q.scales.ptr(), out.ptr(), u32_of(n, "blocks")?);
        // As dequantize_nvfp4: codes and scales of n blocks, out n * 16 BF16.
        launch_kernel!(
            self,
            &QUANTIZE_NVFP4,
            "dequantize_nvfp4",
            grid(n as u64, THREADS as u64, THREADS)?,
            &cp,
            &sp,
            &op,
            &n32
        )?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::bf16;

    /// The GEMM operand decode(code) * s_q is exact in BF16 for every E2M1
    /// code and every scale byte a block can get (2^-6 ..= 448).
    #[test]
    fn code_times_block_scale_is_exact_in_bf16() {
        let (e2m1, e4m3) = (ElemFormat::E2M1, ElemFormat::E4M3FN);
        for byte in 0x08u8..=0x7E {
            for code in 0u8..16 {
                let v = e2m1.decode(code) * e4m3.decode(byte);
                assert_eq!(bf16::to_f32(bf16::from_f32(v)).to_bits(), v.to_bits());
            }
        }
    }

    /// The kernel's SR key argument is MxSrKey: four u32.
    #[test]
    fn sr_arg_is_four_words() {
        assert_eq!(std::mem::size_of::<SrArg>(), 16);
    }
}
