//! Waiting for a busy key: a blocked thread on a condition variable, or a future; first come first served per key, bounded by `max_waiters` and `max_wait`, a dropped future passing on a count handed to it.

use super::{KeySet, KeySlot, ShardState};
use crate::error::Error;
use crate::sync::{now, Arc, Condvar, Ordering::Relaxed};
use std::task::Waker;
use std::time::Instant;

pub(super) struct Waiter {
    pub(super) ticket: u64,
    pub(super) wake: Option<Wake>,
    /// When the deadline watcher expires it (async waiters only).
    #[cfg_attr(loom, allow(dead_code))]
    pub(super) deadline: Option<Instant>,
    /// Timed out by the watcher: skipped by grants, waiting for its owner
    /// to take it out.
    pub(super) expired: bool,
}

/// How to wake a waiter.
pub(super) enum Wake {
    Thread(Arc<Condvar>),
    Task(Waker),
}

impl Wake {
    pub(super) fn wake(self) {
        match self {
            Wake::Thread(condvar) => condvar.notify_all(),
            Wake::Task(waker) => waker.wake(),
        }
    }
}

/// Where a waiter stands, read under the lock.
pub(super) enum Standing {
    /// Still queued, not expired.
    Queued,
    /// Expired by the watcher (still queued until taken out).
    Expired,
    /// Taken out of the queue by a release: the waiter owns a count.
    Granted,
}

impl KeySet {
    /// True if callers may wait for a busy key (`max_waiters > 0`).
    #[inline]
    pub(crate) fn can_wait(&self) -> bool {
        self.max_waiters > 0
    }

    /// The earlier of `deadline` and `max_wait` from now.
    pub(crate) fn deadline(&self, deadline: Option<Instant>) -> Option<Instant> {
        let own = now().checked_add(self.max_wait);
        match (deadline, own) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Counts a waiter in, unless `max_waiters` wait already.
    pub(super) fn join_waiters(&self) -> bool {
        // Relaxed: a bound on a count; nothing is published through it.
        let before = self.waiting.fetch_add(1, Relaxed);
        if before >= self.max_waiters {
            self.waiting.fetch_sub(1, Relaxed);
            return false;
        }
        // Relaxed: a statistic. The count after this join, which every
        // waiter counted in `waiting` then was part of at once.
        self.peak_waiting.fetch_max(before + 1, Relaxed);
        true
    }

    /// A wait for a key ran out: counted for `Stats::timed_out`.
    pub(super) fn record_timeout(&self) {
        // Relaxed: a count, read by `stats` only.
        self.timed_out.fetch_add(1, Relaxed);
    }

    pub(super) fn leave_waiters(&self) {
        // Relaxed: as in `join_waiters`.
        self.waiting.fetch_sub(1, Relaxed);
    }

    /// Takes a count of a key found busy, waiting (blocking the thread) in
    /// the key's queue until `deadline` (already bounded by `max_wait`:
    /// see [`deadline`](Self::deadline)).
    ///
    /// `KeyBusy` when no more waiters fit, `Timeout` when the wait ran
    /// out, `Shutdown` once closed.
    #[cold]
    pub(crate) fn wait_blocking(
        &self,
        id: u64,
        deadline: Option<Instant>,
    ) -> Result<KeySlot<'_>, Error> {
        if !self.join_waiters() {
            return Err(Error::KeyBusy);
        }
        let result = self.wait_blocking_counted(id, deadline);
        self.leave_waiters();
        if let Err(Error::Timeout) = result {
            self.record_timeout();
        }
        result
    }

    pub(super) fn wait_blocking_counted(
        &self,
        id: u64,
        deadline: Option<Instant>,
    ) -> Result<KeySlot<'_>, Error> {
        let shard = self.shard(id);
        let condvar = Arc::new(Condvar::new());
        let mut state = shard.state.lock();
        // The key may have freed while we allocated.
        let mut wake = Some(Wake::Thread(Arc::clone(&condvar)));
        let ticket = match shard.enqueue(&mut state, id, &mut wake, None) {
            Ok(Some(ticket)) => ticket,
            Ok(None) => return Ok(self.slot(id)),
            Err(err) => return Err(err),
        };
        loop {
            match state.standing(id, ticket) {
                Standing::Granted => return Ok(self.slot(id)),
                Standing::Expired => unreachable_expired(),
                Standing::Queued => {}
            }
            if state.closed {
                // A thread's wake: ours to drop anywhere.
                drop(shard.cancel(&mut state, id, ticket));
                return Err(Error::Shutdown);
            }
            // A deadline too far to represent: wait in long steps.
            let step = deadline.unwrap_or_else(|| now() + std::time::Duration::from_secs(3600));
            let timed_out;
            (state, timed_out) = condvar.wait_until(state, step);
            if timed_out && deadline.is_some_and(|d| now() >= d) {
                if let Standing::Granted = state.standing(id, ticket) {
                    // Handed a count just as time ran out: keep it.
                    return Ok(self.slot(id));
                }
                drop(shard.cancel(&mut state, id, ticket));
                return Err(Error::Timeout);
            }
        }
    }

    /// Takes a count, waiting as a future (never blocking the executor's
    /// thread) if the key is busy and the policy lets it, until `deadline`
    /// (already bounded by `max_wait`). Dropping the future gives up the
    /// wait, releasing a count handed to it meanwhile.
    pub(crate) fn enter_async(&self, id: u64, deadline: Option<Instant>) -> WaitKey<'_> {
        WaitKey {
            set: self,
            id,
            deadline,
            ticket: None,
            done: false,
        }
    }
}

