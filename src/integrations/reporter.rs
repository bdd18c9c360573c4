//! [`Reporter`]: reads a front-end's [`Stats`] (and a shepherd's
//! [`ShepherdStats`](crate::shepherd::ShepherdStats)) on a tick, exports them as metrics (feature
//! `metrics`) and feeds its health [`Alarm`]s, off the admission path.
//!
//! A reporter holds its front-end weakly: it never keeps a limiter, pool,
//! supervisor or shepherd alive. Tick it yourself ([`Reporter::tick`], from any
//! runtime's timer) or let it run on a thread of its own
//! ([`Reporter::spawn`]), which you stop with [`ReporterHandle::stop`]; the
//! thread reports one last time before it exits, so the final figures are
//! never lost.

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

    /// How a reporter reads a front-end: its kind, default name, and a
    /// weak read of its figures (`None` once it is gone).
    pub struct Source {
        pub(crate) kind: &'static str,
        pub(crate) name: String,
        pub(crate) read: Box<dyn Fn() -> Option<Reading> + Send>,
    }

    impl std::fmt::Debug for Source {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Source")
                .field("kind", &self.kind)
                .field("name", &self.name)
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
            // A limiter has no name of its own.
            name: "sidejob".to_string(),
            read: Box::new(move || {
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
            read: Box::new(move || read().map(Reading::plain)),
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
            read: Box::new(move || read().map(Reading::plain)),
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
            read: Box::new(move || read().map(Reading::plain)),
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
            read: Box::new(move || {
                read().map(|shepherd| Reading {
                    stats: shepherd.admission.clone(),
                    shepherd: Some(shepherd),
                })
            }),
        }
    }
}
impl<H: Handler> Observe for Shepherd<H> {}

/// Reads a front-end's [`Stats`] every tick, exports them through the
/// `metrics` facade (feature `metrics`) and feeds its [`Alarm`]s.
///
/// Nothing is added to the admission path: the front-end already counts
/// everything, per shard, and the reporter only reads those counts. With
/// the `metrics` feature, each tick sets these series, labelled
/// `name` (the front-end's name, or the builder's) and `kind` (`limiter`,
/// `pool`, `async_pool`, `supervisor`, `shepherd`):
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
/// | `sidejob_waited_seconds_total` | gauge (only grows) | [`Stats::waited_time`], in seconds |
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
/// | `sidejob_shepherd_processing_seconds_total` | gauge (only grows) | [`ShepherdStats::processing_time`](crate::shepherd::ShepherdStats::processing_time), in seconds |
///
/// The handles are registered when the reporter is built, with the
/// recorder installed then: install your exporter first. (The seconds
/// waited are a gauge because the `metrics` facade's counters hold whole
/// numbers; `rate()` reads it as a counter. The time histogram
/// `sidejob_time_in_pool_seconds` comes from the tower layer's
/// `record_time`, which can afford a clock read per request.)
///
/// The reporter holds its front-end weakly: once the front-end is gone,
/// [`tick`](Self::tick) returns `None` and a spawned reporter's thread
/// ends.
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
/// let limiter = Arc::new(Limiter::new(4)?);
/// let mut reporter = Reporter::builder().name("api").build(&limiter)?;
/// let _permit = limiter.try_acquire()?;
/// let stats = reporter.tick(Instant::now()).expect("the limiter is alive");
/// assert_eq!(stats.usage, 1);
///
/// drop(_permit);
/// drop(limiter);
/// assert!(reporter.tick(Instant::now()).is_none()); // held weakly
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
pub struct Reporter {
    source: Source,
    name: String,
    interval: Duration,
    #[cfg(feature = "metrics")]
    handles: Option<crate::metrics::Handles>,
    /// A shepherd's own series.
    #[cfg(feature = "metrics")]
    shepherd_handles: Option<crate::metrics::ShepherdHandles>,
    alarms: Vec<WatchedAlarm>,
}

/// An alarm and, with the `metrics` feature, the gauge it shows on.
struct WatchedAlarm {
    alarm: Alarm,
    #[cfg(feature = "metrics")]
    gauge: Option<::metrics::Gauge>,
}

impl Reporter {
    /// A builder; see [`ReporterBuilder`].
    pub fn builder() -> ReporterBuilder {
        ReporterBuilder::default()
    }

