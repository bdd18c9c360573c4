//! [`Controller`]: drives a front-end's capacity from the samples it is
//! given and the counts the front-end keeps, one [`Window`] per tick.

use std::fmt;
use std::ops::Deref;
use std::time::{Duration, Instant};

use super::feed::{Feed, Samples};
use super::recorder::{Drained, Recorder, BUCKETS};
use super::{Algorithm, Outcome, Target, Window};
use crate::engine::table::MAX_CAPACITY;
use crate::error::ConfigError;
use crate::sync::{now, Arc, AtomicU64, Mutex};

/// Moves a front-end's capacity with an [`Algorithm`], from timed samples
/// and the front-end's own counts.
///
/// Built by [`Controller::builder`] over a [`Target`] (`Arc<Limiter>`,
/// [`Pool`](crate::Pool), [`Supervisor`](crate::Supervisor)). Samples come
/// from [`timed`](Self::timed) permits, the tower layer's `adaptive`
/// option, or [`record`](Self::record); each is a few relaxed atomic adds
/// on a cell the calling thread mostly owns, never a lock. A tick
/// ([`tick`](Self::tick), or the first sample after the builder's
/// [`interval`](ControllerBuilder::interval) has passed) turns what was
/// recorded since the last tick into a [`Window`], asks the algorithm for
/// a limit, clamps it between the floor and the ceiling, and applies it
/// with the target's `set_capacity` when it changed.
///
/// A controller attached to nothing costs admission nothing: the
/// front-end does not know about it. Permits that are not timed cost
/// nothing either; the counts a tick reads are the ones the admission
/// table keeps anyway.
///
/// # Ticks
///
/// A tick takes the algorithm out of its slot, so two ticks never run it
/// at once: a tick that finds it out returns `None` at once (it does not
/// wait). The algorithm runs under no lock, and `set_capacity` after it.
/// A window with fewer than the builder's
/// [`min_samples`](ControllerBuilder::min_samples) timed samples (or
/// completions, for a controller that has never been given a timed
/// sample) is not closed (its samples wait for the next tick) unless it
/// has lasted ten intervals.
///
/// # Examples
///
/// A deterministic run on a virtual clock: samples say the backend got
/// slow, and the limit comes down.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use sidejob::Limiter;
/// use sidejob::adaptive::{Aimd, Controller, Outcome};
///
/// let limiter = Arc::new(Limiter::new(40)?);
/// let aimd = Aimd::builder().latency_threshold(Duration::from_millis(20)).build()?;
/// let controller = Controller::builder().build(Arc::clone(&limiter), aimd)?;
/// let ms = Duration::from_millis;
/// // 100 ms windows with the limit full: 10 ms each while healthy...
/// let mut t = ms(0);
/// for _ in 0..5 {
///     t += ms(100);
///     let in_flight = limiter.capacity() as u64;
///     for _ in 0..in_flight * 10 {
///         controller.record_at(t, ms(10), Outcome::Success);
///     }
///     controller.tick_at(t);
/// }
/// let healthy = limiter.capacity();
/// assert!(healthy > 40);
/// // ... then 40 ms each: the limit backs off.
/// for _ in 0..20 {
///     t += ms(100);
///     let in_flight = limiter.capacity() as u64;
///     for _ in 0..in_flight * 2 {
///         controller.record_at(t, ms(40), Outcome::Success);
///     }
///     controller.tick_at(t);
/// }
/// assert!(limiter.capacity() < healthy / 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Controller {
    target: Box<dyn Target>,
    /// The sample cells and the tick clock, shared with the feeds of the
    /// front-ends this controller is attached to.
    samples: std::sync::Arc<Samples>,
    /// The algorithm and what a tick carries over; `None` while a tick
    /// runs (see "Ticks").
    state: Mutex<Option<State>>,
    /// The last closed window, for readers (`last_window`).
    last: Mutex<Option<Window>>,
    floor: usize,
    ceiling: usize,
    min_samples: u64,
}

/// What a tick carries over to the next.
struct State {
    algorithm: Box<dyn Algorithm>,
    /// When the open window began.
    since: Duration,
    /// The target's counters at that time.
    completed: u64,
    rejected: u64,
    waited: u64,
    /// Samples drained but not yet closed into a window.
    pending: Drained,
    /// Timed samples have come: windows wait for `min_samples` of them.
    timed: bool,
}

