// AdamW and the gradient norm on device buffers (runtime/src/cuda/adamw.rs).
// CPU reference: the `update` function of runtime/src/cpu/adamw.rs, element
// by element:
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
//
// Two launch shapes share the one element update (adamw_elem):
// - adamw_w*_g*: one parameter per launch, a grid-stride loop;
// - adamw_multi: every parameter of a step in one launch. The host uploads
//   a table of AdamWTensor (pointers, size, scalars, and optionally a
//   gradient multiplier, the clip factor: g * mul + 0 rounded to the
//   gradient's dtype, grad_scale's operations, so the bits of scaling the
//   gradients first); the parameters are cut
//   into chunks of MT_CHUNK elements, numbered across the table, and each
//   CTA takes chunks c = blockIdx.x, blockIdx.x + gridDim.x, ... and finds
//   the parameter of chunk c by binary search over chunk_begin. Elements are
//   independent, so the bits are those of the per-parameter launches.
// The gradient norm's kernels use the same chunking over a GradTensor table:
// grad_sumsq_partial writes one f64 partial sum of squares per chunk (each
// thread adds its elements in order, then a fixed shared-memory tree),
// grad_sumsq_final adds the partials in a fixed order in one CTA, so the sum
// is deterministic; grad_scale multiplies every gradient as ops_affine does.

#define ADAMW_THREADS 256
// Elements per chunk of a multi-tensor launch (MT_CHUNK in adamw.rs).
#define MT_CHUNK 32768
// Threads per CTA of the multi-tensor kernels (MT_THREADS in adamw.rs).
#define MT_THREADS 256

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

// g of element i as the update reads it: when scaled, g * mul + 0 rounded
// to G (grad_scale's operations, so the bits of scaling first).
__device__ __forceinline__ float adamw_round(const float*, float x) { return x; }
__device__ __forceinline__ float adamw_round(const u16*, float x) { return u2f(((u32)bf16_from_f32(x)) << 16); }
template <bool SCALED, typename G>
__device__ __forceinline__ float adamw_grad(const G* g, u64 i, float mul) {
    const float gi = adamw_ld(g, i);
    if constexpr (SCALED) {
        return adamw_round(g, gi * mul + 0.0f);
    } else {
        return gi;
    }
}

// The update of one element from its loaded values: the new weight, with m
// and v updated in place.
__device__ __forceinline__ float adamw_math(float w, float gi, float& m, float& v, const AdamWScalars& s) {
    w = w * s.decay;
    m = s.b1 * m + s.one_minus_b1 * gi;
    v = s.b2 * v + s.one_minus_b2 * gi * gi;
    return w - s.step_size * m / (sqrtf(v) / s.bias2_sqrt + s.eps);
}

// Element i of one parameter's update, with the gradient element gi.
template <typename W>
__device__ __forceinline__ void adamw_elem_g(const W* w_in, W* w_out, float gi, float* m, float* v, u64 i,
                                             const AdamWScalars& s) {
    float mi = m[i], vi = v[i];
    const float w = adamw_math(adamw_ld(w_in, i), gi, mi, vi, s);
    m[i] = mi;
    v[i] = vi;
    adamw_st(w_out, i, w);
}

// Element i of one parameter's update.
template <typename W, typename G>
__device__ __forceinline__ void adamw_elem(const W* w_in, W* w_out, const G* g, float* m, float* v,
                                           u64 i, const AdamWScalars& s) {
    adamw_elem_g(w_in, w_out, adamw_ld(g, i), m, v, i, s);
}

