//! The traits every backend implements. The CPU backend (`cpu/`) is the
//! reference; a CUDA or ROCm backend adds a type implementing these traits and
//! one arm per method in `storage/`, and nothing above the storage changes.
//!
//! - [`BackendStorage`] / [`BackendDevice`]: the tensor ops.
//! - [`LinearBackend`]: quantize, GEMM and column sums, the primitives the
//!   one quantized linear ([`crate::qlinear`]) is written against.
//! - [`OptimBackend`]: the AdamW update, so moments stay on the device.
//!
//! Layouts passed in may be strided views (transposes, narrows, stride-0
//! broadcasts); every method returns a new contiguous buffer.

use crate::cpu::{CpuOperand, CpuStorage};
use crate::formats::ElemFormat;
use crate::op::{BinaryOp, ReduceOp, UnaryOp};
use crate::quant::{Fp8GroupConfig, MxConfig, Nvfp4Config, SrKey, BLOCK};
use crate::recipe::{elem_format, fp8_group_config, nvfp4_config, OperandSpec, Scaling};
use crate::{DType, Device, Error, Layout, Result, Shape};

/// A buffer of elements on one device.
pub trait BackendStorage: Sized + Send + Sync {
    /// The device type that allocates this storage (its pair in [`BackendDevice`]).
    type Device: BackendDevice<Storage = Self>;

    /// The device the buffer lives on.
    fn device(&self) -> &Self::Device;
    /// The element type of every element in the buffer.
    fn dtype(&self) -> DType;
    /// Size of the whole buffer in bytes (what a view of it keeps alive).
    fn buffer_bytes(&self) -> usize;
    /// Copies the buffer to host memory.
    fn to_cpu_storage(&self) -> Result<CpuStorage>;

    /// The elements of `layout`, packed row-major.
    fn copy_strided(&self, layout: &Layout) -> Result<Self>;
    /// Converts the elements; f32 to bf16 rounds to nearest even.
    fn to_dtype(&self, layout: &Layout, dtype: DType) -> Result<Self>;
    /// Applies `op` to each element of `layout`; the result keeps the input dtype.
    fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<Self>;
    /// x * mul + add.
    fn affine(&self, layout: &Layout, mul: f32, add: f32) -> Result<Self>;
    /// Both layouts have the same shape (broadcast already applied as strides).
    fn binary(
        &self,
        layout: &Layout,
        rhs: &Self,
        rhs_layout: &Layout,
        op: BinaryOp,
    ) -> Result<Self>;
    /// Reduces `axis`, keeping it with size 1.
    fn reduce(&self, layout: &Layout, op: ReduceOp, axis: usize) -> Result<Self>;
    /// Batched `[.., M, K] x [.., K, N]`; the batch dims are equal (stride 0
    /// where broadcast), the matrices may be transposed views.
    fn matmul(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout) -> Result<Self>;
    /// Concatenates along `axis`; shapes agree except on `axis`.
    fn concat(parts: &[(&Self, &Layout)], axis: usize) -> Result<Self>;
    /// Numerically stable softmax over each row of the last axis (max subtracted
    /// first, computed in f32); the result keeps the input dtype.
    fn softmax_last_dim(&self, layout: &Layout) -> Result<Self>;
    /// Normalizes each row of the last axis; returns `(y, rstd)` with rstd of
    /// shape `[.., 1]`. `rms` skips the mean subtraction (RMSNorm).
    fn norm_last_dim(&self, layout: &Layout, eps: f32, rms: bool) -> Result<(Self, Self)>;
    /// Rotates pairs (2i, 2i+1) of the last axis of x `[.., L, D]` by the
    /// angle whose cos and sin are the `[L, D/2]` tables.
    fn rope_interleaved(
        &self,
        layout: &Layout,
        cos: &Self,
        cos_layout: &Layout,
        sin: &Self,
        sin_layout: &Layout,
    ) -> Result<Self>;
}

