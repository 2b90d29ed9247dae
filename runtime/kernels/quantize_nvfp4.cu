// NVFP4 two-level block quantization (SPEC section 2b; CPU reference:
// runtime/src/quant/nvfp4.rs, quantize_view and Nvfp4Tensor::dequantize_rows)
// of a row-major [rows, cols] f32 or BF16 matrix along its columns and/or its
// rows from one read of each 64x64 tile, as mx_tile.cu does for MX.
//
// Each direction is the CPU's axis-last view: along the columns, `rows` view
// rows of `cols` values (quantize_nvfp4_rows(x, rows, cols, ..)); along the
// rows, `cols` view rows of `rows` values (quantize_nvfp4(x, [rows, cols], 0,
// ..)). A view row of `len` values is zero-padded to padded_len = 16 * nb;
// block b = view_row * nb + kb. Each direction writes, as asked (null
// pointer = not wanted):
//   codes  [vrows, padded_len / 2]  E2M1 packed two per byte, element 2i in the low nibble
//   scales [vrows, nb]              E4M3FN bytes (a 16x16 tile's byte repeated for its blocks)
//   deq    [vrows, padded_len]      BF16 decode(code) * s_q: the GEMM operand without
//                                   the tensor scale t, which the GEMM applies after
//                                   (exact: a 2-bit by a 4-bit significand)
//   state                           an FP8 state (quantize_fp8.cu), zeroed by the host:
//                                   word NV_AMAX takes the tensor amax A, word NV_T
//                                   the tensor scale t (where the GEMM's scale_inv
//                                   pointer looks)
//
// Two passes: the amax pass reduces each direction's A (the max of its
// block amaxes, after its Hadamard-16 when asked) with one atomicMax per CTA,
// and nvfp4_tile's PHASE_QUANTIZE, which needs t and so the whole tensor's A,
// encodes. A direction without the Hadamard has the plain amax of x; when
// neither has it, both states take the one value. The amax pass is
// nvfp4_amax, straight from global memory, unless the direction along the
// columns has the Hadamard: then it is nvfp4_tile's PHASE_AMAX over the
// quantize pass's grid.
//
// Steps (each one IEEE f32 operation, no FMA: the host compiles with
// --fmad=false --prec-div=true):
//   a = block amax (after the Hadamard-16 of each group of 16 when asked);
//       with tiles, the max over the 16x16 tile's 16 blocks
//   A = max a; t = fl32(A / 2688), or 1 where that is 0
//   s = clamp(fl32(fl32(a / 6) / t), 2^-6, 448) -> E4M3FN byte, s_q its value
//   r = fl32(fl32(1 / t) / s_q); code = E2M1(clamp(fl32(v * r), -6, 6)), RNE or SR
//
// A CTA stages a 64x64 slab (four 16x16 tiles each way) in shared memory
// (load_slab of common.cuh).
// Along the columns thread i owns the block of slab row i % 64, block column
// i / 64; along the rows, that of slab column i % 64, block row i / 64. A
// warp so reads 32 rows (columns) of the odd-strided slab without bank
// conflicts, and the 16 threads of a 16x16 tile are consecutive. The outputs
// go through a shared-memory stage (NvStage) so that their stores coalesce.

#define NV_BLOCK 16
#define NV_SLAB 64
#define NV_STRIDE (NV_SLAB + 1)
#define NV_THREADS (NV_SLAB * NV_SLAB / NV_BLOCK)
// Words of the state: the amax slot of quantize_fp8.cu, and its scale_inv slot for t.
#define NV_AMAX 0
#define NV_T 8

// Launch phase: the values of Phase in runtime/src/cuda/quantize.rs.
#define NV_PHASE_QUANTIZE 0
#define NV_PHASE_AMAX 1

// One direction's options and outputs (struct NvDir in src/cuda/nvfp4.rs);
// a null state means the direction is not wanted.
struct NvDir {
    u8* codes;
    u8* scales;
    u16* deq;
    u32* state;
    int hadamard;
    int sr;
    MxSrKey key;
};

// t from the tensor amax bits (nvfp4.rs, tensor_scale).
__device__ __forceinline__ float nv_tensor_scale(const u32* state) {
    const float t = u2f(state[NV_AMAX]) / 2688.0f;
    return t == 0.0f ? 1.0f : t;
}

