//! The shepherd's shared state and its one decision: after an attempt
//! fails, retry the operation later or complete it with its final failure.
//!
//! # Implementation details
//!
//! **Where an operation is.** Every admitted operation is a [`Record`] that
//! owns its unit of capacity ([`Unit`]) and the sender of its completion.
//! At any moment a record is in exactly one place: the queue (due or
//! delayed), a worker's [`Slot`] while an attempt runs, or the hands of the
//! thread resolving it. A record leaves the system only through
//! [`Shared::finish`], which releases the unit and *then* sends the
//! outcome, so a caller that gets its result and submits again never meets
//! its own stale unit. A record dropped any other way (none is) would still
//! release its unit (the guard's `Drop`) and resolve its handle
//! (`Reason::Shutdown`, from the dropped sender).
//!
//! **Locks.** One lock, [`Core`], guards the queue, the retry budget, the
//! jitter RNG, the attempt deadlines and the counts of running attempts and
//! busy workers. Each worker's slot has a lock of its own, taken under
//! `Core` (to install a record, or by the timer to take a timed-out one)
//! or alone (by its worker, after the attempt); never the other way round.
//! The admission table is called with or without `Core` held; it never
//! calls back. A success takes `Core` once (the worker's next pop, which
//! also accounts the attempt that ended); the submit takes it once.
//!
//! **Time** comes only from the shepherd's [`Clock`]. Workers never wait
//! for a time: they sleep on [`Shared::work`] until a record is due. The
//! timer thread sleeps until the earliest due time or attempt deadline
//! (the seed's `NoWorkUntil(deadline)` / `WakeAt`), promotes what is due,
//! expires late attempts, and sleeps again: nothing polls.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use super::clock::Clock;
use super::handle::{Failure, LastAttempt, Outcome, Reason};
use super::handler::Handler;
use super::policy::{Budget, RetryPolicy, Rng};
use super::queue::{InMemory, Store};
use super::stats::Counters;
use crate::sync::{Arc, AtomicUsize, Condvar, Mutex, Ordering::Relaxed};
use crate::table::Table;

/// Builds a worker's handler; shared by every worker thread.
pub(crate) type Factory<H> = dyn Fn(usize) -> H + Send + Sync;

/// One unit of the table, held from admission to the final outcome and
/// released exactly once: by [`Unit::release`], or by `Drop` if its record
/// is dropped unresolved.
pub(crate) struct Unit {
    table: Arc<Table>,
    shard: usize,
    held: bool,
}

impl Unit {
    pub(crate) fn new(table: Arc<Table>, shard: usize) -> Self {
        Unit {
            table,
            shard,
            held: true,
        }
    }

    /// Gives the unit back; `panicked` counts it in `Stats::panicked`.
    fn release(mut self, panicked: bool) {
        self.held = false;
        self.table.release(self.shard, panicked);
    }
}

impl Drop for Unit {
    fn drop(&mut self) {
        if self.held {
            self.table.release(self.shard, false);
        }
    }
}

/// An admitted operation and everything the shepherd keeps about it.
pub(crate) struct Record<H: Handler> {
    pub(crate) op: Arc<H::Op>,
    /// Attempts started so far.
    pub(crate) attempts: u32,
    pub(crate) last: LastAttempt<H::Error>,
    pub(crate) reply: oneshot::Sender<Outcome<H::Output, H::Error>>,
    pub(crate) unit: Unit,
    pub(crate) submitted: Instant,
}

/// What a worker is running: the attempt's token and its record (taken by
/// the timer if the attempt times out).
pub(crate) type Slot<H> = Option<(u64, Record<H>)>;

/// What `Core` guards.
pub(crate) struct Core<H: Handler> {
    pub(crate) queue: InMemory<Record<H>>,
    pub(crate) budget: Option<Budget>,
    pub(crate) rng: Rng,
    /// `(deadline, worker, token)` of attempts with a timeout, earliest on
    /// top. Entries of attempts that ended in time are skipped when they
    /// come up (their token no longer matches the slot).
    pub(crate) deadlines: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    /// Shutdown has begun: no more delays (see `Shepherd::shutdown`).
    pub(crate) closing: bool,
    /// Attempts whose record is in a slot.
    pub(crate) running: usize,
    /// Workers inside a handler, late attempts included.
    pub(crate) busy: usize,
    /// Worker threads still looping.
    pub(crate) alive: usize,
    /// Workers asleep on their own condition variable, most recent last.
    pub(crate) sleepers: Vec<usize>,
    /// The clock time the timer sleeps until, if it sleeps with one.
    pub(crate) timer_wake: Option<Instant>,
    pub(crate) next_token: u64,
}

