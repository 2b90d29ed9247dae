// FP8 rowwise and 128-block scaling (SPEC section 3b; CPU reference:
// runtime/src/quant/fp8_group.rs). E4M3FN codes, one f32 scale per group of
// the axis-last view: a whole row (rowwise) or 128 consecutive elements.
//
// The input is a row-major [rows, cols] matrix (f32 or BF16). DIR_COLS
// quantizes along its columns (axis-last row r is input row r), DIR_ROWS
// along its rows (axis-last row r is input column r). In both, R is the
// number of axis-last rows, L their length, and a thread covers a segment
// of 16 consecutive elements of one axis-last row; a segment never
// straddles two groups (groups are 128 long or a whole row, segments start
// at multiples of 16). Along the columns a warp's segments are consecutive
// in memory; along the rows a warp takes 32 neighbouring columns, so each of
// its 16 loads is one contiguous row piece.
//
// Four launches, stream-ordered, no host sync:
//   fp8g_amax_<dir>_<in>   amax[r * gpr + g] = max |x| bits of group g of
//                          row r (an atomicMax per segment into a zeroed
//                          buffer; NaN > Inf > finite in that order)
//   fp8g_scales            per group, or per 128 x 128 tile with tile2d (the
//                          largest of its groups' amaxes), scale = SPEC 3's
//                          amax_to_scale with fmt_max = 448, scale_inv =
//                          fl32(1 / scale), stored [R, gpr] as the CPU has
//                          them, scale_inv also as the GEMM reads it, and the
//                          largest amax into *flag (the deferred finite check)
//   fp8g_encode_<dir>_<in> codes [r_pad, kp]: satfinite(RNE(fl32(x * scale)))
//                          for the real elements, 0 for the padding
//   fp8g_dequantize        decode(code) * scale_inv, f32 [r_pad, kp] (the
//                          GEMM operand where no scaled FP8 GEMM runs)
// gpr is the groups per row, glen the elements per group (L, at least 1, for
// rowwise; 128 for blocks), kp the stored row length (a multiple of 16 that
// holds L, or of 128 for blocks) and r_pad R rounded up to 16.
//
// The GEMM's scale_inv layouts (cuBLASLt's scale modes):
//   vec[g * r_pad + r]       OUTER_VEC_32F (gpr = 1) and VEC128_32F: one
//                            vector over the rows per 128-block, padding 0
//   blk[(r / 128) * gpr + g] BLK128x128_32F (tile2d): tile row by tile row

#define DIR_COLS 0
#define DIR_ROWS 1
#define FP8G_THREADS 256
#define FP8G_SEG 16
#define FP8G_TILE 128

typedef E4M3FN Fp8gFmt;

// Axis-last rows and their length of a [rows, cols] input along DIR.
template <int DIR>
__device__ __forceinline__ void axis_view(u32 rows, u32 cols, u32& R, u32& L) {
    R = DIR == DIR_COLS ? rows : cols;
    L = DIR == DIR_COLS ? cols : rows;
}

// Segment t of the padded view [r_pad, kp]: its row r and first element c0.
template <int DIR>
__device__ __forceinline__ bool segment_of(u64 t, u32 r_pad, u32 kp, u32& r, u32& c0) {
    const u32 nseg = kp / FP8G_SEG;
    if (t >= (u64)r_pad * nseg) return false;
    if (DIR == DIR_COLS) {
        r = (u32)(t / nseg);
        c0 = (u32)(t % nseg) * FP8G_SEG;
    } else {
        r = (u32)(t % r_pad);
        c0 = (u32)(t / r_pad) * FP8G_SEG;
    }
    return true;
}

