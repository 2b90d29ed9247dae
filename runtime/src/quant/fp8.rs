//! FP8 tensorwise dynamic ("current") scaling, SPEC section 3.
//!
//! One f32 scale per tensor: scale = fl32(fmt_max / max(amax, 1e-12)),
//! q = satfinite(RNE(fl32(x * scale))), and a GEMM multiplies its result by
//! scale_inv = fl32(1 / scale).

use rayon::prelude::*;

use crate::formats::{encode_rne, ElemFormat, MiniFloat};
use crate::simd::with_avx2;
use crate::{Error, Result};

/// Elements per rayon task.
const CHUNK: usize = 1 << 16;

/// A tensor quantized to FP8 with one scale.
#[derive(Clone, Debug, PartialEq)]
pub struct Fp8Tensor {
    /// Shape of the input tensor; `codes` is row-major in it.
    pub shape: Vec<usize>,
    /// The 8-bit element format of the codes.
    pub elem: ElemFormat,
    /// One code per element, row-major.
    pub codes: Vec<u8>,
    /// Multiplies the input before encoding.
    pub scale: f32,
    /// fl32(1 / scale): multiplies decoded codes (or a GEMM's result).
    pub scale_inv: f32,
}

/// max |x| in f32; NaN if any element is NaN (the integer order of the
/// absolute-value bits puts NaN above Inf above every finite value).
pub fn amax(x: &[f32]) -> f32 {
    let m = x
        .par_chunks(CHUNK)
        .map(|c| {
            with_avx2(
                #[inline(always)]
                || {
                    c.iter()
                        .fold(0i32, |m, v| m.max((v.to_bits() & 0x7FFF_FFFF) as i32))
                },
            )
        })
        .max()
        .unwrap_or(0);
    f32::from_bits(m as u32)
}

/// The tensorwise scale of torchao's `amax_to_scale`: the f64 quotient
/// rounded once to f32 (equal to a correctly rounded f32 division), and with
/// `pow2` rounded down to a power of two.
pub fn amax_to_scale(amax: f32, elem: ElemFormat, pow2: bool) -> f32 {
    if amax.is_nan() {
        return f32::NAN;
    }
    let s = (elem.max_value() as f64 / (amax as f64).max(1e-12)) as f32;
    if pow2 && s.is_finite() {
        f32::from_bits(s.to_bits() & 0xFF80_0000)
    } else {
        s
    }
}

/// Quantize a whole tensor with one dynamic scale. `name` identifies the
/// tensor in the error raised for a NaN or Inf amax.
pub fn quantize_tensorwise(
    x: &[f32],
    shape: &[usize],
    elem: ElemFormat,
    pow2: bool,
    name: &str,
) -> Result<Fp8Tensor> {
    if elem.bits() != 8 {
        return Err(Error::InvalidOption(format!(
            "tensorwise FP8 needs an 8-bit element format, not {elem}"
        )));
    }
    let numel: usize = shape.iter().product();
    if numel != x.len() {
        return Err(Error::Shape(format!(
            "{} values do not fill shape {shape:?}",
            x.len()
        )));
    }
    let a = amax(x);
    if !a.is_finite() {
        return Err(Error::NonFiniteAmax {
            tensor: name.to_string(),
            amax: a,
        });
    }
    let scale = amax_to_scale(a, elem, pow2);
    let mut codes = vec![0u8; x.len()];
    encode_scaled(x, scale, elem, &mut codes);
    Ok(Fp8Tensor {
        shape: shape.to_vec(),
        elem,
        codes,
        scale,
        scale_inv: 1.0 / scale,
    })
}

/// codes[i] = satfinite(RNE(fl32(x[i] * scale))), monomorphised per format.
fn encode_scaled(x: &[f32], scale: f32, elem: ElemFormat, codes: &mut [u8]) {
    fn run(x: &[f32], scale: f32, codes: &mut [u8], s: MiniFloat) {
        codes
            .par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK))
            .for_each(|(c, x)| {
                with_avx2(
                    #[inline(always)]
                    || {
                        for (c, &v) in c.iter_mut().zip(x) {
                            *c = encode_rne(s, v * scale);
                        }
                    },
                )
            });
    }
    const E4M3FN: MiniFloat = ElemFormat::E4M3FN.spec();
    const E5M2: MiniFloat = ElemFormat::E5M2.spec();
    const E4M3FNUZ: MiniFloat = ElemFormat::E4M3FNUZ.spec();
    const E5M2FNUZ: MiniFloat = ElemFormat::E5M2FNUZ.spec();
    match elem {
        ElemFormat::E4M3FN => run(x, scale, codes, E4M3FN),
        ElemFormat::E5M2 => run(x, scale, codes, E5M2),
        ElemFormat::E4M3FNUZ => run(x, scale, codes, E4M3FNUZ),
        ElemFormat::E5M2FNUZ => run(x, scale, codes, E5M2FNUZ),
        ElemFormat::E2M1 => unreachable!("rejected by quantize_tensorwise"),
    }
}

impl Fp8Tensor {
    /// decode(code) * scale_inv for every element, in the input's shape.
    pub fn dequantize(&self) -> Vec<f32> {
        let table = self.elem.decode_table();
        let inv = self.scale_inv;
        self.codes
            .par_iter()
            .map(|&c| table[c as usize] * inv)
            .collect()
    }

    /// Bytes held: one per element plus the two f32 scalars.
    pub fn nbytes(&self) -> usize {
        self.codes.len() + 8
    }
}