impl Controller {
    /// A builder, for the floor, the ceiling and the tick interval.
    pub fn builder() -> ControllerBuilder {
        ControllerBuilder::default()
    }

    /// Times `permit`: when the returned guard is dropped, the permit is
    /// released, then its hold time recorded as a success (or as
    /// [`Timed::set_outcome`] says).
    ///
    /// Works with any guard: a [`Permit`](crate::Permit), an
    /// [`OwnedPermit`](crate::OwnedPermit), a
    /// [`ChildGuard`](crate::ChildGuard). About one in the builder's
    /// [`sample_every`](ControllerBuilder::sample_every) is sampled: two
    /// clock reads and a few relaxed atomic adds; the others cost a
    /// thread-local countdown. Permits not wrapped cost nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::Limiter;
    /// use sidejob::adaptive::{Controller, Guarded};
    ///
    /// let limiter = Arc::new(Limiter::new(4)?);
    /// let controller = Controller::builder().build(Arc::clone(&limiter), Guarded::default())?;
    /// let permit = controller.timed(limiter.try_acquire()?);
    /// assert_eq!(limiter.usage(), 1);
    /// drop(permit);
    /// assert_eq!(limiter.usage(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn timed<P>(&self, permit: P) -> Timed<&Controller, P> {
        Timed::new(self, permit)
    }

    /// [`timed`](Self::timed), holding an `Arc` of the controller, so the
    /// guard is `'static` when the permit is (an
    /// [`OwnedPermit`](crate::OwnedPermit) moved into a task).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::Limiter;
    /// use sidejob::adaptive::{Controller, Guarded};
    ///
    /// let limiter = Arc::new(Limiter::new(4)?);
    /// let controller = Arc::new(Controller::builder().build(Arc::clone(&limiter), Guarded::default())?);
    /// let permit = Controller::timed_owned(&controller, limiter.try_acquire_owned()?);
    /// std::thread::spawn(move || drop(permit)).join().unwrap();
    /// assert_eq!(limiter.usage(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn timed_owned<P>(this: &Arc<Controller>, permit: P) -> Timed<Arc<Controller>, P> {
        Timed::new(Arc::clone(this), permit)
    }

    /// Has the target time its requests itself, where it sees each
    /// request's life: a [`Pool`](crate::Pool)'s or an `AsyncPool`'s
    /// (feature `tokio`) workers time each handler, a
    /// [`Supervisor`](crate::Supervisor)'s children their own lives, with
    /// no user code and nothing added to admission (a worker, or a child
    /// on its own thread or task, checks once per request whether a
    /// controller is attached). Returns true if the
    /// target does so from now on; false for a target that cannot (a
    /// [`Limiter`](crate::Limiter), which sees only permits: time them
    /// with [`timed`](Self::timed)) or that is attached already.
    ///
    /// The target holds the sample cells and a weak handle: the
    /// controller (and the target handle in it) is not kept alive by the
    /// target. Ticks that samples bring run on the worker that took the
    /// sample, after it has answered the request.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::{Limiter, Pool, Worker};
    /// use sidejob::adaptive::{Controller, Guarded};
    ///
    /// struct AddOne;
    /// impl Worker for AddOne {
    ///     type Request = u64;
    ///     type Reply = u64;
    ///     type Message = ();
    ///     fn handle_call(&mut self, x: u64) -> u64 {
    ///         x + 1
    ///     }
    ///     fn handle_cast(&mut self, _: ()) {}
    /// }
    ///
    /// let pool = Pool::builder().workers(2).capacity(8).build(|_| AddOne)?;
    /// let controller = Arc::new(Controller::builder().build(pool.clone(), Guarded::default())?);
    /// assert!(Controller::attach(&controller));
    /// assert!(!Controller::attach(&controller), "once");
    /// assert_eq!(pool.call(1)?, 2); // timed by its worker
    ///
    /// let limiter = Arc::new(Limiter::new(4)?);
    /// let controller = Arc::new(Controller::builder().build(limiter, Guarded::default())?);
    /// assert!(!Controller::attach(&controller), "a limiter does not see its requests' lives");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn attach(this: &std::sync::Arc<Controller>) -> bool {
        let feed = Feed::new(
            std::sync::Arc::clone(&this.samples),
            std::sync::Arc::downgrade(this),
        );
        this.target.attach(feed)
    }

    /// True if the request about to start is one to time: about one in
    /// the builder's [`sample_every`](ControllerBuilder::sample_every),
    /// drawn on the calling thread. For requests you time yourself and
    /// [`record`](Self::record): ask before reading the clock, and time
    /// only those it says (what [`timed`](Self::timed) does).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::{Duration, Instant};
    /// use sidejob::Limiter;
    /// use sidejob::adaptive::{Controller, Guarded, Outcome};
    ///
    /// let limiter = Arc::new(Limiter::new(8)?);
    /// let controller = Controller::builder()
    ///     .sample_every(4)
    ///     .min_samples(1)
    ///     .build(Arc::clone(&limiter), Guarded::default())?;
    /// let mut timed = 0;
    /// for _ in 0..400 {
    ///     let started = controller.should_time().then(Instant::now);
    ///     // ... the request ...
    ///     if let Some(started) = started {
    ///         controller.record(started.elapsed(), Outcome::Success);
    ///         timed += 1;
    ///     }
    /// }
    /// assert!((50..200).contains(&timed), "about one in 4: {timed}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn should_time(&self) -> bool {
        self.samples.sample()
    }

    /// Records one request that took `latency`, on the real clock; ticks
    /// if the interval has passed.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use sidejob::Limiter;
    /// use sidejob::adaptive::{Controller, Guarded, Outcome};
    ///
    /// let limiter = Arc::new(Limiter::new(4)?);
    /// let controller = Controller::builder().build(Arc::clone(&limiter), Guarded::default())?;
    /// controller.record(Duration::from_millis(3), Outcome::Success);
    /// controller.record(Duration::from_secs(1), Outcome::Dropped);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn record(&self, latency: Duration, outcome: Outcome) {
        self.record_at(self.samples.epoch.elapsed(), latency, outcome);
    }

    /// [`record`](Self::record) at `now` on a virtual clock (time since
    /// the controller was built, for a simulation or a test): ticks at
    /// `now` if the interval has passed since the last tick.
    ///
    /// Use one clock per controller: real ([`record`](Self::record),
    /// [`tick`](Self::tick), [`timed`](Self::timed)) or virtual.
    pub fn record_at(&self, now: Duration, latency: Duration, outcome: Outcome) {
        if self.samples.record(now, latency, outcome) {
            self.tick_at(now);
        }
    }

    /// Closes the window now (real clock): asks the algorithm for a limit
    /// and applies it. Returns the window, or `None` if another tick is
    /// running or the window has too few samples yet.
    ///
    /// Call it from a timer of yours when samples alone may not tick often
    /// enough (few timed requests, or none: the counts still give
    /// throughput and Little's-law latency).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::Limiter;
    /// use sidejob::adaptive::{Controller, Guarded};
    ///
    /// let limiter = Arc::new(Limiter::new(4)?);
    /// let controller = Controller::builder().min_samples(0).build(Arc::clone(&limiter), Guarded::default())?;
    /// let window = controller.tick().expect("no other tick is running");
    /// assert_eq!(window.limit(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tick(&self) -> Option<Window> {
        self.tick_at(self.samples.epoch.elapsed())
    }

    /// [`tick`](Self::tick) at `now` on a virtual clock (see
    /// [`record_at`](Self::record_at)).
    pub fn tick_at(&self, now: Duration) -> Option<Window> {
        // Take the state out under the lock, and let go: the algorithm and
        // `set_capacity` run under no lock (the algorithm may be a user's).
        // `Slot` puts the state back on every path, a panic included.
        let state = self.state.try_lock()?.take()?;
        let mut slot = Slot {
            controller: self,
            state: Some(state),
        };
        let window = self.close_window(slot.state.as_mut()?, now)?;
        let wanted = slot.state.as_mut()?.algorithm.update(&window);
        drop(slot);
        let limit = wanted.clamp(self.floor, self.ceiling);
        if limit != self.target.capacity() {
            // The ceiling was checked against the target's maximum when
            // built, so the target takes any limit within the bounds; an
            // error (a target of yours that refuses one anyway) leaves the
            // limit where it was, and the next tick tries again.
            let _ = self.target.set_capacity(limit);
        }
        *self.last.lock() = Some(window.clone());
        Some(window)
    }

    /// Spawns a [`Ticker`](super::Ticker): a thread that ticks this
    /// controller every [`interval`](ControllerBuilder::interval) until
    /// the returned handle is dropped (or the controller is). For a
    /// controller fed by counts alone, which no sample ticks.
    ///
    /// # Errors
    ///
    /// The OS's error if it refuses the thread.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::Limiter;
    /// use sidejob::adaptive::{Controller, Guarded};
    ///
    /// let limiter = Arc::new(Limiter::new(16)?);
    /// let controller = Arc::new(Controller::builder().build(limiter, Guarded::default())?);
    /// let ticker = Controller::spawn_ticker(&controller)?;
    /// drop(ticker);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(not(loom))]
    pub fn spawn_ticker(this: &std::sync::Arc<Controller>) -> std::io::Result<super::Ticker> {
        super::Ticker::spawn(this)
    }

    /// How long a window lasts before a sample (or a ticker) closes it.
    pub fn interval(&self) -> Duration {
        self.samples.interval
    }

    /// The window the last tick closed, if any: its latencies (the p99 for
    /// a claim size, say) and counts.
    pub fn last_window(&self) -> Option<Window> {
        self.last.lock().clone()
    }

    /// The limit in force: the target's capacity.
    pub fn limit(&self) -> usize {
        self.target.capacity()
    }

    /// The lowest limit it applies.
    pub fn floor(&self) -> usize {
        self.floor
    }

    /// The highest limit it applies.
    pub fn ceiling(&self) -> usize {
        self.ceiling
    }

    /// Drains the samples and reads the counts; the window, if it may be
    /// closed at `now` (the state then starts the next one).
    fn close_window(&self, state: &mut State, now: Duration) -> Option<Window> {
        state.pending.merge(&self.samples.recorder.drain());
        let stats = self.target.stats();
        let completed = stats
            .completed
            .saturating_add(stats.panicked)
            .saturating_sub(state.completed);
        let elapsed = now.saturating_sub(state.since);
        // Once the controller has been given timed samples, a window is
        // read from them: it waits for `min_samples` of them, not of
        // completions. (With one request in n timed, a window closed on
        // completions would hold a handful of latencies, and the least of
        // many such noisy means reads low: the no-load estimate would sink
        // and the limit with it.) Until then, on completions: counts only.
        state.timed |= state.pending.samples.saturating_add(state.pending.dropped) > 0;
        let seen = if state.timed {
            state.pending.samples.saturating_add(state.pending.dropped)
        } else {
            completed
        };
        // A window in which the limit refused or queued requests may close
        // on fewer samples, if the algorithm says so
        // (`Algorithm::binding_min_samples`; never more than otherwise).
        let binding = stats.rejected > state.rejected || stats.waited > state.waited;
        let least = if binding {
            state
                .algorithm
                .binding_min_samples(self.min_samples)
                .min(self.min_samples)
        } else {
            self.min_samples
        };
        // Saturating: an interval of `Duration::MAX` is a user's to give.
        let enough = seen >= least || elapsed >= self.samples.interval.saturating_mul(10);
        if elapsed.is_zero() || !enough {
            return None;
        }
        let pending = std::mem::replace(&mut state.pending, Drained::empty());
        let window = Window {
            now,
            elapsed,
            limit: stats.capacity,
            floor: self.floor,
            ceiling: self.ceiling,
            samples: pending.samples,
            dropped: pending.dropped,
            mean_latency: pending.mean(),
            min_latency: pending.min(),
            p99_latency: pending.quantile(0.99),
            completed,
            rejected: stats.rejected.saturating_sub(state.rejected),
            waited: stats.waited.saturating_sub(state.waited),
            in_flight: stats.usage,
        };
        state.since = now;
        state.completed = stats.completed.saturating_add(stats.panicked);
        state.rejected = stats.rejected;
        state.waited = stats.waited;
        self.samples.store_tick(now);
        Some(window)
    }
}

