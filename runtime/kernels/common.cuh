// mxswitch kernel common code: the element formats, E8M0 scales, Philox and
// Hadamard-16 of SPEC sections 1-3, as device functions.
//
// Every function here is a line-for-line port of its CPU reference in
// runtime/src/formats.rs and runtime/src/quant/*.rs, so that the GPU gives the
// same bits. Three rules keep it that way:
//   - integer bit manipulation instead of hardware conversions, so NaN,
//     saturation and ties follow the CPU; the one exception is the finite
//     fast path of encode_pack_finite, where no NaN can occur and the
//     platform's paired FP8 conversion (cvt.rn.satfinite on CUDA) rounds
//     and saturates exactly as encode_rne does;
//   - plain IEEE f32 arithmetic: the host compiles with --fmad=false (no
//     contraction of x * s + c into an FMA), --ftz=false and --prec-div=true;
//   - the same operation order (Hadamard butterfly, Philox rounds).
//
// The code keeps to the common subset of CUDA and HIP: __float_as_uint,
// __uint_as_float, fminf, floorf, __byte_perm, __syncthreads and atomicMax
// exist in both;
// no warp shuffles (HIP wavefronts are 64 wide), no inline PTX (only the
// platform prelude has any), no headers.
// The host prepends this file to each kernel source before compiling, after
// the platform prelude (platform_cuda.cuh, or platform_hip.cuh for the HIP
// compile check of .ci/rocm-kernels), which names the few constructs that
// differ (sync_warp); kernels use those rather than the intrinsics.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// Elements per MX block, and the side of a 2-D scale tile.
#define MX_BLOCK 32
// The quiet NaN the CPU's f32::NAN has.
#define F32_QNAN_BITS 0x7FC00000u

__device__ __forceinline__ u32 f2u(float x) { return __float_as_uint(x); }
__device__ __forceinline__ float u2f(u32 x) { return __uint_as_float(x); }
__device__ __forceinline__ bool is_nan_bits(u32 b) { return (b & 0x7FFFFFFFu) > 0x7F800000u; }

// ---------------------------------------------------------------------------
// Element formats (formats.rs, MiniFloat and NanStyle)

enum NanStyle { NAN_FINITE_ONLY = 0, NAN_IEEE = 1, NAN_FNUZ = 2, NAN_NONE = 3 };

template <int EXP, int MAN, int BIAS, u32 MAX_CODE, int NAN_STYLE>
struct MiniFloat {
    static constexpr int exp_bits = EXP;
    static constexpr int man_bits = MAN;
    static constexpr int bias = BIAS;
    static constexpr u32 max_code = MAX_CODE;
    static constexpr int nan_style = NAN_STYLE;
    // Exponent of the largest power of two below max: emax_elem of the MX rules.
    static constexpr int emax = (int)(MAX_CODE >> MAN) - BIAS;
    // f32 bits of the largest finite magnitude.
    static constexpr u32 max_bits =
        ((u32)((int)(MAX_CODE >> MAN) - BIAS + 127) << 23) | ((MAX_CODE & ((1u << MAN) - 1u)) << (23 - MAN));
    __device__ __forceinline__ static float max_value() { return u2f(max_bits); }
};

typedef MiniFloat<4, 3, 7, 0x7Eu, NAN_FINITE_ONLY> E4M3FN;  // max 448
typedef MiniFloat<5, 2, 15, 0x7Bu, NAN_IEEE> E5M2;          // max 57344
typedef MiniFloat<4, 3, 8, 0x7Fu, NAN_FNUZ> E4M3FNUZ;       // max 240
typedef MiniFloat<5, 2, 16, 0x7Fu, NAN_FNUZ> E5M2FNUZ;      // max 57344
typedef MiniFloat<2, 1, 1, 0x7u, NAN_NONE> E2M1;            // max 6

// The code a NaN input of sign `sign` encodes to.
template <class F>
__device__ __forceinline__ u32 nan_code(u32 sign) {
    return F::nan_style == NAN_FNUZ ? 0x80u : F::nan_style == NAN_NONE ? 0u : (0x7Fu | (sign << 7));
}

// Put the sign on a magnitude code; FNUZ has no negative zero.
template <class F>
__device__ __forceinline__ u32 apply_sign(u32 mag, u32 sign) {
    const u32 s = mag | (sign << (F::exp_bits + F::man_bits));
    return (F::nan_style == NAN_FNUZ && mag == 0u) ? 0u : s;
}

