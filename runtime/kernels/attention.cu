// Fused attention, flash-attention 2 style, forward and backward: the
// kernels of the CUDA backend's AttentionBackend (runtime/src/cuda/attention.rs).
// The CPU reference is runtime/src/cpu/attention.rs.
//
// Per head (blockIdx.x = head * tiles + tile), packed row-major: q [L, d],
// k [S, d], v [S, dv], o and dO [L, dv], lse and D [L] (f32). Scores are
// t = scale * q.k. The forward keeps a running max m and sum l per row (the
// online softmax) and writes o = sum_j p_j v_j / l and lse = m + ln l. The
// backward recomputes p = exp(t - lse) tile by tile, with D = rowsum(dO * o)
// (attn_dsum): dv = p^T dO, ds = p (dO v^T - D), dq = scale ds k and
// dk = scale ds^T q. No [L, S] buffer exists in global memory. The backward
// is a dq pass over query tiles and a dk/dv pass over key tiles, so each
// output element has one writer: no atomics, the same bits every run.
//
// Two families, one math:
//   attn_{fwd,dq,dkdv}_mma_d{D}: BF16 on tensor cores, d = dv = D. A CTA
//     is 4 warps; each warp owns 16 rows (query rows in the forward and dq
//     pass, key rows in the dk/dv pass; 32 in the forward at D = 128) and
//     steps over 64 columns at a time (32 in the backward and in the
//     forward at D = 128).
//     Operands go global -> shared by async copies into tiles whose rows are
//     padded by 8 elements (so the 8 rows of an ldmatrix phase fall in 8
//     different bank groups), shared -> registers by ldmatrix, and scores
//     stay in MMA accumulators: a pair of m16n8 C fragments is the m16k16 A
//     fragment of the next product (P V, dS K, ...), so P and dS never go
//     to memory. Scores are taken to base 2: p = exp2_approx(t log2 e - m),
//     one fused multiply-add and the hardware's exp2 a probability; only a
//     ragged last block masks keys. The tile loops are issue-bound (ncu:
//     about half the issue slots busy, the integer pipe the busiest), so
//     instructions per score are what these choices save. The mma,
//     ldmatrix, async-copy, quad-reduction, exp2 and vote primitives come
//     from the shim prepended to this file (attention_mma_cuda.cuh on CUDA).
//   attn_{fwd,dq,dkdv}_{f32,bf16}_t{T} (attention_scalar.cu, after this file
//     in the module): any d, dv <= 256 (T = 32 when both
//     are <= 128, else 16), f32 FMA on tiles of T rows held in shared memory
//     as f32; exponents are expf of the CPU's differences.
//
// Shared memory is the dynamic attn_smem only, carved as each kernel's
// comment says; the host sizes it with the same formulas.

#define ATTN_LOG2E 1.4426950408889634f
#define ATTN_LN2 0.6931471805599453f
// How far (base 2) a row's block maximum may pass the forward's running max
// before the accumulators are rescaled to it: p stays below 2^8.
#define RESCALE_LOG2 8.0f

extern __shared__ Vec16 attn_smem[];

__device__ __forceinline__ float neg_inf() { return u2f(0xFF800000u); }
__device__ __forceinline__ float pos_inf() { return u2f(0x7F800000u); }

// ---------------------------------------------------------------------------
// Tensor-core path (BF16, d = dv = D, D a multiple of 16)

#define MMA_WARPS 4
#define MMA_THREADS (32 * MMA_WARPS)
// Rows a CTA owns, 16 per warp.
#define MMA_ROWS (16 * MMA_WARPS)
// Columns per step of the inner loop: keys in the forward (MMA_COLS) and
// the dq pass (DQ_BN), queries in the dk/dv pass (DKDV_BN). The backward
// holds two score blocks (p and dp) beside its accumulators, so it takes
// fewer columns at a time: at D = 128 that keeps every kernel within 255
// registers without spills (ptxas -v: dq 248, dk/dv 244). The forward is
// asked for three CTAs an SM (12 warps to hide its two barriers a block):
// 168 registers at D = 128, no spills.
#define MMA_COLS 64
#define DQ_BN 32
#define DKDV_BN 32

