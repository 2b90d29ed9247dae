// FP8 rowwise and 128-block scaling (SPEC section 3b; CPU reference:
// runtime/src/quant/fp8_group.rs). E4M3FN codes, one f32 scale per group of
// the axis-last view: a whole row (rowwise) or 128 consecutive elements.
//
// The input is a row-major [rows, cols] matrix (f32 or BF16). A linear asks
// for it along its columns (the "c" direction: axis-last row r is input row
// r, L = cols), along its rows (the "r" direction: axis-last row r is input
// column r, L = rows), or both; both come from two reads of the input:
//   fp8g_amax2d_<in>   one 64 x 64 tile per CTA: the amax of each row piece
//                      and of each column piece (max |x| bits, so NaN > Inf >
//                      finite), reduced in shared memory, one word per piece:
//                      part_c[(c0 / 64) * rows + r], part_r[(r0 / 64) * cols + c]
//                      (partial-major, so the second level reads coalesced);
//   fp8g_scales        per direction, per group the max of its pieces (2
//                      for a block, all of the row for rowwise; with tile2d
//                      per 128 x 128 tile the largest of its groups' amaxes,
//                      reduced in shared memory by a CTA per tile),
//                      scale = SPEC 3's amax_to_scale with fmt_max = 448, and
//                      scale_inv = fl32(1 / scale) in the GEMM's layout; the
//                      largest amax into *flag (the deferred finite check);
//   fp8g_encode2d_<in> one 64 x 64 tile per CTA, read once: codes
//                      satfinite(RNE(fl32(x * scale))), 0 for the padding, in
//                      both directions, each written coalesced: the "c"
//                      codes 16 bytes a thread, the "r" codes through a tile
//                      of code words in shared memory, transposed 4 x 4
//                      bytes at a time in registers;
//   fp8g_dequantize    decode(code) * scale_inv, f32 [r_pad, kp] (the GEMM
//                      operand where no scaled FP8 GEMM runs).
// Per direction: R axis-last rows of L, gpr groups per row, glen elements
// per group (L, at least 1, for rowwise; 128 for blocks), kp the stored row
// length (a multiple of 16 that holds L, or of 128 for blocks) and r_pad R
// rounded up to 16. codes are [r_pad, kp]; the scales (the encoder's
// multipliers) and scale_inv are laid out as the GEMM reads scale_inv
// (cuBLASLt's modes), so every kernel reads and writes them coalesced:
//   vec[g * r_pad + r]       OUTER_VEC_32F (gpr = 1) and VEC128_32F: one
//                            vector over the rows per 128-block, padding 0;
//                            scales[g * r_pad + r] alike
//   blk[(r / 128) * gpr + g] BLK128x128_32F (tile2d): tile row by tile row

#define FP8G_THREADS 256
#define FP8G_TILE 64
#define FP8G_SEG 16
#define FP8G_BLOCK 128

typedef E4M3FN Fp8gFmt;

