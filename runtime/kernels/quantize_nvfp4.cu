// NVFP4 two-level block quantization (SPEC section 2b; CPU reference:
// runtime/src/quant/nvfp4.rs, quantize_view and Nvfp4Tensor::dequantize_rows).
//
// Layout, as on the CPU ("axis-last"): the view is `rows` rows of `len`
// values, each zero-padded to padded_len = 16 * nb; block b = row * nb + kb.
// The input is a row-major f32 or BF16 matrix read as that view either
// directly (element (r, k) at x[r * len + k]: quantized along its columns)
// or transposed (element (r, k) at x[k * rows + r]: quantized along its
// rows, the CPU's quantize_nvfp4(x, [len, rows], 0, ..)).
//   codes  [rows, padded_len / 2]  E2M1 packed two per byte, element 2i in the low nibble
//   scales [rows, nb]              E4M3FN bytes (a 16x16 tile's byte repeated for its blocks)
//   deq    [rows, padded_len]      BF16 decode(code) * s_q: the GEMM operand without
//                                  the tensor scale t, which the GEMM applies after
//                                  (exact: a 2-bit by a 4-bit significand)
//   state                          the FP8 state of quantize_fp8.cu: word FP8_AMAX
//                                  holds the tensor amax A (fp8_amax + fp8_scale
//                                  reduce it), word NV_T the tensor scale t, written
//                                  here (where the GEMM's scale_inv pointer looks)
//
// One thread owns one block. Along the columns consecutive threads take
// consecutive blocks of a row; transposed, consecutive rows of the view
// (columns of x), so a warp's loads of element k cover 32 consecutive values.
//
// Steps (each one IEEE f32 operation, no FMA: the host compiles with
// --fmad=false --prec-div=true):
//   a = block amax (after the Hadamard-16 of each group of 16 when asked)
//   A = max a; t = fl32(A / 2688), or 1 where that is 0
//   s = clamp(fl32(fl32(a / 6) / t), 2^-6, 448) -> E4M3FN byte, s_q its value
//   r = fl32(fl32(1 / t) / s_q); code = E2M1(clamp(fl32(v * r), -6, 6)), RNE or SR
// With the Hadamard option or 16x16 tiles the block amaxes come first
// (PHASE_AMAX), their max is reduced by fp8_amax over those bits, tiles get
// their bytes from nvfp4_tile_scales, and PHASE_ENCODE_FIXED encodes with
// them; otherwise fp8_amax reduces x itself and PHASE_QUANTIZE does the rest.

#define NV_BLOCK 16
#define NV_THREADS 256
// Word of the state that holds t: FP8_SCALE_INV of quantize_fp8.cu.
#define NV_T 8
#define NV_AMAX 0

enum NvPhase { NV_PHASE_QUANTIZE = 0, NV_PHASE_AMAX = 1, NV_PHASE_ENCODE_FIXED = 2 };

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

// The block of `b` in the view: its row and block column. Transposed,
// consecutive b are consecutive rows of one block column.
__device__ __forceinline__ void nv_locate(u32 tid, u32 rows, u32 nb, int transposed, u32& row, u32& kb) {
    if (transposed) {
        kb = tid / rows;
        row = tid - kb * rows;
    } else {
        row = tid / nb;
        kb = tid - row * nb;
    }
}

