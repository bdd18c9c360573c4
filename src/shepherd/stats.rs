//! The shepherd's figures: the [`ShepherdStats`] snapshot, and the
//! counters behind it.

use std::time::{Duration, Instant};

use crate::stats::Stats;
use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// A point-in-time reading of a [`Shepherd`](crate::shepherd::Shepherd): the figures
/// a worker pool of this kind is monitored by (operations due, workers busy and asleep, processing
/// time) and the retry counters, beside the admission table's [`Stats`].
///
/// `due`, `delayed`, `running`, `busy` and `next_due` are read together
/// under the shepherd's lock; the counters are read after it, one by one,
/// and each only grows.
///
/// # Examples
///
/// ```
/// # use sidejob::shepherd::{Handler, Shepherd};
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
    /// Operations due and waiting for a worker: the health figure to
    /// watch. It must routinely drop below the number of workers; one that
    /// stays above it means the workers cannot keep up.
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
    /// Operations completed with a [`Failure`](crate::shepherd::Failure).
    pub failed: u64,
    /// Attempts that returned (with a value, an error or a panic).
    pub processed: u64,
    /// Their time inside the handler, added up: `processing_time /
    /// processed` is the mean attempt. Read on the same clock as
    /// `turnaround_time`: the sum is right, one short attempt's share of it
    /// is not.
    pub processing_time: Duration,
    /// Submission to final outcome, added up over the `succeeded + failed`
    /// operations: delays and retries included. On the system clock both
    /// ends are read on the scheduler tick's clock (a few nanoseconds a
    /// reading, off by up to a tick, 1–4 ms): the sum over many operations
    /// is right, one short operation's share of it is not.
    pub turnaround_time: Duration,
    /// The admission table's figures: `usage` counts every operation the
    /// shepherd holds (due, delayed, running), `rejected` the `Overload`s.
    pub admission: Stats,
}

/// The counters, one cell per worker (and one more for the timer and the
/// threads that shut down or submit), each on its own cache line: the
/// workers count every attempt, and a shared line bouncing between them
/// on every count would cost more than the counting. `stats` adds the
/// cells up. `Relaxed` throughout: each is a count only, read without
/// ordering by `stats`, and no decision depends on one.
#[derive(Debug)]
pub(crate) struct Counters {
    cells: Box<[CachePadded<Cell>]>,
    /// Whether the timer also writes a worker's `running` (it takes a
    /// timed-out record from its slot): only with an attempt timeout.
    timer_stops: bool,
}

/// One thread's counts.
#[derive(Debug, Default)]
struct Cell {
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
    /// Attempts of this worker whose record is in its slot (0 or 1).
    running: AtomicUsize,
    /// This worker is inside a handler (0 or 1; its worker alone writes it).
    busy: AtomicUsize,
    /// Records this worker has completed and not yet counted out of the
    /// due line (line.rs, "Counting out in runs"); its worker alone
    /// writes it.
    kept: AtomicUsize,
}

impl Counters {
    /// Cells for `workers` workers, and the shared one; `timer_stops` if
    /// the timer may stop a worker's attempt (an attempt timeout).
    pub(crate) fn new(workers: usize, timer_stops: bool) -> Self {
        Counters {
            cells: (0..=workers).map(|_| CachePadded::default()).collect(),
            timer_stops,
        }
    }

    /// Adds `delta` (wrapping) to `running` of `cell`: an RMW if the timer
    /// may write it too, else a plain load and store (one writer).
    #[inline]
    fn running_add(&self, cell: &Cell, delta: usize) {
        if self.timer_stops {
            // Relaxed: a count; two writers, so an RMW.
            cell.running.fetch_add(delta, Relaxed);
        } else {
            // Relaxed: a count with one writer, this worker.
            cell.running
                .store(cell.running.load(Relaxed).wrapping_add(delta), Relaxed);
        }
    }

    /// The cell of threads that are not workers.
    pub(crate) fn shared_cell(&self) -> usize {
        self.cells.len() - 1
    }

    fn cell(&self, cell: usize) -> &Cell {
        // Callers pass a worker index or `shared_cell`; anything else is
        // counted in the shared cell rather than panic.
        self.cells
            .get(cell)
            .unwrap_or(&self.cells[self.cells.len() - 1])
    }

    /// Adds `n` to `field` of cell `cell`. A worker's cell has one writer
    /// (its worker), so a plain load and store do, without the locked
    /// instruction of an RMW; the shared cell has several and gets an RMW.
    #[inline]
    fn add(&self, cell: usize, n: u64, field: impl Fn(&Cell) -> &AtomicU64) {
        let shared = cell >= self.shared_cell();
        let counter = field(self.cell(cell));
        if shared {
            // Relaxed: a count (see the type's docs); several writers.
            counter.fetch_add(n, Relaxed);
        } else {
            // Relaxed: a count with one writer, this worker; readers see
            // one value or the next.
            counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
        }
    }

