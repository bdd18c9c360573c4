//! The metric names and the cached `metrics` handles a
//! [`Reporter`](crate::observe::Reporter) exports a front-end's [`Stats`] through.
//!
//! Nothing here runs on the admission path. The table already counts
//! everything exactly, per shard (`stats.rs`); a reporter reads a
//! [`Stats`] snapshot every interval and exports it through handles
//! registered once, so a `metrics` macro call (50–60 ns, more than an
//! admission) is never paid per request.
//!
//! # Series
//!
//! Every series carries the labels `name` (the front-end's name) and
//! `kind` (`limiter`, `pool`, `async_pool`, `supervisor` or `shepherd`),
//! and one `(name, kind)` belongs to one front-end at a time:
//!
//! - **Counters are exported as increments**: each tick adds what the
//!   front-end counted since the last tick
//!   ([`Counter::increment`](::metrics::Counter::increment)), never its
//!   total. A front-end rebuilt under its name carries on the series where
//!   the old one left it, so the counter only ever rises and `rate()` sees
//!   the new front-end's traffic from its first tick. (An exporter stores
//!   an *absolute* value with `fetch_max`: the new front-end's small totals
//!   would hide under the old one's until they passed them.) The same
//!   holds for a new reporter taking over a live front-end from a dropped
//!   one: it carries on from what the old one exported.
//! - **Two live front-ends never share a series.** Building a reporter
//!   claims its `(name, kind)` for the front-end; while that front-end is
//!   alive (reported or not), another front-end asking for the same name
//!   gets a [`ConfigError`](crate::ConfigError) naming `name`, and so does
//!   a second reporter for it while the first one lives (it would count
//!   the front-end twice). A front-end built without a name (so named
//!   `sidejob`, or `shepherd` for a shepherd) is unnamed: it takes
//!   `sidejob`, or `sidejob-2`, `sidejob-3`, ... when that is claimed
//!   (name it for a series that survives a rebuild). One given the name
//!   `sidejob` explicitly is named: refused while another live front-end
//!   holds `sidejob`, never moved to `sidejob-3`. A claim looks at the
//!   entries for the names it tries (one, for a named front-end), so an
//!   unnamed front-end's claim grows with the unnamed ones before it: name
//!   front-ends built by the thousand. Claims are per
//!   recorder: each recorder (the global one, or one installed locally
//!   with `metrics::with_local_recorder`) has series of its own. With no
//!   recorder installed nothing is exported, so nothing is claimed.
//!
//! ```
//! use std::sync::Arc;
//! use sidejob::Limiter;
//! use sidejob::observe::Reporter;
//! # let recorder = metrics_util::debugging::DebuggingRecorder::new();
//! # let _in_force = metrics::set_default_local_recorder(&recorder);
//!
//! let a = Arc::new(Limiter::builder().name("api").capacity(4).build()?);
//! let b = Arc::new(Limiter::builder().name("api").capacity(6).build()?);
//! let reporting = Reporter::builder().build(&a)?;
//! let err = Reporter::builder().build(&b).unwrap_err();
//! assert_eq!(err.field(), "name");
//! assert_eq!(
//!     err.to_string(),
//!     "invalid `name`: another live limiter already exports its series as \"api\" (give each its own name)"
//! );
//!
//! // Unnamed front-ends are told apart.
//! let c = Arc::new(Limiter::new(4)?);
//! let d = Arc::new(Limiter::new(6)?);
//! let (c, d) = (Reporter::builder().build(&c)?, Reporter::builder().build(&d)?);
//! assert_eq!((c.name(), d.name()), ("sidejob", "sidejob-2"));
//!
//! // Once `a` is gone, another `api` carries its series on (even while
//! // `a`'s reporter lives).
//! drop(a);
//! assert_eq!(Reporter::builder().build(&b)?.name(), "api");
//! # drop(reporting);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Names follow Prometheus conventions, and the exporter's page passes
//! `promtool check metrics` (CI runs it on the page of
//! `metrics-exporter-prometheus`): a `sidejob_` prefix, `_total` on
//! counters and only on counters, base units (seconds) in the name.
//!
//! # Per-class series
//!
//! Each front-end also exports its [priority classes](crate::Class)'
//! figures ([`Stats::classes`]), one series per class with a `class` label
//! beside `name` and `kind`: [`CLASS_ACCEPTED`], [`CLASS_REJECTED`],
//! [`CLASS_TIMED_OUT`] (counters, exported as increments as above) and
//! [`CLASS_WAITING`] (a gauge), for all four classes from the first tick,
//! so a class's series is there (at 0) before its first request; and, for
//! a front-end with a min share, [`CLASS_HELD`] (a gauge) for its two
//! sheddable classes. They are
//! names of their own, not a `class` label on `sidejob_accepted_total`:
//! a series with the label beside one without under the same name would
//! make `sum(sidejob_accepted_total)` count every unit twice. Summed over
//! `class`, they are the totals (`sum by (name) (rate(sidejob_class_rejected_total[1m]))`
//! is `rate(sidejob_rejected_total[1m])`): the default class's figures are
//! the totals less the other classes' (see [`ClassStats`]). The share of
//! refusals that fall on the sheddable classes,
//! `sum(rate(sidejob_class_rejected_total{class=~"sheddable.*"}[5m])) / sum(rate(sidejob_rejected_total[5m]))`,
//! says whether shedding by class is doing its work.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Instant;
//! use metrics_util::debugging::{DebugValue, DebuggingRecorder};
//! use sidejob::{observe::Reporter, units::Ask, Class, Error, Limiter};
//!
//! let recorder = DebuggingRecorder::new();
//! let snapshotter = recorder.snapshotter();
//! // Sheddable requests may fill 80 % of 10: 8 (one shard: exact in total).
//! let limiter = Arc::new(Limiter::builder().name("api").capacity(10).shards(1).build()?);
//! let mut reporter = metrics::with_local_recorder(&recorder, || Reporter::builder().build(&limiter))?;
//!
//! let others = limiter.try_acquire_many(8)?;
//! let prefetch = Ask::new().class(Class::Sheddable).fail_fast();
//! assert_eq!(limiter.acquire_with(prefetch).unwrap_err(), Error::Overload);
//! reporter.tick(Instant::now()).expect("the limiter is alive");
//!
//! let rejected = |class: Class| {
//!     snapshotter.snapshot().into_vec().into_iter().find_map(|(key, _, _, value)| {
//!         let key = key.key();
//!         let ours = key.labels().any(|l| l.key() == "class" && l.value() == class.as_str());
//!         (key.name() == sidejob::metrics::CLASS_REJECTED && ours).then_some(value)
//!     })
//! };
//! assert_eq!(rejected(Class::Sheddable), Some(DebugValue::Counter(1)));
//! assert_eq!(rejected(Class::Critical), Some(DebugValue::Counter(0)));
//! # drop(others);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Two figures of [`Stats`] are left out on purpose: `peak_usage` and
//! `peak_waiting` are highs since the front-end was built, never reset, so
//! after the first burst they say nothing; `max_over_time(sidejob_waiting[5m])`
//! is the Prometheus way, and a burst between two scrapes still shows in
//! [`WAITED`] and [`TIMED_OUT`]. A [`Shepherd`](crate::shepherd::Shepherd)
//! also exports its own figures ([`ShepherdStats`]) under `sidejob_shepherd_*`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use ::metrics::{Counter, Gauge, Histogram, Label, Recorder, Unit};