// Magnitude code of a = |x| under RNE with saturation (formats.rs,
// magnitude_code): normal range by adding the RNE increment to the bits,
// subnormal range by the 2^23 magic add (the f32 adder does ties-to-even).
template <class F>
__device__ __forceinline__ u32 magnitude_code(float a) {
    a = fminf(a, F::max_value());
    const u32 shift = 23 - F::man_bits;
    const u32 bits = f2u(a);
    const u32 rounded = bits + ((1u << (shift - 1)) - 1u) + ((bits >> shift) & 1u);
    const u32 normal = (rounded >> shift) - ((u32)(127 - F::bias) << F::man_bits);
    // Subnormal step of the format is 2^(1 - bias - man_bits).
    const float to_steps = u2f((u32)(127 - 1 + F::bias + F::man_bits) << 23);
    const u32 sub = f2u(a * to_steps + 8388608.0f) - 0x4B000000u;
    const u32 min_normal_bits = (u32)(128 - F::bias) << 23;
    return bits >= min_normal_bits ? normal : sub;
}

// Satfinite round-to-nearest-even encoding of one f32 (formats.rs, encode_rne).
template <class F>
__device__ __forceinline__ u32 encode_rne(float x) {
    const u32 bits = f2u(x);
    const u32 sign = bits >> 31;
    const u32 mag = magnitude_code<F>(u2f(bits & 0x7FFFFFFFu)) & 0xFFu;
    const u32 code = apply_sign<F>(mag, sign) & 0xFFu;
    return is_nan_bits(bits) ? nan_code<F>(sign) : code;
}

// encode_sr<E2M1> without branches. For a = min(|x|, 6) in [2^E, 2^(E+1))
// (E = 0, 1, 2; E = 0 below 1 as well) the codes step by 2^(E-1), so the
// lower code is 2E + n, n = floor(q), q = a / 2^(E-1) (exact), and the
// fraction is q - n: the values encode_sr's two branches give. a = 6 is a
// code (fraction 0), so the sum stays <= 7.
__device__ __forceinline__ u32 encode_sr_e2m1(float x, u32 r) {
    const float a = fminf(fabsf(x), 6.0f);
    const u32 e = max(f2u(a) & 0x7F800000u, 0x3F800000u);  // 2^E
    const float q = a * u2f((255u << 23) - e);             // a * 2^(1-E)
    const float n = floorf(q);
    const float frac = q - n;
    const u32 lo = ((e >> 22) - 254u) + (f2u(n + 8388608.0f) - 0x4B000000u);
    const bool up = (float)(r >> 8) < frac * 16777216.0f;
    return (lo + (up ? 1u : 0u)) | ((f2u(x) >> 31) << 3);
}

// Satfinite encoding with stochastic rounding (formats.rs, encode_sr) of an
// x that is not NaN (every caller's block has a finite scale): round away
// from zero when the top 24 bits of `r` fall below the fractional position
// of |x| between its two neighbouring codes.
template <class F>
__device__ __forceinline__ u32 encode_sr(float x, u32 r) {
    if (F::exp_bits == 2 && F::man_bits == 1) return encode_sr_e2m1(x, r);
    const u32 bits = f2u(x);
    const u32 sign = bits >> 31;
    const float a = fminf(u2f(bits & 0x7FFFFFFFu), F::max_value());
    const u32 shift = 23 - F::man_bits;
    const u32 min_normal_bits = (u32)(128 - F::bias) << 23;
    const u32 ab = f2u(a);
    // step is a normal power of two, so dividing by it is multiplying by
    // its exact reciprocal inv (same bits, no IEEE division).
    u32 lo_code;
    float lo_val, step, inv;
    if (ab >= min_normal_bits) {
        const u32 t = ab & ~((1u << shift) - 1u);
        lo_code = (t >> shift) - ((u32)(127 - F::bias) << F::man_bits);
        step = u2f(t & 0x7F800000u) * u2f((u32)(127 - F::man_bits) << 23);
        inv = u2f((254u << 23) - f2u(step));
        lo_val = u2f(t);
    } else {
        step = u2f((u32)(127 + 1 - F::bias - F::man_bits) << 23);
        inv = u2f((u32)(126 + F::bias + F::man_bits) << 23);
        const float n = floorf(a * inv);
        lo_code = (u32)n;
        lo_val = n * step;
    }
    // Fraction in [0, 1) of the way to the next code; exact.
    const float frac = (a - lo_val) * inv;
    const bool up = (float)(r >> 8) < frac * 16777216.0f;
    u32 code = lo_code + (up ? 1u : 0u);
    code = code < F::max_code ? code : F::max_code;
    return apply_sign<F>(code & 0xFFu, sign) & 0xFFu;
}

