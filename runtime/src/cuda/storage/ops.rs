//! The ops of [`CudaStorage`] ([`BackendStorage`]): argument checks and the
//! launches of the `ops_*` kernels (element-wise, row-wise and concat); the
//! matmul machinery is in `matmul.rs`.
//!
//! Element-wise maps, casts and copies run their `*_vec` kernel (VEC
//! elements a thread, 16-byte accesses, see `ops_elementwise.cu`) when
//! [`vec_ok`] says every operand allows it, else the generic strided one;
//! both compute each element with the same expression, so the same bits.

use cudarc::driver::LaunchConfig;

use super::matmul::MatmulArgs;
use super::{
    backend_err, by_dtype, grid, row_grid, CudaDevice, CudaStorage, Strided, OPS, THREADS,
};
use crate::backend::{BackendDevice, BackendStorage};
use crate::cpu::CpuStorage;
use crate::op::{BinaryOp, ReduceOp, UnaryOp};
use crate::shape::coalesce;
use crate::{DType, Error, Layout, Result, Shape};

/// Reductions over the last axis with fewer rows than this and rows longer
/// than [`REDUCE_CHUNK`] are split into chunks (`ops_reduce_rows_partial`).
const REDUCE_SPLIT_ROWS: u64 = 264;
/// Elements per CTA of a split row reduction.
const REDUCE_CHUNK: u64 = 16384;

/// Rows of threads per CTA of `ops_reduce_cols` (COL_GROUPS in ops_rowwise.cu).
const REDUCE_COL_GROUPS: u32 = 16;
/// Reductions over a middle axis with fewer CTAs than [`REDUCE_SPLIT_ROWS`]
/// (one per outer index and 32 inner positions) and an axis longer than
/// twice this are split into chunks of it (`ops_reduce_cols_partial`).
const REDUCE_COL_CHUNK: u64 = 512;

/// Elements a thread of a `*_vec` kernel moves (VEC in ops_elementwise.cu).
const VEC: usize = 8;

/// Elements a thread of the generic maps takes once a view has several runs
/// (WALK_EPT in ops_elementwise.cu): one run each is one element a thread.
const WALK_EPT: u64 = 8;

/// One operand of an element-wise kernel, as [`vec_ok`] checks it: its
/// coalesced strides (one per dim of the shared coalesced dims), its offset
/// in elements, and its buffer's address and element size.
struct VecView<'a> {
    strides: &'a [usize],
    offset: usize,
    base: u64,
    esize: usize,
}

/// Whether the `*_vec` kernels may run on operands of the coalesced `dims`:
/// the innermost dim is a multiple of [`VEC`] unless it is the only one
/// (the kernels finish a one-run view's last group element by element),
/// and each operand is packed (stride 1) or broadcast (stride 0) along it;
/// a packed one must be 16-byte aligned at every group's start, so its
/// first element and its outer strides are multiples of 16 bytes. The
/// output is a fresh packed buffer (256-byte aligned by the pool).
fn vec_ok(dims: &[usize], views: &[VecView]) -> bool {
    let Some((&inner, outer)) = dims.split_last() else {
        return false;
    };
    if !outer.is_empty() && inner % VEC != 0 {
        return false;
    }
    views.iter().all(|v| match v.strides.split_last() {
        Some((0, _)) => true,
        Some((1, outer_strides)) => {
            (v.base + (v.offset * v.esize) as u64) % 16 == 0
                && outer_strides.iter().all(|&s| (s * v.esize) % 16 == 0)
        }
        _ => false,
    })
}

/// Threads of a generic map over `n` elements of views of `rank` coalesced
/// dims: one element each for one run, [`WALK_EPT`] each otherwise.
fn walk_threads(n: u64, rank: usize) -> u64 {
    if rank <= 1 {
        n
    } else {
        n.div_ceil(WALK_EPT)
    }
}