/// A device that can hold storages.
pub trait BackendDevice: Sized + Clone + Send + Sync {
    /// The storage type this device allocates (its pair in [`BackendStorage`]).
    type Storage: BackendStorage<Device = Self>;

    /// Which device this is, as the backend-neutral [`Device`] tag.
    fn location(&self) -> Device;
    /// A packed buffer of `shape.elem_count()` zero elements of `dtype`.
    fn zeros(&self, shape: &Shape, dtype: DType) -> Result<Self::Storage>;
    /// Uploads host data.
    fn storage_from_cpu(&self, data: CpuStorage) -> Result<Self::Storage>;
    /// Uploads host data it does not own (a packed tensor moving here); a
    /// backend that copies from a slice anyway saves the host copy.
    fn storage_from_host(&self, data: &CpuStorage) -> Result<Self::Storage> {
        self.storage_from_cpu(data.clone())
    }
}

/// Which axis of a row-major `[rows, cols]` matrix a GEMM reduces over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Along {
    /// The last, contiguous axis: x and W in fprop, dy in dgrad.
    Cols,
    /// The first axis: W in dgrad, dy and x in wgrad.
    Rows,
}

/// An operand format in the quantizers' own terms (see [`Want::new`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Format {
    /// BF16 values (round to nearest even), no scale.
    Bf16,
    /// FP8 codes with one f32 scale (SPEC section 3).
    Tensorwise {
        /// The 8-bit element format (E4M3 or E5M2).
        elem: ElemFormat,
        /// Round the scale down to a power of two.
        pow2: bool,
    },
    /// MX blocks of 32 along the reduction axis (SPEC section 2).
    Mx(MxConfig),
    /// NVFP4 blocks of 16 along the reduction axis under a tensor scale
    /// (SPEC section 2b).
    Nvfp4(Nvfp4Config),
    /// E4M3 codes with an f32 scale per row or per 128-block along the
    /// reduction axis (SPEC section 3b).
    Fp8Group(Fp8GroupConfig),
}

impl Format {
    /// Whether the scales run along the reduction axis (MX, NVFP4 and FP8
    /// group scaling), so a copy along one axis cannot serve the other and
    /// is stored axis-last. BF16 and tensorwise copies do not depend on it.
    pub const fn follows_axis(&self) -> bool {
        matches!(self, Format::Mx(_) | Format::Nvfp4(_) | Format::Fp8Group(_))
    }
}

/// One copy of a matrix that a GEMM reads: its format along its reduction axis.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Want {
    /// How the copy is encoded.
    pub format: Format,
    /// The axis the GEMM reduces over, which MX blocks and scales run along.
    pub along: Along,
}

impl Want {
    /// The quantizer settings of `spec` along `along`; `sr` keys stochastic
    /// rounding where `spec.sr` asks for it (gradients only: `None` for x
    /// and W). A spec no quantizer implements (an MX block of 16, an E2M1
    /// tensorwise scale) is an error here, before any backend runs.
    pub fn new(spec: &OperandSpec, along: Along, sr: Option<SrKey>) -> Result<Want> {
        if spec.sr && sr.is_none() {
            return Err(Error::InvalidOption(
                "stochastic rounding applies to the gradient operands only".into(),
            ));
        }
        let elem = elem_format(spec.elem);
        let unsupported = || {
            Error::NotImplemented(format!(
                "no quantizer for {} elements with {:?} scaling",
                spec.elem, spec.scaling
            ))
        };
        if spec.sr && !matches!(spec.scaling, Scaling::Mx { .. } | Scaling::Nvfp4 { .. }) {
            return Err(Error::NotImplemented(format!(
                "stochastic rounding of {} with {:?} scaling",
                spec.elem, spec.scaling
            )));
        }
        let format = match (spec.scaling, elem) {
            (Scaling::None, None) if !spec.hadamard => Format::Bf16,
            (Scaling::Tensorwise { pow2 }, Some(elem)) if elem.bits() == 8 && !spec.hadamard => {
                Format::Tensorwise { elem, pow2 }
            }
            (Scaling::Mx { block, mode, tile }, Some(elem)) if block as usize == BLOCK => {
                Format::Mx(MxConfig {
                    elem,
                    scale_mode: mode,
                    tile2d: tile,
                    hadamard: spec.hadamard,
                    sr: if spec.sr { sr } else { None },
                })
            }
            (Scaling::Nvfp4 { .. }, _) => {
                let cfg = nvfp4_config(spec).ok_or_else(unsupported)?;
                Format::Nvfp4(Nvfp4Config {
                    sr: if spec.sr { sr } else { None },
                    ..cfg
                })
            }
            (Scaling::Rowwise { .. } | Scaling::Block { .. }, _) => {
                Format::Fp8Group(fp8_group_config(spec).ok_or_else(unsupported)?)
            }
            _ => return Err(unsupported()),
        };
        Ok(Want { format, along })
    }
}