// Rust's f32::clamp: a NaN stays NaN (fminf / fmaxf would drop it).
__device__ __forceinline__ float clamp_keep_nan(float v, float lo, float hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

// The E4M3FN scale byte of a block or tile amax a (nvfp4.rs, block_scale_byte).
__device__ __forceinline__ u32 nv_scale_byte(float a, float t) {
    const float s = a / 6.0f / t;
    return encode_rne<E4M3FN>(clamp_keep_nan(s, 0.015625f, 448.0f));
}

// decode(c) * s_q of E2M1 code c as f32 bits, exact in BF16 (a 2-bit by a
// 4-bit significand); a NaN s_q gives NaN.
__device__ __forceinline__ u32 nv_deq_bits(u32 c, float sq) { return f2u(decode<E2M1>(c) * sq); }

// Eight BF16 values decode(code) * s_q from one word of codes (half a block):
// the exact products' top halves.
__device__ __forceinline__ Vec16 nv_deq_half(u32 w, float sq) {
    Vec16 o;
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
        const u32 lo = nv_deq_bits(w >> (4 * i), sq);
        const u32 hi = nv_deq_bits(w >> (4 * (i + 1)), sq);
        o.w[i / 2] = (lo >> 16) | (hi & 0xFFFF0000u);
    }
    return o;
}

// A slab's outputs of one direction, staged in shared memory so that the
// stores to global memory are coalesced: a thread's own block is 8 bytes of
// codes, 1 scale byte and 32 bytes of BF16 at a view-row stride, so storing
// it directly would cost one L2 request per 1 to 16 bytes. Slab row i (a view
// row) holds the slab's NV_SPR blocks of that row.
#define NV_SPR (NV_SLAB / NV_BLOCK)
#define NV_CODE_STRIDE (2 * NV_SPR + 1)     // words per staged row of codes (odd: no bank conflicts)
#define NV_DEQ_STRIDE (2 * NV_SPR + 1)      // 16-byte vectors per staged row of BF16
struct NvStage {
    Vec16 deq[NV_SLAB * NV_DEQ_STRIDE];
    u32 codes[NV_SLAB * NV_CODE_STRIDE];
    u8 scales[NV_SLAB * NV_SPR];
};

// Writes the staged outputs of view rows vrow0 .. vrow0 + 63 (those below
// vrows), blocks kb0 .. kb0 + NV_SPR - 1 (those below nb), of direction d:
// consecutive threads write consecutive bytes of a view row.
__device__ __forceinline__ void nv_store_stage(const NvDir& d, const NvStage& st, u64 vrow0, u32 vrows, u32 kb0,
                                               u32 nb) {
    const u32 nrows = vrows - vrow0 < NV_SLAB ? (u32)(vrows - vrow0) : NV_SLAB;
    const u32 nblk = nb - kb0 < NV_SPR ? nb - kb0 : NV_SPR;
    // One (row, block) of codes and scales per thread: NV_THREADS = 64 rows x NV_SPR.
    const u32 r = threadIdx.x / NV_SPR, j = threadIdx.x % NV_SPR;
    if (r < nrows && j < nblk) {
        const u64 b = (vrow0 + r) * nb + kb0 + j;
        d.scales[b] = st.scales[threadIdx.x];
        if (d.codes) {
            const u32* c = st.codes + r * NV_CODE_STRIDE + 2 * j;
            *(u64*)(d.codes + b * (NV_BLOCK / 2)) = (u64)c[0] | ((u64)c[1] << 32);
        }
    }
    if (!d.deq) return;
    // Half blocks (8 BF16, 16 bytes) of the BF16 operand.
    for (u32 h = threadIdx.x; h < NV_SLAB * 2 * NV_SPR; h += NV_THREADS) {
        const u32 hr = h / (2 * NV_SPR), hj = h % (2 * NV_SPR);
        if (hr >= nrows || hj / 2 >= nblk) continue;
        const u64 off = (vrow0 + hr) * ((u64)nb * NV_BLOCK) + (u64)kb0 * NV_BLOCK + hj * (NV_BLOCK / 2);
        *(Vec16*)(d.deq + off) = st.deq[hr * NV_DEQ_STRIDE + hj];
    }
}

