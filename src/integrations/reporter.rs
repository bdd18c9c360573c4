//! [`Reporter`]: reads front-ends' [`Stats`] (and a shepherd's
//! [`ShepherdStats`](crate::shepherd::ShepherdStats)) on a tick, exports them as metrics (feature
//! `metrics`) and feeds their health [`Alarm`]s, off the admission path.
//!
//! A reporter holds its front-ends weakly: it never keeps a limiter, pool,
//! supervisor or shepherd alive. One reporter serves any number of them
//! ([`Reporter::merge`]). Tick it yourself ([`Reporter::tick`], from any
//! runtime's timer) or let it run on a thread of its own
//! ([`Reporter::spawn`]), which you stop with [`ReporterHandle::stop`] (or
//! leave running with [`ReporterHandle::detach`]); the thread reports one
//! last time before it exits, so the final figures are never lost.

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::{ConfigError, Error};
use crate::integrations::health::{Alarm, Watched};
use crate::limiter::Limiter;
use crate::pool::worker::Worker;
use crate::pool::Pool;
use crate::shepherd::{Handler, Shepherd};
use crate::stats::Stats;
use crate::supervisor::Supervisor;
use crate::sync::{now, os_thread, Arc, Condvar, Mutex, Weak};

/// How often a reporter ticks unless told otherwise: every second.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

mod sealed {
    use crate::shepherd::ShepherdStats;
    use crate::stats::Stats;
    use crate::sync::Arc;

    /// One reading of a front-end: its admission stats, and a shepherd's
    /// own figures.
    pub struct Reading {
        pub(crate) stats: Stats,
        pub(crate) shepherd: Option<ShepherdStats>,
    }

    impl Reading {
        pub(crate) fn plain(stats: Stats) -> Self {
            Reading {
                stats,
                shepherd: None,
            }
        }
    }

    /// How a reporter reads a front-end: its kind, its name, which one it
    /// is, and a weak read of its figures (`None` once it is gone).
    pub struct Source {
        pub(crate) kind: &'static str,
        pub(crate) name: String,
        /// True when the front-end was built without a name (its name is
        /// the default); one named `sidejob` explicitly is named.
        #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
        pub(crate) unnamed: bool,
        /// Which front-end it is: an address that it alone owns while it
        /// is alive (the `Arc` of a limiter, the allocation holding the
        /// name of the others: every front-end owns its name; clones of a
        /// handle share it, as they share the front-end). Read by the
        /// metrics claim to tell a front-end from another of its name.
        #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
        pub(crate) id: usize,
        pub(crate) read: Arc<dyn Fn() -> Option<Reading> + Send + Sync>,
    }

    impl std::fmt::Debug for Source {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Source")
                .field("kind", &self.kind)
                .field("name", &self.name)
                .field("unnamed", &self.unnamed)
                .finish_non_exhaustive()
        }
    }

    pub trait Sealed {
        fn source(&self) -> Source;
    }
}

use sealed::{Reading, Source};

/// A front-end a [`Reporter`] can watch: `Arc<Limiter>`, [`Pool`],
/// `AsyncPool` (feature `tokio`), [`Supervisor`] or [`Shepherd`]. Sealed.
pub trait Observe: sealed::Sealed {}

impl sealed::Sealed for Arc<Limiter> {
    fn source(&self) -> Source {
        let weak: Weak<Limiter> = Arc::downgrade(self);
        Source {
            kind: "limiter",
            name: self.name().to_string(),
            unnamed: !self.is_named(),
            id: Arc::as_ptr(self) as usize,
            read: Arc::new(move || {
                weak.upgrade()
                    .map(|limiter| Reading::plain(limiter.stats()))
            }),
        }
    }
}
impl Observe for Arc<Limiter> {}

impl<W: Worker> sealed::Sealed for Pool<W> {
    fn source(&self) -> Source {
        let read = self.weak_stats();
        Source {
            kind: "pool",
            name: self.name().to_string(),
            unnamed: !self.is_named(),
            id: self.name().as_ptr() as usize,
            read: Arc::new(move || read().map(Reading::plain)),
        }
    }
}
impl<W: Worker> Observe for Pool<W> {}

