// Helpers of the GPU recipe linears (runtime/src/cuda/linear.rs; CPU
// reference: runtime/src/recipe/linear.rs):
//   lin_copy2d     zero-padded copy of a row-major matrix, optionally
//                  transposed, converting the element type on the way
//                  (f32 / BF16 / raw bytes in, FP8 codes decoded exactly);
//                  used to put an operand's reduction axis last, to pad GEMM
//                  operands to multiples of 16 and to cast to BF16
//   lin_epilogue   crop of a padded f32 GEMM result, times an optional pair
//                  of per-tensor scales, plus an optional f32 bias, written
//                  as f32 or BF16
//   lin_scale_pair [alpha, 0] with alpha = fl32(scale_a * scale_b), the
//                  factor lin_epilogue applies, for a GEMM that applies it
//                  itself (reading alpha and beta on the device)
//   lin_colsum_*   db = column sums of dy in f32 (two passes over row chunks)
//
// Every conversion is exact except the BF16 casts (round to nearest even,
// as formats.rs bf16::from_f32), so transposing before quantizing gives the
// quantizer the very rows the CPU's quantize_mx(.., axis 0, ..) sees.

// Element kinds of lin_copy2d's input (IN_*) and output (OUT_*).
#define IN_F32 0
#define IN_BF16 1
#define IN_U8 2
#define IN_E4M3FN 3
#define IN_E5M2 4
#define IN_E4M3FNUZ 5
#define IN_E5M2FNUZ 6
#define OUT_F32 0
#define OUT_BF16 1
#define OUT_U8 2

// Side of the square tile of the transposing copy; TILE_ROWS rows of threads.
#define TILE 32
#define TILE_ROWS 8

__device__ __forceinline__ float bf16_to_f32(u16 h) { return u2f((u32)h << 16); }

// Element i of the input as f32 (a raw byte as its integer value, exact).
__device__ __forceinline__ float load_elem(const void* in, u64 i, int kind) {
    switch (kind) {
        case IN_F32:
            return ((const float*)in)[i];
        case IN_BF16:
            return bf16_to_f32(((const u16*)in)[i]);
        case IN_U8:
            return (float)((const u8*)in)[i];
        case IN_E4M3FN:
            return decode<E4M3FN>(((const u8*)in)[i]);
        case IN_E5M2:
            return decode<E5M2>(((const u8*)in)[i]);
        case IN_E4M3FNUZ:
            return decode<E4M3FNUZ>(((const u8*)in)[i]);
        default:
            return decode<E5M2FNUZ>(((const u8*)in)[i]);
    }
}

__device__ __forceinline__ void store_elem(void* out, u64 i, float v, int kind) {
    switch (kind) {
        case OUT_F32:
            ((float*)out)[i] = v;
            break;
        case OUT_BF16:
            ((u16*)out)[i] = bf16_from_f32(v);
            break;
        default:
            ((u8*)out)[i] = (u8)v;
            break;
    }
}

// out [out_rows, out_cols] from in [rows, cols]:
//   transpose = 0: out[r][c] = in[r][c]  for r < rows, c < cols, else 0;
//   transpose = 1: out[r][c] = in[c][r]  for r < cols, c < rows, else 0.
// Grid (ceil(out_cols / 32), ceil(out_rows / 32)), block (32, 8).
extern "C" __global__ void __launch_bounds__(TILE* TILE_ROWS)
    lin_copy2d(const void* in, void* out, u32 rows, u32 cols, u32 out_rows, u32 out_cols, int transpose,
               int in_kind, int out_kind) {
    __shared__ float tile[TILE][TILE + 1];
    const u32 r0 = blockIdx.y * TILE;
    const u32 c0 = blockIdx.x * TILE;
    const u32 tx = threadIdx.x;
    if (!transpose) {
        for (u32 dy = threadIdx.y; dy < TILE; dy += TILE_ROWS) {
            const u32 r = r0 + dy, c = c0 + tx;
            if (r >= out_rows || c >= out_cols) continue;
            const float v = (r < rows && c < cols) ? load_elem(in, (u64)r * cols + c, in_kind) : 0.0f;
            store_elem(out, (u64)r * out_cols + c, v, out_kind);
        }
        return;
    }
    // Input rows c0 .. c0 + 32 (output columns), input columns r0 .. r0 + 32
    // (output rows): read along the input's rows, write along the output's.
    for (u32 dy = threadIdx.y; dy < TILE; dy += TILE_ROWS) {
        const u32 ir = c0 + dy, ic = r0 + tx;
        tile[dy][tx] = (ir < rows && ic < cols) ? load_elem(in, (u64)ir * cols + ic, in_kind) : 0.0f;
    }
    __syncthreads();
    for (u32 dy = threadIdx.y; dy < TILE; dy += TILE_ROWS) {
        const u32 r = r0 + dy, c = c0 + tx;
        if (r >= out_rows || c >= out_cols) continue;
        store_elem(out, (u64)r * out_cols + c, tile[tx][dy], out_kind);
    }
}