// The packed codes of block b at r = fl32(fl32(1 / t) / s_q) (nvfp4.rs,
// encode_blocks_with), RNE or stochastically with element i of the padded
// layout taking word i % 4 of philox([i / 4, step, tensor_id], seed).
__device__ __forceinline__ void nv_encode(const float* v, float r, const NvDir& d, u64 b, u32* w) {
    if ((f2u(r) & 0x7F800000u) == 0x7F800000u) {
        // r = +Inf (A below 2688 * 2^-128): v * r is +-Inf, which encodes as
        // +-6 (stochastically too: its fraction is 0), or NaN (v = 0), which
        // encodes as +0.
        u32 c[NV_BLOCK];
#pragma unroll
        for (int i = 0; i < NV_BLOCK; ++i) c[i] = encode_rne<E2M1>(clamp_keep_nan(v[i] * r, -6.0f, 6.0f));
        pack_codes<E2M1, NV_BLOCK>(c, w);
        return;
    }
    // r finite and every x finite (A passed), so every product is finite.
    if (d.sr) {
        // Packed as pack_codes packs them, group by group (fewer live registers).
        w[0] = w[1] = 0u;
#pragma unroll
        for (int g = 0; g < NV_BLOCK / 4; ++g) {
            u32 rw[4];
            sr_words(d.key, b * (NV_BLOCK / 4) + (u64)g, rw);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int i = 4 * g + q;
                w[i / 8] |= encode_sr<E2M1>(v[i] * r, rw[q]) << (4 * (i % 8));
            }
        }
        return;
    }
    // The fast encoder saturates at 6 and gives encode_rne's bits.
    float q[NV_BLOCK];
#pragma unroll
    for (int i = 0; i < NV_BLOCK; ++i) q[i] = v[i] * r;
    encode_pack_finite<E2M1, NV_BLOCK>(q, w);
}

