//! [`Feed`]: the samples a front-end takes itself, where it sees a
//! request's life (a pool's workers around each handler), into a
//! [`Controller`]'s recorder, with no user code and nothing on the
//! admission path.
//!
//! The front-end keeps the feed in a [`FeedSlot`], set once by
//! [`Controller::attach`]; a worker reads the slot once per request. The
//! feed holds the controller's sample cells (shared, so no cycle: the
//! controller holds the front-end, the front-end only the cells) and a
//! weak handle to the controller, upgraded only for a tick.

use std::fmt;
use std::sync::{Arc as StdArc, OnceLock, Weak};
use std::time::{Duration, Instant};

use super::recorder::Recorder;
use super::{Controller, Outcome};
use crate::sync::{const_thread_local, now, AtomicU64, Ordering::Relaxed};
use std::cell::Cell;

const_thread_local! {
    /// Requests left before this thread times one: the sampling of
    /// [`Samples::sample`]. Shared by every controller the thread times
    /// for; the gaps are random, so two controllers taking turns on one
    /// thread are both sampled.
    static COUNTDOWN: Cell<u32> = Cell::new(1);
}

const_thread_local! {
    /// This thread's xorshift32 state, for the next gap (never 0).
    static GAPS: Cell<u32> = Cell::new(0x9e37_79b9);
}

/// Where a front-end keeps the feed it was given, if any.
pub(crate) type FeedSlot = OnceLock<Feed>;

/// What every sample of a controller goes into, shared by the controller
/// and the feeds of the front-ends it is attached to.
#[derive(Debug)]
pub(crate) struct Samples {
    pub(crate) recorder: Recorder,
    pub(crate) interval: Duration,
    /// About one request in `every` is timed.
    pub(crate) every: u32,
    /// Time zero of the real clock.
    pub(crate) epoch: Instant,
    /// Nanoseconds from time zero to the last tick: read by every sample
    /// to see whether the interval has passed.
    pub(crate) last_tick: AtomicU64,
}

impl Samples {
    /// True if this request is one to time: about one in `every`, by a
    /// countdown of the calling thread (a thread-local decrement and a
    /// branch) whose gaps are drawn at random, uniform in `1..2 × every`.
    #[inline]
    pub(crate) fn sample(&self) -> bool {
        COUNTDOWN.with(|countdown| {
            let left = countdown.get();
            if left > 1 {
                countdown.set(left - 1);
                false
            } else {
                countdown.set(self.next_gap());
                true
            }
        })
    }

    /// A gap uniform in `1..2 × every` (1 when `every` is 1).
    #[cold]
    fn next_gap(&self) -> u32 {
        if self.every <= 1 {
            return 1;
        }
        let mut x = GAPS.with(Cell::get);
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        GAPS.with(|gaps| gaps.set(x));
        let span = u64::from(self.every) * 2 - 1;
        1 + ((u64::from(x) * span) >> 32) as u32
    }

    /// Records one sample; true if the interval has passed since the last
    /// tick at `now`, so the caller should tick.
    pub(crate) fn record(&self, now: Duration, latency: Duration, outcome: Outcome) -> bool {
        match outcome {
            Outcome::Success => self.recorder.record(latency, false),
            Outcome::Dropped => self.recorder.record(latency, true),
            Outcome::Ignore => return false,
        }
        self.due(now)
    }

    /// True if the interval has passed since the last tick at `now`.
    pub(crate) fn due(&self, now: Duration) -> bool {
        // Relaxed: a hint for when to try a tick; the tick itself is
        // serialized by the controller's state slot, and re-reads nothing
        // of this (it pairs with the Relaxed store of `store_tick`).
        let last = self.last_tick.load(Relaxed);
        nanos(now).saturating_sub(last) >= nanos(self.interval)
    }

    /// Notes a tick at `now`.
    pub(crate) fn store_tick(&self, now: Duration) {
        // Relaxed: see `due`.
        self.last_tick.store(nanos(now), Relaxed);
    }
}

pub(crate) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// A [`Controller`]'s samples, as a front-end that times its own requests
/// holds them: given to [`Target::attach`](super::Target::attach) by
/// [`Controller::attach`].
///
/// A front-end of yours that sees when a request starts and ends calls
/// [`start`](Self::start) and [`finish`](Self::finish) around it (on any
/// thread) and [`tick_at`](Self::tick_at) with what `finish` returned,
/// after it has answered the request, so the tick (the algorithm, and the
/// new capacity) delays no reply. The feed keeps the controller alive only
/// while it ticks: a feed outliving its controller records into cells
/// nobody reads.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::sync::OnceLock;
/// use sidejob::adaptive::{Controller, Feed, Guarded, Outcome, Target};
/// use sidejob::{ConfigError, Limiter, Stats};
///
/// /// A limiter that times its requests itself.
/// struct Timing {
///     limiter: Arc<Limiter>,
///     feed: Arc<OnceLock<Feed>>,
/// }
///
/// impl Target for Timing {
///     fn set_capacity(&self, capacity: usize) -> Result<(), ConfigError> {
///         self.limiter.set_capacity(capacity)
///     }
///     fn capacity(&self) -> usize {
///         self.limiter.capacity()
///     }
///     fn stats(&self) -> Stats {
///         self.limiter.stats()
///     }
///     fn attach(&self, feed: Feed) -> bool {
///         self.feed.set(feed).is_ok()
///     }
/// }
///
/// let limiter = Arc::new(Limiter::new(4)?);
/// let feed = Arc::new(OnceLock::new());
/// let timing = Timing { limiter: Arc::clone(&limiter), feed: Arc::clone(&feed) };
/// let controller = Arc::new(Controller::builder().min_samples(1).build(timing, Guarded::default())?);
/// assert!(Controller::attach(&controller));
///
/// // Around a request:
/// let feed = feed.get().expect("attached");
/// let permit = limiter.try_acquire()?;
/// let started = feed.start();
/// // ... the work ...
/// drop(permit);
/// let due = started.and_then(|started| feed.finish(started, Outcome::Success));
/// // ... the answer ...
/// if let Some(now) = due {
///     feed.tick_at(now);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Feed {
    samples: StdArc<Samples>,
    controller: Weak<Controller>,
}

impl Feed {
    pub(crate) fn new(samples: StdArc<Samples>, controller: Weak<Controller>) -> Self {
        Feed {
            samples,
            controller,
        }
    }

    /// The start of a request: the time, or `None` when this request is
    /// not one of the sampled ones (about one in the controller's
    /// [`sample_every`](super::ControllerBuilder::sample_every) is; the
    /// others read no clock and have nothing to finish).
    pub fn start(&self) -> Option<Instant> {
        self.samples.sample().then(now)
    }

    /// The end of a request that started at `started`: records its
    /// latency. Returns the time for [`tick_at`](Self::tick_at) if the
    /// controller's interval has passed, else `None`.
    pub fn finish(&self, started: Instant, outcome: Outcome) -> Option<Duration> {
        let end = now();
        let at = end.saturating_duration_since(self.samples.epoch);
        self.samples
            .record(at, end.saturating_duration_since(started), outcome)
            .then_some(at)
    }

    /// Ticks the controller at `now` (from [`finish`](Self::finish)), if
    /// it is still there. Runs its algorithm and moves the capacity on
    /// the calling thread: call it holding no lock of yours.
    pub fn tick_at(&self, now: Duration) {
        if let Some(controller) = self.controller.upgrade() {
            controller.tick_at(now);
        }
    }
}

impl fmt::Debug for Feed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Feed")
            .field("interval", &self.samples.interval)
            .finish_non_exhaustive()
    }
}
