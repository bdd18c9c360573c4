//! The async idle room: where the free workers of a stealing
//! [`AsyncPool`](crate::PoolBuilder::steal) await work queued at *any*
//! worker's mailbox, how a delivery wakes one of them, and the take loop
//! ([`next`]) those workers run.
//!
//! It is the thread pool's room (`pool/steal.rs`) with wakers in place of a
//! condition variable, and it lives in the engine rather than beside the
//! async pool because it needs no tokio: the loom models, which cannot
//! build tokio, drive it directly (`loom-tests/tests/loom_async_steal.rs`).
//!
//! # Taking
//!
//! Each mailbox is a multi-consumer queue (a crossbeam channel: every
//! worker holds every receiver, and the channel hands each envelope to one
//! of them). A worker looks at its own mailbox first, then once at each
//! other one, starting after its own (so two thieves do not both start at
//! mailbox 0). A task never spins: with nothing found it sleeps.
//!
//! # Sleeping and waking
//!
//! Each worker has a slot for its waker, all under one lock, and a
//! `looking` flag, true while it is awake between two requests and about
//! to look at its own mailbox:
//!
//! * a sleeper puts its waker in its slot and counts itself in `sleepers`
//!   (under the lock), clears `looking`, issues a `SeqCst` fence, then
//!   re-checks every mailbox and its exit rule; it returns `Pending` only
//!   if all are empty and the rule does not hold;
//! * a producer pushes its envelope to mailbox `to`, issues a `SeqCst`
//!   fence and reads `sleepers` and `looking[to]`; only if a sleeper is
//!   counted and `to`'s worker is not looking does it take the lock, take
//!   a waker out of its slot (worker `to`'s if it sleeps, else the next
//!   sleeper's after it) and wake it;
//! * a worker that takes an envelope clears `looking`, issues a `SeqCst`
//!   fence, and looks again: at its own mailbox if it took from there
//!   without having slept, at every mailbox if it stole or slept (it may
//!   then hold the notification meant for another envelope). If anything
//!   is left and someone sleeps, it wakes one.
//!
//! The fences make this Dekker's pattern. Take a producer's fence `Fp` and
//! a sleeper's fence `Fs` in the single total order of `SeqCst` fences. If
//! `Fs` comes first, the producer's read sees the sleeper counted (or its
//! waker already taken, so it is awake and will look again), and wakes a
//! sleeper unless the owner is looking. If `Fp` comes first, the sleeper's
//! re-check sees the envelope and it does not sleep. The same holds for an
//! owner's `looking`: a producer that reads it true had its fence before
//! the owner's next clearing fence, whose look after it sees the envelope.
//! A taken waker is the notification itself: the sleeper registered it
//! *before* its re-check, so a wake-up between the re-check and the
//! `Pending` is not lost (tokio's `AtomicWaker` discipline), and a sleeper
//! polled again finds its slot empty exactly when it was woken.
//!
//! The cost on the plain path: a delivery pays one fence and reads a word
//! that changes only when a worker sleeps or wakes; the wake-up (a lock
//! and a `Waker::wake`) only when a worker sleeps and the mailbox's owner
//! is not already about to look. A worker pays one fence per request.
//!
//! Shutdown changes every sleeper's exit rule rather than a mailbox, and
//! wakes them all under the lock ([`AsyncIdle::wake_all`]); a worker that
//! gave back a unit of another worker's shard wakes that owner
//! ([`after_release`]), which may be asleep waiting for exactly that
//! release to drain its closed shard.

use std::future::poll_fn;
use std::task::{Poll, Waker};

use crossbeam_utils::CachePadded;

use crate::pool::steal::Queue;
use crate::sync::{fence, AtomicBool, AtomicUsize, Mutex, Ordering};

/// Where a stealing async pool's free workers sleep, and how a delivery
/// wakes one.
#[derive(Debug)]
pub(crate) struct AsyncIdle {
    /// Workers whose waker sits in their slot. Changed only under `wakers`'
    /// lock; read without it, after a fence, by producers.
    sleepers: AtomicUsize,
    /// Per worker: true while it is awake between requests and will look
    /// at its own mailbox before it takes anything or sleeps. Each on its
    /// own line: its worker writes it twice per request.
    looking: Box<[CachePadded<AtomicBool>]>,
    /// Per worker: its waker while it sleeps. Taking one out is the
    /// notification.
    wakers: Mutex<Box<[Option<Waker>]>>,
}

impl AsyncIdle {
    /// A room for `workers` workers, none asleep, none looking.
    pub(crate) fn new(workers: usize) -> Self {
        AsyncIdle {
            sleepers: AtomicUsize::new(0),
            looking: (0..workers)
                .map(|_| CachePadded::new(AtomicBool::new(false)))
                .collect(),
            wakers: Mutex::new((0..workers).map(|_| None).collect()),
        }
    }

