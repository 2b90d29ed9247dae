//! The fused modulation ops of [`CudaStorage`] ([`FusedBackend`]): operand
//! checks and the launches of the `fused_*` kernels of `ops_fused.cu`,
//! which follow `cpu/fused.rs` operation for operation.
//!
//! Every operand is a whole packed buffer (the dispatch packs views), so
//! each starts 256-byte aligned and the row kernels take their 16-byte
//! `_vec` form whenever the row width is a multiple of [`VEC`].

use cudarc::driver::LaunchConfig;

use super::{backend_err, by_dtype, grid, row_grid, CudaStorage, OPS};
use crate::backend::{
    BackendDevice, FusedBackend, ModNormSaved, ModShape, RmsRopeSaved, RopeShape,
};
use crate::{DType, Error, Result};

/// Elements of one 16-byte group (VEC in ops_elementwise.cu).
const VEC: usize = 8;
/// Rows of threads of a `fused_token_sums` CTA (SUM_GROUPS in ops_fused.cu).
const SUM_GROUPS: u32 = 8;
/// Tokens one `fused_token_sums` CTA adds (SUM_CHUNK in ops_fused.cu).
const SUM_CHUNK: usize = 256;
/// Rows of one warp's tile of the `_tile` QK norm kernels (RR_TILE).
const RR_TILE: usize = 32;
/// The widest row of the `_tile` QK norm kernels (RR_MAXD).
const RR_MAXD: usize = 128;
/// Warps per CTA of `fused_rms_rope_*_tile` (RR_WARPS in ops_fused.cu).
const RR_WARPS: usize = 2;

/// Whether rows of `d` take the `_tile` QK norm kernels: whole 16-byte
/// groups, a row within a warp's shared-memory tile.
fn tiled(d: usize) -> bool {
    d % VEC == 0 && d <= RR_MAXD
}