use crate::engine::class::Class;
use crate::error::ConfigError;
use crate::shepherd::ShepherdStats;
use crate::stats::{ClassStats, Stats};
use crate::sync::{Arc, Mutex, OnceLock};

/// Gauge: the configured capacity.
pub const CAPACITY: &str = "sidejob_capacity";
/// Gauge: units admitted and not yet released ([`Stats::usage`]).
pub const IN_FLIGHT: &str = "sidejob_in_flight";
/// Counter: units ever admitted ([`Stats::accepted`]).
pub const ACCEPTED: &str = "sidejob_accepted_total";
/// Counter: attempts refused with `Overload` ([`Stats::rejected`]).
pub const REJECTED: &str = "sidejob_rejected_total";
/// Counter: units released normally ([`Stats::completed`]).
pub const COMPLETED: &str = "sidejob_completed_total";
/// Counter: units released by a panic ([`Stats::panicked`]).
pub const PANICKED: &str = "sidejob_panicked_total";
/// Gauge: callers waiting for a unit now ([`Stats::waiting`]).
pub const WAITING: &str = "sidejob_waiting";
/// Counter: callers that waited and were admitted ([`Stats::waited`]).
pub const WAITED: &str = "sidejob_waited_total";
/// Counter: callers that waited and gave up ([`Stats::timed_out`]).
pub const TIMED_OUT: &str = "sidejob_timed_out_total";
/// Gauge that only grows: the seconds admitted waiters waited, added up
/// ([`Stats::waited_time`]). `rate(sidejob_waited_seconds[1m]) /
/// rate(sidejob_waited_total[1m])` is the mean wait.
///
/// A gauge, not a counter: the `metrics` facade's counters hold whole
/// numbers, and whole seconds would read 0 for a service whose waits are
/// milliseconds. So it is typed and named as a gauge (no `_total`, which
/// Prometheus reserves for counters: `promtool` refuses a gauge named
/// `_total`), and it only ever rises, across rebuilds too (it is exported
/// as increments, like the counters), so `rate()` reads it as the counter
/// it is.
pub const WAITED_SECONDS: &str = "sidejob_waited_seconds";
/// Histogram: the seconds a unit was held, from admission to release,
/// where recorded (the tower layer's `LimitLayer::record_time`, feature
/// `tower`, which can afford a clock read per request).
pub const HOLD_SECONDS: &str = "sidejob_hold_seconds";
/// Gauge: 1 while an [`Alarm`](crate::observe::Alarm) is raised, else 0; labelled
/// also with `alarm`, the alarm's name.
pub const ALARM: &str = "sidejob_alarm";

