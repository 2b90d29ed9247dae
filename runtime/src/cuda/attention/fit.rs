//! The attention path a device's shared memory (LDS) can hold. The
//! tensor-core passes at d = 128 take about 69 KB, above the 64 KiB of a
//! gfx942 block; such a device runs the scalar kernels on 32-, then
//! 16-row tiles instead, and the host kernels when none fits. An H200
//! (227 KiB per block) keeps every path that `Path::of` picks.

use super::{CudaDevice, Pass, Path};
use crate::backend::AttentionShape;
use crate::DType;

impl Path {
    /// [`Path::of`] narrowed to what `dev`'s blocks can hold.
    pub(super) fn on(dtype: DType, sh: &AttentionShape, dev: &CudaDevice) -> Option<Path> {
        let cap = dev.context().info().shared_mem_per_block;
        Path::of(dtype, sh).and_then(|p| p.fitted(sh.d, sh.dv, cap))
    }

    /// This path, or the first narrower one whose three passes fit in `cap`
    /// bytes of shared memory at widths (d, dv): scalar tiles of 32 rows
    /// (widths up to 128), then of 16; `None` when none fits.
    pub(super) fn fitted(self, d: usize, dv: usize, cap: usize) -> Option<Path> {
        let bf16 = match self {
            Path::Mma { .. } => true,
            Path::Scalar { bf16, .. } => bf16,
        };
        let narrower = [32, 16]
            .into_iter()
            .filter(|&tile| tile < self.rows(Pass::Dq) && (tile == 16 || d.max(dv) <= 128))
            .map(|tile| Path::Scalar { bf16, tile });
        std::iter::once(self).chain(narrower).find(|p| {
            [Pass::Forward, Pass::Dq, Pass::Dkdv]
                .iter()
                .all(|&pass| p.smem(pass, d, dv) <= cap)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GFX942: usize = 64 << 10;
    const H200: usize = 227 << 10;

    #[test]
    fn d128_leaves_the_tensor_cores_on_a_64_kib_device() {
        let mma = Path::Mma { width: 128 };
        assert!(mma.smem(Pass::Dq, 128, 128) > GFX942, "the premise: ~69 KB");
        // 32-row scalar tiles need 74 752 bytes in dk/dv at d = 128: too many too.
        assert_eq!(
            mma.fitted(128, 128, GFX942),
            Some(Path::Scalar {
                bf16: true,
                tile: 16
            })
        );
        assert_eq!(mma.fitted(128, 128, H200), Some(mma));
    }

    #[test]
    fn narrower_widths_keep_their_path() {
        let mma64 = Path::Mma { width: 64 };
        assert_eq!(mma64.fitted(64, 64, GFX942), Some(mma64));
        let sc = Path::Scalar {
            bf16: false,
            tile: 32,
        };
        assert_eq!(sc.fitted(64, 64, GFX942), Some(sc));
    }

    #[test]
    fn a_16_row_tile_is_never_widened_and_may_not_fit() {
        let t16 = Path::Scalar {
            bf16: false,
            tile: 16,
        };
        assert_eq!(t16.fitted(256, 256, H200), Some(t16));
        assert_eq!(t16.fitted(256, 256, GFX942), None);
        // 32-row tiles are not offered past width 128.
        let mma = Path::Mma { width: 128 };
        assert_eq!(
            mma.fitted(128, 200, 40 << 10),
            None,
            "16-row tiles at dv = 200 need more than 40 KiB"
        );
    }
}