// The 16 values of block (row, kb), zero past len.
template <class In>
__device__ __forceinline__ void nv_load(const void* x, u32 rows, u32 len, int transposed, u32 row, u32 kb,
                                        float* v) {
    const u32 c0 = kb * NV_BLOCK;
    if (transposed) {
#pragma unroll
        for (int i = 0; i < NV_BLOCK; ++i) v[i] = c0 + i < len ? In::load(x, (u64)(c0 + i) * rows + row) : 0.0f;
    } else if (len % In::VEC == 0 && c0 + NV_BLOCK <= len) {
        constexpr int NV = NV_BLOCK / In::VEC;
        Vec16 q[NV];
#pragma unroll
        for (int k = 0; k < NV; ++k) q[k] = In::load_vec(x, (u64)row * len + c0 + k * In::VEC);
#pragma unroll
        for (int k = 0; k < NV; ++k) {
#pragma unroll
            for (int i = 0; i < In::VEC; ++i) v[k * In::VEC + i] = In::elem(q[k], i);
        }
    } else {
#pragma unroll
        for (int i = 0; i < NV_BLOCK; ++i) v[i] = c0 + i < len ? In::load(x, (u64)row * len + c0 + i) : 0.0f;
    }
}

// Writes block b's 16 BF16 values decode(code) * s_q (two words of codes).
__device__ __forceinline__ void nv_store_deq(u16* deq, u64 off, const u32* w, float sq) {
    Vec16 o[2];
#pragma unroll
    for (int i = 0; i < NV_BLOCK; i += 2) {
        const u32 c0 = (w[i / 8] >> (4 * (i % 8))) & 0xFu;
        const u32 c1 = (w[i / 8] >> (4 * (i % 8 + 1))) & 0xFu;
        o[i / 8].w[(i % 8) / 2] =
            (u32)bf16_from_f32(decode<E2M1>(c0) * sq) | ((u32)bf16_from_f32(decode<E2M1>(c1) * sq) << 16);
    }
    Vec16* out = (Vec16*)(deq + off);
    out[0] = o[0];
    out[1] = o[1];
}

// One block through the phase asked for. With EXTRAS = false (no Hadamard,
// no SR, no tiles) only PHASE_QUANTIZE runs.
template <class In, bool EXTRAS>
__device__ __forceinline__ void quantize_nvfp4_rows(const void* __restrict__ x, u8* __restrict__ codes,
                                                    u8* __restrict__ scales, u16* __restrict__ deq,
                                                    u32* __restrict__ amax, u32* __restrict__ state, u32 rows,
                                                    u32 len, u32 nb, int transposed, int phase, int hadamard,
                                                    int sr, MxSrKey key) {
    const u32 tid = blockIdx.x * NV_THREADS + threadIdx.x;
    if (tid >= rows * nb) return;
    u32 row, kb;
    nv_locate(tid, rows, nb, transposed, row, kb);
    const u32 b = row * nb + kb;
    float v[NV_BLOCK];
    nv_load<In>(x, rows, len, transposed, row, kb, v);
    if (EXTRAS && hadamard) hadamard16(v);
    if (EXTRAS && phase == NV_PHASE_AMAX) {
        amax[b] = amax_bits<NV_BLOCK>(v);
        return;
    }

    const float t = nv_tensor_scale(state);
    if (tid == 0) state[NV_T] = f2u(t);
    u32 byte;
    if (EXTRAS && phase == NV_PHASE_ENCODE_FIXED) {
        byte = scales[b];
    } else {
        byte = nv_scale_byte(u2f(amax_bits<NV_BLOCK>(v)), t);
        scales[b] = (u8)byte;
    }
    const float sq = decode<E4M3FN>(byte);
    const float r = 1.0f / t / sq;
    u32 w[2];
    if (EXTRAS && sr) {
        u32 c[NV_BLOCK];
#pragma unroll
        for (int g = 0; g < NV_BLOCK / 4; ++g) {
            u32 rw[4];
            sr_words(key, (u64)b * (NV_BLOCK / 4) + (u64)g, rw);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                c[4 * g + q] = encode_sr<E2M1>(clamp_keep_nan(v[4 * g + q] * r, -6.0f, 6.0f), rw[q]);
            }
        }
        pack_codes<E2M1, NV_BLOCK>(c, w);
    } else if ((f2u(r) & 0x7F800000u) != 0x7F800000u) {
        // r finite and every x finite (A passed), so every product is finite
        // and the fast encoder, which saturates at 6, gives encode_rne's bits.
#pragma unroll
        for (int i = 0; i < NV_BLOCK; ++i) v[i] = v[i] * r;
        encode_pack_finite<E2M1, NV_BLOCK>(v, w);
    } else {
        // r = +Inf (A below 2688 * 2^-128): 0 * Inf is NaN, which E2M1 encodes as +0.
        u32 c[NV_BLOCK];
#pragma unroll
        for (int i = 0; i < NV_BLOCK; ++i) c[i] = encode_rne<E2M1>(clamp_keep_nan(v[i] * r, -6.0f, 6.0f));
        pack_codes<E2M1, NV_BLOCK>(c, w);
    }
    if (codes) {
        u32* out = (u32*)(codes + (u64)b * (NV_BLOCK / 2));
        out[0] = w[0];
        out[1] = w[1];
    }
    if (deq) nv_store_deq(deq, (u64)b * NV_BLOCK, w, sq);
}

