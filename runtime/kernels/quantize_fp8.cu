// FP8 tensorwise dynamic ("current") scaling (SPEC section 3; CPU reference:
// runtime/src/quant/fp8.rs). Three launches, all stream-ordered, no host sync:
//   fp8_amax         state.amax  = max |x| bits over the tensor (atomicMax)
//   fp8_scale        state.scale = fl32(fmt_max / max(amax, 1e-12)) in f64,
//                    state.scale_inv = fl32(1 / scale)
//   fp8_cast_<fmt>   codes[i] = satfinite(RNE(fl32(x[i] * scale)))
//
// The state is a small device buffer of u32 words, one 16-byte slot each so
// that a GEMM can take &scale_inv as its per-tensor scale pointer:
//   word FP8_AMAX       amax bits (zeroed before fp8_amax)
//   word FP8_SCALE      scale (f32 bits)
//   word FP8_SCALE_INV  scale_inv (f32 bits)

#define FP8_AMAX 0
#define FP8_SCALE 4
#define FP8_SCALE_INV 8
// Threads per CTA of the amax reduction (a power of two).
#define AMAX_THREADS 256
// Elements per thread of the cast: one 16-byte load and one u32 store.
#define CAST_VEC 4

// Four floats loaded as one 16-byte access (own type: NVRTC and hiprtc need
// no vector_types header for it).
struct alignas(16) F32x4 {
    float v[4];
};

// Block-wide max of |x| bits through shared memory, then one atomicMax per CTA.
// The integer max of the absolute-value bits is NaN-aware: NaN > Inf > finite.
extern "C" __global__ void __launch_bounds__(AMAX_THREADS) fp8_amax(const float* x, u64 n, u32* state) {
    __shared__ u32 red[AMAX_THREADS];
    u32 m = 0u;
    for (u64 i = (u64)blockIdx.x * AMAX_THREADS + threadIdx.x; i < n; i += (u64)gridDim.x * AMAX_THREADS) {
        const u32 a = f2u(x[i]) & 0x7FFFFFFFu;
        m = a > m ? a : m;
    }
    red[threadIdx.x] = m;
    __syncthreads();
    for (u32 s = AMAX_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const u32 o = red[threadIdx.x + s];
            if (o > red[threadIdx.x]) red[threadIdx.x] = o;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicMax(&state[FP8_AMAX], red[0]);
}

// torchao's amax_to_scale: the f64 quotient rounded once to f32; with pow2
// rounded down to a power of two. One thread.
extern "C" __global__ void fp8_scale(u32* state, float fmt_max, int pow2) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const u32 amax_bits = state[FP8_AMAX];
    float s;
    if (is_nan_bits(amax_bits)) {
        s = u2f(F32_QNAN_BITS);
    } else {
        double a = (double)u2f(amax_bits);
        a = a > 1e-12 ? a : 1e-12;
        s = (float)((double)fmt_max / a);
        if (pow2 && (f2u(s) & 0x7F800000u) != 0x7F800000u) s = u2f(f2u(s) & 0xFF800000u);
    }
    state[FP8_SCALE] = f2u(s);
    state[FP8_SCALE_INV] = f2u(1.0f / s);
}

template <class F>
__device__ __forceinline__ void fp8_cast(const float* x, const u32* state, u8* codes, u64 n) {
    const float s = u2f(state[FP8_SCALE]);
    const u64 i0 = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * CAST_VEC;
    if (i0 >= n) return;
    if (i0 + CAST_VEC <= n) {
        const F32x4 v = *(const F32x4*)(x + i0);
        *(u32*)(codes + i0) = encode_rne<F>(v.v[0] * s) | (encode_rne<F>(v.v[1] * s) << 8) |
                              (encode_rne<F>(v.v[2] * s) << 16) | (encode_rne<F>(v.v[3] * s) << 24);
    } else {
        for (u64 i = i0; i < n; ++i) codes[i] = (u8)encode_rne<F>(x[i] * s);
    }
}

// decode(code) * scale_inv (Fp8Tensor::dequantize), to f32 or BF16.
template <class F>
__device__ __forceinline__ void fp8_dequantize(const u8* codes, const u32* state, float* out_f32,
                                               u16* out_bf16, u64 n) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = decode<F>(codes[i]) * u2f(state[FP8_SCALE_INV]);
    if (out_bf16) {
        out_bf16[i] = bf16_from_f32(v);
    } else {
        out_f32[i] = v;
    }
}

#define FP8_KERNELS(SUFFIX, FMT)                                                                          \
    extern "C" __global__ void fp8_cast_##SUFFIX(const float* x, const u32* state, u8* codes, u64 n) {    \
        fp8_cast<FMT>(x, state, codes, n);                                                                \
    }                                                                                                     \
    extern "C" __global__ void fp8_dequantize_##SUFFIX(const u8* codes, const u32* state, float* out_f32, \
                                                       u16* out_bf16, u64 n) {                            \
        fp8_dequantize<FMT>(codes, state, out_f32, out_bf16, n);                                          \
    }

FP8_KERNELS(e4m3fn, E4M3FN)
FP8_KERNELS(e5m2, E5M2)
FP8_KERNELS(e4m3fnuz, E4M3FNUZ)
FP8_KERNELS(e5m2fnuz, E5M2FNUZ)
