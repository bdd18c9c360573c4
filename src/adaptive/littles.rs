//! [`LittlesLaw`]: brpc's auto concurrency limiter, peak throughput times
//! no-load latency, with brpc's periodic re-measuring.

use std::time::Duration;

use super::noload::{Noload, Reading, DEFAULT_SAMPLES};
use super::{clamp, fraction, Algorithm, Window};
use crate::error::ConfigError;

/// brpc's auto limiter: `limit = max_qps × min_latency × (1 + explore)`
/// (Little's law, with room to explore), where `max_qps` is an average
/// that jumps to any higher throughput and decays from it, and `explore`
/// moves between 6 % and 30 % by 2 % a window: up while latency stays
/// near the minimum or throughput below the peak, down otherwise.
///
/// `min_latency` is not brpc's: brpc follows each lower window latency
/// down with an average, which reads low when few requests are timed
/// (the least of many noisy window means sits below the truth, and at one
/// request in 16 timed that shed at half load). Here it is the no-load
/// estimate [`Guarded`](super::Guarded) uses: the first window's mean,
/// refined by pools of 256 samples, lowered only by a full pool whose
/// mean is at or below it. A window above it by more than `min_explore`
/// plus three of its standard errors is left out of the pools.
///
/// Every [`remeasure_every`](LittlesLawBuilder::remeasure_every) (50 s,
/// brpc's default) it re-measures the no-load latency as brpc does: one
/// window at 90 % of `max_qps × min_latency`, which sheds under full load,
/// then the estimate starts again from the next window, loaded or not.
/// Set it to `None` to keep the estimate for good (only lower pools move
/// it then).
///
/// # Examples
///
/// ```
/// use sidejob::adaptive::LittlesLaw;
///
/// let brpc = LittlesLaw::builder().remeasure_every(None).build()?;
/// # let _ = brpc;
/// assert_eq!(LittlesLaw::builder().max_explore(0.0).build().unwrap_err().field(), "max_explore");
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct LittlesLaw {
    min_explore: f64,
    max_explore: f64,
    step: f64,
    alpha: f64,
    remeasure_every: Option<Duration>,
    reduce_ratio: f64,
    explore: f64,
    max_qps: Option<f64>,
    /// The no-load latency (brpc's `min_latency`).
    noload: Noload,
    /// When the next re-measure begins.
    next_remeasure: Option<Duration>,
    /// A re-measure is under way: forget the minimum after this window.
    remeasuring: bool,
    limit: Option<f64>,
}

impl Default for LittlesLaw {
    /// brpc's flags (explore 6 % to 30 % by 2 %, a peak throughput that
    /// decays by a hundredth a window, a re-measure every 50 s at 90 %),
    /// and no-load pools of 256 samples.
    fn default() -> Self {
        LittlesLaw {
            min_explore: 0.06,
            max_explore: 0.3,
            step: 0.02,
            alpha: 0.1,
            remeasure_every: Some(Duration::from_secs(50)),
            reduce_ratio: 0.9,
            explore: 0.3,
            max_qps: None,
            noload: Noload::new(DEFAULT_SAMPLES, 0.06),
            next_remeasure: None,
            remeasuring: false,
            limit: None,
        }
    }
}

impl LittlesLaw {
    /// A builder, from the defaults.
    pub fn builder() -> LittlesLawBuilder {
        LittlesLawBuilder::default()
    }
}

