//! The no-load latency estimate that [`Guarded`](super::Guarded) and
//! [`LittlesLaw`](super::LittlesLaw) share: the least mean of pools of
//! uncongested windows, each pool holding enough samples that its mean is
//! not noise.
//!
//! Why pools: the least of many noisy means reads low by a few of their
//! standard errors. With one request in 16 timed, a 50 ms window holds a
//! dozen or two samples, its mean is off by 7 % or more, and the least of
//! a few hundred such means sits a fifth below the truth; a limit built on
//! it sheds at half load. A pool of uncongested windows (those above the
//! owner's band are left out) holding [`DEFAULT_SAMPLES`] samples has a mean off by a sixteenth as
//! much.
//!
//! What moves the estimate, and nothing else does:
//!
//! * [`rebase`](Noload::rebase): one window's mean, provisional (the first
//!   window, or whatever its owner takes as a sign the backend changed);
//! * while provisional, the running mean of the pool being filled, which
//!   may correct a rough first reading down but rise above it by `rise`
//!   at most (windows within a wide band could otherwise carry it up with
//!   congestion); the first full pool ends the provisional state;
//! * after that, a full pool whose mean is at or below the estimate.
//!
//! So the estimate never rises on its own: a long incident cannot teach
//! it that congested latency is normal (the drift of failsafe-go#127).
//! Only its owner's re-basing moves it up.

use super::Window;

/// Samples a pool gathers before its mean counts, unless configured.
pub(crate) const DEFAULT_SAMPLES: f64 = 256.0;

/// One window's latency and how far to trust it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    /// The window's mean latency, seconds.
    pub(crate) latency: f64,
    /// What the mean weighs: its timed samples, or its completions when
    /// it has none (a counts-only controller).
    pub(crate) weight: f64,
    /// One sample's relative standard deviation: p99 against the mean, as
    /// if normal; 0 without two timed samples.
    pub(crate) spread: f64,
    /// The relative standard error of the mean: the spread over the root
    /// of the weight.
    pub(crate) noise: f64,
}

impl Reading {
    /// The window's reading; `None` when nothing completed, or when its
    /// mean latency is zero: samples that all read zero (a clock coarser
    /// than the requests, a mock) measure nothing, and taken as the
    /// no-load latency they would hold the limit at the floor.
    pub(crate) fn of(window: &Window) -> Option<Reading> {
        let latency = window.latency()?.as_secs_f64();
        if latency <= 0.0 {
            return None;
        }
        let weight = match window.samples() {
            0 => window.completed(),
            samples => samples,
        } as f64;
        let spread = match (window.p99_latency(), window.samples()) {
            (Some(p99), samples) if samples > 1 && latency > 0.0 => {
                ((p99.as_secs_f64() - latency) / latency).max(0.0) / 2.33
            }
            _ => 0.0,
        };
        Some(Reading {
            latency,
            weight,
            spread,
            noise: spread / weight.max(1.0).sqrt(),
        })
    }
}

/// The no-load latency estimate (see the module's documentation).
#[derive(Debug, Clone)]
pub(crate) struct Noload {
    /// Samples a pool needs before its mean counts.
    samples: f64,
    /// How far a provisional estimate may rise above the window it
    /// started from, relative.
    rise: f64,
    /// The estimate, seconds.
    value: Option<f64>,
    /// The samples behind the estimate: fewer than `samples` make it
    /// provisional.
    weight: f64,
    /// The estimate's relative standard error.
    noise: f64,
    /// The window reading a provisional estimate started from.
    seed: f64,
    /// That reading's relative standard error: a seed from a handful of
    /// samples may itself read low by a few of them.
    seed_noise: f64,
    /// How many of the seed's standard errors a provisional estimate may
    /// rise by beside `rise` (0 unless [`seed_allowance`](Self::seed_allowance)).
    seed_errors: f64,
    /// Uncongested windows pooled toward the next reading.
    pool: Pool,
}

/// Consecutive uncongested windows, summed.
#[derive(Debug, Clone, Copy, Default)]
struct Pool {
    /// Σ latency × weight, seconds.
    sum: f64,
    /// Σ weight.
    weight: f64,
    /// Σ relative spread × weight.
    spread: f64,
}

impl Pool {
    fn add(&mut self, reading: &Reading) {
        self.sum += reading.latency * reading.weight;
        self.weight += reading.weight;
        self.spread += reading.spread * reading.weight;
    }

