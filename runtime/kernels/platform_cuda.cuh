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
