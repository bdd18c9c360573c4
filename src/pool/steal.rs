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
//! A thief passes over a mailbox whose owner is *polling* it (its
//! polling flag): the owner takes what arrives there within
//! nanoseconds, and a thief that took it instead would only move the
//! request's lines to another core. The owner raises the flag while it
//! spins, and already just before it replies to a call
//! ([`Idle::polling`]): the next thing it does is poll, and the caller that
//! gets the reply and sends again at once must find the flag up. (What
//! runs in between is the loop's bookkeeping, and the `Drop` of a reply
//! nobody waited for.)
//!
//! Why it matters: on a machine with fewer cores than busy threads, a
//! spare worker that stole from a polling owner kept itself awake on the
//! owner's requests, the owner fell asleep, and every call then rang it
//! (a futex wake) while the thief took the request; in about one process
//! in three a one-caller round trip ran at 2.3-2.8x the plain pool's.
//!
//! # Sleeping and waking
//!
//! A stealing worker does not block in its own channel's `recv` (nothing
//! would wake it for work at another mailbox). It sleeps in the pool's
//! [`Idle`] room, on a condition variable of its own, and a delivery that
//! nobody will take without it *rings* one sleeper:
//!
//! * the sleeper raises its `asleep` flag, adds itself to `sleepers`,
//!   issues a `SeqCst` fence, then, under the room's lock, re-checks every
//!   mailbox it may take from (and its exit rule) before each wait;
//! * a producer pushes its envelope, issues a `SeqCst` fence, and reads
//!   `sleepers`; only if it is not zero, the mailbox's owner is not
//!   polling it, and the mailbox is not already empty (a polling owner
//!   often takes the envelope, and lowers its flag to handle it, before
//!   the producer reads the flag), does it take the lock and ring: the
//!   owner if it sleeps (its requests' lines stay on its core), else the
//!   first sleeper after it that is not already rung;
//! * an owner stops polling (it took an envelope, or its budget ran out)
//!   by lowering its flag, a `SeqCst` fence, and a look at its own
//!   mailbox: if envelopes remain and someone sleeps, it rings one
//!   sleeper per envelope left (the producers of those envelopes, and the
//!   thieves that passed them over, counted on it; one ring in all left
//!   the second of two such envelopes waiting while a free worker slept,
//!   `loom_steal_three`).
//!
//! The fences make this Dekker's pattern: either the producer's reads
//! (after its fence) see the sleeper counted and flagged, and it rings
//! under the lock, after which the sleeper's re-check sees the envelope or
//! its wait ends; or the sleeper's re-check, after its fence, sees the
//! envelope and it does not wait. The same pair, on the owner's flag,
//! covers a thief that passed over a polling owner. A free worker
//! therefore never sleeps while an envelope it may take waits unseen.
//!
//! A rung sleeper that finds nothing (another worker took the envelope
//! first) goes back to polling rather than to sleep, briefly
//! (`spin / `[`SHORT_SPIN`]), as a worker whose last envelope was stolen
//! does: while envelopes keep coming it is there to take them, and when
//! they stop it is soon asleep again. A ring skips sleepers already rung
//! and not yet up: each of them takes one envelope, so two rings must wake
//! two of them (`loom_steal` found the lost ring when both went to the
//! owner).
//!
//! On the plain path (no sleeper) a delivery costs one fence and the read
//! of a word that only changes when a worker sleeps or wakes, so it stays
//! shared in every cache; with a sleeper, the read of the owner's flag
//! spares the ring (a futex call) whenever the owner is polling for its
//! next request, as it is on a lightly loaded pool.
//!
//! The owner writes its flag twice per request (down when it takes one, up
//! before it replies), so wherever the flag lives, its line moves between
//! the owner and the producer on every request. It lives on the owner's
//! shard of the admission table (`Shard::attended`), the line that already
//! makes that trip: the producer has just taken its unit there, and the
//! owner gives the unit back there just before it raises the flag. On a
//! line of its own it cost one more miss per request, 0.08x to 0.11x of
//! a one-caller round trip (medians of two sets of processes).
//!
//! A worker may also have a *private* mailbox that no other worker takes
//! from (a pinned keyed request, which must run on its key's worker). The
//! owner polls it first, and the sleep check watches it; a producer rings
//! it with [`Idle::private_added`], the same Dekker pair on the owner's
//! `asleep` flag: only if the owner sleeps is it woken, on its own bell.
//!
//! Shutdown, the release of a stolen unit and a worker's exit change a
//! sleeper's exit rule (or what it may take) rather than a mailbox: they
//! [`wake_all`](Idle::wake_all) under the lock, unconditionally (see
//! [`after_release`]). `loom-tests/tests/loom_steal.rs` and
//! `loom_pinned.rs` check the protocol, driving the real loop.