// `rows` rows of a packed [n, W] bf16 matrix from row `row0` into a shared
// tile of row stride W + 8, by async copies; rows at or past n are zero.
template <int W>
__device__ __forceinline__ void tile_load(u16* s, const u16* g, int row0, int rows, int n) {
    constexpr int CH = W / 8;  // 16-byte chunks per row
    for (int c = threadIdx.x; c < rows * CH; c += MMA_THREADS) {
        const int r = c / CH, ch = c % CH;
        u16* dst = s + r * (W + 8) + ch * 8;
        if (row0 + r < n) {
            async_copy_16(dst, g + (u64)(row0 + r) * W + ch * 8);
        } else {
            async_zero_16(dst);
        }
    }
}

// Offset of the row this lane addresses when ldmatrix.x4 reads the 16 x 16
// block at (r0, c0) of a tile of row stride ST as the matrices
// [rows 0-7 cols 0-7, rows 8-15 cols 0-7, rows 0-7 cols 8-15, rows 8-15 cols 8-15]:
// an A fragment; or, with .trans, the B fragments of the n-tiles c0 and
// c0 + 8 (registers 0-1 and 2-3) of a tile stored k x n.
template <int ST>
__device__ __forceinline__ int ldm_a(int r0, int c0) {
    const int lane = threadIdx.x & 31;
    return (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ST + c0 + (lane >> 4) * 8;
}

// The same for the matrices
// [rows 0-7 cols 0-7, rows 0-7 cols 8-15, rows 8-15 cols 0-7, rows 8-15 cols 8-15]:
// the B fragments of the n-tiles r0 and r0 + 8 (registers 0-1 and 2-3) of a
// tile stored n x k, k-step c0.
template <int ST>
__device__ __forceinline__ int ldm_b(int r0, int c0) {
    const int lane = threadIdx.x & 31;
    return (r0 + (lane & 7) + (lane >> 4) * 8) * ST + c0 + ((lane >> 3) & 1) * 8;
}

// acc[NT][4] += A B^T summed over k < W, for the NT * 8 rows of tile b
// (stored n x k: keys against queries, or the reverse), the A fragments
// given per k-step.
template <int W, int NT>
__device__ __forceinline__ void mma_abt_frags(float acc[][4], const u32 af[][4], const u16* b) {
#pragma unroll
    for (int kk = 0; kk < W / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            u32 bf[4];
            ldmatrix_x4(bf, b + ldm_b<W + 8>(np * 16, kk * 16));
            mma_bf16_16x8x16(acc[2 * np], af[kk], bf);
            mma_bf16_16x8x16(acc[2 * np + 1], af[kk], bf + 2);
        }
    }
}

// acc[MT][NT][4] += A B^T summed over k < W: A = MT blocks of 16 rows of
// tile a from row r0, B = the NT * 8 rows of tile b (both of row stride
// W + 8). Each B fragment serves all MT row blocks: with MT = 2 a warp
// reads half the shared memory per MMA that MT = 1 does.
template <int W, int NT, int MT>
__device__ __forceinline__ void mma_abt_mt(float acc[][NT][4], const u16* a, int r0, const u16* b) {
#pragma unroll
    for (int kk = 0; kk < W / 16; ++kk) {
        u32 af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(af[mt], a + ldm_a<W + 8>(r0 + 16 * mt, kk * 16));
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            u32 bf[4];
            ldmatrix_x4(bf, b + ldm_b<W + 8>(np * 16, kk * 16));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma_bf16_16x8x16(acc[mt][2 * np], af[mt], bf);
                mma_bf16_16x8x16(acc[mt][2 * np + 1], af[mt], bf + 2);
            }
        }
    }
}

// mma_abt_mt for one block of 16 rows.
template <int W, int NT>
__device__ __forceinline__ void mma_abt(float acc[][4], const u16* a, int r0, const u16* b) {
    mma_abt_mt<W, NT, 1>((float(*)[NT][4])acc, a, r0, b);
}

