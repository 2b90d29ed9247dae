// FP8 rowwise and 128-block scaling (SPEC section 3b; CPU reference:
// runtime/src/quant/fp8_group.rs). E4M3FN codes, one f32 scale per group of
// the axis-last view: a whole row (rowwise) or 128 consecutive elements.
//
// The input is a row-major [rows, cols] matrix (f32 or BF16). A linear asks
// for it along its columns (the "c" direction: axis-last row r is input row
// r, L = cols), along its rows (the "r" direction: axis-last row r is input
// column r, L = rows), or both.
//
// 128-blocks take one kernel, which reads the input once: a group of either
// direction is a row or a column of one 128 x 128 tile (with tile2d the
// tile itself), so a CTA per tile has all its groups' amaxes:
//   fp8g_block2d_<in>  the tile in registers, its row and column amaxes
//                      reduced in shared memory, the scales put as below,
//                      then the codes of both directions as fp8g_encode2d
//                      writes them; when asked, the tile's column sums
//                      (db, finished by lin_colsum_final).
// A rowwise group is a whole row, which spans many tiles, so rowwise takes
// two reads of the input and three kernels:
//   fp8g_amax2d_<in>   one 64 x 64 tile per CTA: the amax of each row piece
//                      and of each column piece (max |x| bits, so NaN > Inf >
//                      finite), reduced in shared memory, one word per piece:
//                      part_c[(c0 / 64) * rows + r], part_r[(r0 / 64) * cols + c]
//                      (partial-major, so the second level reads coalesced);
//   fp8g_scales        per direction, per row the max of its pieces, scale =
//                      SPEC 3's amax_to_scale with fmt_max = 448, and
//                      scale_inv = fl32(1 / scale) in the GEMM's layout; the
//                      largest amax into *flag (the deferred finite check);
//   fp8g_encode2d_<in> one 64 x 64 tile per CTA, read once: codes
//                      satfinite(RNE(fl32(x * scale))), 0 for the padding, in
//                      both directions, each written coalesced: the "c"
//                      codes 16 bytes a thread, the "r" codes through a tile
//                      of code words in shared memory, transposed 4 x 4
//                      bytes at a time in registers.
// And for either grouping:
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

// The 16 values of input row r from column c as the input's own 16-byte
// vectors, zero outside the input (fp8g_block2d keeps a tile so: half the
// registers for BF16).
template <class In>
__device__ __forceinline__ void fp8g_load_raw(const void* __restrict__ x, u32 rows, u32 cols, u32 r, u32 c,
                                              Vec16* q) {
    constexpr int NV = FP8G_SEG / In::VEC;
    if (r < rows && cols % In::VEC == 0 && c + FP8G_SEG <= cols) {
#pragma unroll
        for (int k = 0; k < NV; ++k) q[k] = In::load_vec(x, (u64)r * cols + c + k * In::VEC);
        return;
    }
#pragma unroll
    for (int k = 0; k < NV; ++k) q[k] = Vec16{{0u, 0u, 0u, 0u}};
#pragma unroll
    for (int j = 0; j < FP8G_SEG; ++j) {
        if (r < rows && c + j < cols) In::load_into(q[j / In::VEC], j % In::VEC, x, (u64)r * cols + c + j);
    }
}

// The f32 values of fp8g_load_raw's vectors.
template <class In>
__device__ __forceinline__ void fp8g_unpack(const Vec16* q, float* v) {
#pragma unroll
    for (int k = 0; k < FP8G_SEG / In::VEC; ++k) {
#pragma unroll
        for (int i = 0; i < In::VEC; ++i) v[k * In::VEC + i] = In::elem(q[k], i);
    }
}

