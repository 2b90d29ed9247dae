//! Element formats of SPEC section 1: FP8 (E4M3FN, E5M2 and the gfx942 FNUZ
//! variants), FP4 E2M1, the E8M0 block scale and BF16.
//!
//! Every narrow float format here is described by one [`MiniFloat`] table, and a
//! single branch-free encoder serves all of them, so the MX and tensorwise
//! quantizers vectorize and every format rounds by the same rule: round to
//! nearest, ties to even, applied once to the exact f32 value, then saturate
//! to the largest finite magnitude ("satfinite").

use std::fmt;
use std::sync::OnceLock;

/// How a format spells NaN, which decides what a NaN input encodes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NanStyle {
    /// OCP E4M3FN: no Inf, S.1111.111 is NaN; NaN encodes to 0x7F with the sign kept.
    FiniteOnly,
    /// OCP E5M2: IEEE-like Inf and NaN; NaN encodes to 0x7F with the sign kept.
    Ieee,
    /// gfx942 FNUZ: no Inf, no negative zero, 0x80 is the only NaN.
    Fnuz,
    /// E2M1: no NaN at all. A NaN input encodes to +0 (MX blocks holding NaN
    /// carry the NaN scale 0xFF instead, so this never decides a result there).
    None,
}

/// Constants of one sign-exponent-mantissa element format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MiniFloat {
    /// Lower-case name as used in recipes and errors, e.g. `"e4m3fn"`.
    pub name: &'static str,
    /// Width of the exponent field in bits.
    pub exp_bits: u32,
    /// Width of the mantissa (fraction) field in bits.
    pub man_bits: u32,
    /// Exponent bias: a normal code's value is 2^(e - bias) * 1.m.
    pub bias: i32,
    /// Code of the largest finite magnitude (sign bit clear).
    pub max_code: u8,
    /// How the format spells NaN (and whether it has Inf).
    pub nan: NanStyle,
}

impl MiniFloat {
    /// Largest finite magnitude, built from the bits so it folds to a constant.
    #[inline(always)]
    pub const fn max_value(self) -> f32 {
        let e = (self.max_code as u32) >> self.man_bits;
        let m = (self.max_code as u32) & ((1 << self.man_bits) - 1);
        let exp = (e as i32 - self.bias + 127) as u32;
        f32::from_bits((exp << 23) | (m << (23 - self.man_bits)))
    }
}

/// The element formats a quantizer can produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElemFormat {
    /// OCP FP8 E4M3FN: bias 7, max 448, no Inf.
    E4M3FN,
    /// OCP FP8 E5M2: bias 15, max 57344, IEEE-like Inf and NaN.
    E5M2,
    /// gfx942 FP8 E4M3FNUZ: bias 8, max 240, no Inf, no negative zero.
    E4M3FNUZ,
    /// gfx942 FP8 E5M2FNUZ: bias 16, max 57344, no Inf, no negative zero.
    E5M2FNUZ,
    /// FP4 E2M1 (the MXFP4 element): bias 1, max 6, no Inf or NaN.
    E2M1,
}

impl ElemFormat {
    /// Every format, in declaration order (for tests and exhaustive checks).
    pub const ALL: [ElemFormat; 5] = [
        ElemFormat::E4M3FN,
        ElemFormat::E5M2,
        ElemFormat::E4M3FNUZ,
        ElemFormat::E5M2FNUZ,
        ElemFormat::E2M1,
    ];