#[cfg(feature = "tokio")]
impl<W: crate::pool::asynchronous::worker::AsyncWorker> sealed::Sealed
    for crate::pool::asynchronous::AsyncPool<W>
{
    fn source(&self) -> Source {
        let read = self.weak_stats();
        Source {
            kind: "async_pool",
            name: self.name().to_string(),
            unnamed: !self.is_named(),
            id: self.name().as_ptr() as usize,
            read: Arc::new(move || read().map(Reading::plain)),
        }
    }
}
#[cfg(feature = "tokio")]
impl<W: crate::pool::asynchronous::worker::AsyncWorker> Observe
    for crate::pool::asynchronous::AsyncPool<W>
{
}

impl sealed::Sealed for Supervisor {
    fn source(&self) -> Source {
        let read = self.weak_stats();
        Source {
            kind: "supervisor",
            name: self.name().to_string(),
            unnamed: !self.is_named(),
            id: self.name().as_ptr() as usize,
            read: Arc::new(move || read().map(Reading::plain)),
        }
    }
}
impl Observe for Supervisor {}

impl<H: Handler> sealed::Sealed for Shepherd<H> {
    fn source(&self) -> Source {
        let read = self.weak_stats();
        Source {
            kind: "shepherd",
            name: self.name().to_string(),
            unnamed: !self.is_named(),
            id: self.name().as_ptr() as usize,
            read: Arc::new(move || {
                read().map(|shepherd| Reading {
                    stats: shepherd.admission.clone(),
                    shepherd: Some(shepherd),
                })
            }),
        }
    }
}
impl<H: Handler> Observe for Shepherd<H> {}

