// Row-wise tensor ops of the CUDA backend: reductions over one axis, softmax,
// layer / RMS norm and interleaved RoPE over the last axis, and a tiled
// batched matmul. CPU references: runtime/src/cpu/reduce.rs, rowwise.rs and
// matmul.rs. Compiled in one module after ops_elementwise.cu (Strided, ld,
// st, GRID_STRIDE, OPS_THREADS come from there). Inputs are packed.
//
// Statistics of softmax and the norms accumulate in double, like the CPU, so
// they agree with it up to the order of f64 additions.

// NaN-propagating max (reduce.rs max_nan).
__device__ __forceinline__ float max_nan(float m, float v) { return (v > m || v != v) ? v : m; }

// Block-wide tree reduction of `v` over OPS_THREADS threads; every thread gets the result.
template <class A, class F>
__device__ __forceinline__ A block_reduce(A* red, A v, F f) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (u32 s = OPS_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] = f(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    const A r = red[0];
    __syncthreads();
    return r;
}

struct AddF { __device__ float operator()(float a, float b) const { return a + b; } };
struct AddD { __device__ double operator()(double a, double b) const { return a + b; } };
struct MaxNan { __device__ float operator()(float a, float b) const { return max_nan(a, b); } };
struct MaxF { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };

// ---------------------------------------------------------------------------
// Reductions of x viewed as [outer, n, inner] into [outer, inner]; op 0 = sum,
// 1 = max. inner == 1: one CTA per row; otherwise one thread per output.

template <class T>
__device__ __forceinline__ void reduce_rows(const T* x, T* y, u64 rows, u64 n, int op) {
    __shared__ float red[OPS_THREADS];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        float acc = op == 0 ? 0.0f : u2f(0xFF800000u);
        for (u64 j = threadIdx.x; j < n; j += OPS_THREADS) {
            const float v = ld(x, r * n + j);
            acc = op == 0 ? acc + v : max_nan(acc, v);
        }
        acc = op == 0 ? block_reduce(red, acc, AddF()) : block_reduce(red, acc, MaxNan());
        if (threadIdx.x == 0) st(y, r, acc);
    }
}
extern "C" __global__ void __launch_bounds__(OPS_THREADS) ops_reduce_rows_f32(const float* x, float* y, u64 rows, u64 n, int op) {
    reduce_rows(x, y, rows, n, op);
}
extern "C" __global__ void __launch_bounds__(OPS_THREADS) ops_reduce_rows_bf16(const u16* x, u16* y, u64 rows, u64 n, int op) {
    reduce_rows(x, y, rows, n, op);
}

// Few long rows (a whole-tensor sum is one row): one CTA per row would run
// on a handful of SMs, so each row is cut into chunks of `chunk` elements,
// one CTA per (row, chunk) writes an f32 partial, and one thread per row
// combines its partials in chunk order. Grid (rows * chunks).
template <class T>
__device__ __forceinline__ void reduce_rows_partial(const T* x, float* partial, u64 n, u64 chunk, u64 chunks, int op) {
    __shared__ float red[OPS_THREADS];
    const u64 r = blockIdx.x / chunks, c = blockIdx.x % chunks;
    const u64 j0 = c * chunk, j1 = j0 + chunk < n ? j0 + chunk : n;
    float acc = op == 0 ? 0.0f : u2f(0xFF800000u);
    for (u64 j = j0 + threadIdx.x; j < j1; j += OPS_THREADS) {
        const float v = ld(x, r * n + j);
        acc = op == 0 ? acc + v : max_nan(acc, v);
    }
    acc = op == 0 ? block_reduce(red, acc, AddF()) : block_reduce(red, acc, MaxNan());
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}
template <class T>
__device__ __forceinline__ void reduce_rows_final(const float* partial, T* y, u64 rows, u64 chunks, int op) {
    GRID_STRIDE(r, rows) {
        float acc = op == 0 ? 0.0f : u2f(0xFF800000u);
        for (u64 c = 0; c < chunks; ++c) {
            const float v = partial[r * chunks + c];
            acc = op == 0 ? acc + v : max_nan(acc, v);
        }
        st(y, r, acc);
    }
}
extern "C" __global__ void __launch_bounds__(OPS_THREADS)
    ops_reduce_rows_partial_f32(const float* x, float* partial, u64 n, u64 chunk, u64 chunks, int op) {
    reduce_rows_partial(x, partial, n, chunk, chunks, op);
}
extern "C" __global__ void __launch_bounds__(OPS_THREADS)
    ops_reduce_rows_partial_bf16(const u16* x, float* partial, u64 n, u64 chunk, u64 chunks, int op) {
    reduce_rows_partial(x, partial, n, chunk, chunks, op);
}
extern "C" __global__ void ops_reduce_rows_final_f32(const float* partial, float* y, u64 rows, u64 chunks, int op) {
    reduce_rows_final(partial, y, rows, chunks, op);
}
extern "C" __global__ void ops_reduce_rows_final_bf16(const float* partial, u16* y, u64 rows, u64 chunks, int op) {
    reduce_rows_final(partial, y, rows, chunks, op);
}