/// What [`LinearBackend::quantize`] is asked for: the copies of one packed
/// row-major `[rows, cols]` matrix (f32 or BF16) that GEMMs about to run
/// read (`now`), and the compact copy saved for the backward (`keep`).
/// `label` names the tensor in a non-finite-amax error (SPEC section 3).
#[derive(Clone, Copy)]
pub struct Request<'r> {
    /// Rows of the `[rows, cols]` matrix.
    pub rows: usize,
    /// Columns of the `[rows, cols]` matrix (the contiguous axis).
    pub cols: usize,
    /// The copies the GEMMs about to run read, one operand each, in order.
    pub now: &'r [Want],
    /// The copy saved for the backward pass, if any.
    pub keep: Option<Want>,
    /// Also the f32 sums of the matrix's columns (dy's, the bias gradient),
    /// taken on a pass over the input where a kernel can, else as
    /// [`LinearBackend::column_sums`] takes them.
    pub column_sums: bool,
    /// Builds the tensor's name for error messages; called only on error.
    pub label: &'r dyn Fn() -> String,
}

/// The answer to a [`Request`]: one operand per entry of `now`, in order,
/// the kept copy and the column sums.
pub struct Quantized<'a, B: LinearBackend> {
    /// One operand per [`Request::now`] entry, in the same order.
    pub now: Vec<B::Operand<'a>>,
    /// The copy asked for by [`Request::keep`]; owns its data so it can outlive
    /// the input until the backward pass.
    pub keep: Option<B::Operand<'static>>,
    /// `[cols]` f32, when [`Request::column_sums`] asked for them.
    pub column_sums: Option<B>,
}

/// A storage packed from element 0: its own buffer when the view already is,
/// else a packed copy.
pub enum Packed<'a, B> {
    /// The input storage itself: it was already packed from element 0.
    Borrowed(&'a B),
    /// A packed copy of the view.
    Owned(B),
}

impl<B: BackendStorage> Packed<'_, B> {
    /// The elements of `layout` of `s`, packed row-major.
    pub fn of<'a>(s: &'a B, layout: &Layout) -> Result<Packed<'a, B>> {
        let n = layout.shape().elem_count();
        let len = s.buffer_bytes() / s.dtype().size_in_bytes();
        if layout.contiguous_range() == Some(0..n) && len == n {
            Ok(Packed::Borrowed(s))
        } else {
            Ok(Packed::Owned(s.copy_strided(layout)?))
        }
    }
}

impl<B> std::ops::Deref for Packed<'_, B> {
    type Target = B;
    fn deref(&self) -> &B {
        match self {
            Packed::Borrowed(s) => s,
            Packed::Owned(s) => s,
        }
    }
}

/// Sizes of one fused attention: `heads` independent problems (batch times
/// heads), each q `[l, d]`, k `[s, d]`, v `[s, dv]`, packed row-major.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Independent problems: batch times heads.
    pub heads: usize,
    /// Query rows of each problem.
    pub l: usize,
    /// Key and value rows of each problem.
    pub s: usize,
    /// Width of q and k.
    pub d: usize,
    /// Width of v and o.
    pub dv: usize,
}

