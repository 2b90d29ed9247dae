// MX quantization of a row-major [rows, cols] tensor in both directions at
// once, for the MX recipe linears (SPEC sections 2 and 4). One read of the
// input serves the two GEMM operands that quantize it along different axes:
//   row blocks     32 consecutive elements of a row: the quantization axis is
//                  `cols`, zero-padded to pc = 32 * ceil(cols / 32);
//   column blocks  32 consecutive elements of a column: the axis is `rows`,
//                  padded to pr = 32 * ceil(rows / 32), i.e. the blocks of the
//                  transposed tensor.
// Each direction writes, as asked (null pointer = not wanted):
//   codes [R, P/2] (E2M1, packed) or [R, P] (E4M3) and scales [R, P/32],
//   the CPU's axis-last layout (R = rows, P = pc for row blocks; R = cols,
//   P = pr for column blocks), so codes and scales are those of
//   quantize_mx(.., axis) on the CPU;
//   deq [R, P] BF16: the dequantized GEMM operand, decode(code) * 2^(byte-127)
//   rounded to BF16 (exact), padding included (after a Hadamard the padding
//   is not zero).
// With tile2d, one scale per 32x32 tile (amax over the tile) serves both
// directions: the CPU's 32x32 weight tiles read along either axis.
//
// With `sums`, the column warps also write the partial f32 column sums of
// the input (db of a dy, on the read the quantizer makes anyway): sums[cy,
// col] adds rows 32 cy .. 32 cy + 31 of column col in row order from +0
// (rows past the matrix add +0); lin_colsum_final adds the cy in order.
//
// A CTA stages a 32 x (32 * TILES) slab in shared memory; per tile, one warp
// quantizes its 32 rows (a thread owns one row block) and one warp its 32
// columns (a thread owns one column block). Each thread's outputs are
// contiguous, so no second staging is needed for the stores.

#define TILES 4
#define SLAB_COLS (MX_BLOCK * TILES)
#define SLAB_STRIDE (SLAB_COLS + 1)

// One direction's options and outputs (struct MxDir in src/cuda/linear.rs).
struct MxDir {
    u8* codes;
    u8* scales;
    u16* deq;
    int hadamard;
    int sr;
    MxSrKey key;
};

// Stores block b's scale, packed codes and BF16 dequantized values (padded
// row length `plen`) with 16-byte stores.
template <class F>
__device__ __forceinline__ void store_block(const MxDir& d, const u32* w, u32 byte, u64 b, u64 row, u32 kb,
                                            u32 plen) {
    constexpr int W = CodeWidth<F>::W;
    if (d.scales) d.scales[b] = (u8)byte;
    if (d.codes) mx_store_codes<F>(d.codes, b, w);
    if (d.deq) {
        const float s = e8m0_decode(byte);
        const bool exact = mx_products_are_bf16<F>(byte);
        u32 h[MX_BLOCK / 2];
#pragma unroll
        for (int i = 0; i < MX_BLOCK; i += 2) {
            const u32 c0 = (w[i * W / 32] >> ((i * W) % 32)) & ((1u << W) - 1u);
            const u32 c1 = (w[(i + 1) * W / 32] >> (((i + 1) * W) % 32)) & ((1u << W) - 1u);
            h[i / 2] = bf16_pair_scaled<F>(c0, c1, s, exact);
        }
        Vec16* out = (Vec16*)(d.deq + row * plen + (u64)kb * MX_BLOCK);
#pragma unroll
        for (int k = 0; k < MX_BLOCK / 8; ++k) {
            Vec16 o;
#pragma unroll
            for (int j = 0; j < 4; ++j) o.w[j] = h[4 * k + j];
            out[k] = o;
        }
    }
}

