//! The async pool's shared queue: one FIFO every worker task takes from,
//! where a free worker awaits work and how a delivery wakes one; the
//! default dispatch of an [`AsyncPool`](crate::AsyncPool)
//! ([`PoolBuilder::steal`](crate::PoolBuilder::steal)).
//!
//! It lives in the pool rather than beside the async pool because it needs
//! no tokio: the loom models, which cannot build tokio, drive it directly
//! (`loom-tests/tests/loom_async_steal.rs`).
//!
//! # One queue, one lock
//!
//! Every request goes to one queue, tagged with the shard whose unit it
//! holds, and the first free worker takes the oldest. A request is never
//! queued *at* a busy worker, so no worker idles while a request waits,
//! and nobody needs to steal. (The thread pool keeps one mailbox per
//! worker and steals, `pool/steal.rs`: its workers are threads on their
//! own cores, and a worker's own mailbox keeps its requests' lines there.
//! An async pool's workers are tasks sharing the runtime's threads: there
//! is no such line to keep. `steal(false)` still gives each async worker a
//! mailbox of its own, for affinity: `asynchronous/mailbox.rs`.)
//!
//! The queue, the stack of sleeping workers and their wakers sit under one
//! lock, held for a push or a pop and never while foreign code runs: a
//! waker is cloned before the lock and woken or dropped after it. One lock
//! makes the sleep/wake protocol plain: a worker registers as a sleeper
//! only after it found the queue empty under the lock, and a push under
//! the same lock takes a sleeper off the stack, so no wake-up can fall
//! between a look and a sleep, and no fence is needed.
//!
//! Why a lock rather than crossbeam's lock-free channel with a room of
//! sleepers beside it (the first version, and the old stealing pool's):
//! that needed a `SeqCst` fence on each side of every delivery and sleep,
//! a second look at the queues after each registration, and the channel's
//! own atomics, and its round trip cost more instructions than the tokio
//! actor idiom's, where this one costs 0.92x the idiom's from one task and
//! 0.93x from 64 (callgrind on a current-thread runtime,
//! `scripts/round-trip-instructions.sh`; `PERFORMANCE.md`). A push or a
//! pop holds the lock for a few dozen instructions; tokio's bounded
//! channel, which the actor idiom uses, takes a lock of its own on every
//! receive (its semaphore's).
//!
//! # Sleeping and waking
//!
//! * A worker polled for its next request keeps a clone of its waker ready
//!   (made outside the lock, kept across polls until used). Under the
//!   lock it takes itself off the stack if it was on it, pops the oldest
//!   request, or, finding none, moves its waker into its slot and pushes
//!   itself on the stack, and returns `Pending`.
//! * A push, under the lock, pops the most recent sleeper (its task and
//!   its lines are the warmest) and takes its waker, then wakes it after
//!   the lock. That worker's next poll finds the request, or, if another
//!   worker took it first, sleeps again.
//!
//! Every push to a queue with a sleeper rings one, and a worker sleeps only
//! on an empty queue: so while the queue holds a request, either a rung
//! worker has yet to look, or no worker sleeps.
//!
//! # Yielding once
//!
//! On a multi-thread runtime a worker that finds the queue empty right
//! after a request does not sleep yet: it wakes itself and returns
//! `Pending` once (not on the stack, so no push rings it), and sleeps
//! only if the queue is still empty when it is polled again. Its reply
//! has just woken its caller into this thread's next slot, and a caller
//! that calls again pushes before the worker looks: the request is taken
//! without a sleep, a ring and a wake-up, three trips through the lock
//! that both threads contend for. With 64 calling tasks on a 2-thread
//! runtime, sleeping at once made every request a sleep and a ring, and
//! a round trip took 2.7x the tokio actor idiom's time on a quiet machine
//! (18 % of it in the lock's slow path); yielding once brought it under
//! the idiom's. On a current-thread runtime nothing contends, and the
//! extra poll costs more than the sleep (1.17x the idiom's instructions
//! from one task, against 0.92x), so there a worker sleeps at once.
//!
//! # Shutdown
//!
//! A worker ends once the pool is closed and every shard drained (every
//! unit admitted is back, so every request has been handled), then runs
//! its `terminate`. Shutdown closes the table, then wakes every sleeper
//! ([`SharedQueue::wake_all`]). A worker that finds the queue empty checks
//! the exit rule under the lock: every worker gives its unit back before
//! it next takes the lock, so the last to look sees every release, and
//! wakes the sleepers to end too.

