//! The async pool's queues: one per worker and one common to all, where a
//! free worker awaits work and how a delivery wakes one; the default
//! dispatch of an [`AsyncPool`](crate::AsyncPool)
//! ([`PoolBuilder::steal`](crate::PoolBuilder::steal)).
//!
//! It lives in the pool rather than beside the async pool because it needs
//! no tokio: the loom models, which cannot build tokio, drive it directly
//! (`loom-tests/tests/loom_async_steal.rs`).
//!
//! # Where a request goes
//!
//! Each worker has a FIFO of its own under a lock of its own (on its own
//! cache line), and one more FIFO is common to all; every request is
//! tagged with the shard whose unit it holds.
//!
//! * A push goes to the queue of the worker last polled on the calling
//!   thread (a thread-local, set at each poll): the worker whose reply
//!   just woke the caller, so the caller, that worker and its queue keep
//!   to one runtime thread, as the tokio actor idiom's tasks keep to their
//!   actor, and no lock line crosses threads.
//! * Unless that worker is **away**: its handler returned `Pending` (it
//!   awaits I/O, a timer, a lock). An away worker's queue takes nothing:
//!   at its first `Pending` the worker moves what it holds to the common
//!   queue ([`SharedQueue::away`]), and later pushes meant for it go there
//!   too, until it looks for work again. So a request never waits behind a
//!   handler that is waiting: a worker that finishes takes the common
//!   queue's oldest, and the connection-shaped workload (every handler
//!   awaits a backend) runs from one FIFO, first come first served.
//! * A worker takes from its own queue first, then from the common one,
//!   then from the others' (it steals), so no request waits at a busy
//!   worker while another is free to look; the lone request of a worker
//!   about to look is left to it ("Leaving a lone request to its owner").
//!
//! Why not one queue under one lock (the previous version, and still the
//! current-thread runtime's, below): from 64 tasks
//! on a 2-thread runtime both threads wrote that lock's line twice a round
//! trip, and the round trip took 1.5-1.6x the actor idiom's time, against
//! 0.76-0.93x its instructions (`PERFORMANCE.md`, "Where the 64-task time
//! went"). Why not per-worker queues alone: a request queued at a worker
//! that awaits a 2 ms backend waited for that worker while others took
//! newer requests from their own queues, and the connection bench's p99
//! rose 1.8-3.8x. Nothing but locks synchronizes here: no atomics, no
//! fences. Locks are taken one at a time, except a worker's own queue
//! then the common one in [`SharedQueue::away`] (never the other way).
//! The common queue shares its lock with the stack of sleepers, as the
//! one queue did: a worker takes from it or sleeps in one critical
//! section, and a push to it takes a sleeper off the stack in another.
//!
//! # Sleeping and waking
//!
//! * A worker that finds the workers' queues empty (after its yield,
//!   below) takes the common queue's oldest, or, finding none, puts its
//!   waker in its slot and itself on the stack of sleepers (under the
//!   same lock), *then* visits every worker's queue under its lock: it
//!   takes an item if one is there (and leaves the stack again), or
//!   counts itself in that queue's `sleeping`. The count is raised and
//!   the queue found empty in one critical section, so a push to it
//!   either came before (the item is seen) or sees the count. The stack
//!   is written first, so a push that sees the count finds a sleeper to
//!   ring. A push to the common queue, or a move into it, takes sleepers
//!   off the stack under the lock the sleeper registered under.
//! * A push, under its queue's lock, reads that queue's `looking` and
//!   `sleeping`. It rings (pops the most recent sleeper off the stack and
//!   wakes its waker, after the lock) when a worker sleeps and the queue's
//!   owner is not `looking`; a move to the common queue rings one sleeper
//!   per item moved. A woken worker takes itself out of every queue's
//!   count (counts can be high for a while, never low: a push may find
//!   the stack empty, and rings nobody, when another push has rung the
//!   sleeper already; that sleeper then takes a request, and the other
//!   waits for a worker to finish one, none being free).
//! * A worker that is rung but takes its request elsewhere first passes
//!   the ring on if a request is still queued, as does one dropped asleep.
//!
//! So while a request is queued, either its queue's owner will look again
//! (`looking`, or it is busy and not away), or a rung worker has yet to
//! look, or no worker sleeps.
//!
//! # Yielding once
//!
//! On a multi-thread runtime a worker that finds its own queue empty right
//! after a request does not sleep yet: it marks itself `looking` (in the
//! same critical section), wakes itself and returns `Pending` once. Its
//! reply has just woken its caller into this thread's next slot, and a
//! caller that calls again pushes to this worker's queue before the
//! worker looks again; `looking` spares that push a ring (the worker will
//! look). The worker's second look is at its own queue (it clears
//! `looking` there); finding it still empty, the worker sleeps at once,
//! and the sleep's walk takes from every other queue what a look would.
//! With one shared queue, sleeping at once made every request from 64
//! tasks a sleep, a ring and a wake-up: 2.7x the actor idiom's time. A
//! worker back from away looks at the common queue too before it yields
//! (its callers pushed there).
//!
//! The second look finds its queue empty when the caller is not back yet.
//! From one task on a 2-thread runtime that was 5-14 % of round trips
//! (counted over 100,000 per process, 2026-12-07), 0.06 % on one thread;
//! a second yield did not catch the caller's push either, so it comes
//! later, most likely from the other runtime thread (tokio queues a woken
//! task where that thread may steal it every few hops). Each such miss is
//! a sleep and a ring. The second look used to
//! walk every queue before the sleep walked them again: with the default
//! worker count (64) that was 64 more locks per miss.
//!
//! # Leaving a lone request to its owner
//!
//! A worker that yielded is `coming`: it will look at its own queue on
//! its next poll, a scheduler tick away. Until it has looked, another
//! worker does not steal the only request in its queue (it takes one of
//! two or more: those wait for a handler). Stealing it made two workers
//! leapfrog for good from one caller: each one's second look took the
//! request pushed to the other's queue, the caller's next push went to
//! the thief (the worker last polled on its thread), and so on; with the
//! default worker count (one per unit of capacity, 64 in the bench) each
//! steal walked up to every worker's queue, 3,670 instructions a round
//! trip against the actor idiom's 2,053 (1.79x; 1,978 with 2 workers).
//! The request is not stranded: its owner looks for it next.
//!
//! # One thread, one queue
//!
//! On a current-thread runtime there is no second thread for a queue to
//! keep away from, and per-worker queues only add locks to each sleep and
//! wake (2,220 instructions a round trip from one task against 1,899, and
//! 1.10x the actor idiom's). There every push goes to the common queue,
//! a worker takes from it or sleeps at once under its one lock (nothing
//! runs in between to make a yield pay), and the workers' queues stay
//! empty.
//!
//! # Shutdown
//!
//! A worker ends once the pool is closed and every shard drained (every
//! unit admitted is back, so every request has been handled), then runs
//! its `terminate`. Shutdown closes the table, then wakes every sleeper
//! ([`SharedQueue::wake_all`]). A worker that finds the queues empty
//! checks the exit rule, before it sleeps and again after it registered:
//! every worker gives its unit back before it next looks, so the last to
//! look sees every release, and wakes the sleepers to end too.

