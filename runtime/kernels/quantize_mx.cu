// MX block quantization of rows (SPEC section 2; CPU reference:
// runtime/src/quant/mx.rs, quantize_rows and MxTensor::dequantize_rows).
//
// Layout, as on the CPU ("axis-last"): the input is `rows` rows of `len` f32
// or BF16 values, row-major; each row is zero-padded to padded_len = 32 * nb.
// Blocks are the consecutive 32-element chunks of the padded rows, numbered
// b = row * nb + k.
//   codes  [rows, padded_len]     E4M3FN, or [rows, padded_len / 2] E2M1
//                                 packed two per byte, element 2i in the low nibble
//   scales [rows, nb]             E8M0 bytes
//
// Quantize: one thread owns one block. It reads the block's 32 elements with
// 16-byte loads straight into registers (a warp covers 32 consecutive blocks,
// so together it reads whole sectors), then writes the block's codes as
// 16-byte stores and its scale byte: no shared memory, no barrier. The host
// keeps rows * nb + QUANT_THREADS below 2^32 so block indices are 32-bit.
//
// Each quantizer comes twice: PLAIN (no Hadamard, no stochastic rounding, no
// tiles; the production 1x32 path, kept small so occupancy stays high) and
// the full kernel with every option.
//
// 32x32 tiles (one scale per tile, replicated over its rows) take three
// launches: PHASE_AMAX writes each block's amax, mx_tile_scales_* reduces
// them per tile into the scale bytes, PHASE_ENCODE_FIXED encodes with them.

// Threads per CTA of the quantize kernels (one MX block each).
#define QUANT_THREADS 256
// Threads per CTA of the dequantize kernels = blocks staged per CTA.
#define QTHREADS 128
// Row stride of the dequantize staging tile: 33 floats, so that thread t
// writing element j of its block hits bank (33 t + j) mod 32 and no two
// threads of a warp collide.
#define TILE_STRIDE 33

enum Phase { PHASE_QUANTIZE = 0, PHASE_AMAX = 1, PHASE_ENCODE_FIXED = 2 };

// Element offset of each staged block's row start, and its first column.
struct StagedBlocks {
    u64 row_offset[QTHREADS];
    u32 col0[QTHREADS];
};

// Fill the row offset and first column of this CTA's blocks (one per thread).
__device__ __forceinline__ void locate_blocks(StagedBlocks& sb, u64 first, u64 nblocks, u32 nb,
                                              u32 row_len) {
    const u64 b = first + threadIdx.x;
    if (b < nblocks) {
        const u64 row = b / nb;
        sb.row_offset[threadIdx.x] = row * row_len;
        sb.col0[threadIdx.x] = (u32)(b - row * nb) * MX_BLOCK;
    }
}

// The 32 elements of the block starting at column col0 of the row that
// starts at element row_start, zero past len. When the row length is a
// multiple of the vector width every row starts 16-byte aligned, and a block
// inside the row is read as whole vectors, all issued before any is used.
template <class In>
__device__ __forceinline__ void load_block(const void* x, u64 row_start, u32 col0, u32 len, float* v) {
    constexpr int NV = MX_BLOCK / In::VEC;
    if (len % In::VEC == 0 && col0 + MX_BLOCK <= len) {
        Vec16 q[NV];
#pragma unroll
        for (int k = 0; k < NV; ++k) q[k] = In::load_vec(x, row_start + col0 + k * In::VEC);
#pragma unroll
        for (int k = 0; k < NV; ++k) {
#pragma unroll
            for (int i = 0; i < In::VEC; ++i) v[k * In::VEC + i] = In::elem(q[k], i);
        }
    } else {
#pragma unroll
        for (int i = 0; i < MX_BLOCK; ++i) v[i] = col0 + i < len ? In::load(x, row_start + col0 + i) : 0.0f;
    }
}