// acc[MT][W / 8][4] += P B: P = MT blocks of a warp's 16 x 16 NK values,
// each held as 2 NK C fragments (f32, rounded to bf16 here), B = the first
// 16 NK rows of tile b stored k x n (n = W, row stride W + 8), read
// transposed; each B fragment serves all MT blocks.
template <int NK, int W, int MT>
__device__ __forceinline__ void mma_pb_mt(float acc[][W / 8][4], const float p[][2 * NK][4], const u16* b) {
#pragma unroll
    for (int kk = 0; kk < NK; ++kk) {
        // C fragments 2 kk and 2 kk + 1 are the A fragment of k-step kk.
        u32 af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const float(*c)[4] = p[mt] + 2 * kk;
            af[mt][0] = pack_bf16x2(c[0][0], c[0][1]);
            af[mt][1] = pack_bf16x2(c[0][2], c[0][3]);
            af[mt][2] = pack_bf16x2(c[1][0], c[1][1]);
            af[mt][3] = pack_bf16x2(c[1][2], c[1][3]);
        }
#pragma unroll
        for (int np = 0; np < W / 16; ++np) {
            u32 bf[4];
            ldmatrix_x4_trans(bf, b + ldm_a<W + 8>(kk * 16, np * 16));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma_bf16_16x8x16(acc[mt][2 * np], af[mt], bf);
                mma_bf16_16x8x16(acc[mt][2 * np + 1], af[mt], bf + 2);
            }
        }
    }
}

// mma_pb_mt for one block of 16 rows.
template <int NK, int W>
__device__ __forceinline__ void mma_pb(float acc[][4], const float p[][4], const u16* b) {
    mma_pb_mt<NK, W, 1>((float(*)[W / 8][4])acc, (const float(*)[2 * NK][4])p, b);
}

template <int N>
__device__ __forceinline__ void zero_frags(float a[][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j) a[j][0] = a[j][1] = a[j][2] = a[j][3] = 0.0f;
}

// Rows `row0` and `row0 + 8` (C fragment rows g and g + 8) of acc times
// `mul`, as bf16 into a packed [n, W] matrix; rows at or past n are skipped.
template <int W>
__device__ __forceinline__ void store_frags(u16* out, const float acc[][4], int row0, int n, float mul0, float mul1) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int j = 0; j < W / 8; ++j) {
        const int col = j * 8 + 2 * t;
        if (row0 < n) *(u32*)(out + (u64)row0 * W + col) = pack_bf16x2(acc[j][0] * mul0, acc[j][1] * mul0);
        if (row0 + 8 < n) *(u32*)(out + (u64)(row0 + 8) * W + col) = pack_bf16x2(acc[j][2] * mul1, acc[j][3] * mul1);
    }
}