    /// Reads the stats once, exports them, and feeds every alarm the
    /// sample with the time `now`; returns the stats read, or `None` if the
    /// front-end is gone (nothing is exported then).
    ///
    /// `now` is the only clock the alarms see: pass `Instant::now()`, or
    /// made-up instants in a test.
    pub fn tick(&mut self, now: Instant) -> Option<Stats> {
        let Reading { stats, shepherd } = (self.source.read)()?;
        #[cfg(feature = "metrics")]
        if let Some(handles) = &self.handles {
            handles.export(&stats);
        }
        #[cfg(feature = "metrics")]
        if let (Some(handles), Some(shepherd)) = (&self.shepherd_handles, &shepherd) {
            handles.export(shepherd);
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

    /// Runs the reporter on a thread of its own, named
    /// `{name}-reporter`: a tick at once (on the caller's thread, before
    /// this returns), then one every
    /// [`interval`](ReporterBuilder::interval) (none for an interval past
    /// the end of the clock's range), until
    /// [`ReporterHandle::stop`] (which ticks one last time) or until the
    /// front-end is gone.
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
            .name(format!("{}-reporter", self.name))
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

    /// The `name` label of its series.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `limiter`, `pool`, `async_pool`, `supervisor` or `shepherd`: the
    /// `kind` label of its series.
    pub fn kind(&self) -> &'static str {
        self.source.kind
    }

    /// How often a spawned reporter ticks.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The alarms it feeds.
    pub fn alarms(&self) -> impl Iterator<Item = &Alarm> {
        self.alarms.iter().map(|watched| &watched.alarm)
    }
}

impl fmt::Debug for Reporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reporter")
            .field("name", &self.name)
            .field("kind", &self.source.kind)
            .field("interval", &self.interval)
            .field("alarms", &self.alarms().collect::<Vec<_>>())
            .finish()
    }
}

/// What a reporter's thread and its handle share.
struct Shared {
    stopping: Mutex<bool>,
    wake: Condvar,
}

/// The reporter thread, after the first tick: wait for the interval or a
/// stop, tick, repeat; on a stop, one last tick. Returns the last stats read.
fn run(mut reporter: Reporter, first: Option<Stats>, shared: &Shared) -> Option<Stats> {
    let mut last = first?;
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
        match reporter.tick(ticked) {
            Some(stats) => last = stats,
            // The front-end is gone: nothing more to report.
            None => return Some(last),
        }
        if stop {
            return Some(last);
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
/// the handle stops it the same way.
pub struct ReporterHandle {
    shared: Arc<Shared>,
    thread: Option<os_thread::JoinHandle<Option<Stats>>>,
}

impl ReporterHandle {
    /// Stops the thread after one last tick, and waits for it; returns the
    /// last stats it read (`None` if the front-end was gone before its
    /// first tick).
    pub fn stop(mut self) -> Option<Stats> {
        self.stop_and_join()
    }

    /// True once the thread has ended (its front-end is gone).
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

    /// The `name` label; defaults to the front-end's name (`sidejob` for a
    /// limiter, which has none).
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
    /// default. Off, the reporter only feeds its alarms.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn export_metrics(&mut self, export: bool) -> &mut Self {
        self.export_metrics = export;
        self
    }

    /// Builds a reporter for `front_end` (`&Arc<Limiter>`, `&Pool<W>`,
    /// `&AsyncPool<W>`, `&Supervisor` or `&Shepherd<H>`), registering its
    /// metric handles now.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `interval` if it is zero, or `name` if it
    /// contains a NUL byte.
    pub fn build<F: Observe>(&self, front_end: &F) -> Result<Reporter, ConfigError> {
        if self.interval.is_zero() {
            return Err(ConfigError::zero_duration("interval"));
        }
        let source = front_end.source();
        let name = self.name.clone().unwrap_or_else(|| source.name.clone());
        if name.contains('\0') {
            return Err(ConfigError::nul("name"));
        }
        let alarms = self
            .alarms
            .iter()
            .map(|alarm| WatchedAlarm {
                alarm: alarm.clone(),
                #[cfg(feature = "metrics")]
                gauge: self
                    .export_metrics
                    .then(|| crate::metrics::alarm_gauge(&name, source.kind, alarm.name())),
            })
            .collect();
        Ok(Reporter {
            #[cfg(feature = "metrics")]
            handles: self
                .export_metrics
                .then(|| crate::metrics::Handles::register(&name, source.kind)),
            #[cfg(feature = "metrics")]
            shepherd_handles: (self.export_metrics && source.kind == "shepherd")
                .then(|| crate::metrics::ShepherdHandles::register(&name, source.kind)),
            source,
            name,
            interval: self.interval,
            alarms,
        })
    }
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
