// Element-wise tensor ops of the CUDA backend (runtime/src/cuda/storage.rs):
// strided gather / placement (copy_strided, concat), dtype casts, unary,
// affine and binary maps. CPU references: runtime/src/cpu/mod.rs,
// runtime/src/cpu/strided.rs and the scalar formulas of runtime/src/op.rs.
//
// Floats compute in f32; BF16 is widened exactly and rounded back RNE with
// bf16_from_f32 (common.cuh), as the CPU does. The host compiles with
// --fmad=false, --prec-div=true and --prec-sqrt=true, so +, -, *, / and sqrt
// give the CPU's bits; expf, logf and tanhf are within 2 ulp of libm.
// Plain C++ in the common subset of CUDA and HIP (no warp intrinsics).
//
// Each map has a generic kernel (any strided view, index arithmetic per
// element or per run) and a vector kernel `*_vec` that the host picks when
// every operand's innermost coalesced dim is packed (stride 1) or broadcast
// (stride 0), the innermost dim is a multiple of VEC (or the view is one
// run) and every packed operand is 16-byte aligned at each VEC-element
// group: a thread then moves VEC consecutive elements with 16-byte accesses
// and places its group once. The per-element math is the same expression,
// so both kernels give the same bits.

// Most dims of a strided view after coalescing (OPS_MAX_RANK in storage.rs).
#define OPS_MAX_RANK 6
#define OPS_THREADS 256

// A strided view: element i (row-major over dims) sits at
// offset + sum_d idx_d * strides[d]. Same layout as `Strided` in storage.rs.
struct Strided {
    u64 dims[OPS_MAX_RANK];
    u64 strides[OPS_MAX_RANK];
    u64 offset;
    u64 rank;
    // dims[rank - 1] and strides[rank - 1] (1 and 0 for rank 0), so that no
    // kernel indexes the arrays by a run-time value (which puts the struct
    // in local memory, copied by every thread).
    u64 inner;
    u64 inner_stride;
};

// Element i of a view. The loops run over the fixed OPS_MAX_RANK with a
// rank guard, so the dims and strides are read straight from the kernel
// parameters (a loop bounded by `rank` made the compiler copy both structs
// to local memory in every thread). Below 2^32 elements the index is split
// with 32-bit divisions, several times cheaper than 64-bit ones.
__device__ __forceinline__ u64 strided_at_wide(const Strided& s, u64 i) {
    u64 pos = s.offset;
#pragma unroll
    for (int d = OPS_MAX_RANK - 1; d >= 0; --d) {
        if (d < (int)s.rank) {
            const u64 dim = s.dims[d];
            pos += (i % dim) * s.strides[d];
            i /= dim;
        }
    }
    return pos;
}

__device__ __forceinline__ u64 strided_at(const Strided& s, u64 i) {
    if (s.rank <= 1) return s.offset + i * s.inner_stride;
    if (i > 0xFFFFFFFFull) return strided_at_wide(s, i);
    u64 pos = s.offset;
    u32 j = (u32)i;
#pragma unroll
    for (int d = OPS_MAX_RANK - 1; d >= 0; --d) {
        if (d < (int)s.rank) {
            const u32 dim = (u32)s.dims[d];
            const u32 q = j / dim;
            pos += (u64)(j - q * dim) * s.strides[d];
            j = q;
        }
    }
    return pos;
}