/// Counter: units admitted to requests of one priority class
/// ([`ClassStats::accepted`]); labelled also with `class`, the class's
/// [`as_str`](crate::Class::as_str) name (`critical_plus`, `critical`,
/// `sheddable_plus`, `sheddable`). See [Per-class series](self#per-class-series).
pub const CLASS_ACCEPTED: &str = "sidejob_class_accepted_total";
/// Counter: one class's attempts refused with `Overload`
/// ([`ClassStats::rejected`]); labelled also with `class`.
pub const CLASS_REJECTED: &str = "sidejob_class_rejected_total";
/// Counter: one class's callers that waited and gave up
/// ([`ClassStats::timed_out`]); labelled also with `class`.
pub const CLASS_TIMED_OUT: &str = "sidejob_class_timed_out_total";
/// Gauge: one class's callers waiting for a unit now
/// ([`ClassStats::waiting`]); labelled also with `class`.
pub const CLASS_WAITING: &str = "sidejob_class_waiting";
/// Gauge: units one sheddable class holds now ([`ClassStats::held`]),
/// what its min share is checked against; labelled also with `class`.
/// Exported only by a front-end with a min share (the only one that
/// counts them), for its two sheddable classes.
pub const CLASS_HELD: &str = "sidejob_class_held";

/// Gauge: shepherd operations due and waiting for a worker
/// ([`ShepherdStats::due`]): the shepherd's health figure.
pub const SHEPHERD_DUE: &str = "sidejob_shepherd_due";
/// Gauge: shepherd operations waiting for their time, a delay or a
/// retry's backoff ([`ShepherdStats::delayed`]).
pub const SHEPHERD_DELAYED: &str = "sidejob_shepherd_delayed";
/// Gauge: shepherd operations with an attempt running
/// ([`ShepherdStats::running`]).
pub const SHEPHERD_RUNNING: &str = "sidejob_shepherd_running";
/// Gauge: shepherd workers inside a handler ([`ShepherdStats::busy`]).
pub const SHEPHERD_BUSY: &str = "sidejob_shepherd_busy_workers";
/// Gauge: shepherd workers waiting for work ([`ShepherdStats::idle`]).
pub const SHEPHERD_IDLE: &str = "sidejob_shepherd_idle_workers";
/// Counter: attempts started, first ones and retries
/// ([`ShepherdStats::attempts`]).
pub const SHEPHERD_ATTEMPTS: &str = "sidejob_shepherd_attempts_total";
/// Counter: retries scheduled ([`ShepherdStats::retries`]).
pub const SHEPHERD_RETRIES: &str = "sidejob_shepherd_retries_total";
/// Counter: operations completed with a final failure
/// ([`ShepherdStats::failed`]).
pub const SHEPHERD_FAILURES: &str = "sidejob_shepherd_failures_total";
/// Counter: attempts that returned, the count of the processing time
/// ([`ShepherdStats::processed`]).
pub const SHEPHERD_PROCESSED: &str = "sidejob_shepherd_processed_total";
/// Gauge that only grows: the seconds attempts spent in the handler,
/// added up ([`ShepherdStats::processing_time`]):
/// `rate(sidejob_shepherd_processing_seconds[1m]) /
/// rate(sidejob_shepherd_processed_total[1m])` is the mean attempt. A
/// gauge for the reason [`WAITED_SECONDS`] is one.
pub const SHEPHERD_PROCESSING_SECONDS: &str = "sidejob_shepherd_processing_seconds";

/// The labels of every series of one front-end.
fn labels(name: &str, kind: &'static str) -> Vec<Label> {
    vec![
        Label::new("name", name.to_string()),
        Label::new("kind", kind),
    ]
}