    /// Tells the sleepers (if any) that an envelope was just queued at
    /// worker `to`. Nobody is woken if nobody sleeps, or if `to` is awake
    /// and about to look at its mailbox (if it takes another envelope
    /// first, it wakes a sleeper itself, see `took`).
    #[inline]
    pub(crate) fn work_added(&self, to: usize) {
        // SeqCst fence: pairs with the fences in `sleep_until` and `took`.
        // Either these reads see the sleeper counted and the owner not
        // looking, or the other side's look, after its fence, sees the
        // envelope pushed before this one (Dekker; see the module docs).
        fence(Ordering::SeqCst);
        // Relaxed, both: ordered by the fence above.
        if self.sleepers.load(Ordering::Relaxed) != 0 && !self.looking[to].load(Ordering::Relaxed) {
            self.wake_one(to);
        }
    }

    /// How many workers sleep now; a reading, for the loom models.
    #[cfg(loom)]
    pub(crate) fn sleepers(&self) -> usize {
        // Relaxed: a reading; the models wait on it with yields.
        self.sleepers.load(Ordering::Relaxed)
    }

    /// Worker `me` is awake and will look at its own mailbox.
    #[inline]
    fn look(&self, me: usize) {
        // Relaxed: a producer that misses it only wakes a sleeper for
        // nothing; one that sees it is covered by the fence in `took` or
        // `sleep_until`, which comes before `me` stops looking.
        self.looking[me].store(true, Ordering::Relaxed);
    }

    /// Worker `me` took an envelope and stops looking. If envelopes remain
    /// (in its own mailbox, or with `everywhere` in any), a producer may
    /// have counted on `me`, or woken `me` for one of them: wake a sleeper.
    #[inline]
    fn took<Q: Queue>(&self, me: usize, mailboxes: &[Q], everywhere: bool) {
        // Relaxed: ordered by the fence below.
        self.looking[me].store(false, Ordering::Relaxed);
        // SeqCst fence: pairs with the one in `work_added`.
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence above.
        if self.sleepers.load(Ordering::Relaxed) == 0 {
            return;
        }
        let left = if everywhere {
            mailboxes.iter().any(|queue| !queue.is_empty())
        } else {
            !mailboxes[me].is_empty()
        };
        if left {
            // `me` is awake, so its slot is empty: another one is woken.
            self.wake_one(me);
        }
    }