template <class In>
__device__ __forceinline__ void nvfp4_tile(const void* __restrict__ x, u32 rows, u32 cols, const NvDir& cd,
                                           const NvDir& rd, int tile2d, int phase) {
    __shared__ float slab[NV_SLAB * NV_STRIDE];
    __shared__ u32 block_amax[2][NV_THREADS];
    __shared__ u32 cta_amax[2];
    __shared__ float tensor_scale[2][2];  // per direction: t and fl32(1 / t)
    __shared__ NvStage stage;
    const u32 row0 = blockIdx.y * NV_SLAB;
    const u32 col0 = blockIdx.x * NV_SLAB;
    if (threadIdx.x < 2) {
        cta_amax[threadIdx.x] = 0u;
        const u32* state = threadIdx.x == 0 ? cd.state : rd.state;
        if (phase == NV_PHASE_QUANTIZE && state) {
            const float t = nv_tensor_scale(state);
            tensor_scale[threadIdx.x][0] = t;
            tensor_scale[threadIdx.x][1] = 1.0f / t;
        }
    }
    load_slab<In, NV_SLAB, NV_SLAB, NV_STRIDE>(x, rows, cols, row0, col0, slab);
    __syncthreads();
    const u32 lane = threadIdx.x % NV_SLAB;  // slab row (along cols) or column (along rows)
    const u32 k = threadIdx.x / NV_SLAB;     // block column or block row in the slab
    // Neither direction rotated: both amaxes are that of x, reduced once.
    const bool same_amax = cd.state && rd.state && !cd.hadamard && !rd.hadamard;
    for (int dir = 0; dir < 2; ++dir) {
        // A copy, field by field: a reference chosen at run time would put
        // both parameter structs in local memory.
        const NvDir d = dir == 0 ? cd : rd;
        if (!d.state || (phase == NV_PHASE_AMAX && dir == 1 && same_amax)) continue;
        // The block's 16 values: along slab row `lane` or down slab column
        // `lane` (one address step per value, whichever the direction).
        const u32 at = dir == 0 ? lane * NV_STRIDE + k * NV_BLOCK : k * NV_BLOCK * NV_STRIDE + lane;
        const u32 step = dir == 0 ? 1u : NV_STRIDE;
        float v[NV_BLOCK];
#pragma unroll
        for (int i = 0; i < NV_BLOCK; ++i) v[i] = slab[at + i * step];
        if (d.hadamard) hadamard16(v);
        u32 a = amax_bits<NV_BLOCK>(v);
        if (phase == NV_PHASE_AMAX || tile2d) block_amax[dir][threadIdx.x] = a;
        if (phase == NV_PHASE_AMAX) continue;
        if (tile2d) {
            // The tile's 16 blocks are threads 16j .. 16j + 15 (zero past the matrix).
            __syncthreads();
            const u32* tb = block_amax[dir] + (threadIdx.x & ~(u32)(NV_BLOCK - 1));
#pragma unroll
            for (int i = 0; i < NV_BLOCK; ++i) a = tb[i] > a ? tb[i] : a;
        }
        // This block in the direction's view.
        const u32 vrows = dir == 0 ? rows : cols, len = dir == 0 ? cols : rows;
        const u64 vrow0 = dir == 0 ? row0 : col0;
        const u32 kb0 = (dir == 0 ? col0 : row0) / NV_BLOCK;
        const u32 nb = (len + NV_BLOCK - 1) / NV_BLOCK;
        if (vrow0 + lane < vrows && kb0 + k < nb) {
            const u64 b = (vrow0 + lane) * nb + kb0 + k;
            const float t = tensor_scale[dir][0];
            if (b == 0) d.state[NV_T] = f2u(t);
            const u32 byte = nv_scale_byte(u2f(a), t);
            const float sq = decode<E4M3FN>(byte);
            const float r = tensor_scale[dir][1] / sq;
            u32 w[2];
            nv_encode(v, r, d, b, w);
            stage.scales[lane * NV_SPR + k] = (u8)byte;
            stage.codes[lane * NV_CODE_STRIDE + 2 * k] = w[0];
            stage.codes[lane * NV_CODE_STRIDE + 2 * k + 1] = w[1];
            if (d.deq) {
                stage.deq[lane * NV_DEQ_STRIDE + 2 * k] = nv_deq_half(w[0], sq);
                stage.deq[lane * NV_DEQ_STRIDE + 2 * k + 1] = nv_deq_half(w[1], sq);
            }
        }
        __syncthreads();
        nv_store_stage(d, stage, vrow0, vrows, kb0, nb);
        // The next direction reuses the stage.
        __syncthreads();
    }
    if (phase == NV_PHASE_AMAX) {
        // The CTA's max per direction: 16 threads each, then one atomic each
        // (a direction skipped above reduces stale values, never used).
        __syncthreads();
        if (threadIdx.x < 2 * NV_BLOCK) {
            const u32* p = block_amax[threadIdx.x / NV_BLOCK] + threadIdx.x % NV_BLOCK;
            u32 m = 0u;
#pragma unroll
            for (int i = 0; i < NV_THREADS / NV_BLOCK; ++i) m = p[i * NV_BLOCK] > m ? p[i * NV_BLOCK] : m;
            atomicMax(&cta_amax[threadIdx.x / NV_BLOCK], m);
        }
        __syncthreads();
        if (threadIdx.x == 0 && cd.state) atomicMax(&cd.state[NV_AMAX], cta_amax[0]);
        if (threadIdx.x == 1 && rd.state) atomicMax(&rd.state[NV_AMAX], cta_amax[same_amax ? 0 : 1]);
    }
}