    /// Worker `cell` starts an attempt.
    pub(crate) fn attempt(&self, cell: usize) {
        self.add(cell, 1, |c| &c.attempts);
        let cell = self.cell(cell);
        self.running_add(cell, 1);
        // Relaxed: a flag with one writer, this worker.
        cell.busy.store(1, Relaxed);
    }

    /// Worker `cell`'s attempt no longer runs (it returned, or the timer
    /// took its record).
    pub(crate) fn stopped(&self, cell: usize) {
        self.running_add(self.cell(cell), usize::MAX);
    }

    /// Worker `cell` is out of the handler.
    pub(crate) fn free(&self, cell: usize) {
        // Relaxed: a flag with one writer, this worker.
        self.cell(cell).busy.store(0, Relaxed);
    }

    pub(crate) fn retry(&self, cell: usize) {
        self.add(cell, 1, |c| &c.retries);
    }

    pub(crate) fn panicked(&self, cell: usize) {
        self.add(cell, 1, |c| &c.panicked);
    }

    pub(crate) fn timed_out(&self, cell: usize) {
        self.add(cell, 1, |c| &c.timed_out);
    }

    pub(crate) fn budget_refused(&self, cell: usize) {
        self.add(cell, 1, |c| &c.budget_refused);
    }

    /// An attempt returned after `took` ns in the handler.
    pub(crate) fn processed(&self, cell: usize, took: u64) {
        self.add(cell, 1, |c| &c.processed);
        self.add(cell, took, |c| &c.processing_nanos);
    }

    /// An operation was completed, `took` ns after its submission.
    pub(crate) fn resolved(&self, cell: usize, succeeded: bool, took: u64) {
        if succeeded {
            self.add(cell, 1, |c| &c.succeeded);
        } else {
            self.add(cell, 1, |c| &c.failed);
        }
        self.add(cell, took, |c| &c.turnaround_nanos);
    }

    /// Worker `cell` completed a record and keeps its count-out for a
    /// run.
    #[inline]
    pub(crate) fn keep(&self, cell: usize) {
        let kept = &self.cell(cell).kept;
        // Relaxed: a count with one writer, this worker; read by figures.
        kept.store(kept.load(Relaxed) + 1, Relaxed);
    }

    /// Records worker `cell` keeps now.
    #[inline]
    pub(crate) fn kept(&self, cell: usize) -> usize {
        // Relaxed: as in `keep`.
        self.cell(cell).kept.load(Relaxed)
    }

    /// Worker `cell` is about to count out what it kept: how many, now 0.
    #[inline]
    pub(crate) fn take_kept(&self, cell: usize) -> usize {
        let kept = &self.cell(cell).kept;
        // Relaxed: as in `keep`.
        let n = kept.load(Relaxed);
        if n > 0 {
            kept.store(0, Relaxed);
        }
        n
    }

    /// Attempts running, workers busy, and records completed but kept
    /// in the line's open count, over every cell.
    pub(crate) fn in_hand(&self) -> (usize, usize, usize) {
        // Relaxed: counts.
        self.cells
            .iter()
            .fold((0, 0, 0), |(running, busy, kept), cell| {
                (
                    running + cell.running.load(Relaxed),
                    busy + cell.busy.load(Relaxed),
                    kept + cell.kept.load(Relaxed),
                )
            })
    }

    /// Fills the counter fields of `stats`.
    pub(crate) fn read_into(&self, stats: &mut ShepherdStats) {
        let mut nanos = (0u64, 0u64);
        for cell in self.cells.iter() {
            // Relaxed: counts (see the type's docs).
            stats.attempts += cell.attempts.load(Relaxed);
            stats.retries += cell.retries.load(Relaxed);
            stats.panicked += cell.panicked.load(Relaxed);
            stats.timed_out += cell.timed_out.load(Relaxed);
            stats.budget_refused += cell.budget_refused.load(Relaxed);
            stats.succeeded += cell.succeeded.load(Relaxed);
            stats.failed += cell.failed.load(Relaxed);
            stats.processed += cell.processed.load(Relaxed);
            nanos.0 = nanos.0.saturating_add(cell.processing_nanos.load(Relaxed));
            nanos.1 = nanos.1.saturating_add(cell.turnaround_nanos.load(Relaxed));
        }
        stats.processing_time = Duration::from_nanos(nanos.0);
        stats.turnaround_time = Duration::from_nanos(nanos.1);
    }
}
