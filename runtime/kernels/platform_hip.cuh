// The HIP side of the platform functions (see platform_cuda.cuh): the same
// functions with the same semantics for AMD GPUs (CDNA3 gfx942, CDNA4
// gfx950), compiled with hip_runtime.h force-included. It has only been
// compile-checked (.ci/rocm-kernels); it has never run on AMD hardware.
//
// What it assumes: a "warp" of the kernels is 32 consecutive threads
// (threadIdx.x % 32) and blocks are multiples of 32 threads or a single warp.
// AMD wavefronts on gfx942 / gfx950 are 64 lanes, so a warp is one half of a
// wavefront; the two halves execute in lockstep, so a 32-lane warp never
// runs ahead of itself. Lane exchanges must use width 32 (__shfl(x, l, 32),
// __shfl_xor(x, m, 32)) so that each half only reads its own lanes.

// As CUDA's warp barrier (sync_warp of platform_cuda.cuh): the wavefront is
// already converged at this point (the kernels call it outside divergent
// code), so what is left is the memory ordering between its lanes: a release fence, a wave barrier (which also
// keeps the compiler from moving code across it) and an acquire fence.
// Workgroup scope is stronger than the wavefront scope needed (it waits for
// this wave's outstanding LDS and global accesses), kept while nothing has
// been measured on hardware.
__device__ __forceinline__ void sync_warp() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// As platform_cuda.cuh's fp8x2_rne_satfinite: the two codes from `encode`,
// the portable encoder of one finite value (gfx942 converts only to the FNUZ
// formats, so no instruction is assumed).
template <bool e5m2, class Encode>
__device__ __forceinline__ unsigned int fp8x2_rne_satfinite(float hi, float lo, Encode encode) {
    return (encode(hi) << 8) | encode(lo);
}