template <class F, class In>
__device__ __forceinline__ void mx_tile(const void* x, u32 rows, u32 cols, const MxDir& rd, const MxDir& cd,
                                        int mode, int tile2d, float* sums) {
    __shared__ float slab[MX_BLOCK * SLAB_STRIDE];
    __shared__ u32 tile_amax[TILES][MX_BLOCK];
    const u32 row0 = blockIdx.y * MX_BLOCK;
    const u32 col0 = blockIdx.x * SLAB_COLS;
    load_slab<In, MX_BLOCK, SLAB_COLS, SLAB_STRIDE>(x, rows, cols, row0, col0, slab);
    __syncthreads();
    const u32 t = threadIdx.x / (2 * MX_BLOCK);           // tile of the slab
    const bool by_row = (threadIdx.x / MX_BLOCK) % 2 == 0;  // which direction this warp quantizes
    const u32 lane = threadIdx.x % MX_BLOCK;
    // A copy, field by field: a reference chosen at run time would put both
    // parameter structs in local memory.
    const MxDir d = by_row ? rd : cd;
    // The block's 32 values: along slab row `lane` or down column `lane` of
    // tile t (one address step per value, whichever the direction).
    const u32 at = by_row ? lane * SLAB_STRIDE + t * MX_BLOCK : t * MX_BLOCK + lane;
    const u32 step = by_row ? 1u : SLAB_STRIDE;
    float v[MX_BLOCK];
#pragma unroll
    for (int i = 0; i < MX_BLOCK; ++i) v[i] = slab[at + i * step];
    const u32 col = col0 + t * MX_BLOCK + lane;  // a column warp's column
    if (sums && !by_row && col < cols) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < MX_BLOCK; ++i) s += v[i];
        sums[(u64)blockIdx.y * cols + col] = s;
    }
    if (d.hadamard) {
        hadamard16(v);
        hadamard16(v + 16);
    }
    u32 m = mx_block_amax_bits(v);
    if (by_row) tile_amax[t][lane] = m;
    __syncthreads();
    if (tile2d) {
        m = 0u;
        for (int i = 0; i < MX_BLOCK; ++i) m = tile_amax[t][i] > m ? tile_amax[t][i] : m;
    }

    const u32 pc = (cols + MX_BLOCK - 1) / MX_BLOCK * MX_BLOCK;
    const u32 pr = (rows + MX_BLOCK - 1) / MX_BLOCK * MX_BLOCK;
    u64 row;
    u32 kb, plen;
    if (by_row) {
        row = row0 + lane;
        kb = col0 / MX_BLOCK + t;
        plen = pc;
        if (row >= rows || kb * MX_BLOCK >= pc) return;
    } else {
        row = col;
        kb = row0 / MX_BLOCK;
        plen = pr;
        if (row >= cols) return;
    }
    if (!d.codes && !d.scales && !d.deq) return;
    const u64 b = row * (plen / MX_BLOCK) + kb;
    const u32 byte = scale_byte<F>(u2f(m), mode);
    u32 w[MX_BLOCK * CodeWidth<F>::W / 32];
    mx_encode_block<F>(v, byte, d.sr, d.key, b, w);
    store_block<F>(d, w, byte, b, row, kb, plen);
}

#define MX_TILE_KERNEL(SUFFIX, FMT, IN)                                                               \
    extern "C" __global__ void __launch_bounds__(2 * MX_BLOCK * TILES)                                \
        mx_tile_##SUFFIX(const void* x, u32 rows, u32 cols, MxDir rd, MxDir cd, int mode, int tile2d,  \
                         float* sums) {                                                               \
        mx_tile<FMT, IN>(x, rows, cols, rd, cd, mode, tile2d, sums);                                  \
    }

MX_TILE_KERNEL(e2m1_f32, E2M1, InF32)
MX_TILE_KERNEL(e2m1_bf16, E2M1, InBF16)
MX_TILE_KERNEL(e4m3fn_f32, E4M3FN, InF32)
MX_TILE_KERNEL(e4m3fn_bf16, E4M3FN, InBF16)