// Forward: one CTA per 64 MT query rows, over every key block; each warp
// owns MT blocks of 16 rows. Shared: the K and V tiles [64][D + 8]. With
// MT = 1 the Q tile is staged in the same space first and each warp keeps
// its 16 rows of Q in registers as A fragments; with MT = 2 (D = 128, where
// those registers go to the second block's accumulators) the Q tile
// [128][D + 8] stays in shared memory after V. V's copy overlaps the
// scores, the next K's overlaps P V.
template <int D, int MT, int BN>
__device__ __forceinline__ void attn_fwd_mma(const u16* q, const u16* k, const u16* v, u16* o, float* lse, int L,
                                             int S, float scale) {
    constexpr int ST = D + 8, NT = BN / 8, ROWS = MMA_ROWS * MT;
    constexpr bool Q_REGS = MT == 1;
    u16* sK = (u16*)attn_smem;
    u16* sV = sK + BN * ST;
    u16* sQ = Q_REGS ? sK : sV + BN * ST;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = lane & 3;
    const int tiles = (L + ROWS - 1) / ROWS;
    const u64 head = blockIdx.x / tiles;
    const int q0 = (blockIdx.x % tiles) * ROWS;
    const int r0 = warp * 16 * MT;  // this warp's first row in the tile
    q += head * L * D;
    k += head * S * D;
    v += head * S * D;
    o += head * L * D;
    lse += head * L;

    tile_load<D>(sQ, q, q0, ROWS, L);
    async_commit();
    async_wait_all();
    __syncthreads();
    u32 qf[Q_REGS ? D / 16 : 1][4];
    if (Q_REGS) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], sQ + ldm_a<ST>(r0, kk * 16));
        __syncthreads();  // K and V overwrite the Q tile
    }
    tile_load<D>(sK, k, 0, BN, S);
    async_commit();

    float acc[MT][D / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) zero_frags<D / 8>(acc[mt]);
    // Rows g and g + 8 of each block: running max (base 2) and this lane's
    // part of the running sum (the quad's parts are added at the end).
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = neg_inf(), l[mt][0] = l[mt][1] = 0.0f;
    const float c = scale * ATTN_LOG2E;
    const int blocks = (S + BN - 1) / BN;
    async_wait_all();
    __syncthreads();
    for (int kb = 0; kb < blocks; ++kb) {
        const int k0 = kb * BN;
        tile_load<D>(sV, v, k0, BN, S);
        async_commit();
        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) zero_frags<NT>(s[mt]);
        if (Q_REGS) {
            mma_abt_frags<D, NT>(s[0], qf, sK);
        } else {
            mma_abt_mt<D, NT, MT>(s, sQ, r0, sK);
        }
        // Keys at or past S drop out (only the last block has any).
        if (k0 + BN > S) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                for (int j = 0; j < NT; ++j) {
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (k0 + j * 8 + 2 * t + (e & 1) >= S) s[mt][j][e] = neg_inf();
                }
            }
        }
        // Block maxima in base-2 units (c > 0 and rounding are monotonic, so
        // c max(t) = max(c t)). The running max only moves when some row of
        // the warp gains more than RESCALE_LOG2 on it (always in the first
        // block, where it is -inf); otherwise p = 2^(t c - m) stays at most
        // 2^RESCALE_LOG2 and acc and l keep their scale. Either way o and
        // lse, taken against the same m, are exact.
        float bm[MT][2];
        bool grow = false;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            float mx0 = neg_inf(), mx1 = neg_inf();
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                mx0 = fmaxf(mx0, fmaxf(s[mt][j][0], s[mt][j][1]));
                mx1 = fmaxf(mx1, fmaxf(s[mt][j][2], s[mt][j][3]));
            }
            bm[mt][0] = quad_max(mx0) * c;
            bm[mt][1] = quad_max(mx1) * c;
            grow |= bm[mt][0] > m[mt][0] + RESCALE_LOG2 || bm[mt][1] > m[mt][1] + RESCALE_LOG2;
        }
        if (warp_any(grow)) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    // The first block has a key, so bm is finite and 2^(-inf - bm) = 0.
                    const float mn = fmaxf(m[mt][h], bm[mt][h]);
                    const float corr = mn == m[mt][h] ? 1.0f : exp2_approx(m[mt][h] - mn);
                    m[mt][h] = mn;
                    l[mt][h] *= corr;
#pragma unroll
                    for (int j = 0; j < D / 8; ++j) {
                        acc[mt][j][2 * h] *= corr;
                        acc[mt][j][2 * h + 1] *= corr;
                    }
                }
            }
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const float n0 = -m[mt][0], n1 = -m[mt][1];
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                s[mt][j][0] = exp2_approx(fmaf(s[mt][j][0], c, n0));
                s[mt][j][1] = exp2_approx(fmaf(s[mt][j][1], c, n0));
                s[mt][j][2] = exp2_approx(fmaf(s[mt][j][2], c, n1));
                s[mt][j][3] = exp2_approx(fmaf(s[mt][j][3], c, n1));
                l[mt][0] += s[mt][j][0] + s[mt][j][1];
                l[mt][1] += s[mt][j][2] + s[mt][j][3];
            }
        }
        async_wait_all();
        __syncthreads();  // V is in; every warp is done with K
        if (kb + 1 < blocks) tile_load<D>(sK, k, k0 + BN, BN, S);
        async_commit();
        mma_pb_mt<BN / 16, D, MT>(acc, s, sV);
        async_wait_all();
        __syncthreads();  // the next K is in; every warp is done with V
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const float l0 = quad_sum(l[mt][0]), l1 = quad_sum(l[mt][1]);
        const int row0 = q0 + r0 + 16 * mt + (lane >> 2);
        store_frags<D>(o, acc[mt], row0, L, 1.0f / l0, 1.0f / l1);
        if (t == 0) {
            if (row0 < L) lse[row0] = (m[mt][0] + log2f(l0)) * ATTN_LN2;
            if (row0 + 8 < L) lse[row0 + 8] = (m[mt][1] + log2f(l1)) * ATTN_LN2;
        }
    }
}

