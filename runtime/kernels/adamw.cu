// AdamW on device buffers (runtime/src/cuda/adamw.rs). CPU reference: the
// `update` function of runtime/src/optim.rs, element by element:
//
//   w *= decay;
//   m = b1 * m + (1 - b1) * g;
//   v = b2 * v + (1 - b2) * g * g;        // ((1 - b2) * g) * g
//   w -= step_size * m / (sqrt(v) / bias2_sqrt + eps);
//
// Same f32 operations in the same order: the host compiles with
// --fmad=false (Rust never contracts a * b + c into an FMA either),
// --prec-div=true, --prec-sqrt=true and --ftz=false, so every step is the
// IEEE-rounded result the CPU computes. The scalar factors (decay,
// step_size, bias2_sqrt, 1 - b1, 1 - b2) come from the host, computed as the
// CPU computes them. A BF16 parameter or gradient is widened exactly and the
// parameter rounded back RNE (bf16_from_f32), as Tensor::to_dtype does.
// Moments are f32 and updated in place; the parameter is written to
// `w_out`, which may be `w_in`. Plain C++ in the CUDA / HIP common subset.

#define ADAMW_THREADS 256

__device__ __forceinline__ float adamw_ld(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ float adamw_ld(const u16* p, u64 i) { return u2f(((u32)p[i]) << 16); }
__device__ __forceinline__ void adamw_st(float* p, u64 i, float x) { p[i] = x; }
__device__ __forceinline__ void adamw_st(u16* p, u64 i, float x) { p[i] = bf16_from_f32(x); }

struct AdamWScalars {
    float decay;
    float b1;
    float one_minus_b1;
    float b2;
    float one_minus_b2;
    float step_size;
    float bias2_sqrt;
    float eps;
};

template <typename W, typename G>
__device__ __forceinline__ void adamw_body(const W* w_in, W* w_out, const G* g, float* m, float* v,
                                           u64 n, const AdamWScalars& s) {
    const u64 stride = (u64)gridDim.x * (u64)blockDim.x;
    for (u64 i = (u64)blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += stride) {
        const float gi = adamw_ld(g, i);
        float w = adamw_ld(w_in, i);
        w = w * s.decay;
        const float mi = s.b1 * m[i] + s.one_minus_b1 * gi;
        const float vi = s.b2 * v[i] + s.one_minus_b2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        w = w - s.step_size * mi / (sqrtf(vi) / s.bias2_sqrt + s.eps);
        adamw_st(w_out, i, w);
    }
}

extern "C" __global__ void adamw_w32_g32(const float* w_in, float* w_out, const float* g, float* m,
                                         float* v, u64 n, AdamWScalars s) {
    adamw_body(w_in, w_out, g, m, v, n, s);
}
extern "C" __global__ void adamw_w32_g16(const float* w_in, float* w_out, const u16* g, float* m,
                                         float* v, u64 n, AdamWScalars s) {
    adamw_body(w_in, w_out, g, m, v, n, s);
}
extern "C" __global__ void adamw_w16_g32(const u16* w_in, u16* w_out, const float* g, float* m,
                                         float* v, u64 n, AdamWScalars s) {
    adamw_body(w_in, w_out, g, m, v, n, s);
}
extern "C" __global__ void adamw_w16_g16(const u16* w_in, u16* w_out, const u16* g, float* m,
                                         float* v, u64 n, AdamWScalars s) {
    adamw_body(w_in, w_out, g, m, v, n, s);
}