    /// The mean latency and its relative standard error.
    fn reading(&self) -> (f64, f64) {
        let spread = self.spread / self.weight;
        (self.sum / self.weight, spread / self.weight.sqrt())
    }
}

impl Noload {
    /// No estimate yet; pools of `samples` (more than 0), a provisional
    /// estimate rising by `rise` at most.
    pub(crate) fn new(samples: f64, rise: f64) -> Self {
        Noload {
            samples,
            rise,
            value: None,
            weight: 0.0,
            noise: 0.0,
            seed: 0.0,
            seed_noise: 0.0,
            seed_errors: 0.0,
            pool: Pool::default(),
        }
    }

    /// Lets a provisional estimate rise above its seed by three of the
    /// seed's standard errors besides `rise`: for an owner whose windows
    /// may close on a handful of samples (Guarded's binding windows).
    pub(crate) fn seed_allowance(mut self) -> Self {
        self.seed_errors = 3.0;
        self
    }

    /// The estimate, seconds, if there is one.
    pub(crate) fn get(&self) -> Option<f64> {
        self.value
    }

    /// The estimate's relative standard error.
    pub(crate) fn noise(&self) -> f64 {
        self.noise
    }

    /// Forgets the estimate: the next [`rebase`](Self::rebase) starts it
    /// again.
    pub(crate) fn forget(&mut self) {
        *self = Noload {
            seed_errors: self.seed_errors,
            ..Noload::new(self.samples, self.rise)
        };
    }

    /// Starts again from one window's reading, provisional until a pool
    /// fills.
    pub(crate) fn rebase(&mut self, reading: &Reading) {
        self.value = Some(reading.latency);
        self.weight = reading.weight;
        self.noise = reading.noise;
        self.seed = reading.latency;
        self.seed_noise = reading.noise;
        self.pool = Pool::default();
    }

    /// Pools a window; `above`: its mean was above the owner's band (a
    /// congested window), which is left out of the pool.
    pub(crate) fn feed(&mut self, reading: &Reading, above: bool) {
        if above {
            return;
        }
        self.pool.add(reading);
        if self.pool.weight <= 0.0 {
            return;
        }
        let (mean, error) = self.pool.reading();
        let full = self.pool.weight >= self.samples;
        if self.weight < self.samples {
            // Above the seed by the rise, and by three of the seed's own
            // standard errors: a seed read from four samples (a window the
            // limit bound, closed early) may be low by a seventh, and a
            // cap at the rise alone kept that error once the pool filled.
            self.value =
                Some(mean.min(self.seed * (1.0 + self.rise + self.seed_errors * self.seed_noise)));
            self.weight = self.pool.weight;
            self.noise = error;
        } else if full && self.value.is_some_and(|value| mean <= value) {
            self.value = Some(mean);
            self.weight = self.pool.weight;
            self.noise = error;
        }
        if full {
            self.pool = Pool::default();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn reading(latency: f64, weight: f64) -> Reading {
        Reading {
            latency,
            weight,
            spread: 0.0,
            noise: 0.0,
        }
    }

    #[test]
    fn moves_down_on_a_full_pool_never_up_on_its_own() {
        let mut noload = Noload::new(100.0, 0.1);
        assert_eq!(noload.get(), None);
        noload.rebase(&reading(10.0, 10.0));
        // Provisional: follows the running mean down, up by 10 % at most.
        noload.feed(&reading(8.0, 10.0), false);
        assert_eq!(noload.get(), Some(8.0));
        noload.feed(&reading(30.0, 10.0), false);
        assert_eq!(noload.get(), Some(11.0));
        // The pool fills at 100 samples: its mean, 10.0 (weights 10, 10
        // and 80 at 8, 30 and 7.75), replaces it.
        noload.feed(&reading(7.75, 80.0), false);
        assert_eq!(noload.get(), Some(10.0));
        // Settled: a full pool above does nothing, however long.
        for _ in 0..100 {
            noload.feed(&reading(12.0, 100.0), false);
        }
        assert_eq!(noload.get(), Some(10.0));
        // A congested window is left out of the pool.
        noload.feed(&reading(9.0, 50.0), false);
        noload.feed(&reading(50.0, 1.0), true);
        assert_eq!(noload.get(), Some(10.0));
        noload.feed(&reading(9.0, 50.0), false);
        assert_eq!(noload.get(), Some(9.0));
        // Only a re-basing moves it up.
        noload.rebase(&reading(20.0, 10.0));
        assert_eq!(noload.get(), Some(20.0));
        noload.forget();
        assert_eq!(noload.get(), None);
    }
}
