//! FP8 rowwise and 128-block quantization (SPEC section 3b) on the device,
//! bit for bit as [`crate::quant::quantize_fp8_group_rows`] (BF16 input
//! widened exactly), and the GEMM of two such operands. The kernels are
//! `runtime/kernels/quantize_fp8_group.cu`.
//!
//! The codes are stored K-contiguous as the GEMM reads them: `[r16(rows),
//! stored_len]`, zero-padded (rows to 16; the axis to 16 for rowwise and to
//! the CPU's 128 for blocks). The scales (the encoder's multipliers) and
//! scale_inv are both laid out as cuBLASLt's scale modes read scale_inv
//! (`vec`: `[gpr, r16(rows)]`, `blk`: one per 128 x 128 tile, tile row by
//! tile row), which the H200 probe of issue 18 showed it reads
//! (`bench/cublaslt_scale_modes.cu`), so every kernel touches them
//! coalesced; a saved operand reads back in the CPU's `[rows, gpr]`.

use std::sync::Arc;

use super::lin_kernels::{native_types, r16, u32_of, GemmShape, Operand, Out, Post};
use super::nvrtc::{launch_kernel, KernelSource};
use super::quantize::{check_holds, grid, input_size};
use super::storage::by_dtype;
use super::{CudaContext, CudaError, DevBuf, GemmDType, Result};
use crate::backend::Format;
use crate::quant::{Fp8GroupConfig, Fp8GroupTensor, Grouping, FP8_BLOCK};
use crate::DType;
use cudarc::driver::DeviceRepr;

/// `runtime/kernels/quantize_fp8_group.cu`.
pub const QUANTIZE_FP8_GROUP: KernelSource = KernelSource {
    name: "quantize_fp8_group.cu",
    body: include_str!("../../kernels/quantize_fp8_group.cu"),
};

/// Threads per CTA (FP8G_THREADS) and the side of a tile (FP8G_TILE).
const THREADS: u32 = 256;
const TILE: usize = 64;

/// The stored row length for an axis of `len`: a multiple of 16 (the FP8
/// GEMM's K) for rowwise, the CPU's multiple of 128 for blocks.
pub fn stored_len(cfg: &Fp8GroupConfig, len: usize) -> usize {
    match cfg.grouping {
        Grouping::Rowwise => r16(len),
        Grouping::Block128 { .. } => cfg.layout(len).0,
    }
}

/// Groups per row of the axis-last view.
fn groups_per_row(cfg: &Fp8GroupConfig, len: usize) -> usize {
    match cfg.grouping {
        Grouping::Rowwise => 1,
        Grouping::Block128 { .. } => cfg.layout(len).0 / FP8_BLOCK,
    }
}

/// An FP8 group-quantized matrix on the device, axis-last (`rows` rows of
/// `len` along the quantization axis).
pub struct Fp8GroupDevice {
    /// Rows of the axis-last view.
    pub rows: usize,
    /// Length of the quantization axis.
    pub len: usize,
    /// The settings it was quantized with.
    pub config: Fp8GroupConfig,
    /// `[r16(rows), stored_len(len)]` E4M3FN codes, zero-padded.
    pub codes: DevBuf,
    /// The scales (a tile's repeated on each of its rows), the encoder's
    /// multipliers, laid out as `vec`.
    pub scales: DevBuf,
    /// scale_inv as `[gpr, r16(rows)]`, padding rows 0: the GEMM's
    /// `OUTER_VEC_32F` (rowwise) or `VEC128_32F` operand.
    pub vec: DevBuf,
    /// With tiles, scale_inv per tile, `[ceil(rows / 128), gpr]`: the GEMM's
    /// `BLK128x128_32F` operand.
    pub blk: Option<DevBuf>,
    /// The largest amax bits of the quantization (both directions share
    /// it), for the deferred finite check.
    pub flag: Arc<DevBuf>,
}

impl Fp8GroupDevice {
    /// Groups per row of the axis-last view.
    pub fn groups_per_row(&self) -> usize {
        groups_per_row(&self.config, self.len)
    }

    /// The stored (and GEMM) row length.
    pub fn stored_len(&self) -> usize {
        stored_len(&self.config, self.len)
    }

    /// Device address of the largest amax (f32 bits).
    pub fn amax_ptr(&self) -> u64 {
        self.flag.ptr()
    }