// Exact value of a code (formats.rs, decode).
template <class F>
__device__ __forceinline__ float decode(u32 code) {
    if (F::exp_bits == 2 && F::man_bits == 1) {
        // E2M1 without branches: the magnitude bits e m placed at bit 22
        // are the f32 2^(e - 127) (1 + m / 2), or 2^-127 for e = 0, m = 1,
        // which is the code's value times 2^-126; the sign bit goes to 31.
        return u2f(((code & 0x7u) << 22) | ((code & 0x8u) << 28)) * 0x1p126f;
    }
    const int nbits = 1 + F::exp_bits + F::man_bits;
    code &= (1u << nbits) - 1u;
    const u32 sign = code >> (nbits - 1);
    const u32 mag = code & ((1u << (nbits - 1)) - 1u);
    const u32 e = mag >> F::man_bits;
    const u32 m = mag & ((1u << F::man_bits) - 1u);
    const bool exp_all_ones = e == (1u << F::exp_bits) - 1u;
    if (F::nan_style == NAN_FINITE_ONLY && mag == 0x7Fu) return u2f(F32_QNAN_BITS);
    if (F::nan_style == NAN_IEEE && exp_all_ones) {
        return m == 0u ? u2f(0x7F800000u | (sign << 31)) : u2f(F32_QNAN_BITS);
    }
    if (F::nan_style == NAN_FNUZ && code == 0x80u) return u2f(F32_QNAN_BITS);
    float v;
    if (e == 0u) {
        // Subnormal: m * 2^(1 - bias - man_bits), exact.
        v = (float)m * u2f((u32)(127 + 1 - F::bias - F::man_bits) << 23);
    } else {
        v = u2f(((e - F::bias + 127) << 23) | (m << (23 - F::man_bits)));
    }
    return sign ? -v : v;
}

// ---------------------------------------------------------------------------
// E8M0 scales (formats.rs e8m0, quant/scale.rs)

// 2^(b - 127); byte 0 is the subnormal 2^-127, 0xFF is NaN.
__device__ __forceinline__ float e8m0_decode(u32 b) {
    return b == 0u ? u2f(0x00400000u) : b == 0xFFu ? u2f(F32_QNAN_BITS) : u2f(b << 23);
}

// 2^(127 - b): what elements are multiplied by before encoding.
__device__ __forceinline__ float e8m0_reciprocal(u32 b) {
    return b == 254u ? u2f(0x00400000u) : b == 0xFFu ? u2f(F32_QNAN_BITS) : u2f((254u - b) << 23);
}

enum ScaleMode { SCALE_FLOOR = 0, SCALE_CEIL = 1, SCALE_EVEN = 2, SCALE_RCEIL = 3 };

// byte = clamp(e - emax_elem, -127, 128) + 127.
template <class F>
__device__ __forceinline__ u32 floor_byte(int e) {
    int v = e - F::emax;
    v = v < -127 ? -127 : v > 128 ? 128 : v;
    return (u32)(v + 127);
}

// Round a non-negative f32 up to a power of two and give its E8M0 byte
// (PTX cvt.rp.ue8m0x2.f32 without satfinite: overflow gives 0xFF).
__device__ __forceinline__ u32 rceil_byte(float descale) {
    const u32 bits = f2u(descale);
    if ((bits & 0x7F800000u) == 0x7F800000u) return 0xFFu;
    const u32 exp_field = (bits >> 23) & 0xFFu;
    const u32 man = bits & 0x7FFFFFu;
    // 2^-127 (byte 0) is the subnormal with mantissa 0x400000.
    const bool up = exp_field == 0u ? man > 0x400000u : man != 0u;
    const u32 b = exp_field + (up ? 1u : 0u);
    return b < 0xFFu ? b : 0xFFu;
}

