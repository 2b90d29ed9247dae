// Fused modulation ops of the CUDA backend (runtime/src/cuda/storage/fused.rs):
// the adaLN modulation of a LayerNorm, out = LN(x) (1 + scale) + shift, and
// the gated residual add, out = x + gate y, forward and backward. CPU
// reference: runtime/src/cpu/fused.rs, operation for operation.
//
// Compiled in one module after ops_elementwise.cu and ops_rowwise.cu (ld,
// st, ld_vec, st_vec, VEC, GRID_STRIDE, block_reduce, AddD, OPS_THREADS come
// from there). Every operand is packed: x, g, y, dx are [rows, d] with
// rows = batch * tokens, the per-batch vectors (shift, scale, gate) [batch, d],
// and row r belongs to batch r / tokens. Element math is f32 in the CPU's
// order (no FMA: the module is compiled with --fmad=false); row statistics
// and sums over tokens are f64, as on the CPU, so the two differ only in the
// order of f64 additions.
//
// The row kernels take a width W: VEC (d % VEC == 0, so each group of VEC
// elements is one 16-byte-aligned access of every operand) or 1.

// W consecutive elements at p[i] as f32, and back.
template <int W, class T>
__device__ __forceinline__ void ld_w(const T* p, u64 i, float v[W]) {
    if constexpr (W == VEC) {
        ld_vec(p, i, v);
    } else {
        v[0] = ld(p, i);
    }
}
template <int W, class T>
__device__ __forceinline__ void st_w(T* p, u64 i, const float v[W]) {
    if constexpr (W == VEC) {
        st_vec(p, i, v);
    } else {
        st(p, i, v[0]);
    }
}

// a / b, in 32 bits when both fit (several times cheaper than 64).
__device__ __forceinline__ u64 div64(u64 a, u64 b) {
    return (a | b) <= 0xFFFFFFFFull ? (u64)((u32)a / (u32)b) : a / b;
}

// ---------------------------------------------------------------------------
// out = LN(x) (1 + scale) + shift, one CTA per row (cpu/fused.rs
// modulated_norm): mean and variance in f64, then per element
// ((v - fl32(mean)) * rstd) * (1 + scale) + shift; each row's fl32(mean) and
// rstd = fl32(1 / sqrt(var + eps)) go to mean_out and rstd_out (f32).

template <class T, int W>
__device__ __forceinline__ void modnorm(const T* x, const T* shift, const T* scale, T* y, float* mean_out,
                                        float* rstd_out, u64 rows, u64 d, u64 tokens, float eps) {
    __shared__ double redd[OPS_THREADS];
    const double n = (double)d;
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * d;
        const u64 b = div64(r, tokens);
        double s = 0.0;
        for (u64 j = threadIdx.x * W; j < d; j += OPS_THREADS * W) {
            float v[W];
            ld_w<W>(xr, j, v);
#pragma unroll
            for (int k = 0; k < W; ++k) s += (double)v[k];
        }
        const double mean = block_reduce(redd, s, AddD()) / n;
        double q = 0.0;
        for (u64 j = threadIdx.x * W; j < d; j += OPS_THREADS * W) {
            float v[W];
            ld_w<W>(xr, j, v);
#pragma unroll
            for (int k = 0; k < W; ++k) {
                const double t = (double)v[k] - mean;
                q += t * t;
            }
        }
        const double var = block_reduce(redd, q, AddD()) / n;
        const float rstd = (float)(1.0 / sqrt(var + (double)eps));
        const float meanf = (float)mean;
        for (u64 j = threadIdx.x * W; j < d; j += OPS_THREADS * W) {
            float v[W], sh[W], sc[W];
            ld_w<W>(xr, j, v);
            ld_w<W>(shift + b * d, j, sh);
            ld_w<W>(scale + b * d, j, sc);
#pragma unroll
            for (int k = 0; k < W; ++k) v[k] = ((v[k] - meanf) * rstd) * (1.0f + sc[k]) + sh[k];
            st_w<W>(y + r * d, j, v);
        }
        if (threadIdx.x == 0) {
            mean_out[r] = meanf;
            rstd_out[r] = rstd;
        }
    }
}