// dq pass: one CTA per 64 query rows, over every block of BN keys. Shared:
// the Q and dO tiles [64][D + 8] (read once: each warp keeps its rows of
// both as A fragments in registers), then two buffers of K and V tiles
// [BN][D + 8] ((2 x 64 + 4 BN) (D + 8) bf16): the next block's copies
// overlap this block's math.
template <int D, int BN>
__device__ __forceinline__ void attn_dq_mma(const u16* q, const u16* k, const u16* v, const u16* d_o, const float* lse,
                                            const float* dsum, u16* dq, int L, int S, float scale) {
    constexpr int ST = D + 8, NT = BN / 8, QT = MMA_ROWS * ST, KT = BN * ST;
    u16* sQ = (u16*)attn_smem;
    u16* sdO = sQ + QT;
    u16* sKV = sdO + QT;  // buffer b: K at sKV + 2 b KT, V after it
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = lane & 3;
    const int tiles = (L + MMA_ROWS - 1) / MMA_ROWS;
    const u64 head = blockIdx.x / tiles;
    const int q0 = (blockIdx.x % tiles) * MMA_ROWS;
    q += head * L * D;
    k += head * S * D;
    v += head * S * D;
    d_o += head * L * D;
    dq += head * L * D;
    lse += head * L;
    dsum += head * L;

    tile_load<D>(sQ, q, q0, MMA_ROWS, L);
    tile_load<D>(sdO, d_o, q0, MMA_ROWS, L);
    tile_load<D>(sKV, k, 0, BN, S);
    tile_load<D>(sKV + KT, v, 0, BN, S);
    async_commit();
    const int row0 = q0 + warp * 16 + (lane >> 2), row1 = row0 + 8;
    // Padding rows get finite statistics: their dO is 0, so their ds is 0.
    const float lse0 = row0 < L ? lse[row0] * ATTN_LOG2E : 0.0f;
    const float lse1 = row1 < L ? lse[row1] * ATTN_LOG2E : 0.0f;
    const float d0 = row0 < L ? dsum[row0] : 0.0f, d1 = row1 < L ? dsum[row1] : 0.0f;
    const float c = scale * ATTN_LOG2E;
    float acc[D / 8][4];
    zero_frags<D / 8>(acc);
    u32 qf[D / 16][4], gf[D / 16][4];
    const int blocks = (S + BN - 1) / BN;
    for (int kb = 0; kb < blocks; ++kb) {
        const int k0 = kb * BN;
        if (kb + 1 < blocks) {
            u16* next = sKV + ((kb + 1) & 1) * 2 * KT;
            tile_load<D>(next, k, k0 + BN, BN, S);
            tile_load<D>(next + KT, v, k0 + BN, BN, S);
        }
        async_commit();
        async_wait_all_but_last();
        __syncthreads();  // this block's K and V (and Q, dO) are in
        const u16* cK = sKV + (kb & 1) * 2 * KT;
        const u16* cV = cK + KT;
        if (kb == 0) {
            // Q and dO are the A operands of every block: keep this warp's rows in registers.
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                ldmatrix_x4(qf[kk], sQ + ldm_a<ST>(warp * 16, kk * 16));
                ldmatrix_x4(gf[kk], sdO + ldm_a<ST>(warp * 16, kk * 16));
            }
        }
        float s[NT][4], dp[NT][4];
        zero_frags<NT>(s);
        zero_frags<NT>(dp);
        mma_abt_frags<D, NT>(s, qf, cK);
        mma_abt_frags<D, NT>(dp, gf, cV);
        // ds = p (dp - D), p = 0 for keys at or past S (only the last block
        // has any: their t = -inf).
        if (k0 + BN > S) {
#pragma unroll
            for (int j = 0; j < NT; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (k0 + j * 8 + 2 * t + (e & 1) >= S) s[j][e] = neg_inf();
            }
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float nl = e < 2 ? -lse0 : -lse1, dr = e < 2 ? d0 : d1;
                s[j][e] = exp2_approx(fmaf(s[j][e], c, nl)) * (dp[j][e] - dr);
            }
        }
        mma_pb<BN / 16, D>(acc, s, cK);  // dq += ds k
        __syncthreads();  // every warp is done with this buffer before it is refilled
    }
    store_frags<D>(dq, acc, row0, L, scale, scale);
}