// Reduction over the middle axis of [outer, n, inner]. A CTA owns 32
// consecutive inner positions of one outer index; its COL_GROUPS rows of
// threads each reduce every COL_GROUPS-th j, then row 0 combines the
// partials in a fixed order (deterministic; the sum order differs from the
// CPU's left-to-right one, which the ops check's tolerance covers).
// Grid (outer * ceil(inner / 32)), block (32, COL_GROUPS).
#define COL_GROUPS 16

template <class T>
__device__ __forceinline__ void reduce_cols(const T* x, T* y, u64 outer, u64 n, u64 inner, int op) {
    __shared__ float part[COL_GROUPS][33];
    const u64 tiles = (inner + 31) / 32;
    const u64 b = blockIdx.x / tiles;
    const u64 c = (blockIdx.x % tiles) * 32 + threadIdx.x;
    float acc = op == 0 ? 0.0f : u2f(0xFF800000u);
    if (c < inner) {
        const T* p = x + b * n * inner + c;
        for (u64 j = threadIdx.y; j < n; j += COL_GROUPS) {
            const float v = ld(p, j * inner);
            acc = op == 0 ? acc + v : max_nan(acc, v);
        }
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y != 0 || c >= inner) return;
    for (int g = 1; g < COL_GROUPS; ++g) {
        const float v = part[g][threadIdx.x];
        acc = op == 0 ? acc + v : max_nan(acc, v);
    }
    st(y, b * inner + c, acc);
}
extern "C" __global__ void ops_reduce_cols_f32(const float* x, float* y, u64 outer, u64 n, u64 inner, int op) {
    reduce_cols(x, y, outer, n, inner, op);
}
extern "C" __global__ void ops_reduce_cols_bf16(const u16* x, u16* y, u64 outer, u64 n, u64 inner, int op) {
    reduce_cols(x, y, outer, n, inner, op);
}

// Few outputs over a long axis (the [D] gradient of a scale applied to
// [B, h, L, D], reduced over L = 8192 with D = 128, is 4 CTAs of the kernel
// above): the axis is cut into chunks of `chunk`, one CTA per (outer, 32
// inner positions, chunk) reduces its chunk as reduce_cols does and writes
// an f32 partial to partial[(b * inner + c) * chunks + chunk index], and
// ops_reduce_rows_final combines each output's partials in chunk order.
// Grid (outer * ceil(inner / 32) * chunks), block (32, COL_GROUPS).
template <class T>
__device__ __forceinline__ void reduce_cols_partial(const T* x, float* partial, u64 n, u64 inner, u64 chunk,
                                                    u64 chunks, int op) {
    __shared__ float part[COL_GROUPS][33];
    const u64 tiles = (inner + 31) / 32;
    const u64 k = blockIdx.x % chunks, rest = blockIdx.x / chunks;
    const u64 b = rest / tiles;
    const u64 c = (rest % tiles) * 32 + threadIdx.x;
    const u64 j0 = k * chunk, j1 = j0 + chunk < n ? j0 + chunk : n;
    float acc = op == 0 ? 0.0f : u2f(0xFF800000u);
    if (c < inner) {
        const T* p = x + b * n * inner + c;
        for (u64 j = j0 + threadIdx.y; j < j1; j += COL_GROUPS) {
            const float v = ld(p, j * inner);
            acc = op == 0 ? acc + v : max_nan(acc, v);
        }
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y != 0 || c >= inner) return;
    for (int g = 1; g < COL_GROUPS; ++g) {
        const float v = part[g][threadIdx.x];
        acc = op == 0 ? acc + v : max_nan(acc, v);
    }
    partial[(b * inner + c) * chunks + k] = acc;
}
extern "C" __global__ void ops_reduce_cols_partial_f32(const float* x, float* partial, u64 n, u64 inner, u64 chunk,
                                                       u64 chunks, int op) {
    reduce_cols_partial(x, partial, n, inner, chunk, chunks, op);
}
extern "C" __global__ void ops_reduce_cols_partial_bf16(const u16* x, float* partial, u64 n, u64 inner, u64 chunk,
                                                        u64 chunks, int op) {
    reduce_cols_partial(x, partial, n, inner, chunk, chunks, op);
}

