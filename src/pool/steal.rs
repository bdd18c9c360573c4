//! Stealing: a worker whose own mailbox is empty takes a request queued at
//! another worker, and the sleep/wake protocol ([`Idle`]) that keeps a free
//! worker from sleeping while work it may take is waiting.
//!
//! A request still takes its unit on the shard that admitted it and goes to
//! that shard's mailbox; only *who runs it* changes. A worker that takes an
//! envelope from mailbox `j` gives the unit back to shard `j` (the caller of
//! [`next`] learns `j` with the envelope), so the bound, "released before
//! the reply" and the shutdown drain rule are those of the plain pool.
//!
//! # Taking
//!
//! Each mailbox is a multi-consumer channel: its owner and every other
//! worker hold a receiver, and the channel hands each envelope to exactly
//! one of them. A worker polls its own mailbox first, for the pool's spin
//! budget, looking at the others every [`STEAL_EVERY`] polls (so the
//! owner's line is not pulled away from its producers on every poll), then
//! once more at all of them before it sleeps.
//!
//! # Sleeping and waking
//!
//! A stealing worker does not block in its own channel's `recv` (nothing
//! would wake it for work at another mailbox). It sleeps in the pool's
//! [`Idle`] room, on a condition variable, and every delivery rings it:
//!
//! * the sleeper adds itself to `sleepers`, issues a `SeqCst` fence, then,
//!   under the room's lock, re-checks every mailbox (and its exit rule)
//!   before each wait;
//! * a producer pushes its envelope, issues a `SeqCst` fence, and reads
//!   `sleepers`; only if it is not zero, and the mailbox's owner is not
//!   spinning on it, does it take the lock and notify one sleeper;
//! * an owner stops spinning (it took an envelope, or its budget ran out)
//!   by clearing its flag, a `SeqCst` fence, and a look at its own
//!   mailbox: if envelopes remain and someone sleeps, it wakes one (the
//!   producers of those envelopes may have counted on it).
//!
//! The two fences make this Dekker's pattern: either the producer's read
//! sees the sleeper counted (and it notifies, under the lock, after which
//! the sleeper's re-check sees the envelope or its wait is interrupted), or
//! the sleeper's re-check, after its fence, sees the envelope and it does
//! not wait. A free worker therefore never sleeps while an envelope waits.
//! Every sleeper waits for the same thing (any mailbox not empty), so
//! waking one is enough: if the one woken finds nothing, another worker
//! already took it. On the plain path (no sleeper) a delivery costs one
//! fence and the read of a word that only changes when a worker sleeps or
//! wakes, so it stays shared in every cache; with a sleeper, the read of
//! the owner's flag spares the wake-up (a futex call) whenever the owner is
//! polling for its next request, as it is on a lightly loaded pool.
//!
//! A worker may also have a *private* mailbox that no other worker takes
//! from (a pinned keyed request, which must run on its key's worker). The
//! owner polls it first, and the sleep check watches it; a producer rings
//! it with [`Idle::private_added`], the same Dekker pair on a per-worker
//! `asleep` flag: only if the owner sleeps, it wakes every sleeper (the
//! condition variable cannot wake the owner alone).
//!
//! Shutdown and the release of a stolen unit change a sleeper's exit rule
//! rather than a mailbox: they [`wake_all`](Idle::wake_all) under the lock,
//! unconditionally (see [`after_release`]). `loom-tests/tests/loom_steal.rs` checks the protocol.

use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::sync::{fence, spin_poll, AtomicBool, AtomicUsize, Condvar, Mutex, Ordering};

/// A worker's own mailbox is polled this many times for each look at the
/// other mailboxes while it spins.
pub(crate) const STEAL_EVERY: u32 = 8;

/// A mailbox as the steal loop sees it: a queue any worker may take from.
pub(crate) trait Queue {
    /// What the queue holds.
    type Item;
    /// Takes the oldest item, if there is one; each item is taken once.
    fn try_take(&self) -> Option<Self::Item>;
    /// True if nothing is queued now (a reading).
    fn is_empty(&self) -> bool;
}

impl<T> Queue for crossbeam_channel::Receiver<T> {
    type Item = T;
    #[inline]
    fn try_take(&self) -> Option<T> {
        self.try_recv().ok()
    }
    #[inline]
    fn is_empty(&self) -> bool {
        crossbeam_channel::Receiver::is_empty(self)
    }
}