/// Reads front-ends' [`Stats`] every tick, exports them through the
/// `metrics` facade (feature `metrics`) and feeds their [`Alarm`]s.
///
/// Nothing is added to the admission path: a front-end already counts
/// everything, per shard, and the reporter only reads those counts. A
/// reporter is built for one front-end ([`ReporterBuilder::build`]); one
/// reporter serves many, each with its own name and alarms, when they are
/// [merged](Self::merge) into it, so one thread (or one task) reports on
/// a whole service.
///
/// With the `metrics` feature, each tick exports these series, labelled
/// `name` (the builder's name, else the front-end's) and `kind`
/// (`limiter`, `pool`, `async_pool`, `supervisor`, `shepherd`). Counters
/// rise by what the front-end counted since the last tick, and a
/// `(name, kind)` belongs to one live front-end at a time: see
/// `sidejob::metrics` for what that means across rebuilds, and for
/// unnamed front-ends.
///
/// | series | type | from |
/// |---|---|---|
/// | `sidejob_capacity` | gauge | [`Stats::capacity`] |
/// | `sidejob_in_flight` | gauge | [`Stats::usage`] |
/// | `sidejob_accepted_total` | counter | [`Stats::accepted`] |
/// | `sidejob_rejected_total` | counter | [`Stats::rejected`] |
/// | `sidejob_completed_total` | counter | [`Stats::completed`] |
/// | `sidejob_panicked_total` | counter | [`Stats::panicked`] |
/// | `sidejob_waiting` | gauge | [`Stats::waiting`] |
/// | `sidejob_waited_total` | counter | [`Stats::waited`] |
/// | `sidejob_timed_out_total` | counter | [`Stats::timed_out`] |
/// | `sidejob_waited_seconds` | gauge (only grows) | [`Stats::waited_time`], in seconds |
/// | `sidejob_alarm` (+ label `alarm`) | gauge | 1 while an alarm is raised |
///
/// and for a [`Shepherd`], its own figures ([`ShepherdStats`](crate::shepherd::ShepherdStats)) as well:
///
/// | series | type | from |
/// |---|---|---|
/// | `sidejob_shepherd_due` | gauge | [`ShepherdStats::due`](crate::shepherd::ShepherdStats::due) |
/// | `sidejob_shepherd_delayed` | gauge | [`ShepherdStats::delayed`](crate::shepherd::ShepherdStats::delayed) |
/// | `sidejob_shepherd_running` | gauge | [`ShepherdStats::running`](crate::shepherd::ShepherdStats::running) |
/// | `sidejob_shepherd_busy_workers` | gauge | [`ShepherdStats::busy`](crate::shepherd::ShepherdStats::busy) |
/// | `sidejob_shepherd_idle_workers` | gauge | [`ShepherdStats::idle`](crate::shepherd::ShepherdStats::idle) |
/// | `sidejob_shepherd_attempts_total` | counter | [`ShepherdStats::attempts`](crate::shepherd::ShepherdStats::attempts) |
/// | `sidejob_shepherd_retries_total` | counter | [`ShepherdStats::retries`](crate::shepherd::ShepherdStats::retries) |
/// | `sidejob_shepherd_failures_total` | counter | [`ShepherdStats::failed`](crate::shepherd::ShepherdStats::failed) (final failures) |
/// | `sidejob_shepherd_processed_total` | counter | [`ShepherdStats::processed`](crate::shepherd::ShepherdStats::processed) |
/// | `sidejob_shepherd_processing_seconds` | gauge (only grows) | [`ShepherdStats::processing_time`](crate::shepherd::ShepherdStats::processing_time), in seconds |
///
/// The handles are registered when the reporter is built, with the
/// recorder installed then: install your exporter first. (The seconds are
/// gauges because the `metrics` facade's counters hold whole numbers;
/// `rate()` reads them as the counters they are. The histogram
/// `sidejob_hold_seconds` comes from the tower layer's `record_time`,
/// which can afford a clock read per request.)
///
/// The reporter holds its front-ends weakly: once a front-end is gone it
/// is read no more and its series are given up; once every one is gone, a
/// spawned reporter's thread ends.
///
/// # Examples
///
/// Tick by hand (from your own timer, or a test):
///
/// ```
/// use std::sync::Arc;
/// use std::time::Instant;
/// use sidejob::Limiter;
/// use sidejob::observe::Reporter;
///
/// let limiter = Arc::new(Limiter::builder().name("api").capacity(4).build()?);
/// let mut reporter = Reporter::builder().build(&limiter)?;
/// assert_eq!((reporter.name(), reporter.kind()), ("api", "limiter"));
/// let _permit = limiter.try_acquire()?;
/// let stats = reporter.tick(Instant::now()).expect("the limiter is alive");
/// assert_eq!(stats.usage, 1);
///
/// drop(_permit);
/// drop(limiter);
/// assert!(reporter.tick(Instant::now()).is_none()); // held weakly
/// assert!(reporter.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// On a thread of its own, stopped with a last report:
///
/// ```
/// use std::time::Duration;
/// use sidejob::Supervisor;
/// use sidejob::observe::Reporter;
///
/// let sup = Supervisor::new(8)?;
/// let handle = Reporter::builder()
///     .interval(Duration::from_secs(1))
///     .build(&sup)?
///     .spawn()?;
/// let child = sup.spawn(|| 6 * 7)?;
/// assert_eq!(child.join().unwrap(), 42);
/// let last = handle.stop().expect("the supervisor is alive");
/// assert_eq!((last.accepted, last.completed), (1, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// On a tokio task instead of a thread, for any number of front-ends:
///
/// ```
/// use std::sync::Arc;
/// use std::time::{Duration, Instant};
/// use sidejob::{Limiter, Supervisor};
/// use sidejob::observe::Reporter;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let api = Arc::new(Limiter::builder().name("api").capacity(64).build()?);
/// let jobs = Supervisor::builder().name("jobs").capacity(8).build()?;
/// let mut reporter = Reporter::builder()
///     .build(&api)?
///     .merge(Reporter::builder().build(&jobs)?);
/// let task = tokio::spawn(async move {
///     let mut every = tokio::time::interval(Duration::from_millis(10));
///     while !reporter.is_empty() {
///         every.tick().await;
///         reporter.tick(Instant::now());
///     }
/// });
/// drop((api, jobs));
/// task.await?; // ends once both front-ends are gone
/// # Ok(())
/// # }
/// ```
#[must_use = "a reporter reads nothing until it is ticked or spawned"]
pub struct Reporter {
    interval: Duration,
    /// In the order they were merged; never empty.
    watches: Vec<Watch>,
}

/// One front-end of a reporter: how to read it, its series, its alarms.
struct Watch {
    source: Source,
    /// The `name` label of its series.
    name: String,
    /// False once the front-end is gone: it is read no more.
    alive: bool,
    #[cfg(feature = "metrics")]
    series: Option<super::metrics::Series>,
    alarms: Vec<WatchedAlarm>,
}

/// An alarm and, with the `metrics` feature, the gauge it shows on.
struct WatchedAlarm {
    alarm: Alarm,
    #[cfg(feature = "metrics")]
    gauge: Option<::metrics::Gauge>,
}

