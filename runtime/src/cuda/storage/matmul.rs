//! Matmuls of [`CudaStorage`]: one strided-batched cuBLASLt call reading the
//! operands in place where it can address them, else from packed copies, and
//! the tiled `ops_matmul_*` kernel when cuBLASLt refuses both.

use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::LaunchConfig;

use super::{backend_err, by_dtype, CudaStorage, Strided, OPS};
use crate::backend::BackendStorage;
use crate::cuda::gemm::{GemmDType, GemmOperand, GemmSpec, MatLayout};
use crate::shape::coalesce;
use crate::{DType, Error, Layout, Result};

/// Side of the matmul tile (MM_TILE).
const MM_TILE: u32 = 16;

/// Matmuls that missed the fast path since the process started: index 0
/// counts first cuBLASLt attempts that failed (then retried from packed
/// copies), index 1 retries that failed too (the tiled kernel ran).
static MATMUL_FALLBACKS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// The fallback counts: `[packed retries, tiled kernel runs]`, for
/// checks and benchmarks that must know which path ran.
pub fn matmul_fallbacks() -> [usize; 2] {
    MATMUL_FALLBACKS
        .each_ref()
        .map(|c| c.load(Ordering::Relaxed))
}

/// A checked matmul: `[.., M, K]` (self, viewed by `ll`) times `rhs`
/// `[.., K, N]` (viewed by `rl`) into the packed `out`, with `dims` =
/// (batch, M, N, K), none of them 0.
pub(super) struct MatmulArgs<'a> {
    pub(super) ll: &'a Layout,
    pub(super) rhs: &'a CudaStorage,
    pub(super) rl: &'a Layout,
    pub(super) out: &'a CudaStorage,
    pub(super) dims: (usize, usize, usize, usize),
}

impl CudaStorage {
    /// cuBLASLt first, reading the operands in place, then from packed
    /// copies; if it refuses both (an unsupported combination), the tiled
    /// kernel. [`matmul_fallbacks`] counts the misses.
    pub(super) fn matmul_into(&self, mm: &MatmulArgs) -> Result<()> {
        if self.matmul_blas(mm, false).is_ok() {
            return Ok(());
        }
        MATMUL_FALLBACKS[0].fetch_add(1, Ordering::Relaxed);
        if self.matmul_blas(mm, true).is_ok() {
            return Ok(());
        }
        MATMUL_FALLBACKS[1].fetch_add(1, Ordering::Relaxed);
        self.matmul_tiled(mm)
    }

    /// The tiled `ops_matmul_*` kernel, reading both views as strided.
    fn matmul_tiled(&self, mm: &MatmulArgs) -> Result<()> {
        let MatmulArgs {
            ll,
            rhs,
            rl,
            out,
            dims: (batch, m, n, k),
        } = *mm;
        let rank = ll.dims().len();
        let bdims = &ll.dims()[..rank - 2];
        let (bd, [bs_l, bs_r]) = coalesce(
            bdims,
            [&ll.strides()[..rank - 2], &rl.strides()[..rank - 2]],
        );
        let ba = Strided::new(&bd, &bs_l, ll.offset())?;
        let bb = Strided::new(&bd, &bs_r, rl.offset())?;
        let st = |l: &Layout, i: usize| l.strides()[i] as u64;
        let (a_rs, a_cs, b_rs, b_cs) = (
            st(ll, rank - 2),
            st(ll, rank - 1),
            st(rl, rank - 2),
            st(rl, rank - 1),
        );
        let cfg = LaunchConfig {
            grid_dim: (
                (n as u64).div_ceil(MM_TILE.into()).min(u64::from(u32::MAX)) as u32,
                (m as u64).div_ceil(MM_TILE.into()).min(65_535) as u32,
                (batch as u64).min(65_535) as u32,
            ),
            block_dim: (MM_TILE, MM_TILE, 1),
            shared_mem_bytes: 0,
        };
        if m.div_ceil(MM_TILE as usize) > 65_535 {
            return Err(Error::NotImplemented(format!(
                "CUDA matmul with M = {m} rows (at most {} without cuBLASLt)",
                65_535 * MM_TILE as usize
            )));
        }
        let (a, b, y) = (self.buf.ptr(), rhs.buf.ptr(), out.buf.ptr());
        let (batch, m, n, k) = (batch as u64, m as u64, n as u64, k as u64);
        let name = by_dtype(self.dtype, "ops_matmul_f32", "ops_matmul_bf16");
        launch!(
            self.ctx(),
            name,
            cfg,
            &a,
            &b,
            &y,
            &ba,
            &bb,
            &batch,
            &m,
            &n,
            &k,
            &a_rs,
            &a_cs,
            &b_rs,
            &b_cs
        )
    }

    /// `[.., M, K] x [.., K, N]` into the packed `out` with one cuBLASLt call
    /// (f32 or BF16, f32 accumulation). Each operand is read in place when
    /// cuBLASLt can address it (see [`gemm_layout`]), else from a copy made
    /// by one kernel for the whole batch; `pack` forces the copies.
    fn matmul_blas(&self, mm: &MatmulArgs, pack: bool) -> Result<()> {
        let (batch, m, n, k) = mm.dims;
        let (a, a_copy) = self.gemm_operand(mm.ll, false, pack)?;
        let (b, b_copy) = mm.rhs.gemm_operand(mm.rl, true, pack)?;
        let dtype = if self.dtype == DType::BF16 {
            GemmDType::Bf16
        } else {
            GemmDType::F32
        };
        let op = |buf| GemmOperand {
            buf,
            dtype,
            scale_inv: None,
        };
        let spec = GemmSpec {
            m,
            n,
            k,
            batch,
            a,
            b,
            y: MatLayout::packed(m, n),
            bias: None,
            alpha: None,
        };
        self.ctx()
            .gemm(
                &op(&a_copy.as_ref().unwrap_or(self).buf),
                &op(&b_copy.as_ref().unwrap_or(mm.rhs).buf),
                &spec,
                &mm.out.buf,
                dtype,
            )
            .map_err(backend_err)
    }