/// Describes every metric once (HELP and unit lines in Prometheus).
fn describe() {
    ::metrics::describe_gauge!(CAPACITY, Unit::Count, "Configured capacity, in units");
    ::metrics::describe_gauge!(
        IN_FLIGHT,
        Unit::Count,
        "Units admitted and not yet released"
    );
    ::metrics::describe_counter!(ACCEPTED, Unit::Count, "Units ever admitted");
    ::metrics::describe_counter!(REJECTED, Unit::Count, "Attempts refused with Overload");
    ::metrics::describe_counter!(COMPLETED, Unit::Count, "Units released normally");
    ::metrics::describe_counter!(PANICKED, Unit::Count, "Units released by a panic");
    ::metrics::describe_histogram!(
        HOLD_SECONDS,
        Unit::Seconds,
        "Seconds a unit was held, from admission to release"
    );
    ::metrics::describe_gauge!(WAITING, Unit::Count, "Callers waiting for a unit now");
    ::metrics::describe_counter!(WAITED, Unit::Count, "Callers that waited and were admitted");
    ::metrics::describe_counter!(
        TIMED_OUT,
        Unit::Count,
        "Callers that waited and gave up (max_wait or the queue's target)"
    );
    ::metrics::describe_gauge!(
        WAITED_SECONDS,
        Unit::Seconds,
        "Seconds admitted waiters waited, added up (only grows: use rate)"
    );
    ::metrics::describe_gauge!(ALARM, Unit::Count, "1 while the health alarm is raised");
    ::metrics::describe_counter!(
        CLASS_ACCEPTED,
        Unit::Count,
        "Units admitted to the requests of a priority class"
    );
    ::metrics::describe_counter!(
        CLASS_REJECTED,
        Unit::Count,
        "Attempts of a priority class refused with Overload"
    );
    ::metrics::describe_counter!(
        CLASS_TIMED_OUT,
        Unit::Count,
        "Callers of a priority class that waited and gave up"
    );
    ::metrics::describe_gauge!(
        CLASS_WAITING,
        Unit::Count,
        "Callers of a priority class waiting for a unit now"
    );
    ::metrics::describe_gauge!(
        CLASS_HELD,
        Unit::Count,
        "Units a sheddable priority class holds now, against its min share"
    );
}

/// Describes the shepherd's metrics once.
fn describe_shepherd() {
    ::metrics::describe_gauge!(
        SHEPHERD_DUE,
        Unit::Count,
        "Operations due and waiting for a worker"
    );
    ::metrics::describe_gauge!(
        SHEPHERD_DELAYED,
        Unit::Count,
        "Operations waiting for a delay or a retry's backoff"
    );
    ::metrics::describe_gauge!(
        SHEPHERD_RUNNING,
        Unit::Count,
        "Operations with an attempt running"
    );
    ::metrics::describe_gauge!(SHEPHERD_BUSY, Unit::Count, "Workers inside a handler");
    ::metrics::describe_gauge!(SHEPHERD_IDLE, Unit::Count, "Workers waiting for work");
    ::metrics::describe_counter!(
        SHEPHERD_ATTEMPTS,
        Unit::Count,
        "Attempts started, first ones and retries"
    );
    ::metrics::describe_counter!(SHEPHERD_RETRIES, Unit::Count, "Retries scheduled");
    ::metrics::describe_counter!(
        SHEPHERD_FAILURES,
        Unit::Count,
        "Operations completed with a final failure"
    );
    ::metrics::describe_counter!(
        SHEPHERD_PROCESSED,
        Unit::Count,
        "Attempts that returned (a value, an error or a panic)"
    );
    ::metrics::describe_gauge!(
        SHEPHERD_PROCESSING_SECONDS,
        Unit::Seconds,
        "Seconds attempts spent in the handler, added up (only grows: use rate)"
    );
}

/// What a front-end's series have been given so far: the totals each
/// increment is measured from.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Totals {
    accepted: u64,
    rejected: u64,
    completed: u64,
    panicked: u64,
    waited: u64,
    timed_out: u64,
    waited_time: Duration,
    attempts: u64,
    retries: u64,
    failed: u64,
    processed: u64,
    processing_time: Duration,
    /// Each class's, by rank.
    classes: [ClassTotals; Class::COUNT],
}

/// What one class's series have been given so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct ClassTotals {
    accepted: u64,
    rejected: u64,
    timed_out: u64,
}

/// Adds to `counter` what `total` gained over `*last`, and moves `*last`.
/// Saturating: a front-end's totals never fall, and if one ever did, a
/// counter must still not.
fn add(counter: &Counter, total: u64, last: &mut u64) {
    let delta = total.saturating_sub(*last);
    if delta > 0 {
        counter.increment(delta);
    }
    *last = total.max(*last);
}

