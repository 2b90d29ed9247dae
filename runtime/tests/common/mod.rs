//! Helpers shared by the runtime's op tests: a seeded generator and
//! comparison with a printed report.
#![allow(dead_code)]

/// The runtime's seeded SplitMix64, with the ranges the op tests want.
pub struct Rng(mxswitch_runtime::module::SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(mxswitch_runtime::module::SplitMix64::new(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }

    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }

    /// `n` distinct values 0.1 apart in random order, shifted by `lo`: maxima
    /// are unique and stay so under small perturbations.
    pub fn distinct(&mut self, n: usize, lo: f32) -> Vec<f32> {
        let mut v: Vec<f32> = (0..n).map(|i| lo + 0.1 * i as f32).collect();
        for i in (1..n).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
        v
    }
}

/// Largest |a - b| / max(1, |b|) and where it is.
pub fn max_rel_diff(a: &[f32], b: &[f32]) -> (f32, usize) {
    assert_eq!(a.len(), b.len(), "compared vectors differ in length");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x - y).abs() / y.abs().max(1.0))
        .enumerate()
        .fold(
            (0.0, 0),
            |(m, at), (i, d)| if d > m || d.is_nan() { (d, i) } else { (m, at) },
        )
}

/// Asserts `got` matches `want` within `tol * max(1, |want|)` element-wise,
/// printing the max difference either way.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let (diff, at) = max_rel_diff(got, want);
    println!("{what}: max scaled diff {diff:.3e} at {at} (tolerance {tol:.0e})");
    assert!(
        diff <= tol,
        "{what}: max scaled diff {diff:.3e} > {tol:.0e} at index {at}: got {} want {}\n got[..8]  {:?}\n want[..8] {:?}",
        got[at],
        want[at],
        &got[..got.len().min(8)],
        &want[..want.len().min(8)]
    );
}