impl Watch {
    /// Reads the front-end once, exports the reading and feeds the alarms;
    /// `None` once it is gone.
    fn tick(&mut self, now: Instant) -> Option<Stats> {
        if !self.alive {
            return None;
        }
        let Some(Reading { stats, shepherd }) = (self.source.read)() else {
            self.alive = false;
            // Give the series up at once: a front-end rebuilt under this
            // name carries them on, even while this reporter lives.
            #[cfg(feature = "metrics")]
            {
                self.series = None;
            }
            return None;
        };
        #[cfg(feature = "metrics")]
        if let Some(series) = &mut self.series {
            series.export(&stats, shepherd.as_ref());
        }
        #[cfg(not(feature = "metrics"))]
        let _ = shepherd;
        for watched in &self.alarms {
            let value = match watched.alarm.watched() {
                Watched::Usage => stats.usage,
                Watched::Waiting => stats.waiting,
            };
            watched.alarm.observe(value, now);
            #[cfg(feature = "metrics")]
            if let Some(gauge) = &watched.gauge {
                gauge.set(if watched.alarm.is_raised() { 1.0 } else { 0.0 });
            }
        }
        Some(stats)
    }
}

impl Reporter {
    /// A builder; see [`ReporterBuilder`].
    pub fn builder() -> ReporterBuilder {
        ReporterBuilder::default()
    }

    /// Reads every front-end once, exports the readings, and feeds every
    /// alarm its front-end's sample with the time `now`; returns the stats
    /// of the front-end this reporter was built for, or `None` once it is
    /// gone (the others are still read: see [`is_empty`](Self::is_empty)).
    ///
    /// `now` is the only clock the alarms see: pass `Instant::now()`, or
    /// made-up instants in a test.
    pub fn tick(&mut self, now: Instant) -> Option<Stats> {
        let mut watches = self.watches.iter_mut();
        let first = watches.next().and_then(|watch| watch.tick(now));
        for watch in watches {
            watch.tick(now);
        }
        first
    }

    /// Takes `other`'s front-ends over, each with its name, series and
    /// alarms, so one tick (one thread, one task) reports on all of them.
    /// This reporter's interval stays; `other`'s is dropped, and so is its
    /// thread's name. [`tick`](Self::tick) and a spawned thread's
    /// [`stop`](ReporterHandle::stop) still answer with the stats of the
    /// front-end this reporter was built for.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Instant;
    /// use sidejob::{Limiter, Supervisor};
    /// use sidejob::observe::Reporter;
    ///
    /// let api = Arc::new(Limiter::builder().name("api").capacity(64).build()?);
    /// let jobs = Supervisor::builder().name("jobs").capacity(8).build()?;
    /// let mut reporter = Reporter::builder()
    ///     .build(&api)?
    ///     .merge(Reporter::builder().build(&jobs)?);
    /// assert_eq!(reporter.len(), 2);
    ///
    /// drop(api);
    /// assert!(reporter.tick(Instant::now()).is_none()); // the first is gone...
    /// assert_eq!(reporter.len(), 1); // ...the supervisor is still read
    /// drop(jobs);
    /// reporter.tick(Instant::now());
    /// assert!(reporter.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn merge(mut self, other: Reporter) -> Reporter {
        self.watches.extend(other.watches);
        self
    }

    /// How many of its front-ends are still read: those not yet found gone
    /// by a tick.
    pub fn len(&self) -> usize {
        self.watches.iter().filter(|watch| watch.alive).count()
    }

    /// True once a tick found every front-end gone: nothing more to report.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs the reporter on a thread of its own, named after the first
    /// front-end's series (`{name}-reporter`): a tick at once (on the
    /// caller's thread, before this returns), then one every
    /// [`interval`](ReporterBuilder::interval) (none for an interval past
    /// the end of the clock's range), until [`ReporterHandle::stop`]
    /// (which ticks one last time) or until every front-end is gone.
    ///
    /// Keep the handle: dropping it stops the thread. To leave the thread
    /// running for as long as the front-ends live, call
    /// [`detach`](ReporterHandle::detach).
    ///
    /// # Errors
    ///
    /// [`Error::Spawn`] when the OS refuses the thread.
    pub fn spawn(mut self) -> Result<ReporterHandle, Error> {
        // The first tick runs here, so the series exist when this returns
        // and a front-end dropped right after still has its figures read.
        let first = self.tick(now());
        let shared = Arc::new(Shared {
            stopping: Mutex::new(false),
            wake: Condvar::new(),
        });
        let thread = os_thread::Builder::new()
            .name(format!("{}-reporter", self.name()))
            .spawn({
                let shared = Arc::clone(&shared);
                move || run(self, first, &shared)
            })
            .map_err(|e| Error::Spawn(e.kind()))?;
        Ok(ReporterHandle {
            shared,
            thread: Some(thread),
        })
    }

    /// The `name` label of the series of the front-end it was built for.
    pub fn name(&self) -> &str {
        &self.watches[0].name
    }

    /// `limiter`, `pool`, `async_pool`, `supervisor` or `shepherd`: the
    /// `kind` label of the series of the front-end it was built for.
    pub fn kind(&self) -> &'static str {
        self.watches[0].source.kind
    }

    /// How often a spawned reporter ticks.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The alarms it feeds, for every front-end.
    pub fn alarms(&self) -> impl Iterator<Item = &Alarm> {
        self.watches
            .iter()
            .flat_map(|watch| watch.alarms.iter().map(|watched| &watched.alarm))
    }
}