// ---------------------------------------------------------------------------
// Softmax of each row of length d (rowwise.rs softmax): max, f64 sum of
// exp(v - max), then exp(v - max) * fl32(1 / sum).

template <class T>
__device__ __forceinline__ void softmax(const T* x, T* y, u64 rows, u64 d) {
    __shared__ float redf[OPS_THREADS];
    __shared__ double redd[OPS_THREADS];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const u64 base = r * d;
        float m = u2f(0xFF800000u);
        for (u64 j = threadIdx.x; j < d; j += OPS_THREADS) m = fmaxf(m, ld(x, base + j));
        m = block_reduce(redf, m, MaxF());
        double sum = 0.0;
        for (u64 j = threadIdx.x; j < d; j += OPS_THREADS) sum += (double)expf(ld(x, base + j) - m);
        sum = block_reduce(redd, sum, AddD());
        const float inv = (float)(1.0 / sum);
        for (u64 j = threadIdx.x; j < d; j += OPS_THREADS) st(y, base + j, expf(ld(x, base + j) - m) * inv);
    }
}
extern "C" __global__ void __launch_bounds__(OPS_THREADS) ops_softmax_f32(const float* x, float* y, u64 rows, u64 d) {
    softmax(x, y, rows, d);
}
extern "C" __global__ void __launch_bounds__(OPS_THREADS) ops_softmax_bf16(const u16* x, u16* y, u64 rows, u64 d) {
    softmax(x, y, rows, d);
}

// ---------------------------------------------------------------------------
// Layer / RMS norm of each row (rowwise.rs norm): mean and variance in f64,
// rstd = fl32(1 / sqrt(var + eps)), y = (v - fl32(mean)) * rstd; rstd per row.

template <class T>
__device__ __forceinline__ void norm(const T* x, T* y, T* rstd_out, u64 rows, u64 d, float eps, int rms) {
    __shared__ double redd[OPS_THREADS];
    const double n = (double)d;
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const u64 base = r * d;
        double mean = 0.0;
        if (!rms) {
            double s = 0.0;
            for (u64 j = threadIdx.x; j < d; j += OPS_THREADS) s += (double)ld(x, base + j);
            mean = block_reduce(redd, s, AddD()) / n;
        }
        double q = 0.0;
        for (u64 j = threadIdx.x; j < d; j += OPS_THREADS) {
            const double t = (double)ld(x, base + j) - mean;
            q += t * t;
        }
        const double var = block_reduce(redd, q, AddD()) / n;
        const float rstd = (float)(1.0 / sqrt(var + (double)eps));
        const float meanf = (float)mean;
        for (u64 j = threadIdx.x; j < d; j += OPS_THREADS) st(y, base + j, (ld(x, base + j) - meanf) * rstd);
        if (threadIdx.x == 0) st(rstd_out, r, rstd);
    }
}
extern "C" __global__ void __launch_bounds__(OPS_THREADS) ops_norm_f32(const float* x, float* y, float* rstd, u64 rows, u64 d, float eps, int rms) {
    norm(x, y, rstd, rows, d, eps, rms);
}
extern "C" __global__ void __launch_bounds__(OPS_THREADS) ops_norm_bf16(const u16* x, u16* y, u16* rstd, u64 rows, u64 d, float eps, int rms) {
    norm(x, y, rstd, rows, d, eps, rms);
}