// The 16 values of segment (r, c0), zero outside the input.
template <class In, int DIR>
__device__ __forceinline__ void load_segment(const void* __restrict__ x, u32 rows, u32 cols, u32 r, u32 c0,
                                             float* v) {
    u32 R, L;
    axis_view<DIR>(rows, cols, R, L);
    if (DIR == DIR_COLS && r < R && cols % In::VEC == 0 && c0 + FP8G_SEG <= L) {
        constexpr int NV = FP8G_SEG / In::VEC;
        Vec16 q[NV];
#pragma unroll
        for (int k = 0; k < NV; ++k) q[k] = In::load_vec(x, (u64)r * cols + c0 + k * In::VEC);
#pragma unroll
        for (int k = 0; k < NV; ++k) {
#pragma unroll
            for (int i = 0; i < In::VEC; ++i) v[k * In::VEC + i] = In::elem(q[k], i);
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < FP8G_SEG; ++j) {
        const u64 at = DIR == DIR_COLS ? (u64)r * cols + c0 + j : (u64)(c0 + j) * cols + r;
        v[j] = r < R && c0 + j < L ? In::load(x, at) : 0.0f;
    }
}

template <class In, int DIR>
__device__ __forceinline__ void fp8g_amax(const void* __restrict__ x, u32 rows, u32 cols, u32 r_pad, u32 kp,
                                          u32 gpr, u32 glen, u32* __restrict__ amax) {
    u32 r, c0, R, L;
    axis_view<DIR>(rows, cols, R, L);
    if (!segment_of<DIR>((u64)blockIdx.x * FP8G_THREADS + threadIdx.x, r_pad, kp, r, c0)) return;
    if (r >= R || c0 >= L) return;
    float v[FP8G_SEG];
    load_segment<In, DIR>(x, rows, cols, r, c0, v);
    u32 m = 0u;
#pragma unroll
    for (int j = 0; j < FP8G_SEG; ++j) {
        const u32 a = f2u(v[j]) & 0x7FFFFFFFu;
        m = a > m ? a : m;
    }
    atomicMax(&amax[(u64)r * gpr + c0 / glen], m);
}

// Scale and inverse of group (r, g) with amax bits m, in every layout.
__device__ __forceinline__ void put_scale(u32 r, u32 g, u32 m, u32 gpr, u32 r_pad, int pow2, float* scales,
                                          float* scale_inv, float* vec) {
    const float s = fp8_amax_to_scale(m, Fp8gFmt::max_value(), pow2);
    const float inv = 1.0f / s;
    scales[(u64)r * gpr + g] = s;
    scale_inv[(u64)r * gpr + g] = inv;
    vec[(u64)g * r_pad + r] = inv;
}

// One thread per group, or with tile2d per (tile row, group column).
extern "C" __global__ void __launch_bounds__(FP8G_THREADS)
    fp8g_scales(const u32* __restrict__ amax, u32 R, u32 gpr, int tile2d, int pow2, u32 r_pad,
                float* __restrict__ scales, float* __restrict__ scale_inv, float* __restrict__ vec,
                float* __restrict__ blk, u32* __restrict__ flag) {
    const u64 t = (u64)blockIdx.x * FP8G_THREADS + threadIdx.x;
    if (!tile2d) {
        if (t >= (u64)R * gpr) return;
        const u32 r = (u32)(t / gpr), g = (u32)(t % gpr);
        const u32 m = amax[t];
        put_scale(r, g, m, gpr, r_pad, pow2, scales, scale_inv, vec);
        atomicMax(flag, m);
        return;
    }
    const u32 tiles = (R + FP8G_TILE - 1) / FP8G_TILE;
    if (t >= (u64)tiles * gpr) return;
    const u32 tr = (u32)(t / gpr), g = (u32)(t % gpr);
    const u32 r0 = tr * FP8G_TILE;
    const u32 r1 = r0 + FP8G_TILE < R ? r0 + FP8G_TILE : R;
    u32 m = 0u;
    for (u32 r = r0; r < r1; ++r) {
        const u32 a = amax[(u64)r * gpr + g];
        m = a > m ? a : m;
    }
    for (u32 r = r0; r < r1; ++r) put_scale(r, g, m, gpr, r_pad, pow2, scales, scale_inv, vec);
    blk[(u64)tr * gpr + g] = 1.0f / fp8_amax_to_scale(m, Fp8gFmt::max_value(), pow2);
    atomicMax(flag, m);
}

template <class In, int DIR>
__device__ __forceinline__ void fp8g_encode(const void* __restrict__ x, u32 rows, u32 cols, u32 r_pad, u32 kp,
                                            u32 gpr, u32 glen, const float* __restrict__ scales,
                                            u8* __restrict__ codes) {
    u32 r, c0, R, L;
    axis_view<DIR>(rows, cols, R, L);
    if (!segment_of<DIR>((u64)blockIdx.x * FP8G_THREADS + threadIdx.x, r_pad, kp, r, c0)) return;
    Vec16 w;
    w.w[0] = w.w[1] = w.w[2] = w.w[3] = 0u;
    if (r < R && c0 < L) {
        const float s = scales[(u64)r * gpr + c0 / glen];
        float q[FP8G_SEG];
        load_segment<In, DIR>(x, rows, cols, r, c0, q);
#pragma unroll
        for (int j = 0; j < FP8G_SEG; ++j) q[j] = q[j] * s;
        // A finite non-zero scale means a finite amax, so every product is
        // finite and the fast encoder gives encode_rne's bits; otherwise
        // (a group the finite check refuses) encode_rne itself.
        if (s > 0.0f && f2u(s) < 0x7F800000u) {
            encode_pack_finite<Fp8gFmt, FP8G_SEG>(q, w.w);
        } else {
            u32 c[FP8G_SEG];
#pragma unroll
            for (int j = 0; j < FP8G_SEG; ++j) c[j] = encode_rne<Fp8gFmt>(q[j]);
            pack_codes<Fp8gFmt, FP8G_SEG>(c, w.w);
        }
        // The padding is the zero code whatever the scale.
        for (u32 j = L - c0; j < FP8G_SEG; ++j) w.w[j / 4] &= ~(0xFFu << (8 * (j % 4)));
    }
    *(Vec16*)(codes + (u64)r * kp + c0) = w;
}

// decode(code) * scale_inv of its group, f32 [r_pad, kp]; rows >= R are 0.
extern "C" __global__ void __launch_bounds__(FP8G_THREADS)
    fp8g_dequantize(const u8* __restrict__ codes, const float* __restrict__ scale_inv, u32 R, u32 r_pad, u32 kp,
                    u32 gpr, u32 glen, float* __restrict__ out) {
    u32 r, c0;
    if (!segment_of<DIR_COLS>((u64)blockIdx.x * FP8G_THREADS + threadIdx.x, r_pad, kp, r, c0)) return;
    const u32 g = c0 / glen < gpr ? c0 / glen : gpr - 1;
    const float inv = r < R ? scale_inv[(u64)r * gpr + g] : 0.0f;
#pragma unroll
    for (int j = 0; j < FP8G_SEG; ++j) {
        const u64 at = (u64)r * kp + c0 + j;
        out[at] = r < R ? decode<Fp8gFmt>(codes[at]) * inv : 0.0f;
    }
}

#define FP8G_KERNELS(DIRNAME, DIR, SUFFIX, IN)                                                            \
    extern "C" __global__ void __launch_bounds__(FP8G_THREADS)                                            \
        fp8g_amax_##DIRNAME##_##SUFFIX(const void* x, u32 rows, u32 cols, u32 r_pad, u32 kp, u32 gpr,     \
                                       u32 glen, u32* amax) {                                             \
        fp8g_amax<IN, DIR>(x, rows, cols, r_pad, kp, gpr, glen, amax);                                    \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(FP8G_THREADS)                                            \
        fp8g_encode_##DIRNAME##_##SUFFIX(const void* x, u32 rows, u32 cols, u32 r_pad, u32 kp, u32 gpr,   \
                                         u32 glen, const float* scales, u8* codes) {                      \
        fp8g_encode<IN, DIR>(x, rows, cols, r_pad, kp, gpr, glen, scales, codes);                         \
    }

FP8G_KERNELS(cols, DIR_COLS, f32, InF32)
FP8G_KERNELS(cols, DIR_COLS, bf16, InBF16)
FP8G_KERNELS(rows, DIR_ROWS, f32, InF32)
FP8G_KERNELS(rows, DIR_ROWS, bf16, InBF16)