__device__ __forceinline__ float ld(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ float ld(const u16* p, u64 i) { return u2f(((u32)p[i]) << 16); }
__device__ __forceinline__ void st(float* p, u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void st(u16* p, u64 i, float v) { p[i] = bf16_from_f32(v); }

#define GRID_STRIDE(i, n) for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

// ---------------------------------------------------------------------------
// VEC consecutive elements as f32: one 16-byte access of BF16, two of f32
// (Vec16 from common.cuh). `pos` must be a multiple of VEC from a 16-byte
// aligned base (the host checks it before picking a vector kernel).

#define VEC 8

__device__ __forceinline__ void ld_vec(const float* p, u64 pos, float v[VEC]) {
    const Vec16 a = *(const Vec16*)(p + pos), b = *(const Vec16*)(p + pos + 4);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        v[k] = u2f(a.w[k]);
        v[4 + k] = u2f(b.w[k]);
    }
}
// Little endian: element 2k is the low half of word k.
__device__ __forceinline__ void ld_vec(const u16* p, u64 pos, float v[VEC]) {
    const Vec16 a = *(const Vec16*)(p + pos);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        v[2 * k] = u2f(a.w[k] << 16);
        v[2 * k + 1] = u2f(a.w[k] & 0xFFFF0000u);
    }
}
__device__ __forceinline__ void st_vec(float* p, u64 pos, const float v[VEC]) {
    Vec16 a, b;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        a.w[k] = f2u(v[k]);
        b.w[k] = f2u(v[4 + k]);
    }
    *(Vec16*)(p + pos) = a;
    *(Vec16*)(p + pos + 4) = b;
}
__device__ __forceinline__ void st_vec(u16* p, u64 pos, const float v[VEC]) {
    Vec16 a;
#pragma unroll
    for (int k = 0; k < 4; ++k) a.w[k] = (u32)bf16_from_f32(v[2 * k]) | ((u32)bf16_from_f32(v[2 * k + 1]) << 16);
    *(Vec16*)(p + pos) = a;
}

// The VEC elements of a view's group at `pos`: packed (stride 1) or one
// element repeated (stride 0, a broadcast along the innermost dim).
template <class T>
__device__ __forceinline__ void ld_group(const T* p, u64 pos, u64 stride, float v[VEC]) {
    if (stride == 1) {
        ld_vec(p, pos, v);
    } else {
        const float x = ld(p, pos);
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = x;
    }
}

// Calls f(i0, pa, pb, full) for each group of VEC consecutive elements
// i0.. of two views of one coalesced shape, pa and pb the group's first
// positions. `full` is false only for the last, shorter group of a one-run
// view (the host guarantees that the innermost dim is a multiple of VEC
// otherwise), which f handles element by element.
template <class F>
__device__ __forceinline__ void walk2_vec(const Strided& sa, const Strided& sb, u64 n, F f) {
    const u64 groups = (n + VEC - 1) / VEC;
    GRID_STRIDE(g, groups) {
        const u64 i0 = g * VEC;
        f(i0, strided_at(sa, i0), strided_at(sb, i0), i0 + VEC <= n);
    }
}

// ---------------------------------------------------------------------------
// Placement: packed element e of the view `s` goes to
// dst[(e / block) * row + at + e % block]. A plain gather is block = row = n,
// at = 0; concatenation places each part's blocks side by side in a row.

template <class T>
__device__ __forceinline__ void place(const T* src, T* dst, const Strided& s, u64 n, u64 block, u64 row, u64 at) {
    GRID_STRIDE(e, n) {
        dst[(e / block) * row + at + e % block] = src[strided_at(s, e)];
    }
}

extern "C" __global__ void ops_place_b4(const u32* src, u32* dst, Strided s, u64 n, u64 block, u64 row, u64 at) {
    place(src, dst, s, n, block, row, at);
}
extern "C" __global__ void ops_place_b2(const u16* src, u16* dst, Strided s, u64 n, u64 block, u64 row, u64 at) {
    place(src, dst, s, n, block, row, at);
}
extern "C" __global__ void ops_place_b1(const u8* src, u8* dst, Strided s, u64 n, u64 block, u64 row, u64 at) {
    place(src, dst, s, n, block, row, at);
}

