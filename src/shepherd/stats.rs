//! The shepherd's figures: the [`ShepherdStats`] snapshot, and the
//! counters behind it.

use std::time::{Duration, Instant};

use crate::stats::Stats;
use crate::sync::{AtomicU64, Ordering::Relaxed};

/// A point-in-time reading of a [`Shepherd`](crate::Shepherd): the seed's
/// monitoring figures (operations due, workers busy and asleep, processing
/// time) and the retry counters, beside the admission table's [`Stats`].
///
/// `due`, `delayed`, `running`, `busy` and `next_due` are read together
/// under the shepherd's lock; the counters are read after it, one by one,
/// and each only grows.
///
/// # Examples
///
/// ```
/// # use sidejob::{Handler, Shepherd};
/// # struct Echo;
/// # impl Handler for Echo {
/// #     type Op = u8; type Output = u8; type Error = ();
/// #     fn handle(&mut self, n: &u8, _: u32) -> Result<u8, ()> { Ok(*n) }
/// # }
/// let shepherd = Shepherd::builder().capacity(4).workers(2).build(|_| Echo)?;
/// assert_eq!(shepherd.submit(1)?.wait(), Ok(1));
/// shepherd.shutdown();
/// let stats = shepherd.stats();
/// assert_eq!((stats.attempts, stats.succeeded, stats.failed), (1, 1, 0));
/// assert_eq!((stats.due, stats.running, stats.workers), (0, 0, 2));
/// assert_eq!(stats.admission.accepted, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShepherdStats {
    /// Operations due and waiting for a worker: the figure the seed's
    /// health alarm watches (it "must routinely drop below the number of
    /// workers").
    pub due: usize,
    /// Operations waiting for their time: a `submit_after` delay or a
    /// retry's backoff. They occupy no worker.
    pub delayed: usize,
    /// Operations with an attempt running now.
    pub running: usize,
    /// Workers inside a handler now (an attempt past its timeout
    /// included, until it returns).
    pub busy: usize,
    /// Workers waiting for work: `workers - busy`.
    pub idle: usize,
    /// Worker threads.
    pub workers: usize,
    /// When the earliest delayed operation becomes due, on the shepherd's
    /// clock.
    pub next_due: Option<Instant>,
    /// Attempts started, first ones and retries.
    pub attempts: u64,
    /// Retries scheduled.
    pub retries: u64,
    /// Attempts that panicked.
    pub panicked: u64,
    /// Attempts that ran past the attempt timeout.
    pub timed_out: u64,
    /// Retries the budget refused (each a final failure).
    pub budget_refused: u64,
    /// Operations completed with their output.
    pub succeeded: u64,
    /// Operations completed with a [`Failure`](crate::Failure).
    pub failed: u64,
    /// Attempts that returned (with a value, an error or a panic).
    pub processed: u64,
    /// Their time inside the handler, added up: `processing_time /
    /// processed` is the mean attempt.
    pub processing_time: Duration,
    /// Submission to final outcome, added up over the `succeeded + failed`
    /// operations: delays and retries included.
    pub turnaround_time: Duration,
    /// The admission table's figures: `usage` counts every operation the
    /// shepherd holds (due, delayed, running), `rejected` the `Overload`s.
    pub admission: Stats,
}

/// The counters; `Relaxed` throughout: each is a count only, read without
/// ordering by `stats`, and no decision depends on one.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    attempts: AtomicU64,
    retries: AtomicU64,
    panicked: AtomicU64,
    timed_out: AtomicU64,
    budget_refused: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    processed: AtomicU64,
    processing_nanos: AtomicU64,
    turnaround_nanos: AtomicU64,
}

/// A duration in nanoseconds for a counter (584 years saturate).
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

impl Counters {
    pub(crate) fn attempt(&self) {
        // Relaxed: a count (see the type's docs).
        self.attempts.fetch_add(1, Relaxed);
    }

    pub(crate) fn retry(&self) {
        // Relaxed: a count.
        self.retries.fetch_add(1, Relaxed);
    }

    pub(crate) fn panicked(&self) {
        // Relaxed: a count.
        self.panicked.fetch_add(1, Relaxed);
    }

    pub(crate) fn timed_out(&self) {
        // Relaxed: a count.
        self.timed_out.fetch_add(1, Relaxed);
    }

    pub(crate) fn budget_refused(&self) {
        // Relaxed: a count.
        self.budget_refused.fetch_add(1, Relaxed);
    }

    /// An attempt returned after `took` in the handler.
    pub(crate) fn processed(&self, took: Duration) {
        // Relaxed: counts.
        self.processed.fetch_add(1, Relaxed);
        self.processing_nanos.fetch_add(nanos(took), Relaxed);
    }

    /// An operation was completed, `took` after its submission.
    pub(crate) fn resolved(&self, succeeded: bool, took: Duration) {
        // Relaxed: counts.
        if succeeded {
            self.succeeded.fetch_add(1, Relaxed);
        } else {
            self.failed.fetch_add(1, Relaxed);
        }
        self.turnaround_nanos.fetch_add(nanos(took), Relaxed);
    }

    /// Fills the counter fields of `stats`.
    pub(crate) fn read_into(&self, stats: &mut ShepherdStats) {
        // Relaxed: counts (see the type's docs).
        stats.attempts = self.attempts.load(Relaxed);
        stats.retries = self.retries.load(Relaxed);
        stats.panicked = self.panicked.load(Relaxed);
        stats.timed_out = self.timed_out.load(Relaxed);
        stats.budget_refused = self.budget_refused.load(Relaxed);
        stats.succeeded = self.succeeded.load(Relaxed);
        stats.failed = self.failed.load(Relaxed);
        stats.processed = self.processed.load(Relaxed);
        stats.processing_time = Duration::from_nanos(self.processing_nanos.load(Relaxed));
        stats.turnaround_time = Duration::from_nanos(self.turnaround_nanos.load(Relaxed));
    }
}