    /// SPEC 3b: a NaN or Inf amax in any group is an error naming the
    /// tensor. Waits for the stream.
    pub fn check_finite(&self, ctx: &CudaContext, name: &str) -> Result<()> {
        let w: Vec<u32> = ctx.download(&self.flag, 1)?;
        let amax = f32::from_bits(w[0]);
        if amax.is_finite() {
            return Ok(());
        }
        Err(crate::Error::NonFiniteAmax {
            tensor: name.to_string(),
            amax,
        }
        .into())
    }

    /// Bytes the CPU counts for the same operand: a code per element and
    /// two f32 per group.
    pub fn nbytes(&self) -> usize {
        self.rows * self.len + 8 * self.rows * self.groups_per_row()
    }

    /// The CPU's tensor, `shape` and `axis` those of the quantized input.
    pub fn to_cpu(
        &self,
        ctx: &CudaContext,
        shape: Vec<usize>,
        axis: usize,
    ) -> Result<Fp8GroupTensor> {
        let (padded_len, group_len) = self.config.layout(self.len);
        let kp = self.stored_len();
        let stored: Vec<u8> = ctx.download(&self.codes, self.rows * kp)?;
        let codes = if kp == padded_len {
            stored
        } else {
            stored
                .chunks(kp.max(1))
                .take(self.rows)
                .flat_map(|r| r[..padded_len].iter().copied())
                .collect()
        };
        let (gpr, rp) = (self.groups_per_row(), r16(self.rows));
        // Scales and inverses are kept as the GEMM reads them, [gpr, rp];
        // the CPU's are [rows, gpr].
        let cpu_layout = |buf: &DevBuf| -> Result<Vec<f32>> {
            let v: Vec<f32> = ctx.download(buf, gpr * rp)?;
            Ok((0..self.rows * gpr)
                .map(|i| v[(i % gpr) * rp + i / gpr])
                .collect())
        };
        Ok(Fp8GroupTensor {
            shape,
            axis,
            config: self.config,
            rows: self.rows,
            len: self.len,
            padded_len,
            group_len,
            codes,
            scales: cpu_layout(&self.scales)?,
            scale_inv: cpu_layout(&self.vec)?,
        })
    }
}

/// Kernel launch of `items` threads.
fn threads(items: usize) -> Result<cudarc::driver::LaunchConfig> {
    grid(items as u64, THREADS as u64, THREADS)
}

/// One CTA per `side` x `side` tile of `[rows, cols]`.
fn tiles(rows: usize, cols: usize, side: usize) -> Result<cudarc::driver::LaunchConfig> {
    let n = rows.div_ceil(side) * cols.div_ceil(side);
    grid(n as u64 * THREADS as u64, THREADS as u64, THREADS)
}

/// One direction's outputs (struct Fp8gOut in quantize_fp8_group.cu); a
/// null `codes` is a direction not wanted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Fp8gOut {
    codes: u64,
    scales: u64,
    vec: u64,
    blk: u64,
    kp: u32,
    r_pad: u32,
    gpr: u32,
    pad: u32,
}

// SAFETY: a plain #[repr(C)] struct of integers, laid out as Fp8gOut in
// quantize_fp8_group.cu.
unsafe impl DeviceRepr for Fp8gOut {}

impl Fp8gOut {
    fn of(q: &Fp8GroupDevice) -> Self {
        Fp8gOut {
            codes: q.codes.ptr(),
            scales: q.scales.ptr(),
            vec: q.vec.ptr(),
            blk: q.blk.as_ref().map_or(0, DevBuf::ptr),
            kp: q.stored_len() as u32,
            r_pad: r16(q.rows) as u32,
            gpr: q.groups_per_row() as u32,
            pad: 0,
        }
    }
}

/// Elements per group: the whole (non-empty) row for rowwise, 128 for blocks.
fn group_len(cfg: &Fp8GroupConfig, len: usize) -> usize {
    match cfg.grouping {
        Grouping::Rowwise => len.max(1),
        Grouping::Block128 { .. } => FP8_BLOCK,
    }
}