// The amax pass without the slab, for every case but a Hadamard along the
// columns (which no recipe asks for; it keeps nvfp4_tile's PHASE_AMAX). x is
// read once from global memory: a warp's lanes take consecutive 16-byte
// vectors of 16 rows, so lane l of warp w holds rows r0 .. r0 + 15 of
// In::VEC columns. The thread reduces max |x| (a direction without the
// Hadamard) and, when rd has it, the amax of the Hadamard-16 of each of its
// columns' 16 rows: the blocks of the direction along the rows (zero past
// the matrix, as the padded view). One shared then one global atomicMax per
// CTA and direction, into a state the host zeroed.
//
// With `sums` (not null) it also takes the f32 column sums of x (the bias
// gradient of dy) on the same read: each thread sums its 16 rows in order,
// the CTA adds its warps' sums in warp order, and sums[blockIdx.y * cols + c]
// gets column c's sum over the CTA's 128 rows; lin_colsum_final adds those
// in order. Zero rows past the matrix add +0.
#define NVA_WARPS (NV_THREADS / 32)
template <class In>
__device__ __forceinline__ void nvfp4_amax(const void* __restrict__ x, u32 rows, u32 cols, const NvDir& cd,
                                           const NvDir& rd, float* __restrict__ sums) {
    __shared__ u32 cta_amax[2];
    __shared__ float warp_sums[NVA_WARPS][32 * InBF16::VEC];
    if (threadIdx.x < 2) cta_amax[threadIdx.x] = 0u;
    const u32 c0 = (blockIdx.x * 32 + threadIdx.x % 32) * In::VEC;
    const u32 r0 = (blockIdx.y * NVA_WARPS + threadIdx.x / 32) * NV_BLOCK;
    Vec16 q[NV_BLOCK];
#pragma unroll
    for (int i = 0; i < NV_BLOCK; ++i) {
        q[i] = Vec16{{0u, 0u, 0u, 0u}};
        if (r0 + i >= rows || c0 >= cols) continue;
        const u64 at = (u64)(r0 + i) * cols + c0;
        if (cols % In::VEC == 0) {
            q[i] = In::load_vec(x, at);
        } else {
            for (u32 k = 0; k < In::VEC && c0 + k < cols; ++k) In::load_into(q[i], k, x, at + k);
        }
    }
    u32 plain = 0u, rotated = 0u;
#pragma unroll
    for (int k = 0; k < In::VEC; ++k) {
        float g[NV_BLOCK];
#pragma unroll
        for (int i = 0; i < NV_BLOCK; ++i) g[i] = In::elem(q[i], k);
        plain = max(plain, amax_bits<NV_BLOCK>(g));
        if (sums) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < NV_BLOCK; ++i) s += g[i];
            warp_sums[threadIdx.x / 32][threadIdx.x % 32 * In::VEC + k] = s;
        }
        if (rd.hadamard) {
            hadamard16_sums(g);
            rotated = max(rotated, amax_bits<NV_BLOCK>(g));
        }
    }
    __syncthreads();
    atomicMax(&cta_amax[0], plain);
    if (rd.hadamard) atomicMax(&cta_amax[1], rotated);
    const u32 c = blockIdx.x * 32 * In::VEC + threadIdx.x;
    if (sums && threadIdx.x < 32 * In::VEC && c < cols) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < NVA_WARPS; ++w) s += warp_sums[w][threadIdx.x];
        sums[(u64)blockIdx.y * cols + c] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0 && cd.state) atomicMax(&cd.state[NV_AMAX], cta_amax[0]);
    if (threadIdx.x == 1 && rd.state) {
        atomicMax(&rd.state[NV_AMAX], rd.hadamard ? f2u(u2f(cta_amax[1]) * 0.25f) : cta_amax[0]);
    }
}

// The GEMM operand of kept codes: deq[b * 16 + i] = BF16(decode(code) * s_q),
// one thread per half block (word h of the codes, 16 bytes of BF16), so that
// consecutive threads store consecutive 16 bytes.
extern "C" __global__ void __launch_bounds__(256) dequantize_nvfp4(const u8* codes, const u8* scales, u16* deq,
                                                                   u32 halves) {
    const u32 h = blockIdx.x * 256 + threadIdx.x;
    if (h >= halves) return;
    ((Vec16*)deq)[h] = nv_deq_half(((const u32*)codes)[h], decode<E4M3FN>(scales[h / 2]));
}

// Five CTAs an SM (48 registers, no spill): unbounded, ptxas spends 118 registers on
// the unrolled Philox rounds and fits two.
#define NVFP4_TILE_KERNEL(SUFFIX, IN)                                                                   \
    extern "C" __global__ void __launch_bounds__(NV_THREADS, 5) nvfp4_tile_##SUFFIX(                     \
        const void* x, u32 rows, u32 cols, NvDir cd, NvDir rd, int tile2d, int phase) {                \
        nvfp4_tile<IN>(x, rows, cols, cd, rd, tile2d, phase);                                           \
    }

NVFP4_TILE_KERNEL(f32, InF32)
NVFP4_TILE_KERNEL(bf16, InBF16)

#define NVFP4_AMAX_KERNEL(SUFFIX, IN)                                                                   \
    extern "C" __global__ void __launch_bounds__(NV_THREADS) nvfp4_amax_##SUFFIX(                        \
        const void* x, u32 rows, u32 cols, NvDir cd, NvDir rd, float* sums) {                           \
        nvfp4_amax<IN>(x, rows, cols, cd, rd, sums);                                                    \
    }

NVFP4_AMAX_KERNEL(f32, InF32)
NVFP4_AMAX_KERNEL(bf16, InBF16)
