//! The shepherd's shared state and its one decision: after an attempt
//! fails, retry the operation later or complete it with its final failure.
//!
//! # Implementation details
//!
//! **Where an operation is.** Every admitted operation is a [`Record`] that
//! owns its unit of capacity ([`Unit`]) and the sender of its completion.
//! At any moment a record is in exactly one place: the due line, the delay
//! heap, a worker's hands while an attempt runs (its [`Slot`] instead when
//! an attempt timeout lets the timer take it), or the hands of the thread
//! resolving it. A record leaves the system only through
//! [`Shared::finish`] (or a worker's own success path), which sends the
//! outcome to the caller's handle, the unit with it (or, with
//! [`UnitRelease::OnCompletion`], given back just before). A record dropped
//! any other way (a refusal after admission, or user code unwinding while
//! a worker holds it) still resolves its handle (`Reason::Shutdown`, from
//! the dropped sender) and still gives its unit back: the unit is a guard.
//!
//! **Where a unit goes back.** A unit goes back to its shard when it is
//! dropped, once, wherever that is. By default ([`UnitRelease::OnHandOver`])
//! that is the caller's thread: the unit travels with the outcome ([`Delivery`]), and
//! the handle drops it as it hands the outcome over, before the caller has
//! it (so a caller that submits again at once never meets its own stale
//! unit). The shard's counter is then written by the submit and by the
//! caller's read of the outcome, usually one thread, so its cache line
//! stays on that core; given back by the worker, it crossed to the worker
//! and back on every operation (the throughput bench ran about a tenth
//! faster, and the round trip about a tenth quicker, once it stopped,
//! `benches/results/`). A handle dropped before the outcome comes makes
//! the send fail, and the unit goes back on the sending thread; one
//! dropped with the outcome in drops the unit with it. To give itself
//! back, a unit holds its shard's [`Home`] (the table and the shard index;
//! a second home per shard counts a panic's unit as one): an allocation
//! per home, so the reference count that a submit and a drop change is
//! shared only by the threads that use that shard, as the shard's counter
//! is, not by every submitter of the shepherd. The unit is that one
//! pointer: a record is copied into the due line and out again, and eight
//! bytes more of it cost the throughput bench 3–5 %.
//!
//! **Where it waits.** An operation due now waits on the lock-free due
//! [`Line`] (`line.rs`, which also holds the workers' sleep/wake
//! protocol); one not yet due waits in the delay heap under [`Core`], and
//! the timer moves it to the line when its time comes. A submit and a
//! worker's take touch only the line and atomics: an operation that
//! succeeds at once takes no lock (its worker's slot lock, uncontended, only
//! with an attempt timeout).
//!
//! **Locks.** [`Core`] guards the delay heap, the jitter RNG, the attempt
//! deadlines and the shutdown flag; the retry budget has a small lock of
//! its own (each submit deposits, each retry withdraws under `Core`: the
//! order is always `Core`, then budget). Each worker's slot has a lock of
//! its own, taken by its worker alone or by the timer under `Core`; never
//! the other way round. The line's sleepers lock is taken under `Core`
//! (a retry or promotion that wakes a worker) or alone, and takes no other
//! lock. The admission table is called with or without `Core` held; it
//! never calls back.
//!
//! **Counts.** The line's open count (line.rs, "The state word") counts
//! the records on the line or in a slot: it goes up with the reservation
//! that puts a record on the line (a submit, a promotion, the timer's
//! requeue of a late attempt's retry) and down once a record leaves a
//! slot for anywhere but the line (completed, or delayed) or is requeued
//! (after the new reservation is in). Moving from the line to a slot
//! changes nothing, and neither does a failed attempt whose retry is due
//! at once: its worker keeps the record, still counted, and attempts it
//! next (worker.rs, "A retry due at once"). A worker may keep the
//! count-outs of the records it completed while it finds more on the line
//! and make them in one decrement before it can sleep (line.rs,
//! "Counting out in runs"). So it is zero exactly when nothing is due, no
//! attempt runs and no worker keeps a count-out, read by
//! [`Shared::is_idle`], and whoever brings it to zero notifies `idle`
//! under `Core`, where `wait_idle` checks and sleeps. It is the line's
//! state word itself, so a submit makes one RMW on one shared cache line,
//! and a worker one per run of records it completed (none when it takes
//! one). The figures `running`, `busy` and the count-outs kept are
//! per-worker counts in [`Counters`], read without ordering; the `due`
//! figure is the open count less the other two.
//!
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use super::clock::{Clock, Stamps};
use super::handle::{Delivery, Failure, LastAttempt, Outcome, Reason, UnitRelease};
use super::handler::Handler;
use super::line::Line;
use super::policy::{Budget, RetryPolicy, Rng};
use super::queue::{InMemory, Store};
use super::stats::Counters;
use super::unit::{Homes, Unit};
use crossbeam_utils::CachePadded;