// dk/dv pass: one CTA per 64 key rows, over every block of BN queries.
// Shared: the K and V tiles [64][D + 8], then two buffers of Q and dO tiles
// [BN][D + 8], then two buffers of lse log2 e and D [BN] f32 each
// ((2 x 64 + 4 BN) (D + 8) bf16 + 4 BN f32). The scores are transposed:
// each warp's rows are keys, its columns queries.
template <int D, int BN>
__device__ __forceinline__ void attn_dkdv_mma(const u16* q, const u16* k, const u16* v, const u16* d_o,
                                              const float* lse, const float* dsum, u16* dk, u16* dv, int L, int S,
                                              float scale) {
    constexpr int ST = D + 8, NT = BN / 8, KT = MMA_ROWS * ST, QT = BN * ST;
    u16* sK = (u16*)attn_smem;
    u16* sV = sK + KT;
    u16* sQdO = sV + KT;                      // buffer b: Q at sQdO + 2 b QT, dO after it
    float* sStat = (float*)(sQdO + 4 * QT);  // buffer b: lse log2 e at sStat + 2 b BN, D after it
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = lane & 3;
    const int tiles = (S + MMA_ROWS - 1) / MMA_ROWS;
    const u64 head = blockIdx.x / tiles;
    const int k0 = (blockIdx.x % tiles) * MMA_ROWS;
    q += head * L * D;
    k += head * S * D;
    v += head * S * D;
    d_o += head * L * D;
    dk += head * S * D;
    dv += head * S * D;
    lse += head * L;
    dsum += head * L;

    tile_load<D>(sK, k, k0, MMA_ROWS, S);
    tile_load<D>(sV, v, k0, MMA_ROWS, S);
    const int blocks = (L + BN - 1) / BN;
    // Query block qb into buffer b. Padding queries get lse = +inf, so p = 0.
    auto stage = [&](int b, int qb) {
        const int first = qb * BN;
        tile_load<D>(sQdO + 2 * b * QT, q, first, BN, L);
        tile_load<D>(sQdO + (2 * b + 1) * QT, d_o, first, BN, L);
        for (int i = threadIdx.x; i < BN; i += MMA_THREADS) {
            const int r = first + i;
            sStat[2 * BN * b + i] = r < L ? lse[r] * ATTN_LOG2E : pos_inf();
            sStat[2 * BN * b + BN + i] = r < L ? dsum[r] : 0.0f;
        }
    };
    if (blocks > 0) stage(0, 0);
    async_commit();
    const float c = scale * ATTN_LOG2E;
    float adk[D / 8][4], adv[D / 8][4];
    zero_frags<D / 8>(adk);
    zero_frags<D / 8>(adv);
    // K and V are the A operands of every block. Up to D = 64 each warp keeps
    // its rows of both in registers; at 128 they do not fit beside the two
    // accumulators and are read from shared memory each time.
    constexpr bool KV_REGS = D <= 64;
    u32 kf[KV_REGS ? D / 16 : 1][4], vf[KV_REGS ? D / 16 : 1][4];
    for (int qb = 0; qb < blocks; ++qb) {
        if (qb + 1 < blocks) stage((qb + 1) & 1, qb + 1);
        async_commit();
        async_wait_all_but_last();
        __syncthreads();  // this block's Q, dO and statistics (and K, V) are in
        const u16* cQ = sQdO + 2 * (qb & 1) * QT;
        const u16* cdO = cQ + QT;
        const float* cL = sStat + 2 * BN * (qb & 1);
        const float* cD = cL + BN;
        float s[NT][4];
        zero_frags<NT>(s);
        if (KV_REGS) {
            if (qb == 0) {
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    ldmatrix_x4(kf[kk], sK + ldm_a<ST>(warp * 16, kk * 16));
                    ldmatrix_x4(vf[kk], sV + ldm_a<ST>(warp * 16, kk * 16));
                }
            }
            mma_abt_frags<D, NT>(s, kf, cQ);
        } else {
            mma_abt<D, NT>(s, sK, warp * 16, cQ);
        }
        // p^T; fragment columns 2t and 2t + 1 of n-tile j are queries 8j + 2t (+1).
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const float la = cL[8 * j + 2 * t], lb = cL[8 * j + 2 * t + 1];
            s[j][0] = exp2_approx(fmaf(s[j][0], c, -la));
            s[j][1] = exp2_approx(fmaf(s[j][1], c, -lb));
            s[j][2] = exp2_approx(fmaf(s[j][2], c, -la));
            s[j][3] = exp2_approx(fmaf(s[j][3], c, -lb));
        }
        mma_pb<BN / 16, D>(adv, s, cdO);  // dv += p^T dO
        float dp[NT][4];
        zero_frags<NT>(dp);
        if (KV_REGS) {
            mma_abt_frags<D, NT>(dp, vf, cdO);  // dp^T = v dO^T
        } else {
            mma_abt<D, NT>(dp, sV, warp * 16, cdO);
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const float da = cD[8 * j + 2 * t], db = cD[8 * j + 2 * t + 1];
            dp[j][0] = s[j][0] * (dp[j][0] - da);
            dp[j][1] = s[j][1] * (dp[j][1] - db);
            dp[j][2] = s[j][2] * (dp[j][2] - da);
            dp[j][3] = s[j][3] * (dp[j][3] - db);
        }
        mma_pb<BN / 16, D>(adk, dp, cQ);  // dk += ds^T q
        __syncthreads();  // every warp is done with this buffer before it is refilled
    }
    async_wait_all();  // with no query block, K and V may still be landing
    const int row0 = k0 + warp * 16 + (lane >> 2);
    store_frags<D>(dk, adk, row0, S, scale, scale);
    store_frags<D>(dv, adv, row0, S, 1.0f, 1.0f);
}

