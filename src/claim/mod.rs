//! Backpressure for a claim loop: how many tasks to claim now, from the
//! units free and the pressure the process is under (seed 003, §2.1 and
//! §2.3).
//!
//! A task worker that polls a queue claims at most what it can start:
//! [`ClaimSize::size`] answers `min(available, batch × factors)`, where
//! each pressure factor applies when its signal passes its threshold:
//!
//! | signal | default threshold | effect (default) |
//! |---|---|---|
//! | free units / capacity | below 0.1 | claim nothing |
//! | memory in use (the cgroup's, else the machine's) | above 0.8 | × 0.5 |
//! | p99 latency | above a threshold of yours (unset: off) | × 0.7 |
//!
//! The numbers are the seed's; each is a builder setting.
//! [`memory_in_use`] reads the memory signal: the process's cgroup (v2,
//! then v1) when it has a limit, else `/proc/meminfo`.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use sidejob::Limiter;
//! use sidejob::claim::{ClaimSize, Pressure};
//!
//! let limiter = Limiter::new(1_000)?;
//! let claims = ClaimSize::builder()
//!     .batch(50)
//!     .latency_threshold(Duration::from_millis(500))
//!     .build()?;
//!
//! // Idle, healthy: the whole batch.
//! let calm = Pressure::of(&limiter).memory(Some(0.3)).p99(Some(Duration::from_millis(20)));
//! assert_eq!(claims.size(&calm), 50);
//! // Memory above 80 % and p99 above 500 ms: 50 × 0.5 × 0.7.
//! let pressed = calm.memory(Some(0.9)).p99(Some(Duration::from_secs(1)));
//! assert_eq!(claims.size(&pressed), 17);
//! // Fewer than 10 % of the units free: nothing.
//! let full = Pressure::new(99, 1_000);
//! assert_eq!(claims.size(&full), 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::time::Duration;

use crate::adaptive::Controller;
use crate::error::ConfigError;
use crate::limiter::Limiter;

mod memory;

pub use memory::memory_in_use;

/// The claim-size rule of seed 003 §2.3; see the [module docs](self).
///
/// Built by [`ClaimSize::builder`]; `Clone + Send + Sync`, a plain value.
#[derive(Debug, Clone)]
pub struct ClaimSize {
    batch: usize,
    min_free: f64,
    memory_threshold: f64,
    memory_factor: f64,
    latency_threshold: Option<Duration>,
    latency_factor: f64,
}

/// The signals one claim is sized from: free units and capacity, and
/// optionally memory in use and a p99 latency.
///
/// # Examples
///
/// ```
/// use sidejob::claim::Pressure;
///
/// let pressure = Pressure::new(30, 100).memory(Some(0.5));
/// assert_eq!((pressure.available(), pressure.capacity()), (30, 100));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pressure {
    available: usize,
    capacity: usize,
    memory: Option<f64>,
    p99: Option<Duration>,
}

impl Pressure {
    /// `available` units free of `capacity`; no memory or latency signal.
    pub fn new(available: usize, capacity: usize) -> Self {
        Pressure {
            available,
            capacity,
            memory: None,
            p99: None,
        }
    }

    /// A limiter's free units and capacity, and the memory in use now
    /// ([`memory_in_use`]).
    pub fn of(limiter: &Limiter) -> Self {
        Pressure::new(limiter.available(), limiter.capacity()).memory(memory_in_use())
    }

    /// The share of memory in use (0 to 1), if known. A reading that is
    /// not a number (NaN) counts as past the threshold: a reading gone
    /// wrong is no sign of calm.
    pub fn memory(self, memory: Option<f64>) -> Self {
        Pressure { memory, ..self }
    }

    /// A p99 latency, if known.
    pub fn p99(self, p99: Option<Duration>) -> Self {
        Pressure { p99, ..self }
    }

    /// The p99 of an adaptive [`Controller`]'s last window, if it has
    /// timed samples.
    pub fn p99_of(self, controller: &Controller) -> Self {
        self.p99(controller.last_window().and_then(|w| w.p99_latency()))
    }

    /// Units free.
    pub fn available(&self) -> usize {
        self.available
    }

    /// The capacity in force.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl ClaimSize {
    /// A builder, from the seed's numbers.
    pub fn builder() -> ClaimSizeBuilder {
        ClaimSizeBuilder::default()
    }

    /// How many tasks to claim under `pressure`: 0 when fewer than the
    /// free share of units are free, else `batch` times each factor whose
    /// signal is past its threshold (rounded down), and never more than
    /// the units free.
    pub fn size(&self, pressure: &Pressure) -> usize {
        let free = if pressure.capacity == 0 {
            0.0
        } else {
            pressure.available as f64 / pressure.capacity as f64
        };
        if pressure.available == 0 || free < self.min_free {
            return 0;
        }
        let mut factor = 1.0;
        // A reading that is not a number is no sign of calm.
        if pressure
            .memory
            .is_some_and(|used| used.is_nan() || used > self.memory_threshold)
        {
            factor *= self.memory_factor;
        }
        if let (Some(threshold), Some(p99)) = (self.latency_threshold, pressure.p99) {
            if p99 > threshold {
                factor *= self.latency_factor;
            }
        }
        ((self.batch as f64 * factor) as usize).min(pressure.available)
    }
}

/// Configures a [`ClaimSize`]; made by [`ClaimSize::builder`].
///
/// # Examples
///
/// ```
/// use sidejob::claim::ClaimSize;
///
/// let err = ClaimSize::builder().memory_threshold(1.5).build().unwrap_err();
/// assert_eq!(err.field(), "memory_threshold");
/// assert_eq!(err.to_string(), "invalid `memory_threshold`: must be a fraction above 0 and below 1");
/// ```
#[derive(Debug, Clone, Default)]
pub struct ClaimSizeBuilder {
    batch: Option<usize>,
    min_free: Option<f64>,
    memory_threshold: Option<f64>,
    memory_factor: Option<f64>,
    latency_threshold: Option<Duration>,
    latency_factor: Option<f64>,
}