/// Puts the state back in the controller's slot when dropped, on every
/// path: a panicking algorithm loses nothing but its own window.
struct Slot<'a> {
    controller: &'a Controller,
    state: Option<State>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.controller.state.lock() = self.state.take();
    }
}

impl fmt::Debug for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("limit", &self.limit())
            .field("floor", &self.floor)
            .field("ceiling", &self.ceiling)
            .field("interval", &self.samples.interval)
            .finish_non_exhaustive()
    }
}

impl Drained {
    pub(crate) fn empty() -> Self {
        Drained {
            samples: 0,
            dropped: 0,
            sum_nanos: 0,
            min_nanos: u64::MAX,
            buckets: [0; BUCKETS],
        }
    }

    fn merge(&mut self, other: &Drained) {
        self.samples += other.samples;
        self.dropped += other.dropped;
        self.sum_nanos = self.sum_nanos.saturating_add(other.sum_nanos);
        self.min_nanos = self.min_nanos.min(other.min_nanos);
        for (sum, count) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *sum += count;
        }
    }
}

/// Configures a [`Controller`]; made by [`Controller::builder`].
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use sidejob::Limiter;
/// use sidejob::adaptive::{Controller, Guarded};
///
/// let limiter = Arc::new(Limiter::new(500)?);
/// let controller = Controller::builder()
///     .floor(8)
///     .ceiling(200)
///     .interval(Duration::from_millis(100))
///     .build(Arc::clone(&limiter), Guarded::default())?;
/// // The limit starts within the bounds.
/// assert_eq!(limiter.capacity(), 200);
///
/// let err = Controller::builder().floor(10).ceiling(5).build(limiter, Guarded::default()).unwrap_err();
/// assert_eq!(err.field(), "ceiling");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct ControllerBuilder {
    floor: Option<usize>,
    ceiling: Option<usize>,
    interval: Option<Duration>,
    min_samples: Option<u64>,
    sample_every: Option<u32>,
}

