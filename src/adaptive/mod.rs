//! Adaptive limits: a [`Controller`] that moves a front-end's capacity
//! from what it observes, with pluggable [`Algorithm`]s.
//!
//! A fixed capacity is a guess. A controller watches the requests a
//! front-end admits (how long each held its unit, whether it was dropped,
//! how many were refused, how many completed) and moves the capacity
//! through the front-end's own `set_capacity`, which is exact under races
//! and never blocks, so fail-fast and waiting admission both keep working
//! while the limit moves.
//!
//! # How it fits together
//!
//! * **Samples** are recorded off the admission path, lock-free: a
//!   [`Timed`] permit (or the tower layer's `LimitLayer::adaptive`
//!   option, or your own [`Controller::record`]) adds one hold
//!   time to a counter cell picked by the calling thread's index, with a
//!   few relaxed atomic adds on a line that thread mostly owns. Counts
//!   that the admission table keeps anyway (completed, refused, waited,
//!   in flight) are read from the front-end's stats at each tick, for
//!   free: a controller with no timed samples still sees throughput, and
//!   latency by Little's law.
//! * **A tick** drains the cells into a [`Window`], hands it to the
//!   algorithm, clamps the answer between the floor and the ceiling, and
//!   calls `set_capacity` if it changed. Ticks come from the sample that
//!   finds the window's interval elapsed, from [`Controller::tick`] (a
//!   timer of yours), or from a [`Ticker`] thread
//!   ([`Controller::spawn_ticker`]): a controller fed by counts alone has
//!   no samples to tick it, and needs one of the last two. No lock of the admission table
//!   is held meanwhile, and the algorithm (which may be yours) runs under
//!   no lock at all.
//! * **Algorithms** are pure state machines fed one [`Window`] at a time,
//!   time included, so tests drive them with a virtual clock
//!   ([`Controller::record_at`], [`Controller::tick_at`]).
//!
//! # Algorithms
//!
//! | algorithm | signal | what it is for |
//! |---|---|---|
//! | [`Guarded`] (the default) | throughput and latency (Little's law), with guardrails | most services: converges in a few windows, no sheds while re-measuring, survives noise, slowdowns and mix shifts |
//! | [`Aimd`] | drops and a latency threshold | a backend that says "too much" by failing or timing out, not by slowing down |
//! | [`Vegas`] | queue estimate from the minimum latency (TCP Vegas, Netflix) | a steady backend with a stable minimum latency |
//! | [`Gradient2`] | long-term against short-term latency (Netflix) | latency that drifts slowly; tolerant of noise |
//! | [`LittlesLaw`] | peak throughput × no-load latency (brpc's auto limiter) | brpc's behaviour, periodic re-measuring included |
//!
//! The guide page [`guide::adaptive`](crate::guide::adaptive) says which
//! to pick for what, and `benches/adaptive.rs` compares them (and the Rust
//! peers) in one simulated run.
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use sidejob::Limiter;
//! use sidejob::adaptive::{Controller, Guarded};
//!
//! let limiter = Arc::new(Limiter::new(10)?);
//! let controller = Controller::builder()
//!     .floor(2)
//!     .ceiling(1_000)
//!     .build(Arc::clone(&limiter), Guarded::default())?;
//!
//! // Each request: a permit whose hold time the controller records.
//! let permit = controller.timed(limiter.try_acquire()?);
//! // ... the work ...
//! drop(permit);
//!
//! // A timer of yours (or the samples themselves) ticks the controller,
//! // which moves the limiter's capacity.
//! controller.tick();
//! assert!(limiter.capacity() >= 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::time::Duration;

mod aimd;
mod controller;
mod feed;
mod gradient2;
mod guarded;
mod littles;
mod noload;
mod recorder;
mod target;
#[cfg(all(test, not(loom)))]
mod tests;
#[cfg(not(loom))]
mod ticker;
mod vegas;