use std::collections::VecDeque;
use std::task::{Context, Poll, Waker};

use crate::sync::Mutex;

/// One queue for every worker of an async pool, and where free workers
/// sleep. Each item carries the shard whose unit it holds.
#[derive(Debug)]
pub(crate) struct SharedQueue<T> {
    state: Mutex<State<T>>,
    /// A worker that finds the queue empty after a request yields once
    /// before it sleeps (on a multi-thread runtime; see "Yielding once").
    yield_first: bool,
}

impl<T> State<T> {
    /// Takes worker `me` off the stack and its waker out of its slot, if a
    /// push has not done so already (then `None`: it was rung).
    fn unregister(&mut self, me: usize) -> Option<Waker> {
        let waker = self.wakers[me].take()?;
        if let Some(at) = self.stack.iter().rposition(|&worker| worker == me) {
            self.stack.remove(at);
        }
        Some(waker)
    }
}

/// One worker's side of the queue, kept by the worker between polls.
#[derive(Debug, Default)]
pub(crate) struct Sleep {
    /// On the stack, its waker in its slot (until a ring takes it off).
    registered: bool,
    /// It found the queue empty once since its last request and yielded
    /// instead of sleeping.
    yielded: bool,
}

/// What the lock guards.
#[derive(Debug)]
struct State<T> {
    /// The requests, oldest first, with their shards.
    queue: VecDeque<(usize, T)>,
    /// Per worker: its waker while it sleeps. Taking one out is the
    /// notification.
    wakers: Box<[Option<Waker>]>,
    /// The workers whose waker is in its slot, the most recent last.
    stack: Vec<usize>,
    /// No worker will take anything any more (the runtime is dropping
    /// them): a push is refused.
    closed: bool,
}

impl<T> SharedQueue<T> {
    /// An empty queue for `workers` workers, with room for `capacity`
    /// requests before it grows (the pool's capacity: the table bounds
    /// what it holds).
    pub(crate) fn new(workers: usize, capacity: usize, yield_first: bool) -> Self {
        SharedQueue {
            yield_first,
            state: Mutex::new(State {
                queue: VecDeque::with_capacity(capacity),
                wakers: (0..workers).map(|_| None).collect(),
                stack: Vec::with_capacity(workers),
                closed: false,
            }),
        }
    }

    /// Queues `item`, which holds a unit of shard `shard`, and wakes a
    /// sleeping worker if there is one. The item back if no worker will
    /// take it.
    #[inline]
    pub(crate) fn push(&self, shard: usize, item: T) -> Result<(), T> {
        let waker = {
            let mut state = self.state.lock();
            if state.closed {
                return Err(item);
            }
            state.queue.push_back((shard, item));
            match state.stack.pop() {
                Some(worker) => state.wakers[worker].take(),
                None => None,
            }
        };
        // Outside the lock: waking may run user code (the runtime's).
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }

    /// How many workers sleep now; a reading, for the loom models.
    #[cfg(loom)]
    pub(crate) fn sleepers(&self) -> usize {
        self.state.lock().stack.len()
    }

    /// True if nothing is queued now; a reading, for the loom models.
    #[cfg(loom)]
    pub(crate) fn is_empty(&self) -> bool {
        self.state.lock().queue.is_empty()
    }