impl ControllerBuilder {
    /// The default tick interval.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(50);
    /// The default ceiling, unless the target starts above it.
    pub const DEFAULT_CEILING: usize = 1_000;
    /// The default least number of completions in a window.
    pub const DEFAULT_MIN_SAMPLES: u64 = 16;
    /// The default sampling: one timed request in 16 reads the clock
    /// (chosen by measurement, see `PERFORMANCE.md`: `Guarded` pools
    /// its no-load samples, so 1 in 16 converges about as 1 in 8 does,
    /// at half the clock reads).
    pub const DEFAULT_SAMPLE_EVERY: u32 = 16;

    /// The lowest limit applied, at least 1. Defaults to 1.
    pub fn floor(&mut self, floor: usize) -> &mut Self {
        self.floor = Some(floor);
        self
    }

    /// The highest limit applied, at least the floor, at most the
    /// target's [`max_capacity`](super::Target::max_capacity). Defaults to
    /// [`DEFAULT_CEILING`](Self::DEFAULT_CEILING), or the target's
    /// capacity when built if that is larger, but never above the
    /// target's maximum (a [`Supervisor`](crate::Supervisor)'s is its
    /// capacity unless its builder raised it).
    pub fn ceiling(&mut self, ceiling: usize) -> &mut Self {
        self.ceiling = Some(ceiling);
        self
    }