#define MODNORM(NAME, T, W)                                                                                        \
    extern "C" __global__ void __launch_bounds__(OPS_THREADS)                                                      \
        NAME(const T* x, const T* shift, const T* scale, T* y, float* mean, float* rstd, u64 rows, u64 d,          \
             u64 tokens, float eps) {                                                                              \
        modnorm<T, W>(x, shift, scale, y, mean, rstd, rows, d, tokens, eps);                                       \
    }
MODNORM(fused_modnorm_f32, float, 1)
MODNORM(fused_modnorm_bf16, u16, 1)
MODNORM(fused_modnorm_f32_vec, float, VEC)
MODNORM(fused_modnorm_bf16_vec, u16, VEC)

// ---------------------------------------------------------------------------
// dx of the modulated norm, one CTA per row (cpu/fused.rs
// modulated_norm_backward): y = (x - mean) * rstd and dy = g * (1 + scale) in
// f32, f64 sums of dy and dy * y, m_dy and m_dyy their means rounded to f32,
// dx = ((dy - m_dy) - y * m_dyy) * rstd.

template <class T, int W>
__device__ __forceinline__ void modnorm_dx(const T* x, const T* g, const T* scale, const float* mean,
                                           const float* rstd, T* dx, u64 rows, u64 d, u64 tokens) {
    __shared__ double redd[OPS_THREADS];
    const double n = (double)d;
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const u64 row = r * d, vec = div64(r, tokens) * d;
        const float m = mean[r], rs = rstd[r];
        double s_dy = 0.0, s_dyy = 0.0;
        for (u64 j = threadIdx.x * W; j < d; j += OPS_THREADS * W) {
            float xv[W], gv[W], sc[W];
            ld_w<W>(x + row, j, xv);
            ld_w<W>(g + row, j, gv);
            ld_w<W>(scale + vec, j, sc);
#pragma unroll
            for (int k = 0; k < W; ++k) {
                const float y = (xv[k] - m) * rs, dy = gv[k] * (1.0f + sc[k]);
                s_dy += (double)dy;
                s_dyy += (double)dy * (double)y;
            }
        }
        const float m_dy = (float)(block_reduce(redd, s_dy, AddD()) / n);
        const float m_dyy = (float)(block_reduce(redd, s_dyy, AddD()) / n);
        for (u64 j = threadIdx.x * W; j < d; j += OPS_THREADS * W) {
            float xv[W], gv[W], sc[W];
            ld_w<W>(x + row, j, xv);
            ld_w<W>(g + row, j, gv);
            ld_w<W>(scale + vec, j, sc);
#pragma unroll
            for (int k = 0; k < W; ++k) {
                const float y = (xv[k] - m) * rs, dy = gv[k] * (1.0f + sc[k]);
                xv[k] = ((dy - m_dy) - y * m_dyy) * rs;
            }
            st_w<W>(dx + row, j, xv);
        }
    }
}

#define MODNORM_DX(NAME, T, W)                                                                                     \
    extern "C" __global__ void __launch_bounds__(OPS_THREADS) NAME(const T* x, const T* g, const T* scale,         \
                                                                   const float* mean, const float* rstd, T* dx,   \
                                                                   u64 rows, u64 d, u64 tokens) {                  \
        modnorm_dx<T, W>(x, g, scale, mean, rstd, dx, rows, d, tokens);                                            \
    }
MODNORM_DX(fused_modnorm_dx_f32, float, 1)
MODNORM_DX(fused_modnorm_dx_bf16, u16, 1)
MODNORM_DX(fused_modnorm_dx_f32_vec, float, VEC)
MODNORM_DX(fused_modnorm_dx_bf16_vec, u16, VEC)

