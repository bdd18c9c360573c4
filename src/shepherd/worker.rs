//! The worker loop (take a due operation, attempt it under `catch_unwind`,
//! complete it or hand it to the retry decision, recover the handler) and
//! the timer loop (promote what became due, expire late attempts, sleep
//! until the next time).
//!
//! # A late attempt
//!
//! An attempt past the shepherd's `attempt_timeout` cannot be stopped: Rust
//! has no safe way to kill a thread. At the deadline the timer takes the
//! record from the worker's slot, so the operation is retried (by another
//! worker) or failed at once, and its caller does not wait for the stuck
//! thread. The worker is *waited for*, not replaced: it stays busy until
//! the late attempt returns, its result is dropped, and its handler is
//! rebuilt (a timed-out resource is suspect). Replacing it would start a
//! second handler, and so a second connection, while the first still holds
//! its resource: the shepherd exists to bound exactly those, and a
//! resource that hangs would make it open one more per timeout, without
//! limit. The cost is visible instead: `busy` counts the stuck worker, and
//! if every worker hangs nothing more runs until one returns.
//!
//! # A retry due at once
//!
//! A failed attempt whose retry has no backoff (a policy with a zero
//! backoff, or a jitter draw of zero) is attempted next by the worker that
//! just failed it, before it takes anything from the line: the record
//! stays in its hands, counted open, and is never requeued. Put at the back
//! of the line instead, the oldest operation the worker knows of would wait
//! behind every newer one: with a line as long as the capacity (a
//! submitter keeping the shepherd full), a caller waiting for its results
//! in submission order then waits on the retry while the line drains, and
//! the workers run dry before it submits again (the throughput bench lost
//! that way). The retry decision is the same (the attempt count, the
//! budget, shutdown, all under `Core`), and shutdown's rule holds: a retry
//! decided before it is due, like an operation on the line, and runs; one
//! decided after it is final. A late attempt's retry is the exception: the
//! timer runs no attempts, so it puts that one on the line.

use std::any::Any;
use std::cmp::Reverse;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use super::handle::LastAttempt;
use super::handler::{Handler, Recovery};
use super::queue::Store;
use super::state::{Decision, Record, Shared};
use crate::engine::foreign::{drop_payload, drop_quietly};
use crate::sync::Arc;

/// How long the timer waits when it has no deadline: it re-checks after a
/// spurious wake-up anyway.
const LONG: Duration = Duration::from_secs(3600);

/// The most completed records a worker keeps before it counts them out of
/// the due line (line.rs, "Counting out in runs"): one RMW per run that
/// long at least, and a bound on how far the open count runs ahead of
/// what is in hand while the line never runs dry.
const RUN: usize = 32;

/// One attempt handed to a worker: its record in hand, or (with an
/// attempt timeout) in the worker's slot, where the timer may take it, and
/// the operation shared.
enum Job<H: Handler> {
    InHand(Record<H>),
    InSlot {
        token: u64,
        op: Arc<H::Op>,
        attempt: u32,
    },
}

/// What the worker loop still owes after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    /// Completed with its output, everything counted ([`WorkerLoop::succeeded`]).
    Done,
    /// The record was in hand: completed with a failure or delayed (the
    /// loop counts the worker free, the attempt stopped and the record out
    /// of the open count), or kept for a retry due at once (still counted
    /// open: only the worker and the attempt are counted).
    Held,
    /// The timer took the record at its deadline (and counted it): only
    /// the worker is free again.
    TimedOut,
}

/// One worker thread's loop.
pub(crate) struct WorkerLoop<H: Handler> {
    pub(crate) index: usize,
    pub(crate) shared: Arc<Shared<H>>,
}