impl CudaContext {
    /// FP8 group quantization of a row-major `[rows, cols]` f32 or BF16
    /// matrix along its columns (`dirs[0]`, axis-last rows = its rows)
    /// and/or along its rows (`dirs[1]`, axis-last rows = its columns),
    /// both from the same reads: one pass over the input for 128-blocks,
    /// an amax pass and an encode pass for rowwise.
    /// Runs without waiting: [`Fp8GroupDevice::check_finite`] or a deferred
    /// check on [`Fp8GroupDevice::amax_ptr`] raises the non-finite amax.
    /// With `column_sums`, 128-blocks also take the f32 column sums of x
    /// (`[cols]`) on their read; rowwise gives `None` for them.
    pub fn quantize_fp8_group_2d(
        &self,
        x: &DevBuf,
        dtype: DType,
        (rows, cols): (usize, usize),
        cfg: &Fp8GroupConfig,
        dirs: [bool; 2],
        column_sums: bool,
    ) -> Result<([Option<Fp8GroupDevice>; 2], Option<DevBuf>)> {
        let size = input_size(dtype)?;
        check_holds(
            x,
            rows * cols * size,
            format_args!("[{rows}, {cols}]"),
            dtype,
        )?;
        u32_of(rows, "rows")?;
        u32_of(cols, "cols")?;
        let flag = Arc::new(self.alloc_zeroed(16)?);
        let tile2d = matches!(cfg.grouping, Grouping::Block128 { tile2d: true });
        let views = [(rows, cols), (cols, rows)];
        let mut out: [Option<Fp8GroupDevice>; 2] = [None, None];
        for d in 0..2 {
            let (r, l) = views[d];
            if !dirs[d] {
                continue;
            }
            let (kp, gpr, rp) = (stored_len(cfg, l), groups_per_row(cfg, l), r16(r));
            // The kernels' sizes are u32 (Fp8gOut).
            u32_of(rp, "padded rows")?;
            u32_of(kp, "row length")?;
            out[d] = Some(Fp8GroupDevice {
                rows: r,
                len: l,
                config: *cfg,
                codes: self.alloc(rp * kp)?,
                scales: self.alloc(4 * gpr * rp)?,
                vec: self.alloc_zeroed(4 * gpr * rp)?,
                blk: tile2d
                    .then(|| self.alloc(4 * r.div_ceil(FP8_BLOCK) * gpr))
                    .transpose()?,
                flag: flag.clone(),
            });
        }
        let enc = out
            .each_ref()
            .map(|q| q.as_ref().map_or_else(Fp8gOut::default, Fp8gOut::of));
        // The padded extents of the two directions, rows and columns.
        let ext_r = (enc[0].r_pad as usize).max(enc[1].kp as usize);
        let ext_c = (enc[0].kp as usize).max(enc[1].r_pad as usize);
        let sums = match cfg.grouping {
            Grouping::Block128 { .. } => {
                // One row of partial sums per tile row.
                let tile_rows = ext_r.div_ceil(FP8_BLOCK);
                let partial = (column_sums && rows * cols > 0)
                    .then(|| self.alloc(4 * tile_rows * cols))
                    .transpose()?;
                let ext = (ext_r, ext_c);
                self.fp8_block_2d(x, dtype, (rows, cols), cfg, ext, &enc, (&flag, &partial))?;
                partial
                    .map(|p| self.lin_colsum_final(&p, tile_rows, cols))
                    .transpose()?
            }
            Grouping::Rowwise => {
                self.fp8_rowwise_2d(x, dtype, (rows, cols), &out, (ext_r, ext_c), &enc, &flag)?;
                None
            }
        };
        Ok((out, sums))
    }