/// Where a stealing pool's free workers sleep, and how a delivery wakes one.
#[derive(Debug)]
pub(crate) struct Idle {
    /// Workers between "about to sleep" and "awake again".
    sleepers: AtomicUsize,
    /// Per worker: true while it polls its own mailbox with nothing in
    /// hand, so it will take what arrives there without being woken. Each
    /// on its own line: its worker writes it once per request.
    spinning: Box<[CachePadded<AtomicBool>]>,
    /// Per worker: true from just before it re-checks the mailboxes to
    /// sleep until it is awake again. Read by [`Idle::private_added`]: only
    /// a delivery to a sleeping worker's private mailbox wakes anyone.
    asleep: Box<[CachePadded<AtomicBool>]>,
    /// Held while a sleeper re-checks the mailboxes and while a waker
    /// notifies, so no notification falls between a check and its wait.
    room: Mutex<()>,
    bell: Condvar,
}

impl Idle {
    /// A room for `workers` workers, none asleep, none spinning.
    pub(crate) fn new(workers: usize) -> Self {
        Idle {
            sleepers: AtomicUsize::new(0),
            spinning: (0..workers)
                .map(|_| CachePadded::new(AtomicBool::new(false)))
                .collect(),
            asleep: (0..workers)
                .map(|_| CachePadded::new(AtomicBool::new(false)))
                .collect(),
            room: Mutex::new(()),
            bell: Condvar::new(),
        }
    }

    /// Tells the sleepers (if any) that an envelope was just queued at
    /// worker `to`. Nobody is woken if nobody sleeps, or if `to` itself is
    /// spinning on its mailbox (it takes the envelope; if it takes another
    /// one first, it wakes a sleeper itself, see [`Idle::took`]).
    #[inline]
    pub(crate) fn work_added(&self, to: usize) {
        // SeqCst fence: pairs with the fences in `sleep_until` and `took`.
        // Either these reads see the sleeper counted and the owner not
        // spinning, or the other side's check, after its fence, sees the
        // envelope pushed before this one (Dekker; see the module docs).
        fence(Ordering::SeqCst);
        // Relaxed, both: ordered by the fence above.
        if self.sleepers.load(Ordering::Relaxed) != 0 && !self.spinning[to].load(Ordering::Relaxed)
        {
            self.wake_one();
        }
    }

    /// Worker `me` starts polling its own mailbox.
    #[inline]
    fn spin(&self, me: usize) {
        // Relaxed: a producer that misses it only wakes a sleeper for
        // nothing.
        self.spinning[me].store(true, Ordering::Relaxed);
    }

    /// Worker `me` stops polling (it took an envelope, or is about to
    /// sleep); `own` is its mailbox. If envelopes remain there, a producer
    /// may have skipped the wake-up counting on `me` to take them: wake a
    /// sleeper now.
    #[inline]
    fn took<Q: Queue>(&self, me: usize, own: &Q) {
        // Relaxed: ordered by the fence below.
        self.spinning[me].store(false, Ordering::Relaxed);
        // SeqCst fence: pairs with the one in `work_added`.
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence above.
        if !own.is_empty() && self.sleepers.load(Ordering::Relaxed) != 0 {
            self.wake_one();
        }
    }

    /// Tells worker `to` that an envelope was just queued in its *private*
    /// mailbox, which no other worker takes (a pinned keyed request). As
    /// [`work_added`](Self::work_added), but a sleeper woken for it must be
    /// `to` itself, and a condition variable cannot pick which sleeper it
    /// wakes: so every sleeper is woken, and the others find nothing and
    /// sleep again. Only when `to` itself sleeps: a busy or polling owner
    /// takes the envelope on its own, and the other sleepers are left
    /// alone.
    #[inline]
    pub(crate) fn private_added(&self, to: usize) {
        // SeqCst fence: pairs with the one in `sleep_until`: either this
        // read sees `to` asleep, or `to`'s re-check of its private mailbox,
        // after its fence, sees the envelope (Dekker).
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence above.
        if self.asleep[to].load(Ordering::Relaxed) {
            self.wake_all();
        }
    }

    #[cold]
    fn wake_one(&self) {
        let _room = self.room.lock();
        self.bell.notify_one();
    }