// The E8M0 scale byte of a block with this amax (ScaleMode::scale_byte).
template <class F>
__device__ __forceinline__ u32 scale_byte(float amax, int mode) {
    const u32 bits = f2u(amax);
    if ((bits & 0x7F800000u) == 0x7F800000u) return 0xFFu;  // NaN or Inf in the block
    const int exp_field = (int)((bits >> 23) & 0xFFu);
    switch (mode) {
    case SCALE_FLOOR:
        return floor_byte<F>(exp_field - 127);
    case SCALE_CEIL:
        return floor_byte<F>(exp_field - 127 + ((bits & 0x7FFFFFu) != 0u ? 1 : 0));
    case SCALE_EVEN: {
        const u32 rounded = (bits + (1u << (23 - F::man_bits - 1))) & 0xFF800000u;
        const int field = (int)((rounded >> 23) & 0xFFu);
        // Rounding carried amax to Inf: torchao gives the NaN scale.
        return field == 0xFF ? 0xFFu : floor_byte<F>(field - 127);
    }
    default:  // SCALE_RCEIL: descale = fl32(amax * fl32(1 / max_elem))
        return rceil_byte(amax * (1.0f / F::max_value()));
    }
}

// ---------------------------------------------------------------------------
// BF16 (formats.rs bf16): round to nearest even, NaN stays a quiet NaN.

