//! Fused attention on CUDA ([`AttentionBackend`]): flash-attention 2 kernels
//! (`runtime/kernels/attention.cu`) with the math of the CPU reference
//! (`cpu/attention.rs`): online softmax, f32 accumulation, o and the
//! gradients in the inputs' dtype, the f32 log-sum-exp; no `[l, s]` buffer.
//!
//! Paths, chosen per call from the dtype and the head widths:
//! - **tensor cores**: BF16 with `d == dv` in {32, 64, 128} (Flux's 128 and
//!   the small configs' 64). Four warps per CTA, 16 rows per warp, 64-row
//!   tiles (the forward at 128: 32 rows per warp, 128-row tiles); `mma.sync` m16n8k16 (BF16 in, f32 accumulate) on operands that
//!   async copies bring to padded shared tiles and `ldmatrix` to registers.
//!   Probabilities and dS are rounded to BF16 as MMA inputs, as in
//!   flash-attention; statistics and accumulators stay f32.
//! - **scalar**: everything else with `d, dv <= 256` (f32 inputs, other
//!   widths, `d != dv`): f32 FMA on T x T tiles (T = 32, or 16 past 128).
//! - **host**: heads wider than 256 (or an empty key axis) run the CPU
//!   kernels on host copies and upload the results, as before the GPU
//!   kernels existed.
//!
//! The backward launches `attn_dsum` (D = rowsum(dO * o), f32), then a dq
//! pass over query tiles and a dk/dv pass over key tiles, each recomputing
//! p from q, k and the saved log-sum-exp. Each output element has one
//! writer, so the gradients are the same bits on every run.

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::LaunchConfig;

use super::nvrtc::{launch_kernel, KernelSource};
use super::storage::backend_err;
use super::{CudaContext, CudaDevice, CudaStorage};
use crate::backend::{
    AttentionBackend, AttentionSaved, AttentionShape, BackendDevice, BackendStorage,
};
use crate::cpu::CpuStorage;
use crate::{DType, Error, Result, Shape};

/// The attention kernels, one module: the CUDA primitives
/// (`attention_mma_cuda.cuh`: mma, ldmatrix, async copies, quad reductions)
/// and then `attention.cu` (the tensor-core kernels) and
/// `attention_scalar.cu` (the scalar ones), which use only those and
/// `common.cuh`.
pub const ATTENTION: KernelSource = KernelSource {
    name: "attention.cu",
    body: concat!(
        "#line 1 \"attention_mma_cuda.cuh\"\n",
        include_str!("../../kernels/attention_mma_cuda.cuh"),
        "\n#line 1 \"attention.cu\"\n",
        include_str!("../../kernels/attention.cu"),
        "\n#line 1 \"attention_scalar.cu\"\n",
        include_str!("../../kernels/attention_scalar.cu")
    ),
};

/// The HIP form of [`ATTENTION`] (for AMD GPUs, compile-checked only by
/// `.ci/rocm-kernels`, never compiled by this backend): the portable HIP
/// shim `attention_mma_hip.cuh` (same functions and semantics, no MFMA yet)
/// in place of the CUDA one, then the same `attention.cu` and
/// `attention_scalar.cu`.
pub const ATTENTION_HIP: KernelSource = KernelSource {
    name: "attention.cu",
    body: concat!(
        "#line 1 \"attention_mma_hip.cuh\"\n",
        include_str!("../../kernels/attention_mma_hip.cuh"),
        "\n#line 1 \"attention.cu\"\n",
        include_str!("../../kernels/attention.cu"),
        "\n#line 1 \"attention_scalar.cu\"\n",
        include_str!("../../kernels/attention_scalar.cu")
    ),
};

mod fit;

