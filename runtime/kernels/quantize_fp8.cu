// FP8 tensorwise dynamic ("current") scaling (SPEC section 3; CPU reference:
// runtime/src/quant/fp8.rs). Three launches, all stream-ordered, no host sync:
//   fp8_amax_<in>       one partial max |x| (bits) per CTA, a grid-stride loop
//                       of 16-byte loads over a grid of a few CTAs per SM
//   fp8_scale           state.amax = max of the partials,
//                       state.scale = fl32(fmt_max / max(amax, 1e-12)) in f64,
//                       state.scale_inv = fl32(1 / scale)
//   fp8_cast_<fmt>_<in>     codes[i] = satfinite(RNE(fl32(x[i] * scale)))
//   fp8_cast_2d_<fmt>_<in>  the same for a [rows, cols] matrix, writing the
//                           codes zero-padded to [rows_pad, cols_pad] and/or
//                           transposed to [cols_pad, rows_pad]
// The input is f32 or BF16 (InF32 / InBF16 in common.cuh).
//
// The state is a small device buffer of u32 words, one 16-byte slot each so
// that a GEMM can take &scale_inv as its per-tensor scale pointer, then the
// partials (written before they are read, so the buffer needs no zeroing):
//   word FP8_AMAX       amax bits
//   word FP8_SCALE      scale (f32 bits)
//   word FP8_SCALE_INV  scale_inv (f32 bits)
//   words FP8_PARTIALS.. one amax per CTA of fp8_amax

#define FP8_AMAX 0
#define FP8_SCALE 4
#define FP8_SCALE_INV 8
#define FP8_PARTIALS 12
// Threads per CTA of the amax and scale reductions (a power of two).
#define AMAX_THREADS 256
// 16-byte loads each thread has in flight per step of the amax loop.
#define AMAX_UNROLL 4
// Threads per CTA of the casts.
#define CAST_THREADS 256
// Elements per thread of the 1-D cast: 16 codes, one 16-byte store.
#define CAST_ELEMS 16
// Side of the square tile of the 2-D cast (CAST_THREADS = TILE * TILE / 16).
#define TILE 64

// Max of the |x| bits of a loaded vector and m. The integer max of the
// absolute-value bits is NaN-aware: NaN > Inf > finite.
template <class In>
__device__ __forceinline__ u32 abs_max_vec(const Vec16& q, u32 m) {
#pragma unroll
    for (int k = 0; k < In::VEC; ++k) {
        const u32 a = f2u(In::elem(q, k)) & 0x7FFFFFFFu;
        m = a > m ? a : m;
    }
    return m;
}

// Max over the CTA of each thread's m, through shared memory; valid in thread 0.
__device__ __forceinline__ u32 cta_max(u32 m) {
    __shared__ u32 red[AMAX_THREADS];
    red[threadIdx.x] = m;
    __syncthreads();
#pragma unroll
    for (u32 s = AMAX_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const u32 o = red[threadIdx.x + s];
            if (o > red[threadIdx.x]) red[threadIdx.x] = o;
        }
        __syncthreads();
    }
    return red[0];
}

// One partial max per CTA. The n % VEC tail (fewer than 8 elements) goes to
// the first threads of CTA 0.
template <class In>
__device__ __forceinline__ void fp8_amax(const void* __restrict__ x, u64 n, u32* __restrict__ state) {
    const u64 nvec = n / In::VEC;
    const u64 stride = (u64)gridDim.x * AMAX_THREADS;
    const u64 t = (u64)blockIdx.x * AMAX_THREADS + threadIdx.x;
    u32 m = 0u;
    u64 i = t;
    for (; i + (AMAX_UNROLL - 1) * stride < nvec; i += AMAX_UNROLL * stride) {
        Vec16 q[AMAX_UNROLL];
#pragma unroll
        for (int u = 0; u < AMAX_UNROLL; ++u) q[u] = In::load_vec(x, (i + u * stride) * In::VEC);
#pragma unroll
        for (int u = 0; u < AMAX_UNROLL; ++u) m = abs_max_vec<In>(q[u], m);
    }
    for (; i < nvec; i += stride) m = abs_max_vec<In>(In::load_vec(x, i * In::VEC), m);
    if (nvec * In::VEC + t < n) {
        const u32 a = f2u(In::load(x, nvec * In::VEC + t)) & 0x7FFFFFFFu;
        m = a > m ? a : m;
    }
    m = cta_max(m);
    if (threadIdx.x == 0) state[FP8_PARTIALS + blockIdx.x] = m;
}