template <typename W, typename G>
__device__ __forceinline__ void adamw_body(const W* w_in, W* w_out, const G* g, float* m, float* v,
                                           u64 n, const AdamWScalars& s) {
    const u64 stride = (u64)gridDim.x * (u64)blockDim.x;
    for (u64 i = (u64)blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += stride) {
        adamw_elem(w_in, w_out, g, m, v, i, s);
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

// ---------------------------------------------------------------------------
// Multi-tensor launches.

// One parameter of adamw_multi (struct AdamWTensor in adamw.rs, 96 bytes).
struct AdamWTensor {
    u64 w_in;
    u64 w_out;
    u64 g;
    u64 m;
    u64 v;
    u64 n;            // elements, at least 1
    u64 chunk_begin;  // number of the parameter's first chunk in the launch
    u32 kind;         // bit 0: the parameter is BF16; bit 1: the gradient is BF16;
                      // bit 2: the gradient is scaled by the f32 whose bits are pad
    u32 pad;
    AdamWScalars s;
};

// One gradient of the norm and scale kernels (struct GradTensor in adamw.rs, 40 bytes).
struct GradTensor {
    u64 src;
    u64 dst;          // grad_scale's output (unused by the sums)
    u64 n;            // elements, at least 1
    u64 chunk_begin;
    u32 bf16;         // 1: BF16 elements, 0: f32
    u32 pad;
};

// The entry of `ts` (count >= 1, chunk_begin ascending from 0) holding chunk c.
template <typename T>
__device__ __forceinline__ u64 mt_find(const T* ts, u64 count, u64 c) {
    u64 lo = 0, hi = count - 1;
    while (lo < hi) {
        const u64 mid = (lo + hi + 1) >> 1;
        if (ts[mid].chunk_begin <= c) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

__device__ __forceinline__ u64 mt_end(u64 begin, u64 n) {
    const u64 end = begin + MT_CHUNK;
    return end < n ? end : n;
}

template <bool SCALED, typename W, typename G>
__device__ __forceinline__ void adamw_chunk(const AdamWTensor& t, u64 begin, u64 end) {
    const W* w_in = (const W*)t.w_in;
    W* w_out = (W*)t.w_out;
    const G* g = (const G*)t.g;
    float* m = (float*)t.m;
    float* v = (float*)t.v;
    const float mul = u2f(t.pad);
    const u64 step = blockDim.x;
    u64 i = begin + threadIdx.x;
    // Elements i and j = i + step together: all eight loads before any
    // store, so a thread has twice the loads in flight (the loop is bound
    // by memory latency). Elements are independent: the same bits.
    for (; i + step < end; i += 2 * step) {
        const u64 j = i + step;
        const float gi = adamw_grad<SCALED>(g, i, mul), gj = adamw_grad<SCALED>(g, j, mul);
        const float wi = adamw_ld(w_in, i), wj = adamw_ld(w_in, j);
        float mi = m[i], mj = m[j], vi = v[i], vj = v[j];
        const float oi = adamw_math(wi, gi, mi, vi, t.s), oj = adamw_math(wj, gj, mj, vj, t.s);
        m[i] = mi;
        m[j] = mj;
        v[i] = vi;
        v[j] = vj;
        adamw_st(w_out, i, oi);
        adamw_st(w_out, j, oj);
    }
    if (i < end) adamw_elem_g(w_in, w_out, adamw_grad<SCALED>(g, i, mul), m, v, i, t.s);
}

extern "C" __global__ void adamw_multi(const AdamWTensor* ts, u64 count, u64 chunks) {
    for (u64 c = blockIdx.x; c < chunks; c += gridDim.x) {
        const AdamWTensor t = ts[mt_find(ts, count, c)];
        const u64 begin = (c - t.chunk_begin) * MT_CHUNK;
        const u64 end = mt_end(begin, t.n);
        switch (t.kind) {
            case 0: adamw_chunk<false, float, float>(t, begin, end); break;
            case 1: adamw_chunk<false, u16, float>(t, begin, end); break;
            case 2: adamw_chunk<false, float, u16>(t, begin, end); break;
            case 3: adamw_chunk<false, u16, u16>(t, begin, end); break;
            case 4: adamw_chunk<true, float, float>(t, begin, end); break;
            case 5: adamw_chunk<true, u16, float>(t, begin, end); break;
            case 6: adamw_chunk<true, float, u16>(t, begin, end); break;
            default: adamw_chunk<true, u16, u16>(t, begin, end); break;
        }
    }
}

// The sum of red[0..MT_THREADS) into red[0], in a fixed tree; every thread
// of the CTA calls it after writing its red[threadIdx.x].
__device__ __forceinline__ void mt_tree_sum(double* red) {
    __syncthreads();
    for (u32 half = MT_THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) red[threadIdx.x] += red[threadIdx.x + half];
        __syncthreads();
    }
}

// A thread's sum of squares over elements begin + threadIdx.x + k blockDim.x,
// in order of k. Four loads at a time (the loop is bound by memory latency),
// added in the same order as one at a time.
template <typename G>
__device__ __forceinline__ double sumsq_chunk(const G* g, u64 begin, u64 end) {
    double acc = 0.0;
    const u64 step = blockDim.x;
    u64 i = begin + threadIdx.x;
    for (; i + 3 * step < end; i += 4 * step) {
        double x[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) x[k] = (double)adamw_ld(g, i + k * step);
#pragma unroll
        for (int k = 0; k < 4; ++k) acc += x[k] * x[k];  // exact: an f32 square fits an f64
    }
    for (; i < end; i += step) {
        const double x = (double)adamw_ld(g, i);
        acc += x * x;
    }
    return acc;
}

// partial[c] = the f64 sum of the squares of chunk c's elements.
extern "C" __global__ void grad_sumsq_partial(const GradTensor* ts, u64 count, u64 chunks,
                                              double* partial) {
    __shared__ double red[MT_THREADS];
    for (u64 c = blockIdx.x; c < chunks; c += gridDim.x) {
        const GradTensor t = ts[mt_find(ts, count, c)];
        const u64 begin = (c - t.chunk_begin) * MT_CHUNK;
        const u64 end = mt_end(begin, t.n);
        red[threadIdx.x] = t.bf16 ? sumsq_chunk((const u16*)t.src, begin, end)
                                  : sumsq_chunk((const float*)t.src, begin, end);
        mt_tree_sum(red);
        if (threadIdx.x == 0) partial[c] = red[0];
        __syncthreads();  // red is written again for the next chunk
    }
}

// out[0] = the sum of partial[0..chunks), in a fixed order (one CTA).
extern "C" __global__ void grad_sumsq_final(const double* partial, u64 chunks, double* out) {
    __shared__ double red[MT_THREADS];
    double acc = 0.0;
    for (u64 i = threadIdx.x; i < chunks; i += blockDim.x) acc += partial[i];
    red[threadIdx.x] = acc;
    mt_tree_sum(red);
    if (threadIdx.x == 0) out[0] = red[0];
}

template <typename G>
__device__ __forceinline__ void scale_chunk(const GradTensor& t, u64 begin, u64 end, float mul, float add) {
    const G* src = (const G*)t.src;
    G* dst = (G*)t.dst;
    for (u64 i = begin + threadIdx.x; i < end; i += blockDim.x) {
        adamw_st(dst, i, adamw_ld(src, i) * mul + add);  // ops_affine's two roundings
    }
}

// dst = src * mul + add for every gradient of the table, in its dtype.
extern "C" __global__ void grad_scale(const GradTensor* ts, u64 count, u64 chunks, float mul, float add) {
    for (u64 c = blockIdx.x; c < chunks; c += gridDim.x) {
        const GradTensor t = ts[mt_find(ts, count, c)];
        const u64 begin = (c - t.chunk_begin) * MT_CHUNK;
        const u64 end = mt_end(begin, t.n);
        if (t.bf16) {
            scale_chunk<u16>(t, begin, end, mul, add);
        } else {
            scale_chunk<float>(t, begin, end, mul, add);
        }
    }
}