/// What the attention backward reads: the forward's inputs and outputs, packed.
pub struct AttentionSaved<'a, B> {
    /// q `[heads, l, d]`.
    pub q: &'a B,
    /// k `[heads, s, d]`.
    pub k: &'a B,
    /// v `[heads, s, dv]`.
    pub v: &'a B,
    /// o `[heads, l, dv]`, in q's dtype.
    pub o: &'a B,
    /// The f32 log-sum-exp of each row of the scaled scores, `[heads, l]`.
    pub lse: &'a B,
}

/// Fused attention, o = softmax(scale q k^T) v, flash-attention style:
/// tiles with an online softmax and f32 accumulation, so the `[l, s]` scores
/// never exist in memory. q, k and v share one dtype (f32 or BF16).
pub trait AttentionBackend: BackendStorage {
    /// o `[heads, l, dv]` in the inputs' dtype, and the f32 log-sum-exp
    /// `[heads, l]` of the scaled scores, the one statistic the backward needs.
    fn attention_forward(
        q: &Self,
        k: &Self,
        v: &Self,
        shape: AttentionShape,
        scale: f32,
    ) -> Result<(Self, Self)>;

    /// dq, dk and dv in the inputs' dtype from dO (`[heads, l, dv]`, the
    /// inputs' dtype): the scores are recomputed from q, k and the
    /// log-sum-exp, with D = rowsum(dO * O).
    fn attention_backward(
        saved: AttentionSaved<'_, Self>,
        d_o: &Self,
        shape: AttentionShape,
        scale: f32,
    ) -> Result<(Self, Self, Self)>;
}

/// The primitives the quantized linear ([`crate::qlinear`]) runs on. A
/// backend implements these and knows nothing of recipes: the linear turns
/// a recipe's [`LinearSpec`](crate::recipe::LinearSpec) into [`Want`]s.
pub trait LinearBackend: BackendStorage + 'static {
    /// One copy of a matrix, ready for a GEMM or kept for the backward; it
    /// may read the quantized storage in place for `'a`.
    type Operand<'a>: Send + Sync
    where
        Self: 'a;

    /// Serves `req` from the matrix in `self`, sharing passes over the
    /// input between the copies where the formats allow.
    fn quantize<'a>(&'a self, req: &Request) -> Result<Quantized<'a, Self>>;

    /// `[rows of a, rows of b]` = a · b^T summed over the reduction axis,
    /// times both scales, plus `bias` (f32, one per column), as `out` (f32
    /// or BF16). Kept operands are dequantized here as the GEMM needs them.
    fn gemm(
        device: &Self::Device,
        a: &Self::Operand<'_>,
        b: &Self::Operand<'_>,
        bias: Option<&Self>,
        out: DType,
    ) -> Result<Self>;

    /// f32 sums of the columns of the packed `[rows, cols]` matrix in `self`.
    fn column_sums(&self, rows: usize, cols: usize) -> Result<Self>;

    /// Bytes an operand holds, counted as SPEC section 4 does (no padding).
    fn operand_bytes(op: &Self::Operand<'_>) -> usize;

    /// Elements of the matrix an operand stands for, before padding.
    fn operand_elements(op: &Self::Operand<'_>) -> usize;

    /// A kept operand on the host, in the CPU backend's form, so two
    /// backends can be compared byte for byte (waits for the device).
    fn operand_to_cpu(device: &Self::Device, op: &Self::Operand<'_>) -> Result<CpuOperand>;
}

/// AdamW's per-step scalars (struct AdamWScalars in `adamw.cu`), computed
/// once on the host so every backend applies the same f32 values.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWScalars {
    /// `1 - lr * weight_decay`: multiplies the weight first (decoupled decay).
    pub decay: f32,
    /// beta1, the first-moment decay.
    pub b1: f32,
    /// `1 - beta1`, computed once in f32.
    pub one_minus_b1: f32,
    /// beta2, the second-moment decay.
    pub b2: f32,
    /// `1 - beta2`, computed once in f32.
    pub one_minus_b2: f32,
    /// `lr / (1 - beta1^t)` for step t, computed in f64 and rounded to f32.
    pub step_size: f32,
    /// `sqrt(1 - beta2^t)` for step t, computed in f64 and rounded to f32.
    pub bias2_sqrt: f32,
    /// Added to the bias-corrected `sqrt(v)` in the denominator.
    pub eps: f32,
}

/// One AdamW step of the parameter held by a storage.
pub struct AdamWStep<'a, B> {
    /// The parameter's view of the storage.
    pub layout: &'a Layout,
    /// The gradient, of the parameter's shape (f32 or BF16).
    pub grad: &'a B,
    /// The gradient's view of `grad`.
    pub grad_layout: &'a Layout,
    /// The f32 moments, packed, one per element; updated in place.
    pub m: &'a mut B,
    /// The second moment (f32, packed, one per element); updated in place.
    pub v: &'a mut B,
    /// This step's scalars, the same for every parameter at the same step count.
    pub scalars: &'a AdamWScalars,
}

