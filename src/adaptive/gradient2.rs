//! [`Gradient2`]: Netflix's `Gradient2Limit`, the ratio of a long-term to
//! a short-term latency, with a tolerance.

use super::{clamp, fraction, non_negative, Algorithm, Window};
use crate::error::ConfigError;

/// Netflix's Gradient2: `gradient = clamp(tolerance × long / short, 0.5,
/// 1)`, `limit = limit × gradient + queue`, smoothed; `short` is the
/// window's mean latency, `long` an exponential average over
/// [`long_window`](Gradient2Builder::long_window) windows (pulled down
/// when it runs far above `short`, so a recovered backend is believed).
///
/// The tolerance (1.5 by default) keeps noise from cutting the limit, at
/// the cost of letting latency rise that far before it reacts; the long
/// average lets a slow drift in, by design.
///
/// # Examples
///
/// ```
/// use sidejob::adaptive::Gradient2;
///
/// let gradient = Gradient2::builder().tolerance(2.0).smoothing(0.5).build()?;
/// # let _ = gradient;
/// assert_eq!(Gradient2::builder().tolerance(0.5).build().unwrap_err().field(), "tolerance");
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Gradient2 {
    tolerance: f64,
    smoothing: f64,
    long_window: f64,
    queue: f64,
    limit: Option<f64>,
    long: Option<f64>,
}

impl Default for Gradient2 {
    /// Tolerance 1.5, smoothing 0.2, a long window of 60 windows, a queue
    /// of 4.
    fn default() -> Self {
        Gradient2 {
            tolerance: 1.5,
            smoothing: 0.2,
            long_window: 60.0,
            queue: 4.0,
            limit: None,
            long: None,
        }
    }
}

impl Gradient2 {
    /// A builder, from the defaults.
    pub fn builder() -> Gradient2Builder {
        Gradient2Builder::default()
    }
}

impl Algorithm for Gradient2 {
    fn update(&mut self, window: &Window) -> usize {
        let limit = self.limit.unwrap_or(window.limit() as f64);
        let Some(short) = window.latency().map(|l| l.as_secs_f64()) else {
            return limit.round() as usize;
        };
        if short <= 0.0 {
            return limit.round() as usize;
        }
        let factor = 2.0 / (self.long_window + 1.0);
        let mut long = match self.long {
            Some(long) => long * (1.0 - factor) + short * factor,
            None => short,
        };
        // Netflix: a long average far above the short one is pulled down,
        // so that a backend that recovered is believed sooner.
        if long / short > 2.0 {
            long *= 0.95;
        }
        self.long = Some(long);
        if window.mean_in_flight() < limit / 2.0 {
            return limit.round() as usize;
        }
        let gradient = (self.tolerance * long / short).clamp(0.5, 1.0);
        let wanted = limit * gradient + self.queue;
        let next = clamp(
            window,
            limit * (1.0 - self.smoothing) + wanted * self.smoothing,
        );
        self.limit = Some(next);
        next.round() as usize
    }
}

/// Configures a [`Gradient2`]; made by [`Gradient2::builder`].
#[derive(Debug, Clone, Default)]
pub struct Gradient2Builder {
    tolerance: Option<f64>,
    smoothing: Option<f64>,
    long_window: Option<f64>,
    queue: Option<f64>,
}

impl Gradient2Builder {
    /// How far the short latency may rise over the long one before the
    /// limit comes down; at least 1. Defaults to 1.5.
    pub fn tolerance(&mut self, tolerance: f64) -> &mut Self {
        self.tolerance = Some(tolerance);
        self
    }

    /// The weight of each window's answer; a fraction above 0 and below
    /// 1. Defaults to 0.2.
    pub fn smoothing(&mut self, smoothing: f64) -> &mut Self {
        self.smoothing = Some(smoothing);
        self
    }

    /// The long average's span, in windows; at least 1. Defaults to 60.
    pub fn long_window(&mut self, windows: f64) -> &mut Self {
        self.long_window = Some(windows);
        self
    }

    /// Units added above `limit × gradient`; 0 or more. Defaults to 4.
    pub fn queue(&mut self, units: f64) -> &mut Self {
        self.queue = Some(units);
        self
    }

    /// Builds it.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `tolerance`, `smoothing`, `long_window` or
    /// `queue` when out of range.
    pub fn build(&self) -> Result<Gradient2, ConfigError> {
        let default = Gradient2::default();
        let tolerance = self.tolerance.unwrap_or(default.tolerance);
        if !(tolerance >= 1.0 && tolerance.is_finite()) {
            return Err(ConfigError::out_of_range(
                "tolerance",
                "a finite number, 1 or more",
            ));
        }
        let long_window = self.long_window.unwrap_or(default.long_window);
        if !(long_window >= 1.0 && long_window.is_finite()) {
            return Err(ConfigError::out_of_range(
                "long_window",
                "a finite number, 1 or more",
            ));
        }
        Ok(Gradient2 {
            tolerance,
            smoothing: fraction("smoothing", self.smoothing.unwrap_or(default.smoothing))?,
            long_window,
            queue: non_negative("queue", self.queue.unwrap_or(default.queue))?,
            ..default
        })
    }
}