/// Widest `d` or `dv` the GPU kernels take.
const MAX_WIDTH: usize = 256;
/// Head widths of the tensor-core kernels (`ATTN_MMA_KERNELS` instances)
/// and, in the same order, the blocks of 16 query rows each warp of their
/// forward owns (the instances' FWD_MT): two at 128, where one warp reading
/// its K and V fragments for 32 rows halves the shared-memory reads per
/// MMA; the forward then steps over 64 / FWD_MT keys at a time.
const MMA_WIDTHS: [usize; 3] = [32, 64, 128];
const FWD_M_TILES: [usize; 3] = [1, 1, 2];
/// Threads and rows of a tensor-core CTA (MMA_THREADS, MMA_ROWS).
const MMA_THREADS: u32 = 128;
const MMA_ROWS: usize = 64;
/// Columns per inner step: keys of the forward (MMA_COLS) and of the dq
/// pass (DQ_BN), queries of the dk/dv pass (DKDV_BN).
const MMA_COLS: usize = 64;
const DQ_BN: usize = 32;
const DKDV_BN: usize = 32;
/// Threads of a scalar CTA (SC_THREADS) and of the D kernel (DSUM_WARPS
/// warps of 32 rows: one row a thread).
const SC_THREADS: u32 = 256;
const DSUM_THREADS: u32 = 256;
/// Dynamic shared memory a kernel may use without opting in.
const DEFAULT_SMEM: usize = 48 * 1024;

/// The three launches of a fused attention, in `*_NAMES` order.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pass {
    Forward = 0,
    Dq = 1,
    Dkdv = 2,
}

/// Tensor-core kernels by pass and width (`MMA_WIDTHS` order).
const MMA_NAMES: [[&str; 3]; 3] = [
    ["attn_fwd_mma_d32", "attn_fwd_mma_d64", "attn_fwd_mma_d128"],
    ["attn_dq_mma_d32", "attn_dq_mma_d64", "attn_dq_mma_d128"],
    [
        "attn_dkdv_mma_d32",
        "attn_dkdv_mma_d64",
        "attn_dkdv_mma_d128",
    ],
];

/// Scalar kernels by pass, dtype (f32, bf16) and tile (32, 16).
const SC_NAMES: [[[&str; 2]; 2]; 3] = [
    [
        ["attn_fwd_f32_t32", "attn_fwd_f32_t16"],
        ["attn_fwd_bf16_t32", "attn_fwd_bf16_t16"],
    ],
    [
        ["attn_dq_f32_t32", "attn_dq_f32_t16"],
        ["attn_dq_bf16_t32", "attn_dq_bf16_t16"],
    ],
    [
        ["attn_dkdv_f32_t32", "attn_dkdv_f32_t16"],
        ["attn_dkdv_bf16_t32", "attn_dkdv_bf16_t16"],
    ],
];

/// Which kernels run a shape.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    /// Tensor cores, `d == dv == width`.
    Mma { width: usize },
    /// Scalar FMA on `tile` x `tile` tiles.
    Scalar { bf16: bool, tile: usize },
}

impl Path {
    /// The GPU path of a shape, or `None` for the host fallback.
    fn of(dtype: DType, sh: &AttentionShape) -> Option<Path> {
        if sh.s == 0 || sh.d == 0 || sh.dv == 0 || sh.d > MAX_WIDTH || sh.dv > MAX_WIDTH {
            return None;
        }
        let bf16 = dtype == DType::BF16;
        if bf16 && sh.d == sh.dv && MMA_WIDTHS.contains(&sh.d) {
            return Some(Path::Mma { width: sh.d });
        }
        let tile = if sh.d.max(sh.dv) <= 128 { 32 } else { 16 };
        Some(Path::Scalar { bf16, tile })
    }