impl Algorithm for LittlesLaw {
    fn update(&mut self, window: &Window) -> usize {
        let limit = self.limit.unwrap_or(window.limit() as f64);
        let Some(reading) = Reading::of(window) else {
            return limit.round() as usize;
        };
        let latency = reading.latency;
        let qps = window.throughput();
        if self.remeasuring {
            // brpc: the reduced window is over; the estimate starts again.
            self.remeasuring = false;
            self.noload.forget();
        }
        let min_latency = match self.noload.get() {
            Some(min) => min,
            None => {
                self.noload.rebase(&reading);
                latency
            }
        };
        let band = self.min_explore + 3.0 * reading.noise;
        self.noload
            .feed(&reading, latency > min_latency * (1.0 + band));
        let min_latency = self.noload.get().unwrap_or(min_latency);
        let decay = self.alpha / 10.0;
        let max_qps = match self.max_qps {
            Some(max) if qps < max => qps * decay + max * (1.0 - decay),
            _ => qps,
        };
        self.max_qps = Some(max_qps);

        let now = window.now();
        let next_remeasure = *self.next_remeasure.get_or_insert_with(|| {
            now.saturating_add(self.remeasure_every.unwrap_or(Duration::MAX))
        });
        let next = if self.remeasure_every.is_some() && now >= next_remeasure {
            self.remeasuring = true;
            // Saturating: `remeasure_every` is the user's, and may be
            // `Duration::MAX`.
            self.next_remeasure = self.remeasure_every.map(|every| now.saturating_add(every));
            max_qps * min_latency * self.reduce_ratio
        } else {
            if latency <= min_latency * (1.0 + self.min_explore)
                || qps <= max_qps / (1.0 + self.min_explore)
            {
                self.explore = (self.explore + self.step).min(self.max_explore);
            } else {
                self.explore = (self.explore - self.step).max(self.min_explore);
            }
            max_qps * min_latency * (1.0 + self.explore)
        };
        let next = clamp(window, next.ceil());
        self.limit = Some(next);
        next.round() as usize
    }
}

/// Configures a [`LittlesLaw`]; made by [`LittlesLaw::builder`].
#[derive(Debug, Clone, Default)]
pub struct LittlesLawBuilder {
    min_explore: Option<f64>,
    max_explore: Option<f64>,
    remeasure_every: Option<Option<Duration>>,
    reduce_ratio: Option<f64>,
}

impl LittlesLawBuilder {
    /// The least room to explore above the estimate; a fraction, at most
    /// `max_explore`. Defaults to 0.06.
    pub fn min_explore(&mut self, ratio: f64) -> &mut Self {
        self.min_explore = Some(ratio);
        self
    }

    /// The most room to explore; a fraction. Defaults to 0.3.
    pub fn max_explore(&mut self, ratio: f64) -> &mut Self {
        self.max_explore = Some(ratio);
        self
    }

    /// How often the no-load latency is re-measured (brpc's way, which
    /// sheds); `None` never. Defaults to 50 s.
    pub fn remeasure_every(&mut self, every: Option<Duration>) -> &mut Self {
        self.remeasure_every = Some(every);
        self
    }

    /// The share of the estimate kept while re-measuring; a fraction.
    /// Defaults to 0.9.
    pub fn reduce_ratio(&mut self, ratio: f64) -> &mut Self {
        self.reduce_ratio = Some(ratio);
        self
    }

    /// Builds it.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `min_explore`, `max_explore` or
    /// `reduce_ratio` when not a fraction, `max_explore` when below
    /// `min_explore`, or `remeasure_every` when zero.
    pub fn build(&self) -> Result<LittlesLaw, ConfigError> {
        let default = LittlesLaw::default();
        let min_explore = fraction(
            "min_explore",
            self.min_explore.unwrap_or(default.min_explore),
        )?;
        let max_explore = fraction(
            "max_explore",
            self.max_explore.unwrap_or(default.max_explore),
        )?;
        if max_explore < min_explore {
            return Err(ConfigError::out_of_range(
                "max_explore",
                "at least `min_explore`",
            ));
        }
        let remeasure_every = self.remeasure_every.unwrap_or(default.remeasure_every);
        if remeasure_every.is_some_and(|every| every.is_zero()) {
            return Err(ConfigError::zero_duration("remeasure_every"));
        }
        Ok(LittlesLaw {
            noload: Noload::new(DEFAULT_SAMPLES, min_explore),
            min_explore,
            max_explore,
            explore: max_explore,
            remeasure_every,
            reduce_ratio: fraction(
                "reduce_ratio",
                self.reduce_ratio.unwrap_or(default.reduce_ratio),
            )?,
            ..default
        })
    }
}