/// The launch of a `_tile` QK norm kernel over `rows`: warps of
/// [`RR_TILE`] rows, `warps` a CTA (a grid-stride loop past 2^20 CTAs).
fn tile_grid(rows: usize, warps: usize) -> LaunchConfig {
    let ctas = rows.div_ceil(RR_TILE).div_ceil(warps).clamp(1, 1 << 20);
    LaunchConfig {
        grid_dim: (ctas as u32, 1, 1),
        block_dim: (32 * warps as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Checks that `s` holds `n` elements of `dtype`.
fn expect(op: &str, s: &CudaStorage, what: &str, n: usize, dtype: DType) -> Result<()> {
    if s.dtype != dtype {
        return Err(Error::DType(format!(
            "{op}: {what} is {}, expected {dtype}",
            s.dtype
        )));
    }
    if s.len != n {
        return Err(Error::Shape(format!(
            "{op}: {what} holds {} elements, expected {n}",
            s.len
        )));
    }
    Ok(())
}

/// Checks the activations' dtype: f32 or BF16.
fn float(op: &str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::DType(format!(
            "{op}: {dtype} operands are not supported; use f32 or bf16"
        )))
    }
}

/// The kernel `name` of `dtype` (`_f32` or `_bf16`), `_vec` when `vec`.
fn kernel(dtype: DType, vec: bool, names: [&'static str; 4]) -> &'static str {
    let [f32_name, bf16_name, f32_vec, bf16_vec] = names;
    if vec {
        by_dtype(dtype, f32_vec, bf16_vec)
    } else {
        by_dtype(dtype, f32_name, bf16_name)
    }
}

impl CudaStorage {
    /// The sums over tokens of `shape` (ops_fused.cu `fused_token_sums`): of
    /// g * v into `out_gv` and, when given, of g into `out_g`, both
    /// `[batch, hidden]` of one dtype. v is y, or with `stats` (mean or
    /// none, rstd) the LayerNorm or RMSNorm output of x = y recomputed.
    fn token_sums(
        g: &CudaStorage,
        y: &CudaStorage,
        stats: Option<(Option<&CudaStorage>, &CudaStorage)>,
        shape: ModShape,
        out_gv: &CudaStorage,
        out_g: Option<&CudaStorage>,
    ) -> Result<()> {
        let ModShape {
            batch,
            tokens,
            hidden,
        } = shape;
        let n = batch * hidden;
        let chunks = tokens.div_ceil(SUM_CHUNK);
        let ctx = g.ctx();
        let pgv = ctx.alloc(chunks * n * 8).map_err(backend_err)?;
        let pg = match out_g {
            Some(_) => Some(ctx.alloc(chunks * n * 8).map_err(backend_err)?),
            None => None,
        };
        let ctas = batch * hidden.div_ceil(32) * chunks;
        let cfg = LaunchConfig {
            grid_dim: (
                u32::try_from(ctas).map_err(|_| {
                    Error::NotImplemented(format!(
                        "CUDA sums over tokens of {batch} x {tokens} x {hidden} (grid too large)"
                    ))
                })?,
                1,
                1,
            ),
            block_dim: (32, SUM_GROUPS, 1),
            shared_mem_bytes: 0,
        };
        let (mean, rstd) =
            stats.map_or((0, 0), |(m, r)| (m.map_or(0, |m| m.buf.ptr()), r.buf.ptr()));
        let (gp, yp, pgv_p) = (g.buf.ptr(), y.buf.ptr(), pgv.ptr());
        let pg_p = pg.as_ref().map_or(0, |p| p.ptr());
        let (b64, t64, d64, c64) = (batch as u64, tokens as u64, hidden as u64, chunks as u64);
        let name = by_dtype(g.dtype, "fused_token_sums_f32", "fused_token_sums_bf16");
        launch!(ctx, name, cfg, &gp, &yp, &mean, &rstd, &pgv_p, &pg_p, &b64, &t64, &d64, &c64)?;
        let (ogv, og, n64) = (out_gv.buf.ptr(), out_g.map_or(0, |o| o.buf.ptr()), n as u64);
        let name = by_dtype(
            out_gv.dtype,
            "fused_token_sums_final_f32",
            "fused_token_sums_final_bf16",
        );
        launch!(ctx, name, grid(n64), &pgv_p, &pg_p, &ogv, &og, &n64, &c64)
    }
}

impl FusedBackend for CudaStorage {
    fn modulated_norm(
        x: &CudaStorage,
        shift: &CudaStorage,
        scale: &CudaStorage,
        shape: ModShape,
        eps: f32,
    ) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
        let op = "modulated_layer_norm";
        let (rows, d, dt) = (shape.batch * shape.tokens, shape.hidden, x.dtype);
        float(op, dt)?;
        expect(op, x, "x", rows * d, dt)?;
        expect(op, shift, "shift", shape.batch * d, dt)?;
        expect(op, scale, "scale", shape.batch * d, dt)?;
        let dev = &x.device;
        let (y, mean, rstd) = (
            dev.alloc(rows * d, dt)?,
            dev.alloc(rows, DType::F32)?,
            dev.alloc(rows, DType::F32)?,
        );
        if rows * d == 0 {
            return Ok((y, mean, rstd));
        }
        let name = kernel(
            dt,
            d % VEC == 0,
            [
                "fused_modnorm_f32",
                "fused_modnorm_bf16",
                "fused_modnorm_f32_vec",
                "fused_modnorm_bf16_vec",
            ],
        );
        let (xp, sh, sc, yp, mp, rp) = (
            x.buf.ptr(),
            shift.buf.ptr(),
            scale.buf.ptr(),
            y.buf.ptr(),
            mean.buf.ptr(),
            rstd.buf.ptr(),
        );
        let (r64, d64, t64) = (rows as u64, d as u64, shape.tokens as u64);
        launch!(
            x.ctx(),
            name,
            row_grid(r64),
            &xp,
            &sh,
            &sc,
            &yp,
            &mp,
            &rp,
            &r64,
            &d64,
            &t64,
            &eps
        )?;
        Ok((y, mean, rstd))
    }

    fn modulated_norm_backward(
        saved: ModNormSaved<'_, CudaStorage>,
        g: &CudaStorage,
        shape: ModShape,
    ) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
        let op = "modulated_layer_norm backward";
        let ModNormSaved {
            x,
            scale,
            mean,
            rstd,
        } = saved;
        let (rows, d, dt) = (shape.batch * shape.tokens, shape.hidden, x.dtype);
        float(op, dt)?;
        expect(op, x, "x", rows * d, dt)?;
        expect(op, g, "the gradient", rows * d, dt)?;
        expect(op, scale, "scale", shape.batch * d, dt)?;
        expect(op, mean, "mean", rows, DType::F32)?;
        expect(op, rstd, "rstd", rows, DType::F32)?;
        let dev = &x.device;
        let dx = dev.alloc(rows * d, dt)?;
        if rows * d == 0 {
            let zeros = || dev.zeros(&crate::Shape::from([shape.batch * d]), dt);
            return Ok((dx, zeros()?, zeros()?));
        }
        let name = kernel(
            dt,
            d % VEC == 0,
            [
                "fused_modnorm_dx_f32",
                "fused_modnorm_dx_bf16",
                "fused_modnorm_dx_f32_vec",
                "fused_modnorm_dx_bf16_vec",
            ],
        );
        let (xp, gp, sc, mp, rp, dxp) = (
            x.buf.ptr(),
            g.buf.ptr(),
            scale.buf.ptr(),
            mean.buf.ptr(),
            rstd.buf.ptr(),
            dx.buf.ptr(),
        );
        let (r64, d64, t64) = (rows as u64, d as u64, shape.tokens as u64);
        launch!(
            x.ctx(),
            name,
            row_grid(r64),
            &xp,
            &gp,
            &sc,
            &mp,
            &rp,
            &dxp,
            &r64,
            &d64,
            &t64
        )?;
        let (dshift, dscale) = (
            dev.alloc(shape.batch * d, dt)?,
            dev.alloc(shape.batch * d, dt)?,
        );
        CudaStorage::token_sums(
            g,
            x,
            Some((Some(mean), rstd)),
            shape,
            &dscale,
            Some(&dshift),
        )?;
        Ok((dx, dshift, dscale))
    }

    fn gated_add(
        x: &CudaStorage,
        gate: &CudaStorage,
        y: &CudaStorage,
        shape: ModShape,
    ) -> Result<CudaStorage> {
        let op = "gated_residual";
        let (n, d, dt) = (
            shape.batch * shape.tokens * shape.hidden,
            shape.hidden,
            x.dtype,
        );
        float(op, dt)?;
        expect(op, x, "x", n, dt)?;
        expect(op, y, "y", n, dt)?;
        expect(op, gate, "gate", shape.batch * d, dt)?;
        let out = x.device.alloc(n, dt)?;
        if n == 0 {
            return Ok(out);
        }
        let vec = d % VEC == 0;
        let name = kernel(
            dt,
            vec,
            [
                "fused_gated_add_f32",
                "fused_gated_add_bf16",
                "fused_gated_add_f32_vec",
                "fused_gated_add_bf16_vec",
            ],
        );
        let per_thread = if vec { VEC } else { 1 };
        let (xp, gp, yp, op_) = (x.buf.ptr(), gate.buf.ptr(), y.buf.ptr(), out.buf.ptr());
        let (n64, d64, t64) = (n as u64, d as u64, shape.tokens as u64);
        let cfg = grid((n / per_thread) as u64);
        launch!(x.ctx(), name, cfg, &xp, &gp, &yp, &op_, &n64, &d64, &t64)?;
        Ok(out)
    }

    fn rms_norm_rope(
        x: &CudaStorage,
        weight: &CudaStorage,
        [cos, sin]: [&CudaStorage; 2],
        shape: RopeShape,
        eps: f32,
    ) -> Result<(CudaStorage, CudaStorage)> {
        let op = "rms_norm_rope";
        let (RopeShape { rows, d, seq }, dt) = (shape, x.dtype);
        float(op, dt)?;
        expect(op, x, "x", rows * d, dt)?;
        expect(op, weight, "the weight", d, DType::F32)?;
        expect(op, cos, "cos", seq * (d / 2), dt)?;
        expect(op, sin, "sin", seq * (d / 2), dt)?;
        let out = x.device.alloc(rows * d, dt)?;
        let rstd = x.device.alloc(rows, DType::F32)?;
        if rows * d == 0 {
            return Ok((out, rstd));
        }
        let (name, cfg) = if tiled(d) {
            let name = by_dtype(dt, "fused_rms_rope_f32_tile", "fused_rms_rope_bf16_tile");
            (name, tile_grid(rows, RR_WARPS))
        } else {
            let names = [
                "fused_rms_rope_f32",
                "fused_rms_rope_bf16",
                "fused_rms_rope_f32_vec",
                "fused_rms_rope_bf16_vec",
            ];
            (kernel(dt, d % VEC == 0, names), grid(rows as u64))
        };
        let (xp, wp, cp, sp, outp, rp) = (
            x.buf.ptr(),
            weight.buf.ptr(),
            cos.buf.ptr(),
            sin.buf.ptr(),
            out.buf.ptr(),
            rstd.buf.ptr(),
        );
        let (r64, d64, s64) = (rows as u64, d as u64, seq as u64);
        launch!(
            x.ctx(),
            name,
            cfg,
            &xp,
            &wp,
            &cp,
            &sp,
            &outp,
            &rp,
            &r64,
            &d64,
            &s64,
            &eps
        )?;
        Ok((out, rstd))
    }

    fn rms_norm_rope_backward(
        saved: RmsRopeSaved<'_, CudaStorage>,
        g: &CudaStorage,
        shape: RopeShape,
    ) -> Result<(CudaStorage, CudaStorage)> {
        let op = "rms_norm_rope backward";
        let RmsRopeSaved {
            x,
            weight,
            tables: [cos, sin],
            rstd,
        } = saved;
        let (RopeShape { rows, d, seq }, dt) = (shape, x.dtype);
        float(op, dt)?;
        expect(op, x, "x", rows * d, dt)?;
        expect(op, g, "the gradient", rows * d, dt)?;
        expect(op, weight, "the weight", d, DType::F32)?;
        expect(op, cos, "cos", seq * (d / 2), dt)?;
        expect(op, sin, "sin", seq * (d / 2), dt)?;
        expect(op, rstd, "rstd", rows, DType::F32)?;
        let dev = &x.device;
        let dx = dev.alloc(rows * d, dt)?;
        if rows * d == 0 {
            return Ok((dx, dev.zeros(&crate::Shape::from([d]), DType::F32)?));
        }
        // g rotated back, in x's dtype: the weight's gradient reads it.
        let back = dev.alloc(rows * d, dt)?;
        let (name, cfg) = if tiled(d) {
            let name = by_dtype(
                dt,
                "fused_rms_rope_dx_f32_tile",
                "fused_rms_rope_dx_bf16_tile",
            );
            (name, tile_grid(rows, 1))
        } else {
            let names = [
                "fused_rms_rope_dx_f32",
                "fused_rms_rope_dx_bf16",
                "fused_rms_rope_dx_f32_vec",
                "fused_rms_rope_dx_bf16_vec",
            ];
            (kernel(dt, d % VEC == 0, names), grid(rows as u64))
        };
        let (xp, wp, cp, sp, rp, gp, bp, dxp) = (
            x.buf.ptr(),
            weight.buf.ptr(),
            cos.buf.ptr(),
            sin.buf.ptr(),
            rstd.buf.ptr(),
            g.buf.ptr(),
            back.buf.ptr(),
            dx.buf.ptr(),
        );
        let (r64, d64, s64) = (rows as u64, d as u64, seq as u64);
        launch!(
            x.ctx(),
            name,
            cfg,
            &xp,
            &wp,
            &cp,
            &sp,
            &rp,
            &gp,
            &bp,
            &dxp,
            &r64,
            &d64,
            &s64
        )?;
        let dw = dev.alloc(d, DType::F32)?;
        let rows_shape = ModShape {
            batch: 1,
            tokens: rows,
            hidden: d,
        };
        CudaStorage::token_sums(&back, x, Some((None, rstd)), rows_shape, &dw, None)?;
        Ok((dx, dw))
    }

    fn gated_add_dgate(g: &CudaStorage, y: &CudaStorage, shape: ModShape) -> Result<CudaStorage> {
        let op = "gated_residual backward";
        let (n, dt) = (shape.batch * shape.tokens * shape.hidden, g.dtype);
        float(op, dt)?;
        expect(op, g, "the gradient", n, dt)?;
        expect(op, y, "y", n, dt)?;
        let width = shape.batch * shape.hidden;
        if n == 0 {
            return g.device.zeros(&crate::Shape::from([width]), dt);
        }
        let dgate = g.device.alloc(width, dt)?;
        CudaStorage::token_sums(g, y, None, shape, &dgate, None)?;
        Ok(dgate)
    }
}
