// The scalar family of the fused attention kernels (see attention.cu, whose
// definitions it follows in the same module: attn_smem, neg_inf, pos_inf).
// The CPU reference is runtime/src/cpu/attention.rs.

// ---------------------------------------------------------------------------
// Scalar path: f32 or BF16 operands, any d, dv <= 256, T x T tiles, 256
// threads. Thread i owns row i / (256 / T) of the tile and its columns
// i % (256 / T) + (256 / T) u: T / (256 / T) scores, and up to 16 output
// columns (d or dv <= 16 (256 / T)). Shared tiles are f32 with rows padded
// by one element against bank conflicts.

#define SC_THREADS 256
#define SC_MAXU 16

template <class In>
__device__ __forceinline__ void store_as(void* p, u64 i, float x);
template <>
__device__ __forceinline__ void store_as<InF32>(void* p, u64 i, float x) {
    ((float*)p)[i] = x;
}
template <>
__device__ __forceinline__ void store_as<InBF16>(void* p, u64 i, float x) {
    ((u16*)p)[i] = bf16_from_f32(x);
}

// `rows` rows of a packed [n, w] matrix (element `base` is its first) from
// row `row0`, as f32 into a shared tile of row stride w + 1; rows at or past
// n are zero.
template <class In>
__device__ __forceinline__ void sc_tile_load(float* s, const void* g, u64 base, int row0, int rows, int n, int w) {
    for (int i = threadIdx.x; i < rows * w; i += SC_THREADS) {
        const int r = i / w, col = i % w;
        s[r * (w + 1) + col] = row0 + r < n ? In::load(g, base + (u64)(row0 + r) * w + col) : 0.0f;
    }
}

// out[i] = sum over x < n of a[x] b_i[x] for SPT rows b_i = b + i STEP (n + 1)
// of a shared tile: a thread's scores, each value of a loaded once.
template <int SPT, int STEP>
__device__ __forceinline__ void sc_dots(float out[SPT], const float* a, const float* b, int n) {
#pragma unroll
    for (int i = 0; i < SPT; ++i) out[i] = 0.0f;
    for (int x = 0; x < n; ++x) {
        const float ax = a[x];
#pragma unroll
        for (int i = 0; i < SPT; ++i) out[i] = fmaf(ax, b[i * STEP * (n + 1) + x], out[i]);
    }
}

// Forward: one CTA per T query rows. Shared: Q [T][d+1], K [T][d+1],
// V [T][dv+1], P [T][T+1], then m, l and the correction [T] each.
template <class In, int T>
__device__ __forceinline__ void attn_fwd_sc(const void* q, const void* k, const void* v, void* o, float* lse, int L,
                                            int S, int d, int dv, float scale) {
    constexpr int TPR = SC_THREADS / T, SPT = T / TPR;
    float* sQ = (float*)attn_smem;
    float* sK = sQ + T * (d + 1);
    float* sV = sK + T * (d + 1);
    float* sP = sV + T * (dv + 1);
    float* sM = sP + T * (T + 1);
    float* sL = sM + T;
    float* sC = sL + T;
    const int tiles = (L + T - 1) / T;
    const u64 head = blockIdx.x / tiles;
    const int q0 = (blockIdx.x % tiles) * T;
    const int r = threadIdx.x / TPR, cl = threadIdx.x % TPR;
    sc_tile_load<In>(sQ, q, head * L * d, q0, T, L, d);
    if (threadIdx.x < T) {
        sM[threadIdx.x] = neg_inf();
        sL[threadIdx.x] = 0.0f;
    }
    float acc[SC_MAXU];
#pragma unroll
    for (int u = 0; u < SC_MAXU; ++u) acc[u] = 0.0f;
    for (int k0 = 0; k0 < S; k0 += T) {
        __syncthreads();  // every thread is done with the previous K, V and P
        sc_tile_load<In>(sK, k, head * S * d, k0, T, S, d);
        sc_tile_load<In>(sV, v, head * S * dv, k0, T, S, dv);
        __syncthreads();
        float x[SPT];
        sc_dots<SPT, TPR>(x, sQ + r * (d + 1), sK + cl * (d + 1), d);
#pragma unroll
        for (int i = 0; i < SPT; ++i) {
            const int cc = cl + TPR * i;
            sP[r * (T + 1) + cc] = k0 + cc < S ? x[i] * scale : neg_inf();
        }
        __syncthreads();
        if (threadIdx.x < T) {
            float* row = sP + threadIdx.x * (T + 1);
            const float m_old = sM[threadIdx.x];
            float mx = m_old;
            for (int cc = 0; cc < T; ++cc) mx = fmaxf(mx, row[cc]);
            float sum = 0.0f;
            for (int cc = 0; cc < T; ++cc) {
                row[cc] = expf(row[cc] - mx);
                sum += row[cc];
            }
            const float corr = expf(m_old - mx);
            sL[threadIdx.x] = sL[threadIdx.x] * corr + sum;
            sM[threadIdx.x] = mx;
            sC[threadIdx.x] = corr;
        }
        __syncthreads();
        const float corr = sC[r];
#pragma unroll
        for (int u = 0; u < SC_MAXU; ++u) acc[u] *= corr;
        for (int cc = 0; cc < T; ++cc) {
            const float p = sP[r * (T + 1) + cc];
            const float* vr = sV + cc * (dv + 1);
#pragma unroll
            for (int u = 0; u < SC_MAXU; ++u) {
                const int j = cl + TPR * u;
                if (j < dv) acc[u] = fmaf(p, vr[j], acc[u]);
            }
        }
    }
    const int row = q0 + r;
    if (row < L) {
        const float inv = 1.0f / sL[r];
#pragma unroll
        for (int u = 0; u < SC_MAXU; ++u) {
            const int j = cl + TPR * u;
            if (j < dv) store_as<In>(o, (head * L + row) * dv + j, acc[u] * inv);
        }
        if (cl == 0) lse[head * L + row] = sM[r] + logf(sL[r]);
    }
}