pub use aimd::{Aimd, AimdBuilder};
pub use controller::{Controller, ControllerBuilder, Timed};
pub use feed::Feed;
pub(crate) use feed::FeedSlot;
pub use gradient2::{Gradient2, Gradient2Builder};
pub use guarded::{Guarded, GuardedBuilder};
pub use littles::{LittlesLaw, LittlesLawBuilder};
pub use target::Target;
#[cfg(not(loom))]
pub use ticker::Ticker;
pub use vegas::{Vegas, VegasBuilder};

/// How a recorded request ended, for [`Controller::record`].
///
/// # Examples
///
/// ```
/// use sidejob::adaptive::Outcome;
///
/// assert_ne!(Outcome::Success, Outcome::Dropped);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Outcome {
    /// It completed: its latency is a sample.
    #[default]
    Success,
    /// It was dropped, timed out or failed in a way that says the backend
    /// is overloaded: counted in [`Window::dropped`], its latency left out
    /// (a timeout's latency is the timeout, not the backend's).
    Dropped,
    /// Neither (cancelled by its caller, or failed for its own reasons):
    /// not counted at all.
    Ignore,
}

/// A limit-setting algorithm: a state machine fed one [`Window`] of
/// observations at a time, answering the limit it wants.
///
/// The controller clamps the answer between [`Window::floor`] and
/// [`Window::ceiling`] and applies it with the front-end's
/// `set_capacity`. `update` runs under no lock (the controller takes the
/// algorithm out of its slot for the call), so it may take its time, but
/// while it runs the controller's other ticks are skipped, not queued.
/// It should be deterministic in its inputs: the window carries the time.
///
/// # Examples
///
/// A limit that follows the refusals: one more when any was refused,
/// one less otherwise.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use sidejob::{Error, Limiter};
/// use sidejob::adaptive::{Algorithm, Controller, Window};
///
/// #[derive(Debug)]
/// struct Follow;
///
/// impl Algorithm for Follow {
///     fn update(&mut self, window: &Window) -> usize {
///         if window.rejected() > 0 {
///             window.limit() + 1
///         } else {
///             window.limit() - 1
///         }
///     }
/// }
///
/// let limiter = Arc::new(Limiter::builder().capacity(1).shards(1).build()?);
/// let controller = Controller::builder()
///     .floor(1)
///     .ceiling(8)
///     .min_samples(0) // close every window, even with nothing completed
///     .build(Arc::clone(&limiter), Follow)?;
/// let held = limiter.try_acquire()?;
/// assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
/// controller.tick_at(Duration::from_millis(100));
/// assert_eq!(limiter.capacity(), 2);
/// drop(held);
/// controller.tick_at(Duration::from_millis(200));
/// assert_eq!(limiter.capacity(), 1, "the floor");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Algorithm: Send + 'static {
    /// The limit wanted after `window`.
    fn update(&mut self, window: &Window) -> usize;

    /// How many timed samples (completions, for a controller never given
    /// one) a window needs before it is closed when the limit refused or
    /// queued requests during it, given the builder's
    /// [`min_samples`](ControllerBuilder::min_samples). The controller
    /// takes no more than `min_samples` whatever this answers.
    ///
    /// By default `min_samples`: a binding window waits as any other.
    /// An algorithm that widens its band by each window's standard error
    /// may answer less, to act sooner when a late answer costs sheds (a
    /// limit too low) or a congested backend (too high): [`Guarded`]
    /// answers an eighth, so a slow backend with one request in 16 timed
    /// (800 completions a second) is read every 50 ms (the interval),
    /// not every 320 ms.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::adaptive::{Algorithm, Guarded, Window};
    ///
    /// #[derive(Debug)]
    /// struct Keep;
    /// impl Algorithm for Keep {
    ///     fn update(&mut self, window: &Window) -> usize {
    ///         window.limit()
    ///     }
    /// }
    ///
    /// assert_eq!(Keep.binding_min_samples(16), 16);
    /// assert_eq!(Guarded::default().binding_min_samples(16), 2);
    /// ```
    fn binding_min_samples(&self, min_samples: u64) -> u64 {
        min_samples
    }
}