    /// The format's constants.
    pub const fn spec(self) -> MiniFloat {
        match self {
            ElemFormat::E4M3FN => MiniFloat {
                name: "e4m3fn",
                exp_bits: 4,
                man_bits: 3,
                bias: 7,
                max_code: 0x7E,
                nan: NanStyle::FiniteOnly,
            },
            ElemFormat::E5M2 => MiniFloat {
                name: "e5m2",
                exp_bits: 5,
                man_bits: 2,
                bias: 15,
                max_code: 0x7B,
                nan: NanStyle::Ieee,
            },
            ElemFormat::E4M3FNUZ => MiniFloat {
                name: "e4m3fnuz",
                exp_bits: 4,
                man_bits: 3,
                bias: 8,
                max_code: 0x7F,
                nan: NanStyle::Fnuz,
            },
            ElemFormat::E5M2FNUZ => MiniFloat {
                name: "e5m2fnuz",
                exp_bits: 5,
                man_bits: 2,
                bias: 16,
                max_code: 0x7F,
                nan: NanStyle::Fnuz,
            },
            ElemFormat::E2M1 => MiniFloat {
                name: "e2m1",
                exp_bits: 2,
                man_bits: 1,
                bias: 1,
                max_code: 0x7,
                nan: NanStyle::None,
            },
        }
    }

    /// Total bits of one code (8, or 4 for E2M1).
    pub const fn bits(self) -> u32 {
        let s = self.spec();
        1 + s.exp_bits + s.man_bits
    }

    /// Largest finite magnitude: 448, 57344, 240, 57344 or 6.
    pub fn max_value(self) -> f32 {
        self.spec().max_value()
    }

    /// Exponent of the largest power of two below `max_value` ("emax_elem" of
    /// the MX scale rules: 8 for E4M3FN, 2 for E2M1).
    pub fn emax(self) -> i32 {
        let s = self.spec();
        ((s.max_code as i32) >> s.man_bits) - s.bias
    }

    /// Satfinite round-to-nearest-even encoding of an f32 (SPEC section 1).
    #[inline(always)]
    pub fn encode(self, x: f32) -> u8 {
        encode_rne(self.spec(), x)
    }

    /// Exact value of a code; every code of these formats is an f32.
    pub fn decode(self, code: u8) -> f32 {
        decode(self.spec(), code)
    }

    /// All codes decoded, for table lookups in hot loops; built once per
    /// format and process.
    pub fn decode_table(self) -> &'static [f32; 256] {
        static TABLES: [OnceLock<[f32; 256]>; ElemFormat::ALL.len()] =
            [const { OnceLock::new() }; ElemFormat::ALL.len()];
        TABLES[self as usize].get_or_init(|| {
            let mut t = [0.0f32; 256];
            for (c, v) in t.iter_mut().enumerate() {
                *v = if (c as u32) < (1 << self.bits()) {
                    self.decode(c as u8)
                } else {
                    f32::NAN
                };
            }
            t
        })
    }
}

impl fmt::Display for ElemFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.spec().name)
    }
}

/// The NaN code of a format for an input whose sign bit is `sign` (0 or 1).
#[inline(always)]
fn nan_code(s: MiniFloat, sign: u8) -> u8 {
    match s.nan {
        NanStyle::FiniteOnly | NanStyle::Ieee => 0x7F | (sign << 7),
        NanStyle::Fnuz => 0x80,
        NanStyle::None => 0,
    }
}

/// Magnitude code of `a = |x|` (finite or +Inf, not NaN) under RNE with saturation.
///
/// Normal range: add the RNE rounding increment to the f32 bits and drop the
/// extra mantissa bits, then rebias the exponent. Subnormal range: scale so the
/// subnormal step is 1 and round to an integer with the 2^23 magic-add trick
/// (the f32 adder does the ties-to-even). Both are computed and one is selected,
/// so the function has no data-dependent branches.
#[inline(always)]
fn magnitude_code(s: MiniFloat, a: f32) -> u32 {
    let max = s.max_value();
    let a = a.min(max); // Inf and overflow saturate; max is representable so rounding stays <= max.
    let shift = 23 - s.man_bits;
    let bits = a.to_bits();
    let rounded = bits + ((1u32 << (shift - 1)) - 1) + ((bits >> shift) & 1);
    // (127 - bias) exponent rebias, moved into the code's exponent field.
    let normal = (rounded >> shift).wrapping_sub(((127 - s.bias) as u32) << s.man_bits);
    // Subnormal step of the format is 2^(1 - bias - man_bits).
    let to_steps = f32::from_bits(((127 - 1 + s.bias + s.man_bits as i32) as u32) << 23);
    let sub = ((a * to_steps) + 8_388_608.0).to_bits() - 0x4B00_0000;
    let min_normal_bits = ((128 - s.bias) as u32) << 23;
    if bits >= min_normal_bits {
        normal
    } else {
        sub
    }
}