use crate::engine::foreign::drop_quietly;
use crate::engine::table::Table;
use crate::sync::{Arc, AtomicUsize, Condvar, Mutex, Ordering::SeqCst};

/// Builds a worker's handler; shared by every worker thread.
pub(crate) type Factory<H> = dyn Fn(usize) -> H + Send + Sync;

/// An operation as its record holds it: owned, or shared with the worker
/// running it once an attempt timeout may hand the record to the timer
/// while the attempt still reads the operation. Without a timeout no
/// attempt outlives its worker's hold on the record, so the common case
/// allocates nothing for it.
pub(crate) enum OpBox<T> {
    Owned(T),
    Shared(Arc<T>),
}

impl<T> OpBox<T> {
    pub(crate) fn get(&self) -> &T {
        match self {
            OpBox::Owned(op) => op,
            OpBox::Shared(op) => op,
        }
    }

    /// The operation behind an `Arc` (made on the first call), and the box
    /// that now shares it.
    pub(crate) fn share(self) -> (Self, Arc<T>) {
        let shared = match self {
            OpBox::Owned(op) => Arc::new(op),
            OpBox::Shared(op) => op,
        };
        (OpBox::Shared(Arc::clone(&shared)), shared)
    }
}

/// An admitted operation and everything the shepherd keeps about it.
pub(crate) struct Record<H: Handler> {
    pub(crate) op: OpBox<H::Op>,
    /// Attempts started so far.
    pub(crate) attempts: u32,
    pub(crate) last: LastAttempt<H::Error>,
    pub(crate) reply: oneshot::Sender<Delivery<H::Output, H::Error>>,
    pub(crate) unit: Unit,
    /// When it was submitted, a stamp of [`Shared::stamps`].
    pub(crate) submitted: u64,
}

/// What a worker is running: the attempt's token and its record (taken by
/// the timer if the attempt times out).
pub(crate) type Slot<H> = Option<(u64, Record<H>)>;

/// What [`Shared::decide`] made of a failed attempt.
pub(crate) enum Decision<H: Handler> {
    /// No more attempts: complete the record with this failure
    /// ([`Shared::finish`], outside `Core`).
    Final(Record<H>, Failure<H::Error>),
    /// The retry waits in the delay heap.
    Later,
    /// The retry is due at once (no backoff). The record stays in the
    /// caller's hands and counted open: a worker attempts it next itself
    /// (worker.rs, "A retry due at once"); the timer puts it on the line
    /// ([`Shared::requeue`]).
    Now(Record<H>),
}

/// What `Core` guards.
pub(crate) struct Core<H: Handler> {
    /// Operations not yet due (a delay or a retry's backoff).
    pub(crate) queue: InMemory<Record<H>>,
    pub(crate) rng: Rng,
    /// `(deadline, worker, token)` of attempts with a timeout, earliest on
    /// top. Entries of attempts that ended in time are skipped when they
    /// come up (their token no longer matches the slot).
    pub(crate) deadlines: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    /// Shutdown has begun: no more delays (see `Shepherd::shutdown`). Set
    /// together with closing the line, under this lock.
    pub(crate) closing: bool,
    /// Worker threads still looping.
    pub(crate) alive: usize,
    /// The clock time the timer sleeps until, if it sleeps with one.
    pub(crate) timer_wake: Option<Instant>,
}

/// Everything the front-end, the workers and the timer share.
pub(crate) struct Shared<H: Handler> {
    pub(crate) table: Arc<Table>,
    /// Where the units of each shard go back (see [`Home`]).
    pub(crate) homes: Homes,
    /// Whether a unit travels with its outcome or goes back at completion.
    pub(crate) unit_release: UnitRelease,
    /// The operations due now, and the workers' sleep/wake protocol.
    pub(crate) line: Line<Record<H>>,
    pub(crate) core: Mutex<Core<H>>,
    /// The retry budget, if the policy has one; on cache lines of its
    /// own, as every submit writes it and the workers read the fields
    /// around it.
    pub(crate) budget: Option<CachePadded<Mutex<Budget>>>,
    /// The timer waits here for an earlier time, a clock move or the end.
    pub(crate) timer: Condvar,
    /// `wait_idle` callers wait here.
    pub(crate) idle: Condvar,
    /// `wait_idle` callers checking or asleep: only then does a worker
    /// that leaves the shepherd idle take `Core` to notify them.
    pub(crate) idle_waiters: AtomicUsize,
    pub(crate) slots: Box<[Mutex<Slot<H>>]>,
    pub(crate) counters: Counters,
    pub(crate) policy: RetryPolicy,
    pub(crate) attempt_timeout: Option<Duration>,
    pub(crate) clock: Clock,
    /// The time stamps of the turnaround and processing figures (see
    /// [`Stamps`]).
    pub(crate) stamps: Stamps,
    pub(crate) spin: Duration,
    pub(crate) factory: Arc<Factory<H>>,
}