// ---------------------------------------------------------------------------
// Interleaved RoPE (rowwise.rs rope_interleaved): pair q of x [rows, 2 half]
// is pair i = q % half of row r = q / half, at position r % seq of the
// packed [seq, half] tables.

template <class T>
__device__ __forceinline__ void rope(const T* x, const T* c, const T* s, T* y, u64 pairs, u64 seq, u64 half) {
    GRID_STRIDE(q, pairs) {
        const u64 r = q / half, i = q % half;
        const u64 t = (r % seq) * half + i;
        const float v0 = ld(x, 2 * q), v1 = ld(x, 2 * q + 1);
        const float cv = ld(c, t), sv = ld(s, t);
        st(y, 2 * q, v0 * cv - v1 * sv);
        st(y, 2 * q + 1, v0 * sv + v1 * cv);
    }
}
extern "C" __global__ void ops_rope_f32(const float* x, const float* c, const float* s, float* y, u64 pairs, u64 seq, u64 half) {
    rope(x, c, s, y, pairs, seq, half);
}
extern "C" __global__ void ops_rope_bf16(const u16* x, const u16* c, const u16* s, u16* y, u64 pairs, u64 seq, u64 half) {
    rope(x, c, s, y, pairs, seq, half);
}

// ---------------------------------------------------------------------------
// Batched matmul [.., M, K] x [.., K, N] -> packed [.., M, N] with arbitrary
// strides: 16 x 16 output tiles, f32 accumulation in k order. `ba` / `bb`
// hold the batch dims and the operands' batch strides (rank 0: no batch).

#define MM_TILE 16

template <class T>
__device__ __forceinline__ void matmul(const T* a, const T* b, T* y, const Strided& ba, const Strided& bb, u64 batch,
                                       u64 m, u64 n, u64 k, u64 a_rs, u64 a_cs, u64 b_rs, u64 b_cs) {
    __shared__ float ta[MM_TILE][MM_TILE + 1];
    __shared__ float tb[MM_TILE][MM_TILE + 1];
    const u64 row = (u64)blockIdx.y * MM_TILE + threadIdx.y;
    const u64 col = (u64)blockIdx.x * MM_TILE + threadIdx.x;
    for (u64 z = blockIdx.z; z < batch; z += gridDim.z) {
        const T* ap = a + strided_at(ba, z);
        const T* bp = b + strided_at(bb, z);
        float acc = 0.0f;
        for (u64 k0 = 0; k0 < k; k0 += MM_TILE) {
            const u64 ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
            ta[threadIdx.y][threadIdx.x] = (row < m && ka < k) ? ld(ap, row * a_rs + ka * a_cs) : 0.0f;
            tb[threadIdx.y][threadIdx.x] = (kb < k && col < n) ? ld(bp, kb * b_rs + col * b_cs) : 0.0f;
            __syncthreads();
#pragma unroll
            for (int t = 0; t < MM_TILE; ++t) acc += ta[threadIdx.y][t] * tb[t][threadIdx.x];
            __syncthreads();
        }
        if (row < m && col < n) st(y, z * m * n + row * n + col, acc);
    }
}
extern "C" __global__ void ops_matmul_f32(const float* a, const float* b, float* y, Strided ba, Strided bb, u64 batch,
                                          u64 m, u64 n, u64 k, u64 a_rs, u64 a_cs, u64 b_rs, u64 b_cs) {
    matmul(a, b, y, ba, bb, batch, m, n, k, a_rs, a_cs, b_rs, b_cs);
}
extern "C" __global__ void ops_matmul_bf16(const u16* a, const u16* b, u16* y, Strided ba, Strided bb, u64 batch,
                                           u64 m, u64 n, u64 k, u64 a_rs, u64 a_cs, u64 b_rs, u64 b_cs) {
    matmul(a, b, y, ba, bb, batch, m, n, k, a_rs, a_cs, b_rs, b_cs);
}