__device__ __forceinline__ u16 bf16_from_f32(float x) {
    const u32 b = f2u(x);
    if (is_nan_bits(b)) return (u16)((b >> 16) | 0x40u);
    return (u16)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

// Whether every decode(code) * scale of format F is a BF16 value as it
// stands (so its top half is its BF16 rounding): the MX scale byte is not NaN
// and lifts F's smallest step, 2^(1 - bias - man_bits), to an f32 normal
// (2^-126), so the products are normal or infinite with at most man_bits + 1
// significant bits.
template <class F>
__device__ __forceinline__ bool mx_products_are_bf16(u32 byte) {
    return byte >= (u32)(F::bias + F::man_bits) && byte != 0xFFu;
}

// BF16 decode(c0) * s and decode(c1) * s in one word, c0 in the low half;
// `exact` as mx_products_are_bf16.
template <class F>
__device__ __forceinline__ u32 bf16_pair_scaled(u32 c0, u32 c1, float s, bool exact) {
    const float a = decode<F>(c0) * s, b = decode<F>(c1) * s;
    if (exact) return (f2u(a) >> 16) | (f2u(b) & 0xFFFF0000u);
    return (u32)bf16_from_f32(a) | ((u32)bf16_from_f32(b) << 16);
}

// ---------------------------------------------------------------------------
// Philox-4x32-10 (quant/philox.rs): counter c, key (k0, k1), in place.

__device__ __forceinline__ void philox4x32_10(u32 c[4], u32 k0, u32 k1) {
#pragma unroll
    for (int i = 0; i < 10; ++i) {
        const u64 p0 = (u64)0xD2511F53u * (u64)c[0];
        const u64 p1 = (u64)0xCD9E8D57u * (u64)c[2];
        const u32 n0 = (u32)(p1 >> 32) ^ c[1] ^ k0;
        const u32 n1 = (u32)p1;
        const u32 n2 = (u32)(p0 >> 32) ^ c[3] ^ k1;
        const u32 n3 = (u32)p0;
        c[0] = n0;
        c[1] = n1;
        c[2] = n2;
        c[3] = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

// ---------------------------------------------------------------------------
// Hadamard-16 (quant/hadamard.rs): butterfly stages h = 1, 2, 4, 8, then * 0.25.

// One butterfly stage: pairs (j, j + h) with bit h of j clear become
// (a + b, a - b). The pairs of a stage are disjoint, so visiting them in j
// order gives the same bits as the CPU's (group, offset) order.
__device__ __forceinline__ void butterfly_stage(float* g, int h) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        if ((j & h) == 0) {
            const float a = g[j];
            const float b = g[j + h];
            g[j] = a + b;
            g[j + h] = a - b;
        }
    }
}

// The four butterfly stages without the final * 0.25: an amax pass scales
// the max instead (rounding is monotone, so max |fl(x / 4)| = fl(max |x| / 4)).
__device__ __forceinline__ void hadamard16_sums(float* g) {
    butterfly_stage(g, 1);
    butterfly_stage(g, 2);
    butterfly_stage(g, 4);
    butterfly_stage(g, 8);
}

__device__ __forceinline__ void hadamard16(float* g) {
    hadamard16_sums(g);
#pragma unroll
    for (int i = 0; i < 16; ++i) g[i] *= 0.25f;
}

// ---------------------------------------------------------------------------
// Quantizer input (f32 or BF16), read as f32. Widening BF16 is exact (its
// bits are the top half of the f32), so a kernel gives the CPU's bits on the
// widened values. VEC elements make one 16-byte access.

// 16 bytes moved as one access (own type: NVRTC and hiprtc need no
// vector_types header for it).
struct alignas(16) Vec16 {
    u32 w[4];
};

struct InF32 {
    static constexpr int VEC = 4;
    __device__ __forceinline__ static float load(const void* x, u64 i) { return ((const float*)x)[i]; }
    __device__ __forceinline__ static Vec16 load_vec(const void* x, u64 i) {
        return *(const Vec16*)((const float*)x + i);
    }
    // Element k (< VEC) of a loaded vector.
    __device__ __forceinline__ static float elem(const Vec16& q, int k) { return u2f(q.w[k]); }
    // Element i of x into slot k of q, whose slot is zero (the ragged edge).
    __device__ __forceinline__ static void load_into(Vec16& q, int k, const void* x, u64 i) {
        q.w[k] = ((const u32*)x)[i];
    }
};

struct InBF16 {
    static constexpr int VEC = 8;
    __device__ __forceinline__ static float load(const void* x, u64 i) {
        return u2f((u32)((const u16*)x)[i] << 16);
    }
    __device__ __forceinline__ static Vec16 load_vec(const void* x, u64 i) {
        return *(const Vec16*)((const u16*)x + i);
    }
    // Little endian: element 2j is the low half of word j.
    __device__ __forceinline__ static float elem(const Vec16& q, int k) {
        const u32 w = q.w[k >> 1];
        return u2f((k & 1) ? (w & 0xFFFF0000u) : (w << 16));
    }
    __device__ __forceinline__ static void load_into(Vec16& q, int k, const void* x, u64 i) {
        q.w[k >> 1] |= (u32)((const u16*)x)[i] << (16 * (k & 1));
    }
};

// ---------------------------------------------------------------------------
// Satfinite RNE encoding of a value known not to be NaN: the hot loops of
// the MX quantizer (a block whose scale is not NaN holds only finite values)
// and of the FP8 cast (a tensor whose amax is finite). Equal to encode_rne
// for every non-NaN f32, checked over all 2^31 magnitudes for the five
// formats; it does most of its work in f32 adds and multiplies, which issue
// at twice the rate of the integer and compare instructions magnitude_code
// uses.
//   - a = min(|x|, max) saturates;
//   - M = 2^(E + 23 - man), E the exponent of a but at least the format's
//     emin: the f32 add a + M rounds a to the format's step in a's binade
//     (the subnormal step below emin), ties to even, and r = (a + M) - M is
//     exact;
//   - r * 2^(bias - 127) has the code's layout in f32 bits (its exponent
//     field is the format's biased exponent; the format's subnormals become
//     f32 subnormals), so those bits are the magnitude code << (23 - man),
//     with nothing below it.
template <class F>
__device__ __forceinline__ u32 code_bits_finite(float a) {
    a = fminf(a, F::max_value());
    const u32 min_normal_bits = (u32)(128 - F::bias) << 23;
    const u32 e = f2u(a) & 0x7F800000u;
    const float m = u2f(e > min_normal_bits ? e : min_normal_bits) * u2f((u32)(127 + 23 - F::man_bits) << 23);
    const float r = (a + m) - m;
    return f2u(r * u2f((u32)F::bias << 23));
}

template <class F>
__device__ __forceinline__ u32 magnitude_code_finite(float a) {
    return code_bits_finite<F>(a) >> (23 - F::man_bits);
}

template <class F>
__device__ __forceinline__ u32 encode_rne_finite(float x) {
    return apply_sign<F>(magnitude_code_finite<F>(fabsf(x)), f2u(x) >> 31);
}

// ---------------------------------------------------------------------------
// FP8 scales (quant/fp8.rs, amax_to_scale): fmt_max / max(amax, 1e-12) as
// the f64 quotient rounded once to f32; with pow2 rounded down to a power of
// two; NaN for a NaN amax. Shared by the tensorwise and the group quantizers.
__device__ __forceinline__ float fp8_amax_to_scale(u32 amax_bits, float fmt_max, int pow2) {
    if (is_nan_bits(amax_bits)) return u2f(F32_QNAN_BITS);
    double a = (double)u2f(amax_bits);
    a = a > 1e-12 ? a : 1e-12;
    float s = (float)((double)fmt_max / a);
    if (pow2 && (f2u(s) & 0x7F800000u) != 0x7F800000u) s = u2f(f2u(s) & 0xFF800000u);
    return s;
}

// ---------------------------------------------------------------------------
// Packing codes into 32-bit words: code j of a word at bit j * W, W = 4 or 8
// bits (E2M1 codes pack two per byte, element 2i in the low nibble).

template <class F>
struct CodeWidth {
    static constexpr int W = 1 + F::exp_bits + F::man_bits;
};

template <class F, int N>
__device__ __forceinline__ void pack_codes(const u32* c, u32* w) {
    constexpr int W = CodeWidth<F>::W;
#pragma unroll
    for (int k = 0; k < N * W / 32; ++k) {
        u32 v = 0u;
#pragma unroll
        for (int j = 0; j < 32 / W; ++j) v |= c[k * (32 / W) + j] << (j * W);
        w[k] = v;
    }
}

// Bit `from` of v moved to bit `to` (constants once the loops are unrolled).
// A right shift is written as the high word of a product, which issues on
// the multiply pipe instead of the integer pipe the rest of the encoder uses.
__device__ __forceinline__ u32 move_bits(u32 v, int from, int to) {
    return to >= from ? v << (to - from) : __umulhi(v, 1u << (32 - (from - to)));
}

// encode_rne_finite of N values, packed as pack_codes packs them. E4M3FN
// and E5M2 go two at a time through the platform's paired conversion (an
// instruction on CUDA). Otherwise outside FNUZ a code is the magnitude code
// bits plus the sign bit of x, each moved into place, so there is no
// per-element sign logic.
template <class F, int N>
__device__ __forceinline__ void encode_pack_finite(const float* x, u32* w) {
    constexpr int W = CodeWidth<F>::W;
    if (F::nan_style == NAN_FNUZ) {
        // No negative zero: the sign depends on the magnitude.
        u32 c[N];
#pragma unroll
        for (int i = 0; i < N; ++i) c[i] = encode_rne_finite<F>(x[i]);
        pack_codes<F, N>(c, w);
    } else if (W == 8) {
        const auto encode = [](float v) { return encode_rne_finite<F>(v); };
        constexpr bool e5m2 = F::exp_bits == 5;
#pragma unroll
        for (int k = 0; k < N / 4; ++k) {
            w[k] = fp8x2_rne_satfinite<e5m2>(x[4 * k + 1], x[4 * k], encode) |
                   (fp8x2_rne_satfinite<e5m2>(x[4 * k + 3], x[4 * k + 2], encode) << 16);
        }
    } else {
#pragma unroll
        for (int k = 0; k < N * W / 32; ++k) {
            u32 v = 0u;
#pragma unroll
            for (int j = 0; j < 32 / W; ++j) {
                const float xi = x[k * (32 / W) + j];
                const int sign_at = j * W + W - 1;
                // Disjoint bits: the adds are ORs.
                v += move_bits(code_bits_finite<F>(fabsf(xi)), 23 - F::man_bits, j * W) +
                     (move_bits(f2u(xi), 31, sign_at) & (1u << sign_at));
            }
            w[k] = v;
        }
    }
}

// ---------------------------------------------------------------------------
// One MX block (SPEC section 2), shared by the row quantizer (quantize_mx.cu)
// and the two-direction tile quantizer of the linears (mx_tile.cu).

// Amax of N values as the max of |x| bits: NaN > Inf > every finite value.
template <int N>
__device__ __forceinline__ u32 amax_bits(const float* v) {
    u32 m = 0u;
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const u32 a = f2u(v[i]) & 0x7FFFFFFFu;
        m = a > m ? a : m;
    }
    return m;
}