// torchao's amax_to_scale: the f64 quotient rounded once to f32; with pow2
// rounded down to a power of two. One CTA of AMAX_THREADS.
extern "C" __global__ void __launch_bounds__(AMAX_THREADS)
    fp8_scale(u32* state, u32 nparts, float fmt_max, int pow2) {
    u32 m = 0u;
    for (u32 j = threadIdx.x; j < nparts; j += AMAX_THREADS) {
        const u32 a = state[FP8_PARTIALS + j];
        m = a > m ? a : m;
    }
    m = cta_max(m);
    if (threadIdx.x != 0) return;
    const float s = fp8_amax_to_scale(m, fmt_max, pow2);
    state[FP8_AMAX] = m;
    state[FP8_SCALE] = f2u(s);
    state[FP8_SCALE_INV] = f2u(1.0f / s);
}

// Encodes n scaled values and packs them four codes per word. FINITE: the
// tensor's amax is finite, so every x is finite and no product is NaN, and
// the fast encoder gives encode_rne's bits. Otherwise (an amax that
// check_finite reports as an error) the codes still follow encode_rne.
template <class F, bool FINITE, int N>
__device__ __forceinline__ void encode_pack(float* q, u32* w) {
    if (FINITE) {
        encode_pack_finite<F, N>(q, w);
    } else {
        u32 c[N];
#pragma unroll
        for (int i = 0; i < N; ++i) c[i] = encode_rne<F>(q[i]);
        pack_codes<F, N>(c, w);
    }
}

// Whether the amax in the state is finite (see encode_pack).
__device__ __forceinline__ bool amax_finite(const u32* state) { return state[FP8_AMAX] < 0x7F800000u; }

// 1-D cast: each thread encodes 16 consecutive elements and writes them as
// one 16-byte store; the last partial group goes element by element.
template <class F, class In, bool FINITE>
__device__ __forceinline__ void fp8_cast_run(const void* __restrict__ x, float s, u8* __restrict__ codes,
                                             u64 n) {
    const u64 i0 = ((u64)blockIdx.x * CAST_THREADS + threadIdx.x) * CAST_ELEMS;
    if (i0 + CAST_ELEMS <= n) {
        constexpr int NV = CAST_ELEMS / In::VEC;
        Vec16 in[NV];
#pragma unroll
        for (int k = 0; k < NV; ++k) in[k] = In::load_vec(x, i0 + k * In::VEC);
        float q[CAST_ELEMS];
#pragma unroll
        for (int k = 0; k < NV; ++k) {
#pragma unroll
            for (int i = 0; i < In::VEC; ++i) q[k * In::VEC + i] = In::elem(in[k], i) * s;
        }
        Vec16 out;
        encode_pack<F, FINITE, CAST_ELEMS>(q, out.w);
        *(Vec16*)(codes + i0) = out;
    } else {
        for (u64 i = i0; i < n; ++i) codes[i] = (u8)encode_rne<F>(In::load(x, i) * s);
    }
}

template <class F, class In>
__device__ __forceinline__ void fp8_cast(const void* __restrict__ x, const u32* __restrict__ state,
                                         u8* __restrict__ codes, u64 n) {
    const float s = u2f(state[FP8_SCALE]);
    if (amax_finite(state)) {
        fp8_cast_run<F, In, true>(x, s, codes, n);
    } else {
        fp8_cast_run<F, In, false>(x, s, codes, n);
    }
}

// 2-D cast of a row-major [rows, cols] input, one CTA per TILE x TILE tile
// of the padded [rows_pad, cols_pad] codes (tile t: row t / tiles_x, column
// t % tiles_x). Thread (tr, 16 columns from tc) reads 16 consecutive
// elements of one row (a warp covers 32 rows, each with whole sectors),
// encodes them, and
//   - codes:   writes them as one 16-byte store (if cols_pad % 16 == 0);
//   - codes_t: puts them into the transposed tile in shared memory; after
//     the barrier thread (column oc, 16 rows from orow) writes 16 bytes of
//     row oc of the transposed tile, so a warp writes 8 rows of 64 bytes.
// Padding (row >= rows or column >= cols) gets the zero code. Either output
// pointer may be null.
template <class F, class In, bool FINITE>
__device__ __forceinline__ void fp8_cast_2d_run(const void* __restrict__ x, float s, u8* __restrict__ codes,
                                                u8* __restrict__ codes_t, u32 rows, u32 cols, u32 rows_pad,
                                                u32 cols_pad, u8 (*tt)[TILE]) {
    const u32 tiles_x = (cols_pad + TILE - 1) / TILE;
    const u32 r0 = blockIdx.x / tiles_x * TILE;
    const u32 c0 = blockIdx.x % tiles_x * TILE;
    const u32 tr = threadIdx.x % TILE;
    const u32 tc = threadIdx.x / TILE * 16;
    const u32 r = r0 + tr;
    const u32 c = c0 + tc;

    float q[16];
    if (r < rows && cols % In::VEC == 0 && c + 16 <= cols) {
        constexpr int NV = 16 / In::VEC;
        Vec16 in[NV];
#pragma unroll
        for (int k = 0; k < NV; ++k) in[k] = In::load_vec(x, (u64)r * cols + c + k * In::VEC);
#pragma unroll
        for (int k = 0; k < NV; ++k) {
#pragma unroll
            for (int i = 0; i < In::VEC; ++i) q[k * In::VEC + i] = In::elem(in[k], i) * s;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) q[i] = r < rows && c + i < cols ? In::load(x, (u64)r * cols + c + i) * s : 0.0f;
    }
    Vec16 w;
    encode_pack<F, FINITE, 16>(q, w.w);
    // Padding is the zero code whatever the scale (0 * NaN would not be).
    if (r >= rows || c + 16 > cols) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            if (r >= rows || c + i >= cols) w.w[i / 4] &= ~(0xFFu << (8 * (i % 4)));
        }
    }

    if (codes != nullptr && r < rows_pad && c < cols_pad) {
        u8* out = codes + (u64)r * cols_pad + c;
        if (cols_pad % 16 == 0) {
            *(Vec16*)out = w;
        } else {
            for (u32 i = 0; i < 16 && c + i < cols_pad; ++i) out[i] = (u8)(w.w[i / 4] >> (8 * (i % 4)));
        }
    }
    if (codes_t == nullptr) return;