/// The optimizer's update, so a parameter on a device is updated there.
pub trait OptimBackend: BackendStorage {
    /// Returns the new parameter, of `self`'s dtype.
    fn adamw_step(&self, step: AdamWStep<'_, Self>) -> Result<Self>;
}

/// Allocator counts of a device, for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Allocations the driver made (cache misses).
    pub device_allocs: u64,
    /// Allocations served from the cache.
    pub reuses: u64,
    /// The most bytes in use at once.
    pub peak_bytes: u64,
}

/// What an accelerator says about itself (the CPU has nothing to say).
pub trait DeviceStatus: BackendDevice {
    /// Waits for the work queued so far.
    fn synchronize(&self) -> Result<()>;
    /// Free and total bytes of the device's memory.
    fn memory_info(&self) -> Result<(u64, u64)>;
    /// The caching allocator's counts since the device was opened.
    fn memory_stats(&self) -> MemoryStats;
}

/// Multi-tensor optimizer primitives (issue 14): one pass over many
/// parameters or gradients of one device, so an optimizer step and the
/// gradient norm cost a few launches instead of a few per parameter.
/// Every entry must be on the same device.
pub trait MultiOptimBackend: OptimBackend {
    /// AdamW steps of many parameters, each `(w, step)` as
    /// [`OptimBackend::adamw_step`] takes it (every `m` and `v` a buffer of
    /// its own); the new parameters in order, each bit-identical to what
    /// `w.adamw_step(step)` returns, with the moments updated the same way.
    fn adamw_multi<'a>(steps: Vec<(&'a Self, AdamWStep<'a, Self>)>) -> Result<Vec<Self>>;

    /// The sum of the squares of every element of every gradient (f32 or
    /// BF16 views), as an f64; see each backend for its order of addition.
    fn sum_squares(grads: &[(&Self, &Layout)]) -> Result<f64>;

    /// Each gradient times `mul`, packed, in its dtype: the bits of
    /// [`BackendStorage::affine`] with `mul` and an `add` of 0.
    fn scale_all(grads: &[(&Self, &Layout)], mul: f32) -> Result<Vec<Self>>;
}

/// Sizes of a fused modulation op (`crate::ops::fused`): x `[batch,
/// tokens, hidden]` and the per-batch vectors (shift, scale, gate)
/// `[batch, hidden]`, every operand packed, all in one dtype (f32 or BF16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModShape {
    /// Independent sequences, each with its own vectors.
    pub batch: usize,
    /// Rows of each sequence.
    pub tokens: usize,
    /// Row width, the normalized axis.
    pub hidden: usize,
}