// The same placement VEC elements at a time, for n, block, row and at
// multiples of VEC and a source packed along its innermost dim: a group
// stays inside one block and one source run, so it is one or two Vec16
// copies. 4- and 2-byte elements.
template <class T>
__device__ __forceinline__ void place_vec(const T* src, T* dst, const Strided& s, u64 n, u64 block, u64 row, u64 at) {
    constexpr int WORDS = VEC * sizeof(T) / 16;
    GRID_STRIDE(g, n / VEC) {
        const u64 e = g * VEC;
        const Vec16* from = (const Vec16*)(src + strided_at(s, e));
        Vec16* to = (Vec16*)(dst + (e / block) * row + at + e % block);
#pragma unroll
        for (int w = 0; w < WORDS; ++w) to[w] = from[w];
    }
}

extern "C" __global__ void ops_place_b4_vec(const u32* src, u32* dst, Strided s, u64 n, u64 block, u64 row, u64 at) {
    place_vec(src, dst, s, n, block, row, at);
}
extern "C" __global__ void ops_place_b2_vec(const u16* src, u16* dst, Strided s, u64 n, u64 block, u64 row, u64 at) {
    place_vec(src, dst, s, n, block, row, at);
}

// ---------------------------------------------------------------------------
// Casts (cpu/mod.rs f32_to_bf16 / bf16_to_f32).

extern "C" __global__ void ops_cast_f32_bf16(const float* src, u16* dst, Strided s, u64 n) {
    GRID_STRIDE(i, n) { dst[i] = bf16_from_f32(src[strided_at(s, i)]); }
}
extern "C" __global__ void ops_cast_bf16_f32(const u16* src, float* dst, Strided s, u64 n) {
    GRID_STRIDE(i, n) { dst[i] = ld(src, strided_at(s, i)); }
}

// y[i] = f(element i of x) for a view x and a packed y, VEC elements a
// thread (the vector path of the maps of one operand).
template <class T, class U, class F>
__device__ __forceinline__ void map_vec(const T* x, U* y, const Strided& s, u64 n, F f) {
    const u64 stride = s.inner_stride;
    walk2_vec(s, s, n, [=](u64 i0, u64 p, u64, bool full) {
        if (full) {
            float v[VEC];
            ld_group(x, p, stride, v);
#pragma unroll
            for (int k = 0; k < VEC; ++k) v[k] = f(v[k]);
            st_vec(y, i0, v);
        } else {
            for (u64 i = i0; i < n; ++i) st(y, i, f(ld(x, p + (i - i0) * stride)));
        }
    });
}

struct Identity { __device__ float operator()(float v) const { return v; } };

extern "C" __global__ void ops_cast_f32_bf16_vec(const float* src, u16* dst, Strided s, u64 n) {
    map_vec(src, dst, s, n, Identity());
}
extern "C" __global__ void ops_cast_bf16_f32_vec(const u16* src, float* dst, Strided s, u64 n) {
    map_vec(src, dst, s, n, Identity());
}

// ---------------------------------------------------------------------------
// Unary ops: UnaryOp::f32 in op.rs, operation for operation (f32 literals
// only, so nothing is promoted to double).

#define SQRT_2_OVER_PI 0.7978846f
#define GELU_CUBIC 0.044715f

// op.rs gelu_gate: sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).
__device__ __forceinline__ float gelu_gate(float x) {
    const float u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
    return 1.0f / (1.0f + expf(-2.0f * u));
}

// Order of UnaryOp (unary_code in storage.rs).
__device__ __forceinline__ float unary_f(int op, float x) {
    switch (op) {
    case 0: return expf(x);
    case 1: return logf(x);
    case 2: return sqrtf(x);
    case 3: return 1.0f / sqrtf(x);
    case 4: return x * x;
    case 5: return tanhf(x);
    case 6: return x / (1.0f + expf(-x));
    default: return x * gelu_gate(x);
    }
}

// op.rs silu_slope: d silu / dx.
__device__ __forceinline__ float silu_slope(float x) {
    const float s = 1.0f / (1.0f + expf(-x));
    return s * (1.0f + x * (1.0f - s));
}

