//! E8M0 block-scale rules of SPEC section 2: FLOOR, CEIL, EVEN and RCEIL.
//!
//! Each takes the block amax (f32, NaN if any element is NaN) and the element
//! format and returns the scale byte; 0xFF marks a block holding NaN or Inf.

use crate::formats::{e8m0, ElemFormat};

/// How a block's power-of-two scale is chosen; the names and the SPEC
/// defaults live with the recipe table.
pub use mxswitch_recipes::ScaleMode;

/// The E8M0 scale byte of a block with this amax under `mode`.
#[inline(always)]
pub fn scale_byte(mode: ScaleMode, amax: f32, elem: ElemFormat) -> u8 {
    if !amax.is_finite() {
        return e8m0::NAN;
    }
    let bits = amax.to_bits();
    let exp_field = ((bits >> 23) & 0xFF) as i32;
    match mode {
        ScaleMode::Floor => floor_byte(exp_field - 127, elem),
        ScaleMode::Ceil => floor_byte(exp_field - 127 + (bits & 0x7F_FFFF != 0) as i32, elem),
        ScaleMode::Even => {
            let rounded = bits.wrapping_add(1 << (23 - elem.spec().man_bits - 1)) & 0xFF80_0000;
            let field = ((rounded >> 23) & 0xFF) as i32;
            if field == 0xFF {
                // Rounding carried amax to Inf: torchao gives the NaN scale.
                e8m0::NAN
            } else {
                floor_byte(field - 127, elem)
            }
        }
        ScaleMode::Rceil => rceil_byte(amax * (1.0 / elem.max_value())),
    }
}

/// byte = clamp(e - emax_elem, -127, 128) + 127.
#[inline(always)]
fn floor_byte(e: i32, elem: ElemFormat) -> u8 {
    ((e - elem.emax()).clamp(-127, 128) + 127) as u8
}

/// Round a non-negative f32 up to a power of two and return its E8M0 byte
/// (PTX cvt.rp.ue8m0x2.f32 without satfinite: overflow gives 0xFF).
#[inline(always)]
fn rceil_byte(descale: f32) -> u8 {
    if !descale.is_finite() {
        return e8m0::NAN;
    }
    let bits = descale.to_bits();
    let exp_field = (bits >> 23) & 0xFF;
    let man = bits & 0x7F_FFFF;
    // 2^-127 (byte 0) is the subnormal with mantissa 0x400000.
    let up = if exp_field == 0 {
        man > 0x40_0000
    } else {
        man != 0
    };
    (exp_field + up as u32).min(0xFF) as u8
}