impl<H: Handler> Shared<H> {
    /// Completes `record` with `outcome`, counted in counter cell `cell`:
    /// the outcome goes to the caller with the record's unit, which the
    /// caller's handle gives back as it hands the outcome over (or here,
    /// if the handle is gone). Never under `Core`.
    pub(crate) fn finish(
        &self,
        record: Record<H>,
        outcome: Outcome<H::Output, H::Error>,
        cell: usize,
    ) {
        let Record {
            mut unit,
            reply,
            submitted,
            ..
        } = record;
        if matches!(&outcome, Err(f) if matches!(f.last(), LastAttempt::Panicked)) {
            self.homes.count_as_panic(&mut unit);
        }
        let unit = self.travelling(unit);
        let took = self.stamps.now().saturating_sub(submitted);
        self.counters.resolved(cell, outcome.is_ok(), took);
        // A caller that dropped its handle is owed nothing more: the
        // delivery comes back, and its unit goes back as it is dropped.
        drop_quietly(reply.send((outcome, unit)));
    }

    /// A completed record's unit: given back here and now with
    /// [`UnitRelease::OnCompletion`], or to travel with the outcome.
    #[inline]
    pub(crate) fn travelling(&self, unit: Unit) -> Option<Unit> {
        match self.unit_release {
            UnitRelease::OnHandOver => Some(unit),
            UnitRelease::OnCompletion => {
                drop(unit);
                None
            }
        }
    }

    /// A first attempt was submitted at stamp `now`: a deposit in the
    /// budget.
    pub(crate) fn deposit(&self, now: u64) {
        if let Some(budget) = &self.budget {
            budget.lock().deposit(self.stamps.instant(now));
        }
    }

    /// After a failed attempt whose record is back in hand: the final
    /// failure, a retry stored in the delay heap, or a retry due at once,
    /// handed back to the caller (see [`Decision::Now`]). Under `Core`;
    /// counted in counter cell `cell`.
    pub(crate) fn decide(
        &self,
        core: &mut Core<H>,
        mut record: Record<H>,
        last: LastAttempt<H::Error>,
        retryable: bool,
        now: Instant,
        cell: usize,
    ) -> Decision<H> {
        let reason = if !retryable {
            Some(Reason::NotRetryable)
        } else if record.attempts >= self.policy.attempts() {
            Some(Reason::Exhausted)
        } else if core.closing {
            // No more delays once shutdown has begun.
            Some(Reason::Shutdown)
        } else if !self
            .budget
            .as_ref()
            .map_or(true, |budget| budget.lock().withdraw(now))
        {
            self.counters.budget_refused(cell);
            Some(Reason::BudgetExhausted)
        } else {
            None
        };
        if let Some(reason) = reason {
            let failure = Failure::new(reason, last, record.attempts);
            return Decision::Final(record, failure);
        }
        record.last = last;
        let delay = self.policy.delay(record.attempts, &mut core.rng);
        self.counters.retry(cell);
        let due = now.checked_add(delay).unwrap_or(now);
        if due <= now {
            return Decision::Now(record);
        }
        self.delay(core, record, due);
        Decision::Later
    }

    /// Puts a retry due at once ([`Decision::Now`]) on the line, for a
    /// caller that cannot attempt it itself (the timer). Under `Core`; the
    /// record and its final failure back if the line is closed (not
    /// reached: the line closes with `closing`, which `decide` checked
    /// under the same lock).
    pub(crate) fn requeue(&self, record: Record<H>) -> Option<(Record<H>, Failure<H::Error>)> {
        match self.enqueue(record) {
            Ok(()) => None,
            Err(mut record) => {
                let last = std::mem::replace(&mut record.last, LastAttempt::None);
                let attempts = record.attempts;
                Some((record, Failure::new(Reason::Shutdown, last, attempts)))
            }
        }
    }