use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::engine::table::Table;
use crate::sync::{fence, spin_poll, Arc, AtomicBool, AtomicUsize, Condvar, Mutex, Ordering};

/// A worker's own mailbox is polled this many times for each look at the
/// other mailboxes while it spins.
pub(crate) const STEAL_EVERY: u32 = 8;

/// A worker whose last envelope was another worker's, or that was rung for
/// work and found none, spins this many times less before it sleeps.
const SHORT_SPIN: u32 = 8;

/// A mailbox as the steal loop sees it: a queue any worker may take from.
pub(crate) trait Queue {
    /// What the queue holds.
    type Item;
    /// Takes the oldest item, if there is one; each item is taken once.
    fn try_take(&self) -> Option<Self::Item>;
    /// True if nothing is queued now (a reading).
    fn is_empty(&self) -> bool;
    /// How many items are queued now (a reading; off the hot path).
    fn len(&self) -> usize;
}

/// The async pool's mailboxes (`pool/asynchronous/mailbox.rs`).
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
    fn len(&self) -> usize {
        crossbeam_channel::Receiver::len(self)
    }
}

/// The thread pool's mailboxes (`pool/mailbox.rs`).
impl<T> Queue for crate::pool::mailbox::Inbox<T> {
    type Item = T;
    #[inline]
    fn try_take(&self) -> Option<T> {
        match self.try_recv() {
            crate::pool::mailbox::Look::Took(item) => Some(item),
            _ => None,
        }
    }
    #[inline]
    fn is_empty(&self) -> bool {
        crate::pool::mailbox::Inbox::is_empty(self)
    }
    fn len(&self) -> usize {
        crate::pool::mailbox::Inbox::len(self)
    }
}

/// Where a stealing pool's free workers sleep, and how a delivery wakes one.
#[derive(Debug)]
pub(crate) struct Idle {
    /// Workers between "about to sleep" and "awake again".
    sleepers: AtomicUsize,
    /// The pool's table. Worker `i`'s *polling flag* is shard `i`'s
    /// `attended` flag: true while the worker polls its own mailbox with
    /// nothing in hand (or is about to, see [`Idle::polling`]), so it will
    /// take what arrives there without being woken. It sits on the shard's
    /// line: the producer that reads it has just taken its unit there.
    table: Arc<Table>,
    /// Per worker: true from just before it re-checks the mailboxes to
    /// sleep until it wakes (cleared under the room's lock). A ring for
    /// work at a sleeping owner's mailbox wakes that owner; otherwise it
    /// wakes one of the sleepers this flag names.
    asleep: Box<[CachePadded<AtomicBool>]>,
    /// Held while a sleeper re-checks the mailboxes and while a waker
    /// rings, so no ring falls between a check and its wait. Per worker:
    /// rung for work since it last looked (set by a waker, cleared by the
    /// sleeper).
    room: Mutex<Box<[bool]>>,
    /// One per worker, so a ring wakes the worker it picks.
    bells: Box<[Condvar]>,
}