    /// How long a window lasts before a sample closes it. Defaults to
    /// [`DEFAULT_INTERVAL`](Self::DEFAULT_INTERVAL) (50 ms). Must not be
    /// zero.
    pub fn interval(&mut self, interval: Duration) -> &mut Self {
        self.interval = Some(interval);
        self
    }

    /// How many timed samples (drops included) a window needs before it
    /// is closed, unless it has lasted ten intervals; completions instead,
    /// until the controller is given its first timed sample (a
    /// counts-only controller). Defaults to
    /// [`DEFAULT_MIN_SAMPLES`](Self::DEFAULT_MIN_SAMPLES).
    pub fn min_samples(&mut self, samples: u64) -> &mut Self {
        self.min_samples = Some(samples);
        self
    }

    /// Times about one request in `every`: a [`Timed`] permit (or a pool
    /// handler, with [`Controller::attach`]) that is not sampled reads no
    /// clock and records nothing, and costs a thread-local countdown. 1
    /// times every request. Defaults to
    /// [`DEFAULT_SAMPLE_EVERY`](Self::DEFAULT_SAMPLE_EVERY); not 0.
    ///
    /// The counts a window reads (completed, refused, in flight) are
    /// every request's whatever this says: only latencies are sampled.
    /// Which requests are sampled is random (random gaps on each thread),
    /// not every n-th, so a periodic pattern in the traffic is not
    /// aliased.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use sidejob::Limiter;
    /// use sidejob::adaptive::{Controller, Guarded};
    ///
    /// let limiter = Arc::new(Limiter::new(8)?);
    /// let every = Controller::builder()
    ///     .sample_every(1)
    ///     .min_samples(1)
    ///     .build(Arc::clone(&limiter), Guarded::default())?;
    /// for _ in 0..10 {
    ///     drop(every.timed(limiter.try_acquire()?));
    /// }
    /// assert_eq!(every.tick_at(Duration::from_secs(1)).unwrap().samples(), 10);
    ///
    /// let err = Controller::builder().sample_every(0).build(limiter, Guarded::default()).unwrap_err();
    /// assert_eq!(err.field(), "sample_every");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sample_every(&mut self, every: u32) -> &mut Self {
        self.sample_every = Some(every);
        self
    }

    /// Builds the controller over `target`, driven by `algorithm`. The
    /// target's capacity is moved into the bounds at once if it is
    /// outside them.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the field when `floor` is 0 or above the
    /// target's [`max_capacity`](super::Target::max_capacity), `ceiling`
    /// is below the floor or above the target's maximum, `interval` is
    /// zero or `sample_every` is 0; naming `capacity` if the target refuses the bounded capacity.
    pub fn build<T: Target, A: Algorithm>(
        &self,
        target: T,
        algorithm: A,
    ) -> Result<Controller, ConfigError> {
        let floor = self.floor.unwrap_or(1);
        if floor == 0 {
            return Err(ConfigError::zero("floor"));
        }
        let capacity = target.capacity();
        // What the target takes at most: a ceiling above it would be a
        // limit every tick asks for and the target refuses (a supervisor
        // left at its default maximum would never grow).
        let max = target.max_capacity().min(MAX_CAPACITY);
        if floor > max {
            return Err(ConfigError::too_large("floor", max));
        }
        let ceiling = self
            .ceiling
            .unwrap_or(Self::DEFAULT_CEILING.max(capacity).max(floor).min(max));
        if ceiling < floor {
            return Err(ConfigError::out_of_range("ceiling", "at least the floor"));
        }
        if ceiling > max {
            return Err(ConfigError::too_large("ceiling", max));
        }
        let interval = self.interval.unwrap_or(Self::DEFAULT_INTERVAL);
        if interval.is_zero() {
            return Err(ConfigError::zero_duration("interval"));
        }
        let every = self.sample_every.unwrap_or(Self::DEFAULT_SAMPLE_EVERY);
        if every == 0 {
            return Err(ConfigError::zero("sample_every"));
        }
        let start = capacity.clamp(floor, ceiling);
        if start != capacity {
            target.set_capacity(start)?;
        }
        let stats = target.stats();
        Ok(Controller {
            samples: std::sync::Arc::new(Samples {
                recorder: Recorder::new(num_cpus::get()),
                interval,
                every,
                epoch: now(),
                last_tick: AtomicU64::new(0),
            }),
            state: Mutex::new(Some(State {
                algorithm: Box::new(algorithm),
                since: Duration::ZERO,
                completed: stats.completed.saturating_add(stats.panicked),
                rejected: stats.rejected,
                waited: stats.waited,
                pending: Drained::empty(),
                timed: false,
            })),
            last: Mutex::new(None),
            target: Box::new(target),
            floor,
            ceiling,
            min_samples: self.min_samples.unwrap_or(Self::DEFAULT_MIN_SAMPLES),
        })
    }
}