// ---------------------------------------------------------------------------
// Sums over the tokens of each batch, per column (dshift, dscale, dgate), in
// two passes so that the whole GPU works on them and the order is fixed:
//
// 1. fused_token_sums_*: a CTA of (32, SUM_GROUPS) threads owns 32 columns
//    of one batch and SUM_CHUNK consecutive tokens; thread row ty adds
//    tokens ty, ty + SUM_GROUPS, .. of the chunk, row 0 adds the rows'
//    sums in ty order and writes the chunk's f64 partials
//    part[(chunk * batch + b) * d + j]: of g * v (pgv) and, when pg is not
//    null, of g. v is y (gated residual: mean and rstd are null), the
//    LayerNorm output (x - mean) * rstd (modulated norm: x is y) or the
//    RMSNorm output x * rstd (QK norm: mean is null), recomputed in f32.
//    Grid (batch * ceil(d / 32) * chunks).
// 2. fused_token_sums_final_*: one thread per (b, j) adds its chunks'
//    partials in chunk order and rounds once to the output dtype.

#define SUM_GROUPS 8
#define SUM_CHUNK 256

template <class T>
__device__ __forceinline__ void token_sums(const T* g, const T* y, const float* mean, const float* rstd,
                                           double* pgv, double* pg, u64 batch, u64 tokens, u64 d, u64 chunks) {
    __shared__ double part_gv[SUM_GROUPS][32];
    __shared__ double part_g[SUM_GROUPS][32];
    const u64 tiles = (d + 31) / 32;
    const u64 chunk = blockIdx.x % chunks, rest = blockIdx.x / chunks;
    const u64 b = rest / tiles, j = (rest % tiles) * 32 + threadIdx.x;
    const u64 t0 = chunk * SUM_CHUNK, t1 = t0 + SUM_CHUNK < tokens ? t0 + SUM_CHUNK : tokens;
    double sgv = 0.0, sg = 0.0;
    if (j < d) {
        for (u64 t = t0 + threadIdx.y; t < t1; t += SUM_GROUPS) {
            const u64 r = b * tokens + t, i = r * d + j;
            const float gv = ld(g, i);
            const float v = rstd ? (mean ? ld(y, i) - mean[r] : ld(y, i)) * rstd[r] : ld(y, i);
            sgv += (double)gv * (double)v;
            sg += (double)gv;
        }
    }
    part_gv[threadIdx.y][threadIdx.x] = sgv;
    part_g[threadIdx.y][threadIdx.x] = sg;
    __syncthreads();
    if (threadIdx.y != 0 || j >= d) return;
    for (int k = 1; k < SUM_GROUPS; ++k) {
        sgv += part_gv[k][threadIdx.x];
        sg += part_g[k][threadIdx.x];
    }
    const u64 at = (chunk * batch + b) * d + j;
    pgv[at] = sgv;
    if (pg) pg[at] = sg;
}
extern "C" __global__ void fused_token_sums_f32(const float* g, const float* y, const float* mean, const float* rstd,
                                                double* pgv, double* pg, u64 batch, u64 tokens, u64 d, u64 chunks) {
    token_sums(g, y, mean, rstd, pgv, pg, batch, tokens, d, chunks);
}
extern "C" __global__ void fused_token_sums_bf16(const u16* g, const u16* y, const float* mean, const float* rstd,
                                                 double* pgv, double* pg, u64 batch, u64 tokens, u64 d, u64 chunks) {
    token_sums(g, y, mean, rstd, pgv, pg, batch, tokens, d, chunks);
}

// Pass 2: out_gv[e] and (when pg is not null) out_g[e] for e < n = batch * d.
template <class T>
__device__ __forceinline__ void token_sums_final(const double* pgv, const double* pg, T* out_gv, T* out_g, u64 n,
                                                 u64 chunks) {
    GRID_STRIDE(e, n) {
        double sgv = 0.0, sg = 0.0;
        for (u64 c = 0; c < chunks; ++c) {
            sgv += pgv[c * n + e];
            if (pg) sg += pg[c * n + e];
        }
        st(out_gv, e, (float)sgv);
        if (pg) st(out_g, e, (float)sg);
    }
}
extern "C" __global__ void fused_token_sums_final_f32(const double* pgv, const double* pg, float* out_gv, float* out_g,
                                                      u64 n, u64 chunks) {
    token_sums_final(pgv, pg, out_gv, out_g, n, chunks);
}
extern "C" __global__ void fused_token_sums_final_bf16(const double* pgv, const double* pg, u16* out_gv, u16* out_g,
                                                       u64 n, u64 chunks) {
    token_sums_final(pgv, pg, out_gv, out_g, n, chunks);
}

