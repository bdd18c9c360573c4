//! [`Aimd`]: additive increase, multiplicative decrease (TCP Reno's rule,
//! Netflix's `AIMDLimit`), on drops and an optional latency threshold.

use std::time::Duration;

use super::{at_most_capacity, clamp, fraction, Algorithm, Window};
use crate::error::ConfigError;

/// Additive increase, multiplicative decrease: the limit grows by
/// [`increase`](AimdBuilder::increase) per round trip while it binds and
/// nothing is dropped, and is multiplied by
/// [`backoff`](AimdBuilder::backoff) once per window that saw a drop or
/// (if set) a p99 latency above the
/// [`latency_threshold`](AimdBuilder::latency_threshold).
///
/// It reacts to loss, not to queueing: behind a backend that slows down
/// before it fails, the limit sits wherever the threshold puts it, and
/// saws up and down around it. Pick it for a backend that says "too much"
/// by failing or timing out.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sidejob::adaptive::Aimd;
///
/// let aimd = Aimd::builder()
///     .backoff(0.8)
///     .latency_threshold(Duration::from_millis(250))
///     .build()?;
/// # let _ = aimd;
/// assert_eq!(Aimd::builder().backoff(1.5).build().unwrap_err().field(), "backoff");
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Aimd {
    increase: f64,
    backoff: f64,
    threshold: Option<Duration>,
    limit: Option<f64>,
}

impl Default for Aimd {
    /// Increase 1 per round trip, back off to 0.9, no latency threshold.
    fn default() -> Self {
        Aimd {
            increase: 1.0,
            backoff: 0.9,
            threshold: None,
            limit: None,
        }
    }
}

impl Aimd {
    /// A builder, from the defaults.
    pub fn builder() -> AimdBuilder {
        AimdBuilder::default()
    }
}

impl Algorithm for Aimd {
    fn update(&mut self, window: &Window) -> usize {
        let limit = self.limit.unwrap_or(window.limit() as f64);
        let latency = window.p99_latency().or(window.latency());
        let slow = matches!((self.threshold, latency), (Some(max), Some(seen)) if seen > max);
        let next = if window.dropped() > 0 || slow {
            limit * self.backoff
        } else if window.is_binding() {
            limit + self.increase * round_trips(window)
        } else {
            limit
        };
        let next = clamp(window, next);
        self.limit = Some(next);
        next.round() as usize
    }
}

/// How many round trips fit the window (at least one): the number of
/// per-sample steps TCP-style algorithms take in it.
pub(crate) fn round_trips(window: &Window) -> f64 {
    match window.latency() {
        Some(latency) if !latency.is_zero() => {
            (window.elapsed().as_secs_f64() / latency.as_secs_f64()).max(1.0)
        }
        _ => 1.0,
    }
}

/// Configures an [`Aimd`]; made by [`Aimd::builder`].
#[derive(Debug, Clone, Default)]
pub struct AimdBuilder {
    increase: Option<f64>,
    backoff: Option<f64>,
    threshold: Option<Duration>,
}

impl AimdBuilder {
    /// Units added per round trip while the limit binds. Defaults to 1;
    /// 0 or more, at most the largest capacity (2^60 - 1 on 64-bit
    /// targets): a larger step means nothing more.
    pub fn increase(&mut self, units: f64) -> &mut Self {
        self.increase = Some(units);
        self
    }

    /// The factor a window with a drop multiplies the limit by. Defaults
    /// to 0.9; a fraction above 0 and below 1.
    pub fn backoff(&mut self, factor: f64) -> &mut Self {
        self.backoff = Some(factor);
        self
    }

    /// A p99 latency (the mean, without timed samples) above which a
    /// window counts as a drop. Unset by default: drops only.
    pub fn latency_threshold(&mut self, threshold: Duration) -> &mut Self {
        self.threshold = Some(threshold);
        self
    }

    /// Builds it.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `increase` or `backoff` when out of range.
    pub fn build(&self) -> Result<Aimd, ConfigError> {
        let default = Aimd::default();
        Ok(Aimd {
            increase: at_most_capacity("increase", self.increase.unwrap_or(default.increase))?,
            backoff: fraction("backoff", self.backoff.unwrap_or(default.backoff))?,
            threshold: self.threshold,
            limit: None,
        })
    }
}