    /// Wakes every sleeper so it re-checks its exit rule: after a shutdown
    /// began.
    pub(crate) fn wake_all(&self) {
        let wakers = {
            let mut state = self.state.lock();
            let State { wakers, stack, .. } = &mut *state;
            stack
                .drain(..)
                .filter_map(|worker| wakers[worker].take())
                .collect::<Vec<_>>()
        };
        // Every one woken even if one panics (`foreign.rs`).
        crate::engine::foreign::each_then_resume(wakers, Waker::wake);
    }

    /// Polls for the next item for worker `me`, with its shard: `Pending`
    /// while the queue is empty, the worker then sleeping on the stack
    /// (`registered`, kept by the worker between polls). `None` once `done`
    /// (the exit rule: the pool closed and drained) holds and the queue is
    /// empty; the sleepers are then woken to see it too.
    ///
    /// `waker` is the worker's spare clone of its own waker, kept across
    /// polls: a sleep moves it into the worker's slot, and a poll that
    /// finds the spare gone (a ring took and woke it) clones a new one
    /// before it takes the lock. A worker that never sleeps never clones.
    ///
    /// `done` is read under the lock: every worker gives back its unit
    /// before it polls for its next request, so the last worker to look
    /// sees every release.
    #[inline]
    pub(crate) fn poll_next(
        &self,
        cx: &mut Context<'_>,
        me: usize,
        waker: &mut Option<Waker>,
        sleep: &mut Sleep,
        done: impl Fn() -> bool,
    ) -> Poll<Option<(usize, T)>> {
        match waker {
            Some(spare) if spare.will_wake(cx.waker()) => {}
            // Outside the lock (a waker is the runtime's code).
            _ => *waker = Some(cx.waker().clone()),
        }
        let mut state = self.state.lock();
        // Off the stack, if still on it (polled without a ring): this look
        // decides anew. Its old waker is dropped after the lock.
        let stale = if sleep.registered {
            sleep.registered = false;
            state.unregister(me)
        } else {
            None
        };
        let outcome = if let Some(item) = state.queue.pop_front() {
            sleep.yielded = false;
            Poll::Ready(Some(item))
        } else if done() {
            Poll::Ready(None)
        } else if self.yield_first && !sleep.yielded {
            // The first time the queue is found empty after a request: let
            // the tasks this worker just woke (its caller, in the runtime's
            // next slot) run first, and look again (below).
            sleep.yielded = true;
            Poll::Pending
        } else {
            state.wakers[me] = waker.take();
            state.stack.push(me);
            sleep.registered = true;
            Poll::Pending
        };
        drop(state);
        drop(stale);
        match outcome {
            // Drained: the other sleepers end too.
            Poll::Ready(None) => self.wake_all(),
            // Yielded, not registered: this worker polls again once the
            // runtime has run what was queued before it.
            Poll::Pending if !sleep.registered => cx.waker().wake_by_ref(),
            _ => {}
        }
        outcome
    }

    /// Takes worker `me` off the stack if it sleeps there (`registered`):
    /// its loop is being dropped. If a ring took it off first, and a
    /// request waits, the ring is passed on to the next sleeper.
    pub(crate) fn leave(&self, me: usize, sleep: &mut Sleep) {
        if !std::mem::take(&mut sleep.registered) {
            return;
        }
        let mut state = self.state.lock();
        let waker = state.unregister(me);
        let passed = match (&waker, state.queue.is_empty()) {
            (None, false) => match state.stack.pop() {
                Some(worker) => state.wakers[worker].take(),
                None => None,
            },
            _ => None,
        };
        drop(state);
        drop(waker);
        if let Some(passed) = passed {
            passed.wake();
        }
    }

    /// Refuses every later push and hands back, one by one with its shard,
    /// what is still queued: for a worker the runtime drops before the
    /// pool drained (no worker will take anything any more).
    // Only the tokio pool drops workers; loom builds without it.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn close_and_drain(&self, mut each: impl FnMut(usize, T)) {
        let items = {
            let mut state = self.state.lock();
            state.closed = true;
            std::mem::take(&mut state.queue)
        };
        // Outside the lock: `each` drops requests (user code).
        for (shard, item) in items {
            each(shard, item);
        }
    }
}