// ---------------------------------------------------------------------------
// out = x + gate * y (cpu/fused.rs gated_add), W elements a thread: element
// i is column i % d of row i / d, whose gate is its batch's.

template <class T, int W>
__device__ __forceinline__ void gated_add(const T* x, const T* gate, const T* y, T* out, u64 n, u64 d, u64 tokens) {
    GRID_STRIDE(q, n / W) {
        const u64 i = q * W, r = div64(i, d), j = i - r * d;
        float a[W], gt[W], v[W];
        ld_w<W>(x, i, a);
        ld_w<W>(gate + div64(r, tokens) * d, j, gt);
        ld_w<W>(y, i, v);
#pragma unroll
        for (int k = 0; k < W; ++k) a[k] = a[k] + gt[k] * v[k];
        st_w<W>(out, i, a);
    }
}

#define GATED_ADD(NAME, T, W)                                                                                      \
    extern "C" __global__ void NAME(const T* x, const T* gate, const T* y, T* out, u64 n, u64 d, u64 tokens) {    \
        gated_add<T, W>(x, gate, y, out, n, d, tokens);                                                            \
    }
GATED_ADD(fused_gated_add_f32, float, 1)
GATED_ADD(fused_gated_add_bf16, u16, 1)
GATED_ADD(fused_gated_add_f32_vec, float, VEC)
GATED_ADD(fused_gated_add_bf16_vec, u16, VEC)

// ---------------------------------------------------------------------------
// Flux's QK norm and RoPE (cpu/fused.rs rms_norm_rope), one thread per row of
// d = 2 half elements, row r at position r % seq of the packed [seq, half]
// tables: rstd = fl32(1 / sqrt(sum(x^2) / d + eps)) with the f64 sum in
// element order (the CPU's order, so the same bits), z = (x * rstd) * w
// rounded to T, out = (z0 c - z1 s, z0 s + z1 c) for each pair. These
// one-thread-per-row kernels serve rows the tile kernels below do not take
// (d % VEC != 0 or d > RR_MAXD).

// v rounded to T's precision and widened back (what a cast to T keeps).
__device__ __forceinline__ float round_as(const float*, float v) { return v; }
__device__ __forceinline__ float round_as(const u16*, float v) { return u2f((u32)bf16_from_f32(v) << 16); }

// W = VEC (d % VEC == 0: 16-byte groups of x, g, out and the weight) or 1;
// either way each row's elements go through the f64 sums in order.
template <class T, int W>
__device__ __forceinline__ void rms_rope(const T* x, const float* w, const T* cos, const T* sin, T* out,
                                         float* rstd_out, u64 rows, u64 d, u64 seq, float eps) {
    static_assert(W % 2 == 0 || W == 1, "whole pairs per group, or one element");
    GRID_STRIDE(r, rows) {
        const u64 row = r * d, half = d / 2, p = (r % seq) * half;
        double q = 0.0;
        for (u64 j = 0; j < d; j += W) {
            float v[W];
            ld_w<W>(x + row, j, v);
#pragma unroll
            for (int k = 0; k < W; ++k) {
                const double t = (double)v[k];
                q += t * t;
            }
        }
        const float rstd = (float)(1.0 / sqrt(q / (double)d + (double)eps));
        // z of pair i is (z[2i], z[2i + 1]); a group of W >= 2 holds W / 2 pairs.
        constexpr int P = W == 1 ? 2 : W;
        for (u64 j = 0; j < d; j += P) {
            float v[P], wv[P];
            if constexpr (W == 1) {
                v[0] = ld(x, row + j);
                v[1] = ld(x, row + j + 1);
                wv[0] = w[j];
                wv[1] = w[j + 1];
            } else {
                ld_w<W>(x + row, j, v);
                ld_w<W>(w, j, wv);
            }
#pragma unroll
            for (int k = 0; k < P; k += 2) {
                const float z0 = round_as(x, (v[k] * rstd) * wv[k]);
                const float z1 = round_as(x, (v[k + 1] * rstd) * wv[k + 1]);
                const u64 t = p + (j + k) / 2;
                const float c = ld(cos, t), s = ld(sin, t);
                v[k] = z0 * c - z1 * s;
                v[k + 1] = z0 * s + z1 * c;
            }
            if constexpr (W == 1) {
                st(out, row + j, v[0]);
                st(out, row + j + 1, v[1]);
            } else {
                st_w<W>(out + row, j, v);
            }
        }
        rstd_out[r] = rstd;
    }
}