    /// Wakes one sleeper: worker `preferred` if it sleeps, else the first
    /// one after it.
    #[cold]
    fn wake_one(&self, preferred: usize) {
        let waker = {
            let mut wakers = self.wakers.lock();
            let count = wakers.len();
            let waker = (0..count)
                .map(|step| (preferred + step) % count)
                .find_map(|index| wakers[index].take());
            if waker.is_some() {
                // Relaxed: under the lock, as every change of the count.
                self.sleepers.fetch_sub(1, Ordering::Relaxed);
            }
            waker
        };
        // Outside the lock: waking may run user code (the runtime's).
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Wakes worker `worker` if it sleeps, so it re-checks its exit rule.
    pub(crate) fn wake(&self, worker: usize) {
        let waker = {
            let mut wakers = self.wakers.lock();
            let waker = wakers[worker].take();
            if waker.is_some() {
                // Relaxed: under the lock.
                self.sleepers.fetch_sub(1, Ordering::Relaxed);
            }
            waker
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Wakes every sleeper so it re-checks its exit rule: after a shutdown
    /// began.
    pub(crate) fn wake_all(&self) {
        // The lock orders this after any sleeper's registration (its waker
        // is taken here) or before it (its re-check, after taking the lock,
        // sees what came before this call).
        let wakers: Vec<Waker> = {
            let mut wakers = self.wakers.lock();
            let taken: Vec<Waker> = wakers.iter_mut().filter_map(Option::take).collect();
            // Relaxed: under the lock.
            self.sleepers.fetch_sub(taken.len(), Ordering::Relaxed);
            taken
        };
        // Every one woken even if one panics (`foreign.rs`).
        crate::engine::foreign::each_then_resume(wakers, Waker::wake);
    }

    /// Puts `me`'s waker in its slot and counts it asleep. The waker is
    /// cloned before the lock and the one it replaces dropped after it: a
    /// waker is the runtime's code, not ours, and never runs under a lock
    /// of ours.
    fn register(&self, me: usize, waker: &Waker) {
        let fresh = Some(waker.clone());
        let mut wakers = self.wakers.lock();
        let old = std::mem::replace(&mut wakers[me], fresh);
        if old.is_none() {
            // Relaxed: under the lock; the fence after the caller's
            // registration orders it before its re-check.
            self.sleepers.fetch_add(1, Ordering::Relaxed);
        }
        drop(wakers);
        drop(old);
    }

    /// Whether `me` was woken (its slot emptied by a waker); if not, its
    /// waker is refreshed to `waker` (cloned and dropped outside the lock,
    /// as in `register`).
    fn woken(&self, me: usize, waker: &Waker) -> bool {
        {
            let wakers = self.wakers.lock();
            match &wakers[me] {
                None => return true,
                Some(old) if old.will_wake(waker) => return false,
                Some(_) => {}
            }
        }
        let mut fresh = Some(waker.clone());
        let mut wakers = self.wakers.lock();
        let woken = match &mut wakers[me] {
            None => true,
            Some(old) => {
                std::mem::swap(old, fresh.as_mut().expect("just cloned"));
                false
            }
        };
        drop(wakers);
        // The replaced waker, or the unused clone.
        drop(fresh);
        woken
    }

    /// Takes `me`'s waker back out of its slot, if nobody took it; dropped
    /// after the lock.
    fn cancel(&self, me: usize) {
        let mut wakers = self.wakers.lock();
        let old = wakers[me].take();
        if old.is_some() {
            // Relaxed: under the lock.
            self.sleepers.fetch_sub(1, Ordering::Relaxed);
        }
        drop(wakers);
        drop(old);
    }

    /// Sleeps until woken, unless `ready` holds right after the
    /// registration (then at once). The caller re-checks what it waits
    /// for: a wake-up may find nothing left.
    async fn sleep_until(&self, me: usize, ready: impl Fn() -> bool) {
        let mut nap = Nap {
            idle: self,
            me,
            registered: false,
        };
        poll_fn(|cx| {
            if nap.registered {
                if self.woken(me, cx.waker()) {
                    nap.registered = false;
                    return Poll::Ready(());
                }
                return Poll::Pending;
            }
            self.register(me, cx.waker());
            nap.registered = true;
            // Relaxed: ordered by the fence below.
            self.looking[me].store(false, Ordering::Relaxed);
            // SeqCst fence: pairs with the one in `work_added`. Either a
            // producer after it sees this sleeper counted, or this re-check
            // sees its envelope.
            fence(Ordering::SeqCst);
            if ready() {
                // `nap` takes the registration back when dropped below.
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await;
        drop(nap);
    }
}

/// A registration in the room, taken back if the sleep ends without a
/// wake-up, or its future is dropped (the runtime drops the worker).
struct Nap<'a> {
    idle: &'a AsyncIdle,
    me: usize,
    registered: bool,
}

impl Drop for Nap<'_> {
    fn drop(&mut self) {
        if self.registered {
            self.idle.cancel(self.me);
        }
    }
}

/// The next envelope for worker `me`: from its own mailbox, or taken from
/// another one; with the index of the mailbox (the shard whose unit it
/// holds). Sleeps in `idle` while no mailbox has anything. `None` once
/// `done` (the worker's exit rule) holds and no mailbox has anything.
pub(crate) async fn next<Q: Queue>(
    me: usize,
    mailboxes: &[Q],
    idle: &AsyncIdle,
    done: impl Fn() -> bool,
) -> Option<(usize, Q::Item)> {
    idle.look(me);
    let mut slept = false;
    loop {
        if let Some(item) = mailboxes[me].try_take() {
            idle.took(me, mailboxes, slept);
            return Some((me, item));
        }
        if let Some(found) = steal(me, mailboxes) {
            idle.took(me, mailboxes, true);
            return Some(found);
        }
        if done() {
            return None;
        }
        idle.sleep_until(me, || {
            done() || mailboxes.iter().any(|queue| !queue.is_empty())
        })
        .await;
        slept = true;
        idle.look(me);
    }
}

/// What worker `me` does after it gave back a unit of shard `from`: if it
/// was another worker's shard, that worker may be asleep waiting for
/// exactly this release to drain it (its shutdown has begun): wake it.
///
/// Unconditional for a stolen unit (a check of "is that shard closed?"
/// would race the close). The lock orders this release before the owner's
/// next registration, whose re-check then sees it, or the owner's waker is
/// in its slot and is woken here.
#[inline]
pub(crate) fn after_release(idle: &AsyncIdle, me: usize, from: usize) {
    if from != me {
        idle.wake(from);
    }
}

/// One look at every other mailbox, starting after `me`.
fn steal<Q: Queue>(me: usize, mailboxes: &[Q]) -> Option<(usize, Q::Item)> {
    let count = mailboxes.len();
    (1..count)
        .map(|step| (me + step) % count)
        .find_map(|other| mailboxes[other].try_take().map(|item| (other, item)))
}