impl Idle {
    /// A room for the workers of a pool whose table is `table` (one shard
    /// per worker), none asleep, none polling.
    pub(crate) fn new(table: Arc<Table>) -> Self {
        let workers = table.shard_count();
        Idle {
            sleepers: AtomicUsize::new(0),
            table,
            asleep: (0..workers)
                .map(|_| CachePadded::new(AtomicBool::new(false)))
                .collect(),
            room: Mutex::new(vec![false; workers].into_boxed_slice()),
            bells: (0..workers).map(|_| Condvar::new()).collect(),
        }
    }

    /// Workers counted as about to sleep or asleep (a reading, for the
    /// loom models).
    #[cfg(loom)]
    pub(crate) fn sleepers(&self) -> usize {
        // Relaxed: a reading; the model re-checks what it needs.
        self.sleepers.load(Ordering::Relaxed)
    }

    /// Worker `i`'s polling flag.
    #[inline]
    fn polling_flag(&self, i: usize) -> &AtomicBool {
        self.table.shard(i).attended()
    }

    /// Tells the sleepers (if any) that an envelope was just queued at
    /// worker `to`; `queued` reads whether that mailbox still holds any.
    /// Nobody is woken if nobody sleeps, if `to` itself is polling its
    /// mailbox (it takes the envelope; if it takes another one first, it
    /// wakes a sleeper itself, see [`Idle::took`]), or if the mailbox is
    /// already empty. Otherwise `to` is woken if it sleeps, else another
    /// sleeper.
    ///
    /// Why the last check: a polling owner takes the envelope within
    /// nanoseconds and lowers its flag to handle it, often before this
    /// producer reads the flag. It then reads the flag down and, without
    /// the check, woke a sleeper for work already taken: in one-caller
    /// round trips, hundreds to thousands of times per 350k calls, each a
    /// futex wake and a spare worker running on a core the caller and the
    /// owner need.
    #[inline]
    pub(crate) fn work_added(&self, to: usize, queued: impl FnOnce() -> bool) {
        // SeqCst fence: pairs with the fences in `sleep_until` and `took`.
        // Either these reads see the sleeper counted and the owner not
        // polling, or the other side's check, after its fence, sees the
        // envelope pushed before this one (Dekker; see the module docs).
        fence(Ordering::SeqCst);
        // Relaxed, both: ordered by the fence above. `queued` last, and
        // only on this slow path: an empty mailbox means every envelope
        // pushed before the fence, this one included, has been taken by
        // a worker that will handle it, so nobody needs waking for it.
        if self.sleepers.load(Ordering::Relaxed) != 0
            && !self.polling_flag(to).load(Ordering::Relaxed)
            && queued()
        {
            self.ring(to);
        }
    }

    /// Worker `me` polls its own mailbox, or will next, before it sleeps
    /// or handles anything else. Raised where the poll starts, and already
    /// just before a reply (the worker has given back the unit of what it
    /// handled): the caller that gets the reply and sends again at once
    /// then wakes nobody, and no other worker takes its request.
    #[inline]
    pub(crate) fn polling(&self, me: usize) {
        // Relaxed, both: a producer that misses it only wakes a sleeper for
        // nothing. Stored only if lowered: after a reply it is already up,
        // and a second store would take the line back from the producer
        // that has just read it.
        if !self.polling_flag(me).load(Ordering::Relaxed) {
            self.polling_flag(me).store(true, Ordering::Relaxed);
        }
    }

    /// Worker `me` leaves for good (its shard is drained): it polls no
    /// more, and every sleeper re-checks (what arrives at its mailbox is
    /// the others' to take from now on).
    pub(crate) fn leave(&self, me: usize) {
        // Relaxed: ordered before the sleepers' re-checks by the room's
        // lock, taken below.
        self.polling_flag(me).store(false, Ordering::Relaxed);
        self.wake_all();
    }

