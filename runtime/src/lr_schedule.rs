//! Learning-rate schedules: a linear warm-up, then a constant or cosine
//! rate (SPEC section 8).
//!
//! The rate is a pure function of the iteration, like the precision
//! schedule, so a resumed run continues exactly where it stopped and every
//! rank of a data-parallel run agrees without talking.

use crate::{Error, Result};

/// What the rate does after warm-up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Decay {
    /// The base rate until the end.
    #[default]
    Constant,
    /// Half a cosine from the base rate down to 0 at the run's last
    /// iteration + 1.
    Cosine,
}

impl Decay {
    /// The name configs use: `constant` or `cosine`.
    pub fn name(self) -> &'static str {
        match self {
            Decay::Constant => "constant",
            Decay::Cosine => "cosine",
        }
    }

    /// The decay a config names, if it names one.
    pub fn from_name(name: &str) -> Option<Decay> {
        [Decay::Constant, Decay::Cosine]
            .into_iter()
            .find(|d| d.name() == name)
    }
}

/// The learning rate of every iteration of a run of `iters` iterations.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrSchedule {
    /// The rate after warm-up (finite, > 0).
    pub base: f32,
    /// Iterations of linear warm-up: iteration i < warmup trains at
    /// base * (i + 1) / warmup.
    pub warmup: u64,
    /// After warm-up.
    pub decay: Decay,
    /// The run trains iterations `0..iters`: the cosine's horizon.
    pub iters: u64,
}

impl LrSchedule {
    /// The constant rate `base`, without warm-up.
    pub fn constant(base: f32) -> LrSchedule {
        LrSchedule {
            base,
            warmup: 0,
            decay: Decay::Constant,
            iters: u64::MAX,
        }
    }

    /// A checked schedule: `base` finite and > 0, and warm-up shorter than
    /// the run.
    pub fn new(base: f32, warmup: u64, decay: Decay, iters: u64) -> Result<LrSchedule> {
        if !(base.is_finite() && base > 0.0) {
            return Err(Error::InvalidOption(format!(
                "the learning rate must be a finite number > 0, got {base}"
            )));
        }
        if warmup >= iters {
            return Err(Error::InvalidOption(format!(
                "a warm-up of {warmup} iterations leaves none of the run's {iters} at the full learning rate: make it shorter than the run"
            )));
        }
        Ok(LrSchedule {
            base,
            warmup,
            decay,
            iters,
        })
    }

    /// The rate iteration `iter` trains at.
    ///
    /// ```text
    /// iter < warmup:  base * (iter + 1) / warmup
    /// constant:       base
    /// cosine:         base * (1 + cos(pi * (iter - warmup) / (iters - warmup))) / 2
    /// ```
    pub fn at(&self, iter: u64) -> f32 {
        if iter < self.warmup {
            return (self.base as f64 * (iter + 1) as f64 / self.warmup as f64) as f32;
        }
        match self.decay {
            Decay::Constant => self.base,
            Decay::Cosine => {
                let span = self.iters.saturating_sub(self.warmup).max(1) as f64;
                let done = ((iter - self.warmup) as f64 / span).min(1.0);
                (self.base as f64 * 0.5 * (1.0 + (std::f64::consts::PI * done).cos())) as f32
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_up_rises_linearly_to_the_base_rate() {
        let s = LrSchedule::new(1e-3, 4, Decay::Constant, 10).unwrap();
        for (i, want) in [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3]
            .into_iter()
            .enumerate()
        {
            let got = s.at(i as u64);
            assert!(
                (got - want).abs() <= 1e-9,
                "iteration {i}: {got} against {want}"
            );
        }
        assert_eq!(s.at(3), 1e-3, "warm-up ends on the base rate exactly");
    }

    #[test]
    fn cosine_falls_from_the_base_rate_towards_zero() {
        let s = LrSchedule::new(1.0, 2, Decay::Cosine, 12).unwrap();
        assert_eq!(s.at(1), 1.0);
        assert_eq!(s.at(2), 1.0);
        // Half-way through the decay: cos(pi / 2) = 0.
        assert!((s.at(7) - 0.5).abs() < 1e-6, "{}", s.at(7));
        let last = s.at(11);
        assert!(last > 0.0 && last < 0.03, "{last}");
        for i in 2..11 {
            assert!(s.at(i + 1) < s.at(i), "not falling at {i}");
        }
        // Past the horizon (a run grown by --iters keeps the floor).
        assert_eq!(s.at(50), 0.0);
    }

    #[test]
    fn bad_schedules_are_refused_in_one_line() {
        let e = LrSchedule::new(1e-3, 10, Decay::Cosine, 10).unwrap_err();
        assert!(e.to_string().contains("warm-up of 10"), "{e}");
        assert!(LrSchedule::new(f32::NAN, 0, Decay::Constant, 10).is_err());
        assert!(LrSchedule::new(0.0, 0, Decay::Constant, 10).is_err());
        assert_eq!(LrSchedule::constant(0.5).at(1 << 40), 0.5);
    }

    #[test]
    fn decays_are_named_as_configs_write_them() {
        assert_eq!(Decay::from_name("constant"), Some(Decay::Constant));
        assert_eq!(Decay::from_name("cosine"), Some(Decay::Cosine));
        assert_eq!(Decay::from_name("Cosine"), None);
    }
}