/// [`add`] for a time exported as a gauge that only grows.
fn add_seconds(gauge: &Gauge, total: Duration, last: &mut Duration) {
    let delta = total.saturating_sub(*last);
    if !delta.is_zero() {
        gauge.increment(delta.as_secs_f64());
    }
    *last = total.max(*last);
}

/// The handles of one front-end's admission series.
#[derive(Debug)]
struct Handles {
    capacity: Gauge,
    in_flight: Gauge,
    accepted: Counter,
    rejected: Counter,
    completed: Counter,
    panicked: Counter,
    waiting: Gauge,
    waited: Counter,
    timed_out: Counter,
    waited_seconds: Gauge,
    /// Each class's, by rank.
    classes: Vec<ClassHandles>,
}

/// The handles of one priority class's series.
#[derive(Debug)]
struct ClassHandles {
    accepted: Counter,
    rejected: Counter,
    timed_out: Counter,
    waiting: Gauge,
    /// For a class whose units the front-end counts (`counted`).
    held: Option<Gauge>,
}

impl ClassHandles {
    /// The series of `class`, under the front-end's `labels`; its units
    /// held too if `counted`.
    fn register(labels: &[Label], class: Class, counted: bool) -> Self {
        let mut labels = labels.to_vec();
        labels.push(Label::new("class", class.as_str()));
        ClassHandles {
            accepted: ::metrics::counter!(CLASS_ACCEPTED, labels.clone()),
            rejected: ::metrics::counter!(CLASS_REJECTED, labels.clone()),
            timed_out: ::metrics::counter!(CLASS_TIMED_OUT, labels.clone()),
            held: counted.then(|| ::metrics::gauge!(CLASS_HELD, labels.clone())),
            waiting: ::metrics::gauge!(CLASS_WAITING, labels),
        }
    }

    fn export(&self, stats: &ClassStats, last: &mut ClassTotals) {
        self.waiting.set(stats.waiting as f64);
        if let (Some(gauge), Some(held)) = (&self.held, stats.held) {
            gauge.set(held as f64);
        }
        add(&self.accepted, stats.accepted, &mut last.accepted);
        add(&self.rejected, stats.rejected, &mut last.rejected);
        add(&self.timed_out, stats.timed_out, &mut last.timed_out);
    }
}

impl Handles {
    fn register(labels: &[Label], counted: [bool; Class::COUNT]) -> Self {
        describe();
        Handles {
            capacity: ::metrics::gauge!(CAPACITY, labels.to_vec()),
            in_flight: ::metrics::gauge!(IN_FLIGHT, labels.to_vec()),
            accepted: ::metrics::counter!(ACCEPTED, labels.to_vec()),
            rejected: ::metrics::counter!(REJECTED, labels.to_vec()),
            completed: ::metrics::counter!(COMPLETED, labels.to_vec()),
            panicked: ::metrics::counter!(PANICKED, labels.to_vec()),
            waiting: ::metrics::gauge!(WAITING, labels.to_vec()),
            waited: ::metrics::counter!(WAITED, labels.to_vec()),
            timed_out: ::metrics::counter!(TIMED_OUT, labels.to_vec()),
            waited_seconds: ::metrics::gauge!(WAITED_SECONDS, labels.to_vec()),
            classes: Class::ALL
                .iter()
                .map(|&class| ClassHandles::register(labels, class, counted[class.rank()]))
                .collect(),
        }
    }

    fn export(&self, stats: &Stats, last: &mut Totals) {
        self.capacity.set(stats.capacity as f64);
        self.in_flight.set(stats.usage as f64);
        self.waiting.set(stats.waiting as f64);
        add(&self.accepted, stats.accepted, &mut last.accepted);
        add(&self.rejected, stats.rejected, &mut last.rejected);
        add(&self.completed, stats.completed, &mut last.completed);
        add(&self.panicked, stats.panicked, &mut last.panicked);
        add(&self.waited, stats.waited, &mut last.waited);
        add(&self.timed_out, stats.timed_out, &mut last.timed_out);
        add_seconds(
            &self.waited_seconds,
            stats.waited_time,
            &mut last.waited_time,
        );
        for class in &stats.classes {
            let rank = class.class.rank();
            if let (Some(handles), Some(last)) =
                (self.classes.get(rank), last.classes.get_mut(rank))
            {
                handles.export(class, last);
            }
        }
    }
}

