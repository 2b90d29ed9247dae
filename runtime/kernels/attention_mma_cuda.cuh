// The CUDA-only pieces of the fused attention kernels (attention.cu): the
// warp-level tensor-core MMA, ldmatrix, asynchronous global-to-shared copies
// and the reductions over the four lanes that share a row of an MMA
// fragment. The CUDA build prepends this file to attention.cu (after
// common.cuh); the HIP build uses attention_mma_hip.cuh, with the same
// functions and the same semantics, so attention.cu itself has no inline
// assembly, no warp intrinsic and no #if.
//
// Fragment layouts are PTX's for mma.m16n8k16 with 16-bit inputs (PTX ISA,
// "Matrix Fragments for mma.m16n8k16"). With g = lane / 4, t = lane % 4 and
// two bf16 per 32-bit register, the lower-indexed element in the low half:
//   A (16 x 16, row-major) a[0]: row g, cols 2t, 2t+1;   a[1]: row g+8, same cols;
//                          a[2]: row g, cols 2t+8, 2t+9; a[3]: row g+8, same cols.
//   B (16 x 8, k x n)      b[0]: k = 2t, 2t+1 at n = g;   b[1]: k = 2t+8, 2t+9 at n = g.
//   C (16 x 8, f32)        c[0], c[1]: row g, cols 2t, 2t+1; c[2], c[3]: row g+8, same cols.

// d += A * B for one 16 x 8 x 16 tile: bf16 inputs, f32 accumulation.
__device__ __forceinline__ void mma_bf16_16x8x16(float d[4], const u32 a[4], const u32 b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The 32-bit shared-window address of a generic pointer into shared memory.
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }\n" : "=r"(a) : "l"(p));
    return a;
}

// Four 8 x 8 bf16 matrices from shared memory (ldmatrix .x4): lane 8m + i
// gives the 16-byte-aligned address of row i of matrix m; r[m] of lane l
// receives row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 of matrix m.
__device__ __forceinline__ void ldmatrix_x4(u32 r[4], const u16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
}

// As ldmatrix_x4, each matrix transposed: r[m] of lane l receives elements
// (row 2 (l % 4), col l / 4) and (row 2 (l % 4) + 1, col l / 4) of matrix m.
__device__ __forceinline__ void ldmatrix_x4_trans(u32 r[4], const u16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
}

// Starts a copy of 16 bytes (both addresses 16-byte aligned) from global to
// shared memory; it is complete after async_wait_* in this thread, and
// visible to the block after a __syncthreads() that follows.
__device__ __forceinline__ void async_copy_16(void* dst_smem, const void* src_global) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst_smem)), "l"(src_global));
}

// Zeroes 16 bytes of shared memory with the visibility of async_copy_16
// (here a plain store, which is complete at once).
__device__ __forceinline__ void async_zero_16(void* dst_smem) { *(Vec16*)dst_smem = Vec16{{0u, 0u, 0u, 0u}}; }

// Closes the group of copies this thread started since the last commit.
__device__ __forceinline__ void async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits for every group this thread committed.
__device__ __forceinline__ void async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Waits for every group this thread committed but the most recent one.
__device__ __forceinline__ void async_wait_all_but_last() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// Max and sum over the four lanes 4g .. 4g+3 (the lanes holding one row of a
// C fragment); every lane of the warp must call them together.
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xFFFFFFFFu, x, 1);
    return x + __shfl_xor_sync(0xFFFFFFFFu, x, 2);
}

// Two f32 rounded to bf16 (nearest even), `lo` in the low half.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// 2^x by the hardware's approximation (ex2.approx.ftz: relative error about
// 2^-22, subnormal results flushed to zero), one instruction where exp2f
// with subnormals kept takes several; exp2_approx(-inf) = 0. Every
// probability's exponent: they are rounded to bf16 as MMA inputs anyway.
__device__ __forceinline__ float exp2_approx(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}

// Whether `p` holds in any lane of the warp; all 32 lanes call it together.
__device__ __forceinline__ bool warp_any(bool p) { return __any_sync(0xFFFFFFFFu, p); }