// One block: amax, scale byte, q = x * 2^(127 - byte), encode. With
// EXTRAS = false the Hadamard, SR and tile-phase arguments are ignored.
template <class F, class In, bool EXTRAS>
__device__ __forceinline__ void quantize_mx_rows(const void* __restrict__ x, u8* __restrict__ codes,
                                                 u8* __restrict__ scales, u32* __restrict__ amax_bits,
                                                 u32 rows, u32 len, u32 nb, int mode, int phase,
                                                 int hadamard, int sr, u32 seed_lo, u32 seed_hi,
                                                 u32 step, u32 tensor_id) {
    const u32 b = blockIdx.x * QUANT_THREADS + threadIdx.x;
    if (b >= rows * nb) return;
    const u32 row = b / nb;
    float v[MX_BLOCK];
    load_block<In>(x, (u64)row * len, (b - row * nb) * MX_BLOCK, len, v);
    if (EXTRAS && hadamard) {
        hadamard16(v);
        hadamard16(v + 16);
    }

    u32 byte;
    if (EXTRAS && phase == PHASE_ENCODE_FIXED) {
        byte = scales[b];
    } else {
        const u32 m = mx_block_amax_bits(v);
        if (EXTRAS && phase == PHASE_AMAX) {
            amax_bits[b] = m;
            return;
        }
        byte = scale_byte<F>(u2f(m), mode);
        scales[b] = (u8)byte;
    }
    u32 w[MX_BLOCK * CodeWidth<F>::W / 32];
    mx_encode_block<F>(v, byte, EXTRAS && sr, MxSrKey{seed_lo, seed_hi, step, tensor_id}, b, w);
    mx_store_codes<F>(codes, b, w);
}

// One scale byte per 32x32 tile from the per-block amax bits, replicated over
// the tile's rows (mx.rs, tile_scales). One thread per (tile row, block column).
template <class F>
__device__ __forceinline__ void mx_tile_scales(const u32* amax_bits, u8* scales, u32 rows, u32 nb,
                                               int mode) {
    const u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 tile_rows = (rows + MX_BLOCK - 1) / MX_BLOCK;
    if (idx >= tile_rows * nb) return;
    const u64 tr = idx / nb;
    const u64 k = idx - tr * nb;
    const u64 r0 = tr * MX_BLOCK;
    const u64 r1 = r0 + MX_BLOCK < rows ? r0 + MX_BLOCK : rows;
    u32 m = 0u;
    for (u64 r = r0; r < r1; ++r) {
        const u32 a = amax_bits[r * nb + k];
        m = a > m ? a : m;
    }
    const u8 byte = (u8)scale_byte<F>(u2f(m), mode);
    for (u64 r = r0; r < r1; ++r) scales[r * nb + k] = byte;
}

// decode(code) * 2^(byte - 127) in f32 for every element of the blocks, then
// (unrotate) the Hadamard-16 again, written as f32 or BF16 to
// out[row * out_stride + col] for col < out_len. out_len = out_stride =
// padded_len gives MxTensor::dequantize_rows (the GEMM operand);
// out_len = out_stride = len with unrotate gives MxTensor::dequantize.
template <class F>
__device__ __forceinline__ void dequantize_mx_rows(const u8* codes, const u8* scales, float* out_f32,
                                                   u16* out_bf16, u32 rows, u32 nb, u32 out_len,
                                                   u32 out_stride, int unrotate) {
    __shared__ float tile[QTHREADS * TILE_STRIDE];
    __shared__ StagedBlocks sb;
    const u64 nblocks = (u64)rows * nb;
    const u64 first = (u64)blockIdx.x * QTHREADS;
    locate_blocks(sb, first, nblocks, nb, out_stride);

    const u64 b = first + threadIdx.x;
    if (b < nblocks) {
        const float s = e8m0_decode(scales[b]);
        float v[MX_BLOCK];
        if (F::exp_bits + F::man_bits == 3) {
            const u32* in = (const u32*)(codes + b * (MX_BLOCK / 2));
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const u32 w = in[k];
#pragma unroll
                for (int i = 0; i < 8; ++i) v[8 * k + i] = decode<F>((w >> (4 * i)) & 0xFu) * s;
            }
        } else {
            const u32* in = (const u32*)(codes + b * MX_BLOCK);
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const u32 w = in[k];
#pragma unroll
                for (int i = 0; i < 4; ++i) v[4 * k + i] = decode<F>((w >> (8 * i)) & 0xFFu) * s;
            }
        }
        if (unrotate) {
            hadamard16(v);
            hadamard16(v + 16);
        }
#pragma unroll
        for (int i = 0; i < MX_BLOCK; ++i) tile[threadIdx.x * TILE_STRIDE + i] = v[i];
    }
    __syncthreads();

    const u32 j = threadIdx.x % MX_BLOCK;
    for (u32 lb = threadIdx.x / MX_BLOCK; lb < QTHREADS; lb += QTHREADS / MX_BLOCK) {
        if (first + lb >= nblocks) break;
        const u32 col = sb.col0[lb] + j;
        if (col >= out_len) continue;
        const float v = tile[lb * TILE_STRIDE + j];
        const u64 o = sb.row_offset[lb] + col;
        if (out_bf16) {
            out_bf16[o] = bf16_from_f32(v);
        } else {
            out_f32[o] = v;
        }
    }
}