/// Satfinite RNE encoding of one f32 into the format `s`.
///
/// Written as selects without early returns so that loops over it vectorize.
#[inline(always)]
pub fn encode_rne(s: MiniFloat, x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = (bits >> 31) as u8;
    let mag = magnitude_code(s, f32::from_bits(bits & 0x7FFF_FFFF)) as u8;
    let signed = apply_sign(s, mag, sign);
    if x.is_nan() {
        nan_code(s, sign)
    } else {
        signed
    }
}

/// Put the sign on a magnitude code; FNUZ has no negative zero.
#[inline(always)]
fn apply_sign(s: MiniFloat, mag: u8, sign: u8) -> u8 {
    let signed = mag | (sign << (s.exp_bits + s.man_bits));
    if s.nan == NanStyle::Fnuz && mag == 0 {
        0
    } else {
        signed
    }
}

/// Satfinite encoding with stochastic rounding: `x` is rounded away from zero
/// with probability equal to its fractional position between the two
/// neighbouring codes. `r` is 24 uniform random bits (the top bits of a
/// Philox word), so the same `(x, r)` gives the same code on every backend.
#[inline(always)]
pub fn encode_sr(s: MiniFloat, x: f32, r: u32) -> u8 {
    let bits = x.to_bits();
    let sign = (bits >> 31) as u8;
    if x.is_nan() {
        return nan_code(s, sign);
    }
    let a = f32::from_bits(bits & 0x7FFF_FFFF).min(s.max_value());
    // Truncated (towards zero) code and the step to the next code, both exact.
    let shift = 23 - s.man_bits;
    let min_normal_bits = ((128 - s.bias) as u32) << 23;
    let ab = a.to_bits();
    let (lo_code, lo_val, step) = if ab >= min_normal_bits {
        let t = ab & !((1u32 << shift) - 1);
        let code = (t >> shift) - (((127 - s.bias) as u32) << s.man_bits);
        let step = f32::from_bits(t & 0x7F80_0000) * f32::from_bits((127 - s.man_bits) << 23);
        (code, f32::from_bits(t), step)
    } else {
        let step = f32::from_bits(((127 + 1 - s.bias - s.man_bits as i32) as u32) << 23);
        let n = (a / step).floor();
        (n as u32, n * step, step)
    };
    // Fraction in [0, 1) of the way to the next code; exact since step is a power of two.
    let frac = (a - lo_val) / step;
    let up = ((r >> 8) as f32) < frac * 16_777_216.0;
    let code = (lo_code + up as u32).min(s.max_code as u32) as u8;
    apply_sign(s, code, sign)
}

/// Exact decoding of one code of format `s`.
pub fn decode(s: MiniFloat, code: u8) -> f32 {
    let nbits = 1 + s.exp_bits + s.man_bits;
    let code = code as u32 & ((1u32 << nbits) - 1);
    let sign = code >> (nbits - 1);
    let mag = code & ((1u32 << (nbits - 1)) - 1);
    let e = mag >> s.man_bits;
    let m = mag & ((1u32 << s.man_bits) - 1);
    let exp_all_ones = e == (1u32 << s.exp_bits) - 1;
    match s.nan {
        NanStyle::FiniteOnly if mag == 0x7F => return f32::NAN,
        NanStyle::Ieee if exp_all_ones && m == 0 => {
            return if sign == 1 {
                f32::NEG_INFINITY
            } else {
                f32::INFINITY
            }
        }
        NanStyle::Ieee if exp_all_ones => return f32::NAN,
        NanStyle::Fnuz if code == 0x80 => return f32::NAN,
        _ => {}
    }
    let v = if e == 0 {
        // Subnormal: m * 2^(1 - bias - man_bits).
        m as f32 * 2f32.powi(1 - s.bias - s.man_bits as i32)
    } else {
        (1.0 + m as f32 / (1u32 << s.man_bits) as f32) * 2f32.powi(e as i32 - s.bias)
    };
    if sign == 1 {
        -v
    } else {
        v
    }
}

