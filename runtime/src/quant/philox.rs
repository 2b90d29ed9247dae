//! Philox-4x32-10, the counter-based generator of cuRAND and PyTorch.
//!
//! Stochastic rounding draws its bits from here so that the CPU and every GPU
//! backend produce the same bits for the same element: the generator is a
//! pure function of (key, counter), with no state to carry between calls.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

#[inline(always)]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

/// Ten Philox rounds of `counter` under `key`.
#[inline(always)]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for _ in 0..10 {
        let (hi0, lo0) = mulhilo(M0, c[0]);
        let (hi1, lo1) = mulhilo(M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
        k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
    }
    c
}

/// The key of one stochastically rounded tensor: (seed, step, tensor id).
///
/// Element `i` (its flat index in the quantizer's padded, axis-last layout)
/// takes word `i % 4` of `philox4x32_10([i/4 lo, i/4 hi, step, tensor_id],
/// [seed lo, seed hi])`; `step` and `tensor_id` are taken modulo 2^32.
///
/// Its text form (`mxswitch quantize --sr`) is `SEED,STEP,TENSOR_ID`, three
/// unsigned decimal integers below 2^64: [`FromStr`] reads it and
/// [`fmt::Display`] writes it (`7,3,1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SrKey {
    /// The run's seed: the Philox key.
    pub seed: u64,
    /// The training iteration (counter word 2, modulo 2^32).
    pub step: u64,
    /// Which tensor of the step (counter word 3, modulo 2^32).
    pub tensor_id: u64,
}

impl SrKey {
    /// The four random words for elements `4 * group .. 4 * group + 4`.
    #[inline(always)]
    pub fn words(&self, group: u64) -> [u32; 4] {
        philox4x32_10(
            [
                group as u32,
                (group >> 32) as u32,
                self.step as u32,
                self.tensor_id as u32,
            ],
            [self.seed as u32, (self.seed >> 32) as u32],
        )
    }

    /// The random word of element `index`.
    #[inline(always)]
    pub fn word(&self, index: u64) -> u32 {
        self.words(index / 4)[(index % 4) as usize]
    }
}

impl fmt::Display for SrKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{},{}", self.seed, self.step, self.tensor_id)
    }
}

impl FromStr for SrKey {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::InvalidOption(format!(
                "a stochastic-rounding key is SEED,STEP,TENSOR_ID, three unsigned decimal \
                 integers below 2^64 separated by commas (e.g. 7,3,1), not `{s}`"
            ))
        };
        // Digits only: no sign, spaces or empty fields.
        let int = |p: &str| {
            let digits = !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
            digits
                .then(|| p.parse::<u64>().ok())
                .flatten()
                .ok_or_else(bad)
        };
        match s.split(',').collect::<Vec<_>>()[..] {
            [seed, step, tensor_id] => Ok(SrKey {
                seed: int(seed)?,
                step: int(step)?,
                tensor_id: int(tensor_id)?,
            }),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips_and_refuses_anything_else() {
        let key: SrKey = "7,3,1".parse().unwrap();
        assert_eq!(
            key,
            SrKey {
                seed: 7,
                step: 3,
                tensor_id: 1
            }
        );
        assert_eq!(key.to_string(), "7,3,1");
        let max = format!("{0},{0},{0}", u64::MAX);
        assert_eq!(max.parse::<SrKey>().unwrap().to_string(), max);
        for bad in [
            "",
            "1,2",
            "1,2,3,4",
            "1,,3",
            "1,2,",
            "-1,2,3",
            "+1,2,3",
            " 1,2,3",
            "1, 2,3",
            "0x10,2,3",
            "a,b,c",
            "18446744073709551616,0,0",
        ] {
            let err = bad.parse::<SrKey>().unwrap_err().to_string();
            assert!(
                err.contains("SEED,STEP,TENSOR_ID") && err.contains(&format!("not `{bad}`")),
                "{bad:?}: {err}"
            );
        }
    }

    /// Known-answer vectors of Random123 (kat_vectors, philox4x32_10).
    #[test]
    fn random123_known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }
}