// The BF16 GEMM operand (MxTensor::dequantize_rows, padding included):
// bf16(decode(code) * 2^(byte - 127)) for each of `octets` runs of 8
// elements, one a thread, so that consecutive threads store consecutive 16
// bytes (dequantize_mx_rows stages blocks for its general layouts and stores
// 2 bytes at a time).
template <class F>
__device__ __forceinline__ void dequantize_mx_operand(const u8* __restrict__ codes, const u8* __restrict__ scales,
                                                      u16* __restrict__ deq, u64 octets) {
    const u64 h = (u64)blockIdx.x * QTHREADS + threadIdx.x;
    if (h >= octets) return;
    const u32 byte = scales[h / (MX_BLOCK / 8)];
    const float s = e8m0_decode(byte);
    const bool exact = mx_products_are_bf16<F>(byte);
    u32 c[8];
    if (F::exp_bits + F::man_bits == 3) {
        const u32 w = ((const u32*)codes)[h];
#pragma unroll
        for (int i = 0; i < 8; ++i) c[i] = (w >> (4 * i)) & 0xFu;
    } else {
        const u32 w0 = ((const u32*)codes)[2 * h], w1 = ((const u32*)codes)[2 * h + 1];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            c[i] = (w0 >> (8 * i)) & 0xFFu;
            c[4 + i] = (w1 >> (8 * i)) & 0xFFu;
        }
    }
    Vec16 o;
#pragma unroll
    for (int j = 0; j < 4; ++j) o.w[j] = bf16_pair_scaled<F>(c[2 * j], c[2 * j + 1], s, exact);
    ((Vec16*)deq)[h] = o;
}

// The quantizer of one element format and input type: full and PLAIN.
#define MX_QUANTIZE_KERNELS(SUFFIX, FMT, IN)                                                            \
    extern "C" __global__ void __launch_bounds__(QUANT_THREADS) quantize_mx_##SUFFIX(                  \
        const void* x, u8* codes, u8* scales, u32* amax_bits, u32 rows, u32 len, u32 nb, int mode,     \
        int phase, int hadamard, int sr, u32 seed_lo, u32 seed_hi, u32 step, u32 tensor_id) {          \
        quantize_mx_rows<FMT, IN, true>(x, codes, scales, amax_bits, rows, len, nb, mode, phase,       \
                                        hadamard, sr, seed_lo, seed_hi, step, tensor_id);              \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(QUANT_THREADS) quantize_mx_plain_##SUFFIX(            \
        const void* x, u8* codes, u8* scales, u32* amax_bits, u32 rows, u32 len, u32 nb, int mode,     \
        int phase, int hadamard, int sr, u32 seed_lo, u32 seed_hi, u32 step, u32 tensor_id) {          \
        quantize_mx_rows<FMT, IN, false>(x, codes, scales, amax_bits, rows, len, nb, mode, phase,      \
                                         hadamard, sr, seed_lo, seed_hi, step, tensor_id);             \
    }

#define MX_KERNELS(SUFFIX, FMT)                                                                      \
    MX_QUANTIZE_KERNELS(SUFFIX##_f32, FMT, InF32)                                                    \
    MX_QUANTIZE_KERNELS(SUFFIX##_bf16, FMT, InBF16)                                                  \
    extern "C" __global__ void mx_tile_scales_##SUFFIX(const u32* amax_bits, u8* scales, u32 rows,   \
                                                       u32 nb, int mode) {                           \
        mx_tile_scales<FMT>(amax_bits, scales, rows, nb, mode);                                      \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(QTHREADS) dequantize_mx_##SUFFIX(                   \
        const u8* codes, const u8* scales, float* out_f32, u16* out_bf16, u32 rows, u32 nb,          \
        u32 out_len, u32 out_stride, int unrotate) {                                                 \
        dequantize_mx_rows<FMT>(codes, scales, out_f32, out_bf16, rows, nb, out_len, out_stride,     \
                                unrotate);                                                           \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(QTHREADS) dequantize_mx_operand_##SUFFIX(           \
        const u8* codes, const u8* scales, u16* deq, u64 octets) {                                   \
        dequantize_mx_operand<FMT>(codes, scales, deq, octets);                                      \
    }

MX_KERNELS(e2m1, E2M1)
MX_KERNELS(e4m3fn, E4M3FN)
