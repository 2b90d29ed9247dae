// The HIP form of attention_mma_cuda.cuh: the same functions with the same
// semantics and fragment layouts, for AMD GPUs (gfx942, gfx950), so that
// attention.cu compiles unchanged as HIP. It is portable HIP: no MFMA yet
// (the 16 x 8 x 16 product is emulated per lane with shuffles and f32
// arithmetic), no inline assembly. It has been compile-checked only
// (.ci/rocm-kernels) and has never run on AMD hardware.
//
// Fragment layouts (as in attention_mma_cuda.cuh, PTX's for mma.m16n8k16
// with 16-bit inputs). With g = lane / 4, t = lane % 4 and two bf16 per
// 32-bit register, the lower-indexed element in the low half:
//   A (16 x 16, row-major) a[0]: row g, cols 2t, 2t+1;   a[1]: row g+8, same cols;
//                          a[2]: row g, cols 2t+8, 2t+9; a[3]: row g+8, same cols.
//   B (16 x 8, k x n)      b[0]: k = 2t, 2t+1 at n = g;   b[1]: k = 2t+8, 2t+9 at n = g.
//   C (16 x 8, f32)        c[0], c[1]: row g, cols 2t, 2t+1; c[2], c[3]: row g+8, same cols.
//
// What it assumes: a warp is 32 consecutive threads (lane = threadIdx.x % 32,
// as attention.cu computes it; MMA_THREADS is a multiple of 32). On AMD's
// 64-lane wavefronts a warp is one half of a wavefront; every exchange
// below uses width 32, so each half reads only its own lanes, and the
// halves run in lockstep. As on CUDA, all 32 lanes of a warp call each
// function together.
//
// Numerics against the CUDA build: quad_max, quad_sum and pack_bf16x2 give
// the same bits; exp2_approx is the device library's exp2f, not CUDA's
// ex2.approx. The MMA does not in general: each bf16 x bf16 product is
// exact in f32, but the 16 products are added here in k order in f32 and
// then added to d, while the tensor core's internal accumulation order and
// precision are its own.

// The 32-bit word `x` of lane `src` (0 .. 31) of this warp.
__device__ __forceinline__ u32 lane_word(u32 x, int src) { return (u32)__shfl((int)x, src, 32); }

// The pointer `p` of lane `src` (0 .. 31) of this warp (64-bit generic address).
__device__ __forceinline__ const u16* lane_ptr(const u16* p, int src) {
    const u64 a = (u64)p;
    const u64 lo = lane_word((u32)a, src), hi = lane_word((u32)(a >> 32), src);
    return (const u16*)((hi << 32) | lo);
}

// The bf16 in the low / high half of a word, as f32.
__device__ __forceinline__ float bf16_lo(u32 w) { return u2f(w << 16); }
__device__ __forceinline__ float bf16_hi(u32 w) { return u2f(w & 0xFFFF0000u); }

// d += A * B for one 16 x 8 x 16 tile: bf16 inputs, f32 accumulation. Lane
// (g, t) gathers, for each group of k columns, row g and g + 8 of A from lane
// 4g + t' and columns 2t and 2t + 1 of B from lanes 8t + t' and 8t + 4 + t'.
__device__ __forceinline__ void mma_bf16_16x8x16(float d[4], const u32 a[4], const u32 b[2]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    // A rolled loop over the eight k pairs (k = 2kp, 2kp + 1): unrolled, the
    // attention kernels' unrolled tiles take minutes to compile.
#pragma unroll 1
    for (int kp = 0; kp < 8; ++kp) {
        const int tq = kp & 3;
        const bool hi = kp >= 4;
        const u32 ag = lane_word(hi ? a[2] : a[0], 4 * g + tq);
        const u32 ag8 = lane_word(hi ? a[3] : a[1], 4 * g + tq);
        const u32 bk = hi ? b[1] : b[0];
        const u32 bn0 = lane_word(bk, 8 * t + tq);
        const u32 bn1 = lane_word(bk, 8 * t + 4 + tq);
        s0 += bf16_lo(ag) * bf16_lo(bn0);
        s0 += bf16_hi(ag) * bf16_hi(bn0);
        s1 += bf16_lo(ag) * bf16_lo(bn1);
        s1 += bf16_hi(ag) * bf16_hi(bn1);
        s2 += bf16_lo(ag8) * bf16_lo(bn0);
        s2 += bf16_hi(ag8) * bf16_hi(bn0);
        s3 += bf16_lo(ag8) * bf16_lo(bn1);
        s3 += bf16_hi(ag8) * bf16_hi(bn1);
    }
    d[0] += s0;
    d[1] += s1;
    d[2] += s2;
    d[3] += s3;
}