use std::collections::VecDeque;
use std::task::{Context, Poll, Waker};

use crossbeam_utils::CachePadded;

use crate::sync::Mutex;

/// The queues of an async pool's workers, the common queue, and where free
/// workers sleep. Each item carries the shard whose unit it holds.
#[derive(Debug)]
pub(crate) struct SharedQueue<T> {
    /// Per worker: its queue, on a cache line of its own.
    queues: Box<[CachePadded<Mutex<Q<T>>>]>,
    /// The common queue, the sleepers and their wakers.
    state: Mutex<State<T>>,
    /// On a multi-thread runtime: pushes go to the workers' queues, and a
    /// worker that finds its queue empty after a request yields once
    /// before it sleeps ("Yielding once"). On a current-thread runtime
    /// every push goes to the common queue ("One thread, one queue").
    per_worker: bool,
}

/// One worker's queue, under its lock.
#[derive(Debug)]
struct Q<T> {
    /// The requests, oldest first, with their shards.
    items: VecDeque<(usize, T)>,
    /// No worker will take anything any more (the runtime is dropping
    /// them): a push is refused.
    closed: bool,
    /// The owner yielded after a request and will look here again.
    looking: bool,
    /// The owner yielded after a request and has not looked since: unlike
    /// `looking`, a push leaves it set. Another worker leaves a lone item
    /// here to its owner ("Leaving a lone request to its owner").
    coming: bool,
    /// The owner's handler awaits: pushes go to the common queue.
    away: bool,
    /// Workers registered asleep (maybe stale high, never low).
    sleeping: usize,
}