// FWD_MT: blocks of 16 query rows per warp in the forward (FWD_M_TILES in
// cuda/attention.rs); three CTAs an SM with one, two with two.
#define ATTN_MMA_KERNELS(D, FWD_MT)                                                                                   \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS, FWD_MT == 1 ? 3 : 2)                                    \
        attn_fwd_mma_d##D(const u16* q, const u16* k, const u16* v, u16* o, float* lse, int L, int S, float scale) {  \
        attn_fwd_mma<D, FWD_MT, 64 / FWD_MT>(q, k, v, o, lse, L, S, scale);                                              \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS)                                                         \
        attn_dq_mma_d##D(const u16* q, const u16* k, const u16* v, const u16* d_o, const float* lse,                  \
                         const float* dsum, u16* dq, int L, int S, float scale) {                                     \
        attn_dq_mma<D, DQ_BN>(q, k, v, d_o, lse, dsum, dq, L, S, scale);                                             \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS)                                                         \
        attn_dkdv_mma_d##D(const u16* q, const u16* k, const u16* v, const u16* d_o, const float* lse,                \
                           const float* dsum, u16* dk, u16* dv, int L, int S, float scale) {                          \
        attn_dkdv_mma<D, DKDV_BN>(q, k, v, d_o, lse, dsum, dk, dv, L, S, scale);                                     \
    }

ATTN_MMA_KERNELS(32, 1)
ATTN_MMA_KERNELS(64, 1)
ATTN_MMA_KERNELS(128, 2)

// ---------------------------------------------------------------------------
// D = rowsum(dO * o), f32, summed in order along the row like the CPU
// (--fmad=false keeps each product rounded). A block of DSUM_WARPS warps
// takes 32 rows a warp. For each 32 columns the warp's lanes read the rows'
// products coalesced (lane j: column j of each row) into the warp's shared
// tile; then lane i adds row i's products in column order.

#define DSUM_WARPS 8

template <class In>
__device__ __forceinline__ void attn_dsum(const void* o, const void* d_o, float* dsum, u64 rows, int dv) {
    __shared__ float tiles[DSUM_WARPS][32][33];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float(*tile)[33] = tiles[warp];
    const u64 r0 = ((u64)blockIdx.x * DSUM_WARPS + warp) * 32;
    float acc = 0.0f;
    for (int c0 = 0; c0 < dv; c0 += 32) {
        const int c = c0 + lane;
        for (int i = 0; i < 32; ++i) {
            const u64 r = r0 + i;
            if (r < rows && c < dv) tile[i][lane] = In::load(o, r * dv + c) * In::load(d_o, r * dv + c);
        }
        sync_warp();
        const int n = dv - c0 < 32 ? dv - c0 : 32;
        for (int j = 0; j < n; ++j) acc += tile[lane][j];
        sync_warp();  // the tile is refilled next
    }
    if (r0 + lane < rows) dsum[r0 + lane] = acc;
}

extern "C" __global__ void attn_dsum_f32(const void* o, const void* d_o, float* dsum, u64 rows, int dv) {
    attn_dsum<InF32>(o, d_o, dsum, rows, dv);
}

extern "C" __global__ void attn_dsum_bf16(const void* o, const void* d_o, float* dsum, u64 rows, int dv) {
    attn_dsum<InBF16>(o, d_o, dsum, rows, dv);
}
