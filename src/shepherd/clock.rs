//! The shepherd's clock: the monotonic clock, or a [`ManualClock`] a test
//! moves by hand, so delays, backoff, timeouts and the retry budget are
//! checked exactly instead of by sleeping.

use std::fmt;
use std::time::{Duration, Instant};

use crate::sync::{now, Arc, CoarseClock, Mutex, Weak};

/// A clock that stands still until it is told to move: give it to
/// [`ShepherdBuilder::clock`](crate::shepherd::ShepherdBuilder::clock) and the
/// shepherd's delays, backoffs, attempt timeouts and retry budget follow it
/// instead of real time.
///
/// Tests use it to check timing without sleeping: a retry due in 80 ms
/// runs as soon as the test [`advance`](Self::advance)s the clock by 80 ms,
/// and not before, however long the test takes. It is a handle: clones
/// share one time.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sidejob::shepherd::{Handler, ManualClock, Shepherd};
///
/// struct Echo;
/// impl Handler for Echo {
///     type Op = u8; type Output = u8; type Error = ();
///     fn handle(&mut self, n: &u8, _: u32) -> Result<u8, ()> { Ok(*n) }
/// }
///
/// let clock = ManualClock::new();
/// let shepherd = Shepherd::builder().capacity(4).clock(clock.clone()).build(|_| Echo)?;
/// let done = shepherd.submit_after(7, Duration::from_secs(60))?;
/// let done = done.wait_timeout(Duration::from_millis(10)).unwrap_err(); // not yet
/// clock.advance(Duration::from_secs(60));
/// assert_eq!(done.wait(), Ok(7));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct ManualClock {
    inner: Arc<Manual>,
}

struct Manual {
    now: Mutex<Instant>,
    /// Called after every move: each shepherd on this clock wakes its
    /// timer. Weak, so a clock never keeps a shepherd alive.
    listeners: Mutex<Vec<Weak<dyn Fn() + Send + Sync>>>,
}

impl ManualClock {
    /// A clock reading the real time now, until moved.
    pub fn new() -> Self {
        ManualClock {
            inner: Arc::new(Manual {
                now: Mutex::new(now()),
                listeners: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The time it reads.
    pub fn now(&self) -> Instant {
        *self.inner.now.lock()
    }

    /// Moves the clock forward by `by`, and wakes every shepherd on it to
    /// act on what became due or timed out. (A move past what an `Instant`
    /// can hold is ignored.)
    pub fn advance(&self, by: Duration) {
        {
            let mut time = self.inner.now.lock();
            if let Some(later) = time.checked_add(by) {
                *time = later;
            }
        }
        let listeners: Vec<_> = {
            let mut listeners = self.inner.listeners.lock();
            listeners.retain(|listener| listener.strong_count() > 0);
            listeners.iter().filter_map(Weak::upgrade).collect()
        };
        for listener in listeners {
            listener();
        }
    }

    pub(crate) fn listen(&self, listener: &Arc<dyn Fn() + Send + Sync>) {
        self.inner.listeners.lock().push(Arc::downgrade(listener));
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now", &self.now())
            .finish()
    }
}

/// The clock a shepherd reads.
#[derive(Debug, Clone, Default)]
pub(crate) enum Clock {
    /// The monotonic clock (`crate::sync::now`).
    #[default]
    System,
    Manual(ManualClock),
}

/// Time stamps for the turnaround and processing figures: the scheduler
/// tick's clock on the
/// system clock (a few nanoseconds a reading where `Instant::now` costs
/// 20 to 60 on a VM, and the submit path is what the shepherd's throughput
/// is made of), the manual clock's time on a manual clock.
///
/// A coarse reading is up to a tick (1–4 ms) early, but both ends of a
/// span are read the same way, so the error of a difference is zero
/// on average: an operation much shorter than a tick reads 0 or one tick,
/// one tick with the probability its length is of a tick. The *sum* over
/// many operations is therefore right; one operation's is not.
///
/// A stamp is nanoseconds since the stamps were made (a `u64`, not an
/// `Instant`): a record carries one, and a span is one subtraction, where
/// `Instant` arithmetic goes through `timespec` on every operation.
#[derive(Debug, Clone)]
pub(crate) enum Stamps {
    Coarse(CoarseClock),
    Manual { clock: ManualClock, base: Instant },
}

impl Stamps {
    pub(crate) fn new(clock: &Clock) -> Self {
        match clock {
            Clock::System => Stamps::Coarse(CoarseClock::new()),
            Clock::Manual(clock) => Stamps::Manual {
                base: clock.now(),
                clock: clock.clone(),
            },
        }
    }

    /// The time now, as a stamp.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        match self {
            Stamps::Coarse(clock) => clock.ticks(),
            Stamps::Manual { clock, base } => {
                let since = clock.now().saturating_duration_since(*base);
                u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
            }
        }
    }

    /// The clock time `stamp` stands for (the retry budget keeps
    /// `Instant`s).
    pub(crate) fn instant(&self, stamp: u64) -> Instant {
        match self {
            Stamps::Coarse(clock) => clock.at(stamp),
            Stamps::Manual { base, .. } => base
                .checked_add(Duration::from_nanos(stamp))
                .unwrap_or(*base),
        }
    }
}

impl Clock {
    pub(crate) fn now(&self) -> Instant {
        match self {
            Clock::System => now(),
            Clock::Manual(clock) => clock.now(),
        }
    }

    /// The real instant to sleep until for clock time `at`: itself on the
    /// system clock; none on a manual clock, which wakes its sleepers when
    /// it moves.
    pub(crate) fn wake_at(&self, at: Instant) -> Option<Instant> {
        match self {
            Clock::System => Some(at),
            Clock::Manual(_) => None,
        }
    }
}