// The 16 values of input row r from column c, zero outside the input.
template <class In>
__device__ __forceinline__ void fp8g_load16(const void* __restrict__ x, u32 rows, u32 cols, u32 r, u32 c,
                                            float* v) {
    if (r < rows && cols % In::VEC == 0 && c + FP8G_SEG <= cols) {
        constexpr int NV = FP8G_SEG / In::VEC;
        Vec16 q[NV];
#pragma unroll
        for (int k = 0; k < NV; ++k) q[k] = In::load_vec(x, (u64)r * cols + c + k * In::VEC);
#pragma unroll
        for (int k = 0; k < NV; ++k) {
#pragma unroll
            for (int i = 0; i < In::VEC; ++i) v[k * In::VEC + i] = In::elem(q[k], i);
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < FP8G_SEG; ++j) v[j] = r < rows && c + j < cols ? In::load(x, (u64)r * cols + c + j) : 0.0f;
}

// Thread (tr, tc) of a tile owns row tr, columns tc .. tc + 15: four
// threads share a row, so a warp reads 8 whole 64-element row pieces (one
// 128-byte line each for BF16) and writes 8 64-byte runs of codes.
#define FP8G_TPR (FP8G_TILE / FP8G_SEG)
__device__ __forceinline__ u32 fp8g_tr() { return threadIdx.x / FP8G_TPR; }
__device__ __forceinline__ u32 fp8g_tc() { return threadIdx.x % FP8G_TPR * FP8G_SEG; }

// Words per row of the code tile of fp8g_encode2d: 16 (four codes each) and
// one of padding, so that its two access patterns meet at most two lanes to
// a bank.
#define FP8G_TW (FP8G_TILE / 4 + 1)

// The 4 x 4 bytes q[i] (row i, byte j = column j) transposed: out[j] holds
// column j, row i in byte i.
__device__ __forceinline__ void fp8g_transpose4x4(const u32* q, u32* out) {
    const u32 t0 = __byte_perm(q[0], q[1], 0x5140u), t1 = __byte_perm(q[0], q[1], 0x7362u);
    const u32 t2 = __byte_perm(q[2], q[3], 0x5140u), t3 = __byte_perm(q[2], q[3], 0x7362u);
    out[0] = __byte_perm(t0, t2, 0x5410u);
    out[1] = __byte_perm(t0, t2, 0x7632u);
    out[2] = __byte_perm(t1, t3, 0x5410u);
    out[3] = __byte_perm(t1, t3, 0x7632u);
}

template <class In>
__device__ __forceinline__ void fp8g_amax2d(const void* __restrict__ x, u32 rows, u32 cols,
                                            u32* __restrict__ part_c, u32* __restrict__ part_r) {
    __shared__ u32 a[FP8G_TILE][FP8G_TILE + 1];
    __shared__ u32 red_c[4][FP8G_TILE], red_r[4][FP8G_TILE];
    const u32 tiles_x = (cols + FP8G_TILE - 1) / FP8G_TILE;
    const u32 r0 = blockIdx.x / tiles_x * FP8G_TILE, c0 = blockIdx.x % tiles_x * FP8G_TILE;
    const u32 tr = fp8g_tr(), tc = fp8g_tc();
    float v[FP8G_SEG];
    fp8g_load16<In>(x, rows, cols, r0 + tr, c0 + tc, v);
    red_c[tc / FP8G_SEG][tr] = amax_bits<FP8G_SEG>(v);
#pragma unroll
    for (int i = 0; i < FP8G_SEG; ++i) a[tr][tc + i] = f2u(v[i]) & 0x7FFFFFFFu;
    __syncthreads();
    // Thread (quarter q, column j): the max over 16 rows of column j.
    const u32 j = threadIdx.x % FP8G_TILE, q = threadIdx.x / FP8G_TILE;
    u32 m = 0u;
#pragma unroll
    for (int i = 0; i < FP8G_SEG; ++i) m = a[q * FP8G_SEG + i][j] > m ? a[q * FP8G_SEG + i][j] : m;
    red_r[q][j] = m;
    __syncthreads();
    if (q >= 2) return;
    const u32(*red)[FP8G_TILE] = q == 0 ? red_c : red_r;
    m = 0u;
#pragma unroll
    for (int k = 0; k < 4; ++k) m = red[k][j] > m ? red[k][j] : m;
    if (q == 0 && part_c && r0 + j < rows) part_c[(u64)(c0 / FP8G_TILE) * rows + r0 + j] = m;
    if (q == 1 && part_r && c0 + j < cols) part_r[(u64)(r0 / FP8G_TILE) * cols + c0 + j] = m;
}

// The max of part[p * R + r] over p in [p0, p1).
__device__ __forceinline__ u32 fp8g_pieces(const u32* __restrict__ part, u32 R, u32 r, u32 p0, u32 p1) {
    u32 m = 0u;
    for (u32 p = p0; p < p1; ++p) {
        const u32 a = part[(u64)p * R + r];
        m = a > m ? a : m;
    }
    return m;
}

// Group g of row r with amax bits m: its scale and inverse, both at
// g * r_pad + r.
__device__ __forceinline__ float fp8g_put(u32 r, u32 g, u32 m, u32 r_pad, int pow2, float* scales, float* vec) {
    const float s = fp8_amax_to_scale(m, Fp8gFmt::max_value(), pow2);
    scales[(u64)g * r_pad + r] = s;
    vec[(u64)g * r_pad + r] = 1.0f / s;
    return s;
}

// Group g of row r is the pieces [g * ppg, (g + 1) * ppg) of the np of its row.
__device__ __forceinline__ u32 fp8g_group_amax(const u32* __restrict__ part, u32 R, u32 np, u32 ppg, u32 r,
                                               u32 g) {
    const u32 p1 = (g + 1) * ppg < np ? (g + 1) * ppg : np;
    return fp8g_pieces(part, R, r, g * ppg, p1);
}

// Without tile2d, one thread per group; consecutive threads take
// consecutive rows, so the piece reads and the scale stores are coalesced.
// With tile2d, one CTA of 128 threads per 128 x 128 tile (tile row b / gpr,
// group column b % gpr), a thread per row: the tile's amax reduced in shared
// memory, its scale on each of its rows and its inverse in blk.
extern "C" __global__ void __launch_bounds__(FP8G_THREADS)
    fp8g_scales(const u32* __restrict__ part, u32 R, u32 np, u32 ppg, u32 gpr, int tile2d, int pow2, u32 r_pad,
                float* __restrict__ scales, float* __restrict__ vec, float* __restrict__ blk,
                u32* __restrict__ flag) {
    if (!tile2d) {
        // The CTA's largest amax goes to *flag in one atomic (a million
        // threads each hitting one word would queue on it).
        __shared__ u32 cta_max;
        if (threadIdx.x == 0) cta_max = 0u;
        __syncthreads();
        const u64 t = (u64)blockIdx.x * FP8G_THREADS + threadIdx.x;
        if (t < (u64)R * gpr) {
            const u32 r = (u32)(t % R), g = (u32)(t / R);
            const u32 m = fp8g_group_amax(part, R, np, ppg, r, g);
            fp8g_put(r, g, m, r_pad, pow2, scales, vec);
            atomicMax(&cta_max, m);
        }
        __syncthreads();
        if (threadIdx.x == 0) atomicMax(flag, cta_max);
        return;
    }
    __shared__ u32 red[FP8G_BLOCK];
    const u32 tr = blockIdx.x / gpr, g = blockIdx.x % gpr;
    const u32 r = tr * FP8G_BLOCK + threadIdx.x;
    red[threadIdx.x] = r < R ? fp8g_group_amax(part, R, np, ppg, r, g) : 0u;
    for (u32 h = FP8G_BLOCK / 2; h > 0; h /= 2) {
        __syncthreads();
        const u32 i = threadIdx.x;
        if (i < h) red[i] = red[i + h] > red[i] ? red[i + h] : red[i];
    }
    __syncthreads();
    const u32 m = red[0];
    if (r < R) fp8g_put(r, g, m, r_pad, pow2, scales, vec);
    if (threadIdx.x == 0) {
        blk[(u64)tr * gpr + g] = 1.0f / fp8_amax_to_scale(m, Fp8gFmt::max_value(), pow2);
        atomicMax(flag, m);
    }
}

// One direction of fp8g_encode2d (struct Fp8gOut in src/cuda/fp8_group.rs);
// codes null = not wanted.
struct Fp8gOut {
    u8* codes;
    const float* scales;
    u32 kp;
    u32 r_pad;
    u32 glen;
    u32 pad;
};

// Whether s is a finite non-zero scale, which means a finite amax.
__device__ __forceinline__ bool fp8g_fast_scale(float s) { return s > 0.0f && f2u(s) < 0x7F800000u; }

// The codes of q[i] = x[i] * s[i]. With `fast` (every s[i] passes
// fp8g_fast_scale) every product is finite and the fast encoder gives
// encode_rne's bits; otherwise (a group the finite check refuses)
// encode_rne itself. Elements with keep bit i clear (padding) get the zero
// code.
__device__ __forceinline__ Vec16 fp8g_encode16(const float* v, const float* s, bool fast, u32 keep) {
    float q[FP8G_SEG];
#pragma unroll
    for (int i = 0; i < FP8G_SEG; ++i) q[i] = v[i] * s[i];
    Vec16 w;
    if (fast) {
        encode_pack_finite<Fp8gFmt, FP8G_SEG>(q, w.w);
    } else {
        u32 c[FP8G_SEG];
#pragma unroll
        for (int i = 0; i < FP8G_SEG; ++i) c[i] = encode_rne<Fp8gFmt>(q[i]);
        pack_codes<Fp8gFmt, FP8G_SEG>(c, w.w);
    }
    if (keep != (1u << FP8G_SEG) - 1u) {
#pragma unroll
        for (int i = 0; i < FP8G_SEG; ++i) {
            if (!((keep >> i) & 1u)) w.w[i / 4] &= ~(0xFFu << (8 * (i % 4)));
        }
    }
    return w;
}

// Both directions of a 64 x 64 tile of the padded extents (the larger of
// the two directions' per axis; all multiples of 16, so every store is
// whole and aligned).
template <class In>
__device__ __forceinline__ void fp8g_encode2d(const void* __restrict__ x, u32 rows, u32 cols, u32 ext_c,
                                              const Fp8gOut& oc, const Fp8gOut& orr) {
    __shared__ u32 tw[FP8G_TILE * FP8G_TW];
    __shared__ float st[FP8G_TILE];
    __shared__ u32 st_fast;  // every scale of st passes fp8g_fast_scale
    const u32 tiles_x = (ext_c + FP8G_TILE - 1) / FP8G_TILE;
    const u32 r0 = blockIdx.x / tiles_x * FP8G_TILE, c0 = blockIdx.x % tiles_x * FP8G_TILE;
    const u32 tr = fp8g_tr(), tc = fp8g_tc();
    const u32 r = r0 + tr, c = c0 + tc;
    // The "r" direction's scales of this tile's columns: its 64 rows lie in
    // one group (64 divides 128, and a rowwise group is a whole column).
    if (threadIdx.x == 0) st_fast = 1u;
    __syncthreads();
    if (orr.codes && threadIdx.x < FP8G_TILE) {
        const u32 col = c0 + threadIdx.x;
        const bool in = col < cols && r0 < rows;
        st[threadIdx.x] = in ? orr.scales[(u64)(r0 / orr.glen) * orr.r_pad + col] : 0.0f;
        // Padding columns take the zero code whatever their scale.
        if (in && !fp8g_fast_scale(st[threadIdx.x])) st_fast = 0u;
    }
    __syncthreads();
    float v[FP8G_SEG], s[FP8G_SEG];
    fp8g_load16<In>(x, rows, cols, r, c, v);
    u32 keep = 0u;
#pragma unroll
    for (int i = 0; i < FP8G_SEG; ++i) keep |= (u32)(r < rows && c + i < cols) << i;
    if (oc.codes && r < oc.r_pad && c < oc.kp) {
        const float sc = keep ? oc.scales[(u64)(c / oc.glen) * oc.r_pad + r] : 0.0f;
#pragma unroll
        for (int i = 0; i < FP8G_SEG; ++i) s[i] = sc;
        *(Vec16*)(oc.codes + (u64)r * oc.kp + c) = fp8g_encode16(v, s, fp8g_fast_scale(sc), keep);
    }
    if (!orr.codes) return;
#pragma unroll
    for (int i = 0; i < FP8G_SEG; ++i) s[i] = st[tc + i];
    const Vec16 w = fp8g_encode16(v, s, st_fast != 0u, keep);
#pragma unroll
    for (int k = 0; k < FP8G_SEG / 4; ++k) tw[tr * FP8G_TW + tc / 4 + k] = w.w[k];
    __syncthreads();
    // Thread (row group og, column group cg) transposes the 4 x 4 codes of
    // rows 4og .., columns 4cg .. and writes them as four words of axis-last
    // rows c0 + 4cg + k: 16 lanes write 64 contiguous bytes of a row.
    const u32 og = threadIdx.x % (FP8G_TILE / 4), cg = threadIdx.x / (FP8G_TILE / 4);
    u32 q[4], t[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = tw[(4 * og + i) * FP8G_TW + cg];
    fp8g_transpose4x4(q, t);
    if (r0 + 4 * og < orr.kp) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if (c0 + 4 * cg + k < orr.r_pad) *(u32*)(orr.codes + (u64)(c0 + 4 * cg + k) * orr.kp + r0 + 4 * og) = t[k];
        }
    }
}