/// The handles of a shepherd's own series.
#[derive(Debug)]
struct ShepherdHandles {
    due: Gauge,
    delayed: Gauge,
    running: Gauge,
    busy: Gauge,
    idle: Gauge,
    attempts: Counter,
    retries: Counter,
    failures: Counter,
    processed: Counter,
    processing_seconds: Gauge,
}

impl ShepherdHandles {
    fn register(labels: &[Label]) -> Self {
        describe_shepherd();
        ShepherdHandles {
            due: ::metrics::gauge!(SHEPHERD_DUE, labels.to_vec()),
            delayed: ::metrics::gauge!(SHEPHERD_DELAYED, labels.to_vec()),
            running: ::metrics::gauge!(SHEPHERD_RUNNING, labels.to_vec()),
            busy: ::metrics::gauge!(SHEPHERD_BUSY, labels.to_vec()),
            idle: ::metrics::gauge!(SHEPHERD_IDLE, labels.to_vec()),
            attempts: ::metrics::counter!(SHEPHERD_ATTEMPTS, labels.to_vec()),
            retries: ::metrics::counter!(SHEPHERD_RETRIES, labels.to_vec()),
            failures: ::metrics::counter!(SHEPHERD_FAILURES, labels.to_vec()),
            processed: ::metrics::counter!(SHEPHERD_PROCESSED, labels.to_vec()),
            processing_seconds: ::metrics::gauge!(SHEPHERD_PROCESSING_SECONDS, labels.to_vec()),
        }
    }

    fn export(&self, stats: &ShepherdStats, last: &mut Totals) {
        self.due.set(stats.due as f64);
        self.delayed.set(stats.delayed as f64);
        self.running.set(stats.running as f64);
        self.busy.set(stats.busy as f64);
        self.idle.set(stats.idle as f64);
        add(&self.attempts, stats.attempts, &mut last.attempts);
        add(&self.retries, stats.retries, &mut last.retries);
        add(&self.failures, stats.failed, &mut last.failed);
        add(&self.processed, stats.processed, &mut last.processed);
        add_seconds(
            &self.processing_seconds,
            stats.processing_time,
            &mut last.processing_time,
        );
    }
}

/// The front-end a reporter asks to export, as the claim registry sees it.
pub(crate) struct FrontEnd<'a> {
    pub(crate) kind: &'static str,
    /// The `name` label asked for: the reporter's, else the front-end's.
    pub(crate) name: &'a str,
    /// True when `name` is the front-end's default (no name was given).
    pub(crate) unnamed: bool,
    /// Which front-end it is: an address it alone owns while it is alive
    /// (see `Source::id` in `reporter.rs`).
    pub(crate) id: usize,
    /// Whether it is still alive; read only while claiming.
    pub(crate) alive: Alive,
    /// The classes whose units it counts while held (`ClassStats::held`
    /// is `Some`): their held gauge is registered.
    pub(crate) counted: [bool; Class::COUNT],
}

/// One front-end's series: the handles, what they were last given, and
/// the claim on their `(name, kind)`, released when this is dropped.
#[derive(Debug)]
pub(crate) struct Series {
    name: String,
    kind: &'static str,
    handles: Handles,
    shepherd: Option<ShepherdHandles>,
    last: Totals,
    claim: Option<Claim>,
}

impl Series {
    /// Claims a `(name, kind)` for `front_end` with the recorder in force
    /// now and registers its handles (a shepherd's own too).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `name` when it is empty, or when another
    /// live front-end's series are exported under it.
    pub(crate) fn register(front_end: FrontEnd<'_>) -> Result<Series, ConfigError> {
        if front_end.name.is_empty() {
            // Prometheus reads an empty label value as no label at all.
            return Err(ConfigError::empty("name"));
        }
        let (name, last, claim) = claim(&front_end)?;
        let labels = labels(&name, front_end.kind);
        Ok(Series {
            handles: Handles::register(&labels, front_end.counted),
            shepherd: (front_end.kind == "shepherd").then(|| ShepherdHandles::register(&labels)),
            name,
            kind: front_end.kind,
            last,
            claim,
        })
    }

    /// The `name` label the series got.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Exports one reading: gauges set, counters raised by what the
    /// front-end counted since the last export.
    pub(crate) fn export(&mut self, stats: &Stats, shepherd: Option<&ShepherdStats>) {
        self.handles.export(stats, &mut self.last);
        if let (Some(handles), Some(shepherd)) = (&self.shepherd, shepherd) {
            handles.export(shepherd, &mut self.last);
        }
    }

    /// The gauge an alarm of this front-end publishes its state to.
    pub(crate) fn alarm_gauge(&self, alarm: &str) -> Gauge {
        describe();
        let mut labels = labels(&self.name, self.kind);
        labels.push(Label::new("alarm", alarm.to_string()));
        ::metrics::gauge!(ALARM, labels)
    }
}