/// A guard whose hold time a [`Controller`] records when it is dropped;
/// made by [`Controller::timed`] and [`Controller::timed_owned`].
///
/// The inner guard (a permit) is dropped first, then the time recorded,
/// so the unit is back before the sample can close a window. A permit
/// that is not one of the sampled ones costs its own drop and one branch.
#[must_use = "the time is recorded, and the permit released, when it is dropped"]
pub struct Timed<C: Deref<Target = Controller>, P> {
    // The fields drop in this order, with no `Drop` of `Timed` itself:
    // the permit (its own release, inlined as it is without a
    // controller), then the sample (the clock and the record, if any).
    permit: P,
    sample: Sample<C>,
}

/// The recording half of a [`Timed`], dropped after its permit: `None`
/// for a permit that is not one of the sampled ones (one word to write,
/// the niche of the start time).
struct Sample<C: Deref<Target = Controller>>(Option<Sampled<C>>);

/// A sampled permit's controller, start and outcome.
struct Sampled<C: Deref<Target = Controller>> {
    controller: C,
    start: Instant,
    outcome: Outcome,
}

impl<C: Deref<Target = Controller>, P> Timed<C, P> {
    #[inline]
    fn new(controller: C, permit: P) -> Self {
        let sample = if controller.samples.sample() {
            Some(Sampled {
                start: now(),
                controller,
                outcome: Outcome::Success,
            })
        } else {
            None
        };
        Timed {
            permit,
            sample: Sample(sample),
        }
    }

