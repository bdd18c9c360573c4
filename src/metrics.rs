//! The metric names and the cached `metrics` handles a
//! [`Reporter`](crate::Reporter) exports a front-end's [`Stats`] through.
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
//! counters, base units (seconds) in the name. Every series carries the
//! labels `name` (the front-end's name) and `kind` (`limiter`, `pool` or
//! `supervisor`).

use ::metrics::{Counter, Gauge, Histogram, Label, Unit};

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
/// Histogram: seconds from admission to release, where recorded (the
/// tower layer's [`record_time`](crate::tower::LimitLayer::record_time)).
pub const TIME_IN_POOL: &str = "sidejob_time_in_pool_seconds";
/// Gauge: 1 while an [`Alarm`](crate::Alarm) is raised, else 0; labelled
/// also with `alarm`, the alarm's name.
pub const ALARM: &str = "sidejob_alarm";

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
    ::metrics::describe_gauge!(ALARM, Unit::Count, "1 while the health alarm is raised");
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
