//! [`Vegas`]: TCP Vegas's queue estimate from the minimum latency, as
//! Netflix's `VegasLimit` applies it to a concurrency limit.

use std::time::Duration;

use super::aimd::round_trips;
use super::{at_most_capacity, clamp, non_negative, Algorithm, Window};
use crate::error::ConfigError;

/// TCP Vegas: the queue is `limit × (1 − no-load latency / latency)`; a
/// queue below `alpha` grows the limit, above `beta` shrinks it, by
/// `log10(limit)` per round trip (Netflix's `VegasLimit`, whose `alpha`
/// and `beta` are 3 and 6 times `log10(limit)`).
///
/// The no-load latency is the least latency ever seen, re-measured the
/// way Netflix does it: after [`probe_multiplier`](VegasBuilder::probe_multiplier)
/// × limit samples, the next window's least latency replaces it, loaded
/// or not. Behind a backend that stays slow for long, that re-measure
/// takes the slow latency for the no-load one and the limit stops coming
/// down ([`Guarded`](super::Guarded) re-measures without that drift).
///
/// # Examples
///
/// ```
/// use sidejob::adaptive::Vegas;
///
/// let vegas = Vegas::builder().alpha(2.0).beta(4.0).build()?;
/// # let _ = vegas;
/// assert_eq!(Vegas::builder().alpha(5.0).beta(4.0).build().unwrap_err().field(), "beta");
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Vegas {
    alpha: f64,
    beta: f64,
    probe_multiplier: f64,
    limit: Option<f64>,
    noload: Option<Duration>,
    /// Samples since the no-load latency was last re-measured.
    since_probe: f64,
}

impl Default for Vegas {
    /// `alpha` 3, `beta` 6, a probe every 30 × limit samples.
    fn default() -> Self {
        Vegas {
            alpha: 3.0,
            beta: 6.0,
            probe_multiplier: 30.0,
            limit: None,
            noload: None,
            since_probe: 0.0,
        }
    }
}

impl Vegas {
    /// A builder, from the defaults.
    pub fn builder() -> VegasBuilder {
        VegasBuilder::default()
    }
}

impl Algorithm for Vegas {
    fn update(&mut self, window: &Window) -> usize {
        let limit = self.limit.unwrap_or(window.limit() as f64);
        let log = limit.max(1.0).log10().max(1.0);
        let (Some(latency), least) = (window.latency(), window.min_latency()) else {
            // No latency (nothing timed succeeded, nothing completed):
            // drops still say "too much".
            if window.dropped() > 0 {
                return self.set(window, limit - log * round_trips(window));
            }
            return limit.round() as usize;
        };
        let least = least.unwrap_or(latency);
        self.since_probe += window.completed() as f64;
        if self.probe_multiplier > 0.0 && self.since_probe >= self.probe_multiplier * limit {
            self.since_probe = 0.0;
            self.noload = Some(least);
        }
        let noload = *self.noload.get_or_insert(least);
        let noload = noload.min(least);
        self.noload = Some(noload);

        let steps = round_trips(window);
        let next = if window.dropped() > 0 {
            limit - log * steps
        } else if window.mean_in_flight() * 2.0 < limit {
            limit
        } else {
            let queue = limit * (1.0 - noload.as_secs_f64() / latency.as_secs_f64());
            if queue <= log {
                limit + self.beta * log * steps
            } else if queue < self.alpha * log {
                limit + log * steps
            } else if queue > self.beta * log {
                limit - log * steps
            } else {
                limit
            }
        };
        self.set(window, next)
    }
}

impl Vegas {
    fn set(&mut self, window: &Window, limit: f64) -> usize {
        let limit = clamp(window, limit);
        self.limit = Some(limit);
        limit.round() as usize
    }
}

/// Configures a [`Vegas`]; made by [`Vegas::builder`].
#[derive(Debug, Clone, Default)]
pub struct VegasBuilder {
    alpha: Option<f64>,
    beta: Option<f64>,
    probe_multiplier: Option<f64>,
}

impl VegasBuilder {
    /// Below `alpha × log10(limit)` queued, the limit grows. Defaults to 3;
    /// 0 or more, at most the largest capacity (2^60 - 1 on 64-bit
    /// targets): no queue is longer.
    pub fn alpha(&mut self, alpha: f64) -> &mut Self {
        self.alpha = Some(alpha);
        self
    }

    /// Above `beta × log10(limit)` queued, it shrinks; at least `alpha`,
    /// at most the largest capacity. Defaults to 6.
    pub fn beta(&mut self, beta: f64) -> &mut Self {
        self.beta = Some(beta);
        self
    }

    /// The no-load latency is re-measured after this many times the limit
    /// in samples; 0 never re-measures. Defaults to 30.
    pub fn probe_multiplier(&mut self, multiplier: f64) -> &mut Self {
        self.probe_multiplier = Some(multiplier);
        self
    }

    /// Builds it.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `alpha`, `beta` or `probe_multiplier` when
    /// negative or not finite, `alpha` or `beta` when above the largest
    /// capacity, or `beta` when below `alpha`.
    pub fn build(&self) -> Result<Vegas, ConfigError> {
        let default = Vegas::default();
        let alpha = at_most_capacity("alpha", self.alpha.unwrap_or(default.alpha))?;
        let beta = at_most_capacity("beta", self.beta.unwrap_or(default.beta))?;
        if beta < alpha {
            return Err(ConfigError::out_of_range("beta", "at least `alpha`"));
        }
        Ok(Vegas {
            alpha,
            beta,
            probe_multiplier: non_negative(
                "probe_multiplier",
                self.probe_multiplier.unwrap_or(default.probe_multiplier),
            )?,
            ..default
        })
    }
}