// One scale byte per 16x16 tile of the view (nvfp4.rs, tile_scale_bytes),
// from the block amaxes, repeated over the tile's rows. One thread per
// (tile row, block column).
extern "C" __global__ void nvfp4_tile_scales(const u32* amax, u8* scales, const u32* state, u32 rows, u32 nb) {
    const u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 tile_rows = (rows + NV_BLOCK - 1) / NV_BLOCK;
    if (idx >= tile_rows * nb) return;
    const u64 tr = idx / nb;
    const u64 k = idx - tr * nb;
    const u64 r0 = tr * NV_BLOCK;
    const u64 r1 = r0 + NV_BLOCK < rows ? r0 + NV_BLOCK : rows;
    u32 m = 0u;
    for (u64 r = r0; r < r1; ++r) {
        const u32 a = amax[r * nb + k];
        m = a > m ? a : m;
    }
    const u8 byte = (u8)nv_scale_byte(u2f(m), nv_tensor_scale(state));
    for (u64 r = r0; r < r1; ++r) scales[r * nb + k] = byte;
}

// The GEMM operand of kept codes: deq[b * 16 + i] = BF16(decode(code) * s_q).
extern "C" __global__ void __launch_bounds__(NV_THREADS)
    dequantize_nvfp4(const u8* codes, const u8* scales, u16* deq, u32 nblocks) {
    const u32 b = blockIdx.x * NV_THREADS + threadIdx.x;
    if (b >= nblocks) return;
    const u32* in = (const u32*)(codes + (u64)b * (NV_BLOCK / 2));
    const u32 w[2] = {in[0], in[1]};
    nv_store_deq(deq, (u64)b * NV_BLOCK, w, decode<E4M3FN>(scales[b]));
}

#define NVFP4_QUANTIZE_KERNELS(SUFFIX, IN)                                                                   \
    extern "C" __global__ void __launch_bounds__(NV_THREADS) quantize_nvfp4_##SUFFIX(                       \
        const void* x, u8* codes, u8* scales, u16* deq, u32* amax, u32* state, u32 rows, u32 len, u32 nb,   \
        int transposed, int phase, int hadamard, int sr, MxSrKey key) {                                     \
        quantize_nvfp4_rows<IN, true>(x, codes, scales, deq, amax, state, rows, len, nb, transposed, phase, \
                                      hadamard, sr, key);                                                   \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(NV_THREADS) quantize_nvfp4_plain_##SUFFIX(                 \
        const void* x, u8* codes, u8* scales, u16* deq, u32* amax, u32* state, u32 rows, u32 len, u32 nb,   \
        int transposed, int phase, int hadamard, int sr, MxSrKey key) {                                     \
        quantize_nvfp4_rows<IN, false>(x, codes, scales, deq, amax, state, rows, len, nb, transposed,       \
                                       phase, hadamard, sr, key);                                           \
    }

NVFP4_QUANTIZE_KERNELS(f32, InF32)
NVFP4_QUANTIZE_KERNELS(bf16, InBF16)