impl CudaStorage {
    /// [`vec_ok`] for this buffer under one coalesced view.
    fn vec_view<'a>(&self, strides: &'a [usize], offset: usize) -> VecView<'a> {
        VecView {
            strides,
            offset,
            base: self.buf.ptr(),
            esize: self.esize(),
        }
    }

    /// The kernel view of a one-operand map's input, and whether the
    /// `*_vec` kernel may read it ([`vec_ok`]).
    fn map_view(&self, layout: &Layout) -> Result<(Strided, bool)> {
        let (dims, [strides]) = coalesce(layout.dims(), [layout.strides()]);
        let vec = vec_ok(&dims, &[self.vec_view(&strides, layout.offset())]);
        Ok((Strided::new(&dims, &strides, layout.offset())?, vec))
    }

    /// Places `layout`'s elements into `dst` as [`CudaStorage::place`]
    /// does, with the `ops_place_*_vec` kernel where the sizes and the
    /// source allow it.
    fn place_fast(
        &self,
        layout: &Layout,
        dst: u64,
        block: usize,
        row: usize,
        at: usize,
    ) -> Result<()> {
        let n = layout.shape().elem_count();
        let (dims, [strides]) = coalesce(layout.dims(), [layout.strides()]);
        let name = match self.esize() {
            4 => "ops_place_b4_vec",
            2 => "ops_place_b2_vec",
            _ => "",
        };
        let vec = !name.is_empty()
            && [n, block, row, at].iter().all(|v| v % VEC == 0)
            && dst % 16 == 0
            && strides.last() == Some(&1)
            && vec_ok(&dims, &[self.vec_view(&strides, layout.offset())]);
        if n == 0 || !vec {
            return self.place(layout, dst, block, row, at);
        }
        let s = Strided::new(&dims, &strides, layout.offset())?;
        let (src, n, block, row, at) = (
            self.buf.ptr(),
            n as u64,
            block as u64,
            row as u64,
            at as u64,
        );
        let cfg = grid(n / VEC as u64);
        launch!(self.ctx(), name, cfg, &src, &dst, &s, &n, &block, &row, &at)
    }
}

fn unary_code(op: UnaryOp) -> i32 {
    match op {
        UnaryOp::Exp => 0,
        UnaryOp::Log => 1,
        UnaryOp::Sqrt => 2,
        UnaryOp::Rsqrt => 3,
        UnaryOp::Sqr => 4,
        UnaryOp::Tanh => 5,
        UnaryOp::Silu => 6,
        UnaryOp::GeluTanh => 7,
    }
}

fn binary_code(op: BinaryOp) -> i32 {
    match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
        BinaryOp::Eq => 4,
        BinaryOp::SiluBackward => 5,
        BinaryOp::GeluTanhBackward => 6,
    }
}

impl BackendStorage for CudaStorage {
    type Device = CudaDevice;