#define RMS_ROPE(NAME, T, W)                                                                                       \
    extern "C" __global__ void NAME(const T* x, const float* w, const T* cos, const T* sin, T* out, float* rstd,  \
                                    u64 rows, u64 d, u64 seq, float eps) {                                         \
        rms_rope<T, W>(x, w, cos, sin, out, rstd, rows, d, seq, eps);                                              \
    }
RMS_ROPE(fused_rms_rope_f32, float, 1)
RMS_ROPE(fused_rms_rope_bf16, u16, 1)
RMS_ROPE(fused_rms_rope_f32_vec, float, VEC)
RMS_ROPE(fused_rms_rope_bf16_vec, u16, VEC)

// Its dx, one thread per row (cpu/fused.rs rms_norm_rope_backward): g' = g
// rotated back ((g0 c - g1 (-s), g0 (-s) + g1 c), rounded to T) goes to
// back for the weight's gradient (fused_token_sums); with y = x * rstd and
// dy = g' * w, m = fl32(sum(dy y) / d) (f64 sum in element order) and
// dx = (dy - y * m) * rstd. W as for rms_rope.
template <class T, int W>
__device__ __forceinline__ void rms_rope_dx(const T* x, const float* w, const T* cos, const T* sin,
                                            const float* rstd, const T* g, T* back, T* dx, u64 rows, u64 d,
                                            u64 seq) {
    constexpr int P = W == 1 ? 2 : W;
    GRID_STRIDE(r, rows) {
        const u64 row = r * d, half = d / 2, p = (r % seq) * half;
        const float rs = rstd[r];
        double s_dyy = 0.0;
        for (u64 j = 0; j < d; j += P) {
            float gv[P], xv[P], wv[P];
            if constexpr (W == 1) {
                for (int k = 0; k < 2; ++k) {
                    gv[k] = ld(g, row + j + k);
                    xv[k] = ld(x, row + j + k);
                    wv[k] = w[j + k];
                }
            } else {
                ld_w<W>(g + row, j, gv);
                ld_w<W>(x + row, j, xv);
                ld_w<W>(w, j, wv);
            }
#pragma unroll
            for (int k = 0; k < P; k += 2) {
                const u64 t = p + (j + k) / 2;
                const float c = ld(cos, t), sn = -ld(sin, t);
                const float g0 = gv[k], g1 = gv[k + 1];
                gv[k] = round_as(g, g0 * c - g1 * sn);
                gv[k + 1] = round_as(g, g0 * sn + g1 * c);
                s_dyy += (double)(gv[k] * wv[k]) * (double)(xv[k] * rs);
                s_dyy += (double)(gv[k + 1] * wv[k + 1]) * (double)(xv[k + 1] * rs);
            }
            if constexpr (W == 1) {
                st(back, row + j, gv[0]);
                st(back, row + j + 1, gv[1]);
            } else {
                st_w<W>(back + row, j, gv);
            }
        }
        const float m = (float)(s_dyy / (double)d);
        for (u64 j = 0; j < d; j += W) {
            float bv[W], xv[W], wv[W];
            ld_w<W>(back + row, j, bv);
            ld_w<W>(x + row, j, xv);
            if constexpr (W == 1) {
                wv[0] = w[j];
            } else {
                ld_w<W>(w, j, wv);
            }
#pragma unroll
            for (int k = 0; k < W; ++k) {
                const float dy = bv[k] * wv[k], y = xv[k] * rs;
                bv[k] = (dy - y * m) * rs;
            }
            st_w<W>(dx + row, j, bv);
        }
    }
}