impl fmt::Debug for Reporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Front<'a>(&'a Watch);
        impl fmt::Debug for Front<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let watch = self.0;
                f.debug_struct("FrontEnd")
                    .field("name", &watch.name)
                    .field("kind", &watch.source.kind)
                    .field("alive", &watch.alive)
                    .field(
                        "alarms",
                        &watch.alarms.iter().map(|w| &w.alarm).collect::<Vec<_>>(),
                    )
                    .finish()
            }
        }
        f.debug_struct("Reporter")
            .field("interval", &self.interval)
            .field(
                "front_ends",
                &self.watches.iter().map(Front).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// What a reporter's thread and its handle share.
struct Shared {
    stopping: Mutex<bool>,
    wake: Condvar,
}

/// The reporter thread, after the first tick: wait for the interval or a
/// stop, tick, repeat; on a stop, one last tick. Returns the last stats
/// read of the front-end the reporter was built for.
fn run(mut reporter: Reporter, first: Option<Stats>, shared: &Shared) -> Option<Stats> {
    let mut last = first;
    if reporter.is_empty() {
        return last;
    }
    let start = now();
    let mut deadline = next_tick(start, reporter.interval, start);
    loop {
        let mut stopping = shared.stopping.lock();
        while !*stopping {
            let Some(at) = deadline else {
                // No tick on a timer: wait for the stop alone.
                stopping = shared.wake.wait(stopping);
                continue;
            };
            let (guard, timed_out) = shared.wake.wait_until(stopping, at);
            stopping = guard;
            if timed_out {
                break;
            }
        }
        let stop = *stopping;
        drop(stopping);
        let ticked = now();
        if let Some(stats) = reporter.tick(ticked) {
            last = Some(stats);
        }
        // Every front-end gone: nothing more to report.
        if stop || reporter.is_empty() {
            return last;
        }
        deadline = deadline.and_then(|at| next_tick(at, reporter.interval, ticked));
    }
}

/// The tick after the one due at `deadline`: `interval` later, but never
/// before `ticked` (the time of the tick just made), so a reporter that fell
/// behind keeps its cadence without catching up on missed ticks. `None`
/// when that instant is past the end of the clock's range
/// (`Duration::MAX`, say): no tick is ever due, and the thread reports only
/// when stopped.
///
/// An interval that large is taken, not refused: "never on a timer" is what
/// it says, the bound is the platform's `Instant` range (not ours to name),
/// and a report at stop still loses nothing.
fn next_tick(deadline: Instant, interval: Duration, ticked: Instant) -> Option<Instant> {
    deadline.checked_add(interval).map(|next| next.max(ticked))
}

/// A running reporter thread; made by [`Reporter::spawn`].
///
/// [`stop`](Self::stop) it to end the thread after a last report; dropping
/// the handle stops it the same way, so a handle dropped at once
/// (`reporter.spawn()?;`) would stop the reporter before it did anything:
/// the compiler warns. To leave the thread running until its front-ends
/// are gone, [`detach`](Self::detach) the handle.
///
/// # Examples
///
/// Dropping the handle unused does not compile under `deny(unused_must_use)`
/// (it is a warning by default):
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let sup = sidejob::Supervisor::new(8)?;
/// sidejob::observe::Reporter::builder().build(&sup)?.spawn()?;
/// # Ok(())
/// # }
/// ```
///
/// Detached, it reports until the front-end is gone:
///
/// ```
/// #![deny(unused_must_use)]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let sup = sidejob::Supervisor::new(8)?;
/// sidejob::observe::Reporter::builder().build(&sup)?.spawn()?.detach();
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping the handle stops the reporter: keep it, or call `detach()`"]
pub struct ReporterHandle {
    shared: Arc<Shared>,
    thread: Option<os_thread::JoinHandle<Option<Stats>>>,
}

impl ReporterHandle {
    /// Stops the thread after one last tick, and waits for it; returns the
    /// last stats it read of the front-end the reporter was built for
    /// (`None` if that one was gone before its first tick).
    pub fn stop(mut self) -> Option<Stats> {
        self.stop_and_join()
    }

    /// Lets the thread run on without a handle: it reports every interval
    /// until every front-end is gone, then ends. Nothing can stop it
    /// earlier, and the last figures a front-end counted after the
    /// thread's last tick before it was dropped are not exported.
    pub fn detach(mut self) {
        // Dropping a `JoinHandle` detaches its thread; with no thread
        // left, our `Drop` has nothing to stop.
        self.thread.take();
    }

    /// True once the thread has ended (every front-end is gone).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().map_or(true, |t| t.is_finished())
    }

    fn stop_and_join(&mut self) -> Option<Stats> {
        let thread = self.thread.take()?;
        *self.shared.stopping.lock() = true;
        self.shared.wake.notify_all();
        // A panic on the reporter thread (a panicking alarm callback) only
        // loses the last reading.
        thread.join().ok().flatten()
    }
}