// dq pass: one CTA per T query rows. Shared: Q [T][d+1], dO [T][dv+1],
// K [T][d+1], V [T][dv+1], dS [T][T+1].
template <class In, int T>
__device__ __forceinline__ void attn_dq_sc(const void* q, const void* k, const void* v, const void* d_o,
                                           const float* lse, const float* dsum, void* dq, int L, int S, int d, int dv,
                                           float scale) {
    constexpr int TPR = SC_THREADS / T, SPT = T / TPR;
    float* sQ = (float*)attn_smem;
    float* sdO = sQ + T * (d + 1);
    float* sK = sdO + T * (dv + 1);
    float* sV = sK + T * (d + 1);
    float* sS = sV + T * (dv + 1);
    const int tiles = (L + T - 1) / T;
    const u64 head = blockIdx.x / tiles;
    const int q0 = (blockIdx.x % tiles) * T;
    const int r = threadIdx.x / TPR, cl = threadIdx.x % TPR;
    const int row = q0 + r;
    sc_tile_load<In>(sQ, q, head * L * d, q0, T, L, d);
    sc_tile_load<In>(sdO, d_o, head * L * dv, q0, T, L, dv);
    const float lr = row < L ? lse[head * L + row] : 0.0f, dr = row < L ? dsum[head * L + row] : 0.0f;
    float acc[SC_MAXU];
#pragma unroll
    for (int u = 0; u < SC_MAXU; ++u) acc[u] = 0.0f;
    for (int k0 = 0; k0 < S; k0 += T) {
        __syncthreads();  // every thread is done with the previous K and dS
        sc_tile_load<In>(sK, k, head * S * d, k0, T, S, d);
        sc_tile_load<In>(sV, v, head * S * dv, k0, T, S, dv);
        __syncthreads();
        float x[SPT], dp[SPT];
        sc_dots<SPT, TPR>(x, sQ + r * (d + 1), sK + cl * (d + 1), d);
        sc_dots<SPT, TPR>(dp, sdO + r * (dv + 1), sV + cl * (dv + 1), dv);
#pragma unroll
        for (int i = 0; i < SPT; ++i) {
            const int cc = cl + TPR * i;
            const float p = k0 + cc < S ? expf(x[i] * scale - lr) : 0.0f;
            sS[r * (T + 1) + cc] = p * (dp[i] - dr);
        }
        __syncthreads();
        for (int cc = 0; cc < T; ++cc) {
            const float ds = sS[r * (T + 1) + cc];
            const float* kr = sK + cc * (d + 1);
#pragma unroll
            for (int u = 0; u < SC_MAXU; ++u) {
                const int x = cl + TPR * u;
                if (x < d) acc[u] = fmaf(ds, kr[x], acc[u]);
            }
        }
    }
    if (row < L) {
#pragma unroll
        for (int u = 0; u < SC_MAXU; ++u) {
            const int x = cl + TPR * u;
            if (x < d) store_as<In>(dq, (head * L + row) * d + x, acc[u] * scale);
        }
    }
}

