//! One-pass MX quantization along rows and columns (`runtime/kernels/mx_tile.cu`):
//! each 32x32 tile of the input is read once and quantized along both axes,
//! writing for each direction the codes and scales (kept for the backward)
//! and/or the dequantized BF16 GEMM operand.

use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::lin_kernels::u32_of;
use super::nvrtc::{launch_kernel, KernelSource};
use super::quantize::mode_arg;
use super::{CudaContext, CudaError, DevBuf, MxDevice, Result};
use crate::formats::ElemFormat;
use crate::quant::{MxConfig, SrKey};
use crate::DType;

/// `runtime/kernels/mx_tile.cu`.
pub const MX_TILE: KernelSource = KernelSource {
    name: "mx_tile.cu",
    body: include_str!("../../kernels/mx_tile.cu"),
};

impl CudaContext {
    /// MX quantization of `x` (`[rows, cols]`, f32 or BF16) along its rows
    /// and/or its columns in one pass (`mx_tile.cu`); with `column_sums` and
    /// a non-empty x, also x's f32 column sums (32-row partial sums, then
    /// `lin_colsum_final`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mx_tile(
        &self,
        x: &DevBuf,
        dtype: DType,
        (rows, cols): (usize, usize),
        cfg: &MxConfig,
        by_row: Option<MxWant>,
        by_col: Option<MxWant>,
        column_sums: bool,
    ) -> Result<(MxOut, MxOut, Option<DevBuf>)> {
        if cfg.tile2d && [by_row, by_col].iter().flatten().any(|w| w.hadamard) {
            return Err(CudaError::Invalid(
                "32x32 tile scales with the Hadamard option are not supported".into(),
            ));
        }
        let suffix = match (cfg.elem, dtype) {
            (ElemFormat::E2M1, DType::F32) => "mx_tile_e2m1_f32",
            (ElemFormat::E2M1, DType::BF16) => "mx_tile_e2m1_bf16",
            (ElemFormat::E4M3FN, DType::F32) => "mx_tile_e4m3fn_f32",
            (ElemFormat::E4M3FN, DType::BF16) => "mx_tile_e4m3fn_bf16",
            (elem, dt) => {
                return Err(CudaError::Invalid(format!(
                    "MX quantization of {dt:?} input to {elem:?}"
                )))
            }
        };
        let (pr, pc) = (rows.div_ceil(32) * 32, cols.div_ceil(32) * 32);
        // Direction outputs: (quantized rows, padded length) = (rows, pc) or (cols, pr).
        let make = |want: Option<MxWant>, r: usize, len: usize, plen: usize| -> Result<MxOut> {
            let Some(w) = want else {
                return Ok(MxOut {
                    q: None,
                    deq: None,
                    config: *cfg,
                });
            };
            let config = MxConfig {
                hadamard: w.hadamard,
                sr: w.sr,
                ..*cfg
            };
            let q = if w.codes {
                Some(MxDevice {
                    rows: r,
                    len,
                    padded_len: plen,
                    config,
                    codes: self.alloc(r * plen * cfg.elem.bits() as usize / 8)?,
                    scales: self.alloc(r * plen / 32)?,
                })
            } else {
                None
            };
            let deq = if w.deq {
                Some(self.alloc(r * plen * 2)?)
            } else {
                None
            };
            Ok(MxOut { q, deq, config })
        };
        let ro = make(by_row, rows, cols, pc)?;
        let co = make(by_col, cols, rows, pr)?;
        if rows == 0 || cols == 0 {
            // No sums from an empty input: the caller's own pass gives them.
            return Ok((ro, co, None));
        }
        let dir = |o: &MxOut| MxDir {
            codes: o.q.as_ref().map_or(0, |q| q.codes.ptr()),
            scales: o.q.as_ref().map_or(0, |q| q.scales.ptr()),
            deq: o.deq.as_ref().map_or(0, |d| d.ptr()),
            hadamard: o.config.hadamard as i32,
            sr: o.config.sr.is_some() as i32,
            seed_lo: o.config.sr.map_or(0, |k| k.seed as u32),
            seed_hi: o.config.sr.map_or(0, |k| (k.seed >> 32) as u32),
            step: o.config.sr.map_or(0, |k| k.step as u32),
            tensor_id: o.config.sr.map_or(0, |k| k.tensor_id as u32),
        };
        let (rd, cd) = (dir(&ro), dir(&co));
        let (xp, r, c) = (x.ptr(), u32_of(rows, "rows")?, u32_of(cols, "cols")?);
        let (mode, tile2d) = (mode_arg(cfg.scale_mode), cfg.tile2d as i32);
        let gy = rows.div_ceil(32);
        if gy > 65535 {
            return Err(CudaError::Invalid(format!(
                "mx_tile: {rows} rows exceed the grid limit"
            )));
        }
        let partial = column_sums.then(|| self.alloc(gy * cols * 4)).transpose()?;
        let sums = partial.as_ref().map_or(0, DevBuf::ptr);
        let cfg = LaunchConfig {
            grid_dim: (
                u32_of(cols.div_ceil(32 * MX_TILES), "column slabs")?,
                gy as u32,
                1,
            ),
            block_dim: (64 * MX_TILES as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // Every output was allocated above for its direction's [rows, padded length].
        launch_kernel!(self, &MX_TILE, suffix, cfg, &xp, &r, &c, &rd, &cd, &mode, &tile2d, &sums)?;
        let sums = partial
            .map(|p| self.lin_colsum_final(&p, gy, cols))
            .transpose()?;
        Ok((ro, co, sums))
    }
}

/// Slabs of 32x32 tiles per CTA of `mx_tile` (TILES in mx_tile.cu).
const MX_TILES: usize = 4;

/// One direction's options and outputs (struct MxDir in mx_tile.cu, whose
/// last four words are its MxSrKey); null pointers are outputs not wanted.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct MxDir {
    codes: u64,
    scales: u64,
    deq: u64,
    hadamard: i32,
    sr: i32,
    seed_lo: u32,
    seed_hi: u32,
    step: u32,
    tensor_id: u32,
}

// SAFETY: a plain #[repr(C)] struct of integers, laid out as MxDir in mx_tile.cu.
unsafe impl DeviceRepr for MxDir {}

/// What one direction of [`CudaContext::mx_tile`] computes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct MxWant {
    /// Codes and scales (kept for the backward).
    pub codes: bool,
    /// The dequantized BF16 GEMM operand.
    pub deq: bool,
    pub hadamard: bool,
    pub sr: Option<SrKey>,
}

/// One direction's results of [`CudaContext::mx_tile`].
pub(super) struct MxOut {
    pub q: Option<MxDevice>,
    pub deq: Option<DevBuf>,
    pub config: MxConfig,
}