impl ClaimSizeBuilder {
    /// The seed's `CLAIM_BATCH_SIZE`.
    pub const DEFAULT_BATCH: usize = 50;

    /// The most tasks one claim asks for. Defaults to
    /// [`DEFAULT_BATCH`](Self::DEFAULT_BATCH) (50); at least 1.
    pub fn batch(&mut self, batch: usize) -> &mut Self {
        self.batch = Some(batch);
        self
    }

    /// Below this share of units free, claim nothing. Defaults to 0.1; a
    /// fraction.
    pub fn min_free(&mut self, share: f64) -> &mut Self {
        self.min_free = Some(share);
        self
    }

    /// Above this share of memory in use, apply the memory factor.
    /// Defaults to 0.8; a fraction.
    pub fn memory_threshold(&mut self, share: f64) -> &mut Self {
        self.memory_threshold = Some(share);
        self
    }

    /// The memory factor. Defaults to 0.5; a fraction.
    pub fn memory_factor(&mut self, factor: f64) -> &mut Self {
        self.memory_factor = Some(factor);
        self
    }

    /// Above this p99 latency, apply the latency factor. Unset by
    /// default (the seed leaves the threshold to its configuration).
    pub fn latency_threshold(&mut self, threshold: Duration) -> &mut Self {
        self.latency_threshold = Some(threshold);
        self
    }

    /// The latency factor. Defaults to 0.7; a fraction.
    pub fn latency_factor(&mut self, factor: f64) -> &mut Self {
        self.latency_factor = Some(factor);
        self
    }

    /// Builds it.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the field: `batch` 0; `min_free`,
    /// `memory_threshold`, `memory_factor` or `latency_factor` not a
    /// fraction above 0 and below 1; `latency_threshold` zero.
    pub fn build(&self) -> Result<ClaimSize, ConfigError> {
        use crate::adaptive::fraction;
        let batch = self.batch.unwrap_or(Self::DEFAULT_BATCH);
        if batch == 0 {
            return Err(ConfigError::zero("batch"));
        }
        if self.latency_threshold.is_some_and(|t| t.is_zero()) {
            return Err(ConfigError::zero_duration("latency_threshold"));
        }
        Ok(ClaimSize {
            batch,
            min_free: fraction("min_free", self.min_free.unwrap_or(0.1))?,
            memory_threshold: fraction("memory_threshold", self.memory_threshold.unwrap_or(0.8))?,
            memory_factor: fraction("memory_factor", self.memory_factor.unwrap_or(0.5))?,
            latency_threshold: self.latency_threshold,
            latency_factor: fraction("latency_factor", self.latency_factor.unwrap_or(0.7))?,
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn claims() -> ClaimSize {
        ClaimSize::builder()
            .latency_threshold(Duration::from_millis(100))
            .build()
            .unwrap()
    }

    #[test]
    fn each_factor_at_its_threshold() {
        let claims = claims();
        let calm = Pressure::new(1_000, 1_000);
        assert_eq!(claims.size(&calm), 50);
        // Exactly at a threshold is not past it.
        assert_eq!(claims.size(&calm.memory(Some(0.8))), 50);
        assert_eq!(claims.size(&calm.memory(Some(0.81))), 25);
        assert_eq!(claims.size(&calm.p99(Some(Duration::from_millis(100)))), 50);
        assert_eq!(claims.size(&calm.p99(Some(Duration::from_millis(101)))), 35);
        // Free share: 10 % claims, below it nothing.
        assert_eq!(claims.size(&Pressure::new(100, 1_000)), 50);
        assert_eq!(claims.size(&Pressure::new(99, 1_000)), 0);
        // Never more than free.
        assert_eq!(claims.size(&Pressure::new(3, 10)), 3);
        assert_eq!(claims.size(&Pressure::new(0, 0)), 0);
    }

    #[test]
    fn a_memory_reading_that_is_not_a_number_is_not_calm() {
        let claims = claims();
        let calm = Pressure::new(1_000, 1_000);
        assert_eq!(claims.size(&calm.memory(Some(f64::NAN))), 25);
        assert_eq!(claims.size(&calm.memory(Some(f64::INFINITY))), 25);
        assert_eq!(claims.size(&calm.memory(None)), 50);
    }

    #[test]
    fn the_limiter_reading_follows_its_units() {
        let limiter = Limiter::new(100).unwrap();
        let held: Vec<_> = (0..95).map(|_| limiter.try_acquire().unwrap()).collect();
        assert_eq!(claims().size(&Pressure::of(&limiter).memory(None)), 0);
        drop(held);
        assert_eq!(claims().size(&Pressure::of(&limiter).memory(None)), 50);
    }

    #[test]
    fn bad_fractions_name_their_field() {
        for (field, err) in [
            ("min_free", ClaimSize::builder().min_free(0.0).build()),
            (
                "memory_factor",
                ClaimSize::builder().memory_factor(1.0).build(),
            ),
            (
                "latency_factor",
                ClaimSize::builder().latency_factor(f64::NAN).build(),
            ),
            ("batch", ClaimSize::builder().batch(0).build()),
            (
                "latency_threshold",
                ClaimSize::builder()
                    .latency_threshold(Duration::ZERO)
                    .build(),
            ),
        ] {
            assert_eq!(err.unwrap_err().field(), field);
        }
    }
}