    /// Worker `me` stops polling (it took an envelope, or is about to
    /// sleep); `own` is its mailbox. If envelopes remain there, producers
    /// may have skipped the wake-up counting on `me` to take them, one
    /// each: wake a sleeper for each envelope left, not one in all (a
    /// sleeper takes one envelope per ring, so one ring for two envelopes
    /// left the second in the mailbox while a free worker slept).
    #[inline]
    fn took<Q: Queue>(&self, me: usize, own: &Q) {
        // Relaxed: ordered by the fence below.
        self.polling_flag(me).store(false, Ordering::Relaxed);
        // SeqCst fence: pairs with the ones in `work_added` (a producer
        // that read this flag up pushed before its fence, so the look
        // below sees its envelope) and in `sleep_until` (a sleeper that
        // read this flag up is counted in `sleepers` for the read below).
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence above.
        if !own.is_empty() && self.sleepers.load(Ordering::Relaxed) != 0 {
            self.ring_for_left(me, own);
        }
    }

    /// The slow half of [`took`](Self::took): rings one sleeper for each
    /// envelope left in `own`, worker `me`'s mailbox. `len` is read after
    /// `took`'s fence, so it counts every envelope whose producer counted
    /// on `me`; it may also count one whose producer rang for it, or one
    /// another worker takes meanwhile: a sleeper woken for nothing goes
    /// back to polling briefly, as after any ring another worker's take
    /// beat.
    #[cold]
    fn ring_for_left<Q: Queue>(&self, me: usize, own: &Q) {
        self.ring_many(me, own.len());
    }

    /// True unless mailbox `other` is another worker's and that worker is
    /// polling it: it takes what arrives there within nanoseconds, so
    /// worker `me` neither steals from it nor stays awake for it.
    #[inline]
    fn takeable(&self, me: usize, other: usize) -> bool {
        // Relaxed: a stale reading only takes one request its owner would
        // have, or leaves one to the owner's `took`, which rings if it
        // stops polling with envelopes left (after its fence; the
        // sleeper's fence is in `sleep_until`).
        other == me || !self.polling_flag(other).load(Ordering::Relaxed)
    }

    /// Tells worker `to` that an envelope was just queued in its *private*
    /// mailbox, which no other worker takes (a pinned keyed request). As
    /// [`work_added`](Self::work_added), but only `to` can take it: only
    /// if `to` sleeps is it woken (a busy or polling owner takes the
    /// envelope on its own).
    #[inline]
    pub(crate) fn private_added(&self, to: usize) {
        // SeqCst fence: pairs with the one in `sleep_until`: either this
        // read sees `to` asleep, or `to`'s re-check of its private mailbox,
        // after its fence, sees the envelope (Dekker).
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence above.
        if self.asleep[to].load(Ordering::Relaxed) {
            let mut rung = self.room.lock();
            rung[to] = true;
            self.bells[to].notify_one();
        }
    }

    /// Wakes one sleeper for an envelope at mailbox `to`: `to` itself if
    /// it sleeps (its requests' lines stay on its core), else the first
    /// sleeper after it; never one already rung and not yet up, which will
    /// take one envelope only (two rings for two envelopes wake two
    /// sleepers, as two `notify_one` on a shared condition variable would).
    #[cold]
    fn ring(&self, to: usize) {
        self.ring_many(to, 1);
    }

    /// [`ring`](Self::ring) for `envelopes` envelopes at mailbox `to`
    /// under one lock: up to that many distinct sleepers not already rung,
    /// in `ring`'s order (fewer if fewer sleep).
    fn ring_many(&self, to: usize, envelopes: usize) {
        let mut rung = self.room.lock();
        // Relaxed: under the lock, a sleeper's flag is exact once it
        // waits (it set the flag before it took the lock, and clears it
        // under the lock); one that has yet to take the lock re-checks the
        // mailboxes after this ring.
        let count = self.asleep.len();
        let mut left = envelopes;
        for k in (0..count).map(|step| (to + step) % count) {
            if left == 0 {
                break;
            }
            if !rung[k] && self.asleep[k].load(Ordering::Relaxed) {
                rung[k] = true;
                self.bells[k].notify_one();
                left -= 1;
            }
        }
    }