    /// `fp8g_block2d`: a CTA per 128 x 128 tile of the padded extents
    /// (multiples of 128 wherever a direction has codes to write); with
    /// `sums`, each tile row's column sums into its row of them.
    #[allow(clippy::too_many_arguments)]
    fn fp8_block_2d(
        &self,
        x: &DevBuf,
        dtype: DType,
        (rows, cols): (usize, usize),
        cfg: &Fp8GroupConfig,
        (ext_r, ext_c): (usize, usize),
        enc: &[Fp8gOut; 2],
        (flag, sums): (&DevBuf, &Option<DevBuf>),
    ) -> Result<()> {
        if ext_r * ext_c == 0 {
            return Ok(());
        }
        let name = by_dtype(dtype, "fp8g_block2d_f32", "fp8g_block2d_bf16");
        let tiles_x = u32_of(ext_c.div_ceil(FP8_BLOCK), "column tiles")?;
        let (xp, fp, sp) = (x.ptr(), flag.ptr(), sums.as_ref().map_or(0, DevBuf::ptr));
        let (r32, c32) = (rows as u32, cols as u32);
        let tile2d = matches!(cfg.grouping, Grouping::Block128 { tile2d: true }) as i32;
        let pow2 = cfg.pow2 as i32;
        // As fp8g_block2d: each direction's codes hold r_pad * kp bytes, its
        // scales and vec gpr * r_pad f32, its blk ceil(R / 128) * gpr; the
        // grid covers [ext_r, ext_c]; `sums` holds ceil(ext_r / 128) * cols f32.
        launch_kernel!(
            self,
            &QUANTIZE_FP8_GROUP,
            name,
            tiles(ext_r, ext_c, FP8_BLOCK)?,
            &xp,
            &r32,
            &c32,
            &tiles_x,
            &enc[0],
            &enc[1],
            &tile2d,
            &pow2,
            &fp,
            &sp
        )
    }

    /// Rowwise: `fp8g_amax2d`, `fp8g_scales` per direction, `fp8g_encode2d`.
    #[allow(clippy::too_many_arguments)]
    fn fp8_rowwise_2d(
        &self,
        x: &DevBuf,
        dtype: DType,
        (rows, cols): (usize, usize),
        out: &[Option<Fp8GroupDevice>; 2],
        (ext_r, ext_c): (usize, usize),
        enc: &[Fp8gOut; 2],
        flag: &DevBuf,
    ) -> Result<()> {
        let (rows32, cols32) = (rows as u32, cols as u32);
        // One amax word per 64-element piece of each axis-last row.
        let views = [(rows, cols), (cols, rows)];
        let mut parts: [Option<DevBuf>; 2] = [None, None];
        for d in 0..2 {
            if out[d].is_some() {
                let (r, l) = views[d];
                parts[d] = Some(self.alloc(4 * r * l.div_ceil(TILE))?);
            }
        }
        if rows * cols > 0 {
            let pp = parts.each_ref().map(|p| p.as_ref().map_or(0, DevBuf::ptr));
            let name = by_dtype(dtype, "fp8g_amax2d_f32", "fp8g_amax2d_bf16");
            let xp = x.ptr();
            // As fp8g_amax2d: part_c holds rows * ceil(cols / 64) words,
            // part_r cols * ceil(rows / 64).
            launch_kernel!(
                self,
                &QUANTIZE_FP8_GROUP,
                name,
                tiles(rows, cols, TILE)?,
                &xp,
                &rows32,
                &cols32,
                &pp[0],
                &pp[1]
            )?;
        }
        for d in 0..2 {
            if let (Some(q), Some(part)) = (&out[d], &parts[d]) {
                self.fp8_rowwise_scales(q, part, flag)?;
            }
        }
        if ext_r * ext_c == 0 {
            return Ok(());
        }
        let name = by_dtype(dtype, "fp8g_encode2d_f32", "fp8g_encode2d_bf16");
        let (xp, ext32) = (x.ptr(), u32_of(ext_c, "padded columns")?);
        // As fp8g_encode2d: each direction's codes hold r_pad * kp bytes,
        // its scales R f32; the grid covers [ext_r, ext_c].
        launch_kernel!(
            self,
            &QUANTIZE_FP8_GROUP,
            name,
            tiles(ext_r, ext_c, TILE)?,
            &xp,
            &rows32,
            &cols32,
            &ext32,
            &enc[0],
            &enc[1]
        )
    }

    /// `fp8g_scales` of one rowwise direction from its amax pieces `part`.
    fn fp8_rowwise_scales(&self, q: &Fp8GroupDevice, part: &DevBuf, flag: &DevBuf) -> Result<()> {
        if q.rows == 0 {
            return Ok(());
        }
        let (pp, sp, vp, fp) = (part.ptr(), q.scales.ptr(), q.vec.ptr(), flag.ptr());
        let (r32, np32) = (q.rows as u32, q.len.div_ceil(TILE) as u32);
        let pow2 = q.config.pow2 as i32;
        // As fp8g_scales: part holds np * R words; scales and vec R f32.
        launch_kernel!(
            self,
            &QUANTIZE_FP8_GROUP,
            "fp8g_scales",
            threads(q.rows)?,
            &pp,
            &r32,
            &np32,
            &pow2,
            &sp,
            &vp,
            &fp
        )
    }

