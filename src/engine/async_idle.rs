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
//! Each worker has a state word of its own, on its own line, with two
//! bits, and an atomic waker slot (the `atomic-waker` crate: futures'
//! `AtomicWaker`, the discipline of tokio MPSC's receiver). No lock:
//!
//! | `state` | the worker |
//! |---|---|
//! | `LOOKING` | awake between requests; will look at its own mailbox before it takes anything or sleeps |
//! | `ASLEEP` | sleeps, its waker in its slot, and nobody has claimed its wake-up yet |
//! | neither | busy with a request (or just woken) |
//!
//! * a sleeper registers its waker, then flips `LOOKING` off and `ASLEEP`
//!   on in one RMW, issues a `SeqCst` fence, and re-checks every mailbox
//!   and its exit rule; it returns `Pending` only if all are empty and the
//!   rule does not hold;
//! * a producer pushes its envelope to mailbox `to`, then clears `to`'s
//!   `ASLEEP` in one RMW (the *claim*; of two claimers one wins) and reads
//!   the old state: if `to` slept, the producer wakes its slot; if `to` was
//!   looking, nobody; if `to` is busy, it issues a `SeqCst` fence and claims
//!   and wakes the first sleeper after `to`, if any;
//! * a worker that takes an envelope clears its `LOOKING` in one RMW and
//!   looks again: at its own mailbox if it took from there without having
//!   slept, at every mailbox if it stole or slept (it may then hold the
//!   notification meant for another envelope). If anything is left, it
//!   issues a `SeqCst` fence and wakes a sleeper.
//!
//! **The owner's word.** Every RMW on one word reads the latest value, and
//! they are `AcqRel`, so for the producer and the owner of mailbox `to`
//! this is Dekker's pattern without a fence: if the producer's claim comes
//! after the sleeper's flip, it reads `ASLEEP` and wakes it; if before,
//! the flip reads the claim's write and acquires the push, so the re-check
//! sees the envelope. Likewise a producer that reads `LOOKING` came before
//! the owner's next RMW (its take or its flip), which acquires the push.
//!
//! **Other workers.** A producer whose mailbox owner is busy, and an owner
//! that leaves envelopes behind, look at *other* workers' words: that is
//! two locations, so both sides issue a `SeqCst` fence (the sleeper after
//! its flip, the waker before its look). Take them in the single total
//! order of `SeqCst` fences: if the sleeper's comes first, the waker sees
//! its `ASLEEP`; if the waker's comes first, the sleeper's re-check sees
//! the envelope (which the waker had seen, or pushed, before its fence).
//!
//! A cleared `ASLEEP` is the notification. Whoever clears a sleeper's bit
//! wakes its slot afterwards, and a sleeper polled again reads its bit,
//! registers its waker again and reads it once more (the atomic waker's
//! contract: a wake after a registration wakes that waker), so a claim is
//! never lost, and a sleeper is done sleeping exactly when its bit is
//! clear. A claim whose wake arrives after the sleeper has left is a
//! spurious wake-up of an awake task, which its next poll absorbs. The
//! claim's `Release` pairs with the sleeper's `Acquire` read of its
//! cleared bit (it sees what was queued before the claim), and the flip's
//! `Release` with the claim's `Acquire` (the wake finds the waker).
//!
//! The cost on the plain path, where the owner sleeps and one request
//! comes in: a delivery makes one RMW on the owner's word and wakes its
//! slot; the worker makes one RMW to take, one to sleep and one fence,
//! and two RMWs on its own slot.
//!
//! Shutdown changes every sleeper's exit rule rather than a mailbox: it
//! claims and wakes every sleeper ([`AsyncIdle::wake_all`]); a worker that
//! gave back a unit of another worker's shard claims and wakes that owner
//! ([`after_release`]), which may be asleep waiting for exactly that
//! release to drain its closed shard. Both are RMWs on the sleeper's word
//! after the change, so the same one-word argument holds: the claim reads
//! `ASLEEP`, or the flip acquires the change and the re-check sees it.

use std::future::poll_fn;
use std::task::Poll;

use crossbeam_utils::CachePadded;

use crate::pool::steal::Queue;
use crate::sync::{fence, AtomicUsize, AtomicWaker, Ordering};

/// Awake between requests, about to look at its own mailbox.
const LOOKING: usize = 1;
/// Asleep, its waker registered, its wake-up not claimed yet.
const ASLEEP: usize = 2;