    fn kernel(self, pass: Pass) -> &'static str {
        match self {
            Path::Mma { width } => MMA_NAMES[pass as usize][mma_index(width)],
            Path::Scalar { bf16, tile } => {
                SC_NAMES[pass as usize][usize::from(bf16)][usize::from(tile == 16)]
            }
        }
    }

    /// Rows of q (forward, dq) or k (dk/dv) one CTA of `pass` owns.
    fn rows(self, pass: Pass) -> usize {
        match (self, pass) {
            (Path::Mma { width }, Pass::Forward) => MMA_ROWS * FWD_M_TILES[mma_index(width)],
            (Path::Mma { .. }, _) => MMA_ROWS,
            (Path::Scalar { tile, .. }, _) => tile,
        }
    }

    fn threads(self) -> u32 {
        match self {
            Path::Mma { .. } => MMA_THREADS,
            Path::Scalar { .. } => SC_THREADS,
        }
    }

    /// Bytes of dynamic shared memory of `pass` at widths (d, dv): the
    /// carving each kernel's comment in attention.cu gives.
    fn smem(self, pass: Pass, d: usize, dv: usize) -> usize {
        match self {
            Path::Mma { width } => {
                let row = 2 * (width + 8);
                match pass {
                    // K and V tiles [MMA_COLS / FWD_MT]; with one block of
                    // rows a warp, the Q tile [MMA_ROWS] is staged in the
                    // same space first, so it must fit there; with two it
                    // stays after them.
                    Pass::Forward => match FWD_M_TILES[mma_index(width)] {
                        1 => (2 * MMA_COLS).max(MMA_ROWS) * row,
                        mt => (2 * MMA_COLS / mt + MMA_ROWS * mt) * row,
                    },
                    Pass::Dq => (2 * MMA_ROWS + 4 * DQ_BN) * row,
                    Pass::Dkdv => (2 * MMA_ROWS + 4 * DKDV_BN) * row + 4 * DKDV_BN * 4,
                }
            }
            Path::Scalar { tile: t, .. } => {
                let (qk, vo, p) = (t * (d + 1), t * (dv + 1), t * (t + 1));
                4 * match pass {
                    Pass::Forward => 2 * qk + vo + p + 3 * t,
                    Pass::Dq => 2 * qk + 2 * vo + p,
                    Pass::Dkdv => 2 * qk + 2 * vo + 2 * p + 2 * t,
                }
            }
        }
    }

    /// The most shared memory `pass` of this kernel takes at any width it
    /// runs: the opt-in limit set on it, the same for every call, so that
    /// concurrent launches of different widths never race on the attribute.
    fn smem_limit(self, pass: Pass) -> usize {
        match self {
            Path::Mma { .. } => self.smem(pass, 0, 0),
            Path::Scalar { tile, .. } => {
                let w = if tile == 32 { 128 } else { MAX_WIDTH };
                self.smem(pass, w, w)
            }
        }
    }
}

/// The position of a tensor-core width in [`MMA_WIDTHS`].
fn mma_index(width: usize) -> usize {
    MMA_WIDTHS
        .iter()
        .position(|&w| w == width)
        .expect("a tensor-core width")
}

/// Launches `pass` of `path` over `ctas` CTAs; the arguments follow.
macro_rules! launch_pass {
    ($ctx:expr, $path:expr, $pass:expr, $ctas:expr, ($d:expr, $dv:expr), $($arg:expr),+ $(,)?) => {{
        let (ctx, path, pass): (&CudaContext, Path, Pass) = ($ctx, $path, $pass);
        let name = path.kernel(pass);
        let cfg = config(ctx, path, pass, name, $ctas, $d, $dv)?;
        launch_kernel!(ctx, &ATTENTION, name, cfg, $($arg),+).map_err(backend_err)
    }};
}