// op.rs gelu_tanh_slope: d gelu_tanh / dx.
__device__ __forceinline__ float gelu_tanh_slope(float x) {
    const float s = gelu_gate(x);
    const float dinner = SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_CUBIC * x * x);
    return s + x * 2.0f * s * (1.0f - s) * dinner;
}

// Elements per thread of the element-wise maps below.
#define WALK_EPT 8

// Calls f(i, position in a, position in b) for every element i < n of two
// views of one (coalesced) shape. For views of more than one run, a thread
// takes WALK_EPT consecutive elements: strided_at places the first, the
// rest step by the innermost strides until the innermost row ends, so the
// index arithmetic is paid about once per WALK_EPT elements.
template <class F>
__device__ __forceinline__ void walk2(const Strided& sa, const Strided& sb, u64 n, F f) {
    if (sa.rank <= 1 && sb.rank <= 1) {
        // One run each (contiguous, or a broadcast scalar): consecutive
        // threads take consecutive elements, no index arithmetic.
        GRID_STRIDE(i, n) { f(i, sa.offset + i * sa.inner_stride, sb.offset + i * sb.inner_stride); }
        return;
    }
    const u64 chunks = (n + WALK_EPT - 1) / WALK_EPT;
    const u64 inner = sa.inner, da = sa.inner_stride, db = sb.inner_stride;
    GRID_STRIDE(c, chunks) {
        const u64 i0 = c * WALK_EPT;
        u64 pa = strided_at(sa, i0), pb = strided_at(sb, i0);
        u64 j = i0 <= 0xFFFFFFFFull && inner <= 0xFFFFFFFFull ? (u64)((u32)i0 % (u32)inner) : i0 % inner;
#pragma unroll 1
        for (int k = 0; k < WALK_EPT; ++k) {
            const u64 i = i0 + k;
            if (i >= n) break;
            if (k > 0) {
                if (++j == inner) {
                    j = 0;
                    pa = strided_at(sa, i);
                    pb = strided_at(sb, i);
                } else {
                    pa += da;
                    pb += db;
                }
            }
            f(i, pa, pb);
        }
    }
}

template <class T>
__device__ __forceinline__ void unary(const T* x, T* y, const Strided& s, u64 n, int op) {
    walk2(s, s, n, [=](u64 i, u64 p, u64) { st(y, i, unary_f(op, ld(x, p))); });
}
extern "C" __global__ void ops_unary_f32(const float* x, float* y, Strided s, u64 n, int op) { unary(x, y, s, n, op); }
extern "C" __global__ void ops_unary_bf16(const u16* x, u16* y, Strided s, u64 n, int op) { unary(x, y, s, n, op); }

// One instantiation per op, so the switch is outside the loop.
template <class T>
__device__ __forceinline__ void unary_vec(const T* x, T* y, const Strided& s, u64 n, int op) {
    switch (op) {
#define UNARY_VEC(K) \
    case K: map_vec(x, y, s, n, [](float v) { return unary_f(K, v); }); break;
    UNARY_VEC(0) UNARY_VEC(1) UNARY_VEC(2) UNARY_VEC(3) UNARY_VEC(4)
    UNARY_VEC(5) UNARY_VEC(6) UNARY_VEC(7)
#undef UNARY_VEC
    }
}
extern "C" __global__ void ops_unary_f32_vec(const float* x, float* y, Strided s, u64 n, int op) { unary_vec(x, y, s, n, op); }
extern "C" __global__ void ops_unary_bf16_vec(const u16* x, u16* y, Strided s, u64 n, int op) { unary_vec(x, y, s, n, op); }