/// Not reachable: only async waiters carry a deadline the watcher expires.
#[cold]
pub(super) fn unreachable_expired() {
    debug_assert!(false, "a blocked waiter was expired by the watcher");
}

/// The future of [`KeySet::enter_async`].
pub(crate) struct WaitKey<'a> {
    pub(super) set: &'a KeySet,
    pub(super) id: u64,
    pub(super) deadline: Option<Instant>,
    /// The ticket while queued (and counted in `KeySet::waiting`).
    pub(super) ticket: Option<u64>,
    /// Resolved: nothing left to clean up.
    pub(super) done: bool,
}

impl<'a> std::future::Future for WaitKey<'a> {
    type Output = Result<KeySlot<'a>, Error>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        let this = self.get_mut();
        if this.done {
            // Polled after completion: a bug in the caller; answer as a
            // closed set would rather than panic.
            return Poll::Ready(Err(Error::Shutdown));
        }
        let set = this.set;
        let shard = set.shard(this.id);
        let id = this.id;
        let Some(ticket) = this.ticket else {
            // First poll: the fast path, then queue.
            match set.try_enter(id) {
                Err(Error::KeyBusy) if set.max_waiters > 0 => {}
                other => {
                    this.done = true;
                    return Poll::Ready(other);
                }
            }
            if !set.join_waiters() {
                this.done = true;
                return Poll::Ready(Err(Error::KeyBusy));
            }
            let deadline = this.deadline;
            // Cloned before the lock, and dropped after it if unused: a
            // waker is code we do not own.
            let mut wake = Some(Wake::Task(cx.waker().clone()));
            let mut state = shard.state.lock();
            let queued = shard.enqueue(&mut state, id, &mut wake, deadline);
            let ticket = match queued {
                Ok(Some(ticket)) => ticket,
                other => {
                    drop(state);
                    set.leave_waiters();
                    this.done = true;
                    // A count taken (`Ok(None)`) is held by the slot made
                    // here, so a panicking drop of the wake strands nothing.
                    let outcome = other.map(|_| set.slot(id));
                    drop(wake);
                    return Poll::Ready(outcome);
                }
            };
            this.ticket = Some(ticket);
            #[cfg(not(loom))]
            let register = deadline.filter(|&deadline| state.arm(deadline));
            drop(state);
            #[cfg(not(loom))]
            if let Some(at) = register {
                let alarm: crate::sync::Weak<dyn crate::engine::alarm::Alarm> =
                    Arc::downgrade(shard) as _;
                crate::engine::alarm::arm(at, alarm);
            }
            return Poll::Pending;
        };
        let mut state = shard.state.lock();
        let mut outcome = state.outcome(id, ticket);
        if outcome.is_none() && !state.will_wake(id, ticket, cx.waker()) {
            // Still queued, with another waker: cloned outside the lock,
            // swapped in under it, the old one dropped outside it.
            drop(state);
            let wake = Wake::Task(cx.waker().clone());
            state = shard.state.lock();
            outcome = state.outcome(id, ticket);
            let unused = match outcome {
                None => state.replace_wake(id, ticket, wake),
                Some(_) => Some(wake),
            };
            if outcome.is_none() {
                drop(state);
                // The old waker's drop may end a child of this very key,
                // which hands its count to this waiter: the new waker, in
                // place now, is woken for it.
                drop(unused);
                return Poll::Pending;
            }
            let ended = this.finish(state, outcome);
            drop(unused);
            return ended;
        }
        if outcome.is_none() {
            return Poll::Pending;
        }
        this.finish(state, outcome)
    }
}

impl<'a> WaitKey<'a> {
    /// Ends the wait with `outcome` (read under `state`'s lock, which this
    /// lets go): out of the queue unless granted, out of the waiters'
    /// count, a timeout counted, and the waker dropped after the lock.
    fn finish(
        &mut self,
        mut state: crate::sync::MutexGuard<'_, ShardState>,
        outcome: Option<Result<(), Error>>,
    ) -> std::task::Poll<Result<KeySlot<'a>, Error>> {
        let (set, id) = (self.set, self.id);
        let outcome = outcome.expect("a finished wait has an outcome");
        let ticket = self.ticket.take().expect("a queued wait has a ticket");
        let wake = match outcome {
            Ok(()) => None,
            Err(_) => set.shard(id).cancel(&mut state, id, ticket),
        };
        drop(state);
        self.done = true;
        set.leave_waiters();
        if let Err(Error::Timeout) = outcome {
            set.record_timeout();
        }
        let result = outcome.map(|()| set.slot(id));
        // Last: a granted count is in its slot guard by now.
        drop(wake);
        std::task::Poll::Ready(result)
    }
}

impl Drop for WaitKey<'_> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        let shard = self.set.shard(self.id);
        let mut state = shard.state.lock();
        let granted = matches!(state.standing(self.id, ticket), Standing::Granted);
        let mut wake = None;
        if !granted {
            wake = shard.cancel(&mut state, self.id, ticket);
        }
        drop(state);
        self.set.leave_waiters();
        if granted {
            // Handed a count we no longer want: pass it on.
            drop(self.set.slot(self.id));
        }
        // After the lock: the waiter's own waker, if it was still queued
        // (then no count was handed to it).
        drop(wake);
    }
}