    /// Counts a record in (due and held), then puts it on the line; the
    /// record back (and nothing counted) if the line is closed.
    pub(crate) fn enqueue(&self, record: Record<H>) -> Result<(), Record<H>> {
        if !self.reserve() {
            return Err(record);
        }
        self.line.publish(record);
        Ok(())
    }

    /// Counts one record in (due and held, one RMW) and reserves its
    /// place on the line; false (nothing counted) if the line is closed.
    /// It never is for a caller under `Core` (the line closes under
    /// `Core`, with `closing`, which those callers check), so only the
    /// submit, which does not hold `Core`, can meet the failure.
    #[inline]
    pub(crate) fn reserve(&self) -> bool {
        self.line.reserve()
    }

    /// [`reserve`](Self::reserve), answering the due count it made; `None`
    /// if the line is closed.
    #[inline]
    pub(crate) fn reserve_due(&self) -> Option<usize> {
        self.line.reserve_due()
    }

    /// A record left the line and the slots for good (completed, or
    /// delayed), or the timer requeued it after its new reservation went in: counts
    /// it out of the open count, and notifies `wait_idle` if that made the
    /// shepherd idle. Not under `Core`.
    #[inline]
    pub(crate) fn work_done(&self) {
        self.work_done_many(1);
    }

    /// [`work_done`](Self::work_done) for `n` records at once, in one
    /// RMW (line.rs, "Counting out in runs").
    #[inline]
    pub(crate) fn work_done_many(&self, n: usize) {
        // The line's SeqCst decrement: one order with `wait_idle`'s
        // increment of `idle_waiters` and its idle check (see
        // `notify_if_idle`).
        if self.line.finish_many(n) {
            self.notify_if_idle();
        }
    }

    /// Puts `record` in the delay heap, due at `due`, and wakes the timer
    /// if it is due before the timer wakes. Under `Core`.
    pub(crate) fn delay(&self, core: &mut Core<H>, record: Record<H>, due: Instant) {
        core.queue.push(record, due);
        if core.timer_wake.map_or(true, |wake| due < wake) {
            self.timer.notify_all();
        }
    }

    /// Moves what is due by `now` from the delay heap to the line (each
    /// push wakes a sleeping worker). Under `Core`.
    pub(crate) fn promote(&self, core: &mut Core<H>, now: Instant) {
        while let Some(record) = core.queue.pop_due(now) {
            if let Err(record) = self.enqueue(record) {
                // Not reached: shutdown empties the heap as it closes the
                // line, under `Core`. Its unit goes back; dropped, the
                // record resolves its handle (module docs).
                debug_assert!(false, "a promotion after shutdown");
                drop(record);
            }
        }
    }

    /// [`work_done`](Self::work_done) for a caller holding `Core`.
    pub(crate) fn work_done_locked(&self) {
        // The line's SeqCst decrement, as in `work_done`.
        if self.line.finish() {
            // `Core` is held: `wait_idle` is checking or asleep.
            self.idle.notify_all();
        }
    }

    /// Operations due and waiting for a worker: the line's open count,
    /// less those in workers' hands (`running`) and those completed whose
    /// count-outs the workers keep for a run (line.rs). Read one after
    /// the other, without ordering: a figure.
    pub(crate) fn due(&self) -> usize {
        let (running, _, kept) = self.counters.in_hand();
        self.line.open().saturating_sub(running + kept)
    }

    /// True when nothing is due, no attempt runs and no worker keeps a
    /// count-out (delayed records may wait); see the module docs,
    /// "Counts".
    pub(crate) fn is_idle(&self) -> bool {
        // The line's SeqCst load: in one order with the SeqCst changes of
        // the open count, and after `wait_idle`'s increment (see
        // `notify_if_idle`).
        self.line.is_idle()
    }

    /// Notifies `wait_idle` callers if there are any and the shepherd is
    /// idle now. Call it after a change that may have made it so (a
    /// `SeqCst` decrement of the open count), not under `Core`.
    pub(crate) fn notify_if_idle(&self) {
        // SeqCst: a store→load pair with `wait_idle` (its SeqCst increment
        // of `idle_waiters`, then its `is_idle` load): in the single order
        // of SeqCst operations, either this load sees the waiter, or the
        // waiter's load comes after the caller's decrement.
        if self.idle_waiters.load(SeqCst) > 0 && self.is_idle() {
            // Under `Core`: `wait_idle` checks and sleeps under it, so it
            // either sees this change or is asleep for this notification.
            let _core = self.core.lock();
            self.idle.notify_all();
        }
    }
}