// dk/dv pass: one CTA per T key rows. Shared: K [T][d+1], V [T][dv+1],
// Q [T][d+1], dO [T][dv+1], P^T [T][T+1], dS^T [T][T+1], then lse and D [T].
template <class In, int T>
__device__ __forceinline__ void attn_dkdv_sc(const void* q, const void* k, const void* v, const void* d_o,
                                             const float* lse, const float* dsum, void* dk, void* dv_out, int L,
                                             int S, int d, int dv, float scale) {
    constexpr int TPR = SC_THREADS / T, SPT = T / TPR;
    float* sK = (float*)attn_smem;
    float* sV = sK + T * (d + 1);
    float* sQ = sV + T * (dv + 1);
    float* sdO = sQ + T * (d + 1);
    float* sP = sdO + T * (dv + 1);
    float* sS = sP + T * (T + 1);
    float* sLse = sS + T * (T + 1);
    float* sD = sLse + T;
    const int tiles = (S + T - 1) / T;
    const u64 head = blockIdx.x / tiles;
    const int k0 = (blockIdx.x % tiles) * T;
    const int r = threadIdx.x / TPR, cl = threadIdx.x % TPR;
    sc_tile_load<In>(sK, k, head * S * d, k0, T, S, d);
    sc_tile_load<In>(sV, v, head * S * dv, k0, T, S, dv);
    float adk[SC_MAXU], adv[SC_MAXU];
#pragma unroll
    for (int u = 0; u < SC_MAXU; ++u) adk[u] = adv[u] = 0.0f;
    for (int q0 = 0; q0 < L; q0 += T) {
        __syncthreads();  // every thread is done with the previous Q, dO, P and dS
        sc_tile_load<In>(sQ, q, head * L * d, q0, T, L, d);
        sc_tile_load<In>(sdO, d_o, head * L * dv, q0, T, L, dv);
        if (threadIdx.x < T) {
            // Padding queries get lse = +inf, so p = 0.
            const int qr = q0 + threadIdx.x;
            sLse[threadIdx.x] = qr < L ? lse[head * L + qr] : pos_inf();
            sD[threadIdx.x] = qr < L ? dsum[head * L + qr] : 0.0f;
        }
        __syncthreads();
        float x[SPT], dp[SPT];
        sc_dots<SPT, TPR>(x, sK + r * (d + 1), sQ + cl * (d + 1), d);
        sc_dots<SPT, TPR>(dp, sV + r * (dv + 1), sdO + cl * (dv + 1), dv);
#pragma unroll
        for (int i = 0; i < SPT; ++i) {
            const int qc = cl + TPR * i;
            const float p = expf(x[i] * scale - sLse[qc]);
            sP[r * (T + 1) + qc] = p;
            sS[r * (T + 1) + qc] = p * (dp[i] - sD[qc]);
        }
        __syncthreads();
        for (int qc = 0; qc < T; ++qc) {
            const float p = sP[r * (T + 1) + qc], ds = sS[r * (T + 1) + qc];
            const float* qrow = sQ + qc * (d + 1);
            const float* grow = sdO + qc * (dv + 1);
#pragma unroll
            for (int u = 0; u < SC_MAXU; ++u) {
                const int x = cl + TPR * u;
                if (x < dv) adv[u] = fmaf(p, grow[x], adv[u]);
                if (x < d) adk[u] = fmaf(ds, qrow[x], adk[u]);
            }
        }
    }
    const int key = k0 + r;
    if (key < S) {
#pragma unroll
        for (int u = 0; u < SC_MAXU; ++u) {
            const int x = cl + TPR * u;
            if (x < d) store_as<In>(dk, (head * S + key) * d + x, adk[u] * scale);
            if (x < dv) store_as<In>(dv_out, (head * S + key) * dv + x, adv[u]);
        }
    }
}

#define ATTN_SCALAR_KERNELS(NAME, IN, T)                                                                              \
    extern "C" __global__ void __launch_bounds__(SC_THREADS)                                                          \
        attn_fwd_##NAME##_t##T(const void* q, const void* k, const void* v, void* o, float* lse, int L, int S, int d, \
                               int dv, float scale) {                                                                 \
        attn_fwd_sc<IN, T>(q, k, v, o, lse, L, S, d, dv, scale);                                                      \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(SC_THREADS)                                                          \
        attn_dq_##NAME##_t##T(const void* q, const void* k, const void* v, const void* d_o, const float* lse,         \
                              const float* dsum, void* dq, int L, int S, int d, int dv, float scale) {                \
        attn_dq_sc<IN, T>(q, k, v, d_o, lse, dsum, dq, L, S, d, dv, scale);                                           \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(SC_THREADS)                                                          \
        attn_dkdv_##NAME##_t##T(const void* q, const void* k, const void* v, const void* d_o, const float* lse,       \
                                const float* dsum, void* dk, void* dv_out, int L, int S, int d, int dv,               \
                                float scale) {                                                                        \
        attn_dkdv_sc<IN, T>(q, k, v, d_o, lse, dsum, dk, dv_out, L, S, d, dv, scale);                                 \
    }

ATTN_SCALAR_KERNELS(f32, InF32, 32)
ATTN_SCALAR_KERNELS(f32, InF32, 16)
ATTN_SCALAR_KERNELS(bf16, InBF16, 32)
ATTN_SCALAR_KERNELS(bf16, InBF16, 16)