impl Drop for ReporterHandle {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

impl fmt::Debug for ReporterHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReporterHandle")
            .field("finished", &self.is_finished())
            .finish()
    }
}

/// Configures a [`Reporter`]; made by [`Reporter::builder`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sidejob::Supervisor;
/// use sidejob::observe::{Alarm, Reporter};
///
/// let sup = Supervisor::builder().name("fsm").capacity(16).build()?;
/// let busy = Alarm::builder().threshold(12).raise_after(Duration::from_secs(30)).build()?;
/// let reporter = Reporter::builder()
///     .interval(Duration::from_millis(500))
///     .alarm(busy.clone())
///     .build(&sup)?;
/// assert_eq!((reporter.name(), reporter.kind()), ("fsm", "supervisor"));
///
/// let err = Reporter::builder().interval(Duration::ZERO).build(&sup).unwrap_err();
/// assert_eq!(err.field(), "interval");
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ReporterBuilder {
    interval: Duration,
    name: Option<String>,
    alarms: Vec<Alarm>,
    #[cfg(feature = "metrics")]
    export_metrics: bool,
}

/// The builder's defaults.
impl ReporterBuilder {
    /// How often a reporter ticks unless [`interval`](Self::interval) says
    /// otherwise: every second.
    pub const DEFAULT_INTERVAL: Duration = DEFAULT_INTERVAL;
}

impl Default for ReporterBuilder {
    fn default() -> Self {
        ReporterBuilder {
            interval: DEFAULT_INTERVAL,
            name: None,
            alarms: Vec::new(),
            #[cfg(feature = "metrics")]
            export_metrics: true,
        }
    }
}

