// The CUDA side of the platform functions: the few device functions whose
// spelling differs between CUDA and HIP. The host prepends this file (or
// platform_hip.cuh, for the HIP compile check) before common.cuh, so every
// kernel module may use them; nothing else in the kernels names a
// platform-only intrinsic, and there is no #if.
//
// Each function here is exactly the CUDA construct it names: the kernels
// compile to the same instructions as when they spelled it out.
//
// A "warp" in these kernels is 32 consecutive threads of a block (lane =
// threadIdx.x % 32), the CUDA warp.

// Orders the shared-memory accesses of the calling warp's 32 lanes and
// reconverges them (every lane of the warp calls it).
__device__ __forceinline__ void sync_warp() { __syncwarp(); }

// The E4M3FN (E5M2 when e5m2) codes of two finite f32 as
// (code(hi) << 8) | code(lo), rounded to nearest even and saturated at the
// format's largest finite value: Hopper's cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32,
// one instruction for what `encode` (the portable one-value encoder, which
// HIP runs instead) does in about ten.
template <bool e5m2, class Encode>
__device__ __forceinline__ unsigned int fp8x2_rne_satfinite(float hi, float lo, Encode) {
    unsigned short d;
    if (e5m2) {
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
    }
    return d;
}