    /// decode(code) * scale_inv as f32 `[r16(rows), stored_len]` (padding 0):
    /// the CPU's `dequantize_rows` values, as a GEMM operand.
    pub fn dequantize_fp8_group(&self, q: &Fp8GroupDevice) -> Result<DevBuf> {
        let (rp, kp, gpr) = (r16(q.rows), q.stored_len(), q.groups_per_row());
        let out = self.alloc(4 * rp * kp)?;
        if rp * kp == 0 {
            return Ok(out);
        }
        let glen = group_len(&q.config, q.len) as u32;
        let (cp, vp, op) = (q.codes.ptr(), q.vec.ptr(), out.ptr());
        let (r32, rp32, kp32, gpr32) = (q.rows as u32, rp as u32, kp as u32, gpr as u32);
        // As fp8g_dequantize: out holds rp * kp f32.
        launch_kernel!(
            self,
            &QUANTIZE_FP8_GROUP,
            "fp8g_dequantize",
            threads(rp * kp)?,
            &cp,
            &vp,
            &r32,
            &rp32,
            &kp32,
            &gpr32,
            &glen,
            &op
        )?;
        Ok(out)
    }
}

/// cuBLASLt's operand types for FP8 group operands `a` x `b` (SPEC 3b):
/// per-row vectors for rowwise; for blocks a weight's 128 x 128 tiles as
/// `BLK128x128_32F` beside the other side's 1 x 128 `VEC128_32F` (the
/// pairings the H200 probe ran; tile x tile has no algorithm), 1 x 128 on
/// both sides otherwise. `None` for a mixed pair.
pub fn cuda_types(a: &Fp8GroupConfig, b: &Fp8GroupConfig) -> Option<(GemmDType, GemmDType)> {
    use GemmDType::{Fp8E4M3Blk128 as Blk, Fp8E4M3Rowwise as Row, Fp8E4M3Vec128 as Vec};
    match (a.grouping, b.grouping) {
        (Grouping::Rowwise, Grouping::Rowwise) => Some((Row, Row)),
        (Grouping::Block128 { .. }, Grouping::Block128 { tile2d: true }) => Some((Vec, Blk)),
        (Grouping::Block128 { tile2d: true }, Grouping::Block128 { .. }) => Some((Blk, Vec)),
        (Grouping::Block128 { .. }, Grouping::Block128 { .. }) => Some((Vec, Vec)),
        _ => None,
    }
}

/// The type an operand asked to go as `t` is read as, given whether it
/// has tile scales and its groups per row. Tiles go as 1 x 128 vectors
/// (their scale repeated per row, the same product) unless the tile row
/// holds a multiple of 4 tiles: with 3 the H200's `BLK128x128_32F` GEMM
/// did not match its reference (cuBLASLt pads that leading dimension).
fn read_as(t: GemmDType, tiles: bool, gpr: usize) -> GemmDType {
    match t {
        GemmDType::Fp8E4M3Blk128 if !(tiles && gpr % 4 == 0) => GemmDType::Fp8E4M3Vec128,
        _ => t,
    }
}

/// [`read_as`] for `q`, with the scale pointer of that type.
fn scaled(q: &Fp8GroupDevice, t: GemmDType) -> (GemmDType, u64) {
    let t = read_as(t, q.blk.is_some(), q.groups_per_row());
    match (&q.blk, t) {
        (Some(blk), GemmDType::Fp8E4M3Blk128) => (t, blk.ptr()),
        _ => (t, q.vec.ptr()),
    }
}