impl ReporterBuilder {
    /// How often a spawned reporter ticks; [`DEFAULT_INTERVAL`](Self::DEFAULT_INTERVAL) (a second)
    /// by default. Must not be zero ([`build`](Self::build) refuses it).
    ///
    /// An interval that reaches past the end of the clock's range
    /// ([`Duration::MAX`], say) means no tick on a timer: a spawned
    /// reporter reads its front-end when spawned and when stopped, and
    /// notices a front-end that is gone only then.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sidejob::Supervisor;
    /// # use sidejob::observe::Reporter;
    ///
    /// let sup = Supervisor::new(8)?;
    /// let err = Reporter::builder().interval(Duration::ZERO).build(&sup).unwrap_err();
    /// assert_eq!(err.to_string(), "invalid `interval`: must be longer than zero");
    ///
    /// // Reports at spawn and at stop only.
    /// let handle = Reporter::builder().interval(Duration::MAX).build(&sup)?.spawn()?;
    /// sup.spawn(|| ())?.join().unwrap();
    /// let last = handle.stop().expect("the supervisor is alive");
    /// assert_eq!((last.accepted, last.completed), (1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn interval(&mut self, interval: Duration) -> &mut Self {
        self.interval = interval;
        self
    }

    /// The `name` label; defaults to the front-end's name (every builder
    /// has a `name`; `sidejob` when none was given, `shepherd` for a
    /// shepherd). An unnamed front-end's series take the first free name
    /// of `sidejob`, `sidejob-2`, ... (see `sidejob::metrics`); a name
    /// given here or to the front-end is taken as it is, or refused.
    pub fn name(&mut self, name: impl Into<String>) -> &mut Self {
        self.name = Some(name.into());
        self
    }

    /// Feeds `alarm` a sample every tick. Keep a clone to read its state.
    pub fn alarm(&mut self, alarm: Alarm) -> &mut Self {
        self.alarms.push(alarm);
        self
    }

    /// Whether to export the stats through the `metrics` facade; on by
    /// default. Off, the reporter only feeds its alarms, and claims no
    /// name.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn export_metrics(&mut self, export: bool) -> &mut Self {
        self.export_metrics = export;
        self
    }

    /// Builds a reporter for `front_end` (`&Arc<Limiter>`, `&Pool<W>`,
    /// `&AsyncPool<W>`, `&Supervisor` or `&Shepherd<H>`), claiming its
    /// series' `(name, kind)` and registering their handles now, with the
    /// recorder in force.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `interval` if it is zero, or `name` if it
    /// contains a NUL byte; with the `metrics` feature, naming `name` also
    /// if it is empty, or if another live front-end of the same kind
    /// already exports its series under it (to this recorder; the example
    /// is in `sidejob::metrics`).
    pub fn build<F: Observe>(&self, front_end: &F) -> Result<Reporter, ConfigError> {
        if self.interval.is_zero() {
            return Err(ConfigError::zero_duration("interval"));
        }
        let source = front_end.source();
        let name = self.name.clone().unwrap_or_else(|| source.name.clone());
        if name.contains('\0') {
            return Err(ConfigError::nul("name"));
        }
        #[cfg(feature = "metrics")]
        let series = if self.export_metrics {
            let read = Arc::clone(&source.read);
            Some(super::metrics::Series::register(
                super::metrics::FrontEnd {
                    kind: source.kind,
                    name: &name,
                    unnamed: self.name.is_none() && source.unnamed,
                    id: source.id,
                    alive: Arc::new(move || read().is_some()),
                    counted: counted(&source),
                },
            )?)
        } else {
            None
        };
        // The name the series got (an unnamed front-end's may be `-2`...).
        #[cfg(feature = "metrics")]
        let name = series.as_ref().map_or(name, |s| s.name().to_string());
        let alarms = self
            .alarms
            .iter()
            .map(|alarm| WatchedAlarm {
                alarm: alarm.clone(),
                #[cfg(feature = "metrics")]
                gauge: series.as_ref().map(|s| s.alarm_gauge(alarm.name())),
            })
            .collect();
        Ok(Reporter {
            interval: self.interval,
            watches: vec![Watch {
                source,
                name,
                alive: true,
                #[cfg(feature = "metrics")]
                series,
                alarms,
            }],
        })
    }
}

/// The classes whose units `source`'s front-end counts while held (their
/// `ClassStats::held` is `Some`), as one reading says: fixed at its build.
#[cfg(feature = "metrics")]
fn counted(source: &Source) -> [bool; crate::Class::COUNT] {
    let mut counted = [false; crate::Class::COUNT];
    if let Some(reading) = (source.read)() {
        for class in &reading.stats.classes {
            counted[class.class.rank()] = class.held.is_some();
        }
    }
    counted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_tick_keeps_the_cadence_without_catching_up() {
        let t0 = now();
        let s = Duration::from_secs;
        // On time: one interval after the last deadline.
        assert_eq!(next_tick(t0, s(1), t0), Some(t0 + s(1)));
        // Fell behind by three intervals: due at once, not three times.
        assert_eq!(next_tick(t0, s(1), t0 + s(4)), Some(t0 + s(4)));
        // Zero (which the builder refuses) would be the tick just made.
        assert_eq!(next_tick(t0, Duration::ZERO, t0 + s(1)), Some(t0 + s(1)));
        // A long interval that fits the clock's range.
        let year = s(365 * 24 * 3600);
        assert_eq!(next_tick(t0, year, t0), Some(t0 + year));
        // Past the end of the clock: never.
        assert_eq!(next_tick(t0, Duration::MAX, t0), None);
    }
}
