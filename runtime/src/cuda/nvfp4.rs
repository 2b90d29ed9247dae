//! NVFP4 quantization on the device (SPEC section 2b), bit-exact with
//! [`crate::quant::quantize_nvfp4`]: the tile kernels of
//! `runtime/kernels/quantize_nvfp4.cu`, which quantize a matrix along its
//! rows and/or columns from one read of each tile, after one pass that
//! reduces each direction's tensor amax into an FP8 state buffer
//! (`quantize_fp8.cu`'s layout), which also carries the tensor scale t.
//!
//! Hopper has no FP4 MMA, so the GEMM operand is BF16: decode(code) * s_q,
//! exact in BF16 (a 2-bit by a 4-bit significand, between 2^-7 and 2688),
//! with t applied to the GEMM's f32 result as a per-tensor scale, as the
//! FNUZ FP8 operands are.

use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::lin_kernels::u32_of;
use super::nvrtc::{launch_kernel, KernelSource};
use super::quantize::{check_holds, grid, input_size, read_state, state_scale_inv_ptr, Phase};
use super::storage::by_dtype;
use super::{CudaContext, CudaError, DevBuf, Result};
use crate::backend::Along;
use crate::quant::nvfp4::nvfp4_padded;
use crate::quant::{Nvfp4Config, Nvfp4Tensor, NVFP4_BLOCK};
use crate::DType;

/// `runtime/kernels/quantize_nvfp4.cu`.
pub const QUANTIZE_NVFP4: KernelSource = KernelSource {
    name: "quantize_nvfp4.cu",
    body: include_str!("../../kernels/quantize_nvfp4.cu"),
};

/// Threads per CTA of `nvfp4_tile_*` (NV_THREADS) and of `dequantize_nvfp4`.
const THREADS: u32 = 256;
/// Side of the square slab one CTA of `nvfp4_tile_*` quantizes (NV_SLAB).
const SLAB: usize = 64;
/// Rows one CTA of `nvfp4_amax_*` reads: 16 for each of its 8 warps.
const AMAX_ROWS: usize = 128;
/// Words of a state buffer: the FP8 state's amax, scale and scale_inv
/// slots (quantize_fp8.cu).
const STATE_WORDS: usize = 12;
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

/// One direction's outputs and options (struct NvDir in
/// quantize_nvfp4.cu); a null state is a direction not wanted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct NvDir {
    codes: u64,
    scales: u64,
    deq: u64,
    state: u64,
    hadamard: i32,
    sr: i32,
    key: SrArg,
}

// SAFETY: a plain #[repr(C)] struct of integers, laid out as NvDir.
unsafe impl DeviceRepr for NvDir {}