    /// Wakes every sleeper so it re-checks its exit rule: after a shutdown
    /// began, or a release on a closed shard.
    pub(crate) fn wake_all(&self) {
        // The lock orders this after any sleeper's check: one that checked
        // first is already waiting and gets the notification.
        let _room = self.room.lock();
        for bell in self.bells.iter() {
            bell.notify_all();
        }
    }

    /// Worker `me` sleeps until `ready` (checked under the room's lock) is
    /// true, or until it is rung for work: a ring for work that another
    /// worker took first (`ready` reads false again) still ends the sleep,
    /// so the caller goes back to polling. Returns whether `ready` held.
    pub(crate) fn sleep_until(&self, me: usize, mut ready: impl FnMut() -> bool) -> bool {
        // Relaxed, both: the fence below orders them before the re-checks.
        self.asleep[me].store(true, Ordering::Relaxed);
        self.sleepers.fetch_add(1, Ordering::Relaxed);
        // SeqCst fence: pairs with the one in `work_added`.
        fence(Ordering::SeqCst);
        let mut rung = self.room.lock();
        let ready = loop {
            if ready() {
                break true;
            }
            if rung[me] {
                break false;
            }
            rung = self.bells[me].wait(rung);
        };
        rung[me] = false;
        // Relaxed: under the lock, which a waker holds while it reads it.
        self.asleep[me].store(false, Ordering::Relaxed);
        drop(rung);
        // Relaxed: a producer that still sees this sleeper counted only
        // takes the lock for nothing.
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
        ready
    }
}

/// The next envelope for worker `me`: from its private mailbox (if it has
/// one), its own mailbox, or taken from another one; with the index of the
/// mailbox (the shard whose unit it holds: `me` for the private one). Spins
/// for `spin` (an eighth of it if `stole`: the worker's last envelope was
/// another's), then sleeps in `idle` until work comes. `None` once `done`
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
    stole: bool,
    done: impl Fn() -> bool,
) -> Option<(usize, Q::Item)> {
    let mut polls = 0u32;
    // A worker whose last envelope was another's polls only briefly: it
    // stays at hand while such work keeps coming, and sleeps soon after.
    let mut spin = if stole { spin / SHORT_SPIN } else { spin };
    let take_private = || private.and_then(Queue::try_take).map(|item| (me, item));
    loop {
        idle.polling(me);
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
                    steal(me, mailboxes, idle)
                } else {
                    None
                }
            })
        });
        // Not polling any more: from here on, producers wake sleepers for
        // what arrives at this mailbox (and this one re-checks after its
        // fence).
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
            if let Some(found) = steal(me, mailboxes, idle) {
                return Some(found);
            }
            if done() {
                return None;
            }
            let ready = idle.sleep_until(me, || {
                done()
                    || private.is_some_and(|queue| !queue.is_empty())
                    || mailboxes
                        .iter()
                        .enumerate()
                        .any(|(other, queue)| idle.takeable(me, other) && !queue.is_empty())
            });
            if !ready {
                // Rung for work another worker took first: poll again,
                // briefly.
                spin /= SHORT_SPIN;
                break;
            }
        }
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
/// do not all start at mailbox 0), passing over those whose owner is
/// polling: it takes what arrives there within nanoseconds, and taking it
/// instead would only move its requests' lines to another core. An owner
/// that stops polling with envelopes left wakes a sleeper ([`Idle::took`]).
fn steal<Q: Queue>(me: usize, mailboxes: &[Q], idle: &Idle) -> Option<(usize, Q::Item)> {
    let count = mailboxes.len();
    (1..count)
        .map(|step| (me + step) % count)
        // Relaxed: a stale reading only delays a steal until the owner's
        // `took` wakes a sleeper, or takes one the owner would have.
        .filter(|&other| idle.takeable(me, other))
        .find_map(|other| mailboxes[other].try_take().map(|item| (other, item)))
}