/// The common queue and the sleepers, under one lock: a worker sleeps only
/// after it found the common queue empty under it, and a push to the
/// common queue takes a sleeper off the stack under it.
#[derive(Debug)]
struct State<T> {
    /// Requests meant for an away worker, oldest first, with their shards.
    common: VecDeque<(usize, T)>,
    /// As [`Q::closed`].
    closed: bool,
    /// Per worker: its waker while it sleeps. Taking one out is the
    /// notification.
    wakers: Box<[Option<Waker>]>,
    /// The workers whose waker is in its slot, the most recent last.
    stack: Vec<usize>,
}

impl<T> Q<T> {
    /// Its owner looks here and takes the oldest item: no longer
    /// `looking` nor `coming` (it has looked) nor `away` (its handler is
    /// done).
    fn look(&mut self) -> Option<(usize, T)> {
        self.looking = false;
        self.coming = false;
        self.away = false;
        self.items.pop_front()
    }

    /// The oldest item, for a worker other than the owner: none if the
    /// owner is coming back for it and it is the only one.
    fn steal(&mut self) -> Option<(usize, T)> {
        if self.coming && self.items.len() == 1 {
            return None;
        }
        self.items.pop_front()
    }
}

impl<T> State<T> {
    /// Takes worker `me` off the stack and its waker out of its slot, if a
    /// ring has not done so already (then `None`: it was rung).
    fn unregister(&mut self, me: usize) -> Option<Waker> {
        let waker = self.wakers[me].take()?;
        if let Some(at) = self.stack.iter().rposition(|&worker| worker == me) {
            self.stack.remove(at);
        }
        Some(waker)
    }

    /// Pops the most recent sleeper and takes its waker, if any.
    fn pop_sleeper(&mut self) -> Option<Waker> {
        let worker = self.stack.pop()?;
        self.wakers[worker].take()
    }

    /// Pops up to `count` sleepers, the most recent first, and takes their
    /// wakers (to be woken after the lock).
    fn pop_sleepers(&mut self, count: usize) -> Vec<Waker> {
        let from = self.stack.len().saturating_sub(count);
        let wakers = &mut self.wakers;
        self.stack
            .drain(from..)
            .rev()
            .filter_map(|worker| wakers[worker].take())
            .collect()
    }
}

/// One worker's side of the queues, kept by the worker between polls.
#[derive(Debug, Default)]
pub(crate) struct Sleep {
    /// On the stack and counted in every queue (until it looks again).
    registered: bool,
    /// It found its queue empty once since its last request and yielded
    /// instead of sleeping.
    yielded: bool,
}

crate::sync::const_thread_local! {
    /// The worker last polled on this thread, as (its pool's queues'
    /// address, its index): where a push from this thread goes.
    static LAST: std::cell::Cell<(usize, usize)> = std::cell::Cell::new((0, 0));
}