/// The launch of `ctas` CTAs of kernel `name`, opting it in to more than
/// 48 KiB of dynamic shared memory where it needs that.
fn config(
    ctx: &CudaContext,
    path: Path,
    pass: Pass,
    name: &'static str,
    ctas: usize,
    d: usize,
    dv: usize,
) -> Result<LaunchConfig> {
    let smem = path.smem(pass, d, dv);
    let limit = path.smem_limit(pass);
    assert!(
        smem <= limit,
        "attention: {name} needs {smem} bytes of shared memory, above its limit {limit}"
    );
    if limit > DEFAULT_SMEM {
        let f = ctx.function(&ATTENTION, name).map_err(backend_err)?;
        ctx.bind().map_err(backend_err)?;
        f.set_attribute(
            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            limit as i32,
        )
        .map_err(|e| {
            Error::Backend(format!(
                "cuFuncSetAttribute({name}, {limit} bytes of shared memory): {e:?}"
            ))
        })?;
    }
    Ok(LaunchConfig {
        grid_dim: (grid_x(ctas)?, 1, 1),
        block_dim: (path.threads(), 1, 1),
        shared_mem_bytes: smem as u32,
    })
}

/// A grid's x extent (the kernels find the head and tile from blockIdx.x).
fn grid_x(ctas: usize) -> Result<u32> {
    u32::try_from(ctas)
        .ok()
        .filter(|&n| n <= i32::MAX as u32)
        .ok_or_else(|| Error::NotImplemented(format!("attention: a grid of {ctas} CTAs")))
}

/// `n` as the kernels' `int` arguments.
fn int(n: usize, what: &str) -> Result<i32> {
    i32::try_from(n)
        .map_err(|_| Error::NotImplemented(format!("attention: {what} = {n} does not fit an int")))
}

/// An uninitialized packed buffer of `n` elements.
fn alloc(dev: &CudaDevice, n: usize, dtype: DType) -> Result<CudaStorage> {
    let buf = dev
        .context()
        .alloc(n * dtype.size_in_bytes())
        .map_err(backend_err)?;
    Ok(CudaStorage::from_buffer(buf, dtype, n, dev.clone()))
}

/// Checks an operand: f32 or BF16 (of `dtype` where given), at least `n` elements.
fn operand(s: &CudaStorage, what: &str, dtype: Option<DType>, n: usize) -> Result<()> {
    let want = dtype.unwrap_or(s.dtype());
    if s.dtype() != want || !matches!(want, DType::F32 | DType::BF16) {
        return Err(Error::DType(format!(
            "attention: {what} is {}, expected {}",
            s.dtype(),
            if dtype.is_some() {
                want.to_string()
            } else {
                "f32 or bf16".into()
            }
        )));
    }
    if s.len() < n {
        return Err(Error::Shape(format!(
            "attention: {what} holds {} elements, the shape needs {n}",
            s.len()
        )));
    }
    Ok(())
}

impl AttentionBackend for CudaStorage {
    fn attention_forward(
        q: &Self,
        k: &Self,
        v: &Self,
        sh: AttentionShape,
        scale: f32,
    ) -> Result<(Self, Self)> {
        let dtype = q.dtype();
        operand(q, "q", None, sh.heads * sh.l * sh.d)?;
        operand(k, "k", Some(dtype), sh.heads * sh.s * sh.d)?;
        operand(v, "v", Some(dtype), sh.heads * sh.s * sh.dv)?;
        let Some(path) = Path::on(dtype, &sh, q.device()) else {
            return host_forward(q, k, v, sh, scale);
        };
        let dev = q.device();
        let o = alloc(dev, sh.heads * sh.l * sh.dv, dtype)?;
        let lse = alloc(dev, sh.heads * sh.l, DType::F32)?;
        if sh.heads * sh.l == 0 {
            return Ok((o, lse));
        }
        let ctx = dev.context();
        let (l, s, d, dv) = (
            int(sh.l, "L")?,
            int(sh.s, "S")?,
            int(sh.d, "d")?,
            int(sh.dv, "dv")?,
        );
        let ctas = sh.heads * sh.l.div_ceil(path.rows(Pass::Forward));
        let ptrs = [q, k, v, &o, &lse].map(|t| t.buffer().ptr());
        let [pq, pk, pv, po, plse] = ptrs;
        // Every buffer holds the packed [heads, ..] operand the shape names
        // (checked above; o and lse were allocated for it).
        match path {
            Path::Mma { .. } => launch_pass!(
                ctx,
                path,
                Pass::Forward,
                ctas,
                (sh.d, sh.dv),
                &pq,
                &pk,
                &pv,
                &po,
                &plse,
                &l,
                &s,
                &scale
            )?,
            Path::Scalar { .. } => launch_pass!(
                ctx,
                path,
                Pass::Forward,
                ctas,
                (sh.d, sh.dv),
                &pq,
                &pk,
                &pv,
                &po,
                &plse,
                &l,
                &s,
                &d,
                &dv,
                &scale
            )?,
        }
        Ok((o, lse))
    }