/// Index of a direction in [`CudaContext::quantize_nvfp4_2d`]'s arrays:
/// along the columns (row blocks) first, then along the rows.
pub fn along_index(along: Along) -> usize {
    usize::from(along == Along::Rows)
}

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
    /// `quantize_nvfp4(x, [rows, cols], 0, ..)`), bit for bit: one direction
    /// of [`CudaContext::quantize_nvfp4_2d`].
    pub fn quantize_nvfp4(
        &self,
        x: (&DevBuf, DType),
        dims: (usize, usize),
        along: Along,
        cfg: &Nvfp4Config,
        outputs: Nvfp4Outputs,
    ) -> Result<Nvfp4Device> {
        let mut dirs = [None, None];
        dirs[along_index(along)] = Some((*cfg, outputs));
        let ([c, r], _) = self.quantize_nvfp4_2d(x, dims, dirs, false)?;
        c.or(r)
            .ok_or_else(|| CudaError::Invalid("nvfp4_tile wrote no output".into()))
    }

    /// NVFP4 quantization of the row-major `[rows, cols]` f32 or BF16 matrix
    /// `x` along its columns and/or its rows (`dirs`, indexed by
    /// [`along_index`]: each direction's settings and outputs), both from
    /// one read of each tile (`nvfp4_tile_*`), after one pass that reduces
    /// both tensor amaxes. The directions must agree on `tile2d` (the 16x16
    /// tiles are the same squares of x either way); Hadamard and the SR key
    /// are per direction. Runs without waiting for the device: a NaN or Inf
    /// in the input (or a Hadamard sum that overflows) leaves a non-finite
    /// amax at [`Nvfp4Device::amax_ptr`] for the caller's deferred check,
    /// and the outputs are then undefined.
    ///
    /// With `column_sums`, the amax pass also takes the f32 column sums of x
    /// (`[cols]`, returned second) on its read, unless the direction along
    /// the columns has the Hadamard or x is empty: then the second value is
    /// None and the caller sums another way.
    pub fn quantize_nvfp4_2d(
        &self,
        (x, dtype): (&DevBuf, DType),
        (rows, cols): (usize, usize),
        dirs: [Option<(Nvfp4Config, Nvfp4Outputs)>; 2],
        column_sums: bool,
    ) -> Result<([Option<Nvfp4Device>; 2], Option<DevBuf>)> {
        let size = input_size(dtype)?;
        check_holds(
            x,
            rows * cols * size,
            format_args!("[{rows}, {cols}]"),
            dtype,
        )?;
        let tile2d = match dirs {
            [Some((a, _)), Some((b, _))] if a.tile2d != b.tile2d => {
                return Err(CudaError::Invalid(
                    "NVFP4 directions of one pass differ in tile2d".into(),
                ))
            }
            [Some((c, _)), _] | [None, Some((c, _))] => c.tile2d,
            [None, None] => false,
        };
        let empty = rows == 0 || cols == 0;
        // Direction d's view: (view rows, length) = (rows, cols) or (cols, rows).
        let make = |d: usize| -> Result<Option<Nvfp4Device>> {
            let Some((config, outputs)) = dirs[d] else {
                return Ok(None);
            };
            let (vrows, len) = if d == 0 { (rows, cols) } else { (cols, rows) };
            let padded_len = nvfp4_padded(len);
            let nblocks = vrows * padded_len / NVFP4_BLOCK;
            let opt = |want: bool, bytes: usize| want.then(|| self.alloc(bytes)).transpose();
            let state = if empty {
                // Nothing to reduce: t = 1, as tensor_scale(0) is.
                let mut words = [0u32; STATE_WORDS];
                words[T_WORD] = 1f32.to_bits();
                self.upload(&words)?
            } else {
                // The amax pass atomically maxes into a zero amax.
                self.alloc_zeroed(STATE_WORDS * 4)?
            };
            Ok(Some(Nvfp4Device {
                rows: vrows,
                len,
                padded_len,
                config,
                codes: opt(outputs.codes, nblocks * NVFP4_BLOCK / 2)?,
                scales: self.alloc(nblocks)?,
                deq: opt(outputs.deq, nblocks * NVFP4_BLOCK * 2)?,
                state,
            }))
        };
        let out = [make(0)?, make(1)?];
        if empty || out.iter().all(Option::is_none) {
            return Ok((out, None));
        }
        let dir = |q: &Option<Nvfp4Device>| {
            let ptr = |b: &Option<DevBuf>| b.as_ref().map_or(0, DevBuf::ptr);
            q.as_ref().map_or(NvDir::default(), |q| NvDir {
                codes: ptr(&q.codes),
                scales: q.scales.ptr(),
                deq: ptr(&q.deq),
                state: q.state.ptr(),
                hadamard: q.config.hadamard as i32,
                sr: q.config.sr.is_some() as i32,
                key: q.config.sr.map_or(SrArg::default(), |k| SrArg {
                    seed_lo: k.seed as u32,
                    seed_hi: (k.seed >> 32) as u32,
                    step: k.step as u32,
                    tensor_id: k.tensor_id as u32,
                }),
            })
        };
        let (cd, rd) = (dir(&out[0]), dir(&out[1]));
        let (xp, r32, c32) = (x.ptr(), u32_of(rows, "rows")?, u32_of(cols, "cols")?);
        let gy = rows.div_ceil(SLAB);
        if gy > 65535 {
            return Err(CudaError::Invalid(format!(
                "nvfp4_tile: {rows} rows exceed the grid limit"
            )));
        }
        let cfg = LaunchConfig {
            grid_dim: (u32_of(cols.div_ceil(SLAB), "column slabs")?, gy as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let name = by_dtype(dtype, "nvfp4_tile_f32", "nvfp4_tile_bf16");
        let tile2d = tile2d as i32;
        // The amax pass: nvfp4_amax_* unless the direction along the columns
        // has the Hadamard (then the tile kernel's PHASE_AMAX).
        let mut sums = None;
        let phases = if cd.hadamard == 0 {
            sums = self.nvfp4_amax((x, dtype), (rows, cols), (&cd, &rd), column_sums)?;
            &[Phase::Quantize][..]
        } else {
            &[Phase::Amax, Phase::Quantize][..]
        };
        for &phase in phases {
            let phase = phase as i32;
            // Every output was allocated above for its direction's view, each state zeroed.
            launch_kernel!(
                self,
                &QUANTIZE_NVFP4,
                name,
                cfg,
                &xp,
                &r32,
                &c32,
                &cd,
                &rd,
                &tile2d,
                &phase
            )?;
        }
        Ok((out, sums))
    }

    /// `nvfp4_amax_*` over the non-empty `[rows, cols]` x into both
    /// directions' zeroed states, and with `column_sums` the f32 column sums
    /// it takes on the way (its 128-row partials added by
    /// `lin_colsum_final`).
    fn nvfp4_amax(
        &self,
        (x, dtype): (&DevBuf, DType),
        (rows, cols): (usize, usize),
        (cd, rd): (&NvDir, &NvDir),
        column_sums: bool,
    ) -> Result<Option<DevBuf>> {
        let vectors_per_row = 32 * (16 / input_size(dtype)?);
        let cfg = LaunchConfig {
            grid_dim: (
                u32_of(cols.div_ceil(vectors_per_row), "column strips")?,
                u32_of(rows.div_ceil(AMAX_ROWS), "row strips")?,
                1,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        if cfg.grid_dim.1 > 65535 {
            return Err(CudaError::Invalid(format!(
                "nvfp4_amax: {rows} rows exceed the grid limit"
            )));
        }
        // One row of partial sums per CTA row (AMAX_ROWS rows of x).
        let chunks = cfg.grid_dim.1 as usize;
        let partial = column_sums
            .then(|| self.alloc(chunks * cols * 4))
            .transpose()?;
        let (xp, pp) = (x.ptr(), partial.as_ref().map_or(0, DevBuf::ptr));
        let (r32, c32) = (u32_of(rows, "rows")?, u32_of(cols, "cols")?);
        let name = by_dtype(dtype, "nvfp4_amax_f32", "nvfp4_amax_bf16");
        // The states were zeroed by the caller; `partial`, if any, holds chunks x cols f32.
        launch_kernel!(
            self,
            &QUANTIZE_NVFP4,
            name,
            cfg,
            &xp,
            &r32,
            &c32,
            cd,
            rd,
            &pp
        )?;
        partial
            .map(|p| self.lin_colsum_final(&p, chunks, cols))
            .transpose()
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
        // One thread per half block (8 elements).
        let halves = 2 * n;
        let (cp, sp, op) = (codes.ptr(), q.scales.ptr(), out.ptr());
        // The kernel numbers half blocks (and their threads) in 32 bits.
        if halves + THREADS as usize > u32::MAX as usize {
            return Err(CudaError::Invalid(format!(
                "{n} NVFP4 blocks are over the 32-bit half-block index"
            )));
        }
        let h32 = halves as u32;
        // As dequantize_nvfp4: codes and scales of n blocks, out n * 16 BF16.
        launch_kernel!(
            self,
            &QUANTIZE_NVFP4,
            "dequantize_nvfp4",
            grid(halves as u64, THREADS as u64, THREADS)?,
            &cp,
            &sp,
            &op,
            &h32
        )?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::{bf16, ElemFormat};

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

    /// The kernel's SR key argument is MxSrKey: four u32; NvDir is four
    /// pointers, two ints and the key.
    #[test]
    fn kernel_structs_have_the_device_layout() {
        assert_eq!(std::mem::size_of::<SrArg>(), 16);
        assert_eq!(std::mem::size_of::<NvDir>(), 56);
    }
}
