//! A small seeded xorshift for the simulated benches (`priority.rs`,
//! `weighted.rs`): every contender at a load draws the same arrivals and
//! holds from the same seed.

use std::time::Duration;

/// A xorshift64 generator; the seed must not be 0.
pub struct Rng(pub u64);

impl Rng {
    /// A uniform draw in (0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// An exponential draw of mean `mean`.
    pub fn exp(&mut self, mean: Duration) -> Duration {
        mean.mul_f64(-self.unit().ln())
    }

    /// An index into `mix` (fractions adding up to 1), drawn with those
    /// weights; the last if rounding leaves the draw past them all.
    pub fn pick(&mut self, mix: &[f64]) -> usize {
        let u = self.unit();
        let mut acc = 0.0;
        for (i, share) in mix.iter().enumerate() {
            acc += share;
            if u < acc {
                return i;
            }
        }
        mix.len() - 1
    }
}