impl fmt::Debug for dyn Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("dyn Algorithm")
    }
}

/// What a [`Controller`] saw between two ticks, handed to
/// [`Algorithm::update`].
///
/// Two kinds of figure:
///
/// * **Timed samples** (from [`Timed`] permits, the tower layer or
///   [`Controller::record`]): [`samples`](Self::samples),
///   [`dropped`](Self::dropped), and the latencies of the successes.
/// * **The front-end's counts**, read at the tick at no cost to
///   admission: [`completed`](Self::completed),
///   [`rejected`](Self::rejected), [`waited`](Self::waited),
///   [`in_flight`](Self::in_flight).
///
/// [`latency`](Self::latency) is the samples' mean when there are any,
/// else Little's law on the counts (in flight over throughput).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use sidejob::Limiter;
/// use sidejob::adaptive::{Algorithm, Controller, Outcome, Window};
///
/// #[derive(Debug, Default)]
/// struct Keep(Option<Window>);
/// impl Algorithm for Keep {
///     fn update(&mut self, window: &Window) -> usize {
///         window.limit()
///     }
/// }
///
/// let limiter = Arc::new(Limiter::new(10)?);
/// // A long interval: only the explicit tick below closes the window.
/// let controller = Controller::builder()
///     .min_samples(1)
///     .interval(Duration::from_secs(1))
///     .build(Arc::clone(&limiter), Keep::default())?;
/// for ms in [4, 6] {
///     controller.record_at(Duration::from_millis(50), Duration::from_millis(ms), Outcome::Success);
/// }
/// controller.record_at(Duration::from_millis(60), Duration::from_millis(90), Outcome::Dropped);
/// let window = controller.tick_at(Duration::from_millis(100)).expect("a tick ran");
/// assert_eq!((window.samples(), window.dropped()), (2, 1));
/// assert_eq!(window.latency(), Some(Duration::from_millis(5)));
/// assert_eq!(window.min_latency(), Some(Duration::from_millis(4)));
/// assert_eq!(window.elapsed(), Duration::from_millis(100));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub(crate) now: Duration,
    pub(crate) elapsed: Duration,
    pub(crate) limit: usize,
    pub(crate) floor: usize,
    pub(crate) ceiling: usize,
    pub(crate) samples: u64,
    pub(crate) dropped: u64,
    pub(crate) mean_latency: Option<Duration>,
    pub(crate) min_latency: Option<Duration>,
    pub(crate) p99_latency: Option<Duration>,
    pub(crate) completed: u64,
    pub(crate) rejected: u64,
    pub(crate) waited: u64,
    pub(crate) in_flight: usize,
}

impl Window {
    /// The time of this tick, since the controller was built (or on the
    /// virtual clock of [`Controller::tick_at`]).
    pub fn now(&self) -> Duration {
        self.now
    }

    /// How long the window lasted: since the previous tick.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// The limit in force during the window.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The lowest limit the controller will apply.
    pub fn floor(&self) -> usize {
        self.floor
    }

    /// The highest limit the controller will apply.
    pub fn ceiling(&self) -> usize {
        self.ceiling
    }

    /// Timed samples of requests that succeeded.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Timed requests that were dropped ([`Outcome::Dropped`]).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Requests the front-end completed (released their unit), timed or
    /// not; falls back to [`samples`](Self::samples) for a target that
    /// counts none.
    pub fn completed(&self) -> u64 {
        self.completed.max(self.samples)
    }

    /// Attempts the front-end refused with `Overload`.
    pub fn rejected(&self) -> u64 {
        self.rejected
    }

    /// Requests that waited in the front-end's waiting room before they
    /// were admitted.
    pub fn waited(&self) -> u64 {
        self.waited
    }