// Block amax of an MX block.
__device__ __forceinline__ u32 mx_block_amax_bits(const float* v) { return amax_bits<MX_BLOCK>(v); }

// The stochastic-rounding key of a tensor (SrKey): seed, step, tensor id.
struct MxSrKey {
    u32 seed_lo, seed_hi, step, tensor_id;
};

// The four random words of elements 4 * group .. 4 * group + 3 of the
// padded layout: philox([group lo, group hi, step, tensor_id], seed)
// (SrKey::word; shared by the MX and NVFP4 encoders).
__device__ __forceinline__ void sr_words(const MxSrKey& key, u64 group, u32 r[4]) {
    r[0] = (u32)group;
    r[1] = (u32)(group >> 32);
    r[2] = key.step;
    r[3] = key.tensor_id;
    philox4x32_10(r, key.seed_lo, key.seed_hi);
}

// Packed codes of block b (pack_codes layout) at scale `byte`: v is scaled
// by 2^(127 - byte) in place, then encoded RNE, or with `sr` stochastically,
// element i of the padded layout taking word i % 4 of
// philox([i / 4 lo, i / 4 hi, step, tensor_id], seed) (SrKey::word). A NaN
// scale (the block holds NaN or Inf) gives zero codes.
template <class F>
__device__ __forceinline__ void mx_encode_block(float* v, u32 byte, bool sr, const MxSrKey& key, u64 b,
                                                u32* w) {
    constexpr int WORDS = MX_BLOCK * CodeWidth<F>::W / 32;
    if (byte == 0xFFu) {
#pragma unroll
        for (int k = 0; k < WORDS; ++k) w[k] = 0u;
        return;
    }
    const float recip = e8m0_reciprocal(byte);
#pragma unroll
    for (int i = 0; i < MX_BLOCK; ++i) v[i] = v[i] * recip;
    if (sr) {
        u32 c[MX_BLOCK];
#pragma unroll
        for (int g = 0; g < MX_BLOCK / 4; ++g) {
            u32 r[4];
            sr_words(key, b * (MX_BLOCK / 4) + (u64)g, r);
#pragma unroll
            // The scale is not NaN, so no element is NaN.
            for (int q = 0; q < 4; ++q) c[4 * g + q] = encode_sr<F>(v[4 * g + q], r[q]);
        }
        pack_codes<F, MX_BLOCK>(c, w);
    } else {
        // The scale is not NaN, so every element is finite.
        encode_pack_finite<F, MX_BLOCK>(v, w);
    }
}