    fn attention_backward(
        saved: AttentionSaved<'_, Self>,
        d_o: &Self,
        sh: AttentionShape,
        scale: f32,
    ) -> Result<(Self, Self, Self)> {
        let dtype = saved.q.dtype();
        let (n_q, n_k, n_v, n_o) = (
            sh.heads * sh.l * sh.d,
            sh.heads * sh.s * sh.d,
            sh.heads * sh.s * sh.dv,
            sh.heads * sh.l * sh.dv,
        );
        operand(saved.q, "q", None, n_q)?;
        operand(saved.k, "k", Some(dtype), n_k)?;
        operand(saved.v, "v", Some(dtype), n_v)?;
        operand(saved.o, "o", Some(dtype), n_o)?;
        operand(d_o, "dO", Some(dtype), n_o)?;
        operand(saved.lse, "lse", Some(DType::F32), sh.heads * sh.l)?;
        let Some(path) = Path::on(dtype, &sh, d_o.device()) else {
            return host_backward(saved, d_o, sh, scale);
        };
        let dev = d_o.device();
        let dq = alloc(dev, n_q, dtype)?;
        if sh.heads * sh.l == 0 {
            // No query: dk and dv are sums over nothing.
            let zeros = |n| dev.zeros(&Shape::new(vec![n]), dtype);
            return Ok((dq, zeros(n_k)?, zeros(n_v)?));
        }
        let dk = alloc(dev, n_k, dtype)?;
        let dv_out = alloc(dev, n_v, dtype)?;
        let ctx = dev.context();
        let rows = (sh.heads * sh.l) as u64;
        let dsum = alloc(dev, sh.heads * sh.l, DType::F32)?;
        let (l, s, d, dv) = (
            int(sh.l, "L")?,
            int(sh.s, "S")?,
            int(sh.d, "d")?,
            int(sh.dv, "dv")?,
        );
        let [pq, pk, pv, po, plse, pdo, pds, pdq, pdk, pdv] = [
            saved.q, saved.k, saved.v, saved.o, saved.lse, d_o, &dsum, &dq, &dk, &dv_out,
        ]
        .map(|t| t.buffer().ptr());
        // D = rowsum(dO * o): o and dO hold `rows` rows of dv, dsum one f32 each.
        let dsum_cfg = LaunchConfig {
            grid_dim: (
                grid_x((sh.heads * sh.l).div_ceil(DSUM_THREADS as usize))?,
                1,
                1,
            ),
            block_dim: (DSUM_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let dsum_name = if dtype == DType::BF16 {
            "attn_dsum_bf16"
        } else {
            "attn_dsum_f32"
        };
        launch_kernel!(ctx, &ATTENTION, dsum_name, dsum_cfg, &po, &pdo, &pds, &rows, &dv)
            .map_err(backend_err)?;
        let q_ctas = sh.heads * sh.l.div_ceil(path.rows(Pass::Dq));
        let k_ctas = sh.heads * sh.s.div_ceil(path.rows(Pass::Dkdv));
        // Every buffer holds the packed operand the shape names (checked
        // above; the outputs were allocated for it).
        match path {
            Path::Mma { .. } => {
                launch_pass!(
                    ctx,
                    path,
                    Pass::Dq,
                    q_ctas,
                    (sh.d, sh.dv),
                    &pq,
                    &pk,
                    &pv,
                    &pdo,
                    &plse,
                    &pds,
                    &pdq,
                    &l,
                    &s,
                    &scale
                )?;
                launch_pass!(
                    ctx,
                    path,
                    Pass::Dkdv,
                    k_ctas,
                    (sh.d, sh.dv),
                    &pq,
                    &pk,
                    &pv,
                    &pdo,
                    &plse,
                    &pds,
                    &pdk,
                    &pdv,
                    &l,
                    &s,
                    &scale
                )?;
            }
            Path::Scalar { .. } => {
                launch_pass!(
                    ctx,
                    path,
                    Pass::Dq,
                    q_ctas,
                    (sh.d, sh.dv),
                    &pq,
                    &pk,
                    &pv,
                    &pdo,
                    &plse,
                    &pds,
                    &pdq,
                    &l,
                    &s,
                    &d,
                    &dv,
                    &scale
                )?;
                launch_pass!(
                    ctx,
                    path,
                    Pass::Dkdv,
                    k_ctas,
                    (sh.d, sh.dv),
                    &pq,
                    &pk,
                    &pv,
                    &pdo,
                    &plse,
                    &pds,
                    &pdk,
                    &pdv,
                    &l,
                    &s,
                    &d,
                    &dv,
                    &scale
                )?;
            }
        }
        Ok((dq, dk, dv_out))
    }
}

/// The forward on host copies (heads wider than the kernels take).
fn host_forward(
    q: &CudaStorage,
    k: &CudaStorage,
    v: &CudaStorage,
    sh: AttentionShape,
    scale: f32,
) -> Result<(CudaStorage, CudaStorage)> {
    let (o, lse) = CpuStorage::attention_forward(
        &q.to_cpu_storage()?,
        &k.to_cpu_storage()?,
        &v.to_cpu_storage()?,
        sh,
        scale,
    )?;
    let dev = q.device();
    Ok((dev.storage_from_cpu(o)?, dev.storage_from_cpu(lse)?))
}

/// The backward on host copies (heads wider than the kernels take).
fn host_backward(
    saved: AttentionSaved<'_, CudaStorage>,
    d_o: &CudaStorage,
    sh: AttentionShape,
    scale: f32,
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let host = [saved.q, saved.k, saved.v, saved.o, saved.lse].map(|s| s.to_cpu_storage());
    let [q, k, v, o, lse] = host;
    let (q, k, v, o, lse) = (q?, k?, v?, o?, lse?);
    let saved_cpu = AttentionSaved {
        q: &q,
        k: &k,
        v: &v,
        o: &o,
        lse: &lse,
    };
    let (dq, dk, dv) =
        CpuStorage::attention_backward(saved_cpu, &d_o.to_cpu_storage()?, sh, scale)?;
    let dev = d_o.device();
    Ok((
        dev.storage_from_cpu(dq)?,
        dev.storage_from_cpu(dk)?,
        dev.storage_from_cpu(dv)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(d: usize, dv: usize) -> AttentionShape {
        AttentionShape {
            heads: 2,
            l: 100,
            s: 70,
            d,
            dv,
        }
    }

    #[test]
    fn paths_follow_dtype_and_widths() {
        let bf = DType::BF16;
        assert_eq!(
            Path::of(bf, &shape(128, 128)),
            Some(Path::Mma { width: 128 })
        );
        assert_eq!(Path::of(bf, &shape(64, 64)), Some(Path::Mma { width: 64 }));
        assert_eq!(
            Path::of(DType::F32, &shape(128, 128)),
            Some(Path::Scalar {
                bf16: false,
                tile: 32
            })
        );
        assert_eq!(
            Path::of(bf, &shape(64, 32)),
            Some(Path::Scalar {
                bf16: true,
                tile: 32
            })
        );
        assert_eq!(
            Path::of(bf, &shape(48, 48)),
            Some(Path::Scalar {
                bf16: true,
                tile: 32
            })
        );
        assert_eq!(
            Path::of(bf, &shape(256, 200)),
            Some(Path::Scalar {
                bf16: true,
                tile: 16
            })
        );
        assert_eq!(Path::of(bf, &shape(257, 64)), None);
        assert_eq!(
            Path::of(
                bf,
                &AttentionShape {
                    s: 0,
                    ..shape(64, 64)
                }
            ),
            None
        );
    }

    #[test]
    fn shared_memory_fits_its_limit_and_the_device() {
        // H100/H200 allow 227 KiB per block; stay well below (two CTAs an SM).
        for w in 1..=MAX_WIDTH {
            for dv in [1, w, MAX_WIDTH] {
                for dtype in [DType::F32, DType::BF16] {
                    let sh = AttentionShape {
                        heads: 1,
                        l: 1,
                        s: 1,
                        d: w,
                        dv,
                    };
                    let p = Path::of(dtype, &sh).expect("a GPU path");
                    for pass in [Pass::Forward, Pass::Dq, Pass::Dkdv] {
                        let (smem, limit) = (p.smem(pass, w, dv), p.smem_limit(pass));
                        assert!(
                            smem <= limit && limit <= 110 * 1024,
                            "{p:?} {pass:?} d {w} dv {dv}: {smem} / {limit}"
                        );
                    }
                }
            }
        }
        // The tensor-core numbers the kernels' comments give at D = 128.
        let p = Path::Mma { width: 128 };
        assert_eq!(p.smem(Pass::Forward, 0, 0), (2 * 32 + 128) * 136 * 2);
        assert_eq!(p.rows(Pass::Forward), 128);
        assert_eq!(
            Path::Mma { width: 64 }.smem(Pass::Forward, 0, 0),
            2 * 64 * 72 * 2
        );
        assert_eq!(p.smem(Pass::Dq, 0, 0), (128 + 4 * 32) * 136 * 2);
        assert_eq!(
            p.smem(Pass::Dkdv, 0, 0),
            (128 + 4 * 32) * 136 * 2 + 4 * 32 * 4
        );
    }

    #[test]
    fn kernel_names_exist_in_the_source() {
        let src = ATTENTION.body;
        for pass in [Pass::Forward, Pass::Dq, Pass::Dkdv] {
            let prefix = ["attn_fwd_", "attn_dq_", "attn_dkdv_"][pass as usize];
            for (w, mt) in MMA_WIDTHS.into_iter().zip(FWD_M_TILES) {
                let name = Path::Mma { width: w }.kernel(pass);
                assert_eq!(name, format!("{prefix}mma_d{w}"));
                assert!(src.contains(&format!("ATTN_MMA_KERNELS({w}, {mt})")));
            }
            for (bf16, ty, inst) in [(false, "f32", "InF32"), (true, "bf16", "InBF16")] {
                for tile in [32, 16] {
                    let name = Path::Scalar { bf16, tile }.kernel(pass);
                    assert_eq!(name, format!("{prefix}{ty}_t{tile}"));
                    assert!(src.contains(&format!("ATTN_SCALAR_KERNELS({ty}, {inst}, {tile})")));
                }
            }
        }
        for (name, value) in [
            ("MMA_WARPS", (MMA_THREADS / 32) as usize),
            ("MMA_COLS", MMA_COLS),
            ("DQ_BN", DQ_BN),
            ("DKDV_BN", DKDV_BN),
            ("SC_THREADS", SC_THREADS as usize),
        ] {
            assert!(
                src.contains(&format!("#define {name} {value}\n")),
                "{name} is not {value} in attention.cu"
            );
        }
    }
}