// out[r][c] = acc[r * ld + c] * (scale_a * scale_b) + bias[c] for r < rows,
// c < cols, in the CPU's order (the GEMM's alpha first, then the bias); the
// scale pointers and the bias may be null. Grid (rows, column groups): each
// thread does EPI_VEC neighbouring columns of one row, with 16-byte loads when
// `vec` (ld and cols multiples of EPI_VEC, so every access is aligned).
#define EPI_VEC 4
extern "C" __global__ void lin_epilogue(const float* acc, u32 ld, const float* scale_a, const float* scale_b,
                                        const float* bias, float* out_f32, u16* out_bf16, u32 rows, u32 cols,
                                        u32 vec) {
    const u64 r = blockIdx.x;
    const u32 c0 = (blockIdx.y * blockDim.x + threadIdx.x) * EPI_VEC;
    if (r >= rows || c0 >= cols) return;
    const u32 count = cols - c0 < EPI_VEC ? cols - c0 : EPI_VEC;
    const float* in = acc + r * ld + c0;
    float v[EPI_VEC];
    if (vec) {
        const Vec16 q = *(const Vec16*)in;
        for (int j = 0; j < EPI_VEC; ++j) v[j] = u2f(q.w[j]);
    } else {
        for (u32 j = 0; j < count; ++j) v[j] = in[j];
    }
    for (u32 j = 0; j < count; ++j) {
        if (scale_a) v[j] = v[j] * (scale_a[0] * scale_b[0]);
        if (bias) v[j] = v[j] + bias[c0 + j];
    }
    const u64 o = r * cols + c0;
    if (out_bf16 && vec) {
        u32 w[EPI_VEC / 2];
        for (int j = 0; j < EPI_VEC / 2; ++j)
            w[j] = (u32)bf16_from_f32(v[2 * j]) | ((u32)bf16_from_f32(v[2 * j + 1]) << 16);
        u32* dst = (u32*)(out_bf16 + o);
        for (int j = 0; j < EPI_VEC / 2; ++j) dst[j] = w[j];
    } else if (out_bf16) {
        for (u32 j = 0; j < count; ++j) out_bf16[o + j] = bf16_from_f32(v[j]);
    } else if (vec) {
        Vec16 q;
        for (int j = 0; j < EPI_VEC; ++j) q.w[j] = f2u(v[j]);
        *(Vec16*)(out_f32 + o) = q;
    } else {
        for (u32 j = 0; j < count; ++j) out_f32[o + j] = v[j];
    }
}

// Pass 1 of the column sums: partial[chunk][c] = sum of rows
// chunk * chunk_rows .. of column c, in row order. Each thread sums
// COLSUM_VEC neighbouring columns, with 16-byte loads when `vec` (f32 or
// BF16 input, cols a multiple of COLSUM_VEC), so that a warp reads whole
// 256- or 512-byte stretches of a row. Grid (ceil(cols / (256 * COLSUM_VEC)),
// chunks).
#define COLSUM_VEC 8
extern "C" __global__ void lin_colsum_partial(const void* x, int in_kind, float* partial, u32 rows, u32 cols,
                                              u32 chunk_rows, u32 vec) {
    const u32 c0 = (blockIdx.x * blockDim.x + threadIdx.x) * COLSUM_VEC;
    if (c0 >= cols) return;
    const u32 n = cols - c0 < COLSUM_VEC ? cols - c0 : COLSUM_VEC;
    const u32 r0 = blockIdx.y * chunk_rows;
    const u32 r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
    float s[COLSUM_VEC];
#pragma unroll
    for (int j = 0; j < COLSUM_VEC; ++j) s[j] = 0.0f;
    if (vec && in_kind == IN_BF16) {
#pragma unroll 4
        for (u32 r = r0; r < r1; ++r) {
            const Vec16 q = *(const Vec16*)((const u16*)x + (u64)r * cols + c0);
#pragma unroll
            for (int j = 0; j < COLSUM_VEC; ++j) s[j] += u2f((q.w[j / 2] >> (16 * (j % 2))) << 16);
        }
    } else if (vec) {
#pragma unroll 4
        for (u32 r = r0; r < r1; ++r) {
            const Vec16* p = (const Vec16*)((const float*)x + (u64)r * cols + c0);
            const Vec16 a = p[0], b = p[1];
#pragma unroll
            for (int j = 0; j < COLSUM_VEC / 2; ++j) {
                s[j] += u2f(a.w[j]);
                s[j + COLSUM_VEC / 2] += u2f(b.w[j]);
            }
        }
    } else {
        for (u32 r = r0; r < r1; ++r) {
            for (u32 j = 0; j < n; ++j) s[j] += load_elem(x, (u64)r * cols + c0 + j, in_kind);
        }
    }
    for (u32 j = 0; j < n; ++j) partial[(u64)blockIdx.y * cols + c0 + j] = s[j];
}

// [alpha, beta] = [scale_a * scale_b, 0] for a GEMM that reads them on the
// device: the product lin_epilogue would apply.
extern "C" __global__ void lin_scale_pair(const float* scale_a, const float* scale_b, float* out) {
    out[0] = scale_a[0] * scale_b[0];
    out[1] = 0.0f;
}

// Pass 2: out[c] = sum over chunks of partial[chunk][c], in chunk order.
extern "C" __global__ void lin_colsum_final(const float* partial, float* out, u32 chunks, u32 cols) {
    const u32 c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.0f;
    for (u32 k = 0; k < chunks; ++k) s += partial[(u64)k * cols + c];
    out[c] = s;
}