// Stores block b's packed codes with 16-byte stores: 16 bytes of E2M1 pairs
// or 32 bytes of E4M3.
template <class F>
__device__ __forceinline__ void mx_store_codes(u8* codes, u64 b, const u32* w) {
    constexpr int WORDS = MX_BLOCK * CodeWidth<F>::W / 32;
    Vec16* out = (Vec16*)(codes + b * (WORDS * 4));
#pragma unroll
    for (int h = 0; h < WORDS / 4; ++h) {
        Vec16 q;
#pragma unroll
        for (int k = 0; k < 4; ++k) q.w[k] = w[4 * h + k];
        out[h] = q;
    }
}

// ---------------------------------------------------------------------------
// The shared-memory slab of the two-direction tile quantizers (mx_tile.cu,
// quantize_nvfp4.cu): rows row0 .. row0 + R - 1 and columns col0 .. col0 + C - 1
// of the row-major [rows, cols] input into slab[r * STRIDE + c] as f32, zero
// past the matrix; coalesced, with 16-byte loads when every row starts
// 16-byte aligned (cols a multiple of the vector). The caller syncs after.
template <class In, u32 R, u32 C, u32 STRIDE>
__device__ __forceinline__ void load_slab(const void* x, u32 rows, u32 cols, u32 row0, u32 col0, float* slab) {
    if (cols % In::VEC == 0) {
        constexpr u32 VPR = C / In::VEC;  // vectors per slab row
        for (u32 i = threadIdx.x; i < R * VPR; i += blockDim.x) {
            const u32 r = i / VPR, c = (i % VPR) * In::VEC;
            const bool in = row0 + r < rows && col0 + c < cols;
            Vec16 q = {{0u, 0u, 0u, 0u}};
            if (in) q = In::load_vec(x, (u64)(row0 + r) * cols + col0 + c);
#pragma unroll
            for (int k = 0; k < In::VEC; ++k) slab[r * STRIDE + c + k] = in ? In::elem(q, k) : 0.0f;
        }
    } else {
        for (u32 i = threadIdx.x; i < R * C; i += blockDim.x) {
            const u32 r = i / C, c = i % C;
            float v = 0.0f;
            if (row0 + r < rows && col0 + c < cols) v = In::load(x, (u64)(row0 + r) * cols + col0 + c);
            slab[r * STRIDE + c] = v;
        }
    }
}