/// Everything the front-end, the workers and the timer share.
pub(crate) struct Shared<H: Handler> {
    pub(crate) table: Arc<Table>,
    pub(crate) core: Mutex<Core<H>>,
    /// Worker `i` sleeps on `work[i]` until a record is due. One each, so
    /// a submit wakes one sleeper (`Shared::wake_workers`), not all: the
    /// shim's condition variable only notifies all.
    pub(crate) work: Box<[Condvar]>,
    /// The timer waits here for an earlier time, a clock move or the end.
    pub(crate) timer: Condvar,
    /// `wait_idle` callers wait here.
    pub(crate) idle: Condvar,
    pub(crate) slots: Box<[Mutex<Slot<H>>]>,
    /// Records in the due line, for workers that spin before they sleep.
    /// Written under `Core`.
    pub(crate) due_hint: AtomicUsize,
    pub(crate) counters: Counters,
    pub(crate) policy: RetryPolicy,
    pub(crate) attempt_timeout: Option<Duration>,
    pub(crate) clock: Clock,
    pub(crate) spin: Duration,
    pub(crate) factory: Arc<Factory<H>>,
}

impl<H: Handler> Shared<H> {
    /// Completes `record` with `outcome`: the unit goes back first, then
    /// the caller hears. Never under `Core`.
    pub(crate) fn finish(&self, record: Record<H>, outcome: Outcome<H::Output, H::Error>) {
        let Record {
            unit,
            reply,
            submitted,
            ..
        } = record;
        let panicked = matches!(&outcome, Err(f) if matches!(f.last(), LastAttempt::Panicked));
        let succeeded = outcome.is_ok();
        unit.release(panicked);
        self.counters.resolved(
            succeeded,
            self.clock.now().saturating_duration_since(submitted),
        );
        // A caller that dropped its handle is owed nothing more.
        let _ = reply.send(outcome);
    }

    /// After a failed attempt whose record is back in hand: schedules the
    /// retry, or returns the record and its final failure for
    /// [`finish`](Self::finish) (outside the lock). Under `Core`.
    pub(crate) fn decide(
        &self,
        core: &mut Core<H>,
        mut record: Record<H>,
        last: LastAttempt<H::Error>,
        retryable: bool,
        now: Instant,
    ) -> Option<(Record<H>, Failure<H::Error>)> {
        let reason = if !retryable {
            Some(Reason::NotRetryable)
        } else if record.attempts >= self.policy.attempts() {
            Some(Reason::Exhausted)
        } else if core.closing {
            // No more delays once shutdown has begun.
            Some(Reason::Shutdown)
        } else if !core
            .budget
            .as_mut()
            .map_or(true, |budget| budget.withdraw(now))
        {
            self.counters.budget_refused();
            Some(Reason::BudgetExhausted)
        } else {
            None
        };
        if let Some(reason) = reason {
            let failure = Failure::new(reason, last, record.attempts);
            return Some((record, failure));
        }
        record.last = last;
        let delay = self.policy.delay(record.attempts, &mut core.rng);
        self.counters.retry();
        self.schedule(core, record, now.checked_add(delay).unwrap_or(now), now);
        None
    }

    /// Queues `record`, due at `due`, and wakes whoever must act: a worker
    /// if it is due now, the timer if it is due before the timer wakes.
    pub(crate) fn schedule(
        &self,
        core: &mut Core<H>,
        record: Record<H>,
        due: Instant,
        now: Instant,
    ) {
        core.queue.push(record, due, now);
        if due <= now {
            self.set_due_hint(core);
            self.wake_workers(core, 1);
        } else if core.timer_wake.map_or(true, |wake| due < wake) {
            self.timer.notify_all();
        }
    }

    /// Publishes the due count to spinning workers. Under `Core`.
    pub(crate) fn set_due_hint(&self, core: &Core<H>) {
        // Relaxed: a hint only; a worker that reads it non-zero takes
        // `Core`, which orders the queue itself.
        self.due_hint.store(core.queue.due(), Relaxed);
    }

    /// Moves what is due by `now` to the due line and wakes a worker per
    /// record moved. Under `Core`.
    pub(crate) fn promote(&self, core: &mut Core<H>, now: Instant) {
        let moved = core.queue.promote(now);
        if moved > 0 {
            self.set_due_hint(core);
            self.wake_workers(core, moved);
        }
    }

    /// Wakes up to `count` sleeping workers, the most recent sleepers first
    /// (their caches are warmest). Under `Core`: a worker registers as a
    /// sleeper and waits under it, so none sleeps through its wake-up.
    pub(crate) fn wake_workers(&self, core: &mut Core<H>, count: usize) {
        for _ in 0..count {
            let Some(worker) = core.sleepers.pop() else {
                return;
            };
            self.work[worker].notify_all();
        }
    }

    /// True when nothing is due and no attempt runs (delayed records may
    /// wait). Under `Core`.
    pub(crate) fn is_idle(core: &Core<H>) -> bool {
        core.queue.due() == 0 && core.running == 0
    }
}