// The 16 values of input row r from column c, zero outside the input.
template <class In>
__device__ __forceinline__ void fp8g_load16(const void* __restrict__ x, u32 rows, u32 cols, u32 r, u32 c,
                                            float* v) {
    Vec16 q[FP8G_SEG / In::VEC];
    fp8g_load_raw<In>(x, rows, cols, r, c, q);
    fp8g_unpack<In>(q, v);
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

// One thread per row; consecutive threads take consecutive rows, so the
// piece reads and the scale stores are coalesced. The CTA's largest amax
// goes to *flag in one atomic (a million threads each hitting one word
// would queue on it).
extern "C" __global__ void __launch_bounds__(FP8G_THREADS)
    fp8g_scales(const u32* __restrict__ part, u32 R, u32 np, int pow2, float* __restrict__ scales,
                float* __restrict__ vec, u32* __restrict__ flag) {
    __shared__ u32 cta_max;
    if (threadIdx.x == 0) cta_max = 0u;
    __syncthreads();
    const u32 r = blockIdx.x * FP8G_THREADS + threadIdx.x;
    if (r < R) {
        u32 m = 0u;
        for (u32 p = 0; p < np; ++p) {
            const u32 a = part[(u64)p * R + r];
            m = a > m ? a : m;
        }
        const float s = fp8_amax_to_scale(m, Fp8gFmt::max_value(), pow2);
        scales[r] = s;
        vec[r] = 1.0f / s;
        atomicMax(&cta_max, m);
    }
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(flag, cta_max);
}

// One direction's outputs (struct Fp8gOut in src/cuda/fp8_group.rs); codes
// null = not wanted. fp8g_encode2d reads the scales; fp8g_block2d writes
// them, scale_inv (vec) and, with tile2d, blk.
struct Fp8gOut {
    u8* codes;
    float* scales;
    float* vec;
    float* blk;
    u32 kp;
    u32 r_pad;
    u32 gpr;
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

// The "r" direction's codes of a tile origin (r0, c0) from its code tile
// tw (a word holds 4 codes of a row; `stride` words a row): transposes the
// 4 x 4 codes of rows 4og .., word column wc, and writes them as one word
// of each of the axis-last rows c0 + 4wc .. c0 + 4wc + 3, at r0 + 4og.
__device__ __forceinline__ void fp8g_store_t4(const u32* tw, u32 stride, u32 og, u32 wc, u32 r0, u32 c0,
                                              const Fp8gOut& o) {
    u32 q[4], t[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = tw[(4 * og + i) * stride + wc];
    fp8g_transpose4x4(q, t);
    if (r0 + 4 * og >= o.kp) return;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        if (c0 + 4 * wc + k < o.r_pad) *(u32*)(o.codes + (u64)(c0 + 4 * wc + k) * o.kp + r0 + 4 * og) = t[k];
    }
}

// Rowwise: both directions of a 64 x 64 tile of the padded extents (the
// larger of the two directions' per axis; all multiples of 16, so every
// store is whole and aligned).
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
    // The "r" direction's scales of this tile's columns (a rowwise group is
    // a whole axis-last row, so its scale is at the row's index).
    if (threadIdx.x == 0) st_fast = 1u;
    __syncthreads();
    if (orr.codes && threadIdx.x < FP8G_TILE) {
        const u32 col = c0 + threadIdx.x;
        const bool in = col < cols && r0 < rows;
        st[threadIdx.x] = in ? orr.scales[col] : 0.0f;
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
        const float sc = keep ? oc.scales[r] : 0.0f;
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
    // Thread (row group og, column group cg): 16 lanes write 64 contiguous
    // bytes of an axis-last row.
    fp8g_store_t4(tw, FP8G_TW, threadIdx.x % (FP8G_TILE / 4), threadIdx.x / (FP8G_TILE / 4), r0, c0, orr);
}

// Both directions of a 128 x 128 tile of the padded extents (multiples of
// 128), 128-blocks in one pass. Thread t holds columns 16 (t % 8) .. + 15 of
// tile rows t / 8 + 32k (k < 4): a warp reads four 128-column row pieces.
#define FP8G_BCG (FP8G_BLOCK / FP8G_SEG)    // threads across a tile row
#define FP8G_BRT (FP8G_THREADS / FP8G_BCG)  // tile rows a pass
#define FP8G_BK (FP8G_BLOCK / FP8G_BRT)     // passes: tile rows a thread
#define FP8G_BTW (FP8G_BLOCK / 4 + 1)       // words per row of the code tile: no bank conflicts
#define FP8G_CSW (FP8G_BLOCK + 1)           // floats per row of the column sums in the code tile
static_assert(FP8G_BRT * FP8G_CSW <= FP8G_BLOCK * FP8G_BTW, "the column sums fit in the code tile");
static_assert(FP8G_THREADS == 2 * FP8G_BLOCK, "one thread per tile row and per tile column");

template <class In>
__device__ __forceinline__ void fp8g_block2d(const void* __restrict__ x, u32 rows, u32 cols, u32 tiles_x,
                                             const Fp8gOut& oc, const Fp8gOut& orr, int tile2d, int pow2,
                                             u32* __restrict__ flag, float* __restrict__ sums) {
    constexpr int NV = FP8G_SEG / In::VEC;
    __shared__ u32 amax_rc[2 * FP8G_BLOCK];     // the tile's row amaxes, then its column amaxes
    __shared__ float scale_rc[2 * FP8G_BLOCK];  // their scales
    __shared__ u32 tile_amax;
    __shared__ u32 col_fast;  // every column scale of the input's columns passes fp8g_fast_scale
    __shared__ u32 tw[FP8G_BLOCK * FP8G_BTW];
    const u32 t = threadIdx.x;
    const u32 r0 = blockIdx.x / tiles_x * FP8G_BLOCK, c0 = blockIdx.x % tiles_x * FP8G_BLOCK;
    const u32 tr = t / FP8G_BCG, tc = t % FP8G_BCG * FP8G_SEG;
    amax_rc[t] = 0u;
    if (t == 0) {
        tile_amax = 0u;
        col_fast = 1u;
    }
    __syncthreads();
    // Every load first, so that all of them are in flight at once.
    Vec16 q[FP8G_BK][NV];
#pragma unroll
    for (int k = 0; k < FP8G_BK; ++k) fp8g_load_raw<In>(x, rows, cols, r0 + tr + k * FP8G_BRT, c0 + tc, q[k]);
    // With `sums` (the bias gradient of dy): column c0 + j's f32 sum over the
    // tile's rows goes to sums[(r0 / 128) * cols + c0 + j]. Each thread adds
    // its 4 rows in order, then thread j adds the 32 threads' sums of column
    // j in row order, through the code tile (free until the encode).
    float* csum = (float*)tw;
    if (sums) {
#pragma unroll
        for (int j = 0; j < FP8G_SEG; ++j) {
            float a = 0.0f;
#pragma unroll
            for (int k = 0; k < FP8G_BK; ++k) a += In::elem(q[k][j / In::VEC], j % In::VEC);
            csum[tr * FP8G_CSW + tc + j] = a;
        }
    }
    // The amaxes: a row's over its 8 threads, a column's over its 32 (each
    // thread first takes the max of its 4 rows).
    u32 cm[FP8G_SEG];
#pragma unroll
    for (int j = 0; j < FP8G_SEG; ++j) cm[j] = 0u;
#pragma unroll
    for (int k = 0; k < FP8G_BK; ++k) {
        const u32 i = tr + k * FP8G_BRT;
        float v[FP8G_SEG];
        fp8g_unpack<In>(q[k], v);
        atomicMax(&amax_rc[i], amax_bits<FP8G_SEG>(v));
#pragma unroll
        for (int j = 0; j < FP8G_SEG; ++j) {
            const u32 a = f2u(v[j]) & 0x7FFFFFFFu;
            cm[j] = a > cm[j] ? a : cm[j];
        }
    }
#pragma unroll
    for (int j = 0; j < FP8G_SEG; ++j) atomicMax(&amax_rc[FP8G_BLOCK + tc + j], cm[j]);
    __syncthreads();
    if (sums && t < FP8G_BLOCK && c0 + t < cols) {
        float a = 0.0f;
#pragma unroll 8
        for (int i = 0; i < FP8G_BRT; ++i) a += csum[i * FP8G_CSW + t];
        sums[(u64)(r0 / FP8G_BLOCK) * cols + c0 + t] = a;
    }
    // The tile's amax: the flag's, and with tile2d that of every group here.
    if (t < 32) {
        u32 m = 0u;
#pragma unroll
        for (int k = 0; k < FP8G_BLOCK / 32; ++k) m = amax_rc[t + 32 * k] > m ? amax_rc[t + 32 * k] : m;
        atomicMax(&tile_amax, m);
    }
    __syncthreads();
    {
        // Thread t < 128 puts the scale of tile row t (the "c" direction's
        // view row r0 + t, group c0 / 128), thread 128 + j that of tile
        // column j (the "r" direction's view row c0 + j, group r0 / 128),
        // field by field (a struct chosen at run time would go to local memory).
        const bool col = t >= FP8G_BLOCK;
        const u32 i = t % FP8G_BLOCK;
        const u32 m = tile2d ? tile_amax : amax_rc[t];
        const float s = fp8_amax_to_scale(m, Fp8gFmt::max_value(), pow2);
        scale_rc[t] = s;
        const u32 vrow = (col ? c0 : r0) + i, g = (col ? r0 : c0) / FP8G_BLOCK;
        const u32 R = col ? cols : rows, r_pad = col ? orr.r_pad : oc.r_pad, gpr = col ? orr.gpr : oc.gpr;
        if ((col ? orr.codes : oc.codes) && vrow < R) {
            const u64 at = (u64)g * r_pad + vrow;
            (col ? orr.scales : oc.scales)[at] = s;
            (col ? orr.vec : oc.vec)[at] = 1.0f / s;
            if (tile2d && i == 0) (col ? orr.blk : oc.blk)[(u64)(vrow / FP8G_BLOCK) * gpr + g] = 1.0f / s;
        }
        // Padding columns take the zero code whatever their scale.
        if (col && vrow < cols && r0 < rows && !fp8g_fast_scale(s)) col_fast = 0u;
        if (t == 0) atomicMax(flag, tile_amax);
    }
    __syncthreads();
    float s[FP8G_SEG];
#pragma unroll
    for (int k = 0; k < FP8G_BK; ++k) {
        const u32 i = tr + k * FP8G_BRT, r = r0 + i, c = c0 + tc;
        float v[FP8G_SEG];
        fp8g_unpack<In>(q[k], v);
        u32 keep = 0u;
#pragma unroll
        for (int j = 0; j < FP8G_SEG; ++j) keep |= (u32)(r < rows && c + j < cols) << j;
        if (oc.codes && r < oc.r_pad && c < oc.kp) {
            const float sc = keep ? scale_rc[i] : 0.0f;
#pragma unroll
            for (int j = 0; j < FP8G_SEG; ++j) s[j] = sc;
            *(Vec16*)(oc.codes + (u64)r * oc.kp + c) = fp8g_encode16(v, s, fp8g_fast_scale(sc), keep);
        }
        if (orr.codes) {
#pragma unroll
            for (int j = 0; j < FP8G_SEG; ++j) s[j] = scale_rc[FP8G_BLOCK + tc + j];
            const Vec16 w = fp8g_encode16(v, s, col_fast != 0u, keep);
#pragma unroll
            for (int j = 0; j < FP8G_SEG / 4; ++j) tw[i * FP8G_BTW + tc / 4 + j] = w.w[j];
        }
    }
    if (!orr.codes) return;
    __syncthreads();
    // Lane (og, wc) of the warp: 8 lanes write 32 contiguous bytes of each
    // of four axis-last rows; the warp's four passes cover the tile's rows.
    const u32 og = t % 8, wc = t / 8 % 4 + 4 * (t / 32);
#pragma unroll
    for (int a = 0; a < FP8G_BLOCK / 32; ++a) fp8g_store_t4(tw, FP8G_BTW, og + 8 * a, wc, r0, c0, orr);
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

// fp8g_block2d: two CTAs an SM (ptxas: 117 registers for BF16; for f32
// 128 and 24 bytes spilled, where unbounded it takes 137 and fits one).
#define FP8G_KERNELS(SUFFIX, IN)                                                                            \
    extern "C" __global__ void __launch_bounds__(FP8G_THREADS)                                              \
        fp8g_amax2d_##SUFFIX(const void* x, u32 rows, u32 cols, u32* part_c, u32* part_r) {                 \
        fp8g_amax2d<IN>(x, rows, cols, part_c, part_r);                                                     \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(FP8G_THREADS)                                              \
        fp8g_encode2d_##SUFFIX(const void* x, u32 rows, u32 cols, u32 ext_c, Fp8gOut oc, Fp8gOut orr) {     \
        fp8g_encode2d<IN>(x, rows, cols, ext_c, oc, orr);                                                   \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(FP8G_THREADS, 2)                                           \
        fp8g_block2d_##SUFFIX(const void* x, u32 rows, u32 cols, u32 tiles_x, Fp8gOut oc, Fp8gOut orr,      \
                              int tile2d, int pow2, u32* flag, float* sums) {                               \
        fp8g_block2d<IN>(x, rows, cols, tiles_x, oc, orr, tile2d, pow2, flag, sums);                        \
    }

FP8G_KERNELS(f32, InF32)
FP8G_KERNELS(bf16, InBF16)