#define RMS_ROPE_DX(NAME, T, W)                                                                                    \
    extern "C" __global__ void NAME(const T* x, const float* w, const T* cos, const T* sin, const float* rstd,     \
                                    const T* g, T* back, T* dx, u64 rows, u64 d, u64 seq) {                       \
        rms_rope_dx<T, W>(x, w, cos, sin, rstd, g, back, dx, rows, d, seq);                                        \
    }
RMS_ROPE_DX(fused_rms_rope_dx_f32, float, 1)
RMS_ROPE_DX(fused_rms_rope_dx_bf16, u16, 1)
RMS_ROPE_DX(fused_rms_rope_dx_f32_vec, float, VEC)
RMS_ROPE_DX(fused_rms_rope_dx_bf16_vec, u16, VEC)

// ---------------------------------------------------------------------------
// The same two ops, fast form (d % VEC == 0 and d <= RR_MAXD, Flux's head dim
// of 128): a warp owns a tile of 32 consecutive rows (32 d contiguous
// elements). Loads and stores are coalesced 16-byte groups of the tile
// (lane q takes groups q, q + 32, ..); the row's f64 sum stays a chain in
// element order, one lane per row, reading the tile from shared memory (row
// stride d + 1 floats, no bank conflicts), so every value, rstd included,
// has the bits of the one-thread-per-row kernels above (and of the CPU).

#define RR_MAXD 128
#define RR_TILE 32
// Warps per CTA of fused_rms_rope_*_tile (RR_WARPS in fused.rs).
#define RR_WARPS 2

template <class T>
__device__ __forceinline__ void rms_rope_tile(const T* x, const float* w, const T* cos, const T* sin, T* out,
                                              float* rstd_out, u64 rows, u64 d, u64 seq, float eps) {
    __shared__ float xs[RR_WARPS][RR_TILE][RR_MAXD + 1];
    __shared__ float rss[RR_WARPS][RR_TILE];
    const u32 lane = threadIdx.x % 32, wp = threadIdx.x / 32, dd = (u32)d, half = dd / 2;
    const u64 tiles = (rows + RR_TILE - 1) / RR_TILE;
    for (u64 tile = (u64)blockIdx.x * RR_WARPS + wp; tile < tiles; tile += (u64)gridDim.x * RR_WARPS) {
        const u64 r0 = tile * RR_TILE;
        const u32 nr = (u32)(rows - r0 < RR_TILE ? rows - r0 : RR_TILE), groups = nr * dd / VEC;
        const T* xt = x + r0 * d;
        for (u32 q = lane; q < groups; q += 32) {
            const u32 e = q * VEC, row = e / dd, col = e - row * dd;
            float v[VEC];
            ld_vec(xt, e, v);
#pragma unroll
            for (int k = 0; k < VEC; ++k) xs[wp][row][col + k] = v[k];
        }
        sync_warp();
        if (lane < nr) {
            double q = 0.0;
            for (u32 j = 0; j < dd; ++j) {
                const double t = (double)xs[wp][lane][j];
                q += t * t;
            }
            const float rstd = (float)(1.0 / sqrt(q / (double)d + (double)eps));
            rss[wp][lane] = rstd;
            rstd_out[r0 + lane] = rstd;
        }
        sync_warp();
        for (u32 q = lane; q < groups; q += 32) {
            const u32 e = q * VEC, row = e / dd, col = e - row * dd;
            const u64 r = r0 + row, p = (r - div64(r, seq) * seq) * half;
            const float rstd = rss[wp][row];
            float v[VEC], wv[VEC];
            ld_vec(w, col, wv);
#pragma unroll
            for (int k = 0; k < VEC; k += 2) {
                const float z0 = round_as(x, (xs[wp][row][col + k] * rstd) * wv[k]);
                const float z1 = round_as(x, (xs[wp][row][col + k + 1] * rstd) * wv[k + 1]);
                const u64 t = p + (col + k) / 2;
                const float c = ld(cos, t), s = ld(sin, t);
                v[k] = z0 * c - z1 * s;
                v[k + 1] = z0 * s + z1 * c;
            }
            st_vec(out + r0 * d, e, v);
        }
        sync_warp();  // xs and rss are written again for the next tile
    }
}