/// Where a stealing async pool's free workers sleep, and how a delivery
/// wakes one.
#[derive(Debug)]
pub(crate) struct AsyncIdle {
    /// Per worker: `LOOKING`, `ASLEEP` or neither (the module docs' table).
    /// `LOOKING` is set and cleared by the worker only;
    /// `ASLEEP` is set by the worker and cleared by whoever claims its
    /// wake-up (an RMW: one wins), or by the worker itself.
    state: Box<[CachePadded<AtomicUsize>]>,
    /// Per worker: its waker while it sleeps (and perhaps after; a stale
    /// waker is only woken by a claim, which `ASLEEP` rules out).
    wakers: Box<[CachePadded<AtomicWaker>]>,
}

impl AsyncIdle {
    /// A room for `workers` workers, none asleep, none looking.
    pub(crate) fn new(workers: usize) -> Self {
        AsyncIdle {
            state: (0..workers)
                .map(|_| CachePadded::new(AtomicUsize::new(0)))
                .collect(),
            wakers: (0..workers)
                .map(|_| CachePadded::new(AtomicWaker::new()))
                .collect(),
        }
    }

    /// Tells the sleepers (if any) that an envelope was just queued at
    /// worker `to`: wakes `to` if it sleeps; nobody if it is looking at its
    /// mailbox (if it takes another envelope first, it wakes a sleeper
    /// itself, see `took`); else another sleeper, if any.
    #[inline]
    pub(crate) fn work_added(&self, to: usize) {
        // AcqRel: Release pairs with the Acquire of `to`'s next RMW (its
        // take or its flip to asleep), which then sees the envelope; Acquire
        // pairs with the flip's Release, so the wake below finds the waker.
        let before = self.state[to].fetch_and(!ASLEEP, Ordering::AcqRel);
        if before & ASLEEP != 0 {
            self.wakers[to].wake();
        } else if before & LOOKING == 0 {
            // `to` is busy, or about to look again (its store of `LOOKING`
            // may follow this RMW, and then its flip does not acquire it):
            // `to` itself is a candidate too.
            self.wake_one(to, 0);
        }
    }

    /// How many workers sleep now; a reading, for the loom models.
    #[cfg(loom)]
    pub(crate) fn sleepers(&self) -> usize {
        self.state
            .iter()
            // Relaxed: a reading; the models wait on it with yields.
            .filter(|state| state.load(Ordering::Relaxed) & ASLEEP != 0)
            .count()
    }

    /// Worker `me` is awake and will look at its own mailbox.
    #[inline]
    fn look(&self, me: usize) {
        // AcqRel, and an RMW, not a store: a claim or a producer's RMW that
        // came before it (reading `me` busy or asleep) released what it
        // queued, and `me`'s next look must see it; a store here would cut
        // that chain (`me`'s flip would read the store, not the claim), and
        // `loom_async_steal` deadlocks. `ASLEEP` is clear: `me` is awake.
        self.state[me].fetch_or(LOOKING, Ordering::AcqRel);
    }

    /// Worker `me` took an envelope and stops looking. If envelopes remain
    /// (in its own mailbox, or with `everywhere` in any), a producer may
    /// have counted on `me`, or woken `me` for one of them: wake a sleeper.
    #[inline]
    fn took<Q: Queue>(&self, me: usize, mailboxes: &[Q], everywhere: bool) {
        // Acquire: pairs with the Release of every producer that read
        // `LOOKING` (and so woke nobody): their envelopes are seen below.
        // (A notification `me` holds was acquired when it read its bit.)
        self.state[me].fetch_and(!LOOKING, Ordering::AcqRel);
        let left = if everywhere {
            mailboxes.iter().any(|queue| !queue.is_empty())
        } else {
            !mailboxes[me].is_empty()
        };
        if left {
            // `me` is awake, so another one is woken.
            self.wake_one(me, 1);
        }
    }

    /// Claims worker `worker`'s wake-up and wakes it; false if it was not
    /// asleep (or another claimer won).
    #[inline]
    fn claim(&self, worker: usize) -> bool {
        // AcqRel: as in `work_added`.
        let before = self.state[worker].fetch_and(!ASLEEP, Ordering::AcqRel);
        if before & ASLEEP == 0 {
            return false;
        }
        self.wakers[worker].wake();
        true
    }