// Four 8 x 8 bf16 matrices from shared memory (ldmatrix .x4): lane 8m + i
// gives the 16-byte-aligned address of row i of matrix m; r[m] of lane l
// receives row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 of matrix m.
// Emulated: each lane takes the row address from lane 8m + l / 4 and loads
// its word.
__device__ __forceinline__ void ldmatrix_x4(u32 r[4], const u16* row) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        const u16* p = lane_ptr(row, 8 * m + (lane >> 2));
        r[m] = *(const u32*)(p + 2 * (lane & 3));
    }
}

// As ldmatrix_x4, each matrix transposed: r[m] of lane l receives elements
// (row 2 (l % 4), col l / 4) and (row 2 (l % 4) + 1, col l / 4) of matrix m.
__device__ __forceinline__ void ldmatrix_x4_trans(u32 r[4], const u16* row) {
    const int lane = threadIdx.x & 31, col = lane >> 2;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        const u16* p0 = lane_ptr(row, 8 * m + 2 * (lane & 3));
        const u16* p1 = lane_ptr(row, 8 * m + 2 * (lane & 3) + 1);
        r[m] = (u32)p0[col] | ((u32)p1[col] << 16);
    }
}

// Copies 16 bytes (both addresses 16-byte aligned) from global to shared
// memory. Here a plain load and store, complete at once: stronger than the
// CUDA asynchronous copy, and the kernels already __syncthreads() between a
// copy and any other thread's read.
__device__ __forceinline__ void async_copy_16(void* dst_smem, const void* src_global) {
    *(Vec16*)dst_smem = *(const Vec16*)src_global;
}

// Zeroes 16 bytes of shared memory with the visibility of async_copy_16.
__device__ __forceinline__ void async_zero_16(void* dst_smem) { *(Vec16*)dst_smem = Vec16{{0u, 0u, 0u, 0u}}; }

// The copies are synchronous, so committing and waiting have nothing to do.
__device__ __forceinline__ void async_commit() {}
__device__ __forceinline__ void async_wait_all() {}
__device__ __forceinline__ void async_wait_all_but_last() {}

// Max and sum over the four lanes 4g .. 4g+3 (the lanes holding one row of a
// C fragment), in the order of the CUDA file; every lane of the warp must
// call them together.
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor(x, 1, 32));
    return fmaxf(x, __shfl_xor(x, 2, 32));
}

__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor(x, 1, 32);
    return x + __shfl_xor(x, 2, 32);
}

// f32 to bf16 bits, round to nearest even (subnormals kept, overflow to
// infinity), NaN to the canonical bf16 NaN.
__device__ __forceinline__ u32 bf16_bits_rne(float x) {
    const u32 b = f2u(x);
    if (is_nan_bits(b)) return 0x7FFFu;
    return (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
}

// Two f32 rounded to bf16 (nearest even), `lo` in the low half.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) { return bf16_bits_rne(lo) | (bf16_bits_rne(hi) << 16); }

// 2^x (CUDA: ex2.approx.ftz); here the device library's exp2f.
__device__ __forceinline__ float exp2_approx(float x) { return exp2f(x); }

// Whether `p` holds in any lane of the warp. __any votes over the whole
// wavefront, both 32-lane warps of it: a superset of the warp's answer,
// which is all the kernels ask of it (rescale when any row may need it).
__device__ __forceinline__ bool warp_any(bool p) { return __any(p); }