    /// How cuBLASLt reads the matrices of `layout`: in place, or from a
    /// packed copy (returned). The copy keeps the view's unit-stride dim
    /// innermost, so it reads along it.
    fn gemm_operand(
        &self,
        layout: &Layout,
        rhs: bool,
        pack: bool,
    ) -> Result<(MatLayout, Option<CudaStorage>)> {
        if !pack {
            if let Some(ml) = gemm_layout(layout, rhs) {
                return Ok((ml, None));
            }
        }
        let r = layout.dims().len();
        let mut perm: Vec<usize> = (0..r).collect();
        if layout.strides()[r - 1] > layout.strides()[r - 2] {
            perm.swap(r - 2, r - 1);
        }
        let view = layout.permute(&perm)?;
        let copy = self.copy_strided(&view)?;
        let packed = Layout::contiguous(view.shape().clone()).permute(&perm)?;
        let ml = gemm_layout(&packed, rhs).ok_or_else(|| {
            Error::Backend(format!(
                "matmul: packed layout {:?} / {:?} is not a cuBLASLt layout",
                packed.dims(),
                packed.strides()
            ))
        })?;
        Ok((ml, Some(copy)))
    }
}

/// The [`MatLayout`] of the matrices of `l` read in place, if cuBLASLt can:
/// the batch dims merge into one stride, and each matrix has a unit stride
/// with the other stride covering a whole row. The lhs `[.., M, K]` is a;
/// the rhs `[.., K, N]` is read as b = its transpose `[.., N, K]`.
fn gemm_layout(l: &Layout, rhs: bool) -> Option<MatLayout> {
    let r = l.dims().len();
    let (bdims, [bs]) = coalesce(&l.dims()[..r - 2], [&l.strides()[..r - 2]]);
    if bdims.len() != 1 {
        return None;
    }
    let (mut rows, mut cols) = (l.dims()[r - 2], l.dims()[r - 1]);
    let (mut rs, mut cs) = (l.strides()[r - 2], l.strides()[r - 1]);
    if rhs {
        (rows, cols, rs, cs) = (cols, rows, cs, rs);
    }
    // A dim of size 1 has no stride that matters.
    let (transposed, ld) = if (cols == 1 || cs == 1) && (rows == 1 || rs >= cols) {
        (false, if rows == 1 { cols } else { rs })
    } else if (rows == 1 || rs == 1) && (cols == 1 || cs >= rows) {
        (true, if cols == 1 { rows } else { cs })
    } else {
        return None;
    };
    Some(MatLayout {
        offset_elems: l.offset(),
        ld,
        batch_stride: bs[0],
        transposed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Shape;

    fn mat(offset_elems: usize, ld: usize, batch_stride: usize, transposed: bool) -> MatLayout {
        MatLayout {
            offset_elems,
            ld,
            batch_stride,
            transposed,
        }
    }

    #[test]
    fn attention_views_are_read_in_place() {
        let q = Layout::contiguous(Shape::from([8, 6, 256, 64]));
        assert_eq!(gemm_layout(&q, false), Some(mat(0, 64, 256 * 64, false)));
        // k^T as the rhs is b = k: K-contiguous, the "TN" case.
        let kt = q.permute(&[0, 1, 3, 2]).unwrap();
        assert_eq!(gemm_layout(&kt, true), Some(mat(0, 64, 256 * 64, false)));
        // v as the rhs [K, N] is b stored the other way.
        assert_eq!(gemm_layout(&q, true), Some(mat(0, 64, 256 * 64, true)));
        // A narrowed view: offset and padded rows.
        let x = Layout::contiguous(Shape::from([2, 5, 9, 16]))
            .narrow(3, 3, 11)
            .unwrap();
        assert_eq!(gemm_layout(&x, false), Some(mat(3, 16, 9 * 16, false)));
        // A narrowed transposed matrix (no batch dims) is read as stored.
        let s = Layout::contiguous(Shape::from([6, 8]))
            .permute(&[1, 0])
            .unwrap()
            .narrow(0, 0, 4)
            .unwrap();
        assert_eq!(gemm_layout(&s, false), Some(mat(0, 8, 1, true)));
        // One shared matrix for the whole batch (stride 0).
        let w = Layout::contiguous(Shape::from([48, 24]))
            .broadcast_as(&Shape::from([4, 48, 24]))
            .unwrap();
        assert_eq!(gemm_layout(&w, true), Some(mat(0, 24, 0, true)));
    }

    #[test]
    fn unaddressable_views_are_packed() {
        // q of a fused [B, L, 3, H, D] projection as [B, H, L, D]: the batch
        // dims (B, H) do not merge into one stride.
        let q = Layout::contiguous(Shape::from([2, 32, 3, 4, 16]))
            .narrow(2, 0, 1)
            .unwrap()
            .permute(&[0, 2, 3, 1, 4])
            .unwrap();
        assert_eq!(gemm_layout(&q, false), None);
        // No unit stride in the matrix.
        let every_other = Layout::contiguous(Shape::from([4, 6, 2]))
            .narrow(2, 0, 1)
            .unwrap()
            .permute(&[2, 0, 1])
            .unwrap();
        assert_eq!(gemm_layout(&every_other, false), None);
    }
}