/// What [`FusedBackend::modulated_norm_backward`] reads from the forward.
pub struct ModNormSaved<'a, B> {
    /// The forward's input x `[batch, tokens, hidden]`.
    pub x: &'a B,
    /// scale `[batch, hidden]`.
    pub scale: &'a B,
    /// fl32 of each row's f64 mean, f32 `[batch * tokens]`.
    pub mean: &'a B,
    /// fl32(1 / sqrt(var + eps)) of each row, f32 `[batch * tokens]`.
    pub rstd: &'a B,
}

/// The fused element-wise ops of a Flux block, forward and backward: each
/// reads its inputs once where the unfused composition makes four to ten
/// passes. Math in f32 (statistics and sums in f64), one rounding to the
/// output dtype. LN below is LayerNorm without affine weights over the
/// last axis: y = (x - fl32(mean)) * rstd, as
/// [`BackendStorage::norm_last_dim`] computes it.
pub trait FusedBackend: BackendStorage {
    /// out = LN(x) * (1 + scale) + shift, each row of x with its batch's
    /// vectors; returns out (x's dtype) and the f32 mean and rstd of each
    /// row, which the backward reads.
    fn modulated_norm(
        x: &Self,
        shift: &Self,
        scale: &Self,
        shape: ModShape,
        eps: f32,
    ) -> Result<(Self, Self, Self)>;

    /// (dx, dshift, dscale) from the gradient g of out (x's dtype): with
    /// y = LN(x) recomputed in f32 and dy = g (1 + scale),
    /// dx = (dy - mean(dy) - y mean(dy y)) rstd, dshift = the sum of g over
    /// the tokens of each batch, dscale = the sum of g y.
    fn modulated_norm_backward(
        saved: ModNormSaved<'_, Self>,
        g: &Self,
        shape: ModShape,
    ) -> Result<(Self, Self, Self)>;

    /// out = x + gate * y for x and y `[batch, tokens, hidden]`, the gate of
    /// each row's batch.
    fn gated_add(x: &Self, gate: &Self, y: &Self, shape: ModShape) -> Result<Self>;

    /// dgate `[batch, hidden]` of [`FusedBackend::gated_add`]: the sum of
    /// g * y over the tokens of each batch, in g's dtype.
    fn gated_add_dgate(g: &Self, y: &Self, shape: ModShape) -> Result<Self>;

    /// Flux's QK norm and RoPE in one pass over x `[rows, d]` (d even; row
    /// r at position r % seq of the `[seq, d / 2]` cos and sin tables, in
    /// x's dtype) with an f32 `[d]` weight: rstd = fl32(1 / sqrt(eps +
    /// mean(x^2))) in f64, z = (x rstd) weight in f32 rounded to x's dtype,
    /// and out = z with pairs (2i, 2i + 1) rotated as
    /// [`BackendStorage::rope_interleaved`] does. Returns out (x's dtype)
    /// and the f32 rstd of each row.
    fn rms_norm_rope(
        x: &Self,
        weight: &Self,
        tables: [&Self; 2],
        shape: RopeShape,
        eps: f32,
    ) -> Result<(Self, Self)>;

    /// (dx in x's dtype, dweight in f32) from the gradient g of out: g'
    /// = g rotated back (sin negated) and rounded to x's dtype, y = x rstd,
    /// dy = g' weight, dx = (dy - y mean(dy y)) rstd, dweight = the sum of
    /// g' y over the rows.
    fn rms_norm_rope_backward(
        saved: RmsRopeSaved<'_, Self>,
        g: &Self,
        shape: RopeShape,
    ) -> Result<(Self, Self)>;
}

/// Sizes of [`FusedBackend::rms_norm_rope`]: `rows` rows of `d` elements,
/// row r at position r % `seq` of the tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeShape {
    /// Rows of x (batch times heads times positions).
    pub rows: usize,
    /// Row width (the head dimension), even.
    pub d: usize,
    /// Positions of the tables.
    pub seq: usize,
}