    fn device(&self) -> &CudaDevice {
        &self.device
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn buffer_bytes(&self) -> usize {
        self.len * self.esize()
    }

    fn to_cpu_storage(&self) -> Result<CpuStorage> {
        let ctx = self.ctx();
        Ok(match self.dtype {
            DType::F32 => CpuStorage::F32(ctx.download(&self.buf, self.len).map_err(backend_err)?),
            DType::BF16 => {
                CpuStorage::BF16(ctx.download(&self.buf, self.len).map_err(backend_err)?)
            }
            DType::U8 => CpuStorage::U8(ctx.download(&self.buf, self.len).map_err(backend_err)?),
        })
    }

    fn copy_strided(&self, layout: &Layout) -> Result<CudaStorage> {
        self.check_layout(layout, "copy_strided")?;
        let n = layout.shape().elem_count();
        let out = self.device.alloc(n, self.dtype)?;
        self.place_fast(layout, out.buf.ptr(), n.max(1), n.max(1), 0)?;
        Ok(out)
    }

    fn to_dtype(&self, layout: &Layout, dtype: DType) -> Result<CudaStorage> {
        if dtype == self.dtype {
            return self.copy_strided(layout);
        }
        let name = match (self.dtype, dtype) {
            (DType::F32, DType::BF16) => "ops_cast_f32_bf16",
            (DType::BF16, DType::F32) => "ops_cast_bf16_f32",
            _ => {
                return Err(Error::DType(format!(
                    "to_dtype: no conversion from {} to {dtype}; u8 codes are made and read by the quantizers",
                    self.dtype
                )))
            }
        };
        self.check_layout(layout, "to_dtype")?;
        let n = layout.shape().elem_count();
        let out = self.device.alloc(n, dtype)?;
        if n > 0 {
            let (s, vec) = self.map_view(layout)?;
            let (src, dst, n) = (self.buf.ptr(), out.buf.ptr(), n as u64);
            if vec {
                let name = if name == "ops_cast_f32_bf16" {
                    "ops_cast_f32_bf16_vec"
                } else {
                    "ops_cast_bf16_f32_vec"
                };
                launch!(
                    self.ctx(),
                    name,
                    grid(n.div_ceil(VEC as u64)),
                    &src,
                    &dst,
                    &s,
                    &n
                )?;
            } else {
                launch!(self.ctx(), name, grid(n), &src, &dst, &s, &n)?;
            }
        }
        Ok(out)
    }

    fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<CudaStorage> {
        self.float(op.name())?;
        self.check_layout(layout, op.name())?;
        let n = layout.shape().elem_count();
        let out = self.device.alloc(n, self.dtype)?;
        if n > 0 {
            let (s, vec) = self.map_view(layout)?;
            let (src, dst, n, code) = (self.buf.ptr(), out.buf.ptr(), n as u64, unary_code(op));
            let (name, cfg) = if vec {
                let name = by_dtype(self.dtype, "ops_unary_f32_vec", "ops_unary_bf16_vec");
                (name, grid(n.div_ceil(VEC as u64)))
            } else {
                let name = by_dtype(self.dtype, "ops_unary_f32", "ops_unary_bf16");
                (name, grid(walk_threads(n, s.rank as usize)))
            };
            launch!(self.ctx(), name, cfg, &src, &dst, &s, &n, &code)?;
        }
        Ok(out)
    }

    fn affine(&self, layout: &Layout, mul: f32, add: f32) -> Result<CudaStorage> {
        self.float("affine")?;
        self.check_layout(layout, "affine")?;
        let n = layout.shape().elem_count();
        let out = self.device.alloc(n, self.dtype)?;
        if n > 0 {
            let (s, vec) = self.map_view(layout)?;
            let (src, dst, n) = (self.buf.ptr(), out.buf.ptr(), n as u64);
            let (name, cfg) = if vec {
                let name = by_dtype(self.dtype, "ops_affine_f32_vec", "ops_affine_bf16_vec");
                (name, grid(n.div_ceil(VEC as u64)))
            } else {
                let name = by_dtype(self.dtype, "ops_affine_f32", "ops_affine_bf16");
                (name, grid(walk_threads(n, s.rank as usize)))
            };
            launch!(self.ctx(), name, cfg, &src, &dst, &s, &n, &mul, &add)?;
        }
        Ok(out)
    }

    fn binary(
        &self,
        layout: &Layout,
        rhs: &CudaStorage,
        rhs_layout: &Layout,
        op: BinaryOp,
    ) -> Result<CudaStorage> {
        self.float(op.name())?;
        rhs.float(op.name())?;
        if self.dtype != rhs.dtype {
            return Err(Error::DType(format!(
                "{}: operands have different dtypes ({} and {})",
                op.name(),
                self.dtype,
                rhs.dtype
            )));
        }
        let (a, b) = (layout.dims(), rhs_layout.dims());
        if a != b {
            let op = op.name();
            return Err(Error::Shape(format!(
                "{op}: views of shapes {a:?} and {b:?} (broadcast first)"
            )));
        }
        self.check_layout(layout, op.name())?;
        rhs.check_layout(rhs_layout, op.name())?;
        let n = layout.shape().elem_count();
        let out = self.device.alloc(n, self.dtype)?;
        if n > 0 {
            let (dims, [ls, rs]) =
                coalesce(layout.dims(), [layout.strides(), rhs_layout.strides()]);
            let vec = vec_ok(
                &dims,
                &[
                    self.vec_view(&ls, layout.offset()),
                    rhs.vec_view(&rs, rhs_layout.offset()),
                ],
            );
            let sa = Strided::new(&dims, &ls, layout.offset())?;
            let sb = Strided::new(&dims, &rs, rhs_layout.offset())?;
            let (a, b, y, n, code) = (
                self.buf.ptr(),
                rhs.buf.ptr(),
                out.buf.ptr(),
                n as u64,
                binary_code(op),
            );
            let (name, cfg) = if vec {
                let name = by_dtype(self.dtype, "ops_binary_f32_vec", "ops_binary_bf16_vec");
                (name, grid(n.div_ceil(VEC as u64)))
            } else {
                let name = by_dtype(self.dtype, "ops_binary_f32", "ops_binary_bf16");
                (name, grid(walk_threads(n, dims.len())))
            };
            launch!(self.ctx(), name, cfg, &a, &b, &y, &sa, &sb, &n, &code)?;
        }
        Ok(out)
    }

    fn reduce(&self, layout: &Layout, op: ReduceOp, axis: usize) -> Result<CudaStorage> {
        self.float(op.name())?;
        let dims = layout.dims();
        if axis >= dims.len() {
            return Err(Error::AxisOutOfRange {
                axis: axis as isize,
                rank: dims.len(),
            });
        }
        let outer: usize = dims[..axis].iter().product();
        let inner: usize = dims[axis + 1..].iter().product();
        let n = dims[axis];
        let out = self.device.alloc(outer * inner, self.dtype)?;
        if outer * inner == 0 {
            return Ok(out);
        }
        let (x, _keep) = self.packed(layout, op.name())?;
        let y = out.buf.ptr();
        let code: i32 = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 1,
        };
        let (outer, n64, inner) = (outer as u64, n as u64, inner as u64);
        if inner == 1 && outer < REDUCE_SPLIT_ROWS && n64 > REDUCE_CHUNK {
            let chunks = n64.div_ceil(REDUCE_CHUNK);
            let partial = self
                .ctx()
                .alloc((outer * chunks) as usize * 4)
                .map_err(backend_err)?;
            let pp = partial.ptr();
            let name = by_dtype(
                self.dtype,
                "ops_reduce_rows_partial_f32",
                "ops_reduce_rows_partial_bf16",
            );
            let cfg = LaunchConfig {
                grid_dim: ((outer * chunks) as u32, 1, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let chunk = REDUCE_CHUNK;
            launch!(self.ctx(), name, cfg, &x, &pp, &n64, &chunk, &chunks, &code)?;
            let name = by_dtype(
                self.dtype,
                "ops_reduce_rows_final_f32",
                "ops_reduce_rows_final_bf16",
            );
            launch!(
                self.ctx(),
                name,
                grid(outer),
                &pp,
                &y,
                &outer,
                &chunks,
                &code
            )?;
        } else if inner == 1 {
            let name = by_dtype(self.dtype, "ops_reduce_rows_f32", "ops_reduce_rows_bf16");
            launch!(
                self.ctx(),
                name,
                row_grid(outer),
                &x,
                &y,
                &outer,
                &n64,
                &code
            )?;
        } else if outer * inner.div_ceil(32) < REDUCE_SPLIT_ROWS && n64 > 2 * REDUCE_COL_CHUNK {
            let chunks = n64.div_ceil(REDUCE_COL_CHUNK);
            let outputs = outer * inner;
            let partial = self
                .ctx()
                .alloc((outputs * chunks) as usize * 4)
                .map_err(backend_err)?;
            let pp = partial.ptr();
            let name = by_dtype(
                self.dtype,
                "ops_reduce_cols_partial_f32",
                "ops_reduce_cols_partial_bf16",
            );
            let cfg = LaunchConfig {
                grid_dim: ((outer * inner.div_ceil(32) * chunks) as u32, 1, 1),
                block_dim: (32, REDUCE_COL_GROUPS, 1),
                shared_mem_bytes: 0,
            };
            let chunk = REDUCE_COL_CHUNK;
            launch!(
                self.ctx(),
                name,
                cfg,
                &x,
                &pp,
                &n64,
                &inner,
                &chunk,
                &chunks,
                &code
            )?;
            let name = by_dtype(
                self.dtype,
                "ops_reduce_rows_final_f32",
                "ops_reduce_rows_final_bf16",
            );
            launch!(
                self.ctx(),
                name,
                grid(outputs),
                &pp,
                &y,
                &outputs,
                &chunks,
                &code
            )?;
        } else {
            let name = by_dtype(self.dtype, "ops_reduce_cols_f32", "ops_reduce_cols_bf16");
            // One CTA per (outer, 32 inner positions), COL_GROUPS rows of threads.
            let ctas = outer * inner.div_ceil(32);
            let cfg = LaunchConfig {
                grid_dim: (
                    u32::try_from(ctas).map_err(|_| {
                        Error::NotImplemented(format!(
                            "CUDA reduce over {outer} x {inner} outputs (grid too large)"
                        ))
                    })?,
                    1,
                    1,
                ),
                block_dim: (32, REDUCE_COL_GROUPS, 1),
                shared_mem_bytes: 0,
            };
            launch!(self.ctx(), name, cfg, &x, &y, &outer, &n64, &inner, &code)?;
        }
        Ok(out)
    }

    fn matmul(
        &self,
        layout: &Layout,
        rhs: &CudaStorage,
        rhs_layout: &Layout,
    ) -> Result<CudaStorage> {
        self.float("matmul")?;
        rhs.float("matmul")?;
        if self.dtype != rhs.dtype {
            return Err(Error::DType(format!(
                "matmul: operands have different dtypes ({} and {})",
                self.dtype, rhs.dtype
            )));
        }
        let (ll, rl) = (layout, rhs_layout);
        let rank = ll.dims().len();
        if rank < 2 || rl.dims().len() != rank || ll.dims()[..rank - 2] != rl.dims()[..rank - 2] {
            return Err(Error::Shape(format!(
                "matmul takes two views of equal rank >= 2 with equal batch dims, got {:?} and {:?}",
                ll.dims(),
                rl.dims()
            )));
        }
        let (m, k, n) = (
            ll.dims()[rank - 2],
            ll.dims()[rank - 1],
            rl.dims()[rank - 1],
        );
        if rl.dims()[rank - 2] != k {
            return Err(Error::Shape(format!(
                "matmul: inner dims differ ({:?} x {:?})",
                ll.dims(),
                rl.dims()
            )));
        }
        self.check_layout(ll, "matmul")?;
        rhs.check_layout(rl, "matmul")?;
        let batch: usize = ll.dims()[..rank - 2].iter().product();
        if batch * m * n == 0 {
            return self.device.alloc(0, self.dtype);
        }
        if k == 0 {
            return self
                .device
                .zeros(&Shape::from(vec![batch, m, n]), self.dtype);
        }
        let out = self.device.alloc(batch * m * n, self.dtype)?;
        self.matmul_into(&MatmulArgs {
            ll,
            rhs,
            rl,
            out: &out,
            dims: (batch, m, n, k),
        })?;
        Ok(out)
    }

    fn concat(parts: &[(&CudaStorage, &Layout)], axis: usize) -> Result<CudaStorage> {
        let Some(&(first, first_layout)) = parts.first() else {
            return Err(Error::Shape("concat of no tensors".into()));
        };
        let rank = first_layout.dims().len();
        if axis >= rank {
            return Err(Error::AxisOutOfRange {
                axis: axis as isize,
                rank,
            });
        }
        for (s, l) in parts {
            if s.dtype != first.dtype {
                return Err(Error::DType("concat: parts have different dtypes".into()));
            }
            s.check_layout(l, "concat")?;
        }
        let outer: usize = first_layout.dims()[..axis].iter().product();
        let blocks: Vec<usize> = parts
            .iter()
            .map(|(_, l)| l.dims()[axis..].iter().product())
            .collect();
        let row: usize = blocks.iter().sum();
        let out = first.device.alloc(outer * row, first.dtype)?;
        let mut at = 0;
        for ((s, l), &block) in parts.iter().zip(&blocks) {
            if block > 0 {
                s.place_fast(l, out.buf.ptr(), block, row, at)?;
            }
            at += block;
        }
        Ok(out)
    }

    fn softmax_last_dim(&self, layout: &Layout) -> Result<CudaStorage> {
        self.float("softmax")?;
        let n = layout.shape().elem_count();
        let d = layout.dims().last().copied().unwrap_or(1);
        let out = self.device.alloc(n, self.dtype)?;
        if n == 0 || d == 0 {
            return Ok(out);
        }
        let (x, _keep) = self.packed(layout, "softmax")?;
        let (y, rows, d) = (out.buf.ptr(), (n / d) as u64, d as u64);
        let name = by_dtype(self.dtype, "ops_softmax_f32", "ops_softmax_bf16");
        launch!(self.ctx(), name, row_grid(rows), &x, &y, &rows, &d)?;
        Ok(out)
    }

    fn norm_last_dim(
        &self,
        layout: &Layout,
        eps: f32,
        rms: bool,
    ) -> Result<(CudaStorage, CudaStorage)> {
        let op = if rms { "rms_norm" } else { "layer_norm" };
        self.float(op)?;
        let n = layout.shape().elem_count();
        let d = layout.dims().last().copied().unwrap_or(1);
        let rows = n.checked_div(d).unwrap_or(0);
        let y = self.device.alloc(n, self.dtype)?;
        let rstd = self.device.alloc(rows, self.dtype)?;
        if rows == 0 {
            return Ok((y, rstd));
        }
        let (x, _keep) = self.packed(layout, op)?;
        let (yp, rp, rows64, d64, rms) = (
            y.buf.ptr(),
            rstd.buf.ptr(),
            rows as u64,
            d as u64,
            i32::from(rms),
        );
        let name = by_dtype(self.dtype, "ops_norm_f32", "ops_norm_bf16");
        launch!(
            self.ctx(),
            name,
            row_grid(rows64),
            &x,
            &yp,
            &rp,
            &rows64,
            &d64,
            &eps,
            &rms
        )?;
        Ok((y, rstd))
    }

    fn rope_interleaved(
        &self,
        layout: &Layout,
        cos: &CudaStorage,
        cos_layout: &Layout,
        sin: &CudaStorage,
        sin_layout: &Layout,
    ) -> Result<CudaStorage> {
        let op = "rope_interleaved";
        self.float(op)?;
        if cos.dtype != self.dtype || sin.dtype != self.dtype {
            return Err(Error::DType(format!(
                "{op}: x, cos and sin must share a dtype"
            )));
        }
        let dims = layout.dims();
        if dims.len() < 2 || dims[dims.len() - 1] % 2 != 0 {
            return Err(Error::Shape(format!(
                "{op}: x must be [.., L, D] with D even, got {dims:?}"
            )));
        }
        let (seq, d) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        let half = d / 2;
        for (l, what) in [(cos_layout, "cos"), (sin_layout, "sin")] {
            if l.shape().elem_count() != seq * half {
                return Err(Error::Shape(format!(
                    "{op}: {what} must hold [{seq}, {half}] values, got {:?}",
                    l.dims()
                )));
            }
        }
        let n = layout.shape().elem_count();
        let out = self.device.alloc(n, self.dtype)?;
        if n == 0 {
            return Ok(out);
        }
        let (x, _kx) = self.packed(layout, op)?;
        let (c, _kc) = cos.packed(cos_layout, op)?;
        let (s, _ks) = sin.packed(sin_layout, op)?;
        let (y, pairs, seq, half) = (out.buf.ptr(), (n / 2) as u64, seq as u64, half as u64);
        let name = by_dtype(self.dtype, "ops_rope_f32", "ops_rope_bf16");
        launch!(
            self.ctx(),
            name,
            grid(pairs),
            &x,
            &c,
            &s,
            &y,
            &pairs,
            &seq,
            &half
        )?;
        Ok(out)
    }
}