impl Drop for Series {
    fn drop(&mut self) {
        if let Some(claim) = self.claim.take() {
            release(claim, self.last);
        }
    }
}

/// The hold-time histogram of one front-end.
#[cfg_attr(not(feature = "tower"), allow(dead_code))]
pub(crate) fn time_histogram(name: &str, kind: &'static str) -> Histogram {
    describe();
    ::metrics::histogram!(HOLD_SECONDS, labels(name, kind))
}

// The claim registry.
//
// Why a process-wide table: the series namespace it guards is the
// recorder's, and the global recorder is process-wide; two reporters built
// in different corners of a program share it whether or not they know of
// each other. The alternatives do not keep a series whole: a per-front-end
// `id` label starts a new series at every rebuild (and grows the label set
// without bound), and summing two front-ends under one name hides each
// one's figures in the other's. Nothing here is on the admission path: a
// reporter takes the lock when it is built and when it is dropped.

/// One `(recorder, kind, name)`: a set of series.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    /// The recorder's address: each recorder has series of its own.
    recorder: usize,
    kind: &'static str,
    name: String,
}

/// Whether a front-end is still alive (it upgrades a weak reference).
type Alive = Arc<dyn Fn() -> bool + Send + Sync>;

/// Who exports a set of series, or last did.
struct Entry {
    /// The claim of the reporter exporting them now; `None` once it is
    /// dropped.
    owner: Option<u64>,
    /// The front-end they were last exported for.
    front_end: usize,
    alive: Alive,
    /// What they were given for that front-end, for a reporter that takes
    /// the same front-end over.
    exported: Totals,
}

#[derive(Default)]
struct Registry {
    entries: HashMap<Key, Entry>,
    next_claim: u64,
    /// How many entries the last sweep left.
    swept: usize,
}

/// A reporter's claim on a set of series.
#[derive(Debug)]
struct Claim {
    key: Key,
    token: u64,
}

fn registry() -> &'static Mutex<Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(Registry::default()))
}

/// The address of the recorder in force, or `None` for a recorder of no
/// size: the facade's no-op, which stands in when none is installed and
/// exports nothing, so there is nothing to claim. (The facade has no
/// "is one installed" query; a recorder that holds series has a size.)
fn recorder_id() -> Option<usize> {
    ::metrics::with_recorder(|recorder: &dyn Recorder| {
        (std::mem::size_of_val(recorder) != 0)
            .then(|| (recorder as *const dyn Recorder).cast::<()>() as usize)
    })
}

/// Picks the `name` label for `front_end` and claims it: the name asked
/// for, or for an unnamed front-end the first of `name`, `name-2`, ...
/// not claimed by another live front-end. Returns the name, the totals to
/// carry on from, and the claim (none under a no-op recorder).
fn claim(front_end: &FrontEnd<'_>) -> Result<(String, Totals, Option<Claim>), ConfigError> {
    let Some(recorder) = recorder_id() else {
        return Ok((front_end.name.to_string(), Totals::default(), None));
    };
    // Which front-ends are gone, asked outside the lock: asking upgrades a
    // weak reference for a moment, and if the owner drops its last handle
    // meanwhile, the front-end's drop (which may join its threads) runs
    // here, where it must not hold the registry. A front-end gone stays
    // gone; one claimed after this look counts as alive.
    //
    // Only the entries this claim looks at are asked: the names it tries,
    // up to the first free one (one name for a named front-end). Every
    // entry is asked only when the registry has doubled since it was last
    // swept (so forgetting the series of front-ends gone costs a claim
    // O(1), amortized, not a question to every live front-end).
    let (probes, sweep): (Vec<Alive>, bool) = {
        let registry = registry().lock();
        let sweep = registry.entries.len() >= registry.swept.saturating_mul(2).max(SWEEP_AT_LEAST);
        let probes = if sweep {
            registry
                .entries
                .values()
                .map(|entry| Arc::clone(&entry.alive))
                .collect()
        } else {
            candidates(front_end, recorder)
                .map_while(|key| registry.entries.get(&key))
                .map(|entry| Arc::clone(&entry.alive))
                .collect()
        };
        (probes, sweep)
    };
    // Kept to the end: an address in `gone` is not reused meanwhile.
    let gone: Vec<Alive> = probes.into_iter().filter(|alive| !alive()).collect();
    let gone_at: HashSet<usize> = gone.iter().map(address).collect();
    let is_gone = |entry: &Entry| gone_at.contains(&address(&entry.alive));
    let mut registry = registry().lock();
    if sweep {
        // Forget the series of front-ends gone and unreported: whoever
        // claims them next starts afresh, as a rebuild does.
        registry
            .entries
            .retain(|_, entry| entry.owner.is_some() || !is_gone(entry));
        registry.swept = registry.entries.len();
    }
    let token = registry.next_claim;
    registry.next_claim += 1;
    for key in candidates(front_end, recorder) {
        let exported = match registry.entries.get(&key) {
            // Never claimed, or its front-end is gone (a rebuild): carry
            // on from the series' last value.
            None => Totals::default(),
            Some(entry) if is_gone(entry) => Totals::default(),
            // The same front-end, unreported since its reporter was
            // dropped: carry on from what that one exported.
            Some(entry) if entry.owner.is_none() && entry.front_end == front_end.id => {
                entry.exported
            }
            // Another live front-end's, or reported now: an unnamed
            // front-end tries the next name, a named one is refused.
            Some(_) if front_end.unnamed => continue,
            Some(_) => {
                return Err(ConfigError::taken(front_end.kind, front_end.name));
            }
        };
        registry.entries.insert(
            key.clone(),
            Entry {
                owner: Some(token),
                front_end: front_end.id,
                alive: Arc::clone(&front_end.alive),
                exported,
            },
        );
        return Ok((key.name.clone(), exported, Some(Claim { key, token })));
    }
    // Only a named front-end's one name ends the loop without returning,
    // and it returns; an unnamed one's names do not run out.
    Err(ConfigError::taken(front_end.kind, front_end.name))
}