    /// Wakes one sleeper: the first one from worker `from + skip` on
    /// (`skip` 1 leaves out `from` itself).
    #[cold]
    fn wake_one(&self, from: usize, skip: usize) {
        // SeqCst fence: pairs with the one in `sleep_until`. Either these
        // reads see the sleeper's `ASLEEP`, or its re-check, after its
        // fence, sees the envelope seen or pushed before this one.
        fence(Ordering::SeqCst);
        let count = self.state.len();
        for step in skip..count {
            let other = (from + step) % count;
            // Relaxed: a hint, ordered by the fence; the claim decides.
            if self.state[other].load(Ordering::Relaxed) & ASLEEP != 0 && self.claim(other) {
                return;
            }
        }
    }

    /// Wakes worker `worker` if it sleeps, so it re-checks its exit rule.
    pub(crate) fn wake(&self, worker: usize) {
        // SeqCst fence: pairs with the one in `sleep_until`: this read sees
        // the sleeper's `ASLEEP`, or its re-check sees what the caller did
        // before this call. (The claim's RMW alone would not do: the
        // worker's store of `LOOKING` may come after it, and its flip then
        // reads that store, not the claim.)
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence; the claim decides.
        if self.state[worker].load(Ordering::Relaxed) & ASLEEP != 0 {
            self.claim(worker);
        }
    }

    /// Wakes every sleeper so it re-checks its exit rule: after a shutdown
    /// began.
    pub(crate) fn wake_all(&self) {
        for worker in 0..self.state.len() {
            self.wake(worker);
        }
    }

    /// `me` stops looking and sleeps: one RMW on its word.
    fn fall_asleep(&self, me: usize) {
        // AcqRel: Release pairs with the Acquire of a claim, whose wake
        // then finds the waker registered before this; Acquire pairs with
        // the Release of a producer (or releaser) whose RMW came first, so
        // the re-check sees its envelope (or release).
        let before = self.state[me].fetch_xor(LOOKING | ASLEEP, Ordering::AcqRel);
        debug_assert_eq!(before, LOOKING, "a worker sleeps only after it looked");
    }

    /// Whether `me`'s bit is still set (nobody claimed its wake-up).
    fn still_asleep(&self, me: usize) -> bool {
        // Acquire: pairs with the Release of the claim that cleared it.
        self.state[me].load(Ordering::Acquire) & ASLEEP != 0
    }

    /// Clears `me`'s bit itself, if nobody claimed it. A claim that won
    /// first wakes `me` for nothing, once, later.
    fn cancel(&self, me: usize) {
        // Relaxed: a claim that won first released to `me`'s next RMW, its
        // `look`, which acquires it.
        self.state[me].fetch_and(!ASLEEP, Ordering::Relaxed);
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
                // Polled again: woken (the bit is clear), or not; then the
                // waker is registered again before a second look, so a
                // claim after the registration wakes this waker, and one
                // before it cleared the bit read after it.
                for register in [false, true] {
                    if register {
                        self.wakers[me].register(cx.waker());
                    }
                    if !self.still_asleep(me) {
                        nap.registered = false;
                        return Poll::Ready(());
                    }
                }
                return Poll::Pending;
            }
            // The waker before the bit: a claimer that reads the bit finds
            // the waker (see `fall_asleep`).
            self.wakers[me].register(cx.waker());
            self.fall_asleep(me);
            nap.registered = true;
            // SeqCst fence: pairs with the one in `wake_other`. Either a
            // waker after it sees this sleeper's bit, or this re-check sees
            // the envelope it saw or pushed.
            fence(Ordering::SeqCst);
            if ready() {
                // `nap` takes the bit back when dropped below.
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
        if let Some(item) = take(&mailboxes[me]) {
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
/// would race the close). The claim is an RMW on the owner's word after
/// this release: it reads the owner asleep and wakes it, or the owner's
/// flip to asleep acquires this release and its re-check sees it.
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
        .find_map(|other| take(&mailboxes[other]).map(|item| (other, item)))
}

/// The oldest item of `queue`, if it has one. Looks before it takes: a
/// reading is two loads, while a take (crossbeam's `try_recv`) issues a
/// `SeqCst` fence even on an empty list, and an idle worker looks at every
/// mailbox. An item pushed just after the look is found by the re-check
/// after the sleeper's fence, as one pushed just after a failed take.
#[inline]
fn take<Q: Queue>(queue: &Q) -> Option<Q::Item> {
    if queue.is_empty() {
        return None;
    }
    queue.try_take()
}
