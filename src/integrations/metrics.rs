//! The metric names and the cached `metrics` handles a
//! [`Reporter`](crate::observe::Reporter) exports a front-end's [`Stats`] through.
//!
//! Nothing here runs on the admission path. The table already counts
//! everything exactly, per shard (`stats.rs`); a reporter reads a
//! [`Stats`] snapshot every interval and *sets* gauges and counters to
//! it through handles registered once, so a `metrics` macro call (50–60
//! ns, more than an admission) is never paid per request. Counters are
//! set with [`Counter::absolute`](::metrics::Counter::absolute): the stats
//! are totals since the front-end was built.
//!
//! Names follow Prometheus conventions: a `sidejob_` prefix, `_total` on
//! counters, base units (seconds) in the name. Two figures of [`Stats`]
//! are left out on purpose: `peak_usage` and `peak_waiting` are highs
//! since the front-end was built, never reset, so after the first burst
//! they say nothing; `max_over_time(sidejob_waiting[5m])` is the
//! Prometheus way, and a burst between two scrapes still shows in
//! [`WAITED`] and [`TIMED_OUT`]. Every series carries the
//! labels `name` (the front-end's name) and `kind` (`limiter`, `pool`,
//! `async_pool`, `supervisor` or `shepherd`). A [`Shepherd`](crate::shepherd::Shepherd) also
//! exports its own figures ([`ShepherdStats`]) under `sidejob_shepherd_*`.

use ::metrics::{Counter, Gauge, Histogram, Label, Unit};

use crate::shepherd::ShepherdStats;
use crate::stats::Stats;

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
/// The seconds admitted waiters waited, added up ([`Stats::waited_time`]):
/// `rate(sidejob_waited_seconds_total) / rate(sidejob_waited_total)` is
/// the mean wait.
///
/// Exported as a *gauge* that only grows, not a counter: the `metrics`
/// facade's counters hold whole numbers, and whole seconds would read 0
/// for a service whose waits are milliseconds. PromQL's `rate` treats it
/// as the counter it is (a fall reads as a reset); only the `# TYPE`
/// line says gauge.
pub const WAITED_SECONDS: &str = "sidejob_waited_seconds_total";
/// Histogram: seconds from admission to release, where recorded (the
/// tower layer's [`record_time`](crate::tower::LimitLayer::record_time)).
pub const TIME_IN_POOL: &str = "sidejob_time_in_pool_seconds";
/// Gauge: 1 while an [`Alarm`](crate::observe::Alarm) is raised, else 0; labelled
/// also with `alarm`, the alarm's name.
pub const ALARM: &str = "sidejob_alarm";

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
/// The seconds attempts spent in the handler, added up
/// ([`ShepherdStats::processing_time`]): `rate(sidejob_shepherd_processing_seconds_total)
/// / rate(sidejob_shepherd_processed_total)` is the mean attempt. A gauge
/// that only grows, as [`WAITED_SECONDS`] is, and for the same reason.
pub const SHEPHERD_PROCESSING_SECONDS: &str = "sidejob_shepherd_processing_seconds_total";

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
        TIME_IN_POOL,
        Unit::Seconds,
        "Time from admission to release"
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
        "Seconds admitted waiters waited, added up (only grows)"
    );
    ::metrics::describe_gauge!(ALARM, Unit::Count, "1 while the health alarm is raised");
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
        "Seconds attempts spent in the handler, added up (only grows)"
    );
}

/// The handles of one front-end's series, registered once with the
/// recorder installed at the time (global, or local to the thread).
#[derive(Debug)]
pub(crate) struct Handles {
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
}

impl Handles {
    pub(crate) fn register(name: &str, kind: &'static str) -> Self {
        describe();
        let labels = labels(name, kind);
        Handles {
            capacity: ::metrics::gauge!(CAPACITY, labels.clone()),
            in_flight: ::metrics::gauge!(IN_FLIGHT, labels.clone()),
            accepted: ::metrics::counter!(ACCEPTED, labels.clone()),
            rejected: ::metrics::counter!(REJECTED, labels.clone()),
            completed: ::metrics::counter!(COMPLETED, labels.clone()),
            panicked: ::metrics::counter!(PANICKED, labels.clone()),
            waiting: ::metrics::gauge!(WAITING, labels.clone()),
            waited: ::metrics::counter!(WAITED, labels.clone()),
            timed_out: ::metrics::counter!(TIMED_OUT, labels.clone()),
            waited_seconds: ::metrics::gauge!(WAITED_SECONDS, labels.clone()),
        }
    }

    /// Sets every series to `stats`.
    pub(crate) fn export(&self, stats: &Stats) {
        self.capacity.set(stats.capacity as f64);
        self.in_flight.set(stats.usage as f64);
        self.accepted.absolute(stats.accepted);
        self.rejected.absolute(stats.rejected);
        self.completed.absolute(stats.completed);
        self.panicked.absolute(stats.panicked);
        self.waiting.set(stats.waiting as f64);
        self.waited.absolute(stats.waited);
        self.timed_out.absolute(stats.timed_out);
        self.waited_seconds.set(stats.waited_time.as_secs_f64());
    }
}

/// The handles of a shepherd's own series.
#[derive(Debug)]
pub(crate) struct ShepherdHandles {
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
    pub(crate) fn register(name: &str, kind: &'static str) -> Self {
        describe_shepherd();
        let labels = labels(name, kind);
        ShepherdHandles {
            due: ::metrics::gauge!(SHEPHERD_DUE, labels.clone()),
            delayed: ::metrics::gauge!(SHEPHERD_DELAYED, labels.clone()),
            running: ::metrics::gauge!(SHEPHERD_RUNNING, labels.clone()),
            busy: ::metrics::gauge!(SHEPHERD_BUSY, labels.clone()),
            idle: ::metrics::gauge!(SHEPHERD_IDLE, labels.clone()),
            attempts: ::metrics::counter!(SHEPHERD_ATTEMPTS, labels.clone()),
            retries: ::metrics::counter!(SHEPHERD_RETRIES, labels.clone()),
            failures: ::metrics::counter!(SHEPHERD_FAILURES, labels.clone()),
            processed: ::metrics::counter!(SHEPHERD_PROCESSED, labels.clone()),
            processing_seconds: ::metrics::gauge!(SHEPHERD_PROCESSING_SECONDS, labels),
        }
    }

    /// Sets every series to `stats`.
    pub(crate) fn export(&self, stats: &ShepherdStats) {
        self.due.set(stats.due as f64);
        self.delayed.set(stats.delayed as f64);
        self.running.set(stats.running as f64);
        self.busy.set(stats.busy as f64);
        self.idle.set(stats.idle as f64);
        self.attempts.absolute(stats.attempts);
        self.retries.absolute(stats.retries);
        self.failures.absolute(stats.failed);
        self.processed.absolute(stats.processed);
        self.processing_seconds
            .set(stats.processing_time.as_secs_f64());
    }
}

/// The gauge an alarm publishes its state to.
pub(crate) fn alarm_gauge(name: &str, kind: &'static str, alarm: &str) -> Gauge {
    describe();
    let mut labels = labels(name, kind);
    labels.push(Label::new("alarm", alarm.to_string()));
    ::metrics::gauge!(ALARM, labels.clone())
}

/// The time-in-pool histogram of one front-end.
#[cfg_attr(not(feature = "tower"), allow(dead_code))]
pub(crate) fn time_histogram(name: &str, kind: &'static str) -> Histogram {
    describe();
    ::metrics::histogram!(TIME_IN_POOL, labels(name, kind))
}