impl<H: Handler> WorkerLoop<H> {
    pub(crate) fn run(self) {
        let shared = &*self.shared;
        let mut state = self.build();
        let mut token = 0;
        // A retry due at once, kept for this worker's next attempt (module
        // docs, "A retry due at once").
        let mut again = None;
        while let Some(job) = self.next(&mut token, again.take()) {
            // Nothing one attempt does may end the loop: a dead worker
            // would strand its slot. Handlers and user drops are caught
            // inside `attempt`; this is the backstop.
            let attempt = catch_unwind(AssertUnwindSafe(|| {
                self.attempt(&mut state, job, &mut again)
            }));
            let after = match attempt {
                Ok(after) => after,
                Err(payload) => {
                    drop_payload(payload);
                    // Whatever unwound, a kept retry has not been set
                    // aside: `failed` keeps it last, after any user code.
                    After::Held
                }
            };
            if after == After::Done {
                continue;
            }
            shared.counters.free(self.index);
            if after == After::Held {
                shared.counters.stopped(self.index);
                if again.is_none() {
                    // The record is completed or delayed by now (state.rs,
                    // "Counts"). Its SeqCst decrement also publishes the
                    // figures above to whoever sees the shepherd idle. A
                    // kept retry stays counted open: it is still in hand.
                    shared.work_done();
                }
            }
        }
        {
            let mut core = shared.core.lock();
            core.alive -= 1;
            shared.timer.notify_all();
            shared.idle.notify_all();
        }
        if let Some(mut handler) = state {
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| handler.terminate())) {
                drop_payload(payload);
            }
            drop_quietly(handler);
        }
    }

    /// The next attempt: the retry `again` if this worker kept one, else
    /// from the due line (which spins, then sleeps, when it is empty);
    /// with an attempt timeout, installed in this worker's slot. `None`
    /// once shutdown has begun and nothing is due.
    fn next(&self, token: &mut u64, again: Option<Record<H>>) -> Option<Job<H>> {
        let shared = &*self.shared;
        let mut record = match again {
            Some(record) => record,
            None => self.take()?,
        };
        shared.counters.attempt(self.index);
        record.attempts += 1;
        let Some(timeout) = shared.attempt_timeout else {
            return Some(Job::InHand(record));
        };
        *token += 1;
        let (op, shared_op) = record.op.share();
        record.op = op;
        let job = Job::InSlot {
            token: *token,
            op: shared_op,
            attempt: record.attempts,
        };
        match shared.clock.now().checked_add(timeout) {
            Some(deadline) => {
                // The deadline and the slot together under `Core`, where
                // the timer looks for both.
                let mut core = shared.core.lock();
                core.deadlines.push(Reverse((deadline, self.index, *token)));
                if core.timer_wake.map_or(true, |wake| deadline < wake) {
                    shared.timer.notify_all();
                }
                *shared.slots[self.index].lock() = Some((*token, record));
            }
            // A timeout past what an `Instant` holds: none, in effect.
            None => *shared.slots[self.index].lock() = Some((*token, record)),
        }
        Some(job)
    }

    /// The next record from the line. While the line has one at once,
    /// the count-outs of the records this worker completed are kept for
    /// a run, up to [`RUN`]; before a take that may spin, sleep or leave
    /// they are made, in one RMW (line.rs, "Counting out in runs").
    fn take(&self) -> Option<Record<H>> {
        let shared = &*self.shared;
        if let Some(record) = shared.line.try_take() {
            if shared.counters.kept(self.index) >= RUN {
                self.count_out();
            }
            return Some(record);
        }
        self.count_out();
        shared.line.take(self.index, shared.spin)
    }

    /// Counts out of the due line the completed records this worker kept.
    fn count_out(&self) {
        let n = self.shared.counters.take_kept(self.index);
        if n > 0 {
            self.shared.work_done_many(n);
        }
    }

    /// Runs one attempt and deals with its outcome; what is left to count
    /// (see [`After`]).
    fn attempt(&self, state: &mut Option<H>, job: Job<H>, again: &mut Option<Record<H>>) -> After {
        let shared = &*self.shared;
        if state.is_none() {
            *state = self.build();
        }
        let (op, attempt) = match &job {
            Job::InHand(record) => (record.op.get(), record.attempts),
            Job::InSlot { op, attempt, .. } => (&**op, *attempt),
        };
        // Stamps, not the precise clock: the figure is a sum (see `Stamps`),
        // and two precise reads would be a good part of a short attempt.
        let started = shared.stamps.now();
        let result = match state.as_mut() {
            Some(handler) => catch_unwind(AssertUnwindSafe(|| handler.handle(op, attempt))),
            // The factory panicked: this attempt fails as a panic would.
            None => Err(Box::new("the factory panicked") as Box<dyn Any + Send>),
        };
        let ended = shared.stamps.now();
        shared
            .counters
            .processed(self.index, ended.saturating_sub(started));
        let taken = match job {
            Job::InHand(record) => Some(record),
            Job::InSlot { token, .. } => {
                take_running(&mut shared.slots[self.index].lock(), token).map(|(_, record)| record)
            }
        };
        let Some(record) = taken else {
            // Timed out: the timer has dealt with the operation. The late
            // result is dropped, and the handler rebuilt (module docs).
            if let Err(payload) = result {
                drop_payload(payload);
            } else {
                drop_quietly(result);
            }
            self.rebuild(state);
            return After::TimedOut;
        };
        // From here until the record is finished or stored, if anything
        // unwinds, the record is dropped: its handle resolves and its unit
        // goes back (state.rs, "Where an operation is").
        match result {
            Ok(Ok(output)) => {
                self.succeeded(record, output, ended);
                return After::Done;
            }
            Ok(Err(error)) => {
                let handler = state.as_mut();
                let verdict = catch_unwind(AssertUnwindSafe(|| {
                    handler.map(|h| (h.is_retryable(&error), h.recover(&error)))
                }));
                let (retryable, recovery) = match verdict {
                    Ok(Some(verdict)) => verdict,
                    Ok(None) => (true, Recovery::Rebuild),
                    Err(payload) => {
                        drop_payload(payload);
                        (true, Recovery::Rebuild)
                    }
                };
                if recovery == Recovery::Rebuild {
                    self.rebuild(state);
                }
                self.failed(record, LastAttempt::Error(error), retryable, again);
            }
            Err(payload) => {
                drop_payload(payload);
                shared.counters.panicked(self.index);
                self.rebuild(state);
                let retryable = shared.policy.retries_panics();
                self.failed(record, LastAttempt::Panicked, retryable, again);
            }
        }
        After::Held
    }

    /// A successful attempt, ended at `ended` (a stamp): the common case,
    /// in the order that lets the caller go on soonest. Every figure is
    /// counted, then the caller hears, its unit travelling with the output
    /// (the handle gives it back as it hands the output over: state.rs,
    /// "Where a unit goes back"), then the record's count-out is kept for
    /// this worker's run (so a `wait_idle` that returns finds every handle
    /// of a completed operation resolved, and the figures published by the
    /// SeqCst decrement that ends the run). The user's drops come last,
    /// and nothing here may unwind (the loop would count the record out
    /// twice).
    fn succeeded(&self, record: Record<H>, output: H::Output, ended: u64) {
        let shared = &*self.shared;
        let Record {
            op,
            last,
            reply,
            unit,
            submitted,
            ..
        } = record;
        let unit = shared.travelling(unit);
        shared
            .counters
            .resolved(self.index, true, ended.saturating_sub(submitted));
        shared.counters.free(self.index);
        shared.counters.stopped(self.index);
        // A caller that dropped its handle is owed nothing more; the
        // unsent output is dropped here, quietly, and the unit with it
        // goes back.
        drop_quietly(reply.send((Ok(output), unit)));
        shared.counters.keep(self.index);
        drop_quietly((op, last));
    }

    /// A failed attempt: retry or finish, as [`Shared::decide`] says; a
    /// retry due at once is kept in `again`, for this worker's next
    /// attempt (module docs, "A retry due at once").
    fn failed(
        &self,
        record: Record<H>,
        last: LastAttempt<H::Error>,
        retryable: bool,
        again: &mut Option<Record<H>>,
    ) {
        let shared = &*self.shared;
        let now = shared.clock.now();
        let decision = {
            let mut core = shared.core.lock();
            // It drops the previous attempt's error: user code.
            shared.decide(&mut core, record, last, retryable, now, self.index)
        };
        match decision {
            Decision::Final(record, failure) => shared.finish(record, Err(failure), self.index),
            Decision::Later => {}
            // Last: nothing after this may unwind, or the loop would count
            // out a record it still holds.
            Decision::Now(record) => *again = Some(record),
        }
    }

    /// Drops the handler (a restart) and builds a fresh one.
    fn rebuild(&self, state: &mut Option<H>) {
        drop_quietly(state.take());
        *state = self.build();
    }

    /// Calls the factory; `None` if it panicked (tried again before the
    /// next attempt, which fails as a panic if it panics again).
    fn build(&self) -> Option<H> {
        match catch_unwind(AssertUnwindSafe(|| (self.shared.factory)(self.index))) {
            Ok(handler) => Some(handler),
            Err(payload) => {
                drop_payload(payload);
                None
            }
        }
    }
}