#pragma unroll
    for (int i = 0; i < 16; ++i) tt[tc + i][tr] = (u8)(w.w[i / 4] >> (8 * (i % 4)));
    __syncthreads();
    const u32 oc = threadIdx.x / 4;
    const u32 orow = threadIdx.x % 4 * 16;
    if (c0 + oc < cols_pad && r0 + orow < rows_pad) {
        u8* out = codes_t + (u64)(c0 + oc) * rows_pad + r0 + orow;
        if (rows_pad % 16 == 0) {
            *(Vec16*)out = *(const Vec16*)&tt[oc][orow];
        } else {
            for (u32 i = 0; i < 16 && r0 + orow + i < rows_pad; ++i) out[i] = tt[oc][orow + i];
        }
    }
}

template <class F, class In>
__device__ __forceinline__ void fp8_cast_2d(const void* __restrict__ x, const u32* __restrict__ state,
                                            u8* __restrict__ codes, u8* __restrict__ codes_t, u32 rows,
                                            u32 cols, u32 rows_pad, u32 cols_pad) {
    // The tile transposed, tt[column][row]: 64-byte rows, so the byte stores
    // of a warp (32 consecutive rows of one column) and the 16-byte reads
    // hit distinct banks.
    alignas(16) __shared__ u8 tt[TILE][TILE];
    const float s = u2f(state[FP8_SCALE]);
    if (amax_finite(state)) {
        fp8_cast_2d_run<F, In, true>(x, s, codes, codes_t, rows, cols, rows_pad, cols_pad, tt);
    } else {
        fp8_cast_2d_run<F, In, false>(x, s, codes, codes_t, rows, cols, rows_pad, cols_pad, tt);
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

#define FP8_AMAX_KERNEL(SUFFIX, IN)                                                                        \
    extern "C" __global__ void __launch_bounds__(AMAX_THREADS)                                           \
        fp8_amax_##SUFFIX(const void* x, u64 n, u32* state) {                                            \
        fp8_amax<IN>(x, n, state);                                                                       \
    }

FP8_AMAX_KERNEL(f32, InF32)
FP8_AMAX_KERNEL(bf16, InBF16)

#define FP8_CAST_KERNELS(SUFFIX, FMT, IN)                                                                  \
    extern "C" __global__ void __launch_bounds__(CAST_THREADS)                                            \
        fp8_cast_##SUFFIX(const void* x, const u32* state, u8* codes, u64 n) {                            \
        fp8_cast<FMT, IN>(x, state, codes, n);                                                            \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(CAST_THREADS)                                            \
        fp8_cast_2d_##SUFFIX(const void* x, const u32* state, u8* codes, u8* codes_t, u32 rows, u32 cols, \
                             u32 rows_pad, u32 cols_pad) {                                                \
        fp8_cast_2d<FMT, IN>(x, state, codes, codes_t, rows, cols, rows_pad, cols_pad);                   \
    }

#define FP8_KERNELS(SUFFIX, FMT)                                                                          \
    FP8_CAST_KERNELS(SUFFIX##_f32, FMT, InF32)                                                            \
    FP8_CAST_KERNELS(SUFFIX##_bf16, FMT, InBF16)                                                          \
    extern "C" __global__ void fp8_dequantize_##SUFFIX(const u8* codes, const u32* state, float* out_f32, \
                                                       u16* out_bf16, u64 n) {                            \
        fp8_dequantize<FMT>(codes, state, out_f32, out_bf16, n);                                          \
    }

FP8_KERNELS(e4m3fn, E4M3FN)
FP8_KERNELS(e5m2, E5M2)
FP8_KERNELS(e4m3fnuz, E4M3FNUZ)
FP8_KERNELS(e5m2fnuz, E5M2FNUZ)