/// The registry is swept whole once it holds this many entries, then
/// each time it has doubled since.
const SWEEP_AT_LEAST: usize = 64;

/// The keys a claim tries, in order: the name asked for, then (unnamed)
/// `name-2`, `name-3`, ...
fn candidates<'a>(front_end: &'a FrontEnd<'_>, recorder: usize) -> impl Iterator<Item = Key> + 'a {
    let tries = if front_end.unnamed { u64::MAX } else { 1 };
    (1..=tries).map(move |n| Key {
        recorder,
        kind: front_end.kind,
        name: match n {
            1 => front_end.name.to_string(),
            n => format!("{}-{n}", front_end.name),
        },
    })
}

/// Where an `Alive` lives: which front-end's probe it is.
fn address(alive: &Alive) -> usize {
    Arc::as_ptr(alive).cast::<()>() as usize
}

/// Gives a claim up, leaving what was exported for a reporter that takes
/// the same front-end over. A claim another reporter took over (its
/// front-end was gone) is not ours to release.
fn release(claim: Claim, exported: Totals) {
    let mut registry = registry().lock();
    if let Some(entry) = registry.entries.get_mut(&claim.key) {
        if entry.owner == Some(claim.token) {
            entry.owner = None;
            entry.exported = exported;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::{AtomicUsize, Ordering::Relaxed};

    /// A claim asked every entry in the registry whether its front-end
    /// was alive: the 3,000th claim took 2.2 ms. It now asks the entries
    /// it looks at, and all of them only when the registry has doubled.
    #[test]
    fn a_claim_asks_only_the_entries_it_looks_at() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let asked = Arc::new(AtomicUsize::new(0));
        let front_end = |name: &'static str, id: usize| {
            let asked = Arc::clone(&asked);
            let alive: Alive = Arc::new(move || {
                // Relaxed: a count the test reads after the claims, on
                // this thread.
                asked.fetch_add(1, Relaxed);
                true
            });
            FrontEnd {
                kind: "limiter",
                name,
                unnamed: false,
                id,
                alive,
                counted: [false; Class::COUNT],
            }
        };
        let claims = 1_000;
        let series: Vec<Series> = ::metrics::with_local_recorder(&recorder, || {
            (0..claims)
                .map(|id| {
                    let name: &'static str = Box::leak(format!("api-{id}").into_boxed_str());
                    Series::register(front_end(name, id)).unwrap()
                })
                .collect()
        });
        // Relaxed: as above.
        let asked_by_all = asked.load(Relaxed);
        assert!(
            asked_by_all <= 3 * claims,
            "{asked_by_all} questions for {claims} claims"
        );
        // A name taken by a live front-end is refused after one question.
        let before = asked.load(Relaxed);
        let err = ::metrics::with_local_recorder(&recorder, || {
            Series::register(front_end("api-7", claims + 1)).unwrap_err()
        });
        assert_eq!(err.field(), "name");
        assert!(asked.load(Relaxed) - before <= claims, "a sweep at most");
        drop(series);
    }
}