/// GEMMs of FP8 group operands that ran as the f32 GEMM of the
/// dequantized values (see [`fp8_group_gemm`]).
static FALLBACKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many FP8 rowwise / block GEMMs since the process started ran on
/// dequantized f32 values because the BLAS library has no scaled GEMM for
/// them.
pub fn fp8_group_fallbacks() -> usize {
    FALLBACKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// `a · b^T` of two FP8 group operands as `out`, with its true `(rows,
/// cols)`: the library's scaled FP8 GEMM ([`native_types`]), else both
/// operands dequantized exactly to f32 (the CPU's values) and an f32 GEMM.
/// The bias follows `lin_gemm`: f32 accumulator plus f32 bias, rounded once.
pub(super) fn fp8_group_gemm(
    ctx: &CudaContext,
    (qa, qb): (&Fp8GroupDevice, &Fp8GroupDevice),
    (bias, out): (Option<&DevBuf>, Out),
) -> Result<(DevBuf, usize, usize)> {
    let k = qa.stored_len();
    if qa.len != qb.len || k != qb.stored_len() {
        return Err(CudaError::Invalid(format!(
            "FP8 group operands reduce over {} and {} elements",
            qa.len, qb.len
        )));
    }
    let g = GemmShape {
        m: r16(qa.rows),
        n: r16(qb.rows),
        k,
    };
    let post = Post {
        bias,
        crop: ((qa.rows, qb.rows) != (g.m, g.n)).then_some((qa.rows, qb.rows)),
        ..Post::default()
    };
    let fa = Format::Fp8Group(qa.config);
    let fb = Format::Fp8Group(qb.config);
    if let Some((ta, tb)) = native_types(ctx, &fa, &fb) {
        let ((ta, sa), (tb, sb)) = (scaled(qa, ta), scaled(qb, tb));
        let (a, b) = (
            Operand::fp8(&qa.codes, ta, k, sa),
            Operand::fp8(&qb.codes, tb, k, sb),
        );
        match ctx.lin_gemm(&a, &b, g, post, out) {
            Ok(y) => return Ok((y, qa.rows, qb.rows)),
            Err(CudaError::Blas(_)) => {}
            Err(e) => return Err(e),
        }
    }
    FALLBACKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (da, db) = (ctx.dequantize_fp8_group(qa)?, ctx.dequantize_fp8_group(qb)?);
    let (a, b) = (
        Operand::rows(&da, GemmDType::F32, k),
        Operand::rows(&db, GemmDType::F32, k),
    );
    Ok((ctx.lin_gemm(&a, &b, g, post, out)?, qa.rows, qb.rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_rows_hold_the_cpu_rows_at_the_gemms_alignment() {
        let (row, blk) = (Fp8GroupConfig::rowwise(), Fp8GroupConfig::block128());
        assert_eq!(
            [0, 1, 16, 17, 300].map(|l| stored_len(&row, l)),
            [0, 16, 16, 32, 304]
        );
        assert_eq!(
            [1, 128, 129, 300].map(|l| stored_len(&blk, l)),
            [128, 128, 256, 384]
        );
        assert_eq!(groups_per_row(&row, 0), 1);
        assert_eq!(groups_per_row(&blk, 300), 3);
    }

    #[test]
    fn tiles_go_to_the_gemm_beside_blocks() {
        use GemmDType::*;
        let (row, blk, tile) = (
            Fp8GroupConfig::rowwise(),
            Fp8GroupConfig::block128(),
            Fp8GroupConfig::block128_tiles(),
        );
        assert_eq!(
            cuda_types(&row, &row),
            Some((Fp8E4M3Rowwise, Fp8E4M3Rowwise))
        );
        assert_eq!(
            cuda_types(&blk, &tile),
            Some((Fp8E4M3Vec128, Fp8E4M3Blk128))
        );
        assert_eq!(
            cuda_types(&tile, &blk),
            Some((Fp8E4M3Blk128, Fp8E4M3Vec128))
        );
        assert_eq!(cuda_types(&blk, &blk), Some((Fp8E4M3Vec128, Fp8E4M3Vec128)));
        // Tile x tile (a per-GEMM override could ask it) has no pairing of its own.
        assert_eq!(
            cuda_types(&tile, &tile),
            Some((Fp8E4M3Vec128, Fp8E4M3Blk128))
        );
        assert_eq!(cuda_types(&row, &blk), None);
    }

    #[test]
    fn tiles_go_as_vectors_unless_a_tile_row_holds_a_multiple_of_4() {
        use GemmDType::*;
        assert_eq!(read_as(Fp8E4M3Blk128, true, 24), Fp8E4M3Blk128);
        assert_eq!(read_as(Fp8E4M3Blk128, true, 3), Fp8E4M3Vec128);
        assert_eq!(read_as(Fp8E4M3Blk128, false, 8), Fp8E4M3Vec128);
        assert_eq!(read_as(Fp8E4M3Vec128, true, 3), Fp8E4M3Vec128);
        assert_eq!(read_as(Fp8E4M3Rowwise, false, 1), Fp8E4M3Rowwise);
    }
}