    /// Units held at the tick.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Completions per second over the window.
    pub fn throughput(&self) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds > 0.0 {
            self.completed() as f64 / seconds
        } else {
            0.0
        }
    }

    /// The mean latency: of the timed samples when there are any, else
    /// by Little's law from the counts ([`in_flight`](Self::in_flight)
    /// over [`throughput`](Self::throughput)); `None` when nothing
    /// completed.
    pub fn latency(&self) -> Option<Duration> {
        if self.mean_latency.is_some() {
            return self.mean_latency;
        }
        let throughput = self.throughput();
        // Saturating: a window as long as `Duration::MAX` with few
        // completions reads a latency beyond it.
        (throughput > 0.0 && self.in_flight > 0)
            .then(|| saturating_secs(self.in_flight as f64 / throughput))
    }

    /// The shortest timed sample, if any.
    pub fn min_latency(&self) -> Option<Duration> {
        self.min_latency
    }

    /// The 99th percentile of the timed samples (to within a quarter of a
    /// power of two), if any.
    pub fn p99_latency(&self) -> Option<Duration> {
        self.p99_latency
    }

    /// The mean number of requests in flight over the window, by Little's
    /// law: throughput × mean latency.
    pub fn mean_in_flight(&self) -> f64 {
        match self.latency() {
            Some(latency) => self.throughput() * latency.as_secs_f64(),
            None => self.in_flight as f64,
        }
    }

    /// True when the limit held requests back during the window: some
    /// were refused or waited, or the mean in flight came within 10 % of
    /// it. An algorithm raises a limit only when it binds: a limit that
    /// nobody reaches says nothing about the backend.
    pub fn is_binding(&self) -> bool {
        self.rejected > 0 || self.waited > 0 || self.mean_in_flight() >= 0.9 * self.limit as f64
    }

    /// The share of timed requests that were dropped.
    pub fn drop_rate(&self) -> f64 {
        let all = self.samples + self.dropped;
        if all == 0 {
            0.0
        } else {
            self.dropped as f64 / all as f64
        }
    }
}

/// `secs` seconds as a `Duration`, saturating: `Duration::MAX` past its
/// end (a latency read from a window as long as `Duration::MAX`), zero
/// below zero or for NaN.
pub(crate) fn saturating_secs(secs: f64) -> Duration {
    match Duration::try_from_secs_f64(secs) {
        Ok(duration) => duration,
        Err(_) if secs > 0.0 => Duration::MAX,
        Err(_) => Duration::ZERO,
    }
}

/// `value` clamped into the window's bounds, as a whole limit: an
/// infinite one is the ceiling (or the floor), NaN the floor.
pub(crate) fn clamp(window: &Window, value: f64) -> f64 {
    let value = if value.is_nan() { 0.0 } else { value };
    value.clamp(window.floor as f64, window.ceiling as f64)
}

/// Checks a builder's fraction: above 0 and below 1.
pub(crate) fn fraction(field: &'static str, value: f64) -> Result<f64, crate::error::ConfigError> {
    if value > 0.0 && value < 1.0 {
        Ok(value)
    } else {
        Err(crate::error::ConfigError::out_of_range(
            field,
            "a fraction above 0 and below 1",
        ))
    }
}

/// Checks a builder's step or queue length: 0 or more, at most the
/// largest capacity (a larger one means nothing more, and would push a
/// limit past what `f64` holds).
pub(crate) fn at_most_capacity(
    field: &'static str,
    value: f64,
) -> Result<f64, crate::error::ConfigError> {
    let value = non_negative(field, value)?;
    let max = crate::engine::table::MAX_CAPACITY;
    if value > max as f64 {
        return Err(crate::error::ConfigError::too_large(field, max));
    }
    Ok(value)
}

/// Checks a builder's non-negative finite number.
pub(crate) fn non_negative(
    field: &'static str,
    value: f64,
) -> Result<f64, crate::error::ConfigError> {
    if value >= 0.0 && value.is_finite() {
        Ok(value)
    } else {
        Err(crate::error::ConfigError::out_of_range(
            field,
            "a finite number, 0 or more",
        ))
    }
}