#define RMS_ROPE_TILE(NAME, T)                                                                                     \
    extern "C" __global__ void __launch_bounds__(RR_WARPS * 32)                                                    \
        NAME(const T* x, const float* w, const T* cos, const T* sin, T* out, float* rstd, u64 rows, u64 d,        \
             u64 seq, float eps) {                                                                                 \
        rms_rope_tile<T>(x, w, cos, sin, out, rstd, rows, d, seq, eps);                                            \
    }
RMS_ROPE_TILE(fused_rms_rope_f32_tile, float)
RMS_ROPE_TILE(fused_rms_rope_bf16_tile, u16)

// The dx of the tile form, one warp per CTA (two tiles of f32 in shared
// memory): pass 1 rotates g back (rounded to T, written to back), and keeps
// dy = g' w and y = x rstd (f32) of the tile in shared memory; each lane adds
// its row's dy y in f64 in element order; pass 2 writes dx = (dy - y m) rstd.
template <class T>
__device__ __forceinline__ void rms_rope_dx_tile(const T* x, const float* w, const T* cos, const T* sin,
                                                 const float* rstd, const T* g, T* back, T* dx, u64 rows, u64 d,
                                                 u64 seq) {
    __shared__ float dys[RR_TILE][RR_MAXD + 1];
    __shared__ float ys[RR_TILE][RR_MAXD + 1];
    __shared__ float ms[RR_TILE];
    const u32 lane = threadIdx.x % 32, dd = (u32)d, half = dd / 2;
    const u64 tiles = (rows + RR_TILE - 1) / RR_TILE;
    for (u64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const u64 r0 = tile * RR_TILE, base = r0 * d;
        const u32 nr = (u32)(rows - r0 < RR_TILE ? rows - r0 : RR_TILE), groups = nr * dd / VEC;
        for (u32 q = lane; q < groups; q += 32) {
            const u32 e = q * VEC, row = e / dd, col = e - row * dd;
            const u64 r = r0 + row, p = (r - div64(r, seq) * seq) * half;
            const float rs = rstd[r0 + row];
            float gv[VEC], xv[VEC], wv[VEC];
            ld_vec(g + base, e, gv);
            ld_vec(x + base, e, xv);
            ld_vec(w, col, wv);
#pragma unroll
            for (int k = 0; k < VEC; k += 2) {
                const u64 t = p + (col + k) / 2;
                const float c = ld(cos, t), sn = -ld(sin, t);
                const float g0 = gv[k], g1 = gv[k + 1];
                gv[k] = round_as(g, g0 * c - g1 * sn);
                gv[k + 1] = round_as(g, g0 * sn + g1 * c);
            }
            st_vec(back + base, e, gv);
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                dys[row][col + k] = gv[k] * wv[k];
                ys[row][col + k] = xv[k] * rs;
            }
        }
        sync_warp();
        if (lane < nr) {
            double s_dyy = 0.0;
            for (u32 j = 0; j < dd; ++j) s_dyy += (double)dys[lane][j] * (double)ys[lane][j];
            ms[lane] = (float)(s_dyy / (double)d);
        }
        sync_warp();
        for (u32 q = lane; q < groups; q += 32) {
            const u32 e = q * VEC, row = e / dd, col = e - row * dd;
            const float rs = rstd[r0 + row], m = ms[row];
            float v[VEC];
#pragma unroll
            for (int k = 0; k < VEC; ++k) v[k] = (dys[row][col + k] - ys[row][col + k] * m) * rs;
            st_vec(dx + base, e, v);
        }
        sync_warp();  // the tile's shared arrays are written again for the next one
    }
}

#define RMS_ROPE_DX_TILE(NAME, T)                                                                                  \
    extern "C" __global__ void __launch_bounds__(32)                                                               \
        NAME(const T* x, const float* w, const T* cos, const T* sin, const float* rstd, const T* g, T* back,      \
             T* dx, u64 rows, u64 d, u64 seq) {                                                                    \
        rms_rope_dx_tile<T>(x, w, cos, sin, rstd, g, back, dx, rows, d, seq);                                      \
    }
RMS_ROPE_DX_TILE(fused_rms_rope_dx_f32_tile, float)
RMS_ROPE_DX_TILE(fused_rms_rope_dx_bf16_tile, u16)