// decode(code) * scale_inv of its group, f32 [r_pad, kp]; rows >= R are 0.
extern "C" __global__ void __launch_bounds__(FP8G_THREADS)
    fp8g_dequantize(const u8* __restrict__ codes, const float* __restrict__ vec, u32 R, u32 r_pad, u32 kp,
                    u32 gpr, u32 glen, float* __restrict__ out) {
    const u64 t = (u64)blockIdx.x * FP8G_THREADS + threadIdx.x;
    if (t >= (u64)r_pad * kp) return;
    const u32 r = (u32)(t / kp), c = (u32)(t % kp);
    const u32 g = c / glen < gpr ? c / glen : gpr - 1;
    out[t] = r < R ? decode<Fp8gFmt>(codes[t]) * vec[(u64)g * r_pad + r] : 0.0f;
}

#define FP8G_KERNELS(SUFFIX, IN)                                                                            \
    extern "C" __global__ void __launch_bounds__(FP8G_THREADS)                                              \
        fp8g_amax2d_##SUFFIX(const void* x, u32 rows, u32 cols, u32* part_c, u32* part_r) {                 \
        fp8g_amax2d<IN>(x, rows, cols, part_c, part_r);                                                     \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(FP8G_THREADS)                                              \
        fp8g_encode2d_##SUFFIX(const void* x, u32 rows, u32 cols, u32 ext_c, Fp8gOut oc, Fp8gOut orr) {     \
        fp8g_encode2d<IN>(x, rows, cols, ext_c, oc, orr);                                                   \
    }

FP8G_KERNELS(f32, InF32)
FP8G_KERNELS(bf16, InBF16)