/// The most requests a queue has room for before it first grows. The
/// table bounds what the queues hold by the pool's capacity, but that may
/// be 2^60 − 1 (`null` in an `Env`): room for it up front would not fit
/// in memory (2^30 requests were 32 GiB). Past this, a queue grows as it
/// fills.
const ROOM_UP_FRONT: usize = 1024;

impl<T> SharedQueue<T> {
    /// Empty queues for `workers` workers; the common one has room for
    /// `capacity` requests before it grows (the pool's capacity: the table
    /// bounds what they hold), each worker's for its share, both at most
    /// [`ROOM_UP_FRONT`].
    pub(crate) fn new(workers: usize, capacity: usize, multi_thread: bool) -> Self {
        let share = if multi_thread {
            capacity.div_ceil(workers.max(1)).min(ROOM_UP_FRONT)
        } else {
            0
        };
        SharedQueue {
            per_worker: multi_thread,
            queues: (0..workers)
                .map(|_| {
                    CachePadded::new(Mutex::new(Q {
                        items: VecDeque::with_capacity(share),
                        closed: false,
                        looking: false,
                        coming: false,
                        away: false,
                        sleeping: 0,
                    }))
                })
                .collect(),
            state: Mutex::new(State {
                common: VecDeque::with_capacity(capacity.min(ROOM_UP_FRONT)),
                closed: false,
                wakers: (0..workers).map(|_| None).collect(),
                stack: Vec::with_capacity(workers),
            }),
        }
    }

    /// This pool's mark in [`LAST`].
    fn key(&self) -> usize {
        self.queues.as_ptr() as usize
    }

    /// The queue a push from this thread goes to: the worker last polled
    /// here, if one of this pool's; else by the unit's shard.
    fn target(&self, shard: usize) -> usize {
        let (key, last) = LAST.with(std::cell::Cell::get);
        // A hint only: a pool dropped and another made at its address may
        // find a stale index here, kept in range.
        if key == self.key() && last < self.queues.len() {
            return last;
        }
        shard % self.queues.len()
    }

    /// Worker `me` is polled on this thread.
    fn mark(&self, me: usize) {
        LAST.with(|last| last.set((self.key(), me)));
    }

    /// Queues `item`, which holds a unit of shard `shard`, and wakes a
    /// sleeping worker unless the queue's owner will look again. The item
    /// back if no worker will take it.
    #[inline]
    pub(crate) fn push(&self, shard: usize, item: T) -> Result<(), T> {
        if !self.per_worker {
            return self.push_common(shard, item);
        }
        let ring = {
            let mut q = self.queues[self.target(shard)].lock();
            if q.away {
                // Its owner awaits: not behind it (one lock at a time).
                drop(q);
                return self.push_past(shard, item);
            }
            if q.closed {
                return Err(item);
            }
            q.items.push_back((shard, item));
            // The owner's next look takes one request: it spares one push
            // a ring, the first after it yielded (its queue was empty).
            if std::mem::take(&mut q.looking) {
                false
            } else {
                q.sleeping > 0
            }
        };
        // Outside the queue's lock.
        if ring {
            self.ring();
        }
        Ok(())
    }

    /// Queues `item` on the common queue and rings the most recent
    /// sleeper, if any.
    #[inline]
    fn push_common(&self, shard: usize, item: T) -> Result<(), T> {
        let waker = {
            let mut state = self.state.lock();
            if state.closed {
                return Err(item);
            }
            state.common.push_back((shard, item));
            state.pop_sleeper()
        };
        // Outside the lock: waking may run the runtime's code.
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }

    /// [`push_common`](Self::push_common) for a push meant for an away
    /// worker: out of the hot path's way (the envelope is moved once more
    /// here rather than on every push).
    #[cold]
    #[inline(never)]
    fn push_past(&self, shard: usize, item: T) -> Result<(), T> {
        self.push_common(shard, item)
    }