    /// How the request ended, if not a success: [`Outcome::Dropped`] for a
    /// timeout or an overload answer from the backend, [`Outcome::Ignore`]
    /// to record nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use sidejob::Limiter;
    /// use sidejob::adaptive::{Controller, Guarded, Outcome};
    ///
    /// let limiter = Arc::new(Limiter::new(4)?);
    /// let controller = Controller::builder()
    ///     .min_samples(1)
    ///     .sample_every(1) // time every permit
    ///     .build(Arc::clone(&limiter), Guarded::default())?;
    /// let mut permit = controller.timed(limiter.try_acquire()?);
    /// permit.set_outcome(Outcome::Dropped); // the backend timed out
    /// drop(permit);
    /// let window = controller.tick_at(Duration::from_secs(1)).unwrap();
    /// assert_eq!((window.samples(), window.dropped()), (0, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_outcome(&mut self, outcome: Outcome) {
        // Not sampled: there is nothing to record, the outcome included.
        if let Some(sampled) = &mut self.sample.0 {
            sampled.outcome = outcome;
        }
    }

    /// The guard inside.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::Limiter;
    /// use sidejob::adaptive::{Controller, Guarded};
    ///
    /// let limiter = Arc::new(Limiter::new(4)?);
    /// let controller = Controller::builder().build(Arc::clone(&limiter), Guarded::default())?;
    /// let permit = controller.timed(limiter.try_acquire()?);
    /// assert!(permit.get_ref().shard() < limiter.shards());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get_ref(&self) -> &P {
        &self.permit
    }
}

impl<C: Deref<Target = Controller>> Drop for Sample<C> {
    #[inline(always)]
    fn drop(&mut self) {
        // Not sampled: no clock, nothing recorded.
        if let Some(sampled) = &self.0 {
            sampled.finish();
        }
    }
}

impl<C: Deref<Target = Controller>> Sampled<C> {
    /// A sampled permit's end (its unit already back): the clock and the
    /// sample.
    #[cold]
    #[inline(never)]
    fn finish(&self) {
        let end = now();
        let controller = &*self.controller;
        controller.record_at(
            end.saturating_duration_since(controller.samples.epoch),
            end.saturating_duration_since(self.start),
            self.outcome,
        );
    }
}

impl<C: Deref<Target = Controller>, P> fmt::Debug for Timed<C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sampled = self.sample.0.as_ref();
        f.debug_struct("Timed")
            .field("start", &sampled.map(|sampled| sampled.start))
            .field("outcome", &sampled.map(|sampled| sampled.outcome))
            .finish_non_exhaustive()
    }
}