/// E8M0 scale byte: an unsigned power of two 2^(b - 127), 0xFF is NaN.
pub mod e8m0 {
    /// The NaN scale byte, used for blocks that hold NaN or Inf.
    pub const NAN: u8 = 0xFF;

    /// 2^(b - 127) in f32; byte 0 is the subnormal 2^-127 (not zero).
    #[inline(always)]
    pub fn decode(b: u8) -> f32 {
        match b {
            0 => f32::from_bits(0x0040_0000),
            NAN => f32::NAN,
            _ => f32::from_bits((b as u32) << 23),
        }
    }

    /// 2^(127 - b) in f32: what elements are multiplied by before encoding.
    /// Byte 254 gives the subnormal 2^-127; byte 0xFF gives NaN.
    #[inline(always)]
    pub fn reciprocal(b: u8) -> f32 {
        match b {
            254 => f32::from_bits(0x0040_0000),
            NAN => f32::NAN,
            _ => f32::from_bits((254 - b as u32) << 23),
        }
    }
}

/// BF16 as IEEE binary16-brain: the top 16 bits of an f32.
pub mod bf16 {
    /// Round-to-nearest-even f32 -> BF16 bits. Inf stays Inf, NaN stays a (quiet) NaN.
    #[inline(always)]
    pub fn from_f32(x: f32) -> u16 {
        let bits = x.to_bits();
        if x.is_nan() {
            return ((bits >> 16) | 0x0040) as u16;
        }
        let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1));
        (rounded >> 16) as u16
    }

    /// Exact widening of BF16 bits to f32.
    #[inline(always)]
    pub fn to_f32(b: u16) -> f32 {
        f32::from_bits((b as u32) << 16)
    }

    /// Round an f32 to the nearest BF16 value, kept in f32.
    #[inline(always)]
    pub fn round(x: f32) -> f32 {
        to_f32(from_f32(x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_values_match_spec() {
        assert_eq!(ElemFormat::E4M3FN.max_value(), 448.0);
        assert_eq!(ElemFormat::E5M2.max_value(), 57344.0);
        assert_eq!(ElemFormat::E4M3FNUZ.max_value(), 240.0);
        assert_eq!(ElemFormat::E5M2FNUZ.max_value(), 57344.0);
        assert_eq!(ElemFormat::E2M1.max_value(), 6.0);
        assert_eq!(ElemFormat::E2M1.emax(), 2);
        assert_eq!(ElemFormat::E4M3FN.emax(), 8);
        assert_eq!(ElemFormat::E5M2.emax(), 15);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16::from_f32(1.0), 0x3F80);
        // 1 + 2^-8 is a tie between 1.0 and 1 + 2^-7: even is 1.0.
        assert_eq!(bf16::from_f32(f32::from_bits(0x3F80_8000)), 0x3F80);
        assert_eq!(bf16::from_f32(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(bf16::from_f32(f32::INFINITY), 0x7F80);
        assert!(bf16::to_f32(bf16::from_f32(f32::NAN)).is_nan());
        // The largest f32 rounds up to Inf: BF16 does not saturate.
        assert_eq!(bf16::from_f32(f32::MAX), 0x7F80);
    }

    #[test]
    fn e8m0_reciprocal_is_inverse() {
        for b in 0..=254u8 {
            let p = e8m0::decode(b) as f64 * e8m0::reciprocal(b) as f64;
            assert_eq!(p, 1.0, "byte {b}");
        }
    }
}