    /// Worker `me`'s handler returned `Pending`: until it looks again its
    /// queue takes nothing, and what it holds moves to the common queue
    /// (oldest first, after what is there), taking a sleeper off the stack
    /// per item moved. Its own queue's lock, then the common one's (the
    /// one place two are held; nothing takes them the other way).
    pub(crate) fn away(&self, me: usize) {
        if !self.per_worker {
            return;
        }
        let wakers = {
            let mut q = self.queues[me].lock();
            q.away = true;
            if q.items.is_empty() {
                return;
            }
            let mut state = self.state.lock();
            let moved = q.items.len();
            state.common.extend(q.items.drain(..));
            state.pop_sleepers(moved)
        };
        // Outside the locks, each even if one panics (`foreign.rs`).
        crate::engine::foreign::each_then_resume(wakers, Waker::wake);
    }

    /// Wakes the most recent sleeper, if any (after the lock: waking may
    /// run the runtime's code).
    fn ring(&self) {
        let waker = self.state.lock().pop_sleeper();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// The oldest item of worker `me`'s queue, else of the next worker's
    /// that holds one it may steal ([`Q::steal`]); clears `me`'s
    /// `looking`, `coming` and `away` (it has looked). (The common queue
    /// is looked at under the sleepers' lock, before a sleep.)
    fn take(&self, me: usize) -> Option<(usize, T)> {
        let n = self.queues.len();
        (0..n).find_map(|i| {
            let mut q = self.queues[(me + i) % n].lock();
            if i == 0 {
                q.look()
            } else {
                q.steal()
            }
        })
    }

    /// True if some queue holds an item now.
    fn any(&self) -> bool {
        !self.state.lock().common.is_empty()
            || self.queues.iter().any(|q| !q.lock().items.is_empty())
    }

    /// Takes worker `me` off the stack and out of the counts of the
    /// `marked` queues it counted itself in (from its own on); its waker
    /// if no ring took it.
    fn unregister(&self, me: usize, marked: usize) -> Option<Waker> {
        let waker = self.state.lock().unregister(me);
        let n = self.queues.len();
        for i in 0..marked {
            self.queues[(me + i) % n].lock().sleeping -= 1;
        }
        waker
    }

    /// How many workers sleep now; a reading, for the loom models.
    #[cfg(loom)]
    pub(crate) fn sleepers(&self) -> usize {
        self.state.lock().stack.len()
    }

    /// True if nothing is queued now; a reading, for the loom models.
    #[cfg(loom)]
    pub(crate) fn is_empty(&self) -> bool {
        !self.any()
    }

    /// Wakes every sleeper so it re-checks its exit rule: after a shutdown
    /// began.
    pub(crate) fn wake_all(&self) {
        let wakers = self.state.lock().pop_sleepers(usize::MAX);
        // Every one woken even if one panics (`foreign.rs`).
        crate::engine::foreign::each_then_resume(wakers, Waker::wake);
    }

    /// Polls for the next item for worker `me`, with its shard: `Pending`
    /// while every queue is empty, the worker then yielding once or
    /// sleeping (`sleep`, kept by the worker between polls). `None` once
    /// `done` (the exit rule: the pool closed and drained) holds and the
    /// queues are empty; the sleepers are then woken to see it too.
    ///
    /// `waker` is the worker's spare clone of its own waker, kept across
    /// polls: a sleep moves it into the worker's slot, and a sleep that
    /// finds the spare gone (a ring took and woke it) clones a new one
    /// before it takes a lock. A worker that never sleeps never clones.
    #[inline]
    pub(crate) fn poll_next(
        &self,
        cx: &mut Context<'_>,
        me: usize,
        waker: &mut Option<Waker>,
        sleep: &mut Sleep,
        done: impl Fn() -> bool,
    ) -> Poll<Option<(usize, T)>> {
        if !self.per_worker {
            return self.poll_common(cx, me, waker, sleep, done);
        }
        self.mark(me);
        let woken = sleep.registered;
        if woken {
            sleep.registered = false;
            drop(self.unregister(me, self.queues.len()));
        }
        let first = if !sleep.yielded {
            let mut q = self.queues[me].lock();
            let was_away = std::mem::take(&mut q.away);
            let item = q.items.pop_front();
            q.looking = item.is_none();
            // Back from away it may take from the common queue instead
            // and run a handler: not coming, then.
            q.coming = item.is_none() && !was_away;
            drop(q);
            match item {
                // Back from away: its callers pushed to the common queue.
                None if was_away => self.state.lock().common.pop_front(),
                item => item,
            }
        } else if woken {
            // Rung, or polled asleep: a request may be queued anywhere.
            self.take(me)
        } else {
            // Back from its yield: its caller's next request, if it came,
            // is at its own queue. If not (the caller is not back yet:
            // most often tokio moved it to the other thread), straight to
            // the sleep below, whose walk steals what it finds as this
            // look's would (one walk of every queue, not two).
            self.queues[me].lock().look()
        };
        if let Some(item) = first {
            sleep.yielded = false;
            return Poll::Ready(Some(item));
        }
        if !sleep.yielded && !done() {
            sleep.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        // Outside any lock (a waker is the runtime's code).
        match waker {
            Some(spare) if spare.will_wake(cx.waker()) => {}
            _ => *waker = Some(cx.waker().clone()),
        }
        // The common queue, else on the stack; then counted in each queue
        // found empty: a push that sees the count finds a sleeper to ring.
        {
            let mut state = self.state.lock();
            if let Some(item) = state.common.pop_front() {
                sleep.yielded = false;
                return Poll::Ready(Some(item));
            }
            if done() {
                drop(state);
                self.wake_all();
                return Poll::Ready(None);
            }
            state.wakers[me] = waker.take();
            state.stack.push(me);
        }
        let n = self.queues.len();
        let mut found = None;
        let mut marked = 0;
        for i in 0..n {
            let mut q = self.queues[(me + i) % n].lock();
            let item = if i == 0 { q.look() } else { q.steal() };
            if let Some(item) = item {
                found = Some(item);
                break;
            }
            q.sleeping += 1;
            marked += 1;
        }
        if let Some(item) = found {
            // Awake again; a ring meant for a request still queued is
            // passed on.
            let mine = self.unregister(me, marked);
            let rung = mine.is_none();
            drop(mine);
            if rung && self.any() {
                self.ring();
            }
            sleep.yielded = false;
            return Poll::Ready(Some(item));
        }
        sleep.registered = true;
        if done() {
            self.wake_all();
            return Poll::Ready(None);
        }
        Poll::Pending
    }

    /// [`poll_next`](Self::poll_next) on a current-thread runtime: one
    /// lock, the common queue and the stack under it ("One thread, one
    /// queue").
    #[inline]
    fn poll_common(
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
        let stale = if std::mem::take(&mut sleep.registered) {
            state.unregister(me)
        } else {
            None
        };
        let outcome = if let Some(item) = state.common.pop_front() {
            Poll::Ready(Some(item))
        } else if done() {
            Poll::Ready(None)
        } else {
            state.wakers[me] = waker.take();
            state.stack.push(me);
            sleep.registered = true;
            Poll::Pending
        };
        drop(state);
        drop(stale);
        if let Poll::Ready(None) = outcome {
            // Drained: the other sleepers end too.
            self.wake_all();
        }
        outcome
    }

    /// Worker `me`'s loop is being dropped: takes it off the stack if it
    /// sleeps there, and passes on a ring it took or a push it spared one.
    pub(crate) fn leave(&self, me: usize, sleep: &mut Sleep) {
        // A worker dropped between its yield and its next look (yielded,
        // not asleep) may have spared a push its ring.
        let in_window = sleep.yielded && !sleep.registered;
        {
            let mut q = self.queues[me].lock();
            q.looking = false;
            q.coming = false;
        }
        let marked = if self.per_worker {
            self.queues.len()
        } else {
            0
        };
        let rung = if std::mem::take(&mut sleep.registered) {
            self.unregister(me, marked).is_none()
        } else {
            false
        };
        if (rung || in_window) && self.any() {
            self.ring();
        }
    }

    /// Refuses every later push and hands back, one by one with its shard,
    /// what is still queued: for a worker the runtime drops before the
    /// pool drained (no worker will take anything any more).
    // Only the tokio pool drops workers; loom builds without it.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn close_and_drain(&self, mut each: impl FnMut(usize, T)) {
        let mut items = Vec::new();
        for q in self.queues.iter() {
            let mut q = q.lock();
            q.closed = true;
            items.extend(q.items.drain(..));
        }
        {
            let mut state = self.state.lock();
            state.closed = true;
            items.extend(state.common.drain(..));
        }
        // Outside the locks: `each` drops requests (user code).
        for (shard, item) in items {
            each(shard, item);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    //! The routing rules, one thread driving every side by hand: where a
    //! push goes, what `away` moves, what a worker takes first. (The
    //! sleep and wake protocol across threads is loom's:
    //! `loom-tests/tests/loom_async_steal.rs`.)

    use super::*;
    use std::sync::Arc;
    use std::task::Wake;

    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }

    /// One poll of worker `me`, as the pool polls it, with a waker that
    /// does nothing.
    fn poll_once(q: &SharedQueue<u32>, me: usize, sleep: &mut Sleep) -> Poll<Option<(usize, u32)>> {
        let waker = Waker::from(Arc::new(Noop));
        q.poll_next(
            &mut Context::from_waker(&waker),
            me,
            &mut None,
            sleep,
            || false,
        )
    }

    /// Worker `me`'s next item if one is there now (`None` if it would
    /// wait).
    fn next(q: &SharedQueue<u32>, me: usize, sleep: &mut Sleep) -> Option<u32> {
        // A worker yields once before it sleeps: poll up to twice.
        for _ in 0..2 {
            match poll_once(q, me, sleep) {
                Poll::Ready(item) => return item.map(|(_, item)| item),
                Poll::Pending if sleep.registered => return None,
                Poll::Pending => {}
            }
        }
        None
    }

    #[test]
    fn a_push_goes_to_the_worker_last_polled_on_this_thread() {
        let q = SharedQueue::new(2, 8, true);
        let (mut zero, mut one) = (Sleep::default(), Sleep::default());
        assert_eq!(next(&q, 0, &mut zero), None);
        assert_eq!(next(&q, 1, &mut one), None);
        // Worker 1 was polled last here: its queue, not the common one.
        q.push(0, 7).unwrap();
        assert_eq!(q.queues[1].lock().items.len(), 1);
        assert!(q.state.lock().common.is_empty());
        assert_eq!(next(&q, 1, &mut one), Some(7));
    }

    #[test]
    fn an_away_worker_hands_its_queue_on_and_pushes_for_it_go_past_it() {
        let q = SharedQueue::new(2, 8, true);
        let (mut zero, mut one) = (Sleep::default(), Sleep::default());
        assert_eq!(next(&q, 0, &mut zero), None);
        q.push(0, 1).unwrap();
        // Worker 0, polled here last, takes it; two more queue at it.
        assert_eq!(next(&q, 0, &mut zero), Some(1));
        q.push(0, 2).unwrap();
        q.push(0, 3).unwrap();
        assert_eq!(q.queues[0].lock().items.len(), 2);
        // Its handler awaits: what waited at it moves to the common queue,
        // and what comes meanwhile goes there too.
        q.away(0);
        assert!(q.queues[0].lock().items.is_empty());
        q.push(0, 4).unwrap();
        assert!(q.queues[0].lock().items.is_empty(), "not queued behind it");
        // A free worker takes them oldest first.
        let order: Vec<u32> = std::iter::from_fn(|| next(&q, 1, &mut one)).collect();
        assert_eq!(order, [2, 3, 4]);
    }

    #[test]
    fn the_lone_request_of_a_worker_coming_back_is_left_to_it() {
        let q = SharedQueue::new(2, 8, true);
        let (mut zero, mut one) = (Sleep::default(), Sleep::default());
        // Both found their queues empty and yielded, worker 1 last.
        assert!(poll_once(&q, 0, &mut zero).is_pending());
        assert!(poll_once(&q, 1, &mut one).is_pending());
        assert!(zero.yielded && one.yielded);
        // One caller's request, queued at worker 1 (polled here last).
        q.push(0, 1).unwrap();
        // Worker 0's second look leaves it to worker 1 and sleeps...
        assert!(poll_once(&q, 0, &mut zero).is_pending());
        assert!(zero.registered);
        assert_eq!(q.queues[1].lock().items.len(), 1);
        // ...which takes it: no leapfrog.
        assert!(matches!(
            poll_once(&q, 1, &mut one),
            Poll::Ready(Some((0, 1)))
        ));
        // Two queued at a worker coming back: another takes one of them.
        assert!(poll_once(&q, 1, &mut one).is_pending());
        q.push(0, 2).unwrap();
        q.push(0, 3).unwrap();
        assert!(matches!(
            poll_once(&q, 0, &mut zero),
            Poll::Ready(Some((0, 2)))
        ));
        assert_eq!(next(&q, 1, &mut one), Some(3));
    }

    #[test]
    fn a_worker_back_from_away_looks_at_the_common_queue_first() {
        let q = SharedQueue::new(2, 8, true);
        let mut zero = Sleep::default();
        assert_eq!(next(&q, 0, &mut zero), None);
        q.push(0, 1).unwrap();
        assert_eq!(next(&q, 0, &mut zero), Some(1));
        q.away(0);
        q.push(0, 2).unwrap();
        assert_eq!(q.state.lock().common.len(), 1);
        // Its first look after the handler: its queue is empty, the common
        // one is not; no yield in between.
        assert!(matches!(
            poll_once(&q, 0, &mut zero),
            Poll::Ready(Some((0, 2)))
        ));
        // And it is back: the next push is queued at it again.
        q.push(0, 3).unwrap();
        assert_eq!(q.queues[0].lock().items.len(), 1);
    }

    #[test]
    fn on_a_current_thread_runtime_every_push_goes_to_the_common_queue() {
        let q = SharedQueue::new(2, 8, false);
        let mut zero = Sleep::default();
        assert_eq!(next(&q, 0, &mut zero), None);
        q.push(0, 1).unwrap();
        q.push(1, 2).unwrap();
        assert!(q.queues.iter().all(|w| w.lock().items.is_empty()));
        assert_eq!(q.state.lock().common.len(), 2);
        let mut one = Sleep::default();
        assert_eq!(next(&q, 1, &mut one), Some(1));
        assert_eq!(next(&q, 1, &mut one), Some(2));
    }

    #[test]
    fn a_stale_mark_out_of_range_falls_back_to_the_shard() {
        let q = SharedQueue::new(2, 8, true);
        // As if a pool of more workers had been polled here and another
        // made at its address.
        LAST.with(|last| last.set((q.key(), 7)));
        q.push(1, 9).unwrap();
        assert_eq!(q.queues[1].lock().items.len(), 1);
    }

    #[test]
    fn a_closed_queue_refuses_and_hands_back_what_it_held() {
        let q = SharedQueue::new(2, 8, true);
        let mut zero = Sleep::default();
        assert_eq!(next(&q, 0, &mut zero), None);
        q.push(0, 1).unwrap();
        q.away(0);
        q.push(1, 2).unwrap();
        let mut back = Vec::new();
        q.close_and_drain(|shard, item| back.push((shard, item)));
        back.sort_unstable();
        assert_eq!(back, [(0, 1), (1, 2)]);
        assert_eq!(q.push(0, 3), Err(3));
    }
}