/// The timer loop: promotes delayed records as they become due, expires
/// attempts past their deadline, and sleeps until the next of those times
/// (or until the clock moves, for a manual clock). Ends once shutdown has
/// begun and every worker has left.
pub(crate) fn run_timer<H: Handler>(shared: &Shared<H>) {
    let mut core = shared.core.lock();
    loop {
        let now = shared.clock.now();
        shared.promote(&mut core, now);
        let mut finals = Vec::new();
        while let Some(&std::cmp::Reverse((deadline, worker, token))) = core.deadlines.peek() {
            if deadline > now {
                break;
            }
            core.deadlines.pop();
            let taken = take_running(&mut shared.slots[worker].lock(), token);
            if let Some((_, record)) = taken {
                let cell = shared.counters.shared_cell();
                shared.counters.timed_out(cell);
                shared.counters.stopped(worker);
                let retryable = shared.policy.retries_timeouts();
                let decision = shared.decide(
                    &mut core,
                    record,
                    LastAttempt::TimedOut,
                    retryable,
                    now,
                    cell,
                );
                let last = match decision {
                    Decision::Final(record, failure) => Some((record, failure)),
                    Decision::Later => None,
                    // The timer runs no attempts: on the line it goes.
                    Decision::Now(record) => shared.requeue(record),
                };
                if let Some(last) = last {
                    finals.push(last);
                }
                // Out of the slot, after the requeue if any (state.rs,
                // "Counts"). A final failure is completed below, after
                // the open count fell: its caller may see `wait_idle` answer a
                // moment before its handle resolves, as with any
                // completion.
                shared.work_done_locked();
            }
        }
        if !finals.is_empty() {
            drop(core);
            let cell = shared.counters.shared_cell();
            for (record, failure) in finals {
                shared.finish(record, Err(failure), cell);
            }
            core = shared.core.lock();
            continue;
        }
        if core.closing && core.alive == 0 {
            return;
        }
        let next = [
            core.queue.next_due(),
            core.deadlines.peek().map(|entry| entry.0 .0),
        ]
        .into_iter()
        .flatten()
        .min();
        core.timer_wake = next;
        let until = next
            .and_then(|next| shared.clock.wake_at(next))
            .unwrap_or_else(|| crate::sync::now() + LONG);
        (core, _) = shared.timer.wait_until(core, until);
        core.timer_wake = None;
    }
}

/// The record of attempt `token` out of its slot, if it is still there
/// (`Option::take_if`, which needs Rust 1.80).
fn take_running<R>(slot: &mut Option<(u64, R)>, token: u64) -> Option<(u64, R)> {
    match slot {
        Some((running, _)) if *running == token => slot.take(),
        _ => None,
    }
}