    /// Wakes every sleeper so it re-checks its exit rule: after a shutdown
    /// began, or a release on a closed shard.
    pub(crate) fn wake_all(&self) {
        // The lock orders this after any sleeper's check: one that checked
        // first is already waiting and gets the notification.
        let _room = self.room.lock();
        self.bell.notify_all();
    }

    /// Worker `me` sleeps until `ready` (checked under the room's lock) is
    /// true.
    pub(crate) fn sleep_until(&self, me: usize, mut ready: impl FnMut() -> bool) {
        // Relaxed, both: the fence below orders them before the re-checks.
        self.asleep[me].store(true, Ordering::Relaxed);
        self.sleepers.fetch_add(1, Ordering::Relaxed);
        // SeqCst fence: pairs with the one in `work_added`.
        fence(Ordering::SeqCst);
        let mut room = self.room.lock();
        while !ready() {
            room = self.bell.wait(room);
        }
        drop(room);
        // Relaxed, both: a producer that still sees this sleeper counted
        // (or asleep) only takes the lock for nothing.
        self.asleep[me].store(false, Ordering::Relaxed);
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The next envelope for worker `me`: from its private mailbox (if it has
/// one), its own mailbox, or taken from another one; with the index of the
/// mailbox (the shard whose unit it holds: `me` for the private one). Spins
/// for `spin`, then sleeps in `idle` until work comes. `None` once `done`
/// (the worker's exit rule) holds and no mailbox has anything.
///
/// The private mailbox is polled first and watched by the sleep check like
/// the others; producers ring it with [`Idle::private_added`].
pub(crate) fn next<Q: Queue>(
    me: usize,
    mailboxes: &[Q],
    private: Option<&Q>,
    idle: &Idle,
    spin: Duration,
    done: impl Fn() -> bool,
) -> Option<(usize, Q::Item)> {
    let mut polls = 0u32;
    let take_private = || private.and_then(Queue::try_take).map(|item| (me, item));
    idle.spin(me);
    // A zero budget polls once, below (under loom too, where `spin_poll`
    // would yield in between).
    let polled = (!spin.is_zero()).then(|| {
        spin_poll(spin, || {
            if let Some(found) = take_private() {
                return Some(found);
            }
            if let Some(item) = mailboxes[me].try_take() {
                return Some((me, item));
            }
            polls = polls.wrapping_add(1);
            if polls % STEAL_EVERY == 0 {
                steal(me, mailboxes)
            } else {
                None
            }
        })
    });
    // Not spinning any more: from here on, producers wake sleepers for
    // what arrives at this mailbox (and this one re-checks after its fence).
    idle.took(me, &mailboxes[me]);
    if let Some(Some(found)) = polled {
        return Some(found);
    }
    loop {
        if let Some(found) = take_private() {
            return Some(found);
        }
        if let Some(item) = mailboxes[me].try_take() {
            return Some((me, item));
        }
        if let Some(found) = steal(me, mailboxes) {
            return Some(found);
        }
        if done() {
            return None;
        }
        idle.sleep_until(me, || {
            done()
                || private.is_some_and(|queue| !queue.is_empty())
                || mailboxes.iter().any(|queue| !queue.is_empty())
        });
    }
}

/// What worker `me` does after it gave back a unit of shard `from`: if it
/// was another worker's shard, that worker may be asleep waiting for
/// exactly this release to drain it (its shutdown has begun), so every
/// sleeper re-checks.
///
/// Unconditional for a stolen unit: a check of "is that shard closed?"
/// here would race the close (the release and the close are on different
/// words), and loom finds the interleaving where the owner sleeps forever.
/// The lock orders this release before the owner's next check, or the
/// owner is already waiting and gets the notification. A stolen request
/// already paid a cross-core hand-off; an uncontended lock is small beside
/// it.
#[inline]
pub(crate) fn after_release(idle: &Idle, me: usize, from: usize) {
    if from != me {
        idle.wake_all();
    }
}

/// One look at every other mailbox, starting after `me` (so two thieves
/// do not all start at mailbox 0).
fn steal<Q: Queue>(me: usize, mailboxes: &[Q]) -> Option<(usize, Q::Item)> {
    let count = mailboxes.len();
    (1..count)
        .map(|step| (me + step) % count)
        .find_map(|other| mailboxes[other].try_take().map(|item| (other, item)))
}