// x * mul + add, two roundings (no FMA).
template <class T>
__device__ __forceinline__ void affine(const T* x, T* y, const Strided& s, u64 n, float mul, float add) {
    walk2(s, s, n, [=](u64 i, u64 p, u64) { st(y, i, ld(x, p) * mul + add); });
}
extern "C" __global__ void ops_affine_f32(const float* x, float* y, Strided s, u64 n, float mul, float add) {
    affine(x, y, s, n, mul, add);
}
extern "C" __global__ void ops_affine_bf16(const u16* x, u16* y, Strided s, u64 n, float mul, float add) {
    affine(x, y, s, n, mul, add);
}
extern "C" __global__ void ops_affine_f32_vec(const float* x, float* y, Strided s, u64 n, float mul, float add) {
    map_vec(x, y, s, n, [=](float v) { return v * mul + add; });
}
extern "C" __global__ void ops_affine_bf16_vec(const u16* x, u16* y, Strided s, u64 n, float mul, float add) {
    map_vec(x, y, s, n, [=](float v) { return v * mul + add; });
}

// ---------------------------------------------------------------------------
// Binary ops (BinaryOp::f32): two views of one shape, stride 0 where broadcast.

// Order of BinaryOp (binary_code in storage/ops.rs).
__device__ __forceinline__ float binary_f(int op, float a, float b) {
    switch (op) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    case 3: return a / b;
    case 4: return a == b ? 1.0f : 0.0f;
    case 5: return a * silu_slope(b);
    default: return a * gelu_tanh_slope(b);
    }
}

template <class T>
__device__ __forceinline__ void binary(const T* a, const T* b, T* y, const Strided& sa, const Strided& sb, u64 n, int op) {
    walk2(sa, sb, n, [=](u64 i, u64 pa, u64 pb) { st(y, i, binary_f(op, ld(a, pa), ld(b, pb))); });
}
extern "C" __global__ void ops_binary_f32(const float* a, const float* b, float* y, Strided sa, Strided sb, u64 n, int op) {
    binary(a, b, y, sa, sb, n, op);
}
extern "C" __global__ void ops_binary_bf16(const u16* a, const u16* b, u16* y, Strided sa, Strided sb, u64 n, int op) {
    binary(a, b, y, sa, sb, n, op);
}

// y[i] = f(a at i, b at i), VEC elements a thread (the vector path of binary).
template <class T, class F>
__device__ __forceinline__ void zip_vec(const T* a, const T* b, T* y, const Strided& sa, const Strided& sb, u64 n, F f) {
    const u64 da = sa.inner_stride, db = sb.inner_stride;
    walk2_vec(sa, sb, n, [=](u64 i0, u64 pa, u64 pb, bool full) {
        if (full) {
            float u[VEC], v[VEC];
            ld_group(a, pa, da, u);
            ld_group(b, pb, db, v);
#pragma unroll
            for (int k = 0; k < VEC; ++k) u[k] = f(u[k], v[k]);
            st_vec(y, i0, u);
        } else {
            for (u64 i = i0; i < n; ++i) st(y, i, f(ld(a, pa + (i - i0) * da), ld(b, pb + (i - i0) * db)));
        }
    });
}

template <class T>
__device__ __forceinline__ void binary_vec(const T* a, const T* b, T* y, const Strided& sa, const Strided& sb, u64 n, int op) {
    switch (op) {
#define BINARY_VEC(K) \
    case K: zip_vec(a, b, y, sa, sb, n, [](float u, float v) { return binary_f(K, u, v); }); break;
    BINARY_VEC(0) BINARY_VEC(1) BINARY_VEC(2) BINARY_VEC(3) BINARY_VEC(4) BINARY_VEC(5) BINARY_VEC(6)
#undef BINARY_VEC
    }
}
extern "C" __global__ void ops_binary_f32_vec(const float* a, const float* b, float* y, Strided sa, Strided sb, u64 n, int op) {
    binary_vec(a, b, y, sa, sb, n, op);
}
extern "C" __global__ void ops_binary_bf16_vec(const u16* a, const u16* b, u16* y, Strided sa, Strided sb, u64 n, int op) {
    binary_vec(a, b, y, sa, sb, n, op);
}