/// What [`FusedBackend::rms_norm_rope_backward`] reads from the forward.
pub struct RmsRopeSaved<'a, B> {
    /// The forward's x `[rows, d]`.
    pub x: &'a B,
    /// The f32 weight `[d]`.
    pub weight: &'a B,
    /// The cos and sin tables `[seq, d / 2]`, in x's dtype.
    pub tables: [&'a B; 2],
    /// The f32 rstd of each row.
    pub rstd: &'a B,
}

/// AdamW with the clip factor fused in: [`MultiOptimBackend::adamw_multi`]
/// with every gradient element first multiplied by `grad_mul` as the update
/// reads it (`g * grad_mul + 0`, rounded to the gradient's dtype: the bits
/// of [`MultiOptimBackend::scale_all`]), so the result is bit-identical to
/// `scale_all` followed by `adamw_multi`, without writing the scaled
/// gradients. The gradients are not changed.
pub trait ScaledAdamWBackend: MultiOptimBackend {
    /// The new parameters in order, the moments updated in place.
    fn adamw_multi_scaled<'a>(
        steps: Vec<(&'a Self, AdamWStep<'a, Self>)>,
        grad_mul: f32,
    ) -> Result<Vec<Self>>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::{Recipe, RecipeKind};

    fn key() -> Option<SrKey> {
        Some(SrKey {
            seed: 1,
            step: 2,
            tensor_id: 3,
        })
    }

    #[test]
    fn the_new_scalings_map_to_their_quantizers() {
        let nv = Recipe::new(RecipeKind::Nvfp4).spec();
        let w = Want::new(&nv.fprop.b, Along::Cols, None).unwrap();
        assert_eq!(
            w.format,
            Format::Nvfp4(Nvfp4Config {
                tile2d: true,
                hadamard: false,
                sr: None
            })
        );
        // The gradients take the call's SR key, as MX's do.
        let dy = Want::new(&nv.wgrad.a, Along::Rows, key()).unwrap();
        assert_eq!(
            dy.format,
            Format::Nvfp4(Nvfp4Config {
                tile2d: false,
                hadamard: true,
                sr: key()
            })
        );
        assert!(Want::new(&nv.dgrad.a, Along::Cols, None).is_err());
        let rows = Recipe::new(RecipeKind::Fp8Rowwise).spec();
        let w = Want::new(&rows.dgrad.b, Along::Rows, None).unwrap();
        assert_eq!(w.format, Format::Fp8Group(Fp8GroupConfig::rowwise()));
        let blocks = Recipe::new(RecipeKind::Fp8Block).spec();
        let w = Want::new(&blocks.fprop.b, Along::Cols, None).unwrap();
        assert_eq!(w.format, Format::Fp8Group(Fp8GroupConfig::block128_tiles()));
        for f in [
            Format::Nvfp4(Nvfp4Config::default()),
            Format::Fp8Group(Fp8GroupConfig::rowwise()),
            Format::Fp8Group(Fp8GroupConfig::block128()),
            Format::Mx(MxConfig::mxfp4()),
            Format::Bf16,
        ] {
            assert_eq!(f.follows_axis(), !matches!(f, Format::Bf16), "{f:?}");
        }
    }

    #[test]
    fn specs_no_quantizer_implements_are_refused() {
        let mut op = Recipe::new(RecipeKind::Fp8Block).spec().fprop.a;
        op.sr = true;
        let e = Want::new(&op, Along::Cols, key()).unwrap_err().to_string();
        assert!(e.starts_with("not implemented: stochastic rounding"), "{e}");
        op.sr = false;
        op.elem = crate::recipe::Elem::E5M2;
        let e = Want::new(&op, Along::Cols, None).unwrap_err().to_string();
        assert!(e.contains("no quantizer for e5m2 elements"), "{e}");
        let mut nv = Recipe::new(RecipeKind::Nvfp4).spec().fprop.a;
        nv.scaling = Scaling::Nvfp4 {
            block: 32,
            tile: false,
        };
        assert!(Want::new(&nv, Along::Cols, None).is_err());
    }
}
