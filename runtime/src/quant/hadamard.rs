//! The Hadamard-16 rotation of SPEC section 2.
//!
//! Each group of 16 elements becomes (1/4) * H16 * x, with H16 the
//! natural-order Sylvester matrix. It is computed as the butterfly with stages
//! h = 1, 2, 4, 8 and then a multiply by 0.25 (exact), so every backend that
//! follows the same order gets the same f32 bits. (1/4 H16) is symmetric and
//! orthogonal, so the transform is its own inverse.

/// Elements per rotated group.
pub const GROUP: usize = 16;

/// Rotate one group of 16 in place.
#[inline(always)]
pub fn hadamard16(g: &mut [f32; GROUP]) {
    let mut h = 1;
    while h < GROUP {
        for i in (0..GROUP).step_by(2 * h) {
            for j in i..i + h {
                let (a, b) = (g[j], g[j + h]);
                g[j] = a + b;
                g[j + h] = a - b;
            }
        }
        h *= 2;
    }
    for v in g.iter_mut() {
        *v *= 0.25;
    }
}

/// Rotate every consecutive group of 16 of `x`; `x.len()` must be a multiple of 16.
pub fn hadamard16_inplace(x: &mut [f32]) {
    assert!(
        x.len() % GROUP == 0,
        "Hadamard groups need a multiple of 16 elements"
    );
    for chunk in x.chunks_exact_mut(GROUP) {
        let g: &mut [f32; GROUP] = chunk.try_into().expect("chunk of 16");
        hadamard16(g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The butterfly equals (1/4) H16 x with H[i][j] = (-1)^popcount(i & j).
    #[test]
    fn butterfly_matches_matrix() {
        let x: Vec<f32> = (0..16).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut g: [f32; 16] = x.clone().try_into().unwrap();
        hadamard16(&mut g);
        for (i, gi) in g.iter().enumerate() {
            let want: f64 = (0..16)
                .map(|j| {
                    let s = if (i & j).count_ones() % 2 == 0 {
                        1.0
                    } else {
                        -1.0
                    };
                    s * x[j] as f64
                })
                .sum::<f64>()
                / 4.0;
            assert!((*gi as f64 - want).abs() < 1e-6, "row {i}: {gi} vs {want}");
        }
    }
}
